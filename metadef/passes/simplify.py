"""``simplify``: remove nodes that compute nothing, as a rule table (``simplify_rules``).

Every rule is a cleanup (``fuses=False``), named in the log and for ``--disable-rule``:
``remove_identity``, ``remove_dropout``, ``remove_noop_cast``, ``remove_noop_reshape``,
``remove_noop_expand``, ``fold_reshape_pair``, ``remove_noop_transpose``, ``fold_transpose_pair``,
``remove_add_zero``, ``remove_mul_one``, ``remove_noop_pad``, ``remove_noop_slice``,
``remove_single_concat``, ``castlike_to_cast``, ``explicit_pads``. They remove an Identity, an inference-mode Dropout, a
Cast to the dtype it already has, a Reshape / Flatten / Squeeze / Unsqueeze / Expand / Slice /
Pad / Concat / Transpose whose output is its input, ``x + 0``, ``x - 0``, ``x * 1``, ``x / 1``
where broadcasting changes neither shape nor dtype; a Reshape of a reshape keeps only the last,
and two Transposes compose into one (or none). A removal that would leave a graph output
carried by an Identity of an input or constant is not made.

Example:
    >>> from metadef.ir import parse_graph, print_graph
    >>> from metadef.passes.base import PassContext
    >>> g = parse_graph('''graph g(%x: f32[n,4]) -> (%y) {
    ...   %one: f32[] = const [1.0]
    ...   %a: f32[n,4] = Mul(%x, %one) @mul
    ...   %t: f32[4,n] = Transpose(%a) {perm=[1,0]} @t1
    ...   %u: f32[n,4] = Transpose(%t) {perm=[1,0]} @t2
    ...   %y: f32[n,4] = Relu(%u) @relu
    ...   return %y
    ... }''')
    >>> ctx = PassContext()
    >>> print(print_graph(simplify(g, ctx)), end="")
    graph g(%x: f32[n,4]) -> (%y) {
      %y: f32[n,4] = Relu(%x) @relu
      return %y
    }
    >>> ctx.log.lines()
    ['taken remove_mul_one at mul', 'taken fold_transpose_pair at t2 (t2, t1)']
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from metadef.core.errors import MetadefError
from metadef.ir import Graph, Node, Value
from metadef.ops.defs.nn_pool import window
from metadef.passes.base import PassContext
from metadef.rewrite import GraphEditor, Match, Refusal, Rule, const, op, rewrite, var
from metadef.rewrite.engine import Built

RESHAPE_LIKE = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")
"""Ops that keep the elements in row-major order and only change the shape."""
WINDOW_OPS = ("Conv", "MaxPool", "AveragePool", "LpPool")
"""Ops whose ``auto_pad`` :func:`.nn_pool.window` resolves to pads (not ConvTranspose: its pads
crop an output)."""


# --- helpers shared with optimize_layout ------------------------------------------------


def same_type(a: Value, b: Value) -> bool:
    """Both values have the same dtype and (structurally) the same known shape."""
    return a.type is not None and b.type is not None and a.type.shape is not None and a.type == b.type


def transpose_perm(node: Node) -> tuple[int, ...] | None:
    """A Transpose node's permutation (the default reverses the axes); None if the rank is unknown."""
    perm = node.attrs.get("perm")
    if perm is not None:
        return tuple(int(p) for p in perm)
    t = node.inputs[0].type if node.inputs and node.inputs[0] is not None else None
    if t is None or t.shape is None:
        return None
    return tuple(reversed(range(len(t.shape))))


def compose_perms(first: Sequence[int], then: Sequence[int]) -> tuple[int, ...]:
    """The one permutation equal to ``Transpose(first)`` followed by ``Transpose(then)``.

    Example:
        >>> compose_perms([0, 2, 3, 1], [0, 3, 1, 2])
        (0, 1, 2, 3)
    """
    return tuple(first[i] for i in then)


def invert_perm(perm: Sequence[int]) -> tuple[int, ...]:
    """The permutation that undoes ``perm``.

    Example:
        >>> invert_perm([0, 2, 3, 1])
        (0, 3, 1, 2)
    """
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return tuple(inverse)


def is_identity_perm(perm: Sequence[int]) -> bool:
    """Whether ``perm`` leaves every axis in place.

    Example:
        >>> is_identity_perm((0, 1, 2)), is_identity_perm((0, 2, 1))
        (True, False)
    """
    return tuple(perm) == tuple(range(len(perm)))


def can_forward(ed: GraphEditor, old: Value, new: Value) -> bool:
    """Whether ``new`` may replace ``old`` without an Identity to carry a graph output's name
    (an output replaced by an input, a constant or another output needs one)."""
    if not ed.is_output(old):
        return True
    return new.producer is not None and not ed.is_output(new)


def rebuild(ed: GraphEditor, node: Node, op_name: str, inputs: Sequence[Value | None],
            attrs: dict | None = None) -> Value | Refusal:
    """A new single-output node standing for ``node``; refused unless it infers ``node``'s type."""
    try:
        new, = ed.add(op_name, inputs, attrs, name=node.name, domain=node.domain, meta=node.meta)
    except MetadefError as e:
        return Refusal(f"the replacement {op_name} does not type-check: {e}")
    if not same_type(new, node.outputs[0]):
        return Refusal(f"the replacement {op_name} infers {new.type}, not {node.outputs[0].type}")
    take_name(new, node)
    return new


