"""Seed a demonstration exchange: two verified providers with fabrics, a tenant, an operator.

Idempotent: a second run reuses what exists. The raw API keys are written, for this local
demo only, to var/demo/credentials.json, which `make demo` reads to start simulated agents.
"""

import json

from django.core.management.base import BaseCommand
from django.db import transaction

from fabric import generators
from fabric import services as fabric_services
from fabric.models import Fabric
from ibex.accounts import services as accounts
from ibex.accounts.models import Organization, ProviderProfile
from ibex.runtime import var_dir

PROVIDERS = [
    # slug, fabric, GPU model, hosts expression, generator arguments
    ("hpc-one", "hpc-one-h100", "H100-80GB", "h100-[01-64]",
     {"nodes": 64, "radix": 8, "tiers": 3, "prefix": "h100-", "rate_gbps": 400}),
    ("campus-gpus", "campus-a100", "A100-80GB", "a100-[01-16]",
     {"nodes": 16, "radix": 8, "tiers": 2, "prefix": "a100-", "rate_gbps": 200}),
]
KEY_SCOPES = {"provider": ["read", "provide"], "tenant": ["read", "trade"],
              "operator": ["read", "trade", "provide", "admin"]}


class Command(BaseCommand):
    help = "Seed the demonstration exchange (idempotent)."

    def handle(self, *args, **options):
        path = var_dir() / "demo" / "credentials.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        credentials = json.loads(path.read_text()) if path.exists() else {}
        with transaction.atomic():
            for slug, fabric_name, model, hosts, shape in PROVIDERS:
                org = self._org(slug, "provider")
                if not Fabric.objects.filter(name=fabric_name).exists():
                    spec = generators.fat_tree(shape["nodes"], shape["radix"], tiers=shape["tiers"],
                                               prefix=shape["prefix"],
                                               rate_gbps=shape["rate_gbps"])
                    fabric_services.save_fabric(owner=org, name=fabric_name, spec=spec,
                                                source="generator")
                if org.provider_profile.state == ProviderProfile.State.PENDING:
                    accounts.change_provider_state(organization=org, to_state="verified",
                                                   actor="demo seed", reason="demonstration")
                entry = self._credentials(credentials, org, "provider")
                entry.update({"fabric": fabric_name, "gpu_model": model, "hosts": hosts})
            self._credentials(credentials, self._org("acme-ai", "tenant"), "tenant")
            self._credentials(credentials, self._org("ibex-ops", "operator"), "operator")
        path.write_text(json.dumps(credentials, indent=2))
        path.chmod(0o600)
        for slug, entry in sorted(credentials.items()):
            self.stdout.write(f"{entry['role']:>9} {slug:<12} key {entry['key'][:18]}…")
        self.stdout.write(f"demo API keys: {path}")

    def _org(self, slug: str, role: str) -> Organization:
        org = Organization.objects.filter(slug=slug).first()
        return org or accounts.create_organization(slug=slug, name=slug.replace("-", " ").title(),
                                                   roles=(role,))

    def _credentials(self, credentials: dict, org: Organization, role: str) -> dict:
        entry = credentials.get(org.slug)
        if entry is None or not org.api_keys.filter(prefix=entry["key"].split("_")[1],
                                                    revoked_at__isnull=True).exists():
            issued = accounts.issue_api_key(organization=org, scopes=KEY_SCOPES[role],
                                            name="demo")
            entry = {"role": role, "key": issued.raw_key}
            credentials[org.slug] = entry
        return entry
