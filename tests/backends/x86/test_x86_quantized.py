"""Quantized products on x86: ``QLinearMatMul`` with constant weights as ``md_qgemm`` (int8 dot
products), bit for bit the reference's; a QDQ model from ONNX Runtime's own quantizer runs as
integer products and agrees with ONNX Runtime to a quantization step."""

from __future__ import annotations

import ctypes

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import metadef as md
from metadef.backends.x86.quantized import pixel_rows
from metadef.codegen.native import ENTRY, native_function
from metadef.codegen.native_qgemm import QGEMM_PANEL, has_int8_products, pack_qgemm_weights, qgemm_dims
from metadef.ir import GraphBuilder
from metadef.ops.defs.quantized import qlinear_matmul_reference
from metadef.shape import parse_type
from metadef.testing.oracle import ort_exact_int8

pytestmark = pytest.mark.jit
needs_int8 = pytest.mark.skipif(not has_int8_products(), reason="md_qgemm needs AVX512-VNNI or AVX2")

RNG = np.random.default_rng(29)


def _ints(dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def _operands(m: int, n: int, k: int, a_dtype: type, y_dtype: type, per_column: bool) -> list[np.ndarray]:
    a, w = _ints(a_dtype, (m, k)), _ints(np.int8, (k, n))
    sa, za = np.float32(0.02), np.asarray(7 if a_dtype is np.uint8 else -3, a_dtype)
    sw = RNG.uniform(0.002, 0.01, n).astype(np.float32) if per_column else np.float32(0.005)
    zw = np.zeros(n if per_column else (), np.int8)
    # an output scale that spreads the results over the whole 8-bit range, saturating some
    sy = np.float32(0.02 * 0.006 * 74 * 74 * np.sqrt(k) / 40)
    zy = np.asarray(128 if y_dtype is np.uint8 else 0, y_dtype)
    return [a, sa, za, w, sw, zw, sy, zy]


@needs_int8
@pytest.mark.parametrize("m,n,k", [(1, 10, 512), (13, 33, 7), (128, 96, 768), (25, 100, 30), (3, 64, 4),
                                   (12, 32, 9), (40, 31, 130)])
@pytest.mark.parametrize("a_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("y_dtype", [np.uint8, np.int8])
def test_md_qgemm_is_the_reference_bit_for_bit(m: int, n: int, k: int, a_dtype: type, y_dtype: type) -> None:
    ops = _operands(m, n, k, a_dtype, y_dtype, per_column=n % 2 == 0)
    a, sa, za, w, sw, _, sy, zy = ops
    want = qlinear_matmul_reference(ops, {})
    packed, colsum = pack_qgemm_weights(w)
    width = packed.shape[0] * QGEMM_PANEL
    flip = a_dtype is np.int8
    corr, mult = np.zeros(width, np.int32), np.zeros(width, np.float32)
    corr[:n] = -(int(za) + 128 * flip) * colsum
    mult[:n] = sa * np.asarray(sw).reshape(-1) / sy
    lo, hi = (float(v) for v in (np.iinfo(y_dtype).min, np.iinfo(y_dtype).max))
    for tasks in (1, 3):
        y = np.full((m, n + 5), 77, y_dtype)  # (rows ldy apart: the 5 columns past n stay untouched)
        args = (ctypes.c_void_p * 5)(a.ctypes.data, packed.ctypes.data, corr.ctypes.data, mult.ctypes.data,
                                     y.ctypes.data)
        for task in range(tasks):
            dims = qgemm_dims(m, n, k, lo=lo, hi=hi, zy=float(zy), flip=flip, ldy=n + 5, task=task, tasks=tasks)
            ENTRY(native_function("md_qgemm"))(args, (ctypes.c_int64 * len(dims))(*dims))
        np.testing.assert_array_equal(y[:, :n], want)
        assert (y[:, n:] == 77).all()
    assert len(np.unique(want)) > min(20, want.size // 3)


def _qlinear_graph(shape: str, ops: list[np.ndarray]) -> md.Graph:
    b = GraphBuilder("g")
    names = ("sa", "za", "w", "sw", "zw", "sy", "zy")
    y, = b.node("QLinearMatMul", [b.input("a", parse_type(shape)), *(b.const(n, np.asarray(v))
                                                                     for n, v in zip(names, ops[1:]))])
    b.output(y)
    return b.build()


@needs_int8
@pytest.mark.parametrize("threads", [1, 2])
def test_qlinear_matmul_runs_as_md_qgemm_at_any_batch(threads: int) -> None:
    ops = _operands(4, 200, 96, np.int8, np.uint8, per_column=True)
    graph = _qlinear_graph("i8[b,s,96]", ops)
    sess = md.compile(graph, target="x86", cache=False, threads=threads)
    ref = md.compile(graph, target="reference")
    assert sess.executable.plan[0].reason.startswith("md_qgemm")
    for b, s in ((1, 1), (2, 37), (3, 128)):
        a = _ints(np.int8, (b, s, 96))
        want = next(iter(ref.run({"a": a}).values()))
        np.testing.assert_array_equal(next(iter(sess.run({"a": a}).values())), want)
        np.testing.assert_array_equal(sess.executable.run_steps({"a": a}, {"b": b, "s": s})[0], want)


@needs_int8
def test_qlinear_matmul_that_md_qgemm_cannot_take_says_why() -> None:
    ops = _operands(4, 20, 96, np.uint8, np.uint8, per_column=False)
    ops[3] = _ints(np.uint8, (96, 20))  # uint8 weights with zero point 0: 255 does not fit in int8
    ops[5] = np.asarray(0, np.uint8)
    sess = md.compile(_qlinear_graph("u8[n,96]", ops), target="x86", cache=False)
    assert sess.executable.plan[0].kind == "reference"
    assert "do not fit in int8" in sess.executable.plan[0].reason


def _qdq_model(path: str) -> None:
    """A two-layer float model (MatMul, Add, Relu, MatMul) quantized by ONNX Runtime's
    ``quantize_static`` in QDQ form (int8 activations and weights, its defaults)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    w1, w2 = RNG.standard_normal((64, 96)).astype(np.float32) * 0.2, RNG.standard_normal((96, 32)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32])],
                              [onnx.numpy_helper.from_array(w1, "w1"), onnx.numpy_helper.from_array(w2, "w2"),
                               onnx.numpy_helper.from_array(RNG.standard_normal(96).astype(np.float32), "b1")])
    float_path = path + ".float.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), float_path)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([{"x": RNG.standard_normal((8, 64)).astype(np.float32)} for _ in range(4)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    quantize_static(float_path, path, Reader(), reduce_range=True,  # (7-bit weights: ORT_EXACT_INT8)
                    quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8)


@needs_int8
def test_an_onnxruntime_qdq_model_runs_as_integer_products(tmp_path: pytest.TempPathFactory) -> None:
    path = str(tmp_path / "q.onnx")  # type: ignore[operator]
    _qdq_model(path)
    graph = md.optimize(md.import_onnx(onnx.load(path)), level="aggressive")
    sess = md.compile(graph, target="x86", cache=False)
    kinds = [e.reason for e in sess.executable.plan]
    assert sum(r.startswith("md_qgemm") or "md_qgemm" in r for r in kinds) == 2, kinds
    ort_sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ref = md.compile(graph, target="reference")
    for n in (1, 5, 64):
        x = RNG.standard_normal((n, 64)).astype(np.float32)
        got = sess.run({"x": x})["y"]
        np.testing.assert_array_equal(got, ref.run({"x": x})["y"])
        want = ort_sess.run(None, {"x": x})[0]
        step = float(np.abs(np.diff(np.unique(want))).min())  # the output's quantization step
        assert np.abs(got - want).max() <= 2 * step + 1e-6
        assert np.mean(got != want) < 0.02


def test_layers_with_their_own_scales_share_one_kernel() -> None:
    """Quantize-dequantize groups that differ only by their scales and zero points (each layer
    of a quantized model) compile one kernel, which reads them at run time; each keeps its own
    values, and a group mixes 8-bit inputs with float ones. (Tabulating is off: it would make
    each chain a look-up of its own table.)"""
    from metadef.codegen.kernel import record_kernels
    b = GraphBuilder("g")
    c = b.const
    for i, (scale, zero) in enumerate([(0.05, 3), (0.2, 200), (0.011, 128)]):
        a = b.input(f"a{i}", parse_type("u8[n,40]"))
        x, = b.node("DequantizeLinear", [a, c(f"sa{i}", np.float32(0.1)), c(f"za{i}", np.uint8(7))])
        r, = b.node("Relu", [x])
        q, = b.node("QuantizeLinear", [r, c(f"s{i}", np.float32(scale)), c(f"z{i}", np.uint8(zero))])
        y, = b.node("DequantizeLinear", [q, c(f"s{i}b", np.float32(scale)), c(f"z{i}b", np.uint8(zero))])
        b.output(y)
    graph = md.optimize(b.build(), level="aggressive", disable_rules=["tabulate_8bit"])
    assert [n.op for n in graph.nodes] == ["Fused"] * 3
    with record_kernels() as structures:
        sess = md.compile(graph, target="x86", cache=False)
    assert len(set(structures)) == 1 and len(structures) == 3
    feeds = {f"a{i}": _ints(np.uint8, (9, 40)) for i in range(3)}
    want = md.compile(graph, target="reference").run(feeds)
    got = sess.run(feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    assert len({got[name].tobytes() for name in got}) == 3


def _qconv_graph(x_shape: tuple[int, ...], x_dtype: type, k: int, kernel: tuple[int, int], attrs: dict,
                 per_channel: bool, bias: bool) -> tuple[md.Graph, np.ndarray]:
    c = x_shape[1]
    w = _ints(np.int8, (k, c // int(attrs.get("group", 1)), *kernel))
    sw = RNG.uniform(0.002, 0.01, k).astype(np.float32) if per_channel else np.float32(0.006)
    sy = np.float32(0.02 * 0.006 * 74 * 74 * np.sqrt(c // int(attrs.get("group", 1)) * kernel[0] * kernel[1]) / 40)
    zx = np.asarray(5 if x_dtype is np.uint8 else -7, x_dtype)
    consts = [np.float32(0.02), zx, w, sw, np.zeros(np.shape(sw), np.int8), sy, np.uint8(128)]
    if bias:
        consts.append(RNG.integers(-20000, 20000, k).astype(np.int32))
    b = GraphBuilder("g")
    names = ("sx", "zx", "w", "sw", "zw", "sy", "zy", "b")
    tag = "u8" if x_dtype is np.uint8 else "i8"
    y, = b.node("QLinearConv", [b.input("x", parse_type(f"{tag}[n,{c},{x_shape[2]},{x_shape[3]}]")),
                                *(b.const(n, np.asarray(v)) for n, v in zip(names, consts))], attrs)
    b.output(y)
    return b.build(), _ints(x_dtype, x_shape)


@needs_int8
@pytest.mark.parametrize("x_shape,k,kernel,attrs", [
    ((2, 16, 10, 10), 24, (3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 8, 9, 11), 40, (3, 3), {"pads": [1, 0, 1, 2], "strides": [2, 2]}),
    ((1, 32, 7, 7), 13, (1, 1), {}),
    ((1, 3, 23, 23), 8, (7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    ((1, 5, 6, 6), 70, (1, 1), {"strides": [2, 2]}),
    ((1, 6, 40, 40), 9, (3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((1, 4, 12, 12), 5, (3, 3), {"strides": [3, 3]}),
    ((2, 16, 7, 7), 64, (3, 3), {"pads": [1, 1, 1, 1]}),                      # md_qconvt: a 7x7 plane
    ((1, 8, 14, 13), 56, (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # md_qconvt: 7x7, a part panel
    ((1, 24, 5, 5), 96, (1, 1), {}),
    ((2, 16, 10, 10), 16, (3, 3), {"pads": [1, 1, 1, 1], "group": 16}),                # depthwise: group by group
    ((1, 12, 9, 9), 24, (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 3}),
])
@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
def test_qlinear_conv_runs_as_md_qconv_bit_for_bit(x_shape: tuple[int, ...], k: int, kernel: tuple[int, int],
                                                    attrs: dict, x_dtype: type) -> None:
    graph, x = _qconv_graph(x_shape, x_dtype, k, kernel, attrs, per_channel=k % 2 == 0, bias=k != 13)
    want = next(iter(md.compile(graph, target="reference").run({"x": x}).values()))
    for threads in (1, 2):
        sess = md.compile(graph, target="x86", cache=False, threads=threads)
        reason = sess.executable.plan[0].reason
        assert reason.startswith("md_qconvt" if pixel_rows(k, want.shape[2] * want.shape[3]) else "md_qconv ")
        np.testing.assert_array_equal(next(iter(sess.run({"x": x}).values())), want)
    np.testing.assert_array_equal(sess.executable.run_steps({"x": x}, {"n": x_shape[0]})[0], want)
    assert len(np.unique(want)) > 20


def _qdq_cnn(path: str, activations: str, operators: bool = False) -> None:
    """A small residual CNN (3x3 and 1x1 convs with bias, Relu, Add, a strided conv, a
    depthwise conv) quantized by ONNX Runtime after its pre-processing (``operators``: in its
    QOperator form, QLinearConv and com.microsoft::QLinearAdd, instead of QDQ)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array((RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
                                             ).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"]),
             helper.make_node("Add", ["c2", "r1"], ["s"]),
             helper.make_node("Conv", ["s", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1], group=16),
             helper.make_node("Conv", ["c3", "w4", "b4"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])]
    inits = [w("w1", 16, 3, 3, 3), w("b1", 16), w("w2", 16, 16, 1, 1), w("b2", 16), w("w3", 16, 1, 3, 3),
             w("b3", 16), w("w4", 24, 16, 3, 3), w("b4", 24)]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 20, 20])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 24, 10, 10])], inits)
    float_path = path + ".float.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), float_path)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([{"x": RNG.standard_normal((2, 3, 20, 20)).astype(np.float32)} for _ in range(4)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    kind = QuantType.QUInt8 if activations == "uint8" else QuantType.QInt8
    quantize_static(float_path, path, Reader(), reduce_range=True,  # (7-bit weights: ORT_EXACT_INT8)
                    quant_format=QuantFormat.QOperator if operators else QuantFormat.QDQ,
                    activation_type=kind, weight_type=QuantType.QInt8, per_channel=activations == "int8")


