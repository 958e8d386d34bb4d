"""llmgw: places LLM inference replicas on GPU nodes within what the building can carry."""

__version__ = "0.1.0"

from llmgw.celery import app as celery_app  # noqa: E402

__all__ = ["celery_app", "__version__"]
