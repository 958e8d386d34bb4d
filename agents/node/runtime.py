"""The replica runtime: runs the replicas the control plane assigned to this node as processes.

Pure: no Django. Each replica is its profile's `command` template with `{model}`, `{port}`,
`{replica}` and `{gpus}` filled in, started in its own process group (a kill takes its children,
the tokenizer workers and the like, with it), with `CUDA_VISIBLE_DEVICES` set to its GPUs and a
free port from the range. Its state is one of:

- starting: spawned, its health URL not yet answering 200;
- ready: the health URL answered 200;
- stopping: sent SIGTERM (no longer assigned, or its command changed); SIGKILL after the grace;
- failed: exited on its own, or could not be started; restarted after a backoff that doubles
  with each failure in a row, up to restart_backoff_max_seconds.

The daemon calls `sync` with each heartbeat's answer and `poll` between beats; nothing here
sleeps or blocks beyond one short health request, except `shutdown`.

Kept in one module: the process group, its ports, its health and metrics checks and the state
machine above are one lifecycle; each part reads the others' state.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any, Protocol

from agents.node.config import RuntimeSettings
from agents.node.protocol import command_problem, health_path_problem, message_text

logger = logging.getLogger("llmgw.agent.runtime")

STATES = ("starting", "ready", "stopping", "failed")
HEALTH_TIMEOUT_SECONDS = 0.5

# Tokens per second: each ready replica's generated-token counter, read from its /metrics (Prometheus
# text format) at most every THROUGHPUT_SECONDS; the rate is taken between two reads.
DEFAULT_THROUGHPUT_METRIC = "vllm:generation_tokens_total"
METRICS_PATH = "/metrics"
THROUGHPUT_SECONDS = 5.0
METRICS_TIMEOUT_SECONDS = 0.5  # the whole read, not each socket call: a slow drip ends here too
METRICS_MAX_BYTES = 4 * 1024 * 1024  # a vLLM server's page is a few hundred KiB
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


class ReplicaProcess(Protocol):
    """A started replica as the runtime sees it; `spawn` returns one."""

    pid: int

    def poll(self) -> int | None:
        """The exit status once it has exited (negative: killed by that signal), else None."""

    def signal(self, signum: int) -> None:
        """Send a signal to the replica and every process it started."""


class ProcessGroup:
    """A real child process led in its own process group (started with a new session)."""

    def __init__(self, popen: subprocess.Popen[bytes], log_file: IO[bytes] | None = None) -> None:
        self._popen = popen
        self._log_file = log_file
        self.pid = popen.pid

    def poll(self) -> int | None:
        code = self._popen.poll()
        if code is not None and self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return code

    def signal(self, signum: int) -> None:
        # The group outlives its leader while children remain; ESRCH means nothing is left.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)


def spawn_process(
    args: list[str], env: dict[str, str], cwd: str | None, log_path: str | None
) -> ProcessGroup:
    """Start `args` in a new session; output goes to `log_path` when given, else to the agent's own."""
    log_file = open(log_path, "ab") if log_path else None  # ProcessGroup closes it when the replica exits
    try:
        popen = subprocess.Popen(
            args,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,
            close_fds=True,
        )
    except BaseException:
        if log_file is not None:
            log_file.close()
        raise
    return ProcessGroup(popen, log_file)


