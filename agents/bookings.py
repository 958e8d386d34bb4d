"""What is booked on each node, for the layers that may not import placement (nodes, facility).

Placement keeps the bookings (its GpuBooking and NodeBooking tables) and registers the readers here in
its AppConfig.ready(); until then, nothing is booked anywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

# node ids → booked present GPUs per node; node ids (None: every node) → placed watts per node.
_booked_gpus: Callable[[Iterable[int]], dict[int, int]] | None = None
_placed_watts: Callable[[Iterable[int] | None], dict[int, float]] | None = None


def register_booking_readers(
    *,
    booked_gpus: Callable[[Iterable[int]], dict[int, int]],
    placed_watts: Callable[[Iterable[int] | None], dict[int, float]],
) -> None:
    """Set the functions that read bookings (placement's, in its ready())."""
    global _booked_gpus, _placed_watts
    _booked_gpus, _placed_watts = booked_gpus, placed_watts


def booked_gpus(node_ids: Iterable[int]) -> dict[int, int]:
    """Node id → how many of its present GPUs are booked (absent: none)."""
    return _booked_gpus(node_ids) if _booked_gpus else {}


def placed_watts(node_ids: Iterable[int] | None = None) -> dict[int, float]:
    """Node id → the declared draw of the shards placed on it (absent: none)."""
    return _placed_watts(node_ids) if _placed_watts else {}