def take_name(new: Value, old: Node) -> None:
    """Let ``new`` and its producer, which replace the single-output node ``old``, carry the
    names of ``old``'s output and of ``old`` (shared only until ``finish`` drops ``old``, which
    is dead once replaced)."""
    if new.producer is not None and len(old.outputs) == 1 and len(new.producer.outputs) == 1:
        new.producer.name = old.name
        new.name = old.outputs[0].name


# --- rule builders ----------------------------------------------------------------------


def _forward(ed: GraphEditor, root: Node, x: Value | None) -> Value | None:
    """``x`` in place of ``root``'s output when they have the same type."""
    if x is None or not same_type(x, root.outputs[0]) or not can_forward(ed, root.outputs[0], x):
        return None
    return x


def _forward_input(m: Match, ed: GraphEditor) -> Built:
    root = m.node("root")
    return _forward(ed, root, root.inputs[0])


def _remove_dropout(m: Match, ed: GraphEditor) -> Built:
    root = m.node("root")
    mode = root.inputs[2] if len(root.inputs) > 2 else None
    if mode is not None and (mode.const is None or bool(np.any(mode.const))):
        return Refusal("training_mode is not a constant false")
    if len(root.outputs) > 1 and ed.num_uses(root.outputs[1]) > 0:
        return Refusal(f"its mask output %{root.outputs[1].name} is used")
    x = _forward(ed, root, root.inputs[0])
    return None if x is None else [x]


def _all_equal(value: float):
    def check(v: Value) -> bool:
        c = v.const
        return c is not None and c.dtype.kind in "biuf" and c.size > 0 and bool(np.all(c == value))
    return check


def _remove_noop_pad(m: Match, ed: GraphEditor) -> Built:
    root = m.node("root")
    pads = root.inputs[1] if len(root.inputs) > 1 else None
    if pads is None or pads.const is None or np.any(pads.const):
        return None
    return _forward(ed, root, root.inputs[0])


def _remove_noop_slice(m: Match, ed: GraphEditor) -> Built:
    root = m.node("root")
    starts = root.inputs[1]
    steps = root.inputs[4] if len(root.inputs) > 4 else None
    if starts is None or starts.const is None or np.any(starts.const):
        return None
    if steps is not None and (steps.const is None or np.any(steps.const != 1)):
        return None
    return _forward(ed, root, root.inputs[0])


def _remove_noop_transpose(m: Match, ed: GraphEditor) -> Built:
    root = m.node("root")
    perm = transpose_perm(root)
    return None if perm is None or not is_identity_perm(perm) else _forward(ed, root, root.inputs[0])


def _fold_transpose_pair(m: Match, ed: GraphEditor) -> Built:
    root, inner = m.node("root"), m.node("inner")
    first, then = transpose_perm(inner), transpose_perm(root)
    if first is None or then is None:
        return None
    perm = compose_perms(first, then)
    if is_identity_perm(perm):
        return _forward(ed, root, m.value("x"))
    return rebuild(ed, root, "Transpose", [m.value("x")], {"perm": list(perm)})


def _fold_reshape_pair(m: Match, ed: GraphEditor) -> Built:
    root, inner = m.node("root"), m.node("inner")
    x = inner.inputs[0]
    if x is None:
        return None
    shape = np.asarray(m.value("shape").const).astype(np.int64)
    if not root.attrs.get("allowzero", 0):
        mid, src = inner.outputs[0].type, x.type
        if mid is None or mid.shape is None or src is None or src.shape is None:
            return None
        for i in np.flatnonzero(shape == 0):
            if i < len(src.shape) and src.shape[i] == mid.shape[i]:
                continue
            if not isinstance(mid.shape[i], int):
                return Refusal(f"target dim {i} copies {mid.shape[i]} from %{inner.outputs[0].name}, "
                               f"which %{x.name} ({src}) does not have at that position")
            shape[i] = mid.shape[i]
    same = np.array_equal(shape, m.value("shape").const)
    target = m.value("shape") if same else ed.const(f"{root.name}_shape", shape)
    return rebuild(ed, root, "Reshape", [x, target], dict(root.attrs))


def _castlike_to_cast(m: Match, ed: GraphEditor) -> Built:
    root = m.node("root")
    like = root.inputs[1] if len(root.inputs) > 1 else None
    if root.inputs[0] is None or like is None or like.type is None:
        return None
    attrs = {"to": like.type.dtype.onnx, **{k: v for k, v in root.attrs.items() if k in ("saturate", "round_mode")}}
    return rebuild(ed, root, "Cast", [root.inputs[0]], attrs)


