"""8-bit values to float32 and back by hand (see :mod:`.native`): ``md_widen8``, ``md_requant8``.

Around a float32 product of 8-bit operands (a ``QLinearMatMul`` of two activations: whose
integer sums float32 holds exactly, see :mod:`metadef.backends.x86.quantized_activations`):

- ``md_widen8``: ``y[i] = float(x[i]) - z`` for 8-bit ``x`` (int8 or uint8) and a float32 ``z``
  (the zero point): exact.
- ``md_requant8``: ``y[i] = clip(rint(s[i] * mult) + zy, lo, hi)`` as 8-bit, ``s`` float32: the
  reference's requantization step for step (a float32 product, rounding half to even, the zero
  point added in float32), so the bytes are the reference's.

Both are plain loops that LLVM vectorizes; task ``task`` of ``tasks`` takes its share.

Example:
    >>> import ctypes, numpy as np
    >>> from metadef.codegen.native import ENTRY, native_function
    >>> x, y = np.array([0, 7, 255], np.uint8), np.empty(3, np.float32)
    >>> dims = widen8_dims(3, signed=False, zero=7.0)
    >>> ENTRY(native_function("md_widen8"))((ctypes.c_void_p * 2)(x.ctypes.data, y.ctypes.data),
    ...                                     (ctypes.c_int64 * len(dims))(*dims))
    >>> y.tolist()
    [-7.0, 0.0, 248.0]
    >>> q = np.empty(3, np.uint8)
    >>> dims = requant8_dims(3, mult=0.5, zero=3.0, signed=False)
    >>> ENTRY(native_function("md_requant8"))((ctypes.c_void_p * 2)(y.ctypes.data, q.ctypes.data),
    ...                                       (ctypes.c_int64 * len(dims))(*dims))
    >>> q.tolist()
    [0, 3, 127]
"""

from __future__ import annotations

import struct

from llvmlite import ir

from metadef.codegen.native_ir import F32, I64, PTR, _arg, _define, _float_bits, _loop, _share

I8 = ir.IntType(8)

WIDEN8_DIMS = ("count", "signed", "zero", "task", "tasks")
"""The dims of ``md_widen8``: args are ``[x (8-bit) [count], y (float32) [count]]``; ``signed``
1 for int8; ``zero`` float32 bits."""

REQUANT8_DIMS = ("count", "mult", "zero", "signed", "task", "tasks")
"""The dims of ``md_requant8``: args are ``[s (float32) [count], y (8-bit) [count]]``; ``mult``
and ``zero`` float32 bits; ``signed`` 1 for an int8 ``y`` (clipped to [-128, 127]), else uint8
([0, 255])."""


def _bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def widen8_dims(count: int, *, signed: bool, zero: float, task: int = 0, tasks: int = 1) -> tuple[int, ...]:
    """The dims of one ``md_widen8`` call.

    Example:
        >>> widen8_dims(10, signed=True, zero=0.0)
        (10, 1, 0, 0, 1)
    """
    return count, int(signed), _bits(zero), task, tasks


def requant8_dims(count: int, *, mult: float, zero: float, signed: bool, task: int = 0,
                  tasks: int = 1) -> tuple[int, ...]:
    """The dims of one ``md_requant8`` call.

    Example:
        >>> requant8_dims(10, mult=1.0, zero=0.0, signed=False)
        (10, 1065353216, 0, 0, 0, 1)
    """
    return count, _bits(mult), _bits(zero), int(signed), task, tasks


def _widen8(module: ir.Module) -> None:
    b, args, dims = _define(module, "md_widen8")
    x, y = _arg(b, args, 0, PTR), _arg(b, args, 1, PTR)
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(WIDEN8_DIMS)}
    zero = _float_bits(b, d["zero"])
    first, last = _share(b, d["count"], d)
    signed = b.icmp_signed("!=", d["signed"], I64(0))

    def body(signed_x: bool) -> None:
        def one(i: ir.Value) -> None:
            v = b.load(b.gep(x, [i], source_etype=I8), typ=I8)
            f = b.sitofp(v, F32) if signed_x else b.uitofp(v, F32)
            b.store(b.fsub(f, zero), b.gep(y, [i], source_etype=F32))
        _loop(b, first, last, one)

    with b.if_else(signed) as (then, otherwise):
        with then:
            body(True)
        with otherwise:
            body(False)
    b.ret_void()


def _requant8(module: ir.Module) -> None:
    b, args, dims = _define(module, "md_requant8")
    s, y = _arg(b, args, 0, PTR), _arg(b, args, 1, PTR)
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(REQUANT8_DIMS)}
    mult, zero = _float_bits(b, d["mult"]), _float_bits(b, d["zero"])
    first, last = _share(b, d["count"], d)
    signed = b.icmp_signed("!=", d["signed"], I64(0))
    roundeven = module.declare_intrinsic("llvm.roundeven", [F32])
    low, high = (module.globals.get(name) or ir.Function(module, ir.FunctionType(F32, [F32, F32]), name)
                 for name in ("llvm.maxnum.f32", "llvm.minnum.f32"))

    def body(lo: float, hi: float) -> None:
        def one(i: ir.Value) -> None:
            v = b.fmul(b.load(b.gep(s, [i], source_etype=F32), typ=F32), mult)
            v = b.fadd(b.call(roundeven, [v]), zero)
            v = b.call(high, [b.call(low, [v, ir.Constant(F32, lo)]), ir.Constant(F32, hi)])
            b.store(b.trunc(b.fptosi(v, ir.IntType(32)), I8), b.gep(y, [i], source_etype=I8))
        _loop(b, first, last, one)

    with b.if_else(signed) as (then, otherwise):
        with then:
            body(-128.0, 127.0)
        with otherwise:
            body(0.0, 255.0)
    b.ret_void()


__all__ = ["REQUANT8_DIMS", "WIDEN8_DIMS", "requant8_dims", "widen8_dims"]
