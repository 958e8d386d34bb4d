"""The node's whole draw from its BMC, through Redfish (DMTF's `redfish` client), in place of GPU + CPU.

The chassis' power is read from ``Chassis/{id}/EnvironmentMetrics`` (``PowerWatts.Reading``), else
``PowerSubsystem`` (its power supplies' ``Metrics.InputPowerWatts.Reading``, all of them), else the older
``Power`` (``PowerControl[].PowerConsumedWatts``), else its ``Sensors`` (the power sensor of the whole
chassis; see :func:`sensors_power`): what the chassis links, in that order. agent.yaml's ``chassis:`` is
the chassis' Id or its id path where the BMC nests them (Intel's ``RackMount/Baseboard``); without it the
BMC's one chassis is taken, or among several the one that links the computer system (whatever its
ChassisType: Intel's is a ``Card``), or among several such the one whose type holds a whole node.

A BMC that refuses the credentials (HTTP 401 or 403) is asked again after a minute, then after twice as
long each time, up to every 10 minutes: a BMC locks an account after a few failed logins, and the
heartbeat's BMC status says when the next try is. The redfish library's own log records are cut to one
line of at most 500 characters: it logs a BMC's whole answer (an HTML page of 900 KB) at ERROR.

A BMC answers in hundreds of milliseconds to seconds, and sometimes not at all: reads run in a worker
thread, one at a time, started by a heartbeat and taken by the next one, so no heartbeat ever waits on the
BMC. A read that passes its deadline (shorter than the heartbeat interval), fails or finds no figure makes
the BMC ``down`` with the reason; the node then falls back to its GPU and CPU readings. One deadline covers
the whole read — every connect, status line, headers and body of its requests (llmgw.outbound keeps it at
the socket) — and each answer is read within a size cap: a BMC that trickles bytes is cut off, not waited for.

What a heartbeat's sensors carry (agents.node.protocol):
``node_power_watts`` and ``power_source: "bmc"`` while the BMC is up, and ``bmc``:
``{"state": "up", "resource": "EnvironmentMetrics"}`` or ``{"state": "down", "reason": "…"}``. A resource the
protocol does not name yet (``Sensors``) is left out of the status, not sent to get the heartbeat refused.
"""

from __future__ import annotations

import base64
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from agents.node.config import CHASSIS_PATH_PREFIX, BmcSettings
from agents.node.protocol import BMC_RESOURCES, MAX_BMC_REASON_LENGTH, NODE_POWER_WATTS_MAX, carried_text
from llmgw import outbound

log = logging.getLogger(__name__)

SERVICE_ROOT = "/redfish/v1"
MAX_ANSWER_BYTES = 1024 * 1024  # a Redfish resource is a few KiB; a PSU collection of a big chassis, tens
MAX_CHASSIS_LOOKED_AT = 16  # members of the chassis collection read to find the node's own
MAX_POWER_SUPPLIES = 64
MAX_SENSORS_LOOKED_AT = 256  # members of a chassis' Sensors read to find its power (an HPE Cray EX node has 85)
# Credentials refused: the first wait before asking again, doubled each time up to the longest.
REFUSED_FIRST_WAIT_SECONDS = 60.0
REFUSED_LONGEST_WAIT_SECONDS = 600.0
LOG_RECORD_CHARS = 500  # the most of one redfish library log record that reaches the agent's log
# Chassis types that hold a whole node (Redfish's ChassisType), not one of its boards or modules.
NODE_CHASSIS_TYPES = frozenset({"RackMount", "StandAlone", "Blade", "Sled", "Enclosure", "Drawer", "Zone"})
_CHUNK_BYTES = 64 * 1024


class BmcDown(Exception):
    """The BMC cannot give the chassis' power now; the text is the reason a person reads."""


class BmcRefused(BmcDown):
    """The BMC refused the credentials (HTTP 401 or 403): asked again only after a wait (see BmcPower)."""


