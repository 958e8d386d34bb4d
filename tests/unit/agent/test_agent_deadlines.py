"""One deadline for each whole call the agent makes — its heartbeat to the control plane and each read of
its BMC: a server that trickles its status line, its headers or its body a byte every half second is cut
when the deadline passes, not when the trickle ends (a timeout per wait never fires: each byte comes in
time), and the agent says why. Real sockets on 127.0.0.1; the deadlines are small, the trickles long."""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agents.node.config import parse_config
from agents.node.daemon import MAX_ANSWER_BYTES, Agent, main
from agents.node.sensors.bmc import BmcDown
from tests.fakes.control_plane import agent_yaml
from tests.fakes.trickle import CUT_WITHIN, PARTS, Trickle
from tests.unit.agent.test_bmc import read
from tests.unit.agent.test_daemon import FixedJitter, StubReader, StubRuntime, agent_messages


def agent_for(url: str) -> Agent:
    # A 2-s interval gives each heartbeat 2 s in all.
    return Agent(parse_config(agent_yaml(url, interval_seconds=2)), StubReader(), StubRuntime(), rng=FixedJitter())


@pytest.mark.parametrize("part", PARTS)
def test_a_control_plane_trickling_its_answer_costs_a_heartbeat_its_deadline_and_no_more(part, caplog):
    caplog.set_level(logging.INFO, logger="llmgw.agent")
    with Trickle(part) as slow:
        agent = agent_for(slow.url)
        try:
            assert agent.beat() == 2  # an outage's first wait: the interval
            assert slow.cut.wait(CUT_WITHIN), "the heartbeat kept waiting for the answer"
        finally:
            agent.close()
    assert agent_messages(caplog) == [
        f"heartbeat: cannot reach {slow.url}/api/v1/agents/heartbeat (ReadTimeout: no answer within 2 s); "
        "retrying with backoff (up to 12 s)"
    ]


def test_once_says_the_control_plane_did_not_answer_in_time(tmp_path, capsys):
    config = tmp_path / "agent.yaml"
    with Trickle("headers") as slow:
        config.write_text(agent_yaml(slow.url, interval_seconds=2))
        code = main(["--once", "--config", str(config), "--sample-seconds", "0", "--sys-root", str(tmp_path)])
        assert slow.cut.wait(CUT_WITHIN)
    assert code == 1
    assert capsys.readouterr().err.endswith(
        f"llmgw agent: cannot reach {slow.url}/api/v1/agents/heartbeat: no answer within 2 s\n"
    )


def test_an_answer_larger_than_any_heartbeats_is_not_read_whole(caplog):
    class Huge(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            try:
                for _ in range(MAX_ANSWER_BYTES // 65536 + 2):
                    self.wfile.write(b" " * 65536)
            except OSError:
                pass

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Huge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    agent = agent_for(url)
    caplog.set_level(logging.INFO, logger="llmgw.agent")
    try:
        agent.beat()
    finally:
        agent.close()
        server.shutdown()
        server.server_close()
    assert agent_messages(caplog) == [
        f"heartbeat: {url}/api/v1/agents/heartbeat: the control plane's answer is larger than 8,388,608 bytes; "
        "retrying with backoff (up to 12 s)"
    ]


@pytest.mark.parametrize("part", PARTS)
def test_a_bmc_trickling_its_answer_is_down_once_the_reads_deadline_passes(part):
    with Trickle(part) as slow:
        with pytest.raises(BmcDown) as down:
            read(slow.url, deadline_seconds=1.0)
        assert slow.cut.wait(CUT_WITHIN), "the read kept waiting for the BMC"
    assert str(down.value).startswith("no answer within 1 s")
