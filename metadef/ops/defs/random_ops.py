"""Random generators: ``Bernoulli`` and ``RandomUniformLike``.

Both draw with numpy. With a ``seed`` attribute a node draws from
``numpy.random.RandomState(int(seed))`` afresh on every run, so its output is a fixed function
of the seed and the input (the same draw as ONNX's reference evaluator gives); without one it
draws from fresh entropy on every run. ONNX leaves the generator to the implementation, so no
other runtime's draws are reproduced, only the distribution: ``Bernoulli`` gives 1 with
probability ``input`` (each element its own probability, which must lie in [0, 1]) and 0
otherwise; ``RandomUniformLike`` gives values uniform in ``[low, high)`` with the input's shape.
The output dtype is the ``dtype`` attribute (an ONNX type code) when given, else the input's.

Both are opaque and declared ``pure=False``: without a seed a node is not a function of its
input, so constant folding leaves a node fed only constants to draw at run time, and
common-subexpression elimination never merges two of them.

Example:
    >>> from metadef.testing.onnx_cases import infer_text
    >>> infer_text("Bernoulli", ["f32[n,4]"], {"dtype": 9})
    ['b8[n,4]']
    >>> infer_text("RandomUniformLike", ["i64[n,4]"], {"dtype": 10})
    ['f16[n,4]']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from metadef.core.dtypes import DType, from_onnx
from metadef.core.errors import BackendError
from metadef.ops.infer import InferContext
from metadef.ops.interface import float_, int_
from metadef.ops.metaop import metaop
from metadef.ops.strategy import Role
from metadef.shape import TensorType

Arrays = list[np.ndarray | None]


def generator(seed: float | None) -> np.random.RandomState:
    """The generator of one run: seeded (the same draws every run) or from fresh entropy.

    Example:
        >>> generator(3.0).random_sample(2).tolist() == generator(3.0).random_sample(2).tolist()
        True
    """
    if seed is None or np.isnan(seed):
        return np.random.RandomState()
    return np.random.RandomState(int(seed))


def _output_dtype(ctx: InferContext, allowed: str) -> DType:
    """The ``dtype`` attribute's type (checked against the op's output types), else the input's."""
    code = ctx.attrs["dtype"]
    dtype = ctx.dtype(0) if code is None else from_onnx(code)
    if dtype not in ctx.op.interface.allowed("T2"):
        what = f"dtype={code} ({dtype.name})" if code is not None else \
            f"the input's dtype {dtype.name} (no dtype attribute)"
        ctx.fail(f"{what} is not an output type of {ctx.op.name}: {allowed}",
                 "set the dtype attribute to a float type" if code is None else "")
    return dtype


def _bernoulli_rule(ctx: InferContext) -> list[Any]:
    return [TensorType(_output_dtype(ctx, "a float, integer or bool type"), ctx.shape(0))]


def bernoulli_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
    """1 with each element's probability, else 0, in the ``dtype`` attribute's type.

    Example:
        >>> bernoulli_reference([np.array([0.0, 1.0, 1.0])], {"dtype": None, "seed": 0.0})
        array([0., 1., 1.])
    """
    p = np.asarray(inputs[0])
    if p.size and not ((p >= 0) & (p <= 1)).all():  # NaN fails this too
        raise BackendError(f"Bernoulli: the probabilities must lie in [0, 1], got values from "
                           f"{np.nanmin(p)} to {np.nanmax(p)}{' and NaN' if np.isnan(p).any() else ''}")
    dtype = p.dtype if attrs["dtype"] is None else from_onnx(attrs["dtype"]).numpy
    return np.asarray(generator(attrs["seed"]).binomial(1, p.astype(np.float64))).astype(dtype)


Bernoulli = metaop(
    "Bernoulli", inputs=("input: T1",), outputs=("output: T2",),
    attrs={"dtype": int_(None), "seed": float_(None)},
    types="T1 in {float}; T2 in {float, int, bool}", rule=_bernoulli_rule,
    reference=bernoulli_reference, role=Role.OPAQUE, since=(15, 22), pure=False,
    doc="A Bernoulli draw per element: 1 with the element's probability, else 0 (seeded: "
        "the same draw every run).",
)


def _uniform_like_rule(ctx: InferContext) -> list[Any]:
    if not ctx.attrs["low"] <= ctx.attrs["high"]:
        ctx.fail(f"low={ctx.attrs['low']} must not exceed high={ctx.attrs['high']}")
    return [TensorType(_output_dtype(ctx, "float16, bfloat16, float32 or float64"), ctx.shape(0))]


def uniform_like_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
    """Uniform values in ``[low, high)`` with the input's shape.

    Example:
        >>> y = uniform_like_reference([np.zeros((2, 3), np.float32)],
        ...                            {"dtype": None, "seed": 1.0, "low": -1.0, "high": 1.0})
        >>> y.shape, y.dtype, bool(((-1 <= y) & (y < 1)).all())
        ((2, 3), dtype('float32'), True)
    """
    x = np.asarray(inputs[0])
    dtype = x.dtype if attrs["dtype"] is None else from_onnx(attrs["dtype"]).numpy
    draw = generator(attrs["seed"]).random_sample(x.shape).astype(dtype)
    return (draw * dtype.type(attrs["high"] - attrs["low"]) + dtype.type(attrs["low"])).astype(dtype)


RandomUniformLike = metaop(
    "RandomUniformLike", inputs=("input: T1",), outputs=("output: T2",),
    attrs={"dtype": int_(None), "high": float_(1.0), "low": float_(0.0), "seed": float_(None)},
    types="T1 in {all, string}; T2 in {float}", rule=_uniform_like_rule,
    reference=uniform_like_reference, role=Role.OPAQUE, since=(1, 22), pure=False,
    doc="Values uniform in [low, high) shaped like the input (seeded: the same draw every run).",
)

__all__ = ["Bernoulli", "RandomUniformLike", "bernoulli_reference", "generator",
           "uniform_like_reference"]
