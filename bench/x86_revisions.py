"""A/B of the x86 backend across git revisions: each revision checked out in a worktree of its
own, fresh processes alternating between them, each process timing its session and ONNX
Runtime side by side.

``bench/x86_ab.py`` compares settings within one process; a change to generated code cannot go
that way (a routine is built once a process), and two processes of the same code on a shared
host differ by 10 % and more. So each process here reports its ratio to ORT measured
interleaved (a burst of foreign load hits both alike), the revisions take turns ``--pairs``
times, and the table gives each revision's median ratio and its ratio to the first revision's.
Each revision keeps one compile cache (a temporary directory) across its processes: the
first compiles and times its choices, the others start warm, as a deployment would.

    .venv/bin/python bench/x86_revisions.py HEAD~1 HEAD --model resnet50 --pairs 3
    .venv/bin/python bench/x86_revisions.py main WORKTREE --model mlp --threads 2

``WORKTREE`` is the checkout as it is, uncommitted changes included.
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

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import functools, json, statistics, sys
import metadef as md
from metadef.backends.x86.threads import set_threads
from metadef.cli_bench import ort_session
from metadef.testing.timing import time_interleaved
name, threads, batch, rounds = {model!r}, {threads}, {batch}, {rounds}
set_threads(threads)
proto = md.zoo.build(name)
sess = md.compile(md.optimize(md.import_onnx(proto), level="aggressive"), target="x86")
ort = ort_session(proto.SerializeToString(), threads)
dims = {{"seq": 128}} if name == "bert" else {{}}
feeds = md.zoo.describe(name).example_inputs(batch=batch, **dims)
sample = time_interleaved({{"ORT": functools.partial(ort.run, None, feeds),
                            "metadef": functools.partial(sess.run, feeds)}}, 3, rounds)
ours, theirs = statistics.median(sample.times["metadef"]), statistics.median(sample.times["ORT"])
print(json.dumps({{"file": md.__file__, "ours": ours, "ort": theirs, "foreign": sample.foreign_cores}}))
"""


def checkout(rev: str, into: Path) -> Path:
    """The tree of ``rev`` in a detached worktree under ``into`` (``WORKTREE``: this checkout)."""
    if rev == "WORKTREE":
        return ROOT
    path = into / rev.replace("/", "_").replace("~", "-").replace("^", "-")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(path), rev], check=True)
    return path


def measure(tree: Path, cache: Path, args: argparse.Namespace) -> dict[str, float]:
    """One fresh process on ``tree``'s code: its session's and ORT's median times (s)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "METADEF_CACHE_DIR": str(cache)}
    code = CHILD.format(model=args.model, threads=args.threads, batch=args.batch, rounds=args.rounds)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tree)
    if done.returncode != 0:
        raise SystemExit(f"the process on {tree} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(result["file"]).resolve().is_relative_to(tree.resolve()):  # (PYTHONPATH must win)
        raise SystemExit(f"the process on {tree} imported metadef from {result['file']}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revisions", nargs="+", help="git revisions (or WORKTREE), the first the baseline")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds a process")
    parser.add_argument("--pairs", type=int, default=3, help="processes a revision, taking turns")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="metadef-revisions-") as scratch:
        base = Path(scratch)
        trees = [checkout(rev, base) for rev in args.revisions]
        caches = [base / f"cache{i}" for i in range(len(trees))]
        try:
            results: list[list[dict[str, float]]] = [[] for _ in trees]
            for turn in range(args.pairs):
                for i, (rev, tree) in enumerate(zip(args.revisions, trees)):
                    r = measure(tree, caches[i], args)
                    results[i].append(r)
                    print(f"turn {turn + 1}, {rev}: metadef {r['ours'] * 1e3:.3f} ms, ORT {r['ort'] * 1e3:.3f} ms, "
                          f"ratio {r['ours'] / r['ort']:.3f} (other processes: {r['foreign']:.2f} cores)", flush=True)
        finally:
            for tree in trees:
                if tree != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    print(f"\n{args.model}, batch {args.batch}, {args.threads} thread(s), {args.pairs} processes a revision, "
          f"{args.rounds} rounds each\n")
    print("| revision | metadef ms (median) | ORT ms (median) | ratio to ORT (median; each process) | / first |")
    print("|---|---|---|---|---|")
    first = None
    for rev, runs in zip(args.revisions, results):
        ratios = [r["ours"] / r["ort"] for r in runs]
        ratio = statistics.median(ratios)
        first = first or ratio
        each = ", ".join(f"{x:.3f}" for x in ratios)
        print(f"| {rev} | {statistics.median(r['ours'] for r in runs) * 1e3:.3f} | "
              f"{statistics.median(r['ort'] for r in runs) * 1e3:.3f} | {ratio:.3f} ({each}) | {ratio / first:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
