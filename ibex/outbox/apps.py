from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "ibex.outbox"
    label = "outbox"
    verbose_name = "Transactional outbox"
