from django.apps import AppConfig


class SchedulerConfig(AppConfig):
    name = "scheduler"

    def ready(self):
        # The market asks for placements through a port it owns (it may not import us).
        from market.placement_port import register_gang_placer
        from scheduler.placement.cli import run_gang

        register_gang_placer(run_gang)
