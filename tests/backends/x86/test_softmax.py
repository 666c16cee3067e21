"""Softmax and LogSoftmax nodes over contiguous rows run as ``md_softmax_rows`` (against ONNX
Runtime and the reference backend); other axes keep the generated kernel."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import metadef as md
from metadef.testing.onnx_cases import one_node_model

pytestmark = pytest.mark.jit

RNG = np.random.default_rng(11)


def _ort(model: object, feeds: dict[str, np.ndarray]) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options,  # type: ignore[attr-defined]
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape,axis,opset,rows", [
    ((3, 5), -1, 13, True),            # fewer columns than a vector
    ((2, 3, 37), -1, 13, True),        # two vectors and a tail
    ((4, 1), 1, 13, True),             # one column
    ((2, 3, 4, 160), 3, 13, True),     # a block of four vectors and more
    ((2, 3, 7), 1, 11, True),          # before opset 13: every axis from 1 on, as rows of 21
    ((2, 70, 5), 1, 13, False),        # not the last axis: the generated kernel
])
@pytest.mark.parametrize("threads", [1, 2])
def test_softmax_rows_match_onnxruntime(op: str, shape: tuple[int, ...], axis: int, opset: int, rows: bool,
                                        threads: int) -> None:
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)
    model = one_node_model(op, {"x": x}, opset=opset, axis=axis)
    sess = md.compile(md.import_onnx(model), target="x86", cache=False, threads=threads)
    got = sess.run({"x": x})["out0"]
    np.testing.assert_allclose(got, _ort(model, {"x": x}), rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(got, md.compile(md.import_onnx(model), target="reference").run({"x": x})["out0"],
                               rtol=1e-5, atol=2e-6)
    kinds = sess.executable.programs.bound({}).call_kinds
    what = "log softmax rows" if op == "LogSoftmax" else "softmax rows"
    assert (kinds.get(what, 0) == 1) == rows


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_rows_split_across_threads_and_keep_nan_and_inf_as_numpy(op: str) -> None:
    """Rows enough to split across two threads; a NaN makes its row NaN, a row of -inf and one
    finite value gives 0 (or -inf) and 1 (or 0) as numpy does."""
    x = (RNG.standard_normal((400, 300)) * 3).astype(np.float32)
    x[5, 17] = np.nan
    x[9, :] = -np.inf
    x[9, 3] = 1.0
    graph = md.import_onnx(one_node_model(op, {"x": x}, axis=-1))
    sess, ref = md.compile(graph, target="x86", cache=False, threads=2), md.compile(graph, target="reference")
    with np.errstate(all="ignore"):
        got, want = sess.run({"x": x})["out0"], ref.run({"x": x})["out0"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
    assert np.isnan(got[5]).all() and np.isnan(want[5]).all()
    np.testing.assert_array_equal(got[9], want[9])


@pytest.mark.parametrize("threads", [1, 2])
def test_reductions_down_columns_split_across_threads(threads: int) -> None:
    """A softmax over the channels of NCHW planes (segmentation heads) and a mean over the
    sequence axis (mean pooling) keep the last axis: they run down its columns in blocks, and
    the blocks (or the outer axes) split across the pool; the reference's answers."""
    from metadef.ir import parse_graph
    g = parse_graph("""graph g(%x: f32[n,19,h,w], %s: f32[b,t,300]) -> (%p, %m) {
      %p: f32[n,19,h,w] = Softmax(%x) {axis=1} @channels
      %a: i64[1] = const [1]
      %m: f32[b,300] = ReduceMean(%s, %a) {keepdims=0} @pool
      return %p, %m }""")
    feeds = {"x": (RNG.standard_normal((3, 19, 33, 40)) * 3).astype(np.float32),
             "s": RNG.standard_normal((5, 77, 300)).astype(np.float32)}
    got = md.compile(g, target="x86", cache=False, threads=threads).run(feeds)
    want = md.compile(g, target="reference").run(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_rows_compile_no_kernel_and_run_step_by_step_and_empty(op: str) -> None:
    """A softmax over rows runs the routine in programs and step by step alike (no generated
    kernel compiled for it), and a batch of no rows runs no call."""
    from metadef.codegen.kernel import record_kernels
    from metadef.ir import parse_graph
    g = parse_graph(f"graph g(%x: f32[n,33]) -> (%y) {{ %y: f32[n,33] = {op}(%x) {{axis=-1}} @s return %y }}")
    with record_kernels() as structures:
        sess = md.compile(g, target="x86", cache=False)
    assert sess.executable.plan[0].reason.endswith("(our kernel)") and structures == []
    x = (RNG.standard_normal((5, 33)) * 3).astype(np.float32)
    want = md.compile(g, target="reference").run({"x": x})["y"]
    np.testing.assert_allclose(sess.executable.run_steps({"x": x}, {"n": 5})[0], want, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(sess.run({"x": x})["y"], want, rtol=1e-5, atol=2e-6)
    assert sess.run({"x": x[:0]})["y"].shape == (0, 33)
