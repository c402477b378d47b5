"""Private pools through the services and tasks (real PostgreSQL): a university's cohort of
departments borrows, is refused beyond its limits, reclaims exactly what it needs, preempts
by priority inside a queue, keeps a shaped guarantee placeable, and accounts GPU-hours."""

import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.utils import timezone

from billing import ledger
from billing import services as money
from billing.models import GPU_HOURS, Account
from market import auctions, leasing, prices
from market.models import Allocation, Lease, Order
from pool import quotas
from pool.models import Binding, Gpu, Node, Pool
from scheduler import placing as scheduler
from scheduler import tasks
from scheduler.moves import remediation
from tests.factories import client_for, make_org
from tests.market.inventory import provider_with_nodes
from tests.scheduler.moves.test_remediation import active_lease, fail
from tests.scheduler.pools.builders import H100, admit, order, private_pool, queue, run, states


@pytest.fixture
def physics(db):
    return make_org("physics-dept", "tenant")


@pytest.fixture
def chemistry(db):
    return make_org("chemistry-dept", "tenant")


@pytest.fixture
def campus(physics, chemistry):
    """32 GPUs: a university cohort of physics (8, may borrow 16) and chemistry (24)."""
    pool = private_pool(nodes=4)
    queue(pool, "university")
    queue(pool, "physics", physics, nominal=8, borrowing_limit=16, parent="university")
    queue(pool, "chemistry", chemistry, nominal=24, parent="university")
    return pool


def test_an_order_in_a_pool_where_the_tenant_has_no_quota_is_refused_naming_the_pool(
        campus, tenant_client):
    answer = tenant_client.post("/api/v1/orders/", {
        "gpu_models": [H100], "gpus": 8, "hours": 2, "tier": "on_demand",
        "max_price_per_gpu_hour": "0.00", "pool": "campus"}, format="json")

    assert answer.status_code == 400
    assert list(answer.json()["error"]["fields"]) == ["pool"]
    assert "no quota" in answer.json()["error"]["fields"]["pool"][0]


def test_a_pool_order_through_the_api_is_queued_then_admitted_by_the_beat(campus, physics):
    client = client_for(physics)
    answer = client.post("/api/v1/orders/", {
        "gpu_models": [H100], "gpus": 8, "hours": 2, "tier": "on_demand",
        "max_price_per_gpu_hour": "0.00", "pool": "campus", "priority": 5}, format="json")
    body = answer.json()

    tasks.admit_pools()
    after = client.get(f"/api/v1/orders/{body['id']}/").json()

    assert answer.status_code == 201
    assert (body["state"], body["pool"], body["queue"], body["priority"]) == \
        ("queued", "campus", "physics", 5)
    assert after["state"] == "filled" and after["lease"] is not None
    lease = Lease.objects.get(pk=after["lease"])
    assert (lease.quota_node.name, lease.price_micros, lease.gpu_count) == ("physics", 0, 8)


def test_a_priced_pool_order_is_refused_naming_the_price(campus, physics):
    answer = client_for(physics).post("/api/v1/orders/", {
        "gpu_models": [H100], "gpus": 8, "hours": 2, "tier": "on_demand",
        "max_price_per_gpu_hour": "2.00", "pool": "campus"}, format="json")

    assert answer.status_code == 400
    assert list(answer.json()["error"]["fields"]) == ["max_price_per_gpu_hour"]


def test_a_department_borrows_idle_gpus_within_its_borrowing_limit(campus, physics):
    placed = order(physics, campus, 24)

    report = admit(campus)
    placed.refresh_from_db()

    assert report.admitted == [placed.pk]
    assert placed.state == "filled"
    assert placed.reason == "admitted in queue physics, borrowing 16"
    assert placed.lease.gpu_count == 24


