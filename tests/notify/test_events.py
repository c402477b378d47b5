"""Tenant events: derived once from lease state changes, health events and SLA credits, and
listed at /api/v1/events/ for the tenant who owns the lease."""

from datetime import timedelta

import pytest
from django.utils import timezone

from market import leasing
from notify import events
from notify.models import Event
from pool.models import Gpu
from scheduler import sla
from tests.factories import client_for
from tests.scheduler.sla_builders import (
    HOUR,
    activate,
    funded_tenant,
    gpu_health,
    lease_gpus,
    meter,
    node_reachability,
    priced_provider,
    won_lease,
)


@pytest.fixture
def provider(db):
    return priced_provider()


@pytest.fixture
def tenant(db):
    return funded_tenant()


@pytest.fixture
def rival_tenant(db):
    return funded_tenant("rival-labs")


def kinds(**filters) -> list[str]:
    return list(Event.objects.filter(**filters).order_by("id").values_list("kind", flat=True))


def test_a_lease_that_starts_and_ends_is_told_started_and_ended_once(provider, tenant):
    lease = won_lease(tenant)
    scheduler_now = timezone.now()
    activate(lease)
    leasing.terminate_lease(lease=lease, actor="acme-ai")

    first = events.sync_events(now=scheduler_now)
    again = events.sync_events(now=scheduler_now)

    assert (first, again) == (2, 0)
    assert kinds() == ["lease.started", "lease.ended"]
    ended = Event.objects.get(kind="lease.ended")
    assert ended.tenant == tenant and ended.lease == lease
    assert ended.payload["to_state"] == "terminated"


def test_a_spot_lease_hears_its_preemption_notice_then_that_it_was_preempted(provider, tenant):
    lease = activate(won_lease(tenant, tier="spot"))
    leasing.change_lease_state(lease=lease, to_state="preempting", actor="market",
                               reason="outbid at 3.10")
    leasing.change_lease_state(lease=lease, to_state="preempted", actor="market",
                               reason="preemption notice ran out")

    events.sync_events()

    assert kinds() == ["lease.started", "lease.preemption_notice", "lease.preempted"]
    assert Event.objects.get(kind="lease.preemption_notice").payload["reason"] == "outbid at 3.10"


def test_a_failed_gpu_or_lost_node_of_a_running_lease_is_a_degraded_event(provider, tenant):
    lease = activate(won_lease(tenant))
    gpu = lease_gpus(lease)[2]
    now = timezone.now()
    gpu_health(gpu, "failed", now)
    node_reachability(gpu.node, False, now)

    events.sync_events(now=now + timedelta(seconds=1))
    events.sync_events(now=now + timedelta(seconds=2))

    degraded = list(Event.objects.filter(kind="lease.degraded").order_by("id"))
    assert [(e.payload["what"], e.payload["gpus"]) for e in degraded] == [
        ("gpu_health", [gpu.index]), ("node_unreachable", list(range(8)))]


def test_a_gpu_failing_outside_any_lease_tells_nobody(provider, tenant):
    lease = activate(won_lease(tenant))
    spare = Gpu.objects.exclude(allocations__lease=lease).first()
    gpu_health(spare, "failed", timezone.now())

    events.sync_events()

    assert kinds(kind="lease.degraded") == []


def test_an_sla_credit_is_an_event_with_its_reason(provider, tenant):
    lease = activate(won_lease(tenant), after_s=90)
    meter(lease, 1)

    credit = sla.evaluate_lease(lease=lease, now=lease.starts_at + HOUR)

    event = Event.objects.get(kind="lease.credited")
    assert event.source == f"sla_credit:{credit.pk}"
    assert event.payload["amount"] == "20.00" and "90 s" in event.payload["reason"]


def test_the_events_api_lists_your_events_newest_first_filtered_by_kind_and_lease(
        provider, tenant, rival_tenant):
    first = activate(won_lease(tenant))
    second = activate(won_lease(tenant))
    rivals = activate(won_lease(rival_tenant))
    leasing.terminate_lease(lease=first, actor="acme-ai")
    events.sync_events()
    client = client_for(tenant)

    everything = client.get("/api/v1/events/").json()
    started = client.get("/api/v1/events/", {"kind": "lease.started"}).json()
    of_first = client.get("/api/v1/events/", {"lease": first.pk}).json()
    page = client.get("/api/v1/events/", {"page_size": 1}).json()

    assert [e["kind"] for e in everything["results"]] == [
        "lease.ended", "lease.started", "lease.started"]
    assert {e["lease"] for e in started["results"]} == {first.pk, second.pk}
    assert [e["kind"] for e in of_first["results"]] == ["lease.ended", "lease.started"]
    assert len(page["results"]) == 1 and page["next"]
    assert rivals.pk not in {e["lease"] for e in everything["results"]}


def test_a_rival_sees_none_of_your_events(provider, tenant, rival_tenant):
    activate(won_lease(tenant))
    events.sync_events()
    event = Event.objects.get()
    rival = client_for(rival_tenant)

    assert rival.get("/api/v1/events/").json()["results"] == []
    assert rival.get(f"/api/v1/events/{event.pk}/").status_code == 404
    assert rival.get("/api/v1/events/", {"lease": event.lease_id}).json()["results"] == []


def test_an_unknown_kind_filter_is_refused(tenant):
    response = client_for(tenant).get("/api/v1/events/", {"kind": "lease.exploded"})

    assert response.status_code == 400


def test_listing_events_takes_the_same_queries_for_one_lease_or_many(
        provider, tenant, django_assert_max_num_queries):
    for _ in range(3):
        activate(won_lease(tenant))
    events.sync_events()
    client = client_for(tenant)

    with django_assert_max_num_queries(6):
        response = client.get("/api/v1/events/")

    assert len(response.json()["results"]) == 3
