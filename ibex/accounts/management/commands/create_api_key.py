from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from ibex.accounts import services
from ibex.accounts.models import ApiKey, Organization


class Command(BaseCommand):
    help = "Issue an API key for an organisation; the key is printed alone on the last line."

    def add_arguments(self, parser):
        parser.add_argument("--org", required=True, help="organisation slug")
        parser.add_argument("--create-org", action="store_true", help="create it if missing")
        parser.add_argument("--role", action="append", choices=services.ROLES, default=[],
                            help="role of a created organisation (repeatable)")
        parser.add_argument("--scopes", nargs="+", choices=ApiKey.Scope.values,
                            help="default: what the organisation's roles need (read, and "
                                 "trade for a tenant, provide for a provider, admin for an "
                                 "operator)")
        parser.add_argument("--name", default="")

    @transaction.atomic
    def handle(self, *args, org, create_org, role, scopes, name, **options):
        organization = Organization.objects.filter(slug=org).first()
        if organization is None:
            if not create_org:
                raise CommandError(f"no organisation {org!r}; pass --create-org to create it")
            organization = services.create_organization(slug=org, roles=tuple(role))
        scopes = scopes or services.default_scopes(organization)
        issued = services.issue_api_key(organization=organization, scopes=scopes, name=name)
        self.stderr.write(f"key {issued.api_key.prefix} for {organization.slug}, "
                          f"scopes {','.join(issued.api_key.scopes)}; it is shown only once")
        self.stdout.write(issued.raw_key)
