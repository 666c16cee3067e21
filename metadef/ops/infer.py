"""Type and shape inference for one node, driven by its meta-op's interface.

``infer_types`` checks the node's attributes and input dtypes against the interface, runs
the op's shape rule and returns one :class:`TensorType` per output. Every failure is a typed
error naming the op, the node, the input types, the attributes and the failed constraint.

Example:
    >>> from metadef.ops import get_op
    >>> from metadef.shape import parse_type
    >>> out, = infer_types(get_op("Relu"), "/relu", [parse_type("f32[batch,8]")], {})
    >>> str(out)
    'f32[batch,8]'
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from metadef.core import flags
from metadef.core.dtypes import STRING, DType
from metadef.core.dtypes import dtype as lookup_dtype
from metadef.core.errors import DTypeError, ShapeError
from metadef.ops.interface import Param, resolve_attrs
from metadef.ops.metaop import BROADCAST_ALL, SAME_AS_FIRST, MetaOp
from metadef.shape import Dim, ShapeEnv, TensorType, broadcast_shapes, format_shape

log = logging.getLogger("metadef.shape")


def _short_attrs(attrs: Mapping[str, Any]) -> str:
    parts = []
    for k, v in attrs.items():
        if v is None or k.startswith("_"):
            continue
        if isinstance(v, np.ndarray):
            v = f"tensor{list(v.shape)}"
        elif hasattr(v, "nodes"):
            v = "<graph>"
        parts.append(f"{k}:{v}")
    return "{" + ", ".join(parts) + "}"


@dataclass
class InferContext:
    """What a shape rule sees of one node: input types, attributes, known input values."""

    op: MetaOp
    node: str
    inputs: list[TensorType | None]
    attrs: dict[str, Any]
    values: list[np.ndarray | None]
    env: ShapeEnv = field(default_factory=ShapeEnv)
    bound: dict[str, DType] = field(default_factory=dict)

    # --- accessors ---------------------------------------------------------------------
    def shape(self, i: int) -> tuple[Dim, ...] | None:
        t = self.inputs[i] if i < len(self.inputs) else None
        return None if t is None else t.shape

    def rank(self, i: int) -> int | None:
        s = self.shape(i)
        return None if s is None else len(s)

    def dtype(self, i: int) -> DType:
        t = self.inputs[i]
        if t is None:
            self.fail(f"input {i} is missing")
        return t.dtype

    def has(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    def value(self, i: int) -> np.ndarray | None:
        """The value of input ``i`` when known at compile time (read it only for ``reads``
        inputs): a constant array, or, for shape arithmetic, an int64 array or an object array
        of symbolic dims such as ``[batch, seq, 12, 64]``."""
        return self.values[i] if i < len(self.values) else None

    def fresh(self, hint: str = "unk") -> Dim:
        """A new symbol for a size that depends on input values."""
        return self.env.fresh(hint)

    def output_type(self, index: int, shape: Sequence[Dim] | None) -> TensorType:
        """A TensorType for output ``index`` with its dtype from the output's type variable."""
        param = self.op.outputs[min(index, len(self.op.outputs) - 1)]
        return TensorType(self.resolve_dtype(param.type_var), None if shape is None else tuple(shape))

    def resolve_dtype(self, type_var: str) -> DType:
        if type_var in self.bound:
            return self.bound[type_var]
        if self.op.interface.allowed(type_var) is None:
            return lookup_dtype(type_var)
        self.fail(f"the output dtype (type variable {type_var}) is not fixed by any input; "
                  "the op's shape rule must give a TensorType")

    # --- errors ------------------------------------------------------------------------
    def describe(self) -> str:
        shapes = ", ".join("none" if t is None else str(t) for t in self.inputs)
        return (f"op {self.op.name} (node {self.node}): inputs [{shapes}], "
                f"attrs {_short_attrs(self.attrs)}")

    def note(self, constraint: str, hint: str = "") -> None:
        """A shape that is valid but suspicious: logged as a warning that names the node, or,
        under ``METADEF_STRICT_SHAPES=1``, raised like ``fail``."""
        if flags.STRICT_SHAPES.get():
            self.fail(constraint, (hint + "; " if hint else "") + "unset METADEF_STRICT_SHAPES to accept it")
        tail = f" ({hint})" if hint else ""
        log.warning("%s: %s%s", self.describe(), constraint, tail)

    def fail(self, constraint: str, hint: str = "") -> NoReturn:
        """Raise a ShapeError that names the node, its inputs, its attributes and ``constraint``."""
        tail = f"\n  hint: {hint}" if hint else ""
        raise ShapeError(f"Cannot infer output shape for {self.describe()}: {constraint}{tail}")


def _param_for(op: MetaOp, index: int) -> Param:
    params = op.inputs
    if index < len(params):
        return params[index]
    if params and params[-1].variadic:
        return params[-1]
    raise IndexError(index)


