"""The optimizer ops of domain ``ai.onnx.preview.training`` (Adagrad, Adam, Momentum): shapes,
errors, and numerics against onnx's reference evaluator (ONNX Runtime's inference build does
not implement them) and the formulas written out in numpy, on inputs the node tests do not use,
on the reference backend and the x86 target."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import metadef as md
from metadef.core.errors import ShapeError
from metadef.ops import get_op, infer_types
from metadef.ops.defs.training import DOMAIN
from metadef.shape import parse_type
from metadef.testing.onnx_cases import assert_same, run_metadef

RNG = np.random.default_rng(77)
KINDS = {"Adagrad": "XGH", "Momentum": "XGV", "Adam": "XGVH"}
"""Per op, its groups of tensors after R and T, in order."""


def infer(op: str, types: Sequence[str], attrs: Mapping[str, Any] | None = None) -> list[str]:
    ins = [parse_type(t) for t in types]
    return [str(t) for t in infer_types(get_op(op, DOMAIN), "/opt", ins, dict(attrs or {}))]


def step_model(op: str, feeds: Mapping[str, np.ndarray], n_out: int, **attrs: Any) -> onnx.ModelProto:
    outs = [f"out{i}" for i in range(n_out)]
    graph = helper.make_graph(
        [helper.make_node(op, list(feeds), outs, domain=DOMAIN, **attrs)], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in feeds.items()],
        [helper.make_empty_tensor_value_info(o) for o in outs])
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)])


def step_feeds(op: str, shapes: Sequence[tuple[int, ...]], t: int, dtype: Any = np.float32,
               rate: float = 0.1) -> dict[str, np.ndarray]:
    """R, T, then the groups (X, G, and the accumulators, which are non-negative for H)."""
    feeds = {"R": np.array(rate, dtype), "T": np.array(t, np.int64)}
    for kind in KINDS[op]:
        for i, shape in enumerate(shapes):
            a = RNG.standard_normal(shape)
            feeds[f"{kind}{i}"] = (np.abs(a) if kind == "H" else a).astype(dtype)
    return feeds


def check_reference(m: onnx.ModelProto, feeds: Mapping[str, np.ndarray], tol: float = 1e-5) -> None:
    want = [np.asarray(w) for w in ReferenceEvaluator(m).run(None, dict(feeds))]
    got = run_metadef(m, feeds)
    # onnx's reference computes part of Adam's step in float64 and keeps it: compare values
    assert_same(got, [w.astype(g.dtype) for g, w in zip(got, want)], rtol=tol, atol=tol)


@pytest.mark.parametrize(("op", "attrs"), [
    ("Adagrad", {"decay_factor": 0.3, "epsilon": 1e-4, "norm_coefficient": 0.02}),
    ("Adagrad", {}),
    ("Momentum", {"alpha": 0.8, "beta": 0.3, "mode": "standard", "norm_coefficient": 0.1}),
    ("Momentum", {"alpha": 0.9, "beta": 0.5, "mode": "nesterov", "norm_coefficient": 0.0}),
    ("Adam", {"alpha": 0.8, "beta": 0.7, "epsilon": 1e-3, "norm_coefficient": 0.05,
              "norm_coefficient_post": 0.01}),
    ("Adam", {}),
])
@pytest.mark.parametrize("t", [0, 3])
def test_optimizer_steps_match_the_reference(op: str, attrs: dict[str, Any], t: int) -> None:
    shapes = [(3, 4), (5,), ()]
    feeds = step_feeds(op, shapes, t)
    m = step_model(op, feeds, (len(KINDS[op]) - 1) * len(shapes), **attrs)
    check_reference(m, feeds)


def test_adam_float64_against_the_formula() -> None:
    feeds = step_feeds("Adam", [(4,)], 5, np.float64, rate=0.01)
    alpha, beta, eps = (float(np.float32(a)) for a in (0.9, 0.99, 1e-8))  # FLOAT attributes
    x_new, v_new, h_new = run_metadef(step_model("Adam", feeds, 3, alpha=alpha, beta=beta,
                                                 epsilon=eps), feeds)
    g = feeds["G0"]
    v = alpha * feeds["V0"] + (1 - alpha) * g
    h = beta * feeds["H0"] + (1 - beta) * g * g
    r = 0.01 * np.sqrt(1 - beta ** 5) / (1 - alpha ** 5)
    for got, want in ((v_new, v), (h_new, h), (x_new, feeds["X0"] - r * v / (np.sqrt(h) + eps))):
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_momentum_runs_compiled_for_x86() -> None:
    feeds = step_feeds("Momentum", [(8, 3), (2,)], 2)
    m = step_model("Momentum", feeds, 4, alpha=0.9, beta=0.4, mode="nesterov", norm_coefficient=0.01)
    sess = md.compile(md.import_onnx(m), target="x86")
    got = sess.run(feeds)
    want = run_metadef(m, feeds)
    assert_same([np.asarray(got[f"out{i}"]) for i in range(4)], want, rtol=1e-6, atol=1e-6)


def test_optimizer_shapes() -> None:
    assert infer("Adagrad", ["f32[]", "i64[]", "f32[n,4]", "f32[7]", "f32[n,4]", "f32[7]",
                             "f32[n,4]", "f32[7]"]) == ["f32[n,4]", "f32[7]", "f32[n,4]", "f32[7]"]
    assert infer("Adam", ["f64[]", "i64[]"] + ["f64[3]"] * 4) == ["f64[3]"] * 3


@pytest.mark.parametrize(("op", "types", "attrs", "match"), [
    ("Adagrad", ["f32[]", "i64[]", "f32[3]", "f32[3]"], {}, "3 groups of n tensors"),
    ("Adam", ["f32[]", "i64[]"] + ["f32[3]"] * 3, {}, "4 groups of n tensors"),
    ("Adagrad", ["f32[]", "i64[]", "f32[3]", "f32[4]", "f32[3]"], {}, "G_1 \\[4\\] must have the shape of X_1"),
    ("Adagrad", ["f32[2]", "i64[]", "f32[3]", "f32[3]", "f32[3]"], {}, "R must be a scalar"),
    ("Momentum", ["f32[]", "i64[]"] + ["f32[3]"] * 3,
     {"alpha": 0.9, "beta": 0.1, "mode": "heavy_ball", "norm_coefficient": 0.0}, "mode='heavy_ball'"),
])
def test_optimizer_errors(op: str, types: list[str], attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(ShapeError, match=match):
        infer(op, types, attrs)


@pytest.mark.slow
def test_conformance() -> None:
    from metadef.testing.conformance import format_report, run_cases

    report = run_cases(op=tuple(KINDS))
    assert report.totals()["pass"] == report.totals()["total"], format_report(report)
