import subprocess
import threading

import pytest
from django.db import connection

from billing import services as money
from billing.models import Hold
from market import prices
from market.models import Allocation, Lease, Order
from pool.models import Node
from scheduler import placing as scheduler
from tests.factories import client_for, make_org
from tests.market.inventory import gpus_of, provider_with_nodes

ORDER = {"gpu_models": ["H100-80GB"], "gpus": 8, "hours": 2, "tier": "on_demand",
         "max_price_per_gpu_hour": "3.00"}


@pytest.fixture
def provider(db):
    provider = provider_with_nodes(nodes=4)  # 32 GPUs: 2 leaves of 2 nodes
    Node.objects.update(state="active")
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_500_000,
                      actor="test")
    return provider


@pytest.fixture
def tenant(db):
    tenant = make_org("acme-ai", "tenant")
    money.grant_credit(organization=tenant, amount_micros=1_000 * 1_000_000, reason="test",
                       actor="test")
    return tenant


@pytest.fixture
def tenant_client(tenant):
    return client_for(tenant)


def order(client, key=None, **changes):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return client.post("/api/v1/orders/", {**ORDER, **changes}, format="json", **headers)


def test_an_on_demand_order_fills_at_once_at_posted_prices(provider, tenant_client, tenant):
    response = order(tenant_client)

    body = response.json()
    assert response.status_code == 201, body
    assert body["state"] == "filled" and body["lease"] is not None
    lease = Lease.objects.get(pk=body["lease"])
    assert lease.price_micros == 2_500_000
    assert lease.locality == {"leaves": 1, "spines": 1, "max_hops": 0}
    assert Allocation.objects.filter(lease=lease).count() == 8
    assert Hold.objects.get(order_ref=f"order-{body['id']}").amount_micros == 8 * 2 * 3_000_000


def test_on_demand_takes_the_cheapest_gpus_that_fit(provider, tenant_client):
    node = gpus_of(provider)[8].node  # the second node
    prices.set_prices(provider=provider, scope={"node": node.hostname}, price_micros=1_000_000,
                      actor="test")

    lease_id = order(tenant_client).json()["lease"]

    hosts = set(Allocation.objects.filter(lease_id=lease_id).values_list(
        "gpu__node__hostname", flat=True))
    assert hosts == {node.hostname}
    assert Lease.objects.get(pk=lease_id).price_micros == 1_000_000


def test_gpus_above_the_limit_are_never_sold(provider, tenant_client):
    response = order(tenant_client, max_price_per_gpu_hour="2.00")

    body = response.json()
    assert body["state"] == "refused"
    assert body["reason"] == ("the cheapest placement needs GPUs at up to 2.50 per GPU-hour, "
                              "above the limit 2.00")
    assert Lease.objects.count() == 0
    assert Hold.objects.get().state == "closed"


def test_a_required_leaf_that_no_leaf_can_hold_is_refused_with_the_engines_reason(
        provider, tenant_client):
    response = order(tenant_client, gpus=24, topology={"required": "leaf"})

    assert response.json()["state"] == "refused"
    assert response.json()["reason"] == "only 16 of 24 GPUs fit within one leaf"


def test_a_resting_order_waits_with_its_reason(provider, tenant_client):
    response = order(tenant_client, gpus=24, topology={"required": "leaf"}, fill="rest")

    assert response.json()["state"] == "resting"
    cancelled = tenant_client.post(f"/api/v1/orders/{response.json()['id']}/cancel/")
    assert cancelled.json()["state"] == "cancelled"
    assert Hold.objects.get().state == "closed"


def test_the_same_idempotency_key_places_one_order(provider, tenant_client):
    first = order(tenant_client, key="abc-1")
    again = order(tenant_client, key="abc-1")

    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert Order.objects.count() == 1 and Lease.objects.count() == 1


def test_an_order_that_would_overdraw_is_refused_and_holds_nothing(provider):
    poor = make_org("poor-ai", "tenant")
    money.grant_credit(organization=poor, amount_micros=10_000_000, reason="test", actor="test")

    response = order(client_for(poor))

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "insufficient_funds"
    assert Order.objects.count() == 0 and Hold.objects.count() == 0


def test_an_order_larger_than_any_fabric_names_gpus_even_when_it_would_also_overdraw(provider):
    poor = make_org("poor-ai", "tenant")
    money.grant_credit(organization=poor, amount_micros=10_000_000, reason="test", actor="test")

    response = order(client_for(poor), gpus=33)

    assert response.status_code == 400, response.json()
    assert "no fabric has 33 GPUs" in str(response.json()["error"]["fields"]["gpus"])
    assert Order.objects.count() == 0 and Hold.objects.count() == 0


def test_a_filled_on_demand_order_takes_a_bounded_number_of_queries(
        provider, tenant_client, django_assert_max_num_queries):
    order(tenant_client, gpus=1)  # the first request warms per-process state (API key, etc.)

    # one read of the free GPUs, no size aggregate; one lock per GPU model named
    with django_assert_max_num_queries(33):
        response = order(tenant_client, gpus=1)

    assert response.json()["state"] == "filled"


