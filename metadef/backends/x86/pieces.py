"""A batch run in pieces: micro-batches whose activations stay in cache, on one thread or several.

A graph that computes each sample on its own (:func:`metadef.analysis.samples.separable_symbol`)
gives the same outputs for a batch of 8 as for 8 batches of one stacked. Two ways of using
that can beat running the batch whole:

- *micro-batches*: when a batch's intermediates far outweigh the weights, pieces of one or
  two samples keep them in the L2 and L3 caches and re-read only the weights: MobileNetV2's
  batch of 8 moves 46 MB of activations through memory between layers, against 14 MB of
  weights (1.23-1.35 -> 0.99-1.10 of ONNX Runtime's time here, one thread);
- *pieces on the threads at once*: with several threads, each piece runs on one thread, the
  kernels not split at all (MobileNetV2 at batch 8 on 2 threads: pieces of one, two at a
  time, 76 ms against 109 for one after another and 119 whole, in one measurement).

ResNet-50's weights (100 MB) outweigh its activations: one after another, pieces would read
them once a piece, and at one thread it runs whole. With several threads, samples on the
threads at once (no kernel split, no barrier between the threads, each core's caches holding
its own sample) beat the whole batch split kernel by kernel: at batch 8 on 2 threads 283-305
ms against 305-313 (Zen 4, ``bench/x86_pieces.py``, three runs). BERT folds the batch into its
products' rows (``[batch*seq, 768]``): not separable, whole.

The rule (:func:`split_rule`): only where the graph is separable along a symbol whose value is
2 or more and the live-memory lower bound of the whole batch exceeds :data:`CACHE_BYTES` (half
this machine's L3). Where it also exceeds :data:`WEIGHTS_FACTOR` times the weights' bytes,
pieces of each size in :data:`PIECES` are candidates, one after another and (with several
threads) on the threads at once; else, with several threads and at least as many samples,
samples one a thread on the threads at once. The candidates and the whole batch are timed on
the call's own inputs, once per binding and thread count (remembered in this process and in
the compile cache's shape level), and the fastest is kept; ``METADEF_DEBUG=1`` logs the decision and, where the
rule declines, why; :meth:`~metadef.backends.x86.backend.X86Executable.pieces_for` tells it afterwards. A piece is a
prepared program of its own binding (``{"batch": 2}``) run on views of the inputs and
outputs: nothing is copied.

Example:
    >>> import numpy as np, metadef as md
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph('''graph g(%x: f32[n,4]) -> (%y) {
    ...   %y: f32[n,4] = Relu(%x) @relu
    ...   return %y }''')
    >>> exe = md.compile(g, target="x86").executable
    >>> split_rule(exe, {"n": 8}, threads=2)    # 128 bytes of activations: nothing to gain
    []
    >>> run_pieces(exe, [np.arange(-4, 4, dtype=np.float32).reshape(2, 4)], {"n": 2}, 1)[0].tolist()
    [[0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 2.0, 3.0]]
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from metadef.analysis import lower_bound
from metadef.backends.x86.native import known_choice, race, remember_choice
from metadef.cache.keys import graph_hash
from metadef.shape import evaluate_shape, sym

log = logging.getLogger("metadef.backends.x86")

CACHE_BYTES = 16 << 20
"""A batch whose live intermediates need less than this (half this machine's L3) runs whole."""
WEIGHTS_FACTOR = 2
"""Pieces re-read the weights once each: they are timed only where the whole batch's live
intermediates exceed this many times the weights' bytes."""
PIECES = (1, 2)
"""The piece sizes timed against the whole batch."""
WHOLE = "whole"


def split_rule(exe: Any, symbols: Mapping[str, int], threads: int = 1) -> list[Pieces]:
    """The ways in pieces the rule times against the whole batch for this binding (see the
    module doc; none: it runs whole, the reason logged under ``METADEF_DEBUG=1``)."""
    s = exe.samples
    n = symbols.get(s, 0) if s is not None else 0
    if n < 2:
        return []
    live = int(lower_bound(exe.graph, symbols))
    weights = sum(int(np.asarray(data).nbytes) for _, data in exe.consts)
    if live > max(CACHE_BYTES, WEIGHTS_FACTOR * weights):
        return [Pieces(m, w) for w in dict.fromkeys((1, threads)) for m in PIECES if m < n]
    if live > CACHE_BYTES and 1 < threads <= n:
        if exe.debug:
            log.debug("x86: %s at %s: its weights (%.1f MB) outweigh its intermediates (%.1f MB live): "
                      "only samples on the threads at once are timed", exe.graph.name, dict(symbols),
                      weights / 1e6, live / 1e6)
        return [Pieces(1, threads)]
    if exe.debug:
        log.debug("x86: %s at %s runs whole: its intermediates (%.1f MB live) stay within %.0f MB or "
                  "%dx the weights (%.1f MB), on %d thread(s)", exe.graph.name, dict(symbols), live / 1e6,
                  CACHE_BYTES / 1e6, WEIGHTS_FACTOR, weights / 1e6, threads)
    return []


def choose_pieces(exe: Any, inputs: Sequence[np.ndarray], symbols: Mapping[str, int], threads: int,
                  outputs: Sequence[np.ndarray]) -> tuple[Pieces | None, bool]:
    """How this binding runs (None: the whole batch at once), measured on ``inputs`` into
    ``outputs`` the first time (each candidate once untimed, which prepares its programs,
    then :func:`~metadef.backends.x86.native.race`'s rounds: one round alone chose wrong
    under foreign load), and whether it was measured (``outputs`` then hold the answer: every
    candidate writes all of them)."""
    ways = split_rule(exe, symbols, threads)
    if not ways:
        return None, False
    key = ("pieces", graph_hash(exe.graph, weights=False), tuple(sorted(symbols.items())), threads)
    names = [WHOLE, *map(str, ways)]
    winner = known_choice(key, names)
    measured = winner is None
    if winner is None:
        candidates = {WHOLE: lambda: exe.run_whole(inputs, symbols, outputs)}
        for way in ways:
            candidates[str(way)] = lambda way=way: run_pieces(exe, inputs, symbols, way, outputs)
        # (timed outside measured_choice's lock: a piece's worker thread may prepare a
        # program, whose kernel choices take that lock)
        winner = remember_choice(key, names, race(candidates))[0]
        if winner != WHOLE:  # its prepared programs hold a whole batch's arena: let them go
            exe.programs.forget(symbols)
    return None if winner == WHOLE else Pieces.parse(winner), measured


@dataclass(frozen=True)
class Pieces:
    """A batch in pieces of ``size`` samples, run one after another (``workers`` 1: each piece
    on the executable's threads) or on ``workers`` threads at once, each piece on one."""

    size: int
    workers: int = 1

    def __str__(self) -> str:
        return f"{self.size}" if self.workers == 1 else f"{self.size} on {self.workers} threads"

    @staticmethod
    def parse(text: str) -> Pieces:
        """The inverse of ``str``.

        Example:
            >>> Pieces.parse(str(Pieces(2, 4))), Pieces.parse("1")
            (Pieces(size=2, workers=4), Pieces(size=1, workers=1))
        """
        words = text.split()
        return Pieces(int(words[0]), int(words[2]) if len(words) > 2 else 1)


def output_specs(exe: Any, symbols: Mapping[str, int]) -> list[tuple[tuple[int, ...], np.dtype]]:
    """The graph outputs' shapes and dtypes for ``symbols``."""
    return [(tuple(evaluate_shape(v.type.shape, symbols)), v.type.dtype.numpy) for v in exe.graph.outputs]


_WORKERS: list[ThreadPoolExecutor] = []
_WORKERS_LOCK = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    with _WORKERS_LOCK:
        if not _WORKERS:
            _WORKERS.append(ThreadPoolExecutor(max(1, (os.cpu_count() or 2) - 1), "metadef-pieces"))
        return _WORKERS[0]


def run_pieces(exe: Any, inputs: Sequence[np.ndarray], symbols: Mapping[str, int], way: Pieces | int,
               outputs: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
    """The graph run in pieces (``way``; an int: that many samples a piece, one after another)
    into ``outputs`` (new arrays when None), each piece a prepared program on views of the
    inputs and outputs; with several workers, each takes the next piece not yet taken (the
    caller's thread is one of them; native code runs with the GIL released), so a core slowed
    by another process's load runs fewer pieces than the others instead of holding them all up."""
    if isinstance(way, int):
        way = Pieces(way)
    s = exe.samples
    n = symbols[s]
    if outputs is None:
        outputs = [np.empty(shape, dtype) for shape, dtype in output_specs(exe, symbols)]
    first = sym(s)
    batched = [bool(v.type.shape) and v.type.shape[0] == first for v in exe.graph.inputs]
    starts = iter(range(0, n, way.size))
    taking = threading.Lock()
    threads = 1 if way.workers > 1 else None

    def take() -> int | None:
        with taking:
            return next(starts, None)

    def work() -> None:
        while (start := take()) is not None:
            count = min(way.size, n - start)
            program = exe.programs.bound({**symbols, s: count}, threads)
            try:
                ins = [a[start:start + count] if b else a for a, b in zip(inputs, batched)]
                for array, (shape, dtype) in zip(ins, program.input_specs):
                    if array.shape != shape or array.dtype != dtype:
                        exe._check_inputs(program, ins)
                program.run(ins, [o[start:start + count] for o in outputs])
            finally:
                exe.programs.give_back(program)

    others = [_executor().submit(work) for _ in range(1, min(way.workers, -(-n // way.size)))]
    try:
        work()
    finally:
        for future in others:
            future.result()  # (an error in a worker is raised here)
    return list(outputs)


__all__ = ["CACHE_BYTES", "PIECES", "WEIGHTS_FACTOR", "Pieces", "choose_pieces", "output_specs", "run_pieces",
           "split_rule"]
