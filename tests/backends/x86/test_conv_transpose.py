"""ConvTranspose on x86 (sgemm + ``md_col2im``) against ONNX Runtime: strides, dilations, pads,
output_padding, output_shape, auto_pad, groups, bias, batch sizes, a fused activation."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import metadef as md
from metadef.codegen.jit import compile_count

pytestmark = pytest.mark.jit

RNG = np.random.default_rng(11)

CASES: list[tuple[int, int, int, int, dict[str, Any]]] = [  # (c, k per group, kernel, size, attributes)
    (8, 4, 3, 6, {}),
    (8, 4, 4, 7, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),              # a decoder's 2x upsampling
    (6, 3, 3, 5, {"strides": [2, 3], "output_padding": [1, 2]}),
    (6, 2, 3, 5, {"dilations": [2, 1], "pads": [0, 2, 1, 0]}),
    (8, 2, 3, 6, {"group": 4, "strides": [2, 2]}),
    (4, 4, 2, 5, {"strides": [2, 2], "output_shape": [11, 10]}),
    (4, 4, 3, 5, {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    (4, 4, 3, 5, {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    (3, 5, 5, 1, {}),                                                    # one pixel in, the kernel out
    (32, 16, 4, 14, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),        # large enough to split over threads
]


def _model(c: int, k: int, kernel: int, attrs: dict[str, Any], bias: bool, relu: bool) -> onnx.ModelProto:
    group = attrs.get("group", 1)
    w = RNG.standard_normal((c, k, kernel, kernel)).astype(np.float32)
    consts = [onnx.numpy_helper.from_array(w, "w")]
    inputs = ["x", "w"]
    if bias:
        consts.append(onnx.numpy_helper.from_array(RNG.standard_normal(k * group).astype(np.float32), "b"))
        inputs.append("b")
    nodes = [helper.make_node("ConvTranspose", inputs, ["t" if relu else "y"], **attrs)]
    if relu:
        nodes.append(helper.make_node("Relu", ["t"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", c, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("c", "k", "kernel", "size", "attrs"), CASES)
def test_convtranspose_matches_onnxruntime(c: int, k: int, kernel: int, size: int, attrs: dict[str, Any],
                                           bias: bool, threads: int) -> None:
    model = _model(c, k, kernel, attrs, bias, relu=False)
    sess = md.compile(md.import_onnx(model), target="x86", threads=threads)
    assert sess.executable.plan[0].kind == "blas"
    oracle = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    compiled = None
    for n in (1, 3):
        x = RNG.standard_normal((n, c, size, size + 1)).astype(np.float32)
        if "output_shape" in attrs or "SAME" in attrs.get("auto_pad", ""):
            x = x[..., :size]  # (the output size is stated for square inputs)
            x = np.ascontiguousarray(x)
        np.testing.assert_allclose(sess.run({"x": x})["y"], oracle.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
        program = sess.executable.programs.bound({"n": n, "h": x.shape[2], "w": x.shape[3]})
        try:
            assert program.python_steps == 0 and program.call_kinds["convtranspose col2im"] == n
        finally:
            sess.executable.programs.give_back(program)
        compiled = compile_count() if compiled is None else compiled
    assert compile_count() == compiled


def test_a_fused_relu_after_convtranspose_runs_as_its_epilogue() -> None:
    model = _model(8, 4, 4, {"strides": [2, 2], "pads": [1, 1, 1, 1]}, bias=True, relu=True)
    graph = md.optimize(md.import_onnx(model), level="aggressive")
    sess = md.compile(graph, target="x86")
    oracle = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for size in (7, 10):
        x = RNG.standard_normal((2, 8, size, size - 2)).astype(np.float32)
        np.testing.assert_allclose(sess.run({"x": x})["y"], oracle.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
    assert all(not p.fallback for p in sess.executable.plan)


CASES_1D: list[tuple[int, int, int, int, dict[str, Any]]] = [  # (c, k per group, kernel, length, attributes)
    (8, 4, 3, 9, {}),
    (16, 8, 16, 25, {"strides": [8], "pads": [4, 4]}),            # a vocoder's 8x upsampling
    (6, 3, 3, 7, {"strides": [3], "output_padding": [2], "dilations": [2]}),
    (8, 2, 4, 10, {"group": 4, "strides": [2], "pads": [1, 2]}),
    (4, 4, 3, 6, {"strides": [2], "auto_pad": "SAME_UPPER"}),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("c", "k", "kernel", "length", "attrs"), CASES_1D)
def test_a_1d_convtranspose_runs_as_planes_of_one_row(c: int, k: int, kernel: int, length: int,
                                                      attrs: dict[str, Any], threads: int) -> None:
    group = attrs.get("group", 1)
    consts = [onnx.numpy_helper.from_array(RNG.standard_normal((c, k, kernel)).astype(np.float32), "w"),
              onnx.numpy_helper.from_array(RNG.standard_normal(k * group).astype(np.float32), "b")]
    graph = helper.make_graph([helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", c, "t"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = md.compile(md.import_onnx(model), target="x86", threads=threads)
    oracle = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n, t in ((1, length), (3, length + 3)):
        x = RNG.standard_normal((n, c, t)).astype(np.float32)
        np.testing.assert_allclose(sess.run({"x": x})["y"], oracle.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
        program = sess.executable.programs.bound({"n": n, "t": t})
        try:
            assert program.python_steps == 0 and program.call_kinds["convtranspose col2im"] == n
        finally:
            sess.executable.programs.give_back(program)
