"""One drain step of one model: which replacements are done (their old replicas stop), which are no longer
needed, and which replicas get a replacement next (DESIGN.md, invariant 5: the replacement is up first).

:func:`drain_stops` settles the replacements there are; :func:`drain_starts` picks the replicas to make
replacements for, from the room it left. Two calls, so the shell reads the model's replicas only when
there is room and something waits (it runs for every model on every reconcile).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from datetime import datetime, timedelta

from facility.domains import LABEL_PREFIX
from placement.decisions.minimums import PENDING, READY, STOPPING, stops_allowed


@dataclass(frozen=True, slots=True)
class Replacement:
    """A replica placed to take over from one that moves: whom it replaces (and that one's state), its own
    state, since when it is ready, and whether every node of its shards is heartbeating now."""

    id: int
    replaces: int
    replaces_state: str
    state: str
    ready_since: datetime | None = None
    nodes_ready: bool = True

    @property
    def replaced(self) -> Original:
        return Original(self.replaces, self.replaces_state)


@dataclass(frozen=True, slots=True)
class Original:
    """A model's replica that replaces none: its id and state."""

    id: int
    state: str


@dataclass(frozen=True, slots=True)
class DrainStops:
    """What :func:`drain_stops` decided.

    ``stop``: the replicas to stop now, in order — replacements whose original no longer moves (the drain
    stopped), then the originals whose replacement has taken over. ``in_flight``: replacements not yet
    done (or done while their original must still serve). ``waiting``: replicas that move and have no
    replacement yet. ``room``: replacements it may make now (the surge less those in flight).
    """

    stop: tuple[int, ...]
    in_flight: int
    waiting: frozenset[int]
    room: int


def is_taken_over(replacement: Replacement, *, min_ready_seconds: float, now: datetime) -> bool:
    """Ready for min_ready_seconds, on nodes still heartbeating: a replacement whose node went quiet says
    'ready' only because nobody has said otherwise, and the old replica must not stop for it."""
    return (
        replacement.state == READY
        and replacement.ready_since is not None
        and now - replacement.ready_since >= timedelta(seconds=min_ready_seconds)
        and replacement.nodes_ready
    )


def drain_stops(
    *, replacements: Iterable[Replacement], moving: Set[int], ready: int, min_ready: int,
    min_ready_seconds: float, surge: int, now: datetime,
) -> DrainStops:
    """Settle a model's replacements: drop those no longer needed, stop the originals taken over.

    ``moving``: the model's replicas that must move (on a draining node, or marked by shedding);
    ``ready``: the model's ready replicas now. An original stops only while the model keeps ``min_ready``
    ready replicas without it, and without the replacements stopped with it; else it serves on and its
    replacement counts as still in flight.
    """
    replacements = list(replacements)
    unneeded = [r for r in replacements if r.replaces not in moving]
    stop = [r.id for r in unneeded]
    # A replacement that is no longer needed goes in the same step: what is left to serve is counted
    # without it (with 4 ready of min_ready 3, a ready one going and an original taken over leave 2).
    ready -= sum(r.state == READY for r in unneeded)
    replaced = {r.replaces for r in replacements}
    in_flight = 0
    done: list[Original] = []
    for replacement in replacements:
        if replacement.replaces not in moving:
            continue
        if is_taken_over(replacement, min_ready_seconds=min_ready_seconds, now=now):
            done.append(replacement.replaced)
        else:
            in_flight += 1
    allowed = stops_allowed(ready=ready, min_ready=min_ready, replicas=done)
    stop.extend(original.id for original in allowed)
    in_flight += len(done) - len(allowed)
    return DrainStops(tuple(stop), in_flight, frozenset(moving) - replaced, surge - in_flight)


def drain_starts(*, originals: Iterable[Original], waiting: Set[int], room: int) -> list[int]:
    """The replicas to make a replacement for now: of ``originals`` (the model's, in ordinal order), those
    ``waiting``, not pending or stopping, at most ``room`` of them."""
    if room <= 0:
        return []
    picked: list[int] = []
    for original in originals:
        if original.id in waiting and original.state not in (PENDING, STOPPING):
            picked.append(original.id)
            if len(picked) == room:
                break
    return picked


def drain_step(
    *, replacements: Sequence[Replacement], originals: Sequence[Original], moving: Set[int], ready: int,
    min_ready: int, min_ready_seconds: float, surge: int, now: datetime,
) -> tuple[DrainStops, list[int]]:
    """Both halves at once, for a caller that has every replica at hand (the tests): what stops, what starts."""
    stops = drain_stops(
        replacements=replacements, moving=moving, ready=ready, min_ready=min_ready,
        min_ready_seconds=min_ready_seconds, surge=surge, now=now,
    )
    return stops, drain_starts(originals=originals, waiting=stops.waiting, room=stops.room)


def spans(nodes: Iterable[tuple[str, Mapping[str, str]]], *, keep_within: str) -> str | None:
    """What a multi-node replica's nodes span that the planner keeps one within, in words — ``rack r1, r2
    (keep_within rack)``, ``fabric ib-a, ib-b`` — or None when they are within one. ``nodes``: each
    node's (fabric, labels) now; ``keep_within``: the model's level ("" for none).

    A node without a fabric, or without the level's label, is left out: the label may be missing on
    every node (keep_within set later, on a level no node carries), and a replacement that cannot be
    placed would wait for ever.
    """
    fabrics: set[str] = set()
    domains: set[str] = set()
    for fabric, labels in nodes:
        if fabric:
            fabrics.add(fabric)
        if keep_within and labels.get(LABEL_PREFIX + keep_within):
            domains.add(labels[LABEL_PREFIX + keep_within])
    if len(domains) > 1:
        return f"{keep_within} {', '.join(sorted(domains))} (keep_within {keep_within})"
    if len(fabrics) > 1:
        return f"fabric {', '.join(sorted(fabrics))}"
    return None
