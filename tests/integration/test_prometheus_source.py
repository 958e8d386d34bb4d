"""The Prometheus facility source against a real Prometheus scraping a DCIM-style exporter.

Real PromQL and real staleness: the test serves gauges on a free port, starts Debian's prometheus
scraping them every second, and polls it as llmgw does.
"""

from __future__ import annotations

import http.server
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from facility.conditions import COOLING_ALARM, INLET
from facility.domains import Domain
from facility.sources import parse_query_signals, poll_prometheus

SIGNALS = parse_query_signals({
    INLET: {"query": "max by (rack) (dcim_rack_inlet_temperature_celsius)", "domain_label": "rack",
            "stale_after": "2m"},
    COOLING_ALARM: {"query": "max by (row) (dcim_crac_alarm)", "domain_label": "row"},
})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Exporter:
    """A small exporter whose gauges the test sets; ``up = False`` makes it answer 503."""

    def __init__(self):
        self.lines: list[str] = []
        self.up = True
        exporter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                if not exporter.up:
                    self.send_response(503)
                    self.end_headers()
                    return
                body = ("\n".join(exporter.lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", _free_port()), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def prometheus(tmp_path: Path):
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: apt-get install prometheus (scripts/test.sh installs it)"
    exporter = Exporter()
    port = _free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: dcim\n    static_configs: [{{targets: ['127.0.0.1:{exporter.port}']}}]\n"
    )
    process = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--query.lookback-delta=5s"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "prometheus did not start"
            time.sleep(0.2)
        yield url, exporter
    finally:
        process.terminate()
        process.wait(timeout=20)
        exporter.server.shutdown()


def _poll_until(url, predicate, timeout=20):
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5) as client:
        while True:
            poll = poll_prometheus(url, SIGNALS, client=client, now=time.time())
            if predicate(poll):
                return poll
            assert time.monotonic() < deadline, f"never happened; last poll: {poll}"
            time.sleep(0.5)


def test_readings_per_domain_from_real_promql(prometheus):
    url, exporter = prometheus
    exporter.lines = [
        'dcim_rack_inlet_temperature_celsius{rack="r1-01",probe="top"} 24.5',
        'dcim_rack_inlet_temperature_celsius{rack="r1-01",probe="bottom"} 26.0',
        'dcim_rack_inlet_temperature_celsius{rack="r1-02",probe="top"} 33.1',
        'dcim_crac_alarm{row="1",unit="crac-1"} 1',
    ]
    poll = _poll_until(url, lambda p: Domain("rack", "r1-02") in p.readings and Domain("row", "1") in p.readings)
    assert poll.up
    assert poll.readings[Domain("rack", "r1-01")][INLET].value == 26.0  # max by (rack)
    assert poll.readings[Domain("rack", "r1-02")][INLET].value == 33.1
    assert poll.readings[Domain("rack", "r1-02")][INLET].stale_after == 120
    assert poll.readings[Domain("row", "1")][COOLING_ALARM].value == 1
    assert abs(poll.readings[Domain("rack", "r1-01")][INLET].at - time.time()) < 10


def test_a_series_that_stops_goes_missing_and_a_dead_server_is_a_fact(prometheus):
    url, exporter = prometheus
    exporter.lines = ['dcim_rack_inlet_temperature_celsius{rack="r1-01"} 25']
    _poll_until(url, lambda p: Domain("rack", "r1-01") in p.readings)
    exporter.up = False  # the exporter fails: Prometheus marks its series stale
    poll = _poll_until(url, lambda p: Domain("rack", "r1-01") not in p.readings)
    assert poll.up  # Prometheus itself answers; the data is missing, not the source
    bad = parse_query_signals({INLET: {"query": "max by (rack) (", "domain_label": "rack"}})
    with httpx.Client(timeout=5) as client:
        poll = poll_prometheus(url, bad, client=client, now=time.time())
        assert not poll.up and poll.errors[0].startswith("inlet_temp_c: HTTP 400")
        down = poll_prometheus("http://127.0.0.1:9", SIGNALS, client=client, now=time.time())
    assert not down.up and down.readings == {}
    assert down.errors[0].startswith("inlet_temp_c: ConnectError")


SERVER_YAML = """\
facility:
  conditions: {{mode: enforce}}
  sources:
    agents: false
    prometheus:
      url: {url}
      interval: 30s
      signals:
        inlet_temp_c: {{query: 'max by (rack) (dcim_rack_inlet_temperature_celsius)', domain_label: rack,
                        stale_after: 10m}}
        cooling_alarm: {{query: 'max by (row) (dcim_crac_alarm)', domain_label: row, stale_after: 10m}}
"""


@pytest.mark.django_db(transaction=True)
def test_prometheus_readings_become_conditions_and_a_dead_source_is_shown(prometheus):
    from datetime import timedelta

    from django.utils import timezone

    from facility.evaluation import conditions_evaluate, effective_conditions
    from facility.models import SourceStatus
    from facility.services import facility_apply

    url, exporter = prometheus
    exporter.lines = [
        'dcim_rack_inlet_temperature_celsius{rack="r1-01"} 24.5',
        'dcim_rack_inlet_temperature_celsius{rack="r1-02"} 33.1',
        'dcim_crac_alarm{row="1"} 1',
    ]
    _poll_until(url, lambda p: Domain("rack", "r1-02") in p.readings and Domain("row", "1") in p.readings)
    facility_apply(text=SERVER_YAML.format(url=url))
    start = timezone.now()
    conditions_evaluate(now=start)
    conditions = effective_conditions(now=start)
    assert conditions["row:1"]["condition"] == "hot"  # a cooling alarm is hot at once
    assert conditions["rack:r1-02"]["condition"] == "ok"  # 33.1 °C, but not for 2 minutes yet
    conditions_evaluate(now=start + timedelta(minutes=3))  # the interval passed: polled again
    conditions = effective_conditions(now=start + timedelta(minutes=3))
    assert conditions["rack:r1-02"]["condition"] == "hot"
    assert conditions["rack:r1-02"]["detail"] == "inlet 33.1 °C for 3 min, hot above 32 °C"
    assert conditions["rack:r1-01"]["condition"] == "ok"
    assert SourceStatus.objects.get(name="prometheus").up
    facility_apply(text=SERVER_YAML.format(url="http://127.0.0.1:9"))
    conditions_evaluate(now=start + timedelta(minutes=4))  # down: a fact, and the last readings stay
    status = SourceStatus.objects.get(name="prometheus")
    assert not status.up and "ConnectError" in status.last_error
    assert effective_conditions(now=start + timedelta(minutes=4))["rack:r1-02"]["condition"] == "hot"