class RedfishLogCut(logging.Filter):
    """Cuts a record of the redfish library to its first line, at most LOG_RECORD_CHARS: the library
    logs a BMC's answer whole (an HTML error page of 900 KB) after its own words."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        first = text.split("\n", 1)[0]
        if len(first) > LOG_RECORD_CHARS:
            first = first[:LOG_RECORD_CHARS] + "…"
        if first != text:
            record.msg = f"{first} ({len(text):,} characters; the rest is not logged)"
            record.args = None
        return True


def bound_redfish_logs() -> None:
    """Put RedfishLogCut on the redfish library's loggers (a logger's filter does not reach its children,
    so each module's logger gets it)."""
    names = ["redfish", *(n for n in list(logging.root.manager.loggerDict) if n.startswith("redfish."))]
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedfishLogCut) for f in logger.filters):
            logger.addFilter(RedfishLogCut())


Get = Callable[[str], "dict[str, Any] | None"]  # GET a Redfish path: its JSON object, None when it is absent (404)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0 <= value <= NODE_POWER_WATTS_MAX else None


def _link(document: dict[str, Any] | None, key: str) -> str | None:
    target = (document or {}).get(key)
    link = target.get("@odata.id") if isinstance(target, dict) else None
    return link if isinstance(link, str) and link.startswith("/") else None


def _members(document: dict[str, Any] | None) -> list[str]:
    members = (document or {}).get("Members")
    if not isinstance(members, list):
        return []
    return [m["@odata.id"] for m in members if isinstance(m, dict) and isinstance(m.get("@odata.id"), str)]


def chassis_path(chassis: str) -> str:
    """agent.yaml's ``chassis:`` (an Id, an id path, or a whole path) as the path to GET."""
    relative = chassis.removeprefix(CHASSIS_PATH_PREFIX)
    return CHASSIS_PATH_PREFIX + "/".join(quote(part, safe="") for part in relative.split("/"))


def _chassis_name(path: str) -> str:
    """A chassis' path as agent.yaml would name it: its Id, or its id path where the BMC nests them."""
    return path.rstrip("/").removeprefix(CHASSIS_PATH_PREFIX)


def find_chassis(get: Get, chassis_id: str | None) -> str:
    """The path of the node's chassis: the one named in agent.yaml, else the BMC's one, else the one that
    links the computer system (among several such, the one whose type holds a whole node); BmcDown naming
    the chassis when it cannot tell."""
    if chassis_id is not None:
        path = chassis_path(chassis_id)
        if get(path) is not None:
            return path
        names = [_chassis_name(m) for m in _members(get(f"{SERVICE_ROOT}/Chassis"))]
        raise BmcDown(f"no chassis {chassis_id!r} on the BMC (it has: {', '.join(names) or 'none'})")
    members = _members(get(f"{SERVICE_ROOT}/Chassis"))
    if len(members) == 1:
        return members[0]
    if not members:
        raise BmcDown("the BMC lists no chassis")
    holding: list[tuple[str, Any]] = []
    for path in members[:MAX_CHASSIS_LOOKED_AT]:
        chassis = get(path) or {}
        links = chassis.get("Links") if isinstance(chassis.get("Links"), dict) else {}
        if links.get("ComputerSystems"):
            holding.append((path, chassis.get("ChassisType")))
    if len(holding) == 1:
        return holding[0][0]
    whole = [path for path, kind in holding if kind in NODE_CHASSIS_TYPES]
    if len(whole) == 1:
        return whole[0]
    names = ", ".join(_chassis_name(m) for m in members[:MAX_CHASSIS_LOOKED_AT])
    raise BmcDown(f"the BMC has {len(members)} chassis ({names}); name the node's in agent.yaml (bmc: chassis:)")


