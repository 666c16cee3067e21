"""The ``ai.onnx.ml`` ops on numeric tensors (Binarizer, ArrayFeatureExtractor, LabelEncoder,
TreeEnsemble): shapes, errors, and numerics against ONNX Runtime on inputs the node tests do
not use (random forests included)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from metadef.core.errors import DTypeError, ShapeError
from metadef.ops import get_op, infer_types
from metadef.ops.defs.ml import DOMAIN, MODES
from metadef.shape import parse_type
from metadef.testing.onnx_cases import assert_same, check_model, run_metadef

RNG = np.random.default_rng(5)


def infer(op: str, types: Sequence[str], attrs: Mapping[str, Any] | None = None) -> list[str]:
    ins = [parse_type(t) for t in types]
    return [str(t) for t in infer_types(get_op(op, DOMAIN), "/ml", ins, dict(attrs or {}))]


def ml_model(op: str, feeds: Mapping[str, np.ndarray], consts: Mapping[str, np.ndarray] | None = None,
             **attrs: Any) -> onnx.ModelProto:
    """One ``ai.onnx.ml`` node (opset 5) reading ``feeds`` then ``consts`` (initializers);
    numpy arrays among ``attrs`` become tensor attributes."""
    consts = dict(consts or {})
    attrs = {k: numpy_helper.from_array(v, k) if isinstance(v, np.ndarray) else v
             for k, v in attrs.items()}
    graph = helper.make_graph(
        [helper.make_node(op, [*feeds, *consts], ["y"], domain=DOMAIN, **attrs)], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in feeds.items()],
        [helper.make_empty_tensor_value_info("y")],
        [numpy_helper.from_array(a, n) for n, a in consts.items()])
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 5)])


def check_reference(m: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> None:
    """metadef agrees with onnx's reference evaluator (where ONNX Runtime lacks a kernel)."""
    want = ReferenceEvaluator(m).run(None, dict(feeds))
    assert_same(run_metadef(m, feeds), [np.asarray(w) for w in want])


# -------------------------------------------------------------------- Binarizer and AFE


@pytest.mark.parametrize(("dtype", "threshold"), [
    (np.float32, 0.25), (np.float64, -1.0), (np.int64, 3.0), (np.int32, 0.0)])
def test_binarizer_matches_onnxruntime(dtype: Any, threshold: float) -> None:
    x = (RNG.standard_normal((4, 7)) * 5).astype(dtype)
    m = ml_model("Binarizer", {"x": x}, threshold=threshold)
    (check_model if dtype == np.float32 else check_reference)(m, {"x": x})  # ORT: float only


def test_binarizer_gives_zero_for_nan() -> None:
    x = np.array([np.nan, 2.0, -2.0], np.float32)  # ONNX Runtime refuses NaN; onnx's reference gives 0
    y, = run_metadef(ml_model("Binarizer", {"x": x}, threshold=1.0), {"x": x})
    assert y.tolist() == [0.0, 1.0, 0.0]


@pytest.mark.parametrize(("shape", "indices", "dtype"), [
    ((5, 9), [[8, 0, 3, 3]], np.float32),
    ((2, 3, 6), [5, 1], np.int64),
    ((6,), [2, 4, 0], np.float64),
    ((4, 5), [[1, 2], [3, 4]], np.int32),
])
def test_array_feature_extractor_matches_onnxruntime(shape: tuple[int, ...], indices: list, dtype: Any) -> None:
    x = (RNG.standard_normal(shape) * 10).astype(dtype)
    idx = np.array(indices, np.int64)
    check_model(ml_model("ArrayFeatureExtractor", {"x": x, "i": idx}), {"x": x, "i": idx})


def test_array_feature_extractor_shapes() -> None:
    assert infer("ArrayFeatureExtractor", ["f32[n,s,10]", "i64[1,4]"]) == ["f32[n,s,4]"]
    assert infer("ArrayFeatureExtractor", ["i64[10]", "i64[2]"]) == ["i64[1,2]"]


# -------------------------------------------------------------------------- LabelEncoder


@pytest.mark.parametrize(("x", "attrs"), [
    (np.array([[3, 1], [7, 9]], np.int64),
     {"keys_int64s": [7, 3, 1], "values_floats": [0.5, -1.5, 2.0], "default_float": 9.0}),
    (np.array([0.5, np.nan, 2.25, 7.0], np.float32),
     {"keys_floats": [2.25, 0.5, np.nan], "values_int64s": [4, 5, 6], "default_int64": -7}),
    (np.array([1.0, 2.0, 3.0]),
     {"keys_tensor": np.array([3.0, 1.0]), "values_tensor": np.array([30.0, 10.0]),
      "default_tensor": np.array([0.0])}),
])
def test_label_encoder_matches_onnxruntime(x: np.ndarray, attrs: dict[str, Any]) -> None:
    check_model(ml_model("LabelEncoder", {"x": x}, **attrs), {"x": x})


