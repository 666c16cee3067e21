"""``Gradient`` (ai.onnx.preview.training), expanded at import into ordinary nodes: each
supported op's gradient, with broadcasting, against central finite differences in float64 (ONNX
Runtime's CPU build has no Gradient kernel and onnx's reference evaluator none either); the
forward replayed at other values, ``zs``, unreached ``xs``, symbolic shapes, the error for an op
without a rule, and the x86 backend."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import metadef as md
from metadef.core.errors import UnsupportedOpError
from metadef.frontends.onnx.gradient import DOMAIN, vjp_rules

F64 = TensorProto.DOUBLE


def gradient_model(nodes: list, inputs: dict[str, Sequence[int | str]], xs: Sequence[str], y: str, *,
                   zs: Sequence[str] = (), at: Sequence[str] | None = None,
                   consts: dict[str, np.ndarray] | None = None):
    """A float64 model: ``nodes``, then a Gradient of ``y`` by ``xs`` (inputs ``at``, default
    ``xs + zs``); outputs ``y`` and ``d_<x>`` for each x."""
    grads = [f"d_{x}" for x in xs]
    gradient = helper.make_node("Gradient", list(at or [*xs, *zs]), grads, domain=DOMAIN, xs=list(xs), y=y,
                                **({"zs": list(zs)} if zs else {}))
    graph = helper.make_graph(
        [*nodes, gradient], "g", [helper.make_tensor_value_info(n, F64, list(s)) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, F64, None) for n in (y, *grads)],
        [numpy_helper.from_array(v, n) for n, v in (consts or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])


def numeric_gradient(sess: md.Session, feeds: dict[str, np.ndarray], x: str, y: str, eps: float = 1e-6) -> np.ndarray:
    """d(sum y)/dx by central differences."""
    grad = np.zeros_like(feeds[x])
    for i in np.ndindex(feeds[x].shape):
        total = []
        for step in (eps, -eps):
            moved = {k: v.copy() for k, v in feeds.items()}
            moved[x][i] += step
            total.append(sess.run(moved)[y].sum())
        grad[i] = (total[0] - total[1]) / (2 * eps)
    return grad


def check_gradient(model, feeds: dict[str, np.ndarray], xs: Sequence[str], y: str, target: str = "reference") -> None:
    sess = md.compile(md.import_onnx(model), target=target)
    out = sess.run(feeds)
    for x in xs:
        assert out[f"d_{x}"].shape == feeds[x].shape, x
        np.testing.assert_allclose(out[f"d_{x}"], numeric_gradient(sess, feeds, x, y), rtol=1e-6, atol=1e-6,
                                   err_msg=f"d{y}/d{x}")


def rand(*shape: int, low: float = -2.0, high: float = 2.0, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, shape)


@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Tanh", "Exp", "Log", "Neg", "Identity"])
def test_unary_ops(op: str) -> None:
    x = rand(3, 4, low=0.1 if op == "Log" else -2.0, seed=1)
    x[np.abs(x) < 0.05] = 0.3  # away from Relu's kink
    model = gradient_model([helper.make_node(op, ["x"], ["h"]), helper.make_node("Mul", ["h", "h"], ["y"])],
                           {"x": [3, 4]}, ["x"], "y")
    check_gradient(model, {"x": x}, ["x"], "y")


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shapes", [((2, 3, 4), (3, 1)), ((4,), (2, 3, 4)), ((2, 1, 4), (1, 3, 1)), ((), (3,))])
def test_binary_ops_with_broadcasting(op: str, shapes: tuple) -> None:
    a, b = rand(*shapes[0], seed=2), rand(*shapes[1], low=0.5, high=2.0, seed=3)
    model = gradient_model([helper.make_node(op, ["a", "b"], ["c"]), helper.make_node("Mul", ["c", "c"], ["y"])],
                           {"a": shapes[0], "b": shapes[1]}, ["a", "b"], "y")
    check_gradient(model, {"a": a, "b": b}, ["a", "b"], "y")


@pytest.mark.parametrize("shapes", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)),
                                    ((4,), (4,)), ((2, 1, 3, 4), (5, 4, 2)), ((4,), (2, 4, 3))])
def test_matmul(shapes: tuple) -> None:
    a, b = rand(*shapes[0], seed=4), rand(*shapes[1], seed=5)
    model = gradient_model([helper.make_node("MatMul", ["a", "b"], ["c"]), helper.make_node("Tanh", ["c"], ["y"])],
                           {"a": shapes[0], "b": shapes[1]}, ["a", "b"], "y")
    check_gradient(model, {"a": a, "b": b}, ["a", "b"], "y")


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean"])
@pytest.mark.parametrize("axes,keepdims,noop", [([1], 0, 0), ([-1, 0], 1, 0), (None, 0, 0), (None, 1, 0),
                                                ([], 1, 1)])
def test_reductions(op: str, axes: list[int] | None, keepdims: int, noop: int) -> None:
    x = rand(2, 3, 4, seed=6)
    consts = {} if axes is None else {"axes": np.array(axes, np.int64)}
    node = helper.make_node(op, ["x", *(["axes"] if axes is not None else [])], ["r"], keepdims=keepdims,
                            noop_with_empty_axes=noop)
    model = gradient_model([node, helper.make_node("Exp", ["r"], ["y"])], {"x": [2, 3, 4]}, ["x"], "y", consts=consts)
    check_gradient(model, {"x": x}, ["x"], "y")


def test_mlp_loss_with_weights_as_xs_and_data_as_zs() -> None:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["a"]), helper.make_node("Sub", ["a", "t"], ["e"]),
             helper.make_node("Mul", ["e", "e"], ["se"]), helper.make_node("ReduceMean", ["se"], ["y"], keepdims=0)]
    model = gradient_model(nodes, {"x": [5, 4], "w": [4, 3], "b": [3]}, ["w", "b"], "y", zs=["x"],
                           consts={"t": rand(5, 3, seed=7)})
    feeds = {"x": rand(5, 4, seed=8), "w": rand(4, 3, seed=9), "b": rand(3, seed=10)}
    check_gradient(model, feeds, ["w", "b"], "y")
    check_gradient(model, feeds, ["w", "b"], "y", target="x86")


def test_the_forward_is_replayed_at_the_gradient_inputs() -> None:
    # Gradient(xs=["a"], y="y") fed a2: the derivative of y = a*a*b at a = a2, not at a
    nodes = [helper.make_node("Mul", ["a", "a"], ["aa"]), helper.make_node("Mul", ["aa", "b"], ["y"])]
    model = gradient_model(nodes, {"a": [3], "b": [3], "a2": [3]}, ["a"], "y", zs=["b"], at=["a2", "b"])
    a, b, a2 = rand(3, seed=11), rand(3, seed=12), rand(3, seed=13)
    out = md.compile(md.import_onnx(model)).run({"a": a, "b": b, "a2": a2})
    np.testing.assert_allclose(out["d_a"], 2 * a2 * b)
    np.testing.assert_allclose(out["y"], a * a * b)


def test_a_value_read_twice_sums_its_cotangents_and_an_unreached_x_gets_zeros() -> None:
    nodes = [helper.make_node("Mul", ["a", "a"], ["aa"]), helper.make_node("Add", ["aa", "a"], ["y"])]
    model = gradient_model(nodes, {"a": [2, 2], "unused": [3]}, ["a", "unused"], "y")
    a = rand(2, 2, seed=14)
    out = md.compile(md.import_onnx(model)).run({"a": a, "unused": np.ones(3)})
    np.testing.assert_allclose(out["d_a"], 2 * a + 1)
    np.testing.assert_array_equal(out["d_unused"], np.zeros(3))


def test_symbolic_shapes_broadcast_either_way_at_run_time() -> None:
    # b's first axis is its own symbol: 1 (broadcast, summed back) or n (not), known only at run time
    nodes = [helper.make_node("Mul", ["a", "b"], ["c"]), helper.make_node("Mul", ["c", "c"], ["y"])]
    model = gradient_model(nodes, {"a": ["n", 3], "b": ["p", 3]}, ["a", "b"], "y")
    graph = md.import_onnx(model)
    for p in (1, 4):
        feeds = {"a": rand(4, 3, seed=15), "b": rand(p, 3, seed=16)}
        check_gradient(model, feeds, ["a", "b"], "y")
        assert md.compile(graph).run(feeds)["d_b"].shape == (p, 3)


def test_an_op_without_a_rule_is_named_with_the_supported_ones() -> None:
    nodes = [helper.make_node("Sin", ["a"], ["s"]), helper.make_node("Add", ["s", "a"], ["y"])]
    with pytest.raises(UnsupportedOpError, match=r"cannot differentiate through op 'Sin' \(node .*\); Gradient "
                                                 r"differentiates Add, Div, Exp, Identity, Log, MatMul"):
        md.import_onnx(gradient_model(nodes, {"a": [2]}, ["a"], "y"))
    assert {"Add", "MatMul", "ReduceMean", "Relu"} <= set(vjp_rules)


def test_ops_off_the_differentiated_path_need_no_rule() -> None:
    # Sin reads only b (a zs): it is computed, not differentiated
    nodes = [helper.make_node("Sin", ["b"], ["s"]), helper.make_node("Mul", ["s", "a"], ["y"])]
    model = gradient_model(nodes, {"a": [3], "b": [3]}, ["a"], "y", zs=["b"])
    a, b = rand(3, seed=17), rand(3, seed=18)
    np.testing.assert_allclose(md.compile(md.import_onnx(model)).run({"a": a, "b": b})["d_a"], np.sin(b))
