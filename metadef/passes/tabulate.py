"""``tabulate``: an elementwise function of one 8-bit tensor becomes a 256-entry table.

A quantized model computes its activations between quantize steps: ONNX Runtime's QOperator
BERT writes GELU as ``DequantizeLinear -> Div -> Erf -> QuantizeLinear -> QLinearAdd ->
QLinearMul -> QLinearMul``, each step requantized; its QDQ form ``DequantizeLinear -> Gelu ->
QuantizeLinear``; a quantized CNN ``QLinearSigmoid`` or ``QLinearLeakyRelu``. Whatever the
chain, its output is a function of one 8-bit input and scalar constants: 256 possible inputs.
ONNX Runtime tabulates its own ``QLinearSigmoid`` and ``QLinearLeakyRelu`` the same way.

Rule ``tabulate_8bit``: at a node whose output is computed, through pure elementwise ops
(or an earlier table) whose other inputs are single-element constants, from one int8 or
uint8 value ``x`` of the same shape, and where that costs more than a table look-up does
(a requantization or more: see :func:`chain_cost` and :func:`worth_of`), the
chain becomes
``ai.metadef::Lookup(x, table)``. The table is the chain itself, run by the reference
evaluator on the 256 values, so each result is the reference's to the bit. The chain taken is
the longest one (from the earliest such ``x``), and a node whose output a later node of the
same chain reads is left for that node.

Example:
    >>> from metadef.ir import parse_graph
    >>> from metadef.passes.base import PassContext
    >>> g = parse_graph('''graph g(%x: u8[n,8]) -> (%y) {
    ...   %s: f32[] = const [0.05]
    ...   %z: u8[] = const [128]
    ...   %d: f32[n,8] = DequantizeLinear(%x, %s, %z) @dq
    ...   %e: f32[n,8] = Erf(%d) @erf
    ...   %y: u8[n,8] = QuantizeLinear(%e, %s, %z) @q
    ...   return %y }''')
    >>> ctx = PassContext()
    >>> [n.qualop for n in tabulate(g, ctx).nodes], ctx.log.lines()
    (['ai.metadef::Lookup'], ['taken tabulate_8bit at q'])
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from metadef.core.dtypes import from_numpy
from metadef.core.errors import MetadefError
from metadef.ir import Graph, Node, Value
from metadef.ops import Role, infer_types
from metadef.ops.interface import resolve_attrs
from metadef.ops.numpy_eval import run_node
from metadef.passes.base import PassContext
from metadef.passes.patterns.common import fused_name, require_opset
from metadef.rewrite import GraphEditor, Match, Refusal, Rule, op, rewrite
from metadef.rewrite.engine import Built
from metadef.shape import TensorType

LOOKUP = "ai.metadef::Lookup"

TRANSCENDENTAL = frozenset({
    "Erf", "Exp", "Log", "Tanh", "Sigmoid", "Gelu", "Softplus", "Softsign", "Elu", "Selu", "Celu", "Mish", "Pow",
    "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Sqrt", "Reciprocal",
    "ai.metadef::SiLU", "com.microsoft::Gelu", "com.microsoft::FastGelu", "com.microsoft::QuickGelu",
    "com.microsoft::QLinearSigmoid", "com.microsoft::QLinearLeakyRelu", "com.microsoft::QLinearSoftsign",
})
"""Ops that cost a look-up's time many times over on their own (qualified names)."""

WORTH = 4
"""The least :func:`chain_cost` a chain of 8-bit results must have to be tabulated: a
requantization (``DequantizeLinear -> QuantizeLinear``, 4) and anything more; one cheap step
(a Cast) stays. A table of bytes takes 64 elements in a few instructions on x86 (``vpermi2b``),
where a generated kernel converts each vector of bytes to floats and back around the chain's
steps: on 802,816 bytes (one core, Zen 4, outputs given) ``DequantizeLinear -> QuantizeLinear``
took 146 us as a generated kernel and 28 as a table, with a ``Relu`` between them 170 and 27.
(In QOperator BERT the score scaling, 5, became a table; the mask's ``QLinearAdd`` after it then
went into the softmax's group and was computed on each of its three passes, 0.36 -> 0.47 ms a
layer, until ``fuse_groups`` weighed that: see its ``RECOMPUTE_LIMIT``; now 0.29.) Without
AVX512-VBMI the table is read a byte at a time, about as fast as such a kernel."""