def test_label_encoder_int32_to_int16_matches_the_reference() -> None:
    x = np.array([4, 8, 15, 16, 23], np.int32)  # ONNX Runtime has no int32 -> int16 kernel
    check_reference(ml_model("LabelEncoder", {"x": x}, keys_tensor=np.array([8, 16, 42], np.int32),
                             values_tensor=np.array([1, 2, 3], np.int16),
                             default_tensor=np.array([-1], np.int16)), {"x": x})


def test_label_encoder_shapes_and_errors() -> None:
    table = {"keys_int64s": (1, 2), "values_floats": (0.5, 1.5)}
    assert infer("LabelEncoder", ["i64[n,3]"], table) == ["f32[n,3]"]
    with pytest.raises(DTypeError, match="input X is int64 but the keys are string; insert a Cast"):
        infer("LabelEncoder", ["i64[n]"], {"keys_strings": ("a",), "values_int64s": (1,)})
    with pytest.raises(DTypeError, match="input X is int32 but the keys are int64; insert a Cast"):
        infer("LabelEncoder", ["i32[n]"], table)
    with pytest.raises(ShapeError, match="2 keys but 1 values"):
        infer("LabelEncoder", ["i64[n]"], {"keys_int64s": (1, 2), "values_floats": (0.5,)})
    with pytest.raises(ShapeError, match="needs keys"):
        infer("LabelEncoder", ["i64[n]"], {"values_floats": (0.5,)})


# -------------------------------------------------------------------------- TreeEnsemble


def random_forest(n_trees: int, depth: int, features: int, n_targets: int, *,
                  member: bool = False, missing: bool = False) -> dict[str, Any]:
    """TreeEnsemble attributes of ``n_trees`` full binary trees of ``depth`` with random
    splits, modes (set membership too when ``member``) and leaves."""
    nodes: dict[str, list] = {k: [] for k in ("featureids", "modes", "splits", "truenodeids",
                                              "trueleafs", "falsenodeids", "falseleafs", "missing")}
    leaf_targets: list[int] = []
    leaf_weights: list[float] = []
    members: list[float] = []
    roots = []

    def build(level: int) -> int:
        index = len(nodes["featureids"])
        mode = int(RNG.integers(0, len(MODES) if member else len(MODES) - 1))
        nodes["featureids"].append(int(RNG.integers(features)))
        nodes["modes"].append(mode)
        nodes["splits"].append(float(RNG.integers(-2, 3)) if mode in (4, 5) else float(RNG.normal()))
        nodes["missing"].append(int(RNG.integers(2)))
        if mode == MODES.index("BRANCH_MEMBER"):
            members.extend([*RNG.integers(-2, 3, 2).astype(float), np.nan])
        for side in ("true", "false"):
            nodes[f"{side}nodeids"].append(0)
            nodes[f"{side}leafs"].append(0)
        for side in ("true", "false"):
            if level + 1 == depth:
                nodes[f"{side}leafs"][index] = 1
                nodes[f"{side}nodeids"][index] = len(leaf_weights)
                leaf_targets.append(int(RNG.integers(n_targets)))
                leaf_weights.append(float(RNG.normal()))
            else:
                nodes[f"{side}nodeids"][index] = build(level + 1)
        return index

    for _ in range(n_trees):
        roots.append(build(0))
    attrs: dict[str, Any] = {
        "tree_roots": roots, "n_targets": n_targets, "leaf_targetids": leaf_targets,
        "leaf_weights": np.array(leaf_weights, np.float32),
        "nodes_modes": np.array(nodes["modes"], np.uint8),
        "nodes_splits": np.array(nodes["splits"], np.float32),
        **{f"nodes_{k}": nodes[k] for k in ("featureids", "truenodeids", "trueleafs",
                                            "falsenodeids", "falseleafs")}}
    if member:
        attrs["membership_values"] = np.array(members, np.float32)
    if missing:
        attrs["nodes_missing_value_tracks_true"] = nodes["missing"]
    return attrs


def forest_input(rows: int, features: int, nan: bool = False, whole: bool = False) -> np.ndarray:
    """Rows of small integers (to hit the EQ, NEQ and membership splits), half of them moved
    off the integers unless ``whole`` (ONNX Runtime tests membership on the integer part)."""
    x = RNG.integers(-2, 3, (rows, features)).astype(np.float32)
    if not whole:
        x += RNG.normal(size=(rows, features)).astype(np.float32) * (RNG.random((rows, features)) < 0.5)
    if nan:
        x[RNG.random(x.shape) < 0.15] = np.nan
    return x


