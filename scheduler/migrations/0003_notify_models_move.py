"""Events and webhooks moved to the notify app: only Django's idea of them changes here.

Their tables keep their names (`Meta.db_table` in notify/models.py) and their rows; notify's
first migration takes the models over.
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('scheduler', '0002_defrag_runs'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(
                    model_name='webhookdelivery',
                    name='event',
                ),
                migrations.RemoveField(
                    model_name='webhookattempt',
                    name='delivery',
                ),
                migrations.RemoveField(
                    model_name='webhookdelivery',
                    name='endpoint',
                ),
                migrations.RemoveField(
                    model_name='webhookendpoint',
                    name='tenant',
                ),
                migrations.DeleteModel(
                    name='Event',
                ),
                migrations.DeleteModel(
                    name='WebhookAttempt',
                ),
                migrations.DeleteModel(
                    name='WebhookDelivery',
                ),
                migrations.DeleteModel(
                    name='WebhookEndpoint',
                ),
            ],
        ),
    ]
