from django.apps import AppConfig


class FacilityConfig(AppConfig):
    name = "facility"
    verbose_name = "Facility"

    def ready(self) -> None:
        # Domain power and holds on /metrics, read from the database on each scrape.
        from facility.metrics import register_collector

        register_collector()
        # A node's rack or PDUs changed: the caps derived from feeds follow (facility.feed_services).
        from agents.signals import nodes_changed
        from facility.feed_services import refresh_after_labels

        nodes_changed.connect(refresh_after_labels, dispatch_uid="facility-feed-caps-on-nodes")
