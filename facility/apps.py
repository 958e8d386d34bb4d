from django.apps import AppConfig


class FacilityConfig(AppConfig):
    name = "facility"
    verbose_name = "Facility"

    def ready(self) -> None:
        # (Its collector of domain power and holds for /metrics is registered by llmgw.apps.)
        # A node's rack or PDUs changed: the caps derived from feeds follow (facility.receivers).
        from agents.signals import nodes_changed
        from facility.receivers import refresh_after_labels

        nodes_changed.connect(refresh_after_labels, dispatch_uid="facility-feed-caps-on-nodes")
        # A relabel locks the budgets of the domains a node joins before the node (a commit's order).
        from agents.signals import domains_joining
        from facility.feed_services import budgets_joined_lock

        domains_joining.connect(budgets_joined_lock, dispatch_uid="facility-budgets-joined-lock")
        # server.yaml's facility.measured_window, for the nodes layer's measured peaks.
        from django.db.models.signals import post_save

        from agents.models import forget_measured_window, register_measured_window_reader
        from facility.models import FacilitySettings

        register_measured_window_reader(measured_window_configured)
        # facility.location_from, for the nodes layer's effective labels; the draws assumed of a card and of a
        # node, for the plausibility of its readings (kept a few seconds: forgotten when the row is saved).
        from agents import readings
        from agents.services import register_location_from_reader

        register_location_from_reader(location_from_configured)
        readings.register_draws_reader(draws_configured)
        post_save.connect(
            lambda **_: readings.forget_draws(), sender=FacilitySettings, weak=False,
            dispatch_uid="facility-draws-forget",
        )
        post_save.connect(
            lambda **_: forget_measured_window(), sender=FacilitySettings, weak=False,
            dispatch_uid="facility-measured-window-forget",
        )


def measured_window_configured() -> float | None:
    """facility.measured_window from the settings row (None: not set, or no row yet)."""
    from facility.models import FacilitySettings

    return FacilitySettings.objects.filter(pk=1).values_list("measured_window_seconds", flat=True).first()


def location_from_configured() -> dict[str, str]:
    """facility.location_from from the settings row: {level: "agents" | "store"} (all agents: not set)."""
    from facility.domains import parse_location_from
    from facility.models import FacilitySettings

    stored = FacilitySettings.objects.filter(pk=1).values_list("location_from", flat=True).first()
    return parse_location_from(stored or None)


def draws_configured() -> tuple[float | None, float | None]:
    """(gpu_watts, node_watts) from the settings row (made now with its defaults if it is not yet: made
    later, its saving would forget what this read)."""
    from facility.models import FacilitySettings

    row = FacilitySettings.objects.filter(pk=1).values_list("gpu_watts", "node_watts").first()
    if row is None:
        settings = FacilitySettings.load()
        return settings.gpu_watts, settings.node_watts
    return row
