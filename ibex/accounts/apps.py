from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "ibex.accounts"
    label = "accounts"
    verbose_name = "Organisations and access"

    def ready(self):
        from ibex.accounts import schema  # noqa: F401  (registers the OpenAPI auth scheme)
