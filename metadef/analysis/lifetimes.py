"""Tensor lifetimes, live memory per step, and a schedule that frees intermediates early.

A *schedule* is a topological order of the graph's nodes; step ``i`` runs ``order[i]``. A
node output is live from the step that defines it to the last step that reads it (inclusive:
while a node runs, its inputs and its outputs are both held). Graph outputs stay live to the
last step. Sizes are symbolic (``batch*seq*3072*4`` bytes); nothing here assumes in-place
kernels or views, so the figures are what an arena needs without aliasing.

Example:
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph('''graph g(%x: f32[n,4]) -> (%z) {
    ...   %a: f32[n,4] = Relu(%x)
    ...   %z: f32[n,4] = Exp(%a)
    ...   return %z
    ... }''')
    >>> [(t.value.name, t.start, t.end, str(t.size)) for t in lifetimes(g)]
    [('x', 0, 0, 'n*16'), ('a', 0, 1, 'n*16'), ('z', 1, 1, 'n*16')]
    >>> live_memory(g, {"n": 2}), lower_bound(g, {"n": 2})
    ([32, 64], 64)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from metadef.core.errors import GraphError, ShapeError
from metadef.ir import Graph, Node, Value
from metadef.shape import Dim, ceildiv, evaluate, max_, mul, sub

INPUT, CONST, NODE = "input", "const", "node"
"""The kinds of a :class:`Lifetime`: a graph input, a constant, or a node output."""

REPRESENTATIVE_DIM = 64
"""The value :func:`memory_order` gives a symbol it was not told about."""


@dataclass(frozen=True)
class Lifetime:
    """When one value holds memory in a schedule, and how much.

    ``start`` is the step that defines it (0 for inputs and constants, which exist before the
    first step); ``end`` is the last step that reads it (the last step for graph outputs and
    constants; ``start`` for a value nobody reads). ``kind`` is ``"input"``, ``"const"`` or
    ``"node"``; ``is_output`` marks graph outputs.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: f32[2]) -> (%y) { %y: f32[2] = Relu(%x) return %y }")
        >>> lifetimes(g)[1]
        Lifetime(%y node steps 0..0, 8 bytes, output)
    """

    value: Value
    kind: str
    start: int
    end: int
    size: Dim
    is_output: bool = False

    def live_at(self, step: int) -> bool:
        """True when the value holds memory during ``step``."""
        return self.start <= step <= self.end

    def __repr__(self) -> str:
        tail = ", output" if self.is_output else ""
        return f"Lifetime(%{self.value.name} {self.kind} steps {self.start}..{self.end}, {self.size} bytes{tail})"


def size_in_bytes(value: Value) -> Dim:
    """``numel * itemsize`` of a value, symbolic; sub-byte dtypes round up per tensor.

    Example:
        >>> from metadef.shape import parse_type
        >>> size_in_bytes(Value("h", parse_type("f32[batch,seq,3072]")))
        Expr(batch*seq*12288)
        >>> size_in_bytes(Value("q", parse_type("i4[3]")))
        2
    """
    t = value.type
    if t is None or t.shape is None:
        raise ShapeError(f"value %{value.name} has no known shape ({t}); its size in bytes is unknown: "
                         "run shape inference first")
    numel: Dim = 1
    for d in t.shape:
        numel = mul(numel, d)
    bits = t.dtype.bits
    return mul(numel, bits // 8) if bits % 8 == 0 else ceildiv(mul(numel, bits), 8)


def _schedule(graph: Graph, order: Sequence[Node] | None) -> list[Node]:
    """The schedule to analyse: ``order`` checked to be a topological order, or the graph's own."""
    if order is None:
        return list(graph.nodes)
    order = list(order)
    if len(order) != len(graph.nodes) or {id(n) for n in order} != {id(n) for n in graph.nodes}:
        raise GraphError(f"graph {graph.name}: the order must hold each of its {len(graph.nodes)} nodes once, "
                         f"got {len(order)} nodes")
    done = {id(v) for v in [*graph.inputs, *graph.constants]}
    for step, node in enumerate(order):
        for v in node.inputs:
            if v is not None and id(v) not in done and v.producer is not None:
                raise GraphError(f"graph {graph.name}: step {step} runs {node.name} ({node.op}) before "
                                 f"%{v.name} is computed: the order is not topological")
        done.update(id(o) for o in node.outputs)
    return order


