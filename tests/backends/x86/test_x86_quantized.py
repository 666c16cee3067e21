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
from metadef.codegen.native import ENTRY, native_function
from metadef.codegen.native_qgemm import QGEMM_PANEL, has_vnni, pack_qgemm_weights, qgemm_dims
from metadef.ir import GraphBuilder
from metadef.ops.defs.quantized import qlinear_matmul_reference
from metadef.shape import parse_type

pytestmark = pytest.mark.jit
needs_vnni = pytest.mark.skipif(not has_vnni(), reason="md_qgemm needs AVX512-VNNI")

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


@needs_vnni
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


@needs_vnni
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


@needs_vnni
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

    quantize_static(float_path, path, Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8)


@needs_vnni
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
    values, and a group mixes 8-bit inputs with float ones."""
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
    graph = md.optimize(b.build(), level="aggressive")
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