@needs_int8
@pytest.mark.parametrize("activations", ["uint8", "int8"])
def test_an_onnxruntime_qdq_cnn_runs_as_integer_convs(tmp_path: pytest.TempPathFactory, activations: str) -> None:
    path = str(tmp_path / "q.onnx")  # type: ignore[operator]
    _qdq_cnn(path, activations)
    graph = md.optimize(md.import_onnx(onnx.load(path)), level="aggressive")
    sess = md.compile(graph, target="x86", cache=False)
    reasons = [e.reason for e in sess.executable.plan]
    assert sum("md_qconv" in r for r in reasons) == 3, reasons
    assert any(r.startswith("depthwise 3x3") for r in reasons), reasons  # (its exact sums in float)
    ort_sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ref = md.compile(graph, target="reference")
    for n in (1, 3):
        x = RNG.standard_normal((n, 3, 20, 20)).astype(np.float32)
        got = sess.run({"x": x})["y"]
        want = ort_sess.run(None, {"x": x})[0]
        step = float(np.abs(np.diff(np.unique(want))).min())
        # fused, the residual group's float ops (two DequantizeLinear, Add) may become one fused
        # multiply-add (generated code allows contraction), and a sum at a rounding tie then
        # quantizes a step from the reference's (seed 1 of 15: 1 of 6,400 elements, 31.5 vs 31.499998)
        mine = ref.run({"x": x})["y"]
        assert np.abs(got - mine).max() <= step * 1.01 and np.mean(got != mine) < 0.01
        assert np.abs(got - want).max() <= 3 * step + 1e-6
        assert np.mean(got != want) < 0.05


