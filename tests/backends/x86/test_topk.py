"""TopK along the last axis runs as ``md_topk_rows``: the reference's order exactly (ties by
the lower position, NaN the largest), against the reference and ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import metadef as md
from metadef.ir import parse_graph

pytestmark = pytest.mark.jit

RNG = np.random.default_rng(13)


def _graph(k: int, largest: int, axis: int = -1, width: int = 300) -> md.Graph:
    return parse_graph(f"""graph g(%x: f32[n,{width}]) -> (%v, %i) {{
      %k: i64[1] = const [{k}]
      %v: f32[n,?], %i: i64[n,?] = TopK(%x, %k) {{axis={axis}, largest={largest}}} @top
      return %v, %i }}""".replace("?", str(k)))


@pytest.mark.parametrize("k", [1, 5, 64, 256])
@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("threads", [1, 2])
def test_topk_rows_match_the_reference_with_ties_nan_and_infinities(k: int, largest: int, threads: int) -> None:
    graph = _graph(k, largest)
    sess, ref = md.compile(graph, target="x86", cache=False, threads=threads), md.compile(graph, target="reference")
    assert sess.executable.plan[0].reason.endswith("(our kernel)")
    x = RNG.integers(-20, 20, (70, 300)).astype(np.float32)  # (ties everywhere)
    x[RNG.random(x.shape) < 0.02] = np.nan
    x[RNG.random(x.shape) < 0.02] = np.inf
    x[RNG.random(x.shape) < 0.02] = -np.inf
    got, want = sess.run({"x": x}), ref.run({"x": x})
    np.testing.assert_array_equal(got["i"], want["i"])
    np.testing.assert_array_equal(got["v"], want["v"])
    steps = sess.executable.run_steps({"x": x}, {"n": 70})
    np.testing.assert_array_equal(steps[1], want["i"])
    assert sess.run({"x": x[:0]})["v"].shape == (0, k)


@pytest.mark.parametrize("largest", [0, 1])
def test_topk_rows_match_onnxruntime(largest: int) -> None:
    from metadef.testing.onnx_cases import one_node_model
    x = RNG.standard_normal((16, 1000)).astype(np.float32)
    model = one_node_model("TopK", {"x": x}, {"k": np.array([7], np.int64)}, ["x", "k"], n_out=2, opset=11,
                           axis=-1, largest=largest)
    got = md.compile(md.import_onnx(model), target="x86", cache=False).run({"x": x})
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(got["out0"], theirs[0])
    np.testing.assert_array_equal(got["out1"], theirs[1])


def test_other_topks_run_their_reference_and_say_why() -> None:
    sess = md.compile(_graph(300, 1, width=400), target="x86", cache=False)
    assert "only K in [1, 256] along the last axis" in sess.executable.plan[0].reason
    x = RNG.standard_normal((3, 400)).astype(np.float32)
    ref = md.compile(_graph(300, 1, width=400), target="reference").run({"x": x})
    np.testing.assert_array_equal(sess.run({"x": x})["i"], ref["i"])
