"""Products by our micro-kernel (:mod:`.native_tile`), with the epilogue fused at store:
pointwise (1x1) convolutions (``md_conv1x1``, ``md_conv1x1t``) and products with constant
weights (``md_gemm``).

``md_conv1x1`` computes, for each image ``i``, output channel ``r`` and pixel ``j``::

    y[i, r, j] = clip(sum_k W[r, k] * x[i, k, j] + bias[r] (+ res[i, r, j]), lo, hi)

``x`` is read in place (``[n, cin, p]``: NCHW with the pixels flattened), so a pointwise conv
needs no packing of its input and no workspace; the weights are packed once, at bind time, in
panels of ``rows`` = :func:`conv1x1_rows` output channels (``[ceil(cout / rows), cin, rows]``,
zero-padded; see :func:`pack_conv1x1_weights`). The register tile is ``rows`` channels x
:func:`conv1x1_width` pixels: with AVX-512, 8 x 32 (two 512-bit registers a channel: 16
accumulators; 190-215 GFLOP/s on one core for ResNet-50's shapes, against 150 for 8 x 16);
without, 6 x 16 (two 256-bit halves: 12). The bias, the residual add and the activation (Relu
is ``lo = 0``, Clip any bounds) are applied in registers before the one store: no second
pass over the output as a separate epilogue kernel would make. A last partial block of
pixels is computed as the block ending at ``p`` (overlapping the previous one, which writes
the same values), so ``p >=`` :func:`conv1x1_width` is required.

``md_gemm`` computes ``y = clip(x W + bias (+ res), lo, hi)`` for ``x [m, k]`` and constant ``W [k, n]``
packed in panels of ``width`` = :func:`gemm_panel` columns (``[ceil(n/width), k, width]``,
:func:`pack_gemm_weights`): each panel stays in cache while the rows of ``x`` pass in tiles of
:func:`gemm_row_tiles` rows, the last ones in the smaller tiles. With AVX-512 the tile is 12
rows x 32 columns (two 512-bit registers a row: 24 accumulators, two FMAs per broadcast of
``x``: 216-252 GFLOP/s on one core for BERT's products, against 180 for 12 x 16 and 115 for
the AVX2 tile); without, 6 rows x 16 (two 256-bit halves). The bias is added per column, and
a last narrower panel is stored through the stack. Tasks split the panels.

The blocks of ``md_conv1x1`` are walked pixels-outer (``order = 0``: one ``cin x width`` panel of ``x`` stays in L1
while every weight panel passes) or in chunks (``order = 1``: the image's pixels in chunks of
``chunk`` whose input stays in L2, each weight panel passing over a whole chunk, the panel
staying in L1: for convs whose weights outweigh a block's input; a chunk's first pass asks for
its input ahead, as order 0 does, so that an image out of cache streams in once); task
``task`` of ``tasks`` takes its share of the units (blocks; chunks, or with ``parts`` > 1 a
chunk's share of the panels) of all images, so a call splits across threads.

Example:
    >>> import ctypes, numpy as np
    >>> from metadef.codegen.native import ENTRY, native_function
    >>> x = np.arange(2 * 32, dtype=np.float32).reshape(1, 2, 32)
    >>> w = np.array([[1.0, 2.0]], np.float32)
    >>> y = np.empty((1, 1, 32), np.float32)
    >>> packed, bias = pack_conv1x1_weights(w), np.zeros(1, np.float32)
    >>> args = (ctypes.c_void_p * 5)(x.ctypes.data, packed.ctypes.data, bias.ctypes.data, None, y.ctypes.data)
    >>> dims = conv1x1_dims(1, 2, 1, 32)
    >>> ENTRY(native_function("md_conv1x1"))(args, (ctypes.c_int64 * len(dims))(*dims))
    >>> bool(np.array_equal(y[0, 0], w[0] @ x[0]))
    True
"""

from __future__ import annotations

import math
import struct

import numpy as np
from llvmlite import ir

from metadef.codegen.native_ir import (
    F32,
    I64,
    PTR,
    V8,
    _arg,
    _define,
    _elem,
    _float_bits,
    _if,
    _loop,
    _share,
)
from metadef.codegen.native_tile import (
    MR,
    NR,
    _ahead,
    _prefetch,
    _row_tiles,
    _tile,
    _transpose8,
    tile_lanes,
)