def test_an_order_beyond_the_borrowing_limit_waits_with_its_position_and_reason(
        campus, physics):
    first = order(physics, campus, 16)
    admit(campus)
    too_many = order(physics, campus, 16)

    admit(campus)
    too_many.refresh_from_db()
    view = client_for(physics).get("/api/v1/quotas/?pool=campus").json()

    assert too_many.state == "queued"
    assert too_many.queue_position == 1
    assert "borrowing limit 16" in too_many.reason
    assert "already borrowing 8" in too_many.reason
    row = next(n for n in view if n["name"] == "physics")
    assert row["quotas"][0]["used"] == 16 and row["quotas"][0]["borrowed"] == 8
    assert row["waiting"] == [{"order": too_many.pk, "gpus": 16, "priority": 0, "position": 1,
                               "reason": too_many.reason}]
    chem = next(n for n in view if n["name"] == "chemistry")
    assert chem["quotas"][0]["lent"] == 8
    assert chem["waiting"] == []
    first.refresh_from_db()
    assert first.state == "filled"


def test_reclaim_preempts_exactly_the_newest_borrowed_leases_needed(campus, physics, chemistry):
    borrowed = run(physics, campus, 4, 4, 4, 4, 4, 4)  # 24: 8 own and 16 borrowed
    wanting = order(chemistry, campus, 16)  # within chemistry's 24; only 8 are free

    report = admit(campus)
    wanting.refresh_from_db()

    assert states(borrowed) == ["active"] * 4 + ["preempting"] * 2
    assert sorted(report.preempted) == sorted(lease.pk for lease in borrowed[4:])
    notice = Lease.objects.get(pk=borrowed[5].pk).preempt_at
    assert notice is not None and notice > timezone.now() + timedelta(
        seconds=settings.PREEMPTION_NOTICE_S - 10)
    assert wanting.state == "queued" and wanting.reason.startswith("reclaiming 8 GPUs")
    # a second pass preempts nothing more, and says what the order waits for
    assert admit(campus).preempted == []
    wanting.refresh_from_db()
    assert wanting.reason == "fits its quota once leases under preemption notice have ended"
    # the notice runs out, the GPUs come back, chemistry's order is admitted
    auctions.end_preempted_leases(now=timezone.now() + timedelta(
        seconds=settings.PREEMPTION_NOTICE_S + 1))
    admit(campus)
    wanting.refresh_from_db()
    assert states(borrowed) == ["active"] * 4 + ["preempted"] * 2
    assert wanting.state == "filled"


def test_a_lending_limit_caps_what_others_borrow(physics, chemistry):
    pool = private_pool(nodes=4)
    queue(pool, "university")
    queue(pool, "physics", physics, nominal=8, parent="university")
    queue(pool, "chemistry", chemistry, nominal=24, lending_limit=4, parent="university")
    twelve = order(physics, pool, 12)
    thirteen = order(physics, pool, 13)

    admit(pool)
    twelve.refresh_from_db()
    thirteen.refresh_from_db()

    assert twelve.state == "filled"  # 8 own + the 4 chemistry lends
    assert thirteen.state == "queued"
    assert "cohort can lend 0" in thirteen.reason


def test_a_higher_priority_order_preempts_lower_priorities_of_its_own_queue_if_allowed(
        physics, chemistry):
    pool = private_pool(nodes=2)
    queue(pool, "lab")
    queue(pool, "physics", physics, nominal=16, borrowing_limit=0, parent="lab",
          preempt_within_queue=True)
    queue(pool, "chemistry", chemistry, nominal=0, parent="lab")
    low = run(physics, pool, 4, 4, 4, 4, priority=1)
    urgent = order(physics, pool, 6, priority=10)

    report = admit(pool)

    assert states(low) == ["active", "active", "preempting", "preempting"]
    assert len(report.preempted) == 2
    auctions.end_preempted_leases(now=timezone.now() + timedelta(
        seconds=settings.PREEMPTION_NOTICE_S + 1))
    admit(pool)
    urgent.refresh_from_db()
    assert urgent.state == "filled"


