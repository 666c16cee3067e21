"""Building typed expression nodes: numpy's dtype rules, weak scalars, constant folding.

:func:`apply` is the one place that decides the dtype of an operator or function of the
semantic language, exactly as the reference evaluator's numpy calls would: operands are
converted to their common dtype here (explicit ``cast`` nodes), so the emitter only meets
operands of one dtype. Operations on weak Python scalars alone are folded with the
evaluator's own numpy functions.

Example:
    >>> from metadef.codegen.exprs import Load
    >>> x = Load(0, (), np.dtype("float32"))
    >>> e = apply("+", [x, Const(1)])
    >>> e.dtype.name, e.args[1]
    ('float32', Const(value=1.0, dtype=dtype('float32')))
    >>> apply("*", [Const(2), Const(3.5)])
    Const(value=7.0, dtype=None)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from metadef.codegen.dtypes import SUPPORTED, float_result
from metadef.codegen.errors import CodegenUnsupported
from metadef.codegen.exprs import Const, Node, Op
from metadef.ops.numpy_eval.functions import (
    binary_operators,
    functions,
    numpy_dtype,
    unary_operators,
)

ARITHMETIC = frozenset({"+", "-", "*", "/", "%", "**", "max", "min", "pow"})
COMPARISONS = frozenset({"<", "<=", ">", ">=", "==", "!="})
FLOAT_FUNCTIONS = frozenset({
    "exp", "expm1", "log", "sqrt", "rsqrt", "tanh", "erf", "ndtr", "sigmoid", "sin", "cos", "tan", "asin", "acos",
    "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "softplus"})
SAME_TYPE_FUNCTIONS = frozenset({"abs", "neg", "sign", "floor", "ceil", "round"})


def sample(node: Node) -> np.dtype | int | float | bool:
    """What stands for ``node`` in numpy's ``result_type``: its dtype, or its weak value."""
    if node.dtype is not None:
        return node.dtype
    return node.value if isinstance(node, Const) else 1


def common(nodes: list[Node]) -> np.dtype:
    """numpy's result dtype of the nodes (weak ones count as Python scalars)."""
    return np.result_type(*(sample(n) for n in nodes))


def convert(node: Node, dtype: np.dtype) -> Node:
    """``node`` as ``dtype``: a weak literal takes it, anything else gets a ``cast``."""
    if dtype not in SUPPORTED:
        raise CodegenUnsupported(f"dtype {dtype} has no code generation")
    if isinstance(node, Const) and node.dtype is None:
        return Const(dtype.type(node.value).item(), dtype)
    if node.dtype == dtype:
        return node
    return Op("cast", (node,), dtype)


def _fold(name: str, args: list[Node]) -> Node | None:
    if not all(isinstance(a, Const) and a.dtype is None for a in args):
        return None
    values = [a.value for a in args]  # type: ignore[attr-defined]
    if len(args) == 1 and name in unary_operators:
        result = unary_operators[name](values[0])
    elif len(args) == 2 and name in binary_operators:
        result = binary_operators[name](*values)
    else:
        result = functions[name][1](*values)
    result = result.item() if isinstance(result, np.generic) else result
    if isinstance(result, np.ndarray):
        return Const(result.item(), result.dtype)
    return Const(result)


def _same(name: str, args: list[Node], result: np.dtype | None = None) -> Node:
    dtype = common(args)
    return Op(name, tuple(convert(a, dtype) for a in args), result or dtype)


def _arithmetic(name: str, args: list[Node]) -> Node:
    dtype = common(args)
    if dtype.kind == "b" and name in ("+", "*", "max", "min"):
        name = {"+": "or", "*": "and", "max": "or", "min": "and"}[name]
    elif dtype.kind == "b":
        raise CodegenUnsupported(f"'{name}' on bool values")
    if name in ("**", "pow") and dtype.kind != "f":
        raise CodegenUnsupported(f"'{name}' on {dtype} values (integer powers)")
    if name in ("**", "pow"):
        return _power(args[0], args[1], dtype)
    return _same(name, args)


