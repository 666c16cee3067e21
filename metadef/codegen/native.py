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
- ``md_winograd3x3``: a 3x3 stride-1 conv as Winograd F(2x2, 3x3) around 16 sgemm.
- ``md_pad2d``: zero-pad the two last axes (for the generated depthwise kernels).
- ``md_copy``: copy bytes.

Each routine is its own module, generated with llvmlite's IR builder, compiled when a graph
first needs it (see :func:`native_function`) and kept in the compile cache like any kernel.

Example:
    >>> import ctypes, numpy as np
    >>> src, dst = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    >>> args = (ctypes.c_void_p * 2)(src.ctypes.data, dst.ctypes.data)
    >>> dims = (ctypes.c_int64 * 1)(16)
    >>> ENTRY(native_function("md_copy"))(args, dims)
    >>> dst.tolist()
    [0.0, 1.0, 2.0, 3.0]
"""

from __future__ import annotations

import ctypes
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

WINOGRAD_DIMS = ("n", "c", "h", "w", "k", "oh", "ow", "pt", "pl", "has_bias")
"""The dims of ``md_winograd3x3``: args are ``[x, u, y, workspace, cblas_sgemm, bias]`` with
``u`` the transformed weights ``[16, K, C]`` and a workspace of :func:`winograd_workspace`
floats."""

IM2COL_DIMS = ("c", "h", "w", "oh", "ow", "kh", "kw", "sh", "sw", "dh", "dw", "pt", "pl", "task", "tasks")
"""The dims of ``md_im2col_task``: args are ``[x, col]``; task ``task`` of ``tasks`` fills the
rows of its share of the channels (one image, one group)."""

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


def _im2col_task(module: ir.Module) -> None:
    """``md_im2col_task``: the im2col of one image, channels ``[c*t/T, c*(t+1)/T)`` (so that the
    tasks of a parallel group fill disjoint rows of the columns)."""
    im2col = _im2col(module)
    b, args, dims = _define(module, "md_im2col_task")
    x, col = _arg(b, args, 0, PTR), _arg(b, args, 1, PTR)
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(IM2COL_DIMS)}
    first = b.sdiv(b.mul(d["c"], d["task"]), d["tasks"])
    last = b.sdiv(b.mul(d["c"], b.add(d["task"], I64(1))), d["tasks"])
    rows = b.mul(first, b.mul(b.mul(d["kh"], d["kw"]), b.mul(d["oh"], d["ow"])))
    b.call(im2col, [_elem(b, x, b.mul(first, b.mul(d["h"], d["w"]))), _elem(b, col, rows), b.sub(last, first),
                    *(d[k] for k in ("h", "w", "oh", "ow", "kh", "kw", "sh", "sw", "dh", "dw", "pt", "pl"))])
    b.ret_void()


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


def _pad_plane(b: ir.IRBuilder, module: ir.Module, src: ir.Value, dst: ir.Value, h: ir.Value, w: ir.Value,
               pt: ir.Value, pl: ir.Value, hp: ir.Value, wp: ir.Value) -> None:
    """``dst[hp, wp]`` = ``src[h, w]`` placed at ``(pt, pl)`` among zeros."""
    _zero(b, module, dst, I64(0), b.mul(pt, wp))

    def row(r: ir.Value) -> None:
        line = _elem(b, dst, b.mul(b.add(r, pt), wp))
        _zero(b, module, line, I64(0), pl)
        b.call(module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64]),
               [_elem(b, line, pl), _elem(b, src, b.mul(r, w)), b.mul(w, I64(4)), ir.IntType(1)(0)])
        _zero(b, module, line, b.add(pl, w), wp)
    _loop(b, I64(0), h, row)
    _zero(b, module, dst, b.mul(b.add(pt, h), wp), b.mul(hp, wp))


def winograd_workspace(c: int, k: int, oh: int, ow: int) -> int:
    """The floats of ``md_winograd3x3``'s workspace: two regions, the first for V (then the
    whole output tiles, once V is read), the second for the padded image (then M, once the
    image is transformed).

    Example:
        >>> winograd_workspace(1, 1, 2, 2)
        32
    """
    th, tw = (oh + 1) // 2, (ow + 1) // 2
    tiles = th * tw
    return max(16 * c, 4 * k) * tiles + max(16 * k * tiles, c * (2 * th + 2) * (2 * tw + 2))


def _internal(module: ir.Module, name: str, params: list[ir.Type], noalias: tuple[int, ...]
              ) -> tuple[ir.Function, ir.IRBuilder]:
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), params), name)
    fn.linkage = "internal"
    for i in noalias:
        fn.args[i].add_attribute("noalias")
    return fn, ir.IRBuilder(fn.append_basic_block("entry"))


def _winograd_rows(module: ir.Module) -> tuple[ir.Function, ir.Function]:
    """One row of tiles each way: ``in(p, v, tw, wp, v_stride)`` transforms the 4 padded image
    rows at ``p`` into ``v[e * v_stride + tx]``; ``out(m, o, tw, o_row, m_stride, bias)`` turns
    ``m[e * m_stride + tx]`` into 2 output rows at ``o``. Separate functions with ``noalias``
    pointers, so the tile loops vectorize."""
    row_in, b = _internal(module, "md_winograd_in_row", [PTR, PTR, I64, I64, I64], (0, 1))
    p, v, tw, wp, v_stride = row_in.args

    def tile_in(tx: ir.Value) -> None:
        left = _elem(b, p, b.mul(tx, I64(2)))
        rows = [[b.load(_elem(b, left, b.add(b.mul(I64(i), wp), I64(j))), typ=F32) for j in range(4)]
                for i in range(4)]
        t = [[b.fsub(rows[0][j], rows[2][j]) for j in range(4)],
             [b.fadd(rows[1][j], rows[2][j]) for j in range(4)],
             [b.fsub(rows[2][j], rows[1][j]) for j in range(4)],
             [b.fsub(rows[1][j], rows[3][j]) for j in range(4)]]
        for r in range(4):
            values = [b.fsub(t[r][0], t[r][2]), b.fadd(t[r][1], t[r][2]),
                      b.fsub(t[r][2], t[r][1]), b.fsub(t[r][1], t[r][3])]
            for col in range(4):
                b.store(values[col], _elem(b, v, b.add(b.mul(I64(r * 4 + col), v_stride), tx)))
    _loop(b, I64(0), tw, tile_in)
    b.ret_void()

    row_out, b = _internal(module, "md_winograd_out_row", [PTR, PTR, I64, I64, I64, F32], (0, 1))
    m_row, o, tw, o_row, m_stride, beta = row_out.args

    def tile_out(tx: ir.Value) -> None:
        m = [[b.load(_elem(b, m_row, b.add(b.mul(I64(r * 4 + col), m_stride), tx)), typ=F32)
              for col in range(4)] for r in range(4)]
        s0 = [b.fadd(b.fadd(m[0][j], m[1][j]), m[2][j]) for j in range(4)]
        s1 = [b.fsub(b.fsub(m[1][j], m[2][j]), m[3][j]) for j in range(4)]
        corner = _elem(b, o, b.mul(tx, I64(2)))
        for i, srow in enumerate((s0, s1)):
            outs = [b.fadd(b.fadd(b.fadd(srow[0], srow[1]), srow[2]), beta),
                    b.fadd(b.fsub(b.fsub(srow[1], srow[2]), srow[3]), beta)]
            for j, value in enumerate(outs):
                b.store(value, _elem(b, corner, b.add(b.mul(I64(i), o_row), I64(j))))
    _loop(b, I64(0), tw, tile_out)
    b.ret_void()
    return row_in, row_out


def _winograd(module: ir.Module) -> None:
    """A 3x3 stride-1 conv as Winograd F(2x2, 3x3): per image, the input is zero-padded to
    whole tiles, each 4x4 tile becomes ``V = Bᵀ d B`` (16 values, laid out ``[16, C, tiles]``),
    16 sgemm make ``M[e] = U[e] V[e]`` (``[K, C] x [C, tiles]``), and each ``M`` tile becomes
    the 2x2 output ``Aᵀ m A`` (+ bias), written in place or, for odd output sizes, into whole
    tiles and cropped. The tile loops have no conditions, so LLVM vectorizes them (stride-2
    loads and stores). 2.25x fewer multiplications than the direct conv."""
    row_in, row_out = _winograd_rows(module)
    b, args, dims = _define(module, "md_winograd3x3")
    x, u, y, work, fn, bias = (_arg(b, args, i, PTR) for i in range(6))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(WINOGRAD_DIMS)}
    callee = _Callee(fn, _SGEMM)
    th = b.sdiv(b.add(d["oh"], I64(1)), I64(2))
    tw = b.sdiv(b.add(d["ow"], I64(1)), I64(2))
    tiles = b.mul(th, tw)
    hp, wp = b.add(b.mul(th, I64(2)), I64(2)), b.add(b.mul(tw, I64(2)), I64(2))
    plane, out_plane, padded_plane = b.mul(d["h"], d["w"]), b.mul(d["oh"], d["ow"]), b.mul(hp, wp)
    v_stride, m_stride = b.mul(d["c"], tiles), b.mul(d["k"], tiles)
    v_base = o_base = work  # the output tiles once V is read
    m_base = p_base = _elem(b, v_base, b.mul(_smax(b, b.mul(I64(16), d["c"]), b.mul(I64(4), d["k"])), tiles))
    has_bias = b.icmp_signed("!=", d["has_bias"], I64(0))
    direct = b.and_(b.icmp_signed("==", b.srem(d["oh"], I64(2)), I64(0)),
                    b.icmp_signed("==", b.srem(d["ow"], I64(2)), I64(0)))
    o_row = b.select(direct, d["ow"], b.mul(tw, I64(2)))

    def image(n: ir.Value) -> None:
        xn = _elem(b, x, b.mul(b.mul(n, d["c"]), plane))
        yn = _elem(b, y, b.mul(b.mul(n, d["k"]), out_plane))

        def pad(c: ir.Value) -> None:
            _pad_plane(b, module, _elem(b, xn, b.mul(c, plane)), _elem(b, p_base, b.mul(c, padded_plane)),
                       d["h"], d["w"], d["pt"], d["pl"], hp, wp)
        _loop(b, I64(0), d["c"], pad)

        def channel(c: ir.Value) -> None:
            pc = _elem(b, p_base, b.mul(c, padded_plane))

            def tile_row(ty: ir.Value) -> None:
                top = _elem(b, pc, b.mul(b.mul(ty, I64(2)), wp))
                b.call(row_in, [top, _elem(b, v_base, b.add(b.mul(c, tiles), b.mul(ty, tw))), tw, wp, v_stride])
            _loop(b, I64(0), th, tile_row)
        _loop(b, I64(0), d["c"], channel)

        def product(e: ir.Value) -> None:
            b.call(callee, [I32(CBLAS_ROW_MAJOR), I32(CBLAS_NO_TRANS), I32(CBLAS_NO_TRANS), d["k"], tiles, d["c"],
                            F32(1.0), _elem(b, u, b.mul(e, b.mul(d["k"], d["c"]))), d["c"],
                            _elem(b, v_base, b.mul(e, v_stride)), tiles, F32(0.0),
                            _elem(b, m_base, b.mul(e, m_stride)), tiles])
        _loop(b, I64(0), I64(16), product)

        def out_channel(k: ir.Value) -> None:
            beta = b.select(has_bias, b.load(_elem(b, bias, b.select(has_bias, k, I64(0))), typ=F32), F32(0.0))
            yk = _elem(b, yn, b.mul(k, out_plane))
            dst = b.select(direct, yk, _elem(b, o_base, b.mul(k, b.mul(tiles, I64(4)))))

            def tile_row(ty: ir.Value) -> None:
                first = _elem(b, m_base, b.add(b.mul(k, tiles), b.mul(ty, tw)))
                b.call(row_out, [first, _elem(b, dst, b.mul(b.mul(ty, I64(2)), o_row)), tw, o_row, m_stride, beta])
            _loop(b, I64(0), th, tile_row)

            def crop() -> None:
                def row(r: ir.Value) -> None:
                    b.call(module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64]),
                           [_elem(b, yk, b.mul(r, d["ow"])), _elem(b, dst, b.mul(r, o_row)),
                            b.mul(d["ow"], I64(4)), ir.IntType(1)(0)])
                _loop(b, I64(0), d["oh"], row)
            _if(b, b.not_(direct), crop)
        _loop(b, I64(0), d["k"], out_channel)

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


# ------------------------------------------------------------------------------ the pool

POOL_WORDS = 64
"""The pool's shared state, in int64 words (fields a cache line apart, see :data:`POOL`)."""

