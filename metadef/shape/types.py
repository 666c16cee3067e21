"""Tensor types: a dtype and a symbolic shape (``None`` when even the rank is unknown).

Example:
    >>> from metadef.shape import sym
    >>> t = TensorType(FLOAT32, (sym("batch"), 3, 224, 224))
    >>> str(t)
    'f32[batch,3,224,224]'
    >>> parse_type("f32[batch,3,224,224]") == t
    True
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from metadef.core.dtypes import FLOAT32, DType, dtype
from metadef.core.errors import DSLSyntaxError
from metadef.shape.expr import Dim, free_symbols
from metadef.shape.parse import parse_dim
from metadef.shape.relations import format_shape


@dataclass(frozen=True)
class TensorType:
    """The static type of a value: element dtype and symbolic shape."""

    dtype: DType
    shape: tuple[Dim, ...] | None

    def __post_init__(self) -> None:
        if self.shape is not None and not isinstance(self.shape, tuple):
            object.__setattr__(self, "shape", tuple(self.shape))

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        """True when every dim is a plain integer."""
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    @property
    def free_symbols(self) -> frozenset[str]:
        out: frozenset[str] = frozenset()
        for d in self.shape or ():
            out |= free_symbols(d)
        return out

    def with_shape(self, shape: Sequence[Dim] | None) -> TensorType:
        return TensorType(self.dtype, None if shape is None else tuple(shape))

    def with_dtype(self, dt: DType) -> TensorType:
        return TensorType(dt, self.shape)

    def __str__(self) -> str:
        return f"{self.dtype.short}{format_shape(self.shape)}"


_TYPE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\[(.*)\]\s*$")


def _split_top(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def parse_type(text: str) -> TensorType:
    """Parse ``f32[batch,3,224,224]``; ``f32[?]`` is an unknown rank, ``f32[]`` a scalar.

    Example:
        >>> parse_type("i64[]").shape
        ()
    """
    m = _TYPE.match(text)
    if m is None:
        raise DSLSyntaxError(f"expected a tensor type like f32[batch,3], got {text!r}")
    dt = dtype(m.group(1))
    body = m.group(2).strip()
    if body == "?":
        return TensorType(dt, None)
    if not body:
        return TensorType(dt, ())
    return TensorType(dt, tuple(parse_dim(p) for p in _split_top(body)))


def scalar(dt: DType = FLOAT32) -> TensorType:
    """The type of a rank-0 tensor."""
    return TensorType(dt, ())


__all__ = ["TensorType", "parse_type", "scalar"]