def lifetimes(graph: Graph, order: Sequence[Node] | None = None) -> list[Lifetime]:
    """Every value's lifetime in a schedule: inputs, then constants, then node outputs by step.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph('''graph g(%x: f32[n,4]) -> (%z) {
        ...   %a: f32[n,4] = Relu(%x)
        ...   %z: f32[n,4] = Exp(%a)
        ...   return %z
        ... }''')
        >>> [t.kind for t in lifetimes(g)]
        ['input', 'node', 'node']
    """
    nodes = _schedule(graph, order)
    last = max(len(nodes) - 1, 0)
    last_use: dict[int, int] = {}
    for step, node in enumerate(nodes):
        for v in node.inputs:
            if v is not None:
                last_use[id(v)] = step
    outputs = {id(v) for v in graph.outputs}
    out: list[Lifetime] = []
    for v in graph.inputs:
        is_out = id(v) in outputs
        out.append(Lifetime(v, INPUT, 0, last if is_out else last_use.get(id(v), 0), size_in_bytes(v), is_out))
    for v in graph.constants:
        out.append(Lifetime(v, CONST, 0, last, size_in_bytes(v), id(v) in outputs))
    for step, node in enumerate(nodes):
        for v in node.outputs:
            is_out = id(v) in outputs
            end = last if is_out else max(step, last_use.get(id(v), step))
            out.append(Lifetime(v, NODE, step, end, size_in_bytes(v), is_out))
    return out


def _per_step(graph: Graph, order: Sequence[Node] | None, kinds: Iterable[str]) -> list[Dim]:
    """Symbolic live bytes per step, by a sweep over interval starts and ends."""
    steps = max(len(graph.nodes), 1)
    delta: list[Dim] = [0] * (steps + 1)
    wanted = set(kinds)
    for t in lifetimes(graph, order):
        if t.kind in wanted:
            delta[t.start] = delta[t.start] + t.size
            delta[t.end + 1] = sub(delta[t.end + 1], t.size)
    live: list[Dim] = []
    running: Dim = 0
    for step in range(steps):
        running = running + delta[step]
        live.append(running)
    return live


def live_memory(graph: Graph, bindings: Mapping[str, int] | None = None, order: Sequence[Node] | None = None,
                *, kinds: Iterable[str] = (NODE,)) -> list[Dim]:
    """Bytes live during each step: ints for concrete ``bindings``, symbolic dims without.

    By default only node outputs count (intermediates and the graph outputs the program
    writes); pass ``kinds=("node", "input", "const")`` to add inputs and weights.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph('''graph g(%x: f32[n,4]) -> (%z) {
        ...   %a: f32[n,4] = Relu(%x)
        ...   %z: f32[n,4] = Exp(%a)
        ...   return %z
        ... }''')
        >>> [str(d) for d in live_memory(g)]
        ['n*16', 'n*32']
        >>> live_memory(g, {"n": 1}, kinds=("node", "input"))
        [32, 32]
    """
    live = _per_step(graph, order, kinds)
    if bindings is None:
        return live
    return [evaluate(d, bindings) for d in live]


def dominates(a: Dim, b: Dim) -> bool:
    """True when ``a >= b`` for every non-negative value of the symbols (``a - b`` has no
    negative coefficient; every atom of a dim is non-negative).

    Example:
        >>> from metadef.shape import sym
        >>> n = sym("n")
        >>> dominates(n * 8 + 4, n * 4), dominates(n * 8, n * n)
        (True, False)
    """
    diff = sub(a, b)
    if isinstance(diff, int):
        return diff >= 0
    return all(coef >= 0 for _mono, coef in diff.terms)


def peak(dims: Iterable[Dim]) -> Dim:
    """``max_`` of the dims that no other dim dominates (a symbolic Pareto frontier).

    Example:
        >>> from metadef.shape import sym
        >>> n, m = sym("n"), sym("m")
        >>> str(peak([n * 4, n * 8, m * 2, 3]))
        'max(3, m*2, n*8)'
    """
    frontier: list[Dim] = []
    for d in dims:
        if any(dominates(f, d) for f in frontier):
            continue
        frontier = [f for f in frontier if not dominates(d, f)]
        frontier.append(d)
    return max_(*frontier) if frontier else 0


