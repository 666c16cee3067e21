"""``fold_constants``: evaluate every node whose inputs are all constants, once, at compile time.

The node runs through :func:`metadef.ops.numpy_eval.run_node`, the same reference semantics
the numpy backend uses, so folding cannot change a result. Every registered op is
deterministic (a training-mode Dropout is refused at import). A fold that would materialize a
tensor larger than ``limit_bytes`` (64 MiB) *and* larger than its inputs, say an Expand or a
ConstantOfShape of a huge shape, is refused with the sizes in the decision log.

Rule: ``fold_constant`` (fuses=False).

Example:
    >>> from metadef.ir import parse_graph, print_graph
    >>> from metadef.passes.base import PassContext
    >>> g = parse_graph('''graph g(%x: f32[n,2]) -> (%y) {
    ...   %a: f32[2] = const [1.0, 4.0]
    ...   %s: f32[2] = Sqrt(%a) @sqrt
    ...   %y: f32[n,2] = Add(%x, %s) @add
    ...   return %y
    ... }''')
    >>> ctx = PassContext()
    >>> print(print_graph(fold_constants(g, ctx)), end="")
    graph g(%x: f32[n,2]) -> (%y) {
      %s_folded: f32[2] = const [1.0, 2.0]
      %y: f32[n,2] = Add(%x, %s_folded) @add
      return %y
    }
    >>> ctx.log.lines()
    ['taken fold_constant at sqrt']
"""

from __future__ import annotations

import functools
import math

import numpy as np

from metadef.core.dtypes import from_numpy
from metadef.core.errors import MetadefError
from metadef.ir import Graph, Node
from metadef.ops import infer_types
from metadef.ops.interface import resolve_attrs
from metadef.ops.numpy_eval import run_node
from metadef.passes.base import PassContext
from metadef.rewrite import GraphEditor, Match, Refusal, Rule, op, rewrite
from metadef.rewrite.engine import Built
from metadef.shape import TensorType

FOLD_LIMIT_BYTES = 64 * 2**20
"""The largest tensor folding materializes when it would replace smaller inputs."""


def format_bytes(n: int) -> str:
    """``n`` bytes for a person: ``512 B``, ``3.0 KiB``, ``64.0 MiB``.

    Example:
        >>> format_bytes(64 * 2**20)
        '64.0 MiB'
    """
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _concrete_types(node: Node, arrays: list[np.ndarray | None]) -> list[TensorType]:
    """The node's output types on these concrete inputs (static shapes)."""
    types = [None if a is None else TensorType(from_numpy(a.dtype), tuple(a.shape)) for a in arrays]
    return infer_types(node.metaop, node.name, types, node.attrs, arrays, n_outputs=len(node.outputs))


def _nbytes(t: TensorType) -> int | None:
    if not t.is_static:
        return None
    return math.prod(t.shape) * np.dtype(t.dtype.numpy).itemsize


def _already_folded(ed: GraphEditor, node: Node, outs: list[np.ndarray]) -> bool:
    """Whether ``node`` only carries a constant to a graph output (what a fold leaves behind:
    the output's name needs a node), so folding it again would change nothing."""
    if len(outs) != 1 or not ed.is_output(node.outputs[0]):
        return False
    present = [v for v in node.inputs if v is not None]
    if len(present) != 1:
        return False
    c = present[0].const
    return c.dtype == outs[0].dtype and c.shape == outs[0].shape and c.tobytes() == outs[0].tobytes()


def _fold(m: Match, ed: GraphEditor, limit_bytes: int) -> Built:
    node = m.node("root")
    if not node.inputs or any(v is not None and v.const is None for v in node.inputs):
        return None
    if not node.metaop.pure:
        return Refusal(f"{node.qualop} draws new values on every run (not a function of its inputs)")
    arrays = [None if v is None else v.const for v in node.inputs]
    try:
        out_types = _concrete_types(node, arrays)
    except MetadefError as e:
        return Refusal(f"its output type is unknown on these constants: {e}")
    sizes = [_nbytes(t) for t in out_types]
    if any(s is None for s in sizes):
        return Refusal("its output size is not static")
    size = sum(sizes)
    inputs_size = sum(a.nbytes for a in arrays if a is not None)
    if size > limit_bytes and size > inputs_size:
        return Refusal(f"the result would take {format_bytes(size)} (limit {format_bytes(limit_bytes)}) "
                       f"where its inputs take {format_bytes(inputs_size)}")
    attrs = resolve_attrs(node.op, f"(node {node.name})", node.metaop.attrs, node.attrs)
    outs = run_node(node.metaop, attrs, arrays, out_types, node.name)
    if _already_folded(ed, node, outs):
        return None
    return [ed.const(f"{old.name}_folded", np.ascontiguousarray(arr)) for old, arr in zip(node.outputs, outs)]


def fold_constant_rules(limit_bytes: int = FOLD_LIMIT_BYTES) -> list[Rule]:
    """The rule table: one rule, at any node."""
    return [Rule("fold_constant", op(None, name="root"), functools.partial(_fold, limit_bytes=limit_bytes),
                 fuses=False, doc="a node of constants -> its value, as a constant")]


def fold_constants(graph: Graph, ctx: PassContext, *, limit_bytes: int = FOLD_LIMIT_BYTES) -> Graph:
    """A new graph where every node of constants is a constant (see the module doc)."""
    rules = [r for r in fold_constant_rules(limit_bytes) if r.name not in ctx.options.disabled]
    new, _ = rewrite(graph, rules, "fold_constants", ctx.log, ctx.options)
    return new


__all__ = ["FOLD_LIMIT_BYTES", "fold_constant_rules", "fold_constants", "format_bytes"]
