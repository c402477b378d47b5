from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "ibex.audit"
    label = "audit"
    verbose_name = "Audit log"

    def ready(self):
        from ibex.audit import admin_log  # noqa: F401 - mirrors Django admin's own log
