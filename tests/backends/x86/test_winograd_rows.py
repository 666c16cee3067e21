"""x86: Winograd convs between pixel-major values (``md_winograd*_rows_*``: the transforms
vectorized along the channels, V and M laid out as the products' rows)."""

from __future__ import annotations

import itertools
import math
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metadef as md
from metadef.backends.x86 import conv1x1, winograd
from metadef.backends.x86.native import pixel_stride, timed_call
from metadef.backends.x86.winograd import winograd_weights
from metadef.codegen.native import native_function
from metadef.codegen.native_tile import tile_lanes
from metadef.codegen.native_winograd_rows import WINOGRAD_ROWS_DIMS, rows_routine
from metadef.ir import GraphBuilder
from metadef.shape import parse_type

pytestmark = pytest.mark.jit
RNG = np.random.default_rng(11)
SENTINEL = -7.0


def _bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def _direct(x: np.ndarray, w: np.ndarray, bias: np.ndarray, pads: tuple[int, int], out_hw: tuple[int, int],
            bounds: tuple[float, float]) -> np.ndarray:
    """The 3x3 conv in float64, zeros outside ``x``: ``[n, k, oh, ow]``."""
    n, c, h, w_ = x.shape
    oh, ow = out_hw
    padded = np.zeros((n, c, oh + 2, ow + 2))
    rows, cols = min(h, oh + 2 - pads[0]), min(w_, ow + 2 - pads[1])
    padded[:, :, pads[0]:pads[0] + rows, pads[1]:pads[1] + cols] = x[:, :, :rows, :cols]
    out = np.zeros((n, w.shape[0], oh, ow))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,kc->nkhw", padded[:, :, i:i + oh, j:j + ow], w[:, :, i, j].astype(np.float64))
    return np.clip(out + bias[None, :, None, None], *bounds)


def _rows_conv(x: np.ndarray, w: np.ndarray, bias: np.ndarray, pads: tuple[int, int], out_hw: tuple[int, int],
               m: int, bounds: tuple[float, float], tasks: int) -> np.ndarray:
    """The input phase into V's rows, numpy's products, the output phase; each phase run as
    ``tasks`` tasks. Returns the pixel-major output, its rows ``pixel_stride(k)`` floats."""
    n, c, h, w_ = x.shape
    k, (oh, ow), a = w.shape[0], out_hw, m + 2
    count = n * -(-oh // m) * -(-ow // m)
    ldx, ldy = pixel_stride(c), pixel_stride(k)
    rows = np.full((n, h * w_, ldx), np.nan, np.float32)  # (the padding lanes: never read)
    rows[:, :, :c] = x.transpose(0, 2, 3, 1).reshape(n, h * w_, c)
    v_plane, m_plane = count * ldx + 16, count * ldy + 16
    v = np.full(a * a * v_plane, np.nan, np.float32)
    mm = np.full(a * a * m_plane, np.nan, np.float32)
    y = np.full((n, oh * ow, ldy), SENTINEL, np.float32)
    dims = {"n": n, "c": c, "h": h, "w": w_, "k": k, "oh": oh, "ow": ow, "pt": pads[0], "pl": pads[1], "ldx": ldx,
            "ldv": ldx, "v_plane": v_plane, "ldm": ldy, "m_plane": m_plane, "ldy": ldy, "lo": _bits(bounds[0]),
            "hi": _bits(bounds[1])}

    def phase(name: str, pointers: list[int]) -> None:
        for t in range(tasks):
            timed_call(native_function(rows_routine(m, name)), pointers,
                       [{**dims, "task": t, "tasks": tasks}[d] for d in WINOGRAD_ROWS_DIMS])()

    phase("in", [rows.ctypes.data, v.ctypes.data])
    u = winograd_weights(w, m)
    for e in range(a * a):
        plane = mm[e * m_plane:e * m_plane + count * ldy].reshape(count, ldy)
        plane[:, :k] = v[e * v_plane:e * v_plane + count * ldx].reshape(count, ldx)[:, :c] @ u[e].T
    phase("out", [mm.ctypes.data, y.ctypes.data, bias.ctypes.data])
    return y


@settings(max_examples=40, deadline=None)
@given(m=st.sampled_from([2, 4]), n=st.integers(1, 3), h=st.integers(1, 13), w=st.integers(1, 13),
       c=st.sampled_from([1, 2]), k=st.sampled_from([1, 3]), pt=st.integers(0, 1), pl=st.integers(0, 1),
       tasks=st.sampled_from([1, 2, 5]), relu=st.booleans())
def test_pixel_rows_transforms_compute_the_direct_conv(m: int, n: int, h: int, w: int, c: int, k: int, pt: int,
                                                       pl: int, tasks: int, relu: bool) -> None:
    """Any image (tiles inside it and across its edges, whole or cropped at the output's),
    pads of 0 or 1 before each axis, several images, bounds, the tiles shared out among
    tasks: the direct conv's outputs, and nothing written past a pixel's ``k`` channels."""
    lanes = tile_lanes()
    c, k = c * lanes, k * lanes
    oh, ow = h + 2 * pt - 2, w + 2 * pl - 2
    if oh < 1 or ow < 1:
        return
    x = RNG.standard_normal((n, c, h, w), dtype=np.float32)
    weight = RNG.standard_normal((k, c, 3, 3), dtype=np.float32) / math.sqrt(9 * c)
    bias = RNG.standard_normal(k, dtype=np.float32)
    bounds = (0.0, math.inf) if relu else (-math.inf, math.inf)
    y = _rows_conv(x, weight, bias, (pt, pl), (oh, ow), m, bounds, tasks)
    want = _direct(x, weight, bias, (pt, pl), (oh, ow), bounds)
    got = y[:, :, :k].reshape(n, oh, ow, k).transpose(0, 3, 1, 2)
    # (F(4x4)'s rounding error: ~1e-5 of the outputs' scale; F(2x2)'s the direct conv's)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=(3e-5 if m == 4 else 3e-6) * max(1.0, np.abs(want).max()))
    assert (y[:, :, k:] == SENTINEL).all()


def test_a_pixel_stride_past_the_channels_is_kept() -> None:
    """1024 channels: rows of ``pixel_stride(1024)`` = 1040 floats in and out (the lanes past
    the channels neither read, they hold NaN, nor written)."""
    x = RNG.standard_normal((1, 1024, 5, 6), dtype=np.float32)
    weight = RNG.standard_normal((1024, 1024, 3, 3), dtype=np.float32) / 96
    bias = RNG.standard_normal(1024, dtype=np.float32)
    unbounded = (-math.inf, math.inf)
    y = _rows_conv(x, weight, bias, (1, 1), (5, 6), 2, unbounded, 2)
    assert y.shape[-1] == pixel_stride(1024) > 1024 and (y[:, :, 1024:] == SENTINEL).all()
    got = y[:, :, :1024].reshape(1, 5, 6, 1024).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, _direct(x, weight, bias, (1, 1), (5, 6), unbounded), rtol=1e-4, atol=1e-4)


