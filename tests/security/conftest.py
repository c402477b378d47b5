import pytest


def pytest_collection_modifyitems(config, items):
    from tests.security.test_api_fuzz import KNOWN_MARKET_FAILURES

    for item in items:
        for label, reason in KNOWN_MARKET_FAILURES.items():
            if f"[{label}]" in item.nodeid:
                item.add_marker(pytest.mark.xfail(reason=f"market/: {reason}", strict=False))
