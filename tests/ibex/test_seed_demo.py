import pytest
from django.core.management import CommandError, call_command


def test_seed_demo_builds_two_priced_providers_three_funded_tenants_and_logins(db, settings,
                                                                               tmp_path,
                                                                               monkeypatch):
    from django.contrib.auth import authenticate

    from billing.services import balances_of
    from market.models import GpuPrice
    from pool.models import Node

    monkeypatch.setenv("IBEX_VAR_DIR", str(tmp_path))
    settings.DEBUG = True

    call_command("seed_demo", verbosity=0)
    call_command("seed_demo", verbosity=0)  # a second run reuses everything

    assert Node.objects.count() == 112  # 80 on the market, 32 in the university's pool
    assert GpuPrice.objects.filter(superseded_at__isnull=True).count() == 640
    from pool import quotas
    from pool.models import Pool, TidalStep

    university = Pool.objects.get(name="state-university")
    tree = quotas.quota_tree(university)
    assert university.nodes.count() == 32
    assert sorted(tree.queues()) == ["biology", "cs-inference", "cs-training", "physics-astro",
                                     "physics-hep"]
    assert tree.capacity("university", "H100-80GB") == 256
    assert TidalStep.objects.filter(pool=university).count() == 2
    from ibex.accounts.models import Organization

    tenant = Organization.objects.get(slug="acme-ai")
    assert balances_of(tenant).available_micros == 50_000 * 1_000_000
    assert authenticate(username="acme-ai", password="ibex-demo") is not None
    assert (tmp_path / "demo" / "credentials.json").exists()


def test_seed_demo_refuses_to_run_outside_debug(db, settings):
    settings.DEBUG = False

    with pytest.raises(CommandError, match="DEBUG=1"):
        call_command("seed_demo", verbosity=0)


def test_the_simulated_traders_are_organisations_of_their_own(db, settings, tmp_path,
                                                               monkeypatch):
    import json

    monkeypatch.setenv("IBEX_VAR_DIR", str(tmp_path))
    settings.DEBUG = True
    call_command("seed_demo")

    credentials = json.loads((tmp_path / "demo" / "credentials.json").read_text())
    simulated = sorted(slug for slug, e in credentials.items() if e.get("simulated"))
    people = sorted(slug for slug, e in credentials.items()
                    if e["role"] == "tenant" and not e.get("simulated"))
    assert simulated == ["sim-trader-1", "sim-trader-2", "sim-trader-3"]
    assert people == ["acme-ai", "beta-labs", "gamma-uni", "uni-biology", "uni-physics"]
    assert sorted(s for s, e in credentials.items() if e["role"] == "provider") == [
        "campus-gpus", "hpc-one", "uni-hpc"]
