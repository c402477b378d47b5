from pool.models import Node, NodeStateChange
from tests.factories import client_for
from tests.market.inventory import provider_with_nodes


def test_the_drain_endpoint_records_the_mode_it_is_given(db):
    provider = provider_with_nodes(nodes=2)
    Node.objects.update(state="active")
    node = Node.objects.first()

    response = client_for(provider).post(f"/api/v1/nodes/{node.pk}/drain/", {"mode": "move"},
                                         format="json")

    assert response.status_code == 200
    assert response.json()["state"] == "draining" and response.json()["drain_mode"] == "move"
    assert NodeStateChange.objects.filter(node=node).last().reason == "drained (move)"


def test_without_a_mode_the_leases_run_to_their_end(db):
    provider = provider_with_nodes(nodes=2)
    Node.objects.update(state="active")
    node = Node.objects.first()

    response = client_for(provider).post(f"/api/v1/nodes/{node.pk}/drain/")

    assert response.status_code == 200 and response.json()["drain_mode"] == "run_to_end"


def test_an_unknown_mode_is_a_400_naming_the_field_and_nothing_changes(db):
    provider = provider_with_nodes(nodes=2)
    Node.objects.update(state="active")
    node = Node.objects.first()

    response = client_for(provider).post(f"/api/v1/nodes/{node.pk}/drain/", {"mode": "evict"},
                                         format="json")

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["mode"]
    node.refresh_from_db()
    assert node.state == "active" and node.drain_mode == "run_to_end"


def test_an_operator_drains_nodes_moving_their_leases_from_the_admin(db, client):
    from django.contrib.auth import get_user_model

    provider_with_nodes(nodes=2)
    Node.objects.update(state="active")
    node = Node.objects.first()
    client.force_login(get_user_model().objects.create_superuser("olga", "o@ibex.example", "pw"))

    client.post("/admin/pool/node/", {"action": "drain_moving_leases",
                                      "_selected_action": [node.pk]})

    node.refresh_from_db()
    assert (node.state, node.drain_mode) == ("draining", "move")
    assert NodeStateChange.objects.filter(node=node).last().actor == "olga"
    assert Node.objects.exclude(pk=node.pk).get().state == "active"