def _explicit_pads(m: Match, ed: GraphEditor) -> Built:
    root = m.node("root")
    auto_pad = root.attrs.get("auto_pad") or "NOTSET"
    x = root.inputs[0] if root.inputs else None
    if auto_pad == "NOTSET" or x is None or x.type is None or x.type.shape is None or len(root.outputs) != 1:
        return None
    spatial = x.type.shape[2:]
    kernel = root.attrs.get("kernel_shape")
    if kernel is None and len(root.inputs) > 1 and root.inputs[1] is not None and root.inputs[1].type is not None \
            and root.inputs[1].type.shape is not None:
        kernel = root.inputs[1].type.shape[2:]
    if kernel is None or not all(isinstance(d, int) for d in (*spatial, *kernel)):
        return Refusal(f"auto_pad={auto_pad} over spatial dims [{', '.join(map(str, spatial))}] (kernel "
                       f"[{', '.join(map(str, kernel))}]): the pads depend on dims not known here")
    win = window(root.attrs, spatial, kernel)
    attrs = {k: v for k, v in root.attrs.items() if k != "auto_pad"}
    attrs["pads"] = [int(p) for p in (*win.begin, *win.end)]
    return rebuild(ed, root, root.op, list(root.inputs), attrs)


def _forward_x(m: Match, ed: GraphEditor) -> Built:
    return _forward(ed, m.node("root"), m.value("x"))


def _neutral(op_name: str, value: float, commutative: bool) -> Rule:
    """``op(x, c)`` -> x for a constant ``c`` filled with ``value`` (0 for Add/Sub, 1 for Mul/Div)."""
    name = "remove_add_zero" if value == 0 else "remove_mul_one"
    pattern = op(op_name, var("x"), const(where=_all_equal(value)), name="root", commutative=commutative)
    return Rule(name, pattern, _forward_x, fuses=False, doc=f"{op_name}(x, {value:g}) -> x")


def _each(name: str, ops: Sequence[str], build, doc: str) -> list[Rule]:
    """One rule per op (the engine indexes rules by their root op), all under one name."""
    return [Rule(name, op(o, name="root"), build, fuses=False, doc=doc) for o in ops]


simplify_rules: list[Rule] = [
    Rule("remove_identity", op("Identity", var("x"), name="root"), _forward_input, fuses=False,
         doc="Identity(x) -> x"),
    Rule("remove_dropout", op("Dropout", name="root"), _remove_dropout, fuses=False,
         doc="Dropout(x) in inference -> x, when its mask output is unused"),
    Rule("remove_noop_cast", op("Cast", var("x"), name="root"), _forward_input, fuses=False,
         doc="Cast(x) to the dtype x has -> x"),
    Rule("castlike_to_cast", op("CastLike", name="root"), _castlike_to_cast, fuses=False,
         doc="CastLike(x, like) -> Cast(x) to like's dtype (known here: a Cast fuses and generates code)"),
    *_each("explicit_pads", WINDOW_OPS, _explicit_pads,
           "auto_pad SAME_UPPER / SAME_LOWER / VALID over known spatial dims -> the pads it means (the "
           "kernels of explicit pads, a 5x5 depthwise conv's routine, take it then)"),
    *[Rule("fold_reshape_pair", op("Reshape", op(inner, name="inner"), const("shape"), name="root"),
           _fold_reshape_pair, fuses=False, doc=f"Reshape({inner}(x), s) -> Reshape(x, s)")
      for inner in RESHAPE_LIKE],
    *_each("remove_noop_reshape", RESHAPE_LIKE, _forward_input,
           "a Reshape, Flatten, Squeeze or Unsqueeze whose output type is its input's -> its input"),
    *_each("remove_noop_expand", ("Expand",), _forward_input, "Expand to the shape its input has -> its input"),
    Rule("remove_noop_transpose", op("Transpose", var("x"), name="root"), _remove_noop_transpose,
         fuses=False, doc="Transpose by the identity permutation -> its input"),
    Rule("fold_transpose_pair", op("Transpose", op("Transpose", var("x"), name="inner"), name="root"),
         _fold_transpose_pair, fuses=False, doc="two Transposes -> one, or none when they cancel"),
    _neutral("Add", 0, commutative=True),
    _neutral("Sub", 0, commutative=False),
    _neutral("Mul", 1, commutative=True),
    _neutral("Div", 1, commutative=False),
    *_each("remove_noop_pad", ("Pad",), _remove_noop_pad, "Pad with all-zero pads -> its input"),
    *_each("remove_noop_slice", ("Slice",), _remove_noop_slice, "a Slice that takes everything -> its input"),
    Rule("remove_single_concat", op("Concat", var("x"), name="root"), _forward_input, fuses=False,
         doc="Concat of one input -> that input"),
]
"""The simplification rules, in the order they are tried at a node."""


def simplify(graph: Graph, ctx: PassContext) -> Graph:
    """A new graph with ``simplify_rules`` applied to a fixpoint (see the module doc); rules
    named in ``ctx.options.disabled`` are skipped."""
    rules = [r for r in simplify_rules if r.name not in ctx.options.disabled]
    new, _ = rewrite(graph, rules, "simplify", ctx.log, ctx.options)
    return new


__all__ = ["RESHAPE_LIKE", "can_forward", "compose_perms", "invert_perm", "is_identity_perm", "rebuild",
           "same_type", "simplify", "simplify_rules", "take_name", "transpose_perm"]
