"""Compute/communication overlap for a graph whose nodes are split across devices or backends.

A *transfer* is a value produced in one partition and read in another: one transfer per
(value, destination). Graph inputs live on the ``host`` partition, and graph outputs made
elsewhere travel back to it; constants are taken to be resident where they are read (weights
are placed ahead of time), so they never transfer. While a transfer is in flight, a node of
its source or destination partition can run when it neither depends on the value nor is
needed to produce it (it is neither a descendant nor an ancestor in the dependency DAG):
those are the computations that can hide the transfer. This is conservative: a node of the
source partition that reads the value there counts as dependent, though it could run during
the copy.

Ancestor and descendant sets are bitsets (Python ints) built in one pass each way, so the
report costs O(n^2 / 64) word operations (a few milliseconds for BERT-base).

Example:
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph('''graph g(%x: f32[n,4]) -> (%z) {
    ...   %a: f32[n,4] = Relu(%x) @relu
    ...   %b: f32[n,4] = Exp(%a) @exp
    ...   %c: f32[n,4] = Neg(%x) @neg
    ...   %z: f32[n,4] = Add(%b, %c) @add
    ...   return %z
    ... }''')
    >>> report = overlap_report(g, {"exp": "gpu", "add": "gpu"})
    >>> [(t.value.name, t.src, t.dst, t.overlappable) for t in report.transfers]
    [('a', 'cpu', 'gpu', ('neg',)), ('c', 'cpu', 'gpu', ('relu', 'exp')), ('z', 'gpu', 'cpu', ())]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from metadef.analysis.lifetimes import size_in_bytes
from metadef.core.errors import GraphError
from metadef.ir import Graph, Value
from metadef.shape import Dim, add

OUTPUT = "<output>"
"""The consumer name a transfer lists when it carries a graph output back to the host."""


@dataclass(frozen=True)
class Transfer:
    """One value copied from partition ``src`` to ``dst``, and the nodes that may run meanwhile.

    ``consumers`` are the reading nodes in ``dst`` (:data:`OUTPUT` for a graph output);
    ``overlappable`` the names of nodes in ``src`` or ``dst`` that neither depend on the value
    nor are needed to produce it, in graph order.
    """

    value: Value
    src: str
    dst: str
    size: Dim
    consumers: tuple[str, ...]
    overlappable: tuple[str, ...]

    @property
    def overlap_count(self) -> int:
        return len(self.overlappable)


@dataclass(frozen=True)
class OverlapReport:
    """The transfers of a partitioned graph, in the order their values are produced.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: f32[2]) -> (%y) { %y: f32[2] = Relu(%x) return %y }")
        >>> overlap_report(g).transfers
        ()
    """

    graph: str
    host: str
    partitions: dict[str, int]
    transfers: tuple[Transfer, ...]

    @property
    def total_bytes(self) -> Dim:
        """Symbolic bytes moved by all transfers together."""
        total: Dim = 0
        for t in self.transfers:
            total = add(total, t.size)
        return total


def partition_of(graph: Graph, assignment: Mapping[str, str] | None, default: str) -> dict[int, str]:
    """Node id -> partition; nodes not named in ``assignment`` go to ``default``.

    Raises GraphError when ``assignment`` names a node the graph does not have.
    """
    assignment = dict(assignment or {})
    names = {n.name for n in graph.nodes}
    unknown = sorted(set(assignment) - names)
    if unknown:
        raise GraphError(f"overlap: the assignment names {len(unknown)} node(s) graph {graph.name} does not have: "
                         f"{unknown[:5]}; use node names as printed by print_graph (after @)")
    return {id(n): assignment.get(n.name, default) for n in graph.nodes}


def _ancestors(graph: Graph) -> list[int]:
    """Per node index, a bitset of the nodes it depends on (transitively)."""
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    anc = [0] * len(graph.nodes)
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            if v is not None and v.producer is not None:
                j = index[id(v.producer)]
                anc[i] |= anc[j] | (1 << j)
    return anc


def _descendants(graph: Graph) -> list[int]:
    """Per node index, a bitset of the nodes that depend on it (transitively)."""
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    desc = [0] * len(graph.nodes)
    for i in range(len(graph.nodes) - 1, -1, -1):
        for v in graph.nodes[i].inputs:
            if v is not None and v.producer is not None:
                desc[index[id(v.producer)]] |= desc[i] | (1 << i)
    return desc


def _crossings(graph: Graph, part: Mapping[int, str], host: str) -> list[tuple[Value, str, str, list[str]]]:
    """(value, src, dst, consumer names) for every value read outside its partition."""
    out: dict[tuple[int, str], tuple[Value, str, str, list[str]]] = {}
    for n in graph.nodes:
        for v in {id(v): v for v in n.inputs if v is not None and not v.is_const}.values():
            src = part[id(v.producer)] if v.producer is not None else host
            dst = part[id(n)]
            if src != dst:
                out.setdefault((id(v), dst), (v, src, dst, []))[3].append(n.name)
    for v in graph.outputs:
        src = part[id(v.producer)] if v.producer is not None else host
        if src != host and not v.is_const:
            out.setdefault((id(v), host), (v, src, host, []))[3].append(OUTPUT)
    return list(out.values())


def overlap_report(graph: Graph, assignment: Mapping[str, str] | None = None, host: str = "cpu",
                   default: str | None = None) -> OverlapReport:
    """Transfers between partitions and, for each, the nodes that can hide it.

    ``assignment`` maps node names to partitions; other nodes go to ``default`` (the host when
    not given). With a single partition the report has no transfers.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph('''graph g(%x: f32[n,4]) -> (%y) {
        ...   %a: f32[n,4] = Relu(%x) @relu
        ...   %y: f32[n,4] = Exp(%a) @exp
        ...   return %y
        ... }''')
        >>> r = overlap_report(g, {"exp": "gpu"})
        >>> [(t.value.name, t.src, t.dst, str(t.size), t.overlap_count) for t in r.transfers]
        [('a', 'cpu', 'gpu', 'n*16', 0), ('y', 'gpu', 'cpu', 'n*16', 0)]
    """
    part = partition_of(graph, assignment, host if default is None else default)
    counts: dict[str, int] = {}
    for n in graph.nodes:
        counts[part[id(n)]] = counts.get(part[id(n)], 0) + 1
    anc, desc = _ancestors(graph), _descendants(graph)
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    members: dict[str, int] = {}
    for i, n in enumerate(graph.nodes):
        members[part[id(n)]] = members.get(part[id(n)], 0) | (1 << i)
    transfers = []
    for v, src, dst, consumers in _crossings(graph, part, host):
        blocked = 0
        if v.producer is not None:
            k = index[id(v.producer)]
            blocked |= anc[k] | (1 << k) | desc[k]
        else:
            for n in graph.nodes:
                if any(x is v for x in n.inputs):
                    blocked |= desc[index[id(n)]] | (1 << index[id(n)])
        free = (members.get(src, 0) | members.get(dst, 0)) & ~blocked
        names = tuple(graph.nodes[i].name for i in range(len(graph.nodes)) if free >> i & 1)
        transfers.append(Transfer(v, src, dst, size_in_bytes(v), tuple(consumers), names))
    return OverlapReport(graph.name, host, counts, tuple(transfers))


def _nodes_text(names: tuple[str, ...], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def format_overlap(report: OverlapReport, bindings: Mapping[str, int] | None = None) -> str:
    """A short text report; sizes are evaluated when ``bindings`` are given.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: f32[2]) -> (%y) { %y: f32[2] = Relu(%x) return %y }")
        >>> print(format_overlap(overlap_report(g)))
        graph g: no transfers: all 1 node(s) run on one partition (cpu)
    """
    parts = ", ".join(f"{p}: {c} nodes" for p, c in report.partitions.items())
    if not report.transfers:
        if len(report.partitions) <= 1:
            where = next(iter(report.partitions), report.host)
            total = sum(report.partitions.values())
            return f"graph {report.graph}: no transfers: all {total} node(s) run on one partition ({where})"
        return f"graph {report.graph}: no transfers: no value crosses partitions ({parts})"
    lines = [f"graph {report.graph}: {len(report.transfers)} transfer(s) ({parts}; host {report.host})"]
    for t in report.transfers:
        size = t.size if bindings is None or isinstance(t.size, int) else t.size.evaluate(bindings)
        lines.append(f"  %{t.value.name}: {t.src} -> {t.dst}, {size} bytes, read by {_nodes_text(t.consumers)}; "
                     f"{t.overlap_count} node(s) can overlap it" +
                     (f": {_nodes_text(t.overlappable)}" if t.overlappable else ""))
    return "\n".join(lines)


__all__ = ["OUTPUT", "OverlapReport", "Transfer", "format_overlap", "overlap_report", "partition_of"]

