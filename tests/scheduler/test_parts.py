"""Leases of parts of GPUs from order to active: the nodes' bindings carry the parts, the
agents report the devices they made, and moves (remediation, defragmentation) keep them parts."""

from datetime import timedelta

import pytest
from django.utils import timezone

from billing import services as money
from market import auctions, leasing, prices
from market.models import Allocation, Lease
from pool import services as pool
from pool.models import Binding, Gpu, Node
from scheduler import placing as scheduler
from scheduler.models import DefragRun
from scheduler.moves import defrag, remediation
from tests.factories import client_for, make_org
from tests.market.inventory import provider_with_nodes
from tests.pool.conftest import heartbeat


@pytest.fixture
def tenant_client(db):
    provider = provider_with_nodes(nodes=2)
    Node.objects.update(state="active")
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_800_000,
                      actor="t", shareable=True)
    tenant = make_org("acme-ai", "tenant")
    money.grant_credit(organization=tenant, amount_micros=1_000_000_000, reason="t", actor="t")
    return client_for(tenant)


def ordered(client, **product) -> Lease:
    body = client.post("/api/v1/orders/", {
        "gpu_models": ["H100-80GB"], "count": 1, "hours": 2, "tier": "on_demand",
        "max_price_per_gpu_hour": "3.00", **product}, format="json").json()
    assert body["state"] in ("filled", "resting"), body
    return Lease.objects.get(pk=body["lease"]) if body["lease"] else body["id"]


def activate(lease: Lease) -> Lease:
    scheduler.place_lease(lease_id=lease.pk)
    Binding.objects.filter(lease_ref=lease.reference).update(acknowledged_at=timezone.now())
    scheduler.activate_acknowledged_leases()
    lease.refresh_from_db()
    assert lease.state == "active"
    return lease


def parts_held(lease) -> list[tuple]:
    return sorted(Allocation.objects.filter(lease=lease, period__contains=timezone.now())
                  .values_list("gpu_id", "part", "span"), key=lambda r: (r[0], r[2].lower))


def test_a_slice_lease_reaches_its_node_as_a_part_and_shows_the_device_the_agent_made(
        tenant_client):
    lease = ordered(tenant_client, mig_profile="1g.10gb")
    scheduler.place_lease(lease_id=lease.pk)
    binding = Binding.objects.get(lease_ref=lease.reference)
    token = pool.rotate_node_token(node=binding.node)
    assert binding.parts == [{"index": binding.gpu_indexes[0], "mig_profile": "1g.10gb",
                              "start": 0}]

    answer = heartbeat(binding.node_id, token).json()
    [start] = [a for a in answer["actions"] if a["lease"] == lease.reference]
    assert start["parts"] == binding.parts
    device = {**binding.parts[0], "uuid": "MIG-5e1f0c9a-0000-4000-8000-000000000001",
              "enforced": True, "error": ""}
    heartbeat(binding.node_id, token, serving=[lease.reference],
              devices={lease.reference: [device]})

    lease.refresh_from_db()
    assert lease.state == "active"
    shown = tenant_client.get(f"/api/v1/leases/{lease.pk}/").json()
    assert shown["gpus"] == [{"node": binding.node.hostname, "index": binding.gpu_indexes[0],
                              "mig_profile": "1g.10gb", "device": device["uuid"],
                              "enforced": True, "error": ""}]


def test_a_share_the_node_cannot_enforce_says_why_in_the_lease(tenant_client):
    lease = ordered(tenant_client, gpu_share=250)
    scheduler.place_lease(lease_id=lease.pk)
    binding = Binding.objects.get(lease_ref=lease.reference)
    token = pool.rotate_node_token(node=binding.node)
    part = binding.parts[0]
    assert part == {"index": binding.gpu_indexes[0], "share": 250, "memory_mib": 20389}

    heartbeat(binding.node_id, token, serving=[lease.reference], devices={lease.reference: [
        {**part, "enforced": False, "error": "no MPS control daemon on this node"}]})

    [gpu] = tenant_client.get(f"/api/v1/leases/{lease.pk}/").json()["gpus"]
    assert (gpu["share"], gpu["enforced"], gpu["error"]) == (
        250, False, "no MPS control daemon on this node")


