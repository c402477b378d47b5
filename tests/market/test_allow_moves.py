from market.models import Lease
from tests.scheduler.moves.test_remediation import setup_market

ORDER = {"gpu_models": ["H100-80GB"], "gpus": 8, "hours": 2, "max_price_per_gpu_hour": "3.00"}


def test_spot_orders_allow_moves_by_default_and_on_demand_ones_do_not(db):
    client = setup_market()

    spot = client.post("/api/v1/orders/", {**ORDER, "tier": "spot"}, format="json")
    on_demand = client.post("/api/v1/orders/", {**ORDER, "tier": "on_demand"}, format="json")

    assert spot.status_code == on_demand.status_code == 201
    assert spot.json()["allow_moves"] is True and on_demand.json()["allow_moves"] is False
    lease = client.get(f"/api/v1/leases/{on_demand.json()['lease']}/").json()
    assert lease["allow_moves"] is False


def test_a_tenant_may_let_an_on_demand_lease_be_moved_and_the_lease_says_so(db):
    client = setup_market()

    order = client.post("/api/v1/orders/", {**ORDER, "tier": "on_demand", "allow_moves": True},
                        format="json").json()

    assert order["allow_moves"] is True
    assert Lease.objects.get(pk=order["lease"]).allow_moves is True
    assert client.get(f"/api/v1/leases/{order['lease']}/").json()["allow_moves"] is True


def test_a_spot_tenant_may_refuse_moves(db):
    client = setup_market()

    order = client.post("/api/v1/orders/", {**ORDER, "tier": "spot", "allow_moves": False},
                        format="json").json()

    assert order["allow_moves"] is False


def test_a_bad_allow_moves_is_a_400_naming_the_field(db):
    client = setup_market()

    response = client.post("/api/v1/orders/", {**ORDER, "tier": "spot", "allow_moves": "maybe"},
                           format="json")

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["allow_moves"]


def test_a_spot_lease_won_at_the_clearing_keeps_the_orders_consent(db):
    from market import auctions
    from market.models import Order

    client = setup_market()
    client.post("/api/v1/orders/", {**ORDER, "tier": "spot"}, format="json")

    auctions.clear_markets()

    lease = Order.objects.get().lease
    assert lease is not None and lease.tier == "spot" and lease.allow_moves is True
