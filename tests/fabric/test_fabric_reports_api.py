"""POST /api/v1/fabrics/{name}/reports/: the fabric agent's report, taken or refused whole."""

from datetime import timedelta

import pytest
from django.utils import timezone

from fabric import services
from fabric.core.generators import fat_tree
from fabric.models import Fabric, Link, LinkStateChange, PortCounters
from tests.fabric.reports import key_of, report, unreachable
from tests.factories import client_for

SPEC = fat_tree(8, 4, rate_gbps=100)  # 4 leaves of 2 hosts under 2 spines: 16 cables
SWITCHES = {switch.guid for switch in SPEC.switches}
UPLINK = next(link for link in SPEC.links if link.a_guid in SWITCHES)  # leaf01 port 3 - spine01
LEAF01 = UPLINK.a_guid


@pytest.fixture
def fabric(provider):
    return services.save_fabric(owner=provider, name="live-ft", spec=SPEC,
                                source="generator").fabric


def post(client, body, name="live-ft"):
    return client.post(f"/api/v1/fabrics/{name}/reports/", body, format="json")


def test_a_first_report_matches_every_cable_and_marks_the_agent_seen(fabric, provider_client):
    now = timezone.now()

    response = post(provider_client, report(SPEC, now))

    body = response.json()
    assert response.status_code == 200, body
    assert body["links"]["active"] == len(SPEC.links) and body["links"]["down"] == 0
    assert body["unmatched_links"] == 0
    assert body["topology_hash"].startswith("sha256:")
    fabric.refresh_from_db()
    assert fabric.agent_reachable is True and fabric.agent_error == ""
    assert fabric.live_seen_at == now and fabric.agent_seen_at is not None


def test_a_cable_missing_from_the_snapshot_is_down_and_back_active_when_it_returns(
        fabric, provider_client):
    now = timezone.now()
    post(provider_client, report(SPEC, now))

    gone = post(provider_client, report(SPEC, now + timedelta(seconds=30),
                                        without={key_of(UPLINK)})).json()
    back = post(provider_client, report(SPEC, now + timedelta(seconds=60))).json()

    assert gone["links"]["down"] == 1
    assert [change["to"] for change in gone["changed"]] == ["down"]
    assert "leaf01 port 3 - spine01 port 1" == gone["changed"][0]["name"]
    assert back["links"] == {**back["links"], "active": len(SPEC.links), "down": 0}
    assert list(LinkStateChange.objects.order_by("at").values_list("to_state", flat=True)) == [
        "down", "active"]


def test_an_unreachable_poll_keeps_the_last_view(fabric, provider_client):
    now = timezone.now()
    post(provider_client, report(SPEC, now, without={key_of(UPLINK)}))

    response = post(provider_client, unreachable(now + timedelta(seconds=30)))

    assert response.status_code == 200
    assert response.json()["reachable"] is False
    fabric.refresh_from_db()
    assert fabric.agent_reachable is False
    assert "no answer" in fabric.agent_error
    assert fabric.live_seen_at == now
    assert Link.objects.filter(state="down").count() == 1
    assert Link.objects.filter(state="active").count() == len(SPEC.links) - 1


def test_a_snapshot_of_less_than_half_the_fabric_is_a_partial_view_that_downs_nothing(
        fabric, provider_client):
    now = timezone.now()
    post(provider_client, report(SPEC, now, without={key_of(UPLINK)}))
    leaf01_only = {key_of(link) for link in SPEC.links if LEAF01 not in (link.a_guid, link.b_guid)}

    answer = post(provider_client, report(SPEC, now + timedelta(seconds=30),
                                          without=leaf01_only)).json()

    assert answer["partial_view"] is True
    assert answer["links"]["down"] == 0  # the uplink it sees again is back; nothing else went
    assert [change["to"] for change in answer["changed"]] == ["active"]


def test_a_report_without_topology_and_the_same_hash_changes_no_link(fabric, provider_client):
    now = timezone.now()
    first = post(provider_client, report(SPEC, now)).json()

    again = post(provider_client, report(SPEC, now + timedelta(seconds=30), topology=False))

    assert again.status_code == 200
    assert again.json()["topology_hash"] == first["topology_hash"]
    assert Link.objects.filter(state="active").count() == len(SPEC.links)