WORTH_WIDE = 8
"""The same for wider results (a float table): such a look-up takes about a cycle an element,
as much as a transcendental op, so only a chain with one is tabulated."""

MAX_CHAIN = 64
"""The most nodes a chain may have (a bound on the search, far above what models write)."""


def chain_cost(nodes: list[Node]) -> int:
    """A rough cost of running ``nodes`` elementwise, in vectorized steps an element: 8 for a
    transcendental op, 3 for a requantizing one (``QuantizeLinear``, ``QLinear*``), 1 else; an
    earlier table in the chain counts its own worth (absorbing it saves a pass).

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: f32[n]) -> (%y) { %e: f32[n] = Erf(%x) %y: f32[n] = Relu(%e) return %y }")
        >>> chain_cost(g.nodes)
        9
    """
    cost = 0
    for n in nodes:
        name = n.qualop
        short = name.rsplit("::", 1)[-1]
        cost += WORTH if name == LOOKUP else 8 if name in TRANSCENDENTAL else \
            3 if short == "QuantizeLinear" or short.startswith("QLinear") else 1
    return cost


def worth_of(v: Value) -> int:
    """The least cost of a chain ending at ``v`` worth a table: :data:`WORTH` for 8-bit
    results, :data:`WORTH_WIDE` for wider ones.

    Example:
        >>> from metadef.ir import parse_graph
        >>> worth_of(parse_graph("graph g(%x: f32[n]) -> (%x) { return %x }").inputs[0])
        8
    """
    return WORTH if v.type is not None and v.type.dtype.numpy.itemsize == 1 else WORTH_WIDE


def _eight_bit(v: Value) -> bool:
    return v.type is not None and v.type.dtype.numpy in (np.dtype(np.int8), np.dtype(np.uint8))


def _scalar(v: Value) -> bool:
    return v.const is not None and np.size(v.const) == 1


def _tabulable(n: Node) -> bool:
    """A node a chain may pass through: pure, elementwise (or a table), one output, not
    kept out of fusion."""
    if n.meta.get("no_fuse") or len(n.outputs) != 1:
        return False
    if n.qualop == LOOKUP:
        return n.inputs[1] is not None and n.inputs[1].const is not None
    return n.metaop.pure and n.metaop.role in (Role.ELEMENTWISE, Role.BROADCAST) and \
        not any(hasattr(a, "nodes") for a in n.attrs.values())


def _operands(n: Node) -> list[Value]:
    """The inputs a chain walks through (a table's entries are not one)."""
    inputs = n.inputs[:1] if n.qualop == LOOKUP else n.inputs
    return [v for v in inputs if v is not None]


def chain(v: Value, source: Value, ok: Callable[[Node], bool] = _tabulable) -> list[Node] | None:
    """The nodes that compute ``v`` from ``source`` and single-element constants alone, each of
    ``source``'s shape, in no particular order; None where ``v`` needs anything else. ``ok``:
    whether a node may be in it (:func:`_tabulable`, or a remembering form of it).

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: i8[n]) -> (%y) { %y: f32[n] = Cast(%x) return %y }")
        >>> [n.op for n in chain(g.outputs[0], g.inputs[0])]
        ['Cast']
    """
    shape = source.type.shape if source.type is not None else None
    if shape is None:
        return None
    found: dict[int, Node] = {}
    stack = [v]
    while stack:
        u = stack.pop()
        if u is source or _scalar(u):
            continue
        p = u.producer
        if p is None or not ok(p) or u.type is None or u.type.shape != shape:
            return None
        if id(p) not in found:
            found[id(p)] = p
            if len(found) > MAX_CHAIN:
                return None
            stack.extend(_operands(p))
    return list(found.values())


def longest_chain(v: Value, ok: Callable[[Node], bool] = _tabulable) -> tuple[Value, list[Node]] | None:
    """The 8-bit source and nodes of the longest chain ending at ``v`` (see :func:`chain`), or
    None: every non-constant 8-bit value behind ``v`` through tabulable nodes is tried."""
    candidates: dict[int, Value] = {}
    seen: set[int] = set()
    stack = [v]
    while stack and len(seen) <= MAX_CHAIN:
        u = stack.pop()
        if u.const is not None or id(u) in seen:
            continue
        seen.add(id(u))
        if _eight_bit(u) and u is not v:
            candidates[id(u)] = u
        if u.producer is not None and ok(u.producer):
            stack.extend(_operands(u.producer))
    best: tuple[Value, list[Node]] | None = None
    for source in candidates.values():
        nodes = chain(v, source, ok)
        if nodes and (best is None or len(nodes) > len(best[1])):
            best = source, nodes
    return best


