"""`llmgw agent`: the daemon on each GPU node — heartbeats out, assigned replicas in.

Pure: no Django. Every interval the agent reads its sensors, posts a heartbeat (inventory,
labels, sensors, replica states) to the control plane and hands the answer's replicas to the
runtime; between beats it polls the runtime. A control plane that does not answer is retried
with backoff and jitter, so ten thousand nodes do not all come back in the same second.

Kept in one module: the heartbeat loop, its backoff and the command line that starts it are the
agent's one entry point; the sensors and the runtime live in their own modules.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import httpx

from agents.node.config import (
    MAX_INTERVAL_SECONDS,
    AgentConfig,
    AgentConfigError,
    default_config,
    load_config,
)
from agents.node.protocol import HeartbeatError, validate_capping
from agents.node.runtime import Runtime
from llmgw import outbound

logger = logging.getLogger("llmgw.agent")

AGENT_VERSION = "0.1.0"
# An outage's retries grow to this many intervals and no further.
BACKOFF_CAP_INTERVALS = 6
REPLICA_FIELDS = ("id", "state", "port", "restarts", "message")
# The most of the control plane's answer read: it lists the node's replicas, at most 1,024 of them.
MAX_ANSWER_BYTES = 8 * 1024 * 1024


class AnswerTooLarge(httpx.TransportError):
    """The control plane's answer passed MAX_ANSWER_BYTES: not read further."""


class Reader(Protocol):
    """What the agent needs from agents.node.sensors.SensorReader."""

    def inventory(self) -> dict: ...
    def read(self) -> dict: ...
    def close(self) -> None: ...
    # Optional: `apply_capping(capping: Capping | None)`, GPU capping (agents.node.sensors.SensorReader).


class PowerSource(Protocol):
    """What the agent needs from agents.node.sensors.bmc.BmcPower: its sensors now, never waited on."""

    def sensors(self) -> dict: ...
    def wait(self) -> None: ...
    def close(self) -> None: ...


