"""Repeated subgraphs: structurally identical regions, so code generation compiles each once.

The algorithm, in three steps (each instance is a run of ``p`` consecutive nodes of a
schedule, the instances of a group follow one another):

1. **Node keys.** A node's key is its op, domain, attributes, input and output types (with
   their symbolic shapes) and, for constant inputs, their dtype and shape (not their values:
   the twelve encoder layers differ only in their weights). Keys become small ints.
2. **Periodic runs.** For every period ``p >= min_nodes`` a vectorised comparison finds the
   maximal runs where ``key[i] == key[i + p]``; a run of length ``>= p`` spans at least two
   candidate instances. This is O(n^2) element comparisons in numpy (~1 ms for n = 1000).
3. **Alignment with wiring.** Within a run every phase (instance start) is tried. A node's
   input is encoded as the distance back to its producer when the producer lies inside the
   instance, and as "external #k" (k-th distinct outside value) when it does not, so the first
   encoder layer, which reads the embeddings rather than a previous layer, matches the
   others. Consecutive equal instances form a candidate; per run the phase covering the most
   nodes wins, then the one with the fewest values crossing its boundary, then the one whose
   instances agree best with node-name scopes.

Candidates from three schedules (the graph's order, an as-soon-as-possible level order and a
depth-first post-order, so a block the graph's order interleaves with unrelated nodes is still
found) are chosen greedily by covered nodes, then by instance count, largest first, trimming
instances that overlap a group already chosen. Cost: O(n^2) numpy work per schedule plus
O(p * region) for each periodic region (BERT-base, n = 960: about 0.2 s in all).

Example:
    >>> from metadef.ir import parse_graph
    >>> body = "".join(f"  %r{i}: f32[n,4] = Relu(%e{i})\\n  %s{i}: f32[n,4] = Sigmoid(%r{i})\\n"
    ...                f"  %m{i}: f32[n,4] = Mul(%r{i}, %s{i})\\n  %e{i + 1}: f32[n,4] = Add(%m{i}, %e{i})\\n"
    ...                for i in range(3))
    >>> g = parse_graph(f"graph g(%e0: f32[n,4]) -> (%e3) {{\\n{body}  return %e3\\n}}")
    >>> groups = find_repeats(g)
    >>> [(grp.count, grp.size) for grp in groups]
    [(3, 4)]
    >>> [v.name for v in groups[0].instances[1].inputs], [v.name for v in groups[0].instances[1].outputs]
    (['e1'], ['e2'])
"""

from __future__ import annotations

import functools
import hashlib
import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from metadef.analysis.lifetimes import dfs_order, level_order
from metadef.ir import Graph, Node, Value
from metadef.ir.printer import format_attr

EXTERNAL = -1   # an input produced outside the instance (or a graph input)
CONSTANT = -2   # a constant input: described by the node key
ABSENT = -3     # an omitted optional input


@dataclass(frozen=True)
class RepeatInstance:
    """One occurrence of a repeated region: its nodes in order and the values crossing it.

    ``inputs`` are the non-constant values read from outside, in first-use order; ``params``
    the constants it reads (its weights); ``outputs`` the values it produces that are read
    after it or are graph outputs.
    """

    nodes: tuple[Node, ...]
    inputs: tuple[Value, ...]
    params: tuple[Value, ...]
    outputs: tuple[Value, ...]

    @functools.cached_property
    def scope(self) -> str:
        """The longest ``/``-separated name prefix its nodes share (else the first node's name).

        Example:
            >>> RepeatInstance((Node("Relu", (), (), name="/l/0/a"),
            ...                 Node("Relu", (), (), name="/l/0/b")), (), (), ()).scope
            '/l/0'
        """
        return name_scope(self.nodes)


def name_scope(nodes: Sequence[Node]) -> str:
    """The longest ``/``-separated prefix the nodes' names share; the first name when none."""
    if not nodes:
        return ""
    names = [n.name for n in nodes]
    low, high = min(names).split("/"), max(names).split("/")
    k = 0
    while k < min(len(low), len(high)) - 1 and low[k] == high[k]:
        k += 1
    text = "/".join(low[:k])
    return text if text.strip("/") else nodes[0].name


