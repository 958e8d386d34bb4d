from django.apps import AppConfig


class FacilityConfig(AppConfig):
    name = "facility"
    verbose_name = "Facility"

    def ready(self) -> None:
        # Domain power and holds on /metrics, read from the database on each scrape.
        from facility.metrics import register_collector

        register_collector()
