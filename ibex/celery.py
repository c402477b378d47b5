"""The Celery app: `celery -A ibex worker` and `celery -A ibex beat`."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ibex.settings")

app = Celery("ibex")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.autodiscover_tasks(["ibex"], related_name="tasks")
