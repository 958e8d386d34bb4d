"""llmgw_placement_would_total: observe mode's counts, kept where every process's /metrics reads them."""

import os

import pytest
import redis

from placement import explain
from placement.metrics import PlacementWouldCollector

NOTES = (
    "would have refused: rack r1-01 is hot (inlet 33.1 °C for 6 min, hot above 32 °C)",
    "would have scored down: rack r1-02 is warm (inlet 28.0 °C for 3 min, warm above 27 °C)",
    "something else",
)


def _samples():
    (family,) = PlacementWouldCollector().collect()
    return {s.labels["decision"]: s.value for s in family.samples if s.name == "llmgw_placement_would_total"}


def test_embedded_counts_in_the_process(settings, monkeypatch):
    settings.REDIS_URL = ""
    monkeypatch.setattr(explain, "_local_counts", {})
    explain.count_would(NOTES)
    explain.count_would(NOTES[:1])
    assert _samples() == {"refused": 2.0, "scored_down": 1.0}


def test_with_redis_every_process_counts_into_one_hash(settings, monkeypatch):
    url = os.environ.get("LLMGW_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    settings.REDIS_URL = url
    monkeypatch.setattr(explain, "_redis", None)
    monkeypatch.setattr(explain, "_local_counts", {})
    other = redis.Redis.from_url(url)
    other.delete(explain.WOULD_KEY)
    try:
        # Another process (a worker) counted one already: it is in the hash, not in this process.
        other.hincrby(explain.WOULD_KEY, "refused", 1)
        explain.count_would(NOTES)
        assert other.hgetall(explain.WOULD_KEY) == {b"refused": b"2", b"scored_down": b"1"}
        assert _samples() == {"refused": 2.0, "scored_down": 1.0}
    finally:
        other.delete(explain.WOULD_KEY)


def test_redis_down_costs_the_placement_nothing(settings, monkeypatch, caplog):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    monkeypatch.setattr(explain, "_redis", None)
    explain.count_would(NOTES)  # does not raise
    assert _samples() == {}
    assert "not kept in Redis" in caplog.text


@pytest.fixture(autouse=True)
def _fresh_client():
    yield
    explain._redis = None
