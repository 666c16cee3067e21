"""The numpy implementation of every function of the semantic language.

``functions`` maps each name in :data:`metadef.ops.semantics.FUNCTION_ARITIES` (except the
access forms ``fill`` and ``inbounds``, which the evaluator handles) to ``(arity, callable)``.
Add a function by adding it to both tables.

Example:
    >>> import numpy as np
    >>> arity, relu = functions["relu"]
    >>> arity, relu(np.array([-1.0, 2.0])).tolist()
    (1, [0.0, 2.0])
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from metadef.ops.numpy_eval.labelled import ML_FLOATS
from metadef.ops.semantics import CAST_DTYPE_NAMES

_ERF_SERIES_TERMS = 80
_ERFC_FRACTION_TERMS = 80
_ERF_SWITCH = 2.5


def _as_float_work(x: Any) -> tuple[np.ndarray, np.dtype]:
    """``x`` in float64 for computing, and the float dtype to return."""
    arr = np.asarray(x)
    kind_float = arr.dtype.kind == "f" or arr.dtype in ML_FLOATS
    return arr.astype(np.float64), (arr.dtype if kind_float else np.dtype(np.float64))


def erf(x: Any) -> Any:
    """The error function, vectorized, accurate to about 1e-15 (computed in float64).

    |x| < 2.5 sums the everywhere-positive series
    ``erf(x) = 2/sqrt(pi) exp(-x^2) sum_n 2^n x^(2n+1) / (1*3*...*(2n+1))``; larger |x| use
    the continued fraction of erfc. Loops run over series terms, never over elements.

    Example:
        >>> round(float(erf(0.5)), 12)
        0.520499877813
    """
    z, out_dtype = _as_float_work(x)
    small, series, tail = _erf_parts(np.abs(z))
    result = (np.sign(z) * np.where(small, series, 1.0 - tail)).astype(out_dtype)
    return result[()] if result.ndim == 0 else result


def ndtr(x: Any) -> Any:
    """The standard normal CDF ``Phi(x) = 0.5 * erfc(-x / sqrt 2)`` (GELU is ``x * Phi(x)``),
    vectorized, in float64: relative in the lower tail too (``erfc`` from its continued
    fraction there, not ``1 + erf``).

    Example:
        >>> [round(float(v), 12) for v in ndtr([0.0, 1.0])], f"{float(ndtr(-10.0)):.6e}"
        ([0.5, 0.841344746069], '7.619853e-24')
    """
    z, out_dtype = _as_float_work(x)
    small, series, tail = _erf_parts(np.abs(z) / math.sqrt(2.0))
    erfc = np.where(small, 1.0 - series, tail)  # erfc(|z| / sqrt 2)
    result = np.where(z < 0, 0.5 * erfc, 1.0 - 0.5 * erfc)
    result = np.where(np.isnan(z), z, result).astype(out_dtype)
    return result[()] if result.ndim == 0 else result


def _erf_parts(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For ``a >= 0``: where the series holds, ``erf(a)`` by it, and ``erfc(a)`` by the
    continued fraction (for ``a`` past the switch; a placeholder value elsewhere)."""
    small = a < _ERF_SWITCH
    xs = np.where(small, a, 0.0)
    x2 = xs * xs
    term, total = xs.copy(), xs.copy()
    for n in range(1, _ERF_SERIES_TERMS):
        term = term * (2.0 * x2) / (2 * n + 1)
        total = total + term
    series = 2.0 / math.sqrt(math.pi) * np.exp(-x2) * total
    xl = np.where(small, _ERF_SWITCH, a)
    fraction = xl.copy()
    for k in range(_ERFC_FRACTION_TERMS, 0, -1):
        fraction = xl + (k / 2.0) / fraction
    with np.errstate(invalid="ignore", over="ignore"):
        tail = np.exp(-xl * xl) / (math.sqrt(math.pi) * fraction)
    return small, series, tail


def _sigmoid(x: Any) -> Any:
    return np.exp(-np.logaddexp(0, -x))


def _where(c: Any, a: Any, b: Any) -> Any:
    result = np.where(c, a, b)
    return result[()] if result.ndim == 0 else result


def numpy_dtype(name: str) -> np.dtype:
    """A dtype from its name: numpy's spelling, or ml_dtypes' (bfloat16, float8_e4m3fn, ...).

    Example:
        >>> numpy_dtype("bfloat16").name, numpy_dtype("int32").name
        ('bfloat16', 'int32')
    """
    return np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else np.dtype(name)


def _cast(dtype: np.dtype) -> Callable[[Any], Any]:
    def cast(x: Any) -> np.ndarray:
        return np.asarray(x).astype(dtype)
    return cast


functions: dict[str, tuple[int, Callable[..., Any]]] = {
    "exp": (1, np.exp), "expm1": (1, np.expm1), "log": (1, np.log), "sqrt": (1, np.sqrt),
    "rsqrt": (1, lambda x: 1 / np.sqrt(x)), "tanh": (1, np.tanh), "erf": (1, erf),
    "ndtr": (1, ndtr),    "sigmoid": (1, _sigmoid), "abs": (1, np.abs), "neg": (1, np.negative),
    "floor": (1, np.floor), "ceil": (1, np.ceil), "round": (1, np.round),  # half to even
    "sign": (1, np.sign), "sin": (1, np.sin), "cos": (1, np.cos), "tan": (1, np.tan),
    "asin": (1, np.arcsin), "acos": (1, np.arccos), "atan": (1, np.arctan),
    "sinh": (1, np.sinh), "cosh": (1, np.cosh), "asinh": (1, np.arcsinh),
    "acosh": (1, np.arccosh), "atanh": (1, np.arctanh),
    "reciprocal": (1, lambda x: np.divide(1, x)), "relu": (1, lambda x: np.maximum(x, 0)),
    "softplus": (1, lambda x: np.logaddexp(0, x)), "isnan": (1, np.isnan),
    "isinf": (1, np.isinf), "where": (3, _where), "max": (2, np.maximum),
    "min": (2, np.minimum), "pow": (2, np.power),
    **{f"cast_{name}": (1, _cast(numpy_dtype(name))) for name in CAST_DTYPE_NAMES},
}
"""name -> (arity, numpy callable). Callables keep numpy's dtype rules; Python scalars in give
numpy scalars out, which the evaluator turns back into (weak) Python scalars."""


def divide(a: Any, b: Any) -> Any:
    """``/``: true division for floats, truncation toward zero for integers (C semantics).

    Example:
        >>> divide(np.array([7, -7]), 2).tolist(), divide(np.array([7.0]), 2).tolist()
        ([3, -3], [3.5])
    """
    if np.issubdtype(np.result_type(a, b), np.integer):
        quotient = np.floor_divide(a, b)
        inexact = np.not_equal(quotient * b, a) & np.not_equal(np.less(a, 0), np.less(b, 0))
        return quotient + inexact
    return np.true_divide(a, b)


binary_operators: dict[str, Callable[[Any, Any], Any]] = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": divide,
    "%": np.mod,  # numpy's mod: the sign of the divisor (Python's rule), not C's fmod
    "**": np.power, "<": np.less, "<=": np.less_equal, ">": np.greater,
    ">=": np.greater_equal, "==": np.equal, "!=": np.not_equal,
    "and": np.logical_and, "or": np.logical_or,
}
"""Binary operator symbol -> numpy callable."""

unary_operators: dict[str, Callable[[Any], Any]] = {"-": np.negative, "not": np.logical_not}
"""Unary operator -> numpy callable."""


__all__ = ["binary_operators", "divide", "erf", "functions", "ndtr", "numpy_dtype", "unary_operators"]