def lower_bound(graph: Graph, bindings: Mapping[str, int] | None = None,
                order: Sequence[Node] | None = None, *, kinds: Iterable[str] = (NODE,)) -> Dim:
    """The peak of :func:`live_memory`: what any allocator needs at least for this schedule.

    With ``bindings`` an int. Without, a symbolic ``max(...)`` over the per-step sums that are
    not dominated by another for all symbol values; evaluating it at any bindings gives the
    same number as passing them (it is exact, only the dominated steps are dropped).

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph('''graph g(%x: f32[n,4]) -> (%z) {
        ...   %a: f32[n,4] = Relu(%x)
        ...   %z: f32[n,4] = Exp(%a)
        ...   return %z
        ... }''')
        >>> lower_bound(g), lower_bound(g, {"n": 3})
        (Expr(n*32), 96)
    """
    live = live_memory(graph, bindings, order, kinds=kinds)
    if bindings is not None:
        return max(live, default=0)
    return peak(live)


def representative_bindings(graph: Graph, bindings: Mapping[str, int] | None = None) -> dict[str, int]:
    """``bindings`` completed with a representative value for every other symbol of the graph."""
    out: dict[str, int] = {}
    symbols = set(graph.env.symbols)
    for v in graph.values():
        if v.type is not None:
            symbols |= v.type.free_symbols
    for name in sorted(symbols):
        info = graph.env.symbols.get(name)
        value = REPRESENTATIVE_DIM
        if info is not None:
            value = max(value, info.lo)
            value = min(value, info.hi) if info.hi is not None else value
            value -= value % info.multiple_of
        out[name] = value
    out.update(bindings or {})
    return out


def _bytes(value: Value, env: Mapping[str, int]) -> int:
    size = size_in_bytes(value)
    return size if isinstance(size, int) else size.evaluate(env)


def greedy_order(graph: Graph, bindings: Mapping[str, int]) -> list[Node]:
    """Greedy list scheduling: among ready nodes run the one whose step adds the fewest live
    bytes (outputs allocated minus intermediates freed), ties by the original order."""
    users = graph.consumers()
    remaining = {key: len(nodes) for key, nodes in users.items()}
    keep = {id(v) for v in graph.outputs}
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    waiting = {id(n): len({id(v) for v in n.inputs if v is not None and v.producer is not None})
               for n in graph.nodes}
    ready = {index[id(n)]: n for n in graph.nodes if waiting[id(n)] == 0}
    order: list[Node] = []
    while ready:
        best = min(ready, key=lambda i: (_net_bytes(ready[i], remaining, keep, bindings), i))
        node = ready.pop(best)
        order.append(node)
        for v in {id(v): v for v in node.inputs if v is not None}.values():
            remaining[id(v)] -= sum(1 for x in node.inputs if x is v)
        for out in node.outputs:
            for user in {id(u): u for u in users.get(id(out), [])}.values():
                waiting[id(user)] -= 1
                if waiting[id(user)] == 0:
                    ready[index[id(user)]] = user
    return order


def _net_bytes(node: Node, remaining: Mapping[int, int], keep: set[int], env: Mapping[str, int]) -> int:
    allocated = sum(_bytes(o, env) for o in node.outputs)
    freed = 0
    for v in {id(v): v for v in node.inputs if v is not None}.values():
        uses = sum(1 for x in node.inputs if x is v)
        if v.producer is not None and id(v) not in keep and remaining[id(v)] == uses:
            freed += _bytes(v, env)
    return allocated - freed


def memory_order(graph: Graph, bindings: Mapping[str, int] | None = None) -> list[Node]:
    """A topological order that frees intermediates early.

    Greedy list scheduling (:func:`greedy_order`) at ``bindings`` (symbols not given get
    :data:`REPRESENTATIVE_DIM`); the graph's own order is kept when the greedy one does not
    lower the peak there, so ``lower_bound(memory_order(g))`` never exceeds the original's at
    those bindings.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph('''graph g(%x: f32[n,4]) -> (%z) {
        ...   %w1: f32[n,16] = Concat(%x, %x, %x, %x) {axis=1}
        ...   %w2: f32[n,16] = Concat(%x, %x, %x, %x) {axis=1}
        ...   %r1: f32[1,1] = ReduceSum(%w1)
        ...   %r2: f32[1,1] = ReduceSum(%w2)
        ...   %z: f32[1,1] = Add(%r1, %r2)
        ...   return %z
        ... }''')
        >>> order = memory_order(g, {"n": 8})
        >>> [n.name for n in order]
        ['Concat_0', 'ReduceSum_2', 'Concat_1', 'ReduceSum_3', 'Add_4']
        >>> lower_bound(g, {"n": 8}), lower_bound(g, {"n": 8}, order)
        (1028, 520)
    """
    env = representative_bindings(graph, bindings)
    greedy = greedy_order(graph, env)
    if len(greedy) != len(graph.nodes):
        raise GraphError(f"graph {graph.name} has a cycle or a node whose input is never computed: "
                         f"only {len(greedy)} of {len(graph.nodes)} nodes could be scheduled")
    if lower_bound(graph, env, greedy) < lower_bound(graph, env):
        return greedy
    return list(graph.nodes)


