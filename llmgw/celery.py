"""The Celery app: settings from Django's (CELERY_*), tasks found in the apps."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")

app = Celery("llmgw")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