def test_without_the_policy_a_higher_priority_waits_and_preempts_nothing(physics):
    pool = private_pool(nodes=2)
    queue(pool, "physics", physics, nominal=16)
    low = run(physics, pool, 8, 8, priority=1)
    urgent = order(physics, pool, 8, priority=10)

    report = admit(pool)
    urgent.refresh_from_db()

    assert report.preempted == []
    assert states(low) == ["active", "active"]
    assert urgent.state == "queued" and urgent.queue_position == 1


def test_a_shaped_guarantee_stays_placeable_under_a_storm_of_small_leases(physics, chemistry):
    """24 nodes in 3 leaves of 8; in two leaves one GPU of seven nodes is out of service, so
    only the third leaf has 8 whole nodes. Chemistry's guarantee is 8 whole nodes in one leaf;
    physics sends a storm of 2-GPU orders that best-fit would spill into that leaf."""
    pool = private_pool(nodes=24)
    queue(pool, "institute")
    queue(pool, "physics", physics, nominal=128, parent="institute")
    queue(pool, "chemistry", chemistry, nominal=64, parent="institute", shape_nodes=8)
    hosts = list(Node.objects.filter(pools=pool).order_by("host__leaf", "hostname")
                 .values_list("host__leaf", "hostname"))
    leaves = sorted({leaf for leaf, _ in hosts})
    for leaf in leaves[:2]:
        for _, host in [h for h in hosts if h[0] == leaf][:7]:
            Gpu.objects.filter(node__hostname=host, index=7).update(health="failed")
    storm = [order(physics, pool, 2) for _ in range(60)]  # 120 GPUs, only 114 outside

    admit(pool)
    storm = list(Order.objects.filter(pk__in=[o.pk for o in storm]))
    reserved_leaf_used = Allocation.objects.filter(gpu__node__host__leaf=leaves[2]).count()
    guaranteed = order(chemistry, pool, 64, topology={"required": "leaf", "whole_nodes": True})
    admit(pool)
    guaranteed.refresh_from_db()

    assert reserved_leaf_used == 0
    assert sum(o.state == "filled" for o in storm) == 57  # all 114 GPUs outside that leaf
    assert all("no room to place it" in o.reason for o in storm if o.state == "queued")
    assert guaranteed.state == "filled", guaranteed.reason
    assert guaranteed.lease.locality["leaves"] == 1


def test_an_ended_pool_lease_is_accounted_in_gpu_hours_through_the_ledger(campus, physics):
    lease = run(physics, campus, 8)[0]
    for allocation in Allocation.objects.filter(lease=lease):
        allocation.period = DateTimeTZRange(timezone.now() - timedelta(hours=1),
                                            allocation.period.upper)
        allocation.save()

    leasing.terminate_lease(lease=lease, actor="test")

    used = ledger.balance(physics, Account.Kind.QUOTA_USED, GPU_HOURS)
    issued = ledger.balance(campus.owner, Account.Kind.QUOTA_ISSUED, GPU_HOURS)
    assert 7_990_000 <= used <= 8_010_000  # 8 GPUs for one hour, in micro-GPU-hours
    assert issued == -used
    assert ledger.balance(physics, Account.Kind.TENANT_AVAILABLE) == 0


@pytest.mark.django_db(transaction=True)
def test_admission_passes_racing_on_one_pool_never_admit_beyond_the_quota():
    """Six passes at once over 12 queued orders of 8 GPUs for a queue that may hold 32: the
    pool's row lock makes them take turns, so exactly four are admitted."""
    from django.db import connection

    from pool.services import ensure_gpu_catalogue

    ensure_gpu_catalogue()
    lab = make_org("racing-lab", "tenant")
    pool = private_pool(nodes=8)  # 64 GPUs
    queue(pool, "lab", lab, nominal=32)
    queued = [order(lab, pool, 8) for _ in range(12)]
    barrier = threading.Barrier(6)
    failures = []

    def admit_once():
        barrier.wait()
        try:
            admit(pool)
        except Exception as exc:  # any failure fails the test below
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=admit_once) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failures == []
    states_now = list(Order.objects.filter(pk__in=[o.pk for o in queued])
                      .values_list("state", flat=True))
    assert states_now.count("filled") == 4 and states_now.count("queued") == 8
    assert Lease.objects.filter(quota_node__name="lab").count() == 4
    gpu_ids = list(Allocation.objects.values_list("gpu_id", flat=True))
    assert len(gpu_ids) == len(set(gpu_ids)) == 32