def level_order(graph: Graph, key: Callable[[Node], Any] | None = None) -> list[Node]:
    """Nodes by as-soon-as-possible level (longest path from the inputs); within a level by
    ``key``, then by the positions of their producers, then by the graph's order. The result
    depends on the structure, not on how the graph happened to list its nodes (up to ties
    between truly symmetric nodes), and keeps chains of blocks contiguous.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph('''graph g(%x: f32[2]) -> (%y, %z) {
        ...   %a: f32[2] = Relu(%x)
        ...   %y: f32[2] = Exp(%a)
        ...   %z: f32[2] = Neg(%x)
        ...   return %y, %z
        ... }''')
        >>> [n.op for n in level_order(g)], [n.op for n in level_order(g, key=lambda n: n.op)]
        (['Relu', 'Neg', 'Exp'], ['Neg', 'Relu', 'Exp'])
    """
    level: dict[int, int] = {}
    by_level: dict[int, list[Node]] = {}
    for n in graph.nodes:
        level[id(n)] = 1 + max((level.get(id(p), -1) for p in _producers(n)), default=-1)
        by_level.setdefault(level[id(n)], []).append(n)
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    position: dict[int, int] = {}
    order: list[Node] = []
    for depth in sorted(by_level):
        def rank(n: Node) -> tuple:
            return (key(n) if key else 0, tuple(position[id(p)] for p in _producers(n)), index[id(n)])
        for n in sorted(by_level[depth], key=rank):
            position[id(n)] = len(order)
            order.append(n)
    return order


def _producers(node: Node) -> list[Node]:
    return [v.producer for v in node.inputs if v is not None and v.producer is not None]


def dfs_order(graph: Graph) -> list[Node]:
    """Depth-first post-order from the graph outputs (inputs visited in order): each node comes
    right after the part of its dependency cone not emitted yet, so a block stays contiguous
    even when the graph's own order interleaves it with unrelated nodes.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph('''graph g(%x: f32[2]) -> (%z) {
        ...   %a: f32[2] = Relu(%x)
        ...   %b: f32[2] = Neg(%x)
        ...   %c: f32[2] = Exp(%a)
        ...   %z: f32[2] = Add(%c, %b)
        ...   return %z
        ... }''')
        >>> [n.op for n in dfs_order(g)]
        ['Relu', 'Exp', 'Neg', 'Add']
    """
    done: set[int] = set()
    order: list[Node] = []
    roots = [v.producer for v in graph.outputs if v.producer is not None] + list(graph.nodes)
    for root in roots:
        stack: list[tuple[Node, int]] = [(root, 0)]
        while stack:
            node, k = stack.pop()
            if id(node) in done:
                continue
            deps = _producers(node)
            while k < len(deps) and id(deps[k]) in done:
                k += 1
            if k < len(deps):
                stack.append((node, k + 1))
                stack.append((deps[k], 0))
            else:
                done.add(id(node))
                order.append(node)
    return order


def is_topological(graph: Graph, order: Sequence[Node]) -> bool:
    """True when ``order`` holds every node once and runs each after its inputs' producers.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: f32[2]) -> (%y) { %y: f32[2] = Relu(%x) return %y }")
        >>> is_topological(g, g.nodes), is_topological(g, [])
        (True, False)
    """
    try:
        _schedule(graph, order)
    except GraphError:
        return False
    return True


__all__ = [
    "CONST", "INPUT", "NODE", "REPRESENTATIVE_DIM", "Lifetime", "dfs_order", "dominates", "greedy_order",
    "is_topological", "level_order", "lifetimes", "live_memory", "lower_bound", "memory_order", "peak",
    "representative_bindings", "size_in_bytes",
]
