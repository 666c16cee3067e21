"""Integer products scaled to float32 on x86: ``md_qgemmf`` bit for bit the reference;
``MatMulIntegerToFloat`` (what ``quantize_dynamic``'s layers become) runs as it at any batch and
thread count; a model from ONNX Runtime's ``quantize_dynamic`` runs as integer products and
agrees with ONNX Runtime."""

from __future__ import annotations

import ctypes

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import metadef as md
from metadef.backends.x86.quantized_float import qgemmf_plan
from metadef.codegen.native import ENTRY, native_function
from metadef.codegen.native_qgemm import has_int8_products, qgemmf_dims
from metadef.ir import GraphBuilder
from metadef.ops.defs.microsoft import matmul_integer_to_float_reference
from metadef.shape import parse_type
from metadef.testing.oracle import ort_exact_int8

pytestmark = pytest.mark.jit
needs_int8 = pytest.mark.skipif(not has_int8_products(), reason="md_qgemmf needs AVX512-VNNI or AVX2")

RNG = np.random.default_rng(31)


def _ints(dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def _graph(shape: str, w: np.ndarray, sw: np.ndarray, zw: np.ndarray | None, bias: np.ndarray | None,
           a_dtype: str = "u8") -> md.Graph:
    """One MatMulIntegerToFloat whose activations' scale and zero point are graph inputs."""
    b = GraphBuilder("g")
    inputs = [b.input("a", parse_type(shape)), b.const("w", w), b.input("sa", parse_type("f32[]")),
              b.const("sw", sw), b.input("za", parse_type(f"{a_dtype}[]")),
              None if zw is None else b.const("zw", zw), None if bias is None else b.const("bias", bias)]
    while inputs[-1] is None:
        inputs.pop()
    y, = b.node("MatMulIntegerToFloat", inputs, domain="com.microsoft")
    b.output(y)
    return b.build()


@needs_int8
@pytest.mark.parametrize("m,n,k", [(1, 10, 512), (13, 33, 7), (128, 96, 768), (3, 64, 4), (40, 31, 130), (5, 40, 200)])
@pytest.mark.parametrize("a_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("weights", ["int8", "uint8 wide"])
def test_md_qgemmf_is_the_reference_bit_for_bit(m: int, n: int, k: int, a_dtype: type, weights: str) -> None:
    """int8 weights, and uint8 ones whose zero points (one a column, 0 to 255) leave them outside
    int8: packed as W - 128, each row's byte sum times 128 - zero point added in the stores."""
    a = _ints(a_dtype, (m, k))
    w = _ints(np.int8, (k, n)) if weights == "int8" else _ints(np.uint8, (k, n))
    zw = None if weights == "int8" else RNG.integers(0, 256, n).astype(np.uint8)
    sa, za = np.array([0.0173], np.float32), np.array([131 if a_dtype is np.uint8 else -9], a_dtype)
    sw = RNG.uniform(0.002, 0.01, n).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32)
    node = _graph(f"{'u8' if a_dtype is np.uint8 else 'i8'}[m,{k}]", w, sw, zw, bias,
                  "u8" if a_dtype is np.uint8 else "i8").nodes[0]
    plan = qgemmf_plan(node, [None, w, None, sw, None, zw, bias])
    assert not isinstance(plan, str), plan
    assert plan.wide == (weights != "int8")
    want = matmul_integer_to_float_reference([a, w, sa[0], sw, za[0], zw, bias], {})
    for tasks in (1, 3):
        y = np.full((m, n + 5), 77.0, np.float32)  # (rows ldy apart: the 5 columns past n stay untouched)
        args = (ctypes.c_void_p * 10)(a.ctypes.data, plan.packed.ctypes.data, plan.base.ctypes.data,
                                      plan.colsum.ctypes.data, plan.scale.ctypes.data, plan.bias.ctypes.data,
                                      plan.rowterm.ctypes.data, sa.ctypes.data, za.ctypes.data, y.ctypes.data)
        for task in range(tasks):
            dims = qgemmf_dims(m, n, k, flip=a_dtype is np.int8, wide=plan.wide, ldy=n + 5, task=task, tasks=tasks)
            ENTRY(native_function("md_qgemmf"))(args, (ctypes.c_int64 * len(dims))(*dims))
        np.testing.assert_array_equal(y[:, :n], want)
        assert (y[:, n:] == 77.0).all()


@needs_int8
@pytest.mark.parametrize("threads", [1, 2])
def test_matmul_integer_to_float_runs_as_md_qgemmf_at_any_batch(threads: int) -> None:
    w = _ints(np.int8, (96, 200))
    graph = _graph("u8[b,s,96]", w, RNG.uniform(0.002, 0.01, 200).astype(np.float32), np.zeros(200, np.int8),
                   RNG.standard_normal(200).astype(np.float32))
    sess = md.compile(graph, target="x86", cache=False, threads=threads)
    ref = md.compile(graph, target="reference")
    assert sess.executable.plan[0].reason.startswith("md_qgemmf"), sess.executable.plan[0].reason
    for shape, scale, zero in (((1, 7), 0.02, 0), ((3, 40), 0.005, 255), ((2, 129), 1.5, 17)):
        feeds = {"a": _ints(np.uint8, (*shape, 96)), "sa": np.array(scale, np.float32), "za": np.array(zero, np.uint8)}
        got, = sess.run(feeds).values()
        want, = ref.run(feeds).values()
        assert got.shape == (*shape, 200)
        np.testing.assert_array_equal(got, want)


def test_a_product_md_qgemmf_cannot_take_says_why() -> None:
    graph = _graph("u8[b,96]", _ints(np.int8, (96, 8)), np.float32(0.01), np.int8(-100), None)
    sess = md.compile(graph, target="x86", cache=False)
    reason = sess.executable.plan[0].reason
    assert "do not fit in int8" in reason or "VNNI" in reason, reason
    feeds = {"a": _ints(np.uint8, (4, 96)), "sa": np.array(0.1, np.float32), "za": np.array(3, np.uint8)}
    (got,), (want,) = sess.run(feeds).values(), md.compile(graph, target="reference").run(feeds).values()
    np.testing.assert_array_equal(got, want)


def _dynamic_model(path: str, **options: object) -> None:
    """A small transformer-style block (two linear layers, GELU by erf, a residual add, a
    LayerNormalization) quantized by ONNX Runtime's ``quantize_dynamic`` (int8 weights unless
    ``options`` say otherwise)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    w1, w2 = (RNG.standard_normal(s).astype(np.float32) * 0.1 for s in ((64, 128), (128, 64)))
    w1 = np.abs(w1)  # (all positive: as uint8 their zero point is 0, and W - 0 is outside int8)
    consts = {"w1": w1, "w2": w2, "b1": RNG.standard_normal(128).astype(np.float32) * 0.1,
              "b2": RNG.standard_normal(64).astype(np.float32) * 0.1, "half": np.float32(0.5),
              "one": np.float32(1.0), "root": np.float32(1 / np.sqrt(2)), "g": np.ones(64, np.float32),
              "beta": np.zeros(64, np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Mul", ["hb", "root"], ["s"]), helper.make_node("Erf", ["s"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["hb", "e1"], ["g1"]),
             helper.make_node("Mul", ["g1", "half"], ["gelu"]), helper.make_node("MatMul", ["gelu", "w2"], ["o"]),
             helper.make_node("Add", ["o", "b2"], ["ob"]), helper.make_node("Add", ["ob", "x"], ["r"]),
             helper.make_node("LayerNormalization", ["r", "g", "beta"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 64])],
                              [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path + ".float.onnx")
    quantize_dynamic(path + ".float.onnx", path,  # (7-bit weights: ORT_EXACT_INT8)
                     **{"weight_type": QuantType.QInt8, "reduce_range": True, **options})  # type: ignore[arg-type]


@needs_int8
@pytest.mark.parametrize("options", ["int8", "uint8", "per_channel"])
def test_an_onnxruntime_dynamic_model_runs_as_integer_products(tmp_path: pytest.TempPathFactory, options: str) -> None:
    """int8 weights (ORT's default), uint8 ones (asymmetric: their zero points need md_qgemmf's
    row sums), and per-channel scales."""
    from onnxruntime.quantization import QuantType

    path = str(tmp_path / "dyn.onnx")  # type: ignore[operator]
    _dynamic_model(path, **{"int8": {}, "uint8": {"weight_type": QuantType.QUInt8},
                            "per_channel": {"per_channel": True}}[options])
    model = onnx.load(path)
    assert sum(n.op_type == "MatMulInteger" for n in model.graph.node) == 2
    zeros = [onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name.startswith("w1_zero_point")]
    assert options != "uint8" or (zeros[0].dtype == np.uint8 and zeros[0].max() < 64), zeros  # (md_qgemmf's wide)
    graph = md.import_onnx(model)
    optimized = md.optimize(graph, level="aggressive")
    sess = md.compile(optimized, target="x86", cache=False)
    kinds = [e.reason for e in sess.executable.plan]
    assert sum("md_qgemmf" in r for r in kinds) == 2, kinds
    ort_sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    before = md.compile(graph, target="reference")
    for shape in ((1, 1), (2, 9), (1, 128)):
        x = RNG.standard_normal((*shape, 64)).astype(np.float32)
        got = sess.run({"x": x})["y"]
        # the integer products are exact; the float ops round differently, which could move an
        # activation across a quantization step (in BERT-base ONNX Runtime's own optimization
        # levels differ by 2 % of the largest output): a few rows move by about one step (the
        # LayerNorm spreads one moved activation over its row: one row of 18 was 5.5 % of the
        # elements, which failed a count of elements where the test order changed the data)
        for want in (before.run({"x": x})["y"], ort_sess.run(None, {"x": x})[0]):
            off = np.abs(got - want)
            moved = np.any(off > 1e-5, axis=-1)
            assert off.max() <= 5e-3 and moved.sum() <= max(1, 0.02 * moved.size), (off.max(), moved.sum())


@needs_int8
@pytest.mark.parametrize("c,k,group,hw,attrs", [
    (8, 16, 1, 10, {"pads": [1, 1, 1, 1]}), (3, 24, 1, 17, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    (16, 40, 1, 7, {"kernel_shape": [1, 1]}), (5, 7, 1, 9, {"pads": [2, 2, 2, 2]}),
    (8, 8, 8, 10, {"pads": [1, 1, 1, 1]}), (12, 6, 3, 9, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
])
@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("runtime_zero", [True, False])
def test_conv_integer_runs_as_md_qconvi_bit_for_bit(c: int, k: int, group: int, hw: int, attrs: dict,
                                                    x_dtype: type, runtime_zero: bool) -> None:
    b = GraphBuilder("g")
    text = "u8" if x_dtype is np.uint8 else "i8"
    x = b.input("x", parse_type(f"{text}[n,{c},{hw},{hw}]"))
    size = (1, 1) if attrs.get("kernel_shape") == [1, 1] else (5, 5) if attrs.get("pads") == [2, 2, 2, 2] else (3, 3)
    w = _ints(np.int8, (k, c // group, *size))
    zero = np.asarray(200 if x_dtype is np.uint8 else -100, x_dtype)
    za = b.input("za", parse_type(f"{text}[]")) if runtime_zero else b.const("za", zero)
    y, = b.node("ConvInteger", [x, b.const("w", w), za, b.const("wz", np.int8(0))], {**attrs, "group": group})
    b.output(y)
    graph = b.build()
    sess = md.compile(graph, target="x86", cache=False)
    assert sess.executable.plan[0].reason.startswith("md_qconvi"), sess.executable.plan[0].reason
    feeds = {"x": _ints(x_dtype, (2, c, hw, hw))}
    if runtime_zero:
        feeds["za"] = zero
    (got,), (want,) = sess.run(feeds).values(), md.compile(graph, target="reference").run(feeds).values()
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


@needs_int8
def test_an_onnxruntime_dynamic_conv_net_runs_as_integer_convs(tmp_path: pytest.TempPathFactory) -> None:
    """A conv, a depthwise conv and a pointwise one, each quantized by ``quantize_dynamic``
    (``DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul``): all three run as ``md_qconvi``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    path = str(tmp_path / "conv.onnx")  # type: ignore[operator]
    consts = {"w1": RNG.standard_normal((16, 3, 3, 3)) * 0.3, "w2": RNG.standard_normal((16, 1, 3, 3)) * 0.3,
              "w3": RNG.standard_normal((8, 16, 1, 1)) * 0.3, "b1": RNG.standard_normal(16) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], group=16, strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"]), helper.make_node("Conv", ["r2", "w3"], ["y"])]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 20, 20])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8, 10, 10])],
                              [onnx.numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in consts.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path + ".float.onnx")
    quantize_dynamic(path + ".float.onnx", path, weight_type=QuantType.QInt8, reduce_range=True)  # (ORT_EXACT_INT8)
    model = onnx.load(path)
    assert sum(n.op_type == "ConvInteger" for n in model.graph.node) == 3
    sess = md.compile(md.optimize(md.import_onnx(model), level="aggressive"), target="x86", cache=False)
    assert sum("md_qconvi" in e.reason for e in sess.executable.plan) == 3, [e.reason for e in sess.executable.plan]
    ort_sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for n in (1, 3):
        x = RNG.standard_normal((n, 3, 20, 20)).astype(np.float32)
        off = np.abs(sess.run({"x": x})["y"] - ort_sess.run(None, {"x": x})[0])
        assert off.max() <= 5e-2 and np.mean(off > 1e-5) < 0.02, (off.max(), np.mean(off > 1e-5))


@needs_int8
@pytest.mark.parametrize("weights", ["int8", "uint8"])
def test_qattention_runs_its_projection_as_md_qgemmf(weights: str) -> None:
    """ORT's QAttention (an ORT-optimized transformer quantized by quantize_dynamic): the
    projection by md_qgemmf, the result ONNX Runtime's."""
    batch, seq, hidden, heads = 2, 7, 32, 4
    w = ort_exact_int8(RNG, (hidden, 3 * hidden)) if weights == "int8" else _ints(np.uint8, (hidden, 3 * hidden))
    consts = {"w": w, "bias": RNG.standard_normal(3 * hidden).astype(np.float32),
              "sw": np.float32(0.004), "zw": np.asarray(0 if weights == "int8" else 20, w.dtype)}
    node = helper.make_node("QAttention", ["x", "w", "bias", "sx", "sw", "mask", "zx", "zw"], ["y"],
                            domain="com.microsoft", num_heads=heads)
    graph = helper.make_graph([node], "g", [
        helper.make_tensor_value_info("x", TensorProto.UINT8, ["b", "s", hidden]),
        helper.make_tensor_value_info("sx", TensorProto.FLOAT, []),
        helper.make_tensor_value_info("zx", TensorProto.UINT8, []),
        helper.make_tensor_value_info("mask", TensorProto.INT32, ["b", "s"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", hidden])],
        [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    sess = md.compile(md.import_onnx(model), target="x86", cache=False)
    assert "md_qgemmf" in sess.executable.plan[0].reason, sess.executable.plan[0].reason
    ort_sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    mask = np.ones((batch, seq), np.int32)
    mask[0, 4:] = 0
    feeds = {"x": _ints(np.uint8, (batch, seq, hidden)), "sx": np.array(0.03, np.float32),
             "zx": np.array(121, np.uint8), "mask": mask}
    np.testing.assert_allclose(sess.run(feeds)["y"], ort_sess.run(None, feeds)[0], rtol=1e-4, atol=1e-5)
