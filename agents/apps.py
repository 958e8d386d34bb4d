from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"
    verbose_name = "Nodes and agents"

    def ready(self) -> None:
        # Node sensors on /metrics, read from the database on each scrape.
        from agents.metrics import register_collector

        register_collector()
