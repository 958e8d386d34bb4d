"""The demo's nodes draw from labelled legs of their PDUs (llmgw.io/leg), so what a facility team reads of
legs — ctl facility feeds' leg table, /metrics' llmgw_pdu_leg_imbalance_ratio and the dashboard's
leg-imbalance panel from it — has figures on the demo, and its placement is what it was without legs."""

from __future__ import annotations

import pytest

from facility.feed_selectors import feeds_overview
from llmgw.management.commands.demo import demo_nodes
from placement.models import Shard
from placement.reconcile import reconcile_all
from tests.integration.test_whatif import demo_loaded

pytestmark = pytest.mark.django_db(transaction=True)


def test_every_pdu_of_the_demo_has_its_three_legs_and_their_imbalance():
    demo_loaded()
    reconcile_all()
    legs = {row["pdu"]: row for feed in feeds_overview()["feeds"] for row in feed["legs"]}
    pdus = {pdu for spec in demo_nodes() for pdu in spec["labels"]["llmgw.io/pdu"].split(",")}
    assert set(legs) == pdus and len(pdus) == 16
    for row in legs.values():
        assert [leg["leg"] for leg in row["legs"]] == ["A", "B", "C"]
        assert row["imbalance"] is not None and row["imbalance"] > 0  # a rack's four nodes on three legs
    # Each node on one leg of each of its PDUs.
    for spec in demo_nodes():
        labels = spec["labels"]
        assert sorted(leg.rsplit(".", 1)[0] for leg in labels["llmgw.io/leg"].split(",")) == sorted(
            labels["llmgw.io/pdu"].split(","))


def test_the_demos_placement_is_the_one_its_docs_show():
    demo_loaded()
    reconcile_all()
    placed = sorted({(s.replica.model.name, s.node.name) for s in Shard.objects.select_related("replica__model", "node")})
    assert placed == [
        ("deepseek-v3", "gpu17"), ("deepseek-v3", "gpu18"), ("embed-small", "gpu01"), ("embed-small", "gpu05"),
        ("llama-70b", "gpu01"), ("llama-70b", "gpu05"), ("llama-70b", "gpu09"), ("llama-70b", "gpu13"),
        ("mixtral-8x22b", "gpu21"), ("mixtral-8x22b", "gpu25"), ("mixtral-8x22b", "gpu29"),
    ]
