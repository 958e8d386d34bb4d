"""The heartbeat fast path's readings batch (agents.readings.flush): many nodes' readings written in one
statement, the console told of them in one pass, and a flush armed for later cancelled once done."""

from __future__ import annotations

import time

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.utils import timezone

from agents import events, readings
from agents.models import Node

pytestmark = pytest.mark.django_db(transaction=True)

NODES = 40


def buffered(names: list[str], watts: float) -> None:
    """Each named node known (its full heartbeat stored) and a reading of `watts` buffered for it."""
    now = timezone.now()
    for name in names:
        readings.remember(name, "")
        sensors = {"gpus": [{"index": 0, "power_watts": watts}]}
        assert readings.buffer_readings(name, "", at=now, sensors=sensors, watts=watts, interval=10)


def test_a_batch_of_readings_reaches_the_console_in_one_pass(monkeypatch):
    names = [f"gpu{i:02}" for i in range(NODES)]
    earlier = [[timezone.now().timestamp() // 60 * 60 - 60, 310.0]]  # a reading of the minute before
    Node.objects.bulk_create([Node(name=name, last_heartbeat_at=timezone.now(), measured_peaks=earlier) for name in names])
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(events.NODES_GROUP, channel)
    passes: list[int] = []
    original = events._send_many

    def counted(messages):
        passes.append(len(messages))
        original(messages)

    monkeypatch.setattr(events, "_send_many", counted)
    monkeypatch.setattr(readings, "FLUSH_SECONDS", 60)  # written by the flush below, as the timer would

    buffered(names, 300.0)
    assert readings.flush() == NODES

    # The peak: the second-highest reading of the window (the earlier 310 W and this 300 W).
    assert Node.objects.filter(name__in=names, measured_watts=300.0, measured_peak_watts=300.0).count() == NODES
    # No event loop here (as in the batch writer's thread): still one pass for the whole batch, one
    # `nodes.readings` message naming every node (pages pick their own from it).
    assert passes == [1]
    message = async_to_sync(layer.receive)(channel)
    assert message["type"] == "nodes.readings"
    assert set(message["nodes"]) == set(names)


def test_a_direct_flush_cancels_the_flush_armed_for_later(monkeypatch):
    Node.objects.create(name="gpu01", last_heartbeat_at=timezone.now())
    monkeypatch.setattr(readings, "FLUSH_SECONDS", 0.2)
    fired: list[bool] = []
    original = readings._flush_in_thread

    def spy():
        fired.append(True)
        original()

    monkeypatch.setattr(readings, "_flush_in_thread", spy)
    buffered(["gpu01"], 250.0)  # arms the timer

    assert readings.flush() == 1
    time.sleep(0.5)

    assert fired == []  # nothing left for it: no thread opened a connection to write nothing
    assert Node.objects.get(name="gpu01").measured_watts == 250.0
