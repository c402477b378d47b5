"""A lease's delivered bandwidth from its hosts' HCA port counters, in the lease JSON; the
fabric's error threshold (PATCH) and the link faults its reports open and close; the provider's
health per tier in the fabric JSON."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from fabric.models import Fabric, LinkFault, TrafficAccount
from market.models import Allocation
from pool.models import Node
from scheduler.moves import remediation
from tests.fabric.lease_traffic import LAB, counters, hca_link, post_report
from tests.factories import client_for
from tests.scheduler.moves.test_remediation import active_lease, setup_market

pytestmark = pytest.mark.django_db

LEAF02 = next(s.guid for s in LAB.switches if s.name == "leaf02")
GB = 3_125_000_000  # words: 10 Gb/s over 10 s (32 bits a word)


def hosts_of(lease) -> list[str]:
    return sorted(set(Allocation.objects.filter(lease=lease, period__contains=timezone.now())
                      .values_list("gpu__node__hostname", flat=True)))


def provider_client():
    return client_for(Fabric.objects.get(name="lab").owner)


def delivered(client, lease) -> dict:
    return client.get(f"/api/v1/leases/{lease.pk}/").json()["fabric"]["delivered_gbps"]


def test_a_leases_delivered_bandwidth_is_its_hosts_xmit_words_over_the_interval():
    client = setup_market()
    lease = active_lease(client, gpus=16)
    first, second = hosts_of(lease)
    agent, t0 = provider_client(), timezone.now() + timedelta(seconds=1)
    before = delivered(client, lease)

    post_report(agent, t0, xmit={first: 1_000, second: 5_000})
    post_report(agent, t0 + timedelta(seconds=10),
                xmit={first: 1_000 + GB, second: 5_000 + 2 * GB})
    shown = delivered(client, lease)

    assert before == {"last_interval": None, "mean": None, "sampled_at": None, "shared": False}
    # (GB + 2 GB) words × 32 bits / 10 s = 30 Gb/s
    assert shown["last_interval"] == pytest.approx(30.0)
    assert shown["mean"] == pytest.approx(30.0)
    assert shown["sampled_at"] == (t0 + timedelta(seconds=10)).isoformat().replace("+00:00", "Z")
    assert shown["shared"] is False


def test_a_counter_reset_gives_no_figure_for_its_interval_and_the_mean_keeps_what_was_counted():
    client = setup_market()
    lease = active_lease(client, gpus=16)
    first, second = hosts_of(lease)
    agent, t0 = provider_client(), timezone.now() + timedelta(seconds=1)
    post_report(agent, t0, xmit={first: 0, second: 0})
    post_report(agent, t0 + timedelta(seconds=10), xmit={first: GB, second: GB})

    post_report(agent, t0 + timedelta(seconds=20), xmit={first: 12, second: 2 * GB})
    shown = delivered(client, lease)
    post_report(agent, t0 + timedelta(seconds=30), xmit={first: 12 + GB, second: 3 * GB})
    after = delivered(client, lease)

    assert shown["last_interval"] is None  # first's counter went backwards: not a negative
    # 3 GB words over [t0, t0 + 20 s]: the second host's interval still counts
    assert shown["mean"] == pytest.approx(15.0)
    assert after["last_interval"] == pytest.approx(20.0)
    # 5 GB words over [t0, t0 + 30 s]: the first host's interval with no figure added none
    assert after["mean"] == pytest.approx(5 * GB * 32 / 30 / 1e9, abs=1e-3)


def test_traffic_before_the_lease_came_onto_its_host_is_not_counted_for_it():
    client = setup_market()
    agent = provider_client()
    earlier = timezone.now() - timedelta(seconds=5)
    post_report(agent, earlier, xmit={host: 0 for host in
                                      ("hpc-provider-01", "hpc-provider-02",
                                       "hpc-provider-03", "hpc-provider-04")})
    lease = active_lease(client, gpus=16)
    first, second = hosts_of(lease)
    t1 = timezone.now() + timedelta(seconds=1)

    post_report(agent, t1, xmit={first: 7 * GB, second: 7 * GB})
    straddling = delivered(client, lease)
    post_report(agent, t1 + timedelta(seconds=10), xmit={first: 8 * GB, second: 8 * GB})

    assert straddling["last_interval"] is None and straddling["mean"] is None
    assert delivered(client, lease)["last_interval"] == pytest.approx(20.0)
    assert delivered(client, lease)["mean"] == pytest.approx(20.0)


def test_a_host_shared_by_two_leases_shows_each_its_whole_traffic_flagged_shared():
    client = setup_market()
    one, other = active_lease(client, gpus=4), active_lease(client, gpus=4)
    assert hosts_of(one) == hosts_of(other)  # best fit: both on one node
    (host,) = hosts_of(one)
    agent, t0 = provider_client(), timezone.now() + timedelta(seconds=1)

    post_report(agent, t0, xmit={host: 0})
    post_report(agent, t0 + timedelta(seconds=10), xmit={host: GB})

    for lease in (one, other):
        assert delivered(client, lease) == {
            "last_interval": pytest.approx(10.0), "mean": pytest.approx(10.0),
            "sampled_at": (t0 + timedelta(seconds=10)).isoformat().replace("+00:00", "Z"),
            "shared": True}


def test_a_lease_that_moves_keeps_its_mean_over_both_hosts():
    client = setup_market()
    lease = active_lease(client, gpus=8, topology={"required": "leaf"})
    (old,) = hosts_of(lease)
    agent, t0 = provider_client(), timezone.now() + timedelta(seconds=1)
    post_report(agent, t0, xmit={old: 0})
    post_report(agent, t0 + timedelta(seconds=10), xmit={old: GB})
    Node.objects.filter(hostname=old).update(health=Node.Health.UNREACHABLE)
    remediation.remediate_leases()
    (new,) = hosts_of(lease)
    t1 = timezone.now() + timedelta(seconds=11)

    post_report(agent, t1, xmit={old: GB, new: 0})
    post_report(agent, t1 + timedelta(seconds=10), xmit={old: 9 * GB, new: 3 * GB})
    shown = delivered(client, lease)

    assert new != old
    assert TrafficAccount.objects.get(holder=lease.reference, host__name=old).closed_at
    assert shown["last_interval"] == pytest.approx(30.0)  # the new host only
    # GB + 3 GB words from t0 to t1 + 10 s
    span = (t1 + timedelta(seconds=10) - t0).total_seconds()
    assert shown["mean"] == pytest.approx(4 * GB * 32 / span / 1e9, abs=1e-3)


def test_the_lease_list_reads_every_leases_bandwidth_in_a_few_queries(
        django_assert_max_num_queries):
    client = setup_market()
    active_lease(client, gpus=8)
    client.get("/api/v1/leases/")
    with django_assert_max_num_queries(40) as one:
        assert len(client.get("/api/v1/leases/").json()["results"]) == 1
    queries_for_one = len(one.captured_queries)  # (read now: each request clears the log)
    active_lease(client, gpus=8)
    active_lease(client, gpus=16)

    with django_assert_max_num_queries(queries_for_one):
        listed = client.get("/api/v1/leases/").json()

    assert len(listed["results"]) == 3
    assert all("delivered_gbps" in lease["fabric"] for lease in listed["results"])


# --- the error threshold and link faults ---------------------------------------------------------


def test_the_provider_sets_the_error_threshold_and_bad_values_are_refused_naming_it():
    setup_market()
    agent = provider_client()
    fabric = Fabric.objects.get(name="lab")

    refused = [agent.patch(f"/api/v1/fabrics/{fabric.pk}/", body, format="json")
               for body in ({"error_threshold": -1}, {"error_threshold": "ten"},
                            {"error_threshold": 10**7}, {"error_threshold": None})]
    empty = agent.patch(f"/api/v1/fabrics/{fabric.pk}/", {}, format="json")
    unchanged = Fabric.objects.get(pk=fabric.pk).error_threshold
    taken = agent.patch(f"/api/v1/fabrics/{fabric.pk}/", {"error_threshold": 25}, format="json")

    assert [r.status_code for r in refused] == [400] * 4
    assert all("error_threshold" in r.json()["error"]["fields"] for r in refused)
    assert empty.status_code == 400
    assert unchanged == 10  # the documented default
    assert taken.status_code == 200 and taken.json()["error_threshold"] == 25
    assert Fabric.objects.get(pk=fabric.pk).error_threshold == 25


def test_a_link_erring_above_the_threshold_opens_a_fault_naming_it_until_it_calms():
    client = setup_market()
    lease = active_lease(client, gpus=8)
    (host,) = hosts_of(lease)
    agent, t0 = provider_client(), timezone.now() + timedelta(seconds=1)

    post_report(agent, t0, xmit={host: 0})
    post_report(agent, t0 + timedelta(seconds=60), xmit={host: 0})  # no errors: nothing
    quiet = LinkFault.objects.count()
    post_report(agent, t0 + timedelta(seconds=120), extra=counters(
        {host: 0}, errors={"symbol_errors": 11}))  # 11 errors in a minute > 10
    fault = LinkFault.objects.get()
    post_report(agent, t0 + timedelta(seconds=180), extra=counters(
        {host: 0}, errors={"symbol_errors": 21}))  # 10 in a minute: at the threshold
    fault.refresh_from_db()

    assert quiet == 0
    link = hca_link(host)
    assert fault.kind == "errors"
    assert fault.name == f"{host} mlx5_0 port 1 - leaf0{1 + (link.b_guid == LEAF02)} port {link.b_port}"
    assert fault.detail == "11.0 errors/min > 10"
    assert fault.started_at == t0 + timedelta(seconds=120)
    assert fault.ended_at == t0 + timedelta(seconds=180)


def test_a_link_down_opens_a_down_fault_closed_when_it_is_active_again():
    setup_market()
    agent, t0 = provider_client(), timezone.now()

    post_report(agent, t0)
    post_report(agent, t0 + timedelta(seconds=30), without_hosts=["hpc-provider-01"])
    fault = LinkFault.objects.get()
    post_report(agent, t0 + timedelta(seconds=60))
    fault.refresh_from_db()

    assert fault.kind == "down" and fault.name == "hpc-provider-01 mlx5_0 port 1 - leaf01 port 1"
    assert fault.started_at == t0 + timedelta(seconds=30)
    assert fault.ended_at == t0 + timedelta(seconds=60)


def test_the_owner_sees_links_down_errors_and_utilisation_per_tier_and_a_tenant_does_not():
    client = setup_market()
    lease = active_lease(client, gpus=8)
    (host,) = hosts_of(lease)
    agent, t0 = provider_client(), timezone.now()
    fabric = Fabric.objects.get(name="lab")
    post_report(agent, t0, xmit={host: 0, "hpc-provider-04": 0})
    post_report(agent, t0 + timedelta(seconds=10), xmit={host: GB, "hpc-provider-04": 0},
                without_hosts=["hpc-provider-04"])

    health = agent.get(f"/api/v1/fabrics/{fabric.pk}/").json()["health"]
    tenant_view = client.get(f"/api/v1/fabrics/{fabric.pk}/").json()
    listed = agent.get("/api/v1/fabrics/").json()["results"][0]

    tiers = {tier["tier"]: tier for tier in health["tiers"]}
    assert list(tiers) == ["host-leaf", "leaf-spine"]
    assert tiers["host-leaf"]["links"] == 4 and tiers["host-leaf"]["down"] == 1
    assert tiers["leaf-spine"]["down"] == 0
    # the host sent 10 Gb/s; its leaf's side of the cable was not reported: not measured
    assert health["faults"] == [{"kind": "down", "name": "hpc-provider-04 mlx5_0 port 1 - "
                                 "leaf02 port 2", "detail": "down",
                                 "started_at": (t0 + timedelta(seconds=10)).isoformat()
                                 .replace("+00:00", "Z")}]
    assert health["error_threshold"] == 10
    assert "health" not in tenant_view
    assert listed["health"] is None


def recorder(into: list):
    def record(execute, sql, params, many, context):
        into.append(sql)
        return execute(sql, params, many, context)
    return record


def test_the_health_picture_is_computed_once_a_report_and_follows_the_next_report_and_threshold():
    setup_market()
    agent, t0 = provider_client(), timezone.now()
    fabric = Fabric.objects.get(name="lab")
    post_report(agent, t0)
    computed, cached = [], []
    with connection.execute_wrapper(recorder(computed)):
        first = agent.get(f"/api/v1/fabrics/{fabric.pk}/").json()["health"]

    with connection.execute_wrapper(recorder(cached)):
        again = agent.get(f"/api/v1/fabrics/{fabric.pk}/").json()["health"]
    post_report(agent, t0 + timedelta(seconds=10), without_hosts=["hpc-provider-04"])
    after_report = agent.get(f"/api/v1/fabrics/{fabric.pk}/").json()["health"]
    agent.patch(f"/api/v1/fabrics/{fabric.pk}/", {"error_threshold": 25}, format="json")
    after_patch = agent.get(f"/api/v1/fabrics/{fabric.pk}/").json()["health"]

    def reads_ports(queries) -> bool:
        return any('FROM "fabric_port"' in sql for sql in queries)

    assert reads_ports(computed) and not reads_ports(cached)
    assert again == first and first["tiers"][0]["down"] == 0
    assert after_report["tiers"][0]["down"] == 1
    assert after_patch["error_threshold"] == 25
