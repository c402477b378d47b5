from datetime import timedelta

import pytest
from django.utils import timezone

from billing import services as money
from billing.models import Hold
from market import prices
from market.models import Allocation, Lease
from market.orders import FoundGpus, FreeGpu
from pool import services as pool
from pool.models import Binding, Gpu, Node
from scheduler import placing as scheduler
from scheduler import routing, tasks
from tests.factories import client_for, make_org
from tests.market.inventory import provider_with_nodes


def won_lease(nodes: int = 2, gpus: int = 16, topology: dict | None = None
              ) -> tuple[Lease, object]:
    provider = provider_with_nodes(nodes=nodes)
    Node.objects.update(state="active")
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_000_000,
                      actor="t")
    tenant = make_org("acme-ai", "tenant")
    money.grant_credit(organization=tenant, amount_micros=100_000_000, reason="t", actor="t")
    body = client_for(tenant).post("/api/v1/orders/", {
        "gpu_models": ["H100-80GB"], "gpus": gpus, "hours": 1, "tier": "on_demand",
        "max_price_per_gpu_hour": "2.00", **({"topology": topology} if topology else {})},
        format="json").json()
    return Lease.objects.get(pk=body["lease"]), tenant


def test_a_lease_is_bound_on_every_node_it_uses(db):
    lease, _ = won_lease()

    scheduler.place_lease(lease_id=lease.pk)

    bindings = list(Binding.objects.filter(lease_ref=f"L-{lease.pk}"))
    assert len(bindings) == 2 and len({b.node_id for b in bindings}) == 2
    assert all(b.gpu_indexes == list(range(8)) for b in bindings)


def test_a_lease_no_agent_acknowledges_fails_after_the_timeout_and_costs_nothing(db, settings):
    settings.PLACING_TIMEOUT_S = 300
    lease, tenant = won_lease()
    scheduler.place_lease(lease_id=lease.pk)
    Binding.objects.filter(node__hostname__endswith="1").update(acknowledged_at=timezone.now())

    assert scheduler.fail_stuck_leases(now=timezone.now()) == []
    failed = scheduler.fail_stuck_leases(now=timezone.now() + timedelta(seconds=301))

    lease.refresh_from_db()
    assert failed == [lease.pk]
    assert lease.state == "failed"
    assert "no acknowledgement from" in lease.events.get(to_state="failed").reason
    assert Hold.objects.get().state == "closed"
    assert money.balances_of(tenant).held_micros == 0
    assert not Binding.objects.filter(serve=True).exists()  # the nodes are told to stop


def held_gpus(lease: Lease) -> set[int]:
    return set(Allocation.objects.filter(lease=lease).values_list("gpu_id", flat=True))


def test_a_lease_placed_twice_is_bound_once(db):
    lease, _ = won_lease()

    scheduler.place_lease(lease_id=lease.pk)
    scheduler.place_lease(lease_id=lease.pk)

    assert Binding.objects.filter(lease_ref=f"L-{lease.pk}").count() == 2
    assert [e.to_state for e in lease.events.filter(kind="state")] == ["pending", "placing"]


def test_a_lease_whose_gpu_failed_since_the_clearing_is_re_placed_on_healthy_gpus(db):
    lease, _ = won_lease(nodes=4, gpus=8)
    before = held_gpus(lease)
    broken = Gpu.objects.filter(pk__in=before).order_by("pk").first()
    Gpu.objects.filter(pk=broken.pk).update(health="failed")

    scheduler.place_lease(lease_id=lease.pk)

    lease.refresh_from_db()
    after = held_gpus(lease)
    assert lease.state == "placing"
    assert len(after) == 8 and broken.pk not in after
    assert all(a.period.lower > lease.starts_at for a in lease.allocations.all())  # from now
    assert lease.locality["max_hops"] == 0  # the engine still puts 8 GPUs on one node
    moved = lease.events.get(kind="moved")
    assert "1 of GPUs" in moved.reason and "no longer offered" in moved.reason
    bound = Binding.objects.get(lease_ref=f"L-{lease.pk}")
    assert bound.node_id != broken.node_id and len(bound.gpu_indexes) == 8


def test_a_lease_whose_node_went_unreachable_honours_its_topology_when_re_placed(db):
    lease, _ = won_lease(nodes=4, gpus=16, topology={"required": "leaf"})
    first_node = Gpu.objects.filter(pk__in=held_gpus(lease)).values_list("node_id",
                                                                         flat=True).first()
    Node.objects.filter(pk=first_node).update(health="unreachable")

    scheduler.place_lease(lease_id=lease.pk)

    lease.refresh_from_db()
    nodes = set(Gpu.objects.filter(pk__in=held_gpus(lease)).values_list("node_id", flat=True))
    assert lease.state == "placing" and first_node not in nodes and len(nodes) == 2
    assert lease.locality == {"leaves": 1, "spines": 1, "max_hops": 2}


