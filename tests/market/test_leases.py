import threading
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.utils import timezone

from market import leasing
from market.models import Allocation, Lease
from tests.factories import client_for, make_org
from tests.market.inventory import gpus_of, provider_with_nodes

HOUR = timedelta(hours=1)


@pytest.fixture
def provider(db):
    return provider_with_nodes()


@pytest.fixture
def tenant(db):
    return make_org("acme-ai", "tenant")


def lease_on(tenant, gpus, start=None, hours=2, tier="on_demand"):
    start = start or timezone.now()
    return leasing.create_lease(
        tenant=tenant, tier=tier, gpu_model="H100-80GB",
        gpus=[leasing.GpuChoice(g.pk, 2_000_000) for g in gpus], starts_at=start,
        ends_at=start + hours * HOUR, price_micros=2_000_000, max_price_micros=2_500_000,
        locality={"leaves": 1, "spines": 1, "max_hops": 0}, actor="test")


def test_a_gpu_cannot_be_in_two_leases_at_overlapping_times(provider, tenant):
    gpus = gpus_of(provider)[:2]
    lease_on(tenant, gpus)

    with pytest.raises(leasing.GpusUnavailable):
        lease_on(make_org("rival-ai", "tenant"), gpus[1:], start=timezone.now() + HOUR)

    assert Lease.objects.count() == 1


def test_the_database_itself_refuses_an_overlapping_allocation(provider, tenant):
    gpu = gpus_of(provider)[0]
    lease = lease_on(tenant, [gpu])
    now = timezone.now()

    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(lease=lease, gpu=gpu, price_micros=0,
                                  period=DateTimeTZRange(now + HOUR, now + 3 * HOUR))


def test_back_to_back_leases_on_one_gpu_are_allowed(provider, tenant):
    gpu = gpus_of(provider)[0]
    first = lease_on(tenant, [gpu], hours=1)

    second = lease_on(tenant, [gpu], start=first.ends_at, hours=1)

    assert Allocation.objects.filter(gpu=gpu).count() == 2
    assert second.starts_at == first.ends_at


def test_state_changes_follow_the_table_and_are_recorded(provider, tenant):
    lease = lease_on(tenant, gpus_of(provider)[:1])
    lease = leasing.change_lease_state(lease=lease, to_state="placing", actor="scheduler",
                                       reason="placing")
    lease = leasing.change_lease_state(lease=lease, to_state="active", actor="scheduler",
                                       reason="bound")

    with pytest.raises(leasing.LeaseTransitionError):
        leasing.change_lease_state(lease=lease, to_state="pending", actor="x", reason="no")

    assert [(e.from_state, e.to_state) for e in lease.events.all()] == [
        ("", "pending"), ("pending", "placing"), ("placing", "active")]


def test_terminating_frees_the_gpus_from_that_moment(provider, tenant):
    gpus = gpus_of(provider)[:2]
    lease = lease_on(tenant, gpus, hours=4)

    leasing.terminate_lease(lease=lease, actor="acme-ai")

    assert Lease.objects.get(pk=lease.pk).state == "terminated"
    lease_on(make_org("rival-ai", "tenant"), gpus, start=timezone.now() + timedelta(minutes=1))


def test_extending_works_while_the_gpus_stay_free_and_is_refused_otherwise(provider, tenant):
    gpus = gpus_of(provider)[:2]
    lease = lease_on(tenant, gpus, hours=1)
    extended = leasing.extend_lease(lease=lease, hours=1, actor="acme-ai")
    lease_on(make_org("rival-ai", "tenant"), gpus[:1], start=extended.ends_at, hours=1)

    with pytest.raises(leasing.GpusUnavailable):
        leasing.extend_lease(lease=extended, hours=1, actor="acme-ai")

    assert Lease.objects.get(pk=lease.pk).ends_at == extended.ends_at


def test_the_api_shows_a_tenant_its_lease_and_a_rival_gets_404(provider, tenant):
    lease = lease_on(tenant, gpus_of(provider)[:2])
    rival = client_for(make_org("rival-ai", "tenant"))

    body = client_for(tenant).get(f"/api/v1/leases/{lease.pk}/").json()

    assert body["state"] == "pending"
    assert body["gpus"] == [{"node": "hpc-provider-01", "index": 0},
                            {"node": "hpc-provider-01", "index": 1}]
    assert body["price_per_gpu_hour"] == "2.00"
    assert body["locality"] == {"leaves": 1, "spines": 1, "max_hops": 0}
    assert body["events"][0]["to_state"] == "pending"
    assert rival.get(f"/api/v1/leases/{lease.pk}/").status_code == 404
    assert rival.post(f"/api/v1/leases/{lease.pk}/terminate/").status_code == 404


def test_the_api_terminates_and_extends(provider, tenant):
    lease = lease_on(tenant, gpus_of(provider)[:1], hours=1)
    client = client_for(tenant)

    extended = client.post(f"/api/v1/leases/{lease.pk}/extend/", {"hours": 2}, format="json")
    bad = client.post(f"/api/v1/leases/{lease.pk}/extend/", {"hours": 0}, format="json")
    ended = client.post(f"/api/v1/leases/{lease.pk}/terminate/")
    again = client.post(f"/api/v1/leases/{lease.pk}/terminate/")

    assert extended.status_code == 200
    assert bad.status_code == 400 and "hours" in bad.json()["error"]["fields"]
    assert ended.json()["state"] == "terminated"
    assert again.status_code == 409


@pytest.mark.django_db(transaction=True)
def test_200_tenants_racing_for_the_last_gpus_never_share_one():
    provider = provider_with_nodes(nodes=2)
    last_gpus = gpus_of(provider)[:4]
    start = timezone.now()
    tenants = [make_org(f"tenant-{n:03d}", "tenant") for n in range(200)]
    barrier = threading.Barrier(20)
    won, refused, failed = [], [], []

    def race(batch):
        barrier.wait()
        try:
            for tenant in batch:
                try:
                    # each wants two of the four, overlapping in time with everyone else
                    pair = last_gpus[len(won) % 3: len(won) % 3 + 2]
                    won.append(lease_on(tenant, pair, start=start).pk)
                except leasing.GpusUnavailable:
                    refused.append(tenant.slug)
        except Exception as exc:  # any other failure fails the test below
            failed.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=race, args=(tenants[i::20],)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failed == []
    assert len(won) + len(refused) == 200
    assert 1 <= len(won) <= 2
    periods = list(Allocation.objects.values_list("gpu_id", flat=True))
    assert len(periods) == len(set(periods)), "a GPU is in two overlapping leases"
