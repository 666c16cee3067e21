"""A convolution read in place from its (padded) NCHW input: ``md_conv_direct``.

For a conv whose im2col would be large next to its input (a stride-2 3x3 conv makes 2.25
times its input in columns; ResNet-50's 7x7 stem 12 times), the tile of our products
(:mod:`.native_tile`: output pixels as its rows, a panel of :func:`.native_gemm.gemm_panel`
output channels as its columns, in registers) takes its scalars straight from the input: for
output pixels ``ox0 .. ox0 + rows - 1`` of output row ``oy``, depth step ``(c, ky, kx)`` reads
``x[c, oy*stride + ky, (ox0 + r)*stride + kx]``, a few cache lines per ``(c, ky)`` that all
``kx`` steps share. No columns are written or read; the weights are the im2col product's,
packed in panels of channels in ``(c, ky, kx)`` order (:func:`.native_gemm.pack_rows`), and
the tile is stored column by column into the NCHW output, with the bias, a residual and the
bounds on the way, as ``md_conv1x1t`` stores it.

``x`` is the padded input (``md_pad2d``): ``[n, cin, hp, wp]``, followed by at least
:func:`direct_slack` floats that a last tile of a row may read past its pixels (it computes
``rows`` = :func:`direct_rows` pixels and stores the ones that exist). Task
``task`` of ``tasks`` takes its share of the (image, band of output rows, panel) units.

Example:
    >>> import ctypes, numpy as np
    >>> from metadef.codegen.native import ENTRY, native_function
    >>> from metadef.codegen.native_gemm import gemm_panel, pack_rows
    >>> x = np.zeros(1 * 1 * 5 * 5 + direct_slack(1), np.float32); x[:25] = np.arange(25)
    >>> w = np.ones((1, 1, 3, 3), np.float32)
    >>> y = np.empty((1, 1, 2, 2), np.float32)
    >>> packed, bias = pack_rows(w.reshape(1, 9), gemm_panel()), np.zeros(gemm_panel(), np.float32)
    >>> args = (ctypes.c_void_p * 5)(x.ctypes.data, packed.ctypes.data, bias.ctypes.data, None, y.ctypes.data)
    >>> dims = direct_dims(1, 1, 1, (5, 5), (2, 2), (3, 3), 2)
    >>> ENTRY(native_function("md_conv_direct"))(args, (ctypes.c_int64 * len(dims))(*dims))
    >>> y[0, 0].tolist()
    [[54.0, 72.0], [144.0, 162.0]]
"""

from __future__ import annotations

import math

from llvmlite import ir

from metadef.codegen.native_gemm import _bits, _pointwise_entry, conv1x1_rows, gemm_panel
from metadef.codegen.native_ir import F32, I64, PTR, _elem, _internal, _loop, _share, _splat
from metadef.codegen.native_tile import _eighths, _fma, _prefetch_block, _store_columns, tile_lanes

DIRECT_DIMS = ("n", "cin", "cout", "hp", "wp", "oh", "ow", "kh", "kw", "stride", "has_res", "lo", "hi",
               "band", "task", "tasks")
"""The dims of ``md_conv_direct``: args are ``[x (padded), packed weights, bias [panels*w],
residual or null, y [n, cout, oh, ow]]``; ``band``: output rows a unit (:func:`direct_band`)."""

BAND_BYTES = 384 << 10
"""The input rows a band of output rows reads stay within this many bytes (in L2, while every
panel of weights passes over them)."""


