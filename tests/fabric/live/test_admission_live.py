"""Admission on the real routes, for real: a 64-host fat tree (8 leaves of 8 hosts under 8
spines, 100 Gb/s) simulated by ibsim under OpenSM's ftree routing; the fabric agent reads the
switches' forwarding tables and IBEX places guaranteed leases on them.

Nodes are offered a pair at a time, so each order can only go where the test means it to."""

import time

import pytest
from django.utils import timezone

from agent.fabric_agent import FabricAgent, FabricAgentOptions
from billing import services as money
from fabric import services as fabric_services
from fabric.core import admission
from fabric.models import Fabric, Link
from fabric.selectors import route_map
from ibex.accounts import services as accounts
from ibex.outbox.models import OutboxMessage
from market import prices
from market.models import Allocation, Lease, LeaseEvent, Order
from pool import services as pool
from pool.models import Binding, Node
from scheduler import placing, tasks
from tests.fabric.live.conftest import SPEC_64
from tests.factories import client_for, make_org, report_every_gpu

pytestmark = pytest.mark.django_db(transaction=True)

SPEC = SPEC_64  # 8 leaves of 8 hosts under 8 spines, 100 Gb/s
FULL_NODE_GBPS = "9.4"  # 8 GPUs × 9.4 = 75.2 Gb/s a hop: one such flow fits a link (80), two do not
HALF_LINK_GBPS = "6"  # 8 × 6 = 48 Gb/s a hop: two such flows overfill a link


@pytest.fixture
def fabric_spec():
    return SPEC


@pytest.fixture
def sim(simulated_fabric):
    return simulated_fabric


class Market:
    def __init__(self, live_server, sim, spec=SPEC):
        self.provider = make_org("hpc-provider", "provider")
        accounts.change_provider_state(organization=self.provider, to_state="verified",
                                       actor="test", reason="audit")
        pool.ensure_gpu_catalogue()
        fabric_services.save_fabric(owner=self.provider, name="live-ft", spec=spec,
                                    source="generator")
        tenant = make_org("acme-ai", "tenant")
        money.grant_credit(organization=tenant, amount_micros=10_000_000_000, reason="t",
                           actor="t")
        self.client = client_for(tenant)
        key = accounts.issue_api_key(organization=self.provider,
                                     scopes=["read", "provide"]).raw_key
        self.agent = FabricAgent(FabricAgentOptions(
            server=live_server.url, token=key, fabric="live-ft", interval_s=1,
            command_timeout_s=10, env=sim.env))

    def offer(self, *hosts):
        pool.register_nodes(provider=self.provider, specs=[
            pool.NodeSpec(hostname=host, fabric="live-ft", gpu_model="H100-80GB", gpu_count=8,
                          cpu_cores=64, memory_gib=1024) for host in hosts])
        report_every_gpu(self.provider)
        Node.objects.update(state="active")
        prices.set_prices(provider=self.provider, scope={"fabric": "live-ft"},
                          price_micros=2_000_000, actor="t")

    def order(self, gbps=None, cls="guaranteed") -> Order:
        bandwidth = {"class": cls, "gbps_per_gpu": gbps} if gbps else {"class": cls}
        answer = self.client.post("/api/v1/orders/", {
            "gpu_models": ["H100-80GB"], "gpus": 16, "hours": 2, "tier": "on_demand",
            "max_price_per_gpu_hour": "3.00", "bandwidth": bandwidth}, format="json")
        assert answer.status_code in (200, 201), answer.json()
        return Order.objects.get(pk=answer.json()["id"])

    def active(self, order: Order) -> Lease:
        assert order.state == "filled", order.reason
        placing.place_lease(lease_id=order.lease_id)
        Binding.objects.update(acknowledged_at=timezone.now())
        placing.activate_acknowledged_leases()
        lease = Lease.objects.get(pk=order.lease_id)
        assert lease.state == "active"
        return lease


@pytest.fixture
def market(live_server, sim):
    return Market(live_server, sim)


def leaf_of(route, host):
    return route.peers[route.host_ports[host]][0]


def hosts_of(lease) -> set[str]:
    return set(Allocation.objects.filter(lease=lease, period__contains=timezone.now())
               .values_list("gpu__node__hostname", flat=True))


def sharing_pairs(route):
    """(A1, B1), (A2, B2): A1 and A2 under one leaf, B1 and B2 under two others, the routes
    A1 → B1 and A2 → B2 leaving by the same uplink and the way back sharing nothing."""
    hosts = sorted(route.host_ports)
    first = leaf_of(route, hosts[0])
    home = [h for h in hosts if leaf_of(route, h) == first]
    away = [h for h in hosts if leaf_of(route, h) != first]
    for a1 in home:
        for a2 in home:
            for b1 in away:
                for b2 in away:
                    if a1 == a2 or leaf_of(route, b1) == leaf_of(route, b2):
                        continue
                    if (route.path(a1, b1)[1] == route.path(a2, b2)[1]
                            and not set(route.path(b1, a1)) & set(route.path(b2, a2))):
                        return (a1, b1), (a2, b2)
    raise AssertionError("no two routes share an uplink")


