"""Linear and cubic Resizes of the last two axes run as ``md_resize2d`` with the reference's
own taps: against the reference backend and ONNX Runtime, every coordinate mode."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import metadef as md
from metadef.testing.onnx_cases import one_node_model

pytestmark = pytest.mark.jit

RNG = np.random.default_rng(3)
EMPTY = np.array([], np.float32)


def _check(model: object, x: np.ndarray, threads: int = 1, routine: bool = True, ort_too: bool = True) -> None:
    graph = md.import_onnx(model)
    sess = md.compile(graph, target="x86", cache=False, threads=threads)
    got = sess.run({"x": x})["out0"]
    want = md.compile(graph, target="reference").run({"x": x})["out0"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if ort_too:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        theirs = ort.InferenceSession(model.SerializeToString(), options,  # type: ignore[attr-defined]
                                      providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, theirs, rtol=1e-4, atol=1e-4)
    assert sess.executable.plan[0].reason.endswith("md_resize2d (our kernel)") == routine, sess.executable.plan[0]


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("transform", ["half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel"])
@pytest.mark.parametrize("scales", [(1, 1, 2, 2), (1, 1, 0.5, 1.5), (1, 1, 1, 3)])
def test_resize_matches_the_reference_and_onnxruntime(mode: str, transform: str, scales: tuple) -> None:
    x = RNG.standard_normal((2, 3, 9, 14)).astype(np.float32)
    model = one_node_model("Resize", {"x": x}, {"roi": EMPTY, "scales": np.array(scales, np.float32)},
                           inputs=["x", "roi", "scales"], opset=19, mode=mode,
                           coordinate_transformation_mode=transform)
    _check(model, x, ort_too=scales == (1, 1, 2, 2))


@pytest.mark.parametrize("threads", [1, 2])
def test_resize_by_sizes_antialiased_and_split_across_threads(threads: int) -> None:
    x = RNG.standard_normal((4, 8, 40, 50)).astype(np.float32)
    up = one_node_model("Resize", {"x": x}, {"roi": EMPTY, "scales": EMPTY, "sizes": np.array([4, 8, 81, 77])},
                        inputs=["x", "roi", "scales", "sizes"], opset=19, mode="linear")
    _check(up, x, threads)
    down = one_node_model("Resize", {"x": x}, {"roi": EMPTY, "scales": np.array([1, 1, 0.4, 0.5], np.float32)},
                          inputs=["x", "roi", "scales"], opset=19, mode="cubic", antialias=1, exclude_outside=1)
    _check(down, x, threads, ort_too=False)


def test_other_resizes_go_elsewhere() -> None:
    x = RNG.standard_normal((2, 3, 6, 6)).astype(np.float32)
    channels = one_node_model("Resize", {"x": x}, {"roi": EMPTY, "scales": np.array([1, 2, 2, 2], np.float32)},
                              inputs=["x", "roi", "scales"], opset=19, mode="linear")
    _check(channels, x, routine=False, ort_too=False)
    nearest = one_node_model("Resize", {"x": x}, {"roi": EMPTY, "scales": np.array([1, 1, 2, 2], np.float32)},
                             inputs=["x", "roi", "scales"], opset=19, mode="nearest")
    _check(nearest, x, routine=False)
