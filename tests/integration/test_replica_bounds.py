"""Replicas are bounded: every model's together (a file of many models is refused whole, naming replicas),
and a viewer's read of them is a page (GET /replicas, a model's detail, its explain); ctl still shows every
one."""

from __future__ import annotations

import pytest

from placement.documents import MAX_REPLICAS_TOTAL
from placement.models import Model, Replica, ReplicaState
from tests.integration.test_ctl_remote import remote

pytestmark = pytest.mark.django_db(transaction=True)


def doc(name: str, replicas: int) -> str:
    return f"kind: Model\nname: {name}\nreplicas: {replicas}\nprofile: {{gpus: 8, command: 'x {{port}}'}}\n"


def pending_model(name: str, count: int) -> Model:
    """A model with ``count`` pending replicas, as a reconcile that found no node leaves it."""
    model = Model.objects.create(name=name, replicas=count, gpus=8)
    Replica.objects.bulk_create(
        Replica(model=model, ordinal=i, state=ReplicaState.PENDING, reason="no node") for i in range(1, count + 1)
    )
    return model


def test_a_file_taking_every_models_replicas_past_the_bound_is_refused_whole(api):
    text = "---\n".join(doc(f"m{i}", 10_000) for i in range(10))
    response = api.post("/api/v1/apply", {"text": text}, format="json")
    assert response.status_code == 400
    assert response.json()["field"] == "replicas"
    assert response.json()["detail"] == (
        "replicas: every model's replicas together at most 20,000; this asks 100,000 ('m0': 10,000) "
        "where the other models hold 0"
    )
    assert not Model.objects.exists() and not Replica.objects.exists()


def test_the_bound_counts_the_other_models_and_a_model_changed_counts_once(api):
    Model.objects.create(name="a", replicas=10_000, gpus=8)
    Model.objects.create(name="b", replicas=9_000, gpus=8)
    response = api.post("/api/v1/apply", {"text": doc("c", 1_001)}, format="json")
    assert response.status_code == 400 and response.json()["field"] == "replicas"
    assert "this asks 1,001 ('c': 1,001) where the other models hold 19,000" in response.json()["detail"]
    assert not Model.objects.filter(name="c").exists()
    # b asked again at 10,000 is counted as itself, not on top of its 9,000: exactly the bound.
    body = {"kind": "Model", "name": "b", "replicas": MAX_REPLICAS_TOTAL - 10_000, "profile": {"gpus": 8}}
    assert api.post("/api/v1/models", body, format="json").status_code == 200


def test_replicas_are_listed_a_page_at_a_time(viewer_api):
    pending_model("big", 1_200)
    response = viewer_api.get("/api/v1/replicas")
    assert response.status_code == 200
    assert [r["ordinal"] for r in response.json()] == list(range(1, 501))  # the default page
    page = viewer_api.get("/api/v1/replicas", {"model": "big", "offset": 1_000, "limit": 1_000}).json()
    assert [r["ordinal"] for r in page] == list(range(1_001, 1_201))  # shorter than asked: the last
    for query, field in [({"limit": 1_001}, "limit"), ({"limit": 0}, "limit"), ({"offset": "x"}, "offset"),
                         ({"offset": MAX_REPLICAS_TOTAL + 1}, "offset")]:
        response = viewer_api.get("/api/v1/replicas", query)
        assert response.status_code == 400, query
        assert response.json()["field"] == field
    assert viewer_api.get("/api/v1/replicas", {"limit": 1_001}).json()["detail"] == (
        "limit: a whole number from 1 to 1,000"
    )


def test_a_models_detail_lists_its_first_replicas_and_counts_every_one(viewer_api):
    pending_model("big", 1_200)
    body = viewer_api.get("/api/v1/models/big").json()
    assert [r["ordinal"] for r in body["replica_list"]] == list(range(1, 101))
    assert body["states"] == {"pending": 1_200}
    assert body["replicas"]["pending"] == 1_200


def test_ctl_replicas_remote_reads_every_page(live_server, make_user, tmp_path):
    pending_model("big", 2_100)
    _, key = make_user("viewer1", role="viewer")
    got = remote(live_server.url, key, "replicas", "--model", "big", home=tmp_path)
    assert got.returncode == 0, got.stderr
    lines = got.stdout.splitlines()
    assert len(lines) == 1 + 2_100
    assert lines[1].split()[:3] == ["big", "#1", "pending"] and lines[-1].split()[:3] == ["big", "#2100", "pending"]


