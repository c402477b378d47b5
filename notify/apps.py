from django.apps import AppConfig


class NotifyConfig(AppConfig):
    name = "notify"

    def ready(self):
        # A recorded event is fanned out to webhooks by a Celery task once it commits; the
        # tasks module imports the events module, so the task is handed in here.
        from notify import events, tasks

        events.on_events_recorded(lambda: tasks.fan_out_events.delay())
