from django.apps import AppConfig


class LlmgwConfig(AppConfig):
    name = "llmgw"
    verbose_name = "llmgw"

    def ready(self) -> None:
        # The Celery app is made here, not in llmgw/__init__.py, so that the node agent (which imports
        # llmgw but never Django) does not load Celery; every Django process (serve, ctl, the in-process
        # eager mode, the worker) gets it, so @shared_task tasks bind to it and not to Celery's default.
        import llmgw.celery  # noqa: F401

        live_pages_connect()
        register_metrics_collectors()


def live_pages_connect() -> None:
    """The console's live pages hear of placement's and the facility's changes here, in the interface
    layer (the layers below never import it). Through agents.events alone: the sockets' consumers (and the
    API they share code with) are the web server's, not every writer's."""
    from facility.signals import facility_changed
    from placement.signals import placement_changed

    placement_changed.connect(placement_changed_receiver, dispatch_uid="console-live-placement")
    facility_changed.connect(facility_changed_receiver, dispatch_uid="console-live-facility")


def placement_changed_receiver(**_: object) -> None:
    """placement.signals.placement_changed (sent on commit): tell the open Facility and Models pages."""
    from agents import events

    events.placement_changed()


def facility_changed_receiver(**_: object) -> None:
    """facility.signals.facility_changed (sent in the writing transaction): tell them once it commits."""
    from django.db import transaction

    from agents import events

    transaction.on_commit(events.placement_changed)


def register_metrics_collectors() -> None:
    """/metrics' collectors (domain power and holds, placement's would-place counts), read from the
    database on each scrape: registered with the interfaces, not in each app's ready(), so a process that
    serves no /metrics (ctl: LlmgwCtlConfig, LlmgwReadConfig) does not load prometheus_client. The node
    sensors' series are written by agents.metrics.metrics_view itself (too many for a collector)."""
    from facility.metrics import register_collector as facility_collector
    from placement.metrics import register_collector as placement_collector

    facility_collector()
    placement_collector()


class LlmgwCtlConfig(LlmgwConfig):
    """llmgw for `llmgw ctl`'s commands that write (settings.CTL_WRITE_APPS): the Celery app their tasks go
    by and the live pages' receivers (with Redis, the console hears of a hold made by ctl), but no /metrics
    collectors (prometheus_client): ctl serves none."""

    default = False

    def ready(self) -> None:
        import llmgw.celery  # noqa: F401

        live_pages_connect()


class LlmgwReadConfig(LlmgwConfig):
    """llmgw for `llmgw ctl`'s listings (settings.CTL_READ_APPS): they send no task, change nothing the
    live pages show and serve no /metrics, so neither the Celery app, the live pages' receivers (Channels)
    nor the metrics collectors (prometheus_client) is loaded."""

    default = False

    def ready(self) -> None:
        pass
