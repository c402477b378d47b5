"""Seed a demonstration exchange: two verified providers with fabrics, registered and priced
nodes, funded tenants and an operator; and a university's private pool (a third provider's
256 unpriced H100s) shared by departments and research groups through quotas, with a tidal
schedule moving GPUs between training (night) and inference (day).

Idempotent: a second run reuses what exists. The raw API keys are written, for this local
demo only, to var/demo/credentials.json, which `make demo` reads to start simulated agents.
"""

import json
from datetime import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from billing import services as money
from fabric import services as fabric_services
from fabric.core import generators
from fabric.models import Fabric, Host
from ibex.accounts import services as accounts
from ibex.accounts.models import Membership, Organization, ProviderProfile
from ibex.runtime import var_dir
from market import prices
from market.models import GpuPrice
from pool import quotas
from pool import services as pool
from pool.models import Node, Pool, TidalStep

PROVIDERS = [
    # slug, fabric, GPU model, hosts expression, generator arguments, price per GPU-hour
    ("hpc-one", "hpc-one-h100", "H100-80GB", "h100-[01-64]",
     {"nodes": 64, "radix": 8, "tiers": 3, "prefix": "h100-", "rate_gbps": 400}, 2_490_000),
    ("campus-gpus", "campus-a100", "A100-80GB", "a100-[01-16]",
     {"nodes": 16, "radix": 8, "tiers": 2, "prefix": "a100-", "rate_gbps": 200}, 1_290_000),
    # the university's own GPUs: not sold on the market (price None), shared through quotas
    ("uni-hpc", "uni-h100", "H100-80GB", "uni-[01-32]",
     {"nodes": 32, "radix": 8, "tiers": 2, "prefix": "uni-", "rate_gbps": 400}, None),
]
# the provider whose fabric `make demo` runs live, under ibsim and OpenSM with the fabric agent
# (`manage.py fabric_sim`): 64 hosts and 48 switches, well inside ibsim's 2,048 nodes and 256
# switches
LIVE_FABRIC_PROVIDER = "hpc-one"
# providers that also sell MIG slices and shares of their GPUs (docs/parts.md)
SELLS_PARTS = {"campus-gpus"}
TENANTS = ["acme-ai", "beta-labs", "gamma-uni", "uni-physics", "uni-biology"]
# `simulate_tenants` trades as these, never as an organisation a person logs in as, so the
# numbers people read on their pages change only by what they do themselves
SIMULATED_TENANTS = ["sim-trader-1", "sim-trader-2", "sim-trader-3"]
UNIVERSITY_POOL = "state-university"
H100 = "H100-80GB"
# name, parent, organisation, nominal, borrowing limit, lending limit, whole-node shape
UNIVERSITY_QUOTAS = [
    ("university", None, "gamma-uni", 0, None, None, None),
    ("physics", "university", "uni-physics", 0, None, None, None),
    ("physics-astro", "physics", "uni-physics", 48, 32, None, None),
    ("physics-hep", "physics", "uni-physics", 48, None, 16, None),
    ("biology", "university", "uni-biology", 64, 32, None, 4),
    ("cs-training", "university", "gamma-uni", 64, 64, None, None),
    ("cs-inference", "university", "gamma-uni", 32, 32, None, None),
]
PRIORITY_CLASSES = [("urgent", 500), ("normal", 100), ("batch", 0)]
TIDES = [  # UTC: inference gets the day, training the night
    ("day-inference", "07:00", {"cs-training": {H100: 32}, "cs-inference": {H100: 64}}),
    ("night-training", "19:00", {"cs-training": {H100: 64}, "cs-inference": {H100: 32}}),
]
DEMO_PASSWORD = "ibex-demo"  # local demonstration only: the seed refuses to run with DEBUG off
TENANT_CREDIT_MICROS = 50_000 * 1_000_000
KEY_SCOPES = {"provider": ["read", "provide"], "tenant": ["read", "trade"],
              "operator": ["read", "trade", "provide", "admin"]}


