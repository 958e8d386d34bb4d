"""Every writer that locks nodes locks them in one order, and budgets before nodes: holds, releases, model
deletes and scale-downs, budget changes racing from several threads never deadlock and never answer 5xx
(a hold deadlocked with a delete; a budget change, which locks every budget to refresh the feeds' caps,
deadlocked with placements holding some of them).

Runs ``LLMGW_RACE_SECONDS`` (default 20; the issue's two minutes: ``LLMGW_RACE_SECONDS=120``).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter

import pytest
from django.db import connection

from agents.models import Node
from llmgw.errors import WRITE_CONFLICT_TEXT

RACE_SECONDS = float(os.environ.get("LLMGW_RACE_SECONDS", "20"))


def deadlocks() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def model(name: str, replicas: int) -> dict:
    return {"kind": "Model", "name": name, "replicas": replicas, "profile": {"gpus": 2, "cpu_cores": 4}}


@pytest.mark.django_db(transaction=True)
def test_holds_releases_deletes_and_scale_downs_racing_never_deadlock(join_node, make_user):
    if connection.vendor != "postgresql":
        pytest.skip("row locks and deadlocks are PostgreSQL's")
    from rest_framework.test import APIClient

    for i in range(8):
        join_node(f"a{i}", rack="ra" if i < 4 else "rb", pdu=f"p{i // 2}")
    Node.objects.update(heartbeat_interval_seconds=3600)
    from facility.services import budget_set

    budgeted = ["rack:ra", "rack:rb", "pdu:p0", "pdu:p1", "pdu:p2", "pdu:p3"]
    for domain in budgeted:
        budget_set(domain=domain, cap_watts=200_000)
    _, key = make_user("racer", "operator")
    before = deadlocks()
    answers: Counter = Counter()
    conflicts: list[str] = []
    errors: list[str] = []
    deadline = time.monotonic() + RACE_SECONDS

    def client() -> APIClient:
        c = APIClient()
        c.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        return c

    def record(response) -> None:
        answers[response.status_code] += 1
        if response.status_code >= 500:
            errors.append(f"{response.status_code}: {response.content[:300]!r}")
        elif response.status_code == 409 and response.json().get("detail") == WRITE_CONFLICT_TEXT:
            conflicts.append(response.json()["detail"])

    def holder(rack: str) -> None:
        c = client()
        try:
            while time.monotonic() < deadline:
                record(c.post("/api/v1/facility/holds", {"domain": f"rack:{rack}", "reason": "race"}, format="json"))
                time.sleep(random.random() * 0.05)
                record(c.delete(f"/api/v1/facility/holds/rack:{rack}"))
        finally:
            connection.close()

    def scaler(name: str) -> None:
        c = client()
        try:
            while time.monotonic() < deadline:
                record(c.post("/api/v1/models", model(name, random.randint(3, 8)), format="json"))
                record(c.post("/api/v1/models", model(name, 1), format="json"))  # scale down: several freed
        finally:
            connection.close()

    def deleter(name: str) -> None:
        c = client()
        try:
            while time.monotonic() < deadline:
                record(c.post("/api/v1/models", model(name, random.randint(2, 6)), format="json"))
                record(c.delete(f"/api/v1/models/{name}"))
        finally:
            connection.close()

    def budgeter() -> None:
        c = client()
        try:
            while time.monotonic() < deadline:
                domain = random.choice(budgeted)
                cap = random.randint(150_000, 250_000)
                record(c.post("/api/v1/facility/budgets", {"domain": domain, "cap_watts": cap}, format="json"))
                if random.random() < 0.3:
                    record(c.delete(f"/api/v1/facility/budgets/{domain}"))
                    record(c.post("/api/v1/facility/budgets", {"domain": domain, "cap_watts": cap}, format="json"))
        finally:
            connection.close()

    threads = [
        threading.Thread(target=budgeter),
        threading.Thread(target=holder, args=("ra",)),
        threading.Thread(target=holder, args=("rb",)),
        threading.Thread(target=scaler, args=("up-down",)),
        threading.Thread(target=deleter, args=("come-go",)),
        threading.Thread(target=deleter, args=("here-gone",)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RACE_SECONDS + 120)
    assert not any(t.is_alive() for t in threads)
    time.sleep(1.5)  # server statistics are flushed when a backend's transaction ends, at most once a second
    assert errors == []
    assert sum(answers.values()) > 20, answers  # the race ran
    assert conflicts == []
    assert deadlocks() == before
