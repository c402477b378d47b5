from django.apps import AppConfig


class SchedulerConfig(AppConfig):
    name = "scheduler"

    def ready(self):
        # The market asks for placements through a port it owns (it may not import us).
        from market.placement_port import register_make_placer, register_part_placer
        from scheduler.core.clearing_placer import IndexPlacer
        from scheduler.core.placement.parts import choose_parts

        register_make_placer(IndexPlacer)
        register_part_placer(choose_parts)
        # The last heartbeat acknowledging a lease's binding activates it at once.
        from pool.services import on_bindings_acknowledged
        from scheduler.placing import activate_on_acknowledgement

        on_bindings_acknowledged(activate_on_acknowledgement)
