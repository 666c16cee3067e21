"""x86: values between pointwise convs stored pixel-major where producer and consumers agree."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metadef as md
from metadef.backends.x86 import conv1x1, layouts
from metadef.backends.x86.layouts import agree, transposes
from metadef.backends.x86.native import PixelRows
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
    without a pixel-rows form."""
    steps: list[layouts.StepValues] = []
    for s in range(draw(st.integers(1, 8))):
        earlier = [f"v{i}" for i in range(s)] or ["input"]
        ins = draw(st.lists(st.sampled_from(earlier), min_size=1, max_size=2))
        form = None
        if draw(st.booleans()):
            reads = (0,) if draw(st.booleans()) else ()
            residual = len(ins) - 1 if len(ins) == 2 else None
            form = _conv(*reads, residual=residual, writes=0 if draw(st.booleans()) else None)
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