def chassis_power(get: Get, chassis_path: str, sensors: list[str] | None = None) -> tuple[float, str]:
    """The chassis' power (W) and the resource it was read from; BmcDown when none gives a figure.
    ``sensors``: the power sensors found last time (sensors_power's ``known``)."""
    chassis = get(chassis_path)
    if chassis is None:
        raise BmcDown(f"{chassis_path} is gone from the BMC")
    tried = []
    link = _link(chassis, "EnvironmentMetrics")
    if link is not None:
        tried.append("EnvironmentMetrics")
        power = (get(link) or {}).get("PowerWatts")
        watts = _number(power.get("Reading")) if isinstance(power, dict) else None
        if watts is not None:
            return watts, "EnvironmentMetrics"
    link = _link(chassis, "PowerSubsystem")
    if link is not None:
        tried.append("PowerSubsystem")
        watts = _power_supplies_watts(get, link)
        if watts is not None:
            return watts, "PowerSubsystem"
    link = _link(chassis, "Power")
    if link is not None:
        tried.append("Power")
        controls = (get(link) or {}).get("PowerControl")
        for control in controls if isinstance(controls, list) else []:
            watts = _number(control.get("PowerConsumedWatts")) if isinstance(control, dict) else None
            if watts is not None:
                return watts, "Power"
    link = _link(chassis, "Sensors")
    if link is not None:
        tried.append("Sensors")
        watts = sensors_power(get, link, sensors if sensors is not None else [])
        if watts is not None:
            return watts, "Sensors"
    where = f" ({', '.join(tried)} read)" if tried else " (no EnvironmentMetrics, PowerSubsystem, Power or Sensors)"
    raise BmcDown(f"chassis {_chassis_name(chassis_path)} reports no power reading{where}")


def _sensor_kind(sensor: dict[str, Any]) -> str | None:
    """Which of the chassis' power sensors this is, if it is one: ``chassis`` (PhysicalContext Chassis: the
    whole chassis), ``supply`` (a power supply's input), ``input`` (HPE Cray EX: the node's input
    regulator, PhysicalContext VoltageRegulator, PhysicalSubContext Input, Oem.ParentalContext Chassis —
    the blade's node reports its whole draw there and nowhere else)."""
    if sensor.get("ReadingType") != "Power":
        return None
    context, sub = sensor.get("PhysicalContext"), sensor.get("PhysicalSubContext")
    if context == "Chassis":
        return "chassis"
    if context == "PowerSupply" and sub in (None, "Input"):
        return "supply"
    oem = sensor.get("Oem") if isinstance(sensor.get("Oem"), dict) else {}
    if context == "VoltageRegulator" and sub == "Input" and oem.get("ParentalContext") == "Chassis":
        return "input"
    return None


def sensors_power(get: Get, sensors_path: str, known: list[str]) -> float | None:
    """The chassis' power from its Sensors collection: its Chassis power sensor (the ``Total`` one first),
    else the sum of its power supplies' inputs (every one must read), else an HPE Cray EX node's input
    regulator; None when none reads. ``known`` holds the sensors found last time (read alone, not the whole
    collection again) and is filled with those found now."""
    if known:
        readings = [(get(path) or {}).get("Reading") for path in known]
        values = [_number(r) for r in readings]
        if values and None not in values:
            return sum(v for v in values if v is not None)
        known.clear()  # gone or not reading: look through the collection again
    found: dict[str, list[tuple[str, dict[str, Any]]]] = {"chassis": [], "supply": [], "input": []}
    for path in _members(get(sensors_path))[:MAX_SENSORS_LOOKED_AT]:
        sensor = get(path)
        kind = _sensor_kind(sensor) if isinstance(sensor, dict) else None
        if kind is not None:
            found[kind].append((path, sensor))  # type: ignore[arg-type]
    chassis = sorted(found["chassis"], key=lambda item: item[1].get("ElectricalContext") != "Total")
    for path, sensor in chassis:
        watts = _number(sensor.get("Reading"))
        if watts is not None:
            known[:] = [path]
            return watts
    supplies = found["supply"]
    values = [_number(sensor.get("Reading")) for _, sensor in supplies]
    if supplies and len(supplies) <= MAX_POWER_SUPPLIES and None not in values:
        known[:] = [path for path, _ in supplies]
        return sum(v for v in values if v is not None)
    for path, sensor in found["input"]:
        watts = _number(sensor.get("Reading"))
        if watts is not None:
            known[:] = [path]
            return watts
    return None