def test_a_queued_pool_order_can_be_cancelled_and_is_never_admitted(campus, physics):
    waiting = order(physics, campus, 32)  # more than physics may ever hold: 8 + 16
    admit(campus)

    answer = client_for(physics).post(f"/api/v1/orders/{waiting.pk}/cancel/")
    report = admit(campus)

    assert answer.status_code == 200 and answer.json()["state"] == "cancelled"
    assert report.admitted == [] and report.waiting == {}


def test_an_organisation_with_two_queues_must_name_one(campus, physics):
    queue(campus, "physics-night", physics, nominal=0, parent="university")
    body = {"gpu_models": [H100], "gpus": 8, "hours": 2, "tier": "on_demand",
            "max_price_per_gpu_hour": "0.00", "pool": "campus"}
    client = client_for(physics)

    unnamed = client.post("/api/v1/orders/", body, format="json")
    unknown = client.post("/api/v1/orders/", {**body, "queue": "chemistry"}, format="json")
    named = client.post("/api/v1/orders/", {**body, "queue": "physics-night"}, format="json")

    assert unnamed.status_code == 400
    assert "physics, physics-night" in unnamed.json()["error"]["fields"]["queue"][0]
    assert unknown.status_code == 400 and list(unknown.json()["error"]["fields"]) == ["queue"]
    assert named.status_code == 201 and named.json()["queue"] == "physics-night"


def test_another_organisation_sees_the_quotas_but_not_whose_orders_wait(campus, physics,
                                                                         chemistry):
    order(physics, campus, 32)
    admit(campus)

    theirs = client_for(chemistry).get("/api/v1/quotas/?pool=campus").json()
    mine = client_for(physics).get("/api/v1/quotas/?pool=campus").json()

    assert next(n for n in theirs if n["name"] == "physics")["waiting"] == []
    assert len(next(n for n in mine if n["name"] == "physics")["waiting"]) == 1


def test_gpus_of_a_private_pool_are_not_sold_on_the_market(campus):
    from billing import services as money
    from market import orders, prices

    prices.set_prices(provider=Node.objects.first().provider, scope={"fabric": "lab"},
                      price_micros=1_000_000, actor="test")
    buyer = make_org("market-buyer", "tenant")
    money.grant_credit(organization=buyer, amount_micros=100_000_000, reason="t", actor="t")

    def buy():
        return orders.place_order(tenant=buyer, actor="test", request=orders.OrderRequest(
            gpu_models=[H100], gpus=8, hours=1, tier="on_demand", max_price_micros=2_000_000))

    refused = buy()
    campus.nodes.clear()  # the same GPUs, out of the private pool
    sold = buy()

    assert refused.state == "refused"
    assert sold.state == "filled"


def _pending_pool_lease(org, pool, gpus=8, queue_name="") -> Lease:
    placed = order(org, pool, gpus, queue_name=queue_name)
    admit(pool)
    placed.refresh_from_db()
    assert placed.state == "filled", placed.reason
    return placed.lease