GEMM_DIMS = ("m", "n", "k", "lo", "hi", "task", "tasks", "lda", "has_res", "ldy", "batch", "xs", "ys")
"""The dims of ``md_gemm``: args are ``[x [m, k] (rows ``lda`` floats apart), packed weights,
bias [ceil(n/w)*w], y [m, n] (rows ``ldy`` apart)]`` and, with ``has_res``, a fifth: a residual
``[m, n]`` (rows ``ldy`` apart) added before the bounds; ``batch`` such products with the same
weights, the ``i``-th's ``x`` at ``i * xs`` floats and its ``y`` and residual at ``i * ys`` (the
images of a pointwise conv whose values are pixel-major, one pixel's channels a row); task
``task`` of ``tasks`` computes its share of the (product, ``w``-column panel) units (``w`` =
:func:`gemm_panel`)."""

CONV1X1_DIMS = ("n", "cin", "cout", "p", "has_res", "lo", "hi", "order", "ys", "task", "tasks", "chunk", "parts")
"""The dims of ``md_conv1x1``: args are ``[x, packed weights, bias, residual or null, y]``;
``lo`` and ``hi`` are float32 bits (``-inf`` / ``inf`` for no bound); ``ys``: the floats from
one row of ``y`` (and of the residual) to the next, ``p`` unless ``x`` is a band of columns
of a wider output (an im2col of some output rows), whose image ``cout * ys`` floats apart."""

CONV1X1T_DIMS = ("n", "cin", "cout", "p", "has_res", "lo", "hi", "task", "tasks", "ldx")
"""The dims of ``md_conv1x1t``: args are ``[xt [n, p, ldx] (the input transposed, see md_transpose; a
pixel's ``cin`` channels ``ldx`` floats after the previous one's), packed weights
(pack_gemm_weights(Wᵀ): panels of ``w`` = :func:`gemm_panel` channels), bias [ceil(cout/w)*w],
residual or null, y [n, cout, p]]``; task ``task`` of ``tasks`` takes its share of the (image,
panel) units."""



def conv1x1_rows() -> int:
    """The output channels of ``md_conv1x1``'s tile (its weights' panels), and the pixels of
    ``md_conv1x1t``'s, on this host: 8 rows of one 512-bit register with AVX-512 (8 chains of
    FMAs, as many as two FMA units of four cycles keep busy; 8 divides the usual channel
    counts, where 12 computed padding rows and measured no faster), else :data:`MR` rows of
    two 256-bit halves.

    Example:
        >>> conv1x1_rows() in (MR, 8)
        True
    """
    return 8 if tile_lanes() == 16 else MR


def conv1x1_width() -> int:
    """The pixels of ``md_conv1x1``'s tile on this host: 32 with AVX-512 (two 512-bit
    registers a channel), else :data:`NR`; an image needs at least this many.

    Example:
        >>> conv1x1_width() in (16, 32)
        True
    """
    return 32 if tile_lanes() == 16 else NR


def pack_conv1x1_weights(w: np.ndarray) -> np.ndarray:
    """``W [cout, cin, (1, 1)]`` in the panels ``md_conv1x1`` reads: ``[ceil(cout/rows), cin,
    rows]``, ``rows`` = :func:`conv1x1_rows`.

    Example:
        >>> packed = pack_conv1x1_weights(np.ones((13, 3), np.float32))
        >>> packed.shape == (-(-13 // conv1x1_rows()), 3, conv1x1_rows())
        True
    """
    return pack_rows(w.reshape(w.shape[0], -1), conv1x1_rows())


