"""An open page's socket renders again no sooner than RENDER_COST_TIMES what its last render took: on a busy
server a render seconds long, asked for every second, would take the web process from everything else."""

from __future__ import annotations

from agents import consumers
from agents.consumers import RENDER_COST_TIMES, FilteredPageConsumer


class Page(FilteredPageConsumer):
    """A page whose render takes `cost` seconds of the test's clock."""

    def __init__(self, clock: dict, cost: float):
        super().__init__()
        self.clock, self.cost = clock, cost
        self.groups_to_join()
        self.sent: list[str] = []

    def html(self) -> str:
        self.clock["now"] += self.cost
        return "page"

    def send(self, text_data=None, bytes_data=None, close=False):
        self.sent.append(text_data)


def test_a_costly_render_spaces_the_next_by_its_cost_a_cheap_one_by_the_window(monkeypatch):
    clock = {"now": 1000.0}
    monkeypatch.setattr(consumers.time, "monotonic", lambda: clock["now"])
    slow = Page(clock, cost=3.0)
    slow.owe(1.0)  # nothing rendered yet: at once
    assert slow.sent == ["page"]
    slow.owe(1.0)
    assert (len(slow.sent), slow.due_at) == (1, 1000.0 + 3.0 * RENDER_COST_TIMES)
    clock["now"] = slow.due_at
    slow.page_tick({})
    assert len(slow.sent) == 2

    quick = Page(clock, cost=0.01)
    quick.owe(1.0)
    quick.owe(1.0)
    assert quick.due_at == quick.last_render + 1.0