@dataclass(frozen=True)
class RepeatGroup:
    """Structurally identical instances: compile one, run it ``count`` times.

    ``signature`` is a stable hex digest of the instances' structure (the same in every run
    and process); ``size`` is the number of nodes per instance.
    """

    signature: str
    size: int
    instances: tuple[RepeatInstance, ...]

    @property
    def count(self) -> int:
        return len(self.instances)

    @property
    def covered(self) -> int:
        """Nodes covered by all instances together."""
        return self.count * self.size


def node_key(node: Node) -> str:
    """A node's structural key: op, domain, attributes, types; constants by dtype and shape.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: f32[n]) -> (%y) { %y: f32[n] = Relu(%x) return %y }")
        >>> node_key(g.nodes[0])
        'Relu() f32[n] -> f32[n]'
    """
    attrs = ",".join(f"{k}={_attr_text(v)}" for k, v in sorted(node.attrs.items()) if v is not None)
    ins = " ".join("_" if v is None else (f"const:{v.type}" if v.is_const else str(v.type)) for v in node.inputs)
    outs = " ".join(str(v.type) for v in node.outputs)
    return f"{node.qualop}({attrs}) {ins} -> {outs}"


def _attr_text(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"tensor<{value.dtype}{list(value.shape)}>"
    if isinstance(value, Graph):
        return body_key(value)
    return format_attr(value)


def body_key(body: Graph) -> str:
    """A nested graph's structure without its names: node keys, and each input as the body
    input it is or the (node, output) it comes from. Identical fused groups get equal keys."""
    where = {id(v): f"i{k}" for k, v in enumerate(body.inputs)}
    parts = []
    for i, n in enumerate(body.nodes):
        ins = ",".join("_" if v is None else where.get(id(v), "c") for v in n.inputs)
        parts.append(f"{node_key(n)}[{ins}]")
        for k, o in enumerate(n.outputs):
            where[id(o)] = f"n{i}.{k}"
    outs = ",".join(where.get(id(v), "?") for v in body.outputs)
    return "{" + ";".join(parts) + "->" + outs + "}"


def signature(instance: RepeatInstance) -> str:
    """A stable digest of an instance's structure: node keys, and inputs as distances back to
    their producer inside the instance or as the k-th distinct outside value.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: f32[n]) -> (%y) { %y: f32[n] = Relu(%x) return %y }")
        >>> len(signature(RepeatInstance(tuple(g.nodes), (), (), ())))
        16
    """
    position = {id(o): (i, k) for i, n in enumerate(instance.nodes) for k, o in enumerate(n.outputs)}
    outside: dict[int, int] = {}
    lines = []
    for i, n in enumerate(instance.nodes):
        wires = []
        for v in n.inputs:
            if v is None or v.is_const:
                wires.append("_" if v is None else "c")
            elif id(v) in position:
                pos, port = position[id(v)]
                wires.append(f"{i - pos}.{port}")
            else:
                wires.append(f"x{outside.setdefault(id(v), len(outside))}")
        lines.append(f"{node_key(n)} <- {','.join(wires)}")
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()[:16]


class _Schedule:
    """One node order, flattened for the search: int keys, input positions and ports."""

    def __init__(self, graph: Graph, nodes: Sequence[Node], codes: dict[str, int], keys: dict[int, str]) -> None:
        self.nodes = list(nodes)
        self.base = np.array([codes.setdefault(keys[id(n)], len(codes)) for n in self.nodes], dtype=np.int64)
        where = {id(o): (i, k) for i, n in enumerate(self.nodes) for k, o in enumerate(n.outputs)}
        n, width = len(self.nodes), max((len(x.inputs) for x in self.nodes), default=1) or 1
        self.ports = 1 + max((len(x.outputs) for x in self.nodes), default=1)
        self.refs = np.full((n, width), ABSENT, dtype=np.int64)   # producer position or a marker
        self.port = np.zeros((n, width), dtype=np.int64)          # which output of the producer
        self.ident = np.full((n, width), ABSENT, dtype=np.int64)  # a distinct id per value read
        last_use: dict[int, int] = {id(v): n for v in graph.outputs}
        for i, node in enumerate(self.nodes):
            for j, v in enumerate(node.inputs):
                if v is None or v.is_const:
                    self.refs[i, j] = ABSENT if v is None else CONSTANT
                    continue
                last_use[id(v)] = max(last_use.get(id(v), i), i)
                pos, k = where.get(id(v), (EXTERNAL, 0))
                self.refs[i, j], self.port[i, j] = pos, k
                self.ident[i, j] = pos * self.ports + k if pos >= 0 else -4 - graph.inputs.index(v)
        outs = max(self.ports - 1, 1)
        self.out_last = np.full((n, outs), -1, dtype=np.int64)    # last step reading each output
        for i, node in enumerate(self.nodes):
            for k, o in enumerate(node.outputs):
                self.out_last[i, k] = last_use.get(id(o), -1)

    def block_codes(self, p: int, starts: np.ndarray) -> np.ndarray:
        """Per block (one per start): its node keys and input encodings, shape (blocks, p, 1 + width).

        An input inside the block is its distance back (times ``ports``, plus the output index);
        one outside is EXTERNAL; constants and omitted inputs keep their markers.
        """
        idx = starts[:, None] + np.arange(p)[None, :]
        refs = self.refs[idx]
        inside = refs >= starts[:, None, None]
        wire = (idx[..., None] - refs) * self.ports + self.port[idx]
        rel = np.where(refs >= 0, np.where(inside, wire, EXTERNAL), refs)
        return np.concatenate([self.base[idx][..., None], rel], axis=2)

    def cut(self, start: int, p: int) -> int:
        """Values crossing the boundary of block ``[start, start + p)``: read from outside or read after."""
        refs, ident = self.refs[start:start + p], self.ident[start:start + p]
        entering = np.unique(ident[(refs < start) & (refs != CONSTANT) & (refs != ABSENT)]).size
        return entering + int((self.out_last[start:start + p] >= start + p).sum())

    def instance(self, start: int, p: int) -> RepeatInstance:
        """The instance made of nodes ``[start, start + p)``, with the values crossing it."""
        nodes = tuple(self.nodes[start:start + p])
        produced = {id(o) for n in nodes for o in n.outputs}
        inputs: dict[int, Value] = {}
        params: dict[int, Value] = {}
        for n in nodes:
            for v in n.inputs:
                if v is not None and id(v) not in produced:
                    (params if v.is_const else inputs).setdefault(id(v), v)
        outputs = tuple(o for i, n in enumerate(nodes) for k, o in enumerate(n.outputs)
                        if self.out_last[start + i, k] >= start + p)
        return RepeatInstance(nodes, tuple(inputs.values()), tuple(params.values()), outputs)


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """Maximal ``[start, stop)`` runs of True."""
    padded = np.concatenate(([False], mask, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist()))


def periodic_regions(base: np.ndarray, min_nodes: int) -> list[tuple[int, int, int]]:
    """``(period, start, stop)``: maximal regions whose keys repeat with that period at least
    twice. A region that a shorter period dividing this one already explains is left out.

    Example:
        >>> periodic_regions(np.array([9, 1, 2, 1, 2, 1, 2, 1, 2, 7]), 2)
        [(2, 1, 9)]
    """
    out: list[tuple[int, int, int]] = []
    found: dict[int, list[tuple[int, int]]] = {}
    for p in range(max(min_nodes, 1), len(base) // 2 + 1):
        for a, b in _runs(base[:-p] == base[p:]):
            lo, hi = a, b + p
            if b - a < p or any(x <= lo and hi <= y for q, spans in found.items() if p % q == 0 for x, y in spans):
                continue
            found.setdefault(p, []).append((lo, hi))
            out.append((p, lo, hi))
    return out


@dataclass
class _Candidate:
    """Equal consecutive blocks of one schedule, starting at ``starts``: a group before the choice."""

    schedule: _Schedule
    period: int
    starts: list[int]

    @functools.cached_property
    def cut(self) -> int:
        return sum(self.schedule.cut(a, self.period) for a in self.starts)

    @functools.cached_property
    def scope_depth(self) -> int:
        return sum(name_scope(self.schedule.nodes[a:a + self.period]).count("/") for a in self.starts)

    def rank(self) -> tuple:
        """Most covered nodes first, then the most instances (smallest period), then the smallest
        boundary, then the deepest name scopes."""
        return (-len(self.starts) * self.period, self.period, self.cut, -self.scope_depth, self.starts[0])


def _phase_runs(s: _Schedule, p: int, start: int, stop: int) -> list[tuple[int, list[list[int]]]]:
    """For each phase of the region: nodes covered and the runs of equal consecutive blocks."""
    out = []
    for r in range(start, min(start + p, stop - 2 * p + 1)):
        starts = np.arange(r, stop - p + 1, p)
        codes = s.block_codes(p, starts)
        same = np.all(codes[1:] == codes[:-1], axis=(1, 2))
        runs = [starts[a:b + 1].tolist() for a, b in _runs(same)]
        if runs:
            out.append((sum(len(run) for run in runs) * p, runs))
    return out


def _region_candidates(s: _Schedule, p: int, start: int, stop: int) -> list[_Candidate]:
    """The best phase of one periodic region: most nodes covered, then boundary, then scopes."""
    phases = _phase_runs(s, p, start, stop)
    if not phases:
        return []
    top = max(covered for covered, _ in phases)
    options = [[_Candidate(s, p, run) for run in runs] for covered, runs in phases if covered == top]
    least = min(sum(c.cut for c in cands) for cands in options)
    options = [cands for cands in options if sum(c.cut for c in cands) == least]
    return max(options, key=lambda cands: sum(c.scope_depth for c in cands))


def context_codes(graph: Graph, keys: dict[int, str], radius: int = 8) -> dict[int, tuple[int, ...]]:
    """Per node id, codes naming its key and what its outputs feed 1, 2, ... ``radius`` hops
    down (consumer codes with the input slot they read). Equal local structure gives equal
    codes, so sorting by them (nearest context first) orders look-alike nodes, such as the
    query and value projections of an attention layer, the same way in every layer."""
    users: dict[int, list[tuple[Node, int]]] = {}
    for n in graph.nodes:
        for slot, v in enumerate(n.inputs):
            if v is not None:
                users.setdefault(id(v), []).append((n, slot))
    names: dict[tuple, int] = {}
    code = {id(n): names.setdefault((keys[id(n)],), len(names)) for n in graph.nodes}
    out = {key: [c] for key, c in code.items()}
    for _ in range(radius):
        code = {id(n): names.setdefault((keys[id(n)], tuple(sorted(
            (k, code[id(u)], slot) for k, o in enumerate(n.outputs) for u, slot in users.get(id(o), [])))),
            len(names)) for n in graph.nodes}
        for key, c in code.items():
            out[key].append(c)
    return {key: tuple(c) for key, c in out.items()}


def _candidates(graph: Graph, min_nodes: int) -> list[_Candidate]:
    """Candidates from three schedules: the graph's order, the level order and the DFS order."""
    keys = {id(n): node_key(n) for n in graph.nodes}
    codes: dict[str, int] = {}
    orders: list[list[Node]] = []
    context = context_codes(graph, keys)
    for order in (list(graph.nodes), level_order(graph, key=lambda n: context[id(n)]), dfs_order(graph)):
        if not any(all(a is b for a, b in zip(order, seen)) for seen in orders):
            orders.append(order)
    out: list[_Candidate] = []
    for order in orders:
        s = _Schedule(graph, order, codes, keys)
        for p, start, stop in periodic_regions(s.base, min_nodes):
            out.extend(_region_candidates(s, p, start, stop))
    return out


def _groups_of(cand: _Candidate) -> list[RepeatGroup]:
    """The candidate's instances, split where exact signatures (external values told apart) differ."""
    out: list[tuple[str, list[RepeatInstance]]] = []
    for a in cand.starts:
        inst = cand.schedule.instance(a, cand.period)
        sig = signature(inst)
        if out and out[-1][0] == sig:
            out[-1][1].append(inst)
        else:
            out.append((sig, [inst]))
    return [RepeatGroup(sig, cand.period, tuple(insts)) for sig, insts in out if len(insts) >= 2]


def _trim(cand: _Candidate, taken: set[int]) -> _Candidate | None:
    """The longest run of the candidate's blocks that avoids nodes already taken."""
    best: list[int] = []
    run: list[int] = []
    for a in cand.starts:
        if any(id(n) in taken for n in cand.schedule.nodes[a:a + cand.period]):
            run = []
            continue
        run.append(a)
        if len(run) > len(best):
            best = list(run)
    return _Candidate(cand.schedule, cand.period, best) if len(best) >= 2 else None


def _select(cands: list[_Candidate], graph: Graph) -> list[RepeatGroup]:
    """Greedy choice by rank; a candidate overlapping a chosen group is trimmed and queued again."""
    heap = [(c.rank(), k, c) for k, c in enumerate(cands)]
    heapq.heapify(heap)
    taken: set[int] = set()
    groups: list[RepeatGroup] = []
    counter = len(cands)
    while heap:
        rank, _, cand = heapq.heappop(heap)
        trimmed = _trim(cand, taken)
        if trimmed is None:
            continue
        if trimmed.rank() != rank:
            counter += 1
            heapq.heappush(heap, (trimmed.rank(), counter, trimmed))
            continue
        for group in _groups_of(trimmed):
            groups.append(group)
            taken.update(id(n) for inst in group.instances for n in inst.nodes)
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    groups.sort(key=lambda g: (-g.covered, index[id(g.instances[0].nodes[0])]))
    return groups


def find_repeats(graph: Graph, min_nodes: int = 4) -> list[RepeatGroup]:
    """Maximal groups of structurally identical, non-overlapping regions of at least
    ``min_nodes`` nodes, the most covered first (see the module doc for the algorithm).

    Example:
        >>> from metadef.ir import parse_graph
        >>> body = "".join(f"  %a{i}: f32[n] = Relu(%x{i})\\n  %x{i + 1}: f32[n] = Exp(%a{i})\\n" for i in range(4))
        >>> g = parse_graph(f"graph g(%x0: f32[n]) -> (%x4) {{\\n{body}  return %x4\\n}}")
        >>> [(grp.count, grp.size) for grp in find_repeats(g, min_nodes=2)]
        [(4, 2)]
    """
    return _select(_candidates(graph, min_nodes), graph)


def format_repeats(groups: Sequence[RepeatGroup]) -> str:
    """A short report, one line per group: ``12 x 78 nodes: /encoder/layer/0 ... /encoder/layer/11``.

    Example:
        >>> print(format_repeats([]))
        no repeated subgraphs
    """
    if not groups:
        return "no repeated subgraphs"
    lines = []
    for g in groups:
        scopes = [i.scope for i in g.instances]
        where = ", ".join(scopes) if len(scopes) <= 3 else f"{scopes[0]} ... {scopes[-1]}"
        lines.append(f"{g.count} x {g.size} nodes: {where}  [{g.signature}]")
    covered = sum(g.covered for g in groups)
    lines.append(f"{len(groups)} group(s) cover {covered} nodes; {sum(g.size for g in groups)} to compile")
    return "\n".join(lines)


__all__ = [
    "RepeatGroup", "RepeatInstance", "find_repeats", "format_repeats", "name_scope", "node_key",
    "periodic_regions", "signature",
]
