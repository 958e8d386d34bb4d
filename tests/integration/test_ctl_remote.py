"""`llmgw ctl` in remote mode: the real command, a live server, and the same output as on the database."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from llmgw.ctl import main as ctl
from tests.integration.test_schema_fuzz import seeded  # noqa: F401  (the fixture: something of everything)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("seeded")]

LLMGW = Path(sys.executable).parent / "llmgw"

LISTINGS = [
    ("nodes",),
    ("nodes", "--domain", "rack:r1-01"),
    ("nodes", "--domain", "rack:r1-1"),  # no node is in it: the same "did you mean" remote
    ("models",),
    ("replicas",),
    ("replicas", "--model", "llama"),
    ("explain-placement", "llama"),
    ("headroom", "llama"),
    ("facility",),
    ("facility", "feeds"),
    ("facility", "feed-loss"),
    ("facility", "events"),
    ("facility", "shed", "--dry-run"),
    ("facility", "capping"),
]


def remote(url: str, token: str, *argv: str, home: Path, token_env: bool = True,
           stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"LLMGW_URL", "LLMGW_TOKEN", "DATABASE_URL"}}
    env["XDG_CONFIG_HOME"] = str(home)
    if url:
        env["LLMGW_URL"] = url
    if token_env:
        env["LLMGW_TOKEN"] = token
    return subprocess.run([str(LLMGW), "ctl", *argv], capture_output=True, text=True, env=env, timeout=60,
                          input=stdin if stdin is not None else "")


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
        "code = main(['ctl', 'facility', 'shed', '--dry-run']) or main(['ctl', 'facility', 'capping'])\n"
        "code = code or main(['ctl', 'nodes', '-o', 'json'])\n"
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


def test_a_bad_token_is_refused_clearly_and_login_keeps_a_good_one(live_server, make_user, tmp_path):
    got = remote(live_server.url, "not-a-token", "nodes", home=tmp_path)
    assert got.returncode == 1
    assert got.stderr.startswith(f"error: {live_server.url} refused the token (401"), got.stderr

    # No token at all: said so, with how to get one.
    got = remote(live_server.url, "", "nodes", home=tmp_path, token_env=False)
    assert got.returncode == 1 and got.stderr.startswith(
        f"error: {live_server.url} asks for a token and none is set: log in ("), got.stderr
    # A token file that is not there, empty, or refused: named, never a traceback.
    login = ("login", "--server", live_server.url, "--token-file")
    got = remote("", "", *login, str(tmp_path / "nothere.token"), home=tmp_path, token_env=False)
    assert (got.returncode, got.stderr) == (1, f"error: {tmp_path / 'nothere.token'}: cannot read: No such file or directory\n")
    (tmp_path / "empty.token").write_text("\n")
    got = remote("", "", *login, str(tmp_path / "empty.token"), home=tmp_path, token_env=False)
    assert (got.returncode, got.stderr) == (1, f"error: {tmp_path / 'empty.token'}: holds no token (`llmgw ctl token "
                                            "create USER --role operator` where the database is makes one)\n")
    (tmp_path / "two.token").write_text("one\ntwo\n")
    got = remote("", "", *login, str(tmp_path / "two.token"), home=tmp_path, token_env=False)
    assert (got.returncode, got.stderr) == (
        1, f"error: {tmp_path / 'two.token'}: holds more than one word; a token file holds the token alone\n")
    (tmp_path / "bad.token").write_text("not-a-token\n")
    got = remote("", "", *login, str(tmp_path / "bad.token"), home=tmp_path, token_env=False)
    assert got.returncode == 1 and f"; check {tmp_path / 'bad.token'} (" in got.stderr, got.stderr
    assert not (tmp_path / "llmgw" / "token").exists()

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
    # As the README writes it: the token from `ctl token create` on standard input, no --token-file.
    kept.unlink()
    got = remote("", "", "login", "--server", live_server.url, home=tmp_path, token_env=False, stdin=key + "\n")
    assert (got.returncode, got.stdout) == (
        0, f"token kept in {kept}; use --server {live_server.url} or LLMGW_URL\n"), got.stderr
    assert kept.read_text().strip() == key
    # A good token whose role is short of the change: the API's words, not a token problem.
    got = remote(live_server.url, "", "facility", "hold", "rack:r1-01", "--reason", "x", home=tmp_path, token_env=False)
    assert got.returncode == 1
    assert got.stderr == f"error: {live_server.url} refused: your role does not allow this: reading needs the " \
        "viewer role, changes the operator role\n"


# -- every command remote: the writes ----------------------------------------------------------------------


def errors(text: str) -> list[str]:
    """The `error: …` lines (the live server's request log shares this process's stderr)."""
    return [line for line in text.splitlines() if line.startswith("error: ")]


def both(capsys, url: str, key: str, home: Path, *argv: str) -> tuple[tuple, tuple]:
    """`argv` on the database here, then through the API: (code, stdout, error lines) of each."""
    code, out, err = local(capsys, *argv)
    got = remote(url, key, *argv, home=home)
    return (code, out, errors(err)), (got.returncode, got.stdout, errors(got.stderr))


def same(capsys, url: str, key: str, home: Path, *argv: str) -> str:
    """`argv` prints the same here and through the API (a command that changes nothing the second time)."""
    here, there = both(capsys, url, key, home, *argv)
    assert here == there, argv
    return here[1]


def twice(capsys, url: str, key: str, home: Path, argv: tuple[str, ...], undo: tuple[str, ...]) -> str:
    """`argv` here, `undo` here, `argv` through the API: the same output, and `argv` answers alike after."""
    code, out, err = local(capsys, *argv)
    assert code == 0, (argv, err)
    assert local(capsys, *undo)[0] == 0, undo
    got = remote(url, key, *argv, home=home)
    assert (got.returncode, got.stdout) == (0, out), (argv, got.stderr)
    return out


def test_budgets_conditions_and_model_deletes_print_the_same_remote(live_server, make_user, capsys, tmp_path):
    _, key = make_user("op", role="operator")
    url = live_server.url
    budget = ("facility", "budget", "set", "rack:r1-02", "--cap-watts", "18400", "--other-watts", "800")
    assert same(capsys, url, key, tmp_path, *budget) == "rack:r1-02: cap 18.4 kW, other 0.8 kW\n"
    # --other-watts not given: kept as it is, in both modes.
    assert same(capsys, url, key, tmp_path, *budget[:-2], "--cap-watts", "20000") == \
        "rack:r1-02: cap 20.0 kW, other 0.8 kW\n"
    out = twice(capsys, url, key, tmp_path, ("facility", "budget", "delete", "rack:r1-02"), budget)
    assert out == ("rack:r1-02: budget removed\n"
                   "warning: rack r1-02 has no power limit any more: nothing refuses a replica there for power\n")
    here, there = both(capsys, url, key, tmp_path, "facility", "budget", "delete", "rack:r1-02")
    assert here == there == (1, "", ["error: rack:r1-02 has no budget"])
    here, there = both(capsys, url, key, tmp_path, "facility", "budget", "set", "rack:r1-02", "--cap-watts", "-5")
    assert here == there and here[0] == 1 and here[2][0].startswith("error: cap_watts: "), here

    hand = ("facility", "condition", "set", "rack:r1-01", "ok", "--reason", "probe fault")
    assert same(capsys, url, key, tmp_path, *hand) == "rack:r1-01 set ok until cleared: probe fault\n"
    got = remote(url, key, *hand, "--for", "2h", home=tmp_path)
    assert got.returncode == 0, got.stderr
    until = datetime.strptime(got.stdout.split(" until ")[1].split(": ")[0], "%Y-%m-%d %H:%M UTC").replace(tzinfo=UTC)
    assert abs(until - (datetime.now(UTC) + timedelta(hours=2))) < timedelta(minutes=2)
    code, out, _ = local(capsys, *hand, "--for", "2h")
    assert code == 0 and out.split(" until ")[0] == got.stdout.split(" until ")[0]
    out = twice(capsys, url, key, tmp_path, ("facility", "condition", "clear", "rack:r1-01"), hand)
    assert out == "rack:r1-01: condition set by hand cleared\n"
    here, there = both(capsys, url, key, tmp_path, "facility", "condition", "clear", "rack:r1-01")
    assert here == there == (1, "", ["error: rack:r1-01 has no condition set by hand"])
    here, there = both(capsys, url, key, tmp_path, *hand, "--for", "0s")
    assert here == there and here[2] == ["error: --for: a duration of at least 1s, at most a year (366 days)"]

    models = tmp_path / "models.yaml"
    models.write_text("kind: Model\nname: small\nreplicas: 2\nprofile: {gpus: 1}\n")
    assert local(capsys, "apply", "-f", str(models))[0] == 0
    out = twice(capsys, url, key, tmp_path, ("delete", "model", "small"), ("apply", "-f", str(models)))
    assert out == "model small deleted (2 replicas removed)\n"
    here, there = both(capsys, url, key, tmp_path, "delete", "model", "small")
    assert here == there == (1, "", ["error: model 'small' is not known"])


SERVER_YAML = """\
facility:
  margin: 0.1
  budgets:
    - {domain: rack:r1-02, cap_watts: 18000, other_watts: 500}
  sources:
    agents: true
    simulated: {file: scenarios/crac.yaml, speed: 1}
