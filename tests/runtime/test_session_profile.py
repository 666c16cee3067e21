"""Session.profile: each node timed on its own, the run's outputs unchanged, on the x86
backend (native groups, one and two threads, steps from Python) and the reference backend."""

from __future__ import annotations

import numpy as np
import pytest

import metadef as md
from metadef.core.errors import BackendError, InputError
from metadef.ir import parse_graph

pytestmark = pytest.mark.jit

RNG = np.random.default_rng(3)

CNN = """graph cnn(%x: f32[n,16,12,12]) -> (%y, %s) {
  %w1: f32[16,16,3,3] = const
  %c1: f32[n,16,12,12] = Conv(%x, %w1) {pads=[1,1,1,1]} @conv
  %r1: f32[n,16,12,12] = Relu(%c1) @relu
  %wp: f32[8,16,1,1] = const
  %y: f32[n,8,12,12] = Conv(%r1, %wp) @pointwise
  %s: i64[n,1,12,12] = ArgMax(%y) {axis=1} @argmax
  return %y, %s }"""


def _graph() -> md.Graph:
    return parse_graph(CNN, constants={"w1": RNG.standard_normal((16, 16, 3, 3), dtype=np.float32),
                                       "wp": RNG.standard_normal((8, 16, 1, 1), dtype=np.float32)})


@pytest.mark.parametrize(("target", "threads"), [("x86", 1), ("x86", 2), ("reference", None)])
def test_profile_times_every_node_and_leaves_runs_right(target: str, threads: int | None) -> None:
    g = _graph()
    sess = md.compile(g, target=target, **({"threads": threads} if threads else {}))
    feeds = {"x": RNG.standard_normal((3, 16, 12, 12), dtype=np.float32)}
    p = sess.profile(feeds, runs=3, warmup=1)
    assert p.runs == 3 and p.target == target and p.symbols == {"n": 3}
    assert {r.node for r in p.rows} <= {n.name for n in g.nodes} and {r.node for r in p.by_node()} >= {"argmax"}
    assert all(r.seconds > 0 for r in p.rows) and p.wall is not None and p.wall > 0
    if target == "x86":
        assert ("argmax", "from Python") in {(r.node, r.what) for r in p.rows}
        assert f"{threads} thread" in p.note
    want = md.compile(g, target="reference").run(feeds)
    got = sess.run(feeds)  # (a session profiled runs as before)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got["s"], want["s"])


def test_profile_checks_its_inputs_like_run() -> None:
    sess = md.compile(_graph(), target="x86")
    with pytest.raises(InputError, match="x"):
        sess.profile({"x": np.ones((1, 3, 12, 12), np.float32)})


def test_a_graph_run_step_by_step_says_it_cannot_be_profiled() -> None:
    # NonZero's output size depends on the values: no native program to time
    g = parse_graph("""graph g(%x: f32[n]) -> (%i) {
      %i: i64[1,k] = NonZero(%x) @nz
      return %i }""")
    sess = md.compile(g, target="x86")
    with pytest.raises(BackendError, match="step by step"):
        sess.profile({"x": np.array([0, 1, 2], np.float32)})


def test_a_session_specialized_per_structure_profiles_the_specialization_its_feeds_take() -> None:
    # (md.compile_onnx: a SpecializingSession; its profile is its specialization's)
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    sess = md.compile_onnx(model, target="x86")
    p = sess.profile({"x": np.ones((3, 4), np.float32)}, runs=2)
    assert [r.node for r in p.rows] == ["relu"] and p.symbols == {"n": 3} and p.target == "x86"
