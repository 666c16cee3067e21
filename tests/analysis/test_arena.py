"""Arena planning: buffers alive together never share bytes; the peak against the lower bound."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadef.analysis.arena import ALIGNMENT, Buffer, lower_bound, plan_arena

buffers = st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 30), st.integers(0, 10)), max_size=40).map(
    lambda items: [Buffer(size, start, start + length) for size, start, length in items])


@given(buffers)
@settings(max_examples=200, deadline=None)
def test_live_buffers_never_overlap_and_the_peak_bounds_hold(items: list[Buffer]) -> None:
    plan = plan_arena(items)
    assert all(o % ALIGNMENT == 0 for o in plan.offsets)
    spans = [(o, o + -(-b.size // ALIGNMENT) * ALIGNMENT, b) for o, b in zip(plan.offsets, items)]
    for i, (lo, hi, a) in enumerate(spans):
        assert hi <= plan.peak
        for lo2, hi2, b in spans[i + 1:]:
            if a.start <= b.end and b.start <= a.end and a.size and b.size:
                assert hi <= lo2 or hi2 <= lo, (a, b)
    assert lower_bound(items) <= plan.peak <= sum(-(-b.size // ALIGNMENT) * ALIGNMENT for b in items)


def test_a_chain_reuses_memory_and_reaches_the_lower_bound() -> None:
    chain = [Buffer(1000, i, i + 1) for i in range(10)]  # each read by the next step only
    plan = plan_arena(chain)
    assert plan.peak == plan.lower_bound == 2 * 1024
    assert plan.ratio == 1.0


def test_bad_buffers_are_refused() -> None:
    with pytest.raises(ValueError, match="end >= start"):
        plan_arena([Buffer(8, 3, 1)])
