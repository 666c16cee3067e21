"""Max pools over 8-bit planes (see :mod:`.native`): ``md_qmaxpool``.

A quantized model's MaxPool reads the 8-bit activations as they are (the maximum commutes with
the quantization: :mod:`metadef.passes.recognize_quantized`). ``md_qmaxpool`` takes, per plane
``[h, w]`` of ``x``, the maximum over each window of ``kh x kw`` taps (strides, dilations and
padding as ONNX's MaxPool; padding never wins). At strides 1 and 2 along a row it computes 64
output pixels at a time: per tap, one masked 64-byte load (two at stride 2, the even bytes
taken), the lanes outside the image reading the smallest value, and one unsigned byte maximum
(windows up to :data:`MAX_VECTOR_KW` wide);
int8 planes are read with each byte's sign bit flipped (their order as unsigned bytes) and
flipped back when stored. Other strides go pixel by pixel. Tasks share the planes.

Example:
    >>> import ctypes, numpy as np
    >>> from metadef.codegen.native import ENTRY, native_function
    >>> x = np.arange(16, dtype=np.uint8).reshape(1, 4, 4)
    >>> y = np.empty((1, 2, 2), np.uint8)
    >>> dims = qmaxpool_dims(1, (4, 4), (2, 2), (2, 2), (2, 2), (1, 1), (0, 0), flip=False)
    >>> ENTRY(native_function("md_qmaxpool"))((ctypes.c_void_p * 2)(x.ctypes.data, y.ctypes.data),
    ...                                       (ctypes.c_int64 * len(dims))(*dims))
    >>> y.tolist()
    [[[5, 7], [13, 15]]]
"""

from __future__ import annotations

from llvmlite import ir

from metadef.codegen.host import host_target
from metadef.codegen.native_ir import I32, I64, PTR, _arg, _define, _loop, _share, _splat
from metadef.codegen.native_qconv import ByteWindows, even_bytes, lanes_between
from metadef.codegen.native_qgemm import _intrinsic

I8 = ir.IntType(8)

MAX_VECTOR_KW = 16
"""The widest window (along a row) ``md_qmaxpool`` computes 64 pixels at a time; wider ones go pixel by pixel."""

QMAXPOOL_DIMS = ("planes", "h", "w", "oh", "ow", "kh", "kw", "sh", "sw", "dh", "dw", "pt", "pl", "flip", "task",
                 "tasks")
"""The dims of ``md_qmaxpool``: args are ``[x [planes, h, w] (8-bit), y [planes, oh, ow]]``;
``pt``, ``pl``: the padding before the first row and column; ``flip``: 1 where the planes are
int8. Task ``task`` of ``tasks`` takes its share of the planes."""


def qmaxpool_dims(planes: int, hw: tuple[int, int], out_hw: tuple[int, int], kernel: tuple[int, int],
                  strides: tuple[int, int], dilations: tuple[int, int], begin: tuple[int, int], *, flip: bool,
                  task: int = 0, tasks: int = 1) -> tuple[int, ...]:
    """The dims of one ``md_qmaxpool`` call (see :data:`QMAXPOOL_DIMS`).

    Example:
        >>> qmaxpool_dims(64, (112, 112), (56, 56), (3, 3), (2, 2), (1, 1), (1, 1), flip=False)[:5]
        (64, 112, 112, 56, 56)
    """
    values = {"planes": planes, "h": hw[0], "w": hw[1], "oh": out_hw[0], "ow": out_hw[1], "kh": kernel[0],
              "kw": kernel[1], "sh": strides[0], "sw": strides[1], "dh": dilations[0], "dw": dilations[1],
              "pt": begin[0], "pl": begin[1], "flip": int(flip), "task": task, "tasks": tasks}
    return tuple(values[d] for d in QMAXPOOL_DIMS)