def http_health_check(port: int, path: str) -> bool:
    """Whether http://127.0.0.1:{port}{path} answers 200 now."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HEALTH_TIMEOUT_SECONDS)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def counter_value(text: str, metric: str) -> float | None:
    """The sum of every sample of `metric` in a Prometheus text page (all its label sets); None if absent.

    A small strict reader of the text format (prometheus_client is not among the agent's dependencies):
    a sample line is `name[{labels}] value [timestamp]`; label values are quoted and may hold escaped
    quotes, spaces and braces. A sample of that name that does not parse, or is not a finite number,
    makes the whole answer None rather than a wrong sum.
    """
    total: float | None = None
    for line in text.splitlines():
        if not line.startswith(metric):
            continue
        rest = line[len(metric):]
        if rest[:1] == "{":
            end = _labels_end(rest)
            if end is None:
                return None
            rest = rest[end:]
        elif rest[:1] not in (" ", "\t"):
            continue  # another metric whose name starts with this one
        parts = rest.split()
        if not 1 <= len(parts) <= 2:
            return None
        try:
            value = float(parts[0])
        except ValueError:
            return None
        if not math.isfinite(value) or value < 0:
            return None
        total = (total or 0.0) + value
    return total


def _labels_end(text: str) -> int | None:
    """The index just past the `{...}` that opens `text`, skipping quoted values; None if it never closes."""
    quoted = escaped = False
    for i, char in enumerate(text):
        if escaped:
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == "}" and not quoted:
            return i + 1
    return None


def http_counter(port: int, metric: str) -> float | None:
    """`metric`'s value from http://127.0.0.1:{port}/metrics, read within METRICS_TIMEOUT_SECONDS and
    METRICS_MAX_BYTES; None when it does not answer, answers too much or too slowly, or lacks the metric."""
    deadline = time.monotonic() + METRICS_TIMEOUT_SECONDS
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=METRICS_TIMEOUT_SECONDS)
    try:
        conn.request("GET", METRICS_PATH)
        response = conn.getresponse()
        if response.status != 200:
            return None
        chunks, size = [], 0
        while True:
            if time.monotonic() > deadline:
                return None
            chunk = response.read1(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > METRICS_MAX_BYTES:
                return None
            chunks.append(chunk)
        return counter_value(b"".join(chunks).decode("utf-8", errors="replace"), metric)
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def is_port_free(port: int) -> bool:
    """Whether a server could listen on `port` now (on every address, as model servers do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # A port in TIME_WAIT from a replica just stopped is free for a server using SO_REUSEADDR.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def exit_message(code: int) -> str:
    """How a person reads an exit status: `exited with status 3`, `killed by signal 9 (SIGKILL)`."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown"
        return f"killed by signal {-code} ({name})"
    return f"exited with status {code}"


@dataclass(frozen=True)
class ReplicaSpec:
    """What the control plane asked for; a change in any of these restarts the replica."""

    id: int
    model: str
    command: str
    gpus: tuple[int, ...]

    @classmethod
    def from_assignment(cls, entry: Mapping[str, Any]) -> ReplicaSpec:
        """One entry of the heartbeat answer's `replicas`; ValueError names what is wrong."""
        if not isinstance(entry, Mapping):
            raise ValueError(f"a replica is a mapping, got {entry!r}")
        try:
            replica_id = entry["id"]
            command = entry["command"]
        except KeyError as exc:
            raise ValueError(f"replica {entry.get('id', '?')}: {exc.args[0]} missing") from None
        if not isinstance(replica_id, int) or isinstance(replica_id, bool):
            raise ValueError(f"replica id must be an integer, got {replica_id!r}")
        if not isinstance(command, str) or not command.strip():
            raise ValueError(f"replica {replica_id}: command must be text, got {command!r}")
        gpus = entry.get("gpus") or []
        if not isinstance(gpus, list) or not all(
            isinstance(g, int) and not isinstance(g, bool) for g in gpus
        ):
            raise ValueError(f"replica {replica_id}: gpus must be a list of GPU indices, got {gpus!r}")
        return cls(id=replica_id, model=str(entry.get("model") or ""), command=command, gpus=tuple(gpus))


@dataclass
class _Replica:
    spec: ReplicaSpec
    state: str = "starting"
    port: int | None = None
    process: ReplicaProcess | None = None
    restarts: int = 0
    message: str = ""
    started_at: float = 0.0
    failures_in_a_row: int = 0
    restart_at: float | None = None  # failed: when to try again; None: never (a bad template)
    kill_at: float | None = None  # stopping: when SIGTERM's grace runs out
    killed: bool = False
    removed: bool = False  # stopping because no longer assigned: forget it once it is gone
    replacement: ReplicaSpec | None = None  # stopping because its spec changed: start this next
    # Throughput: the counter to read, its last value and when it was read, the rate between two reads.
    throughput_metric: str = DEFAULT_THROUGHPUT_METRIC
    health_path: str | None = None  # the profile's; None: the agent's runtime.health_path
    counter: tuple[float, float] | None = None  # (monotonic time, value)
    next_count_at: float = 0.0
    tokens_per_second: float | None = None


class Runtime:
    """The replicas this node runs, kept to what the last heartbeat answer assigned."""

    def __init__(
        self,
        settings: RuntimeSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        health_check: Callable[[int, str], bool] | None = None,
        spawn: Callable[[list[str], dict[str, str], str | None, str | None], ReplicaProcess] | None = None,
        port_free: Callable[[int], bool] | None = None,
        read_counter: Callable[[int, str], float | None] | None = None,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._health_check = health_check or http_health_check
        self._spawn = spawn or spawn_process
        self._port_free = port_free or is_port_free
        self._read_counter = read_counter or http_counter
        self._replicas: dict[int, _Replica] = {}

    # -- what the control plane asks --------------------------------------------------------

    def sync(self, assigned: list[dict]) -> None:
        """Run exactly the assigned replicas: start new ones, stop the others; same spec: nothing."""
        wanted: dict[int, ReplicaSpec] = {}
        metrics: dict[int, str] = {}
        health: dict[int, str | None] = {}
        for entry in assigned:
            try:
                spec = ReplicaSpec.from_assignment(entry)
            except ValueError as exc:
                # One malformed entry must not stop the others from running.
                logger.error("heartbeat answer: %s; that replica is skipped", exc)
                continue
            wanted[spec.id] = spec
            metrics[spec.id] = _throughput_metric(entry)
            health[spec.id] = _health_path(entry)

        for replica_id, replica in list(self._replicas.items()):
            if replica_id not in wanted:
                replica.replacement = None
                replica.removed = True
                if replica.process is None:
                    del self._replicas[replica_id]  # failed and waiting: nothing runs
                else:
                    self._stop(replica, "no longer assigned")

        for replica_id, spec in wanted.items():
            replica = self._replicas.get(replica_id)
            if replica is not None:
                replica.health_path = health[replica_id]  # read at the next check: not a restart
            if replica is not None and replica.throughput_metric != metrics[replica_id]:
                # Another counter: not a restart, but the rate starts over.
                replica.throughput_metric, replica.counter, replica.tokens_per_second = metrics[replica_id], None, None
            if replica is None:
                replica = _Replica(spec=spec, throughput_metric=metrics[replica_id], health_path=health[replica_id])
                self._replicas[replica_id] = replica
                self._start(replica)
                continue
            if replica.state == "stopping":
                # Assigned again while it stops: start what is assigned once the old one is gone.
                replica.removed = False
                replica.replacement = spec
                continue
            if replica.spec == spec:
                continue
            if replica.process is None:
                # Failed and waiting: nothing to stop, start the new command now.
                replica.spec = spec
                replica.failures_in_a_row = 0
                self._start(replica)
            else:
                replica.replacement = spec
                self._stop(replica, "its command, model or GPUs changed")

    def poll(self) -> None:
        """Health checks, crash detection, restarts after backoff, SIGKILL after the grace."""
        for replica in list(self._replicas.values()):
            now = self._clock()
            if replica.state in ("starting", "ready"):
                self._poll_running(replica, now)
                if replica.state == "ready":
                    self._poll_throughput(replica, now)
            elif replica.state == "stopping":
                self._poll_stopping(replica, now)
            elif replica.state == "failed":
                if replica.removed:
                    del self._replicas[replica.spec.id]
                elif replica.restart_at is not None and now >= replica.restart_at:
                    replica.restarts += 1
                    self._start(replica)

    def states(self) -> list[dict]:
        """Each replica's state, sent with every heartbeat, ordered by id."""
        return [
            {
                "id": r.spec.id,
                "state": r.state,
                "port": r.port,
                "pid": r.process.pid if r.process is not None else None,
                "restarts": r.restarts,
                # The heartbeat refuses a longer one (and with it the node's every report): a failure's
                # words quote the command, which may be longer.
                "message": message_text(r.message),
            }
            for r in sorted(self._replicas.values(), key=lambda r: r.spec.id)
        ]

    def throughput(self) -> list[dict]:
        """Each ready replica's generated tokens per second, where two reads of its counter are known."""
        return [
            {"id": r.spec.id, "tokens_per_second": round(r.tokens_per_second, 1)}
            for r in sorted(self._replicas.values(), key=lambda r: r.spec.id)
            if r.state == "ready" and r.tokens_per_second is not None
        ]

    def shutdown(self, *, sleep: Callable[[float], None] = time.sleep) -> None:
        """Stop every replica: SIGTERM, then SIGKILL after the grace; returns when all are gone."""
        for replica_id, replica in list(self._replicas.items()):
            replica.removed = True
            replica.replacement = None
            if replica.process is None:
                del self._replicas[replica_id]
            else:
                self._stop(replica, "the agent is shutting down")
        # The grace plus a moment for the kernel to reap what SIGKILL hit.
        deadline = self._clock() + self.settings.grace_seconds + 5.0
        while self._replicas and self._clock() < deadline:
            self.poll()
            if self._replicas:
                sleep(0.05)
        for replica in self._replicas.values():
            logger.error(
                "replica %s (pid %s) did not exit after SIGKILL",
                replica.spec.id,
                replica.process.pid if replica.process else "-",
            )

    # -- the steps --------------------------------------------------------------------------

    def _start(self, replica: _Replica) -> None:
        try:
            self._start_once(replica)
        except Exception as exc:
            # Whatever goes wrong starting one replica fails that replica (retried with backoff), never
            # the sync or poll that would start or check the others on the node.
            logger.exception("replica %s (%s): cannot start", replica.spec.id, replica.spec.model)
            replica.process = None
            self._fail(replica, self._clock(), f"cannot start: {type(exc).__name__}: {exc}", retry=True)

    def _start_once(self, replica: _Replica) -> None:
        spec = replica.spec
        now = self._clock()
        replica.process = None
        replica.kill_at = None
        replica.killed = False
        replica.counter, replica.tokens_per_second, replica.next_count_at = None, None, 0.0
        port = replica.port if replica.port is not None and self._port_usable(replica.port, spec.id) else None
        if port is None:
            port = self._free_port(spec.id)
        if port is None:
            low, high = self.settings.port_range
            self._fail(replica, now, f"no free port in {low}-{high}", retry=True)
            return
        replica.port = port
        gpus = ",".join(str(g) for g in spec.gpus)
        # A bad template will not get better by retrying: wait for a new assignment. The control plane
        # refuses one, but an assignment is checked here too (a server of another version, a row written
        # before the check): one replica's template fails that replica, never the others on the node.
        problem = command_problem(spec.command)
        if problem is None:
            try:
                args = shlex.split(spec.command.format(model=spec.model, port=port, replica=spec.id, gpus=gpus))
            except ValueError as exc:  # an unclosed quote
                problem = str(exc)
        if problem is not None:
            self._fail(replica, now, f"command template {spec.command!r}: {problem}", retry=False)
            return
        if not args:
            self._fail(replica, now, "the command is empty", retry=False)
            return
        env = dict(os.environ)
        # Number CUDA's devices the way NVML and the control plane do (PCI bus order), not
        # fastest-first, so GPU 3 here is the GPU 3 the agent reported.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = gpus  # empty for a CPU replica: it sees no GPU at all
        env["LLMGW_REPLICA_ID"] = str(spec.id)
        env["LLMGW_PORT"] = str(port)
        workdir = self.settings.workdir
        log_path = os.path.join(workdir, f"replica-{spec.id}.log") if workdir else None
        try:
            replica.process = self._spawn(args, env, workdir, log_path)
        except OSError as exc:
            # A missing binary may be installed later: retry with backoff.
            self._fail(replica, now, f"cannot start {args[0]!r}: {exc.strerror or exc}", retry=True)
            return
        replica.state = "starting"
        replica.started_at = now
        replica.restart_at = None
        logger.info(
            "replica %s (%s): started pid %s on port %s, GPUs [%s]",
            spec.id,
            spec.model,
            replica.process.pid,
            port,
            gpus,
        )

    def _poll_running(self, replica: _Replica, now: float) -> None:
        assert replica.process is not None
        code = replica.process.poll()
        if code is not None:
            # Children of a crashed server may still hold the port or the GPUs.
            replica.process.signal(signal.SIGKILL)
            if now - replica.started_at >= self.settings.restart_backoff_max_seconds:
                replica.failures_in_a_row = 0  # it ran well for a while: start the backoff over
            self._fail(replica, now, exit_message(code), retry=True)
            return
        if replica.state == "starting" and replica.port is not None:
            if self._health_check(replica.port, replica.health_path or self.settings.health_path):
                replica.state = "ready"
                replica.message = ""
                logger.info(
                    "replica %s (%s): ready on port %s", replica.spec.id, replica.spec.model, replica.port
                )

    def _poll_throughput(self, replica: _Replica, now: float) -> None:
        if now < replica.next_count_at or replica.port is None:
            return
        replica.next_count_at = now + THROUGHPUT_SECONDS
        value = self._read_counter(replica.port, replica.throughput_metric)
        if value is None:
            # Not answering, or no such counter (not every server has one): unknown, never 0.
            replica.counter, replica.tokens_per_second = None, None
            return
        previous, replica.counter = replica.counter, (now, value)
        if previous is None or now <= previous[0]:
            return
        # A counter lower than before was reset (the server restarted): it counted up from 0 since.
        increase = value - previous[1] if value >= previous[1] else value
        replica.tokens_per_second = increase / (now - previous[0])

    def _poll_stopping(self, replica: _Replica, now: float) -> None:
        process = replica.process
        code = process.poll() if process is not None else None
        if process is not None and code is None:
            if not replica.killed and replica.kill_at is not None and now >= replica.kill_at:
                logger.warning(
                    "replica %s: still running %.3g s after SIGTERM; sending SIGKILL",
                    replica.spec.id,
                    self.settings.grace_seconds,
                )
                process.signal(signal.SIGKILL)
                replica.killed = True
            return
        if process is not None and code is not None:
            process.signal(signal.SIGKILL)  # what the leader left behind in its group
            logger.info(
                "replica %s (%s): stopped, %s", replica.spec.id, replica.spec.model, exit_message(code)
            )
        replica.process = None
        if replica.removed:
            del self._replicas[replica.spec.id]
        else:
            if replica.replacement is not None:
                replica.spec = replica.replacement
                replica.replacement = None
            replica.failures_in_a_row = 0
            replica.message = ""
            self._start(replica)

    def _stop(self, replica: _Replica, why: str) -> None:
        if replica.process is None or replica.state == "stopping":
            return
        logger.info("replica %s (%s): stopping, %s", replica.spec.id, replica.spec.model, why)
        replica.state = "stopping"
        replica.message = why
        replica.process.signal(signal.SIGTERM)
        replica.kill_at = self._clock() + self.settings.grace_seconds

    def _fail(self, replica: _Replica, now: float, message: str, *, retry: bool) -> None:
        replica.state = "failed"
        replica.process = None
        replica.failures_in_a_row += 1
        if retry:
            delay = min(
                self.settings.restart_backoff_seconds * 2 ** min(replica.failures_in_a_row - 1, 30),
                self.settings.restart_backoff_max_seconds,
            )
            replica.restart_at = now + delay
            replica.message = message
            logger.warning(
                "replica %s (%s): %s; restarting in %.3g s",
                replica.spec.id,
                replica.spec.model,
                message,
                delay,
            )
        else:
            replica.restart_at = None
            replica.message = message
            logger.error(
                "replica %s (%s): %s; waiting for a new assignment",
                replica.spec.id,
                replica.spec.model,
                message,
            )

    # -- ports ------------------------------------------------------------------------------

    def _port_usable(self, port: int, replica_id: int) -> bool:
        taken = {r.port for r in self._replicas.values() if r.spec.id != replica_id}
        return port not in taken and self._port_free(port)

    def _free_port(self, replica_id: int) -> int | None:
        low, high = self.settings.port_range
        for port in range(low, high + 1):
            if self._port_usable(port, replica_id):
                return port
        return None


def _health_path(entry: Mapping[str, Any]) -> str | None:
    """The assignment's `health_path` (its profile's), or None (the agent's own) when absent or no path."""
    path = entry.get("health_path")
    if path is None:
        return None
    if isinstance(path, str) and health_path_problem(path) is None:
        return path
    logger.error("heartbeat answer: replica %s: health_path %r is not a URL path; checking the agent's own",
                 entry.get("id"), path)
    return None


def _throughput_metric(entry: Mapping[str, Any]) -> str:
    """The assignment's `throughput_metric` (its profile's), or the vLLM counter when absent or not a name."""
    metric = entry.get("throughput_metric")
    if metric is None:
        return DEFAULT_THROUGHPUT_METRIC
    if isinstance(metric, str) and METRIC_NAME.fullmatch(metric):
        return metric
    logger.error(
        "heartbeat answer: replica %s: throughput_metric %r is not a metric name; reading %s",
        entry.get("id"), metric, DEFAULT_THROUGHPUT_METRIC,
    )
    return DEFAULT_THROUGHPUT_METRIC


