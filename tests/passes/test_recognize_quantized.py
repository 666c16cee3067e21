"""``recognize_quantized``: QDQ MatMuls with constant 8-bit weights become QLinearMatMul, which
the reference evaluates to within a quantization step of the float form; what does not fit
stays as it is, the reason logged."""

from __future__ import annotations

import numpy as np
import pytest

import metadef as md
from metadef.ir import Graph, GraphBuilder
from metadef.passes.base import PassContext
from metadef.passes.recognize_quantized import recognize_quantized
from metadef.rewrite import DecisionLog
from metadef.shape import parse_type

RNG = np.random.default_rng(41)


def _qdq(k: int = 48, n: int = 24, *, w_scale: np.ndarray | None = None, axis: int = 1, users: int = 1,
         w_dtype: type = np.int8, extra_use: bool = False) -> Graph:
    """``Q(MatMul(DQ(a), DQ(W)))`` (``users`` such products reading the same ``DQ(a)``)."""
    b = GraphBuilder("g")
    c = b.const
    a = b.input("a", parse_type(f"u8[m,{k}]"))
    x, = b.node("DequantizeLinear", [a, c("sa", np.float32(0.05)), c("za", np.uint8(100))], name="dq_a")
    for i in range(users):
        info = np.iinfo(w_dtype)
        w = RNG.integers(info.min, int(info.max) + 1, (k, n)).astype(w_dtype)
        sw = np.float32(0.01) if w_scale is None else w_scale
        zw = np.zeros(np.shape(sw), w_dtype)
        dw, = b.node("DequantizeLinear", [c(f"w{i}", w), c(f"sw{i}", sw), c(f"zw{i}", zw)], {"axis": axis},
                     name=f"dq_w{i}")
        p, = b.node("MatMul", [x, dw], name=f"mm{i}")
        y, = b.node("QuantizeLinear", [p, c(f"sy{i}", np.float32(0.8)), c(f"zy{i}", np.uint8(128))], name=f"q{i}")
        b.output(y)
        if extra_use:
            r, = b.node("Relu", [p], name=f"relu{i}")
            b.output(r)
    return b.build()


def _run(graph: Graph, a: np.ndarray) -> list[np.ndarray]:
    return list(md.compile(graph, target="reference").run({"a": a}).values())


@pytest.mark.parametrize("w_scale", [None, RNG.uniform(0.005, 0.02, 24).astype(np.float32)])
def test_qdq_matmul_becomes_qlinear_matmul_within_a_step(w_scale: np.ndarray | None) -> None:
    graph = _qdq(w_scale=w_scale, users=3)
    ctx = PassContext()
    new = recognize_quantized(graph, ctx)
    assert [n.op for n in new.nodes] == ["QLinearMatMul"] * 3
    assert sum(line.startswith("taken recognize_qlinear_matmul") for line in ctx.log.lines()) == 3
    a = RNG.integers(0, 256, (37, 48)).astype(np.uint8)
    for got, want in zip(_run(new, a), _run(graph, a)):
        diff = np.abs(got.astype(int) - want.astype(int))
        assert diff.max() <= 1 and diff.mean() < 0.01


def test_every_level_but_safe_recognizes_it() -> None:
    graph = _qdq()
    assert "QLinearMatMul" in [n.op for n in md.optimize(graph, level="aggressive").nodes] + \
        [m.op for n in md.optimize(graph, level="aggressive").nodes if n.op == "Fused" for m in n.attrs["body"].nodes]
    assert [n.op for n in md.optimize(graph, level="moderate").nodes] == ["QLinearMatMul"]
    assert "QLinearMatMul" not in [n.op for n in md.optimize(graph, level="safe").nodes]
    kept = md.optimize(graph, level="moderate", disable_rules=["recognize_qlinear_matmul"])
    assert "QLinearMatMul" not in [n.op for n in kept.nodes]


@pytest.mark.parametrize("case,reason", [
    ({"k": 24, "w_scale": np.full(24, 0.01, np.float32), "axis": 0}, "not along their columns"),
    ({"w_scale": np.full(48, 0.01, np.float32), "axis": 0}, "not one value or one a column"),
    ({"extra_use": True}, "consumers"),
])
def test_what_is_not_a_quantized_product_stays_with_the_reason(case: dict, reason: str) -> None:
    log = DecisionLog()
    new = md.optimize(_qdq(**case), level="moderate", log=log)
    assert "QLinearMatMul" not in [n.op for n in new.nodes]
    refused = [line for line in log.lines() if line.startswith("refused recognize_qlinear_matmul")]
    assert refused and reason in refused[0], log.lines()


