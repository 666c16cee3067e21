"""The model zoo: API, determinism, ONNX validity, and runs in ONNX Runtime."""

from __future__ import annotations

import functools
import os
import pathlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from metadef import zoo

ALL = ["mlp", "resnet50", "mobilenetv2", "bert"]
SLOW_RUN = {"resnet50", "mobilenetv2", "bert"}
RUN_SEQS = {"bert": [128, 37]}
"""Sequence lengths to run each sequence model at; other models run with seq=None."""


@functools.cache
def built(name: str) -> onnx.ModelProto:
    """Build each model once per test session (BERT takes a few seconds)."""
    return zoo.build(name, seed=0)


def slow_if_heavy(names: list[str]) -> list:
    return [
        pytest.param(n, marks=pytest.mark.slow) if n in SLOW_RUN else n for n in names
    ]


def dims(value_info: onnx.ValueInfoProto) -> tuple[int | str, ...]:
    shape = value_info.type.tensor_type.shape
    return tuple(d.dim_param or d.dim_value for d in shape.dim)


# -- the API -------------------------------------------------------------------------------


def test_names_lists_the_four_models_in_order() -> None:
    assert zoo.names() == ALL


@pytest.mark.parametrize("call", [zoo.build, zoo.describe])
def test_unknown_name_is_a_key_error_listing_the_known_ones(call) -> None:
    with pytest.raises(KeyError, match="resnet") as error:
        call("resnet18")
    message = str(error.value)
    assert "resnet18" in message and all(name in message for name in ALL)


def test_describe_is_frozen_and_matches_the_module_contract() -> None:
    info = zoo.describe("bert")
    assert info.name == "bert" and info.summary
    assert info.inputs[0] == ("input_ids", "int64", ("batch", "seq"))
    assert all({"batch", "seq"} <= set(example) for example in info.example_dims)
    with pytest.raises(AttributeError):
        info.name = "other"  # type: ignore[misc]


def test_example_inputs_for_image_models_reject_seq() -> None:
    feeds = zoo.describe("resnet50").example_inputs(batch=2)
    assert (
        feeds["input"].shape == (2, 3, 224, 224) and feeds["input"].dtype == np.float32
    )
    with pytest.raises(ValueError, match="seq"):
        zoo.describe("mobilenetv2").example_inputs(batch=1, seq=16)


def test_bert_example_inputs_are_valid_tokens_with_trailing_padding() -> None:
    feeds = zoo.describe("bert").example_inputs(batch=4, seq=37, seed=3)
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    assert ids.shape == mask.shape == (4, 37) and ids.dtype == mask.dtype == np.int64
    assert ids.min() >= 0 and ids.max() < 30522
    assert set(np.unique(mask)) <= {0, 1} and mask[:, 0].all()
    assert (np.diff(mask, axis=1) <= 0).all(), "mask must be ones then trailing zeros"
    assert not mask[0].all(), "row 0 should carry some padding"
    assert zoo.describe("bert").example_inputs(batch=1)["input_ids"].shape == (1, 128)


def test_example_inputs_are_deterministic_per_seed() -> None:
    info = zoo.describe("mlp")
    np.testing.assert_array_equal(
        info.example_inputs(2, seed=5)["x"], info.example_inputs(2, seed=5)["x"]
    )
    assert not np.array_equal(
        info.example_inputs(2, seed=5)["x"], info.example_inputs(2, seed=6)["x"]
    )


# -- the models as ONNX ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mlp", "mobilenetv2"])
def test_same_seed_gives_the_same_bytes(name: str) -> None:
    first = zoo.build(name, seed=7).SerializeToString()
    assert first == zoo.build(name, seed=7).SerializeToString()
    assert first != zoo.build(name, seed=8).SerializeToString()


@pytest.mark.slow
def test_bert_same_seed_gives_the_same_bytes() -> None:
    assert (
        zoo.build("bert", seed=0).SerializeToString()
        == built("bert").SerializeToString()
    )


@pytest.mark.parametrize("name", ALL)
def test_model_passes_the_checker(name: str) -> None:
    model = built(name)
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8
    assert [(op.domain, op.version) for op in model.opset_import] == [("", 17)]


@pytest.mark.parametrize("name", ALL)
def test_inputs_and_outputs_match_describe_with_symbolic_dims(name: str) -> None:
    model, info = built(name), zoo.describe(name)
    for declared, specs in (
        (model.graph.input, info.inputs),
        (model.graph.output, info.outputs),
    ):
        got = [
            (
                v.name,
                onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name,
                dims(v),
            )
            for v in declared
        ]
        assert got == list(specs)
        assert all(shape[0] == "batch" for _, _, shape in got)


