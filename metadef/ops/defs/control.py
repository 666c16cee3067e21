"""Control flow: ``If``, with its two branches as graph attributes.

**Captured values are explicit.** An ONNX subgraph reads values of the enclosing scopes
(initializers, node outputs) by name. In metadef an ``If`` node's inputs are
``(cond, *captured)`` and both branch graphs (``then_branch``, ``else_branch``) take the
captured values as their inputs, in that order: the union of what either branch reads from
outside, so each branch simply ignores the inputs it does not use. A branch's own weights stay
inside it as constants; an ``If`` inside a branch captures from that branch, recursively. So a
pass that renames or replaces an outer value never needs to look inside a branch. The
variadic input named :data:`CAPTURED` carries this convention (:func:`captured_start`): the
ONNX importer and exporter read it from the interface, not from the op's name.

**Shape rule.** ``cond`` is a bool tensor of one element. When its value is known at compile
time the outputs take the chosen branch's output types; otherwise each output merges the two
branches' types: the same dtype is required (the error names both), equal dims are kept,
differing dims become a fresh symbol and differing ranks give an unknown rank. Branch types
are written in the outer graph's symbols; a branch input that is one symbol binds to the
captured value's dim (so concrete inputs give concrete outputs).

**Semantics.** Opaque: the numpy reference runs the chosen branch node by node with
:func:`~metadef.ops.defs.fused.run_body`, the evaluator that runs ``Fused`` bodies (by duck
typing: ``ops`` does not import the IR). Role OPAQUE.

Example:
    >>> import numpy as np
    >>> from types import SimpleNamespace as NS
    >>> from metadef.ops import get_op, infer_types
    >>> from metadef.shape import parse_type
    >>> t = parse_type("f32[n,2]")
    >>> def branch(op):  # one captured input %x, one node
    ...     x, y = NS(name="x", type=t, const=None), NS(name="y", type=t)
    ...     node = NS(name=op, metaop=get_op(op), attrs={}, inputs=(x,), outputs=(y,))
    ...     return NS(name=op, inputs=[x], outputs=[y], nodes=[node])
    >>> attrs = {"then_branch": branch("Relu"), "else_branch": branch("Neg")}
    >>> str(infer_types(If, "/if", [parse_type("bool[]"), t], attrs)[0])
    'f32[n,2]'
    >>> x = np.array([[-1.0, 2.0]], np.float32)
    >>> If.semantics.reference([np.array(False), x], attrs)
    [array([[ 1., -2.]], dtype=float32)]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from metadef.ops.defs.fused import run_body
from metadef.ops.infer import InferContext
from metadef.ops.interface import REQUIRED, Param, graph_
from metadef.ops.metaop import MetaOp, metaop
from metadef.ops.strategy import Role
from metadef.shape import Dim, TensorType, substitute

CAPTURED = "captured"
"""The name of the variadic input that carries outer-scope values into graph attributes."""

BRANCHES = ("then_branch", "else_branch")


def captured_start(op: MetaOp) -> int | None:
    """The index of a node's first captured input, or None when the op captures nothing.

    Example:
        >>> from metadef.ops import get_op
        >>> captured_start(If), captured_start(get_op("Relu"))
        (1, None)
    """
    params = op.inputs
    if params and params[-1].variadic and params[-1].name == CAPTURED:
        return len(params) - 1
    return None


# ---------------------------------------------------------------------- binding branches


def _bind_dim(given: Dim, inner: Dim, bindings: dict[str, Dim]) -> bool:
    """Whether the outer ``given`` dim agrees with a branch input's ``inner`` dim; a branch dim
    that is one unbound symbol binds to it."""
    if str(given) == str(substitute(inner, bindings)):
        return True
    atom = None if isinstance(inner, int) else inner.as_atom()
    if atom is None or atom.key[0] != "sym" or atom.key[1] in bindings:
        return False
    bindings[atom.key[1]] = given
    return True


def input_bindings(graph: Any, given: Sequence[TensorType | None]) -> tuple[dict[str, Dim], str | None]:
    """Bindings of the graph's input symbols to the ``given`` types, and the first mismatch as
    a sentence (None when every input agrees).

    Example:
        >>> from types import SimpleNamespace as NS
        >>> from metadef.shape import parse_type
        >>> g = NS(inputs=[NS(name="x", type=parse_type("f32[n,2]"))])
        >>> b, problem = input_bindings(g, [parse_type("f32[7,2]")])
        >>> {k: str(v) for k, v in b.items()}, problem
        ({'n': '7'}, None)
    """
    bindings: dict[str, Dim] = {}
    for i, (outer, inner) in enumerate(zip(given, graph.inputs)):
        t = inner.type
        if outer is None or t is None:
            continue
        if outer.dtype is not t.dtype:
            return bindings, (f"captured input {i} is {outer.dtype.name} but the branch's input "
                              f"%{inner.name} is {t.dtype.name}")
        if outer.shape is None or t.shape is None:
            continue
        if len(outer.shape) != len(t.shape) or not all(
                _bind_dim(g, d, bindings) for g, d in zip(outer.shape, t.shape)):
            return bindings, f"captured input {i} has type {outer} but the branch's input %{inner.name} is {t}"
    return bindings, None


def rebind(t: TensorType | None, bindings: Mapping[str, Dim]) -> TensorType | None:
    """``t`` with bound symbols substituted."""
    if t is None or t.shape is None or not bindings:
        return t
    return t.with_shape([substitute(d, bindings) for d in t.shape])


def merge_types(a: TensorType, b: TensorType, fresh: Callable[[], Dim]) -> TensorType:
    """The type of a value that is ``a`` or ``b`` (same dtype): equal dims kept, others fresh.

    Example:
        >>> from metadef.shape import parse_type, sym
        >>> str(merge_types(parse_type("f32[n,3]"), parse_type("f32[n,4]"), lambda: sym("if_0")))
        'f32[n,if_0]'
        >>> str(merge_types(parse_type("f32[3]"), parse_type("f32[3,1]"), lambda: sym("u")))
        'f32[?]'
    """
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return TensorType(a.dtype, None)
    return a.with_shape([x if str(x) == str(y) else fresh() for x, y in zip(a.shape, b.shape)])


# --------------------------------------------------------------------------- the rule


def _if_infer(ctx: InferContext) -> list[TensorType]:
    cond = ctx.inputs[0]
    if cond is not None and cond.is_static and math.prod(cond.shape) != 1:
        ctx.fail(f"cond has type {cond} but must hold exactly one element",
                 "reduce the condition to one bool (e.g. with ReduceMax or Squeeze)")
    captured = ctx.inputs[1:]
    branches: dict[str, list[TensorType | None]] = {}
    for key in BRANCHES:
        graph = ctx.attrs[key]
        if len(graph.inputs) != len(captured):
            ctx.fail(f"the node captures {len(captured)} values but {key} takes {len(graph.inputs)}",
                     "both branches take the captured values as their inputs, in order")
        bindings, problem = input_bindings(graph, captured)
        if problem is not None:
            ctx.fail(f"{key}: {problem}", "the branch was built for other captured types")
        branches[key] = [rebind(o.type, bindings) for o in graph.outputs]
    then, other = (branches[k] for k in BRANCHES)
    if len(then) != len(other):
        ctx.fail(f"then_branch has {len(then)} outputs but else_branch has {len(other)}")
    for i, (a, b) in enumerate(zip(then, other)):
        if a is None or b is None:
            ctx.fail(f"output {i} of {'then_branch' if a is None else 'else_branch'} has no type")
        if a.dtype is not b.dtype:
            ctx.fail(f"output {i} is {a} in then_branch but {b} in else_branch",
                     "both branches must give each output the same dtype; insert a Cast")
    known = ctx.value(0)
    if known is not None and np.size(known) == 1:
        return then if bool(np.asarray(known).reshape(-1)[0]) else other
    return [merge_types(a, b, lambda: ctx.fresh("if")) for a, b in zip(then, other)]


def _if_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> list[np.ndarray]:
    chosen = attrs["then_branch"] if bool(np.asarray(inputs[0]).reshape(-1)[0]) else attrs["else_branch"]
    return run_body(chosen, inputs[1:])


If = metaop(
    "If",
    inputs=("cond: B", Param(CAPTURED, optional=True, variadic=True, type_var="V", mixed=True)),
    outputs=(Param("outputs", variadic=True, type_var="V", mixed=True),),
    attrs={"then_branch": graph_(REQUIRED), "else_branch": graph_(REQUIRED)},
    types="B in {bool}; V in {all, string}",
    rule=_if_infer,
    reference=_if_reference,
    role=Role.OPAQUE,
    reads=(0,),
    since=(1, 11, 13, 16, 19, 21),
    doc="Run then_branch or else_branch on the captured values, as cond says.",
)

__all__ = ["BRANCHES", "CAPTURED", "If", "captured_start", "input_bindings", "merge_types", "rebind"]
