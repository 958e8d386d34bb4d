from django.apps import AppConfig


class AccessConfig(AppConfig):
    name = "llmgw.access"
    label = "access"
    verbose_name = "access"
    default_auto_field = "django.db.models.BigAutoField"