def _qmaxpool(module: ir.Module) -> None:
    b, args, dims = _define(module, "md_qmaxpool")
    x, y = _arg(b, args, 0, PTR), _arg(b, args, 1, PTR)
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(QMAXPOOL_DIMS)}
    first, last = _share(b, d["planes"], d)
    h, w, oh, ow, sw = d["h"], d["w"], d["oh"], d["ow"], d["sw"]
    mask = b.trunc(b.mul(d["flip"], I64(0x80)), I8)
    v64b, bit64 = ir.VectorType(I8, 64), ir.VectorType(ir.IntType(1), 64)
    load64 = _intrinsic(module, "llvm.masked.load.v64i8.p0", ir.FunctionType(v64b, [PTR, I32, bit64, v64b]))
    store64 = _intrinsic(module, "llvm.masked.store.v64i8.p0",
                         ir.FunctionType(ir.VoidType(), [v64b, PTR, I32, bit64]))
    umax64 = _intrinsic(module, "llvm.umax.v64i8", ir.FunctionType(v64b, [v64b, v64b]))
    flips = _splat(b, mask, 64)  # (a masked-off lane reads the flip itself: the smallest value once flipped)
    acc_v, acc_s = b.alloca(v64b), b.alloca(I8)  # (in the entry block: kept in registers)
    masks = b.alloca(I64, size=2 * MAX_VECTOR_KW)  # (a block's load masks, per tap along the row)
    # (without AVX-512BW's byte masks: windows of the plane, see ByteWindows)
    windows = None if host_target().has("avx512bw") else ByteWindows(module, b)
    plane_bytes = b.mul(h, w)

    def row_of(plane: ir.Value, oy: ir.Value, dy: ir.Value) -> tuple[ir.Value, ir.Value]:
        iy = b.add(b.sub(b.mul(oy, d["sh"]), d["pt"]), b.mul(dy, d["dh"]))
        inside = b.and_(b.icmp_signed(">=", iy, I64(0)), b.icmp_signed("<", iy, h))
        return inside, b.gep(plane, [b.select(inside, b.mul(iy, w), I64(0))], source_etype=I8)

    def vectors(plane: ir.Value, out: ir.Value, stride: int) -> None:
        def block(k: ir.Value) -> None:
            ox0 = b.mul(k, I64(64))
            store = lanes_between(b, I64(0), b.sub(ow, ox0))

            def start_of(dx: ir.Value) -> ir.Value:
                return b.sub(b.add(b.mul(ox0, I64(stride)), b.mul(dx, d["dw"])), d["pl"])

            def mask_at(dx: ir.Value, i: int) -> ir.Value:
                return b.gep(masks, [b.add(b.mul(dx, I64(2)), I64(i))], source_etype=I64)

            def tap_masks(dx: ir.Value) -> None:
                start = start_of(dx)
                for i in range(stride):
                    bits = lanes_between(b, b.sub(I64(-64 * i), start), b.sub(b.sub(w, start), I64(64 * i)))
                    b.store(b.bitcast(bits, I64), mask_at(dx, i))

            if windows is None:
                _loop(b, I64(0), d["kw"], tap_masks)

            def out_row(oy: ir.Value) -> None:
                acc = acc_v
                b.store(ir.Constant(v64b, [0] * 64), acc)

                def tap_row(dy: ir.Value) -> None:
                    inside, src = row_of(plane, oy, dy)
                    with b.if_then(inside):
                        def tap(dx: ir.Value) -> None:
                            start = start_of(dx)
                            at = b.gep(src, [start], source_etype=I8)
                            if windows is None:
                                parts = [b.call(load64, [b.gep(at, [I64(64 * i)], source_etype=I8), I32(1),
                                                         b.bitcast(b.load(mask_at(dx, i), typ=I64), bit64), flips])
                                         for i in range(stride)]
                            else:
                                parts = [windows.load(plane, plane_bytes, b.gep(at, [I64(64 * i)], source_etype=I8),
                                                      ir.IntType(1)(1), b.sub(I64(-64 * i), start),
                                                      b.sub(b.sub(w, start), I64(64 * i)), flips)
                                         for i in range(stride)]
                            v = parts[0] if stride == 1 else even_bytes(b, *parts, wide=windows is None)
                            b.store(b.call(umax64, [b.load(acc), b.xor(v, flips)]), acc)

                        _loop(b, I64(0), d["kw"], tap)

                _loop(b, I64(0), d["kh"], tap_row)
                at = b.gep(out, [b.add(b.mul(oy, ow), ox0)], source_etype=I8)
                if windows is None:
                    b.call(store64, [b.xor(b.load(acc), flips), at, I32(1), store])
                else:
                    windows.store([b.xor(b.load(acc), flips)], at, b.sub(ow, ox0))

            _loop(b, I64(0), oh, out_row)

        _loop(b, I64(0), b.sdiv(b.add(ow, I64(63)), I64(64)), block)

    def scalars(plane: ir.Value, out: ir.Value) -> None:
        def pixel(p: ir.Value) -> None:
            oy, ox = b.sdiv(p, ow), b.srem(p, ow)
            acc = acc_s
            b.store(I8(0), acc)

            def tap_row(dy: ir.Value) -> None:
                inside, src = row_of(plane, oy, dy)

                def tap(dx: ir.Value) -> None:
                    ix = b.add(b.sub(b.mul(ox, sw), d["pl"]), b.mul(dx, d["dw"]))
                    ok = b.and_(inside, b.and_(b.icmp_signed(">=", ix, I64(0)), b.icmp_signed("<", ix, w)))
                    v = b.xor(b.load(b.gep(src, [b.select(ok, ix, I64(0))], source_etype=I8), typ=I8), mask)
                    was = b.load(acc)
                    b.store(b.select(b.and_(ok, b.icmp_unsigned(">", v, was)), v, was), acc)

                _loop(b, I64(0), d["kw"], tap)

            _loop(b, I64(0), d["kh"], tap_row)
            b.store(b.xor(b.load(acc), mask), b.gep(out, [p], source_etype=I8))

        _loop(b, I64(0), b.mul(oh, ow), pixel)

    def plane(c: ir.Value) -> None:
        src = b.gep(x, [b.mul(c, b.mul(h, w))], source_etype=I8)
        out = b.gep(y, [b.mul(c, b.mul(oh, ow))], source_etype=I8)
        narrow = b.icmp_signed("<=", d["kw"], I64(MAX_VECTOR_KW))
        with b.if_else(b.and_(narrow, b.icmp_signed("==", sw, I64(1)))) as (one, other):
            with one:
                vectors(src, out, 1)
            with other, b.if_else(b.and_(narrow, b.icmp_signed("==", sw, I64(2)))) as (two, rest):
                with two:
                    vectors(src, out, 2)
                with rest:
                    scalars(src, out)

    _loop(b, first, last, plane)
    b.ret_void()


__all__ = ["QMAXPOOL_DIMS", "qmaxpool_dims"]
