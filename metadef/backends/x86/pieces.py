"""A batch run in pieces: micro-batches whose activations stay in cache.

A graph that computes each sample on its own (:func:`metadef.analysis.samples.separable_symbol`)
gives the same outputs for a batch of 8 as for 8 batches of one stacked. When a batch's
intermediates far outweigh the weights, the pieces win: MobileNetV2's batch of 8 moves 46 MB
of activations through memory between layers, a piece of one or two keeps them in the L2 and
L3 caches and re-reads only its 14 MB of weights (measured here: 1.19-1.27 -> 1.03-1.06 of
ONNX Runtime's time). ResNet-50's weights (100 MB) outweigh its activations, so it runs
whole; BERT folds the batch into its products' rows (``[batch*seq, 768]``), so it is not
separable and runs whole too.

The rule: a binding is split only where the graph is separable along a symbol whose value is
2 or more, and the live-memory lower bound of the whole batch exceeds both
:data:`CACHE_BYTES` and :data:`WEIGHTS_FACTOR` times the weights' bytes. Then the whole batch
and pieces of each size in :data:`PIECES` (smaller than the batch) are timed on the call's
own inputs, once per binding and thread count (remembered in this process and in the
compile cache's shape level), and the fastest is kept; ``METADEF_DEBUG=1`` logs the decision
and, where the rule declines, why. A piece is a prepared program of its own binding
(``{"batch": 2}``) run on views of the inputs and outputs: nothing is copied.

Example:
    >>> import numpy as np, metadef as md
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph('''graph g(%x: f32[n,4]) -> (%y) {
    ...   %y: f32[n,4] = Relu(%x) @relu
    ...   return %y }''')
    >>> exe = md.compile(g, target="x86").executable
    >>> split_rule(exe, {"n": 8}) is None    # 128 bytes of activations: nothing to gain
    True
    >>> run_pieces(exe, [np.arange(-4, 4, dtype=np.float32).reshape(2, 4)], {"n": 2}, 1)[0].tolist()
    [[0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 2.0, 3.0]]
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metadef.analysis import lower_bound
from metadef.backends.x86.native import known_choice, measured_choice
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


def split_rule(exe: Any, symbols: Mapping[str, int]) -> tuple[str, int] | None:
    """``(symbol, batch)`` when the rule allows pieces for this binding (see the module doc),
    else None (the reason logged under ``METADEF_DEBUG=1``)."""
    s = exe.samples
    n = symbols.get(s, 0) if s is not None else 0
    if n < 2:
        return None
    live = int(lower_bound(exe.graph, symbols))
    weights = sum(int(np.asarray(data).nbytes) for _, data in exe.consts)
    if live <= max(CACHE_BYTES, WEIGHTS_FACTOR * weights):
        if exe.debug:
            log.debug("x86: %s at %s runs whole: its intermediates (%.1f MB live) stay within %.0f MB or "
                      "%dx the weights (%.1f MB)", exe.graph.name, dict(symbols), live / 1e6, CACHE_BYTES / 1e6,
                      WEIGHTS_FACTOR, weights / 1e6)
        return None
    return s, n


def choose_pieces(exe: Any, inputs: Sequence[np.ndarray], symbols: Mapping[str, int], threads: int,
                  outputs: Sequence[np.ndarray]) -> int | None:
    """The piece size for this binding (None: the whole batch), measured on ``inputs`` into
    ``outputs`` the first time (each candidate run once untimed first: it prepares its
    programs, whose kernel choices must not wait on the measuring lock)."""
    found = split_rule(exe, symbols)
    if found is None:
        return None
    _, n = found
    sizes = [m for m in PIECES if m < n]
    key = ("pieces", graph_hash(exe.graph, weights=False), tuple(sorted(symbols.items())), threads)
    names = [WHOLE, *map(str, sizes)]
    winner = known_choice(key, names)
    if winner is None:
        candidates = {WHOLE: lambda: exe.run_whole(inputs, symbols, outputs)}
        for m in sizes:
            candidates[str(m)] = lambda m=m: run_pieces(exe, inputs, symbols, m, outputs)
        for run in candidates.values():
            run()
        winner = measured_choice(key, candidates, rounds=1, warm_up=False)[0]
        if winner != WHOLE:  # its prepared programs hold a whole batch's arena: let them go
            exe.programs.forget(symbols)
    return None if winner == WHOLE else int(winner)


def output_specs(exe: Any, symbols: Mapping[str, int]) -> list[tuple[tuple[int, ...], np.dtype]]:
    """The graph outputs' shapes and dtypes for ``symbols``."""
    return [(tuple(evaluate_shape(v.type.shape, symbols)), v.type.dtype.numpy) for v in exe.graph.outputs]


def run_pieces(exe: Any, inputs: Sequence[np.ndarray], symbols: Mapping[str, int], size: int,
               outputs: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
    """The graph run in pieces of ``size`` samples (the last one smaller) into ``outputs``
    (new arrays when None), each piece a prepared program on views of the inputs and outputs."""
    s = exe.samples
    n = symbols[s]
    if outputs is None:
        outputs = [np.empty(shape, dtype) for shape, dtype in output_specs(exe, symbols)]
    first = sym(s)
    batched = [bool(v.type.shape) and v.type.shape[0] == first for v in exe.graph.inputs]
    for start in range(0, n, size):
        count = min(size, n - start)
        piece = {**symbols, s: count}
        program = exe.programs.bound(piece)
        try:
            ins = [a[start:start + count] if b else a for a, b in zip(inputs, batched)]
            for array, (shape, dtype) in zip(ins, program.input_specs):
                if array.shape != shape or array.dtype != dtype:
                    exe._check_inputs(program, ins)
            program.run(ins, [o[start:start + count] for o in outputs])
        finally:
            exe.programs.give_back(program)
    return list(outputs)


__all__ = ["CACHE_BYTES", "PIECES", "WEIGHTS_FACTOR", "choose_pieces", "output_specs", "run_pieces", "split_rule"]
