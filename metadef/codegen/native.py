"""The native runtime: a program driver and the hand-written routines around BLAS.

Every native routine has the kernels' calling convention, ``void f(ptr args, ptr dims)``
(``args``: pointers; ``dims``: int64 sizes), so one driver runs a whole program of them:

- ``md_run_program(entries, n)``: calls ``entries[i].fn(entries[i].args, entries[i].dims)``
  for ``i < n``; a program is a table of such entries, prepared once per binding of the
  symbolic dims, and one ctypes call (the GIL released) runs all of it.
- ``md_sgemm``: a (batched) ``C = alpha * op(A) op(B) + beta * bias`` through the ``cblas_sgemm``
  whose address is ``args[3]`` (numpy's OpenBLAS), the bias broadcast into C first; a
  one-row product goes to the ``cblas_sgemv`` at ``args[5]`` instead (when not null).
- ``md_conv2d``: a 2-D convolution (grouped, strided, dilated, padded) as our own im2col into
  a workspace and one ``sgemm`` per image and group, the bias written into the output first;
  a 1x1 stride-1 unpadded conv reads its input in place.
- ``md_pad2d``: zero-pad the two last axes (for the generated depthwise kernels).
- ``md_copy``: copy bytes.

The module is generated with llvmlite's IR builder, compiled once per process and kept in
the compile cache like any kernel.

Example:
    >>> import ctypes, numpy as np
    >>> fns = native_functions()
    >>> src, dst = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    >>> args = (ctypes.c_void_p * 2)(src.ctypes.data, dst.ctypes.data)
    >>> dims = (ctypes.c_int64 * 1)(16)
    >>> ENTRY(fns["md_copy"])(args, dims)
    >>> dst.tolist()
    [0.0, 1.0, 2.0, 3.0]
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from collections.abc import Callable

from llvmlite import ir

from metadef.codegen.jit import compile_ir, load_object, object_code
from metadef.codegen.kernel import KernelCode, current_store
from metadef.core.errors import BackendError

ENTRY = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64))
"""The calling convention of every kernel and native routine."""

PROGRAM = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)
"""``md_run_program(entries, n)``."""

CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS = 101, 111, 112

SGEMM_DIMS = ("batch", "m", "n", "k", "lda", "ldb", "ldc", "trans_a", "trans_b", "stride_a",
              "stride_b", "stride_c", "bias_row_stride", "bias_col_stride", "has_bias", "alpha", "beta")
"""The dims of ``md_sgemm``, in order (strides in elements; alpha and beta as float32 bits)."""

CONV2D_DIMS = ("n", "c", "h", "w", "k", "oh", "ow", "kh", "kw", "sh", "sw", "dh", "dw", "pt", "pl",
               "group", "has_bias")
"""The dims of ``md_conv2d``: args are ``[x, w, y, workspace, cblas_sgemm, bias]``."""

PAD2D_DIMS = ("planes", "h", "w", "pt", "pl", "hp", "wp")
"""The dims of ``md_pad2d``: args are ``[x, padded]``."""

I64, I32, F32 = ir.IntType(64), ir.IntType(32), ir.FloatType()
PTR = ir.PointerType()
_FN = ir.FunctionType(ir.VoidType(), [PTR, PTR])
_SGEMM = ir.FunctionType(ir.VoidType(), [I32, I32, I32, I64, I64, I64, F32, PTR, I64, PTR, I64, F32, PTR, I64])
_SGEMV = ir.FunctionType(ir.VoidType(), [I32, I32, I64, I64, F32, PTR, I64, PTR, I64, F32, PTR, I64])
_LOCK = threading.Lock()


def _loop(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, body: Callable[[ir.Value], None]) -> None:
    """``for i in [start, stop): body(i)`` (nothing when stop <= start)."""
    pre = b.block
    head = b.append_basic_block("loop")
    after = b.append_basic_block("after")
    b.cbranch(b.icmp_signed("<", start, stop), head, after)
    b.position_at_end(head)
    i = b.phi(I64)
    i.add_incoming(start, pre)
    body(i)
    nxt = b.add(i, I64(1))
    i.add_incoming(nxt, b.block)
    b.cbranch(b.icmp_signed("<", nxt, stop), head, after)
    b.position_at_end(after)


def _if(b: ir.IRBuilder, cond: ir.Value, then: Callable[[], None]) -> None:
    yes = b.append_basic_block("then")
    after = b.append_basic_block("endif")
    b.cbranch(cond, yes, after)
    b.position_at_end(yes)
    then()
    b.branch(after)
    b.position_at_end(after)


def _arg(b: ir.IRBuilder, base: ir.Value, i: int, typ: ir.Type) -> ir.Value:
    return b.load(b.gep(base, [I64(i)], source_etype=typ), typ=typ)


def _elem(b: ir.IRBuilder, base: ir.Value, index: ir.Value) -> ir.Value:
    return b.gep(base, [index], source_etype=F32)


def _float_bits(b: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    return b.bitcast(b.trunc(bits, I32), F32)


def _smax(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed(">", x, y), x, y)


def _smin(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def _define(module: ir.Module, name: str) -> tuple[ir.IRBuilder, ir.Value, ir.Value]:
    fn = ir.Function(module, _FN, name)
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    return b, fn.args[0], fn.args[1]


def _program(module: ir.Module) -> None:
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, I64]), "md_run_program")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    entries, n = fn.args
    entry_type = ir.ArrayType(PTR, 3)

    def call(i: ir.Value) -> None:
        fields = [b.load(b.gep(entries, [i, I32(k)], source_etype=entry_type), typ=PTR) for k in range(3)]
        b.call(_Callee(fields[0]), [fields[1], fields[2]])

    _loop(b, I64(0), n, call)
    b.ret_void()


class _Callee(ir.Value):
    """A function pointer loaded at run time, called with ``function_type`` (llvmlite's builder
    needs the callee's type, which an opaque pointer does not carry)."""

    def __init__(self, pointer: ir.Value, function_type: ir.FunctionType = _FN) -> None:
        self.pointer = pointer
        self.type = ir.PointerType()
        self.function_type = function_type

    def get_reference(self) -> str:
        return self.pointer.get_reference()

    def __str__(self) -> str:
        return str(self.pointer)


def _copy(module: ir.Module) -> None:
    b, args, dims = _define(module, "md_copy")
    src, dst = _arg(b, args, 0, PTR), _arg(b, args, 1, PTR)
    b.call(module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64]),
           [dst, src, _arg(b, dims, 0, I64), ir.IntType(1)(0)])
    b.ret_void()


