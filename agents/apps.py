from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"
    verbose_name = "Nodes and agents"
    # Its collector of node sensors for /metrics is registered by llmgw.apps, with the other interfaces.