@needs_int8
@pytest.mark.parametrize("activations", ["uint8", "int8"])
def test_an_onnxruntime_qoperator_cnn_runs_as_integer_kernels(tmp_path: pytest.TempPathFactory,
                                                              activations: str) -> None:
    """The QOperator form: every conv a QLinearConv, the residual a com.microsoft::QLinearAdd as
    a generated kernel, the depthwise conv's exact sums by the float depthwise kernel
    (``exact_depthwise_qlinear_conv``); the reference backend's results exactly, ONNX Runtime's
    but where its QLinearAdd rounds a tie the other way: it computes with the scale ratios as
    fixed-point multipliers (MLAS's ``MlasCalcQLinearAddParameters``), not the op's float
    formula, so an exact .5 (one of the models drawn here: 16 of 7,200 outputs, 115.5 -> 115)
    can land a step lower (the element and those the later convs compute from it)."""
    path = str(tmp_path / "q.onnx")  # type: ignore[operator]
    _qdq_cnn(path, activations, operators=True)
    model = onnx.load(path)
    assert {n.op_type for n in model.graph.node} >= {"QLinearConv", "QLinearAdd"}
    graph = md.optimize(md.import_onnx(model), level="aggressive")
    sess = md.compile(graph, target="x86", cache=False)
    reasons = [e.reason for e in sess.executable.plan]
    assert sum("md_qconv" in r for r in reasons) == 3 and not any("reference" in r for r in reasons), reasons
    assert any(r.startswith("depthwise 3x3") for r in reasons), reasons
    ort_sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ref = md.compile(graph, target="reference")
    for n in (1, 3):
        x = RNG.standard_normal((n, 3, 20, 20)).astype(np.float32)
        got = sess.run({"x": x})["y"]
        np.testing.assert_array_equal(got, ref.run({"x": x})["y"])
        want = ort_sess.run(None, {"x": x})[0]
        step = float(np.abs(np.diff(np.unique(want))).min())
        assert np.abs(got - want).max() <= 2 * step * 1.01 and np.mean(got != want) < 0.01


