"""Sequences built and taken apart inside a graph are unrolled at import time; the rest is refused."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import metadef as md
from metadef.core.errors import UnsupportedOpError


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


def test_a_position_known_only_at_run_time_is_refused() -> None:
    with pytest.raises(UnsupportedOpError, match="known only at run time"):
        _model([helper.make_node("SequenceConstruct", ["x", "x"], ["s"]),
                helper.make_node("SequenceAt", ["s", "i"], ["y"])],
               [_x("x", [3]), helper.make_tensor_value_info("i", TensorProto.INT64, [])], [_x("y", None)])


def test_a_sequence_graph_output_is_refused() -> None:
    with pytest.raises(UnsupportedOpError, match="a sequence of 1 tensors"):
        _model([helper.make_node("SequenceConstruct", ["x"], ["s"])], [_x("x", [3])],
               [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)])
