"""Symbolic dimensions (L1): expressions, parsing, relations, constraints.

Example:
    >>> from metadef.shape import sym, floordiv
    >>> str(floordiv(sym("seq") * 2, 2))
    'seq'
"""

from metadef.shape.expr import (
    Dim,
    Expr,
    add,
    ceildiv,
    evaluate,
    floordiv,
    free_symbols,
    gcd_of,
    is_static,
    max_,
    min_,
    mod,
    mul,
    sub,
    substitute,
    sym,
)
from metadef.shape.parse import parse_dim, parse_dim_with
from metadef.shape.relations import (
    Decision,
    ShapeEnv,
    SymbolInfo,
    bind_shape,
    broadcast_dim,
    broadcast_shapes,
    equal,
    evaluate_shape,
    format_shape,
)
from metadef.shape.types import TensorType, parse_type, scalar

__all__ = [
    "TensorType", "parse_type", "scalar",
    "Decision", "Dim", "Expr", "ShapeEnv", "SymbolInfo", "add", "bind_shape", "broadcast_dim",
    "broadcast_shapes", "ceildiv", "equal", "evaluate", "evaluate_shape", "floordiv",
    "format_shape", "free_symbols", "gcd_of", "is_static", "max_", "min_", "mod", "mul",
    "parse_dim", "parse_dim_with", "sub", "substitute", "sym",
]