class Command(BaseCommand):
    help = "Seed the demonstration exchange (idempotent)."

    def handle(self, *args, **options):
        if not settings.DEBUG:
            raise CommandError("seed_demo is for local demonstrations: run it with DEBUG=1")
        path = var_dir() / "demo" / "credentials.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        credentials = json.loads(path.read_text()) if path.exists() else {}
        with transaction.atomic():
            for slug, fabric_name, model, hosts, shape, price in PROVIDERS:
                org = self._org(slug, "provider")
                if not Fabric.objects.filter(name=fabric_name).exists():
                    spec = generators.fat_tree(shape["nodes"], shape["radix"], tiers=shape["tiers"],
                                               prefix=shape["prefix"],
                                               rate_gbps=shape["rate_gbps"])
                    fabric_services.save_fabric(owner=org, name=fabric_name, spec=spec,
                                                source="generator")
                if not Node.objects.filter(provider=org).exists():
                    hostnames = Host.objects.filter(fabric__name=fabric_name).values_list(
                        "name", flat=True)
                    pool.register_nodes(provider=org, specs=[
                        pool.NodeSpec(hostname=host, fabric=fabric_name, gpu_model=model,
                                      gpu_count=8, cpu_cores=128, memory_gib=2048)
                        for host in hostnames])
                if price is not None and not GpuPrice.objects.filter(
                        gpu__node__provider=org, superseded_at__isnull=True).exists():
                    prices.set_prices(provider=org, scope={"fabric": fabric_name},
                                      price_micros=price, actor="demo seed",
                                      shareable=slug in SELLS_PARTS)
                if org.provider_profile.state == ProviderProfile.State.PENDING:
                    accounts.change_provider_state(organization=org, to_state="verified",
                                                   actor="demo seed", reason="demonstration")
                entry = self._credentials(credentials, org, "provider")
                entry.update({"fabric": fabric_name, "gpu_model": model, "hosts": hosts,
                              "price_micros": price, "live_fabric": slug == LIVE_FABRIC_PROVIDER})
            for slug in TENANTS + SIMULATED_TENANTS:
                tenant = self._org(slug, "tenant")
                entry = self._credentials(credentials, tenant, "tenant")
                entry["simulated"] = slug in SIMULATED_TENANTS
                if money.balances_of(tenant).available_micros == 0:
                    money.grant_credit(organization=tenant, amount_micros=TENANT_CREDIT_MICROS,
                                       reason="demo credit", actor="demo seed")
            operator = self._org("ibex-ops", "operator")
            self._credentials(credentials, operator, "operator")
            self._university(operator)
        path.write_text(json.dumps(credentials, indent=2))
        path.chmod(0o600)
        for slug, entry in sorted(credentials.items()):
            self.stdout.write(f"{entry['role']:>9} {slug:<12} key {entry['key'][:18]}…")
        self.stdout.write(f"demo API keys: {path}")
        self.stdout.write(f"web logins: each organisation's slug, password {DEMO_PASSWORD!r} "
                          "(ibex-ops is also an admin at /admin/)")

    def _university(self, operator: Organization) -> None:
        """The university's private pool, its quota tree and its tidal schedule."""
        university, _ = Pool.objects.get_or_create(name=UNIVERSITY_POOL,
                                                   defaults={"owner": operator})
        university.nodes.set(Node.objects.filter(provider__slug="uni-hpc"))
        for name, parent, org, nominal, borrowing, lending, shape in UNIVERSITY_QUOTAS:
            quotas.define_quota_node(
                pool=university, name=name, parent=parent,
                organization=Organization.objects.get(slug=org), shape_nodes=shape,
                quotas=[quotas.QuotaSpec(H100, nominal, borrowing, lending)])
        for name, value in PRIORITY_CLASSES:
            quotas.define_priority_class(pool=university, name=name, value=value)
        for name, at, nominals in TIDES:
            hour, minute = (int(part) for part in at.split(":"))
            TidalStep.objects.get_or_create(pool=university, name=name, defaults={
                "daily_at": time(hour, minute), "nominals": nominals})

    def _org(self, slug: str, role: str) -> Organization:
        org = Organization.objects.filter(slug=slug).first()
        user = get_user_model().objects.filter(username=slug).first()
        if user is None:
            # a person to log in to the web pages as: user = the slug, password DEMO_PASSWORD
            user = get_user_model().objects.create_user(username=slug, password=DEMO_PASSWORD,
                                                        is_staff=role == "operator",
                                                        is_superuser=role == "operator")
            if org is not None:
                Membership.objects.get_or_create(user=user, organization=org,
                                                 defaults={"role": Membership.Role.OWNER})
        if org is None:
            org = accounts.create_organization(slug=slug, name=slug.replace("-", " ").title(),
                                               roles=(role,), owner=user)
        return org

    def _credentials(self, credentials: dict, org: Organization, role: str) -> dict:
        entry = credentials.get(org.slug)
        if entry is None or not org.api_keys.filter(prefix=entry["key"].split("_")[1],
                                                    revoked_at__isnull=True).exists():
            issued = accounts.issue_api_key(organization=org, scopes=KEY_SCOPES[role],
                                            name="demo")
            entry = {"role": role, "key": issued.raw_key}
            credentials[org.slug] = entry
        return entry
