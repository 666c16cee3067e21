"""Optimizer steps of domain ``ai.onnx.preview.training``: ``Adagrad``, ``Adam``, ``Momentum``.

Each takes a learning rate ``R`` and an update count ``T`` (scalars), then ``n`` tensors to
optimize followed by their gradients and their accumulators, grouped by kind:
``X_1..X_n, G_1..G_n, H_1..H_n`` for Adagrad (``V`` for Momentum; ``V`` then ``H`` for Adam).
It gives the new ``X``, then the new accumulators, in the same grouping. Every formula is
elementwise, so each node's semantics is an index expression written for its ``n`` (a
variadic input ``Inputs`` is named ``Inputs_0, Inputs_1, ...`` there, the outputs ``Outputs_0, ...``):

- Adagrad: ``r = R / (1 + T * decay_factor)``, ``g = norm_coefficient * X + G``,
  ``H' = H + g²``, ``X' = X - r * g / (sqrt(H') + epsilon)``.
- Momentum: ``g = norm_coefficient * X + G``, ``V' = alpha * V + β g`` with ``β = beta``
  after the first step (``T > 0``) and 1 on it; ``X' = X - R * V'`` (standard) or
  ``X' = X - R * (g + alpha * V')`` (nesterov).
- Adam: ``g`` as above, ``V' = alpha * V + (1 - alpha) g``, ``H' = beta * H + (1 - beta) g²``,
  ``r = R * sqrt(1 - beta^T) / (1 - alpha^T)`` (``R`` on the first step, ``T = 0``),
  ``X' = (1 - norm_coefficient_post) * (X - r * V' / (sqrt(H') + epsilon))``.

Example:
    >>> from metadef.ops import get_op
    >>> print(get_op("Momentum", DOMAIN).semantics.expression(
    ...     {"mode": "standard"}, [(), (), (4,), (4,), (4,)]))
    g0[...] = norm_coefficient * Inputs_0[...] + Inputs_1[...]
    Outputs_1[...] = alpha * Inputs_2[...] + where(T[] > 0, beta, 1) * g0[...]
    Outputs_0[...] = Inputs_0[...] - R[] * Outputs_1[...]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from metadef.ops.infer import InferContext
from metadef.ops.interface import REQUIRED, float_, string
from metadef.ops.metaop import metaop
from metadef.ops.strategy import Role
from metadef.shape import Decision, Dim, equal, format_shape

DOMAIN = "ai.onnx.preview.training"
MOMENTUM_MODES = ("standard", "nesterov")

Shapes = Sequence[Sequence[Dim] | None]
_SIGNATURE = {"inputs": ("R: T1", "T: T2", "Inputs*: T3"), "outputs": ("Outputs*: T3",),
              "types": "T1 in {float32, float64}; T2 in {int64}; T3 in {float32, float64}",
              "role": Role.ELEMENTWISE, "domain": DOMAIN}


def _groups(ctx: InferContext, kinds: str) -> int:
    """The number ``n`` of optimized tensors, checking the inputs come in ``len(kinds)``
    groups of ``n`` (``kinds`` names them, ``"XGH"``) whose shapes agree across a group."""
    tensors = ctx.inputs[2:]
    if not tensors or len(tensors) % len(kinds):
        ctx.fail(f"after R and T the inputs must be {len(kinds)} groups of n tensors "
                 f"({', '.join(k + '_1..' + k + '_n' for k in kinds)}), got {len(tensors)}")
    for i, name in ((0, "R"), (1, "T")):
        shape = ctx.shape(i)
        if shape:  # neither unknown nor rank 0
            ctx.fail(f"{name} must be a scalar, got shape {format_shape(shape)}")
    n = len(tensors) // len(kinds)
    for i in range(n):
        shapes = [tensors[g * n + i].shape for g in range(len(kinds))]
        first = shapes[0]
        for kind, shape in zip(kinds[1:], shapes[1:]):
            if first is None or shape is None:
                continue
            if len(shape) != len(first) or any(
                    equal(a, b, ctx.env) is Decision.FALSE for a, b in zip(first, shape)):
                ctx.fail(f"{kind}_{i + 1} {format_shape(shape)} must have the shape of X_{i + 1} "
                         f"{format_shape(first)}")
    return n


def _optimizer_rule(kinds: str) -> Callable[[InferContext], list[Any]]:
    """A shape rule: each new ``X`` and accumulator like the old one."""
    def rule(ctx: InferContext) -> list[Any]:
        n = _groups(ctx, kinds)
        olds = [ctx.shape(2 + i) for i in range(n)]  # the X group
        accumulators = [ctx.shape(2 + g * n + i) for g in range(2, len(kinds)) for i in range(n)]
        return [*olds, *accumulators]
    return rule


def _regularized(n: int) -> list[str]:
    """``g_i = norm_coefficient * X_i + G_i`` for each group member."""
    return [f"g{i}[...] = norm_coefficient * Inputs_{i}[...] + Inputs_{n + i}[...]"
            for i in range(n)]


def adagrad_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> str:
    """Adagrad's update for the node's ``n`` tensors (see the module doc).

    Example:
        >>> print(adagrad_semantics({}, [(), (), (3,), (3,), (3,)]))
        r[] = R[] / (1 + T[] * decay_factor)
        g0[...] = norm_coefficient * Inputs_0[...] + Inputs_1[...]
        Outputs_1[...] = Inputs_2[...] + g0[...] * g0[...]
        Outputs_0[...] = Inputs_0[...] - r[] * g0[...] / (sqrt(Outputs_1[...]) + epsilon)
    """
    n = (len(shapes) - 2) // 3
    lines = ["r[] = R[] / (1 + T[] * decay_factor)", *_regularized(n)]
    for i in range(n):
        lines += [f"Outputs_{n + i}[...] = Inputs_{2 * n + i}[...] + g{i}[...] * g{i}[...]",
                  f"Outputs_{i}[...] = Inputs_{i}[...] - r[] * g{i}[...] / "
                  f"(sqrt(Outputs_{n + i}[...]) + epsilon)"]
    return "\n".join(lines)


def momentum_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> str:
    """Momentum's update (standard or Nesterov) for the node's ``n`` tensors.

    Example:
        >>> print(momentum_semantics({"mode": "nesterov"}, [(), (), (2,), (2,), (2,)]).splitlines()[-1])
        Outputs_0[...] = Inputs_0[...] - R[] * (g0[...] + alpha * Outputs_1[...])
    """
    n = (len(shapes) - 2) // 3
    lines = _regularized(n)
    for i in range(n):
        v = f"Outputs_{n + i}[...]"
        step = f"R[] * {v}" if attrs["mode"] == "standard" \
            else f"R[] * (g{i}[...] + alpha * {v})"
        lines += [f"{v} = alpha * Inputs_{2 * n + i}[...] + where(T[] > 0, beta, 1) * g{i}[...]",
                  f"Outputs_{i}[...] = Inputs_{i}[...] - {step}"]
    return "\n".join(lines)


def adam_semantics(attrs: Mapping[str, Any], shapes: Shapes) -> str:
    """Adam's update for the node's ``n`` tensors (the bias correction from the second step
    on; ``max(T, 1)`` keeps the unused branch finite on the first).

    Example:
        >>> print(adam_semantics({}, [(), ()] + [(3,)] * 8).splitlines()[1])
        r[] = where(T[] > 0, R[] * sqrt(1 - beta ** t[]) / (1 - alpha ** t[]), R[])
    """
    n = (len(shapes) - 2) // 4
    lines = ["t[] = max(T[], 1)",
             "r[] = where(T[] > 0, R[] * sqrt(1 - beta ** t[]) / (1 - alpha ** t[]), R[])",
             *_regularized(n)]
    for i in range(n):
        v, h = f"Outputs_{n + i}[...]", f"Outputs_{2 * n + i}[...]"
        lines += [f"{v} = alpha * Inputs_{2 * n + i}[...] + (1 - alpha) * g{i}[...]",
                  f"{h} = beta * Inputs_{3 * n + i}[...] + (1 - beta) * g{i}[...] * g{i}[...]",
                  f"Outputs_{i}[...] = (1 - norm_coefficient_post) * (Inputs_{i}[...] - "
                  f"r[] * {v} / (sqrt({h}) + epsilon))"]
    return "\n".join(lines)


def _momentum_rule(ctx: InferContext) -> list[Any]:
    if ctx.attrs["mode"] not in MOMENTUM_MODES:
        ctx.fail(f"mode={ctx.attrs['mode']!r} is not 'standard' or 'nesterov'")
    return _optimizer_rule("XGV")(ctx)


Adagrad = metaop(
    "Adagrad", **_SIGNATURE,
    attrs={"decay_factor": float_(0.0), "epsilon": float_(1e-6), "norm_coefficient": float_(0.0)},
    rule=_optimizer_rule("XGH"), semantics=adagrad_semantics,
    doc="One Adagrad step: X_i, G_i, H_i -> X_i', H_i'.",
)
Momentum = metaop(
    "Momentum", **_SIGNATURE,
    attrs={"alpha": float_(REQUIRED), "beta": float_(REQUIRED), "mode": string(REQUIRED),
           "norm_coefficient": float_(REQUIRED)},
    rule=_momentum_rule, semantics=momentum_semantics,
    doc="One SGD-with-momentum step (standard or Nesterov): X_i, G_i, V_i -> X_i', V_i'.",
)
Adam = metaop(
    "Adam", **_SIGNATURE,
    attrs={"alpha": float_(0.9), "beta": float_(0.999), "epsilon": float_(1e-6),
           "norm_coefficient": float_(0.0), "norm_coefficient_post": float_(0.0)},
    rule=_optimizer_rule("XGVH"), semantics=adam_semantics,
    doc="One Adam step: X_i, G_i, V_i, H_i -> X_i', V_i', H_i'.",
)

__all__ = ["DOMAIN", "MOMENTUM_MODES", "Adagrad", "Adam", "Momentum", "adagrad_semantics",
           "adam_semantics", "momentum_semantics"]
