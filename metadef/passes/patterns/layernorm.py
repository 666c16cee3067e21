"""``recognize_layernorm``: LayerNorm as exporters decompose it -> ONNX ``LayerNormalization``.

::

    mean = ReduceMean(x, axes)            # axes: the last k axes, keepdims=1
    d    = Sub(x, mean)
    var  = ReduceMean(Pow(d, 2), axes)    # or Mul(d, d)
    y    = Div(d, Sqrt(Add(var, eps)))    # or Mul(d, Reciprocal(Sqrt(...)))
    y    = Add(Mul(y, gamma), beta)       # optional: gamma, beta, both

becomes ``LayerNormalization(x, gamma, beta, axis=rank-k, epsilon=eps)`` (a unit scale when
there is no gamma). The rules are listed for each root (the Div, the Mul by gamma, the Add of
beta); a smaller match defers to the larger one its single consumer completes, so one
LayerNorm is one decision. Gamma and beta must broadcast over the normalized axes only; a
constant one is broadcast to their full shape, as ONNX Runtime wants.

Example:
    >>> len(layernorm_rules), {r.name for r in layernorm_rules}
    (16, {'recognize_layernorm'})
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from metadef.ir import Value
from metadef.passes.patterns.common import emit, escaping, rank_of, scalar, scalar_value
from metadef.rewrite import GraphEditor, Match, Refusal, Rule, const, match, op, var
from metadef.rewrite.engine import Built
from metadef.rewrite.pattern import Pattern

RULE = "recognize_layernorm"


@dataclass(frozen=True)
class _Plan:
    x: Value
    axis: int
    epsilon: float
    scale: Value | np.ndarray | None = None
    bias: Value | np.ndarray | None = None


def _normalized_cores() -> Iterator[Pattern]:
    """The four ways to normalize: (Pow | Mul) x (Div | Mul by Reciprocal)."""
    x = var("x")
    mean = op("ReduceMean", x, const("axes"), name="mean", attrs={"keepdims": 1})
    centered = op("Sub", x, mean, name="centered")
    squares = (op("Pow", centered, const("two", where=scalar(2.0)), name="square"),
               op("Mul", centered, centered, name="square"))
    for square in squares:
        variance = op("ReduceMean", square, const("axes_var"), name="variance", attrs={"keepdims": 1})
        plus_eps = op("Add", variance, const("eps", where=scalar()), name="plus_eps", commutative=True)
        std = op("Sqrt", plus_eps, name="std")
        yield op("Div", centered, std, name="normalized")
        yield op("Mul", centered, op("Reciprocal", std, name="inverse"), name="normalized",
                 commutative=True)


def _affine(core: Pattern, gamma: bool, beta: bool) -> Pattern:
    out = op("Mul", core, var("gamma"), name="times_gamma", commutative=True) if gamma else core
    return op("Add", out, var("beta"), name="plus_beta", commutative=True) if beta else out


def _axis(m: Match, x: Value) -> int | None:
    """The first normalized axis when both ReduceMeans reduce the same trailing axes."""
    rank = rank_of(x)
    if rank is None or rank == 0:
        return None
    axes = [sorted(int(a) % rank for a in np.asarray(m.value(k).const).reshape(-1)) for k in ("axes", "axes_var")]
    if axes[0] != axes[1] or not axes[0] or axes[0] != list(range(rank - len(axes[0]), rank)):
        return None
    return axes[0][0]


def _affine_operand(v: Value, x: Value, axis: int) -> Value | np.ndarray | None:
    """gamma or beta as LayerNormalization takes it: over the normalized axes only, with
    their full shape (broadcast, when constant); None when it does not fit."""
    normalized = tuple(x.type.shape[axis:])
    if v.type is None or v.type.shape is None or v.type.dtype is not x.type.dtype:
        return None
    shape = tuple(v.type.shape)
    if len(shape) > len(normalized) or any(d != 1 and d != n for d, n in zip(shape[::-1], normalized[::-1])):
        return None
    if shape == normalized:
        return v
    if v.const is None or not all(isinstance(n, int) for n in normalized):
        return None
    return np.broadcast_to(v.const, normalized).copy()


def _plan(m: Match) -> _Plan | None:
    """What the match computes, or None when it is not a LayerNorm after all."""
    x = m.value("x")
    axis = _axis(m, x)
    eps = scalar_value(m, "eps")
    if axis is None or eps < 0 or x.type is None or not x.type.dtype.is_float:
        return None
    parts = {}
    for name in ("gamma", "beta"):
        if m.has(name):
            parts[name] = _affine_operand(m.value(name), x, axis)
            if parts[name] is None:
                return None
    return _Plan(x, axis, eps, parts.get("gamma"), parts.get("beta"))


def _operand(ed: GraphEditor, data: Value | np.ndarray | None, hint: str) -> Value | None:
    """gamma or beta as a value (a broadcast constant becomes a new one)."""
    return ed.const(hint, data) if isinstance(data, np.ndarray) else data


def _larger_match(ed: GraphEditor, m: Match, larger: Sequence[Pattern]) -> bool:
    """Whether the root's only consumer completes a larger LayerNorm (its rule decides)."""
    out = m.nodes[0].outputs[0]
    users = ed.users(out)
    if ed.num_uses(out) != 1 or len(users) != 1:
        return False
    for pattern in larger:
        bigger = match(pattern, users[0].outputs[0], ed.num_uses)
        if bigger is not None and bigger.node("normalized") is m.node("normalized") and _plan(bigger):
            return True
    return False


def _build(larger: Sequence[Pattern], m: Match, ed: GraphEditor) -> Built:
    plan = _plan(m)
    if plan is None or _larger_match(ed, m, larger):
        return None
    refusal = escaping(m, ed)
    if refusal is not None:
        return refusal
    x = plan.x
    scale = _operand(ed, plan.scale, "layernorm_scale")
    if scale is None:
        normalized = tuple(x.type.shape[plan.axis:])
        if not all(isinstance(n, int) for n in normalized):
            return Refusal(f"no gamma, and the normalized axes of %{x.name} ({x.type}) have symbolic "
                           "sizes, so no unit scale can be made")
        scale = ed.const("layernorm_unit_scale", np.ones(normalized, x.type.dtype.numpy))
    bias = _operand(ed, plan.bias, "layernorm_bias")
    return emit(m, ed, "LayerNormalization", [x, scale, bias] if bias is not None else [x, scale],
                {"axis": plan.axis, "epsilon": plan.epsilon})


def _rules() -> list[Rule]:
    cores = list(_normalized_cores())
    shapes = {(g, b): [_affine(c, g, b) for c in cores] for g, b in itertools.product((False, True), repeat=2)}
    consumers = {  # what each form's single consumer may complete
        (False, False): shapes[(True, False)] + shapes[(False, True)],
        (True, False): shapes[(True, True)],
        (False, True): [],
        (True, True): [],
    }
    return [Rule(RULE, pattern, partial(_build, consumers[form]),
                 doc="decomposed LayerNorm -> LayerNormalization")
            for form in ((True, True), (True, False), (False, True), (False, False))
            for pattern in shapes[form]]


layernorm_rules = _rules()

__all__ = ["layernorm_rules"]