def test_counters_keep_the_latest_sample_and_the_one_before(fabric, provider_client):
    now, port = timezone.now(), (UPLINK.a_guid, UPLINK.a_port)
    post(provider_client, report(SPEC, now, counters={port: {"xmit_data": 1000, "extended": True}}))

    answer = post(provider_client, report(SPEC, now + timedelta(seconds=30), topology=False,
                                          counters={port: {"xmit_data": 4000, "symbol_errors": 3,
                                                           "extended": True}})).json()

    assert answer["counters"] == {"stored": 1, "unmatched": 0}
    row = PortCounters.objects.get()
    assert (row.xmit_data, row.previous_xmit_data, row.symbol_errors) == (4000, 1000, 3)
    assert row.sampled_at - row.previous_sampled_at == timedelta(seconds=30)


def test_a_sample_delivered_twice_is_taken_once(fabric, provider_client):
    now, port = timezone.now(), (UPLINK.a_guid, UPLINK.a_port)
    body = report(SPEC, now, counters={port: {"xmit_data": 1000}})
    post(provider_client, body)

    answer = post(provider_client, body).json()

    assert answer["counters"]["stored"] == 0
    assert PortCounters.objects.get().previous_sampled_at is None


def test_a_report_for_another_providers_fabric_is_refused_and_changes_nothing(
        fabric, rival_provider):
    rival = client_for(rival_provider)

    response = post(rival, report(SPEC, timezone.now(), without={key_of(UPLINK)}))

    assert response.status_code == 404
    assert "'live-ft'" in response.json()["error"]["message"]
    fabric.refresh_from_db()
    assert fabric.agent_seen_at is None
    assert not Link.objects.filter(state="down").exists()


def test_a_tenant_key_cannot_report(fabric, tenant_client):
    response = post(tenant_client, report(SPEC, timezone.now()))

    assert response.status_code == 403


@pytest.mark.parametrize(("change", "field"), [
    (lambda body: body.pop("reachable"), "reachable"),
    (lambda body: body.update(version=2), "version"),
    (lambda body: body.update(observed_at="yesterday"), "observed_at"),
    (lambda body: body["links"][0].update(state="flapping"), "links.0.state"),
    (lambda body: body["links"][0]["a"].update(guid="not-a-guid"), "links.0.a.guid"),
    (lambda body: body["links"][1].update(a=body["links"][0]["a"]), "links.1"),
    (lambda body: body.pop("nodes"), "nodes"),
    (lambda body: body.update(topology_hash=""), "topology_hash"),
    (lambda body: body.update(surprise=1), "surprise"),
    (lambda body: body.update(counters=[{"guid": "0x1", "port": 1}]), "counters.0.xmit_data"),
    (lambda body: body.update(reachable=False), "nodes"),
    (lambda body: body.update(routes={"lids": {}, "switches": {}}), "routes_hash"),
    (lambda body: body.update(routes_hash="sha256:1", routes={"lids": {"0x1": 1},
                                                              "switches": {"0x2": "0g"}}),
     "routes.switches"),
    (lambda body: body.update(routes_hash="sha256:1", routes={"lids": {"leaf": 1},
                                                              "switches": {}}), "routes.lids"),
])
def test_a_malformed_report_is_a_400_naming_the_field_and_changes_nothing(
        fabric, provider_client, change, field):
    body = report(SPEC, timezone.now(), without={key_of(UPLINK)})
    change(body)

    response = post(provider_client, body)

    assert response.status_code == 400, response.json()
    assert field in response.json()["error"]["fields"]
    assert not Link.objects.filter(state="down").exists()
    assert Fabric.objects.get().agent_seen_at is None


def test_the_providers_own_pkeys_are_taken_without_the_full_member_bit(fabric, provider_client):
    body = {**report(SPEC, timezone.now()), "provider_pkeys": ["0x7fff", "0x8002"]}

    answer = post(provider_client, body)

    assert answer.status_code == 200, answer.json()
    assert answer.json()["partitions"] == []
    fabric.refresh_from_db()
    assert fabric.provider_pkeys == [0x0002, 0x7FFF]


@pytest.mark.parametrize("pkeys", [["7fff"], ["0x1ffff"], ["0xzz"], [True]])
def test_a_malformed_provider_pkey_is_refused_naming_it_and_nothing_changes(
        fabric, provider_client, pkeys):
    answer = post(provider_client, {**report(SPEC, timezone.now()), "provider_pkeys": pkeys})

    assert answer.status_code == 400
    assert "provider_pkeys" in str(answer.json())
    fabric.refresh_from_db()
    assert fabric.provider_pkeys == [] and fabric.agent_seen_at is None