def test_a_models_explain_is_a_page_of_replicas_with_the_counts_of_all(viewer_api):
    pending_model("big", 1_200)
    body = viewer_api.get("/api/v1/models/big/explain").json()
    assert [r["ordinal"] for r in body["replicas"]] == list(range(1, 101))  # the default page
    assert (body["replicas_total"], body["offset"], body["pending"], body["placed"]) == (1_200, 0, 1_200, 0)
    assert body["replicas"][0]["summary"] == "no node"
    page = viewer_api.get("/api/v1/models/big/explain", {"offset": 1_100, "limit": 1_000}).json()
    assert [r["ordinal"] for r in page["replicas"]] == list(range(1_101, 1_201))
    assert page["offset"] == 1_100 and page["replicas_total"] == 1_200
    for query, field in [({"limit": 1_001}, "limit"), ({"limit": "-1"}, "limit"), ({"offset": "1e3"}, "offset")]:
        response = viewer_api.get("/api/v1/models/big/explain", query)
        assert response.status_code == 400, query
        assert response.json()["field"] == field


def test_ctl_explain_placement_remote_reads_every_page(live_server, make_user, tmp_path):
    pending_model("big", 2_100)
    _, key = make_user("viewer1", role="viewer")
    got = remote(live_server.url, key, "explain-placement", "big", home=tmp_path)
    assert got.returncode == 0, got.stderr
    lines = got.stdout.splitlines()
    assert lines[0] == "big: 2100 wanted, 0 placed, 2100 pending (8 GPUs × 1 node)"
    assert len(lines) == 1 + 2_100
    assert lines[1] == "#1 pending: no node" and lines[-1] == "#2100 pending: no node"


# An apply in a process of its own that stops once it has counted the replicas, until told to go on.
APPLY_AND_WAIT = """
import sys, django
django.setup()
from placement import services
check = services._totals_check
def counted_then_wait(values):
    check(values)
    print("counted", flush=True)
    sys.stdin.readline()
services._totals_check = counted_then_wait
services._request_reconcile = lambda: None
services.model_apply(data={"kind": "Model", "name": "a", "replicas": 10_000, "profile": {"gpus": 8}})
print("applied", flush=True)
"""


def test_two_applies_at_once_cannot_together_go_past_the_bound(monkeypatch):
    import os
    import subprocess
    import sys
    import threading
    import time

    from django.db import connection

    from llmgw.errors import InvalidInput
    from placement import services
    from tests.integration.test_concurrency import ROOT, database_url

    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (DATABASE_URL=postgres://…)")
    monkeypatch.setattr(services, "_request_reconcile", lambda: None)
    Model.objects.create(name="m0", replicas=5_000, gpus=8)
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "llmgw.settings"}
    env.pop("REDIS_URL", None)
    first = subprocess.Popen(
        [sys.executable, "-c", APPLY_AND_WAIT], cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )
    try:
        assert first.stdout.readline() == "counted\n", first.stderr.read()
        # 5,000 + 10,000 (uncommitted yet) + 5,001: each alone within 20,000, together past it.
        outcome: list = []

        def second() -> None:
            try:
                outcome.append(services.model_apply(data={"kind": "Model", "name": "b", "replicas": 5_001,
                                                          "profile": {"gpus": 8}}))
            except InvalidInput as exc:
                outcome.append(exc)
            finally:
                connection.close()

        thread = threading.Thread(target=second)
        thread.start()
        deadline = time.monotonic() + 10
        while thread.is_alive() and time.monotonic() < deadline and not Model.objects.raw(
            "SELECT 1 AS id FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ):
            time.sleep(0.05)
        first.stdin.write("go on\n")
        first.stdin.flush()
        assert first.stdout.readline() == "applied\n", first.stderr.read()
        thread.join(timeout=30)
    finally:
        first.kill()
        first.wait()
    [refused] = outcome
    assert isinstance(refused, InvalidInput) and refused.field == "replicas", refused
    assert "this asks 5,001 ('b': 5,001) where the other models hold 15,000" in refused.message
    assert sorted(Model.objects.values_list("name", flat=True)) == ["a", "m0"]


def test_models_past_their_count_are_refused_whole_naming_name(api, monkeypatch):
    from placement import documents

    monkeypatch.setattr(documents, "MAX_MODELS", 3)
    Model.objects.create(name="a", replicas=0, gpus=8)
    text = "---\n".join(doc(f"m{i}", 0) for i in range(3))
    response = api.post("/api/v1/apply", {"text": text}, format="json")
    assert response.status_code == 400 and response.json()["field"] == "name"
    assert response.json()["detail"] == (
        "name: at most 3 models; this adds 3 where 1 are known (delete the ones no longer served: llmgw ctl "
        "delete model NAME)"
    )
    assert list(Model.objects.values_list("name", flat=True)) == ["a"]
    # A model changed is no new one: a file of the known ones and two new is exactly the bound.
    text = "---\n".join(doc(name, 0) for name in ("a", "m0", "m1"))
    assert api.post("/api/v1/apply", {"text": text}, format="json").status_code == 200
    assert api.post("/api/v1/models", {"kind": "Model", "name": "m2", "replicas": 0, "profile": {"gpus": 8}},
                    format="json").status_code == 400
