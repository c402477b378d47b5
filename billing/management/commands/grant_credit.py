from django.core.management.base import BaseCommand, CommandError

from billing import services
from billing.core import money
from ibex.accounts.models import Organization


class Command(BaseCommand):
    help = "Grant promotional or goodwill credit to an organisation, recorded in the ledger."

    def add_arguments(self, parser):
        parser.add_argument("--org", required=True, help="organisation slug")
        parser.add_argument("--amount", required=True, help="dollars, e.g. 100.00")
        parser.add_argument("--reason", required=True)
        parser.add_argument("--actor", default="operator", help="who grants it")

    def handle(self, *args, org, amount, reason, actor, **options):
        organization = Organization.objects.filter(slug=org).first()
        if organization is None:
            raise CommandError(f"no organisation {org!r}")
        try:
            micros = money.to_micros(amount)
            grant = services.grant_credit(organization=organization, amount_micros=micros,
                                          reason=reason, actor=actor)
        except (money.BadAmount, services.MoneyError) as exc:
            raise CommandError(str(exc)) from None
        balance = services.balances_of(organization).available_micros
        self.stdout.write(f"granted {money.to_dollars(grant.amount_micros)} USD to {org} "
                          f"(grant {grant.pk}); available now {money.to_dollars(balance)} USD")
