"""Locust scenario for `bench/load.py`: tenants browse the markets and their leases and place
on-demand orders through the REST API, ending each lease they win at once (so capacity is
recycled and every order can be filled).

Each simulated tenant uses its own organisation's API key (IBEX_LOAD_KEYS: a JSON list).
Response times are gathered per group (reads, orders, other writes) and written as JSON to
IBEX_LOAD_RESULT when the run stops: count, errors, p50/p95/p99/max in ms.
"""

import itertools
import json
import os
import time
import uuid

from locust import HttpUser, between, events, task

KEYS = json.loads(os.environ.get("IBEX_LOAD_KEYS", "[]"))
_next_key = itertools.count()
SAMPLES: dict[str, list[float]] = {"reads": [], "orders": [], "writes": []}
ERRORS: dict[str, int] = {"reads": 0, "orders": 0, "writes": 0}
BY_NAME: dict[str, list[float]] = {}
ERROR_EXAMPLES: list[str] = []
STARTED = {"at": None}
ORDER = {"gpu_models": ["H100-80GB"], "hours": 1, "tier": "on_demand",
         "max_price_per_gpu_hour": "3.00"}


def _group(request_type: str, name: str) -> str:
    if name == "POST /orders/":
        return "orders"
    return "reads" if request_type == "GET" else "writes"


@events.request.add_listener
def _record(request_type, name, response_time, exception, **kwargs):
    if STARTED["at"] is None:
        STARTED["at"] = time.monotonic()
    group = _group(request_type, name)
    SAMPLES[group].append(response_time)
    BY_NAME.setdefault(name, []).append(response_time)
    if exception is not None:
        ERRORS[group] += 1
        if len(ERROR_EXAMPLES) < 20:
            ERROR_EXAMPLES.append(f"{request_type} {name}: {exception}"[:300])


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1) if ordered else 0.0


@events.test_stop.add_listener
def _write(environment, **kwargs):
    path = os.environ.get("IBEX_LOAD_RESULT")
    if not path:
        return
    seconds = time.monotonic() - (STARTED["at"] or time.monotonic())
    result = {"seconds": round(seconds, 1), "groups": {}, "error_examples": ERROR_EXAMPLES}
    total = 0
    for group, values in SAMPLES.items():
        total += len(values)
        result["groups"][group] = {
            "requests": len(values), "errors": ERRORS[group],
            "per_s": round(len(values) / seconds, 1) if seconds else 0.0,
            "p50_ms": _percentile(values, 0.50), "p95_ms": _percentile(values, 0.95),
            "p99_ms": _percentile(values, 0.99), "max_ms": round(max(values, default=0), 1)}
    result["by_name"] = {name: {"requests": len(v), "p50_ms": _percentile(v, 0.5),
                                "p99_ms": _percentile(v, 0.99)} for name, v in BY_NAME.items()}
    result["requests"] = total
    result["per_s"] = round(total / seconds, 1) if seconds else 0.0
    result["errors"] = sum(ERRORS.values())
    with open(path, "w") as out:
        json.dump(result, out)


class Tenant(HttpUser):
    wait_time = between(0.5, 2.0)

    def on_start(self):
        key = KEYS[next(_next_key) % len(KEYS)]
        self.client.headers["Authorization"] = f"Bearer {key}"

    @task(4)
    def markets(self):
        self.client.get("/api/v1/markets/", name="GET /markets/")

    @task(2)
    def price_history(self):
        self.client.get("/api/v1/markets/H100-80GB/history/", name="GET /markets/{model}/history/")

    @task(3)
    def leases(self):
        self.client.get("/api/v1/leases/", name="GET /leases/")

    @task(2)
    def orders(self):
        self.client.get("/api/v1/orders/", name="GET /orders/")

    @task(1)
    def offered_gpus(self):
        self.client.get("/api/v1/gpus/?model=H100-80GB", name="GET /gpus/")

    @task(1)
    def market_page(self):
        self.client.get("/", name="GET / (web market page)")

    @task(2)
    def place_order(self):
        body = {**ORDER, "gpus": 1 + int(uuid.uuid4().int % 2)}
        with self.client.post("/api/v1/orders/", json=body, name="POST /orders/",
                              headers={"Idempotency-Key": uuid.uuid4().hex},
                              catch_response=True) as response:
            if response.status_code != 201:
                response.failure(f"{response.status_code}: {response.text[:200]}")
                return
            response.success()
            lease = response.json().get("lease")
        if lease:
            self.client.post(f"/api/v1/leases/{lease}/terminate/",
                             name="POST /leases/{id}/terminate/")