class StopSignal(Protocol):
    """threading.Event's two methods the loop uses."""

    def is_set(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> bool: ...


def _number(value: float) -> float | int:
    # 10.0 goes out as 10: the control plane keeps whole seconds.
    return int(value) if float(value).is_integer() else value


def build_heartbeat(
    config: AgentConfig, reader: Reader, runtime: Runtime | None, bmc: PowerSource | None = None
) -> dict:
    """The heartbeat body: who this node is, what it holds, what its sensors read, its replicas.

    A sensor reader that fails leaves its part empty: the heartbeat still goes out, since a node
    that stops beating over a bad reading would be taken for dead. The BMC (agent.yaml bmc:) adds the
    chassis' power from its last read, which ended before this heartbeat or is reported down.
    """
    try:
        inventory = dict(reader.inventory())
    except Exception:
        logger.exception("reading the inventory failed; sending the heartbeat without it")
        inventory = {}
    if config.fabric:
        inventory["fabric"] = config.fabric
    try:
        sensors = dict(reader.read())
    except Exception:
        logger.exception("reading the sensors failed; sending the heartbeat without them")
        sensors = {}
    if bmc is not None:
        try:
            sensors.update(bmc.sensors())
        except Exception:
            logger.exception("reading the BMC failed; sending the heartbeat without it")
    replicas = []
    if runtime is not None:
        replicas = [{key: state[key] for key in REPLICA_FIELDS} for state in runtime.states()]
        throughput = runtime.throughput()
        if throughput:
            # In the sensors, not the replica states: it changes every beat, and the states are part of
            # the heartbeat's fingerprint (a change there takes the control plane's slow path).
            sensors["replicas"] = throughput
    return {
        "node": config.node,
        "agent_version": AGENT_VERSION,
        "interval_seconds": _number(config.interval_seconds),
        "inventory": inventory,
        "labels": dict(config.labels),
        "sensors": sensors,
        "replicas": replicas,
    }


def server_message(response: httpx.Response) -> str:
    """What the control plane said about a refused heartbeat, in one line."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(body, dict) and set(body) == {"detail"}:
        return str(body["detail"])
    return json.dumps(body, sort_keys=True)[:500]


class Agent:
    """One node's heartbeat loop: send, apply the answer, back off while the server is away."""

    def __init__(
        self,
        config: AgentConfig,
        reader: Reader,
        runtime: Runtime,
        *,
        client: httpx.Client | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        bmc: PowerSource | None = None,
    ) -> None:
        if not config.server or not config.token:
            raise ValueError("the agent needs a server and a token to send heartbeats")
        self.config = config
        self.reader = reader
        self.runtime = runtime
        self.bmc = bmc
        self.interval = config.interval_seconds
        self.failures = 0  # heartbeats in a row the server did not answer (or answered 5xx)
        self._rng = rng or random.Random()
        self._clock = clock
        self._problem: str | None = None
        self._capping_problem: str | None = None
        self._warnings = ""  # the last answer's warnings, logged when they change
        # One deadline for a whole heartbeat: connect, the request, the answer's status line, headers and body.
        self.deadline_seconds = min(MAX_INTERVAL_SECONDS, max(2.0, config.interval_seconds))
        self._client = client or outbound.client(headers={"User-Agent": f"llmgw-agent/{AGENT_VERSION}"})

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def send(self, body: dict) -> httpx.Response:
        """POST one heartbeat and read its answer whole; raises httpx.HTTPError when the server cannot be
        reached, or passes the deadline or MAX_ANSWER_BYTES.

        A timeout per wait bounds nothing against a server (or a proxy) that sends its answer a byte at a
        time: one deadline covers the whole call — connect, the request, the status line, the headers and
        the body (llmgw.outbound keeps it at the socket) — so a heartbeat never waits past it.
        """
        seconds = self.deadline_seconds
        with outbound.Deadline(seconds) as deadline:
            request = self._client.build_request(
                "POST", self.config.heartbeat_url, json=body, headers={"Authorization": f"Token {self.config.token}"},
                timeout=httpx.Timeout(seconds),
            )
            try:
                response = self._client.send(request, stream=True)
                try:
                    stream = response.iter_bytes()  # as it arrives, decoded: the cap counts what is kept
                    content = outbound.read_within(
                        lambda _: next(stream, b""), deadline_at=deadline.at, max_bytes=MAX_ANSWER_BYTES,
                        what="the control plane's answer",
                    )
                finally:
                    response.close()
            except (httpx.HTTPError, outbound.OutboundError) as exc:
                # Every wait is held to what is left of the deadline: a timeout is the deadline's.
                if deadline.left() <= 0 or isinstance(exc, httpx.TimeoutException):
                    raise httpx.ReadTimeout(f"no answer within {seconds:g} s", request=request) from None
                if isinstance(exc, outbound.OutboundError):
                    raise AnswerTooLarge(str(exc), request=request) from None
                raise
        # Decoded already: the answer as read, less the headers that describe its encoding on the wire.
        headers = [
            (key, value) for key, value in response.headers.multi_items()
            if key.lower() not in ("content-encoding", "content-length", "transfer-encoding")
        ]
        return httpx.Response(response.status_code, headers=headers, content=content, request=request)

    def beat(self) -> float:
        """Send one heartbeat and apply its answer; returns the seconds to wait before the next.

        Never raises: a heartbeat that fails is logged (once per change of what went wrong)
        and retried.
        """
        # The interval in force, which the control plane may have changed, is the one it must
        # count missed heartbeats against.
        config = dataclasses.replace(self.config, interval_seconds=self.interval)
        body = build_heartbeat(config, self.reader, self.runtime, self.bmc)
        url = self.config.heartbeat_url
        try:
            response = self.send(body)
        except AnswerTooLarge as exc:
            return self._outage(f"{url}: {exc}")
        except httpx.HTTPError as exc:
            return self._outage(f"cannot reach {url} ({type(exc).__name__}: {exc})")
        if response.status_code >= 500:
            return self._outage(f"{url} answered {response.status_code} {response.reason_phrase}")
        if response.status_code >= 400:
            self._recovered()
            self._report(
                f"refused:{response.status_code}:{server_message(response)}",
                logging.ERROR,
                f"heartbeat refused by {url} ({response.status_code}): {server_message(response)}",
            )
            return self.interval
        self._recovered()
        if self._apply(response):
            self._problem = None
        return self.interval

    def run(self, stop: StopSignal, *, poll_seconds: float = 0.5) -> None:
        """Beat every interval and poll the runtime in between, until `stop` is set."""
        next_beat = self._clock()
        while not stop.is_set():
            self._poll_runtime()
            if self._clock() >= next_beat:
                started = self._clock()
                try:
                    wait = self.beat()
                except Exception:
                    # A bug here must not end the agent: the node would look dead and its replicas
                    # would run unwatched.
                    logger.exception("heartbeat failed unexpectedly; trying again after the interval")
                    wait = self.interval
                next_beat = started + wait
            stop.wait(max(0.0, min(poll_seconds, next_beat - self._clock())))

    # -- the parts ---------------------------------------------------------------------------

    def backoff_seconds(self) -> float:
        """The wait after the `failures`-th failed heartbeat in a row: doubling, capped, jittered."""
        cap = self.interval * BACKOFF_CAP_INTERVALS
        # The exponent is bounded: a float overflows after ~1000 doublings, a week-long outage.
        delay = min(self.interval * 2 ** min(self.failures - 1, 30), cap)
        # Jitter downwards only, so the cap holds; spread keeps a fleet from retrying in step.
        return delay * self._rng.uniform(0.5, 1.0)

    def _outage(self, what: str) -> float:
        self.failures += 1
        cap = self.interval * BACKOFF_CAP_INTERVALS
        # The problem's kind is the state, not its text: a timeout after a refused connection is
        # the same outage and is not logged again.
        kind = "unreachable" if what.startswith("cannot reach") else what
        self._report(kind, logging.WARNING, f"heartbeat: {what}; retrying with backoff (up to {cap:g} s)")
        return self.backoff_seconds()

    def _recovered(self) -> None:
        if self.failures:
            logger.warning(
                "heartbeat: %s answered again after %d failed tries", self.config.server, self.failures
            )
        self.failures = 0
        if self._problem is not None and not self._problem.startswith(("refused:", "bad-answer")):
            self._problem = None

    def _report(self, kind: str, level: int, message: str) -> None:
        if kind != self._problem:
            logger.log(level, "%s", message)
        self._problem = kind

    def _apply(self, response: httpx.Response) -> bool:
        """Take the answer's interval and replicas; False when the answer made no sense."""
        try:
            answer = response.json()
        except ValueError:
            self._report(
                "bad-answer", logging.ERROR, "heartbeat answer is not JSON; keeping the replicas as they are"
            )
            return False
        if not isinstance(answer, dict):
            self._report(
                "bad-answer", logging.ERROR, "heartbeat answer is not an object; keeping the replicas"
            )
            return False
        interval = answer.get("interval_seconds")
        if (
            isinstance(interval, int | float)
            and not isinstance(interval, bool)
            and math.isfinite(interval)
            and 0 < interval <= MAX_INTERVAL_SECONDS
            and interval != self.interval
        ):
            logger.info("heartbeat interval set to %g s by the control plane", interval)
            self.interval = float(interval)
        self._answer_warnings(answer.get("warnings"))
        self._apply_capping(answer.get("capping"))
        replicas = answer.get("replicas")
        if not isinstance(replicas, list):
            self._report(
                "bad-answer", logging.ERROR, "heartbeat answer has no replicas list; keeping the replicas"
            )
            return False
        try:
            self.runtime.sync(replicas)
        except Exception:
            logger.exception("applying the assigned replicas failed; will try again with the next answer")
        return True

    def _answer_warnings(self, raw: object) -> None:
        """What the control plane did not take of the heartbeat (readings more than the node can draw):
        logged once per change, not every beat."""
        text = "; ".join(w for w in raw if isinstance(w, str)) if isinstance(raw, list) else ""
        if text and text != self._warnings:
            logger.warning("heartbeat answer: %s", text)
        self._warnings = text

    def _apply_capping(self, raw: object) -> None:
        """Hold the GPUs at the answer's capping block (their defaults when it has none).

        A block that breaks the protocol changes nothing: the GPUs keep what they hold.
        """
        apply = getattr(self.reader, "apply_capping", None)
        if apply is None:
            return
        try:
            capping = validate_capping(raw)
        except HeartbeatError as exc:
            if exc.message != self._capping_problem:  # said once, not every beat
                logger.error("heartbeat answer: %s; GPU capping unchanged", exc.message)
            self._capping_problem = exc.message
            return
        self._capping_problem = None
        try:
            apply(capping)
        except Exception:
            logger.exception("applying the GPU capping failed; will try again with the next answer")

    def _poll_runtime(self) -> None:
        try:
            self.runtime.poll()
        except Exception:
            logger.exception("polling the replicas failed")


class _StopFlag:
    """Set from a signal handler. Unlike threading.Event it takes no lock in `set`, so a signal
    landing while the loop waits cannot deadlock on the lock the loop holds."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        deadline = time.monotonic() + (timeout or 0.0)
        while not self._set and time.monotonic() < deadline:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        return self._set


HELP = """\
Run on each GPU node: every interval (at most 10 s) post a heartbeat to the control plane —
inventory (GPUs from NVML, cores, memory), labels, sensors (GPU temperatures, power and
throttling; CPU temperature and package power; the board's inlet air), the state of the
replicas it runs — and run the replicas the answer assigns.

examples:
  llmgw agent --config /etc/llmgw/agent.yaml
      run forever (SIGTERM or Ctrl-C stops the replicas and exits 0)
  llmgw agent --once --dry-run
      check a new machine: read the sensors and print the heartbeat it would send, send nothing
  llmgw agent --once --dry-run --sys-root /srv/fixtures/xeon
      the same, reading another tree in place of / (its sys/ and proc/)
  llmgw agent --once --config agent.yaml
      send one heartbeat (with no replicas) and print the answer

agent.yaml:
  server: https://llmgw.example.net     node: gpu01     token_file: /etc/llmgw/token
  interval_seconds: 10                  fabric: ib-a
  labels: {llmgw.io/rack: r12-07, llmgw.io/pdu: "r12-07-a,r12-07-b"}
  runtime: {port_range: [8100, 8199], grace_seconds: 30, health_path: /health,
            workdir: /var/lib/llmgw, restart_backoff_seconds: 1, restart_backoff_max_seconds: 300}
  bmc: {redfish: https://10.0.0.17, credentials_file: /etc/llmgw/bmc, verify_tls: true, chassis: 1U}
      the node's draw from its BMC (Redfish) in place of GPU + CPU readings; down: back to them

A sensor the machine lacks is left out of the heartbeat, never sent as 0. A control plane that
does not answer is retried with backoff (up to 6 intervals, with jitter); a refused heartbeat
(4xx) is logged with the server's reason and the agent goes on.
"""


def build_parser() -> argparse.ArgumentParser:
    """The `llmgw agent` command line."""
    parser = argparse.ArgumentParser(
        prog="llmgw agent", description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", metavar="FILE", help="agent.yaml (required unless --once --dry-run)")
    parser.add_argument("--once", action="store_true", help="send one heartbeat, print the answer, exit")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="with --once: print the heartbeat as JSON instead of sending it (implies --once)",
    )
    parser.add_argument(
        "--sys-root",
        metavar="DIR",
        help="read DIR in place of /sys (or, when DIR holds sys/ and proc/, in place of /): fixture trees; "
        "overrides sys_root in agent.yaml",
    )
    parser.add_argument(
        "--sample-seconds",
        type=float,
        default=1.0,
        metavar="S",
        help="with --once: read the sensors twice S seconds apart, since CPU power (RAPL) needs two "
        "reads (default 1.0; 0 skips CPU power)",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"), help="default INFO"
    )
    return parser


def machine_root(path: str) -> str:
    """The root holding sys/ and proc/: DIR itself, or its parent when DIR is a sys tree (has class/)."""
    if not os.path.isdir(os.path.join(path, "sys")) and os.path.isdir(os.path.join(path, "class")):
        return os.path.dirname(os.path.abspath(path.rstrip("/"))) or "/"
    return path


def _default_reader(sys_root: str) -> Reader:
    from agents.node.sensors import SensorReader  # NVML is loaded only when sensors are read

    return SensorReader(sys_root=machine_root(sys_root))


def main(argv: Sequence[str], *, reader_factory: Callable[[str], Reader] | None = None) -> int:
    """`llmgw agent ...`; returns the exit status. `reader_factory(sys_root)` replaces the sensors."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:  # --help, or a usage error already printed
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    if args.sample_seconds < 0:
        print("llmgw agent: --sample-seconds must be 0 or more", file=sys.stderr)
        return 2
    if args.dry_run:
        args.once = True
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=args.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )

    try:
        if args.config and args.dry_run:
            config = _dry_run_config(args.config)
        elif args.config:
            config = load_config(args.config)
        elif args.dry_run:
            config = default_config()
        else:
            print(
                "llmgw agent: --config FILE is required (only --once --dry-run runs without one)",
                file=sys.stderr,
            )
            return 2
    except AgentConfigError as exc:
        print(f"llmgw agent: {exc}", file=sys.stderr)
        return 2
    sys_root = args.sys_root or config.sys_root
    if not os.path.isdir(sys_root):
        print(f"llmgw agent: --sys-root {sys_root!r} is not a directory", file=sys.stderr)
        return 2

    reader = (reader_factory or _default_reader)(sys_root)
    bmc = _bmc(config)
    try:
        if args.dry_run and not args.config:
            config = dataclasses.replace(config, node=_hostname(reader) or config.node)
        if args.once:
            return _once(config, reader, dry_run=args.dry_run, sample_seconds=args.sample_seconds, bmc=bmc)
        return _forever(config, reader, bmc=bmc)
    finally:
        try:
            reader.close()
            if bmc is not None:
                bmc.close()
        except Exception:
            logger.exception("closing the sensor reader failed")


def _dry_run_config(path: str) -> AgentConfig:
    """agent.yaml for a dry run, which sends nothing: a token it cannot have yet (a new machine, its
    token_file not written) is said on stderr, not refused; anything else wrong is refused as ever."""
    try:
        return load_config(path)
    except AgentConfigError as exc:
        config = load_config(path, need_token=False)  # refused again here when the token was not all
        print(f"llmgw agent: {exc} (a dry run sends nothing and needs no token)", file=sys.stderr)
        return config


def _bmc(config: AgentConfig) -> PowerSource | None:
    if config.bmc is None:
        return None
    from agents.node.sensors.bmc import BmcPower  # the Redfish client is loaded only where a BMC is set

    return BmcPower(config.bmc)


def _hostname(reader: Reader) -> str | None:
    # The machine being read names the node: with --sys-root, that is the tree's host, not ours.
    try:
        hostname = reader.inventory().get("hostname")
    except Exception:
        return None
    return hostname if isinstance(hostname, str) and hostname else None


def _once(
    config: AgentConfig, reader: Reader, *, dry_run: bool, sample_seconds: float, bmc: PowerSource | None = None
) -> int:
    if bmc is not None:
        # One heartbeat only: it waits for the BMC's first read (within its deadline), as a loop's next beat would.
        bmc.sensors()
        bmc.wait()
    if sample_seconds > 0:
        # The first read primes the RAPL counters; the heartbeat's own read gives CPU power.
        try:
            reader.read()
        except Exception:
            logger.exception("reading the sensors failed")
        time.sleep(sample_seconds)
    if dry_run:
        print(json.dumps(build_heartbeat(config, reader, None, bmc), indent=2))
        return 0
    agent = Agent(config, reader, Runtime(config.runtime))
    try:
        response = agent.send(build_heartbeat(config, reader, None, bmc))
    except httpx.HTTPError as exc:
        print(f"llmgw agent: cannot reach {config.heartbeat_url}: {exc}", file=sys.stderr)
        return 1
    finally:
        agent.close()
    if response.status_code >= 400:
        print(
            f"llmgw agent: heartbeat refused ({response.status_code}): {server_message(response)}",
            file=sys.stderr,
        )
        return 1
    try:
        print(json.dumps(response.json(), indent=2))
    except ValueError:
        print(response.text)
    return 0


def _forever(config: AgentConfig, reader: Reader, *, bmc: PowerSource | None = None) -> int:
    runtime = Runtime(config.runtime)
    agent = Agent(config, reader, runtime, bmc=bmc)
    stop = _StopFlag()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, lambda *_: stop.set())
    logger.info(
        "agent for node %s: heartbeats to %s every %g s",
        config.node,
        config.heartbeat_url,
        config.interval_seconds,
    )
    try:
        agent.run(stop)
        logger.info("stopping: replicas get SIGTERM, SIGKILL after %g s", config.runtime.grace_seconds)
    finally:
        runtime.shutdown()
        agent.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
