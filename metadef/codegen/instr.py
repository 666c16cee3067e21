"""LLVM instructions for each operator and function of the semantic language.

``op_rules[name](out, args, dtype)`` appends the instructions computing ``name`` on the
already-emitted ``args`` (one dtype, see :mod:`metadef.codegen.build`) and returns the result
register. ``out`` is anything with ``__call__(text) -> register`` (the emitter's current
block). Float32 transcendental functions call the inline versions of
:mod:`metadef.codegen.mathlib`; float16 computes them in float32, as numpy does.

Example:
    >>> lines = []
    >>> def out(text):
    ...     lines.append(text)
    ...     return f"%r{len(lines)}"
    >>> op_rules["+"](out, [("%a", F32), ("%b", F32)], F32), lines
    ('%r1', ['fadd contract float %a, %b'])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from metadef.codegen.dtypes import is_signed, llvm_type
from metadef.codegen.errors import CodegenUnsupported
from metadef.codegen.mathlib import FUNCTIONS, float_literal

F32 = np.dtype(np.float32)
BOOL = np.dtype(bool)
I64 = np.dtype(np.int64)
Arg = tuple[str, np.dtype]


class Out(Protocol):
    """Where instructions go: ``out(text)`` appends one and names its result."""

    def __call__(self, text: str) -> str: ...

    def declare(self, text: str) -> None:
        """Record a declaration (an intrinsic or libm function) the module needs."""


def constant(value: int | float | bool, dtype: np.dtype) -> str:
    """The LLVM literal of ``value`` in ``dtype``."""
    if dtype.kind == "f":
        return float_literal(float(value), dtype)
    if dtype.kind == "b":
        return "true" if value else "false"
    if isinstance(value, float) and not np.isfinite(value):  # a max-pool's -inf padding on integers
        if np.isnan(value):
            raise CodegenUnsupported(f"NaN has no {dtype} literal")
        info = np.iinfo(dtype)
        return str(info.min if value < 0 else info.max)
    return str(int(value))


def intrinsic(out: Out, name: str, dtype: np.dtype, args: list[str], count: int | None = None) -> str:
    """Call ``llvm.<name>.<type>`` (declaring it)."""
    t = llvm_type(dtype)
    suffix = {"float": "f32", "double": "f64", "half": "f16"}.get(t, t)
    extra = ", i1 false" if name == "abs" else ""
    params = ", ".join([t] * len(args)) + (", i1" if extra else "")
    out.declare(f"declare {t} @llvm.{name}.{suffix}({params})")
    joined = ", ".join(f"{t} {a}" for a in args)
    return out(f"call {t} @llvm.{name}.{suffix}({joined}{extra})")


def libm(out: Out, name: str, dtype: np.dtype, args: list[str]) -> str:
    """Call a libm function (``sinf`` for float32, ``sin`` for float64)."""
    t = llvm_type(dtype)
    symbol = name + ("f" if t == "float" else "")
    out.declare(f"declare {t} @{symbol}({', '.join([t] * len(args))}) nounwind willreturn memory(none)")
    return out(f"call {t} @{symbol}({', '.join(f'{t} {a}' for a in args)})")


def cast(out: Out, value: str, src: np.dtype, dst: np.dtype) -> str:
    """Convert a register of dtype ``src`` to ``dst`` (numpy's ``astype``)."""
    if src == dst:
        return value
    half = np.dtype(np.float16)
    f32 = np.dtype(np.float32)
    if (src == half) != (dst == half) and dst.kind != "b" and f32 not in (src, dst):
        # x86 converts half only to and from float (F16C); anything else would be a call to a
        # compiler-rt builtin (__truncdfhf2, ...) the JIT cannot resolve, which aborts the process
        if src == np.float64 and dst == half:
            raise CodegenUnsupported("float64 -> float16 needs one correctly rounded step, which x86 lacks")
        return cast(out, cast(out, value, src, f32), f32, dst)
    s, d = llvm_type(src), llvm_type(dst)
    if dst.kind == "b":
        test = "fcmp une" if src.kind == "f" else "icmp ne"
        zero = "0.0" if src.kind == "f" else "0"
        return out(f"{test} {s} {value}, {zero}")
    if src.kind == "f" and dst.kind == "f":
        grow = dst.itemsize > src.itemsize
        return out(f"{'fpext' if grow else 'fptrunc'} {s} {value} to {d}")
    if src.kind == "f":
        return out(f"{'fptosi' if is_signed(dst) else 'fptoui'} {s} {value} to {d}")
    if dst.kind == "f":
        return out(f"{'sitofp' if is_signed(src) else 'uitofp'} {s} {value} to {d}")
    if dst.itemsize == src.itemsize and src.kind != "b":
        return value
    if dst.itemsize < src.itemsize:
        return out(f"trunc {s} {value} to {d}")
    return out(f"{'sext' if is_signed(src) else 'zext'} {s} {value} to {d}")


# ------------------------------------------------------------------------- arithmetic


def _binary(float_op: str, signed_op: str, unsigned_op: str | None = None) -> Callable:
    def rule(out: Out, args: list[Arg], dtype: np.dtype) -> str:
        (a, t), (b, _) = args
        if t.kind == "f":
            return out(f"{float_op} {llvm_type(t)} {a}, {b}")
        op = signed_op if is_signed(t) or unsigned_op is None else unsigned_op
        return out(f"{op} {llvm_type(t)} {a}, {b}")
    return rule


def _int_guard(out: Out, a: str, b: str, t: np.dtype, op: str) -> str:
    """``a op b`` for integers with 0 where b is 0 (numpy's result, and no SIGFPE)."""
    ty = llvm_type(t)
    zero = out(f"icmp eq {ty} {b}, 0")
    safe = out(f"select i1 {zero}, {ty} 1, {ty} {b}")
    if is_signed(t):  # INT_MIN / -1 overflows: divide by 1 and negate instead
        minus = out(f"icmp eq {ty} {safe}, -1")
        safe = out(f"select i1 {minus}, {ty} 1, {ty} {safe}")
        raw = out(f"{op} {ty} {a}, {safe}")
        fixed = out(f"sub {ty} 0, {raw}") if op == "sdiv" else "0"
        raw = out(f"select i1 {minus}, {ty} {fixed}, {ty} {raw}")
    else:
        raw = out(f"{op} {ty} {a}, {safe}")
    return out(f"select i1 {zero}, {ty} 0, {ty} {raw}")


def _divide(out: Out, args: list[Arg], dtype: np.dtype) -> str:
    (a, t), (b, _) = args
    if t.kind == "f":
        return out(f"fdiv {llvm_type(t)} {a}, {b}")
    return _int_guard(out, a, b, t, "sdiv" if is_signed(t) else "udiv")


def _modulo(out: Out, args: list[Arg], dtype: np.dtype) -> str:
    """numpy's mod: the remainder takes the divisor's sign."""
    (a, t), (b, _) = args
    ty = llvm_type(t)
    if t.kind == "f":
        r = out(f"frem {ty} {a}, {b}")
        differ = out(f"xor i1 {out(f'fcmp olt {ty} {r}, 0.0')}, {out(f'fcmp olt {ty} {b}, 0.0')}")
        fix = out(f"and i1 {differ}, {out(f'fcmp une {ty} {r}, 0.0')}")
        return out(f"select i1 {fix}, {ty} {out(f'fadd {ty} {r}, {b}')}, {ty} {r}")
    if not is_signed(t):
        return _int_guard(out, a, b, t, "urem")
    r = _int_guard(out, a, b, t, "srem")
    differ = out(f"xor i1 {out(f'icmp slt {ty} {r}, 0')}, {out(f'icmp slt {ty} {b}, 0')}")
    fix = out(f"and i1 {differ}, {out(f'icmp ne {ty} {r}, 0')}")
    return out(f"select i1 {fix}, {ty} {out(f'add {ty} {r}, {b}')}, {ty} {r}")


def _extremum(which: str) -> Callable:
    def rule(out: Out, args: list[Arg], dtype: np.dtype) -> str:
        (a, t), (b, _) = args
        if t.kind == "f":  # NaN-propagating, like np.maximum
            return intrinsic(out, "maximum" if which == "max" else "minimum", t, [a, b])
        prefix = "s" if is_signed(t) else "u"
        return intrinsic(out, f"{prefix}{which}", t, [a, b])
    return rule


def _compare(float_pred: str, signed_pred: str, unsigned_pred: str) -> Callable:
    def rule(out: Out, args: list[Arg], dtype: np.dtype) -> str:
        (a, t), (b, _) = args
        if t.kind == "f":
            return out(f"fcmp {float_pred} {llvm_type(t)} {a}, {b}")
        pred = signed_pred if is_signed(t) else unsigned_pred
        return out(f"icmp {pred} {llvm_type(t)} {a}, {b}")
    return rule


def _negate(out: Out, args: list[Arg], dtype: np.dtype) -> str:
    a, t = args[0]
    if t.kind == "f":
        return out(f"fneg {llvm_type(t)} {a}")
    return out(f"sub {llvm_type(t)} 0, {a}")


def _absolute(out: Out, args: list[Arg], dtype: np.dtype) -> str:
    a, t = args[0]
    if t.kind == "f":
        return intrinsic(out, "fabs", t, [a])
    return a if not is_signed(t) else intrinsic(out, "abs", t, [a])


def _sign(out: Out, args: list[Arg], dtype: np.dtype) -> str:
    a, t = args[0]
    ty = llvm_type(t)
    if t.kind == "f":
        pos = out(f"select i1 {out(f'fcmp ogt {ty} {a}, 0.0')}, {ty} {constant(1, t)}, {ty} {a}")
        return out(f"select i1 {out(f'fcmp olt {ty} {a}, 0.0')}, {ty} {constant(-1, t)}, {ty} {pos}")
    above = "sgt" if is_signed(t) else "ugt"
    gt = out(f"zext i1 {out(f'icmp {above} {ty} {a}, 0')} to {ty}")
    lt = out(f"zext i1 {out(f'icmp slt {ty} {a}, 0')} to {ty}") if is_signed(t) else "0"
    return out(f"sub {ty} {gt}, {lt}")


def _logic(op: str) -> Callable:
    def rule(out: Out, args: list[Arg], dtype: np.dtype) -> str:
        if op == "not":
            return out(f"xor i1 {args[0][0]}, true")
        return out(f"{op} i1 {args[0][0]}, {args[1][0]}")
    return rule


def _where(out: Out, args: list[Arg], dtype: np.dtype) -> str:
    (c, _), (a, t), (b, _) = args
    return out(f"select i1 {c}, {llvm_type(t)} {a}, {llvm_type(t)} {b}")


# ------------------------------------------------------------------------- functions


def _in_float32(body: Callable[[Out, str], str]) -> Callable:
    """A float32 implementation, used for float16 through float32 (numpy's way)."""
    def rule(out: Out, args: list[Arg], dtype: np.dtype) -> str:
        a, t = args[0]
        if t == np.float16:
            return cast(out, body(out, cast(out, a, t, F32)), F32, t)
        return body(out, a)
    return rule


def _transcendental(name: str, double: Callable[[Out, str], str]) -> Callable:
    def float32(out: Out, a: str) -> str:
        return out(f"call float @{FUNCTIONS[name]}(float {a})")

    single = _in_float32(float32)

    def rule(out: Out, args: list[Arg], dtype: np.dtype) -> str:
        return double(out, args[0][0]) if args[0][1] == np.float64 else single(out, args, dtype)
    return rule


def _libm_function(name: str) -> Callable:
    def rule(out: Out, args: list[Arg], dtype: np.dtype) -> str:
        a, t = args[0]
        if t == np.float16:
            return cast(out, libm(out, name, F32, [cast(out, a, t, F32)]), F32, t)
        return libm(out, name, t, [a])
    return rule


def _intrinsic_function(name: str) -> Callable:
    def rule(out: Out, args: list[Arg], dtype: np.dtype) -> str:
        return intrinsic(out, name, args[0][1], [a for a, _ in args])
    return rule


def _rsqrt(out: Out, args: list[Arg], dtype: np.dtype) -> str:
    a, t = args[0]
    root = intrinsic(out, "sqrt", t, [a])
    return out(f"fdiv {llvm_type(t)} {constant(1.0, t)}, {root}")


def _sigmoid64(out: Out, a: str) -> str:
    e = libm(out, "exp", np.dtype(np.float64), [out(f"fneg double {a}")])
    return out(f"fdiv double 1.0, {out(f'fadd double {e}, 1.0')}")


def _softplus64(out: Out, a: str) -> str:
    f64 = np.dtype(np.float64)
    small = libm(out, "exp", f64, [out(f"fneg double {intrinsic(out, 'fabs', f64, [a])}")])
    pos = out(f"select i1 {out(f'fcmp ogt double {a}, 0.0')}, double {a}, double 0.0")
    return out(f"fadd double {pos}, {libm(out, 'log1p', f64, [small])}")


def _ndtr64(out: Out, a: str) -> str:
    """``0.5 * erfc(-x / sqrt 2)``: relative in the lower tail, where ``1 + erf`` cancels."""
    scaled = out(f"fmul double {a}, {constant(-0.7071067811865476, np.dtype(np.float64))}")
    return out(f"fmul double {libm(out, 'erfc', np.dtype(np.float64), [scaled])}, 0.5")


def _double_libm(name: str) -> Callable[[Out, str], str]:
    return lambda out, a: libm(out, name, np.dtype(np.float64), [a])


def _is_nan(out: Out, args: list[Arg], dtype: np.dtype) -> str:
    a, t = args[0]
    return out(f"fcmp uno {llvm_type(t)} {a}, {a}")


def _is_inf(out: Out, args: list[Arg], dtype: np.dtype) -> str:
    a, t = args[0]
    magnitude = intrinsic(out, "fabs", t, [a])
    return out(f"fcmp oeq {llvm_type(t)} {magnitude}, {constant(float('inf'), t)}")


def _cast_rule(out: Out, args: list[Arg], dtype: np.dtype) -> str:
    return cast(out, args[0][0], args[0][1], dtype)


op_rules: dict[str, Callable[[Out, list[Arg], np.dtype], str]] = {
    "+": _binary("fadd contract", "add"), "-": _binary("fsub contract", "sub"),
    "*": _binary("fmul contract", "mul"), "/": _divide, "%": _modulo,
    "max": _extremum("max"), "min": _extremum("min"), "pow": _intrinsic_function("pow"),
    "<": _compare("olt", "slt", "ult"), "<=": _compare("ole", "sle", "ule"),
    ">": _compare("ogt", "sgt", "ugt"), ">=": _compare("oge", "sge", "uge"),
    "==": _compare("oeq", "eq", "eq"), "!=": _compare("une", "ne", "ne"),
    "and": _logic("and"), "or": _logic("or"), "not": _logic("not"), "where": _where,
    "abs": _absolute, "sign": _sign, "sqrt": _intrinsic_function("sqrt"), "rsqrt": _rsqrt,
    "floor": _intrinsic_function("floor"), "ceil": _intrinsic_function("ceil"),
    "round": _intrinsic_function("roundeven"), "isnan": _is_nan, "isinf": _is_inf,
    "cast": _cast_rule,
    "exp": _transcendental("exp", _double_libm("exp")),
    "expm1": _transcendental("expm1", _double_libm("expm1")),
    "log": _transcendental("log", _double_libm("log")),
    "tanh": _transcendental("tanh", _double_libm("tanh")),
    "erf": _transcendental("erf", _double_libm("erf")),
    "ndtr": _transcendental("ndtr", _ndtr64),
    "sigmoid": _transcendental("sigmoid", _sigmoid64),
    "softplus": _transcendental("softplus", _softplus64),
    "sin": _transcendental("sin", _double_libm("sin")),
    "cos": _transcendental("cos", _double_libm("cos")),
    **{name: _libm_function(name) for name in (
        "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh")},
}
"""Operator name -> how to emit it."""


def emit_op(out: Out, name: str, args: list[Arg], dtype: np.dtype) -> str:
    """Emit ``name(args)``; unary ``-`` is negation."""
    if name == "-" and len(args) == 1:
        return _negate(out, args, dtype)
    rule = op_rules.get(name)
    if rule is None:
        raise CodegenUnsupported(f"operator {name} has no code generation")
    return rule(out, args, dtype)


__all__ = ["cast", "constant", "emit_op", "intrinsic", "libm", "op_rules"]