def _sgemm(module: ir.Module) -> None:
    b, args, dims = _define(module, "md_sgemm")
    a, bm, c, fn, bias, gemv = (_arg(b, args, i, PTR) for i in range(6))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(SGEMM_DIMS)}
    trans = [b.select(b.icmp_signed("!=", d[t], I64(0)), I32(CBLAS_TRANS), I32(CBLAS_NO_TRANS))
             for t in ("trans_a", "trans_b")]
    alpha, beta = _float_bits(b, d["alpha"]), _float_bits(b, d["beta"])
    has_bias = b.icmp_signed("!=", d["has_bias"], I64(0))
    callee = _Callee(fn, _SGEMM)

    def one(i: ir.Value) -> None:
        ci = _elem(b, c, b.mul(i, d["stride_c"]))

        def fill() -> None:
            def row(r: ir.Value) -> None:
                def col(q: ir.Value) -> None:
                    src = b.add(b.mul(r, d["bias_row_stride"]), b.mul(q, d["bias_col_stride"]))
                    value = b.load(_elem(b, bias, src), typ=F32)
                    b.store(value, _elem(b, ci, b.add(b.mul(r, d["ldc"]), q)))
                _loop(b, I64(0), d["n"], col)
            _loop(b, I64(0), d["m"], row)

        _if(b, has_bias, fill)
        ai, bi = _elem(b, a, b.mul(i, d["stride_a"])), _elem(b, bm, b.mul(i, d["stride_b"]))
        beta_i = b.select(has_bias, beta, F32(0.0))
        # one row (a batch-1 linear layer): sgemv, which OpenBLAS runs several times faster
        row = b.and_(b.icmp_signed("==", d["m"], I64(1)), b.icmp_signed("!=", b.ptrtoint(gemv, I64), I64(0)))
        with b.if_else(row) as (then, otherwise):
            with then:
                # c[n] = op(B)^T a: B stored [k, n] (no trans) needs Trans; B stored [n, k] NoTrans
                b_trans = b.icmp_signed("!=", d["trans_b"], I64(0))
                rows = b.select(b_trans, d["n"], d["k"])
                cols = b.select(b_trans, d["k"], d["n"])
                inc = b.select(b.icmp_signed("!=", d["trans_a"], I64(0)), d["lda"], I64(1))
                b.call(_Callee(gemv, _SGEMV), [I32(CBLAS_ROW_MAJOR), b.select(b_trans, I32(CBLAS_NO_TRANS),
                       I32(CBLAS_TRANS)), rows, cols, alpha, bi, d["ldb"], ai, inc, beta_i, ci, I64(1)])
            with otherwise:
                b.call(callee, [I32(CBLAS_ROW_MAJOR), trans[0], trans[1], d["m"], d["n"], d["k"], alpha,
                                ai, d["lda"], bi, d["ldb"], beta_i, ci, d["ldc"]])

    _loop(b, I64(0), d["batch"], one)
    b.ret_void()


