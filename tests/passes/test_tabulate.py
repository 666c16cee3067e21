"""The ``tabulate`` pass: costly elementwise chains of one 8-bit tensor become table look-ups,
whose results are the chain's own (reference) results to the bit, on the reference and on x86."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metadef as md
from metadef.ir import Graph, GraphBuilder
from metadef.passes.base import PassContext, mark_no_fuse
from metadef.passes.tabulate import chain_cost, tabulate, worth_of
from metadef.rewrite import DecisionLog, RewriteOptions
from metadef.shape import parse_type

RNG = np.random.default_rng(23)


def _qoperator_gelu(dtype: type = np.uint8, shape: str = "n,3,40") -> Graph:
    """GELU as ONNX Runtime's QOperator BERT writes it, each step requantized:
    ``0.5 * x * (1 + erf(x / sqrt 2))``."""
    kind, signed = ("u8", False) if dtype is np.uint8 else ("i8", True)
    mid, low = (dtype(0), dtype(-128)) if signed else (dtype(128), dtype(0))
    b = GraphBuilder("g")
    c = b.const
    x = b.input("x", parse_type(f"{kind}[{shape}]"))
    s, z = c("s", np.float32(0.04)), c("z", mid)
    d, = b.node("DequantizeLinear", [x, s, z], name="/act/dq")
    t, = b.node("Div", [d, c("sqrt2", np.float32(1.4142135))], name="/act/div")
    e, = b.node("Erf", [t], name="/act/erf")
    se = c("se", np.float32(1 / 127))
    q, = b.node("QuantizeLinear", [e, se, z], name="/act/q")
    sa, za = c("sa", np.float32(2 / 255)), c("za", low)  # 1 + erf in [0, 2]
    one = c("one", dtype(int(low) + 128))  # 1.0 at (sa, za)
    a, = b.node("QLinearAdd", [q, se, z, one, sa, za, sa, za], domain="com.microsoft", name="/act/add")
    sm = c("sm", np.float32(0.08))
    m, = b.node("QLinearMul", [a, sa, za, x, s, z, sm, z], domain="com.microsoft", name="/act/mul")
    sh = c("sh", np.float32(1 / 255))
    half = c("half", dtype(int(low) + 128))  # 0.5 at (sh, za)
    y, = b.node("QLinearMul", [m, sm, z, half, sh, za, s, z], domain="com.microsoft", name="/act/mul_1")
    b.output(y)
    return b.build()


def _every_value(dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    flat = np.resize(np.arange(info.min, int(info.max) + 1).astype(dtype), int(np.prod(shape)))
    return RNG.permutation(flat).reshape(shape)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_a_qoperator_gelu_becomes_one_lookup_with_the_references_results(dtype: type) -> None:
    graph = _qoperator_gelu(dtype)
    ctx = PassContext()
    new = tabulate(graph, ctx)
    assert [n.qualop for n in new.nodes] == ["ai.metadef::Lookup"], ctx.log.lines()
    assert any(line.startswith("taken tabulate_8bit") for line in ctx.log.lines())
    for batch in (3, 8):  # every one of the 256 values, at two sizes
        feeds = {"x": _every_value(dtype, (batch, 3, 40))}
        want = md.compile(graph, target="reference").run(feeds)[graph.outputs[0].name]
        assert len(np.unique(want)) > 20
        for target in ("reference", "x86"):
            got = md.compile(new, target=target).run(feeds)[new.outputs[0].name]
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


def test_the_aggressive_level_tabulates_and_x86_runs_it_natively() -> None:
    graph = _qoperator_gelu()
    optimized = md.optimize(graph, level="aggressive")
    assert [n.qualop for n in optimized.nodes] == ["ai.metadef::Lookup"]
    sess = md.compile(optimized, target="x86")
    assert "md_lookup" in sess.executable.plan[0].reason, sess.executable.plan[0].reason
    feeds = {"x": _every_value(np.uint8, (70, 3, 40))}  # (enough elements to split over the threads)
    np.testing.assert_array_equal(sess.run(feeds)[optimized.outputs[0].name],
                                  md.compile(graph, target="reference").run(feeds)[graph.outputs[0].name])


def _chain(ops: list[tuple[str, list[object]]], x_type: str = "u8[n,8]") -> Graph:
    """``x`` through DequantizeLinear, then ``ops`` (each with its constant operands after the
    running value), each named ``/c/<i>``."""
    b = GraphBuilder("g")
    x = b.input("x", parse_type(x_type))
    v, = b.node("DequantizeLinear", [x, b.const("s", np.float32(0.05)), b.const("z", np.uint8(100))], name="/c/dq")
    for i, (name, consts) in enumerate(ops):
        operands = [b.const(f"k{i}_{j}", np.asarray(k)) for j, k in enumerate(consts)]
        v, = b.node(name, [v, *operands], name=f"/c/{i}")
    b.output(v)
    return b.build()


def test_a_float_result_gets_a_float_table() -> None:
    graph = _chain([("Tanh", [])])
    new = tabulate(graph, PassContext())
    lookup, = new.nodes
    assert lookup.qualop == "ai.metadef::Lookup" and lookup.inputs[1].const.dtype == np.float32
    feeds = {"x": _every_value(np.uint8, (32, 8))}
    np.testing.assert_array_equal(md.compile(new, target="x86").run(feeds)[new.outputs[0].name],
                                  md.compile(graph, target="reference").run(feeds)[graph.outputs[0].name])


def test_a_requantization_becomes_a_table_and_a_cheap_float_chain_stays_with_its_reason() -> None:
    graph = _chain([("Relu", []), ("QuantizeLinear", [np.float32(0.05), np.uint8(0)])])
    assert [n.qualop for n in tabulate(graph, PassContext()).nodes] == ["ai.metadef::Lookup"]
    graph = _chain([("Relu", []), ("Mul", [np.float32(3.0)])])  # (a float result: a table read slower)
    ctx = PassContext()
    new = tabulate(graph, ctx)
    assert [n.op for n in new.nodes] == ["DequantizeLinear", "Relu", "Mul"]
    assert chain_cost(graph.nodes) < worth_of(graph.outputs[0])
    assert any(line.startswith("refused tabulate_8bit") and "table look-up" in line for line in ctx.log.lines())


@pytest.mark.parametrize("why", ["vector constant", "two sources", "no_fuse", "disabled"])
def test_what_is_not_a_function_of_one_8bit_value_stays(why: str) -> None:
    if why == "vector constant":  # a bias a column: the result depends on the position too
        graph = _chain([("Add", [np.arange(8, dtype=np.float32)]), ("Erf", [])])
    elif why == "two sources":
        b = GraphBuilder("g")
        x, w = b.input("x", parse_type("u8[n,8]")), b.input("w", parse_type("u8[n,8]"))
        s, z = b.const("s", np.float32(0.1)), b.const("z", np.uint8(3))
        dx, = b.node("DequantizeLinear", [x, s, z])
        dw, = b.node("DequantizeLinear", [w, s, z])
        y, = b.node("Erf", [b.node("Add", [dx, dw])[0]])
        b.output(y)
        graph = b.build()
    else:
        graph = _chain([("Erf", []), ("Exp", [])])
    ctx = PassContext(log=DecisionLog())
    if why == "no_fuse":
        mark_no_fuse(graph, ["/c/1"])
    if why == "disabled":
        ctx.options = RewriteOptions(disabled=frozenset({"tabulate_8bit"}))
    new = tabulate(graph, ctx)
    if why == "no_fuse":  # the chain stops before the marked node
        assert [n.qualop for n in new.nodes] == ["ai.metadef::Lookup", "Exp"]
    else:
        assert "ai.metadef::Lookup" not in [n.qualop for n in new.nodes]


def test_a_value_read_outside_the_chain_is_still_computed() -> None:
    b = GraphBuilder("g")
    x = b.input("x", parse_type("i8[n]"))
    d, = b.node("DequantizeLinear", [x, b.const("s", np.float32(0.02)), b.const("z", np.int8(0))])
    e, = b.node("Exp", [d])
    y, = b.node("Sigmoid", [e])
    b.output(y)
    b.output(d)
    graph = b.build()
    new = tabulate(graph, PassContext())
    assert sorted(n.qualop for n in new.nodes) == ["DequantizeLinear", "ai.metadef::Lookup"]
    feeds = {"x": _every_value(np.int8, (300,))}
    want = md.compile(graph, target="reference").run(feeds)
    got = md.compile(new, target="x86").run(feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


UNARY = ["Erf", "Exp", "Tanh", "Sigmoid", "Relu", "Neg", "Abs", "Softplus", "Floor", "Sqrt"]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(UNARY), min_size=1, max_size=4), st.sampled_from([np.uint8, np.int8]),
       st.booleans())
def test_any_tabulated_chain_gives_the_references_results(ops: list[str], dtype: type, requantize: bool) -> None:
    kind = "u8" if dtype is np.uint8 else "i8"
    b = GraphBuilder("g")
    x = b.input("x", parse_type(f"{kind}[n,5]"))
    v, = b.node("DequantizeLinear", [x, b.const("s", np.float32(0.03)), b.const("z", dtype(7))])
    for name in ops:
        v, = b.node(name, [v])
    if requantize:
        v, = b.node("QuantizeLinear", [v, b.const("sy", np.float32(0.01)), b.const("zy", dtype(0))])
    b.output(v)
    graph = b.build()
    new = tabulate(graph, PassContext())
    tabulated = [n.qualop for n in new.nodes] == ["ai.metadef::Lookup"]
    assert tabulated == (chain_cost(graph.nodes) >= worth_of(graph.outputs[0]))
    feeds = {"x": _every_value(dtype, (52, 5))}
    want = md.compile(graph, target="reference").run(feeds)[graph.outputs[0].name]
    for target in ("reference", "x86") if tabulated else ():
        np.testing.assert_array_equal(md.compile(new, target=target).run(feeds)[new.outputs[0].name], want)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_a_lookup_exports_to_onnx_and_runs_in_onnxruntime(dtype: type, tmp_path: pytest.TempPathFactory) -> None:
    graph = _qoperator_gelu(dtype)
    new = tabulate(graph, PassContext())
    path = str(tmp_path / "lookup.onnx")  # type: ignore[operator]
    md.export_onnx(new, path)
    model = onnx.load(path)
    assert {f.name for f in model.functions} == {"LookupInt8" if dtype is np.int8 else "Lookup"}
    x = _every_value(dtype, (2, 3, 40))
    got, = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(got, md.compile(new, target="reference").run({"x": x})[new.outputs[0].name])
