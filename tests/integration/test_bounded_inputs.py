"""Bounded everywhere: every YAML through the one bounded reader, every outbound call within a total
deadline and a size cap, every CLI entry point an `error:` line — an attacker's input costs a bounded
time, gives a 4xx naming the file, line and field, and never a 500 or a traceback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.node.config import AgentConfigError, parse_config
from agents.simulator.cluster import load_cluster
from facility import netbox_csv
from facility.sources import parse_query_signals, parse_scenario, poll_prometheus
from llmgw.errors import InvalidInput
from llmgw.yamldoc import load_documents

pytestmark = pytest.mark.django_db(transaction=True)

# Nine aliases of nine: 9**7 values from a few hundred bytes.
BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9) if prev else '1, 1, 1, 1, 1, 1, 1, 1, 1'}]\n"
    for prev, name in zip([None, "a", "b", "c", "d", "e"], ["a", "b", "c", "d", "e", "f"], strict=True)
) + "g: [*f, *f, *f, *f, *f, *f, *f, *f, *f]\n"

SCENARIO_SERVER_YAML = """\
facility:
  sources:
    simulated: {file: scenario.yaml}
"""


def test_an_alias_bomb_in_a_scenario_sent_to_the_api_is_a_400(admin_client):
    started = time.monotonic()
    answer = admin_client.post(
        "/api/v1/facility/apply",
        {"text": SCENARIO_SERVER_YAML, "files": {"scenario.yaml": BOMB}},
        content_type="application/json",
    )
    assert answer.status_code == 400
    assert answer.json()["detail"] == (
        "server.yaml line 3: facility.sources.simulated.file: scenario.yaml: more than 500,000 values "
        "(an alias repeating a large part?)"
    )
    assert time.monotonic() - started < 30  # not the 30 s of every later evaluation


def test_an_integer_past_pythons_limit_is_a_400_naming_the_line(admin_client):
    digits = "9" * 5000
    answer = admin_client.post(
        "/api/v1/facility/apply", {"text": f"facility:\n  margin: {digits}\n"}, content_type="application/json"
    )
    assert answer.status_code == 400
    assert answer.json()["detail"] == "server.yaml line 2: facility.margin: an integer of more than 30 digits"
    scenario = f"name: s\ntracks:\n  - {{domains: rack:r1, signal: inlet_temp_c, points: [[0, {digits}]]}}\n"
    answer = admin_client.post(
        "/api/v1/facility/apply",
        {"text": SCENARIO_SERVER_YAML, "files": {"scenario.yaml": scenario}},
        content_type="application/json",
    )
    assert answer.status_code == 400 and "scenario.yaml line 3:" in answer.json()["detail"]


def test_a_feed_supplying_more_pdus_or_racks_than_the_bound_is_a_400_and_nothing_is_applied(admin_client):
    from facility.feed_services import MAX_FEED_NAMES
    from facility.models import Budget, Feed

    for key in ("pdus", "racks"):
        names = ", ".join(f"p{i}" for i in range(MAX_FEED_NAMES + 1))
        text = (
            "facility:\n  margin: 0.2\n  feeds:\n"
            "    - {name: A2, voltage: 415, amperage: 32, phase: three, pdus: [p-a]}\n"
            f"    - {{name: A1, voltage: 415, amperage: 32, phase: three, {key}: [{names}]}}\n"
        )
        answer = admin_client.post("/api/v1/facility/apply", {"text": text}, content_type="application/json")
        assert answer.status_code == 400
        assert answer.json()["detail"] == f"server.yaml line 5: facility.feeds[1].{key}: at most 1,000 names, not 1,001"
        assert answer.json()["field"] == f"facility.feeds[1].{key}"
    assert not Feed.objects.exists() and not Budget.objects.exists()
    assert admin_client.get("/api/v1/facility").json()["settings"]["margin"] != 0.2


def test_a_file_too_large_is_refused_unread(tmp_path):
    big = tmp_path / "server.yaml"
    with big.open("w") as handle:
        handle.write("facility:\n  budgets:\n")
        handle.write("    - {domain: 'rack:r1', cap_watts: 1000}\n" * 60_000)
    _database(tmp_path)
    done = _llmgw(tmp_path, "ctl", "facility", "apply", "-f", str(big))
    assert done.returncode != 0
    assert done.stderr.strip().startswith(f"error: {big}: 2,")
    assert "a file llmgw reads is at most 2,000,000" in done.stderr and "Traceback" not in done.stderr


def _fifo_of(tmp_path, name: str, chars: int):
    """A named pipe a thread writes `chars` characters to (a device or a pipe: no size to look at first)."""
    import os

    fifo = tmp_path / name
    os.mkfifo(fifo)

    def write() -> None:
        try:
            with open(fifo, "w") as handle:
                for _ in range(chars // 100_000):
                    handle.write("a" * 100_000)
        except BrokenPipeError:  # the reader had enough
            pass

    threading.Thread(target=write, daemon=True).start()
    return fifo


def test_ctl_reads_standard_input_and_named_files_within_the_bound(tmp_path, monkeypatch, capsys):
    from llmgw.ctl import main as ctl

    class Endless:
        """`< /dev/zero`: read whole, it never ends (memory runs out first)."""

        def read(self, size=-1):
            assert size is not None and size >= 0, "standard input read without a bound"
            return "a" * size

    monkeypatch.setattr(sys, "stdin", Endless())
    too_much = "more than 2,000,000 characters; a file llmgw reads is at most 2,000,000"
    for argv in (["apply", "-f", "-"], ["facility", "apply", "-f", "-"]):
        assert ctl(argv) == 1
        assert capsys.readouterr().err == f"error: <stdin>: {too_much}\n"
    csv = _fifo_of(tmp_path, "feeds.csv", 10_000_000)
    assert ctl(["facility", "import", "netbox", "--csv", str(csv), "--dry-run"]) == 1
    assert capsys.readouterr().err == f"error: {csv}: {too_much}\n"
    token = _fifo_of(tmp_path, "alice.token", 1_000_000)
    assert ctl(["--server", "http://127.0.0.1:9", "login", "--token-file", str(token)]) == 1
    assert capsys.readouterr().err == (
        f"error: {token}: more than 10,000 characters; a file llmgw reads is at most 10,000\n"
    )


def _database(tmp_path) -> None:
    """A data directory with a database, as _llmgw's ctl looks for one before it reads anything else."""
    (tmp_path / "var").mkdir(exist_ok=True)
    (tmp_path / "var" / "llmgw.sqlite3").touch()