@pytest.mark.parametrize("changes, field", [
    ({"gpu_models": ["GTX-1080"]}, "gpu_models"),
    ({"gpus": 0}, "gpus"),
    ({"hours": -1}, "hours"),
    ({"max_price_per_gpu_hour": "-0.01"}, "max_price_per_gpu_hour"),
    ({"gpus": 33}, "gpus"),
    ({"tier": "reserved"}, "start_window"),
    ({"tier": "reserved", "start_window": {"earliest": "2026-12-02T00:00:00Z",
                                           "latest": "2026-12-01T00:00:00Z"}},
     "start_window.latest"),
    ({"tier": "reserved", "start_window": {"earliest": "2001-01-01T00:00:00Z",
                                           "latest": "2001-01-02T00:00:00Z"}},
     "start_window"),  # long past
    ({"tier": "reserved", "start_window": {"earliest": "9999-01-01T00:00:00Z",
                                           "latest": "9999-01-02T00:00:00Z"}},
     "start_window"),  # beyond the market's horizon
    ({"topology": {"required": "rack"}}, "topology.required"),
    ({"colour": "green"}, "colour"),
])
def test_bad_orders_name_the_field_and_change_nothing(provider, tenant_client, changes, field):
    response = order(tenant_client, **changes)

    assert response.status_code == 400, response.json()
    assert field in response.json()["error"]["fields"]
    assert Order.objects.count() == 0 and Hold.objects.count() == 0


def test_a_rival_tenants_order_is_a_404(provider, tenant_client):
    order_id = order(tenant_client).json()["id"]
    rival = client_for(make_org("rival-ai", "tenant"))

    assert rival.get(f"/api/v1/orders/{order_id}/").status_code == 404
    assert rival.post(f"/api/v1/orders/{order_id}/cancel/").status_code == 404


def test_a_won_lease_is_bound_to_its_nodes_and_activated_once_they_serve_it(provider,
                                                                            tenant_client):
    from pool.models import Binding

    lease_id = order(tenant_client).json()["lease"]

    scheduler.place_lease(lease_id=lease_id)
    scheduler.place_lease(lease_id=lease_id)  # delivered twice: bound once
    binding = Binding.objects.get()
    assert Lease.objects.get(pk=lease_id).state == "placing"
    assert scheduler.activate_acknowledged_leases() == []
    Binding.objects.update(acknowledged_at=binding.created_at)

    assert scheduler.activate_acknowledged_leases() == [lease_id]
    assert Lease.objects.get(pk=lease_id).state == "active"


@pytest.mark.django_db(transaction=True)
def test_200_tenants_ordering_the_last_gpus_at_once_never_share_one():
    provider = provider_with_nodes(nodes=2)  # 16 GPUs
    Node.objects.update(state="active")
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=1_000_000,
                      actor="test")
    tenants = []
    for n in range(200):
        tenant = make_org(f"tenant-{n:02d}", "tenant")
        money.grant_credit(organization=tenant, amount_micros=100 * 1_000_000, reason="t",
                           actor="t")
        tenants.append(tenant)
    threads_count = 25  # 200 tenants on 25 connections: the server allows 100
    barrier = threading.Barrier(threads_count)
    outcomes, failures = [], []

    def buy(batch):
        from market import orders

        barrier.wait()
        try:
            for tenant in batch:
                placed = orders.place_order(
                    tenant=tenant, actor=tenant.slug, request=orders.OrderRequest(
                        gpu_models=["H100-80GB"], gpus=4, hours=1, tier="on_demand",
                        max_price_micros=2_000_000))
                outcomes.append(placed.state)
        except Exception as exc:  # any failure fails the test below
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=buy, args=(tenants[i::threads_count],))
               for i in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failures == []
    assert outcomes.count("filled") == 4
    assert outcomes.count("refused") == 196
    # refused because the GPUs were sold, never because another order crossed it
    assert set(Order.objects.filter(state="refused").values_list("reason", flat=True)) == {
        "only 0 of 4 GPUs fit"}
    gpu_ids = list(Allocation.objects.values_list("gpu_id", flat=True))
    assert len(gpu_ids) == len(set(gpu_ids)) == 16


def test_gpus_outside_their_offer_window_or_minimum_length_are_not_sold(provider, tenant_client):
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_000_000,
                      actor="test", offered_until=now + timedelta(hours=1))
    short_window = order(tenant_client, hours=2).json()
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_000_000,
                      actor="test", min_lease_hours=4)
    too_short = order(tenant_client, hours=2).json()
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_000_000,
                      actor="test", offered_until=now + timedelta(hours=3))
    fits = order(tenant_client, hours=2).json()

    assert short_window["state"] == "refused"
    assert too_short["state"] == "refused"
    assert fits["state"] == "filled"


