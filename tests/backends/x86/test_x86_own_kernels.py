"""Our own native kernels against float64 numpy and the reference backend: the pointwise-conv
micro-kernels ``md_conv1x1`` and ``md_conv1x1t`` (epilogue fused), im2col, transposes, the 3x3
depthwise ``md_depthwise`` and the max pool, called directly on random shapes and through
compiled graphs whose fused groups they run (the products ``md_gemm`` and ``md_bmm``:
``test_x86_gemm.py``)."""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np
import pytest

import metadef as md
from metadef.backends.x86 import conv1x1, conv_lowering
from metadef.codegen.native import ENTRY, IM2COL_DIMS, native_function
from metadef.codegen.native_gemm import (
    CHUNK_BYTES,
    NR,
    conv1x1_chunks,
    conv1x1_dims,
    conv1x1_width,
    conv1x1t_dims,
    gemm_lda,
    gemm_panel,
    pack_conv1x1_weights,
    pack_gemm_weights,
    transpose_dims,
)
from metadef.ir import GraphBuilder
from metadef.shape import parse_type

pytestmark = pytest.mark.jit
RNG = np.random.default_rng(7)


def _call(routine: str, arrays: list[np.ndarray | None], dims: tuple[int, ...]) -> None:
    args = (ctypes.c_void_p * len(arrays))(*[None if a is None else a.ctypes.data for a in arrays])
    ENTRY(native_function(routine))(args, (ctypes.c_int64 * len(dims))(*dims))


@pytest.mark.parametrize(("n", "cin", "cout", "p", "residual", "bounds", "order", "tasks"), [
    (1, 16, 96, 300, False, (0.0, 6.0), 0, 1),
    (2, 5, 13, 49, True, (0.0, math.inf), 0, 1),
    (1, 3, 7, 37, False, (-math.inf, math.inf), 1, 1),
    (3, 24, 20, 100, True, (-0.5, 0.5), 1, 2),
    (2, 7, 11, 33, False, (-1.0, 1.0), 0, 3),
    (1, 64, 6, 32, True, (-math.inf, math.inf), 0, 2),  # one block (AVX-512), two (AVX2)
    (1, 33, 17, 40, True, (-math.inf, math.inf), 0, 1),  # panels of 8 or 6 channels, a last one of 1 or 5
    (2, 9, 25, 64, False, (0.0, math.inf), 1, 2),
    # order 1 in several chunks (over CHUNK_BYTES of input an image): a chunk's panels split
    # over the tasks (3 tasks, 2 chunks), whole chunks a task (2 images, 2 chunks each), chunks
    # of one block (the last overlapping the one before)
    (1, 300, 20, 300, True, (0.0, math.inf), 1, 3),
    (2, 300, 13, 333, False, (-math.inf, math.inf), 1, 2),
    (1, 1100, 9, 100, True, (-1.0, 1.0), 1, 1),
])
def test_conv1x1_matches_float64(n: int, cin: int, cout: int, p: int, residual: bool,
                                 bounds: tuple[float, float], order: int, tasks: int) -> None:
    x = RNG.standard_normal((n, cin, p), dtype=np.float32)
    w = RNG.standard_normal((cout, cin), dtype=np.float32)
    bias = RNG.standard_normal(cout, dtype=np.float32)
    res = RNG.standard_normal((n, cout, p), dtype=np.float32)
    y = np.full((n, cout, p), np.nan, np.float32)
    packed = pack_conv1x1_weights(w)
    for t in range(tasks):  # the tasks of a split call cover the output exactly once between them
        _call("md_conv1x1", [x, packed, bias, res if residual else None, y],
              conv1x1_dims(n, cin, cout, p, residual=residual, lo=bounds[0], hi=bounds[1], order=order,
                           task=t, tasks=tasks))
    want = np.einsum("rk,nkp->nrp", w.astype(np.float64), x.astype(np.float64)) + bias[:, None]
    if residual:
        want += res
    # (float32 sums of cin products: their rounding grows with the depth)
    np.testing.assert_allclose(y, np.clip(want, *bounds), rtol=1e-5, atol=1e-5 * max(1.0, math.sqrt(cin / 16)))


@pytest.mark.parametrize(("n", "cin", "p", "tasks"), [(1, 64, 3136, 1), (1, 64, 3136, 2), (8, 64, 3136, 2),
                                                     (1, 256, 196, 2), (1, 2048, 49, 2), (3, 300, 333, 4)])