def _qdq_conv(group: int = 1, bias_scale: float | None = None, w_scale: np.ndarray | None = None) -> Graph:
    """``Q(Conv(DQ(x), DQ(W), DQ(B)))`` as ONNX Runtime's quantizer writes it."""
    b = GraphBuilder("g")
    c = b.const
    x = b.input("x", parse_type("i8[n,8,10,10]"))
    sx, sw = np.float32(0.05), np.float32(0.01) if w_scale is None else w_scale
    dx, = b.node("DequantizeLinear", [x, c("sx", sx), c("zx", np.int8(-3))])
    w = RNG.integers(-128, 128, (16, 8 // group, 3, 3)).astype(np.int8)
    dw, = b.node("DequantizeLinear", [c("w", w), c("sw", sw), c("zw", np.zeros(np.shape(sw), np.int8))], {"axis": 0})
    scale = (sx * np.asarray(sw, np.float32)).astype(np.float32) if bias_scale is None else np.float32(bias_scale)
    db, = b.node("DequantizeLinear", [c("b", RNG.integers(-999, 999, 16).astype(np.int32)), c("sb", scale),
                                      c("zb", np.zeros(np.shape(scale), np.int32))], {"axis": 0})
    y, = b.node("Conv", [dx, dw, db], {"pads": [1, 1, 1, 1], "group": group}, name="conv")
    q, = b.node("QuantizeLinear", [y, c("sy", np.float32(0.3)), c("zy", np.int8(0))], name="q")
    b.output(q)
    return b.build()


@pytest.mark.parametrize("w_scale", [None, RNG.uniform(0.005, 0.02, 16).astype(np.float32)])
def test_qdq_conv_becomes_qlinear_conv_within_a_step(w_scale: np.ndarray | None) -> None:
    graph = _qdq_conv(w_scale=w_scale)
    new = md.optimize(graph, level="moderate")
    assert [n.op for n in new.nodes] == ["QLinearConv"] and len(new.nodes[0].inputs) == 9
    x = RNG.integers(-128, 128, (2, 8, 10, 10)).astype(np.int8)
    got = md.compile(new, target="reference").run({"x": x})
    want = md.compile(graph, target="reference").run({"x": x})
    for name in want:
        diff = np.abs(got[name].astype(int) - want[name].astype(int))
        assert diff.max() <= 1 and diff.mean() < 0.01


def test_a_grouped_qdq_conv_becomes_a_grouped_qlinear_conv_within_a_step() -> None:
    graph = _qdq_conv(group=2)
    new = md.optimize(graph, level="moderate")
    assert [n.op for n in new.nodes] == ["QLinearConv"] and new.nodes[0].attrs["group"] == 2
    x = RNG.integers(-128, 128, (2, 8, 10, 10)).astype(np.int8)
    got, want = (md.compile(g, target="reference").run({"x": x}) for g in (new, graph))
    for name in want:
        diff = np.abs(got[name].astype(int) - want[name].astype(int))
        assert diff.max() <= 1 and diff.mean() < 0.01


@pytest.mark.parametrize("case,reason", [({"bias_scale": 0.1}, "the bias is not int32")])
def test_a_conv_that_is_not_a_quantized_conv_stays_with_the_reason(case: dict, reason: str) -> None:
    log = DecisionLog()
    new = md.optimize(_qdq_conv(**case), level="moderate", log=log)
    assert "QLinearConv" not in [n.op for n in new.nodes]
    refused = [line for line in log.lines() if line.startswith("refused recognize_qlinear_conv")]
    assert refused and reason in refused[0], log.lines()


def test_qdq_gemm_becomes_qgemm_and_a_transposed_a_stays() -> None:
    def graph(trans_a: int) -> Graph:
        b = GraphBuilder("g")
        c = b.const
        x = b.input("x", parse_type("u8[16,n]" if trans_a else "u8[n,16]"))
        sx, sw = np.float32(0.05), np.float32(0.01)
        dx, = b.node("DequantizeLinear", [x, c("sx", sx), c("zx", np.uint8(3))])
        dw, = b.node("DequantizeLinear", [c("w", RNG.integers(-128, 128, (8, 16)).astype(np.int8)), c("sw", sw),
                                          c("zw", np.int8(0))])
        db, = b.node("DequantizeLinear", [c("b", RNG.integers(-99, 99, 8).astype(np.int32)), c("sb", sx * sw),
                                          c("zb", np.int32(0))])
        y, = b.node("Gemm", [dx, dw, db], {"transB": 1, "transA": trans_a}, name="gemm")
        q, = b.node("QuantizeLinear", [y, c("sy", np.float32(0.2)), c("zy", np.uint8(128))], name="q")
        b.output(q)
        return b.build()

    plain = graph(0)
    new = md.optimize(plain, level="moderate")
    assert [n.qualop for n in new.nodes] == ["com.microsoft::QGemm"]
    x = RNG.integers(0, 256, (5, 16)).astype(np.uint8)
    got, want = (md.compile(g, target="reference").run({"x": x}) for g in (new, plain))
    for name in want:
        assert np.abs(got[name].astype(int) - want[name].astype(int)).max() <= 1
    log = DecisionLog()
    kept = md.optimize(graph(1), level="moderate", log=log)
    assert "QGemm" not in [n.op for n in kept.nodes]
    assert any("A transposed" in line for line in log.lines())


def _around(move: str, inputs: list, attrs: dict, *, scale: float = 0.05, zero: int = 100,
            dtype: type = np.uint8, x_shape: str = "1,3,9,9") -> Graph:
    """``Q(move(DQ(x), ...))``, the two sides at one scale unless ``scale`` / ``zero`` say otherwise."""
    b = GraphBuilder("g")
    c = b.const
    kind = "u8" if dtype == np.uint8 else "i8"
    x = b.input("x", parse_type(f"{kind}[{x_shape}]"))
    f, = b.node("DequantizeLinear", [x, c("s", np.float32(0.05)), c("z", dtype(100 if dtype == np.uint8 else -3))])
    m, = b.node(move, [f, *(c(f"arg{i}", v) for i, v in enumerate(inputs))], attrs, name="move")
    y, = b.node("QuantizeLinear", [m, c("sy", np.float32(scale)), c("zy", dtype(zero if dtype == np.uint8 else -3))])
    b.output(y)
    return b.build()


@pytest.mark.parametrize("move,inputs,attrs", [
    ("MaxPool", [], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("Reshape", [np.array([1, 3, 81], np.int64)], {}),
    ("Transpose", [], {"perm": [0, 2, 3, 1]}),
    ("Flatten", [], {"axis": 1}),
    ("Slice", [np.array([1], np.int64), np.array([7], np.int64), np.array([3], np.int64)], {}),
    ("Gather", [np.array([2, 0], np.int64)], {"axis": 1}),
    ("SpaceToDepth", [], {"blocksize": 3}),
])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qdq_around_a_move_at_one_scale_is_the_move_on_the_bytes(move: str, inputs: list, attrs: dict,
                                                                 dtype: type) -> None:
    graph = _around(move, inputs, attrs, dtype=dtype)
    ctx = PassContext()
    new = recognize_quantized(graph, ctx)
    assert [n.op for n in new.nodes] == [move] and new.nodes[0].inputs[0] is new.inputs[0]
    assert any(line.startswith("taken drop_qdq_around_moves") for line in ctx.log.lines())
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, int(info.max) + 1, (1, 3, 9, 9)).astype(dtype)
    want, = md.compile(graph, target="reference").run({"x": x}).values()
    got, = md.compile(new, target="reference").run({"x": x}).values()
    np.testing.assert_array_equal(got, want)  # (byte for byte: (x - z) * s / s rounds back to x - z)
    got, = md.compile(md.optimize(graph, level="aggressive"), target="x86", cache=False).run({"x": x}).values()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("scale,zero,reason", [
    (0.1, 100, "the scale and zero point change across the MaxPool (0.05, 100 -> 0.1, 100)"),
    (0.05, 99, "the scale and zero point change across the MaxPool (0.05, 100 -> 0.05, 99)"),
])
def test_a_move_that_requantizes_keeps_its_qdq_with_the_reason(scale: float, zero: int, reason: str) -> None:
    graph = _around("MaxPool", [], {"kernel_shape": [2, 2]}, scale=scale, zero=zero)
    log = DecisionLog()
    new = recognize_quantized(graph, PassContext(log=log))
    assert [n.op for n in new.nodes] == ["DequantizeLinear", "MaxPool", "QuantizeLinear"]
    assert f"refused drop_qdq_around_moves at QuantizeLinear_2: {reason}" in log.lines(), log.lines()


def _dynamic(n: int = 24, *, w_dtype: type = np.int8, sw: np.ndarray | None = None, bias: bool = True,
             zero_points: int = 2, extra_use: bool = False, bias_shape: tuple[int, ...] | None = None,
             batched: bool = False) -> Graph:
    """What ``quantize_dynamic`` writes for a linear layer: ``DynamicQuantizeLinear(x)``, then
    ``Mul(Cast(MatMulInteger(xq, W, xz, wz)), Mul(x_scale, w_scale))`` and a bias ``Add``."""
    b = GraphBuilder("g")
    c = b.const
    x = b.input("x", parse_type("f32[m,48]"))
    xq, xs, xz = b.node("DynamicQuantizeLinear", [x], name="dql")
    info = np.iinfo(w_dtype)
    w = RNG.integers(info.min, int(info.max) + 1, (2, 48, n) if batched else (48, n)).astype(w_dtype)
    scale = np.asarray(RNG.uniform(0.001, 0.01, n), np.float32) if sw is None else sw
    operands = [xq, c("w", w), xz, c("wz", np.zeros(np.shape(scale), w_dtype))][:2 + zero_points]
    acc, = b.node("MatMulInteger", operands, name="mmi")
    f, = b.node("Cast", [acc], {"to": 1}, name="cast")
    s, = b.node("Mul", [xs, c("sw", scale)], name="scales")
    y, = b.node("Mul", [f, s], name="mul")
    if extra_use:
        b.output(f)
    if bias:
        y, = b.node("Add", [c("bias", RNG.standard_normal(bias_shape or (n,)).astype(np.float32)), y], name="add")
    b.output(y)
    return b.build()


@pytest.mark.parametrize("case", [{}, {"bias": False}, {"zero_points": 1}, {"zero_points": 0},
                                  {"sw": np.float32(0.003)}])
def test_quantize_dynamics_layer_becomes_matmul_integer_to_float_exactly(case: dict) -> None:
    graph = _dynamic(**case)
    new = recognize_quantized(graph, PassContext())
    new = md.optimize(new, level="safe")  # (the dead scale product goes)
    assert [n.op for n in new.nodes] == ["DynamicQuantizeLinear", "MatMulIntegerToFloat"]
    assert (len(new.nodes[1].inputs) == 7) == case.get("bias", True)
    for m in (1, 5):
        feeds = {"x": RNG.standard_normal((m, 48)).astype(np.float32) * 3}
        want = md.compile(graph, target="reference").run(feeds)
        got = md.compile(new, target="reference").run(feeds)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])


