"""The money models move here from `market`, state only: their tables keep their names."""

import django.db.models.deletion
import django.db.models.expressions
import django.db.models.functions.math
import django.db.models.lookups
from django.db import migrations, models

MOVED = ["account", "ledgertransaction", "entry", "creditgrant", "spendlimit", "hold",
         "usagerecord", "topup", "refund", "connectaccount", "payout", "moneystatechange",
         "stripeevent"]


def rename_content_types(apps, schema_editor, old="market", new="billing"):
    """Permissions and admin log rows follow the models: their content types change app."""
    ContentType = apps.get_model("contenttypes", "ContentType")
    ContentType.objects.filter(app_label=old, model__in=MOVED).update(app_label=new)


def rename_content_types_back(apps, schema_editor):
    rename_content_types(apps, schema_editor, old="billing", new="market")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('accounts', '0002_providerprofile_providerstatechange'),
        ('market', '0006_order_priority_class'),
        ('contenttypes', '0002_remove_content_type_name'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.CreateModel(
                name='StripeEvent',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('event_id', models.CharField(max_length=100, unique=True)),
                    ('type', models.CharField(max_length=100)),
                    ('payload', models.JSONField()),
                    ('outcome', models.CharField(blank=True, max_length=500)),
                    ('received_at', models.DateTimeField(auto_now_add=True)),
                ],
                options={
                    'db_table': 'market_stripeevent',
                },
            ),
            migrations.CreateModel(
                name='Account',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('kind', models.CharField(choices=[('tenant_available', 'Tenant Available'), ('tenant_held', 'Tenant Held'), ('provider_payable', 'Provider Payable'), ('provider_held_back', 'Provider Held Back'), ('platform_revenue', 'Platform Revenue'), ('sla_credits', 'Sla Credits'), ('promotions', 'Promotions'), ('stripe_clearing', 'Stripe Clearing'), ('quota_used', 'Quota Used'), ('quota_issued', 'Quota Issued')], max_length=24)),
                    ('currency', models.CharField(default='usd', max_length=3)),
                    ('balance_micros', models.BigIntegerField(default=0, help_text='cache of the sum of entries, under lock')),
                    ('created_at', models.DateTimeField(auto_now_add=True)),
                    ('organization', models.ForeignKey(blank=True, help_text="empty for the platform's own accounts", null=True, on_delete=django.db.models.deletion.PROTECT, related_name='ledger_accounts', to='accounts.organization')),
                ],
                options={
                    'db_table': 'market_account',
                },
            ),
            migrations.CreateModel(
                name='ConnectAccount',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('stripe_account_id', models.CharField(blank=True, max_length=64, null=True, unique=True)),
                    ('onboarding_url', models.URLField(blank=True, max_length=500)),
                    ('details_submitted', models.BooleanField(default=False)),
                    ('charges_enabled', models.BooleanField(default=False)),
                    ('payouts_enabled', models.BooleanField(default=False)),
                    ('created_at', models.DateTimeField(auto_now_add=True)),
                    ('updated_at', models.DateTimeField(auto_now=True)),
                    ('organization', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='connect_account', to='accounts.organization')),
                ],
                options={
                    'db_table': 'market_connectaccount',
                },
            ),
            migrations.CreateModel(
                name='CreditGrant',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('amount_micros', models.BigIntegerField()),
                    ('reason', models.CharField(max_length=500)),
                    ('actor', models.CharField(max_length=150)),
                    ('created_at', models.DateTimeField(auto_now_add=True)),
                    ('organization', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='credit_grants', to='accounts.organization')),
                ],
                options={
                    'db_table': 'market_creditgrant',
                },
            ),
            migrations.CreateModel(
                name='Hold',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('order_ref', models.CharField(max_length=100, unique=True)),
                    ('amount_micros', models.BigIntegerField()),
                    ('captured_micros', models.BigIntegerField(default=0)),
                    ('released_micros', models.BigIntegerField(default=0)),
                    ('state', models.CharField(choices=[('open', 'Open'), ('closed', 'Closed')], default='open', max_length=8)),
                    ('created_at', models.DateTimeField(auto_now_add=True)),
                    ('closed_at', models.DateTimeField(blank=True, null=True)),
                    ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='holds', to='accounts.organization')),
                ],
                options={
                    'db_table': 'market_hold',
                },
            ),
            migrations.CreateModel(
                name='LedgerTransaction',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('cause', models.CharField(choices=[('top_up', 'Top Up'), ('grant', 'Grant'), ('hold', 'Hold'), ('release', 'Release'), ('capture', 'Capture'), ('usage', 'Usage'), ('payout', 'Payout'), ('payout_reversal', 'Payout Reversal'), ('refund', 'Refund'), ('refund_reversal', 'Refund Reversal'), ('sla_credit', 'Sla Credit'), ('quota_usage', 'Quota Usage')], max_length=20)),
                    ('source_type', models.CharField(help_text='the kind of row that caused it', max_length=40)),
                    ('source_id', models.CharField(help_text="that row's id or reference", max_length=200)),
                    ('currency', models.CharField(default='usd', max_length=3)),
                    ('memo', models.CharField(blank=True, max_length=500)),
                    ('actor', models.CharField(help_text="a user name, or 'system'", max_length=150)),
                    ('created_at', models.DateTimeField(auto_now_add=True)),
                ],
                options={
                    'db_table': 'market_ledgertransaction',
                    'indexes': [models.Index(fields=['source_type', 'source_id'], name='market_ledg_source__7b07ed_idx')],
                },
            ),
            migrations.CreateModel(
                name='Entry',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('amount_micros', models.BigIntegerField()),
                    ('created_at', models.DateTimeField(auto_now_add=True)),
                    ('account', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='entries', to='billing.account')),
                    ('transaction', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='entries', to='billing.ledgertransaction')),
                ],
                options={
                    'db_table': 'market_entry',
                },
            ),
            migrations.CreateModel(
                name='MoneyStateChange',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('subject', models.CharField(help_text='top_up, refund or payout', max_length=10)),
                    ('subject_id', models.BigIntegerField()),
                    ('from_state', models.CharField(max_length=10)),
                    ('to_state', models.CharField(max_length=10)),
                    ('actor', models.CharField(max_length=150)),
                    ('reason', models.CharField(max_length=500)),
                    ('at', models.DateTimeField(auto_now_add=True)),
                ],
                options={
                    'db_table': 'market_moneystatechange',
                    'ordering': ['at', 'id'],
                    'indexes': [models.Index(fields=['subject', 'subject_id'], name='market_mone_subject_4877a9_idx')],
                },
            ),
            migrations.CreateModel(
                name='Payout',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('amount_micros', models.BigIntegerField()),
                    ('state', models.CharField(choices=[('pending', 'Pending'), ('paid', 'Paid'), ('failed', 'Failed')], default='pending', max_length=8)),
                    ('stripe_transfer_id', models.CharField(blank=True, max_length=64, null=True, unique=True)),
                    ('stripe_payout_id', models.CharField(blank=True, max_length=64, null=True, unique=True)),
                    ('last_error', models.CharField(blank=True, max_length=500)),
                    ('created_at', models.DateTimeField(auto_now_add=True)),
                    ('state_changed_at', models.DateTimeField(auto_now_add=True)),
                    ('provider', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='payouts', to='accounts.organization')),
                ],
                options={
                    'db_table': 'market_payout',
                },
            ),
            migrations.CreateModel(
                name='SpendLimit',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('per_hour_micros', models.BigIntegerField(blank=True, null=True)),
                    ('per_month_micros', models.BigIntegerField(blank=True, null=True)),
                    ('auto_top_up_below_micros', models.BigIntegerField(blank=True, help_text='top up automatically when available falls below', null=True)),
                    ('auto_top_up_amount_micros', models.BigIntegerField(blank=True, null=True)),
                    ('stripe_customer_id', models.CharField(blank=True, max_length=64)),
                    ('stripe_payment_method_id', models.CharField(blank=True, max_length=64)),
                    ('organization', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='spend_limit', to='accounts.organization')),
                ],
                options={
                    'db_table': 'market_spendlimit',
                },
            ),
            migrations.CreateModel(
                name='TopUp',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('amount_micros', models.BigIntegerField()),
                    ('currency', models.CharField(default='usd', max_length=3)),
                    ('state', models.CharField(choices=[('created', 'Created'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('refunded', 'Refunded')], default='created', max_length=10)),
                    ('automatic', models.BooleanField(default=False)),
                    ('idempotency_key', models.CharField(blank=True, help_text="the client's Idempotency-Key header", max_length=100, null=True)),
                    ('payment_intent_id', models.CharField(blank=True, max_length=64, null=True, unique=True)),
                    ('client_secret', models.CharField(blank=True, max_length=200)),
                    ('refunded_micros', models.BigIntegerField(default=0)),
                    ('last_error', models.CharField(blank=True, max_length=500)),
                    ('created_at', models.DateTimeField(auto_now_add=True)),
                    ('state_changed_at', models.DateTimeField(auto_now_add=True)),
                    ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='top_ups', to='accounts.organization')),
                ],
                options={
                    'db_table': 'market_topup',
                },
            ),
            migrations.CreateModel(
                name='Refund',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('idempotency_key', models.CharField(blank=True, max_length=100, null=True)),
                    ('amount_micros', models.BigIntegerField()),
                    ('state', models.CharField(choices=[('pending', 'Pending'), ('succeeded', 'Succeeded'), ('failed', 'Failed')], default='pending', max_length=10)),
                    ('stripe_refund_id', models.CharField(blank=True, max_length=64, null=True, unique=True)),
                    ('reason', models.CharField(blank=True, max_length=500)),
                    ('created_at', models.DateTimeField(auto_now_add=True)),
                    ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='refunds', to='accounts.organization')),
                    ('top_up', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='refunds', to='billing.topup')),
                ],
                options={
                    'db_table': 'market_refund',
                },
            ),
            migrations.CreateModel(
                name='UsageRecord',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('lease_ref', models.CharField(max_length=100)),
                    ('minute', models.DateTimeField(help_text='start of the minute, UTC')),
                    ('gpus', models.PositiveIntegerField()),
                    ('seconds', models.PositiveIntegerField()),
                    ('price_per_gpu_hour_micros', models.BigIntegerField()),
                    ('charge_micros', models.BigIntegerField()),
                    ('fee_micros', models.BigIntegerField()),
                    ('held_back_micros', models.BigIntegerField()),
                    ('created_at', models.DateTimeField(auto_now_add=True)),
                    ('payee', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='usage_earned', to='accounts.organization')),
                    ('payer', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='usage_paid', to='accounts.organization')),
                    ('transaction', models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='usage_record', to='billing.ledgertransaction')),
                ],
                options={
                    'db_table': 'market_usagerecord',
                },
            ),
            migrations.AddConstraint(
                model_name='account',
                constraint=models.UniqueConstraint(fields=('organization', 'kind', 'currency'), name='one_account_per_org_kind', nulls_distinct=False),
            ),
            migrations.AddConstraint(
                model_name='account',
                constraint=models.CheckConstraint(condition=models.Q(('balance_micros__gte', 0), ('kind__in', ['sla_credits', 'promotions', 'stripe_clearing', 'quota_issued']), _connector='OR'), name='account_balance_not_negative'),
            ),
            migrations.AddConstraint(
                model_name='account',
                constraint=models.CheckConstraint(condition=models.Q(models.Q(('kind__in', ['platform_revenue', 'sla_credits', 'promotions', 'stripe_clearing']), ('organization__isnull', True)), models.Q(('kind__in', ['tenant_available', 'tenant_held', 'provider_payable', 'provider_held_back', 'quota_used', 'quota_issued']), ('organization__isnull', False)), _connector='OR'), name='account_owner_matches_kind'),
            ),
            migrations.AddConstraint(
                model_name='creditgrant',
                constraint=models.CheckConstraint(condition=models.Q(('amount_micros__gt', 0)), name='grant_positive'),
            ),
            migrations.AddIndex(
                model_name='hold',
                index=models.Index(fields=['tenant', 'created_at'], name='market_hold_tenant__98d002_idx'),
            ),
            migrations.AddConstraint(
                model_name='hold',
                constraint=models.CheckConstraint(condition=models.Q(('amount_micros__gt', 0)), name='hold_positive'),
            ),
            migrations.AddConstraint(
                model_name='hold',
                constraint=models.CheckConstraint(condition=models.Q(('amount_micros__gte', django.db.models.expressions.CombinedExpression(models.F('captured_micros'), '+', models.F('released_micros'))), ('captured_micros__gte', 0), ('released_micros__gte', 0)), name='hold_not_overspent'),
            ),
            migrations.AddIndex(
                model_name='entry',
                index=models.Index(fields=['account', '-id'], name='market_entr_account_bfb1dd_idx'),
            ),
            migrations.AddConstraint(
                model_name='entry',
                constraint=models.CheckConstraint(condition=models.Q(('amount_micros', 0), _negated=True), name='entry_not_zero'),
            ),
            migrations.AddConstraint(
                model_name='payout',
                constraint=models.CheckConstraint(condition=models.Q(('amount_micros__gt', 0)), name='payout_positive'),
            ),
            migrations.AddConstraint(
                model_name='payout',
                constraint=models.CheckConstraint(condition=django.db.models.lookups.Exact(django.db.models.functions.math.Mod('amount_micros', models.Value(10000)), 0), name='payout_whole_cents'),
            ),
            migrations.AddConstraint(
                model_name='spendlimit',
                constraint=models.CheckConstraint(condition=models.Q(('per_hour_micros__gte', 0), ('per_hour_micros', None), _connector='OR'), name='hour_limit_not_negative'),
            ),
            migrations.AddConstraint(
                model_name='spendlimit',
                constraint=models.CheckConstraint(condition=models.Q(('per_month_micros__gte', 0), ('per_month_micros', None), _connector='OR'), name='month_limit_not_negative'),
            ),
            migrations.AddConstraint(
                model_name='topup',
                constraint=models.CheckConstraint(condition=models.Q(('amount_micros__gt', 0)), name='top_up_positive'),
            ),
            migrations.AddConstraint(
                model_name='topup',
                constraint=models.CheckConstraint(condition=django.db.models.lookups.Exact(django.db.models.functions.math.Mod('amount_micros', models.Value(10000)), 0), name='top_up_whole_cents'),
            ),
            migrations.AddConstraint(
                model_name='topup',
                constraint=models.CheckConstraint(condition=models.Q(('refunded_micros__gte', 0), ('refunded_micros__lte', models.F('amount_micros'))), name='top_up_refund_within_amount'),
            ),
            migrations.AddConstraint(
                model_name='topup',
                constraint=models.UniqueConstraint(fields=('tenant', 'idempotency_key'), name='top_up_idempotency_key'),
            ),
            migrations.AddConstraint(
                model_name='refund',
                constraint=models.CheckConstraint(condition=models.Q(('amount_micros__gt', 0)), name='refund_positive'),
            ),
            migrations.AddConstraint(
                model_name='refund',
                constraint=models.UniqueConstraint(fields=('tenant', 'idempotency_key'), name='refund_idempotency_key'),
            ),
            migrations.AddIndex(
                model_name='usagerecord',
                index=models.Index(fields=['payer', 'minute'], name='market_usag_payer_i_f5c5be_idx'),
            ),
            migrations.AddIndex(
                model_name='usagerecord',
                index=models.Index(fields=['payee', 'minute'], name='market_usag_payee_i_115f0d_idx'),
            ),
            migrations.AddConstraint(
                model_name='usagerecord',
                constraint=models.UniqueConstraint(fields=('lease_ref', 'minute'), name='usage_once_per_minute'),
            ),
            migrations.AddConstraint(
                model_name='usagerecord',
                constraint=models.CheckConstraint(condition=models.Q(('seconds__lte', 60)), name='usage_within_minute'),
            ),
        ]),
        migrations.RunPython(rename_content_types, rename_content_types_back),
    ]