def test_conv1x1_chunks_cover_the_image_and_share_out_evenly(n: int, cin: int, p: int, tasks: int) -> None:
    width = conv1x1_width()
    chunk, parts = conv1x1_chunks(n, cin, p, tasks)
    blocks = -(-p // width)
    chunks = -(-blocks // (chunk // width))
    assert chunk % width == 0 and (chunk == width or 4 * cin * chunk <= CHUNK_BYTES)
    assert (chunks - 1) * chunk < blocks * width <= chunks * chunk  # no chunk empty
    assert (parts in (1, tasks) and (n * chunks * parts) % tasks == 0) or n * chunks >= 4 * tasks


def test_conv1x1_writes_a_band_into_a_wider_output() -> None:
    # the product of some output rows' columns: its rows of y (and of the residual) lie a whole
    # image's pixels apart, its image cout * ys floats
    cin, cout, p, wide, at = 9, 14, 40, 100, 30
    x = RNG.standard_normal((1, cin, p), dtype=np.float32)
    w = RNG.standard_normal((cout, cin), dtype=np.float32)
    bias = RNG.standard_normal(cout, dtype=np.float32)
    res = RNG.standard_normal((cout, wide), dtype=np.float32)
    y = np.full((cout, wide), np.nan, np.float32)
    args = [x, pack_conv1x1_weights(w), bias, res[:, at:], y[:, at:]]
    pointers = (ctypes.c_void_p * 5)(*[a.ctypes.data for a in args])
    for t in range(2):
        dims = conv1x1_dims(1, cin, cout, p, residual=True, lo=0.0, hi=3.0, y_stride=wide, task=t, tasks=2)
        ENTRY(native_function("md_conv1x1"))(pointers, (ctypes.c_int64 * len(dims))(*dims))
    want = np.clip(w.astype(np.float64) @ x[0] + bias[:, None] + res[:, at:at + p], 0.0, 3.0)
    np.testing.assert_allclose(y[:, at:at + p], want, rtol=1e-5, atol=1e-5)
    assert np.isnan(y[:, :at]).all() and np.isnan(y[:, at + p:]).all()  # nothing outside the band


@pytest.mark.parametrize(("c", "h", "w", "k", "strides", "dilations", "begin"), [
    (3, 23, 20, 7, (2, 2), (1, 1), (3, 3)),
    (4, 11, 9, 3, (1, 2), (2, 1), (2, 1)),
    (2, 8, 8, 1, (3, 3), (1, 1), (0, 0)),
])
def test_im2col_of_a_band_is_the_band_of_the_whole(c: int, h: int, w: int, k: int, strides: tuple[int, int],
                                                   dilations: tuple[int, int], begin: tuple[int, int]) -> None:
    oh = (h + 2 * begin[0] - dilations[0] * (k - 1) - 1) // strides[0] + 1
    ow = (w + 2 * begin[1] - dilations[1] * (k - 1) - 1) // strides[1] + 1
    x = RNG.standard_normal((c, h, w), dtype=np.float32)
    values = {"c": c, "h": h, "w": w, "oh": oh, "ow": ow, "kh": k, "kw": k, "sh": strides[0], "sw": strides[1],
              "dh": dilations[0], "dw": dilations[1], "pt": begin[0], "pl": begin[1], "y0": 0, "task": 0, "tasks": 1}
    whole = np.full((c * k * k, oh * ow), np.nan, np.float32)
    _call("md_im2col_task", [x, whole], tuple(values[d] for d in IM2COL_DIMS))
    for y0 in range(oh):
        for rows in range(1, oh - y0 + 1):
            band = np.full((c * k * k, rows * ow), np.nan, np.float32)
            _call("md_im2col_task", [x, band], tuple({**values, "y0": y0, "oh": rows}[d] for d in IM2COL_DIMS))
            np.testing.assert_array_equal(band, whole[:, y0 * ow:(y0 + rows) * ow])


def _im2col_reference(x: np.ndarray, k: int, strides: tuple[int, int], dilations: tuple[int, int],
                      begin: tuple[int, int], oh: int, ow: int) -> np.ndarray:
    c, h, w = x.shape
    out = np.zeros((c, k, k, oh, ow), np.float32)
    for r in range(k):
        for t in range(k):
            for y in range(oh):
                ih = y * strides[0] - begin[0] + r * dilations[0]
                if not 0 <= ih < h:
                    continue
                iw = np.arange(ow) * strides[1] - begin[1] + t * dilations[1]
                ok = (iw >= 0) & (iw < w)
                out[:, r, t, y, ok] = x[:, ih, iw[ok]]
    return out.reshape(c * k * k, oh * ow)


@pytest.mark.parametrize(("c", "h", "w", "k", "strides", "begin"), [
    (3, 9, 224, 7, (2, 2), (3, 3)),  # ResNet's stem: rows of 112 outputs at stride 2
    (2, 7, 113, 3, (2, 2), (1, 1)),  # an odd width: the last outputs one by one
    (2, 6, 67, 3, (2, 2), (0, 0)),  # no padding: the last row of the input is read to its end
    (2, 4, 97, 3, (2, 2), (0, 0)),  # 48 outputs, the last at the input's last float: no 32-float load there
    (2, 5, 64, 1, (2, 2), (0, 0)),  # a strided 1x1 (a downsample)
    (3, 5, 50, 3, (1, 1), (1, 1)),  # stride 1: a copy
    (2, 6, 70, 3, (3, 3), (1, 1)),  # stride 3: one by one
])
def test_im2col_matches_numpy_and_reads_nothing_past_its_input(c: int, h: int, w: int, k: int,
                                                                strides: tuple[int, int],
                                                                begin: tuple[int, int]) -> None:
    oh = (h + 2 * begin[0] - (k - 1) - 1) // strides[0] + 1
    ow = (w + 2 * begin[1] - (k - 1) - 1) // strides[1] + 1
    x, release = _guarded((c, h, w), at_end=True)
    x[...] = RNG.standard_normal((c, h, w), dtype=np.float32)
    values = {"c": c, "h": h, "w": w, "oh": oh, "ow": ow, "kh": k, "kw": k, "sh": strides[0], "sw": strides[1],
              "dh": 1, "dw": 1, "pt": begin[0], "pl": begin[1], "y0": 0, "task": 0, "tasks": 1}
    cols = np.full((c * k * k, oh * ow), np.nan, np.float32)
    _call("md_im2col_task", [x, cols], tuple(values[d] for d in IM2COL_DIMS))
    np.testing.assert_array_equal(cols, _im2col_reference(np.array(x), k, strides, (1, 1), begin, oh, ow))
    release()


def test_im2col_bands_cover_the_image_in_blocks_the_kernel_takes() -> None:
    for depth, out_hw, weights in [(147, (112, 112), 0), (27, (112, 112), 0), (576, (7, 7), 0), (4608, (14, 14), 0),
                                   (9000, (3, 3), 0), (1152, (28, 28), 589824), (1152, (28, 28), 0)]:
        bands = conv_lowering.im2col_bands(depth, out_hw, weights)
        assert [y0 for y0, _ in bands] == list(np.cumsum([0] + [r for _, r in bands[:-1]]))
        assert sum(r for _, r in bands) == out_hw[0]
        assert all(r * out_hw[1] >= conv1x1_width() for _, r in bands) or len(bands) == 1
        # (a band is at least one row and one block)
        widest = max(conv_lowering.BAND_BYTES, conv_lowering.BAND_WEIGHTS * weights)
        assert all(4 * depth * (r - 1) * out_hw[1] < widest for _, r in bands[:-1]) or out_hw[1] < conv1x1_width()
    assert len(conv_lowering.im2col_bands(1152, (28, 28), 589824)) < len(conv_lowering.im2col_bands(1152, (28, 28)))


def test_bands_share_out_over_the_threads_when_units_are_few() -> None:
    for n in (1, 2, 3):
        for oh, ow in [(28, 28), (56, 56), (14, 14), (7, 7), (112, 112), (13, 40)]:
            for depth in (147, 576, 1152, 4608):
                for threads in (1, 2, 3, 4):
                    bands = conv_lowering.im2col_bands(depth, (oh, ow), depth * 128 * 4)
                    shared = conv_lowering._shared_out(bands, n, (oh, ow), threads)
                    assert [y0 for y0, _ in shared] == list(np.cumsum([0] + [r for _, r in shared[:-1]]))
                    assert sum(r for _, r in shared) == oh
                    if shared != bands:
                        assert len(shared) > len(bands) and (n * len(shared)) % threads == 0
                        assert min(r for _, r in shared) * ow >= conv1x1_width()
                    elif len(bands) > 1 and n * len(bands) < 4 * threads and (n * len(bands)) % threads:
                        widest = max(r for _, r in bands)  # (no even split into bands half as tall or more)
                        assert not any((n * (oh // rows)) % threads == 0 and oh % rows == 0
                                       for rows in range(max(1, widest // 2), widest) if rows * ow >= 32)
    assert conv_lowering._shared_out([(0, 9), (9, 9), (18, 10)], 1, (28, 28), 2) == [(0, 7), (7, 7), (14, 7), (21, 7)]


@pytest.mark.parametrize(("n", "rows", "cols", "tasks", "pad"), [
    (1, 1, 1, 1, 0), (2, 8, 8, 1, 0), (1, 17, 9, 2, 0), (3, 16, 24, 3, 0), (1, 4608, 49, 2, 0), (2, 5, 3, 4, 0),
    (1, 9, 16, 1, 0), (2, 1024, 13, 2, 16), (1, 17, 9, 1, 3)])
def test_transpose_matches_numpy(n: int, rows: int, cols: int, tasks: int, pad: int) -> None:
    x = RNG.standard_normal((n, rows, cols), dtype=np.float32)
    y = np.full((n, cols, rows + pad), np.nan, np.float32)
    for t in range(tasks):
        _call("md_transpose", [x, y], transpose_dims(n, rows, cols, t, tasks, ld=rows + pad))
    assert np.array_equal(y[:, :, :rows], x.transpose(0, 2, 1))
    assert np.isnan(y[:, :, rows:]).all()  # the padding is left as it was


def test_transpose_reads_rows_a_stride_apart() -> None:
    """``xs``: the input's rows further apart than its columns (a pixel-major value, each
    pixel's channels padded to a row stride, back to channels-major); the padding is not read."""
    n, rows, cols, xs = 2, 13, 37, 48
    x = np.full((n, rows, xs), np.nan, np.float32)
    x[:, :, :cols] = RNG.standard_normal((n, rows, cols), dtype=np.float32)
    y = np.full((n, cols, rows), np.nan, np.float32)
    for t in range(2):
        _call("md_transpose", [x, y], transpose_dims(n, rows, cols, t, 2, xs=xs))
    assert np.array_equal(y, x[:, :, :cols].transpose(0, 2, 1))


@pytest.mark.parametrize(("n", "cin", "cout", "p", "residual", "bounds", "tasks"), [
    (1, 5, 3, 1, False, (-math.inf, math.inf), 1),
    (2, 7, 17, 13, True, (0.0, math.inf), 2),
    (1, 64, 40, 49, True, (-1.0, 0.5), 3),
    (3, 33, 16, 6, False, (0.0, 6.0), 1),
    (1, 300, 100, 23, True, (-math.inf, math.inf), 2),
    (2, 16, 32, 196, False, (0.0, math.inf), 4),
    (2, 1024, 40, 11, True, (0.0, math.inf), 2),  # a pixel's channels at gemm_lda(1024): one line further
])
def test_conv1x1t_matches_float64(n: int, cin: int, cout: int, p: int, residual: bool,
                                  bounds: tuple[float, float], tasks: int) -> None:
    """Pixels as the tile's rows: the input transposed first, every tail of rows and of
    channels (a last panel narrower than the panel) written exactly once, nothing past them."""
    x = RNG.standard_normal((n, cin, p), dtype=np.float32)
    w = RNG.standard_normal((cout, cin), dtype=np.float32)
    width = gemm_panel()  # md_conv1x1t's panels of channels: 16 (AVX2) or 32 (AVX-512)
    bias = np.zeros(-(-cout // width) * width, np.float32)
    bias[:cout] = RNG.standard_normal(cout, dtype=np.float32)
    res = RNG.standard_normal((n, cout, p), dtype=np.float32)
    ldx = gemm_lda(cin)
    xt = np.full((n, p, ldx), np.nan, np.float32)  # (any padding is never read)
    flat = np.full(n * cout * p + NR, np.nan, np.float32)  # NR floats more: they must stay untouched
    y = flat[:n * cout * p].reshape(n, cout, p)
    packed = pack_gemm_weights(np.ascontiguousarray(w.T), width)
    _call("md_transpose", [x, xt], transpose_dims(n, cin, p, ld=ldx))
    for t in range(tasks):
        _call("md_conv1x1t", [xt, packed, bias, res if residual else None, y],
              conv1x1t_dims(n, cin, cout, p, residual=residual, lo=bounds[0], hi=bounds[1], task=t, tasks=tasks,
                            ldx=ldx))
    want = np.einsum("rk,nkp->nrp", w.astype(np.float64), x.astype(np.float64)) + bias[:cout, None]
    if residual:
        want += res
    # (float32 sums of up to 300 products: errors reach ~1e-5 of values ~20)
    np.testing.assert_allclose(y, np.clip(want, *bounds), rtol=1e-4, atol=1e-4)
    assert np.isnan(flat[n * cout * p:]).all()


def test_conv1x1_keeps_nan_through_its_bounds() -> None:
    p = conv1x1_width()  # (the kernel's block of pixels)
    x = np.full((1, 2, p), np.nan, np.float32)
    y = np.zeros((1, 1, p), np.float32)
    _call("md_conv1x1", [x, pack_conv1x1_weights(np.ones((1, 2), np.float32)), np.zeros(1, np.float32), None, y],
          conv1x1_dims(1, 2, 1, p, lo=0.0, hi=6.0))
    assert np.isnan(y).all()  # as numpy's clip and ONNX's Clip: NaN stays NaN


def _block() -> md.Graph:
    """Pointwise conv + residual + Relu; pointwise conv + Clip; depthwise + Clip; a plain 1x1."""
    g = GraphBuilder("block")
    x = g.input("x", parse_type("f32[n,8,10,10]"))
    r = g.input("r", parse_type("f32[n,16,10,10]"))

    def conv(v: object, cout: int, cin: int, **attrs: object) -> object:
        k = 3 if attrs.get("group") else 1
        w = RNG.standard_normal((cout, cin, k, k), dtype=np.float32) * 0.3
        y, = g.node("Conv", [v, g.const(f"w{len(g.nodes)}", w), g.const(f"b{len(g.nodes)}",
                                                                         RNG.standard_normal(cout, dtype=np.float32))],
                    dict(attrs))
        return y

    a = conv(x, 16, 8)
    a, = g.node("Add", [a, r])
    a, = g.node("Relu", [a])
    lo, hi = g.const("lo", np.array(0.0, np.float32)), g.const("hi", np.array(6.0, np.float32))
    b = conv(a, 16, 16)
    b, = g.node("Clip", [b, lo, hi])
    c = conv(b, 16, 1, group=16, pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    c, = g.node("Clip", [c, lo, hi])
    d = conv(c, 4, 16)
    g.output(d)
    return g.build()


@pytest.mark.parametrize("prefer", [conv1x1.OWN, conv1x1.OWN_T, conv1x1.BLAS])
def test_fused_groups_run_our_kernels(prefer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conv1x1, "PREFER", prefer)
    graph = md.optimize(_block(), level="aggressive")
    exe = md.compile(graph, target="x86")
    ref = md.compile(graph, target="reference")
    for batch in (1, 3):
        feeds = {"x": RNG.standard_normal((batch, 8, 10, 10), dtype=np.float32),
                 "r": RNG.standard_normal((batch, 16, 10, 10), dtype=np.float32)}
        got, want = exe.run(feeds), ref.run(feeds)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4)
    kinds = exe.executable.programs.bound({"n": 3}).call_kinds
    if prefer == conv1x1.OWN:
        assert kinds["conv2d 1x1 own kernel + epilogue"] == 2 and kinds["conv2d 1x1 own kernel"] == 1
        assert kinds["depthwise 3x3 + bounds"] == 1
        assert "epilogue" not in kinds  # every epilogue went into a kernel's stores
    elif prefer == conv1x1.OWN_T:  # the depthwise conv between two convs on pixel rows runs on them too
        assert kinds["depthwise 3x3 on pixel rows + bounds"] == 1 and "depthwise 3x3 + bounds" not in kinds
        assert kinds["conv2d 1x1 own kernel, pixel rows stored + epilogue"] == 1
        assert kinds["conv2d 1x1 own kernel, pixel rows + epilogue"] == 1
        assert kinds["conv2d 1x1 own kernel, pixel rows"] == 1 and kinds["conv2d 1x1 transpose"] == 2
        assert "epilogue" not in kinds
    else:
        assert kinds["depthwise 3x3 + bounds"] == 1
        assert not any("own kernel" in k for k in kinds)



def _guarded(shape: tuple[int, ...], at_end: bool) -> tuple[np.ndarray, Any]:
    """A float32 array whose first (or last) byte touches an inaccessible page: a kernel that
    reads one float before (after) it crashes the test instead of passing by luck."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    nbytes = 4 * math.prod(shape)
    data_pages = -(-nbytes // page)
    buf = mmap.mmap(-1, (data_pages + 2) * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    for guard in (base, base + (data_pages + 1) * page):
        assert libc.mprotect(guard, page, 0) == 0  # PROT_NONE
    start = page + (data_pages * page - nbytes if at_end else 0)
    array = np.frombuffer(buf, np.float32, math.prod(shape), start).reshape(shape)

    def release() -> None:
        for guard in (base, base + (data_pages + 1) * page):
            libc.mprotect(guard, page, 3)  # PROT_READ | PROT_WRITE, so that mmap can unmap it
    return array, release


def _convs() -> md.Graph:
    """Convs that im2col serves: 3x3 stride 2 + Relu, 1x1 stride 3 (9 pixels: fewer than
    md_conv1x1's block of 16), 5x5 dilated + residual + Clip,
    7x7 stride 2 padded on one side, a 3x3 stride-1 conv too small for Winograd + Relu."""
    g = GraphBuilder("convs")
    x = g.input("x", parse_type("f32[n,6,15,15]"))

    def conv(v: object, cout: int, cin: int, k: int, **attrs: object) -> object:
        w = RNG.standard_normal((cout, cin, k, k), dtype=np.float32) * 0.3
        y, = g.node("Conv", [v, g.const(f"w{len(g.nodes)}", w),
                             g.const(f"b{len(g.nodes)}", RNG.standard_normal(cout, dtype=np.float32))],
                    {"kernel_shape": [k, k], **attrs})
        return y

    a = conv(x, 20, 6, 3, strides=[2, 2], pads=[1, 1, 1, 1])  # [n, 20, 8, 8]
    a, = g.node("Relu", [a])
    b = conv(a, 20, 20, 1, strides=[3, 3])  # [n, 20, 3, 3]
    c = conv(a, 20, 20, 5, dilations=[2, 2], pads=[4, 4, 4, 4])  # [n, 20, 8, 8]
    c, = g.node("Add", [c, a])
    c, = g.node("Clip", [c, g.const("lo", np.array(-1.0, np.float32)), g.const("hi", np.array(2.0, np.float32))])
    d = conv(c, 7, 20, 7, strides=[2, 2], pads=[3, 3, 2, 2])  # [n, 7, 4, 4]
    e = conv(c, 4, 20, 3, pads=[1, 1, 1, 1])  # [n, 4, 8, 8]: fewer than 8 channels out, no Winograd
    e, = g.node("Relu", [e])
    g.output(b)
    g.output(d)
    g.output(e)
    return g.build()


@pytest.mark.parametrize(("prefer", "bands"), [(conv1x1.OWN, False), (conv1x1.OWN_C, False), (conv1x1.OWN_T, False),
                                               (conv1x1.BLAS, False), (conv1x1.OWN, True), (conv1x1.OWN_C, True)])
def test_im2col_convs_run_our_kernels_with_their_epilogues(prefer: str, bands: bool,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Each image's im2col, then our kernel (the residual add and the bounds in its stores)
    give the reference backend's outputs, on two batch sizes without compiling again; with
    ``bands``, each image in bands of output rows (its columns, then their product)."""
    monkeypatch.setattr(conv1x1, "PREFER", prefer)
    if bands:
        monkeypatch.setattr(conv_lowering, "BAND_BYTES", 1)
        monkeypatch.setattr(conv_lowering, "BAND_WEIGHTS", 0)
    graph = md.optimize(_convs(), level="aggressive")
    exe = md.compile(graph, target="x86", threads=1)
    two = md.compile(graph, target="x86", threads=2, cache=False)
    ref = md.compile(graph, target="reference")
    for batch in (1, 3):
        feeds = {"x": RNG.standard_normal((batch, 6, 15, 15), dtype=np.float32)}
        want = ref.run(feeds)
        for got in (exe.run(feeds), two.run(feeds)):
            for k in want:
                np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4)
    kinds = exe.executable.programs.bound({"n": 3}).call_kinds
    program = two.executable.programs.bound({"n": 3})
    groups = sum(segment.count for segment in program.segments)
    if prefer in (conv1x1.OWN, conv1x1.OWN_C):  # each unit's im2col joins the product of the unit before
        assert groups < program.native_calls, program.describe()
    own = sum(v for k, v in kinds.items() if k.startswith("conv2d own kernel"))
    width = conv1x1_width()  # the kernel's block of pixels: 16 (AVX2) or 32 (AVX-512)
    small = int(width <= 16)  # the 4x4 output: pixels as columns only where 16 pixels make a block
    if prefer == conv1x1.BLAS:
        assert own == 0 and kinds["conv2d sgemm"] == 3 * 5
    elif bands:  # the 8x8 outputs in bands of a block's rows (2 or 4), the 4x4 in one where it fits a block
        band_rows = -(-width // 8)
        assert own == kinds["conv2d im2col"] - 3 * (2 - small) == 3 * (3 * (8 // band_rows) + small)
    else:  # pixels as columns: not the 9-pixel conv, which takes sgemm
        assert own == 3 * (5 if prefer == conv1x1.OWN_T else 3 + small)
        assert kinds["conv2d im2col"] == 3 * 5
        assert "epilogue" not in kinds  # Relu, and the residual add with its Clip, went into the stores
        if prefer == conv1x1.OWN_T:
            assert kinds["conv2d transpose"] == 3 * 5


AVX2_SCRIPT = """
import ctypes, json
import numpy as np
from metadef.codegen import native_gemm as g, native_tile
# before any routine is built: the tiles of a host without AVX-512
g.tile_lanes = native_tile.tile_lanes = lambda: 8
from metadef.codegen.native import ENTRY, native_function
rng = np.random.default_rng(3)
def call(name, arrays, dims):
    args = (ctypes.c_void_p * len(arrays))(*[None if a is None else a.ctypes.data for a in arrays])
    ENTRY(native_function(name))(args, (ctypes.c_int64 * len(dims))(*dims))
errors = {}
for m, n, k in [(27, 40, 131), (8, 512, 78), (1, 17, 33)]:
    x, w = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    packed = g.pack_gemm_weights(w)
    y = np.full((m, n), np.nan, np.float32)
    call("md_gemm", [x, packed, np.zeros(packed.shape[0] * packed.shape[2], np.float32), y], g.gemm_dims(m, n, k))
    errors[f"gemm {m}x{n}x{k}"] = float(np.abs(y - x.astype(np.float64) @ w).max())
res = rng.standard_normal((27, 40), dtype=np.float32)  # a residual, a last panel of 8 columns
y = np.full((27, 40), np.nan, np.float32)
call("md_gemm", [x := rng.standard_normal((27, 131), dtype=np.float32), g.pack_gemm_weights(w := rng.standard_normal(
    (131, 40), dtype=np.float32)), np.zeros(48, np.float32), y, res], g.gemm_dims(27, 40, 131, residual=True))
errors["gemm + residual"] = float(np.abs(y - x.astype(np.float64) @ w - res).max())
from metadef.codegen.native_direct import direct_dims, direct_slack
xp = np.zeros(2 * 5 * 11 * 13 + direct_slack(2), np.float32)
xp[:2 * 5 * 11 * 13] = rng.standard_normal(2 * 5 * 11 * 13, dtype=np.float32)
wd = rng.standard_normal((19, 5, 3, 3), dtype=np.float32)
packed = g.pack_rows(wd.reshape(19, -1), g.gemm_panel())
y = np.full((2, 19, 5, 6), np.nan, np.float32)
call("md_conv_direct", [xp, packed, np.zeros(packed.shape[0] * 16, np.float32), None, y],
     direct_dims(2, 5, 19, (11, 13), (5, 6), (3, 3), 2))
xv = xp[:2 * 5 * 11 * 13].reshape(2, 5, 11, 13).astype(np.float64)
want = sum(np.einsum("ncij,oc->noij", xv[:, :, ky:ky + 9:2, kx:kx + 11:2], wd[:, :, ky, kx]) for ky in range(3)
           for kx in range(3))
errors["direct conv 3x3 stride 2"] = float(np.abs(y - want).max())
for cin, cout, p in [(33, 17, 40), (16, 96, 300)]:
    x, w = rng.standard_normal((1, cin, p), dtype=np.float32), rng.standard_normal((cout, cin), dtype=np.float32)
    y = np.full((1, cout, p), np.nan, np.float32)
    call("md_conv1x1", [x, g.pack_conv1x1_weights(w), np.zeros(cout, np.float32), None, y],
         g.conv1x1_dims(1, cin, cout, p))
    errors[f"conv1x1 {cin}->{cout}@{p}"] = float(np.abs(y[0] - w.astype(np.float64) @ x[0]).max())
    xt = np.ascontiguousarray(x.transpose(0, 2, 1))
    packed = g.pack_rows(w, g.gemm_panel())
    y = np.full((1, cout, p), np.nan, np.float32)
    call("md_conv1x1t", [xt, packed, np.zeros(packed.shape[0] * 16, np.float32), None, y],
         g.conv1x1t_dims(1, cin, cout, p))
    errors[f"conv1x1t {cin}->{cout}@{p}"] = float(np.abs(y[0] - w.astype(np.float64) @ x[0]).max())
from metadef.codegen.native_bmm import bmm_dims
for trans in (False, True):
    a, b = rng.standard_normal((2, 13, 9), dtype=np.float32), rng.standard_normal((2, 9, 37), dtype=np.float32)
    y = np.full((2, 13, 37), np.nan, np.float32)
    call("md_bmm", [a, np.ascontiguousarray(b.transpose(0, 2, 1)) if trans else b, y],
         bmm_dims(2, 13, 37, 9, trans_b=trans))
    errors[f"bmm trans_b={trans}"] = float(np.abs(y - a.astype(np.float64) @ b).max())
print(json.dumps({"rows": g.conv1x1_rows(), "tiles": g.gemm_row_tiles(), "panel": g.gemm_panel(),
                  "width": g.conv1x1_width(), "lanes": native_tile.tile_lanes(), "errors": errors}))
"""


def test_the_avx2_tiles_match_float64_too(tmp_path: Any) -> None:
    """On a host without AVX-512 the tiles are 6 rows of two 256-bit halves: built here (in a
    process of its own, with its own cache) by making the host's lanes 8, and checked."""
    import json
    import os
    import subprocess
    import sys
    env = {**os.environ, "METADEF_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", AVX2_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["rows"] == 6 and got["tiles"] == [6, 4, 2, 1] and got["panel"] == got["width"] == 16
    assert got["lanes"] == 8
    assert all(error < 1e-3 for error in got["errors"].values()), got["errors"]
    assert len(got["errors"]) == 11


def test_the_column_walks_do_not_race_on_small_images_unless_their_input_is_fresh(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Any, list[str], dict[str, float]]] = []

    def record(key: Any, candidates: Any, handicaps: dict[str, float]) -> tuple[str, str]:
        seen.append((key, sorted(candidates), handicaps))
        return conv1x1.OWN_T, "recorded by the test"
    monkeypatch.setattr(conv1x1, "measured_choice", record)
    monkeypatch.setattr(conv1x1, "known_choice", lambda key, names: None)
    product = conv1x1.WeightProduct(RNG.standard_normal((64, 32), dtype=np.float32), None, conv1x1.NULL, False,
                                    (-math.inf, math.inf))
    for p, fresh in ((196, False), (196, True), (3136, False)):
        assert product.choice(p, fresh=fresh) == conv1x1.OWN_T
    (small_key, small, _), (fresh_key, fresh, _), (_, large, handicaps) = seen
    assert small == sorted([conv1x1.BLAS, conv1x1.OWN_T])
    assert fresh == large == sorted([conv1x1.BLAS, conv1x1.OWN, conv1x1.OWN_C, conv1x1.OWN_T])
    assert handicaps == {conv1x1.OWN: conv1x1.PIXELS_OUTER_HANDICAP}
    assert small_key != fresh_key  # (a fresh input's choice is kept apart from the image's)
    # where pixels as rows cannot run (a bias read through its argument, channels not whole
    # panels), the column walks race on small images too
    odd = conv1x1.WeightProduct(RNG.standard_normal((20, 32), dtype=np.float32), None, conv1x1.Arg("in", 2), False,
                                (-math.inf, math.inf))
    assert not odd.rows_possible
    odd.choice(196)
    assert seen[-1][1] == sorted([conv1x1.BLAS, conv1x1.OWN, conv1x1.OWN_C])


def test_a_handicap_keeps_a_candidate_that_only_ties_from_winning() -> None:
    # (md_conv1x1's pixel blocks outer ties its chunks in a race, data in cache, and loses in a model)
    from metadef.backends.x86.native import remember_choice

    close = {conv1x1.OWN: 1.00e-3, conv1x1.OWN_C: 1.03e-3}
    winner, text = remember_choice(("test: a close race",), close, close, {conv1x1.OWN: conv1x1.PIXELS_OUTER_HANDICAP})
    assert winner == conv1x1.OWN_C and "x1.05 to win" in text
    clear = {conv1x1.OWN: 0.90e-3, conv1x1.OWN_C: 1.00e-3}
    assert remember_choice(("test: a clear win",), clear, clear, {conv1x1.OWN: 1.05})[0] == conv1x1.OWN