POOL = {"next": 0, "done": 8, "tasks": 16, "count": 17, "sleeping": 24, "stop": 32, "busy": 40,
        "syscall": 48, "spin": 49}
"""Word offsets of the pool's fields. ``next`` holds the generation (high 32 bits) and the
next task (low 32 bits) of the group being run: a worker takes a task only by a
compare-and-swap within the generation it saw, so it never runs a task of another group."""

FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE, SYS_FUTEX = 128, 129, 202
SPIN = 100
"""``pause`` loops a worker spins before it sleeps on the futex, unless the pool's ``spin``
word says otherwise (a few microseconds: a worker spinning through a BLAS call would take a
core from BLAS's own threads)."""


def _atomic_add(b: ir.IRBuilder, ptr: ir.Value, value: int) -> ir.Value:
    return b.atomic_rmw("add", ptr, I64(value), "seq_cst")


def _load_atomic(b: ir.IRBuilder, ptr: ir.Value, typ: ir.Type = I64) -> ir.Value:
    return b.load_atomic(ptr, "seq_cst", 8, typ=typ)


def _store_atomic(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value) -> None:
    # llvmlite's builder.store_atomic reads the pointee type, which an opaque pointer lacks
    b._insert(ir.instructions.StoreAtomicInstr(b.block, value, ptr, "seq_cst", 8))