def test_a_resting_order_fills_when_capacity_frees(provider, tenant_client, tenant):
    from market import leasing, orders

    first = order(tenant_client, gpus=32).json()
    waiting = order(tenant_client, gpus=8, fill="rest").json()
    assert waiting["state"] == "resting"
    assert orders.retry_resting_orders() == []

    leasing.terminate_lease(lease=Lease.objects.get(pk=first["lease"]), actor="acme-ai")

    assert orders.retry_resting_orders() == [waiting["id"]]
    assert Order.objects.get(pk=waiting["id"]).state == "filled"


def test_active_leases_complete_at_their_end_time(provider, tenant_client):
    from datetime import timedelta

    from django.utils import timezone

    from market import leasing

    lease = Lease.objects.get(pk=order(tenant_client).json()["lease"])
    Lease.objects.filter(pk=lease.pk).update(state="active")

    assert leasing.complete_ended_leases(now=timezone.now()) == []
    assert leasing.complete_ended_leases(now=lease.ends_at + timedelta(seconds=1)) == [lease.pk]
    assert Lease.objects.get(pk=lease.pk).state == "completed"


def test_a_running_lease_is_metered_per_minute_at_its_posted_prices(provider, tenant_client,
                                                                    tenant):
    from datetime import timedelta

    from billing.models import UsageRecord
    from market import leasing, metering

    lease = Lease.objects.get(pk=order(tenant_client).json()["lease"])
    leasing.change_lease_state(lease=lease, to_state="placing", actor="t", reason="t")
    leasing.change_lease_state(lease=lease, to_state="active", actor="t", reason="t")
    next_minute = (lease.events.get(to_state="active").at + timedelta(minutes=1)).replace(
        second=0, microsecond=0)

    assert metering.meter_minute(minute=next_minute) == 1
    assert metering.meter_minute(minute=next_minute) == 1  # re-run: billed once
    usage = UsageRecord.objects.get()
    assert usage.charge_micros == 8 * 2_500_000 // 60  # 8 GPUs for 60 s at 2.50 an hour
    assert money.balances_of(provider).payable_micros > 0


def test_ending_a_lease_releases_what_its_hold_did_not_capture(provider, tenant_client, tenant):
    response = order(tenant_client).json()
    held = money.balances_of(tenant).held_micros
    assert held == 8 * 2 * 3_000_000

    tenant_client.post(f"/api/v1/leases/{response['lease']}/terminate/")

    assert money.balances_of(tenant).held_micros == 0
    assert Hold.objects.get(order_ref=f"order-{response['id']}").state == "closed"


# --- workloads and SSH keys: checked at intake, kept on the order, copied to its lease ---------

WORKLOAD = {"command": ["python3", "train.py", "--epochs", "3"], "env": {"SEED": "7"},
            "workdir": "runs/first"}


@pytest.fixture
def ed25519_key(tmp_path) -> str:
    path = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ada@laptop", "-f",
                    str(path)], check=True)
    return (tmp_path / "id.pub").read_text().strip()


def test_an_orders_workload_and_keys_are_kept_and_copied_to_its_lease(provider, tenant_client,
                                                                      ed25519_key):
    Node.objects.update(runtime="ssh")  # SSH keys need nodes whose agent runs SSH
    response = order(tenant_client, workload=WORKLOAD, ssh_keys=[ed25519_key])

    body = response.json()
    assert response.status_code == 201, body
    assert body["workload"] == WORKLOAD and body["ssh_keys"] == [ed25519_key]
    lease = Lease.objects.get(pk=body["lease"])
    assert lease.workload == WORKLOAD
    assert lease.ssh_keys == [ed25519_key]


def test_an_order_without_a_workload_has_none(provider, tenant_client):
    body = order(tenant_client).json()

    assert body["workload"] is None and body["ssh_keys"] == []
    assert Lease.objects.get(pk=body["lease"]).workload is None


@pytest.mark.parametrize("changes, field", [
    ({"workload": {"command": "python3 train.py"}}, "workload.command"),
    ({"workload": {"command": ["python3"], "env": {"NODE_RANK": "0"}}}, "workload.env.NODE_RANK"),
    ({"workload": {"command": ["python3"], "workdir": "../etc"}}, "workload.workdir"),
    ({"workload": {"command": ["python3"], "shell": True}}, "workload.shell"),
    ({"ssh_keys": ["ssh-dss AAAAB3NzaC1kc3MAAACBAP8="]}, "ssh_keys.0"),
    ({"ssh_keys": ["not a key"]}, "ssh_keys.0"),
])
def test_a_bad_workload_or_key_is_a_400_naming_the_field_and_records_nothing(
        provider, tenant_client, changes, field):
    response = order(tenant_client, **changes)

    assert response.status_code == 400, response.json()
    assert field in response.json()["error"]["fields"]
    assert Order.objects.count() == 0 and Lease.objects.count() == 0
