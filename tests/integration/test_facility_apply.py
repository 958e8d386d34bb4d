"""server.yaml's facility block: applied whole and idempotently, or refused naming the line and the field."""

from __future__ import annotations

import textwrap

import pytest

from facility.models import Budget, FacilitySettings, Feed, Source
from facility.services import budget_set, facility_apply
from llmgw.errors import Conflict, InvalidInput

pytestmark = pytest.mark.django_db

GOOD = textwrap.dedent(
    """\
    facility:
      margin: 0.1
      gpu_watts: 700
      cpu_core_watts: 10
      node_watts: 350
      budgets:
        - domain: rack:r12-07
          cap_watts: 16000
          other_watts: 800
        - domain: pdu:r12-07-a
          cap_watts: 7400
    """
)


def budgets() -> dict[str, tuple[float, float]]:
    return {b.domain: (b.cap_watts, b.other_watts) for b in Budget.objects.all()}


def test_apply_sets_settings_and_budgets_and_is_idempotent():
    assert facility_apply(text=GOOD) == {
        "created": 2, "updated": 0, "unchanged": 0, "removed": 0, "removed_domains": [], "warnings": []
    }
    # Applied again as it is: nothing written, and said so.
    assert facility_apply(text=GOOD) == {
        "created": 0, "updated": 0, "unchanged": 2, "removed": 0, "removed_domains": [], "warnings": []
    }
    assert budgets() == {"rack:r12-07": (16000, 800), "pdu:r12-07-a": (7400, 0)}
    settings = FacilitySettings.load()
    assert (settings.margin, settings.gpu_watts, settings.cpu_core_watts, settings.node_watts) == (0.1, 700, 10, 350)


def test_the_file_owns_the_rows_it_names_and_leaves_others_alone():
    budget_set(domain="rack:r1", cap_watts=9000)
    facility_apply(text=GOOD)
    smaller = GOOD.replace("    - domain: pdu:r12-07-a\n      cap_watts: 7400\n", "")
    assert facility_apply(text=smaller)["removed"] == 1
    assert budgets() == {"rack:r12-07": (16000, 800), "rack:r1": (9000, 0)}
    assert Budget.objects.get(domain="rack:r1").source == Source.API


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "cap_watts: 16000",
            "cap_watts: -5",
            "server.yaml line 8: facility.budgets[0].cap_watts: must not be negative (got -5)",
        ),
        ("margin: 0.1", "margin: 1.0", "server.yaml line 2: facility.margin: must be in [0, 1) (a share of the cap kept free), got 1"),
        (
            "domain: pdu:r12-07-a",
            "domain: pdu-r12-07-a",
            "server.yaml line 10: facility.budgets[1].domain: 'pdu-r12-07-a' is not a domain: write level:name, "
            "with level one of site, room, row, rack, pdu, leg",
        ),
        (
            "node_watts: 350",
            "node_wats: 350",
            "server.yaml line 5: facility.node_wats: unknown key; facility takes: margin, gpu_watts, cpu_core_watts, "
            "node_watts, measured_window, location_from, budgets, conditions, sources, feeds, shedding, capping, netbox",
        ),
        (
            "other_watts: 800",
            "other_watts: 800\n      colour: red",
            "server.yaml line 10: facility.budgets[0].colour: unknown key; a budget takes: domain, cap_watts, other_watts",
        ),
        ("gpu_watts: 700", "gpu_watts: lots", "server.yaml line 3: facility.gpu_watts: must be a number of watts, not 'lots'"),
    ],
)
def test_a_bad_file_is_refused_whole_naming_line_and_field(old, new, message):
    facility_apply(text=GOOD)
    before = budgets()
    bad = GOOD.replace(old, new).replace("cap_watts: 7400", "cap_watts: 9999")
    with pytest.raises(InvalidInput) as exc:
        facility_apply(text=bad)
    assert exc.value.message == message
    assert budgets() == before


def test_not_yaml_names_the_line():
    with pytest.raises(InvalidInput) as exc:
        facility_apply(text="facility:\n  margin: [0.1\n")
    assert exc.value.message.startswith("server.yaml line 3: not valid YAML")


def test_a_file_without_budgets_changes_no_budget():
    facility_apply(text=GOOD)
    result = facility_apply(text="facility:\n  margin: 0.2\n")
    assert result["removed"] == 0
    assert budgets() == {"rack:r12-07": (16000, 800), "pdu:r12-07-a": (7400, 0)}
    assert FacilitySettings.load().margin == 0.2


def test_a_key_given_twice_is_refused_with_its_line():
    with pytest.raises(InvalidInput) as exc:
        facility_apply(text="facility:\n  margin: 0.1\n  margin: 0.2\n")
    assert exc.value.message == "server.yaml line 3: facility.margin: given twice"


def test_removed_budgets_are_named():
    facility_apply(text=GOOD)
    smaller = GOOD.replace("    - domain: pdu:r12-07-a\n      cap_watts: 7400\n", "")
    assert facility_apply(text=smaller)["removed_domains"] == ["pdu:r12-07-a"]


WITH_FEEDS = GOOD + (
    "  feeds:\n"
    "    - {name: B12, voltage: 415, amperage: 32, phase: three, max_utilization: 0.8, pdus: [r12-07-b]}\n"
    "    - {name: A12, voltage: 415, amperage: 32, phase: three, max_utilization: 0.8, pdus: [r12-07-a]}\n"
)


def test_an_unconfirmed_apply_that_removes_names_every_row_and_applies_nothing():
    facility_apply(text=WITH_FEEDS)
    smaller = (
        WITH_FEEDS.replace("margin: 0.1", "margin: 0.3")
        .replace("    - domain: pdu:r12-07-a\n      cap_watts: 7400\n", "")
        .replace("    - domain: rack:r12-07\n      cap_watts: 16000\n      other_watts: 800\n", "    []\n")
        .split("  feeds:\n")[0] + "  feeds: []\n"
    )
    with pytest.raises(Conflict) as refused:
        facility_apply(text=smaller, filename="new.yaml", confirm=False)
    assert refused.value.message == "new.yaml would remove 2 budgets: pdu:r12-07-a, rack:r12-07; 2 feeds: A12, B12"
    assert refused.value.field == "confirm"
    assert FacilitySettings.load().margin == 0.1 and Feed.objects.count() == 2
    assert Budget.objects.filter(source=Source.FILE).count() == 2

    # A file that removes nothing needs no confirmation; one confirmed removes what it names.
    assert facility_apply(text=WITH_FEEDS, confirm=False)["removed"] == 0
    one = WITH_FEEDS.replace("    - domain: pdu:r12-07-a\n      cap_watts: 7400\n", "")
    with pytest.raises(Conflict, match=r"^server.yaml would remove 1 budget: pdu:r12-07-a$"):
        facility_apply(text=one, confirm=False)
    assert facility_apply(text=one, confirm=True)["removed_domains"] == ["pdu:r12-07-a"]
