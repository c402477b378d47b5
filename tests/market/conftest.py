"""Trading tests use the money tests' personas, Stripe fake and zero-sum ledger check."""

from tests.billing.conftest import (  # noqa: F401 - fixtures, found by name
    fake_stripe,
    ledger_balances_to_zero,
    operator,
    provider,
    provider_client,
    rival_tenant,
    stripe_server,
    tenant,
    tenant_client,
)
