"""A day of history for the operator and provider screenshots: leases that came and went over
the last 24 hours, usage billed, payouts, SLA credits."""

from datetime import timedelta

from django.utils import timezone

from billing import services
from billing.models import ConnectAccount, Payout
from market import leasing
from market.models import Lease
from notify.models import Event, WebhookDelivery, WebhookEndpoint
from pool.models import Gpu
from scheduler.models import SlaCredit

# (hours ago it started, hours it ran, GPUs): a busy afternoon, a quiet night, a busy morning
WAVES = [(24, 6, 64), (23, 9, 32), (21, 5, 48), (19, 4, 24), (16, 3, 16), (14, 5, 8),
         (11, 6, 32), (9, 12, 60), (7, 10, 34), (5, 8, 24), (3, 5, 16)]


def a_day_of_leases(provider, tenant) -> list[Lease]:
    now = timezone.now()
    gpus = list(Gpu.objects.filter(node__provider=provider).order_by("node__hostname", "index"))
    leases, cursor = [], 0
    for ago, hours, count in WAVES:
        chosen = gpus[cursor:cursor + count]
        cursor = (cursor + count) % (len(gpus) - 64)
        start = now - timedelta(hours=ago)
        leases.append(leasing.create_lease(
            tenant=tenant, tier="on_demand", gpu_model="H100-80GB",
            gpus=[leasing.GpuChoice(g.pk, 2_450_000) for g in chosen], starts_at=start,
            ends_at=start + timedelta(hours=hours), price_micros=2_450_000,
            max_price_micros=3_000_000, locality={"leaves": 1, "spines": 1, "max_hops": 2},
            actor="test"))
    for lease in leases:
        if lease.ends_at <= now:
            Lease.objects.filter(pk=lease.pk).update(state="completed")
        else:
            Lease.objects.filter(pk=lease.pk).update(state="active")
    return leases


def billed_and_paid(provider, tenant, *, minutes: int = 480):
    """Usage billed for 64 GPUs over the last hours (every other minute keeps the test quick);
    payouts in each state."""
    start = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=minutes + 1)
    for i in range(0, minutes, 2):
        services.record_usage(lease_ref=f"L-0:{provider.slug}:2450000", payer=tenant,
                              payee=provider, price_per_gpu_hour_micros=2_450_000, gpus=64,
                              seconds=60, minute=start + timedelta(minutes=i))
    ConnectAccount.objects.create(organization=provider, stripe_account_id="acct_1Nv0Demo",
                                  details_submitted=True, charges_enabled=True,
                                  payouts_enabled=True)
    for amount, state, error in [(212_400_000, "paid", ""), (158_900_000, "paid", ""),
                                 (96_000_000, "failed", "the bank account was closed"),
                                 (120_000_000, "pending", "")]:
        Payout.objects.create(provider=provider, amount_micros=amount, state=state,
                              last_error=error, stripe_payout_id=f"po_{amount}")


def sla_breaches(leases):
    now = timezone.now()
    for lease, amount, why in [
            (leases[-1], 3_920_000, "availability 98.7 % < 99.5 %: 2 GPUs down 41 min"),
            (leases[-2], 1_225_000, "activation took 212 s > 120 s")]:
        SlaCredit.objects.create(lease=lease, window_start=now - timedelta(hours=2),
                                 window_end=now - timedelta(hours=1), down_gpu_seconds=4_920,
                                 lease_gpu_seconds=460_800, owed_micros=amount,
                                 amount_micros=amount, reason=why)


def deliveries_to_an_older_endpoint(leases):
    """An endpoint registered earlier, with events of the day's leases delivered to it (one
    delivery gave up after a 503)."""
    tenant = leases[0].tenant
    endpoint = WebhookEndpoint.objects.create(tenant=tenant, url="https://ops.acme.example/ibex",
                                              secret="whsec_old", description="ops dashboard")
    for i, lease in enumerate(leases[-6:]):
        for kind, at in (("lease.started", lease.starts_at), ("lease.ended", lease.ends_at)):
            if at > timezone.now():
                continue
            event = Event.objects.create(tenant=tenant, lease=lease, kind=kind,
                                         source=f"{kind}:{lease.pk}", occurred_at=at)
            failed = i == 1 and kind == "lease.ended"
            WebhookDelivery.objects.create(
                endpoint=endpoint, event=event, next_attempt_at=at,
                state="failed" if failed else "succeeded", attempts=6 if failed else 1,
                status_code=503 if failed else 200, error="HTTP 503" if failed else "",
                delivered_at=None if failed else at)
