"""``Fused``: one fused group of nodes, the unit of code generation (domain ``ai.metadef``).

The ``fuse_groups`` pass replaces each group of nodes it decides to fuse by one ``Fused``
node. Its inputs are the values entering the group and its outputs the values leaving it;
its ``body`` attribute is a graph holding the group's original nodes, whose inputs and outputs
correspond one-to-one to the node's. ``kind`` says how the group was formed (for example
``"contraction+epilogue"``, ``"prologue+reduction"``, ``"elementwise"``); the node it grew
from is named in ``node.meta["anchor"]`` (not an attribute: it does not change what the node
computes, and identical groups must compare equal).

The shape rule gives each output the type of the corresponding body output (the body is
typed in the outer graph's symbols) after checking that the input types agree with the
body's. The semantics is opaque: the numpy reference interprets the body node by node with
the very evaluator that runs unfused nodes, so fusing never changes a result. The body is
handled by duck typing (``.inputs``, ``.outputs``, ``.nodes``, ``node.metaop``,
``node.attrs``, values' ``.type`` and ``.const``): ``ops`` does not import the IR.

Example:
    >>> import numpy as np
    >>> from types import SimpleNamespace as NS
    >>> from metadef.ops import get_op, infer_types
    >>> from metadef.shape import parse_type
    >>> t = parse_type("f32[n,2]")
    >>> x, s, y = NS(name="x", type=t, const=None), NS(name="s", type=t, const=None), NS(name="y", type=t)
    >>> add = NS(name="/add", metaop=get_op("Add"), attrs={}, inputs=(x, x), outputs=(s,))
    >>> relu = NS(name="/relu", metaop=get_op("Relu"), attrs={}, inputs=(s,), outputs=(y,))
    >>> body = NS(name="g", inputs=[x], outputs=[y], nodes=[add, relu])
    >>> attrs = {"body": body, "kind": "elementwise"}
    >>> str(infer_types(Fused, "/add/fused", [t], attrs)[0])
    'f32[n,2]'
    >>> Fused.semantics.reference([np.array([[-1.0, 2.0]], np.float32)], attrs)
    [array([[0., 4.]], dtype=float32)]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metadef.core.dtypes import from_numpy
from metadef.core.errors import MetadefError
from metadef.ops.infer import InferContext, infer_types
from metadef.ops.interface import REQUIRED, Param, graph_, resolve_attrs, string
from metadef.ops.metaop import metaop
from metadef.ops.numpy_eval import run_node
from metadef.ops.strategy import Role
from metadef.shape import Dim, TensorType, bind_shape, evaluate_shape, substitute

DOMAIN = "ai.metadef"


# ------------------------------------------------------------------------- shape rule


def _bind_dim(given: Dim, inner: Dim, bindings: dict[str, Dim]) -> bool:
    """Whether ``given`` (the outer input's dim) agrees with ``inner`` (the body's); a body
    dim that is one symbol binds to a concrete or other symbolic size."""
    if str(given) == str(substitute(inner, bindings)):
        return True
    atom = None if isinstance(inner, int) else inner.as_atom()
    if atom is None or atom.key[0] != "sym" or atom.key[1] in bindings:
        return False
    bindings[atom.key[1]] = given
    return True


def _type_problem(given: TensorType | None, inner: TensorType | None,
                  bindings: dict[str, Dim]) -> str | None:
    """Why ``given`` cannot feed a body input of type ``inner`` (None when it can)."""
    if given is None:
        return "is missing"
    if inner is None:
        return None
    if given.dtype is not inner.dtype:
        return f"has dtype {given.dtype.name} but the body's input is {inner.dtype.name}"
    if given.shape is None or inner.shape is None:
        return None
    if len(given.shape) != len(inner.shape):
        return f"has type {given} but the body's input is {inner} (rank differs)"
    for axis, (g, i) in enumerate(zip(given.shape, inner.shape)):
        if not _bind_dim(g, i, bindings):
            return f"has type {given} but the body's input is {inner} (dim {axis} differs)"
    return None


def _fused_infer(ctx: InferContext) -> list[TensorType]:
    body = ctx.attrs["body"]
    if len(body.inputs) != len(ctx.inputs):
        ctx.fail(f"the node has {len(ctx.inputs)} inputs but its body has {len(body.inputs)}",
                 "a Fused node's inputs correspond one-to-one to its body's inputs")
    bindings: dict[str, Dim] = {}
    for i, (given, inner) in enumerate(zip(ctx.inputs, body.inputs)):
        problem = _type_problem(given, inner.type, bindings)
        if problem is not None:
            ctx.fail(f"input {i} (body input %{inner.name}) {problem}",
                     "the body was built for other input types; rebuild the group")
    outs = []
    for o in body.outputs:
        t = o.type
        if t is not None and t.shape is not None and bindings:
            t = t.with_shape([substitute(d, bindings) for d in t.shape])
        outs.append(t)
    return outs


# -------------------------------------------------------------------------- reference


def _concrete_types(node: Any, args: Sequence[np.ndarray | None],
                    symbols: Mapping[str, int]) -> list[TensorType]:
    """Concrete output types of a body node: its recorded types evaluated with the symbols
    bound from the body's inputs, or (sizes that depend on values) inferred from the arrays."""
    try:
        types = [o.type for o in node.outputs]
        if all(t is not None and t.shape is not None for t in types):
            return [t.with_shape(evaluate_shape(t.shape, symbols)) for t in types]
    except MetadefError:
        pass
    concrete = [None if a is None else TensorType(from_numpy(a.dtype), a.shape) for a in args]
    return infer_types(node.metaop, node.name, concrete, node.attrs, list(args),
                       n_outputs=len(node.outputs))


def run_body(body: Any, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Interpret a body graph node by node on numpy arrays (the ``Fused`` reference)."""
    env: dict[int, np.ndarray | None] = {}
    symbols: dict[str, int] = {}
    for v, a in zip(body.inputs, inputs):
        env[id(v)] = a
        if a is not None and v.type is not None and v.type.shape is not None:
            bind_shape(v.type.shape, np.shape(a), symbols)

    def read(v: Any) -> np.ndarray | None:
        if v is None:
            return None
        if id(v) in env:
            return env[id(v)]
        return v.const  # a constant kept inside the body

    for node in body.nodes:
        op = node.metaop
        args = [read(v) for v in node.inputs]
        attrs = resolve_attrs(op.name, f"(node {node.name})", op.attrs, node.attrs)
        outs = run_node(op, attrs, args, _concrete_types(node, args, symbols), node.name)
        env.update(zip((id(o) for o in node.outputs), outs))
    return [read(v) for v in body.outputs]


def _fused_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> list[np.ndarray]:
    return run_body(attrs["body"], inputs)


Fused = metaop(
    "Fused",
    domain=DOMAIN,
    # A group's inputs and outputs keep their own dtypes (e.g. float activations and int64 indices).
    inputs=(Param("inputs", variadic=True, mixed=True),), outputs=(Param("outputs", variadic=True, mixed=True),),
    attrs={"body": graph_(REQUIRED), "kind": string(REQUIRED)},
    types="T in {all}",
    rule=_fused_infer,
    reference=_fused_reference,
    role=Role.OPAQUE,
    doc="A fused group of nodes (its body), lowered as one unit of code generation.",
)

__all__ = ["DOMAIN", "Fused", "run_body"]
