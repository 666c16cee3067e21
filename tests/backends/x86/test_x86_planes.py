"""Kernels over planes, against the reference backend: the 3x3 depthwise conv ``md_depthwise``
and the 3x3 max pool ``md_maxpool3x3`` (strides, padding, NaN), their variants that read planes
in place (only inside their input: guard pages), which of those routines a node needs, and the
5x5 / 7x7 depthwise convs ``md_depthwise5`` / ``md_depthwise7`` (rows computed in groups)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import metadef as md
from metadef.backends.x86.native import needs as native_needs
from metadef.codegen.native_depthwise import ROW_GROUP, depthwise_dims, depthwise_routine, in_place, maxpool_routine
from metadef.ir import GraphBuilder
from metadef.shape import parse_type
from tests.backends.x86.test_x86_own_kernels import _call, _guarded

pytestmark = pytest.mark.jit
RNG = np.random.default_rng(13)


def _conv_ort(x: np.ndarray, w: np.ndarray, b: np.ndarray, strides: list[int], pads: list[int]) -> np.ndarray:
    g = GraphBuilder("dw")
    xi = g.input("x", parse_type(f"f32[{','.join(map(str, x.shape))}]"))
    y, = g.node("Conv", [xi, g.const("w", w), g.const("b", b)],
                {"group": x.shape[1], "strides": strides, "pads": pads, "kernel_shape": list(w.shape[2:])})
    g.output(y)
    return md.compile(g.build(), target="reference").run({"x": x})[y.name]


@pytest.mark.parametrize(("n", "c", "h", "w", "strides", "pads", "bounds"), [
    (1, 8, 20, 19, [1, 1], [1, 1, 1, 1], (0.0, 6.0)),
    (2, 5, 15, 13, [2, 2], [1, 1, 1, 1], (-math.inf, math.inf)),
    (1, 3, 9, 10, [1, 3], [2, 0, 1, 2], (-1.0, 1.0)),
    (1, 4, 2, 2, [1, 1], [1, 1, 1, 1], (0.0, math.inf)),
    (1, 2, 5, 1, [2, 1], [1, 1, 1, 1], (-9.0, 9.0)),
    (1, 6, 40, 37, [2, 2], [0, 0, 1, 1], (0.0, 6.0)),
    # MobileNetV2's small planes: rows end in one whole vector step (lanes past the row filled)
    (2, 6, 7, 7, [1, 1], [1, 1, 1, 1], (0.0, 6.0)),
    (1, 5, 14, 14, [2, 2], [1, 1, 1, 1], (0.0, 6.0)),
    (1, 3, 28, 30, [2, 2], [0, 0, 1, 1], (-math.inf, math.inf)),
    (1, 4, 14, 14, [1, 1], [1, 1, 1, 1], (-math.inf, math.inf)),
    # small planes alternate between two padded copies (an odd count per task too); a large
    # plane (over DOUBLE_FLOATS padded) has one
    (3, 7, 7, 7, [1, 1], [1, 1, 1, 1], (0.0, 6.0)),
    (1, 3, 100, 90, [1, 1], [1, 1, 1, 1], (-math.inf, math.inf)),
    (1, 3, 100, 90, [2, 2], [1, 1, 1, 1], (0.0, 6.0)),
])
def test_depthwise_matches_reference(n: int, c: int, h: int, w: int, strides: list[int], pads: list[int],
                                     bounds: tuple[float, float]) -> None:
    x = RNG.standard_normal((n, c, h, w), dtype=np.float32)
    wt = RNG.standard_normal((c, 1, 3, 3), dtype=np.float32)
    b = RNG.standard_normal(c, dtype=np.float32)
    want = np.clip(_conv_ort(x, wt, b, strides, pads), *bounds)
    y = np.full(want.shape, np.nan, np.float32)
    for t in range(2):
        _call("md_depthwise", [x, wt, b, y], depthwise_dims(n, c, (h, w), want.shape[2:], tuple(strides),
                                                            (pads[0], pads[1]), lo=bounds[0], hi=bounds[1],
                                                            task=t, tasks=2))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def _pool_ort(x: np.ndarray, strides: list[int], pads: list[int], k: int = 3) -> np.ndarray:
    g = GraphBuilder("pool")
    xi = g.input("x", parse_type(f"f32[{','.join(map(str, x.shape))}]"))
    y, = g.node("MaxPool", [xi], {"strides": strides, "pads": pads, "kernel_shape": [k, k]})
    g.output(y)
    return md.compile(g.build(), target="reference").run({"x": x})[y.name]


@pytest.mark.parametrize(("h", "w", "stride", "pads"), [
    # read in place: stride 1, same size, 9 wide at least (a first and a last vector, 9: overlapping;
    # 16: the last a whole block; 17, 14: the last overlapping the one before); stride 2 halving an even
    # plane, 16 wide at least (or padded after: never read)
    (5, 9, 1, [1, 1, 1, 1]), (12, 14, 1, [1, 1, 1, 1]), (16, 16, 1, [1, 1, 1, 1]), (3, 17, 1, [1, 1, 1, 1]),
    (40, 112, 1, [1, 1, 1, 1]), (16, 16, 2, [1, 1, 1, 1]), (6, 18, 2, [1, 1, 0, 0]), (24, 40, 2, [1, 1, 1, 1]),
    (2, 112, 2, [1, 1, 1, 1]),
    # narrow planes of 7 outputs a row: 7 wide at stride 1, 14 at stride 2 (3 and 4 rows: the
    # first and last rows only)
    (7, 7, 1, [1, 1, 1, 1]), (3, 7, 1, [1, 1, 1, 1]), (14, 14, 2, [1, 1, 1, 1]), (4, 14, 2, [1, 1, 0, 0]),
    # through the padded copy still: too narrow, odd, unpadded, uneven strides
    (9, 8, 1, [1, 1, 1, 1]), (15, 16, 2, [1, 1, 1, 1]), (16, 16, 2, [0, 0, 1, 1]), (16, 16, 1, [1, 1, 0, 0]),
])
def test_planes_read_in_place_match_the_reference(h: int, w: int, stride: int, pads: list[int]) -> None:
    """... by the whole routines and, where the planes are read in place (all but the last
    four cases), by the routines' in-place variants for the stride too."""
    n, c = 2, 3
    x = RNG.standard_normal((n, c, h, w), dtype=np.float32)
    x[1, 2, h // 2, w - 1] = np.nan  # (a NaN at a row's end: max and the sums carry it)
    wt = RNG.standard_normal((c, 1, 3, 3), dtype=np.float32)
    b = RNG.standard_normal(c, dtype=np.float32)
    want = np.clip(_conv_ort(x, wt, b, [stride] * 2, pads), 0.0, 6.0)
    padded = (h, w, stride, pads) in [(9, 8, 1, [1, 1, 1, 1]), (15, 16, 2, [1, 1, 1, 1]), (16, 16, 2, [0, 0, 1, 1]),
                                      (16, 16, 1, [1, 1, 0, 0])]
    assert in_place((h, w), want.shape[2:], (stride, stride), (pads[0], pads[1])) is not padded
    variants = ("", f"_inplace{stride}") if not padded else ("",)
    for variant in variants:
        y = np.full(want.shape, -7.0, np.float32)
        dims = depthwise_dims(n, c, (h, w), want.shape[2:], (stride, stride), (pads[0], pads[1]), lo=0.0, hi=6.0)
        _call("md_depthwise" + variant, [x, wt, b, y], dims)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    want = _pool_ort(x, [stride] * 2, pads)
    for variant in variants:
        y = np.full(want.shape, -7.0, np.float32)
        _call("md_maxpool3x3" + variant, [x, None, None, y], depthwise_dims(n, c, (h, w), want.shape[2:],
                                                                             (stride, stride), (pads[0], pads[1])))
        np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize(("h", "w", "stride"), [(7, 7, 1), (3, 7, 1), (14, 14, 2), (4, 14, 2), (9, 16, 1),
                                                (16, 16, 2), (5, 9, 1)])
def test_planes_read_in_place_read_only_their_input(h: int, w: int, stride: int) -> None:
    # (the input's first plane after a guard page, then its last plane before one)
    c = 3
    wt = RNG.standard_normal((c, 1, 3, 3), dtype=np.float32)
    b = RNG.standard_normal(c, dtype=np.float32)
    for at_end in (False, True):
        x, release = _guarded((1, c, h, w), at_end)
        try:
            x[...] = RNG.standard_normal(x.shape)
            want = _conv_ort(np.array(x), wt, b, [stride] * 2, [1, 1, 1, 1])
            y = np.full(want.shape, np.nan, np.float32)
            _call("md_depthwise", [x, wt, b, y], depthwise_dims(1, c, (h, w), want.shape[2:], (stride, stride),
                                                                (1, 1)))
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
            want = _pool_ort(np.array(x), [stride] * 2, [1, 1, 1, 1])
            y = np.full(want.shape, np.nan, np.float32)
            _call("md_maxpool3x3", [x, None, None, y], depthwise_dims(1, c, (h, w), want.shape[2:],
                                                                       (stride, stride), (1, 1)))
            np.testing.assert_array_equal(y, want)
        finally:
            release()


@pytest.mark.parametrize("seed", range(12))
def test_depthwise_reads_only_its_input_on_random_shapes(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, c, h, w = 1, int(rng.integers(1, 4)), int(rng.integers(1, 24)), int(rng.integers(1, 40))
    strides = [int(rng.integers(1, 4)), int(rng.integers(1, 4))]
    pads = [int(v) for v in rng.integers(0, 3, 4)]
    if h + pads[0] + pads[2] < 3 or w + pads[1] + pads[3] < 3:
        pads = [2, 2, 2, 2]
    wt = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    for at_end in (False, True):
        x, release = _guarded((n, c, h, w), at_end)
        try:
            x[...] = rng.standard_normal(x.shape)
            want = _conv_ort(np.array(x), wt, b, strides, pads)
            y = np.full(want.shape, np.nan, np.float32)
            _call("md_depthwise", [x, wt, b, y], depthwise_dims(n, c, (h, w), want.shape[2:], tuple(strides),
                                                                (pads[0], pads[1])))
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
        finally:
            release()


@pytest.mark.parametrize("k", [5, 7])
@pytest.mark.parametrize(("n", "c", "h", "w", "strides", "pads"), [
    # 'same' padding at stride 1 and 2 (EfficientNet, MobileNetV3, ConvNeXt): rows in groups of
    # ROW_GROUP, two vectors a step (an odd count of vectors a row: the last pair overlaps; 8-15
    # outputs: the pair overlaps), the last group of rows overlapping the one before
    (2, 3, 14, 14, [1, 1], "same"), (1, 4, 28, 28, [1, 1], "same"), (1, 2, 23, 41, [1, 1], "same"),
    (1, 3, 9, 8, [1, 1], "same"), (2, 3, 56, 56, [2, 2], "same"), (1, 2, 17, 35, [2, 2], "same"),
    # fewer rows than a group, rows shorter than a vector, uneven strides, stride 3: a row at a time
    (1, 3, 3, 30, [1, 1], "same"), (1, 3, 20, 5, [1, 1], "same"), (1, 2, 20, 21, [2, 1], "same"),
    (1, 2, 19, 19, [3, 3], "same"), (1, 2, 1, 1, [1, 1], "same"),
    # no padding, padding on one side only
    (1, 3, 16, 24, [1, 1], [0, 0, 0, 0]), (1, 3, 16, 24, [2, 2], [0, 3, 1, 0]),
])
def test_wide_depthwise_and_max_pools_match_reference(k: int, n: int, c: int, h: int, w: int, strides: list[int],
                                          pads: list[int] | str) -> None:
    pads = [k // 2] * 4 if pads == "same" else pads
    x = RNG.standard_normal((n, c, h, w), dtype=np.float32)
    x[0, c - 1, h // 2, w - 1] = np.nan  # (a NaN at a row's end reaches the outputs whose window holds it)
    wt = RNG.standard_normal((c, 1, k, k), dtype=np.float32)
    b = RNG.standard_normal(c, dtype=np.float32)
    want = np.clip(_conv_ort(x, wt, b, strides, pads), -2.0, 2.0)
    y = np.full(want.shape, -7.0, np.float32)
    for t in range(2):
        _call(depthwise_routine(k), [x, wt, b, y], depthwise_dims(n, c, (h, w), want.shape[2:], tuple(strides),
                                                                  (pads[0], pads[1]), lo=-2.0, hi=2.0, task=t,
                                                                  tasks=2))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    assert ROW_GROUP[k] > 1
    want = _pool_ort(x, strides, pads, k)  # (the max pool of the same window: maxima along lines first)
    y = np.full(want.shape, -7.0, np.float32)
    _call(maxpool_routine(k), [x, None, None, y], depthwise_dims(n, c, (h, w), want.shape[2:], tuple(strides),
                                                                 (pads[0], pads[1]), task=1, tasks=2))
    _call(maxpool_routine(k), [x, None, None, y], depthwise_dims(n, c, (h, w), want.shape[2:], tuple(strides),
                                                                 (pads[0], pads[1]), task=0, tasks=2))
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("seed", range(6))
def test_wide_depthwise_reads_only_its_input_on_random_shapes(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    k = (5, 7)[seed % 2]
    c, h, w = int(rng.integers(1, 4)), int(rng.integers(1, 30)), int(rng.integers(1, 40))
    strides = [int(rng.integers(1, 3)), int(rng.integers(1, 3))]
    pads = [int(v) for v in rng.integers(0, k, 4)]
    if h + pads[0] + pads[2] < k or w + pads[1] + pads[3] < k:
        pads = [k // 2 + 1] * 4
    wt = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    for at_end in (False, True):
        x, release = _guarded((1, c, h, w), at_end)
        try:
            x[...] = rng.standard_normal(x.shape)
            want = _conv_ort(np.array(x), wt, b, strides, pads)
            y = np.full(want.shape, np.nan, np.float32)
            _call(depthwise_routine(k), [x, wt, b, y], depthwise_dims(1, c, (h, w), want.shape[2:], tuple(strides),
                                                                      (pads[0], pads[1])))
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
        finally:
            release()


def test_wide_depthwise_convs_run_their_routines_with_their_activations() -> None:
    """EfficientNet's 5x5 depthwise conv + Relu6 and ConvNeXt's 7x7 one run as one routine call
    each, bounds applied in it, at any batch; a dilated 5x5 keeps the generated kernel."""
    g = GraphBuilder("wide")
    x = g.input("x", parse_type("f32[n,6,20,20]"))
    lo, hi = g.const("lo", np.array(0.0, np.float32)), g.const("hi", np.array(6.0, np.float32))
    y = x
    for k, attrs in ((5, {"strides": [2, 2]}), (7, {}), (5, {"dilations": [2, 2], "pads": [4] * 4})):
        w = g.const(f"w{k}{len(attrs)}", RNG.standard_normal((6, 1, k, k), dtype=np.float32) * 0.2)
        bias = g.const(f"b{k}{len(attrs)}", RNG.standard_normal(6, dtype=np.float32))
        y, = g.node("Conv", [y, w, bias], {"group": 6, "kernel_shape": [k, k], "pads": [k // 2] * 4, **attrs})
        if k == 5:
            y, = g.node("Clip", [y, lo, hi])
    g.output(y)
    graph = md.optimize(g.build(), level="aggressive")
    exe, ref = md.compile(graph, target="x86"), md.compile(graph, target="reference")
    for batch in (1, 3):
        feeds = {"x": RNG.standard_normal((batch, 6, 20, 20), dtype=np.float32)}
        got, want = exe.run(feeds), ref.run(feeds)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
    kinds = exe.executable.programs.bound({"n": 3}).call_kinds
    assert kinds["depthwise 5x5 + bounds"] == 1 and kinds["depthwise 7x7"] == 1
    assert "depthwise 5x5" not in kinds


def test_maxpool3x3_matches_reference_with_pads_ceil_mode_and_nan() -> None:
    """3x3 MaxPools (padded and strided, ceil mode, SAME_UPPER) run as ``md_maxpool3x3``, NaN
    propagated as numpy's max does; a 2x2 pool keeps the generated kernel."""
    g = GraphBuilder("pools")
    x = g.input("x", parse_type("f32[n,8,15,14]"))
    for attrs in ({"strides": [2, 2], "pads": [1, 1, 1, 1]}, {"strides": [2, 2], "ceil_mode": 1},
                  {"auto_pad": "SAME_UPPER"}, {"strides": [3, 1], "pads": [0, 1, 2, 0]}):
        y, = g.node("MaxPool", [x], {"kernel_shape": [3, 3], **attrs})
        g.output(y)
    y, = g.node("MaxPool", [x], {"kernel_shape": [2, 2]})
    g.output(y)
    graph = g.build()
    exe, ref = md.compile(graph, target="x86"), md.compile(graph, target="reference")
    for batch in (1, 3):
        feeds = {"x": RNG.standard_normal((batch, 8, 15, 14), dtype=np.float32)}
        feeds["x"][0, 1, 4, 5] = np.nan
        got, want = exe.run(feeds), ref.run(feeds)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    kinds = exe.executable.programs.bound({"n": 3}).call_kinds
    assert kinds["maxpool 3x3"] == 4 and sum(v for k, v in kinds.items() if k.startswith("MaxPool at")) == 1


@pytest.mark.parametrize("dtype", ["u8", "i8"])
@pytest.mark.parametrize("threads", [1, 2])
def test_max_pools_of_bytes_run_as_md_qmaxpool(dtype: str, threads: int) -> None:
    """8-bit MaxPools (a quantized model's: padded, strided, ceil mode, SAME_UPPER, stride 3, a
    2x2 window) run as ``md_qmaxpool``, the reference's bytes at every batch."""
    g = GraphBuilder("pools")
    x = g.input("x", parse_type(f"{dtype}[n,8,15,70]"))
    for attrs in ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
                  {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
                  {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"},
                  {"kernel_shape": [3, 3], "strides": [3, 1], "pads": [0, 1, 2, 0]}, {"kernel_shape": [2, 2]}):
        y, = g.node("MaxPool", [x], attrs)
        g.output(y)
    graph = g.build()
    exe, ref = md.compile(graph, target="x86", threads=threads), md.compile(graph, target="reference")
    info = np.iinfo(np.uint8 if dtype == "u8" else np.int8)
    for batch in (1, 3):
        feeds = {"x": RNG.integers(info.min, int(info.max) + 1, (batch, 8, 15, 70)).astype(info.dtype)}
        got, want = exe.run(feeds), ref.run(feeds)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    assert exe.executable.programs.bound({"n": 3}).call_kinds["maxpool"] == 5


@pytest.mark.parametrize("size", ["16", "s"])
def test_planes_known_before_binding_need_only_the_in_place_routines(size: str) -> None:
    """A max pool and depthwise convs over 16x16 planes (stride 2 and 1, one pixel of padding):
    with the planes' size in the graph, their steps need only ``..._inplace2`` and
    ``..._inplace1`` (a sixth of the routines' LLVM time); with a symbolic size, the whole
    routines, which read any plane. The outputs are the reference backend's either way."""
    g = GraphBuilder("planes")
    x = g.input("x", parse_type(f"f32[n,4,{size},{size}]"))
    y, = g.node("MaxPool", [x], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})
    w = g.const("w", RNG.standard_normal((4, 1, 3, 3), dtype=np.float32))
    z, = g.node("Conv", [x, w], {"kernel_shape": [3, 3], "group": 4, "pads": [1, 1, 1, 1]})
    z, = g.node("Relu", [z])
    g.output(y)
    g.output(z)
    graph = md.optimize(g.build(), level="aggressive")
    exe, ref = md.compile(graph, target="x86", cache=False), md.compile(graph, target="reference")
    feeds = {"x": RNG.standard_normal((2, 4, 16, 16), dtype=np.float32)}
    got, want = exe.run(feeds), ref.run(feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)
    routines = {r for s in exe.executable.steps for r in native_needs(s.native)}
    whole = {"md_maxpool3x3", "md_depthwise"}
    variants = {"md_maxpool3x3_inplace2", "md_depthwise_inplace1"}
    assert (routines & (whole | variants)) == (variants if size == "16" else whole)


@pytest.mark.parametrize("threads", [1, 2])
def test_larger_max_pools_run_as_5x5_or_3x3_passes(threads: int) -> None:
    """YOLO's SPPF (three 5x5 pools in a row) runs as ``md_maxpool5x5`` calls, strided or
    unpadded 5x5 and 7x7 pools too; SPP's 9x9 and 13x13 windows at stride 1 as two and three
    5x5 passes between scratch planes, an 11x11 one as five 3x3 passes: the reference's
    answers, NaN and -inf included; a dilated 5x5 pool keeps the generated kernel."""
    g = GraphBuilder("spp")
    x = g.input("x", parse_type("f32[n,8,20,21]"))
    a, = g.node("MaxPool", [x], {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]})
    b, = g.node("MaxPool", [a], {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]})
    c, = g.node("MaxPool", [b], {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]})
    nine, = g.node("MaxPool", [x], {"kernel_shape": [9, 9], "pads": [4, 4, 4, 4]})
    thirteen, = g.node("MaxPool", [x], {"kernel_shape": [13, 13], "pads": [6, 6, 6, 6]})
    strided, = g.node("MaxPool", [x], {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2], "strides": [2, 2]})
    unpadded, = g.node("MaxPool", [x], {"kernel_shape": [5, 5]})
    seven, = g.node("MaxPool", [x], {"kernel_shape": [7, 7], "pads": [3, 2, 1, 3], "strides": [2, 1], "ceil_mode": 1})
    eleven, = g.node("MaxPool", [x], {"kernel_shape": [11, 11], "pads": [5, 5, 5, 5]})
    dilated, = g.node("MaxPool", [x], {"kernel_shape": [5, 5], "pads": [4, 4, 4, 4], "dilations": [2, 2]})
    for v in (c, nine, thirteen, strided, unpadded, seven, eleven, dilated):
        g.output(v)
    graph = g.build()
    exe, ref = md.compile(graph, target="x86", threads=threads), md.compile(graph, target="reference")
    feeds = {"x": RNG.standard_normal((3, 8, 20, 21), dtype=np.float32)}
    feeds["x"][0, 1, 4, 5] = np.nan
    feeds["x"][1, 2] = -np.inf
    got, want = exe.run(feeds), ref.run(feeds)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    kinds = exe.executable.programs.bound({"n": 3}).call_kinds
    assert kinds["maxpool 5x5"] == 3 + 2 + 3 + 2 and kinds["maxpool 7x7"] == 1 and kinds["maxpool 3x3"] == 5
    assert sum(v for k, v in kinds.items() if k.startswith("MaxPool at")) == 1


def test_average_pools_that_divide_by_the_window_run_as_depthwise_convs() -> None:
    """AveragePools of 3x3, 5x5 and 7x7 windows that count the padding (PyTorch's default) or
    have none run as the depthwise routines with taps of 1 / k**2; one that does not count
    its padding, a ceil-mode one and a 2x2 one keep the generated kernel."""
    g = GraphBuilder("avg")
    x = g.input("x", parse_type("f32[n,5,17,16]"))
    cases = [({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}, True),
             ({"kernel_shape": [5, 5], "pads": [2, 2, 2, 2], "strides": [2, 2], "count_include_pad": 1}, True),
             ({"kernel_shape": [7, 7]}, True),
             ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, False),
             ({"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "count_include_pad": 1}, False),
             ({"kernel_shape": [2, 2], "strides": [2, 2]}, False)]
    for attrs, _ in cases:
        y, = g.node("AveragePool", [x], attrs)
        g.output(y)
    graph = g.build()
    exe, ref = md.compile(graph, target="x86"), md.compile(graph, target="reference")
    for batch in (1, 3):
        feeds = {"x": RNG.standard_normal((batch, 5, 17, 16), dtype=np.float32)}
        got, want = exe.run(feeds), ref.run(feeds)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
    kinds = exe.executable.programs.bound({"n": 3}).call_kinds
    assert (kinds["avgpool 3x3"], kinds["avgpool 5x5"], kinds["avgpool 7x7"]) == (1, 1, 1)
    assert sum(v for k, v in kinds.items() if k.startswith("AveragePool at")) == 3


def _pool_numpy(x: np.ndarray, k: int, strides: tuple[int, int], pads: list[int]) -> np.ndarray:
    """MaxPool by numpy: -inf padding, each window's ``np.max`` (NaN if the window holds one)."""
    padded = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])), constant_values=-np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (k, k), axis=(2, 3))
    return windows[:, :, ::strides[0], ::strides[1]].max(axis=(4, 5))


@pytest.mark.parametrize(("k", "h", "w", "stride", "pads"), [
    (3, 12, 16, 2, [1, 1, 1, 1]), (3, 9, 17, 1, [1, 1, 1, 1]), (3, 14, 14, 2, [1, 1, 1, 1]),  # in place
    (3, 7, 7, 1, [1, 1, 1, 1]), (3, 11, 13, 2, [1, 1, 1, 1]), (3, 8, 19, 1, [0, 2, 1, 0]),  # narrow, padded copy
    (3, 10, 12, 3, [1, 1, 1, 1]),  # a stride one output at a time
    (5, 13, 21, 1, [2, 2, 2, 2]), (7, 15, 18, 2, [3, 3, 3, 3]), (5, 9, 10, 3, [1, 2, 0, 1]),  # wide windows
])
def test_max_pools_carry_every_nan_and_infinity_in_their_windows(k: int, h: int, w: int, stride: int,
                                                                 pads: list[int]) -> None:
    """Maxima over trees (pairs of pairs) must not lose a NaN at any of the window's places:
    planes with NaN, both infinities and both zeros sown densely, every routine and path."""
    rng = np.random.default_rng(k * 100 + h * 10 + w)
    n, c = 1, 4
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)
    sown = rng.random(x.shape) < 0.06
    x[sown] = rng.choice(specials, size=int(sown.sum()))
    x[0, 0] = np.where(rng.random((h, w)) < 0.5, -np.inf, x[0, 0])  # (a plane of mostly -inf)
    x[0, 1] = np.abs(x[0, 1])  # (and one without NaN: the wide pools' fast path)
    x[0, 1][np.isnan(x[0, 1])] = 1.0
    want = _pool_numpy(x, k, (stride, stride), pads)
    y = np.full(want.shape, -7.0, np.float32)
    _call(maxpool_routine(k), [x, None, None, y], depthwise_dims(n, c, (h, w), want.shape[2:], (stride, stride),
                                                                 (pads[0], pads[1])))
    np.testing.assert_array_equal(y, want)  # (NaN where numpy's is; -0 and +0 alike)
