"""Bad input from one user costs nobody else: model documents, server.yaml, store labels and holds
refused with 4xx naming the field and the bound, nothing half-applied; a model whose placement fails is
marked with its error while the others are placed."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from agents.models import StoreLabel
from facility.models import Budget, FacilitySettings, Hold
from facility.services import facility_apply
from llmgw.ctl import main as ctl
from llmgw.errors import InvalidInput
from placement import documents
from placement.models import Model, Replica, ReplicaState
from placement.reconcile import reconcile_all

pytestmark = pytest.mark.django_db(transaction=True)


def model_doc(name: str = "m", replicas: int = 1, **profile) -> dict:
    return {"kind": "Model", "name": name, "replicas": replicas, "profile": {"gpus": 0, "cpu_cores": 1, **profile}}


def refused(response, field: str) -> str:
    """The refusal's detail, after checking it is a 4xx naming the field."""
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:500])
    body = response.json()
    assert body["field"] == field, body
    return body["detail"]


# -- model documents -------------------------------------------------------------------------------------

BAD_MODELS = [
    (model_doc(power_watts=1e308), "profile.power_watts", "1000000"),
    (model_doc(memory_gib=1e308), "profile.memory_gib", "1048576"),
    (model_doc(power_watts=10**400), "profile.power_watts", "1000000"),
    (model_doc(memory_gib=10**400), "profile.memory_gib", "1048576"),
    (model_doc(cpu_cores=10**400), "profile.cpu_cores", "16384"),
    (model_doc(gpus=10**400), "profile.gpus", "64"),
    (model_doc(replicas=10**400), "replicas", "10000"),
    (model_doc(replicas=10_001), "replicas", "10000"),
    (model_doc(min_ready_seconds=10**400), "profile.min_ready_seconds", "86400"),
    (model_doc(command="vllm serve\x00x"), "profile.command", "NUL"),
    (model_doc(command="vllm serve\x1bx"), "profile.command", "control"),
    (model_doc(health_path="/health\x00"), "profile.health_path", "NUL"),
    (model_doc(health_path="/health\n"), "profile.health_path", "control"),
    (model_doc(health_path="../../etc"), "profile.health_path", "a URL path starting with '/'"),
    (model_doc(health_path="health"), "profile.health_path", "a URL path starting with '/'"),
    (model_doc(health_path="/ready now"), "profile.health_path", "no spaces"),
    (model_doc(command="x" * 2001), "profile.command", "2000"),
    (model_doc(node_selector="a\x00=b"), "profile.node_selector", ""),
    (model_doc(command="serve {model.x}"), "profile.command", "unknown field {model.x}"),
    (model_doc(command="serve {model:>99999999999}"), "profile.command", "no conversion or format spec"),
    (model_doc(command="serve {nope}"), "profile.command", "the fields are {model}, {port}, {replica}, {gpus}"),
    (model_doc(command="serve {"), "profile.command", "a brace itself is written {{ or }}"),
    (model_doc(name="sec-nl\n"), "name", ""),
    (model_doc(name="m" * 201), "name", "200"),
]


@pytest.mark.parametrize(("doc", "field", "bound"), BAD_MODELS, ids=[f"{f}-{i}" for i, (_, f, _) in enumerate(BAD_MODELS)])
def test_a_bad_model_document_is_refused_naming_the_field_and_the_bound(api, doc, field, bound):
    detail = refused(api.post("/api/v1/models", doc, format="json"), field)
    assert bound.replace(",", "") in detail.replace(",", "")
    assert not Model.objects.exists()


@pytest.mark.parametrize("body", ["null", "[]", '"kind: Model"'])
def test_a_model_body_that_is_no_document_is_refused_naming_the_body(api, body):
    detail = refused(api.post("/api/v1/models", body, content_type="application/json"), "body")
    assert detail == "a model document is a mapping with kind: Model, name, replicas and profile"
    assert not Model.objects.exists()


