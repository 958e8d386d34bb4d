"""`llmgw ctl` as an operator types it: output, -o json, and refusals on stderr with exit 1."""

from __future__ import annotations

import json
import textwrap

import pytest

from llmgw.ctl import main as ctl

pytestmark = pytest.mark.django_db(transaction=True)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = ctl(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_nodes_table_and_json(capsys, join_node):
    join_node("gpu01", rack="r12-07", pdu="r12-07-a,r12-07-b")
    join_node("gpu02")
    code, out, _ = run(capsys, "nodes")
    assert code == 0
    assert out.splitlines() == [
        "NAME   STATE  GPUS FREE/TOTAL  CONDITION  LOCATION",
        "gpu01  ready  8/8              unknown    rack=r12-07 pdu=r12-07-a,r12-07-b",
        "gpu02  ready  8/8              unknown    -",
    ]
    code, out, _ = run(capsys, "nodes", "--domain", "pdu:r12-07-b", "-o", "json")
    assert [n["name"] for n in json.loads(out)] == ["gpu01"]
    # The console's filter: a rack's name, a label, several; a term no node has says so, as the console does.
    for given in ("r12-07", "llmgw.io/rack=r12-07", "rack:r12-07 pdu:r12-07-a"):
        code, out, _ = run(capsys, "nodes", "--domain", given, "-o", "json")
        assert [n["name"] for n in json.loads(out)] == ["gpu01"], given
    code, out, _ = run(capsys, "nodes", "--domain", "rack:r12-7")
    assert (code, out.splitlines()) == (0, [
        "NAME  STATE  GPUS FREE/TOTAL  CONDITION  LOCATION",
        "warning: No node is in rack r12-7. Did you mean rack:r12-07?",
    ])
    code, _, err = run(capsys, "nodes", "--domain", "rack:")
    assert code == 1 and err.startswith("error: domain: ")


def test_nodes_by_state(capsys, join_node):
    join_node("gpu01", rack="r1")
    join_node("gpu02", rack="r1")
    assert run(capsys, "cordon", "gpu02")[0] == 0
    code, out, _ = run(capsys, "nodes", "--state", "cordoned", "-o", "json")
    assert (code, [n["name"] for n in json.loads(out)]) == (0, ["gpu02"])


def test_an_option_a_command_does_not_take_is_refused_by_that_command(capsys):
    with pytest.raises(SystemExit) as code:
        ctl(["facility", "events", "--since", "5"])
    err = capsys.readouterr().err
    assert code.value.code == 2
    assert err.splitlines()[0].startswith("usage: llmgw ctl facility events ")
    assert err.splitlines()[-1] == "llmgw ctl facility events: error: unrecognized arguments: --since 5"
    assert run(capsys, "facility", "events", "--limit", "0")[2] == "error: --limit: a whole number from 1 up\n"
    assert run(capsys, "facility", "events", "--limit", "1", "-o", "json")[0] == 0


def test_events_of_a_domain_no_node_is_in_says_so_with_the_nearest_names(capsys, join_node):
    join_node("gpu01", rack="r1-01")
    join_node("gpu02", rack="r1-02")
    code, out, _ = run(capsys, "facility", "events", "--domain", "rack:r1-1")
    assert (code, out.splitlines()) == (0, [
        "AT (UTC)  DOMAIN  FROM  TO  REASON",
        "warning: no node is in rack r1-1 yet; known racks nearest that name: r1-01, r1-02",
    ])
    # A domain nodes are in, with no change yet, is no typo; -o json stays the list alone.
    assert run(capsys, "facility", "events", "--domain", "rack:r1-01")[1] == "AT (UTC)  DOMAIN  FROM  TO  REASON\n"
    assert run(capsys, "facility", "events", "--domain", "rack:r1-1", "-o", "json")[1] == "[]\n"


def test_label_then_remove_back_to_the_agents_value(capsys, join_node):
    join_node("gpu01", rack="r1")
    code, out, _ = run(capsys, "label", "gpu01", "llmgw.io/rack=r12-07", "llmgw.io/pdu=r12-07-a,r12-07-b")
    assert code == 0
    assert "llmgw.io/rack=r12-07" in out
    code, out, _ = run(capsys, "label", "gpu01", "llmgw.io/rack-")
    assert "llmgw.io/rack=r1" in out


def test_label_refusals(capsys):
    code, _, err = run(capsys, "label", "gpu01", "llmgw.io/rak=r1")
    assert code == 1
    assert err.startswith("error: labels: unknown label key 'llmgw.io/rak': the llmgw.io/ keys are llmgw.io/site")
    code, _, err = run(capsys, "label", "gpu01", "rack")
    assert err == "error: 'rack': write key=value to set a label or key- to remove it\n"


def test_facility_apply_hold_release_and_listing(capsys, tmp_path, join_node):
    join_node("gpu01", rack="r12-07", pdu="r12-07-a")
    server = tmp_path / "server.yaml"
    server.write_text(
        textwrap.dedent(
            """\
            facility:
              margin: 0.1
              node_watts: 350
              budgets:
                - domain: rack:r12-07
                  cap_watts: 16000
                  other_watts: 800
            """
        )
    )
    code, out, _ = run(capsys, "facility", "apply", "-f", str(server))
    assert out == f"{server}: applied (1 budgets created, 0 updated, 0 removed)\n"
    code, out, _ = run(capsys, "facility", "hold", "rack:r12-07", "--reason", "PDU swap", "--drain")
    assert out == "rack:r12-07 held and draining: PDU swap\n"
    code, out, _ = run(capsys, "facility")
    assert out.splitlines() == [
        "DOMAIN        NODES  USE     LIMIT    CONDITION  HOLD                             SOURCE",
        "rack:r12-07   1      1.1 kW  14.4 kW  unknown    held (drain: drained): PDU swap  budget",
        "pdu:r12-07-a  1      0.3 kW  -        unknown    -                                -",
    ]
    code, out, _ = run(capsys, "facility", "-o", "wide")  # the reserved and measured draw beside
    assert out.splitlines() == [
        "DOMAIN        NODES  USE     LIMIT    RESERVED  MEASURED PEAK 15m  CONDITION  HOLD                             SOURCE",
        "rack:r12-07   1      1.1 kW  14.4 kW  0.0 kW    -                  unknown    held (drain: drained): PDU swap  budget",
        "pdu:r12-07-a  1      0.3 kW  -        0.0 kW    -                  unknown    -                                -",
    ]
    code, out, _ = run(capsys, "nodes")
    assert "held" in out.splitlines()[1]
    code, out, _ = run(capsys, "facility", "release", "rack:r12-07")
    assert out == "rack:r12-07 released\n"
    code, out, _ = run(capsys, "facility", "-o", "json")
    assert json.loads(out)["domains"][0]["hold"] is None
    # A domain past its limit is said under the table, not left to a comparison of USE and LIMIT.
    run(capsys, "facility", "budget", "set", "pdu:r12-07-a", "--cap-watts", "300")
    code, out, _ = run(capsys, "facility")
    assert out.splitlines()[3:] == ["pdu:r12-07-a: over its limit by 80 W (0.3 kW in use of a 0.3 kW limit)"]


def test_an_apply_that_removes_budgets_or_feeds_names_them_and_needs_yes(capsys, tmp_path):
    from facility.models import Budget, Feed

    server = tmp_path / "server.yaml"
    server.write_text(
        "facility:\n  budgets:\n    - {domain: rack:r1-01, cap_watts: 16000}\n    - {domain: rack:r1-02, cap_watts: 16000}\n"
        "  feeds:\n    - {name: A101, voltage: 415, amperage: 32, phase: three, pdus: [r1-01-a]}\n"
        "    - {name: B101, voltage: 415, amperage: 32, phase: three, pdus: [r1-01-b]}\n"
    )
    assert run(capsys, "facility", "apply", "-f", str(server))[0] == 0
    other = tmp_path / "other.yaml"
    other.write_text("facility:\n  margin: 0.2\n  budgets:\n    - {domain: rack:r12-07, cap_watts: 16000}\n  feeds: []\n")
    assert run(capsys, "facility", "apply", "-f", str(other)) == (1, "", (
        f"error: {other} would remove 2 budgets: rack:r1-01, rack:r1-02; 2 feeds: A101, B101\n"
        "nothing was applied: give --yes to apply it and remove them\n"
    ))
    assert sorted(Budget.objects.filter(source="file").values_list("domain", flat=True)) == ["rack:r1-01", "rack:r1-02"]
    assert Feed.objects.count() == 2
    code, out, _ = run(capsys, "facility", "apply", "-f", str(other), "--yes")
    assert (code, out) == (0, f"{other}: applied (1 budgets created, 0 updated, 2 removed: rack:r1-01, rack:r1-02; "
                              "0 feeds created, 0 updated, 2 removed: A101, B101)\n")


def test_a_bad_server_yaml_names_the_line(capsys, tmp_path):
    server = tmp_path / "server.yaml"
    server.write_text("facility:\n  margin: 2\n")
    code, _, err = run(capsys, "facility", "apply", "-f", str(server))
    assert code == 1
    assert err == f"error: {server} line 2: facility.margin: must be in [0, 1) (a share of the cap kept free), got 2\n"


def test_token_create_prints_a_working_token(capsys, client):
    code, out, _ = run(capsys, "token", "create", "alice", "--role", "operator")
    key = out.strip()
    assert len(key) == 40
    response = client.get("/api/v1/nodes", HTTP_AUTHORIZATION=f"Token {key}")
    assert response.status_code == 200


def test_node_token_and_cordon(capsys, join_node):
    code, out, _ = run(capsys, "node", "token", "gpu01")
    assert out.startswith("node_")
    join_node("gpu01")
    code, out, _ = run(capsys, "cordon", "gpu01", "--reason", "fan")
    assert out == "gpu01 cordoned\n"
    _, out, _ = run(capsys, "nodes")
    assert out.splitlines()[1].split()[1] == "cordoned"
    code, _, err = run(capsys, "cordon", "gpu99")
    assert (code, err) == (1, "error: node 'gpu99' is not known\n")


def test_the_states_ctl_offers_are_the_apis():
    from agents.cli import NODE_STATES
    from agents.filtersets import STATES

    assert NODE_STATES == STATES


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (("headroom", "llama\udcff"), "model"),
        (("explain-placement", "llama\udcff"), "model"),
        (("delete", "model", "llama\udcff"), "name"),
        (("node", "show", "gpu\udcff"), "node"),
        (("label", "gpu\udcff", "a=b"), "node"),
        (("cordon", "gpu\udcff", "--reason", "x"), "node"),
        (("facility", "release", "rack:r1\udcff"), "domain"),
        (("facility", "budget", "delete", "rack:r1\udcff"), "domain"),
    ],
)
def test_a_name_with_a_byte_that_is_not_utf_8_is_refused_naming_its_field_not_a_traceback(capsys, argv, field):
    # A shell passes such a byte as a lone surrogate ($'llama\xff'): no path and no database takes it.
    code, out, err = run(capsys, *argv)
    assert (code, out, err) == (1, "", f"error: {field}: must not contain lone surrogates (not valid Unicode)\n")
