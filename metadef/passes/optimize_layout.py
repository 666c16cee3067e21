"""``optimize_layout``: remove the Transpose round trips that layout conversions leave behind.

A TensorFlow-exported model works in NHWC and wraps each NCHW convolution in
``Transpose(perm=[0,3,1,2])`` ... ``Transpose(perm=[0,2,3,1])``; between two convolutions the
pair meets again, often with elementwise ops in between. This pass pushes a Transpose down,
through unary elementwise ops and through broadcast ops whose other operands are constants
(transposed once, here) or the same Transpose, until it meets its inverse; the two cancel.
A Transpose is only pushed when that meeting is certain (each value on the way has one reader),
so no Transpose is merely moved, and the result keeps its numerics exactly.

Rules: ``push_transpose``, ``cancel_transpose`` (fuses=False).

Example:
    >>> from metadef.ir import parse_graph, print_graph
    >>> from metadef.passes.base import PassContext
    >>> g = parse_graph('''graph g(%x: f32[n,8,4,4]) -> (%y) {
    ...   %b: f32[8] = const
    ...   %t: f32[n,4,4,8] = Transpose(%x) {perm=[0,2,3,1]} @to_nhwc
    ...   %a: f32[n,4,4,8] = Add(%t, %b) @add
    ...   %r: f32[n,4,4,8] = Relu(%a) @relu
    ...   %y: f32[n,8,4,4] = Transpose(%r) {perm=[0,3,1,2]} @to_nchw
    ...   return %y
    ... }''', constants={"b": np.arange(8, dtype=np.float32)})
    >>> ctx = PassContext()
    >>> print(print_graph(optimize_layout(g, ctx)), end="")
    graph g(%x: f32[n,8,4,4]) -> (%y) {
      %add_B: f32[1,8,1,1] = const [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
      %a: f32[n,8,4,4] = Add(%x, %add_B) @add
      %y: f32[n,8,4,4] = Relu(%a) @relu
      return %y
    }
    >>> ctx.log.lines()
    ['taken push_transpose at add', 'taken push_transpose at relu', \
'taken cancel_transpose at to_nchw (to_nchw, relu/transpose)']
"""

from __future__ import annotations

import numpy as np

from metadef.ir import Graph, Node, Value
from metadef.ops import Role
from metadef.passes.base import PassContext
from metadef.passes.simplify import (
    can_forward,
    compose_perms,
    invert_perm,
    is_identity_perm,
    same_type,
    take_name,
    transpose_perm,
)
from metadef.rewrite import GraphEditor, Match, Refusal, Rule, op, rewrite
from metadef.rewrite.engine import Built

MAX_DISTANCE = 64
"""How many ops a Transpose is pushed through, at most, to meet its inverse."""


def _transposed_by(v: Value | None) -> tuple[Node, tuple[int, ...]] | None:
    """The Transpose that produces ``v`` and its permutation, if one does."""
    node = None if v is None else v.producer
    if node is None or node.op != "Transpose" or node.domain not in ("", "ai.onnx"):
        return None
    perm = transpose_perm(node)
    return None if perm is None else (node, perm)


def _pushable(node: Node, perm: tuple[int, ...], via: Value | None = None) -> bool:
    """Whether Transpose(perm) on ``node``'s inputs can move after it: a one-input elementwise op,
    or a broadcast op whose operands are constants or transposed by ``perm``, of full rank.
    ``via`` counts as transposed (the value a Transpose is being pushed along)."""
    if len(node.outputs) != 1 or node.outputs[0].type is None or node.outputs[0].type.rank != len(perm):
        return False

    def moved(v: Value) -> bool:
        source = _transposed_by(v)
        return v is via or (source is not None and source[1] == perm)

    present = [v for v in node.inputs if v is not None]
    role = node.metaop.role
    if role is Role.ELEMENTWISE:
        return len(present) == 1 and moved(present[0])
    if role is not Role.BROADCAST:
        return False
    if any(not moved(v) and (v.const is None or v.const.ndim > len(perm)) for v in present):
        return False
    return any(moved(v) for v in present)