def test_a_bad_document_in_a_file_applies_none_of_the_file(api):
    good = "kind: Model\nname: good\nreplicas: 1\nprofile: {gpus: 0, cpu_cores: 1}\n"
    bad = "kind: Model\nname: bad\nreplicas: 1\nprofile: {gpus: 0, power_watts: 1.0e+308}\n"
    with pytest.raises(InvalidInput) as caught:
        from placement.services import models_apply

        models_apply(text=good + "---\n" + bad)
    assert caught.value.field == "profile.power_watts"
    assert "line" in str(caught.value)
    assert not Model.objects.exists()


def test_the_bounds_themselves_are_accepted(api, join_node):
    join_node("gpu01")
    doc = model_doc(
        replicas=1, power_watts=documents.MAX_POWER_WATTS, memory_gib=1, min_ready_seconds=documents.MAX_MIN_READY_SECONDS
    )
    response = api.post("/api/v1/models", doc, format="json")
    assert response.status_code == 201, response.content


# -- a poisoned model beside a good one ------------------------------------------------------------------


def test_a_poisoned_model_is_marked_with_its_error_and_the_good_one_is_placed(api, join_node, capsys):
    join_node("gpu01")
    # Validation bypassed, as a row written before the bounds existed would be.
    Model.objects.create(name="poison", replicas=3, gpus=0, cpu_cores=1, power_watts=1e308)
    Model.objects.create(name="good", replicas=2, gpus=1, cpu_cores=1)
    reconcile_all()
    placed = Replica.objects.filter(model__name="good", state=ReplicaState.PLACED).count()
    assert placed == 2
    poison = Model.objects.get(name="poison")
    assert poison.error
    assert poison.error_at is not None
    good = Model.objects.get(name="good")
    assert good.error == ""
    row = next(m for m in api.get("/api/v1/models").json() if m["name"] == "poison")
    assert row["error"] == poison.error
    assert api.get("/api/v1/models/poison").json()["error"] == poison.error
    assert ctl(["models"]) == 0
    out = capsys.readouterr().out
    assert "poison" in out and "error" in out.lower()
    # Fixed: the next reconcile places it and clears the mark.
    Model.objects.filter(name="poison").update(power_watts=100)
    reconcile_all()
    poison.refresh_from_db()
    assert poison.error == "" and poison.error_at is None
    assert Replica.objects.filter(model__name="poison", state=ReplicaState.PLACED).count() == 3


def test_a_model_whose_placement_raises_does_not_stop_the_next(monkeypatch, join_node):
    join_node("gpu01")
    Model.objects.create(name="a-broken", replicas=1, gpus=0, cpu_cores=1)
    Model.objects.create(name="b-good", replicas=1, gpus=0, cpu_cores=1)
    from placement.index import PlacementIndex

    real = PlacementIndex.plan

    def plan(self, request, **kwargs):
        if request.model == "a-broken":
            raise ZeroDivisionError("a bug")
        return real(self, request, **kwargs)

    monkeypatch.setattr(PlacementIndex, "plan", plan)
    reconcile_all()
    assert Replica.objects.filter(model__name="b-good", state=ReplicaState.PLACED).count() == 1
    assert Model.objects.get(name="a-broken").error == "ZeroDivisionError: a bug"
    assert Model.objects.get(name="b-good").error == ""


# -- a request's work is bounded ---------------------------------------------------------------------------


def test_many_replicas_answer_with_a_batch_placed_and_the_rest_pending(api, join_node, monkeypatch):
    from placement import reconcile

    monkeypatch.setattr(reconcile, "REQUEST_PLACEMENTS", 3)
    join_node("gpu01")
    response = api.post("/api/v1/models", model_doc("many", replicas=10, cpu_cores=1), format="json")
    assert response.status_code == 201, response.content
    states = list(Replica.objects.filter(model__name="many").values_list("state", flat=True))
    assert len(states) == 10
    assert states.count(ReplicaState.PLACED) == 3
    reconcile_all()
    assert Replica.objects.filter(model__name="many", state=ReplicaState.PLACED).count() == 10


# -- server.yaml -----------------------------------------------------------------------------------------