def test_a_lease_that_fits_nowhere_any_more_changes_nothing_until_its_last_attempt(db):
    lease, tenant = won_lease(nodes=2, gpus=16)
    Gpu.objects.filter(node__hostname__endswith="1", index=0).update(health="failed")
    before = held_gpus(lease)

    with pytest.raises(scheduler.NoPlacement, match="1 of its GPUs are no longer offered"):
        scheduler.place_lease(lease_id=lease.pk, final=False)

    lease.refresh_from_db()
    assert lease.state == "pending" and held_gpus(lease) == before
    assert not Binding.objects.exists()

    scheduler.place_lease(lease_id=lease.pk, final=True)

    lease.refresh_from_db()
    assert lease.state == "failed"
    assert lease.events.get(to_state="failed").reason.startswith("could not be placed: 1 of")
    assert all(a.period.upper <= timezone.now() for a in lease.allocations.all())  # given back
    assert Hold.objects.get().state == "closed"
    assert money.balances_of(tenant).held_micros == 0


def test_the_last_heartbeat_acknowledgement_activates_the_lease_at_once(db):
    lease, _ = won_lease()
    scheduler.place_lease(lease_id=lease.pk)
    first, second = Node.objects.filter(bindings__lease_ref=f"L-{lease.pk}").order_by("pk")
    beat = {"gpus": [{"index": i} for i in range(8)], "ib_ports": [],
            "serving": [f"L-{lease.pk}"]}

    pool.record_heartbeat(node=first, **beat)
    lease.refresh_from_db()
    assert lease.state == "placing"
    pool.record_heartbeat(node=second, **beat)

    lease.refresh_from_db()
    assert lease.state == "active"
    assert lease.events.filter(to_state="active").count() == 1
    assert scheduler.activate_acknowledged_leases() == []


def test_a_pending_lease_whose_message_was_lost_is_queued_again(db, settings):
    settings.PLACEMENT_REQUEUE_S = 60
    lease, _ = won_lease()

    assert scheduler.requeue_unplaced_leases(now=timezone.now()) == []
    assert scheduler.requeue_unplaced_leases(
        now=timezone.now() + timedelta(seconds=61)) == [lease.pk]
    scheduler.place_lease(lease_id=lease.pk)
    assert scheduler.requeue_unplaced_leases(now=timezone.now() + timedelta(seconds=61)) == []


def test_a_placement_is_routed_to_its_fabrics_partition_queue(db, settings):
    settings.PLACEMENT_PARTITIONS = 4
    lease, _ = won_lease()
    fabric_id = Node.objects.values_list("fabric_id", flat=True).first()

    route = routing.route_task("scheduler.place_lease", [lease.pk], {}, {})

    default = routing.current_app.conf.task_default_queue
    assert route == {"queue": f"{default}.place-{fabric_id % 4}"}
    assert routing.route_task("scheduler.evaluate_slas", [], {}, {}) is None
    assert routing.worker_queues("ibex", 2) == ["ibex", "ibex.place-0", "ibex.place-1"]


def test_a_placement_retry_keeps_its_queue_without_asking_the_database(
        db, settings, django_assert_num_queries):
    settings.PLACEMENT_PARTITIONS = 4
    retry_options = {"exchange": "ibex.place-2", "routing_key": "ibex.place-2"}

    with django_assert_num_queries(0):
        assert routing.route_task("scheduler.place_lease", [123], {}, retry_options) is None


def test_a_placement_whose_fabric_cannot_be_read_goes_to_partition_zero(settings, monkeypatch):
    from django.db import OperationalError

    settings.PLACEMENT_PARTITIONS = 4

    def database_away(lease_id):
        raise OperationalError("the database system is shutting down")

    monkeypatch.setattr(routing, "fabric_of_lease", database_away)

    route = routing.route_task("scheduler.place_lease", [123], {}, {})

    assert route == {"queue": f"{routing.current_app.conf.task_default_queue}.place-0"}


def test_a_worker_started_without_queues_consumes_every_placement_partition(settings):
    # what the demo's and docker-compose's workers do (no -Q)
    consumed = [q.name for q in settings.CELERY_TASK_QUEUES]

    assert consumed == routing.worker_queues(settings.CELERY_TASK_DEFAULT_QUEUE)
    assert all(q.routing_key == q.name for q in settings.CELERY_TASK_QUEUES)


