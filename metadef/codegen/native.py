"""The native runtime: a program driver and the hand-written routines around BLAS.

Every native routine has the kernels' calling convention, ``void f(ptr args, ptr dims)``
(``args``: pointers; ``dims``: int64 sizes), so one driver runs a whole program of them:

- ``md_run_program(entries, n)``: calls ``entries[i].fn(entries[i].args, entries[i].dims)``
  for ``i < n``; a program is a table of such entries, prepared once per binding of the
  symbolic dims, and one ctypes call (the GIL released) runs all of it. ``md_run_sequence``
  does the same with the routines' convention (``args[0]``: the entries, ``dims[0]``: their
  count): a task of the worker pool that is several calls in order.
- ``md_sgemm``: a (batched) ``C = alpha * op(A) op(B) + beta * bias`` through the ``cblas_sgemm``
  whose address is ``args[3]`` (numpy's OpenBLAS), the bias broadcast into C first; a
  one-row product goes to the ``cblas_sgemv`` at ``args[5]`` instead (when not null).
- ``md_conv2d``: a 2-D convolution (grouped, strided, dilated, padded) as our own im2col into
  a workspace and one ``sgemm`` per image and group, the bias written into the output first;
  a 1x1 stride-1 unpadded conv reads its input in place.
- ``md_col2im``: ConvTranspose's columns (``W^T X`` by sgemm) added into the output planes.
- ``md_winograd_in`` / ``md_winograd_out``: the transforms of a 3x3 stride-1 conv as Winograd
  F(2x2, 3x3), around 16 products; ``md_winograd4_in`` / ``_out`` as F(4x4, 3x3), around 36
  (:mod:`.native_winograd`); ``md_winograd_rows_in`` ... ``md_winograd4_rows_out`` the same
  between pixel-major values, a vector of channels at a time (:mod:`.native_winograd_rows`).
- ``md_conv1x1``: a pointwise conv by our own register-tiled kernel, bias, residual and
  activation applied before the store (:mod:`.native_gemm`); ``md_conv1x1t`` the same with
  the pixels as the tile's rows (small images: a 7x7 plane is 49 rows, not four 16-pixel blocks).
- ``md_transpose``: each image's ``[rows, cols]`` matrix transposed, 8 x 8 blocks in registers.
- ``md_gemm``: a product with constant weights, ``act(X W + bias)``, by the same micro-kernel
  (for few rows: a batch-8 linear layer), weights packed once.
- ``md_qgemm``: a quantized product (8-bit activations, constant int8 weights) on AVX512-VNNI's
  dot products, requantized to 8 bits in its stores (:mod:`.native_qgemm`; ``md_qgemmf`` the same
  scaled to float32, a run-time ``a_scale`` and zero point: ``MatMulIntegerToFloat``); ``md_qconv`` the same for a
  quantized conv's output channels over its pixels (``md_qconvi``: ConvInteger's int32 sums), ``md_qpack``
  its input (taps) packed for it;
  ``md_qconvt`` the same with the pixels as the tile's rows (small planes); ``md_qmaxpool`` an 8-bit
  MaxPool (:mod:`.native_qpool`).
- ``md_bmm``: a batched product of two activations (attention's ``Q Kᵀ`` and ``P V``) by the
  same micro-kernel, each item's second operand packed on the stack (:mod:`.native_bmm`);
  ``md_softmax_rows`` the softmax between them, the mask added, which Softmax nodes over rows
  run too, and ``md_log_softmax_rows`` (:mod:`.native_softmax`).
- ``md_resize2d``: a linear or cubic Resize of planes from per-axis tap tables (:mod:`.native_resize`).
- ``md_lookup``: 8-bit values looked up in a 256-entry table, 64 at a time by ``vpermi2b``
  where the table is of bytes and the host has AVX512-VBMI (:mod:`.native_lookup`).
- ``md_widen8``, ``md_requant8``: 8-bit values to float32 less their zero point, and float32
  sums requantized to 8 bits as the reference does (:mod:`.native_q8`).
- ``md_topk_rows``: TopK along rows, each row's best k kept sorted on the stack (:mod:`.native_topk`).
- ``md_rnn_cell`` / ``md_gru_cell`` / ``md_lstm_cell``: one time step of the cells after their products
  (:mod:`.native_recurrent`).
- ``md_depthwise``: a 3x3 depthwise conv, padding skipped in place, bias and bounds applied
  (:mod:`.native_depthwise`); ``md_maxpool3x3`` the same walk taking each window's maximum;
  ``md_depthwise5`` / ``md_depthwise7`` its padded walk for 5x5 and 7x7 windows, ``md_maxpool5x5`` /
  ``md_maxpool7x7`` the same taking maxima; ``md_depthwise_rows``: a depthwise conv of any square
  window on pixel-major values, vectorized along the channels, ``md_depthwise_rows3`` its 3x3
  form (:mod:`.native_dwrows`).
- ``md_pad2d``: zero-pad the two last axes (for the generated depthwise kernels).
- ``md_copy``: copy bytes; ``md_copy_rows``: copy rows of bytes between two strides (Concat,
  Split, Slice: each part a block of every row of the whole, or the reverse).
- ``md_gather_planes``: every plane's 32-bit elements picked by one index table (a nearest
  Resize: the table says which input pixel each output pixel copies); ``md_map_rows`` the same
  for a map that picks whole rows and keeps a block of columns (a reflect Pad: rows copied).
- ``md_fill``: fill bytes with copies of one element (Pad's constant), in doubling copies.
- ``md_gather``: Gather's rows picked by int32/int64 indices, each checked: an index out of
  range writes zeros and is reported in a status word the caller reads after the run.
- ``md_gather_elements`` / ``md_scatter_elements``, ``md_gather_nd`` / ``md_scatter_nd``:
  GatherElements, ScatterElements, GatherND and ScatterND, every index checked the same way;
  ``md_scatter_elements_reduce`` / ``md_scatter_nd_reduce`` the scatters with a reduction
  (:mod:`.native_scatter`).

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
import functools
import threading
from collections.abc import Callable

from llvmlite import ir

from metadef.codegen.host import generate
from metadef.codegen.kernel import KernelCode, current_store, load_or_claim, release
from metadef.codegen.link import load_object
from metadef.codegen.native_bmm import BMM_DIMS, _bmm
from metadef.codegen.native_conv import (
    COL2IM_DIMS,
    CONV2D_DIMS,
    IM2COL_DIMS,
    PAD2D_DIMS,
    _col2im,
    _conv2d,
    _im2col,
    _im2col_task,
    _pad2d,
)
from metadef.codegen.native_depthwise import (
    DEPTHWISE_DIMS,
    DEPTHWISE_KERNELS,
    _depthwise,
    depthwise_routine,
    maxpool_routine,
)
from metadef.codegen.native_direct import _conv_direct
from metadef.codegen.native_dwrows import DWROWS_ROUTINES, _depthwise_rows
from metadef.codegen.native_gemm import CONV1X1_DIMS, GEMM_DIMS, _conv1x1, _conv1x1t, _gemm, _transpose
from metadef.codegen.native_ir import (
    _SGEMM,
    _SGEMV,
    CBLAS_NO_TRANS,
    CBLAS_ROW_MAJOR,
    CBLAS_TRANS,
    F32,
    I32,
    I64,
    PTR,
    _arg,
    _Callee,
    _define,
    _elem,
    _float_bits,
    _if,
    _loop,
    _share,
)
from metadef.codegen.native_lookup import _lookup
from metadef.codegen.native_pool import POOL, POOL_WORDS, _pool_module
from metadef.codegen.native_q8 import _requant8, _widen8
from metadef.codegen.native_qconv import _qconv, _qconvt, _qpack
from metadef.codegen.native_qgemm import _qgemm, _qgemmf
from metadef.codegen.native_qpool import _qmaxpool
from metadef.codegen.native_recurrent import CELL_ROUTINES, _recurrent_cell
from metadef.codegen.native_resize import _resize2d
from metadef.codegen.native_scatter import (
    SCATTER_BUILDERS,
    SCATTER_ROUTINES,
)
from metadef.codegen.native_softmax import _log_softmax_rows, _softmax_rows
from metadef.codegen.native_topk import _topk_rows
from metadef.codegen.native_winograd import WINOGRAD_DIMS, WINOGRAD_TASK_DIMS, _winograd_phases, winograd_workspace
from metadef.codegen.native_winograd_rows import WINOGRAD_ROWS_ROUTINES, winograd_rows_phase
from metadef.core.errors import BackendError

ENTRY = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64))
"""The calling convention of every kernel and native routine."""

PROGRAM = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)
"""``md_run_program(entries, n)``."""

SGEMM_DIMS = ("batch", "m", "n", "k", "lda", "ldb", "ldc", "trans_a", "trans_b", "stride_a",
              "stride_b", "stride_c", "bias_row_stride", "bias_col_stride", "has_bias", "alpha", "beta",
              "split", "task", "tasks")
"""The dims of ``md_sgemm``, in order (strides in elements; alpha and beta as float32 bits).
Task ``task`` of ``tasks`` computes its share of the batch (``split`` 0), of the columns of C
(1) or of its rows (2), so one product splits across the worker pool."""

_LOCK = threading.Lock()


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

    # md_run_sequence(args, dims): the entries at args[0], dims[0] of them, in order: one task
    # of a pool group that runs several calls one after the other (each reads what the one
    # before wrote)
    b, args, dims = _define(module, "md_run_sequence")
    b.call(fn, [_arg(b, args, 0, PTR), _arg(b, dims, 0, I64)])
    b.ret_void()


def _copy(module: ir.Module) -> None:
    b, args, dims = _define(module, "md_copy")
    src, dst = _arg(b, args, 0, PTR), _arg(b, args, 1, PTR)
    b.call(module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64]),
           [dst, src, _arg(b, dims, 0, I64), ir.IntType(1)(0)])
    b.ret_void()


COPY_ROWS_DIMS = ("rows", "row_bytes", "src_stride", "dst_stride")
"""The dims of ``md_copy_rows`` (in bytes): row ``r``'s ``row_bytes`` go from
``src + r * src_stride`` to ``dst + r * dst_stride``."""


def _copy_rows(module: ir.Module) -> None:
    b, args, dims = _define(module, "md_copy_rows")
    src, dst = _arg(b, args, 0, PTR), _arg(b, args, 1, PTR)
    rows, row_bytes, src_stride, dst_stride = (_arg(b, dims, i, I64) for i in range(len(COPY_ROWS_DIMS)))
    memcpy = module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
    byte = ir.IntType(8)

    def row(r: ir.Value) -> None:
        to = b.gep(dst, [b.mul(r, dst_stride)], source_etype=byte)
        b.call(memcpy, [to, b.gep(src, [b.mul(r, src_stride)], source_etype=byte), row_bytes, ir.IntType(1)(0)])

    _loop(b, I64(0), rows, row)
    b.ret_void()


GATHER_PLANES_DIMS = ("planes", "in_plane", "out_plane", "task", "tasks")
"""The dims of ``md_gather_planes(x, table, y)``: ``y[p, j] = x[p, table[j]]`` for 32-bit
elements, ``table`` ``out_plane`` int32 indices below ``in_plane`` (the caller's promise); task
``task`` of ``tasks`` does its share of the planes."""


def _gather_planes(module: ir.Module) -> None:
    b, args, dims = _define(module, "md_gather_planes")
    x, table, y = (_arg(b, args, i, PTR) for i in range(3))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(GATHER_PLANES_DIMS)}
    first, last = _share(b, d["planes"], d)

    def plane(p: ir.Value) -> None:
        src, dst = _elem(b, x, b.mul(p, d["in_plane"])), _elem(b, y, b.mul(p, d["out_plane"]))

        def one(j: ir.Value) -> None:
            at = b.sext(b.load(b.gep(table, [j], source_etype=I32), typ=I32), I64)
            b.store(b.load(_elem(b, src, at), typ=F32), _elem(b, dst, j))

        _loop(b, I64(0), d["out_plane"], one)

    _loop(b, first, last, plane)
    b.ret_void()


MAP_ROWS_DIMS = ("planes", "h", "w", "oh", "ow", "left", "task", "tasks")
"""The dims of ``md_map_rows(x, row_map, col_map, y)``: ``y[p, r, c] = x[p, row_map[r],
col_map[c]]`` for 32-bit elements (int32 maps), where ``col_map`` is the identity on the ``w``
columns from ``left``: those copied as one block a row, the few others one at a time (a
reflect, edge or wrap Pad)."""


def _map_rows(module: ir.Module) -> None:
    b, args, dims = _define(module, "md_map_rows")
    x, row_map, col_map, y = (_arg(b, args, i, PTR) for i in range(4))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(MAP_ROWS_DIMS)}
    memcpy = module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
    first, last = _share(b, d["planes"], d)
    h, w, oh, ow, left = d["h"], d["w"], d["oh"], d["ow"], d["left"]

    def entry(table: ir.Value, i: ir.Value) -> ir.Value:
        return b.sext(b.load(b.gep(table, [i], source_etype=I32), typ=I32), I64)

    def row(p: ir.Value, r: ir.Value) -> None:
        src = _elem(b, x, b.add(b.mul(p, b.mul(h, w)), b.mul(entry(row_map, r), w)))
        dst = _elem(b, y, b.mul(b.add(b.mul(p, oh), r), ow))

        def one(i: ir.Value) -> None:
            b.store(b.load(_elem(b, src, entry(col_map, i)), typ=F32), _elem(b, dst, i))

        _loop(b, I64(0), left, one)
        b.call(memcpy, [_elem(b, dst, left), src, b.mul(w, I64(4)), ir.IntType(1)(0)])
        _loop(b, b.add(left, w), ow, one)

    _loop(b, first, last, lambda p: _loop(b, I64(0), oh, lambda r: row(p, r)))
    b.ret_void()


FILL_DIMS = ("total_bytes", "itemsize")
"""The dims of ``md_fill(value, dst)``: ``dst``'s ``total_bytes`` (a multiple of ``itemsize``)
become copies of the ``itemsize`` bytes at ``value``."""


def _fill(module: ir.Module) -> None:
    b, args, dims = _define(module, "md_fill")
    value, dst = _arg(b, args, 0, PTR), _arg(b, args, 1, PTR)
    total, itemsize = (_arg(b, dims, i, I64) for i in range(len(FILL_DIMS)))
    memcpy = module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
    false = ir.IntType(1)(0)
    filled = b.alloca(I64)
    with b.if_then(b.icmp_signed(">=", total, itemsize)):
        b.call(memcpy, [dst, value, itemsize, false])
        b.store(itemsize, filled)
        head, body, done = (b.append_basic_block(n) for n in ("fill_head", "fill_body", "fill_done"))
        b.branch(head)
        b.position_at_end(head)
        have = b.load(filled, typ=I64)
        b.cbranch(b.icmp_signed("<", have, total), body, done)
        b.position_at_end(body)  # the bytes written so far, copied after themselves
        count = b.select(b.icmp_signed("<", have, b.sub(total, have)), have, b.sub(total, have))
        b.call(memcpy, [b.gep(dst, [have], source_etype=ir.IntType(8)), dst, count, false])
        b.store(b.add(have, count), filled)
        b.branch(head)
        b.position_at_end(done)
    b.ret_void()


GATHER_DIMS = ("outer", "rows", "count", "inner_bytes", "index_bytes")
"""The dims of ``md_gather(data, indices, out, status)``: ``data`` is ``[outer, rows, inner]``
(``inner_bytes`` a row), ``indices`` ``count`` int32 or int64 (``index_bytes`` 4 or 8), ``out``
``[outer, count, inner]``. An index below ``-rows`` or from ``rows`` up (negative ones count
from the end) gets a row of zeros, and ``status[0] = 1, status[1] = the index``."""


def _gather(module: ir.Module) -> None:
    b, args, dims = _define(module, "md_gather")
    data, indices, out, status = (_arg(b, args, i, PTR) for i in range(4))
    outer, rows, count, inner, index_bytes = (_arg(b, dims, i, I64) for i in range(len(GATHER_DIMS)))
    memcpy = module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
    memset = module.declare_intrinsic("llvm.memset", [PTR, I64])
    byte, i32 = ir.IntType(8), ir.IntType(32)
    wide = b.icmp_signed("==", index_bytes, I64(8))

    def image(o: ir.Value) -> None:
        src = b.gep(data, [b.mul(o, b.mul(rows, inner))], source_etype=byte)
        dst = b.gep(out, [b.mul(o, b.mul(count, inner))], source_etype=byte)

        def one(j: ir.Value) -> None:
            with b.if_else(wide) as (as_i64, as_i32):
                with as_i64:
                    v64, in64 = b.load(b.gep(indices, [j], source_etype=I64), typ=I64), b.block
                with as_i32:
                    v32, in32 = b.sext(b.load(b.gep(indices, [j], source_etype=i32), typ=i32), I64), b.block
            raw = b.phi(I64)
            raw.add_incoming(v64, in64)
            raw.add_incoming(v32, in32)
            index = b.select(b.icmp_signed("<", raw, I64(0)), b.add(raw, rows), raw)
            inside = b.and_(b.icmp_signed(">=", index, I64(0)), b.icmp_signed("<", index, rows))
            to = b.gep(dst, [b.mul(j, inner)], source_etype=byte)
            with b.if_else(inside) as (good, bad):
                with good:
                    b.call(memcpy, [to, b.gep(src, [b.mul(index, inner)], source_etype=byte), inner,
                                    ir.IntType(1)(0)])
                with bad:
                    b.call(memset, [to, byte(0), inner, ir.IntType(1)(0)])
                    b.store(I64(1), b.gep(status, [I64(0)], source_etype=I64))
                    b.store(raw, b.gep(status, [I64(1)], source_etype=I64))

        _loop(b, I64(0), count, one)

    _loop(b, I64(0), outer, image)
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
    ta, tb = (b.icmp_signed("!=", d[t], I64(0)) for t in ("trans_a", "trans_b"))

    def share(extent: ir.Value, axis: int) -> tuple[ir.Value, ir.Value]:
        """This task's [first, last) of ``extent`` when the split is along ``axis``, else all."""
        mine = b.icmp_signed("==", d["split"], I64(axis))
        first = b.sdiv(b.mul(extent, d["task"]), d["tasks"])
        last = b.sdiv(b.mul(extent, b.add(d["task"], I64(1))), d["tasks"])
        return b.select(mine, first, I64(0)), b.select(mine, last, extent)

    b0, b1 = share(d["batch"], 0)
    j0, j1 = share(d["n"], 1)
    i0, i1 = share(d["m"], 2)
    m, n = b.sub(i1, i0), b.sub(j1, j0)
    # the task's block: rows i0.. of A (a column offset when A is stored transposed) and C,
    # columns j0.. of B (a row offset when B is stored transposed) and C
    a = _elem(b, a, b.select(ta, i0, b.mul(i0, d["lda"])))
    bm = _elem(b, bm, b.select(tb, b.mul(j0, d["ldb"]), j0))
    c = _elem(b, c, b.add(b.mul(i0, d["ldc"]), j0))
    bias = _elem(b, bias, b.add(b.mul(i0, d["bias_row_stride"]), b.mul(j0, d["bias_col_stride"])))
    d = {**d, "m": m, "n": n}

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

    _loop(b, b0, b1, one)
    b.ret_void()


INPLACE_VARIANTS = tuple(f"{name}_inplace{s}" for name in ("md_depthwise", "md_maxpool3x3") for s in (1, 2))
"""``md_depthwise`` and ``md_maxpool3x3`` for planes read in place at stride 1 or 2 only
(:func:`.native_depthwise.in_place`): a model whose planes all are needs none of the rest."""
WIDE_DEPTHWISE = tuple(name(k) for k in DEPTHWISE_KERNELS if k != 3 for name in (depthwise_routine, maxpool_routine))
"""``md_depthwise5``, ``md_depthwise7``, ``md_maxpool5x5``, ``md_maxpool7x7``: the padded walk of
``md_depthwise`` and ``md_maxpool3x3`` with larger windows."""

ROUTINES: dict[str, Callable[[ir.Module], None]] = {
    "md_run_program": _program,
    "md_copy": _copy,
    "md_copy_rows": _copy_rows,
    "md_gather": _gather,
    **SCATTER_BUILDERS,
    "md_fill": _fill,
    "md_gather_planes": _gather_planes,
    "md_map_rows": _map_rows,
    "md_col2im": _col2im,
    "md_sgemm": _sgemm,
    "md_conv2d": lambda module: _conv2d(module, _im2col(module)),
    "md_im2col_task": _im2col_task,
    "md_winograd_in": lambda module: _winograd_phases(module, ("in",)),
    "md_winograd_out": lambda module: _winograd_phases(module, ("out",)),
    "md_winograd4_in": lambda module: _winograd_phases(module, ("in",), m=4),
    "md_winograd4_out": lambda module: _winograd_phases(module, ("out",), m=4),
    **{name: functools.partial(winograd_rows_phase, name=name) for name in WINOGRAD_ROWS_ROUTINES},
    "md_pad2d": _pad2d,
    "md_conv1x1": _conv1x1,
    "md_conv1x1t": _conv1x1t,
    "md_conv_direct": _conv_direct,
    "md_transpose": _transpose,
    "md_gemm": _gemm,
    "md_qgemm": _qgemm,
    "md_qgemmf": _qgemmf,
    "md_qconv": _qconv,
    "md_qconvi": functools.partial(_qconv, ints=True),
    "md_qpack": _qpack,
    "md_qconvt": _qconvt,
    "md_qmaxpool": _qmaxpool,
    "md_bmm": _bmm,
    "md_softmax_rows": _softmax_rows,
    "md_resize2d": _resize2d,
    "md_topk_rows": _topk_rows,
    "md_lookup": _lookup,
    "md_widen8": _widen8,
    "md_requant8": _requant8,
    "md_log_softmax_rows": _log_softmax_rows,
    **{name: functools.partial(_recurrent_cell, name=name) for name in CELL_ROUTINES},
    "md_depthwise": _depthwise,
    "md_maxpool3x3": lambda module: _depthwise(module, pool=True),
    **{f"md_depthwise_inplace{s}": functools.partial(_depthwise, only_in_place=s) for s in (1, 2)},
    **{f"md_maxpool3x3_inplace{s}": functools.partial(_depthwise, pool=True, only_in_place=s) for s in (1, 2)},
    **{depthwise_routine(k): functools.partial(_depthwise, k=k) for k in DEPTHWISE_KERNELS if k != 3},
    **{maxpool_routine(k): functools.partial(_depthwise, pool=True, k=k) for k in DEPTHWISE_KERNELS if k != 3},
    **{name: functools.partial(_depthwise_rows, window=int(name[17:]) if name[17:] else None)
       for name in DWROWS_ROUTINES},
    "md_run_tasks": _pool_module,
}

UNROLLED_BY_HAND = frozenset({"md_conv1x1", "md_conv1x1t", "md_conv_direct", "md_gemm", "md_qgemm", "md_qgemmf",
                              "md_qconv", "md_qconvi", "md_qconvt", "md_bmm", "md_depthwise", *DWROWS_ROUTINES,
                              "md_maxpool3x3", *INPLACE_VARIANTS, *WIDE_DEPTHWISE, "md_sgemm",
                              "md_winograd_in", "md_winograd_out", "md_winograd4_in", "md_winograd4_out",
                              *WINOGRAD_ROWS_ROUTINES, "md_softmax_rows", "md_log_softmax_rows", *SCATTER_ROUTINES})
"""Routines whose tiles are written out already: LLVM's unroller would only multiply their
code (md_gemm: 0.36 s of LLVM with it); md_sgemm, whose one loop broadcasts a bias into the
output before OpenBLAS runs (vectorized still; 127 -> 71 ms of LLVM); the softmax routines,
whose bodies unroll their own loops (md_softmax_rows with its log form as four bodies: 470 ->
141 ms of LLVM, the same speed); the gathers and scatters, whose loops are written per element
size (md_scatter_nd_reduce 330 -> 130 ms of LLVM)."""
VECTORIZED_BY_HAND = frozenset({"md_qpack", "md_depthwise", *DWROWS_ROUTINES, "md_maxpool3x3", *INPLACE_VARIANTS,
                                *WIDE_DEPTHWISE,
                                "md_transpose", "md_qmaxpool",
                                "md_pad2d", "md_run_program", "md_run_tasks", "md_winograd_out", "md_copy_rows",
                                "md_gather", "md_fill", "md_bmm", "md_im2col_task", "md_winograd_in", "md_winograd4_in",
                                "md_winograd4_out", *WINOGRAD_ROWS_ROUTINES, "md_softmax_rows", "md_log_softmax_rows",
                                *SCATTER_ROUTINES})
"""Routines compiled without LLVM's vectorizers (at O2): their vectors are written out, or they
copy whole rows or only dispatch; measured as fast as at O3 on MobileNetV2's and ResNet's
shapes, for about half of LLVM's time (md_depthwise 232 -> 132 ms, md_pad2d 159 -> 39 ms,
md_bmm 304 -> 206 ms at the same speed; md_im2col_task 133 -> 48 ms, its calls in ResNet-50
and MobileNetV2 timed level in program order, 2.5-3.6 and 0.21-0.28 ms either way; its stride-2
rows are now gathered 16 at a time by hand).
The Winograd input transform gathers its tiles 16, 8 or 4 at a time by hand (349-490 -> ~200 ms
of LLVM; one core, medians of 100 calls: ResNet-50's 56x56 level at 0.16 ms, 28x28 0.13 -> 0.09,
14x14 0.10-0.11 -> 0.08, 7x7 0.08 -> 0.07 ms); the output transform needs no vectorizer either
(measured level, 0.5 -> ~0.2 s of LLVM for the two). The gathers and scatters of
:mod:`.native_scatter` move an element or a slice at a time, their reductions' vectors written
out (54-416 ms of LLVM instead of 97-713, at the same speed)."""

OPTIMIZED_LIGHTLY = frozenset({"md_gemm", "md_qgemm", "md_qgemmf", "md_qconv", "md_qconvi", "md_qconvt", "md_conv1x1",
                               "md_conv1x1t", "md_conv_direct", "md_bmm", "md_depthwise", *DWROWS_ROUTINES,
                               "md_maxpool3x3", *INPLACE_VARIANTS, *WIDE_DEPTHWISE, "md_winograd_in",
                               "md_winograd_out",
                               "md_winograd4_in", "md_winograd4_out", *WINOGRAD_ROWS_ROUTINES})
"""Routines through LLVM's O1 pipeline (no vectorizers): their tiles, vectors and prefetches are
all written out, so O3 only spent time on them (the code generator still schedules at its
highest level)."""

MODULE_SYMBOLS = {"md_run_tasks": ("md_run_tasks", "md_worker"),
                  "md_run_program": ("md_run_program", "md_run_sequence")}
"""The symbols of a routine's module besides the routine (by the routine's name)."""

MODULE_OF = {symbol: routine for routine, symbols in MODULE_SYMBOLS.items() for symbol in symbols}
"""Each native routine and the builder of its module: routines compile one by one, when a
compiled graph needs them (a conv routine takes LLVM ~0.3 s: an MLP should not pay for it)."""

NATIVE_SYMBOLS = tuple(symbol for routine in ROUTINES for symbol in MODULE_SYMBOLS.get(routine, (routine,)))


def native_module(name: str) -> str:
    """The IR (text) of routine ``name``'s module."""
    module = ir.Module(f"md_native_{name}")
    ROUTINES[name](module)
    return str(module)


_ADDRESSES: dict[str, int] = {}


def native_function(name: str, wait: bool = True) -> int:
    """The address of native routine ``name``: compiled on first use in this process, or
    linked from the kernel store in effect (:func:`metadef.codegen.kernel.kernel_store`, the
    on-disk compile cache), where a compile also leaves its object code. ``wait=False``:
    raise :class:`~metadef.codegen.kernel.CompiledElsewhere` when another process sharing the
    compile is building it, rather than wait.

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
            _ADDRESSES.update(_build(routine, wait))
    return _ADDRESSES[name]


def _build(name: str, wait: bool = True) -> dict[str, int]:
    symbols = list(MODULE_SYMBOLS.get(name, (name,)))
    # the cache key's environment holds a digest of codegen's source, this file included: the
    # routine's name is enough here, and a hit needs no IR at all
    structure = f"md_native runtime {name}"
    store = current_store()
    code = load_or_claim(store, structure, name, wait)
    if code is not None:
        try:
            return load_object(code.object_code, symbols, name)
        except BackendError:  # a damaged entry: compile it again
            pass
    module = f"md_native_{name}"
    try:
        light = name in OPTIMIZED_LIGHTLY
        addresses, obj = generate(native_module(name), symbols, module, unroll=name not in UNROLLED_BY_HAND,
                                  vectorize=name not in VECTORIZED_BY_HAND and not light, light=light)
    except BaseException:
        release(store, structure)
        raise
    if store is not None:
        store.save(structure, name, KernelCode(name, obj, (), (), (), ()))
    return addresses


__all__ = ["BMM_DIMS", "COL2IM_DIMS", "CONV1X1_DIMS", "CONV2D_DIMS", "COPY_ROWS_DIMS", "DEPTHWISE_DIMS", "ENTRY",
           "FILL_DIMS", "GATHER_DIMS", "GATHER_PLANES_DIMS", "GEMM_DIMS", "IM2COL_DIMS", "MAP_ROWS_DIMS",
           "NATIVE_SYMBOLS", "POOL", "POOL_WORDS", "ROUTINES", "PAD2D_DIMS", "PROGRAM", "SGEMM_DIMS", "WINOGRAD_DIMS",
           "WINOGRAD_TASK_DIMS", "native_function", "native_module", "winograd_workspace"]
