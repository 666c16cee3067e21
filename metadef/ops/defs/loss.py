"""Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both pick, for each sample ``n`` (and each extra position ``d1, d2...``), the entry of its
target class from an ``[N, C, d1, d2...]`` input: ``loss[n, d] = -weight[t] * input[n, t, d]``
with ``t = target[n, d]``. A position whose target equals ``ignore_index`` weighs 0 (its target
may lie outside ``[0, C)``). The reduction is ``none`` (the per-position losses, shaped like the
target), ``sum``, or ``mean``: the weighted sum divided by the sum of the weights used (the
number of positions not ignored when there are no weights). SoftmaxCrossEntropyLoss first
takes the log-softmax of its scores over the class axis; its optional second output is that
log-probability.

The pick reads the input at a position given by another input's *value*, which an index
expression cannot name, so both ops are opaque with a vectorized numpy reference
(:func:`nll_reference`); float16 and bfloat16 are computed in float32.

Example:
    >>> from metadef.testing.onnx_cases import infer_text
    >>> infer_text("NegativeLogLikelihoodLoss", ["f32[n,5,h]", "i64[n,h]"], {"reduction": "none"})
    ['f32[n,h]']
    >>> infer_text("SoftmaxCrossEntropyLoss", ["f32[n,5]", "i64[n]"], {}, n_outputs=2)
    ['f32[]', 'f32[n,5]']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from metadef.core.errors import BackendError
from metadef.ops.infer import InferContext
from metadef.ops.interface import int_, string
from metadef.ops.metaop import metaop
from metadef.ops.strategy import Role
from metadef.shape import Decision, equal

REDUCTIONS = ("none", "sum", "mean")
LOSS_TYPES = "T in {float}; Tind in {int32, int64}"
Arrays = list[np.ndarray | None]


def _loss_rule(ctx: InferContext) -> list[Any]:
    """``[N, C, d...]`` input, ``[N, d...]`` target, ``[C]`` weight; the loss is shaped like
    the target (``none``) or a scalar; a second output (the log-probability) like the input."""
    if ctx.attrs["reduction"] not in REDUCTIONS:
        ctx.fail(f"reduction={ctx.attrs['reduction']!r} is not one of {', '.join(REDUCTIONS)}")
    x, target = ctx.shape(0), ctx.shape(1)
    if x is not None and len(x) < 2:
        ctx.fail(f"the input must be [N, C, d1...] (rank >= 2), got rank {len(x)}")
    if x is not None and target is not None:
        want = (x[0], *x[2:])
        if len(target) != len(want) or any(
                equal(a, b, ctx.env) is Decision.FALSE for a, b in zip(target, want)):
            ctx.fail(f"the target must be shaped like the input without its class axis, "
                     f"{list(want)}; got {list(target)}")
    weight = ctx.shape(2) if ctx.has(2) else None
    if weight is not None and (len(weight) != 1 or (
            x is not None and equal(weight[0], x[1], ctx.env) is Decision.FALSE)):
        ctx.fail(f"the weight must be 1-D with one entry per class ({x[1] if x else 'C'}), "
                 f"got shape {list(weight)}")
    if ctx.attrs["reduction"] != "none":
        loss = ()
    elif target is not None:
        loss = target
    else:
        loss = None if x is None else (x[0], *x[2:])
    return [loss, x][:len(ctx.op.outputs)]


def _compute_dtype(x: np.ndarray) -> Any:
    """float16 and bfloat16 losses are computed in float32."""
    return np.float32 if x.dtype in (np.float16, ml_dtypes.bfloat16) else x.dtype


def nll_reference(log_prob: np.ndarray, target: np.ndarray, weight: np.ndarray | None,
                  ignore_index: int | None, reduction: str) -> np.ndarray:
    """The negative log-likelihood of ``target`` under ``log_prob`` (``[N, C, d...]``).

    Example:
        >>> lp = np.log(np.array([[0.5, 0.5], [0.25, 0.75]]))
        >>> round(float(nll_reference(lp, np.array([0, 1]), None, None, "sum")), 4)
        0.9808
        >>> nll_reference(lp, np.array([0, 1]), np.array([1.0, 0.0]), 1, "none")
        array([0.69314718, 0.        ])
    """
    classes = log_prob.shape[1]
    target = np.asarray(target).astype(np.int64)
    ignored = np.zeros(target.shape, bool) if ignore_index is None else target == ignore_index
    bad = ~ignored & ((target < 0) | (target >= classes))
    if bad.any():
        raise BackendError(f"target {int(target[bad][0])} is outside the {classes} classes "
                           f"[0, {classes}) and is not ignore_index ({ignore_index})")
    index = np.where(ignored, 0, target)
    picked = np.take_along_axis(log_prob, index[:, None], axis=1)[:, 0]
    weights = np.ones(target.shape, log_prob.dtype) if weight is None \
        else weight.astype(log_prob.dtype)[index]
    weights = np.where(ignored, 0, weights).astype(log_prob.dtype)
    loss = -picked * weights
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / weights.sum()


def _nll_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
    x, target = inputs[0], inputs[1]
    weight = inputs[2] if len(inputs) > 2 else None
    work = _compute_dtype(x)
    return nll_reference(x.astype(work), target, weight, attrs["ignore_index"],
                         attrs["reduction"])


def log_softmax(x: np.ndarray, axis: int = 1) -> np.ndarray:
    """``x - logsumexp(x)`` along ``axis``, shifted by the maximum for stability.

    Example:
        >>> np.exp(log_softmax(np.array([[1.0, 1.0]]))).tolist()
        [[0.5, 0.5]]
    """
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def _sce_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    x, target = inputs[0], inputs[1]
    weight = inputs[2] if len(inputs) > 2 else None
    log_prob = log_softmax(x.astype(_compute_dtype(x)))
    loss = nll_reference(log_prob, target, weight, attrs["ignore_index"], attrs["reduction"])
    return loss, log_prob


_LOSS_ATTRS = {"ignore_index": int_(None), "reduction": string("mean")}

NegativeLogLikelihoodLoss = metaop(
    "NegativeLogLikelihoodLoss", inputs=("input", "target: Tind", "weight?"),
    outputs=("loss",), attrs=_LOSS_ATTRS, types=LOSS_TYPES, rule=_loss_rule,
    reference=_nll_reference, role=Role.OPAQUE, since=(12, 13, 22),
    doc="-weight[t] * input[n, t, d...] for each target class t = target[n, d...] (0 where "
        "t == ignore_index), reduced by none, sum or a weighted mean.",
)

SoftmaxCrossEntropyLoss = metaop(
    "SoftmaxCrossEntropyLoss", inputs=("scores", "labels: Tind", "weights?"),
    outputs=("output", "log_prob?"), attrs=_LOSS_ATTRS, types=LOSS_TYPES, rule=_loss_rule,
    reference=_sce_reference, role=Role.OPAQUE, since=(12, 13),
    doc="NegativeLogLikelihoodLoss of log_softmax(scores) over the class axis (axis 1); "
        "the optional second output is that log-probability.",
)

__all__ = ["LOSS_TYPES", "NegativeLogLikelihoodLoss", "REDUCTIONS", "SoftmaxCrossEntropyLoss",
           "log_softmax", "nll_reference"]
