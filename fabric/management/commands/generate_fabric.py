import time

from django.core.management.base import BaseCommand, CommandError

from fabric import services
from fabric.core import generators
from fabric.core.slurm import export_slurm_tree
from fabric.management.commands._owner import resolve_owner


class Command(BaseCommand):
    help = "Generate a fat-tree, dragonfly or 3D torus and save it (or print its topology.conf)."

    def add_arguments(self, parser):
        parser.add_argument("--kind", required=True, choices=["fat-tree", "dragonfly", "torus"])
        parser.add_argument("--name", help="save under this fabric name")
        parser.add_argument("--owner", help="owning organisation's slug")
        parser.add_argument("--print", action="store_true", help="print topology.conf, save nothing")
        parser.add_argument("--gpus-per-node", type=int, default=8)
        parser.add_argument("--rate-gbps", type=float, default=400)
        fat = parser.add_argument_group("fat-tree")
        fat.add_argument("--nodes", type=int, default=64)
        fat.add_argument("--radix", type=int, default=32)
        fat.add_argument("--tiers", type=int, choices=[2, 3], default=2)
        fat.add_argument("--rails", type=int, default=1)
        fly = parser.add_argument_group("dragonfly")
        fly.add_argument("--a", type=int, default=4, help="routers per group")
        fly.add_argument("--p", type=int, default=2, help="hosts per router")
        fly.add_argument("--h", type=int, default=2, help="global links per router")
        tor = parser.add_argument_group("torus")
        tor.add_argument("--x", type=int, default=4)
        tor.add_argument("--y", type=int, default=4)
        tor.add_argument("--z", type=int, default=4)

    def handle(self, *args, **o):
        if not o["print"] and not o["name"]:
            raise CommandError("give --name to save the fabric, or --print to print it")
        try:
            spec = self._generate(o)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if o["print"]:
            self.stdout.write(export_slurm_tree(spec), ending="")
            return
        started = time.perf_counter()
        result = services.save_fabric(owner=resolve_owner(o["owner"], o["name"]), name=o["name"],
                                      spec=spec, source="generator")
        counts = result.summary["domain_counts"]
        self.stdout.write(
            f"saved {o['kind']} {o['name']}: {counts['node']} nodes, {counts['leaf']} leaves, "
            f"{counts['spine']} spines, {result.summary['gpus']} GPUs "
            f"in {time.perf_counter() - started:.2f} s"
        )

    def _generate(self, o):
        common = {"gpus_per_node": o["gpus_per_node"], "rate_gbps": o["rate_gbps"]}
        if o["kind"] == "fat-tree":
            return generators.fat_tree(o["nodes"], o["radix"], tiers=o["tiers"], rails=o["rails"],
                                       **common)
        if o["kind"] == "dragonfly":
            return generators.dragonfly(o["a"], o["p"], o["h"], **common)
        return generators.torus(o["x"], o["y"], o["z"], **common)
