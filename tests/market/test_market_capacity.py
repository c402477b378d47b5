"""The public market counts only what it sells: GPUs of a private pool, and GPUs without a
price, are neither offered nor free on `/` and `/api/v1/markets/`."""

from market import prices
from pool.models import Node
from tests.market.inventory import provider_with_nodes
from tests.scheduler.pools.builders import private_pool


def h100(client):
    return next(m for m in client.get("/api/v1/markets/").json()
                if m["gpu_model"] == "H100-80GB")


def test_private_pool_gpus_are_not_counted_as_offered_or_free(client, db):
    seller = provider_with_nodes(slug="seller", nodes=2, fabric="public-lab")  # 16 GPUs
    Node.objects.filter(provider=seller).update(state="active")
    prices.set_prices(provider=seller, scope={"fabric": "public-lab"}, price_micros=2_000_000,
                      actor="t")
    campus = private_pool(nodes=4)  # 32 GPUs, priced too, but never for sale
    prices.set_prices(provider=Node.objects.filter(pools=campus).first().provider,
                      scope={"fabric": "lab"}, price_micros=1_000_000, actor="t")

    market = h100(client)

    assert (market["offered_gpus"], market["free_gpus"]) == (16, 16)
    assert market["on_demand_min"] == "2.00"
    assert "<strong>16</strong> of 16 GPUs" in client.get("/markets/cards/").content.decode()


def test_unpriced_gpus_are_not_for_sale(client, db):
    seller = provider_with_nodes(slug="seller", nodes=2)
    Node.objects.filter(provider=seller).update(state="active")
    prices.set_prices(provider=seller, scope={"node": "seller-01"}, price_micros=2_000_000,
                      actor="t")

    assert h100(client)["offered_gpus"] == 8
