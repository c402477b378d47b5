from django import template

from billing.core.money import divide_rounded, to_dollars

register = template.Library()


@register.filter
def dollars(micros) -> str:
    """Micro-dollars as people read money: "$1,234.50", to the cent (half to even); an amount
    under a cent that is not zero is "<$0.01". (The API keeps every micro-dollar.)"""
    if micros is None or micros == "":
        return "—"
    micros = int(micros)
    cents = divide_rounded(micros, 10_000)
    sign = "-" if micros < 0 else ""
    if cents == 0 and micros != 0:
        return f"{sign}<$0.01"
    whole, fraction = divmod(abs(cents), 100)
    return f"{sign}${whole:,}.{fraction:02d}"


BADGES = {
    "filled": "ok", "succeeded": "ok", "paid": "ok", "active": "ok", "verified": "ok", "reachable": "ok", "completed": "muted",
    "resting": "wait", "open": "wait", "pending": "wait", "placing": "wait", "registering": "wait",
    "preempting": "warn", "draining": "warn", "degraded": "warn",
    "refused": "bad", "failed": "bad", "preempted": "bad", "suspended": "bad",
    "unreachable": "bad", "offline": "bad",
    "cancelled": "muted", "expired": "muted", "terminated": "muted", "retired": "muted",
    # a workload's ranks
    "running": "ok", "waiting": "wait", "exited": "muted", "stopped": "muted",
}


@register.inclusion_tag("web/partials/badge.html")
def badge(state):
    return {"state": state, "kind": BADGES.get(str(state), "muted"),
            "label": str(state).replace("_", " ")}


@register.filter
def label(value) -> str:
    return str(value).replace("_", " ")


@register.simple_tag(takes_context=True)
def page_query(context, param: str, number: int) -> str:
    """The current query string with `param` set to `number` (other lists keep their page)."""
    query = context["request"].GET.copy()
    query[param] = number
    return "?" + query.urlencode()


@register.filter
def cents(micros) -> str:
    """Micro-dollars shown to the cent, half to even, as "$1,234.50" (summaries; the ledger
    and invoices keep every micro-dollar)."""
    if micros is None or micros == "":
        return "—"
    whole_cents = divide_rounded(int(micros), 10_000)
    return dollars(whole_cents * 10_000)


@register.filter
def exact_dollars(micros) -> str:
    """Micro-dollars with every digit kept ("$2.415"): a price to win rounded to the cent
    could be one that loses."""
    if micros is None or micros == "":
        return "—"
    return f"${to_dollars(int(micros))}"


PRICE_TO_WIN_STATES = ("open", "resting", "refused", "expired")


@register.inclusion_tag("web/partials/price_to_win.html")
def price_to_win(order):
    """A bid a clearing refused: the lowest limit that would have won it, or why none
    would have (nothing for a filled or cancelled order, or one no clearing has seen)."""
    shown = order.state in PRICE_TO_WIN_STATES and (
        order.price_to_win_micros is not None or bool(order.price_to_win_reason))
    return {"shown": shown, "micros": order.price_to_win_micros,
            "reason": order.price_to_win_reason}
