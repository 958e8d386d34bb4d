from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"
    verbose_name = "Nodes and agents"

    def ready(self) -> None:
        # Node sensors on /metrics, read from the database on each scrape.
        from agents.metrics import register_collector

        register_collector()

        # The heartbeat's cached map of assignments is read again after a placement change in this process.
        from django.db.models.signals import post_delete, post_save

        from agents.readings import invalidate_assignments

        for sender in ("placement.Shard", "placement.Replica"):
            post_save.connect(invalidate_assignments, sender=sender, dispatch_uid=f"assignments-save-{sender}")
            post_delete.connect(invalidate_assignments, sender=sender, dispatch_uid=f"assignments-delete-{sender}")
