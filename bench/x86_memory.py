"""Memory of the zoo models on the x86 backend: the planned arena against the lifetime lower
bound, and each runtime's process peak RSS (metadef and ONNX Runtime in separate fresh
processes, so neither pays for the other's libraries).

    .venv/bin/python bench/x86_memory.py                     # every zoo model, batch 1
    .venv/bin/python bench/x86_memory.py --models bert --batch 8
    .venv/bin/python bench/x86_memory.py --cold              # no compile cache: LLVM generates the code

The arena holds every intermediate tensor and scratch buffer of one run (of one piece's, where
the batch ran in pieces: ``runs``); the lower bound is the most memory live at any one step (no
placement needs less). Peak RSS is ``VmHWM`` after building the model, compiling (metadef: optimize at ``aggressive``
+ x86 compile; ORT: session creation at ORT_ENABLE_ALL) and three runs, minus nothing: imports
and weights count. The ORT process imports only onnxruntime and numpy: it reads the model and
its inputs from files written here; both metadef processes read the same inputs file. metadef
is measured twice: importing the model from ONNX in the process (the zoo builds it there: the
proto and the imported weights coexist for a moment), and loading the file ``metadef convert
--optimize aggressive`` writes (the deployment path: the weights stay mapped, and leave the RSS
once checked, folded or packed; the code comes from the compile cache when an earlier run left
it there, and then LLVM and onnx are never loaded).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from metadef.convert import convert

METADEF = """
import json, logging, sys, numpy as np
logging.disable(logging.WARNING)
import metadef as md
name, batch, mdef, inputs = {name!r}, {batch}, {mdef!r}, {inputs!r}
dims = {{"seq": 128}} if name == "bert" else {{}}
if mdef:  # the deployment path: a converted file, mapped
    sess = md.load(mdef).optimize_for(level="aggressive").compile(target="x86")
else:
    sess = md.compile(md.optimize(md.import_onnx(md.zoo.build(name)), level="aggressive"), target="x86")
feeds = dict(np.load(inputs))
for _ in range(3):
    sess.run(feeds)
hwm = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
symbols = {{"batch": batch, **dims}}
way = sess.executable.pieces_for(symbols)
if way is not None:  # the batch ran in pieces: the arena of a piece's program
    symbols["batch"] = way.size
program = sess.executable.programs.bound(symbols)
print(json.dumps({{"arena": program.plan.peak, "lower_bound": program.plan.lower_bound, "rss_kb": hwm,
                  "python_steps": program.python_steps, "native_calls": program.native_calls,
                  "pieces": "whole" if way is None else str(way),
                  "llvm": "llvmlite.binding" in sys.modules}}))
"""

ORT = """
import json, numpy as np, onnxruntime as ort
model, inputs = {model!r}, {inputs!r}
so = ort.SessionOptions()
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
so.intra_op_num_threads = 1
sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
feeds = dict(np.load(inputs))
for _ in range(3):
    sess.run(None, feeds)
hwm = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
print(json.dumps({{"rss_kb": hwm}}))
"""
"""The ONNX Runtime process reads the model and its inputs from files this script writes: it
imports onnxruntime and numpy only (not metadef, its zoo, onnx or LLVM)."""


def _ort_files(name: str, batch: int, where: str) -> tuple[str, str]:
    import numpy as np

    import metadef as md
    dims = {"seq": 128} if name == "bert" else {}
    model, inputs = os.path.join(where, f"{name}.onnx"), os.path.join(where, f"{name}.npz")
    with open(model, "wb") as f:
        f.write(md.zoo.build(name).SerializeToString())
    np.savez(inputs, **md.zoo.describe(name).example_inputs(batch=batch, **dims))
    return model, inputs


def _run(script: str, cache: str | None = None) -> dict:
    env = {**os.environ, "METADEF_CACHE_DIR": cache} if cache else None
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900, env=env)
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "resnet50", "mobilenetv2", "bert"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--cold", action="store_true",
                    help="each metadef process starts with an empty compile cache (it generates its code with LLVM)")
    args = ap.parse_args()
    print("| model | batch | runs | arena MB | lower bound MB | arena / bound | metadef peak RSS MB, from ONNX | "
          "from .mdef | ORT peak RSS MB | RSS ratio, from ONNX | from .mdef | LLVM loaded, from .mdef |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        with tempfile.TemporaryDirectory() as where:
            model, inputs = _ort_files(name, args.batch, where)
            fresh = (lambda: tempfile.mkdtemp(dir=where)) if args.cold else (lambda: None)
            ours = _run(METADEF.format(name=name, batch=args.batch, mdef="", inputs=inputs), fresh())
            mdef = os.path.join(where, f"{name}.mdef")
            convert(name, mdef, optimize="aggressive")  # what `metadef convert --optimize aggressive` writes
            mapped = _run(METADEF.format(name=name, batch=args.batch, mdef=mdef, inputs=inputs), fresh())
            theirs = _run(ORT.format(model=model, inputs=inputs))
        ratio = ours["arena"] / ours["lower_bound"] if ours["lower_bound"] else 1.0
        print(f"| {name} | {args.batch} | {ours['pieces']} | {ours['arena'] / 2**20:.2f} | "
              f"{ours['lower_bound'] / 2**20:.2f} | "
              f"{ratio:.3f} | {ours['rss_kb'] / 1024:.0f} | {mapped['rss_kb'] / 1024:.0f} | "
              f"{theirs['rss_kb'] / 1024:.0f} | {ours['rss_kb'] / theirs['rss_kb']:.2f} | "
              f"{mapped['rss_kb'] / theirs['rss_kb']:.2f} | {'yes' if mapped['llvm'] else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
