"""Single ops that used to leave x86's native program, vs ONNX Runtime, measured interleaved.

Each case is a one- or two-node ONNX model: a decoder's 2x ConvTranspose, an Inception-style
Concat of four branches, BERT's embedding Gather, a tf2onnx-style Pad before a conv, YOLO's
nearest 2x upsampling, a CastLike. metadef compiles it for x86 (``threads=1``; ORT with one intra-op thread) and the
two run alternately; the table gives medians in ms and the ratio metadef / ORT, and the
kind of step metadef ran (``native``/``blas``: in the native program; ``reference``: numpy).

    .venv/bin/python bench/x86_ops.py [--runs 50]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

import metadef as md
from metadef.cli_bench import ort_session

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT


def _model(nodes: list, inputs: list, consts: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "op", inputs, [helper.make_tensor_value_info("y", F, None)],
                              [onnx.numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def cases() -> dict[str, tuple[onnx.ModelProto, dict[str, np.ndarray]]]:
    """name -> (model, feeds)."""
    x = RNG.standard_normal((1, 64, 56, 56)).astype(np.float32)
    small = RNG.standard_normal((1, 128, 40, 40)).astype(np.float32)
    branches = {f"b{i}": RNG.standard_normal((1, 64, 28, 28)).astype(np.float32) for i in range(4)}
    ids = RNG.integers(0, 30522, (8, 128)).astype(np.int64)
    return {
        "ConvTranspose 64->32, k4 s2, 56x56": (_model(
            [helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1])],
            [helper.make_tensor_value_info("x", F, ["n", 64, 56, 56])],
            {"w": RNG.standard_normal((64, 32, 4, 4)).astype(np.float32)}), {"x": x}),
        "Concat of 4 x [64,28,28]": (_model(
            [helper.make_node("Concat", list(branches), ["y"], axis=1)],
            [helper.make_tensor_value_info(k, F, ["n", 64, 28, 28]) for k in branches], {}), branches),
        "Gather 8x128 rows of [30522,768]": (_model(
            [helper.make_node("Gather", ["table", "ids"], ["y"])],
            [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
            {"table": RNG.standard_normal((30522, 768)).astype(np.float32)}), {"ids": ids}),
        "Pad 1 pixel of [64,56,56]": (_model(
            [helper.make_node("Pad", ["x", "pads"], ["y"])],
            [helper.make_tensor_value_info("x", F, ["n", 64, 56, 56])],
            {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)}), {"x": x}),
        "Resize nearest 2x of [128,40,40] (YOLO)": (_model(
            [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")],
            [helper.make_tensor_value_info("x", F, ["n", 128, 40, 40])],
            {"scales": np.array([1, 1, 2, 2], np.float32)}), {"x": small}),
        "CastLike [64,56,56] to float16 and back": (_model(
            [helper.make_node("CastLike", ["x", "half"], ["h"]), helper.make_node("CastLike", ["h", "x"], ["y"])],
            [helper.make_tensor_value_info("x", F, ["n", 64, 56, 56])],
            {"half": np.zeros(1, np.float16)}), {"x": x}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    print("| op | metadef ms | ORT ms | ratio | metadef step |\n|---|---|---|---|---|")
    for name, (model, feeds) in cases().items():
        sess = md.compile(md.import_onnx(model), target="x86", threads=1)
        ort_sess = ort_session(model.SerializeToString(), 1)
        kinds = ", ".join(sorted({p.kind for p in sess.executable.plan}))
        ours, theirs = [], []
        for _ in range(3):
            sess.run(feeds), ort_sess.run(None, feeds)
        for _ in range(args.runs):  # interleaved: foreign load hits both alike
            t0 = time.perf_counter()
            sess.run(feeds)
            t1 = time.perf_counter()
            ort_sess.run(None, feeds)
            t2 = time.perf_counter()
            ours.append(t1 - t0)
            theirs.append(t2 - t1)
        a, b = statistics.median(ours) * 1e3, statistics.median(theirs) * 1e3
        print(f"| {name} | {a:.3f} | {b:.3f} | {a / b:.2f} | {kinds} |", flush=True)


if __name__ == "__main__":
    main()
