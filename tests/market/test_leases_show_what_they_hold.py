"""A lease lists the GPUs and the locality of the allocations in force now: after a move or a
repair the GPUs it left are in its events, not in what the API and the pages show."""

from django.test import Client

from market import leasing
from market.models import Allocation
from tests.factories import client_for, make_org
from tests.market.inventory import gpus_of, provider_with_nodes
from tests.market.test_leases import lease_on
from tests.web.conftest import person


def active_lease_moved_one_gpu(tenant):
    """An 8-GPU lease on node01 whose GPU 3 failed and was moved to another node."""
    provider = provider_with_nodes(nodes=4)
    gpus = gpus_of(provider)
    lease = lease_on(tenant, gpus[:8])
    for state in ("placing", "active"):
        leasing.change_lease_state(lease=lease, to_state=state, actor="test", reason="test")
    spare = gpus[16]  # on another leaf
    leasing.move_gpus(lease=lease, away_from=[gpus[3].pk],
                      onto=[leasing.GpuChoice(spare.pk, 2_000_000)], reason="GPU failed")
    return lease, gpus[3], spare


def test_the_api_lists_only_the_gpus_in_force_after_a_move(tenant):
    lease, left, spare = active_lease_moved_one_gpu(tenant)

    body = client_for(tenant).get(f"/api/v1/leases/{lease.pk}/").json()

    listed = [(g["node"], g["index"]) for g in body["gpus"]]
    assert len(listed) == 8 == lease.gpu_count
    assert (left.node.hostname, left.index) not in listed
    assert (spare.node.hostname, spare.index) in listed
    assert body["locality"] == {"leaves": 2, "spines": 1, "max_hops": 4}
    assert Allocation.objects.filter(lease=lease).count() == 9  # the history is kept


def test_the_move_event_names_gpus_as_node_and_index(tenant):
    lease, left, spare = active_lease_moved_one_gpu(tenant)

    moved = lease.events.get(kind="moved").reason

    assert moved == (f"GPU failed: {left.node.hostname}/{left.index} → "
                     f"{spare.node.hostname}/{spare.index}")


def test_a_terminated_moved_lease_lists_what_it_held_at_its_end(tenant):
    lease, left, spare = active_lease_moved_one_gpu(tenant)
    leasing.terminate_lease(lease=lease, actor="acme-ai")

    body = client_for(tenant).get(f"/api/v1/leases/{lease.pk}/").json()

    assert len(body["gpus"]) == 8
    assert {"node": left.node.hostname, "index": left.index} not in body["gpus"]


def test_the_pages_show_the_gpus_and_locality_in_force(tenant):
    lease, left, spare = active_lease_moved_one_gpu(tenant)
    web = Client()
    web.force_login(person("acme-owner", tenant))

    page = web.get(f"/app/leases/{lease.pk}/").content.decode()
    activity = web.get("/app/activity/").content.decode()

    for html in (page, activity):
        assert f"{spare.node.hostname}/{spare.index}</div>" in html
        assert f"{left.node.hostname}/0-2,4-7</div>" in html
        assert "2 leaves · 1 spine · 4 hops" in html


def test_a_rivals_lease_is_still_a_404(tenant):
    lease, _, _ = active_lease_moved_one_gpu(tenant)

    rival = client_for(make_org("rival-labs", "tenant"))

    assert rival.get(f"/api/v1/leases/{lease.pk}/").status_code == 404
