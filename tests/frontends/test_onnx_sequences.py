"""Sequences built and taken apart inside a graph are unrolled at import time; the rest is refused."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import metadef as md
from metadef.core.errors import SpecializationError, UnsupportedOpError


def _model(nodes: list, inputs: list, outputs: list, inits: list = ()) -> md.Graph:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return md.import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)]))


def _x(name: str, shape: list) -> object:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def test_split_then_at_and_length_run_as_split_nodes() -> None:
    graph = _model([helper.make_node("SplitToSequence", ["x", "k"], ["s"], axis=1),
                    helper.make_node("SequenceAt", ["s", "i"], ["y"]),
                    helper.make_node("SequenceLength", ["s"], ["n"])],
                   [_x("x", [2, 5])], [_x("y", None), helper.make_empty_tensor_value_info("n")],
                   [helper.make_tensor("k", TensorProto.INT64, [], [2]),
                    helper.make_tensor("i", TensorProto.INT64, [], [-1])])
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    out = md.compile(graph).run({"x": x})
    np.testing.assert_array_equal(out["y"], x[:, 4:])
    assert int(out["n"]) == 3


def test_a_position_known_only_at_run_time_asks_to_specialize_its_input() -> None:
    with pytest.raises(SpecializationError, match=r"known only at run time.*input_values=\{'i': \.\.\.\}"):
        _model([helper.make_node("SequenceConstruct", ["x", "x"], ["s"]),
                helper.make_node("SequenceAt", ["s", "i"], ["y"])],
               [_x("x", [3]), helper.make_tensor_value_info("i", TensorProto.INT64, [])], [_x("y", None)])


def test_a_sequence_graph_output_is_its_items() -> None:
    graph = _model([helper.make_node("SequenceConstruct", ["x"], ["s"])], [_x("x", [3])],
                   [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)])
    assert [v.name for v in graph.outputs] == ["s.0"]
    x = np.array([1, 2, 3], np.float32)
    [got] = md.compile(graph).run({"x": x})["s"]
    np.testing.assert_array_equal(got, x)


def _model15(nodes: list, inputs: list, outputs: list) -> md.Graph:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return md.import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def test_optionals_known_at_import_time_become_their_value_or_a_constant() -> None:
    empty_type = helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [3]))
    graph = _model15([helper.make_node("Optional", ["x"], ["some"]),
                      helper.make_node("Optional", [], ["none"], type=empty_type.optional_type.elem_type),
                      helper.make_node("OptionalHasElement", ["some"], ["has_some"]),
                      helper.make_node("OptionalHasElement", ["none"], ["has_none"]),
                      helper.make_node("OptionalGetElement", ["some"], ["y"])],
                     [_x("x", [3])],
                     [helper.make_tensor_value_info("has_some", TensorProto.BOOL, []),
                      helper.make_tensor_value_info("has_none", TensorProto.BOOL, []), _x("y", [3])])
    x = np.array([1, 2, 3], np.float32)
    out = md.compile(graph).run({"x": x})
    assert bool(out["has_some"]) and not bool(out["has_none"])
    np.testing.assert_array_equal(out["y"], x)


def test_getting_the_element_of_an_empty_optional_is_refused() -> None:
    elem = helper.make_tensor_type_proto(TensorProto.FLOAT, [3])
    with pytest.raises(UnsupportedOpError, match="empty optional"):
        _model15([helper.make_node("Optional", [], ["none"], type=elem),
                  helper.make_node("OptionalGetElement", ["none"], ["y"])], [], [_x("y", [3])])