def test_a_malformed_device_report_is_a_400_naming_the_lease(tenant_client):
    lease = ordered(tenant_client, gpu_share=250)
    scheduler.place_lease(lease_id=lease.pk)
    binding = Binding.objects.get(lease_ref=lease.reference)
    token = pool.rotate_node_token(node=binding.node)

    response = heartbeat(binding.node_id, token, serving=[lease.reference],
                         devices={lease.reference: [{"index": "zero"}]})

    assert response.status_code == 400
    assert f"devices.{lease.reference}" in response.json()["error"]["fields"]


def test_a_share_on_a_failed_gpu_is_moved_to_another_share(tenant_client):
    lease = activate(ordered(tenant_client, gpu_share=250))
    [(gpu_id, _, _)] = parts_held(lease)
    gpu = Gpu.objects.get(pk=gpu_id)
    reports = [{"index": i} for i in range(8)]
    reports[gpu.index]["ecc_errors"] = 1
    pool.record_heartbeat(node=gpu.node, gpus=reports, ib_ports=[], serving=[])

    assert remediation.remediate_leases() == {lease.pk: "moved"}

    [(new_gpu, part, span)] = parts_held(lease)
    assert new_gpu != gpu_id and part == "share" and span.upper - span.lower == 250
    binding = Binding.objects.get(lease_ref=lease.reference, serve=True)
    assert binding.parts[0]["share"] == 250
    assert Allocation.objects.get(lease=lease, gpu_id=new_gpu).price_micros == 700_000


def two_gpus_with_a_share_each(client, interval_s: int, tier: str) -> list[Lease]:
    """Two leases of a 300 share on two GPUs: a 600 share held the first one's GPU while the
    second was placed, and has ended since."""
    now = timezone.now()
    product = {"tier": tier, "gpu_share": 300}
    first = ordered(client, **product)
    auctions.clear_markets(now=now - timedelta(seconds=interval_s))
    between = ordered(client, gpu_share=600)  # beside the first: one GPU, 900 of 1000
    second = ordered(client, **product)
    auctions.clear_markets(now=now)
    leases = [activate(o if isinstance(o, Lease) else Lease.objects.get(order__id=o))
              for o in (first, second)]
    leasing.terminate_lease(lease=between, actor="test")
    assert len({parts_held(lease)[0][0] for lease in leases}) == 2
    return leases


def test_the_defragmenter_frees_a_whole_gpu_from_two_spot_shares(tenant_client, settings):
    leases = two_gpus_with_a_share_each(tenant_client, settings.AUCTION_INTERVAL_S, "spot")
    held = {parts_held(lease)[0][0] for lease in leases}

    run = defrag.defragment()

    after = {parts_held(lease)[0][0] for lease in leases}
    assert len(after) == 1 and after < held
    spans = sorted((parts_held(lease)[0][2] for lease in leases), key=lambda s: s.lower)
    assert spans[0].upper <= spans[1].lower  # side by side, never overlapping
    assert run == DefragRun.objects.get() and run.moves_applied == 1
    assert run.moves[0]["parts"] and run.moves[0]["applied"]
    moved = next(lease for lease in leases if lease.events.filter(kind="moved").exists())
    assert "a whole GPU freed" in moved.events.get(kind="moved").reason
    binding = Binding.objects.get(lease_ref=moved.reference, serve=True)
    assert binding.parts[0]["share"] == 300


def test_the_defragmenter_never_moves_parts_of_an_on_demand_lease(tenant_client, settings):
    leases = two_gpus_with_a_share_each(tenant_client, settings.AUCTION_INTERVAL_S,
                                        "on_demand")
    held = {parts_held(lease)[0][0] for lease in leases}

    run = defrag.defragment()

    assert run.moves_planned == 0
    assert {parts_held(lease)[0][0] for lease in leases} == held