def _qgemm_model(trans_b: int, alpha: float, float_output: bool) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    a = _ints(np.uint8, (5, 40))
    b = ort_exact_int8(RNG, (30, 40) if trans_b else (40, 30))
    consts = {"sa": np.float32(0.02), "za": np.uint8(9), "B": b, "sb": RNG.uniform(0.001, 0.01, 30).astype(np.float32),
              "zb": np.zeros(30, np.int8), "C": RNG.integers(-3000, 3000, 30).astype(np.int32)}
    if not float_output:
        consts.update(sy=np.float32(0.9), zy=np.uint8(3))
    node = helper.make_node("QGemm", ["A", *consts], ["Y"], domain="com.microsoft", alpha=alpha, transB=trans_b)
    out = TensorProto.FLOAT if float_output else TensorProto.UINT8
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.UINT8, ["m", 40])],
                              [helper.make_tensor_value_info("Y", out, ["m", 30])],
                              [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    return model, {"A": a}


@pytest.mark.parametrize("trans_b,alpha,float_output", [(1, 1.0, False), (0, 0.5, False), (1, 1.0, True)])
def test_qgemm_is_onnxruntimes_and_runs_as_md_qgemm(trans_b: int, alpha: float, float_output: bool) -> None:
    model, feeds = _qgemm_model(trans_b, alpha, float_output)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    graph = md.import_onnx(model)
    np.testing.assert_array_equal(md.compile(graph, target="reference").run(feeds)["Y"], want)
    sess = md.compile(graph, target="x86", cache=False)
    np.testing.assert_array_equal(sess.run(feeds)["Y"], want)
    native = sess.executable.plan[0].reason.startswith("md_qgemm")
    assert native == has_int8_products(), sess.executable.plan[0].reason  # (a float output: md_qgemmf)


@needs_int8
def test_an_onnxruntime_qdq_linear_stack_runs_as_qgemm(tmp_path: pytest.TempPathFactory) -> None:
    """Linear layers on 2-D inputs (Gemm, transB=1, as PyTorch exports them) quantized by ORT."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    path = str(tmp_path / "q.onnx")  # type: ignore[operator]
    w1, w2 = (RNG.standard_normal(s).astype(np.float32) * 0.2 for s in ((96, 64), (32, 96)))
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32])],
                              [onnx.numpy_helper.from_array(v, k) for k, v in
                               (("w1", w1), ("w2", w2), ("b1", RNG.standard_normal(96).astype(np.float32)),
                                ("b2", RNG.standard_normal(32).astype(np.float32)))])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path + ".f.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([{"x": RNG.standard_normal((8, 64)).astype(np.float32)} for _ in range(4)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    quantize_static(path + ".f.onnx", path, Reader(), reduce_range=True,  # (ORT_EXACT_INT8)
                    quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    graph = md.optimize(md.import_onnx(onnx.load(path)), level="aggressive")
    sess = md.compile(graph, target="x86", cache=False)
    assert sum("md_qgemm" in e.reason for e in sess.executable.plan) == 2, [e.reason for e in sess.executable.plan]
    ort_sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ref = md.compile(graph, target="reference")
    for n in (1, 7):
        x = RNG.standard_normal((n, 64)).astype(np.float32)
        got = sess.run({"x": x})["y"]
        np.testing.assert_array_equal(got, ref.run({"x": x})["y"])
        want = ort_sess.run(None, {"x": x})[0]
        step = float(np.abs(np.diff(np.unique(want))).min())
        assert np.abs(got - want).max() <= 2 * step + 1e-6


def test_without_vnni_the_products_are_exact_through_sgemm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host with neither AVX512-VNNI nor AVX2 runs quantized products as float32 products over chunks of
    512 depths (each sum exact): the reference's results bit for bit, at BLAS speed, not the
    index expression's."""
    import metadef.backends.x86.quantized as quantized
    monkeypatch.setattr(quantized, "has_int8_products", lambda: False)
    conv, x = _qconv_graph((2, 64, 9, 9), np.int8, 24, (3, 3), {"pads": [1, 2, 1, 0], "strides": [2, 1]},
                           per_channel=True, bias=True)
    ops = _operands(4, 50, 1100, np.uint8, np.int8, per_column=True)  # (depth over 2 chunks)
    matmul, a = _qlinear_graph("u8[b,1100]", ops), _ints(np.uint8, (6, 1100))
    model, feeds = _qgemm_model(1, 1.0, False)
    for graph, inputs in ((conv, {"x": x}), (matmul, {"a": a}), (md.import_onnx(model), feeds)):
        sess = md.compile(graph, target="x86", cache=False)
        assert sess.executable.plan[0].reason.startswith("exact integer products through float32 sgemm")
        want = md.compile(graph, target="reference").run(inputs)
        for name, got in sess.run(inputs).items():
            np.testing.assert_array_equal(got, want[name])


def test_the_onnx_node_tests_of_the_quantized_products_pass_on_x86() -> None:
    """ONNX's own cases (weights fed as inputs, uint8 weights with a zero point, per-row
    scales): whatever md_qgemm / md_qconv cannot take runs the reference, the expected
    outputs exactly (test_qlinearconv once failed resolving its attributes twice)."""
    from metadef.testing.conformance import all_cases
    cases = [c for c in all_cases() if c.name.startswith(("test_qlinearconv", "test_qlinearmatmul"))]
    assert len(cases) >= 5
    for case in cases:
        sess = md.compile(md.import_onnx(case.model), target="x86", cache=False)
        for inputs, outputs in case.data_sets:
            got = sess.run({v.name: a for v, a in zip(case.model.graph.input, inputs)})
            for value, want in zip(case.model.graph.output, outputs):
                np.testing.assert_array_equal(got[value.name], want, err_msg=case.name)


def test_a_quantized_model_saved_to_mdef_keeps_int8_weights(tmp_path: pytest.TempPathFactory) -> None:
    """The weights of recognized layers stay 8-bit in the file (folding DequantizeLinear made
    them float32: ResNet-50 102 -> 26 MB), and the loaded model runs as the ONNX one does."""
    path = str(tmp_path / "q.onnx")  # type: ignore[operator]
    _qdq_cnn(path, "uint8")
    graph = md.optimize(md.import_onnx(onnx.load(path)), level="moderate")
    convs = [n for n in graph.nodes if n.op == "QLinearConv"]
    assert len(convs) == 3 and all(n.inputs[3].const.dtype == np.int8 for n in convs)
    saved = str(tmp_path / "q.mdef")  # type: ignore[operator]
    md.save(graph, saved)
    loaded = md.load(saved).compile(target="x86")
    direct = md.compile(md.optimize(md.import_onnx(onnx.load(path)), level="aggressive"), target="x86", cache=False)
    x = RNG.standard_normal((2, 3, 20, 20)).astype(np.float32)
    np.testing.assert_array_equal(loaded.run({"x": x})["y"], direct.run({"x": x})["y"])


@pytest.mark.parametrize("k", [64, 300])
def test_a_qlinear_matmul_of_two_activations_is_exact(k: int) -> None:
    """Attention's products in a QOperator model (both operands computed): exact integer sums
    through float32 batched products in chunks of 256 depths, the reference's bytes."""
    b = GraphBuilder("g")
    c = b.const
    y, = b.node("QLinearMatMul", [b.input("a", parse_type(f"u8[n,4,16,{k}]")), c("sa", np.float32(0.03)),
                                  c("za", np.uint8(120)), b.input("b", parse_type(f"u8[n,4,{k},24]")),
                                  c("sb", np.float32(0.02)), c("zb", np.uint8(9)),
                                  c("sy", np.float32(0.03 * 0.02 * 60 * np.sqrt(k))), c("zy", np.uint8(128))])
    b.output(y)
    graph = b.build()
    sess = md.compile(graph, target="x86", cache=False)
    assert "two activations" in sess.executable.plan[0].reason, sess.executable.plan[0].reason
    feeds = {"a": _ints(np.uint8, (2, 4, 16, k)), "b": _ints(np.uint8, (2, 4, k, 24))}
    (got,), (want,) = sess.run(feeds).values(), md.compile(graph, target="reference").run(feeds).values()
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(want)) > 20


