"""Rehearse a failure in the demo: tell a simulated agent to fail a GPU or go silent.

    python manage.py rehearse_failure --host h100-03 --gpu 2     # GPU 2 reports ECC errors
    python manage.py rehearse_failure --host h100-05 --node-down # the node stops heartbeating
    python manage.py rehearse_failure --clear                    # everything healthy again

The simulated agents (`make demo`) re-read their control files every heartbeat; the pool
marks the GPU failed or the node unreachable, the scheduler moves the leases on it
(`scheduler.remediate_leases`, every 15 s) and the SLA task credits the downtime (every 60 s).
"""

import json

from django.core.management.base import BaseCommand, CommandError

from ibex.runtime import var_dir
from pool.models import Node


class Command(BaseCommand):
    help = "Fail a GPU or silence a node of the demo's simulated agents (or clear all)."

    def add_arguments(self, parser):
        parser.add_argument("--host")
        target = parser.add_mutually_exclusive_group()
        target.add_argument("--gpu", type=int)
        target.add_argument("--node-down", action="store_true")
        parser.add_argument("--clear", action="store_true")

    def handle(self, *args, host, gpu, node_down, clear, **options):
        demo = var_dir() / "demo"
        if clear:
            for path in demo.glob("*-control.json"):
                path.write_text("{}")
            self.stdout.write("every simulated GPU and node is healthy again")
            return
        if not host or (gpu is None and not node_down):
            raise CommandError("give --host and --gpu N or --node-down (or --clear)")
        node = Node.objects.filter(hostname=host).select_related("provider").first()
        if node is None:
            raise CommandError(f"no node {host!r}")
        path = demo / f"{node.provider.slug}-control.json"
        control = json.loads(path.read_text()) if path.exists() and path.read_text() else {}
        if node_down:
            control.setdefault("stop_heartbeats", []).append(host)
            what = f"{host} stops heartbeating"
        else:
            if not 0 <= gpu < node.gpus.count():
                raise CommandError(f"{host} has no GPU {gpu}")
            control.setdefault("fail_gpus", {}).setdefault(host, []).append(gpu)
            what = f"{host} GPU {gpu} reports uncorrectable ECC errors"
        path.write_text(json.dumps(control))
        self.stdout.write(f"{what} (control file {path})")