def test_a_replacement_taken_by_another_lease_meanwhile_makes_the_engine_look_again(
        db, monkeypatch):
    lease, tenant = won_lease(nodes=4, gpus=8)
    rival = client_for(tenant).post("/api/v1/orders/", {
        "gpu_models": ["H100-80GB"], "gpus": 8, "hours": 1, "tier": "on_demand",
        "max_price_per_gpu_hour": "2.00"}, format="json").json()
    rival_gpus = held_gpus(Lease.objects.get(pk=rival["lease"]))
    Gpu.objects.filter(pk__in=held_gpus(lease)).update(health="failed")
    real_find = scheduler.find_gpus
    calls = []

    def stale_then_real(order, start, end, **options):
        found = real_find(order, start, end, **options)
        calls.append(found)
        if len(calls) == 1:  # what a snapshot taken just before the rival committed would say
            taken = Gpu.objects.filter(pk__in=rival_gpus).order_by("index")
            chosen = [(found.chosen[0][0], FreeGpu(g.pk, g.index, 2_000_000)) for g in taken]
            return FoundGpus(chosen=chosen, gpu_model=found.gpu_model)
        return found

    monkeypatch.setattr(scheduler, "find_gpus", stale_then_real)

    scheduler.place_lease(lease_id=lease.pk)

    lease.refresh_from_db()
    assert len(calls) == 2  # the exclusion constraint refused the first answer
    assert lease.state == "placing"
    assert len(held_gpus(lease)) == 8 and not held_gpus(lease) & rival_gpus
    assert held_gpus(Lease.objects.get(pk=rival["lease"])) == rival_gpus


def test_the_task_retries_a_lease_that_fits_nowhere_then_fails_it_refunded(db, settings):
    settings.PLACEMENT_ATTEMPTS = 3
    lease, tenant = won_lease(nodes=2, gpus=16)
    Node.objects.filter(hostname__endswith="2").update(health="unreachable")

    outcome = tasks.place_lease.apply(args=[lease.pk])  # eager: retries run at once

    lease.refresh_from_db()
    assert outcome.get() == "failed"
    assert lease.state == "failed"
    reason = lease.events.get(to_state="failed").reason
    assert reason == ("could not be placed: 8 of its GPUs are no longer offered and only 8 of "
                      "16 GPUs fit")
    assert money.balances_of(tenant).held_micros == 0
    assert not Binding.objects.exists()


def test_a_lease_a_silent_node_did_not_acknowledge_is_placed_again_elsewhere(db, time_machine):
    lease, _ = won_lease(nodes=4, gpus=8)
    scheduler.place_lease(lease_id=lease.pk)
    silent = Binding.objects.get(lease_ref=f"L-{lease.pk}").node
    later = timezone.now() + timedelta(seconds=31)  # two 15 s intervals and a bit
    time_machine.move_to(later, tick=False)
    Node.objects.exclude(pk=silent.pk).update(last_heartbeat_at=later)  # the others beat
    Node.objects.filter(pk=silent.pk).update(last_heartbeat_at=later - timedelta(seconds=40))

    assert scheduler.replace_unacknowledged_leases(now=later) == [lease.pk]

    lease.refresh_from_db()
    assert lease.state == "pending"
    assert "no acknowledgement from " + silent.hostname in lease.events.last().reason
    assert not Binding.objects.filter(node=silent, serve=True).exists()
    scheduler.place_lease(lease_id=lease.pk)
    lease.refresh_from_db()
    nodes = set(Allocation.objects.filter(lease=lease).values_list("gpu__node_id", flat=True))
    assert lease.state == "placing" and len(nodes) == 1 and silent.pk not in nodes
    assert Binding.objects.filter(lease_ref=f"L-{lease.pk}", serve=True).get().node_id in nodes


def test_an_acknowledged_lease_or_one_within_two_intervals_is_left_alone(db):
    lease, _ = won_lease(nodes=2, gpus=8)
    scheduler.place_lease(lease_id=lease.pk)

    assert scheduler.replace_unacknowledged_leases(now=timezone.now()) == []
    Binding.objects.update(acknowledged_at=timezone.now())
    assert scheduler.replace_unacknowledged_leases(
        now=timezone.now() + timedelta(seconds=60)) == []


def test_a_lease_is_placed_again_at_most_placement_attempts_times(db, settings):
    settings.PLACEMENT_ATTEMPTS = 2
    lease, _ = won_lease(nodes=2, gpus=8)
    replaced = 0
    for _ in range(4):
        scheduler.place_lease(lease_id=lease.pk)
        replaced += len(scheduler.replace_unacknowledged_leases(
            now=timezone.now() + timedelta(seconds=31)))

    assert replaced == 2
    assert Lease.objects.get(pk=lease.pk).state == "placing"  # the stuck sweep fails it later
