"""The BMC as a careful client: credentials refused are asked again ever more rarely, the redfish library's
log is bounded, power is found where HPE Cray EX blades keep it (Sensors), Intel's nested chassis ids and a
chassis that links the system whatever its type. Real mockups (tests/fixtures/redfish/README.md) served by
sushy-static."""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agents.node.config import is_chassis_id
from agents.node.protocol import validate_heartbeat
from agents.node.sensors.bmc import BmcDown, BmcPower, BmcRefused, RedfishPower
from tests.fakes.fixture_trees import FakeClock
from tests.fakes.redfish import sushy_static
from tests.unit.agent.test_bmc import read, release_bmc_workers, settings

CRAY_NODE_INPUT = "/redfish/v1/Chassis/Node0/Sensors/ChassisVoltageRegulator0InputPower"


def test_hpe_cray_ex_blade_power_comes_from_its_sensors():
    # Node0 links Power (voltages only, no PowerControl) and Sensors: its 467 W input regulator is the
    # node's whole draw; the GPUs' and CPUs' own power sensors are parts of it, not read.
    with sushy_static("cray-ex235n") as url:
        power = RedfishPower(settings(url, chassis="Node0"))
        try:
            assert power.read() == (467.0, "Sensors")
            assert power._sensors == [CRAY_NODE_INPUT]  # found once; read alone from now on
            assert power.read() == (467.0, "Sensors")
        finally:
            power.close()


def test_a_cray_blade_without_a_chassis_named_says_which_to_name():
    with sushy_static("cray-ex235n") as url, pytest.raises(BmcDown) as refused:
        read(url)
    assert str(refused.value) == (
        "the BMC has 7 chassis (Mezz2, Node1, Mezz0, Node0, Enclosure, Mezz1, Mezz3); name the node's in "
        "agent.yaml (bmc: chassis:)"
    )


def test_a_figure_from_sensors_goes_out_in_a_heartbeat_the_protocol_takes():
    bmc = BmcPower(settings("http://127.0.0.1:1"), clock=FakeClock(), source=lambda: (467.0, "Sensors"))
    bmc.sensors()
    bmc.wait()
    sensors = bmc.sensors()
    release_bmc_workers()
    assert sensors["node_power_watts"] == 467.0 and sensors["bmc"]["state"] == "up"
    assert validate_heartbeat({"node": "cray01", "sensors": sensors})["sensors"]["node_power_watts"] == 467.0


@pytest.mark.parametrize("chassis", ["/redfish/v1/Chassis/RackMount/Baseboard", "RackMount/Baseboard", None])
def test_intel_nested_chassis_by_its_path_its_id_path_or_as_the_one_holding_the_system(chassis):
    # Intel's BMC nests chassis ids (RackMount/Baseboard) and RackMount itself answers 404; the Baseboard,
    # a "Card", is the one chassis linking the computer system.
    with sushy_static("intel-s2600bpb") as url:
        assert read(url, chassis=chassis) == (148.0, "Power")


def test_a_nested_chassis_the_bmc_does_not_have_is_named_with_those_it_has():
    with sushy_static("intel-s2600bpb") as url, pytest.raises(BmcDown) as refused:
        read(url, chassis="RackMount/Nope")
    assert str(refused.value).startswith(
        "no chassis 'RackMount/Nope' on the BMC (it has: RackMount, RackMount/Baseboard, RackMount/HSBackplane,"
    )


@pytest.mark.parametrize(
    ("chassis", "taken"),
    [
        ("1U", True),
        ("System.Embedded.1", True),
        ("RackMount/Baseboard", True),
        ("/redfish/v1/Chassis/RackMount/Baseboard", True),
        ("1U/../x", False),
        ("/redfish/v1/Systems/1", False),
        ("a//b", False),
        ("", False),
    ],
)
def test_agent_yaml_takes_a_chassis_id_or_its_id_path(chassis, taken):
    assert is_chassis_id(chassis) is taken


def test_refused_credentials_are_asked_again_after_a_wait_that_doubles_to_ten_minutes():
    clock = FakeClock()
    reads: list[float] = []
    accepted = threading.Event()

    def source():
        reads.append(clock())
        if accepted.is_set():
            return 900.0, "Power"
        raise BmcRefused("the BMC refused the credentials (HTTP 401 on /redfish/v1/Chassis)")

    bmc = BmcPower(settings("http://127.0.0.1:1"), clock=clock, source=source)
    try:
        bmc.sensors()
        bmc.wait()
        assert bmc.sensors() == {
            "bmc": {
                "state": "down",
                "reason": "the BMC refused the credentials (HTTP 401 on /redfish/v1/Chassis); asked again in 1 min "
                "(the wait doubles while refused, up to 10 min)",
            }
        }
        waits = []
        for _ in range(6):
            start = len(reads)
            while len(reads) == start:  # heartbeats every 10 s until the BMC is asked again
                clock.advance(10)
                bmc.sensors()
                bmc.wait()
            waits.append(reads[-1] - reads[-2])
        assert waits == [60, 120, 240, 480, 600, 600]
        assert "asked again in 10 min" in bmc.sensors()["bmc"]["reason"]
        accepted.set()
        clock.advance(600)
        bmc.sensors()
        bmc.wait()
        assert bmc.sensors()["node_power_watts"] == 900.0
        bmc.wait()
        before = len(reads)
        for _ in range(3):  # accepted: read at every heartbeat again
            clock.advance(10)
            bmc.sensors()
            bmc.wait()
        assert len(reads) == before + 3
    finally:
        release_bmc_workers()


def test_other_failures_are_not_waited_on():
    clock = FakeClock()
    reads: list[float] = []

    def source():
        reads.append(clock())
        raise BmcDown("the BMC answered HTTP 503 on /redfish/v1/Chassis")

    bmc = BmcPower(settings("http://127.0.0.1:1"), clock=clock, source=source)
    for _ in range(3):
        bmc.sensors()
        bmc.wait()
        clock.advance(10)
    release_bmc_workers()
    assert len(reads) == 3


class HtmlErrorPage(BaseHTTPRequestHandler):
    """A BMC's web server answering its Redfish path with a 900 KB HTML page (and status 200)."""

    BODY = b"<html><body>" + b"x" * 900_000 + b"</body></html>"

    def do_GET(self) -> None:  # noqa: N802 — http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(self.BODY)))
        self.end_headers()
        self.wfile.write(self.BODY)

    def log_message(self, *args) -> None:
        pass


def test_the_redfish_librarys_log_of_a_900_kb_page_is_one_short_line(caplog):
    server = ThreadingHTTPServer(("127.0.0.1", 0), HtmlErrorPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(BmcDown, match="with no JSON"):
            read(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    library = [r for r in caplog.records if r.name.startswith("redfish")]
    assert library, "the library logs the page at ERROR"
    for record in library:
        text = record.getMessage()
        assert len(text) < 700 and "<html>" not in text and "\n" not in text, text[:300]
    assert library[0].getMessage().startswith("Service responded with invalid JSON at URI /redfish/v1/Chassis (")
