"""The node's draw from its BMC: Redfish read from sushy-tools' emulator serving DMTF mockups, and BMCs that
fail, hang or trickle — the BMC goes down with its reason, heartbeats never wait on it."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agents.node.config import BmcSettings, parse_config
from agents.node.daemon import Agent, build_heartbeat
from agents.node.protocol import validate_heartbeat
from agents.node.sensors.bmc import BmcDown, BmcPower, RedfishPower
from tests.fakes.control_plane import DEADLINE_SECONDS, ControlPlane, agent_yaml, wait_until
from tests.fakes.fixture_trees import FakeClock
from tests.fakes.redfish import SilentBmc, TricklingBmc, free_port, self_signed_certificate, sushy_static
from tests.unit.agent.test_daemon import StubReader, StubRuntime


def settings(url: str, **kwargs) -> BmcSettings:
    return BmcSettings(redfish=url, username="root", password="calvin", **{"deadline_seconds": 5.0, **kwargs})


def read(url: str, **kwargs) -> tuple[float, str]:
    power = RedfishPower(settings(url, **kwargs))
    try:
        return power.read()
    finally:
        power.close()


def valid(heartbeat: dict) -> dict:
    """The heartbeat less the stub reader's GPU readings (they carry no index): the BMC's part is checked."""
    return {**heartbeat, "sensors": {k: v for k, v in heartbeat["sensors"].items() if k != "gpus"}}


def release_bmc_workers() -> None:
    for thread in threading.enumerate():
        if thread.name == "llmgw-bmc":
            thread.join(DEADLINE_SECONDS)


# -- a real Redfish service: sushy-static on DMTF's mockups -------------------------------------------------


@pytest.fixture(scope="module")
def rackmount():
    with sushy_static("public-rackmount1") as url:
        yield url


def test_environment_metrics_first(rackmount):
    # The chassis also links the older Power (344 W): EnvironmentMetrics' 374 W is the figure.
    assert read(rackmount) == (374.0, "EnvironmentMetrics")
    assert read(rackmount, chassis="1U") == (374.0, "EnvironmentMetrics")


def test_power_subsystem_sums_every_supply():
    with sushy_static("public-tower") as url:
        assert read(url) == (974.8, "PowerSubsystem")


def test_the_older_power_resource_alone():
    with sushy_static("public-localstorage") as url:
        assert read(url) == (344.0, "Power")


def test_among_several_chassis_the_one_holding_the_system():
    with sushy_static("public-smartnic") as url:  # 1U (rack mount) and Card1 (a SmartNIC with its own system)
        assert read(url) == (374.0, "EnvironmentMetrics")


def test_a_chassis_the_bmc_does_not_have_is_named_with_those_it_has(rackmount):
    with pytest.raises(BmcDown, match=r"no chassis '2U' on the BMC \(it has: 1U\)"):
        read(rackmount, chassis="2U")


def test_the_heartbeat_carries_the_bmc_figure_as_the_nodes_draw(rackmount):
    config = parse_config(agent_yaml("http://cp"))
    bmc = BmcPower(settings(rackmount))
    try:
        first = build_heartbeat(config, StubReader(), None, bmc)
        assert "node_power_watts" not in first["sensors"]  # nothing read yet: the heartbeat does not wait
        bmc.wait()
        heartbeat = build_heartbeat(config, StubReader(), None, bmc)
    finally:
        release_bmc_workers()
        bmc.close()
    sensors = heartbeat["sensors"]
    assert sensors["node_power_watts"] == 374.0
    assert sensors["power_source"] == "bmc"
    assert sensors["bmc"] == {"state": "up", "resource": "EnvironmentMetrics"}
    assert sensors["gpus"]  # the cards' own readings still go: the node page shows them
    assert validate_heartbeat(valid(heartbeat))["sensors"]["node_power_watts"] == 374.0


# -- BMCs that fail ---------------------------------------------------------------------------------------


def test_nothing_listening_is_down_with_the_reason():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(BmcDown, match=r"cannot connect to http://127\.0\.0\.1:\d+"):
        read(url)


def test_refused_credentials_are_said():
    class Refusing(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 — http.server's name
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(BmcDown, match="refused the credentials"):
            read(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()


def test_an_answer_that_trickles_is_cut_at_the_deadline():
    bmc = TricklingBmc()
    try:
        with pytest.raises(BmcDown, match=r"no answer within 0\.5 s \(cut after \d+ bytes\)"):
            read(bmc.url, deadline_seconds=0.5)
    finally:
        bmc.close()


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")  # verify_tls: false, as told
def test_a_self_signed_certificate_is_refused_unless_told(tmp_path):
    certificate, key = self_signed_certificate(tmp_path)
    with sushy_static("public-rackmount1", tls=(certificate, key)) as url:
        with pytest.raises(BmcDown, match="TLS certificate was not accepted.*verify_tls: false"):
            read(url)  # verify_tls is true unless said otherwise
        assert read(url, verify_tls=False) == (374.0, "EnvironmentMetrics")
        assert read(url, ca_file=str(certificate)) == (374.0, "EnvironmentMetrics")


def test_a_hung_bmc_is_down_within_the_deadline_and_every_heartbeat_goes_out_on_time():
    silent = SilentBmc()
    clock = FakeClock()
    plane = ControlPlane(clock=clock)
    config = parse_config(agent_yaml(plane.url))
    bmc = BmcPower(settings(silent.url, deadline_seconds=2.0), clock=clock)
    agent = Agent(config, StubReader(), StubRuntime(), clock=clock, bmc=bmc)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), kwargs={"poll_seconds": 0.01})
    thread.start()
    try:
        wait_until(lambda: len(plane.requests) == 1)
        # The first heartbeat went out while the BMC hangs: it says nothing of it yet (nothing read).
        assert "bmc" not in plane.requests[0]["body"]["sensors"]
        clock.advance(2.5)  # past the BMC's deadline, not yet the next heartbeat
        clock.advance(7.5)
        wait_until(lambda: len(plane.requests) == 2)
        clock.advance(10)
        wait_until(lambda: len(plane.requests) == 3)
    finally:
        stop.set()
        thread.join(DEADLINE_SECONDS)
        silent.close()
        release_bmc_workers()
        plane.close()
        agent.close()
    # Each heartbeat at its time by the daemon's clock: the interval after the last, never later.
    assert [r["at"] for r in plane.requests] == [1000.0, 1010.0, 1020.0]
    for request in plane.requests[1:]:
        sensors = request["body"]["sensors"]
        assert sensors["bmc"] == {"state": "down", "reason": "no answer within 2 s"}
        assert "node_power_watts" not in sensors and "power_source" not in sensors  # GPU + CPU readings count
        assert sensors["gpus"]
        validate_heartbeat(valid(request["body"]))


def test_one_stuck_read_at_a_time():
    hang = threading.Event()
    clock = FakeClock()
    reads = []

    def source():
        reads.append(clock())
        hang.wait(DEADLINE_SECONDS)
        raise BmcDown("released")

    bmc = BmcPower(settings("http://127.0.0.1:1", deadline_seconds=2.0), clock=clock, source=source)
    try:
        assert bmc.sensors() == {}
        for _ in range(3):
            clock.advance(10)
            assert bmc.sensors() == {"bmc": {"state": "down", "reason": "no answer within 2 s"}}
        assert len(reads) == 1  # still stuck: no second read piled on it
    finally:
        hang.set()
        release_bmc_workers()
    assert bmc.sensors() == {"bmc": {"state": "down", "reason": "released"}}
    release_bmc_workers()
    assert len(reads) == 2  # ended: the next heartbeat started a new read


def test_a_read_that_ends_past_its_deadline_is_not_believed():
    clock = FakeClock()

    def slow():
        clock.advance(3)
        return 900.0, "EnvironmentMetrics"

    bmc = BmcPower(settings("http://127.0.0.1:1", deadline_seconds=2.0), clock=clock, source=slow)
    bmc.sensors()
    bmc.wait()
    assert bmc.sensors() == {"bmc": {"state": "down", "reason": "answered after 3.0 s, more than 2 s"}}
    release_bmc_workers()


def test_a_bug_in_a_read_is_a_down_bmc_not_a_lost_heartbeat():
    def broken():
        raise KeyError("PowerWatts")

    bmc = BmcPower(settings("http://127.0.0.1:1"), source=broken)
    bmc.sensors()
    bmc.wait()
    assert bmc.sensors() == {"bmc": {"state": "down", "reason": "KeyError: 'PowerWatts'"}}
    release_bmc_workers()


def test_a_long_reason_is_one_bounded_line():
    def verbose():
        raise BmcDown("line one\nline two " + "x" * 1000)

    bmc = BmcPower(settings("http://127.0.0.1:1"), source=verbose)
    bmc.sensors()
    bmc.wait()
    reason = bmc.sensors()["bmc"]["reason"]
    release_bmc_workers()
    assert reason.startswith("line one line two x")
    assert len(reason) == 300
    validate_heartbeat({"node": "gpu01", "sensors": {"bmc": {"state": "down", "reason": reason}}})


def test_a_reason_quoting_terminal_controls_is_carried_as_their_escapes():
    def quoting():
        raise BmcDown("answered \x1b[2J\x9b31m<html>")

    bmc = BmcPower(settings("http://127.0.0.1:1"), source=quoting)
    bmc.sensors()
    bmc.wait()
    reason = bmc.sensors()["bmc"]["reason"]
    release_bmc_workers()
    assert reason == "answered \\x1b[2J\\x9b31m<html>"
    validate_heartbeat({"node": "gpu01", "sensors": {"bmc": {"state": "down", "reason": reason}}})
