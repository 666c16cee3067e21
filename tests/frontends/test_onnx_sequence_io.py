"""Sequences and optionals at the graph's boundary: specialized at import, fed and returned as
lists and None, checked against ONNX Runtime on both backends and through save / load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import metadef as md
from metadef.core.errors import InputError, SpecializationError
from metadef.ir.structure import STRUCTURE_KEY
from metadef.testing.oracle import run_onnxruntime

TARGETS = ["reference", pytest.param("x86", marks=pytest.mark.jit)]
F = TensorProto.FLOAT


def _model(nodes: list, inputs: list, outputs: list, inits: list = (), opset: int = 18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _optional(name: str, elem: onnx.TypeProto) -> onnx.ValueInfoProto:
    return helper.make_value_info(name, helper.make_optional_type_proto(elem))


def _same(got: Any, want: Any) -> None:
    """Outputs agree: lists item by item, None with None, arrays in dtype, shape and value."""
    if want is None:
        assert got is None
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (got, want)
        for g, w in zip(got, want):
            _same(g, w)
    else:
        got = np.asarray(got)
        assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _check(model: onnx.ModelProto, feeds: dict[str, Any], target: str, **hints: Any) -> md.Session:
    sess = md.compile(md.import_onnx(model, **hints), target=target)
    got, want = sess.run(feeds), run_onnxruntime(model, feeds)
    assert list(got) == list(want)
    for name in want:
        _same(got[name], want[name])
    return sess


def _insert_and_concat() -> onnx.ModelProto:
    """seq (items f32[n_i, 3]) and x: insert x at the front, concatenate, count, and give the
    new sequence back."""
    return _model([helper.make_node("SequenceInsert", ["seq", "x", "zero"], ["longer"]),
                   helper.make_node("ConcatFromSequence", ["longer"], ["joined"], axis=0),
                   helper.make_node("SequenceLength", ["longer"], ["count"])],
                  [helper.make_tensor_sequence_value_info("seq", F, ["n", 3]),
                   helper.make_tensor_value_info("x", F, ["k", 3])],
                  [helper.make_tensor_sequence_value_info("longer", F, None),
                   helper.make_tensor_value_info("joined", F, None),
                   helper.make_tensor_value_info("count", TensorProto.INT64, [])],
                  [helper.make_tensor("zero", TensorProto.INT64, [], [0])])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_sequence_input_of_random_length_matches_onnxruntime(target: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    length = int(rng.integers(1, 6))
    seq = [rng.standard_normal((int(rng.integers(1, 5)), 3)).astype(np.float32) for _ in range(length)]
    x = rng.standard_normal((int(rng.integers(1, 4)), 3)).astype(np.float32)
    sess = _check(_insert_and_concat(), {"seq": seq, "x": x}, target, sequence_lengths={"seq": length})
    assert [s.name for s in sess.inputs] == [*(f"seq.{i}" for i in range(length)), "x"]
    assert [s.name for s in sess.outputs][: length + 1] == [f"longer.{i}" for i in range(length + 1)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("present", [True, False])
def test_an_optional_input_present_or_absent_matches_onnxruntime(target: str, present: bool) -> None:
    elem = helper.make_tensor_type_proto(F, ["n"])
    model = _model([helper.make_node("OptionalHasElement", ["o"], ["has"]),
                    helper.make_node("Identity", ["o"], ["same"])],
                   [_optional("o", elem)], [helper.make_tensor_value_info("has", TensorProto.BOOL, []),
                                            _optional("same", elem)])
    feeds = {"o": np.arange(5, dtype=np.float32) if present else None}
    sess = _check(model, feeds, target, optional_present={"o": present})
    assert len(sess.inputs) == int(present)


@pytest.mark.parametrize("target", TARGETS)
def test_split_to_sequence_with_a_run_time_split_gives_a_list(target: str) -> None:
    model = _model([helper.make_node("SplitToSequence", ["x", "split"], ["parts"], axis=1)],
                   [helper.make_tensor_value_info("x", F, ["b", 7]),
                    helper.make_tensor_value_info("split", TensorProto.INT64, [3])],
                   [helper.make_tensor_sequence_value_info("parts", F, None)])
    x = np.random.default_rng(3).standard_normal((2, 7)).astype(np.float32)
    sess = _check(model, {"x": x, "split": np.array([1, 4, 2])}, target)  # three pieces, sizes at run time
    _same(sess.run({"x": x, "split": np.array([3, 3, 1])})["parts"], [x[:, :3], x[:, 3:6], x[:, 6:]])


@pytest.mark.parametrize("target", TARGETS)
def test_sequence_map_unrolls_its_body_per_item(target: str) -> None:
    body = helper.make_graph([helper.make_node("Mul", ["a", "w"], ["y"])], "body",
                             [helper.make_tensor_value_info("a", F, ["m"]), helper.make_tensor_value_info("w", F, [])],
                             [helper.make_tensor_value_info("y", F, ["m"])])
    model = _model([helper.make_node("SequenceMap", ["seq", "w"], ["scaled"], body=body)],
                   [helper.make_tensor_sequence_value_info("seq", F, ["m"]), helper.make_tensor_value_info("w", F, [])],
                   [helper.make_tensor_sequence_value_info("scaled", F, None)])
    rng = np.random.default_rng(4)
    seq = [rng.standard_normal(n).astype(np.float32) for n in (3, 1, 6, 2)]
    _check(model, {"seq": seq, "w": np.array(2.5, np.float32)}, target, sequence_lengths={"seq": 4})


@pytest.mark.parametrize("target", TARGETS)
def test_the_structure_survives_save_and_load(tmp_path: Path, target: str) -> None:
    model = _insert_and_concat()
    graph = md.import_onnx(model, sequence_lengths={"seq": 2})
    loaded = md.load(md.save(graph, tmp_path / "seq.mdef"))
    assert loaded.graph.metadata[STRUCTURE_KEY] == graph.metadata[STRUCTURE_KEY]
    rng = np.random.default_rng(5)
    feeds = {"seq": [rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)],
             "x": rng.standard_normal((1, 3)).astype(np.float32)}
    got, want = loaded.compile(target=target).run(feeds), run_onnxruntime(model, feeds)
    for name in want:
        _same(got[name], want[name])
    with pytest.raises(SpecializationError, match=r"sequence_lengths=\{'seq': 3\}"):
        loaded.compile(target=target).run({**feeds, "seq": [*feeds["seq"], feeds["x"]]})


def test_compile_onnx_specializes_once_per_structure() -> None:
    sess = md.compile_onnx(_insert_and_concat())
    rng = np.random.default_rng(6)
    x = np.ones((1, 3), np.float32)
    for length in (3, 1, 3, 0, 1):
        seq = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(length)]
        want = run_onnxruntime(_insert_and_concat(), {"seq": seq, "x": x})
        got = sess.run({"seq": seq, "x": x})
        for name in want:
            _same(got[name], want[name])
    assert len(sess.sessions) == 3  # lengths 3, 1 and 0


def test_compile_onnx_specializes_on_the_values_that_decide_a_structure() -> None:
    model = _model([helper.make_node("SplitToSequence", ["x", "k"], ["parts"], axis=0)],
                   [helper.make_tensor_value_info("x", F, [6]),
                    helper.make_tensor_value_info("k", TensorProto.INT64, [])],
                   [helper.make_tensor_sequence_value_info("parts", F, None)])
    sess = md.compile_onnx(model)
    x = np.arange(6, dtype=np.float32)
    for k in (4, 2, 4):
        feeds = {"x": x, "k": np.array(k)}
        _same(sess.run(feeds)["parts"], run_onnxruntime(model, feeds)["parts"])
    assert len(sess.sessions) == 2
    with pytest.raises(SpecializationError, match=r"input_values=\{'k': \.\.\.\}"):
        md.import_onnx(model)
    graph = md.import_onnx(model, input_values={"k": 4})
    with pytest.raises(SpecializationError, match="specialized on its value 4; got 2"):
        md.compile(graph).run({"x": x, "k": np.array(2)})


def test_if_branches_of_one_structure_keep_a_run_time_condition() -> None:
    def branch(name: str, op: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node(op, ["x"], ["y"]),
                                  helper.make_node("SequenceConstruct", ["x", "y"], ["s"])], name, [],
                                 [helper.make_tensor_sequence_value_info("s", F, None)])

    model = _model([helper.make_node("If", ["c"], ["out"], then_branch=branch("then", "Neg"),
                                     else_branch=branch("else", "Abs"))],
                   [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                    helper.make_tensor_value_info("x", F, [3])],
                   [helper.make_tensor_sequence_value_info("out", F, None)])
    sess = md.compile(md.import_onnx(model))
    assert [n.op for n in sess.graph.nodes].count("If") == 1
    x = np.array([-1, 2, -3], np.float32)
    for c in (True, False):
        feeds = {"c": np.array(c), "x": x}
        _same(sess.run(feeds)["out"], run_onnxruntime(model, feeds)["out"])


# --- errors ---------------------------------------------------------------------------------
def test_import_without_a_length_names_the_input_and_the_keyword() -> None:
    with pytest.raises(SpecializationError, match=r"graph input 'seq' is a sequence.*sequence_lengths=\{'seq': N\}"):
        md.import_onnx(_insert_and_concat())
    with pytest.raises(SpecializationError, match=r"sequence_lengths names \['x'\]"):
        md.import_onnx(_insert_and_concat(), sequence_lengths={"seq": 1, "x": 2})


def test_feeding_the_wrong_structure_says_what_was_expected() -> None:
    sess = md.compile(md.import_onnx(_insert_and_concat(), sequence_lengths={"seq": 2}))
    item, x = np.ones((2, 3), np.float32), np.ones((1, 3), np.float32)
    with pytest.raises(InputError, match="input 'x' is a tensor; got a list of 2 values"):
        sess.run({"seq": [item, item], "x": [x, x]})
    with pytest.raises(InputError, match="input 'seq' is a sequence of 2 tensors; got ndarray"):
        sess.run({"seq": item, "x": x})
    with pytest.raises(InputError, match=r"input 'seq.1' has dtype float64, expected float32"):
        sess.run({"seq": [item, item.astype(np.float64)], "x": x})
    with pytest.raises(SpecializationError, match=r"specialized at import as a sequence of 2 tensors; got a list of 3"):
        sess.run({"seq": [item] * 3, "x": x})
    with pytest.raises(InputError, match="unknown input name"):
        sess.run({"seq.0": item, "seq.1": item, "x": x})


def test_an_optional_specialized_absent_refuses_a_value() -> None:
    model = _model([helper.make_node("OptionalHasElement", ["o"], ["has"])],
                   [_optional("o", helper.make_tensor_type_proto(F, [2]))],
                   [helper.make_tensor_value_info("has", TensorProto.BOOL, [])])
    with pytest.raises(SpecializationError, match=r"optional_present=\{'o': True\}"):
        md.import_onnx(model)
    sess = md.compile(md.import_onnx(model, optional_present={"o": False}))
    assert not sess.run({"o": None})["has"] and not sess.run({})["has"]
    with pytest.raises(SpecializationError, match=r"specialized as absent.*optional_present=\{'o': True\}"):
        sess.run({"o": np.ones(2, np.float32)})
