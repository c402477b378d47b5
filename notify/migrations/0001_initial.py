"""The events and webhook models, taken over from the scheduler app with their tables.

The tables exist already (scheduler's first migration made them), so the models are created in
Django's state only. Their content types follow them, so permissions and admin log entries
stay attached.
"""

import django.db.models.deletion
from django.db import migrations, models

MODELS = ["event", "webhookendpoint", "webhookdelivery", "webhookattempt"]


def rename_content_types(apps, from_label, to_label):
    ContentType = apps.get_model("contenttypes", "ContentType")
    ContentType.objects.filter(app_label=from_label, model__in=MODELS).update(app_label=to_label)


def content_types_to_notify(apps, schema_editor):
    rename_content_types(apps, "scheduler", "notify")


def content_types_to_scheduler(apps, schema_editor):
    rename_content_types(apps, "notify", "scheduler")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('contenttypes', '0002_remove_content_type_name'),
        ('scheduler', '0003_notify_models_move'),
        ('accounts', '0002_providerprofile_providerstatechange'),
        ('market', '0006_order_priority_class'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='Event',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('kind', models.CharField(choices=[('lease.started', 'Started'), ('lease.preemption_notice', 'Preemption Notice'), ('lease.preempted', 'Preempted'), ('lease.degraded', 'Degraded'), ('lease.moved', 'Moved'), ('lease.credited', 'Credited'), ('lease.ended', 'Ended')], max_length=30)),
                        ('source', models.CharField(help_text='what caused it: lease_event:12, ...', max_length=60)),
                        ('payload', models.JSONField(default=dict)),
                        ('occurred_at', models.DateTimeField()),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('lease', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='tenant_events', to='market.lease')),
                        ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='events', to='accounts.organization')),
                    ],
                    options={
                        'db_table': 'scheduler_event',
                    },
                ),
                migrations.CreateModel(
                    name='WebhookDelivery',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('state', models.CharField(choices=[('pending', 'Pending'), ('sending', 'Sending'), ('succeeded', 'Succeeded'), ('failed', 'Failed')], default='pending', max_length=10)),
                        ('attempts', models.PositiveIntegerField(default=0)),
                        ('status_code', models.PositiveIntegerField(blank=True, help_text='the last answer', null=True)),
                        ('error', models.CharField(blank=True, max_length=500)),
                        ('next_attempt_at', models.DateTimeField(help_text='due from then (or, sending: claim expiry)')),
                        ('delivered_at', models.DateTimeField(blank=True, null=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('event', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='deliveries', to='notify.event')),
                    ],
                    options={
                        'verbose_name_plural': 'webhook deliveries',
                        'db_table': 'scheduler_webhookdelivery',
                    },
                ),
                migrations.CreateModel(
                    name='WebhookAttempt',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('number', models.PositiveIntegerField()),
                        ('status_code', models.PositiveIntegerField(blank=True, null=True)),
                        ('error', models.CharField(blank=True, max_length=500)),
                        ('next_attempt_at', models.DateTimeField(blank=True, null=True)),
                        ('at', models.DateTimeField()),
                        ('delivery', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='attempt_log', to='notify.webhookdelivery')),
                    ],
                    options={
                        'db_table': 'scheduler_webhookattempt',
                        'ordering': ['delivery', 'number'],
                    },
                ),
                migrations.CreateModel(
                    name='WebhookEndpoint',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('url', models.URLField(max_length=500)),
                        ('secret', models.CharField(help_text='shown once, at creation', max_length=100)),
                        ('description', models.CharField(blank=True, max_length=200)),
                        ('active', models.BooleanField(default=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='webhook_endpoints', to='accounts.organization')),
                    ],
                    options={
                        'db_table': 'scheduler_webhookendpoint',
                    },
                ),
                migrations.AddField(
                    model_name='webhookdelivery',
                    name='endpoint',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='deliveries', to='notify.webhookendpoint'),
                ),
                migrations.AddIndex(
                    model_name='event',
                    index=models.Index(fields=['tenant', '-id'], name='scheduler_e_tenant__836002_idx'),
                ),
                migrations.AddIndex(
                    model_name='event',
                    index=models.Index(fields=['tenant', 'created_at'], name='scheduler_e_tenant__323092_idx'),
                ),
                migrations.AddConstraint(
                    model_name='event',
                    constraint=models.UniqueConstraint(fields=('lease', 'source'), name='one_event_per_lease_source'),
                ),
                migrations.AddConstraint(
                    model_name='webhookattempt',
                    constraint=models.UniqueConstraint(fields=('delivery', 'number'), name='one_log_row_per_try'),
                ),
                migrations.AddIndex(
                    model_name='webhookendpoint',
                    index=models.Index(fields=['tenant', 'active'], name='scheduler_w_tenant__606e15_idx'),
                ),
                migrations.AddIndex(
                    model_name='webhookdelivery',
                    index=models.Index(fields=['state', 'next_attempt_at'], name='scheduler_w_state_10f561_idx'),
                ),
                migrations.AddConstraint(
                    model_name='webhookdelivery',
                    constraint=models.UniqueConstraint(fields=('endpoint', 'event'), name='one_delivery_per_event'),
                ),
            ],
        ),
        migrations.RunPython(content_types_to_notify, content_types_to_scheduler),
    ]
