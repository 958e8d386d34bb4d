"""llmgw: places LLM inference replicas on GPU nodes within what the building can carry.

Imports nothing: `llmgw agent` runs on GPU nodes that have neither Django nor Celery installed. The
Celery app is created when Django starts (llmgw.apps) and by the worker and beat commands.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
