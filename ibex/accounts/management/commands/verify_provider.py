from django.core.management.base import BaseCommand, CommandError

from ibex.accounts import services
from ibex.accounts.models import Organization, ProviderProfile


class Command(BaseCommand):
    help = "Verify a provider by hand (after an audit), or suspend one with --suspend."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--suspend", action="store_true")
        parser.add_argument("--reason", default="verified by an operator")

    def handle(self, *args, slug, suspend, reason, **options):
        org = Organization.objects.filter(slug=slug, provider_profile__isnull=False).first()
        if org is None:
            raise CommandError(f"no provider {slug!r}")
        to_state = ProviderProfile.State.SUSPENDED if suspend else ProviderProfile.State.VERIFIED
        try:
            services.change_provider_state(organization=org, to_state=to_state,
                                           actor="operator (manage.py)", reason=reason)
        except services.TransitionError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"{slug} is now {to_state}")
