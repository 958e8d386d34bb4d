"""The Nodes filter (one FilterSet for the console and the API): bare rack names, key=value labels, several
terms at once, the `level:name` form still; suggestions for a name or label value no node has; bad input
refused naming the field; queries that do not grow with nodes."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.test_console import login, row_names  # noqa: F401  (login: a fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture
def nodes(join_node):
    from agents.services import labels_set

    join_node("gpu01", rack="r12-07", pdu="r12-07-a", labels={"gpu.model": "H200"})
    join_node("gpu02", rack="r12-07", pdu="r12-07-b", labels={"gpu.model": "H100"})
    join_node("gpu03", rack="r12-08", pdu="r12-08-a", labels={"gpu.model": "H200"})
    join_node("gpu04", rack="b7", pdu="pdu-b7", labels={"llmgw.io/row": "r12-09"})
    labels_set(node_name="gpu04", changes={"pool": "batch"}, set_by="test")


def names(api, domain: str) -> list[str]:
    response = api.get("/api/v1/nodes", {"domain": domain})
    assert response.status_code == 200, response.content
    return [n["name"] for n in response.json()]


def test_the_api_takes_bare_names_labels_and_several_terms(nodes, api):
    assert names(api, "rack:r12-07") == ["gpu01", "gpu02"]
    assert names(api, "r12-07") == ["gpu01", "gpu02"]
    assert names(api, "r12-09") == ["gpu04"]  # no rack so named: the row is
    assert names(api, "pdu-b7") == ["gpu04"]
    assert names(api, "gpu.model=H200") == ["gpu01", "gpu03"]
    assert names(api, "gpu.model = H200 r12-07") == ["gpu01"]
    assert names(api, "r12-07\tgpu.model= H100") == ["gpu02"]
    # One level's or one key's terms are any of them; different ones all hold.
    assert names(api, "r12-07 r12-08") == ["gpu01", "gpu02", "gpu03"]
    assert names(api, "r12-08 rack:b7 gpu.model=H200") == ["gpu03"]
    assert names(api, "gpu.model=H200 gpu.model=H100 r12-08") == ["gpu03"]
    assert names(api, "rack:r12-07 pdu:r12-07-b") == ["gpu02"]
    assert names(api, "pool=batch rack:b7") == ["gpu04"]
    assert names(api, "r99") == []  # a name no node has: none, not an error
    assert names(api, "gpu.model=B200") == []
    for bad, words in (
        ("rack", "'rack' is not a domain: write level:name"),
        ("gpu.model=", "'gpu.model=': a label is key=value, with a value"),
        ("9x=1", "'9x=1': a label is key=value, the key a letter"),
        ("r1/2", "a domain name takes letters, digits"),
        ("gpu.model=H2\x0100", "a filter must not hold a control character"),
        (" ".join(f"r{i}" for i in range(9)), "at most 8 terms"),
    ):
        response = api.get("/api/v1/nodes", {"domain": bad})
        assert response.status_code == 400, bad
        assert response.json()["field"] == "domain"
        assert words in response.json()["detail"], response.json()


def test_the_console_suggests_what_an_unknown_name_or_label_could_have_meant(nodes, login):  # noqa: F811
    client = login("viewer")

    def hint(domain: str) -> str:
        page = client.get("/nodes/", {"domain": domain, "sort": "-name"}, HTTP_HX_REQUEST="true").content.decode()
        assert row_names(page) == []
        start = page.index('id="filter-suggestions"')
        return page[start : page.index("</div>", start)]

    text = hint("r12-7")
    assert "No node is in rack r12-7. Did you mean" in text
    assert '<a href="?domain=r12-07&amp;sort=-name">r12-07</a>' in text  # the other terms and the sort kept
    assert '<a href="?domain=r12-08&amp;sort=-name">r12-08</a>' in text
    text = hint("rack:r12-7 gpu.model=H200")
    assert '<a href="?domain=rack%3Ar12-07+gpu.model%3DH200&amp;sort=-name">rack:r12-07</a>' in text
    text = hint("r12-07 gpu.model=h200")
    assert "No node has gpu.model=h200. Did you mean" in text and ">gpu.model=H200</a>" in text
    assert "No node has a gpu.modle label. Did you mean" in hint("gpu.modle=H200")
    assert "No node is in rack zzz. No name is close to it." in hint("zzz")
    # A term no node has is said even when the others found nodes.
    page = client.get("/nodes/", {"domain": "r12-08 r12-9"}).content.decode()
    assert row_names(page) == ["gpu03"]
    assert "No node is in rack r12-9. Did you mean" in page and '<a href="?domain=r12-08+r12-09">r12-09</a>' not in page
    # Both terms known, together no node: nothing to suggest.
    page = client.get("/nodes/", {"domain": "r12-08 gpu.model=H100"}).content.decode()
    assert row_names(page) == [] and 'id="filter-suggestions"' not in page


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from([*"ab rk:=.-_/\t\n\x0bR1é\u3000", "rack", "pdu", "rack:", "gpu.model", " = ", "= "]),
                max_size=25).map("".join))
def test_the_schema_states_exactly_what_the_filter_takes(text):
    """The API's schema gives `domain` a pattern: a text it matches is taken, one it does not is refused."""
    from agents.filtersets import filter_pattern, parse_terms
    from facility.domains import DomainError

    try:
        parse_terms(text)
        taken = True
    except DomainError:
        taken = False
    assert taken == bool(re.fullmatch(filter_pattern(), text)), repr(text)


@pytest.mark.parametrize("count", [20, 150])
def test_a_label_filter_costs_the_same_queries_whatever_the_nodes(login, django_assert_max_num_queries, count):  # noqa: F811
    from tests.integration.test_console import make_nodes

    make_nodes(count)
    client = login("viewer")
    # The list's 18 at most, and one for each term: does any node have it (else, suggestions).
    with django_assert_max_num_queries(20):
        page = client.get("/nodes/", {"domain": "r01 llmgw.io/pdu=r01-a"}).content.decode()
    assert len(row_names(page)) == count // 10
