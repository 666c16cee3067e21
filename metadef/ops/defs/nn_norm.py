"""Normalizations: BatchNormalization, Instance-, Layer- and GroupNormalization, LRN,
MeanVarianceNormalization and LpNormalization.

Each is an index expression generated per node from its rank and axes: statistics are
temporaries (``mu``, ``rstd``) reduced over the normalized axes, then one broadcast statement
normalizes. LayerNormalization's optional Mean and InvStdDev outputs keep their reduced
axes as extent-1 axes (``Mean[a0, k0] = mean[b0:N0] X[a0, b0 + k0*N0]``).

BatchNormalization with ``training_mode=1`` (opset 14 and later) normalizes with the batch's
own statistics and gives the running ones updated with ``momentum``; it runs from a numpy
reference (:func:`batchnorm_training_reference`), since its three outputs are not one
expression's. The training forms of opsets below 14 (``is_test=0``; five outputs with the
saved statistics) are refused with ``UnsupportedOpError``.

Example:
    >>> from metadef.ops import get_op, infer_types
    >>> from metadef.shape import parse_type
    >>> y, mean, rstd = infer_types(get_op("LayerNormalization"), "/ln",
    ...     [parse_type("f16[batch,seq,768]"), parse_type("f16[768]")], {"axis": -1},
    ...     n_outputs=3)
    >>> str(y), str(mean), str(rstd)
    ('f16[batch,seq,768]', 'f32[batch,seq,1]', 'f32[batch,seq,1]')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metadef.core import dtypes as dt
from metadef.core.errors import AttributeError_, UnsupportedOpError
from metadef.ops.infer import InferContext
from metadef.ops.interface import REQUIRED, float_, int_, ints
from metadef.ops.metaop import SAME_AS_FIRST, metaop
from metadef.ops.strategy import Role
from metadef.shape import Dim, TensorType

# ONNX TensorProto element types a stash_type may name -> (metadef dtype, semantic cast).
STASH_TYPES = {1: (dt.FLOAT32, "cast_float32"), 10: (dt.FLOAT16, "cast_float16"),
               11: (dt.FLOAT64, "cast_float64"), 16: (dt.BFLOAT16, "cast_bfloat16")}
_NORM_HINTS = {"role": Role.REDUCTION, "parallel": ("n",)}


def _vars(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(count)]


def _join(*groups: Sequence[str]) -> str:
    return ", ".join(v for g in groups for v in g)


def _stash(attrs: Mapping[str, Any]) -> tuple[dt.DType, str]:
    stash = attrs.get("stash_type", 1)
    if stash not in STASH_TYPES:
        raise AttributeError_(f"stash_type={stash} is not one of "
                              f"{sorted(STASH_TYPES)} (float, float16, double, bfloat16)")
    return STASH_TYPES[stash]


def _norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise AttributeError_(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


# ------------------------------------------------------------------- BatchNormalization


def _batchnorm_infer(ctx: InferContext) -> list[Any]:
    x = ctx.shape(0)
    if ctx.attrs.get("training_mode") and ctx.rank(3) not in (None, 1):
        ctx.fail(f"training_mode=1 takes per-channel statistics (rank 1), got rank {ctx.rank(3)}")
    if x is not None and len(x) < 2:
        ctx.fail(f"X must have rank >= 2 (N, C, ...), got rank {len(x)}")
    return [x, ctx.shape(3), ctx.shape(4)]


def batchnorm_semantics(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None]) -> str | None:
    """Per channel (or per activation when the statistics have rank > 1, the ``spatial=0``
    form of opsets below 9); None in training mode (the reference runs it)."""
    if attrs.get("training_mode"):
        return None
    per = "c" if len(shapes[1]) == 1 else "c, ..."
    return (f"Y[n, c, ...] = (X[n, c, ...] - input_mean[{per}]) / "
            f"sqrt(input_var[{per}] + epsilon) * scale[{per}] + B[{per}]")


def batchnorm_training_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any],
                                 ) -> list[np.ndarray]:
    """Training mode (ONNX opset 14+): the batch mean and (population) variance per channel,
    over every axis but 1, normalize X; the running statistics become
    ``input_mean * momentum + mean * (1 - momentum)`` (and likewise the variance). Sums are
    taken in float64.

    Example:
        >>> x = np.array([[1.0], [3.0]], np.float32)
        >>> one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
        >>> y, mean, var = batchnorm_training_reference(
        ...     [x, one, zero, zero, one], {"epsilon": 0.0, "momentum": 0.5})
        >>> y.ravel().tolist(), mean.tolist(), var.tolist()
        ([-1.0, 1.0], [1.0], [1.0])
    """
    x, scale, bias, mean, var = (np.asarray(a) for a in inputs[:5])
    axes = tuple(a for a in range(x.ndim) if a != 1)
    per_channel = (-1, *[1] * (x.ndim - 2))
    wide = x.astype(np.float64)
    batch_mean, batch_var = wide.mean(axis=axes), wide.var(axis=axes)
    y = ((wide - batch_mean.reshape(per_channel)) / np.sqrt(batch_var.reshape(per_channel) + attrs["epsilon"])
         * scale.astype(np.float64).reshape(per_channel) + bias.astype(np.float64).reshape(per_channel))
    momentum = attrs["momentum"]
    running_mean = mean.astype(np.float64) * momentum + batch_mean * (1 - momentum)
    running_var = var.astype(np.float64) * momentum + batch_var * (1 - momentum)
    return [y.astype(x.dtype), running_mean.astype(mean.dtype), running_var.astype(var.dtype)]


def _batchnorm_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> list[np.ndarray]:
    # Only training-mode nodes reach here: the others have an expression.
    return batchnorm_training_reference(inputs, attrs)


def _batchnorm_adapt(opset: int, attrs: dict[str, Any], n_inputs: int, n_outputs: int = 1,
                     ) -> tuple[dict[str, Any], dict[int, Any]]:
    """Drop the attributes of old opsets: ``consumed_inputs`` (1), ``is_test`` (< 7) and
    ``spatial`` (< 9; honoured through the statistics' rank). Their training forms (``is_test=0``
    below opset 7, more than one output below 14) are refused."""
    attrs = dict(attrs)
    attrs.pop("consumed_inputs", None)
    if opset < 14 and (attrs.pop("is_test", 1) == 0 or n_outputs > 1):
        raise UnsupportedOpError(
            f"BatchNormalization in training mode at opset {opset} (five outputs, with the saved "
            "statistics) is not supported; re-export the model with opset 14 or later "
            "(training_mode=1, three outputs), or in eval mode (model.eval() in PyTorch)")
    attrs.pop("spatial", None)
    return attrs, {}


BatchNormalization = metaop(
    "BatchNormalization",
    inputs=("X", "scale: T1", "B: T1", "input_mean: T2", "input_var: T2"),
    outputs=("Y", "running_mean?: T2", "running_var?: T2"),
    attrs={"epsilon": float_(1e-5), "momentum": float_(0.9), "training_mode": int_(0)},
    types="T in {float}; T1 in {float}; T2 in {float}",
    rule=_batchnorm_infer, semantics=batchnorm_semantics, reference=_batchnorm_reference,
    adapt=_batchnorm_adapt,
    since=(1, 6, 7, 9, 14, 15),
    # In inference BN is a per-channel affine map of given statistics: no reduction in it.
    role=Role.BROADCAST, parallel=("n",),
    doc="Batch normalization: with given statistics, or (training_mode=1) the batch's, updating "
        "the running ones.",
)


# ------------------------------------------------------- Instance- and GroupNormalization


def instancenorm_semantics(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None],
                           ) -> str:
    """Statistics per (n, c) over the spatial axes."""
    h = _vars("h", len(shapes[0]) - 2)
    x = f"input[{_join(['n', 'c'], h)}]"
    return (f"mu[n, c] = mean[{_join(h)}] {x}\n"
            f"rstd[n, c] = rsqrt(mean[{_join(h)}] ({x} - mu[n, c]) ** 2 + epsilon)\n"
            f"output[{_join(['n', 'c'], h)}] = ({x} - mu[n, c]) * rstd[n, c] * scale[c] + B[c]")


InstanceNormalization = metaop(
    "InstanceNormalization", inputs=("input", "scale", "B"), outputs=("output",),
    attrs={"epsilon": float_(1e-5)}, types="T in {float}", rule=SAME_AS_FIRST,
    semantics=instancenorm_semantics, since=(1, 6, 22), **_NORM_HINTS,
)


def groupnorm_semantics(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None],
                        ) -> tuple[str, dict[str, Any]]:
    """Statistics per (n, group) over the group's channels and the spatial axes, in the
    stash type; scale and bias per channel (opset 21) or per group (opset 18's form,
    recognized by their length)."""
    x = shapes[0]
    groups = attrs["num_groups"]
    _, cast = _stash(attrs)
    h = _vars("h", len(x) - 2)
    ch = "g*CG + cc"
    xs = f"xs[{_join(['n', ch], h)}]"
    per_group = shapes[1][0] == groups and x[1] != groups
    affine = "g" if per_group else ch
    text = (f"xs[{_join(['n', 'c'], h)}] = {cast}(X[{_join(['n', 'c'], h)}])\n"
            f"mu[n, g] = mean[{_join(['cc:CG'], h)}] {xs}\n"
            f"rstd[n, g] = rsqrt(mean[{_join(['cc:CG'], h)}] ({xs} - mu[n, g]) ** 2 + epsilon)\n"
            f"Y[{_join(['n', ch], h)}] = ({xs} - mu[n, g]) * rstd[n, g] * scale[{affine}]"
            f" + bias[{affine}]")
    return text, {"CG": x[1] // groups}


def _groupnorm_infer(ctx: InferContext) -> list[Any]:
    x = ctx.shape(0)
    groups = ctx.attrs["num_groups"]
    if x is not None and isinstance(x[1], int) and (groups <= 0 or x[1] % groups):
        ctx.fail(f"the channels ({x[1]}) must split into num_groups={groups} equal groups")
    try:
        _stash(ctx.attrs)
    except AttributeError_ as e:
        ctx.fail(str(e))
    return [x]


GroupNormalization = metaop(
    "GroupNormalization", inputs=("X", "scale", "bias"), outputs=("Y",),
    attrs={"epsilon": float_(1e-5), "num_groups": int_(REQUIRED), "stash_type": int_(1)},
    types="T in {float}", rule=_groupnorm_infer, semantics=groupnorm_semantics,
    since=(18, 21), **_NORM_HINTS,
)


# ------------------------------------------------------------------ LayerNormalization


def _layernorm_infer(ctx: InferContext) -> list[Any]:
    x = ctx.shape(0)
    try:
        stash, _ = _stash(ctx.attrs)
        axis = None if x is None else _norm_axis(ctx.attrs["axis"], len(x))
    except AttributeError_ as e:
        ctx.fail(str(e))
    if x is None:
        return [None, TensorType(stash, None), TensorType(stash, None)]
    stats = tuple(x[:axis]) + (1,) * (len(x) - axis)
    return [x, TensorType(stash, stats), TensorType(stash, stats)]


def layernorm_semantics(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None],
                        ) -> tuple[str, dict[str, Any]]:
    """Mean and inverse standard deviation over the axes from ``axis`` on, in the stash
    type; Scale and B broadcast against the trailing axes."""
    x = shapes[0]
    rank = len(x)
    axis = _norm_axis(attrs["axis"], rank)
    _, cast = _stash(attrs)
    a, b, k = _vars("a", axis), _vars("b", rank - axis), _vars("k", rank - axis)
    bounds = _join([f"b{i}:N{i}" for i in range(rank - axis)])
    keep = _join(a, [f"b{i} + k{i}*N{i}" for i in range(rank - axis)])
    zeros = _join(a, ["0"] * (rank - axis))
    full = _join(a, b)

    def affine(i: int) -> str:
        return _join((a + b)[rank - len(shapes[i]):])

    text = (f"xs[{full}] = {cast}(X[{full}])\n"
            f"Mean[{_join(a, k)}] = mean[{bounds}] xs[{keep}]\n"
            f"InvStdDev[{_join(a, k)}] = rsqrt(mean[{bounds}] (xs[{keep}] - Mean[{_join(a, k)}])"
            f" ** 2 + epsilon)\n"
            f"Y[{full}] = (xs[{full}] - Mean[{zeros}]) * InvStdDev[{zeros}] * Scale[{affine(1)}]")
    if len(shapes) > 2 and shapes[2] is not None:
        text += f" + B[{affine(2)}]"
    return text, {f"N{i}": x[axis + i] for i in range(rank - axis)}


LayerNormalization = metaop(
    "LayerNormalization", inputs=("X", "Scale", "B?"),
    outputs=("Y", "Mean?: U", "InvStdDev?: U"),
    attrs={"axis": int_(-1), "epsilon": float_(1e-5), "stash_type": int_(1)},
    types="T in {float}; U in {float32, bfloat16, float16, float64}",
    rule=_layernorm_infer, semantics=layernorm_semantics, since=(17,), **_NORM_HINTS,
)


# ---------------------------------------------------------------- LRN, MVN, LpNormalization


def lrn_semantics(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None],
                  ) -> tuple[str, dict[str, Any]]:
    """``x / (bias + alpha/size * sum of squares over channels c - (size-1)//2 ..
    c + size//2) ** beta``; channels outside read 0."""
    size = attrs["size"]
    return ("Y[n, c, ...] = X[n, c, ...] / (bias + AS * sum[i:SIZE] "
            "fill(X[n, c + i - LO, ...], 0) ** 2) ** beta",
            {"AS": attrs["alpha"] / size, "SIZE": size, "LO": (size - 1) // 2})


LRN = metaop(
    "LRN", inputs=("X",), outputs=("Y",),
    attrs={"alpha": float_(1e-4), "beta": float_(0.75), "bias": float_(1.0),
           "size": int_(REQUIRED)},
    types="T in {float}", rule=SAME_AS_FIRST, semantics=lrn_semantics, since=(1, 13),
    **_NORM_HINTS,
)


def _axes(attrs: Mapping[str, Any], rank: int, name: str = "axes") -> list[int]:
    return sorted({_norm_axis(a, rank) for a in attrs[name]})


def mvn_semantics(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None]) -> str:
    """``(X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9)`` over ``axes`` (ONNX's function body)."""
    rank = len(shapes[0])
    axes = _axes(attrs, rank)
    d = _vars("d", rank)
    kept = [v for i, v in enumerate(d) if i not in axes]
    reduced = _join([v for i, v in enumerate(d) if i in axes])
    x = f"X[{_join(d)}]"
    return (f"ex[{_join(kept)}] = mean[{reduced}] {x}\n"
            f"ex2[{_join(kept)}] = mean[{reduced}] {x} ** 2\n"
            f"Y[{_join(d)}] = ({x} - ex[{_join(kept)}]) / "
            f"(sqrt(ex2[{_join(kept)}] - ex[{_join(kept)}] ** 2) + 1e-9)")


def _mvn_infer(ctx: InferContext) -> list[Any]:
    x = ctx.shape(0)
    if x is not None:
        try:
            _axes(ctx.attrs, len(x))
        except AttributeError_ as e:
            ctx.fail(str(e))
    return [x]


MeanVarianceNormalization = metaop(
    "MeanVarianceNormalization", inputs=("X",), outputs=("Y",),
    attrs={"axes": ints((0, 2, 3))}, types="T in {float}", rule=_mvn_infer,
    semantics=mvn_semantics, since=(9, 13), **_NORM_HINTS,
)


def lpnorm_semantics(attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None]) -> str:
    """``X / ||X||_p`` along ``axis``, p in {1, 2}; 0 where the norm is 0."""
    rank = len(shapes[0])
    axis = _norm_axis(attrs["axis"], rank)
    d = _vars("d", rank)
    kept = _join(d[:axis] + d[axis + 1:])
    x = f"input[{_join(d)}]"
    norm = f"sum[{d[axis]}] abs({x})" if attrs["p"] == 1 else f"sqrt(sum[{d[axis]}] {x} ** 2)"
    return (f"nrm[{kept}] = {norm}\n"
            f"output[{_join(d)}] = where(nrm[{kept}] == 0, 0, {x} / nrm[{kept}])")


def _lpnorm_infer(ctx: InferContext) -> list[Any]:
    x = ctx.shape(0)
    if ctx.attrs["p"] not in (1, 2):
        ctx.fail(f"p={ctx.attrs['p']} must be 1 or 2")
    if x is not None:
        try:
            _norm_axis(ctx.attrs["axis"], len(x))
        except AttributeError_ as e:
            ctx.fail(str(e))
    return [x]


LpNormalization = metaop(
    "LpNormalization", inputs=("input",), outputs=("output",),
    attrs={"axis": int_(-1), "p": int_(2)}, types="T in {float}", rule=_lpnorm_infer,
    semantics=lpnorm_semantics, since=(1, 22), **_NORM_HINTS,
)

__all__ = ["STASH_TYPES", "batchnorm_semantics", "batchnorm_training_reference", "groupnorm_semantics",
           "instancenorm_semantics", "layernorm_semantics", "lpnorm_semantics",
           "lrn_semantics", "mvn_semantics"]
