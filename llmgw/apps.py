from django.apps import AppConfig


class LlmgwConfig(AppConfig):
    name = "llmgw"
    verbose_name = "llmgw"

    def ready(self) -> None:
        # The Celery app is made here, not in llmgw/__init__.py, so that the node agent (which imports
        # llmgw but never Django) does not load Celery; every Django process (serve, ctl, the in-process
        # eager mode, the worker) gets it, so @shared_task tasks bind to it and not to Celery's default.
        import llmgw.celery  # noqa: F401
