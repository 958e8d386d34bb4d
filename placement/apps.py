from django.apps import AppConfig


class PlacementConfig(AppConfig):
    name = "placement"
    verbose_name = "Placement"

    def ready(self) -> None:
        # Placement listens to the layers below it; they never import placement (README, Architecture).
        from agents import bookings, readings
        from agents.signals import node_reported, nodes_changed
        from facility.signals import conditions_evaluated, domains_renamed, facility_changed
        from placement import receivers, renames
        from placement.selectors import all_assignments, booked_gpus, placed_watts
        from placement.signals import placement_changed, reconcile_requested

        facility_changed.connect(receivers.reconcile_on_change, dispatch_uid="placement-reconcile-on-facility")
        nodes_changed.connect(receivers.reconcile_on_change, dispatch_uid="placement-reconcile-on-nodes")
        node_reported.connect(receivers.record_report, dispatch_uid="placement-record-report")
        # The heartbeat's answer: what each node must run comes from placement, cached by the node layer.
        readings.register_assignments_provider(all_assignments)
        # What is booked on each node: placement's tables, read for the node list and facility power.
        bookings.register_booking_readers(booked_gpus=booked_gpus, placed_watts=placed_watts)
        # The GPU caps each node's answer carries (placement.capping; none while capping is off).
        readings.register_capping_provider(capping_blocks)
        conditions_evaluated.connect(receivers.respond_to_conditions, dispatch_uid="placement-shed-and-cap")
        placement_changed.connect(receivers.forget_assignments, dispatch_uid="placement-forget-assignments")
        reconcile_requested.connect(receivers.reconcile_on_request, dispatch_uid="placement-reconcile-on-request")
        domains_renamed.connect(renames.domains_renamed, dispatch_uid="placement-domains-renamed")
        plugins_from_config()
        # (Its collector for /metrics is registered by llmgw.apps, with the other interfaces.)


def capping_blocks() -> dict[str, dict]:
    """placement.capping.capping_blocks, imported when first asked (a heartbeat's answer): capping brings
    shedding and the commit's writes with it, which a process that answers no heartbeat (ctl) never runs."""
    from placement.capping import capping_blocks as blocks

    return blocks()


def plugins_from_config() -> None:
    """Load the placement plugins LLMGW_CONFIG names and the `llmgw.plugins` entry points, once a process.

    A file that does not parse loads none of its plugins (serve refuses it, saying why); a plugin that
    fails to load is reported and skipped.
    """
    import logging

    from django.conf import settings

    from placement.plugins import REGISTRY, plugins_load

    if REGISTRY.loaded or getattr(plugins_from_config, "done", False):
        return
    plugins_from_config.done = True
    names: list[str] = []
    if settings.LLMGW_CONFIG:
        from llmgw.errors import InvalidInput
        from llmgw.plugin_names import plugins_configured
        from llmgw.yamldoc import read_text

        try:
            names = plugins_configured(read_text(settings.LLMGW_CONFIG), settings.LLMGW_CONFIG)
        except InvalidInput as exc:
            logging.getLogger(__name__).warning("placement plugins not loaded: %s", exc.message)
    plugins_load(REGISTRY, names)
