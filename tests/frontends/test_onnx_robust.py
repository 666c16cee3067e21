"""Robust ONNX import: wrong declared types, unused initializers and opset imports, outputs
that are inputs or initializers, NHWC inputs, unknown ops in any domain and at any depth."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import metadef as md
from metadef.core.errors import UnsupportedOpError
from metadef.frontends.onnx.exporter import to_onnx
from metadef.testing.onnx_cases import assert_same, run_both, run_metadef
from metadef.testing.oracle import run_onnxruntime

LOGGER = "metadef.frontends.onnx"
RNG = np.random.default_rng(3)


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
           outputs: list[onnx.ValueInfoProto], inits: list[onnx.TensorProto] = (),
           value_info: list[onnx.ValueInfoProto] = (), domains: tuple[str, ...] = ()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "t", inputs, outputs, list(inits), value_info=list(value_info))
    ops = [helper.make_opsetid("", 17)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(g, opset_imports=ops, ir_version=8)


def _relu_model(out_type: int, out_shape: list[int | str] | None,
                value_info: list[onnx.ValueInfoProto] = ()) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Neg", ["h"], ["y"])]
    return _model(nodes, [x], [helper.make_tensor_value_info("y", out_type, out_shape)],
                  value_info=value_info)


# -------------------------------------------------------------------------- declared types


@pytest.mark.parametrize(("elem", "shape", "declared"), [
    (TensorProto.FLOAT, ["batch", 5], "f32[batch,5]"),        # a fixed size differs
    (TensorProto.FLOAT, ["batch", 4, 1], "f32[batch,4,1]"),   # the rank differs
    (TensorProto.INT64, ["batch", 4], "i64[batch,4]"),        # the dtype differs
])
def test_wrong_declared_output_is_reported_and_inference_wins(
        caplog: pytest.LogCaptureFixture, elem: int, shape: list, declared: str) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        g = md.import_onnx(_relu_model(elem, shape))
    assert str(g.outputs[0].type) == "f32[batch,4]"
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1, warnings
    assert "'y'" in warnings[0] and declared in warnings[0] and "f32[batch,4]" in warnings[0]
    x = np.array([[-1, 2, -3, 4]], np.float32)
    np.testing.assert_array_equal(md.compile(g, target="reference").run({"x": x})["y"], -np.maximum(x, 0))


def test_wrong_value_info_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    vi = [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["batch", 7])]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        g = md.import_onnx(_relu_model(TensorProto.FLOAT, ["batch", 4], vi))
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(messages) == 1 and "'h'" in messages[0] and "f32[batch,7]" in messages[0], messages
    assert str(g.nodes[0].outputs[0].type) == "f32[batch,4]"


@pytest.mark.parametrize("shape", [["batch", 4], ["n", 4], [None, 4], None])
def test_agreeing_declared_types_are_silent(caplog: pytest.LogCaptureFixture, shape: list | None) -> None:
    vi = [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["b", 4])]
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        md.import_onnx(_relu_model(TensorProto.FLOAT, shape, vi))
    assert not [r for r in caplog.records if r.name == LOGGER]


# ----------------------------------------------------------------- unused parts are ignored


def test_unused_initializers_and_opset_imports_are_ignored() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])
    unused = [numpy_helper.from_array(np.ones((2, 2), np.float32), "unused_w"),
              numpy_helper.from_array(np.array([1, 2], np.int64), "unused_shape")]
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [x], [y], unused,
                   domains=("com.microsoft", "ai.onnx.ml", "com.example.nothing"))
    g = md.import_onnx(model)
    assert [n.op for n in g.nodes] == ["Relu"]
    feeds = {"x": RNG.standard_normal((2, 3)).astype(np.float32)}
    assert_same(*run_both(model, feeds))


# ------------------------------------------------------ outputs that are inputs or constants


@pytest.mark.parametrize("passthrough", ["input", "initializer"])
def test_outputs_that_are_inputs_or_initializers_work_end_to_end(passthrough: str) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    w = numpy_helper.from_array(np.arange(3, dtype=np.float32), "w")
    name = "x" if passthrough == "input" else "w"
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3]),
               helper.make_tensor_value_info(name, TensorProto.FLOAT, None)]
    model = _model([helper.make_node("Add", ["x", "w"], ["y"])], [x], outputs, [w])
    feeds = {"x": RNG.standard_normal((2, 3)).astype(np.float32)}
    g = md.import_onnx(model)
    assert [v.name for v in g.outputs] == ["y", name]
    got = run_metadef(model, feeds)
    w_array = numpy_helper.to_array(w)
    assert_same(got, [feeds["x"] + w_array, feeds["x"] if name == "x" else w_array])
    exported = to_onnx(g)
    onnx.checker.check_model(exported)
    assert [o.name for o in exported.graph.output] == ["y", name]
    again = run_onnxruntime(exported, feeds)
    assert_same([again["y"], again[name]], got)


# ---------------------------------------------------------------------------- NHWC inputs


def test_nhwc_input_transposed_before_conv_matches_onnxruntime() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, 8, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(RNG.standard_normal(4).astype(np.float32), "b")
    nodes = [helper.make_node("Transpose", ["x"], ["x_nchw"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["x_nchw", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    model = _model(nodes, [x], [y], [w, b])
    g = md.import_onnx(model)
    assert str(g.outputs[0].type) == "f32[n,4,8,8]"
    feeds = {"x": RNG.standard_normal((2, 8, 8, 3)).astype(np.float32)}
    assert_same(*run_both(model, feeds), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------- unknown ops


def test_unknown_custom_domain_op_inside_if_branch_fails_before_anything_runs() -> None:
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    then_out = helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])
    else_out = helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])
    then_g = helper.make_graph([helper.make_node("Frobnicate", ["x"], ["t"], domain="com.acme",
                                                 name="/then/frob")], "then", [], [then_out])
    else_g = helper.make_graph([helper.make_node("Relu", ["x"], ["e"])], "else", [], [else_out])
    model = _model([helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)],
                   [cond, x], [y], domains=("com.acme",))
    with pytest.raises(UnsupportedOpError) as info:
        md.import_onnx(model)
    text = str(info.value)
    assert "'Frobnicate'" in text and "'com.acme'" in text and "/then/frob" in text
    assert "metadef.ops.metaop(" in text and "domain=" in text
