"""A/B of x86 backend settings on a zoo model, in one process: sessions of each variant run
side by side with ONNX Runtime, round after round.

A variant is a set of overrides, each ``module.ATTRIBUTE=value`` (a Python literal) or an
environment variable ``NAME=value`` read at compile time (upper case, no dot); ``base`` is the
code as it is. Each variant is compiled ``--sessions`` times (every compile packs its own
weights, whose place in memory moves a session's time by a few percent: identical ResNet-50
sessions in one process measured 121.5, 121.0 and 116.3 ms side by side), with the overrides
applied while it compiles and binds only (no compile cache; a choice measured in this process
is kept for the same shape and candidates, so a variant that changes the candidates races
again, one that changes how they are timed does not). Then every session and ORT run once a round, in turn,
``--rounds`` rounds: the table gives each variant's median over its sessions' runs, the ratio
to ORT and to ``base``. Between processes on a shared host the same code moves by 10 % and
more; within a round, a burst of foreign load hits all alike.

    .venv/bin/python bench/x86_ab.py resnet50 --variant METADEF_WINOGRAD=2
    .venv/bin/python bench/x86_ab.py bert --threads 2 --variant metadef.backends.x86.conv1x1.PREFER="'sgemm'"
    .venv/bin/python bench/x86_ab.py resnet50 --control --sessions 4 --rounds 25   # the tool's own spread
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import os
import statistics
from collections.abc import Iterator

import metadef as md
from metadef.backends.x86.threads import set_threads
from metadef.cli_bench import ort_session
from metadef.testing.timing import time_interleaved


def parse_override(text: str) -> tuple[str, str, object]:
    """``module.ATTR=literal`` -> (module, attribute, value); ``NAME=text`` -> ("env", NAME, text).

    Example:
        >>> parse_override("metadef.backends.x86.conv1x1.PREFER='sgemm'")
        ('metadef.backends.x86.conv1x1', 'PREFER', 'sgemm')
        >>> parse_override("METADEF_WINOGRAD=2")
        ('env', 'METADEF_WINOGRAD', '2')
    """
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"--variant {text!r}: give module.ATTRIBUTE=value or NAME=value")
    if "." not in name:
        return "env", name, value
    module, _, attribute = name.rpartition(".")
    return module, attribute, ast.literal_eval(value)


@contextlib.contextmanager
def applied(overrides: list[tuple[str, str, object]]) -> Iterator[None]:
    """The overrides in force inside the block, the old values back after it."""
    undo = []
    try:
        for module, attribute, value in overrides:
            if module == "env":
                undo.append((os.environ, attribute, os.environ.get(attribute)))
                os.environ[attribute] = str(value)
            else:
                target = importlib.import_module(module)
                undo.append((target, attribute, getattr(target, attribute)))
                setattr(target, attribute, value)
        yield
    finally:
        for target, attribute, old in reversed(undo):
            if target is os.environ:
                if old is None:
                    os.environ.pop(attribute, None)
                else:
                    os.environ[attribute] = old  # type: ignore[assignment]
            else:
                setattr(target, attribute, old)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--variant", action="append", default=[], metavar="OVERRIDE[,OVERRIDE...]",
                        help="one variant: overrides separated by commas (repeat for more variants)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--sessions", type=int, default=2, help="sessions compiled per variant")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--control", action="store_true",
                        help="add 'base again': more sessions of the code as it is, whose ratio to base is how far "
                             "two identical variants fall apart on this host (Zen 5, 4 sessions x 25 rounds: 0.967)")
    args = parser.parse_args()
    set_threads(args.threads)
    proto = md.zoo.build(args.model)
    graph = md.optimize(md.import_onnx(proto), level="aggressive")
    dims = {"seq": 128} if args.model == "bert" else {}
    feeds = md.zoo.describe(args.model).example_inputs(batch=args.batch, **dims)
    variants = {"base": []} | {text: [parse_override(o) for o in text.split(",")] for text in args.variant}
    if args.control:
        variants["base again"] = []
    runners, owner = {}, {}
    for name, overrides in variants.items():
        for i in range(args.sessions):
            with applied(overrides):
                sess = md.compile(graph, target="x86", threads=args.threads, cache=False)
                sess.run(feeds)
            runners[f"{name} #{i}"] = lambda sess=sess: sess.run(feeds)
            owner[f"{name} #{i}"] = name
    ort = ort_session(proto.SerializeToString(), args.threads)
    runners["ORT"] = lambda: ort.run(None, feeds)
    sample = time_interleaved(runners, 2, args.rounds)
    ort_ms = statistics.median(sample.times["ORT"]) * 1e3
    print(f"\n{args.model}, batch {args.batch}, {args.threads} thread(s), {args.rounds} rounds, "
          f"{args.sessions} sessions a variant; ORT {ort_ms:.2f} ms; other processes used "
          f"{sample.foreign_cores:.2f} cores meanwhile")
    print("\n| variant | ms (median of its sessions' runs) | per session | / ORT | / base |\n|---|---|---|---|---|")
    base = None
    for name in variants:
        runs = [t for key, times in sample.times.items() if owner.get(key) == name for t in times]
        ms = statistics.median(runs) * 1e3
        base = base or ms
        each = ", ".join(f"{statistics.median(sample.times[k]) * 1e3:.2f}" for k in owner if owner[k] == name)
        print(f"| {name} | {ms:.2f} | {each} | {ms / ort_ms:.3f} | {ms / base:.3f} |")


if __name__ == "__main__":
    main()