def _pool_module(module: ir.Module) -> None:
    """``md_run_tasks(pool, groups, n)`` and ``md_worker(pool)``: a pool of worker threads
    (Python threads parked in ``md_worker``, the GIL released) that run groups of
    independent calls with the caller. ``groups`` is ``n`` pairs (a table of calls as in
    ``md_run_program``, its length): a group of one runs on the caller; a larger group is
    published to the workers, shared by compare-and-swap, and waited for. A pool already
    running another program (``busy``) leaves the caller to run everything alone."""
    pause = module.declare_intrinsic("llvm.x86.sse2.pause", fnty=ir.FunctionType(ir.VoidType(), []))
    futex = ir.FunctionType(I64, [I64], var_arg=True)
    entry_type = ir.ArrayType(PTR, 3)

    def field(b: ir.IRBuilder, pool: ir.Value, name: str) -> ir.Value:
        return b.gep(pool, [I64(POOL[name])], source_etype=I64)

    def run_task(b: ir.IRBuilder, tasks: ir.Value, i: ir.Value) -> None:
        parts = [b.load(b.gep(tasks, [i, I32(k)], source_etype=entry_type), typ=PTR) for k in range(3)]
        b.call(_Callee(parts[0]), [parts[1], parts[2]])

    def take_all(b: ir.IRBuilder, pool: ir.Value, gen: ir.Value) -> None:
        """Take tasks of generation ``gen`` by CAS until none is left; count each one done."""
        nxt, done = field(b, pool, "next"), field(b, pool, "done")
        tasks = b.inttoptr(_load_atomic(b, field(b, pool, "tasks")), PTR)
        count = _load_atomic(b, field(b, pool, "count"))
        head = b.append_basic_block("take")
        work = b.append_basic_block("work")
        after = b.append_basic_block("taken")
        b.branch(head)
        b.position_at_end(head)
        cur = _load_atomic(b, nxt)
        same = b.icmp_unsigned("==", b.lshr(cur, I64(32)), gen)
        index = b.and_(cur, I64(0xFFFFFFFF))
        left = b.and_(same, b.icmp_signed("<", index, count))
        got = b.append_basic_block("cas")
        b.cbranch(left, got, after)
        b.position_at_end(got)
        pair = b.cmpxchg(nxt, cur, b.add(cur, I64(1)), "seq_cst", "seq_cst")
        b.cbranch(b.extract_value(pair, 1), work, head)
        b.position_at_end(work)
        run_task(b, tasks, index)
        _atomic_add(b, done, 1)
        b.branch(head)
        b.position_at_end(after)

    # md_worker(pool)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), "md_worker")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    pool = fn.args[0]
    nxt = field(b, pool, "next")
    gen_word = b.gep(nxt, [I32(1)], source_etype=I32)  # the high half (little-endian)
    wait = b.append_basic_block("wait")
    b.branch(wait)
    b.position_at_end(wait)
    seen = b.phi(I64)
    seen.add_incoming(I64(0), fn.entry_basic_block)
    spin = b.append_basic_block("spin")
    b.branch(spin)
    b.position_at_end(spin)
    spins = b.phi(I64)
    spins.add_incoming(I64(0), wait)
    gen = b.lshr(_load_atomic(b, nxt), I64(32))
    stop = b.icmp_signed("!=", _load_atomic(b, field(b, pool, "stop")), I64(0))
    quit_ = b.append_basic_block("quit")
    check = b.append_basic_block("check")
    b.cbranch(stop, quit_, check)
    b.position_at_end(check)
    fresh = b.icmp_unsigned("!=", gen, seen)
    new_work = b.append_basic_block("new_work")
    idle = b.append_basic_block("idle")
    b.cbranch(fresh, new_work, idle)
    b.position_at_end(idle)
    keep_spinning = b.icmp_signed("<", spins, _load_atomic(b, field(b, pool, "spin")))
    paused = b.append_basic_block("pause")
    sleep = b.append_basic_block("sleep")
    b.cbranch(keep_spinning, paused, sleep)
    b.position_at_end(paused)
    b.call(pause, [])
    spins.add_incoming(b.add(spins, I64(1)), paused)
    b.branch(spin)
    b.position_at_end(sleep)
    sleeping = field(b, pool, "sleeping")
    _atomic_add(b, sleeping, 1)
    again = b.lshr(_load_atomic(b, nxt), I64(32))
    still = b.and_(b.icmp_unsigned("==", again, seen),
                   b.icmp_signed("==", _load_atomic(b, field(b, pool, "stop")), I64(0)))
    with b.if_then(still):
        call = _Callee(b.inttoptr(_load_atomic(b, field(b, pool, "syscall")), PTR), futex)
        b.call(call, [I64(SYS_FUTEX), gen_word, I32(FUTEX_WAIT_PRIVATE), b.trunc(seen, I32),
                      ir.Constant(PTR, None), ir.Constant(PTR, None), I32(0)])
    _atomic_add(b, sleeping, -1)
    spins.add_incoming(I64(0), b.block)
    b.branch(spin)
    b.position_at_end(new_work)
    take_all(b, pool, gen)
    seen.add_incoming(gen, b.block)
    b.branch(wait)
    b.position_at_end(quit_)
    b.ret_void()

    # md_run_tasks(pool, groups, n)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64]), "md_run_tasks")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    pool, groups, n = fn.args
    pair_type = ir.ArrayType(I64, 2)
    busy = field(b, pool, "busy")
    owned = b.extract_value(b.cmpxchg(busy, I64(0), I64(1), "seq_cst", "seq_cst"), 1)
    nxt = field(b, pool, "next")
    gen_word = b.gep(nxt, [I32(1)], source_etype=I32)

    def group(g: ir.Value) -> None:
        tasks = b.inttoptr(b.load(b.gep(groups, [g, I32(0)], source_etype=pair_type), typ=I64), PTR)
        count = b.load(b.gep(groups, [g, I32(1)], source_etype=pair_type), typ=I64)
        shared = b.and_(owned, b.icmp_signed(">", count, I64(1)))
        with b.if_else(shared) as (then, otherwise):
            with then:
                _store_atomic(b, b.ptrtoint(tasks, I64), field(b, pool, "tasks"))
                _store_atomic(b, count, field(b, pool, "count"))
                _store_atomic(b, I64(0), field(b, pool, "done"))
                gen = b.add(b.lshr(_load_atomic(b, nxt), I64(32)), I64(1))
                gen = b.and_(gen, I64(0xFFFFFFFF))
                _store_atomic(b, b.shl(gen, I64(32)), nxt)  # publish: generation, task 0
                with b.if_then(b.icmp_signed(">", _load_atomic(b, field(b, pool, "sleeping")), I64(0))):
                    call = _Callee(b.inttoptr(_load_atomic(b, field(b, pool, "syscall")), PTR), futex)
                    b.call(call, [I64(SYS_FUTEX), gen_word, I32(FUTEX_WAKE_PRIVATE), I32(0x7FFFFFFF),
                                  ir.Constant(PTR, None), ir.Constant(PTR, None), I32(0)])
                take_all(b, pool, gen)
                head = b.append_basic_block("join")
                after = b.append_basic_block("joined")
                b.branch(head)
                b.position_at_end(head)
                finished = b.icmp_signed(">=", _load_atomic(b, field(b, pool, "done")), count)
                waiting = b.append_basic_block("join_pause")
                b.cbranch(finished, after, waiting)
                b.position_at_end(waiting)
                b.call(pause, [])
                b.branch(head)
                b.position_at_end(after)
            with otherwise:
                _loop(b, I64(0), count, lambda i: run_task(b, tasks, i))

    _loop(b, I64(0), n, group)
    with b.if_then(owned):
        _store_atomic(b, I64(0), busy)
    b.ret_void()


