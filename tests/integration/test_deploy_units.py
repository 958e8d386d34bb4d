"""The deployment units in deploy/, each checked by the program that reads it.

- systemd (deploy/systemd/): `systemd-analyze verify` prints nothing for any unit, `systemd-analyze
  security --offline` rates the control plane's units OK, the agent's unit keeps the GPUs' devices,
  `systemd-sysusers` makes the user, the environment file names every setting, agent.yaml loads.
- compose (deploy/compose/): compose.yaml against the Compose Specification's JSON schema (Docker does not
  run here), its wiring (migrations once and first, healthchecks, mounted files), and its nginx.conf in
  a real nginx in front of two stand-in web processes.
- Prometheus and Grafana: the compose's prometheus.yml in a real Prometheus scraping a real `llmgw serve`
  (with the bearer token) and loading alerts.yaml; every query of deploy/grafana/llmgw.json then runs
  against it and answers with data.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import httpx
import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SYSTEMD = DEPLOY / "systemd"
COMPOSE = DEPLOY / "compose"
DASHBOARD = DEPLOY / "grafana" / "llmgw.json"
SCHEMA = REPO / "tests" / "fixtures" / "compose-spec" / "compose-spec.json"
LLMGW = str(Path(sys.executable).with_name("llmgw"))
# Where the units expect `pip install llmgw` (a virtualenv at /opt/llmgw).
UNIT_BINARY = "/opt/llmgw/bin/llmgw"
SERVER_UNITS = ("llmgw-web@.service", "llmgw-worker.service", "llmgw-conditions.service", "llmgw-beat.service",
                "llmgw-migrate.service")
# Read by llmgw-web@.service's command line, not by llmgw's settings.
UNIT_ONLY_VARIABLES = {"LLMGW_WEB_HOST"}


def _tool(name: str, package: str) -> str:
    path = shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)),
                                      None)
    assert path, f"{name} is missing: apt-get install {package} (scripts/test.sh installs it)"
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what: str, predicate, timeout: float = 30.0, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(every)


# --- systemd --------------------------------------------------------------------------------------


def unit_settings(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file's settings: section -> key -> every value given (a key may be given more than once)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def units() -> list[Path]:
    return sorted(SYSTEMD.glob("*.service"))


@pytest.fixture
def units_here(tmp_path: Path) -> Path:
    """The units copied with their ExecStart pointed at a stand-in binary that exists (verify checks it)."""
    binary = tmp_path / "bin" / "llmgw"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    here = tmp_path / "units"
    here.mkdir()
    for unit in units():
        text = unit.read_text()
        assert UNIT_BINARY in text, f"{unit.name}: its ExecStart is not {UNIT_BINARY}"
        (here / unit.name).write_text(text.replace(UNIT_BINARY, str(binary)))
    # An instance of the template, as `systemctl enable llmgw-web@8001` makes it.
    (here / "llmgw-web@8001.service").symlink_to("llmgw-web@.service")
    return here


def test_the_units_are_the_expected_ones():
    assert [u.name for u in units()] == sorted(["llmgw-agent.service", *SERVER_UNITS])


def test_every_unit_verifies_without_a_word(units_here: Path):
    analyze = _tool("systemd-analyze", "systemd")
    for unit in sorted(units_here.glob("*.service")):
        done = subprocess.run([analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60)
        said = (done.stdout + done.stderr).strip()
        assert done.returncode == 0 and said == "", f"systemd-analyze verify {unit.name}:\n{said}"


def test_the_control_planes_units_are_hardened(units_here: Path):
    analyze = _tool("systemd-analyze", "systemd")
    for name in (*SERVER_UNITS, "llmgw-web@8001.service"):
        settings = unit_settings(units_here / name)["Service"]
        assert settings["User"] == ["llmgw"] and settings["Group"] == ["llmgw"], name
        assert settings["EnvironmentFile"] == ["/etc/llmgw/llmgw.env"], name
        assert settings["StateDirectory"] == ["llmgw"] and settings["ProtectSystem"] == ["strict"], name
        assert settings["NoNewPrivileges"] == ["yes"] and settings["CapabilityBoundingSet"] == [""], name
        done = subprocess.run([analyze, "security", "--offline=yes", "--no-pager", str(units_here / name)],
                              capture_output=True, text=True, timeout=60)
        found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout)
        assert found, f"systemd-analyze security {name}:\n{done.stdout}{done.stderr}"
        assert float(found.group(1)) <= 2.0, f"{name} is exposed: {found.group(0)}"


def test_each_unit_runs_its_role():
    commands = {u.name: unit_settings(u)["Service"]["ExecStart"] for u in units()}
    assert commands == {
        "llmgw-agent.service": [f"{UNIT_BINARY} agent --config /etc/llmgw/agent.yaml"],
        "llmgw-web@.service": [f"{UNIT_BINARY} serve ${{LLMGW_WEB_HOST}}:%i"],
        "llmgw-worker.service": [f"{UNIT_BINARY} worker"],
        "llmgw-conditions.service": [f"{UNIT_BINARY} worker --queues conditions --concurrency 1 --hostname conditions@%%H"],
        "llmgw-beat.service": [f"{UNIT_BINARY} beat --schedule /var/lib/llmgw/celerybeat-schedule"],
        "llmgw-migrate.service": [f"{UNIT_BINARY} migrate --noinput"],
    }
    for name in ("llmgw-web@.service", "llmgw-worker.service", "llmgw-conditions.service", "llmgw-beat.service"):
        unit = unit_settings(SYSTEMD / name)["Unit"]
        assert "llmgw-migrate.service" in unit["Wants"][0].split() and "llmgw-migrate.service" in unit["After"][0].split()
    migrate = unit_settings(SYSTEMD / "llmgw-migrate.service")["Service"]
    assert migrate["Type"] == ["oneshot"] and migrate["RemainAfterExit"] == ["yes"]


def test_the_agent_keeps_the_gpus_and_its_replicas():
    unit = unit_settings(SYSTEMD / "llmgw-agent.service")["Service"]
    assert "User" not in unit, "the agent runs as root: capping and RAPL need it"
    # Any of these closes the device list (ProtectClock= implies DeviceAllow=char-rtc), hiding /dev/nvidia*.
    for key in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock"):
        assert key not in unit, f"llmgw-agent.service sets {key}=, which hides the GPUs from NVML and the replicas"
    # A replica killed for memory must not take the unit (and every other replica) down with it.
    assert unit["OOMPolicy"] == ["continue"]
    # The agent stops its replicas itself within their grace; the unit waits longer than that.
    assert unit["KillMode"] == ["mixed"] and int(unit["TimeoutStopSec"][0]) > 30 + 5
    assert unit["NoNewPrivileges"] == ["yes"] and unit["ProtectSystem"] == ["strict"]
    assert unit["WorkingDirectory"] == ["/var/lib/llmgw/replicas"]


def test_sysusers_makes_the_user(tmp_path: Path):
    sysusers = _tool("systemd-sysusers", "systemd")
    (tmp_path / "etc").mkdir()
    done = subprocess.run([sysusers, f"--root={tmp_path}", "--dry-run", str(SYSTEMD / "llmgw.sysusers")],
                          capture_output=True, text=True, timeout=60)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "Creating user 'llmgw'" in said, said


def settings_variables() -> set[str]:
    """Every environment variable llmgw/settings.py reads."""
    text = (REPO / "llmgw" / "settings.py").read_text()
    names = set(re.findall(r"""(?:os\.environ\.get\(|os\.environ\[|env_bool\(|env_number\()\s*["']([A-Z][A-Z0-9_]*)["']""", text))
    assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "LLMGW_DATA_DIR", "LLMGW_CONFIG"} <= names
    return names


def test_the_environment_file_names_every_setting():
    named = {}
    for number, line in enumerate((SYSTEMD / "llmgw.env.example").read_text().splitlines(), 1):
        setting = re.fullmatch(r"#?([A-Z][A-Z0-9_]*)=(.*)", line.strip())
        if setting:
            named[setting.group(1)] = setting.group(2)
        else:
            assert not line.strip() or line.startswith("#"), f"llmgw.env.example line {number}: not VAR=value: {line!r}"
    read = settings_variables()
    assert sorted(read - named.keys()) == [], "settings llmgw.env.example does not name"
    assert sorted(named.keys() - read - UNIT_ONLY_VARIABLES) == [], "names in llmgw.env.example that llmgw does not read"


def test_the_agent_yaml_example_loads(tmp_path: Path):
    from agents.node.config import load_config

    (tmp_path / "token").write_text("a-node-token\n")
    (tmp_path / "replicas").mkdir()
    text = (SYSTEMD / "agent.yaml.example").read_text()
    assert "/etc/llmgw/token" in text and "/var/lib/llmgw/replicas" in text
    path = tmp_path / "agent.yaml"
    path.write_text(text.replace("/etc/llmgw/token", str(tmp_path / "token"))
                    .replace("/var/lib/llmgw/replicas", str(tmp_path / "replicas")))
    config = load_config(path)
    assert config.token == "a-node-token" and config.runtime.grace_seconds == 30


# --- compose ---------------------------------------------------------------------------------------

_VARIABLE = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def interpolate(value, env: dict[str, str]):
    """Compose's interpolation of ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, $VAR and $$."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(4)
        op, arg = match.group(2), match.group(3)
        present = name in env and (env[name] != "" or not (op or "").startswith(":"))
        if op and op.endswith("?") and not present:
            raise KeyError(f"{name}: {arg}")
        if op and op.endswith("-") and not present:
            return arg
        return env.get(name, "")

    return _VARIABLE.sub(one, value)


def env_example() -> dict[str, str]:
    pairs = {}
    for line in (COMPOSE / "env.example").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def compose_document() -> dict:
    return interpolate(yaml.safe_load((COMPOSE / "compose.yaml").read_text()), env_example())


def test_compose_is_valid_against_the_compose_specification():
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)
    errors = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(compose_document())]
    assert errors == []
    # The schema does refuse what Compose refuses: a misspelt key of a service.
    broken = compose_document()
    broken["services"]["worker"]["healthchek"] = broken["services"]["worker"].pop("healthcheck")
    assert any("healthchek" in e.message for e in validator.iter_errors(broken))


def test_compose_will_not_start_without_its_secrets():
    raw = yaml.safe_load((COMPOSE / "compose.yaml").read_text())
    for secret in ("POSTGRES_PASSWORD", "SECRET_KEY", "LLMGW_METRICS_TOKEN"):
        env = {k: v for k, v in env_example().items() if k != secret}
        with pytest.raises(KeyError, match=secret):
            interpolate(raw, env)


def test_compose_runs_the_migrations_once_before_the_rest():
    services = compose_document()["services"]
    assert set(services) == {"postgres", "redis", "migrate", "web-1", "web-2", "worker", "conditions", "beat", "proxy",
                             "prometheus"}
    llmgw = {name for name, s in services.items() if s.get("image") == "llmgw:local"}
    assert llmgw == {"migrate", "web-1", "web-2", "worker", "conditions", "beat"}
    migrate = services["migrate"]
    assert migrate["command"] == ["migrate", "--noinput"] and migrate["restart"] == "no"
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in llmgw - {"migrate"}:
        assert services[name]["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}, name
        assert services[name]["restart"] == "unless-stopped", name
    # Everything that keeps running says whether it is healthy, and a wait for health has one to wait on.
    for name, service in services.items():
        if name != "migrate":
            assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        for other, condition in (service.get("depends_on") or {}).items():
            assert other in services, f"{name} depends on {other}, which is not a service"
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[other], f"{name} waits for {other} to be healthy; it has no check"
    assert [s["command"][0] for s in services.values() if s.get("image") == "llmgw:local"].count("beat") == 1


def test_compose_names_only_settings_llmgw_reads_and_files_that_exist():
    document = compose_document()
    services = document["services"]
    read = settings_variables()
    for name in ("migrate", "web-1", "web-2", "worker", "conditions", "beat"):
        assert set(services[name]["environment"]) <= read, name
        build = services[name]["build"]
        assert (COMPOSE / build["context"] / build["dockerfile"]).is_file()
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE / source).is_file(), f"{name} mounts {source}, which is not there"
    # The proxy sends to the web services, and Prometheus scrapes the proxy.
    upstreams = set(re.findall(r"server\s+([\w.-]+):8000", (COMPOSE / "nginx.conf").read_text()))
    assert upstreams == {"web-1", "web-2"}
    for web in upstreams:
        assert services[web]["command"] == ["serve", "0.0.0.0:8000"]
    scrape = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())["scrape_configs"][0]
    assert scrape["static_configs"][0]["targets"] == ["proxy:8000"]
    assert {c["target"] for c in services["prometheus"]["configs"]} == {scrape["authorization"]["credentials_file"]}


# --- the proxy, for real ---------------------------------------------------------------------------


class StandInWeb:
    """A web process's stand-in: answers every request with who it is and what it was sent."""

    def __init__(self, name: str):
        stand_in = self
        self.name = name

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                received = len(self.rfile.read(length)) if length else 0
                body = json.dumps({"who": stand_in.name, "path": self.path, "received": received,
                                   "headers": {k.lower(): v for k, v in self.headers.items()}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer  # noqa: N815

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def compose_nginx(tmp_path: Path, ports: dict[str, int]):
    """compose's nginx.conf in a real nginx on 127.0.0.1, with web-1 and web-2 at ``ports``; yields its URL."""
    nginx = _tool("nginx", "nginx")
    tmp_path.mkdir(exist_ok=True)
    port = _free_port()
    conf = (COMPOSE / "nginx.conf").read_text()
    for name, web_port in ports.items():
        conf, n = re.subn(rf"\b{name}:8000\b", f"127.0.0.1:{web_port}", conf)
        assert n == 2, f"nginx.conf names {name}:8000 {n} times"
    conf, n = re.subn(r"listen 8000;", f"listen 127.0.0.1:{port};", conf)
    assert n == 1
    # The test's own scratch directories (nginx's compiled-in ones may not be writable here).
    temp = "".join(f"    {kind}_temp_path {tmp_path / kind};\n" for kind in ("client_body", "proxy", "fastcgi", "uwsgi",
                                                                                 "scgi"))
    conf = conf.replace("http {\n", "http {\n" + temp, 1)
    (tmp_path / "nginx.conf").write_text(conf)
    # Its workers as the test's own user, so they can use those directories (root: nginx's own default is nobody).
    user = "user root; " if os.geteuid() == 0 else ""
    command = [nginx, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-e", "stderr",
               "-g", f"daemon off; pid {tmp_path / 'nginx.pid'}; {user}"]
    checked = subprocess.run([*command, "-t"], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    log = open(tmp_path / "nginx.log", "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def up():
        try:
            return httpx.get(f"{url}/login/", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        _wait("nginx answering", up, timeout=20)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=20)
        log.close()


@pytest.fixture
def proxy(tmp_path: Path):
    """compose's nginx.conf in a real nginx, web-1 and web-2 stand-ins behind it, all on 127.0.0.1."""
    webs = {"web-1": StandInWeb("web-1"), "web-2": StandInWeb("web-2")}
    try:
        with compose_nginx(tmp_path, {name: web.port for name, web in webs.items()}) as url:
            yield url, webs
    finally:
        for web in webs.values():
            web.stop()


def test_the_proxy_shares_the_load_and_sends_metrics_to_one_process(proxy):
    url, webs = proxy
    with httpx.Client(base_url=url, timeout=5) as client:
        served = [client.get("/api/v1/nodes").json() for _ in range(10)]
        assert {s["who"] for s in served} == {"web-1", "web-2"}
        first = served[0]["headers"]
        assert first["host"] == url.removeprefix("http://"), "Django checks ALLOWED_HOSTS and CSRF against it"
        assert first["x-forwarded-for"] == "127.0.0.1" and first["x-forwarded-proto"] == "http"
        # Every scrape from the same process, so its counters never jump between two.
        metrics = [client.get("/metrics", headers={"Authorization": "Bearer t"}).json() for _ in range(6)]
        assert {m["who"] for m in metrics} == {"web-1"}
        assert metrics[0]["headers"]["authorization"] == "Bearer t"
        assert metrics[0]["headers"]["host"] == first["host"]
        # The console's sockets are upgraded through it.
        socket_request = client.get("/ws/nodes/", headers={"Upgrade": "websocket", "Connection": "Upgrade"}).json()
        assert socket_request["headers"]["upgrade"] == "websocket"
        assert socket_request["headers"]["connection"].lower() == "upgrade"
        # A body as large as llmgw takes reaches it (llmgw says 413 itself past that); far larger does not.
        large = client.post("/api/v1/facility/import/netbox", content=b"x" * 2_621_440)
        assert large.status_code == 200 and large.json()["received"] == 2_621_440
        # Past it, nginx answers in the API's error shape and the web processes never see the body.
        refused = client.post("/api/v1/facility/import/netbox", content=b"x" * (2_621_440 + 1))
        assert refused.status_code == 413
        assert refused.json() == {"detail": "body: over the 2621440-byte limit", "field": "body"}
        beat = client.post("/api/v1/agents/heartbeat", content=b"x" * 262_144)
        assert beat.status_code == 200 and beat.json()["received"] == 262_144
        refused = client.post("/api/v1/agents/heartbeat", content=b"x" * (262_144 + 1))
        assert refused.status_code == 413
        assert refused.json() == {"detail": "heartbeat: over the 262144-byte limit", "field": "heartbeat"}
        # web-1 gone: web-2 answers everything, /metrics too.
        webs["web-1"].stop()
        assert {client.get("/metrics").json()["who"] for _ in range(3)} == {"web-2"}
        assert {client.get("/api/v1/nodes").json()["who"] for _ in range(4)} == {"web-2"}


# --- Prometheus and the Grafana dashboard, against a real llmgw ----------------------------------------

TOKEN = "scrape-token-for-the-test"
LEGS = """\
facility:
  margin: 0.1
  node_watts: 0
  gpu_watts: 700
  sources:
    agents: false
  feeds:
    - {name: A1, voltage: 400, amperage: 16, phase: three, pdus: [p-a]}
    - {name: B1, voltage: 400, amperage: 16, phase: three, pdus: [p-b]}
"""
NODE_LEGS = {"n1": "p-a.A,p-b.A", "n2": "p-a.B,p-b.B", "n3": "p-a.A,p-b.B"}


def sensors(hot: bool) -> dict:
    return {
        "gpus": [
            {"index": 0, "uuid": "GPU-a", "temperature_celsius": 84.0 if hot else 61.0,
             "memory_temperature_celsius": 88.0 if hot else 66.0, "power_watts": 512.5, "power_limit_watts": 700.0,
             "throttle_reasons": ["sw_thermal"] if hot else []},
            {"index": 1, "uuid": "GPU-b", "temperature_celsius": 33.0, "memory_temperature_celsius": 35.0,
             "power_watts": 71.0, "power_limit_watts": 700.0, "throttle_reasons": ["sw_power_cap"]},
        ],
        "cpu_temperature_celsius": 55.0,
        "cpu_power_watts": 180.0,
        "inlet_temperature_celsius": 23.5,
    }


def report_sensors() -> None:
    """Each node's heartbeat with its sensors: what keeps it ready, and its series on /metrics."""
    from agents.services import heartbeat_record
    from agents.simulator.cluster import heartbeat_for
    from tests.conftest import node_spec

    for name, legs in NODE_LEGS.items():
        beat = heartbeat_for(node_spec(name, rack="r1", pdu="p-a,p-b", gpus=2, labels={"llmgw.io/leg": legs}))
        beat["sensors"] = sensors(hot=name == "n1")
        heartbeat_record(node_name=name, heartbeat=beat)


def make_facility() -> None:
    """A rack on two three-phase feeds with its PDUs' legs loaded unevenly, hot from a cooling alarm."""
    from django.utils import timezone

    from agents.models import Node
    from facility.evaluation import conditions_evaluate
    from facility.services import facility_apply, scenario_start
    from placement.models import NodeBooking

    report_sensors()
    facility_apply(text=LEGS)
    for name, watts in (("n1", 2000), ("n2", 500), ("n3", 500)):
        NodeBooking.objects.update_or_create(node=Node.objects.get(name=name), defaults={"placed_watts": watts})
    scenario_start(
        data={"name": "hot", "tracks": [{"domains": "rack:r1", "signal": "cooling_alarm", "points": [[0, 1]]}]},
        started_at=timezone.now() - timedelta(minutes=1),
    )
    conditions_evaluate()


@contextlib.contextmanager
def served_llmgw(tmp_path: Path, name: str = "llmgw", **settings_env: str):
    """A real `llmgw serve` on the test database, /metrics behind LLMGW_METRICS_TOKEN; yields its host:port."""
    from django.conf import settings

    from tests.integration.conftest import redis_url, test_database_url

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"LLMGW_CONFIG", "REDIS_URL", "DATABASE_URL"}}
    env.update(DATABASE_URL=test_database_url(), REDIS_URL=redis_url(), SECRET_KEY=settings.SECRET_KEY,
               LLMGW_DATA_DIR=str(tmp_path / name), LLMGW_METRICS_TOKEN=TOKEN, **settings_env)
    log = tmp_path / f"{name}.log"
    with open(log, "w") as out:
        process = subprocess.Popen([LLMGW, "serve", f"127.0.0.1:{port}"], env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def up():
        assert process.poll() is None, f"llmgw serve exited: {log.read_text()[-3000:]}"
        try:
            return httpx.get(f"{url}/login/", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        _wait("llmgw serve answering /login/ (compose's healthcheck)", up, timeout=60)
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


@pytest.fixture
def llmgw_server(transactional_db, tmp_path: Path):
    """A real `llmgw serve` on the test database, /metrics behind LLMGW_METRICS_TOKEN."""
    with served_llmgw(tmp_path) as address:
        yield address


def test_oversize_posts_through_the_proxy_take_no_web_process_out(transactional_db, tmp_path: Path):
    """Bodies past llmgw's limits, from anyone, never make nginx take a web process out of the rotation:
    after them every request through the proxy is answered by llmgw (here 401: no credentials), none 502."""
    with served_llmgw(tmp_path, "web-1") as web_1, served_llmgw(tmp_path, "web-2") as web_2:
        ports = {"web-1": int(web_1.rpartition(":")[2]), "web-2": int(web_2.rpartition(":")[2])}
        with compose_nginx(tmp_path / "nginx", ports) as url, httpx.Client(base_url=url, timeout=30) as client:
            # As large as nginx took before it knew llmgw's limits (3 MB): the more of a body is still being
            # sent when llmgw refuses it, the surer nginx sees the connection reset.
            refused = [client.post("/api/v1/agents/heartbeat", content=b"{" + b" " * 3_000_000 + b"}",
                                   headers={"Content-Type": "application/json"}) for _ in range(12)]
            refused += [client.post("/api/v1/facility/import/netbox", content=b"x" * 3_000_000) for _ in range(6)]
            # Straight after, every request reaches llmgw (web-1 and web-2 in turn): none is a 502.
            assert [client.get("/api/v1/nodes").status_code for _ in range(8)] == [401] * 8
            assert [r.status_code for r in refused] == [413] * 18
            assert {r.json()["field"] for r in refused} == {"heartbeat", "body"}
            beat = client.post("/api/v1/agents/heartbeat", json={"node": "n1"})
            assert beat.status_code == 401


@pytest.fixture
def prometheus(llmgw_server: str, tmp_path: Path):
    """compose's prometheus.yml in a real Prometheus: its targets and files moved here, scraping every second."""
    binary = _tool("prometheus", "prometheus")
    promtool = _tool("promtool", "prometheus")
    port = _free_port()
    config = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/alerts.yaml"]
    config["rule_files"] = [str(DEPLOY / "prometheus" / "alerts.yaml")]
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    (tmp_path / "metrics-token").write_text(TOKEN + "\n")
    for job in config["scrape_configs"]:
        job.update(scrape_interval="1s", scrape_timeout="1s")
        if job["job_name"] == "llmgw":
            job["static_configs"] = [{"targets": [llmgw_server]}]
            job["authorization"]["credentials_file"] = str(tmp_path / "metrics-token")
        else:
            job["static_configs"] = [{"targets": [f"127.0.0.1:{port}"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    checked = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    log = open(tmp_path / "prometheus.log", "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def ready():
        try:
            return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        _wait("prometheus ready", ready, timeout=30)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=20)
        log.close()


def query(api: httpx.Client, expr: str) -> list[dict]:
    answer = api.get("/api/v1/query", params={"query": expr}).json()
    assert answer["status"] == "success", f"{expr}: {answer}"
    return answer["data"]["result"]


def dashboard_panels(dashboard: dict) -> list[dict]:
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels += panel.get("panels", [])  # a collapsed row keeps its panels inside
    return panels


def variable_values(api: httpx.Client, variable: dict) -> list[str]:
    """What Grafana lists for a `label_values(selector, label)` variable, its regex's group applied."""
    found = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["query"]["query"])
    assert found, f"variable {variable['name']}: only label_values(selector, label) is run here"
    selector, label = found.groups()
    answer = api.get(f"/api/v1/label/{label}/values", params={"match[]": selector}).json()
    assert answer["status"] == "success", answer
    values = answer["data"]
    if variable.get("regex"):
        pattern = re.compile(variable["regex"].strip("/"))
        values = [m.group(1) if m.groups() else m.group(0) for v in values if (m := pattern.search(v))]
    return values


def grafana_escape(value: str) -> str:
    """A single value in a regex matcher, escaped as Grafana escapes it for Prometheus."""
    return re.sub(r"([$^*{}\[\]'+?.()|\\])", r"\\\\\1", value)


def substitute(expr: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        expr = re.sub(rf"\$(?:{name}\b|\{{{name}\}})", lambda _, value=value: value, expr)
    assert "$" not in expr, f"a template variable left in {expr}"
    return expr


def test_the_dashboard_is_well_formed():
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard_panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for panel in panels:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]
    titles = " | ".join(p["title"] for p in panels)
    for wanted in ("Rack power vs limit", "Domains not ok", "Feed-loss violations", "Failed feeds", "PDU leg imbalance",
                   "Facility sources up", "GPU temperature", "GPUs held down"):
        assert wanted in titles


@pytest.mark.django_db(transaction=True)
def test_prometheus_scrapes_llmgw_and_every_dashboard_query_answers(prometheus):
    with httpx.Client(base_url=prometheus, timeout=10) as api:  # one client: a new one costs a TLS context
        prometheus_answers_the_dashboard(api)


def prometheus_answers_the_dashboard(api: httpx.Client) -> None:
    make_facility()
    # The compose's scrape job reaches /metrics with its bearer token, and the rules are loaded.
    _wait("llmgw scraped", lambda: [r for r in query(api, 'up{job="llmgw"}') if r["value"][1] == "1"])
    _wait("the hot rack and the nodes' GPUs on /metrics",
          lambda: query(api, 'llmgw_domain_condition{condition="hot"} == 1') and query(api, "llmgw_gpu_throttled"))
    report_sensors()  # the nodes stay ready (three missed intervals) for the rest of the test
    _wait("the nodes' measured draw on /metrics", lambda: query(api, "llmgw_domain_measured_watts"), timeout=90)

    dashboard = json.loads(DASHBOARD.read_text())
    variables = [v for v in dashboard["templating"]["list"] if v["type"] == "query"]
    one_each = {}
    for variable in variables:
        values = variable_values(api, variable)
        assert values, f"variable {variable['name']} lists nothing"
        one_each[variable["name"]] = grafana_escape(values[0])
    every = {v["name"]: v["allValue"] for v in variables}
    empty = []
    for panel in dashboard_panels(dashboard):
        for target in panel.get("targets", []):
            for chosen in (every, one_each):
                expr = substitute(target["expr"], chosen)
                if not query(api, expr):
                    empty.append(f"{panel['title']} [{target['refId']}]: {expr}")
                if target.get("range", True):
                    now = time.time()
                    answer = api.get("/api/v1/query_range", params={
                        "query": expr, "start": now - 30, "end": now, "step": 1}).json()
                    assert answer["status"] == "success", f"{expr}: {answer}"
                    if not answer["data"]["result"]:
                        empty.append(f"{panel['title']} [{target['refId']}] over a range: {expr}")
    assert empty == [], "queries without data:\n" + "\n".join(empty)

    # alerts.yaml's every rule evaluates without an error on what llmgw serves.
    def evaluated():
        groups = api.get("/api/v1/rules").json()["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        return rules if rules and all(r["health"] != "unknown" for r in rules) else None

    def hot_pending():
        rules = evaluated() or []
        hot = {a["labels"].get("domain") for r in rules if r["name"] == "LlmgwDomainHot" for a in r["alerts"]}
        return rules if "rack:r1" in hot else None

    rules = _wait("the hot rack's alert pending", hot_pending)
    assert {r["name"] for r in rules} >= {"LlmgwDomainHot", "LlmgwFeedLossViolations", "LlmgwGPUThermalThrottling"}
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []
