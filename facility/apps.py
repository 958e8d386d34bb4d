from django.apps import AppConfig


class FacilityConfig(AppConfig):
    name = "facility"
    verbose_name = "Facility"

    def ready(self) -> None:
        # (Its collector of domain power and holds for /metrics is registered by llmgw.apps.)
        # A node's rack or PDUs changed: the caps derived from feeds follow (facility.feed_services).
        from agents.signals import nodes_changed
        from facility.feed_services import refresh_after_labels

        nodes_changed.connect(refresh_after_labels, dispatch_uid="facility-feed-caps-on-nodes")
        # server.yaml's facility.measured_window, for the nodes layer's measured peaks.
        from django.db.models.signals import post_save

        from agents.models import forget_measured_window, register_measured_window_reader
        from facility.models import FacilitySettings

        register_measured_window_reader(measured_window_configured)
        post_save.connect(
            lambda **_: forget_measured_window(), sender=FacilitySettings, weak=False,
            dispatch_uid="facility-measured-window-forget",
        )


def measured_window_configured() -> float | None:
    """facility.measured_window from the settings row (None: not set, or no row yet)."""
    from facility.models import FacilitySettings

    return FacilitySettings.objects.filter(pk=1).values_list("measured_window_seconds", flat=True).first()