BAD_FACILITY = [
    ("facility:\n  node_watts: 1.0e+308\n", "facility.node_watts"),
    (f"facility:\n  gpu_watts: {10**400}\n", "facility.gpu_watts"),
    ("facility:\n  gpu_watts: 0\n", "facility.gpu_watts"),  # every card reporting no limit out of every cap
    (f"facility:\n  margin: {10**400}\n", "facility.margin"),
    (f"facility:\n  budgets:\n    - domain: rack:r1\n      cap_watts: {10**400}\n", "facility.budgets[0].cap_watts"),
    ("facility:\n  budgets:\n    - domain: rack:r1\n      cap_watts: 100\n      other_watts: 1.0e+300\n",
     "facility.budgets[0].other_watts"),
    ('facility:\n  budgets:\n    - domain: "rack:r1\\n"\n      cap_watts: 100\n', "facility.budgets[0].domain"),
    ('facility:\n  budgets:\n    - domain: "rack:r1\\u0000"\n      cap_watts: 100\n', "facility.budgets[0].domain"),
]


@pytest.mark.parametrize(("text", "field"), BAD_FACILITY)
def test_a_bad_server_yaml_is_refused_naming_the_field_and_nothing_applied(text, field):
    with pytest.raises(InvalidInput) as caught:
        facility_apply(text=text)
    assert caught.value.field == field
    assert not Budget.objects.exists()
    assert FacilitySettings.load().node_watts != 1e308


def test_a_card_counted_at_no_watts_is_refused_by_the_api_too(api):
    before = FacilitySettings.load().gpu_watts
    answer = api.post("/api/v1/facility/apply", {"text": "facility:\n  gpu_watts: 0\n"}, format="json")
    assert "above 0 W" in refused(answer, "facility.gpu_watts")
    assert FacilitySettings.load().gpu_watts == before


# -- store labels and holds ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "labels", "field"),
    [
        ("gpu01\n", {"team": "a"}, "node"),
        ("gpu01", {"zz\n": "x"}, "labels.zz\n"),
        ("gpu01", {"team": "a\x00b"}, "labels.team"),
        ("gpu01", {"team": "a\nb"}, "labels.team"),
        ("gpu01", {"llmgw.io/rack": "r1-01\n"}, "labels.llmgw.io/rack"),
        ("gpu01", {"team": "v" * 254}, "labels.team"),
    ],
    ids=["node-newline", "key-newline", "value-nul", "value-newline", "rack-newline", "value-long"],
)
def test_bad_store_labels_are_refused_naming_the_field(api, node, labels, field):
    from agents.services import labels_set

    with pytest.raises(InvalidInput) as caught:
        labels_set(node_name=node, changes=labels)
    assert caught.value.field == field
    if node == "gpu01":  # a newline in a path is the URL's business (404), not the labels'
        response = api.post(f"/api/v1/nodes/{node}/labels", {"labels": labels}, format="json")
        assert 400 <= response.status_code < 500
        assert response.json()["field"].startswith("labels")
    assert not StoreLabel.objects.exists()


def test_five_thousand_labels_in_one_request_are_refused_at_once(api):
    labels = {f"k{i}": "v" for i in range(5000)}
    detail = refused(api.post("/api/v1/nodes/gpu01/labels", {"labels": labels}, format="json"), "labels")
    assert "256" in detail
    from agents.services import labels_set

    with pytest.raises(InvalidInput, match="256"):
        labels_set(node_name="gpu01", changes=labels)
    assert not StoreLabel.objects.exists()


def test_a_label_change_with_an_unknown_field_is_refused_naming_it(api):
    response = api.post("/api/v1/nodes/gpu01/labels", {"labels": {"foo": "bar"}, "zzz": 1}, format="json")
    assert "zzz" in refused(response, "zzz")
    assert not StoreLabel.objects.exists()


def test_an_unknown_name_is_refused_naming_the_parameter_and_quoted_short(api):
    answer = api.get("/api/v1/replicas", {"model": "m" * 5000})
    assert answer.status_code == 404
    body = answer.json()
    assert body["field"] == "model"
    assert len(body["detail"]) < 100 and body["detail"].endswith("mm… is not known")


