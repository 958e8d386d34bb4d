from django.apps import AppConfig


class FacilityConfig(AppConfig):
    name = "facility"
    verbose_name = "Facility"
