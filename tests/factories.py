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
