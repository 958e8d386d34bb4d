"""`llmgw ctl` on the database: a listing starts Django with the listings' apps only (settings.CTL_READ_APPS)
and prints what the whole stack prints; a command that writes starts without the web server's apps
(settings.CTL_WRITE_APPS), its receivers connected. The real command in a fresh process, on this test's
database."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from llmgw.ctl import main as ctl
from tests.integration.test_ctl_remote import LISTINGS
from tests.integration.test_schema_fuzz import seeded  # noqa: F401  (the fixture: something of everything)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("seeded")]

# What the web server, the worker and /metrics load, and a listing must not: each is tens to hundreds of
# milliseconds of a command that should answer in a fraction of a second.
HEAVY = ("daphne", "twisted", "channels", "celery", "llmgw.celery", "drf_spectacular", "django_prometheus",
         "prometheus_client", "rest_framework.views", "rest_framework.serializers", "agents.consumers",
         "django.contrib.admin.sites")
# Listings beside the remote ones (test_ctl_remote.LISTINGS): a what-if, a POST through the API.
LOCAL_LISTINGS = [("facility", "what-if", "hold", "rack:r1-01")]

LISTINGS_PROBE = """
import contextlib, io, json, sys
from django.apps import apps
from llmgw.cli import main

outputs = []
for argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(['ctl', *argv])
    outputs.append([code, out.getvalue()])
print(json.dumps({
    "outputs": outputs,
    "loaded": sorted(m for m in sys.modules if m in json.loads(sys.argv[2])),
    "models": sorted(m._meta.label for m in apps.get_models()),
    "llmgw": type(apps.get_app_config("llmgw")).__name__,
}))
"""

WRITE_PROBE = """
import json, sys
from django.apps import apps
from llmgw.cli import main
from placement.signals import placement_changed

codes = [main(['ctl', 'token', 'create', 'probe', '--role', 'viewer']),
         main(['ctl', 'facility', 'hold', 'rack:r1-01', '--reason', 'probe'])]
print(json.dumps({"codes": codes, "celery": "llmgw.celery" in sys.modules,
                  "live_pages": any(key[0] == "console-live-placement" for key, *_ in placement_changed.receivers),
                  "loaded": sorted(m for m in sys.modules if m in json.loads(sys.argv[1])),
                  "llmgw": type(apps.get_app_config("llmgw")).__name__}))
"""

# What a command that writes must not load: the web server's (its tasks go by Celery, and it tells the live
# pages through the channel layer, so those stay).
SERVER_ONLY = ("daphne", "twisted", "drf_spectacular", "django_prometheus", "prometheus_client",
               "rest_framework.views", "agents.consumers", "django.contrib.admin.sites")

COLLECTOR_PROBE = """
import gc, json, sys
import llmgw.ctl
import llmgw.output
from llmgw.cli import main

seen = {}
django_setup = llmgw.ctl.django_setup
def setup_spy(**kwargs):
    seen.setdefault("starting", gc.isenabled())  # the first command's
    return django_setup(**kwargs)
llmgw.ctl.django_setup = setup_spy
print_table = llmgw.output.print_table
def spy(*args, **kwargs):
    if "enabled" not in seen:  # the first command's
        seen.update(enabled=gc.isenabled(), frozen=gc.get_freeze_count(), django="django.db.models" in sys.modules)
    return print_table(*args, **kwargs)
llmgw.output.print_table = spy  # before main imports the commands' modules, which import it by name

sys.argv = ["llmgw", "ctl", "nodes"]
code = main()  # the process's own command line, as the `llmgw` script runs it
after = {"enabled_after": gc.isenabled(), "frozen_after": gc.get_freeze_count()}
gc.unfreeze()
main(["ctl", "nodes"])  # called with its arguments, in a process that goes on: the collector left alone
print(json.dumps({"code": code, **seen, **after, "in_process_frozen": gc.get_freeze_count()}))
"""


def run_probe(code: str, *args: str) -> dict:
    """`code` in a fresh Python on this test's database; its last line of output, decoded."""
    from django.db import connection

    db = connection.settings_dict
    env = {k: v for k, v in os.environ.items() if k not in {"LLMGW_URL", "LLMGW_TOKEN"}}
    env["DATABASE_URL"] = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    got = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=120)
    assert got.returncode == 0, got.stderr[-3000:]
    return json.loads(got.stdout.strip().splitlines()[-1])


def test_a_listing_loads_only_what_it_reads_and_prints_the_same(capsys):
    from django.apps import apps

    argvs = [[*argv, *fmt] for argv in [*LISTINGS, *LOCAL_LISTINGS] for fmt in ([], ["-o", "json"])]
    got = run_probe(LISTINGS_PROBE, json.dumps(argvs), json.dumps(HEAVY))
    assert got["llmgw"] == "LlmgwReadConfig"
    assert got["loaded"] == []
    # Every model of llmgw's apps is there (a listing's query may join any of them); none of the web
    # stack's: the console's sessions, the admin's log, users and their API tokens, which no listing reads.
    web_only = {"admin", "sessions", "auth", "contenttypes", "authtoken", "access", "axes"}
    assert got["models"] == sorted(
        m._meta.label for m in apps.get_models() if m._meta.app_label not in web_only
    )
    assert {"agents", "facility", "placement"} <= {label.split(".")[0] for label in got["models"]}
    for argv, (code, out) in zip(argvs, got["outputs"], strict=True):
        assert code == 0, argv
        assert ctl(argv) == 0, argv
        expected = capsys.readouterr().out
        if "json" in argv:
            assert json.loads(out) == json.loads(expected), argv
        else:
            assert out == expected, argv


def test_a_command_that_writes_starts_without_the_web_server():
    from facility.models import Hold
    from llmgw.access.models import ApiToken

    got = run_probe(WRITE_PROBE, json.dumps(SERVER_ONLY))
    assert got == {"codes": [0, 0], "celery": True, "live_pages": True, "loaded": [], "llmgw": "LlmgwCtlConfig"}
    assert ApiToken.objects.filter(user__username="probe").exists()
    assert Hold.objects.filter(domain="rack:r1-01", reason="probe").exists()


def test_the_command_runs_with_the_collector_on_over_its_own_objects_only():
    """`llmgw ctl` starts with the collector off and freezes what starting Django made (gc.freeze) rather
    than walk it again and again; the command itself collects as ever. Called in-process with its
    arguments, ctl leaves the collector alone."""
    got = run_probe(COLLECTOR_PROBE)
    assert got["code"] == 0 and got["django"]
    assert got["starting"] is False
    assert got["enabled"] is True and got["enabled_after"] is True
    # Django's modules, classes and the apps' models: hundreds of thousands of objects, none walked again.
    assert got["frozen"] > 100_000
    assert got["in_process_frozen"] == 0
