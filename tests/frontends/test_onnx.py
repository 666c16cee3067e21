"""ONNX import/export: symbols, constants, external data, unknown ops, custom ops, round trips."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import metadef as md
from metadef.core.errors import FormatError, UnsupportedOpError
from metadef.ops import Role, metaop
from metadef.ops.metaop import SAME_AS_FIRST
from metadef.testing.oracle import run_onnxruntime


def _model(nodes, inputs, outputs, inits=(), opset=17, domains=()):
    g = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(g, opset_imports=ops, ir_version=8)


def _relu_add_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    bias = numpy_helper.from_array(np.arange(4, dtype=np.float32), "bias")
    nodes = [
        helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.float32(2.0))),
        helper.make_node("Add", ["x", "bias"], ["h"], name="/add"),
        helper.make_node("Mul", ["h", "two"], ["h2"], name="/mul"),
        helper.make_node("Relu", ["h2"], ["y"], name="/relu"),
    ]
    return _model(nodes, [x], [y], [bias])


def test_dim_params_become_symbols_and_constants_become_consts():
    g = md.import_onnx(_relu_add_model())
    assert str(g.inputs[0].type) == "f32[batch,4]"
    assert str(g.outputs[0].type) == "f32[batch,4]"
    assert sorted(v.name for v in g.constants) == ["bias", "two"]
    assert "batch" in g.env.symbols
    x = np.array([[-3, -1, 0, 1]], np.float32)
    out = md.compile(g).run({"x": x})["y"]
    np.testing.assert_array_equal(out, np.maximum((x + np.arange(4)) * 2, 0))


def test_unnamed_dims_get_fresh_symbols():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = md.import_onnx(_model([helper.make_node("Relu", ["x"], ["y"])], [x], [y]))
    assert str(g.inputs[0].type).startswith("f32[x_") and str(g.outputs[0].type).endswith(",4]")


def test_unknown_op_names_op_domain_node_and_the_way_to_register():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    m = _model([helper.make_node("FancyOp", ["x"], ["y"], name="/enc/Fancy_3", domain="com.acme")],
               [x], [y], domains=["com.acme"])
    with pytest.raises(UnsupportedOpError) as e:
        md.import_onnx(m)
    text = str(e.value)
    assert "op 'FancyOp' of domain 'com.acme' (node /enc/Fancy_3)" in text
    assert "metadef.ops.metaop(" in text and "docs/custom_ops.md" in text


def test_custom_op_is_one_declaration():
    metaop("TestSoftsign", domain="com.example.test", inputs=("X",), outputs=("Y",), types="T in {float}",
           rule=SAME_AS_FIRST, semantics="Y[...] = X[...] / (1 + abs(X[...]))", role=Role.ELEMENTWISE)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])
    m = _model([helper.make_node("TestSoftsign", ["x"], ["y"], domain="com.example.test")], [x], [y],
               domains=["com.example.test"])
    g = md.import_onnx(m)
    data = np.linspace(-3, 3, 7, dtype=np.float32)
    np.testing.assert_allclose(md.compile(g).run({"x": data})["y"], data / (1 + np.abs(data)), rtol=1e-6)


def test_external_data_and_paths(tmp_path):
    m = _relu_add_model()
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.arange(4, dtype=np.float32) * 10, "bias"))
    path = tmp_path / "m.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="m.data", size_threshold=0)
    assert (tmp_path / "m.data").exists()
    g = md.import_onnx(path)
    np.testing.assert_array_equal(g.value("bias").const, np.arange(4) * 10)


def test_corrupt_and_missing_files_are_format_errors(tmp_path):
    with pytest.raises(FormatError, match="does not exist"):
        md.import_onnx(tmp_path / "nope.onnx")
    path = tmp_path / "cut.onnx"
    path.write_bytes(_relu_add_model().SerializeToString()[:37])
    with pytest.raises(FormatError, match="cannot read ONNX model"):
        md.import_onnx(path)


def test_initializer_listed_as_input_is_a_constant():
    m = _relu_add_model()
    m.graph.input.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, [4]))
    g = md.import_onnx(m)
    assert [v.name for v in g.inputs] == ["x"]


def test_export_runs_in_onnxruntime_with_the_same_outputs(tmp_path):
    m = _relu_add_model()
    g = md.import_onnx(m)
    path = md.export_onnx(g, tmp_path / "out.onnx")
    assert not list(tmp_path.glob(".*tmp*"))
    back = onnx.load(str(path))
    onnx.checker.check_model(back)
    assert back.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(run_onnxruntime(back, {"x": x})["y"], run_onnxruntime(m, {"x": x})["y"])
