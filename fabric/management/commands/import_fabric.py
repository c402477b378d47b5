import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from fabric import services
from fabric.management.commands._owner import resolve_owner


class Command(BaseCommand):
    help = "Import a fabric from ibnetdiscover output or a Slurm topology.conf (one transaction)."

    def add_arguments(self, parser):
        parser.add_argument("path")
        parser.add_argument("--format", required=True, choices=services.FORMATS, dest="fmt")
        parser.add_argument("--name", required=True, help="the fabric's name (a slug)")
        parser.add_argument("--owner", help="owning organisation's slug")
        parser.add_argument("--gpus-per-node", type=int, default=8)

    def handle(self, *args, path, fmt, name, owner, gpus_per_node, **options):
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise CommandError(f"{path}: cannot read: {exc.strerror}") from None
        started = time.perf_counter()
        try:
            result = services.import_fabric_file(
                owner=resolve_owner(owner, name), name=name, text=text, fmt=fmt, path=path,
                gpus_per_node=gpus_per_node,
            )
        except services.FabricImportError as exc:
            raise CommandError(str(exc)) from None
        counts = result.summary["domain_counts"]
        verb = "imported" if result.created else "updated"
        self.stdout.write(
            f"{verb} fabric {name}: {counts['node']} nodes, {counts['leaf']} leaves, "
            f"{counts['spine']} spines, {result.summary['gpus']} GPUs "
            f"in {time.perf_counter() - started:.2f} s"
        )
