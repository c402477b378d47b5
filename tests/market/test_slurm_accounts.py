"""Nodes of a Slurm cluster (runtime "slurm") are handed to a tenant as a Slurm reservation for
the Slurm account its order names: an order without `slurm_account` never goes on them, and is
refused saying so when only they have free GPUs; one that names an account may go on any node
and its lease carries the account. A malformed account is a 400 naming the field."""

import pytest
from django.db import IntegrityError, transaction

from billing.models import Hold
from market import auctions, prices
from market.models import Allocation, Lease, Order
from pool.models import Node
from tests.market.test_auctions import bid, funded_tenant, market_with_32_gpus_at
from tests.market.test_orders import order

NEEDS_AN_ACCOUNT = ("nodes on a Slurm fabric need a slurm_account on the order (the Slurm "
                    "account their reservation is made for)")


@pytest.fixture
def provider(db):
    return market_with_32_gpus_at(2_500_000)  # 4 nodes of 8 H100s on 2 leaves


@pytest.fixture
def tenant_client(db):
    from tests.factories import client_for

    return client_for(funded_tenant("physics-lab"))


def on_slurm(*nodes: Node) -> None:
    Node.objects.filter(pk__in=[node.pk for node in nodes]).update(runtime="slurm")


def nodes_by_name() -> list[Node]:
    return list(Node.objects.order_by("hostname"))


def hosts_of(lease_id) -> set[str]:
    return set(Allocation.objects.filter(lease_id=lease_id).values_list(
        "gpu__node__hostname", flat=True))


def test_an_order_without_a_slurm_account_is_never_placed_on_slurm_nodes(provider,
                                                                         tenant_client):
    first, second, third, fourth = nodes_by_name()
    on_slurm(first, second)

    body = order(tenant_client, gpus=16).json()

    assert body["state"] == "filled", body
    assert hosts_of(body["lease"]) == {third.hostname, fourth.hostname}
    assert body["slurm_account"] == ""
    assert Lease.objects.get(pk=body["lease"]).slurm_account == ""


def test_an_order_without_a_slurm_account_is_refused_naming_it_when_only_slurm_nodes_are_free(
        provider, tenant_client):
    first, second, third, _ = nodes_by_name()
    on_slurm(first, second, third)

    response = order(tenant_client, gpus=16)

    body = response.json()
    assert response.status_code == 201, body
    assert body["state"] == "refused"
    assert body["reason"] == f"only 8 of 16 GPUs are on nodes that can run it; {NEEDS_AN_ACCOUNT}"
    assert Lease.objects.count() == 0
    assert Hold.objects.get().state == "closed"  # its maximum cost was held, then released


def test_an_order_naming_a_slurm_account_is_placed_on_slurm_nodes_and_its_lease_carries_it(
        provider, tenant_client):
    on_slurm(*nodes_by_name())

    body = order(tenant_client, gpus=16, slurm_account="physics.ml-2").json()

    assert body["state"] == "filled", body
    assert body["slurm_account"] == "physics.ml-2"
    lease = Lease.objects.get(pk=body["lease"])
    assert lease.slurm_account == "physics.ml-2"
    assert Node.objects.filter(hostname__in=hosts_of(lease.pk), runtime="slurm").count() == 2
    shown = tenant_client.get(f"/api/v1/leases/{lease.pk}/").json()
    assert shown["slurm_account"] == "physics.ml-2"


def test_an_order_naming_a_slurm_account_may_still_take_ordinary_nodes(provider,
                                                                       tenant_client):
    body = order(tenant_client, gpus=8, slurm_account="physics").json()

    assert body["state"] == "filled", body
    assert Lease.objects.get(pk=body["lease"]).slurm_account == "physics"


def test_a_workload_with_a_slurm_account_still_needs_nodes_that_run_commands(provider,
                                                                             tenant_client):
    on_slurm(*nodes_by_name())

    body = order(tenant_client, gpus=8, slurm_account="physics",
                 workload={"command": ["python3", "train.py"]}).json()

    assert body["state"] == "refused"
    assert body["reason"].endswith("a workload needs nodes whose agent runs commands "
                                   "(runtime process or ssh)")


@pytest.mark.parametrize("slurm_account, message", [
    ("-physics", "starts with '-'"),
    ("physics lab", "contains ' '"),
    ("ops;reboot", "contains ';'"),
    ("a" * 65, "no more than 64 characters"),
    (["physics"], "Not a valid string"),
    (None, "may not be null"),
])
def test_a_bad_slurm_account_is_a_400_naming_the_field_and_records_nothing(
        provider, tenant_client, slurm_account, message):
    response = order(tenant_client, slurm_account=slurm_account)

    assert response.status_code == 400, response.json()
    [said] = response.json()["error"]["fields"]["slurm_account"]
    assert message in said
    assert Order.objects.count() == 0 and Lease.objects.count() == 0
    assert Hold.objects.count() == 0


def test_the_database_refuses_a_malformed_slurm_account(provider, tenant_client):
    body = order(tenant_client, gpus=8, slurm_account="physics").json()

    for table in (Lease, Order):
        with pytest.raises(IntegrityError), transaction.atomic():
            table.objects.update(slurm_account="-physics")

    assert Lease.objects.get(pk=body["lease"]).slurm_account == "physics"


def test_an_auction_bid_without_a_slurm_account_does_not_win_slurm_gpus(provider):
    first, second, third, fourth = nodes_by_name()
    on_slurm(first, second)
    large = bid(funded_tenant("large-ai"), 24, 3_000_000)
    plain = bid(funded_tenant("plain-ai"), 16, 2_900_000)
    named = bid(funded_tenant("physics-lab"), 16, 2_800_000, slurm_account="physics")

    [cleared] = auctions.clear_markets()

    assert [r["order"] for r in cleared.refused] == [large.pk]
    large.refresh_from_db()
    assert large.reason == ("fits nowhere at any price: only 16 of 24 GPUs are on nodes that "
                            f"can run it; {NEEDS_AN_ACCOUNT}")
    plain.refresh_from_db()
    assert hosts_of(plain.lease_id) == {third.hostname, fourth.hostname}
    named.refresh_from_db()
    assert hosts_of(named.lease_id) == {first.hostname, second.hostname}
    assert named.lease.slurm_account == "physics"


def test_a_plain_order_whose_price_only_slurm_nodes_meet_is_refused_for_the_account(
        provider, tenant_client):
    first, second, _, _ = nodes_by_name()
    on_slurm(first, second)
    for node in (first, second):  # the Slurm nodes are the cheap ones
        prices.set_prices(provider=provider, scope={"node": node.hostname},
                          price_micros=1_000_000, actor="test")

    body = order(tenant_client, gpus=8, max_price_per_gpu_hour="1.20").json()

    assert body["state"] == "refused"
    assert body["reason"] == f"only 0 of 8 GPUs are on nodes that can run it; {NEEDS_AN_ACCOUNT}"
    body = order(tenant_client, gpus=8, max_price_per_gpu_hour="1.20",
                 slurm_account="physics").json()
    assert body["state"] == "filled"
