"""Graph analyses (L4, between ``ir`` and ``passes``): what a schedule, a code generator or a
multi-device plan needs to know about a graph, computed without changing it.

- **Tensor lifetimes** (:mod:`~metadef.analysis.lifetimes`): when each value is live in a
  schedule and how many bytes it takes (symbolic); the live bytes per step and their peak,
  the least memory any allocator needs for that schedule; :func:`memory_order`, a schedule
  that frees intermediates early.
- **Repeated subgraphs** (:mod:`~metadef.analysis.repeats`): structurally identical regions
  (BERT's twelve encoder layers, ResNet's identity blocks), so each compiles once.
- **Compute/communication overlap** (:mod:`~metadef.analysis.overlap`): the transfers of a
  graph split across devices and the computations that can run while each is in flight.

Example:
    >>> from metadef.ir import parse_graph
    >>> from metadef.analysis import find_repeats, lower_bound, overlap_report
    >>> g = parse_graph('''graph g(%x: f32[n,4]) -> (%z) {
    ...   %a: f32[n,4] = Relu(%x) @relu
    ...   %z: f32[n,4] = Exp(%a) @exp
    ...   return %z
    ... }''')
    >>> lower_bound(g, {"n": 2}), str(lower_bound(g))
    (64, 'n*32')
    >>> find_repeats(g), len(overlap_report(g, {"exp": "gpu"}).transfers)
    ([], 2)
"""

from metadef.analysis.lifetimes import (
    Lifetime,
    dfs_order,
    is_topological,
    level_order,
    lifetimes,
    live_memory,
    lower_bound,
    memory_order,
    size_in_bytes,
)
from metadef.analysis.overlap import OverlapReport, Transfer, format_overlap, overlap_report
from metadef.analysis.repeats import RepeatGroup, RepeatInstance, find_repeats, format_repeats

__all__ = [
    "Lifetime", "OverlapReport", "RepeatGroup", "RepeatInstance", "Transfer", "dfs_order", "find_repeats",
    "format_overlap", "format_repeats", "is_topological", "level_order", "lifetimes", "live_memory", "lower_bound",
    "memory_order", "overlap_report", "size_in_bytes",
]
