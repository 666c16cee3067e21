"""Dtypes in generated code: numpy's promotion rules (as the reference evaluator applies them)
and the LLVM type of each dtype.

A weak value (a Python literal or param) has dtype None and takes the dtype of what it meets;
numpy's ``result_type`` already knows the weak-scalar rules when given the Python value.

Example:
    >>> f32 = np.dtype("float32")
    >>> promote(f32, 0.5).name, promote(np.dtype("int32"), 0.5).name, promote(f32, None)
    ('float32', 'float64', dtype('float32'))
    >>> llvm_type(f32), llvm_type(np.dtype(bool)), memory_type(np.dtype(bool))
    ('float', 'i1', 'i8')
"""

from __future__ import annotations

import numpy as np

_LLVM_TYPES = {
    "float16": "half", "float32": "float", "float64": "double", "bool": "i1",
    "int8": "i8", "uint8": "i8", "int16": "i16", "uint16": "i16", "int32": "i32",
    "uint32": "i32", "int64": "i64", "uint64": "i64",
}
SUPPORTED = frozenset(np.dtype(name) for name in _LLVM_TYPES)
"""The dtypes generated code handles (bfloat16, float8 and complex raise CodegenUnsupported)."""

LOW_PRECISION = frozenset({np.dtype(np.float16)})
"""Float dtypes whose sums accumulate in float32 (the evaluator's rule)."""


def promote(a: np.dtype | None, b: np.dtype | int | float | bool | None) -> np.dtype | None:
    """numpy's result dtype of ``a`` with ``b`` (a dtype, or a weak Python value / None)."""
    if a is None and (b is None or not isinstance(b, np.dtype)):
        return None
    if a is None:
        return promote(b, None)  # type: ignore[arg-type]
    if b is None:
        return a
    return np.result_type(a, b)


def float_result(dtype: np.dtype | None) -> np.dtype | None:
    """The dtype numpy gives ``exp(x)`` for ``x`` of ``dtype`` (ints widen to a float)."""
    if dtype is None:
        return None
    return dtype if dtype.kind == "f" else np.result_type(dtype, np.float16)


def llvm_type(dtype: np.dtype) -> str:
    """The LLVM register type (``i1`` for bool)."""
    return _LLVM_TYPES[dtype.name]


def memory_type(dtype: np.dtype) -> str:
    """The LLVM type in memory (``i8`` for bool: numpy stores bools as bytes)."""
    return "i8" if dtype.kind == "b" else _LLVM_TYPES[dtype.name]


def is_signed(dtype: np.dtype) -> bool:
    return dtype.kind == "i"


def accumulator(op: str, dtype: np.dtype) -> tuple[np.dtype, np.dtype]:
    """(accumulation dtype, result dtype) of a reduction of values of ``dtype``."""
    if op in ("max", "min"):
        return dtype, dtype
    if dtype in LOW_PRECISION:
        return np.dtype(np.float32), dtype
    if op == "mean" and dtype.kind in "iub":
        return np.dtype(np.float64), np.dtype(np.float64)
    if dtype.kind == "b":
        return np.dtype(np.int64), np.dtype(np.int64)
    return dtype, dtype


__all__ = ["LOW_PRECISION", "SUPPORTED", "accumulator", "float_result", "is_signed",
           "llvm_type", "memory_type", "promote"]
