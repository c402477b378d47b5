from django.apps import AppConfig


class MarketConfig(AppConfig):
    name = "market"

    def ready(self):
        # The pool's quota view reads usage and queued orders through a port it owns.
        from market.pool_orders import usage_and_waiting
        from pool.usage_port import register_usage_source

        register_usage_source(usage_and_waiting)