def test_a_guarantee_that_would_overfill_an_uplink_is_refused_naming_it_and_a_standard_order_is_placed(
        market):
    market.agent.poll_once()
    route = route_map(Fabric.objects.get())
    (a1, b1), (a2, b2) = sharing_pairs(route)
    uplink = route.path(a1, b1)[1]

    market.offer(a1, b1)
    first = market.active(market.order(HALF_LINK_GBPS))
    market.offer(a2, b2)
    refused = market.order(HALF_LINK_GBPS)
    standard = market.order(cls="standard")

    assert hosts_of(first) == {a1, b1}
    assert refused.state == "refused" and refused.lease is None
    assert refused.reason.startswith("its guaranteed bandwidth does not fit: ")
    assert f"{route.name(uplink)} would carry 96 Gb/s of guarantees (48 held + 48 new), " \
           "above its 80 Gb/s (100 Gb/s × guarantee ratio 0.8)" in refused.reason
    assert route.name(uplink).startswith("leaf01 port ") and "→ spine" in route.name(uplink)
    assert hosts_of(market.active(standard)) == {a2, b2}


def spread_over_uplinks(route):
    """Eight pairs (X, Y): every X under the first leaf, each Y elsewhere, each route X → Y
    leaving by a different one of the leaf's eight uplinks; and two hosts of a leaf with no Y."""
    hosts = sorted(route.host_ports)
    first = leaf_of(route, hosts[0])
    home = [h for h in hosts if leaf_of(route, h) == first]
    away = [h for h in hosts if leaf_of(route, h) != first]
    pairs, used = [], set()
    for x in home:
        y = next(y for y in away if y not in {p[1] for p in pairs}
                 and route.path(x, y)[1] not in used)
        used.add(route.path(x, y)[1])
        pairs.append((x, y))
    taken_leaves = {leaf_of(route, y) for _, y in pairs}
    spare = next(h for h in away if leaf_of(route, h) not in taken_leaves)
    spare_pair = [h for h in away if leaf_of(route, h) == leaf_of(route, spare)][:2]
    return pairs, spare_pair


def test_after_an_uplink_under_a_guaranteed_lease_is_unlinked_the_lease_is_moved_or_credited(
        market, sim):
    market.agent.poll_once()
    fabric = Fabric.objects.get()
    route = route_map(fabric)
    pairs, spare = spread_over_uplinks(route)
    loads = {}
    for x, y in pairs:  # the plan fits before the cable goes: one 75.2 Gb/s flow an uplink
        guarantee = admission.Guarantee("plan", (x, y), (8, 8), float(FULL_NODE_GBPS))
        assert admission.check(route, loads, guarantee).ok
        admission.add(loads, route, guarantee)
    leases = []
    for x, y in pairs:
        market.offer(x, y)
        leases.append(market.active(market.order(FULL_NODE_GBPS)))
    market.offer(*spare)  # where a lease can go
    youngest, (x, y) = leases[-1], pairs[-1]
    uplink = route.path(x, y)[1]
    cable = Link.objects.get(ends__device_guid=uplink[0], ends__number=uplink[1])

    unlinked_at = time.monotonic()
    sim.console(f'Unlink "leaf01"[{uplink[1]}]')
    polls, told = 0, LeaseEvent.objects.none()
    poll_s = recheck_s = 0.0
    while time.monotonic() - unlinked_at < 60:
        started = time.monotonic()
        market.agent.poll_once()
        poll_s += time.monotonic() - started
        polls += 1
        # a report that changed links or routes enqueued the re-check (the outbox); a worker
        # runs it: here, the task itself
        queued = OutboxMessage.objects.filter(task="scheduler.recheck_guarantees")
        started = time.monotonic()
        for args in queued.values_list("args", flat=True):
            tasks.recheck_guarantees(*args)
        recheck_s += time.monotonic() - started
        queued.delete()
        told = LeaseEvent.objects.filter(lease__in=leases,
                                         kind__in=("moved", "bandwidth_broken"))
        if told.exists():
            break
        time.sleep(0.2)
    elapsed = time.monotonic() - unlinked_at
    print(f"\nUnlink to lease moved or credited: {elapsed:.2f} s over {polls} polls "
          f"(polls {poll_s:.2f} s, re-checks {recheck_s:.2f} s)")
    for event in told:
        print(f"{event.lease.reference} ({'youngest' if event.lease == youngest else 'older'})"
              f" {event.kind}: {event.reason}")

    cable.refresh_from_db()
    assert cable.state == "down"
    # eight 75.2 Gb/s flows on seven uplinks: whatever OpenSM's new routes, one is left out
    event = told.first()
    assert event is not None, "no lease was moved or credited"
    assert "its guaranteed bandwidth no longer holds: leaf01 port " in event.reason
    assert "above its 80 Gb/s" in event.reason
    assert f"links down: leaf01 port {uplink[1]} - spine" in event.reason
    if event.kind == "moved":
        assert hosts_of(event.lease) & set(spare)
    assert youngest in leases
