"""A CNN whose image size is symbolic: ResNet-50 with input ``[n, 3, h, w]``, x86 vs ONNX Runtime.

The zoo's ResNet-50 with its batch, height and width made symbolic, optimized at
``aggressive`` and compiled once; each image size then runs without compiling. Both runtimes
on one thread, interleaved, medians; the label (first argument) marks the run.

    .venv/bin/python bench/x86_dynamic_size.py [LABEL] [--runs 8]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import metadef as md
from metadef.cli_bench import ort_session

SIZES = ((224, 224), (160, 192))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("label", nargs="?", default="metadef")
    parser.add_argument("--runs", type=int, default=8)
    args = parser.parse_args()
    model = md.zoo.build("resnet50")
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[0].dim_param, dims[2].dim_param, dims[3].dim_param = "n", "h", "w"
    sess = md.compile(md.optimize(md.import_onnx(model), level="aggressive"), target="x86", threads=1)
    fallbacks = sum(p.fallback for p in sess.executable.plan)
    oracle = ort_session(model.SerializeToString(), 1)
    name = model.graph.input[0].name
    for size in SIZES:
        feeds = {name: np.random.default_rng(0).standard_normal((1, 3, *size)).astype(np.float32)}
        for _ in range(2):
            sess.run(feeds), oracle.run(None, feeds)
        ours, theirs = [], []
        for _ in range(args.runs):  # interleaved: foreign load hits both alike
            t0 = time.perf_counter()
            sess.run(feeds)
            t1 = time.perf_counter()
            oracle.run(None, feeds)
            ours.append(t1 - t0)
            theirs.append(time.perf_counter() - t1)
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"{args.label}: {size[0]}x{size[1]}, {fallbacks} steps on numpy: metadef {a * 1e3:.1f} ms, "
              f"ORT {b * 1e3:.1f} ms, ratio {a / b:.2f}", flush=True)


if __name__ == "__main__":
    main()