def table_of(nodes: list[Node], source: Value, v: Value) -> np.ndarray:
    """``v`` for each of the 256 values of ``source``, by the reference evaluator running
    ``nodes`` in order on them (raises :class:`MetadefError` where a node cannot run so)."""
    dtype = np.dtype(source.type.dtype.numpy)
    info = np.iinfo(dtype)
    rank = max(1, len(source.type.shape))
    values: dict[int, np.ndarray] = {id(source): np.arange(info.min, info.max + 1).astype(dtype)
                                     .reshape((1,) * (rank - 1) + (256,))}
    pending = list(nodes)
    while pending:  # (``nodes`` is unordered: run each once its operands are known)
        ready = [n for n in pending if all(x is None or x.const is not None or id(x) in values for x in n.inputs)]
        if not ready:
            raise MetadefError("the chain's nodes depend on each other in a cycle")
        for n in ready:
            arrays = [None if x is None else x.const if x.const is not None else values[id(x)] for x in n.inputs]
            types = [None if a is None else TensorType(from_numpy(np.asarray(a).dtype), tuple(np.shape(a)))
                     for a in arrays]
            outs = infer_types(n.metaop, n.name, types, n.attrs, arrays, n_outputs=1)
            attrs = resolve_attrs(n.op, f"(node {n.name})", n.metaop.attrs, n.attrs)
            with np.errstate(all="ignore"):
                values[id(n.outputs[0])] = run_node(n.metaop, attrs, arrays, outs, n.name)[0]
        pending = [n for n in pending if all(n is not r for r in ready)]
    return np.ascontiguousarray(np.asarray(values[id(v)]).reshape(256))


def _tabulate(m: Match, ed: GraphEditor, known: dict[Node, bool]) -> Built:
    def ok(n: Node) -> bool:  # (remembered for the pass: each node's answer is asked many times)
        got = known.get(n)
        if got is None:
            got = known[n] = _tabulable(n)
        return got

    root = m.node("root")
    if not ok(root):
        return None
    v = root.outputs[0]
    found = longest_chain(v, ok)
    if found is None:
        return None
    source, nodes = found
    for user in ed.users(v):  # a later node of the same chain takes it whole
        if ok(user) and chain(user.outputs[0], source, ok):
            return None
    if len(nodes) == 1 and nodes[0].qualop == LOOKUP:
        return None
    cost, worth = chain_cost(nodes), worth_of(v)
    if cost < worth:
        return None if len(nodes) < 2 else Refusal(
            f"the chain of {len(nodes)} nodes from %{source.name} costs about {cost} steps an element, "
            f"less than a table look-up's worth ({worth})")
    try:
        table = table_of(nodes, source, v)
    except (MetadefError, ValueError, TypeError, IndexError) as e:
        return Refusal(f"the chain from %{source.name} did not run on the 256 values: {e}")
    require_opset(ed, "Lookup", "ai.metadef")
    y, = ed.add("Lookup", [source, ed.const("table", table)], domain="ai.metadef", name=fused_name(root, "Lookup"))
    return y


def rules() -> list[Rule]:
    """The rule table (its rule remembers which nodes a chain may pass through: make it anew
    for each graph)."""
    return [Rule("tabulate_8bit", op(None, name="root"), functools.partial(_tabulate, known={}),
                 doc="an elementwise chain from one 8-bit tensor -> ai.metadef::Lookup of its 256 results")]


def tabulate(graph: Graph, ctx: PassContext) -> Graph:
    """A new graph where each costly elementwise chain from one 8-bit tensor is a table
    look-up (see the module doc)."""
    new, _ = rewrite(graph, [r for r in rules() if r.name not in ctx.options.disabled], "tabulate", ctx.log,
                     ctx.options)
    return new


__all__ = ["LOOKUP", "TRANSCENDENTAL", "WORTH", "WORTH_WIDE", "chain", "chain_cost", "longest_chain",
           "rules", "table_of", "tabulate", "worth_of"]