def _zero(b: ir.IRBuilder, module: ir.Module, base: ir.Value, start: ir.Value, stop: ir.Value) -> None:
    count = b.sub(stop, start)

    def clear() -> None:
        b.call(module.declare_intrinsic("llvm.memset", [PTR, I64]),
               [_elem(b, base, start), ir.IntType(8)(0), b.mul(count, I64(4)), ir.IntType(1)(0)])

    _if(b, b.icmp_signed(">", count, I64(0)), clear)


def _im2col(module: ir.Module) -> ir.Function:
    """``col[(c*kh + r)*kw + s, y*ow + x] = X[c, y*sh - pt + r*dh, x*sw - pl + s*dw]`` (0 outside)."""
    names = ("cg", "h", "w", "oh", "ow", "kh", "kw", "sh", "sw", "dh", "dw", "pt", "pl")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, *(I64 for _ in names)]), "md_im2col")
    fn.linkage = "internal"
    fn.args[0].add_attribute("noalias")
    fn.args[1].add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    x, col = fn.args[0], fn.args[1]
    d = dict(zip(names, fn.args[2:]))
    pixels = b.mul(d["oh"], d["ow"])
    plane = b.mul(d["h"], d["w"])

    def channel(c: ir.Value) -> None:
        xc = _elem(b, x, b.mul(c, plane))

        def tap_row(r: ir.Value) -> None:
            def tap(s: ir.Value) -> None:
                row = b.add(b.mul(b.add(b.mul(c, d["kh"]), r), d["kw"]), s)
                shift = b.sub(b.mul(s, d["dw"]), d["pl"])  # iw = x*sw + shift
                # lo: the first x with x*sw + shift >= 0; hi: one past the last with < w
                need = b.sub(I64(0), shift)
                lo = b.select(b.icmp_signed("<=", need, I64(0)), I64(0),
                              b.sdiv(b.add(need, b.sub(d["sw"], I64(1))), d["sw"]))
                lo = _smin(b, lo, d["ow"])
                top = b.sub(b.sub(d["w"], I64(1)), shift)
                hi = b.select(b.icmp_signed("<", top, I64(0)), I64(0), b.add(b.sdiv(top, d["sw"]), I64(1)))
                hi = _smax(b, _smin(b, hi, d["ow"]), lo)
                base = _elem(b, col, b.mul(row, pixels))

                def out_row(y: ir.Value) -> None:
                    ih = b.add(b.sub(b.mul(y, d["sh"]), d["pt"]), b.mul(r, d["dh"]))
                    dst = _elem(b, base, b.mul(y, d["ow"]))
                    inside = b.and_(b.icmp_signed(">=", ih, I64(0)), b.icmp_signed("<", ih, d["h"]))
                    with b.if_else(inside) as (then, otherwise):
                        with then:
                            src = _elem(b, xc, b.add(b.mul(ih, d["w"]), shift))
                            _zero(b, module, dst, I64(0), lo)

                            def copy(q: ir.Value) -> None:
                                v = b.load(_elem(b, src, b.mul(q, d["sw"])), typ=F32)
                                b.store(v, _elem(b, dst, q))
                            _loop(b, lo, hi, copy)
                            _zero(b, module, dst, hi, d["ow"])
                        with otherwise:
                            _zero(b, module, dst, I64(0), d["ow"])

                _loop(b, I64(0), d["oh"], out_row)
            _loop(b, I64(0), d["kw"], tap)
        _loop(b, I64(0), d["kh"], tap_row)

    _loop(b, I64(0), d["cg"], channel)
    b.ret_void()
    return fn


