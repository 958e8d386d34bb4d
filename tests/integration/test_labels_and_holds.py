"""Location labels (agent's and store's), domains, holds — through the services every interface calls."""

from __future__ import annotations

import pytest

from agents import services
from agents.models import Node
from facility import nodes as selectors
from facility.services import hold_create, hold_release
from llmgw.errors import InvalidInput, NotFound

pytestmark = pytest.mark.django_db


def test_store_label_wins_over_agent_and_removal_goes_back_to_agent(join_node):
    join_node("gpu01", rack="r1")
    services.labels_set(node_name="gpu01", changes={"llmgw.io/rack": "r12-07"})
    node = Node.objects.get(name="gpu01")
    assert node.labels["llmgw.io/rack"] == "r12-07"
    assert sorted(node.domains.values_list("domain", flat=True)) == ["rack:r12-07"]

    services.labels_set(node_name="gpu01", changes={"llmgw.io/rack": None})
    node.refresh_from_db()
    assert node.labels["llmgw.io/rack"] == "r1"
    assert list(node.domains.values_list("domain", flat=True)) == ["rack:r1"]


def test_labels_set_before_the_node_joins_apply_when_it_does(join_node):
    services.labels_set(node_name="gpu09", changes={"llmgw.io/rack": "r3", "llmgw.io/pdu": "r3-a,r3-b"})
    node = join_node("gpu09", rack="r1")
    assert node.labels["llmgw.io/rack"] == "r3"
    assert sorted(node.domains.values_list("domain", flat=True)) == ["pdu:r3-a", "pdu:r3-b", "rack:r3"]


def test_misspelt_key_is_refused_with_the_valid_keys_and_nothing_applied(join_node):
    join_node("gpu01", rack="r1")
    with pytest.raises(InvalidInput) as exc:
        services.labels_set(node_name="gpu01", changes={"llmgw.io/row": "12", "llmgw.io/rak": "r2"})
    assert exc.value.message == (
        "labels: unknown label key 'llmgw.io/rak': the llmgw.io/ keys are llmgw.io/site, llmgw.io/room, "
        "llmgw.io/row, llmgw.io/rack, llmgw.io/pdu, llmgw.io/leg"
    )
    assert "llmgw.io/row" not in Node.objects.get(name="gpu01").labels


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("llmgw.io/rack", "r 12", "labels: llmgw.io/rack='r 12': a value takes letters, digits, '.', '_' and '-' only"),
        (
            "llmgw.io/pdu",
            "a;b",
            "labels: llmgw.io/pdu='a;b': a value takes letters, digits, '.', '_' and '-' (and ',' between PDUs) only",
        ),
    ],
)
def test_bad_location_value_is_refused(join_node, key, value, message):
    join_node("gpu01")
    with pytest.raises(InvalidInput) as exc:
        services.labels_set(node_name="gpu01", changes={key: value})
    assert exc.value.message == message


def test_free_form_labels_are_kept_but_make_no_domain(join_node):
    join_node("gpu01")
    labels = services.labels_set(node_name="gpu01", changes={"spot": "true"})
    assert labels["spot"] == "true"
    assert not Node.objects.get(name="gpu01").domains.exists()


def test_a_dual_fed_rack_puts_the_node_in_both_pdus(join_node):
    node = join_node("gpu01", rack="r12-07", pdu="r12-07-a,r12-07-b")
    assert sorted(node.domains.values_list("domain", flat=True)) == ["pdu:r12-07-a", "pdu:r12-07-b", "rack:r12-07"]


def test_a_node_labelled_into_a_held_domain_later_is_held(join_node):
    join_node("gpu01", rack="r1")
    join_node("gpu02", rack="r2")
    hold_create(domain="rack:r2", reason="PDU swap")
    states = {r.name: r.state for r in selectors.node_rows()}
    assert states == {"gpu01": "ready", "gpu02": "held"}

    services.labels_set(node_name="gpu01", changes={"llmgw.io/rack": "r2"})
    rows = {r.name: r for r in selectors.node_rows()}
    assert rows["gpu01"].state == "held"
    assert rows["gpu01"].hold.reason == "PDU swap"

    hold_release(domain="rack:r2")
    assert {r.name: r.state for r in selectors.node_rows()} == {"gpu01": "ready", "gpu02": "ready"}


def test_a_pdu_hold_holds_every_node_on_it(join_node):
    join_node("gpu01", rack="r1", pdu="p1-a,p1-b")
    join_node("gpu02", rack="r2", pdu="p1-b,p2-a")
    join_node("gpu03", rack="r3", pdu="p3-a")
    hold_create(domain="pdu:p1-b", reason="breaker test")
    assert {r.name: r.state for r in selectors.node_rows()} == {"gpu01": "held", "gpu02": "held", "gpu03": "ready"}


def test_hold_needs_a_parsable_domain_and_a_reason():
    with pytest.raises(InvalidInput) as exc:
        hold_create(domain="shelf:s1", reason="x")
    assert exc.value.message == "domain: 'shelf:s1': unknown level 'shelf'; levels are site, room, row, rack, pdu, leg"
    with pytest.raises(InvalidInput) as exc:
        hold_create(domain="rack:r1", reason="  ")
    assert exc.value.field == "reason"
    with pytest.raises(NotFound) as exc:
        hold_release(domain="rack:r1")
    assert exc.value.message == "rack:r1 is not held"


def test_node_filter_by_domain(join_node):
    join_node("gpu01", rack="r1", pdu="p1")
    join_node("gpu02", rack="r2", pdu="p1")
    join_node("gpu03")
    assert [r.name for r in selectors.node_rows(domain="pdu:p1")] == ["gpu01", "gpu02"]
    assert [r.name for r in selectors.node_rows(domain="rack:r2")] == ["gpu02"]
    rows = selectors.node_rows()
    assert rows[2].location_text == "-"
    assert rows[0].location_text == "rack=r1 pdu=p1"


def test_a_location_key_in_other_case_is_refused_not_taken_as_free_form(join_node):
    join_node("gpu01")
    with pytest.raises(InvalidInput) as exc:
        services.labels_set(node_name="gpu01", changes={"Llmgw.io/rack": "r1"})
    assert exc.value.message.startswith("labels: unknown label key 'Llmgw.io/rack'")


def test_a_long_cordon_reason_is_refused_naming_the_field(join_node):
    join_node("gpu01")
    with pytest.raises(InvalidInput) as exc:
        services.node_cordon(node_name="gpu01", cordoned=True, reason="x" * 501)
    assert exc.value.message == "reason: at most 500 characters"
