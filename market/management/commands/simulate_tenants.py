"""Simulated tenants for the demo: they place orders through the REST API, continuously.

Each round a random demo tenant orders a random gang of GPUs, on demand (7 in 10) or spot,
and now and then terminates one of its leases, so the market, the clearing and the
scheduler always have work. Stops on SIGINT/SIGTERM or after --duration seconds.
"""

import json
import random
import signal
import time

import requests
from django.core.management.base import BaseCommand, CommandError

from ibex.runtime import var_dir

SIZES = [1, 2, 4, 8, 8, 16, 32]


class Command(BaseCommand):
    help = "Run simulated tenants that place orders through the API."

    def add_arguments(self, parser):
        parser.add_argument("--api", default="http://127.0.0.1:8000")
        parser.add_argument("--every", type=float, default=3.0, help="seconds between orders")
        parser.add_argument("--duration", type=float, default=0, help="0: until stopped")
        parser.add_argument("--seed", type=int, default=7)

    def handle(self, *args, api, every, duration, seed, **options):
        path = var_dir() / "demo" / "credentials.json"
        if not path.exists():
            raise CommandError(f"{path} is missing: run `python manage.py seed_demo` first")
        credentials = json.loads(path.read_text())
        tenants = {slug: e["key"] for slug, e in credentials.items()
                   if e["role"] == "tenant" and e.get("simulated")}
        if not tenants:
            raise CommandError(f"{path} names no simulated tenant: run `python manage.py "
                               f"seed_demo` again")
        models = sorted({e["gpu_model"] for e in credentials.values() if e["role"] == "provider"})
        running = [True]
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: running.__setitem__(0, False))
        rng = random.Random(seed)
        session = requests.Session()
        deadline = time.monotonic() + duration if duration else None
        while running[0] and (deadline is None or time.monotonic() < deadline):
            slug = rng.choice(sorted(tenants))
            headers = {"Authorization": f"Bearer {tenants[slug]}"}
            try:
                if rng.random() < 0.2:
                    self._terminate_one(session, api, headers, rng)
                else:
                    self._order(session, api, headers, slug, rng, models)
            except requests.RequestException as exc:
                self.stderr.write(f"simulated tenants: {exc.__class__.__name__}: {exc}")
            time.sleep(every)

    def _order(self, session, api, headers, slug, rng, models):
        tier = "on_demand" if rng.random() < 0.7 else "spot"
        body = {"gpu_models": [rng.choice(models)], "gpus": rng.choice(SIZES),
                "hours": rng.choice([1, 2, 4]), "tier": tier,
                "max_price_per_gpu_hour": f"{rng.uniform(1.5, 4.0):.2f}",
                "topology": {"preferred": "leaf"}, "fill": "rest" if tier == "spot" else
                rng.choice(["rest", "fill_or_kill"])}
        if rng.random() < 0.5:  # a training run the simulated agents pretend to run
            body["workload"] = {
                "command": ["python3", "train.py", "--epochs", str(rng.choice([1, 3, 10]))],
                "env": {"IBEX_SIMULATED_SECONDS": str(rng.choice([60, 300, 1800]))}}
        answer = session.post(f"{api}/api/v1/orders/", json=body, headers=headers, timeout=30)
        state = answer.json().get("state", answer.status_code)
        self.stdout.write(f"{slug}: {tier} {body['gpus']} x {body['gpu_models'][0]} "
                          f"at <= {body['max_price_per_gpu_hour']}: {state}")

    def _terminate_one(self, session, api, headers, rng):
        leases = session.get(f"{api}/api/v1/leases/?state=active", headers=headers,
                             timeout=30).json().get("results", [])
        if leases:
            lease = rng.choice(leases)
            session.post(f"{api}/api/v1/leases/{lease['id']}/terminate/", headers=headers,
                         timeout=30)
