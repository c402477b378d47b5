"""Small factories for tests: named organisations, keys and authenticated API clients."""

from rest_framework.test import APIClient

from ibex.accounts import services


def make_org(slug: str, *roles: str):
    return services.create_organization(slug=slug, name=slug.replace("-", " ").title(),
                                        roles=roles)


def client_for(org, scopes=("read", "trade", "provide")) -> APIClient:
    issued = services.issue_api_key(organization=org, scopes=list(scopes))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.raw_key}")
    return client


def fund(org, dollars: str, reason: str = "test funds"):
    """Give an organisation available balance through the ledger (a credit grant)."""
    from billing import services as market
    from billing.core import money

    return market.grant_credit(organization=org, amount_micros=money.to_micros(dollars),
                               reason=reason, actor="test")


def report_every_gpu(provider) -> None:
    """What each node's first complete heartbeat does to its GPUs: known and healthy."""
    from pool.models import Gpu

    Gpu.objects.filter(node__provider=provider).update(health="ok")