@pytest.mark.parametrize(("trees", "depth", "targets", "aggregate", "post", "options"), [
    (1, 3, 1, 1, 0, {}),
    (5, 4, 3, 1, 0, {"missing": True}),
    (4, 3, 2, 0, 0, {"member": True}),
    (6, 2, 4, 2, 0, {}),
    (6, 3, 3, 3, 0, {"missing": True, "member": True}),
    (3, 3, 5, 1, 3, {}),
])
def test_tree_ensemble_matches_onnxruntime(trees: int, depth: int, targets: int, aggregate: int,
                                           post: int, options: dict[str, bool]) -> None:
    attrs = random_forest(trees, depth, 4, targets, **options)
    x = forest_input(64, 4, nan=options.get("missing", False), whole=options.get("member", False))
    m = ml_model("TreeEnsemble", {"x": x}, aggregate_function=aggregate, post_transform=post, **attrs)
    check_model(m, {"x": x}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("post", "transform"), [
    (1, lambda s: np.exp(s - s.max(1, keepdims=True)) / np.exp(s - s.max(1, keepdims=True)).sum(1, keepdims=True)),
    (2, lambda s: 1 / (1 + np.exp(-s))),
])
def test_tree_ensemble_post_transforms_follow_the_spec(post: int, transform: Any) -> None:
    """SOFTMAX is 1 and LOGISTIC 2 in the ONNX spec (ONNX Runtime 1.32 swaps them)."""
    attrs = random_forest(3, 3, 4, 3)
    x = forest_input(16, 4).astype(np.float64)
    attrs["nodes_splits"] = attrs["nodes_splits"].astype(np.float64)
    attrs["leaf_weights"] = attrs["leaf_weights"].astype(np.float64)
    raw, = run_metadef(ml_model("TreeEnsemble", {"x": x}, **attrs), {"x": x})
    got, = run_metadef(ml_model("TreeEnsemble", {"x": x}, post_transform=post, **attrs), {"x": x})
    np.testing.assert_allclose(got, transform(raw), rtol=1e-12)


def test_tree_ensemble_single_leaf_tree_and_one_row() -> None:
    attrs = {"tree_roots": [0], "nodes_featureids": [0], "nodes_modes": np.array([0], np.uint8),
             "nodes_splits": np.array([0.0], np.float32), "nodes_truenodeids": [1],
             "nodes_trueleafs": [1], "nodes_falsenodeids": [1], "nodes_falseleafs": [1],
             "leaf_targetids": [0, 1], "leaf_weights": np.array([5.0, 7.0], np.float32)}
    x = np.array([3.0, -3.0], np.float32)
    y, = run_metadef(ml_model("TreeEnsemble", {"x": x}, **attrs), {"x": x})
    assert y.tolist() == [[0.0, 7.0]]  # the tree is leaf 1, whatever the row


@pytest.mark.parametrize(("change", "match"), [
    ({"nodes_featureids": [0, 1]}, "one entry per node"),
    ({"nodes_modes": np.array([9], np.uint8)}, "nodes_modes holds \\[9\\]"),
    ({"nodes_truenodeids": [5]}, "nodes_truenodeids points outside"),
    ({"tree_roots": [3]}, "tree_roots \\[3\\]"),
    ({"n_targets": 1, "leaf_targetids": [0, 1]}, "leaf_targetids must lie in \\[0, n_targets=1\\)"),
    ({"nodes_modes": np.array([6], np.uint8)}, "0 NaN-delimited sets for 1 BRANCH_MEMBER"),
    ({"post_transform": 5}, "post_transform=5"),
    ({"nodes_featureids": [4]}, "reads feature 4 of 3"),
])
def test_tree_ensemble_errors(change: dict[str, Any], match: str) -> None:
    attrs = {"tree_roots": (0,), "nodes_featureids": (0,), "nodes_modes": np.array([0], np.uint8),
             "nodes_splits": np.array([0.5]), "nodes_truenodeids": (0,), "nodes_trueleafs": (1,),
             "nodes_falsenodeids": (1,), "nodes_falseleafs": (1,), "leaf_targetids": (0, 0),
             "leaf_weights": np.array([1.0, 2.0])}
    with pytest.raises(ShapeError, match=match):
        infer("TreeEnsemble", ["f32[n,3]"], {**attrs, **change})


@pytest.mark.slow
def test_conformance() -> None:
    from metadef.testing.conformance import format_report, run_cases

    report = run_cases(op=("Binarizer", "ArrayFeatureExtractor", "TreeEnsemble"))
    assert report.totals()["pass"] == report.totals()["total"], format_report(report)
