"""Arena planning: one block of memory for every intermediate tensor, offsets by lifetime.

A buffer lives from the step that writes it to the last step that reads it (inclusive). Two
buffers may share bytes when their lifetimes do not overlap. :func:`plan_arena` places the
buffers greedily, each in the tightest gap that fits it among the buffers already placed that
overlap it in time, in several orders (largest first, as TensorFlow Lite's "greedy by size"
planner; by start; by size x lifetime; longest first), then, while the best is above the
lower bound, in up to :data:`RANDOM_ORDERS` seeded random orders (fewer for many buffers:
:data:`RANDOM_WORK`), and keeps the smallest arena.
:attr:`ArenaPlan.lower_bound` is the most memory live at any one step: no placement can need
less, so ``peak / lower_bound`` says how good the plan is.

Example:
    >>> plan = plan_arena([Buffer(100, 0, 1), Buffer(50, 1, 2), Buffer(100, 2, 3)])
    >>> plan.offsets, plan.peak, plan.lower_bound
    ([0, 128, 0], 192, 192)
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

ALIGNMENT = 64
"""Every offset is a multiple of this (a cache line; the widest vector load)."""


@dataclass(frozen=True)
class Buffer:
    """``size`` bytes live from step ``start`` to step ``end`` (both included)."""

    size: int
    start: int
    end: int


@dataclass(frozen=True)
class ArenaPlan:
    """Where each buffer goes (``offsets``, in the order given), the arena's size (``peak``)
    and the most memory live at one step (``lower_bound``), both with aligned sizes."""

    offsets: list[int]
    peak: int
    lower_bound: int

    @property
    def ratio(self) -> float:
        """``peak / lower_bound`` (1.0 for an empty plan)."""
        return self.peak / self.lower_bound if self.lower_bound else 1.0


def _aligned(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def lower_bound(buffers: Sequence[Buffer], alignment: int = ALIGNMENT) -> int:
    """The most bytes (aligned sizes) live at any one step.

    Example:
        >>> lower_bound([Buffer(10, 0, 0), Buffer(10, 0, 1), Buffer(64, 1, 1)])
        128
    """
    events: dict[int, int] = {}
    for b in buffers:
        size = _aligned(b.size, alignment)
        events[b.start] = events.get(b.start, 0) + size
        events[b.end + 1] = events.get(b.end + 1, 0) - size
    live = best = 0
    for step in sorted(events):
        live += events[step]
        best = max(best, live)
    return best


ORDERS: dict[str, Callable[[Buffer], tuple[int, ...]]] = {
    "size": lambda b: (-b.size, b.start),
    "start": lambda b: (b.start, -b.size),
    "area": lambda b: (-b.size * (b.end - b.start + 1), b.start),
    "duration": lambda b: (b.start - b.end, -b.size),
}
"""The placement orders :func:`plan_arena` tries (greedy by size first); the best plan wins."""


def plan_arena(buffers: Sequence[Buffer], alignment: int = ALIGNMENT) -> ArenaPlan:
    """Offsets for ``buffers`` such that buffers alive at the same step never share a byte:
    the smallest arena of the greedy placements in each of :data:`ORDERS`.

    Example:
        >>> plan_arena([Buffer(8, 0, 0), Buffer(8, 1, 1)]).offsets
        [0, 0]
    """
    for b in buffers:
        if b.size < 0 or b.end < b.start:
            raise ValueError(f"a buffer needs size >= 0 and end >= start, got {b}")
    bound = lower_bound(buffers, alignment)
    best: ArenaPlan | None = None
    orders = (sorted(range(len(buffers)), key=lambda i: (*key(buffers[i]), i)) for key in ORDERS.values())
    shuffled = random.Random(len(buffers))  # (seeded: the same buffers get the same plan)
    random_orders = min(RANDOM_ORDERS, max(64, RANDOM_WORK // max(1, len(buffers))))
    for tries, order in enumerate(itertools.chain(orders, _shuffles(len(buffers), shuffled))):
        if best is not None and (best.peak == bound or tries >= len(ORDERS) + random_orders):
            break
        offsets, peak = _place(buffers, order, alignment)
        if best is None or peak < best.peak:
            best = ArenaPlan(offsets, peak, bound)
    assert best is not None
    return best


RANDOM_ORDERS = 1024
"""Random placement orders :func:`plan_arena` tries at most after :data:`ORDERS` while its best
plan is above the lower bound (ResNet-50's im2col workspaces: 1.13x the bound by every fixed
order, the bound itself within 300 random ones; ResNet-50 at batch 3 with its Winograd convs on
pixel rows: 1.11x by every fixed order and the first 256 random ones, the bound within 512; a
try of its 84 buffers takes ~0.1 ms), fewer for many buffers (:data:`RANDOM_WORK`)."""

RANDOM_WORK = 150_000
"""Random orders times buffers :func:`plan_arena` spends at most (at least 64 orders)."""


def _shuffles(n: int, rng: random.Random) -> Iterator[list[int]]:
    while True:
        order = list(range(n))
        rng.shuffle(order)
        yield order


def _place(buffers: Sequence[Buffer], order: Sequence[int], alignment: int) -> tuple[list[int], int]:
    """Place the buffers in ``order``, each in the tightest gap that fits it (the buffers it
    may not overlap found through the steps they are alive at, not by a scan of all)."""
    offsets = [0] * len(buffers)
    sizes = [0] * len(buffers)
    alive: dict[int, list[int]] = {}  # step -> the placed buffers alive at it
    peak = 0
    for i in order:
        b = buffers[i]
        size = _aligned(b.size, alignment)
        near: set[int] = set()
        for t in range(b.start, b.end + 1):
            near.update(alive.get(t, ()))
        best, best_gap, cursor = None, None, 0
        for o, s in sorted((offsets[j], sizes[j]) for j in near):
            gap = o - cursor
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, o + s)
        offset = best if best is not None else cursor
        offsets[i], sizes[i] = offset, size
        for t in range(b.start, b.end + 1):
            alive.setdefault(t, []).append(i)
        peak = max(peak, offset + size)
    return offsets, peak


__all__ = ["ALIGNMENT", "ArenaPlan", "Buffer", "RANDOM_ORDERS", "RANDOM_WORK", "lower_bound", "plan_arena"]