ROUTINES: dict[str, Callable[[ir.Module], None]] = {
    "md_run_program": _program,
    "md_copy": _copy,
    "md_sgemm": _sgemm,
    "md_conv2d": lambda module: _conv2d(module, _im2col(module)),
    "md_im2col_task": _im2col_task,
    "md_winograd3x3": _winograd,
    "md_pad2d": _pad2d,
    "md_run_tasks": _pool_module,
}

MODULE_SYMBOLS = {"md_run_tasks": ("md_run_tasks", "md_worker")}
"""The symbols of a routine's module besides the routine (by the routine's name)."""

MODULE_OF = {symbol: routine for routine, symbols in MODULE_SYMBOLS.items() for symbol in symbols}
"""Each native routine and the builder of its module: routines compile one by one, when a
compiled graph needs them (a conv routine takes LLVM ~0.3 s: an MLP should not pay for it)."""

NATIVE_SYMBOLS = tuple(symbol for routine in ROUTINES for symbol in MODULE_SYMBOLS.get(routine, (routine,)))


def native_module(name: str | None = None) -> str:
    """The IR (text) of routine ``name``'s module, or of all routines in one module."""
    module = ir.Module(f"md_native_{name or 'all'}")
    for routine, build in ROUTINES.items():
        if name is None or routine == name:
            build(module)
    return str(module)