def aligned_empty(shape: tuple[int, ...], align: int = 64) -> np.ndarray:
    """An uninitialized float32 array whose data starts on an ``align``-byte boundary (a cache
    line). NumPy aligns arrays only to 16 bytes, so packed weights sat 0, 16, 32 or 48 bytes
    off a line (ResNet-50's, about a quarter each), and where, depended on the heap's history
    in that process: every 512-bit load of a tile from a misaligned panel spans two lines.
    (ResNet-50 b1t1 in five A/B pairs: 0.864 -> 0.858 of ORT's time, within the noise; packed
    weights now load the same way in every process.)

    Example:
        >>> aligned_empty((3, 5)).ctypes.data % 64, aligned_empty((3, 5)).shape
        (0, (3, 5))
    """
    count = math.prod(shape)
    raw = np.empty(count + align // 4, np.float32)
    start = (-raw.ctypes.data % align) // 4
    return raw[start:start + count].reshape(shape)


def pack_rows(w: np.ndarray, block: int) -> np.ndarray:
    """The rows of ``w [rows, depth]`` in panels of ``block``: ``[ceil(rows/block), depth, block]``,
    the last panel zero-padded; one pass over the weights (packing runs on a session's first
    use of a shape, so its cost is time to the first output).

    Example:
        >>> pack_rows(np.arange(6, dtype=np.float32).reshape(3, 2), 2)[:, :, :].tolist()
        [[[0.0, 2.0], [1.0, 3.0]], [[4.0, 0.0], [5.0, 0.0]]]
    """
    rows, depth = w.shape
    panels, full = -(-rows // block), rows // block
    out = aligned_empty((panels, depth, block))
    if full:
        out[:full] = w[:full * block].reshape(full, block, depth).transpose(0, 2, 1)
    if full < panels:
        out[full] = 0
        out[full, :, :rows - full * block] = w[full * block:].T
    return out


def _bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def conv1x1_dims(n: int, cin: int, cout: int, p: int, *, residual: bool = False, lo: float = -math.inf,
                 hi: float = math.inf, order: int = 0, y_stride: int | None = None, task: int = 0,
                 tasks: int = 1) -> tuple[int, ...]:
    """The dims of one ``md_conv1x1`` call (see :data:`CONV1X1_DIMS`; order 1's chunks from
    :func:`conv1x1_chunks`).

    Example:
        >>> conv1x1_dims(1, 16, 96, 12544)[:4]
        (1, 16, 96, 12544)
    """
    chunk, parts = conv1x1_chunks(n, cin, p, tasks)
    values = {"n": n, "cin": cin, "cout": cout, "p": p, "has_res": int(residual), "lo": _bits(lo),
              "hi": _bits(hi), "order": order, "ys": p if y_stride is None else y_stride, "task": task,
              "tasks": tasks, "chunk": chunk, "parts": parts}
    return tuple(values[d] for d in CONV1X1_DIMS)


CHUNK_BYTES = 256 << 10
"""At most how many bytes of input a chunk of ``md_conv1x1``'s pixels (order 1) spans: a
chunk's ``cin`` rows stay in L2 (1 MB a core on Zen 4, 2 MB on recent Intel cores) while every
weight panel passes over them, the output and residual streaming by beside them."""


def conv1x1_chunks(n: int, cin: int, p: int, tasks: int = 1) -> tuple[int, int]:
    """``md_conv1x1``'s chunks (order 1) for ``n`` images of ``p`` pixels and ``cin``
    channels on ``tasks`` tasks: the pixels of a chunk (a multiple of :func:`conv1x1_width`,
    :data:`CHUNK_BYTES` of input at most, the image's blocks shared out evenly) and the parts
    each chunk's panels are split into (1; ``tasks`` where the chunks would not share out
    evenly over the tasks).

    Example:
        >>> conv1x1_chunks(1, 64, 3136) == (800, 1) if conv1x1_width() == 32 else True
        True
        >>> conv1x1_chunks(1, 256, 196, tasks=2)[1]
        2
    """
    width = conv1x1_width()
    blocks = max(1, -(-p // width))
    most = max(1, CHUNK_BYTES // (4 * cin * width))
    chunks = -(-blocks // most)
    per = -(-blocks // chunks)
    chunks = -(-blocks // per)
    units = n * chunks
    parts = 1 if tasks < 2 or units % tasks == 0 or units >= 4 * tasks else tasks
    return per * width, parts


AHEAD = 4
"""How many pixel blocks ahead ``md_conv1x1`` (pixels outer) asks for its input and output
lines: a block's ``cin`` input rows and ``cout`` output rows lie a plane apart, more streams
than the hardware prefetchers follow, so on a plane out of cache (a large image, a batch)
each tile waited on memory (3-4 GB/s of the 12 a copy reaches here). The input's lines are
asked for by the tiles of the block's first panel, every line of one row a depth step: asked
for all at once at the block's start, as they were, the requests queued behind each other
(ResNet-50's 256 -> 64 channels at batch 8 on one core, the input from memory: 137-148 ->
188-191 GFLOP/s)."""


def _pointwise_entry(module: ir.Module, name: str, dim_names: tuple[str, ...]
                     ) -> tuple[ir.IRBuilder, list[ir.Value], dict[str, ir.Value], tuple[ir.Value, ir.Value], ir.Value]:
    """The entry of a pointwise-conv routine: its builder, args ``[x, w, bias, res, y]``, dims by
    name, the bounds as floats and whether there is a residual."""
    b, args, dims = _define(module, name)
    d = {dim: _arg(b, dims, i, I64) for i, dim in enumerate(dim_names)}
    return (b, [_arg(b, args, i, PTR) for i in range(5)], d, (_float_bits(b, d["lo"]), _float_bits(b, d["hi"])),
            b.icmp_signed("!=", d["has_res"], I64(0)))


def _conv1x1t(module: ir.Module) -> None:
    """``md_conv1x1t``: a pointwise conv with the pixels as the tile's rows (see
    :data:`CONV1X1T_DIMS`): each panel of :func:`gemm_panel` channels (32 with AVX-512: two
    512-bit registers a pixel) of the packed weights stays in cache while the image's pixels
    pass in tiles of :func:`conv1x1_rows`, the last few one by one, each row a pixel of the
    transposed input (read along the channels: 6 or 8 streams, a new cache line every 16
    steps; reading the NCHW input in place would take a new line every step, measured up to
    1.6x slower), and the tile is stored column by column into the NCHW output. No pixel is computed twice, so a
    7x7 image (49 pixels) costs 49 rows where ``md_conv1x1`` computes 64."""
    # (two tiles: a tile's transposed store doubles its code, and LLVM's time with it; the
    # last few rows go one at a time, through the single row's four chains of FMAs)
    top = conv1x1_rows()
    pw = gemm_panel()
    tiles = {mr: _tile(module, f"md_conv1x1t_tile{mr}", mr, column_bias=True, transposed=True, width=pw,
                       ahead=(0,) if mr >= AHEAD_ROWS else ()) for mr in (top, 1)}
    b, (x, w, bias, res, y), d, (lo, hi), has_res = _pointwise_entry(module, "md_conv1x1t", CONV1X1T_DIMS)
    p, cin, cout, ldx = d["p"], d["cin"], d["cout"], d["ldx"]
    panels = b.sdiv(b.add(cout, I64(pw - 1)), I64(pw))
    units = b.mul(d["n"], panels)
    first, last = _share(b, units, d)
    null = ir.Constant(PTR, None)

    def unit(u: ir.Value) -> None:
        image, q = b.sdiv(u, panels), b.srem(u, panels)
        c0 = b.mul(q, I64(pw))
        cols = b.sub(cout, c0)
        cols = b.select(b.icmp_signed(">", cols, I64(pw)), I64(pw), cols)
        xi = _elem(b, x, b.mul(image, b.mul(ldx, p)))
        yi = b.add(b.mul(image, b.mul(cout, p)), b.mul(c0, p))
        wq = _elem(b, w, b.mul(q, b.mul(cin, I64(pw))))
        following = _elem(b, wq, b.mul(cin, I64(pw)))

        def rows_from(r0: ir.Value, mr: int) -> None:
            at = b.add(yi, r0)
            ahead = _ahead(b, following, b.sdiv(r0, I64(top)), cin, pw) if mr >= AHEAD_ROWS else ()
            b.call(tiles[mr], [wq, I64(pw), _elem(b, xi, b.mul(r0, ldx)), ldx, I64(1), cin, _elem(b, y, at), p,
                               b.select(has_res, _elem(b, res, at), null), _elem(b, bias, c0), I64(mr), cols, lo, hi,
                               *ahead])

        full = b.sdiv(p, I64(top))
        _loop(b, I64(0), full, lambda i: rows_from(b.mul(i, I64(top)), top))
        _loop(b, b.mul(full, I64(top)), p, lambda r: rows_from(r, 1))

    _loop(b, first, last, unit)
    b.ret_void()


TRANSPOSE_DIMS = ("n", "rows", "cols", "task", "tasks", "ld", "xs")
"""The dims of ``md_transpose``: args are ``[x [n, rows, cols], y [n, cols, ld]]`` (``x``'s
rows ``xs >= cols`` floats apart, ``y``'s ``ld >= rows``, the rest of each left as it was);
task ``task`` of ``tasks`` writes its share of the (image, 8-column block) units."""

def _transpose(module: ir.Module) -> None:
    """``md_transpose`` (see :data:`TRANSPOSE_DIMS`): 8 x 8 blocks through registers, the
    rows and columns past the last whole block element by element."""
    b, args, dims = _define(module, "md_transpose")
    x, y = _arg(b, args, 0, PTR), _arg(b, args, 1, PTR)
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(TRANSPOSE_DIMS)}
    rows, cols, ld, xs = d["rows"], d["cols"], d["ld"], d["xs"]
    blocks = b.sdiv(b.add(cols, I64(7)), I64(8))
    units = b.mul(d["n"], blocks)
    first, last = _share(b, units, d)
    plane, out_plane = b.mul(rows, xs), b.mul(ld, cols)

    def unit(u: ir.Value) -> None:
        image = b.sdiv(u, blocks)
        c0 = b.mul(b.srem(u, blocks), I64(8))
        xi, yi = _elem(b, x, b.mul(image, plane)), _elem(b, y, b.mul(image, out_plane))
        width = b.sub(cols, c0)
        width = b.select(b.icmp_signed(">", width, I64(8)), I64(8), width)
        whole = b.icmp_signed("==", width, I64(8))
        full = b.select(whole, b.mul(b.sdiv(rows, I64(8)), I64(8)), I64(0))

        def block(i: ir.Value) -> None:
            r0 = b.mul(i, I64(8))
            loaded = [b.load(_elem(b, xi, b.add(b.mul(b.add(r0, I64(r)), xs), c0)), typ=V8, align=4)
                      for r in range(8)]
            for j, column in enumerate(_transpose8(b, loaded)):
                b.store(column, _elem(b, yi, b.add(b.mul(b.add(c0, I64(j)), ld), r0)), align=4)

        _loop(b, I64(0), b.sdiv(full, I64(8)), block)

        def row(r: ir.Value) -> None:
            def element(j: ir.Value) -> None:
                c = b.add(c0, j)
                b.store(b.load(_elem(b, xi, b.add(b.mul(r, xs), c)), typ=F32), _elem(b, yi, b.add(b.mul(c, ld), r)))
            _loop(b, I64(0), width, element)

        _loop(b, full, rows, row)

    _loop(b, first, last, unit)
    b.ret_void()


def transpose_dims(n: int, rows: int, cols: int, task: int = 0, tasks: int = 1, ld: int | None = None,
                   xs: int | None = None) -> tuple[int, ...]:
    """The dims of one ``md_transpose`` call (see :data:`TRANSPOSE_DIMS`; ``ld`` defaults to
    ``rows``, ``xs`` to ``cols``).

    Example:
        >>> transpose_dims(1, 512, 49)
        (1, 512, 49, 0, 1, 512, 49)
    """
    return (n, rows, cols, task, tasks, rows if ld is None else ld, cols if xs is None else xs)


def conv1x1t_dims(n: int, cin: int, cout: int, p: int, *, residual: bool = False, lo: float = -math.inf,
                  hi: float = math.inf, task: int = 0, tasks: int = 1, ldx: int | None = None) -> tuple[int, ...]:
    """The dims of one ``md_conv1x1t`` call (see :data:`CONV1X1T_DIMS`; ``ldx`` defaults to
    ``cin``).

    Example:
        >>> conv1x1t_dims(1, 512, 2048, 49)[:4]
        (1, 512, 2048, 49)
    """
    values = {"n": n, "cin": cin, "cout": cout, "p": p, "has_res": int(residual), "lo": _bits(lo),
              "hi": _bits(hi), "task": task, "tasks": tasks, "ldx": cin if ldx is None else ldx}
    return tuple(values[d] for d in CONV1X1T_DIMS)


def _conv1x1(module: ir.Module) -> None:
    mr = conv1x1_rows()
    width = conv1x1_width()
    tile = _tile(module, "md_conv1x1_tile", mr, column_bias=False, width=width,
                 ahead=(*range(0, width, NR), width - 1))  # (every line of a block's row: 2 or 3 of 32 floats)
    b, (x, w, bias, res, y), d, (lo, hi), has_res = _pointwise_entry(module, "md_conv1x1", CONV1X1_DIMS)
    p, cin, cout, ys = d["p"], d["cin"], d["cout"], d["ys"]
    col_blocks = b.sdiv(b.add(p, I64(width - 1)), I64(width))
    row_blocks = b.sdiv(b.add(cout, I64(mr - 1)), I64(mr))
    null = ir.Constant(PTR, None)

    def one(xi: ir.Value, yi: ir.Value, rb: ir.Value, cb: ir.Value, ahead: ir.Value) -> None:
        """The tile (panel ``rb``, block ``cb``); ``ahead``: whether it also asks for the input
        lines ``AHEAD`` blocks on, one row a depth step (the input out of cache, each row in
        its own stream: more streams than the hardware prefetchers follow)."""
        j0 = b.mul(cb, I64(width))
        j0 = b.select(b.icmp_signed(">", b.add(j0, I64(width)), p), b.sub(p, I64(width)), j0)
        r0 = b.mul(rb, I64(mr))
        at = b.add(yi, b.add(b.mul(r0, ys), j0))
        on = _elem(b, xi, b.mul(b.add(cb, I64(AHEAD)), I64(width)))
        b.call(tile, [_elem(b, xi, j0), p, _elem(b, w, b.mul(rb, b.mul(cin, I64(mr)))), I64(1), I64(mr), cin,
                      _elem(b, y, at), ys, b.select(has_res, _elem(b, res, at), null), _elem(b, bias, r0),
                      b.sub(cout, r0), I64(width), lo, hi, on, b.select(ahead, p, I64(0))])

    def pixels_outer() -> None:  # order 0: a unit is a block of pixels, every panel passing over it
        first, last = _share(b, b.mul(d["n"], col_blocks), d)

        def unit(u: ir.Value) -> None:
            image, cb = b.sdiv(u, col_blocks), b.srem(u, col_blocks)
            xi = _elem(b, x, b.mul(image, b.mul(cin, p)))
            yi = b.mul(image, b.mul(cout, ys))
            j = b.mul(b.add(cb, I64(AHEAD)), I64(width))
            _loop(b, I64(0), cout, lambda r: _prefetch(module, b, _elem(b, y, b.add(yi, b.add(b.mul(r, ys), j))),
                                                       write=True))
            _loop(b, I64(0), row_blocks, lambda rb: one(xi, yi, rb, cb, b.icmp_signed("==", rb, I64(0))))

        _loop(b, first, last, unit)

    def chunks_outer() -> None:  # order 1: a unit is a chunk's share of the panels, each passing over the chunk
        per_chunk = b.sdiv(d["chunk"], I64(width))
        chunks = b.sdiv(b.add(col_blocks, b.sub(per_chunk, I64(1))), per_chunk)
        parts = d["parts"]
        first, last = _share(b, b.mul(b.mul(d["n"], chunks), parts), d)

        def unit(u: ir.Value) -> None:
            image, rest = b.sdiv(u, b.mul(chunks, parts)), b.srem(u, b.mul(chunks, parts))
            c, part = b.sdiv(rest, parts), b.srem(rest, parts)
            xi = _elem(b, x, b.mul(image, b.mul(cin, p)))
            yi = b.mul(image, b.mul(cout, ys))
            lo_block = b.mul(c, per_chunk)
            hi_block = b.add(lo_block, per_chunk)
            hi_block = b.select(b.icmp_signed(">", hi_block, col_blocks), col_blocks, hi_block)
            lo_panel = b.sdiv(b.mul(row_blocks, part), parts)
            hi_panel = b.sdiv(b.mul(row_blocks, b.add(part, I64(1))), parts)

            def panel(rb: ir.Value) -> None:
                def block(cb: ir.Value) -> None:  # (the chunk's first pass asks for its input ahead)
                    one(xi, yi, rb, cb, b.icmp_signed("==", rb, lo_panel))
                _loop(b, lo_block, hi_block, block)

            _loop(b, lo_panel, hi_panel, panel)

        _loop(b, first, last, unit)

    wide = b.icmp_signed(">=", p, I64(width))
    chunked = b.icmp_signed("!=", d["order"], I64(0))
    _if(b, b.and_(wide, chunked), chunks_outer)
    _if(b, b.and_(wide, b.not_(chunked)), pixels_outer)
    b.ret_void()


def gemm_panel() -> int:
    """The columns of ``md_gemm``'s weight panels (and tile) on this host: 32 with AVX-512
    (a tile row is two 512-bit registers: 12 rows make 24 accumulators, two FMAs per
    broadcast), else :data:`NR` (16: two 256-bit halves).

    Example:
        >>> gemm_panel() in (16, 32)
        True
    """
    return 32 if tile_lanes() == 16 else NR


def pack_gemm_weights(w: np.ndarray, width: int | None = None) -> np.ndarray:
    """``W [k, n]`` in the panels ``md_gemm`` reads: ``[ceil(n/width), k, width]``, zero-padded
    (one pass); ``width``: :func:`gemm_panel` unless given.

    Example:
        >>> pack_gemm_weights(np.ones((3, 20), np.float32), 16).shape
        (2, 3, 16)
    """
    width = width or gemm_panel()
    k, n = w.shape
    panels, full = -(-n // width), n // width
    out = aligned_empty((panels, k, width))
    if full and w.dtype == np.float32 and w.strides[1] == 4:  # each panel's row as one item:
        chunk = np.dtype((np.void, 4 * width))  # a copy of 64- or 128-byte items, not float loops
        out[:full].view(chunk).reshape(full, k)[...] = w[:, :full * width].view(chunk).T
    elif full:
        out[:full] = w[:, :full * width].reshape(k, full, width).transpose(1, 0, 2)
    if full < panels:
        out[full] = 0
        out[full, :, :n - full * width] = w[:, full * width:]
    return out


def gemm_dims(m: int, n: int, k: int, *, lo: float = -math.inf, hi: float = math.inf, task: int = 0,
              tasks: int = 1, lda: int | None = None, residual: bool = False, ldy: int | None = None,
              batch: int = 1, xs: int = 0, ys: int = 0) -> tuple[int, ...]:
    """The dims of one ``md_gemm`` call (see :data:`GEMM_DIMS`; ``lda`` defaults to ``k``,
    ``ldy`` to ``n``).

    Example:
        >>> gemm_dims(8, 512, 784)[:3]
        (8, 512, 784)
    """
    values = {"m": m, "n": n, "k": k, "lo": _bits(lo), "hi": _bits(hi), "task": task, "tasks": tasks,
              "lda": k if lda is None else lda, "has_res": int(residual), "ldy": n if ldy is None else ldy,
              "batch": batch, "xs": xs, "ys": ys}
    return tuple(values[d] for d in GEMM_DIMS)


def gemm_lda(k: int) -> int:
    """The row stride (floats) at which ``md_gemm`` reads ``x [m, k]`` fastest: ``k``, unless
    rows ``4 k`` bytes apart would all fall in one set of the L1 cache (``k`` a multiple of
    1024: a 12-row tile streams 12 lines through an 8-way set, and every broadcast misses);
    then ``k + 16``, one line more, for a copy of ``x`` made first (one core, 128 rows:
    BERT's ``k = 3072`` 95 -> 110 GFLOP/s, ``k = 1024`` 80 -> 113, ``k = 1536`` already 110).

    Example:
        >>> gemm_lda(768), gemm_lda(3072)
        (768, 3088)
    """
    return k + 16 if k % 1024 == 0 else k


def gemm_row_tiles() -> tuple[int, ...]:
    """The row counts of ``md_gemm``'s tiles on this host, largest first: 12 rows of one
    512-bit register each with AVX-512 (12 accumulators of 32), else 6 rows of two 256-bit
    halves (12 of 16); the last rows go by the smaller tiles.

    Example:
        >>> gemm_row_tiles()[-1]
        1
    """
    return (12, 8, 4, 2, 1) if tile_lanes() == 16 else (MR, 4, 2, 1)


AHEAD_ROWS = 4
"""Tiles of at least this many rows ask for the next weight panel as they go
(:func:`.native_tile._ahead`); a tile of fewer rows (a GEMV: the MLP at batch 1) is bound by
its loads, which one more a depth step slows (784-512-512-10 at batch 1: 1.00 -> 1.04-1.11 of
ONNX Runtime's time)."""


def _gemm(module: ir.Module) -> None:
    sizes = gemm_row_tiles()
    pw = gemm_panel()
    tiles = {mr: _tile(module, f"md_gemm_tile{mr}", mr, column_bias=True, width=pw,
                       ahead=(0,) if mr >= AHEAD_ROWS else ()) for mr in sizes}
    b, args, dims = _define(module, "md_gemm")
    x, w, bias, y = (_arg(b, args, i, PTR) for i in range(4))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(GEMM_DIMS)}
    null = ir.Constant(PTR, None)
    pre = b.block
    with b.if_then(b.icmp_signed("!=", d["has_res"], I64(0))):  # (a fifth arg only where there is one)
        given, inside = _arg(b, args, 4, PTR), b.block
    res = b.phi(PTR)
    res.add_incoming(null, pre)
    res.add_incoming(given, inside)
    lo, hi = _float_bits(b, d["lo"]), _float_bits(b, d["hi"])
    m, n, k, lda, ldy = d["m"], d["n"], d["k"], d["lda"], d["ldy"]
    panels = b.sdiv(b.add(n, I64(pw - 1)), I64(pw))
    first, last = _share(b, b.mul(d["batch"], panels), d)

    def panel(u: ir.Value) -> None:
        image, q = b.sdiv(u, panels), b.srem(u, panels)
        xi, yi = _elem(b, x, b.mul(image, d["xs"])), b.mul(image, d["ys"])
        j0 = b.mul(q, I64(pw))
        cols = b.sub(n, j0)
        cols = b.select(b.icmp_signed(">", cols, I64(pw)), I64(pw), cols)
        wq = _elem(b, w, b.mul(q, b.mul(k, I64(pw))))

        following = _elem(b, wq, b.mul(k, I64(pw)))

        def rows_from(r0: ir.Value, mr: int) -> None:
            ordinal = b.sdiv(b.add(r0, I64(sizes[0] - 1)), I64(sizes[0]))  # (r0 / 12 up: two 8s count apart)
            ahead = _ahead(b, following, ordinal, k, pw) if mr >= AHEAD_ROWS else ()
            at = b.add(yi, b.add(b.mul(r0, ldy), j0))
            b.call(tiles[mr], [wq, I64(pw), _elem(b, xi, b.mul(r0, lda)), lda, I64(1), k, _elem(b, y, at), ldy,
                               b.select(b.icmp_signed("!=", b.ptrtoint(res, I64), I64(0)), _elem(b, res, at), null),
                               _elem(b, bias, j0), I64(mr), cols, lo, hi, *ahead])

        _row_tiles(b, m, sizes, rows_from, pairs=True)

    _loop(b, first, last, panel)
    b.ret_void()


__all__ = ["CONV1X1T_DIMS", "CONV1X1_DIMS", "GEMM_DIMS", "MR", "NR", "TRANSPOSE_DIMS", "aligned_empty", "conv1x1_dims",
           "conv1x1_rows", "conv1x1_width", "conv1x1t_dims", "gemm_dims", "gemm_lda", "gemm_panel", "gemm_row_tiles",
           "pack_conv1x1_weights", "pack_gemm_weights", "pack_rows", "tile_lanes", "transpose_dims"]
