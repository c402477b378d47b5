"""The money models leave for `billing` (state only: no table is dropped)."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('market', '0006_order_priority_class'),
        ('billing', '0001_money_from_market'),
        ('scheduler', '0004_sla_credits_point_to_billing'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.RemoveField(
                model_name='account',
                name='organization',
            ),
            migrations.RemoveField(
                model_name='entry',
                name='account',
            ),
            migrations.RemoveField(
                model_name='connectaccount',
                name='organization',
            ),
            migrations.RemoveField(
                model_name='creditgrant',
                name='organization',
            ),
            migrations.RemoveField(
                model_name='entry',
                name='transaction',
            ),
            migrations.RemoveField(
                model_name='hold',
                name='tenant',
            ),
            migrations.RemoveField(
                model_name='usagerecord',
                name='transaction',
            ),
            migrations.DeleteModel(
                name='MoneyStateChange',
            ),
            migrations.RemoveField(
                model_name='payout',
                name='provider',
            ),
            migrations.RemoveField(
                model_name='refund',
                name='tenant',
            ),
            migrations.RemoveField(
                model_name='refund',
                name='top_up',
            ),
            migrations.RemoveField(
                model_name='spendlimit',
                name='organization',
            ),
            migrations.DeleteModel(
                name='StripeEvent',
            ),
            migrations.RemoveField(
                model_name='topup',
                name='tenant',
            ),
            migrations.RemoveField(
                model_name='usagerecord',
                name='payee',
            ),
            migrations.RemoveField(
                model_name='usagerecord',
                name='payer',
            ),
            migrations.DeleteModel(
                name='Account',
            ),
            migrations.DeleteModel(
                name='ConnectAccount',
            ),
            migrations.DeleteModel(
                name='CreditGrant',
            ),
            migrations.DeleteModel(
                name='Entry',
            ),
            migrations.DeleteModel(
                name='Hold',
            ),
            migrations.DeleteModel(
                name='LedgerTransaction',
            ),
            migrations.DeleteModel(
                name='Payout',
            ),
            migrations.DeleteModel(
                name='Refund',
            ),
            migrations.DeleteModel(
                name='SpendLimit',
            ),
            migrations.DeleteModel(
                name='TopUp',
            ),
            migrations.DeleteModel(
                name='UsageRecord',
            ),
        ]),
    ]
