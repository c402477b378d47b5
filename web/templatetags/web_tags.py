from django import template

from market.money import divide_rounded, to_dollars

register = template.Library()


@register.filter
def dollars(micros) -> str:
    """Micro-dollars as "$1,234.50"."""
    if micros is None or micros == "":
        return "—"
    text = to_dollars(int(micros))
    sign = "-" if text.startswith("-") else ""
    whole, _, fraction = text.lstrip("-").partition(".")
    return f"{sign}${int(whole):,}.{fraction}"


BADGES = {
    "filled": "ok", "succeeded": "ok", "paid": "ok", "active": "ok", "verified": "ok", "reachable": "ok", "completed": "muted",
    "resting": "wait", "open": "wait", "pending": "wait", "placing": "wait", "registering": "wait",
    "preempting": "warn", "draining": "warn", "degraded": "warn",
    "refused": "bad", "failed": "bad", "preempted": "bad", "suspended": "bad",
    "unreachable": "bad", "offline": "bad",
    "cancelled": "muted", "expired": "muted", "terminated": "muted", "retired": "muted",
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
