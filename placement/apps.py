from django.apps import AppConfig


class PlacementConfig(AppConfig):
    name = "placement"
    verbose_name = "Placement"

    def ready(self) -> None:
        # Placement listens to the layers below it; they never import placement (see README, Architecture).
        from agents import readings
        from agents.signals import node_reported, nodes_changed
        from facility.signals import facility_changed
        from placement.reports import shard_states_report
        from placement.selectors import all_assignments
        from placement.signals import placement_changed
        from placement.tasks import request_reconcile

        def reconcile_on_change(**_: object) -> None:
            request_reconcile()

        def record_report(*, node, states, now, **_: object) -> None:
            shard_states_report(node=node, states=states, now=now)

        def forget_assignments(**_: object) -> None:
            readings.invalidate_assignments()

        facility_changed.connect(reconcile_on_change, dispatch_uid="placement-reconcile-on-facility")
        nodes_changed.connect(reconcile_on_change, dispatch_uid="placement-reconcile-on-nodes")
        node_reported.connect(record_report, dispatch_uid="placement-record-report")
        # The heartbeat's answer: what each node must run comes from placement, cached by the node layer.
        readings.register_assignments_provider(all_assignments)
        placement_changed.connect(forget_assignments, dispatch_uid="placement-forget-assignments")
