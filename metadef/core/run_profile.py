"""A run's time, node by node: what :meth:`metadef.Session.profile` returns.

A backend times each unit of work it runs (for the x86 backend, each group of native calls
the worker pool runs at once; for the reference backend, each node) over several runs and
reports the median of each. Like ONNX Runtime's ``enable_profiling`` and TVM's debug
executor, units are timed one at a time, so each carries a call's overhead (about a
microsecond) and the sum is a little above a plain run's latency.

Example:
    >>> p = RunProfile([ProfileRow("conv1", "Conv", "conv (sgemm)", 1, 0.003),
    ...              ProfileRow("relu1", "Relu", "generated", 1, 0.001)], runs=5, target="x86")
    >>> round(p.total * 1e3, 3), [r.node for r in p.top(1)], [r.node for r in p.by_node()]
    (4.0, ['conv1'], ['conv1', 'relu1'])
    >>> p.by_op()[0][:2]
    ('Conv', 0.003)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ProfileRow:
    """One timed unit: the node it runs, its op, how it runs, its native calls, seconds a run
    (median over the profiled runs)."""

    node: str
    op: str
    what: str
    calls: int
    seconds: float


@dataclass
class RunProfile:
    """Rows in run order, how many runs they are the medians of, the target and the symbols'
    values. ``total``: the rows summed; ``wall``: the median time of a whole profiled run
    (the rows and what lies between them)."""

    rows: list[ProfileRow]
    runs: int
    target: str
    symbols: dict[str, int] = field(default_factory=dict)
    wall: float | None = None
    note: str = ""

    @property
    def total(self) -> float:
        return sum(r.seconds for r in self.rows)

    def top(self, n: int = 20) -> list[ProfileRow]:
        """The ``n`` slowest rows, slowest first."""
        return sorted(self.rows, key=lambda r: -r.seconds)[:n]

    def by_node(self) -> list[ProfileRow]:
        """One row per node (its units summed; ``what``: how its slowest unit runs, and how
        many units it has), slowest first."""
        nodes: dict[str, list[ProfileRow]] = {}
        for r in self.rows:
            nodes.setdefault(r.node, []).append(r)
        merged = []
        for node, rows in nodes.items():
            slowest = max(rows, key=lambda r: r.seconds)
            what = slowest.what + (f" ({len(rows)} units)" if len(rows) > 1 else "")
            merged.append(ProfileRow(node, slowest.op, what, sum(r.calls for r in rows),
                                     sum(r.seconds for r in rows)))
        return sorted(merged, key=lambda r: -r.seconds)

    def by_op(self) -> list[tuple[str, float, int]]:
        """(op, seconds, nodes) per op, slowest first."""
        seconds: dict[str, float] = {}
        nodes: dict[str, set[str]] = {}
        for r in self.rows:
            seconds[r.op] = seconds.get(r.op, 0.0) + r.seconds
            nodes.setdefault(r.op, set()).add(r.node)
        return sorted(((op, t, len(nodes[op])) for op, t in seconds.items()), key=lambda x: -x[1])

    def to_dict(self) -> dict[str, Any]:
        """The profile as plain data (seconds), for JSON."""
        return {"target": self.target, "runs": self.runs, "symbols": dict(self.symbols), "wall": self.wall,
                "total": self.total, "note": self.note,
                "rows": [{"node": r.node, "op": r.op, "what": r.what, "calls": r.calls, "seconds": r.seconds}
                         for r in self.rows]}

    def table(self, n: int = 20) -> str:
        """The slowest ``n`` nodes and the time per op, as text."""
        total = self.total or 1e-12
        binding = ", ".join(f"{k}={v}" for k, v in sorted(self.symbols.items())) or "static shapes"
        wall = f", a whole run {self.wall * 1e3:.3f} ms" if self.wall is not None else ""
        lines = [f"profile ({self.target}, {binding}; medians of {self.runs} runs): "
                 f"{len(self.rows)} units, {self.total * 1e3:.3f} ms in all{wall}"]
        if self.note:
            lines.append(f"  ({self.note})")
        lines.append(f"  {'ms':>9} {'%':>5}  {'op':<22} {'node':<36} how")
        for r in self.by_node()[:n]:
            lines.append(f"  {r.seconds * 1e3:9.3f} {100 * r.seconds / total:5.1f}  {r.op[:22]:<22} "
                         f"{r.node[:36]:<36} {r.what}")
        lines.append("  by op:")
        for op, seconds, count in self.by_op():
            lines.append(f"  {seconds * 1e3:9.3f} {100 * seconds / total:5.1f}  {op:<22} {count} node"
                         + ("s" if count != 1 else ""))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def median_rows(runs: Sequence[Sequence[float]], labels: Iterable[tuple[str, str, str, int]]) -> list[ProfileRow]:
    """Rows from per-run timings (``runs[k][i]``: unit ``i``'s seconds in run ``k``) and each
    unit's (node, op, what, calls).

    Example:
        >>> [r.seconds for r in median_rows([[1.0, 2.0], [3.0, 2.0], [2.0, 9.0]], [("a", "A", "", 1)] * 2)]
        [2.0, 2.0]
    """
    return [ProfileRow(node, op, what, calls, statistics.median(run[i] for run in runs))
            for i, (node, op, what, calls) in enumerate(labels)]


def measure(run: Callable[[], Any], timed_run: Callable[[], list[float]], runs: int,
            warmup: int) -> tuple[list[list[float]], float]:
    """``warmup`` plain runs, then ``max(1, runs)`` rounds of a plain run (timed whole) and a
    run with each unit timed (``timed_run``'s seconds): every round's unit times, and the median
    of the whole runs. The loop each backend's ``profile`` shares.

    Example:
        >>> times, wall = measure(lambda: None, lambda: [0.5, 0.25], runs=3, warmup=1)
        >>> times, wall >= 0
        ([[0.5, 0.25], [0.5, 0.25], [0.5, 0.25]], True)
    """
    for _ in range(warmup):
        run()
    timings, walls = [], []
    for _ in range(max(1, runs)):
        start = time.perf_counter()
        run()
        walls.append(time.perf_counter() - start)
        timings.append(timed_run())
    return timings, statistics.median(walls)


__all__ = ["ProfileRow", "RunProfile", "measure", "median_rows"]
