"""ONNX Runtime's QOperator contrib ops (``QLinearAdd``, ``QLinearMul``, ``QLinearSigmoid``,
``QLinearLeakyRelu``, ``QLinearGlobalAveragePool``, ``QLinearAveragePool``, ``QLinearConcat``):
shapes and errors, and one-node models against ONNX Runtime on the reference backend and on x86
(where the index expressions become generated kernels)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import metadef as md
from metadef.core.errors import DTypeError, ShapeError
from metadef.ops import get_op, infer_types
from metadef.ops.defs.microsoft_qlinear import DOMAIN
from metadef.shape import parse_type

RNG = np.random.default_rng(53)


def _model(op: str, feeds: dict[str, np.ndarray], consts: dict[str, Any], inputs: list[str],
           **attrs: Any) -> onnx.ModelProto:
    node = helper.make_node(op, inputs, ["y"], domain=DOMAIN, **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                      for k, v in feeds.items()],
        [helper.make_empty_tensor_value_info("y")],
        [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])


def _check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], steps: int = 0, share: float = 0.0) -> None:
    """Reference and x86 (a generated kernel unless the op is opaque) against ONNX Runtime: equal,
    or at most ``steps`` apart in at most ``share`` of the elements."""
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    graph = md.import_onnx(model)
    sess = md.compile(graph, target="x86", cache=False)
    for got in (next(iter(md.compile(graph, target="reference").run(feeds).values())),
                next(iter(sess.run(feeds).values()))):
        assert got.dtype == want.dtype and got.shape == want.shape
        off = np.abs(got.astype(np.int64) - want.astype(np.int64))
        assert off.max() <= steps and np.mean(off > 0) <= share, (off.max(), np.mean(off > 0))
    if graph.nodes[0].op != "QLinearConcat":
        assert "LLVM" in sess.executable.plan[0].reason, sess.executable.plan[0].reason


def _ints(dtype: type, *shape: int) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, int(info.max) + 1, shape).astype(dtype)


DTYPES = [np.uint8, np.int8]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("b_shape", [(2, 8, 5, 5), (8, 1, 1)])
def test_qlinear_add_and_mul_are_onnxruntimes(dtype: type, op: str, b_shape: tuple[int, ...]) -> None:
    z = lambda v: np.asarray(v, dtype)  # noqa: E731
    consts = {"sa": np.float32(0.031), "za": z(3), "sb": np.float32(0.017), "zb": z(-5 if dtype is np.int8 else 120),
              "sc": np.float32(0.04), "zc": z(7)}
    feeds = {"a": _ints(dtype, 2, 8, 5, 5), "b": _ints(dtype, *b_shape)}
    _check(_model(op, feeds, consts, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"]), feeds)


@pytest.mark.parametrize("dtype", DTYPES)
def test_qlinear_sigmoid_and_leaky_relu_are_onnxruntimes(dtype: type) -> None:
    z = lambda v: np.asarray(v, dtype)  # noqa: E731
    feeds = {"x": _ints(dtype, 3, 100)}
    sigmoid = {"sx": np.float32(0.05), "zx": z(10), "sy": np.float32(1 / 256 if dtype is np.uint8 else 1 / 128),
               "zy": z(0 if dtype is np.uint8 else -128)}
    _check(_model("QLinearSigmoid", feeds, sigmoid, ["x", "sx", "zx", "sy", "zy"]), feeds)
    leaky = dict(sigmoid, sy=np.float32(0.04), zy=z(20))
    _check(_model("QLinearLeakyRelu", feeds, leaky, ["x", "sx", "zx", "sy", "zy"], alpha=0.1), feeds)


@pytest.mark.parametrize("dtype", DTYPES)
def test_qlinear_pools_are_onnxruntimes(dtype: type) -> None:
    z = lambda v: np.asarray(v, dtype)  # noqa: E731
    consts = {"sx": np.float32(0.05), "zx": z(10), "sy": np.float32(0.03), "zy": z(5)}
    names = ["x", "sx", "zx", "sy", "zy"]
    feeds = {"x": _ints(dtype, 2, 16, 7, 7)}
    _check(_model("QLinearGlobalAveragePool", feeds, consts, names), feeds)
    feeds = {"x": _ints(dtype, 2, 16, 9, 9)}
    _check(_model("QLinearAveragePool", feeds, consts, names, kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                  count_include_pad=1), feeds)
    # windows clipped by the padding: ONNX Runtime rounds its mean its own way, a step apart in ~2 %
    _check(_model("QLinearAveragePool", feeds, consts, names, kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                  strides=[2, 2]), feeds, steps=1, share=0.05)


@pytest.mark.parametrize("dtype", DTYPES)
def test_qlinear_concat_is_onnxruntimes(dtype: type) -> None:
    z = lambda v: np.asarray(v, dtype)  # noqa: E731
    consts = {"sy": np.float32(0.05), "zy": z(4), "s1": np.float32(0.05), "z1": z(4), "s2": np.float32(0.02),
              "z2": z(9)}
    feeds = {"x1": _ints(dtype, 2, 3, 4), "x2": _ints(dtype, 2, 5, 4)}
    _check(_model("QLinearConcat", feeds, consts, ["sy", "zy", "x1", "s1", "z1", "x2", "s2", "z2"], axis=1), feeds)


def _infer(op: str, types: list[str | None], attrs: dict | None = None) -> list[str]:
    ins = [None if t is None else parse_type(t) for t in types]
    return [str(t) for t in infer_types(get_op(op, DOMAIN), "/n", ins, dict(attrs or {}))]


def test_qlinear_shapes_and_errors() -> None:
    assert _infer("QLinearAdd", ["u8[b,8,5,5]", "f32[]", "u8[]", "u8[8,1,1]", "f32[]", "u8[]", "f32[]",
                                 "u8[]"]) == ["u8[b,8,5,5]"]
    assert _infer("QLinearGlobalAveragePool", ["i8[b,16,7,7]", "f32[]", "i8[]", "f32[]", "i8[]"]) == ["i8[b,16,1,1]"]
    assert _infer("QLinearGlobalAveragePool", ["u8[b,7,7,16]", "f32[]", "u8[]", "f32[]", "u8[]"],
                  {"channels_last": 1}) == ["u8[b,1,1,16]"]
    assert _infer("QLinearAveragePool", ["u8[b,16,9,9]", "f32[]", "u8[]", "f32[]", "u8[]"],
                  {"kernel_shape": [3, 3], "strides": [2, 2]}) == ["u8[b,16,4,4]"]
    assert _infer("QLinearConcat", ["f32[]", "u8[]", "u8[b,3,4]", "f32[]", "u8[]", "u8[b,5,4]", "f32[]", "u8[]"],
                  {"axis": 1}) == ["u8[b,8,4]"]
    with pytest.raises(DTypeError, match=r"input 3 \(B\) is int8 but an earlier input of type T is uint8"):
        _infer("QLinearAdd", ["u8[4]", "f32[]", "u8[]", "i8[4]", "f32[]", "i8[]", "f32[]", "u8[]"])
    with pytest.raises(ShapeError, match=r"must come in \(X, X_scale, X_zero_point\) triples, got 2"):
        _infer("QLinearConcat", ["f32[]", "u8[]", "u8[3]", "f32[]"], {"axis": 0})
    with pytest.raises(ShapeError, match="channels_last=1 is not supported"):
        _infer("QLinearAveragePool", ["u8[b,9,9,16]", "f32[]", "u8[]", "f32[]", "u8[]"],
               {"kernel_shape": [3, 3], "channels_last": 1})


@pytest.mark.parametrize("dtype", DTYPES)
def test_qlinear_softmax_is_onnxruntimes(dtype: type) -> None:
    z = lambda v: np.asarray(v, dtype)  # noqa: E731
    consts = {"sx": np.float32(0.05), "zx": z(10), "sy": np.float32(1 / 256), "zy": z(0 if dtype is np.uint8 else -128)}
    names = ["x", "sx", "zx", "sy", "zy"]
    feeds = {"x": _ints(dtype, 4, 10)}
    _check(_model("QLinearSoftmax", feeds, consts, names, axis=-1, opset=13), feeds)
    feeds = {"x": _ints(dtype, 2, 3, 10)}  # (another axis: the reference kernel, on x86 too)
    model = _model("QLinearSoftmax", feeds, consts, names, axis=1, opset=13)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(next(iter(md.compile(md.import_onnx(model), target="x86", cache=False)
                                            .run(feeds).values())), want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_qlinear_global_average_pool_channels_last_is_onnxruntimes(dtype: type) -> None:
    z = lambda v: np.asarray(v, dtype)  # noqa: E731
    consts = {"sx": np.float32(0.05), "zx": z(10), "sy": np.float32(0.03), "zy": z(5)}
    feeds = {"x": _ints(dtype, 2, 7, 7, 16)}
    model = _model("QLinearGlobalAveragePool", feeds, consts, ["x", "sx", "zx", "sy", "zy"], channels_last=1)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for target in ("reference", "x86"):
        got = next(iter(md.compile(md.import_onnx(model), target=target).run(feeds).values()))
        np.testing.assert_array_equal(got, want)