def direct_band(cin: int, wp: int, kh: int, stride: int, oh: int) -> int:
    """The output rows of ``md_conv_direct``'s units: as many as read at most
    :data:`BAND_BYTES` of the padded input (``cin`` planes ``wp`` wide), at least one. A unit is
    a band's rows under one panel of output channels, the panels of a band in turn: a band's
    input is read from memory once, not once a panel (ResNet-50's layer2 stride-2 conv reads
    1.7 MB an image).

    Example:
        >>> direct_band(128, 58, 3, 2, 28), direct_band(3, 230, 7, 2, 112)
        (6, 56)
    """
    rows = BAND_BYTES // (4 * cin * wp)
    most = max(1, min(oh, (rows - kh) // stride + 1))
    return -(-oh // -(-oh // most))  # (the bands as even as that many allows: threads share them out)


def direct_rows() -> int:
    """The output pixels of ``md_conv_direct``'s tile: 7 with AVX-512 (14 accumulators of
    two 512-bit registers a pixel), else :func:`.native_gemm.conv1x1_rows` (6: the 16 AVX2
    registers hold no more). Seven, not the products' 8: the output rows of ImageNet's CNNs are
    7 x 2^k pixels wide (112, 56, 28, 14, 7), so that 8-pixel tiles computed 32 pixels for 28
    and 16 for 14, an eighth of the work thrown away; 7 divides them all.

    Example:
        >>> direct_rows() in (6, 7)
        True
    """
    rows = conv1x1_rows()
    return rows - 1 if rows == 8 else rows


def direct_slack(stride: int) -> int:
    """The floats after the padded input that a row's last tile may read (its pixels past the
    row's end), for a conv of ``stride``.

    Example:
        >>> direct_slack(2) >= 16
        True
    """
    return conv1x1_rows() * stride + 16


def direct_dims(n: int, cin: int, cout: int, padded_hw: tuple[int, int], out_hw: tuple[int, int],
                kernel: tuple[int, int], stride: int, *, residual: bool = False, lo: float = -math.inf,
                hi: float = math.inf, band: int | None = None, task: int = 0, tasks: int = 1) -> tuple[int, ...]:
    """The dims of one ``md_conv_direct`` call (see :data:`DIRECT_DIMS`; ``band``:
    :func:`direct_band` unless given).

    Example:
        >>> direct_dims(1, 3, 64, (230, 230), (112, 112), (7, 7), 2)[:4]
        (1, 3, 64, 230)
    """
    values = {"n": n, "cin": cin, "cout": cout, "hp": padded_hw[0], "wp": padded_hw[1], "oh": out_hw[0],
              "ow": out_hw[1], "kh": kernel[0], "kw": kernel[1], "stride": stride, "has_res": int(residual),
              "lo": _bits(lo), "hi": _bits(hi), "task": task, "tasks": tasks,
              "band": band or direct_band(cin, padded_hw[1], kernel[0], stride, out_hw[0])}
    return tuple(values[d] for d in DIRECT_DIMS)


def _direct_tile(module: ir.Module, mr: int, width: int) -> ir.Function:
    """``tile(w, s, stride, plane, wp, cin, kh, kw, y, y_col, res, bias, rows, cols, lo, hi)``:
    ``mr`` output pixels (row ``r``'s scalars at ``s + r*stride``) x ``width`` channels, summed
    over ``(c, ky, kx)`` (scalar at ``+ c*plane + ky*wp + kx``, weights ``width`` floats a
    step from ``w``), stored transposed (element ``(r, j)`` at ``y + j*y_col + r``)."""
    lanes = tile_lanes()
    per, vector = width // lanes, ir.VectorType(F32, lanes)
    fma = _fma(module, lanes)
    fn, b = _internal(module, "md_direct_tile", [PTR, PTR, I64, I64, I64, I64, I64, I64, PTR, I64, PTR, PTR, I64,
                                                 I64, F32, F32], (0, 1, 8, 10, 11))
    w, s, stride, plane, wp, cin, kh, kw, y, y_col, res, bias, rows, cols, lo, hi = fn.args
    _prefetch_block(module, b, y, y_col, res, mr, True, width)
    with b.goto_entry_block():
        accs = [[b.alloca(vector) for _ in range(per)] for _ in range(mr)]  # (SROA makes them registers)
    zero = ir.Constant(vector, [0.0] * lanes)
    for row in accs:
        for acc in row:
            b.store(zero, acc)
    taps = b.mul(kh, kw)

    def channel(c: ir.Value) -> None:
        def tap_row(ky: ir.Value) -> None:
            line = _elem(b, s, b.add(b.mul(c, plane), b.mul(ky, wp)))
            step0 = b.mul(b.add(b.mul(c, taps), b.mul(ky, kw)), I64(width))

            def tap(kx: ir.Value) -> None:
                src = _elem(b, w, b.add(step0, b.mul(kx, I64(width))))
                vs = [b.load(_elem(b, src, I64(lanes * h)), typ=vector, align=4) for h in range(per)]
                at = _elem(b, line, kx)
                for r in range(mr):
                    a = _splat(b, b.load(_elem(b, at, b.mul(I64(r), stride)), typ=F32), lanes)
                    for h in range(per):
                        b.store(b.call(fma, [a, vs[h], b.load(accs[r][h], typ=vector)]), accs[r][h])
            _loop(b, I64(0), kw, tap)
        _loop(b, I64(0), kh, tap_row)
    _loop(b, I64(0), cin, channel)
    betas = [b.load(_elem(b, bias, I64(lanes * h)), typ=vector, align=4) for h in range(per)]
    out = [_eighths(b, [b.fadd(b.load(accs[r][h], typ=vector), betas[h]) for h in range(per)]) for r in range(mr)]
    with_res = b.icmp_signed("!=", b.ptrtoint(res, I64), I64(0))
    _store_columns(module, b, out, y, y_col, res, with_res, rows, cols, (_splat(b, lo), _splat(b, hi)))
    b.ret_void()
    return fn


def _conv_direct(module: ir.Module) -> None:
    mr, pw = direct_rows(), gemm_panel()
    tile = _direct_tile(module, mr, pw)
    b, (x, w, bias, res, y), d, (lo, hi), has_res = _pointwise_entry(module, "md_conv_direct", DIRECT_DIMS)
    cin, cout, oh, ow, stride = d["cin"], d["cout"], d["oh"], d["ow"], d["stride"]
    plane = b.mul(d["hp"], d["wp"])
    pixels = b.mul(oh, ow)
    depth = b.mul(cin, b.mul(d["kh"], d["kw"]))
    panels = b.sdiv(b.add(cout, I64(pw - 1)), I64(pw))
    bands = b.sdiv(b.add(oh, b.sub(d["band"], I64(1))), d["band"])
    first, last = _share(b, b.mul(b.mul(d["n"], bands), panels), d)
    null = ir.Constant(PTR, None)
    blocks = b.sdiv(b.add(ow, I64(mr - 1)), I64(mr))

    def unit(u: ir.Value) -> None:  # (image, band, panel), the panels of a band in turn
        q, rest = b.srem(u, panels), b.sdiv(u, panels)
        image, band = b.sdiv(rest, bands), b.srem(rest, bands)
        top = b.mul(band, d["band"])
        bottom = b.add(top, d["band"])
        bottom = b.select(b.icmp_signed(">", bottom, oh), oh, bottom)
        c0 = b.mul(q, I64(pw))
        cols = b.sub(cout, c0)
        cols = b.select(b.icmp_signed(">", cols, I64(pw)), I64(pw), cols)
        xi = _elem(b, x, b.mul(image, b.mul(cin, plane)))
        yi = b.add(b.mul(image, b.mul(cout, pixels)), b.mul(c0, pixels))
        wq = _elem(b, w, b.mul(q, b.mul(depth, I64(pw))))

        def out_row(oy: ir.Value) -> None:
            line = _elem(b, xi, b.mul(b.mul(oy, stride), d["wp"]))

            def block(k: ir.Value) -> None:
                ox0 = b.mul(k, I64(mr))
                left = b.sub(ow, ox0)
                at = b.add(yi, b.add(b.mul(oy, ow), ox0))
                b.call(tile, [wq, _elem(b, line, b.mul(ox0, stride)), stride, plane, d["wp"], cin, d["kh"], d["kw"],
                              _elem(b, y, at), pixels, b.select(has_res, _elem(b, res, at), null),
                              _elem(b, bias, c0), b.select(b.icmp_signed(">", left, I64(mr)), I64(mr), left),
                              cols, lo, hi])
            _loop(b, I64(0), blocks, block)
        _loop(b, top, bottom, out_row)

    _loop(b, first, last, unit)
    b.ret_void()


__all__ = ["DIRECT_DIMS", "direct_dims", "direct_rows", "direct_slack"]
