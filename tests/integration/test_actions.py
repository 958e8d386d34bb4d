"""One use case per operator action (placement.services: labels, budgets, cordon and drain, as holds
already were): the API, ctl and the admin call the same service and say the same warnings for the same
change, and a warning never stops the change it comes with."""

from __future__ import annotations

import pytest

from agents.models import Node, StoreLabel
from facility.models import Budget
from llmgw.ctl import main as ctl
from placement.services import budget_change, labels_change, model_apply

pytestmark = pytest.mark.django_db(transaction=True)

TYPO = "no node is in rack r1-10 yet; known racks nearest that name: r1-01, r1-02"
NO_LIMIT = "rack r1-01 has no power limit any more: nothing refuses a replica there for power"


@pytest.fixture
def site(join_node):
    join_node("gpu01", rack="r1-01", pdu="p1")
    join_node("gpu02", rack="r1-02", pdu="p2")
    model_apply(data={"kind": "Model", "name": "llama", "replicas": 1, "profile": {"gpus": 8}})


def said(capsys, *argv: str) -> list[str]:
    """ctl's warning lines for `argv` (run on the database here)."""
    code = ctl(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return [line.removeprefix("warning: ") for line in out.splitlines() if line.startswith("warning: ")]


def test_a_label_into_a_rack_no_node_is_in_is_warned_alike_by_the_api_ctl_and_the_admin(
    site, api, capsys, admin_client
):
    answer = api.post("/api/v1/nodes/gpu02/labels", {"labels": {"llmgw.io/rack": "r1-10"}}, format="json").json()
    assert answer["warning"] == TYPO and answer["labels"]["llmgw.io/rack"] == "r1-10"
    labels_change(node_name="gpu02", changes={"llmgw.io/rack": None})  # back to its agent's r1-02
    assert said(capsys, "label", "gpu02", "llmgw.io/rack=r1-10") == [TYPO]
    labels_change(node_name="gpu02", changes={"llmgw.io/rack": None})
    page = admin_client.post(
        "/admin/agents/storelabel/add/", {"node_name": "gpu02", "key": "llmgw.io/rack", "value": "r1-10"}, follow=True
    )
    assert TYPO in [str(m) for m in page.context["messages"]]
    assert StoreLabel.objects.get(node_name="gpu02").value == "r1-10"  # warned, and written


def test_a_budget_below_the_racks_use_is_written_and_says_nothing_new_goes_there(site, api, capsys):
    answer = api.post("/api/v1/facility/budgets", {"domain": "rack:r1-01", "cap_watts": 1000}, format="json").json()
    (warning,) = answer["warning"].split("; ")
    assert warning.startswith("rack r1-01 uses ") and warning.endswith(
        ", above its 0.9 kW limit: nothing new is placed there until its use is below"
    ), warning
    assert Budget.objects.get(domain="rack:r1-01").cap_watts == 1000
    assert said(capsys, "facility", "budget", "set", "rack:r1-01", "--cap-watts", "1000") == [warning]
    # A cap the rack's use is within says nothing.
    assert budget_change(domain="rack:r1-01", cap_watts=100_000).warnings == []


def test_a_budget_on_a_mistyped_rack_is_warned_and_its_removal_says_no_limit_is_left(
    site, api, capsys, admin_client
):
    page = admin_client.post(
        "/admin/facility/budget/add/", {"domain": "rack:r1-10", "cap_watts": "9000", "other_watts": "0"}, follow=True
    )
    assert TYPO in [str(m) for m in page.context["messages"]]
    answer = api.post("/api/v1/facility/budgets", {"domain": "rack:r1-10", "cap_watts": 9000}, format="json").json()
    assert answer["warning"] == TYPO
    # Its other equipment alone past its limit: said as well, no node in it or not.
    body = {"domain": "rack:r1-10", "cap_watts": 1000, "other_watts": 5000}
    answer = api.post("/api/v1/facility/budgets", body, format="json").json()
    assert answer["warning"] == (
        f"{TYPO}; rack r1-10 uses 5.0 kW now, above its 0.9 kW limit: nothing new is placed there until its use is below"
    )
    budget_change(domain="rack:r1-10", cap_watts=9000, other_watts=0)

    budget_change(domain="rack:r1-01", cap_watts=100_000)
    answer = api.delete("/api/v1/facility/budgets/rack:r1-01")
    assert (answer.status_code, answer.json()) == (200, {"domain": "rack:r1-01", "warning": NO_LIMIT})
    budget_change(domain="rack:r1-01", cap_watts=100_000)
    assert said(capsys, "facility", "budget", "delete", "rack:r1-01") == [NO_LIMIT]
    assert not Budget.objects.filter(domain="rack:r1-01").exists()


def test_a_drain_with_nowhere_to_go_is_warned_before_and_its_stop_after(site, api, capsys):
    placed_on = Node.objects.get(shards__replica__model__name="llama").name
    other = "gpu02" if placed_on == "gpu01" else "gpu01"
    Node.objects.filter(name=other).update(cordoned=True)
    answer = api.post(f"/api/v1/nodes/{placed_on}/cordon", {"cordoned": True, "drain": True}, format="json").json()
    (warning,) = answer["warning"].split("; ")
    assert warning == "llama#1 could not move: no node fits (2 nodes): 2 × cordoned"
    assert (answer["cordoned"], answer["draining"]) == (True, True)  # warned, and draining

    answer = api.post(f"/api/v1/nodes/{placed_on}/cordon", {"cordoned": False}, format="json").json()
    assert answer["warning"] == f"{placed_on}'s drain stops: the replicas moved so far stay where they are"
    assert said(capsys, "drain", placed_on) == [warning]
    assert said(capsys, "uncordon", placed_on) == [answer["warning"]]
    # A drain that is done (nothing left on the node) stops nothing: uncordoning it says nothing of one.
    Node.objects.filter(name=other).update(cordoned=True, draining=True)
    answer = api.post(f"/api/v1/nodes/{other}/cordon", {"cordoned": False}, format="json").json()
    assert answer.get("warning") is None and not answer["draining"]
    # Cordoning alone moves nothing: nothing to warn of.
    assert said(capsys, "cordon", placed_on) == []
