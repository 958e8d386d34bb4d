"""`llmgw ctl` in remote mode: the real command, a live server, and the same output as on the database."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.ctl import main as ctl
from tests.integration.test_schema_fuzz import seeded  # noqa: F401  (the fixture: something of everything)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("seeded")]

LLMGW = Path(sys.executable).parent / "llmgw"

LISTINGS = [
    ("nodes",),
    ("nodes", "--domain", "rack:r1-01"),
    ("models",),
    ("replicas",),
    ("replicas", "--model", "llama"),
    ("explain-placement", "llama"),
    ("headroom", "llama"),
    ("facility",),
    ("facility", "feeds"),
    ("facility", "feed-loss"),
    ("facility", "events"),
]


def remote(url: str, token: str, *argv: str, home: Path, token_env: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"LLMGW_URL", "LLMGW_TOKEN", "DATABASE_URL"}}
    env["XDG_CONFIG_HOME"] = str(home)
    if url:
        env["LLMGW_URL"] = url
    if token_env:
        env["LLMGW_TOKEN"] = token
    return subprocess.run([str(LLMGW), "ctl", *argv], capture_output=True, text=True, env=env, timeout=60)


def local(capsys, *argv: str) -> tuple[int, str, str]:
    code = ctl(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_listings_print_the_same_remote_as_local(live_server, make_user, capsys, tmp_path):
    _, key = make_user("viewer1", role="viewer")
    for argv in LISTINGS:
        code, out, err = local(capsys, *argv)
        assert code == 0, (argv, err)
        got = remote(live_server.url, key, *argv, home=tmp_path)
        assert got.returncode == 0, (argv, got.stderr)
        assert got.stdout == out, argv
        code, out, _ = local(capsys, *argv, "-o", "json")
        got = remote(live_server.url, key, *argv, "-o", "json", home=tmp_path)
        assert got.returncode == 0, (argv, got.stderr)
        assert json.loads(got.stdout) == json.loads(out), argv


def test_a_remote_listing_loads_no_django(live_server, make_user, tmp_path):
    _, key = make_user("viewer1", role="viewer")
    probe = (
        "import sys\n"
        "from llmgw.cli import main\n"
        "code = main(['ctl', 'nodes', '-o', 'json'])\n"
        "print('loaded:', sorted(m for m in sys.modules if m.split('.')[0] in {'django', 'rest_framework'}))\n"
        "sys.exit(code)\n"
    )
    env = {**os.environ, "LLMGW_URL": live_server.url, "LLMGW_TOKEN": key, "XDG_CONFIG_HOME": str(tmp_path)}
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert got.returncode == 0, got.stderr
    assert got.stdout.rstrip().endswith("loaded: []"), got.stdout[-500:]
    assert '"name": "gpu01"' in got.stdout


def test_changes_through_the_api_and_the_same_refusals(live_server, make_user, capsys, tmp_path):
    _, key = make_user("op", role="operator")
    got = remote(live_server.url, key, "facility", "hold", "rack:r1-01", "--reason", "PDU swap", home=tmp_path)
    assert (got.returncode, got.stdout) == (0, "rack:r1-01 held: PDU swap\n"), got.stderr
    got = remote(live_server.url, key, "facility", "release", "rack:r1-01", home=tmp_path)
    assert (got.returncode, got.stdout) == (0, "rack:r1-01 released\n"), got.stderr
    got = remote(live_server.url, key, "cordon", "gpu01", "--reason", "fan", home=tmp_path)
    assert (got.returncode, got.stdout) == (0, "gpu01 cordoned\n"), got.stderr
    got = remote(live_server.url, key, "uncordon", "gpu01", home=tmp_path)
    assert (got.returncode, got.stdout) == (0, "gpu01 uncordoned\n"), got.stderr
    got = remote(live_server.url, key, "label", "gpu01", "team=search", home=tmp_path)
    assert got.returncode == 0 and "team=search" in got.stdout, got.stderr

    # The API's {"detail"} is printed as local mode prints the service's error.
    for argv in (("facility", "release", "rack:nowhere"), ("headroom", "nosuch"), ("cordon", "nosuch")):
        code, _, err = local(capsys, *argv)
        got = remote(live_server.url, key, *argv, home=tmp_path)
        # The live server's request log shares this process's stderr: compare the error line alone.
        local_error = [line for line in err.splitlines() if line.startswith("error: ")]
        assert code == got.returncode == 1, argv
        assert got.stderr.splitlines() == local_error and len(local_error) == 1, argv

    for argv in (("facility", "what-if", "hold", "rack:r1-01", "--drain"), ("facility", "what-if", "feed-loss", "nosuch")):
        code, out, _ = local(capsys, *argv, "-o", "json")
        got = remote(live_server.url, key, *argv, "-o", "json", home=tmp_path)
        assert got.returncode == code, (argv, got.stderr)
        if code == 0:
            assert json.loads(got.stdout) == json.loads(out), argv

    models = tmp_path / "models.yaml"
    models.write_text("kind: Model\nname: small\nreplicas: 1\nprofile: {gpus: 1}\n")
    got = remote(live_server.url, key, "apply", "-f", str(models), home=tmp_path)
    assert got.returncode == 0 and got.stdout.startswith("model small created: "), got.stderr

    got = remote(live_server.url, key, "node", "token", "gpu01", home=tmp_path)
    assert got.returncode == 1 and "has no API yet" in got.stderr


def test_a_bad_token_is_refused_clearly_and_login_keeps_a_good_one(live_server, make_user, tmp_path):
    got = remote(live_server.url, "not-a-token", "nodes", home=tmp_path)
    assert got.returncode == 1
    assert got.stderr.startswith(f"error: {live_server.url} refused the token (401"), got.stderr

    _, key = make_user("viewer1", role="viewer")
    token_file = tmp_path / "given.token"
    token_file.write_text(key + "\n")
    got = remote("", "", "login", "--server", live_server.url, "--token-file", str(token_file), home=tmp_path,
                 token_env=False)
    assert got.returncode == 0, got.stderr
    kept = tmp_path / "llmgw" / "token"
    assert kept.read_text().strip() == key
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    got = remote(live_server.url, "", "nodes", home=tmp_path, token_env=False)
    assert got.returncode == 0 and "gpu01" in got.stdout, got.stderr
    # A good token whose role is short of the change: the API's words, not a token problem.
    got = remote(live_server.url, "", "facility", "hold", "rack:r1-01", "--reason", "x", home=tmp_path, token_env=False)
    assert got.returncode == 1
    assert got.stderr == f"error: {live_server.url} refused: your role does not allow this: reading needs the " \
        "viewer role, changes the operator role\n"
