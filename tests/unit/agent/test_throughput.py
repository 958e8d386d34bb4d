"""Tokens per second: the replica's counter read from its /metrics, the rate between two reads."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agents.node import runtime as runtime_module
from agents.node.config import RuntimeSettings
from agents.node.runtime import (
    DEFAULT_THROUGHPUT_METRIC,
    THROUGHPUT_SECONDS,
    Runtime,
    counter_value,
    http_counter,
)

PAGE = """# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="llama {70b}, \\"q\\""} 1500.0
vllm:generation_tokens_total{model_name="other"} 500 1700000000000
vllm:generation_tokens_created{model_name="other"} 1.7e9
vllm:generation_tokens_total_extra 99
"""


def test_the_counter_is_summed_over_its_label_sets_and_lookalike_names_are_not_counted():
    assert counter_value(PAGE, DEFAULT_THROUGHPUT_METRIC) == 2000.0


@pytest.mark.parametrize(
    "page",
    ["", "# vllm:generation_tokens_total 5\n", "other_total 5\n"],
)
def test_an_absent_counter_is_none(page):
    assert counter_value(page, DEFAULT_THROUGHPUT_METRIC) is None


@pytest.mark.parametrize(
    "line",
    [
        'vllm:generation_tokens_total{model_name="x"',  # labels never close
        "vllm:generation_tokens_total NaN",
        "vllm:generation_tokens_total -3",
        "vllm:generation_tokens_total many",
        "vllm:generation_tokens_total 1 2 3",
    ],
)
def test_a_sample_that_does_not_parse_makes_the_answer_unknown_not_a_wrong_sum(line):
    assert counter_value(f"vllm:generation_tokens_total 7\n{line}\n", DEFAULT_THROUGHPUT_METRIC) is None


class FakeProcess:
    pid = 4242

    def poll(self):
        return None

    def signal(self, signum: int) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(counts: dict[tuple[int, str], float | None]):
    clock = Clock()
    reads: list[tuple[int, str]] = []

    def read_counter(port: int, metric: str) -> float | None:
        reads.append((port, metric))
        return counts.get((port, metric))

    runtime = Runtime(
        RuntimeSettings(port_range=(9000, 9009)),
        clock=clock,
        health_check=lambda port, path: True,
        spawn=lambda args, env, cwd, log: FakeProcess(),
        port_free=lambda port: True,
        read_counter=read_counter,
    )
    return runtime, clock, reads


def test_the_rate_is_taken_between_two_reads_and_only_for_ready_replicas():
    counts: dict = {}
    runtime, clock, reads = make(counts)
    runtime.sync([{"id": 17, "model": "m", "command": "serve {port}"}])
    assert runtime.throughput() == []  # starting: not read at all
    counts[(9000, DEFAULT_THROUGHPUT_METRIC)] = 1000.0
    runtime.poll()  # ready now, first read
    assert runtime.throughput() == []  # one read is no rate: absent, not 0
    clock.now += 1.0
    runtime.poll()
    assert len(reads) == 1  # read at most every THROUGHPUT_SECONDS
    clock.now += THROUGHPUT_SECONDS
    counts[(9000, DEFAULT_THROUGHPUT_METRIC)] = 1000.0 + 1200.0 * (THROUGHPUT_SECONDS + 1.0)
    runtime.poll()
    assert runtime.throughput() == [{"id": 17, "tokens_per_second": 1200.0}]


def test_a_counter_reset_counts_from_zero_and_a_lost_counter_is_unknown():
    counts: dict = {(9000, DEFAULT_THROUGHPUT_METRIC): 50_000.0}
    runtime, clock, _ = make(counts)
    runtime.sync([{"id": 17, "model": "m", "command": "serve {port}"}])
    runtime.poll()
    runtime.poll()
    clock.now += 10.0
    counts[(9000, DEFAULT_THROUGHPUT_METRIC)] = 3000.0  # the server restarted: it counted 3000 since
    runtime.poll()
    assert runtime.throughput() == [{"id": 17, "tokens_per_second": 300.0}]
    clock.now += 10.0
    counts[(9000, DEFAULT_THROUGHPUT_METRIC)] = None
    runtime.poll()
    assert runtime.throughput() == []


def test_the_profiles_metric_is_read_and_a_bad_name_falls_back_to_vllms():
    counts: dict = {}
    runtime, _, reads = make(counts)
    runtime.sync([
        {"id": 17, "model": "m", "command": "serve {port}", "throughput_metric": "sglang:generation_tokens_total"},
        {"id": 18, "model": "m", "command": "serve {port}", "throughput_metric": "bad name{}"},
    ])
    runtime.poll()
    runtime.poll()
    assert sorted(reads) == [(9000, "sglang:generation_tokens_total"), (9001, DEFAULT_THROUGHPUT_METRIC)]


class MetricsServer:
    def __init__(self, status: int, body: bytes) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 — http.server's name
                self.send_response(status if self.path == "/metrics" else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [(200, PAGE.encode(), 2000.0), (500, PAGE.encode(), None), (200, b"up 1\n", None)],
)
def test_the_counter_is_read_over_http(status, body, expected):
    server = MetricsServer(status, body)
    try:
        assert http_counter(server.port, DEFAULT_THROUGHPUT_METRIC) == expected
    finally:
        server.close()


def test_a_page_over_the_size_bound_is_not_read(monkeypatch):
    monkeypatch.setattr(runtime_module, "METRICS_MAX_BYTES", 100)
    server = MetricsServer(200, PAGE.encode())
    try:
        assert http_counter(server.port, DEFAULT_THROUGHPUT_METRIC) is None
    finally:
        server.close()


def test_nothing_listening_is_unknown():
    server = MetricsServer(200, b"")
    port = server.port
    server.close()
    assert http_counter(port, DEFAULT_THROUGHPUT_METRIC) is None
