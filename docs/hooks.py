"""MkDocs hooks: the reference pages are written from the code before each build, so they cannot drift.

- reference/cli.md from the argument parsers (`llmgw ctl`, `llmgw agent`);
- reference/api.md from the OpenAPI schema drf-spectacular serves at /api/v1/schema;
- reference/limits.md from the bound constants the readers check (each with the comment above it);
- reference/metrics.md from deploy/prometheus/alerts.yaml and the metric families /metrics serves.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = Path(__file__).resolve().parent / "reference"


def on_pre_build(config, **kwargs) -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    os.environ.setdefault("LLMGW_DATA_DIR", tempfile.mkdtemp(prefix="llmgw-docs-"))
    os.environ.pop("DATABASE_URL", None)
    os.environ.pop("REDIS_URL", None)
    import django

    django.setup()
    from llmgw import docgen

    REFERENCE.mkdir(exist_ok=True)
    for name, text in docgen.pages().items():
        path = REFERENCE / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