def test_matmul_integer_to_float_is_recognized_at_moderate_and_can_be_disabled() -> None:
    graph = _dynamic()
    ops = [n.op for n in md.optimize(graph, level="moderate").nodes]
    assert "MatMulIntegerToFloat" in ops and "MatMulInteger" not in ops
    kept = md.optimize(graph, level="moderate", disable_rules=["recognize_matmul_integer_to_float"])
    assert "MatMulIntegerToFloat" not in [n.op for n in kept.nodes]


@pytest.mark.parametrize("case,reason", [
    ({"batched": True, "sw": np.float32(0.01)}, "not 2-D 8-bit"),
    ({"extra_use": True}, "consumers"),
    ({"bias_shape": (1, 24)}, "is not float32, one a column"),
])
def test_what_is_not_a_dynamic_layer_stays_with_the_reason(case: dict, reason: str) -> None:
    log = DecisionLog()
    new = md.optimize(_dynamic(**case), level="moderate", log=log)
    refused = [line for line in log.lines() if line.startswith("refused recognize_matmul_integer_to_float")]
    assert refused and reason in refused[0], log.lines()
    ops = [n.op for n in new.nodes]
    assert ("MatMulIntegerToFloat" in ops) == ("bias_shape" in case)  # (an odd bias stays an Add after it)


