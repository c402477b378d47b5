from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "web"
    verbose_name = "Web marketplace"

    def ready(self):
        from django.contrib import admin

        # The admin is the operations console; its "view site" link opens the dashboard.
        admin.site.site_header = "IBEX operations console"
        admin.site.site_title = "IBEX operations"
        admin.site.index_title = "Pool, market and money"
        admin.site.site_url = "/ops/"