def test_a_node_holds_at_most_256_store_labels_whatever_the_requests(api):
    for start in (0, 200):
        labels = {f"k{i}": "v" for i in range(start, start + 56 if start else 200)}
        assert api.post("/api/v1/nodes/gpu01/labels", {"labels": labels}, format="json").status_code == 200
    response = api.post("/api/v1/nodes/gpu01/labels", {"labels": {"one-more": "v"}}, format="json")
    assert "gpu01 would have 257 store labels; at most 256" in refused(response, "labels")
    assert StoreLabel.objects.filter(node_name="gpu01").count() == 256


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b'{"labels": {"a": "b"}, "n": ' + b"9" * 5000 + b"}", "a number of more than 4,300 digits"),
        (b'{"labels": {"a": "b"}, "n": NaN}', "NaN and Infinity are not JSON numbers"),
        (b'{"labels": {"a": "b"}, "n": -Infinity}', "NaN and Infinity are not JSON numbers"),
        # json keeps the last of a key given twice: the first (a label set, then removed) would go unseen.
        (b'{"labels": {"a": "b", "a": null}}', "'a' is given twice in one object"),
        (b'{"labels": {"a": "b"}, "labels": {}}', "'labels' is given twice in one object"),
    ],
)
def test_a_body_json_cannot_hold_is_refused_in_the_senders_words(api, raw, words):
    response = api.post("/api/v1/nodes/gpu01/labels", raw, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["detail"] == f"JSON parse error - {words}"
    assert not StoreLabel.objects.exists()


def test_labels_for_nodes_not_joined_yet_are_bounded_in_names(api, monkeypatch):
    from agents import services

    monkeypatch.setattr(services, "MAX_NODES_WAITING", 3)
    for i in range(3):
        assert api.post(f"/api/v1/nodes/later{i}/labels", {"labels": {"a": "b"}}, format="json").status_code == 200
    response = api.post("/api/v1/nodes/later3/labels", {"labels": {"a": "b"}}, format="json")
    assert "4 names no node has joined under hold store labels; at most 3" in refused(response, "node")
    assert not StoreLabel.objects.filter(node_name="later3").exists()
    # A name in the store already takes more labels; removing one's labels makes room again.
    assert api.post("/api/v1/nodes/later1/labels", {"labels": {"c": "d"}}, format="json").status_code == 200
    assert api.post("/api/v1/nodes/later0/labels", {"labels": {"a": None}}, format="json").status_code == 200
    assert api.post("/api/v1/nodes/later3/labels", {"labels": {"a": "b"}}, format="json").status_code == 200


def test_256_labels_in_one_request_are_taken(api):
    labels = {f"k{i}": "v" for i in range(256)}
    response = api.post("/api/v1/nodes/gpu01/labels", {"labels": labels}, format="json")
    assert response.status_code == 200, response.content
    assert StoreLabel.objects.count() == 256


def test_a_hold_with_a_trailing_newline_is_refused(api, capsys):
    assert ctl(["facility", "hold", "rack:r1-01\n", "--reason", "x"]) == 1
    assert "domain" in capsys.readouterr().err
    refused(api.post("/api/v1/facility/holds", {"domain": "rack:r1-01\n", "reason": "x"}, format="json"), "domain")
    assert not Hold.objects.exists()


ESCAPES = "PDU \x1b[2J\x1b[31mOWNED\x1b[0m swap"


def test_reasons_with_terminal_controls_are_refused_naming_the_reason(api, join_node):
    """Holds', conditions' and cordons' reasons are printed in tables, refusals and terminals: one with an
    escape sequence would drive the terminal of whoever lists it."""
    join_node("gpu01", rack="r1-01")
    hold = {"domain": "rack:r1-01", "reason": ESCAPES}
    assert "control character" in refused(api.post("/api/v1/facility/holds", hold, format="json"), "reason")
    condition = {"domain": "rack:r1-01", "condition": "ok", "reason": "\x1b]8;;http://x\x1b\\link"}
    refused(api.post("/api/v1/facility/conditions", condition, format="json"), "reason")
    cordon = {"cordoned": True, "reason": ESCAPES}
    refused(api.post("/api/v1/nodes/gpu01/cordon", cordon, format="json"), "reason")
    c1 = {"domain": "rack:r1-01", "reason": "swap \x9b2J"}  # CSI in one character
    refused(api.post("/api/v1/facility/holds", c1, format="json"), "reason")
    assert not Hold.objects.exists()
    assert ctl(["facility", "hold", "rack:r1-01", "--reason", ESCAPES]) == 1
    assert not Hold.objects.exists()


def test_ctl_shows_a_stored_control_character_as_its_escape(capsys):
    """Whatever wrote it (a row from before the check, the admin's database), a listing shows it, never
    acts on it."""
    Hold.objects.create(domain="rack:r1-01", reason=ESCAPES)
    assert ctl(["facility"]) == 0
    out = capsys.readouterr().out
    assert "PDU \\x1b[2J\\x1b[31mOWNED\\x1b[0m swap" in out
    assert "\x1b" not in out


def test_a_ctl_label_with_a_newline_key_is_refused(capsys):
    assert ctl(["label", "gpu01", "zz\n=x"]) == 1
    assert "zz" in capsys.readouterr().err
    assert not StoreLabel.objects.exists()


# -- property: random model documents ---------------------------------------------------------------------

_numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.integers(min_value=10**300, max_value=10**420),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
)
_texts = st.one_of(st.text(max_size=40), st.integers(), st.none())
_profiles = st.fixed_dictionaries(
    {"gpus": st.one_of(st.integers(min_value=0, max_value=2), _numbers)},
    optional={
        "nodes": _numbers, "cpu_cores": _numbers, "memory_gib": _numbers, "power_watts": _numbers,
        "min_ready_seconds": _numbers, "command": _texts, "health_path": _texts, "node_selector": _texts,
        "keep_within": _texts,
    },
)
_documents = st.fixed_dictionaries(
    {"kind": st.just("Model"), "name": st.one_of(st.from_regex(r"\Ar[a-z0-9]{0,8}\Z"), _texts),
     "profile": _profiles},
    optional={"replicas": st.one_of(st.integers(min_value=0, max_value=3), _numbers)},
)