def _qlinear_depthwise(group: int = 8, kernel: int = 3, per_channel: bool = True, bias: bool = True) -> Graph:
    """A QLinearConv over 8 channels in ``group`` groups (8: depthwise, as ONNX Runtime's
    QOperator form writes MobileNet's)."""
    b = GraphBuilder("g")
    c = b.const
    w = RNG.integers(-128, 128, (8, 8 // group, kernel, kernel)).astype(np.int8)
    sw = RNG.uniform(0.002, 0.01, 8).astype(np.float32) if per_channel else np.float32(0.006)
    inputs = [b.input("x", parse_type("u8[n,8,9,9]")), c("sx", np.float32(0.05)), c("zx", np.uint8(100)), c("w", w),
              c("sw", sw), c("zw", np.zeros(np.shape(sw), np.int8)), c("sy", np.float32(0.3)), c("zy", np.uint8(128))]
    if bias:
        inputs.append(c("b", RNG.integers(-3000, 3000, 8).astype(np.int32)))
    y, = b.node("QLinearConv", inputs, {"group": group, "pads": [kernel // 2] * 4, "kernel_shape": [kernel] * 2},
                name="conv")
    b.output(y)
    return b.build()


@pytest.mark.parametrize("case", [{}, {"per_channel": False}, {"bias": False}, {"kernel": 5}])
def test_a_depthwise_qlinear_conv_becomes_its_exact_float_sums(case: dict) -> None:
    graph = _qlinear_depthwise(**case)
    log = DecisionLog()
    new = recognize_quantized(graph, PassContext(log=log))
    assert "QLinearConv" not in [n.op for n in new.nodes] and "Conv" in [n.op for n in new.nodes], log.lines()
    for n in (1, 2):
        feeds = {"x": RNG.integers(0, 256, (n, 8, 9, 9)).astype(np.uint8)}
        want = md.compile(graph, target="reference").run(feeds)
        got = md.compile(new, target="reference").run(feeds)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
            assert len(np.unique(want[name])) > 20


def test_a_grouped_qlinear_conv_that_is_not_depthwise_stays() -> None:
    log = DecisionLog()
    new = recognize_quantized(_qlinear_depthwise(group=4), PassContext(log=log))
    assert [n.op for n in new.nodes] == ["QLinearConv"]
    refused = [line for line in log.lines() if line.startswith("refused exact_depthwise_qlinear_conv")]
    assert refused and "not a depthwise conv" in refused[0], log.lines()
    kept = md.optimize(_qlinear_depthwise(), level="moderate", disable_rules=["exact_depthwise_qlinear_conv"])
    assert [n.op for n in kept.nodes] == ["QLinearConv"]


def _activations_product(a_type: str, b_type: str, dtype: type = np.uint8) -> Graph:
    """A QLinearMatMul of two activations (a QOperator transformer's ``Q Kᵀ``)."""
    b = GraphBuilder("g")
    c = b.const
    za, zb = (dtype(128), dtype(130)) if dtype is np.uint8 else (dtype(-5), dtype(3))
    inputs = [b.input("a", parse_type(a_type)), c("sa", np.float32(0.05)), c("za", za),
              b.input("b", parse_type(b_type)), c("sb", np.float32(0.03)), c("zb", zb), c("sy", np.float32(1.5)),
              c("zy", za)]
    y, = b.node("QLinearMatMul", inputs, name="qmm")
    b.output(y)
    return b.build()


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_a_product_of_two_activations_becomes_its_exact_float_sums(dtype: type) -> None:
    """Depth 64 (an attention head): the float MatMul's sums are exact, the requantization the
    reference's: byte for byte on the reference and on x86 (a batched product, a generated
    epilogue), the extreme values included."""
    kind = "u8" if dtype is np.uint8 else "i8"
    graph = _activations_product(f"{kind}[b,2,s,64]", f"{kind}[b,2,64,t]", dtype)
    log = DecisionLog()
    new = recognize_quantized(graph, PassContext(log=log))
    ops = [n.op for n in new.nodes]
    assert "QLinearMatMul" not in ops and "MatMul" in ops, log.lines()
    info = np.iinfo(dtype)
    for b, s, t in ((1, 5, 7), (2, 16, 33)):
        feeds = {"a": RNG.integers(info.min, int(info.max) + 1, (b, 2, s, 64)).astype(dtype),
                 "b": RNG.integers(info.min, int(info.max) + 1, (b, 2, 64, t)).astype(dtype)}
        feeds["a"][0, 0, 0], feeds["b"][0, 0, :, 0] = info.max, info.min  # the largest sums
        want = md.compile(graph, target="reference").run(feeds)["qmm_out"]
        for target in ("reference", "x86"):
            np.testing.assert_array_equal(md.compile(new, target=target).run(feeds)[new.outputs[0].name], want)
        assert len(np.unique(want)) > 20


def test_a_product_of_two_activations_with_an_unknown_or_long_depth_stays() -> None:
    for a_type, b_type in (("u8[s,k]", "u8[k,t]"), ("u8[s,300]", "u8[300,t]")):
        log = DecisionLog()
        new = recognize_quantized(_activations_product(a_type, b_type), PassContext(log=log))
        assert [n.op for n in new.nodes] == ["QLinearMatMul"]
        refused = [line for line in log.lines() if line.startswith("refused exact_activations_qlinear_matmul")]
        assert refused and "may not be exact in float32" in refused[0], log.lines()