@pytest.mark.parametrize(("a_dtype", "y_dtype"), [(np.uint8, np.uint8), (np.int8, np.int8)])
@pytest.mark.parametrize("threads", [1, 2])
def test_attentions_p_v_of_a_symbolic_depth_runs_natively_up_to_256(a_dtype: type, y_dtype: type,
                                                                    threads: int) -> None:
    """``P V`` in a QOperator transformer: its depth is the sequence. Bound to at most 256, it
    runs as md_widen8, md_bmm and md_requant8 (no Python); longer, from Python in chunks: the
    reference's bytes either way, with the extreme values in."""
    kind, mid = ("u8", 128) if a_dtype is np.uint8 else ("i8", 0)
    b = GraphBuilder("g")
    c = b.const
    y, = b.node("QLinearMatMul", [b.input("p", parse_type(f"{kind}[n,4,s,s]")), c("sp", np.float32(1 / 255)),
                                  c("zp", a_dtype(mid - 3)), b.input("v", parse_type(f"{kind}[n,4,s,24]")),
                                  c("sv", np.float32(0.02)), c("zv", a_dtype(mid + 9)), c("sy", np.float32(0.14)),
                                  c("zy", y_dtype(mid + 5))], name="pv")
    b.output(y)
    graph = b.build()
    sess = md.compile(graph, target="x86", threads=threads, cache=False)
    reference = md.compile(graph, target="reference")
    info = np.iinfo(a_dtype)
    for n, s in ((1, 5), (2, 100), (1, 256), (1, 300)):
        feeds = {"p": _ints(a_dtype, (n, 4, s, s)), "v": _ints(a_dtype, (n, 4, s, 24))}
        feeds["p"][0, 0, 0], feeds["v"][0, 0, :, 0] = info.max, info.min  # the largest sums
        got = sess.run(feeds)["pv_out"]
        np.testing.assert_array_equal(got, reference.run(feeds)["pv_out"])
        assert len(np.unique(got)) > 20 or s == 5
        ran = {row.what for row in sess.profile(feeds, runs=1).rows}
        assert ("exact integer sums (md_bmm)" in ran) == (s <= 256), ran


def test_a_product_of_two_activations_with_a_broadcast_batch_runs_from_python() -> None:
    """Operands whose batch axes differ (one broadcast) take the chunked path from Python, with
    the binding's reason: the reference's bytes."""
    b = GraphBuilder("g")
    c = b.const
    y, = b.node("QLinearMatMul", [b.input("p", parse_type("u8[n,4,s,s]")), c("sp", np.float32(1 / 255)),
                                  c("zp", np.uint8(125)), b.input("v", parse_type("u8[1,4,s,24]")),
                                  c("sv", np.float32(0.02)), c("zv", np.uint8(137)), c("sy", np.float32(0.1)),
                                  c("zy", np.uint8(133))], name="pv")
    b.output(y)
    graph = b.build()
    sess = md.compile(graph, target="x86", cache=False)
    feeds = {"p": _ints(np.uint8, (3, 4, 40, 40)), "v": _ints(np.uint8, (1, 4, 40, 24))}
    got = sess.run(feeds)["pv_out"]
    np.testing.assert_array_equal(got, md.compile(graph, target="reference").run(feeds)["pv_out"])
    assert len(np.unique(got)) > 20
    assert "exact integer sums (md_bmm)" not in {row.what for row in sess.profile(feeds, runs=1).rows}