def test_a_pool_lease_whose_gpu_failed_before_binding_is_re_placed_inside_its_pool(
        campus, physics):
    market = make_org("market-cloud", "tenant")  # market GPUs elsewhere stay out of reach
    provider_with_nodes(slug="market-hpc", nodes=2, fabric="market")
    Node.objects.filter(provider__slug="market-hpc").update(state="active")
    lease = _pending_pool_lease(physics, campus)
    first = set(Allocation.objects.filter(lease=lease).values_list("gpu__node_id", flat=True))
    Gpu.objects.filter(node_id__in=first, index=3).update(health="failed")

    lease = scheduler.place_lease(lease_id=lease.pk)

    assert lease.state == "placing", lease.events.last().reason
    nodes = set(Allocation.objects.filter(lease=lease).values_list("gpu__node", flat=True))
    assert len(Allocation.objects.filter(lease=lease)) == 8 and not nodes & first
    assert set(Node.objects.filter(pk__in=nodes).values_list("pools", flat=True)) == {campus.pk}
    assert lease.price_micros == 0 and lease.quota_node.name == "physics"
    assert not Lease.objects.filter(tenant=market).exists()


def test_re_placing_a_pool_lease_keeps_another_queues_shaped_guarantee(physics, chemistry):
    pool = private_pool(name="lab-pool", nodes=2)
    queue(pool, "lab")
    queue(pool, "physics", physics, nominal=8, parent="lab")
    queue(pool, "chemistry", chemistry, nominal=8, parent="lab", shape_nodes=1)
    lease = _pending_pool_lease(physics, pool)
    held = set(Allocation.objects.filter(lease=lease).values_list("gpu__node_id", flat=True))
    Gpu.objects.filter(node_id__in=held, index=0).update(health="failed")

    with pytest.raises(scheduler.NoPlacement, match="no room in pool lab-pool"):
        scheduler.place_lease(lease_id=lease.pk, final=False)

    lease.refresh_from_db()
    assert lease.state == "pending"  # nothing changed: the only whole node is chemistry's
    assert set(Allocation.objects.filter(lease=lease).values_list("gpu__node_id",
                                                                  flat=True)) == held


def _active_pool_lease(org, pool, gpus=8) -> Lease:
    lease = _pending_pool_lease(org, pool, gpus)
    scheduler.place_lease(lease_id=lease.pk)
    Binding.objects.update(acknowledged_at=timezone.now())
    scheduler.activate_acknowledged_leases()
    lease.refresh_from_db()
    assert lease.state == "active"
    return lease


def test_a_failed_gpu_of_a_pool_lease_is_replaced_from_its_own_pool(campus, physics):
    prices.set_prices(provider=provider_with_nodes(slug="market-hpc", nodes=2, fabric="mkt"),
                      scope={"fabric": "mkt"}, price_micros=1, actor="t")  # all but free
    Node.objects.filter(provider__slug="market-hpc").update(state="active")
    lease = _active_pool_lease(physics, campus, gpus=4)
    failed = Allocation.objects.filter(lease=lease).first().gpu

    fail(failed)
    outcome = remediation.remediate_leases()

    assert outcome == {lease.pk: "moved"}
    now_on = Allocation.objects.filter(lease=lease, period__contains=timezone.now())
    assert now_on.count() == 4 and failed.pk not in {a.gpu_id for a in now_on}
    assert set(Node.objects.filter(gpus__allocations__in=now_on).values_list(
        "pools", flat=True)) == {campus.pk}


def test_a_market_lease_never_takes_a_private_pools_gpus_even_priced(db):
    """One fabric of 4 nodes, 2 of them in a private pool; all priced, the private ones
    cheaper. A market lease on the 2 market nodes loses a GPU: no market GPU is free, so it
    is degraded rather than moved onto the pool's."""
    provider = provider_with_nodes(slug="shared-hpc", nodes=4)
    Node.objects.filter(provider=provider).update(state="active")
    hosts = list(Node.objects.filter(provider=provider).order_by("hostname"))
    pool = Pool.objects.create(name="lab-pool", owner=make_org("lab-ops", "operator"))
    pool.nodes.set(hosts[:2])
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=1_000_000,
                      actor="t")
    for node in hosts[2:]:
        prices.set_prices(provider=provider, scope={"node": node.hostname},
                          price_micros=2_000_000, actor="t")
    tenant = make_org("acme-ai", "tenant")
    money.grant_credit(organization=tenant, amount_micros=10**9, reason="t", actor="t")
    lease = active_lease(client_for(tenant), gpus=16, topology={"preferred": "leaf"})
    assert lease.price_micros == 2_000_000  # the market nodes, not the cheaper private ones

    fail(Allocation.objects.filter(lease=lease).first().gpu)
    outcome = remediation.remediate_leases()

    assert outcome == {lease.pk: "degraded"}
    assert not Allocation.objects.filter(lease=lease, gpu__node__pools=pool).exists()