def _power(x: Node, y: Node, dtype: np.dtype) -> Node:
    """``x ** y``; a literal exponent of 1, 2, 3, 4, -1, -2 or 0.5 as products, a division or
    a square root in ``x``'s float type, as numpy and ONNX Runtime compute them (``pow`` itself
    is a scalar libm call in every vector loop: 25x slower), within two roundings of ``powf``."""
    if not isinstance(y, Const) or x.dtype is None or x.dtype.kind != "f":
        return _same("pow", [x, y], dtype)
    square = Op("*", (x, x), x.dtype)
    one = Const(1.0, x.dtype)
    powers: dict[float, Node] = {1.0: x, 2.0: square, 3.0: Op("*", (square, x), x.dtype),
                                 4.0: Op("*", (square, square), x.dtype), -1.0: Op("/", (one, x), x.dtype),
                                 -2.0: Op("/", (one, square), x.dtype), 0.5: Op("sqrt", (x,), x.dtype)}
    power = powers.get(float(y.value))
    return _same("pow", [x, y], dtype) if power is None else convert(power, dtype)


def _float_function(name: str, args: list[Node]) -> Node:
    x = args[0]
    dtype = float_result(x.dtype) if x.dtype is not None else np.dtype(np.float64)
    return Op(name, (convert(x, dtype),), dtype)


def _same_type(name: str, args: list[Node]) -> Node:
    x = args[0]
    if name in ("floor", "ceil", "round") and x.dtype is not None and x.dtype.kind != "f":
        raise CodegenUnsupported(f"{name} of {x.dtype} values")
    if name == "neg":
        name = "-"
    return Op(name, (x,), x.dtype)


def _logic(name: str, args: list[Node]) -> Node:
    boolean = np.dtype(bool)
    return Op(name, tuple(convert(a, boolean) for a in args), boolean)


def _where(name: str, args: list[Node]) -> Node:
    cond, a, b = args
    dtype = common([a, b])
    return Op("where", (convert(cond, np.dtype(bool)), convert(a, dtype), convert(b, dtype)), dtype)


def _reciprocal(name: str, args: list[Node]) -> Node:
    x = args[0]
    dtype = x.dtype if x.dtype is not None and x.dtype.kind == "f" else np.dtype(np.float64)
    return Op("/", (Const(dtype.type(1).item(), dtype), convert(x, dtype)), dtype)


def _relu(name: str, args: list[Node]) -> Node:
    return _arithmetic("max", [args[0], Const(0)])


def _isnan_isinf(name: str, args: list[Node]) -> Node:
    x = args[0]
    if x.dtype is not None and x.dtype.kind != "f":
        return Const(False, np.dtype(bool))
    return Op(name, (x,), np.dtype(bool))


def _cast(name: str, args: list[Node]) -> Node:
    return convert(args[0], numpy_dtype(name[len("cast_"):]))


def _comparison(name: str, args: list[Node]) -> Node:
    return _same(name, args, np.dtype(bool))


apply_rules: dict[str, Callable[[str, list[Node]], Node]] = {
    **dict.fromkeys(ARITHMETIC, _arithmetic),
    **dict.fromkeys(COMPARISONS, _comparison),
    **dict.fromkeys(FLOAT_FUNCTIONS, _float_function),
    **dict.fromkeys(SAME_TYPE_FUNCTIONS, _same_type),
    "and": _logic, "or": _logic, "not": _logic, "where": _where, "reciprocal": _reciprocal,
    "relu": _relu, "isnan": _isnan_isinf, "isinf": _isnan_isinf,
}
"""Operator or function name -> how to type it (casts are matched by prefix)."""


def apply(name: str, args: list[Node]) -> Node:
    """The typed node for ``name(args)`` (``-`` with one argument is negation)."""
    folded = _fold(name, args)
    if folded is not None:
        return folded
    if name == "-" and len(args) == 1:
        return _same_type("-", args)
    if name.startswith("cast_"):
        return _cast(name, args)
    rule = apply_rules.get(name)
    if rule is None:
        raise CodegenUnsupported(f"function {name} has no code generation")
    node = rule(name, args)
    if node.dtype is not None and node.dtype not in SUPPORTED:
        raise CodegenUnsupported(f"{name} gives dtype {node.dtype}, which has no code generation")
    return node


__all__ = ["apply", "apply_rules", "common", "convert", "sample"]
