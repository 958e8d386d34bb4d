from django.apps import AppConfig


class LlmgwConfig(AppConfig):
    name = "llmgw"
    verbose_name = "llmgw"