_ADDRESSES: dict[str, int] = {}


def native_function(name: str) -> int:
    """The address of native routine ``name``: compiled on first use in this process, or
    linked from the kernel store in effect (:func:`metadef.codegen.kernel.kernel_store`, the
    on-disk compile cache), where a compile also leaves its object code.

    Example:
        >>> native_function("md_copy") != 0
        True
    """
    address = _ADDRESSES.get(name)
    if address is not None:
        return address
    routine = MODULE_OF.get(name, name)
    if routine not in ROUTINES:
        raise BackendError(f"no native routine {name!r}; there are {', '.join(ROUTINES)}")
    with _LOCK:
        if name not in _ADDRESSES:
            _ADDRESSES.update(_build(routine))
    return _ADDRESSES[name]


def native_functions() -> dict[str, int]:
    """Every native routine's address (compiling those not compiled yet)."""
    return {name: native_function(name) for name in NATIVE_SYMBOLS}


def _build(name: str) -> dict[str, int]:
    symbols = list(MODULE_SYMBOLS.get(name, (name,)))
    # the cache key's environment holds a digest of codegen's source, this file included: the
    # routine's name is enough here, and a hit needs no IR at all
    structure = f"md_native runtime {name}"
    store = current_store()
    code = store.load(structure, name) if store is not None else None
    if code is not None:
        try:
            return load_object(code.object_code, symbols)
        except BackendError:  # a damaged entry: compile it again
            pass
    module = f"md_native_{name}"
    addresses = compile_ir(native_module(name), symbols, module)
    if store is not None:
        store.save(structure, name, KernelCode(name, object_code(module) or b"", (), (), (), ()))
    return addresses


__all__ = ["CONV2D_DIMS", "ENTRY", "IM2COL_DIMS", "NATIVE_SYMBOLS", "POOL", "POOL_WORDS", "ROUTINES", "PAD2D_DIMS",
           "PROGRAM", "SGEMM_DIMS", "WINOGRAD_DIMS", "native_function", "native_functions", "native_module",
           "winograd_workspace"]