@hsettings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(doc=_documents)
@pytest.mark.slow
def test_random_model_documents_never_give_a_5xx_nor_leave_another_model_unplaced(doc):
    from django.db.models import F
    from rest_framework.test import APIClient

    from agents.services import heartbeat_record
    from agents.simulator.cluster import heartbeat_for
    from llmgw.users_cli import token_create
    from placement.services import model_delete
    from tests.conftest import node_spec

    global _token
    if Model.objects.filter(name="witness", replicas__gte=64).exists():
        # One core a replica on a 96-core node: start the witness over before it could not fit (Hypothesis's
        # shrinking runs many more examples than max_examples).
        model_delete(name="witness")
    # The node beats each example: on a busy machine the examples outlast its three missed intervals.
    heartbeat_record(node_name="gpu01", heartbeat=heartbeat_for(node_spec("gpu01")))
    if not Model.objects.filter(name="witness").exists():
        Model.objects.create(name="witness", replicas=0, gpus=0, cpu_cores=1)
        if not _token:
            _token = token_create(username="prop", role="operator")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {_token}")
    # One more witness replica each time: the reconcile after the random document must place it.
    Model.objects.filter(name="witness").update(replicas=F("replicas") + 1)
    response = client.post("/api/v1/models", doc, format="json")
    assert response.status_code < 500, response.content[:500]
    if response.status_code >= 400:
        assert response.json().get("detail")
    reconcile_all()
    witness = Model.objects.get(name="witness")
    assert Replica.objects.filter(model=witness, state=ReplicaState.PLACED).count() == witness.replicas
    for name in Model.objects.exclude(name="witness").values_list("name", flat=True):
        model_delete(name=name)


_token = ""


# -- the server's own limits: slow and oversize headers ---------------------------------------------------


@pytest.fixture
def limited_server(settings):
    """`llmgw serve`'s uvicorn, with its limits, on a free port (headers given 0.5 s)."""
    from llmgw.serving import uvicorn_limits
    from tests.integration.test_hardening_lane import uvicorn_in_thread

    settings.LLMGW_HEADER_TIMEOUT_SECONDS = 0.5
    yield from uvicorn_in_thread(**uvicorn_limits())


def _answer(conn) -> bytes:
    answer = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return answer
        answer += chunk


def test_headers_sent_slowly_lose_the_connection(limited_server):
    import socket

    with socket.create_connection(limited_server, timeout=30) as conn:
        conn.sendall(b"GET /api/v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")  # then nothing more
        assert _answer(conn) == b""  # closed by the server, not by the 30 s timeout (that raises)


