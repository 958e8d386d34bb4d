"""The `llmgw` command: `llmgw agent` runs on GPU nodes without Django; the rest is the control plane."""

from __future__ import annotations

import os
import sys

USAGE = """\
usage: llmgw COMMAND [ARGS]

control plane:
  demo            load the demo facility and serve the console at http://127.0.0.1:8000
  serve           serve the console and the API (ASGI): llmgw serve [ADDR:PORT]
  migrate         create or upgrade the database
  ctl             operate: nodes, labels, facility budgets and holds, models (llmgw ctl --help)
  worker, beat    Celery worker and scheduler (production, with REDIS_URL)
  sim             simulated agents for a cluster file's nodes (llmgw sim up -f cluster.yaml), or a facility
                  scenario replayed into the simulated source (llmgw sim facility -f SCENARIO --speed N)
  createsuperuser, makemigrations, shell, …   any Django management command

on a GPU node:
  agent           report inventory, labels and sensors, run assigned replicas (llmgw agent --help)
"""


# The top-level modules of the server extra (pyproject's [project.optional-dependencies] server): a
# command missing one runs on an install without it (`pip install llmgw`, a GPU node's).
SERVER_MODULES = frozenset({
    "django", "rest_framework", "drf_spectacular", "drf_spectacular_sidecar", "django_filters", "django_htmx",
    "servestatic", "uvicorn", "celery", "redis", "psycopg", "channels", "channels_redis", "pynetbox", "daphne",
    "django_prometheus", "prometheus_client", "dj_database_url", "axes",
})
INSTALL_SERVER = "pip install 'llmgw[server]'"


def server_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("django") is not None
    except ImportError:
        return False


def main(argv: list[str] | None = None) -> int:
    """The command; ``argv`` None is the process's own command line (the `llmgw` script), which then
    exits after it: only then does ctl take the collector over for its start (llmgw.ctl.main).

    A setting from the environment that does not parse is one ``error:`` line and exit 2; so is a control
    plane command on an install without the server extra (what to install said)."""
    try:
        return _main(argv)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in SERVER_MODULES:
            raise
        command = (list(sys.argv[1:] if argv is None else argv) or ["?"])[0]
        print(f"error: llmgw {command} is the control plane's, and this install lacks its packages "
              f"(no module named {exc.name!r}): {INSTALL_SERVER}", file=sys.stderr)
        return 2
    except Exception as exc:  # by name: a remote ctl listing never imports Django
        if type(exc).__name__ != "ImproperlyConfigured":
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None = None) -> int:
    own_process = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        if server_installed():
            print(USAGE)
        else:  # a GPU node's install: the agent's; the control plane's commands need the server extra
            print(USAGE.replace("control plane:\n", f"control plane (not installed here: {INSTALL_SERVER}):\n"))
        return 0
    command, rest = argv[0], argv[1:]
    if command == "agent":
        from agents.node.daemon import main as agent_main

        return agent_main(rest)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    if command == "ctl":
        from llmgw.ctl import main as ctl_main

        return ctl_main(rest, own_process=own_process)
    if command == "sim" and not {"-h", "--help"} & set(rest):
        # It works on a control plane's data (tokens, the scenario), found as ctl finds it; its help needs none.
        from llmgw import whereabouts

        try:
            whereabouts.local_data_find()
        except whereabouts.ServerNotFound as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if command in {"worker", "beat"}:
        import django

        django.setup()
        from llmgw.celery import app

        extra = ["--loglevel", "INFO"] if "--loglevel" not in rest and "-l" not in rest else []
        app.start([command, *extra, *rest])
        return 0
    from django.core.management import execute_from_command_line

    execute_from_command_line(["llmgw", command, *rest])
    return 0


if __name__ == "__main__":
    sys.exit(main())