def _meets_inverse(ed: GraphEditor, node: Node, perm: tuple[int, ...]) -> bool:
    """Whether ``node``'s output, through single-reader pushable ops, reaches Transpose(perm⁻¹)."""
    for _ in range(MAX_DISTANCE):
        out = node.outputs[0]
        users = [u for u in ed.users(out) if any(ed.num_uses(o) for o in u.outputs)]
        if ed.is_output(out) or len(users) != 1:
            return False
        nxt = users[0]
        found = _transposed_by(nxt.outputs[0])
        if found is not None and found[0] is nxt:
            return is_identity_perm(compose_perms(perm, found[1]))
        if not _pushable(nxt, perm, via=out):
            return False
        node = nxt
    return False


def _moved_input(ed: GraphEditor, v: Value | None, perm: tuple[int, ...], hint: str) -> Value | None:
    """An operand of the pushed op: the Transpose's input, or a constant transposed back."""
    if v is None:
        return None
    source = _transposed_by(v)
    if source is not None and source[1] == perm:
        return source[0].inputs[0]
    c = np.asarray(v.const)
    if c.ndim == 0:
        return v
    full = c.reshape((1,) * (len(perm) - c.ndim) + c.shape)
    return ed.const(hint, np.ascontiguousarray(np.transpose(full, invert_perm(perm))))


def _push(m: Match, ed: GraphEditor) -> Built:
    root = m.node("root")
    first = next((s for s in map(_transposed_by, root.inputs) if s is not None), None)
    if first is None or not _pushable(root, first[1]):
        return None
    perm = first[1]
    if not _meets_inverse(ed, root, perm):
        return None
    for v in root.inputs:
        source = _transposed_by(v)
        if source is not None and ed.num_uses(v) > 1:
            return Refusal(f"%{v.name} has {ed.num_uses(v)} consumers: pushing would copy the Transpose")
    names = root.metaop.inputs
    inputs = [_moved_input(ed, v, perm, f"{root.name}_{names[min(i, len(names) - 1)].name}")
              for i, v in enumerate(root.inputs)]
    inner, = ed.add(root.op, inputs, dict(root.attrs), name=root.name, domain=root.domain, meta=root.meta)
    out, = ed.add("Transpose", [inner], {"perm": list(perm)}, name=f"{root.name}/transpose")
    if not same_type(out, root.outputs[0]):
        return Refusal(f"the pushed Transpose infers {out.type}, not {root.outputs[0].type}")
    take_name(inner, root)
    return out


def _cancel(m: Match, ed: GraphEditor) -> Built:
    root, inner = m.node("root"), m.node("inner")
    first, then = transpose_perm(inner), transpose_perm(root)
    if first is None or then is None or not is_identity_perm(compose_perms(first, then)):
        return None
    x = inner.inputs[0]
    return x if x is not None and can_forward(ed, root.outputs[0], x) else None


optimize_layout_rules: list[Rule] = [
    Rule("cancel_transpose", op("Transpose", op("Transpose", name="inner"), name="root"), _cancel,
         fuses=False, doc="Transpose(Transpose(x, p), inverse of p) -> x"),
    Rule("push_transpose", op(None, name="root", role=Role.ELEMENTWISE), _push, fuses=False,
         doc="f(Transpose(x)) -> Transpose(f(x)) for a unary elementwise f, toward the inverse"),
    Rule("push_transpose", op(None, name="root", role=Role.BROADCAST), _push, fuses=False,
         doc="g(Transpose(x), c) -> Transpose(g(x, c')) for a broadcast g and a constant c"),
]
"""The layout rules, in the order they are tried at a node."""


def optimize_layout(graph: Graph, ctx: PassContext) -> Graph:
    """A new graph without Transpose round trips (see the module doc); rules named in
    ``ctx.options.disabled`` are skipped."""
    rules = [r for r in optimize_layout_rules if r.name not in ctx.options.disabled]
    new, _ = rewrite(graph, rules, "optimize_layout", ctx.log, ctx.options)
    return new


__all__ = ["optimize_layout", "optimize_layout_rules"]
