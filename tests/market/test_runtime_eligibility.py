"""An order is matched only to GPUs whose node's agent can run what it asks (issue 19): a
workload needs runtime process or ssh, SSH keys need ssh, an order asking neither takes any
node. A refusal caused by the runtime says so and holds nothing."""

import pytest

from billing.models import Hold
from market import auctions
from market.models import Allocation, Lease, Order
from pool.models import Node
from tests.market.test_auctions import bid, funded_tenant, market_with_32_gpus_at
from tests.market.test_orders import WORKLOAD, ed25519_key, order  # noqa: F401 - a fixture

RUNS_COMMANDS = "a workload needs nodes whose agent runs commands (runtime process or ssh)"


@pytest.fixture
def provider(db):
    return market_with_32_gpus_at(2_500_000)  # 4 nodes of 8 H100s, their agents run nothing


@pytest.fixture
def tenant_client(db):
    from tests.factories import client_for

    return client_for(funded_tenant("acme-ai"))


def hosts_of(lease_id) -> set[str]:
    return set(Allocation.objects.filter(lease_id=lease_id).values_list(
        "gpu__node__hostname", flat=True))


def nodes_by_name() -> list[Node]:
    return list(Node.objects.order_by("hostname"))


def test_a_workload_on_a_market_whose_nodes_run_nothing_is_refused_naming_the_runtime(
        provider, tenant_client):
    response = order(tenant_client, gpus=4, workload=WORKLOAD)

    body = response.json()
    assert response.status_code == 201, body
    assert body["state"] == "refused"
    assert body["reason"] == f"only 0 of 4 GPUs are on nodes that can run it; {RUNS_COMMANDS}"
    assert Lease.objects.count() == 0
    assert Hold.objects.get().state == "closed"  # its maximum cost was held, then released


def test_a_workload_fills_on_the_node_whose_agent_reports_process(provider, tenant_client):
    node = nodes_by_name()[2]
    Node.objects.filter(pk=node.pk).update(runtime="process", address="10.0.0.3")

    body = order(tenant_client, gpus=4, workload=WORKLOAD).json()

    assert body["state"] == "filled", body
    assert hosts_of(body["lease"]) == {node.hostname}


def test_ssh_keys_skip_process_nodes_and_take_the_ssh_node(provider, tenant_client,
                                                           ed25519_key):  # noqa: F811
    first, second, third, _ = nodes_by_name()
    Node.objects.filter(pk__in=[first.pk, second.pk]).update(runtime="process")
    Node.objects.filter(pk=third.pk).update(runtime="ssh", ssh_port=2222)

    body = order(tenant_client, gpus=8, ssh_keys=[ed25519_key]).json()

    assert body["state"] == "filled", body
    assert hosts_of(body["lease"]) == {third.hostname}


def test_ssh_keys_on_process_nodes_only_are_refused_naming_ssh(provider, tenant_client,
                                                               ed25519_key):  # noqa: F811
    Node.objects.update(runtime="process")

    body = order(tenant_client, gpus=8, ssh_keys=[ed25519_key]).json()

    assert body["state"] == "refused"
    assert body["reason"] == ("only 0 of 8 GPUs are on nodes that can run it; SSH keys need "
                              "nodes whose agent runs SSH (runtime ssh)")


def test_an_order_asking_neither_still_fills_on_nodes_that_run_nothing(provider, tenant_client):
    body = order(tenant_client, gpus=8).json()

    assert body["state"] == "filled", body
    assert Node.objects.filter(runtime="none").count() == 4


def test_a_refusal_the_runtime_did_not_cause_keeps_the_engines_reason(provider, tenant_client):
    Node.objects.update(runtime="process")

    # no node holds 16 GPUs, whatever its agent runs
    body = order(tenant_client, gpus=16, workload=WORKLOAD, topology={"required": "node"}).json()

    assert body["state"] == "refused"
    assert "runtime" not in body["reason"]


def test_an_auction_bid_with_a_workload_is_not_matched_to_nodes_that_run_nothing(provider):
    runs = nodes_by_name()[3]
    Node.objects.filter(pk=runs.pk).update(runtime="process")
    work = bid(funded_tenant("work-ai"), 16, 3_000_000, workload=WORKLOAD)
    small = bid(funded_tenant("small-ai"), 8, 3_000_000, workload=WORKLOAD)
    plain = bid(funded_tenant("plain-ai"), 16, 2_800_000)

    [cleared] = auctions.clear_markets()

    assert [r["order"] for r in cleared.refused] == [work.pk]
    work.refresh_from_db()
    assert work.reason == ("fits nowhere at any price: only 8 of 16 GPUs are on nodes that can "
                           f"run it; {RUNS_COMMANDS}")
    small_lease = Order.objects.get(pk=small.pk).lease
    assert hosts_of(small_lease.pk) == {runs.hostname}
    assert Order.objects.get(pk=plain.pk).state == "filled"
