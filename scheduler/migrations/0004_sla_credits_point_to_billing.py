"""An SLA credit's ledger transaction now lives in `billing` (the same table)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0001_money_from_market'),
        ('scheduler', '0003_notify_models_move'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.AlterField(
                model_name='slacredit',
                name='transaction',
                field=models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='sla_credit', to='billing.ledgertransaction'),
            ),
        ]),
    ]