def _llmgw(tmp_path, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "LLMGW_URL")}
    base["LLMGW_DATA_DIR"] = str(tmp_path / "var")
    base.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "llmgw.cli", *argv], capture_output=True, text=True, timeout=120, env=base
    )


def test_serve_and_sim_with_bad_configuration_print_one_error_line(tmp_path):
    bad = tmp_path / "server.yaml"
    bad.write_text("facility:\n  margin: 7\n")
    _llmgw(tmp_path, "migrate", "--noinput")
    done = _llmgw(tmp_path, "serve", "127.0.0.1:1", env={"LLMGW_CONFIG": str(bad)})
    assert (done.returncode, done.stderr.strip()) == (
        2, f"error: {bad} line 2: facility.margin: must be in [0, 1) (a share of the cap kept free), got 7")
    bomb = tmp_path / "scenario.yaml"
    bomb.write_text(BOMB)
    done = _llmgw(tmp_path, "sim", "facility", "-f", str(bomb))
    assert (done.returncode, done.stderr.strip()) == (
        2, f"error: {bomb}: more than 500,000 values (an alias repeating a large part?)")


def test_sim_help_needs_no_database_and_lists_only_its_own_flags(tmp_path):
    done = _llmgw(tmp_path, "sim", "--help")  # a data directory with no database in it
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: llmgw sim ") and "--settings" not in done.stdout, done.stdout


def test_a_negative_zero_budget_reads_as_zero(capsys):
    from facility.services import budget_set
    from llmgw.ctl import main as ctl

    budget_set(domain="rack:r1", cap_watts=-0.0)
    assert ctl(["facility", "budget", "set", "rack:r2", "--cap-watts", "-0"]) == 0
    assert capsys.readouterr().out == (
        "rack:r2: cap 0.0 kW, other 0.0 kW\nwarning: no node is in rack r2 yet; no node is in any rack\n"
    )


# -- outbound calls: a total deadline ---------------------------------------------------------------------


