"""A lease's workload as its tenant sees it through the API: each rank's state, the SSH lines,
the logs, and a notice that reaches the nodes (docs/workloads.md)."""

import base64
from datetime import timedelta

import pytest
from django.utils import timezone

from market import leasing
from market.models import Lease
from pool import services as pool
from pool import workloads
from pool.models import Binding, Node
from scheduler.placing import place_lease
from tests.factories import client_for, make_org
from tests.market.inventory import gpus_of, provider_with_nodes

KEY = "ssh-ed25519 " + base64.b64encode(
    b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + bytes(range(32))).decode() + " alice@laptop"
WORKLOAD = {"command": ["python3", "train.py"], "env": {"EPOCHS": "3"}, "workdir": ""}


@pytest.fixture
def provider(db):
    provider = provider_with_nodes()
    for number, node in enumerate(Node.objects.filter(provider=provider).order_by("hostname")):
        node.runtime, node.address, node.ssh_port = "ssh", f"10.0.0.{number + 1}", 2222
        node.save()
        beat(node)  # active, and offered
    return provider


@pytest.fixture
def tenant(db):
    return make_org("acme-ai", "tenant")


def two_node_lease(tenant, provider, workload=WORKLOAD, ssh_keys=(KEY,), index=0) -> Lease:
    """A placed lease on GPU `index` of the first two nodes."""
    nodes = sorted({g.node_id for g in gpus_of(provider)})[:2]
    gpus = [g for g in gpus_of(provider) if g.node_id in nodes and g.index == index]
    start = timezone.now()
    lease = leasing.create_lease(
        tenant=tenant, tier="on_demand", gpu_model="H100-80GB",
        gpus=[leasing.GpuChoice(g.pk, 2_000_000) for g in gpus], starts_at=start,
        ends_at=start + timedelta(hours=2), price_micros=2_000_000, max_price_micros=2_000_000,
        locality={"leaves": 1, "spines": 1, "max_hops": 2}, actor="test",
        workload=workload, ssh_keys=list(ssh_keys))
    return place_lease(lease_id=lease.pk)


def beat(node, serving=(), reports=()):
    node.has_bindings = True
    return pool.record_heartbeat(node=node, gpus=[{"index": i} for i in range(8)], ib_ports=[],
                                 serving=list(serving), workloads_reported=list(reports))


def run_ranks(lease, *states):
    """Every rank reports its state (rank 0 also the port it chose)."""
    for rank, state in enumerate(states):
        binding = Binding.objects.select_related("node").get(lease_ref=lease.reference,
                                                             node_rank=rank)
        beat(binding.node, [lease.reference], [{
            "lease": lease.reference, "generation": binding.generation, "state": state,
            "exit_code": 0 if state == "exited" else None, "master_port": 29500}])


def test_the_lease_shows_each_ranks_state_and_the_ssh_line_of_each_node(provider, tenant):
    lease = two_node_lease(tenant, provider)
    run_ranks(lease, "running", "exited")

    shown = client_for(tenant).get(f"/api/v1/leases/{lease.pk}/").json()

    first, second = sorted(Node.objects.filter(provider=provider), key=str)[:2]
    assert shown["workload"]["state"] == "running"
    assert shown["workload"]["command"] == ["python3", "train.py"]
    assert [(n["node"], n["node_rank"], n["state"], n["exit_code"])
            for n in shown["workload"]["nodes"]] == [
        (first.hostname, 0, "running", None), (second.hostname, 1, "exited", 0)]
    assert shown["access"] == [
        {"node": first.hostname, "ssh": f"ssh -p 2222 ibex-l{lease.pk}@10.0.0.1", "slurm": None},
        {"node": second.hostname, "ssh": f"ssh -p 2222 ibex-l{lease.pk}@10.0.0.2", "slurm": None}]