def _power_supplies_watts(get: Get, subsystem_path: str) -> float | None:
    """The sum of every power supply's input power; None unless each one reads."""
    supplies = _members(get(_link(get(subsystem_path), "PowerSupplies") or f"{subsystem_path}/PowerSupplies"))
    if not supplies or len(supplies) > MAX_POWER_SUPPLIES:
        return None
    total = 0.0
    for path in supplies:
        metrics = _link(get(path), "Metrics")
        power = (get(metrics) or {}).get("InputPowerWatts") if metrics else None
        watts = _number(power.get("Reading")) if isinstance(power, dict) else None
        if watts is None:
            return None  # a supply that does not read: a sum of the others would be too low
        total += watts
    return total


class RedfishPower:
    """Reads the chassis' power through one Redfish client (kept for the agent's life: one connection)."""

    def __init__(self, settings: BmcSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._clock = clock
        self._client: Any = None
        self._chassis: str | None = None
        self._sensors: list[str] = []  # the chassis' power sensors, once found: read alone after that
        self._deadline_at = 0.0
        self._deadline: outbound.Deadline | None = None

    def read(self) -> tuple[float, str]:
        """(watts, resource) within the settings' deadline, or BmcDown with the reason."""
        self._deadline_at = self._clock() + self._settings.deadline_seconds
        with outbound.Deadline(self._settings.deadline_seconds) as self._deadline:
            if self._chassis is None:
                self._chassis = find_chassis(self._get, self._settings.chassis)
            try:
                return chassis_power(self._get, self._chassis, self._sensors)
            except BmcDown:
                self._chassis = None  # the BMC's firmware may have changed: look for the chassis again
                self._sensors.clear()
                raise

    def close(self) -> None:
        if self._client is not None:
            self._client.logout()  # no session to end (basic auth): closes the connection pool

    def _get(self, path: str) -> dict[str, Any] | None:
        left = self._deadline_at - self._clock()
        if left <= 0:
            raise BmcDown(f"no answer within {self._settings.deadline_seconds:g} s")
        client = self._redfish()
        try:
            response = client.get(path, timeout=left, max_retry=0)
        except BmcDown:
            raise
        except Exception as exc:
            reason = _failure(exc, self._settings)
            if self._cut_by_deadline() and not reason.startswith("no answer within"):
                reason = f"no answer within {self._settings.deadline_seconds:g} s"  # its sockets were shut: that is why
            raise BmcDown(reason) from None
        if response.status == 404:
            return None
        if response.status in (401, 403):
            raise BmcRefused(f"the BMC refused the credentials (HTTP {response.status} on {path})")
        if response.status != 200:
            raise BmcDown(f"the BMC answered HTTP {response.status} on {path}")
        try:
            document = response.dict
        except Exception:
            raise BmcDown(f"the BMC answered {path} with no JSON") from None
        if not isinstance(document, dict):
            raise BmcDown(f"the BMC answered {path} with no JSON object")
        return document

    def _redfish(self) -> Any:
        if self._client is None:
            import redfish  # the agent's dependency, loaded only where a BMC is configured

            # It logs every request at INFO ("Attempt 1 of …"): three lines a heartbeat in the agent's log.
            logging.getLogger("redfish").setLevel(max(logging.WARNING, logging.getLogger("redfish").level))
            bound_redfish_logs()
            settings = self._settings
            # The library checks certificates only when given a CA file: the one named, else requests' own.
            ca_file = None
            if settings.verify_tls:
                import requests.certs

                ca_file = settings.ca_file or requests.certs.where()
            client = redfish.redfish_client(
                base_url=settings.redfish,
                cafile=ca_file,
                timeout=settings.deadline_seconds,
                max_retry=0,  # its default is 10 tries a second apart: the deadline is ours to keep
                check_connectivity=False,  # no read of the service root on every new client
            )
            # Basic authentication on each request: no Redfish session to create, keep alive and delete.
            token = base64.b64encode(f"{settings.username}:{settings.password}".encode()).decode()
            client.set_authorization_key(f"Basic {token}")
            # Its requests keep the read's one deadline (outbound.Deadline, in read()) at the socket.
            outbound.bound_session(client._session)
            # The client is built on requests, whose timeouts bound each wait but not the whole body: a
            # response hook (run before requests reads the body) reads it within the deadline and a size cap.
            client._session.hooks["response"].append(self._bounded_body)
            self._client = client
        return self._client

    def _cut_by_deadline(self) -> bool:
        return self._deadline is not None and self._deadline.expired

    def _cut_after(self, size: int) -> str:
        return f"no answer within {self._settings.deadline_seconds:g} s (cut after {size:,} bytes)"

    def _bounded_body(self, response: Any, *args: Any, **kwargs: Any) -> Any:
        length = response.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > MAX_ANSWER_BYTES:
            response.close()
            raise BmcDown(f"an answer of {int(length):,} bytes, more than {MAX_ANSWER_BYTES:,}")
        # What has arrived, up to a chunk (urllib3 2); an older urllib3 waits for a whole chunk, each wait
        # still bounded by the request's timeout.
        read = getattr(response.raw, "read1", None) or response.raw.read
        chunks: list[bytes] = []
        size = 0
        while True:
            if self._clock() > self._deadline_at:
                response.close()
                raise BmcDown(self._cut_after(size))
            try:
                chunk = read(_CHUNK_BYTES, decode_content=True)
            except Exception:
                if self._cut_by_deadline():  # its watchdog shut the socket under the read
                    response.close()
                    raise BmcDown(self._cut_after(size)) from None
                raise
            if not chunk:
                if self._cut_by_deadline():  # the watchdog's cut reads as the end of the stream
                    response.close()
                    raise BmcDown(self._cut_after(size))
                break
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                response.close()
                raise BmcDown(f"an answer larger than {MAX_ANSWER_BYTES:,} bytes")
            chunks.append(chunk)
        # What requests would have read itself; set before it does, so it reads nothing more.
        response._content = b"".join(chunks)
        response._content_consumed = True
        return response


def _failure(exc: BaseException, settings: BmcSettings) -> str:
    """One line on why a request failed: the cause under the client's own wrapper."""
    chain = [exc]
    while len(chain) < 10 and (chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)  # type: ignore[arg-type]
    for link in chain:
        if isinstance(link, BmcDown):  # raised by our own bound on the body, wrapped by the client
            return str(link)
    cause = chain[-1]
    name = type(cause).__name__
    if "Timeout" in name or isinstance(cause, TimeoutError):
        return f"no answer within {settings.deadline_seconds:g} s"
    if "SSL" in name or "Certificate" in str(cause):
        return f"the BMC's TLS certificate was not accepted ({str(cause)[:160]}); verify_tls: false for a self-signed one"
    if "Connection" in name:
        return f"cannot connect to {settings.redfish} ({name})"
    return f"{name}: {str(cause)[:200]}"


class BmcPower:
    """The BMC as a power source: one read at a time in a worker thread, never waited on by a heartbeat."""

    def __init__(
        self,
        settings: BmcSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        source: Callable[[], tuple[float, str]] | None = None,
    ) -> None:
        """``source`` reads (watts, resource) or raises BmcDown; by default, RedfishPower on the settings."""
        self._settings = settings
        self._clock = clock
        self._redfish = RedfishPower(settings, clock) if source is None else None
        self._source = source or self._redfish.read  # type: ignore[union-attr]
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._started_at = 0.0
        self._outcome: dict[str, Any] | None = None  # the last read's sensors, once one ended
        self._said: str | None = None  # the state last logged, so a change is logged once
        # Credentials refused: no read before retry_at; the wait doubles with each refusal in a row.
        self._refused_wait = 0.0
        self._retry_at = 0.0

    def sensors(self) -> dict[str, Any]:
        """What the heartbeat's sensors say of the BMC now (nothing before the first read ended), and a
        new read started for the next heartbeat unless one is still under way."""
        with self._lock:
            running = self._worker is not None and self._worker.is_alive()
            now = self._clock()
            if running and now - self._started_at > self._settings.deadline_seconds:
                self._outcome = _down(f"no answer within {self._settings.deadline_seconds:g} s")
            outcome = self._outcome
            waiting = self._retry_at - now
            if not running and waiting <= 0:
                self._start()
        if outcome is None:
            return {}
        self._log(outcome)
        if waiting > 0 and outcome["bmc"]["state"] == "down":
            # Said on the node page: when the BMC is asked again, so nobody waits on a fixed password.
            reason = (
                f"{outcome['bmc']['reason']}; asked again in {_duration(waiting)} (the wait doubles while "
                f"refused, up to {_duration(REFUSED_LONGEST_WAIT_SECONDS)})"
            )
            return _down(reason)
        if outcome["bmc"].get("resource") not in (None, *BMC_RESOURCES):
            return {**outcome, "bmc": {"state": outcome["bmc"]["state"]}}  # a resource the protocol does not name
        return dict(outcome)

    def wait(self) -> None:
        """Wait for the read under way, up to the deadline (``--once``: its one heartbeat has the BMC's figure)."""
        worker = self._worker
        if worker is not None:
            worker.join(self._settings.deadline_seconds)

    def close(self) -> None:
        worker = self._worker
        if self._redfish is not None and (worker is None or not worker.is_alive()):
            try:
                self._redfish.close()
            except Exception:
                log.debug("closing the Redfish client failed", exc_info=True)

    def _start(self) -> None:
        started = self._clock()

        def work() -> None:
            refused = False
            try:
                watts, resource = self._source()
            except BmcRefused as exc:
                outcome, refused = _down(str(exc)), True
            except BmcDown as exc:
                outcome = _down(str(exc))
            except Exception as exc:  # a bug or a library's surprise: the BMC is down, the agent goes on
                log.debug("reading the BMC failed", exc_info=True)
                outcome = _down(f"{type(exc).__name__}: {str(exc)[:200]}")
            else:
                took = self._clock() - started
                if took > self._settings.deadline_seconds:
                    outcome = _down(f"answered after {took:.1f} s, more than {self._settings.deadline_seconds:g} s")
                else:
                    outcome = {
                        "node_power_watts": round(watts, 1),
                        "power_source": "bmc",
                        "bmc": {"state": "up", "resource": resource},
                    }
            with self._lock:
                if self._worker is threading.current_thread():
                    self._outcome = outcome
                    if refused:
                        self._refused_wait = min(
                            REFUSED_LONGEST_WAIT_SECONDS, self._refused_wait * 2 or REFUSED_FIRST_WAIT_SECONDS
                        )
                        self._retry_at = self._clock() + self._refused_wait
                    else:
                        self._refused_wait = self._retry_at = 0.0

        self._started_at = started
        self._worker = threading.Thread(target=work, name="llmgw-bmc", daemon=True)
        self._worker.start()

    def _log(self, outcome: dict[str, Any]) -> None:
        bmc = outcome["bmc"]
        said = bmc.get("reason") or bmc["state"]
        if said == self._said:
            return
        self._said = said
        if bmc["state"] == "up":
            log.info("BMC %s: chassis power %g W (%s)", self._settings.redfish, outcome["node_power_watts"], bmc["resource"])
        else:
            log.warning("BMC %s down: %s; the node's draw is its GPUs' and CPUs' readings", self._settings.redfish, bmc["reason"])


def _duration(seconds: float) -> str:
    """``45 s``, ``2 min``, ``1 min 30 s``."""
    whole = max(1, math.ceil(seconds))
    if whole < 60:
        return f"{whole} s"
    minutes, rest = divmod(whole, 60)
    return f"{minutes} min {rest} s" if rest else f"{minutes} min"


def _down(reason: str) -> dict[str, Any]:
    # One line, and any other control character written as its escape: the protocol refuses them.
    return {"bmc": {"state": "down", "reason": carried_text(" ".join(reason.split()), MAX_BMC_REASON_LENGTH)}}