class Trickle:
    """An HTTP server that sends its headers, then one byte every ``every`` seconds, for a minute."""

    def __init__(self, every: float = 0.3):
        self.cut = threading.Event()
        trickle = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "1000000")
                self.end_headers()
                try:
                    for _ in range(200):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        time.sleep(every)
                except OSError:
                    trickle.cut.set()  # the client went away: it stopped waiting

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


SIGNALS = parse_query_signals({"inlet_temp_c": {"query": "max by (rack) (x)", "domain_label": "rack"}})


def test_a_trickling_prometheus_is_down_with_the_reason_once_its_deadline_passes():
    import httpx

    with Trickle() as slow, httpx.Client() as client:
        poll = poll_prometheus(slow.url, SIGNALS, client=client, now=time.time(), deadline_seconds=1.0)
        assert slow.cut.wait(10), "the poll kept reading"
    assert not poll.up
    assert poll.errors[0].startswith("inlet_temp_c: the answer took longer than its deadline (cut after ")


def test_with_a_trickling_prometheus_a_scale_up_still_places(join_node, monkeypatch):
    from facility import sources
    from facility.models import SourceStatus
    from facility.services import facility_apply
    from llmgw.management.commands.serve import periodic_round
    from placement import selectors
    from placement import services as placement_services

    monkeypatch.setattr(sources, "PROMETHEUS_DEADLINE_SECONDS", 1.0)
    for i in range(4):
        join_node(f"n{i}", rack=f"r{i}")
    with Trickle() as slow:
        facility_apply(text=(
            "facility:\n  conditions: {mode: enforce}\n  sources:\n    prometheus:\n"
            f"      url: {slow.url}\n      interval: 30s\n      signals:\n"
            "        inlet_temp_c: {query: 'max by (rack) (x)', domain_label: rack}\n"
        ))
        placement_services.model_apply(data={"kind": "Model", "name": "m", "replicas": 4, "profile": {"gpus": 8}})
        periodic_round()  # the poll, then the reconcile
        assert slow.cut.wait(10)
    assert len([r for r in selectors.replica_rows(model="m") if r["nodes"]]) == 4
    status = SourceStatus.objects.get(name="prometheus")
    # The poll's own client keeps the deadline at the socket: the trickled body is cut there.
    assert not status.up and status.last_error == "inlet_temp_c: no answer within 5 s"


def test_a_trickling_netbox_is_refused_naming_the_url(tmp_path, capsys):
    from facility import netbox_import
    from llmgw.ctl import main as ctl

    token = tmp_path / "nb.token"
    token.write_text("t")
    with Trickle(every=0.2) as slow:
        original = netbox_import.NETBOX_TIMEOUT_SECONDS
        netbox_import.NETBOX_TIMEOUT_SECONDS = 1
        try:
            code = ctl(["facility", "import", "netbox", "--url", slow.url, "--token-file", str(token)])
        finally:
            netbox_import.NETBOX_TIMEOUT_SECONDS = original
        assert slow.cut.wait(10)
    assert code == 1
    assert capsys.readouterr().err.startswith(f"error: --url: NetBox at {slow.url}/api did not answer: NetBox's answer took longer")


def test_a_celery_soft_time_limit_is_never_swallowed_by_a_source():
    from celery.exceptions import SoftTimeLimitExceeded

    class Limited:
        def stream(self, *_a, **_k):
            raise SoftTimeLimitExceeded()

    with pytest.raises(SoftTimeLimitExceeded):
        poll_prometheus("http://127.0.0.1:9", SIGNALS, client=Limited(), now=0)


def test_the_periodic_tasks_end_before_their_next_run():
    from django.conf import settings

    from llmgw.celery import app

    app.loader.import_default_modules()
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        task = app.tasks[entry["task"]]
        assert task.soft_time_limit is not None and task.soft_time_limit < entry["schedule"], entry["task"]


# -- every reader, fed anything -------------------------------------------------------------------------

yaml_like = st.one_of(
    st.text(max_size=400),
    st.binary(max_size=400).map(lambda b: b.decode("latin-1")),
    st.lists(
        st.sampled_from(["a: ", "&x ", "*x", "- ", "[", "]", "{", "}", ": ", "\n", "  ", "9" * 40, "!!python/object",
                         "'", '"', "---\n", "nodes:", "server:", "tracks:", "1e999", "-0", "~", "<<: *x"]),
        max_size=60,
    ).map("".join),
)