def _conv2d(module: ir.Module, im2col: ir.Function) -> None:
    b, args, dims = _define(module, "md_conv2d")
    x, w, y, work, fn, bias = (_arg(b, args, i, PTR) for i in range(6))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(CONV2D_DIMS)}
    callee = _Callee(fn, _SGEMM)
    cg = b.sdiv(d["c"], d["group"])
    kg = b.sdiv(d["k"], d["group"])
    taps = b.mul(d["kh"], d["kw"])
    depth = b.mul(cg, taps)
    pixels = b.mul(d["oh"], d["ow"])
    plane = b.mul(d["h"], d["w"])
    ones = [b.icmp_signed("==", d[k], I64(1)) for k in ("kh", "kw", "sh", "sw")]
    zeros = [b.icmp_signed("==", d[k], I64(0)) for k in ("pt", "pl")]
    direct = ones[0]
    for flag in [*ones[1:], *zeros]:
        direct = b.and_(direct, flag)
    has_bias = b.icmp_signed("!=", d["has_bias"], I64(0))

    def image(n: ir.Value) -> None:
        def group(g: ir.Value) -> None:
            xg = _elem(b, x, b.mul(b.add(b.mul(n, d["c"]), b.mul(g, cg)), plane))
            yg = _elem(b, y, b.mul(b.add(b.mul(n, d["k"]), b.mul(g, kg)), pixels))
            with b.if_then(b.not_(direct)):
                b.call(im2col, [xg, work, cg, d["h"], d["w"], d["oh"], d["ow"], d["kh"], d["kw"],
                                d["sh"], d["sw"], d["dh"], d["dw"], d["pt"], d["pl"]])
            cols = b.select(direct, xg, work)

            def fill() -> None:
                def channel(k: ir.Value) -> None:
                    value = b.load(_elem(b, bias, b.add(b.mul(g, kg), k)), typ=F32)
                    row = _elem(b, yg, b.mul(k, pixels))

                    def pixel(p: ir.Value) -> None:
                        b.store(value, _elem(b, row, p))
                    _loop(b, I64(0), pixels, pixel)
                _loop(b, I64(0), kg, channel)

            _if(b, has_bias, fill)
            b.call(callee, [I32(CBLAS_ROW_MAJOR), I32(CBLAS_NO_TRANS), I32(CBLAS_NO_TRANS), kg, pixels, depth,
                            F32(1.0), _elem(b, w, b.mul(b.mul(g, kg), depth)), depth, cols, pixels,
                            b.select(has_bias, F32(1.0), F32(0.0)), yg, pixels])
        _loop(b, I64(0), d["group"], group)

    _loop(b, I64(0), d["n"], image)
    b.ret_void()


def _pad2d(module: ir.Module) -> None:
    b, args, dims = _define(module, "md_pad2d")
    x, out = _arg(b, args, 0, PTR), _arg(b, args, 1, PTR)
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(PAD2D_DIMS)}
    plane, padded = b.mul(d["h"], d["w"]), b.mul(d["hp"], d["wp"])

    def one(p: ir.Value) -> None:
        src, dst = _elem(b, x, b.mul(p, plane)), _elem(b, out, b.mul(p, padded))
        _zero(b, module, dst, I64(0), b.mul(d["pt"], d["wp"]))

        def row(r: ir.Value) -> None:
            line = _elem(b, dst, b.mul(b.add(r, d["pt"]), d["wp"]))
            _zero(b, module, line, I64(0), d["pl"])
            b.call(module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64]),
                   [_elem(b, line, d["pl"]), _elem(b, src, b.mul(r, d["w"])), b.mul(d["w"], I64(4)),
                    ir.IntType(1)(0)])
            _zero(b, module, line, b.add(d["pl"], d["w"]), d["wp"])
        _loop(b, I64(0), d["h"], row)
        _zero(b, module, dst, b.mul(b.add(d["pt"], d["h"]), d["wp"]), padded)

    _loop(b, I64(0), d["planes"], one)
    b.ret_void()


def native_module() -> str:
    """The IR of the native runtime module (text)."""
    module = ir.Module("md_native")
    _program(module)
    _copy(module)
    _sgemm(module)
    _conv2d(module, _im2col(module))
    _pad2d(module)
    return str(module)


NATIVE_SYMBOLS = ("md_run_program", "md_copy", "md_sgemm", "md_conv2d", "md_pad2d")


_ADDRESSES: dict[str, int] = {}


def native_functions() -> dict[str, int]:
    """The native routines' addresses: compiled on first use in this process, or linked from
    the kernel store in effect (:func:`metadef.codegen.kernel.kernel_store`, the on-disk compile
    cache), where a compile also leaves its object code."""
    if _ADDRESSES:
        return _ADDRESSES
    with _LOCK:
        if not _ADDRESSES:
            _ADDRESSES.update(_build())
    return _ADDRESSES


def _build() -> dict[str, int]:
    ir_text = native_module()
    structure = "md_native runtime\n" + hashlib.sha1(ir_text.encode()).hexdigest()
    store = current_store()
    code = store.load(structure, "md_native") if store is not None else None
    if code is not None:
        try:
            return load_object(code.object_code, list(NATIVE_SYMBOLS))
        except BackendError:  # a damaged entry: compile it again
            pass
    addresses = compile_ir(ir_text, list(NATIVE_SYMBOLS), "md_native")
    if store is not None:
        store.save(structure, "md_native", KernelCode("md_native", object_code("md_native") or b"", (), (), (), ()))
    return addresses


__all__ = ["CONV2D_DIMS", "ENTRY", "NATIVE_SYMBOLS", "PAD2D_DIMS", "PROGRAM", "SGEMM_DIMS", "native_functions",
           "native_module"]
