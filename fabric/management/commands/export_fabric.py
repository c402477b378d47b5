from django.core.management.base import BaseCommand, CommandError

from fabric.models import Fabric
from fabric.selectors import EXPORT_FORMATS, export_topology_conf


class Command(BaseCommand):
    help = "Write a fabric as a Slurm topology.conf (tree or block) on standard output."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--format", required=True, choices=EXPORT_FORMATS, dest="fmt")

    def handle(self, *args, name, fmt, **options):
        fabric = Fabric.objects.filter(name=name).first()
        if fabric is None:
            raise CommandError(f"no fabric named {name!r}")
        self.stdout.write(export_topology_conf(fabric, fmt), ending="")