@pytest.mark.parametrize("name", ALL)
def test_node_names_are_unique_and_hierarchical(name: str) -> None:
    nodes = built(name).graph.node
    node_names = [node.name for node in nodes]
    assert len(set(node_names)) == len(node_names)
    assert all(n.startswith("/") for n in node_names)
    initializer_names = [t.name for t in built(name).graph.initializer]
    assert len(set(initializer_names)) == len(initializer_names)


@pytest.mark.parametrize("name", ALL)
def test_model_records_that_the_zoo_built_it_and_the_seed(name: str) -> None:
    model = zoo.build(name, seed=3) if name == "mlp" else built(name)
    seed = "3" if name == "mlp" else "0"
    props = {p.key: p.value for p in model.metadata_props}
    assert props == {"metadef.zoo.model": name, "metadef.zoo.seed": seed}
    assert "metadef" in model.doc_string and f"seed {seed}" in model.doc_string


def test_model_contents_follow_the_exporter_layout() -> None:
    ops = {name: {node.op_type for node in built(name).graph.node} for name in ALL}
    assert {"Gemm", "MatMul", "Add", "Relu", "Softmax"} <= ops["mlp"]
    assert {
        "Conv",
        "BatchNormalization",
        "MaxPool",
        "GlobalAveragePool",
        "Flatten",
        "Gemm",
    } <= ops["resnet50"]
    assert "Clip" in ops["mobilenetv2"] and "Relu" not in ops["mobilenetv2"]
    assert {
        "Erf",
        "Pow",
        "Sqrt",
        "ReduceMean",
        "Shape",
        "Concat",
        "Slice",
        "Cast",
        "Tanh",
    } <= ops["bert"]
    conv_groups = [
        a.i
        for n in built("mobilenetv2").graph.node
        for a in n.attribute
        if a.name == "group"
    ]
    assert max(conv_groups) == 960  # the widest depthwise conv
    assert sum(n.op_type == "Conv" for n in built("resnet50").graph.node) == 53
    assert sum(n.op_type == "Erf" for n in built("bert").graph.node) == 12


# -- running in ONNX Runtime -----------------------------------------------------------------


def run(name: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = _session(name)
    return session.run(None, feeds)


@functools.cache
def _session(name: str) -> ort.InferenceSession:
    return ort.InferenceSession(
        built(name).SerializeToString(), providers=["CPUExecutionProvider"]
    )


@pytest.mark.parametrize("name", slow_if_heavy(ALL))
def test_model_runs_in_onnxruntime_at_batch_1_and_3_with_independent_rows(
    name: str,
) -> None:
    info = zoo.describe(name)
    for seq in RUN_SEQS.get(name, [None]):
        feeds = info.example_inputs(batch=3, seq=seq, seed=1)
        outputs = run(name, feeds)
        single = run(name, {key: value[:1] for key, value in feeds.items()})
        for (out_name, _, shape), full, one in zip(
            info.outputs, outputs, single, strict=True
        ):
            expected = tuple(
                3 if d == "batch" else seq if d == "seq" else d for d in shape
            )
            assert full.shape == expected, out_name
            assert one.shape == (1, *expected[1:]), out_name
            assert np.isfinite(full).all() and np.isfinite(one).all(), out_name
            np.testing.assert_allclose(
                full[:1], one, rtol=1e-4, atol=1e-5, err_msg=out_name
            )


@pytest.mark.slow
def test_resnet50_activations_stay_order_one() -> None:
    (logits,) = run("resnet50", zoo.describe("resnet50").example_inputs(batch=2))
    assert 1e-2 < logits.std() < 1e2


def test_mlp_outputs_are_probabilities() -> None:
    (probs,) = run("mlp", zoo.describe("mlp").example_inputs(batch=5))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)


# -- export ----------------------------------------------------------------------------------


def test_export_writes_a_loadable_file_and_no_temp_file(tmp_path: pathlib.Path) -> None:
    path = zoo.export("mlp", tmp_path / "mlp.onnx", seed=2)
    assert path == tmp_path / "mlp.onnx"
    assert os.listdir(tmp_path) == ["mlp.onnx"]
    loaded = onnx.load(path)
    assert loaded.SerializeToString() == zoo.build("mlp", seed=2).SerializeToString()


def test_export_replaces_an_existing_file(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "model.onnx"
    target.write_bytes(b"stale")
    zoo.export("mlp", str(target))
    onnx.checker.check_model(onnx.load(target))
    assert os.listdir(tmp_path) == ["model.onnx"]


def test_failed_export_leaves_nothing_behind(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        zoo.export("mlp", tmp_path / "mlp.onnx")
    assert os.listdir(tmp_path) == []