@settings(max_examples=300, deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=yaml_like)
def test_every_yaml_reader_answers_any_input_with_a_clear_refusal_or_a_value(text):
    for read in (
        lambda: load_documents(text, "f.yaml"),
        lambda: load_cluster(text, "cluster.yaml"),
        lambda: _scenario(text),
    ):
        try:
            read()
        except InvalidInput as exc:
            assert exc.message and "Traceback" not in exc.message
        except ValueError as exc:  # parse_scenario's own refusals
            assert str(exc)
    try:
        parse_config(text)
    except AgentConfigError as exc:
        assert str(exc).startswith("agent.yaml")


def _scenario(text):
    from llmgw.yamldoc import load_one

    return parse_scenario(load_one(text, "scenario.yaml").data)


csv_like = st.one_of(
    st.text(max_size=300),
    st.lists(st.sampled_from(["Name,Voltage,Amperage,Phase,Max Utilization,Rack\n", "A1,230,16,Single phase,80%,r1\n",
                              ",,,\n", '"', "\x00", "x" * 200, "\r", ",", "\n", "Three-phase", "-48", "DC"]),
             max_size=30).map("".join),
)


@settings(max_examples=300, deadline=5000)
@given(text=csv_like)
def test_the_csv_reader_answers_any_input_with_a_refusal_naming_the_line_or_a_plan(text):
    try:
        plan = netbox_csv.plan_from_csv(text)
    except InvalidInput as exc:
        assert exc.message.startswith("csv")
    else:
        assert all(f.capacity_watts >= 0 for f in plan.feeds)


def test_a_csv_field_past_the_csv_modules_limit_is_a_400(admin_client):
    text = "Name,Voltage,Amperage,Phase,Max Utilization,Rack\n" + '"' + "x" * 200_000 + '",230,16,Single phase,80%,r1\n'
    answer = admin_client.post("/api/v1/facility/import/netbox", {"csv": text}, content_type="application/json")
    assert answer.status_code == 400
    assert json.loads(answer.content)["detail"].startswith("csv line 2: field larger than field limit")


def test_random_bytes_to_the_heartbeat_and_apply_endpoints_are_never_a_500(admin_client, node_client, join_node):
    join_node("n1")
    node = node_client("n1")
    for body in (b"\xff\xfe", b"{", b"[]", b'{"a":' * 100, json.dumps({"text": BOMB}).encode(), b"9" * 10_000):
        assert admin_client.post("/api/v1/apply", body, content_type="application/json").status_code < 500
        assert admin_client.post("/api/v1/facility/apply", body, content_type="application/json").status_code < 500
        assert node.post("/api/v1/agents/heartbeat", body, content_type="application/json").status_code < 500


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_setting_that_does_not_parse_is_one_error_line(tmp_path):
    _database(tmp_path)
    done = _llmgw(tmp_path, "ctl", "nodes", env={"LLMGW_RECONCILE_INTERVAL": "abc"})
    assert (done.returncode, done.stderr) == (2, "error: LLMGW_RECONCILE_INTERVAL: 'abc' is not a number\n")


def test_a_format_no_renderer_writes_is_a_400_naming_format_and_the_schema_keeps_its_version(viewer_api):
    response = viewer_api.get("/api/v1/nodes", {"format": "zz"})
    assert response.status_code == 400
    assert response.json() == {"field": "format", "detail": "format: one of api, json; not 'zz'"}
    assert viewer_api.get("/api/v1/nodes", {"format": "json"}).status_code == 200
    schema = viewer_api.get("/api/v1/schema", {"format": "xml"})
    assert schema.status_code == 400 and b"field: format" in schema.content
    # ?version= is not written into the schema nor its file name (a newline there was a 500).
    for version in ["<b>x</b>", "1\nX-Injected: 1", "9" * 5_000]:
        response = viewer_api.get("/api/v1/schema", {"version": version})
        assert response.status_code == 200, version
        assert response.content.startswith(b"openapi: 3.0.3\ninfo:\n  title: llmgw API\n  version: '1'\n")
        assert response["Content-Disposition"] == 'inline; filename="llmgw API.yaml"'