def test_a_rank_that_could_not_start_says_why(provider, tenant):
    lease = two_node_lease(tenant, provider)
    run_ranks(lease, "running")
    rank_one = Binding.objects.select_related("node").get(lease_ref=lease.reference, node_rank=1)
    beat(rank_one.node, [lease.reference], [{
        "lease": lease.reference, "generation": rank_one.generation, "state": "failed",
        "exit_code": 127, "error": "command not found: python3"}])

    shown = client_for(tenant).get(f"/api/v1/leases/{lease.pk}/").json()["workload"]

    assert shown["state"] == "failed"
    assert [(n["state"], n["exit_code"], n["error"]) for n in shown["nodes"]] == [
        ("running", None, ""), ("failed", 127, "command not found: python3")]


def test_a_lease_without_workload_or_keys_shows_none_and_no_ssh(provider, tenant):
    lease = two_node_lease(tenant, provider, workload=None, ssh_keys=())

    shown = client_for(tenant).get(f"/api/v1/leases/{lease.pk}/").json()

    assert shown["workload"] is None
    assert [a["ssh"] for a in shown["access"]] == [None, None]


def test_the_lease_list_reads_every_leases_ranks_in_one_query(provider, tenant,
                                                               django_assert_max_num_queries):
    client = client_for(tenant)
    two_node_lease(tenant, provider)
    client.get("/api/v1/leases/")
    with django_assert_max_num_queries(30) as one:
        client.get("/api/v1/leases/")
    for index in (1, 2):
        two_node_lease(tenant, provider, index=index)

    with django_assert_max_num_queries(len(one.captured_queries)):
        listed = client.get("/api/v1/leases/").json()

    assert len(listed["results"]) == 3


def test_a_ranks_output_is_tailed_through_the_api_with_its_cursor(provider, tenant):
    lease = two_node_lease(tenant, provider)
    run_ranks(lease, "running", "running")
    rank_one = Binding.objects.select_related("node").get(lease_ref=lease.reference, node_rank=1)
    workloads.append_log(node=rank_one.node, lease_ref=lease.reference,
                         generation=rank_one.generation, from_line=0,
                         lines=["rank 1 sees MASTER_ADDR=10.0.0.1", "connected"])
    client = client_for(tenant)

    page = client.get(f"/api/v1/leases/{lease.pk}/logs/?node_rank=1").json()
    workloads.append_log(node=rank_one.node, lease_ref=lease.reference,
                         generation=rank_one.generation, from_line=2, lines=["step 1"])
    tail = client.get(f"/api/v1/leases/{lease.pk}/logs/?node_rank=1&since={page['cursor']}")

    assert page["lines"] == ["rank 1 sees MASTER_ADDR=10.0.0.1", "connected"]
    assert (page["node"], page["node_rank"], page["dropped"]) == (rank_one.node.hostname, 1, 0)
    assert tail.json()["lines"] == ["step 1"]


@pytest.mark.parametrize("query, field", [("node_rank=7", "node_rank"),
                                          ("node_rank=-1", "node_rank"),
                                          ("since=garbage", "since")])
def test_a_bad_log_query_is_a_400_naming_the_parameter(provider, tenant, query, field):
    lease = two_node_lease(tenant, provider)

    response = client_for(tenant).get(f"/api/v1/leases/{lease.pk}/logs/?{query}")

    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]


def test_another_tenants_lease_logs_are_a_404(provider, tenant):
    lease = two_node_lease(tenant, provider)

    response = client_for(make_org("rival-ai", "tenant")).get(f"/api/v1/leases/{lease.pk}/logs/")

    assert response.status_code == 404


def test_a_preempted_lease_gives_its_nodes_notice_until_it_ends(provider, tenant):
    lease = two_node_lease(tenant, provider)
    run_ranks(lease, "running", "running")
    lease = Lease.objects.get(pk=lease.pk)
    assert lease.state == "active"

    lease = leasing.give_notice(lease=lease, reason="outbid", now=timezone.now(), actor="market")

    rank_zero = Binding.objects.select_related("node").get(lease_ref=lease.reference,
                                                           node_rank=0)
    actions = beat(rank_zero.node, [lease.reference]).actions
    assert actions == [{"action": "notice", "lease": lease.reference, "gpus": [0],
                        "until": lease.preempt_at.isoformat()}]
