"""File size and output fidelity of quantized zoo models (.mdef, issue 6).

For each zoo model: the float32 .mdef file and the float16 / int8 / int4 files written by the
converter; size ratios against float32; outputs of the loaded (dequantized) models against the
float32 model on 16 example inputs: mean cosine similarity per example and top-1 agreement.

    .venv/bin/python bench/mdef_quantize.py [model ...]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import metadef as md
from metadef.convert import convert

SCHEMES = ("float16", "int8", "int4")
LEVEL = "aggressive"  # what users convert with (BatchNorm folded into the weights)
DIMS = {"bert": {"batch": 16, "seq": 64}}


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.reshape(a.shape[0], -1).astype(np.float64), b.reshape(b.shape[0], -1).astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-30)


def main(names: list[str]) -> None:
    work = Path(tempfile.mkdtemp())
    print("| model | scheme | file MB | ratio vs fp32 | output | cosine (mean / min) | top-1 agreement |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        feeds = md.zoo.describe(name).example_inputs(**DIMS.get(name, {"batch": 16}))
        base = convert(name, work / f"{name}.mdef", optimize=LEVEL, verify=False)
        ref = md.load(base.output).compile().run(feeds)
        size = base.output.stat().st_size
        print(f"| {name} | float32 | {size / 1e6:.1f} | 1.000 | | | |")
        for scheme in SCHEMES:
            t0 = time.perf_counter()
            rep = convert(name, work / f"{name}.{scheme}.mdef", optimize=LEVEL, quantize=scheme, verify=False)
            got = md.load(rep.output).compile().run(feeds)
            for out in ref:
                cos = cosine_rows(ref[out], got[out])
                top1 = ""
                if ref[out].ndim == 2 and name != "bert":
                    top1 = f"{(ref[out].argmax(1) == got[out].argmax(1)).mean():.3f}"
                print(f"| {name} | {scheme} | {rep.output.stat().st_size / 1e6:.1f} | "
                      f"{rep.output.stat().st_size / size:.3f} | {out} | {cos.mean():.6f} / {cos.min():.6f} | "
                      f"{top1} |", flush=True)
            print(f"<!-- {name} {scheme}: {time.perf_counter() - t0:.1f} s -->", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:] or md.zoo.names())