"""


def test_facility_apply_remote_applies_the_file_as_here(live_server, make_user, capsys, tmp_path):
    from facility.models import Budget, FacilitySettings, ScenarioRun

    _, key = make_user("op", role="operator")
    (tmp_path / "scenarios").mkdir()
    scenario = Path(__file__).parents[2] / "llmgw" / "demo" / "scenarios" / "crac-failure.yaml"
    (tmp_path / "scenarios" / "crac.yaml").write_text(scenario.read_text())
    server = tmp_path / "server.yaml"
    server.write_text(SERVER_YAML)
    code, first, err = local(capsys, "facility", "apply", "-f", str(server))
    assert (code, first) == (0, f"{server}: applied (1 budgets created, 0 updated, 0 removed)\n"), err
    # The scenario the file names, relative to it, is read by ctl and sent: the server reads no file of its own.
    out = same(capsys, live_server.url, key, tmp_path, "facility", "apply", "-f", str(server))
    assert out == f"{server}: applied (0 budgets created, 0 updated, 1 unchanged, 0 removed)\n"
    assert ScenarioRun.objects.get().name == "crac-failure"

    # A refusal names the file's line; nothing of the file is applied, here or there.
    server.write_text(SERVER_YAML.replace("margin: 0.1", "margin: 0.2").replace("cap_watts: 18000", "cap_watts: lots"))
    here, there = both(capsys, live_server.url, key, tmp_path, "facility", "apply", "-f", str(server))
    assert here == there and here[:2] == (1, ""), (here, there)
    assert here[2][0].startswith(f"error: {server} line 4: facility.budgets[0].cap_watts: "), here
    assert FacilitySettings.load().margin == 0.1 and Budget.objects.get(domain="rack:r1-02").cap_watts == 18000
    server.write_text(SERVER_YAML.replace("crac.yaml", "missing.yaml"))
    here, there = both(capsys, live_server.url, key, tmp_path, "facility", "apply", "-f", str(server))
    assert here == there, (here, there)
    assert here[2] == [f"error: {server} line 7: facility.sources.simulated.file: "
                       f"{tmp_path / 'scenarios' / 'missing.yaml'}: "
                       "cannot read: No such file or directory"]


def test_a_remote_apply_that_removes_needs_yes_as_here(live_server, make_user, capsys, tmp_path):
    from facility.models import Budget

    _, key = make_user("op", role="operator")
    server = tmp_path / "server.yaml"
    server.write_text("facility:\n  budgets:\n    - {domain: rack:r1-02, cap_watts: 18000}\n")
    assert local(capsys, "facility", "apply", "-f", str(server))[0] == 0
    server.write_text("facility:\n  budgets: []\n")
    refused = [f"error: {server} would remove 1 budget: rack:r1-02",
               "nothing was applied: give --yes to apply it and remove them"]
    code, out, err = local(capsys, "facility", "apply", "-f", str(server))
    assert (code, out, err.splitlines()) == (1, "", refused)
    got = remote(live_server.url, key, "facility", "apply", "-f", str(server), home=tmp_path)
    assert (got.returncode, got.stdout, got.stderr.splitlines()) == (1, "", refused)
    assert Budget.objects.filter(domain="rack:r1-02").exists()
    got = remote(live_server.url, key, "facility", "apply", "-f", str(server), "--yes", home=tmp_path)
    assert (got.returncode, got.stdout) == (0, f"{server}: applied (0 budgets created, 0 updated, 1 removed: rack:r1-02)\n")


TWO_MODELS = "kind: Model\nname: first\nreplicas: 1\nprofile: {gpus: 1}\n---\nkind: Model\nname: second\nreplicas: 1\nprofile: {gpus: 2}\n"


def test_remote_apply_is_all_or_nothing_like_local(live_server, make_user, capsys, tmp_path):
    from placement.models import Model
    from placement.services import model_delete

    _, key = make_user("op", role="operator")
    bad = tmp_path / "models.yaml"
    bad.write_text(TWO_MODELS.replace("gpus: 2", "gpus: many"))
    here, there = both(capsys, live_server.url, key, tmp_path, "apply", "-f", str(bad))
    assert here == there, (here, there)
    assert here[0] == 1 and here[2][0].startswith(f"error: {bad} line 9: profile.gpus: "), here
    assert not Model.objects.filter(name__in=["first", "second"]).exists()  # the first document neither

    good = tmp_path / "good.yaml"
    good.write_text(TWO_MODELS)
    code, out, err = local(capsys, "apply", "-f", str(good))
    assert code == 0 and [line.split(":")[0] for line in out.splitlines()] == [
        "model first created", "model second created"], err
    for name in ("first", "second"):
        model_delete(name=name)
    got = remote(live_server.url, key, "apply", "-f", str(good), home=tmp_path)
    assert (got.returncode, got.stdout) == (0, out), got.stderr
    assert same(capsys, live_server.url, key, tmp_path, "apply", "-f", str(good)) == out.replace("created", "unchanged")
    # A YAML file that stands for millions of values is refused, not expanded.
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 10) + "]\n" for i in range(8))
    (tmp_path / "bomb.yaml").write_text(bomb)
    here, there = both(capsys, live_server.url, key, tmp_path, "apply", "-f", str(tmp_path / "bomb.yaml"))
    assert here == there == (1, "", [f"error: {tmp_path / 'bomb.yaml'}: more than 500,000 values "
                                     "(an alias repeating a large part?)"])


def test_shed_and_capping_with_rows_print_the_same_remote(live_server, make_user, capsys, tmp_path):
    from django.utils import timezone

    from placement.capping import capping_run
    from placement.models import ShedDomain

    _, key = make_user("op", role="operator")
    server = tmp_path / "server.yaml"
    server.write_text(
        "facility:\n  conditions: {mode: observe}\n  sources: {agents: false}\n"
        "  shedding: {enabled: true, shed_after: 1h, interval: 5m}\n  capping: {enabled: true}\n"
        "  budgets:\n    - {domain: rack:r1-01, cap_watts: 500}\n"
    )
    got = remote(live_server.url, key, "facility", "apply", "-f", str(server), home=tmp_path)
    assert got.returncode == 0, got.stderr
    got = remote(live_server.url, key, "facility", "condition", "set", "rack:r1-01", "warm", "--reason", "CRAC 2",
                 home=tmp_path)
    assert got.returncode == 0, got.stderr
    capping_run()
    ShedDomain.objects.create(domain="rack:r1-01", trouble_since=timezone.now())  # a dry run's times, fixed
    for argv in (("facility", "shed", "--dry-run", "--intervals", "2"), ("facility", "capping")):
        out = same(capsys, live_server.url, key, tmp_path, *argv)
        assert "off" not in out and "nothing" not in out and "no GPU" not in out, out
        here, there = both(capsys, live_server.url, key, tmp_path, *argv, "-o", "json")
        assert here[0] == there[0] == 0 and json.loads(here[1]) == json.loads(there[1]) != [], argv
    assert "would cap gpu01" in out


# -- tokens, NetBox, and who may do what --------------------------------------------------------------------


def test_tokens_are_made_remotely_by_an_admin_only(live_server, make_user, capsys, tmp_path):
    from agents.models import NodeToken

    _, operator = make_user("op", role="operator")
    for argv in (("token", "create", "bob", "--role", "viewer"), ("node", "token", "gpu01")):
        got = remote(live_server.url, operator, *argv, home=tmp_path)
        assert (got.returncode, got.stderr) == (1, f"error: {live_server.url} refused: your role does not allow "
                                                   "this: tokens are made by an admin (a staff user)\n"), argv
    admin, key = make_user("alice", role="operator")
    admin.is_staff = True
    admin.save()
    # The user's one token, new each time (here and there): the last one works, the one before does not.
    here, there = both(capsys, live_server.url, key, tmp_path, "token", "create", "bob", "--role", "viewer")
    assert here[0] == there[0] == 0 and len(here[1]) == len(there[1]) == 41 and here[1] != there[1]
    got = remote(live_server.url, there[1].strip(), "nodes", home=tmp_path)
    assert got.returncode == 0 and "gpu01" in got.stdout, got.stderr
    got = remote(live_server.url, here[1].strip(), "nodes", home=tmp_path)
    assert got.returncode == 1 and "no such token (revoked, rotated or mistyped)" in got.stderr
    # A node token is new each time; the old one stops working.
    code, old, _ = local(capsys, "node", "token", "gpu01")
    got = remote(live_server.url, key, "node", "token", "gpu01", home=tmp_path)
    assert code == got.returncode == 0 and len(got.stdout) == len(old) and got.stdout != old, got.stderr
    assert NodeToken.objects.get(node_name="gpu01").key_hash == NodeToken.hash_key(got.stdout.strip())
    # A staff user's token is a superuser's to give out.
    got = remote(live_server.url, key, "token", "create", "alice", "--role", "viewer", home=tmp_path)
    assert got.stderr == f"error: {live_server.url} refused: username: alice is an admin; only a superuser " \
        "gives out an admin's token\n"


CSV = (
    "Name,Power Panel,Rack,Status,Type,Voltage,Amperage,Phase,Max Utilization\n"
    "A1,panel 1,r1-01,Active,Primary,415,32,Three-phase,80%\n"
    "B1,panel 1,r1-01,Active,Redundant,415,16,Three-phase,80%\n"
)


def test_netbox_import_remote_prints_the_same(live_server, make_user, capsys, tmp_path, settings):
    from facility.models import Feed
    from tests.fakes.netbox import FakeNetbox
    from tests.integration.test_netbox_import import netbox_data

    _, key = make_user("op", role="operator")
    (tmp_path / "feeds.csv").write_text(CSV)
    csv = ("facility", "import", "netbox", "--csv", str(tmp_path / "feeds.csv"))
    for fmt in ((), ("-o", "json")):
        out = same(capsys, live_server.url, key, tmp_path, *csv, "--dry-run", *fmt)
    assert json.loads(out)["applied"] is False and len(json.loads(out)["feeds_added"]) == 2
    assert not Feed.objects.exists()  # the dry runs wrote nothing
    code, here, err = local(capsys, *csv)
    assert code == 0 and here.endswith("3 changes applied\n"), err  # 2 feeds and the rack's cap
    Feed.objects.all().delete()
    got = remote(live_server.url, key, *csv, home=tmp_path)
    assert (got.returncode, got.stdout) == (0, here), got.stderr
    assert sorted(Feed.objects.values_list("name", flat=True)) == ["A1", "B1"]

    token = tmp_path / "nb.token"
    token.write_text("t0ken\n")
    with FakeNetbox(netbox_data()) as nb:
        argv = ("facility", "import", "netbox", "--url", nb.url, "--token-file", str(token), "--site", "sto2",
                "--dry-run", "-o", "json")
        # The server reads no NetBox its admins did not name.
        got = remote(live_server.url, key, *argv, home=tmp_path)
        assert got.returncode == 1 and got.stderr.startswith(
            "error: url: this server reads only the NetBox its LLMGW_NETBOX_URLS names (none is set)"), got.stderr
        settings.LLMGW_NETBOX_URLS = [nb.url]
        here, there = both(capsys, live_server.url, key, tmp_path, *argv)
        assert here[0] == there[0] == 0 and json.loads(here[1]) == json.loads(there[1]), (here, there)
        assert len(json.loads(here[1])["feeds_added"]) == 8


def test_a_viewer_is_refused_every_change(live_server, make_user, capsys, tmp_path):
    from facility.models import Budget, ConditionOverride, FacilitySettings, Feed
    from placement.models import Model

    _, key = make_user("viewer1", role="viewer")
    (tmp_path / "models.yaml").write_text(TWO_MODELS)
    (tmp_path / "server.yaml").write_text("facility:\n  margin: 0.3\n")
    (tmp_path / "feeds.csv").write_text(CSV)
    refused = f"error: {live_server.url} refused: your role does not allow this: reading needs the viewer role, " \
        "changes the operator role\n"
    for argv in (
        ("facility", "budget", "set", "rack:r1-02", "--cap-watts", "1000"),
        ("facility", "budget", "delete", "rack:r1-01"),
        ("facility", "condition", "set", "rack:r1-01", "hot", "--reason", "x"),
        ("facility", "condition", "clear", "rack:r1-01"),
        ("delete", "model", "llama"),
        ("apply", "-f", str(tmp_path / "models.yaml")),
        ("facility", "apply", "-f", str(tmp_path / "server.yaml")),
        ("facility", "import", "netbox", "--csv", str(tmp_path / "feeds.csv")),
        ("token", "create", "bob"),
        ("node", "token", "gpu01"),
    ):
        got = remote(live_server.url, key, *argv, home=tmp_path)
        assert (got.returncode, got.stdout) == (1, ""), argv
        assert got.stderr == refused.replace("reading needs the viewer role, changes the operator role",
                                             "tokens are made by an admin (a staff user)") \
            if "token" in argv else got.stderr == refused, (argv, got.stderr)
    assert list(Budget.objects.values_list("domain", flat=True)) == ["rack:r1-01"]
    assert not ConditionOverride.objects.exists() and not Feed.objects.exists()
    assert list(Model.objects.values_list("name", flat=True)) == ["llama"]
    assert FacilitySettings.load().margin != 0.3


def test_a_remote_nodes_filter_that_finds_nothing_says_what_it_could_have_meant(live_server, make_user, tmp_path):
    _, key = make_user("viewer1", role="viewer")
    got = remote(live_server.url, key, "nodes", "--domain", "rack:r1-1", home=tmp_path)
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines()[-1] == "warning: No node is in rack r1-1. Did you mean rack:r1-01, rack:r1-02?"
