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
        # A fabric whose routes or links changed has its guarantees checked again.
        from fabric.services import on_fabric_changed
        from scheduler.guarantees import enqueue_recheck

        on_fabric_changed(enqueue_recheck)
