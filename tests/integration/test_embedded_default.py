"""The embedded default works with nothing installed: SQLite under LLMGW_DATA_DIR, tasks in-process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

LLMGW = str(Path(sys.executable).with_name("llmgw"))


def llmgw(data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "LLMGW_CONFIG"}}
    env["LLMGW_DATA_DIR"] = str(data_dir)
    return subprocess.run([LLMGW, *args], env=env, capture_output=True, text=True, timeout=120)


def test_demo_loads_on_sqlite_and_ctl_reads_it(tmp_path):
    result = llmgw(tmp_path, "demo", "--no-serve")
    assert result.returncode == 0, result.stderr
    assert "log in as admin / " in result.stdout
    assert (tmp_path / "llmgw.sqlite3").exists()

    nodes = json.loads(llmgw(tmp_path, "ctl", "nodes", "-o", "json").stdout)
    assert len(nodes) == 32
    assert {n["location"]["room"] for n in nodes} == {"hall-a", "hall-b"}
    assert len({n["location"]["rack"] for n in nodes}) == 8

    held = llmgw(tmp_path, "ctl", "facility", "hold", "rack:r1-01", "--reason", "PDU swap")
    assert held.returncode == 0, held.stderr
    table = llmgw(tmp_path, "ctl", "nodes", "--domain", "rack:r1-01").stdout.splitlines()
    assert len(table) == 5
    assert all(line.split()[1] == "held" for line in table[1:])


def test_demo_serves_the_console_with_live_simulated_nodes(tmp_path):
    import re
    import signal
    import socket
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "LLMGW_CONFIG"}}
    env["LLMGW_DATA_DIR"] = str(tmp_path)
    log = open(tmp_path / "demo.log", "w+")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([LLMGW, "demo", f"127.0.0.1:{port}", "--interval", "2"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        password = None
        while time.monotonic() < deadline:
            text = (tmp_path / "demo.log").read_text()
            match = re.search(r"log in as admin / (\S+)\)", text)
            if match:
                password = match.group(1)
                # The login comes last, after the server's own lines, where a person looks.
                assert "log in as admin" in text.strip().splitlines()[-1], text
                try:
                    if httpx.get(f"{base}/login/", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
            assert proc.poll() is None, text
            time.sleep(0.3)
        assert password, (tmp_path / "demo.log").read_text()
        with httpx.Client(base_url=base, follow_redirects=True, timeout=10) as client:
            page = client.get("/login/")
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
            client.post("/login/", data={"username": "admin", "password": password, "csrfmiddlewaretoken": token},
                        headers={"Referer": f"{base}/login/"})
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                nodes = client.get("/nodes/").text
                if nodes.count('badge state-ready"') == 32:
                    break
                time.sleep(1)
            assert nodes.count('badge state-ready"') == 32, nodes
            assert "gpu32" in nodes and "r4-02" in nodes
            # A label term in the filter compares text on SQLite as on PostgreSQL.
            rack = client.get("/nodes/", params={"domain": "llmgw.io/rack=r1-01"})
            assert rack.status_code == 200 and rack.text.count('badge state-ready"') == 4, rack.text[-2000:]
            quoted = client.get("/nodes/", params={"domain": 'llmgw.io/rack="r1-01"'})
            assert quoted.status_code == 200 and quoted.text.count('badge state-ready"') == 0
            assert client.get("/static/vendor/htmx-2.0.11.min.js").status_code == 200
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            raise AssertionError("llmgw demo did not stop on SIGTERM:\n" + (tmp_path / "demo.log").read_text()[-3000:]) from None
        finally:
            log.close()


def test_demo_on_a_busy_address_says_so_before_loading_anything(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = llmgw(tmp_path, "demo", "--addr", f"127.0.0.1:{port}")
    assert result.returncode != 0
    assert f"cannot serve at 127.0.0.1:{port}" in result.stderr
    assert "log in as" not in result.stdout
    assert not (tmp_path / "llmgw.sqlite3").exists()


def test_check_deploy_is_clean_with_the_documented_production_environment(tmp_path):
    import secrets

    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "LLMGW_CONFIG", "DEBUG"}}
    env.update(
        LLMGW_DATA_DIR=str(tmp_path), SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="llmgw.example.org",
        CSRF_TRUSTED_ORIGINS="https://llmgw.example.org", LLMGW_HSTS_SECONDS="31536000",
        LLMGW_HSTS_INCLUDE_SUBDOMAINS="true", LLMGW_HSTS_PRELOAD="true", LLMGW_SSL_REDIRECT="true",
        LLMGW_SECURE_COOKIES="true", LLMGW_PROXY_SSL_HEADER="X-Forwarded-Proto",
    )
    result = subprocess.run([LLMGW, "check", "--deploy", "--fail-level", "WARNING"], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout

    # Without the switches, Django's deploy check names each one: the test above is not clean by accident.
    for name in ("LLMGW_HSTS_SECONDS", "LLMGW_SSL_REDIRECT", "LLMGW_SECURE_COOKIES"):
        env.pop(name)
    result = subprocess.run([LLMGW, "check", "--deploy"], env=env, capture_output=True, text=True, timeout=120)
    for code in ("W004", "W008", "W012", "W016"):
        assert f"security.{code}" in result.stderr + result.stdout