def _check_arity(op: MetaOp, node: str, n_in: int, present: Sequence[bool]) -> None:
    variadic = bool(op.inputs) and op.inputs[-1].variadic
    if n_in > len(op.inputs) and not variadic:
        raise ShapeError(f"op {op.name} (node {node}) takes at most {len(op.inputs)} inputs "
                         f"({', '.join(p.name for p in op.inputs)}), got {n_in}")
    for i, p in enumerate(op.inputs):
        if p.optional:
            continue
        if p.variadic:
            if n_in <= i:
                raise ShapeError(f"op {op.name} (node {node}) needs at least one {p.name} input")
            continue
        if i >= n_in or not present[i]:
            raise ShapeError(f"op {op.name} (node {node}): required input {i} ({p.name}) is missing")


def _check_dtypes(ctx: InferContext) -> None:
    op = ctx.op
    for i, t in enumerate(ctx.inputs):
        if t is None:
            continue
        param = _param_for(op, i)
        allowed = op.interface.allowed(param.type_var)
        if allowed is None:
            want = lookup_dtype(param.type_var)
            if t.dtype is not want:
                raise DTypeError(f"op {op.name} (node {ctx.node}): input {i} ({param.name}) must be "
                                 f"{want.name}, got {t.dtype.name}")
            continue
        if t.dtype not in allowed and not t.dtype.custom:
            names = ", ".join(sorted(d.name for d in allowed))
            raise DTypeError(f"op {op.name} (node {ctx.node}): input {i} ({param.name}) has dtype "
                             f"{t.dtype.name}, but {param.type_var} must be one of {{{names}}}")
        if param.mixed:
            continue
        seen = ctx.bound.setdefault(param.type_var, t.dtype)
        if seen is not t.dtype:
            raise DTypeError(f"op {op.name} (node {ctx.node}): input {i} ({param.name}) is "
                             f"{t.dtype.name} but an earlier input of type {param.type_var} is "
                             f"{seen.name}; insert a Cast")


def _check_string_outputs(ctx: InferContext, outs: Sequence[TensorType]) -> None:
    """An output may be a string tensor only where the op declares strings for it: an
    attribute (Cast's ``to``, a tensor value) must not make a numeric op yield text."""
    for i, t in enumerate(outs):
        if t is None or not t.dtype.is_string:
            continue
        param = ctx.op.outputs[min(i, len(ctx.op.outputs) - 1)]
        allowed = ctx.op.interface.allowed(param.type_var)
        if STRING in (allowed if allowed is not None else {lookup_dtype(param.type_var)}):
            continue
        raise DTypeError(f"op {ctx.op.name} (node {ctx.node}): output {i} ({param.name}) would be a "
                         f"string tensor, but {ctx.op.name} computes numbers; string tensors go "
                         "only to ops that declare them (Equal, StringConcat, LabelEncoder, ...)")


def _run_rule(ctx: InferContext) -> list[Any]:
    rule = ctx.op.rule
    if rule == SAME_AS_FIRST:
        return [ctx.output_type(0, ctx.shape(0))]
    if rule == BROADCAST_ALL:
        shapes = [t.shape for t in ctx.inputs if t is not None]
        if any(s is None for s in shapes):
            return [ctx.output_type(0, None)]
        try:
            out, _undecided = broadcast_shapes(*shapes)
        except ShapeError:
            ctx.fail("shapes " + " and ".join(format_shape(s) for s in shapes) + " cannot broadcast",
                     "every pair of trailing dims must be equal or 1")
        return [ctx.output_type(0, out)]
    return list(rule(ctx))


def infer_types(op: MetaOp, node: str, inputs: Sequence[TensorType | None],
                attrs: Mapping[str, Any], values: Sequence[np.ndarray | None] = (),
                env: ShapeEnv | None = None, n_outputs: int | None = None) -> list[TensorType]:
    """Check a node against its meta-op and infer its output types (see the module doc).

    ``values`` are the inputs' values where known (see ``InferContext.value``).
    """
    resolved = resolve_attrs(op.name, f"(node {node})", op.attrs, attrs)
    _check_arity(op, node, len(inputs), [t is not None for t in inputs])
    vals = list(values) + [None] * (len(inputs) - len(values))
    ctx = InferContext(op, node, list(inputs), resolved, vals, env or ShapeEnv())
    _check_dtypes(ctx)
    outs = _run_rule(ctx)
    result = []
    for i, o in enumerate(outs):
        result.append(o if isinstance(o, TensorType) else ctx.output_type(i, o))
    _check_string_outputs(ctx, result)
    if n_outputs is not None:
        if len(result) < n_outputs:
            ctx.fail(f"the rule gave {len(result)} outputs but the node has {n_outputs}")
        result = result[:n_outputs]
    return result


__all__ = ["InferContext", "infer_types"]
