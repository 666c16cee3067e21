"""From a model file to a ready session: ``.mdef`` with metadef against ``.onnx`` with ONNX Runtime.

For each zoo model, saved both ways (the .mdef at ``moderate``, as ``metadef convert`` writes it),
a fresh process times ``metadef.load(path).compile(target=...)`` (the reference backend; x86 with
a warm compile cache, made by an untimed first process) and another times ``onnx.load`` plus
``onnxruntime.InferenceSession`` (ORT_ENABLE_ALL, 1 thread). Medians of 3 fresh processes each.

    .venv/bin/python bench/mdef_session.py                  # bert resnet50
    .venv/bin/python bench/mdef_session.py --models bert mlp
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

OURS = """
import json, logging, time
logging.disable(logging.WARNING)
import metadef as md
import metadef.backends.x86
t0 = time.perf_counter()
model = md.load({path!r})
t1 = time.perf_counter()
md.compile(model.graph, target={target!r})
t2 = time.perf_counter()
print(json.dumps({{"load_ms": (t1 - t0) * 1e3, "compile_ms": (t2 - t1) * 1e3}}))
"""

THEIRS = """
import json, time
import onnx, onnxruntime as ort
t0 = time.perf_counter()
proto = onnx.load({path!r})
t1 = time.perf_counter()
so = ort.SessionOptions()
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
so.intra_op_num_threads = 1
so.log_severity_level = 3
ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
t2 = time.perf_counter()
print(json.dumps({{"load_ms": (t1 - t0) * 1e3, "compile_ms": (t2 - t1) * 1e3}}))
"""


def _run(script: str, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _median(script: str, env: dict[str, str], runs: int = 3) -> tuple[float, float]:
    rows = [_run(script, env) for _ in range(runs)]
    return statistics.median(r["load_ms"] for r in rows), statistics.median(r["compile_ms"] for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["bert", "resnet50"])
    args = ap.parse_args()
    import onnx

    import metadef as md

    print("| model | .mdef load + reference compile ms | .mdef load + x86 compile (warm cache) ms | "
          "onnx.load + ORT session ms | ratio (reference) | ratio (x86) |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        env = {**os.environ, "METADEF_CACHE_DIR": str(Path(work) / "cache")}
        for name in args.models:
            proto = md.zoo.build(name)
            onnx_path, mdef_path = Path(work) / f"{name}.onnx", Path(work) / f"{name}.mdef"
            onnx.save(proto, onnx_path)
            md.save(md.optimize(md.import_onnx(proto), level="moderate"), mdef_path)
            ref = sum(_median(OURS.format(path=str(mdef_path), target="reference"), env))
            _run(OURS.format(path=str(mdef_path), target="x86"), env)  # fills the compile cache
            x86 = sum(_median(OURS.format(path=str(mdef_path), target="x86"), env))
            ort_ms = sum(_median(THEIRS.format(path=str(onnx_path)), env))
            print(f"| {name} | {ref:.1f} | {x86:.1f} | {ort_ms:.0f} | {ort_ms / ref:.0f}x | {ort_ms / x86:.0f}x |",
                  flush=True)


if __name__ == "__main__":
    main()
