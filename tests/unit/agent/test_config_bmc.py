"""agent.yaml's bmc: block: the BMC's Redfish URL, its credentials file, TLS and chassis; errors name line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.node.config import AgentConfigError, BmcSettings, load_config

HEAD = "server: http://cp\nnode: gpu01\ntoken: t\n"


def config(tmp_path: Path, bmc: str, credentials: str | None = "root:calvin\n", head: str = HEAD):
    if credentials is not None:
        (tmp_path / "bmc-credentials").write_text(credentials)
    (tmp_path / "agent.yaml").write_text(head + bmc)
    return load_config(tmp_path / "agent.yaml")


def refusal(tmp_path: Path, bmc: str, **kwargs) -> str:
    with pytest.raises(AgentConfigError) as refused:
        config(tmp_path, bmc, **kwargs)
    return str(refused.value).removeprefix(f"{tmp_path / 'agent.yaml'} ")


def test_a_full_block_loads(tmp_path: Path):
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    loaded = config(
        tmp_path,
        "bmc:\n  redfish: https://10.0.0.17/redfish/v1/\n  credentials_file: bmc-credentials\n"
        "  ca_file: ca.pem\n  chassis: 1U\n  deadline_seconds: 3\n",
    )
    assert loaded.bmc == BmcSettings(
        redfish="https://10.0.0.17",
        username="root",
        password="calvin",
        verify_tls=True,
        ca_file=str(tmp_path / "ca.pem"),
        chassis="1U",
        deadline_seconds=3.0,
    )
    assert "calvin" not in repr(loaded)


def test_defaults_verify_tls_and_a_deadline_under_the_interval(tmp_path: Path):
    bmc = "bmc:\n  redfish: http://127.0.0.1:8000\n  credentials_file: bmc-credentials\n"
    loaded = config(tmp_path, bmc)
    assert (loaded.bmc.verify_tls, loaded.bmc.chassis, loaded.bmc.deadline_seconds) == (True, None, 5.0)
    assert config(tmp_path, bmc, head=HEAD + "interval_seconds: 2\n").bmc.deadline_seconds == 1.0
    assert config(tmp_path, "").bmc is None


@pytest.mark.parametrize(
    ("bmc", "message"),
    [
        (
            "bmc: https://bmc\n",
            "line 4: bmc: a mapping: redfish and credentials_file, and optionally verify_tls, ca_file, chassis, "
            "deadline_seconds",
        ),
        (
            "bmc:\n  credentials_file: bmc-credentials\n",
            "line 4: bmc.redfish: required: the BMC's Redfish URL, e.g. https://10.0.0.17",
        ),
        (
            "bmc:\n  redfish: bmc01\n  credentials_file: bmc-credentials\n",
            "line 5: bmc.redfish: an http:// or https:// URL of the BMC (e.g. https://10.0.0.17), got 'bmc01'",
        ),
        ("bmc:\n  redfish: https://bmc\n", "line 4: bmc.credentials_file: required: a file holding the BMC's user:password"),
        (
            "bmc:\n  redfish: https://bmc\n  credentials_file: bmc-credentials\n  verify_tls: no thanks\n",
            "line 7: bmc.verify_tls: true or false, got 'no thanks'",
        ),
        (
            "bmc:\n  redfish: https://bmc\n  credentials_file: bmc-credentials\n  chassis: 1U/../x\n",
            "line 7: bmc.chassis: the chassis' Id as its BMC names it (e.g. 1U), or its path (e.g. "
            "/redfish/v1/Chassis/RackMount/Baseboard), got '1U/../x'",
        ),
        (
            "bmc:\n  redfish: https://bmc\n  credentials_file: bmc-credentials\n  deadline_seconds: 10\n",
            "line 7: bmc.deadline_seconds: less than interval_seconds (10 s): a BMC read ends before the next "
            "heartbeat, got 10",
        ),
        (
            "bmc:\n  redfish: https://bmc\n  credentials_file: bmc-credentials\n  deadline_seconds: 0\n",
            "line 7: bmc.deadline_seconds: a number of seconds, more than 0, got 0",
        ),
        (
            "bmc:\n  redfish: https://bmc\n  credentials_file: bmc-credentials\n  password: calvin\n",
            "line 7: bmc.password: unknown key; bmc takes: redfish, credentials_file, verify_tls, ca_file, chassis, "
            "deadline_seconds",
        ),
        (
            "bmc:\n  redfish: https://bmc\n  credentials_file: bmc-credentials\n  verify_tls: false\n  ca_file: x\n",
            None,  # the CA file does not exist: said first (see below)
        ),
    ],
)
def test_bad_blocks_are_refused_naming_field_and_line(tmp_path: Path, bmc: str, message: str | None):
    said = refusal(tmp_path, bmc)
    if message is not None:
        assert said == message
    else:
        assert said == f"line 8: bmc.ca_file: {str(tmp_path / 'x')!r} is not a file"


def test_a_ca_file_with_verify_tls_false_is_a_contradiction(tmp_path: Path):
    (tmp_path / "ca.pem").write_text("")
    bmc = "bmc:\n  redfish: https://bmc\n  credentials_file: bmc-credentials\n  verify_tls: false\n  ca_file: ca.pem\n"
    assert refusal(tmp_path, bmc) == (
        "line 8: bmc.ca_file: a CA file checks the BMC's certificate: remove verify_tls: false"
    )


@pytest.mark.parametrize("credentials", ["root\n", ":calvin\n", "root:\n", "root:calvin\nadmin:admin\n", ""])
def test_credentials_are_one_line_user_colon_password(tmp_path: Path, credentials: str):
    bmc = "bmc:\n  redfish: https://bmc\n  credentials_file: bmc-credentials\n"
    path = tmp_path / "bmc-credentials"
    assert refusal(tmp_path, bmc, credentials=credentials) == (
        f"line 6: bmc.credentials_file: {str(path)!r} must hold one line, user:password"
    )


def test_an_unreadable_credentials_file_is_named(tmp_path: Path):
    bmc = "bmc:\n  redfish: https://bmc\n  credentials_file: nowhere\n"
    assert refusal(tmp_path, bmc, credentials=None) == (
        f"line 6: bmc.credentials_file: cannot read {str(tmp_path / 'nowhere')!r}: No such file or directory"
    )


def test_a_password_may_hold_colons(tmp_path: Path):
    bmc = "bmc:\n  redfish: https://bmc\n  credentials_file: bmc-credentials\n"
    loaded = config(tmp_path, bmc, credentials="admin:pa:ss:word\n")
    assert (loaded.bmc.username, loaded.bmc.password) == ("admin", "pa:ss:word")