def test_defragmentation_never_plans_a_move_onto_a_private_pools_gpus(campus):
    from scheduler.moves.defrag import snapshot

    prices.set_prices(provider=Node.objects.filter(pools=campus).first().provider,
                      scope={"fabric": "lab"}, price_micros=1_000_000, actor="t")

    nodes, _ = snapshot(timezone.now())

    private = {str(pk) for pk in Node.objects.filter(pools=campus).values_list("pk", flat=True)}
    assert private <= {n.name for n in nodes}
    assert all(g.price_micros is None for n in nodes if n.name in private for g in n.gpus)


POOL_ORDER = {"gpu_models": [H100], "gpus": 8, "hours": 2, "tier": "on_demand",
              "max_price_per_gpu_hour": "0.00", "pool": "campus"}


def test_an_order_naming_a_priority_class_gets_its_value_and_shows_its_name(campus, physics):
    quotas.define_priority_class(pool=campus, name="urgent", value=500)
    client = client_for(physics)

    body = client.post("/api/v1/orders/", {**POOL_ORDER, "priority_class": "urgent"},
                       format="json").json()
    pool = client.get("/api/v1/pools/campus/").json()

    assert (body["priority"], body["priority_class"]) == (500, "urgent")
    assert Order.objects.get(pk=body["id"]).priority == 500
    assert pool["priority_classes"] == [{"name": "urgent", "value": 500, "description": ""}]


def test_a_priority_class_orders_admission_before_a_lower_one(campus, physics):
    quotas.define_priority_class(pool=campus, name="batch", value=0)
    quotas.define_priority_class(pool=campus, name="urgent", value=500)
    client = client_for(physics)
    run(physics, campus, 8, 8)  # 16 of the 24 physics may take: room for one order of 8
    batch = client.post("/api/v1/orders/", {**POOL_ORDER, "priority_class": "batch"},
                        format="json").json()
    urgent = client.post("/api/v1/orders/", {**POOL_ORDER, "priority_class": "urgent"},
                         format="json").json()

    admit(campus)

    assert Order.objects.get(pk=urgent["id"]).state == "filled"
    assert Order.objects.get(pk=batch["id"]).state == "queued"


def test_an_unknown_priority_class_is_a_400_naming_the_field_and_the_known_ones(campus,
                                                                                physics):
    quotas.define_priority_class(pool=campus, name="urgent", value=500)
    client = client_for(physics)

    unknown = client.post("/api/v1/orders/", {**POOL_ORDER, "priority_class": "vip"},
                          format="json")
    both = client.post("/api/v1/orders/", {**POOL_ORDER, "priority_class": "urgent",
                                           "priority": 7}, format="json")
    market_order = {k: v for k, v in POOL_ORDER.items() if k != "pool"}
    no_pool = client.post("/api/v1/orders/", {**market_order, "priority_class": "urgent"},
                          format="json")

    for answer in (unknown, both, no_pool):
        assert answer.status_code == 400
        assert list(answer.json()["error"]["fields"]) == ["priority_class"]
    assert "urgent" in unknown.json()["error"]["fields"]["priority_class"][0]
    assert not Order.objects.exists()


def test_a_priority_class_value_out_of_range_is_refused(campus):
    with pytest.raises(quotas.QuotaInputError, match="0 to 1000"):
        quotas.define_priority_class(pool=campus, name="huge", value=5000)