def test_headers_past_the_limit_are_refused(limited_server, settings):
    import socket

    with socket.create_connection(limited_server, timeout=30) as conn:
        big = b"x" * (settings.LLMGW_MAX_HEADER_BYTES + 1024)
        conn.sendall(b"GET /api/v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + big + b"\r\n\r\n")
        assert _answer(conn).startswith(b"HTTP/1.1 431")


def test_a_prompt_request_with_a_large_body_on_the_limited_server_is_answered(limited_server, settings):
    import socket

    body = b"{" + b" " * (settings.LLMGW_MAX_HEADER_BYTES * 4) + b"}"  # in the same write as its head
    with socket.create_connection(limited_server, timeout=30) as conn:
        conn.sendall(b"POST /api/v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                     b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        assert _answer(conn).startswith(b"HTTP/1.1 401")


@pytest.mark.parametrize(
    ("path", "raw", "detail"),
    [
        # 100,000 files that are no text: counted first, one short refusal (it checked and named each).
        ("/api/v1/facility/apply", '{"text": "facility: {}", "files": {' + ", ".join(f'"f{i}": [1]' for i in range(100_000)) + "}}",
         "files: at most 8 files"),
        ("/api/v1/facility/import/netbox", '{"url": "http://x", "token": "t", "roles": [' + ", ".join(["[]"] * 100_000) + "]}",
         "roles: Ensure this field has no more than 50 elements."),
    ],
)
def test_a_list_or_map_past_its_count_is_refused_short_before_its_items_are_read(api, path, raw, detail):
    response = api.post(path, raw, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["detail"] == detail
    assert len(response.content) < 500


def test_an_error_body_names_at_most_twenty_of_a_fields_bad_items(api):
    raw = '{"url": "http://x", "token": "t", "roles": [' + ", ".join(["[]"] * 50) + "]}"
    response = api.post("/api/v1/facility/import/netbox", raw, content_type="application/json")
    assert response.status_code == 400 and response.json()["detail"] == "roles: 0: Not a valid string."
    assert len(response.json()["errors"]["roles"]) == 20


def test_budgets_holds_and_conditions_by_hand_are_bounded_in_count_not_in_changes(api, monkeypatch):
    from facility import feed_services
    from facility import services as facility_services
    from facility.models import ConditionOverride

    monkeypatch.setattr(facility_services, "MAX_BUDGETS", 2)
    monkeypatch.setattr(facility_services, "MAX_HOLDS", 2)
    monkeypatch.setattr(facility_services, "MAX_CONDITION_OVERRIDES", 2)
    monkeypatch.setattr(feed_services, "MAX_FEEDS", 2)
    for path, body, count in (
        ("/api/v1/facility/budgets", {"cap_watts": 1000}, lambda: Budget.objects.count()),
        ("/api/v1/facility/holds", {"reason": "x", "new": True}, lambda: Hold.objects.count()),
        ("/api/v1/facility/conditions", {"condition": "ok", "reason": "x"}, lambda: ConditionOverride.objects.count()),
    ):
        for rack in ("rack:z1", "rack:z2", "rack:z1"):  # the third changes one there is: no new one
            assert api.post(path, {"domain": rack, **body}, format="json").status_code in (200, 201)
        response = api.post(path, {"domain": "rack:z3", **body}, format="json")
        assert response.status_code == 400 and response.json()["field"] == "domain"
        assert response.json()["detail"].startswith("domain: at most 2 ") and ", and 2 are set" in response.json()["detail"]
        assert count() == 2
    three = "".join(f"    - {{domain: 'rack:y{i}', cap_watts: 1000}}\n" for i in range(3))
    with pytest.raises(InvalidInput, match=r"facility.budgets: at most 2 budgets, not 3"):
        facility_apply(text="facility:\n  budgets:\n" + three)
    feeds = "".join(f"    - {{name: F{i}, voltage: 230, amperage: 16, phase: single, pdus: [p{i}]}}\n" for i in range(3))
    with pytest.raises(InvalidInput, match=r"facility.feeds: at most 2 feeds, not 3"):
        facility_apply(text="facility:\n  feeds:\n" + feeds)
