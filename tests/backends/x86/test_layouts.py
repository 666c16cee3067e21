"""x86: values between pointwise convs stored pixel-major where producer and consumers agree."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metadef as md
from metadef.backends.x86 import conv1x1, layouts, pointwise
from metadef.backends.x86.depthwise_rows import form_cost
from metadef.backends.x86.layouts import agree, transposes
from metadef.backends.x86.native import PixelRows
from metadef.backends.x86.pointwise import rows_cost
from metadef.ir import GraphBuilder
from metadef.shape import parse_type

RNG = np.random.default_rng(5)


def _conv(*reads: int, residual: int | None = None, writes: int | None = 0) -> PixelRows:
    return PixelRows(reads, residual, writes, lambda args: None)  # type: ignore[arg-type,return-value]


def _blocks(count: int) -> list[layouts.StepValues]:
    """A ResNet stage: ``x_k = conv3(conv2(conv1(x_{k-1}))) + x_{k-1}`` (conv2 without a
    pixel-rows form), its last value read by a step that needs NCHW (a strided conv's im2col)."""
    steps: list[layouts.StepValues] = []
    for k in range(1, count + 1):
        steps += [(_conv(0), [f"x{k - 1}"], [f"h{k}"]), (None, [f"h{k}"], [f"g{k}"]),
                  (_conv(0, residual=1), [f"g{k}", f"x{k - 1}"], [f"x{k}"])]
    return [*steps, (None, [f"x{count}"], ["y"])]


def test_a_chain_stays_pixel_major_up_to_a_reader_that_needs_nchw() -> None:
    """The stage's values between its blocks go pixel-major: each saves the next block's
    first transpose; the first block transposes its NCHW residual (the stage's input) into
    pixel rows, the last its pixel-major residual back to NCHW. With three blocks that is
    two transposes for two: a tie, left NCHW."""
    four = _blocks(4)
    assert agree(four) == {"x1", "x2", "x3"}
    assert transposes(four, {"x1", "x2", "x3"}) == 7 < transposes(four, set()) == 8
    assert agree(_blocks(3)) == set()


def test_nothing_changes_where_no_transpose_is_saved() -> None:
    """A residual-only reader with an NCHW output, a value viewed under another shape
    (pinned), a reader without a pixel-rows form, the layouts switched off."""
    residual_only = [(_conv(0), ["x"], ["a"]), (_conv(0, residual=1), ["b", "a"], ["c"]), (None, ["c"], ["y"])]
    assert agree(residual_only) == set()
    chain = [(_conv(0), ["x"], ["a"]), (_conv(0), ["a"], ["b"])]
    assert agree(chain) == {"a"}
    assert agree(chain, pinned={"a"}) == set()
    assert agree([*chain, (None, ["a"], ["z"])]) == set()
    assert agree([(_conv(0, writes=None), ["x"], ["a"]), (_conv(0), ["a"], ["b"])]) == set()
    layouts.ENABLED = False
    try:
        assert agree(chain) == set()
    finally:
        layouts.ENABLED = True


@st.composite
def _graphs(draw: st.DrawFn) -> list[layouts.StepValues]:
    """Random steps over a few values: each written once, read by any later step, with or
    without a pixel-rows form (a transposing conv's, a depthwise conv's, a pointwise conv's
    whose product on pixel rows is faster)."""
    steps: list[layouts.StepValues] = []
    for s in range(draw(st.integers(1, 8))):
        earlier = [f"v{i}" for i in range(s)] or ["input"]
        ins = draw(st.lists(st.sampled_from(earlier), min_size=1, max_size=2))
        form = None
        kind = draw(st.sampled_from(["none", "conv", "either", "faster"]))
        residual = len(ins) - 1 if len(ins) == 2 else None
        if kind == "conv":
            reads = (0,) if draw(st.booleans()) else ()
            form = _conv(*reads, residual=residual, writes=0 if draw(st.booleans()) else None)
        elif kind == "either":  # (a depthwise conv: one input)
            form = _either()
        elif kind == "faster":
            form = _faster(residual)
        steps.append((form, ins, [f"v{s}"]))
    return steps


@settings(max_examples=200, deadline=None)
@given(_graphs())
def test_agreed_values_are_written_and_read_pixel_major_and_save_transposes(steps: list[layouts.StepValues]) -> None:
    chosen = agree(steps)
    for value in chosen:
        (producer,) = [rows for rows, _, outs in steps if value in outs]
        assert producer is not None and producer.writes is not None
        for rows, ins, _ in steps:
            for k, read in enumerate(ins):
                if read == value:
                    assert rows is not None and (k in rows.reads or k == rows.residual)
    none: set[Hashable] = set()
    assert not chosen or transposes(steps, chosen) < transposes(steps, none)


def _pointwise(g: GraphBuilder) -> Callable[..., Any]:
    """``conv(v, cout, cin, residual=None, relu=True, **attrs)``: a 1x1 Conv with a bias in
    ``g`` (random weights), then the residual added and a Relu."""
    def conv(v: object, cout: int, cin: int, residual: object = None, relu: bool = True, **attrs: object) -> object:
        w = RNG.standard_normal((cout, cin, 1, 1), dtype=np.float32) * (0.5 / cin ** 0.5)
        y, = g.node("Conv", [v, g.const(f"w{len(g.nodes)}", w),
                             g.const(f"b{len(g.nodes)}", RNG.standard_normal(cout, dtype=np.float32))],
                    {"kernel_shape": [1, 1], **attrs})
        if residual is not None:
            y, = g.node("Add", [y, residual])
        if relu:
            y, = g.node("Relu", [y])
        return y
    return conv


def _stage() -> md.Graph:
    """Pointwise convs at 7x7 with skip connections, a strided pointwise conv between them,
    and values that leave the chain: a graph output, a strided conv's input."""
    g = GraphBuilder("stage")
    x = g.input("x", parse_type("f32[n,16,7,7]"))
    conv = _pointwise(g)

    a = conv(x, 32, 16)  # x: an NCHW graph input, transposed
    b = conv(a, 32, 32, residual=a)  # a read as pixel rows and as the residual
    c = conv(b, 16, 32)
    d = conv(c, 32, 16, residual=b)
    e = conv(d, 24, 32, relu=False, strides=[2, 2])  # [n, 24, 4, 4]: d's im2col reads NCHW
    f = conv(d, 32, 32, residual=d)  # f: a graph output, NCHW, its residual d too
    h = conv(c, 24, 16, strides=[2, 2])  # an im2col conv whose output goes on as pixel rows
    k = conv(h, 24, 24, residual=e)
    g.output(f)
    g.output(conv(k, 8, 24, relu=False))
    return g.build()


@pytest.mark.jit
@pytest.mark.parametrize("threads", [1, 2])
def test_a_stage_of_pointwise_convs_matches_the_reference(threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every conv takes pixels as rows; the values between them go pixel-major where that
    saves a transpose, residuals in the other layout are transposed; the outputs are the
    reference backend's, on two batch sizes, the same with the layouts switched off."""
    monkeypatch.setattr(conv1x1, "PREFER", conv1x1.OWN_T)
    graph = md.optimize(_stage(), level="aggressive")
    ref = md.compile(graph, target="reference")
    feeds = [{"x": RNG.standard_normal((batch, 16, 7, 7), dtype=np.float32)} for batch in (1, 3)]
    got: dict[bool, list[dict[str, np.ndarray]]] = {}
    kinds: dict[bool, dict[str, int]] = {}
    for enabled in (True, False):  # (a program's layouts are agreed when its binding is first run)
        monkeypatch.setattr(layouts, "ENABLED", enabled)
        session = md.compile(graph, target="x86", threads=threads, cache=False)
        got[enabled] = [session.run(f) for f in feeds]
        program = session.executable.programs.bound({"n": 3})
        assert (program.pixel_major >= 3) if enabled else program.pixel_major == 0, program.describe()
        kinds[enabled] = program.call_kinds
    for f, rows, nchw in zip(feeds, got[True], got[False]):
        want = ref.run(f)
        for name in want:
            np.testing.assert_allclose(rows[name], want[name], rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(nchw[name], want[name], rtol=1e-4, atol=1e-4)
    assert kinds[True]["conv2d 1x1 own kernel, pixel rows stored + epilogue"] >= 2
    # (the strided convs: each image's im2col, then its rows stored pixel-major)
    assert kinds[True]["conv2d own kernel, pixel rows stored + epilogue"] == 2 * 3
    assert kinds[True]["conv2d 1x1 residual transpose"] >= 1
    assert kinds[True]["conv2d 1x1 transpose"] < kinds[False]["conv2d 1x1 transpose"]


def _downsample() -> md.Graph:
    """Pointwise convs at 8x8, then a stride-2 pointwise conv (8x8 -> 4x4) of a pixel-major
    value, and one more pointwise conv with that as its residual."""
    g = GraphBuilder("downsample")
    x = g.input("x", parse_type("f32[n,16,8,8]"))
    conv = _pointwise(g)

    a = conv(x, 32, 16)
    b = conv(a, 32, 32, residual=a)
    d = conv(b, 24, 32, strides=[2, 2])  # b's every other pixel of every other row, read pixel-major
    e = conv(d, 24, 24, residual=d)
    g.output(conv(e, 8, 24))
    return g.build()


@pytest.mark.jit
@pytest.mark.parametrize("threads", [1, 2])
def test_a_strided_pointwise_conv_gathers_its_pixel_major_input(threads: int,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The strided conv copies the pixels it reads as rows (no im2col, no transpose) and
    computes the reference backend's outputs, on two batch sizes."""
    monkeypatch.setattr(conv1x1, "PREFER", conv1x1.OWN_T)
    graph = md.optimize(_downsample(), level="aggressive")
    ref = md.compile(graph, target="reference")
    session = md.compile(graph, target="x86", threads=threads, cache=False)
    for batch in (1, 3):
        feeds = {"x": RNG.standard_normal((batch, 16, 8, 8), dtype=np.float32)}
        got, want = session.run(feeds), ref.run(feeds)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
    kinds = session.executable.programs.bound({"n": 3}).call_kinds
    assert kinds["conv2d pixel rows gathered"] == 3 * 4  # (an output row of an image a call)
    assert "conv2d im2col" not in kinds and "conv2d transpose" not in kinds


def _either(x: int = 0, out: int = 0) -> PixelRows:
    """A depthwise conv's form: it runs in either layout, a transpose where input and output differ."""
    return PixelRows((x,), None, out, lambda args: None, form_cost(x, out))  # type: ignore[arg-type,return-value]


def _faster(residual: int | None = None) -> PixelRows:
    """A pointwise conv whose product on pixel rows outruns its NCHW winner."""
    return PixelRows((0,), residual, 0, lambda args: None,  # type: ignore[arg-type,return-value]
                     rows_cost(0, 0, residual))


def test_a_mobilenet_chain_goes_pixel_major_through_its_depthwise_convs() -> None:
    """expand -> depthwise -> project (+ the block's input), three blocks, between an NCHW
    producer and an NCHW reader: every value inside goes pixel-major (at each end an input and
    a residual in the other layout cost one each); with the depthwise convs NCHW-only
    nothing does (no value between two forms)."""
    steps: list[layouts.StepValues] = [(None, ["in"], ["x0"])]
    for k in range(1, 4):
        steps += [(_faster(), [f"x{k - 1}"], [f"e{k}"]), (_either(), [f"e{k}"], [f"d{k}"]),
                  (_faster(residual=1), [f"d{k}", f"x{k - 1}"], [f"x{k}"])]
    steps.append((None, ["x3"], ["y"]))
    inside = {f"{v}{k}" for k in range(1, 4) for v in "ed"} | {"x1", "x2"}
    assert agree(steps) == inside
    assert transposes(steps, inside) == 4 < transposes(steps, set()) == 6  # (2 at each end: input, residual)
    nchw_only = [(None if rows is not None and rows.cost is not None and rows.residual is None and
                  ins[0].startswith("e") else rows, ins, outs) for rows, ins, outs in steps]
    assert agree(nchw_only) == set()


def test_a_depthwise_conv_costs_a_transpose_only_where_its_layouts_differ() -> None:
    """Read by two pointwise convs, a depthwise conv's output goes pixel-major though its
    input is NCHW (one transpose for two); read by one, it is a tie and stays NCHW."""
    two = [(_either(), ["x"], ["d"]), (_conv(0), ["d"], ["a"]), (_conv(0), ["d"], ["b"])]
    assert agree(two) == {"d"} and transposes(two, {"d"}) == 1 < transposes(two, set()) == 2
    assert agree(two[:2]) == set()


def _mobile_block(g: GraphBuilder, x: object, cin: int, expand: int, residual: bool) -> object:
    """A MobileNetV2 block at its input's size: pointwise expand + Relu6, depthwise 3x3 +
    Relu6, pointwise project (+ the block's input)."""
    lo, hi = g.const(f"lo{len(g.nodes)}", np.array(0.0, np.float32)), g.const(f"hi{len(g.nodes)}",
                                                                              np.array(6.0, np.float32))

    def conv(v: object, cout: int, cin: int, **attrs: object) -> object:
        k = 3 if attrs.get("group") else 1
        w = RNG.standard_normal((cout, cin, k, k), dtype=np.float32) * (0.7 / (cin * k * k) ** 0.5)
        y, = g.node("Conv", [v, g.const(f"w{len(g.nodes)}", w),
                             g.const(f"b{len(g.nodes)}", RNG.standard_normal(cout, dtype=np.float32) * 0.1)],
                    {"kernel_shape": [k, k], **attrs})
        return y

    e, = g.node("Clip", [conv(x, cin * expand, cin), lo, hi])
    d, = g.node("Clip", [conv(e, cin * expand, 1, group=cin * expand, pads=[1, 1, 1, 1]), lo, hi])
    p = conv(d, cin, cin * expand)
    if residual:
        p, = g.node("Add", [p, x])
    return p


def _mobile() -> md.Graph:
    """Three MobileNetV2 blocks at 9x9 (40 channels: a channel tail on AVX-512's 16-lane
    vectors), a depthwise conv of the graph's input read by two pointwise convs (its output
    pixel-major, its input transposed), and a pointwise conv whose output two pointwise convs
    and a depthwise conv read, that one's output a graph output (pixel rows back to planes)."""
    g = GraphBuilder("mobile")
    x = g.input("x", parse_type("f32[n,8,9,9]"))
    w = RNG.standard_normal((8, 1, 3, 3), dtype=np.float32)
    u, = g.node("Conv", [x, g.const("wd", w)], {"kernel_shape": [3, 3], "group": 8, "pads": [1, 1, 1, 1]})
    conv = _pointwise(g)
    v = conv(conv(u, 8, 8), 8, 8, residual=conv(u, 8, 8, relu=False))
    for k in range(3):
        v = _mobile_block(g, v, 8, 5, residual=k > 0)
    s = conv(v, 8, 8)
    t, = g.node("Conv", [s, g.const("wt", w)], {"kernel_shape": [3, 3], "group": 8, "pads": [1, 1, 1, 1],
                                                "strides": [2, 2]})
    g.output(conv(conv(s, 8, 8), 8, 8, residual=conv(s, 8, 8, relu=False)))
    g.output(t)
    return g.build()


@pytest.mark.jit
@pytest.mark.parametrize("prefer", [conv1x1.OWN_T, conv1x1.BLAS])
@pytest.mark.parametrize("threads", [1, 2])
def test_mobilenet_blocks_on_pixel_rows_match_the_reference(prefer: str, threads: int,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The depthwise convs run on pixel rows between pointwise convs on pixel rows (with
    ``md_conv1x1t`` the winner on NCHW, and with OpenBLAS the winner whose product on pixel rows
    measured faster), transposing their input or output where only one side is pixel-major;
    the outputs are the reference backend's on two batch sizes; with the forms switched off
    every depthwise conv runs on planes."""
    monkeypatch.setattr(conv1x1, "PREFER", prefer)
    monkeypatch.setattr(pointwise, "rows_pay", lambda product, kind, p: True)
    graph = md.optimize(_mobile(), level="aggressive")
    ref = md.compile(graph, target="reference")
    feeds = [{"x": RNG.standard_normal((batch, 8, 9, 9), dtype=np.float32)} for batch in (1, 3)]
    kinds: dict[bool, dict[str, int]] = {}
    for enabled in (True, False):
        monkeypatch.setattr(conv1x1, "DEPTHWISE_ROWS", enabled)
        monkeypatch.setattr(pointwise, "ENABLED", enabled)
        session = md.compile(graph, target="x86", threads=threads, cache=False)
        for f in feeds:
            got, want = session.run(f), ref.run(f)
            for name in want:
                np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
        kinds[enabled] = session.executable.programs.bound({"n": 3}).call_kinds
    on, off = kinds[True], kinds[False]
    assert on["depthwise 3x3 on pixel rows + bounds"] == 3 and on["depthwise 3x3 on pixel rows"] == 2
    assert on["depthwise input transpose"] == 1 and on["depthwise output transpose"] == 1
    assert not any("on pixel rows" in kind for kind in off) and off["depthwise 3x3 + bounds"] == 3