def _bottleneck(size: int, channels: int) -> md.Graph:
    """ResNet's block: a pointwise conv, a 3x3 conv (+ Relu), a pointwise conv with the
    block's input added; twice."""
    g = GraphBuilder("bottleneck")
    x = g.input("x", parse_type(f"f32[n,{2 * channels},{size},{size}]"))

    def conv(v: Any, cout: int, cin: int, k: int, residual: Any = None) -> Any:
        w = RNG.standard_normal((cout, cin, k, k), dtype=np.float32) / math.sqrt(cin * k * k)
        y, = g.node("Conv", [v, g.const(f"w{len(g.nodes)}", w), g.const(f"b{len(g.nodes)}",
                                                                          RNG.standard_normal(cout, dtype=np.float32))],
                    {"kernel_shape": [k, k], "pads": [k // 2] * 4})
        if residual is not None:
            y, = g.node("Add", [y, residual])
        y, = g.node("Relu", [y])
        return y

    for _ in range(2):
        x = conv(conv(conv(x, channels, 2 * channels, 1), channels, channels, 3), 2 * channels, channels, 1,
                 residual=x)
    g.output(x)
    return g.build()


def _forced(monkeypatch: pytest.MonkeyPatch, m: int) -> None:
    """Winograd F(m x m) for every 3x3 conv, pointwise convs on pixel rows."""
    monkeypatch.setattr(winograd, "known_choice", lambda key, names: None)
    monkeypatch.setattr(winograd, "measured_choice",
                        lambda key, candidates: ("winograd4" if m == 4 else "winograd", "forced by the test"))
    monkeypatch.setattr(conv1x1, "PREFER", conv1x1.OWN_T)


def _check(graph: md.Graph, threads: int, sizes: tuple[int, ...], batches: tuple[int, ...] = (1, 3)
           ) -> dict[str, int]:
    """The x86 outputs against the reference backend's on each batch size; the call kinds of
    the last batch's program."""
    ref = md.compile(graph, target="reference")
    session = md.compile(graph, target="x86", threads=threads, cache=False)
    for n in batches:
        feeds = {"x": RNG.standard_normal((n, *sizes), dtype=np.float32)}
        got, want = session.run(feeds), ref.run(feeds)
        for name in want:
            scale = max(1.0, float(np.abs(want[name]).max()))
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=3e-5 * scale)
    return session.executable.programs.bound({"n": batches[-1]}).call_kinds


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("threads", [1, 2])
def test_bottleneck_blocks_run_winograd_on_pixel_rows(m: int, threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between pointwise convs on pixel rows the 3x3 convs read and write pixel rows: no
    transpose of V before the products, no transpose around the block; the reference
    backend's outputs on two batch sizes. Without the form, each goes by planes."""
    _forced(monkeypatch, m)
    lanes = tile_lanes()
    graph = md.optimize(_bottleneck(14, 2 * lanes), level="aggressive")
    sizes = (4 * lanes, 14, 14)
    rows = _check(graph, threads, sizes)
    stem = f"conv2d winograd F({m}x{m},3x3) on pixel rows"
    groups = 2 * -(-3 // winograd.winograd_group(3, 2 * lanes, 2 * lanes, 14, 14, m))  # (two convs, a batch of 3)
    assert rows[f"{stem} input"] == rows[f"{stem} output"] == groups, rows
    assert rows[f"{stem} product own kernel, pixel rows stored"] == groups * (m + 2) ** 2
    assert not any("transpose" in kind and "winograd" in kind for kind in rows), rows
    monkeypatch.setattr(winograd, "PIXEL_ROWS", False)
    planes = _check(graph, threads, sizes)
    assert not any("on pixel rows" in kind for kind in planes) and planes["conv2d winograd product transpose"] > 0


@pytest.mark.parametrize("threads", [1, 2])
def test_a_winograd_conv_between_layouts_transposes_its_side(threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """With pixel rows on one side only (its form made to cost nothing then): an NCHW input
    transposed into pixel rows first (the graph's input into the first block), a pixel-major
    output transposed back into planes (the last block's, for the graph's output); the
    reference backend's outputs."""
    _forced(monkeypatch, 2)
    monkeypatch.setattr(winograd, "_rows_cost", lambda x, out: lambda args: 0 if args else 1)
    lanes = tile_lanes()
    g = GraphBuilder("sides")
    x = g.input("x", parse_type(f"f32[n,{lanes},9,9]"))

    def conv3x3(v: Any, cout: int, cin: int) -> Any:
        w = RNG.standard_normal((cout, cin, 3, 3), dtype=np.float32) / math.sqrt(9 * cin)
        y, = g.node("Conv", [v, g.const(f"w{len(g.nodes)}", w)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})
        return y

    def pointwise(v: Any, cout: int, cin: int) -> Any:
        w = RNG.standard_normal((cout, cin, 1, 1), dtype=np.float32) / math.sqrt(cin)
        y, = g.node("Conv", [v, g.const(f"w{len(g.nodes)}", w)], {"kernel_shape": [1, 1]})
        return y

    first = pointwise(conv3x3(x, 2 * lanes, lanes), lanes, 2 * lanes)  # NCHW in, pixel rows out
    last = conv3x3(pointwise(x, lanes, lanes), lanes, lanes)  # pixel rows in, planes out (a graph output)
    g.output(first)
    g.output(last)
    kinds = _check(md.optimize(g.build(), level="aggressive"), threads, (lanes, 9, 9))
    stem = "conv2d winograd F(2x2,3x3) on pixel rows"
    groups = [-(-3 // winograd.winograd_group(3, c, k, 9, 9, 2)) for c, k in ((lanes, 2 * lanes), (lanes, lanes))]
    assert [kinds[f"{stem} input transpose"], kinds[f"{stem} output transpose"]] == groups, kinds  # (a group at a time)


def test_products_packed_another_way_are_packed_again_back_to_back() -> None:
    """A conv whose planes' way packed its products for ``md_conv1x1`` and let the transformed
    weights go: its pixel-rows step makes them again, packs them for ``md_gemm`` one after the
    other in one array, and lets them go again."""
    from metadef.backends.x86.native import NULL, Arg

    lanes = tile_lanes()
    weights = winograd.WinogradWeights(RNG.standard_normal((lanes, lanes, 3, 3), dtype=np.float32))
    _, products = weights.of(2)
    for product in products:
        product.packed(conv1x1.OWN)
    weights.drop(2)
    step = winograd.winograd_rows_step((1, lanes, 6, 6), lanes, (6, 6), [1, 1], Arg("in", 0), NULL, Arg("out", 0),
                                       weights, (-math.inf, math.inf), 2, "test")
    packed = [product.packed(conv1x1.OWN_T)[0] for product in products]
    assert all(b.ctypes.data == a.ctypes.data + a.nbytes for a, b in itertools.pairwise(packed))
    assert all(product.weight is None for product in products) and 2 not in weights.u
    assert [call.what for call in step.calls].count("test product own kernel, pixel rows stored") == 16
