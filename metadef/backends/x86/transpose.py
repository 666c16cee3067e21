"""A Transpose that swaps two blocks of axes as ``md_transpose`` (8 x 8 tiles through registers).

The generated kernel of a Transpose walks its output in order and reads its input one float at
a time across rows: NCHW to NHWC on ``[8, 64, 56, 56]`` ran 2.2-2.5x ONNX Runtime's time. Once
axes of length 1 are dropped and axes that stay neighbours are merged, many permutations are a
batched matrix transpose, ``[n, r, c] -> [n, c, r]`` (NCHW <-> NHWC, a matrix's ``.T``, a
sequence's ``[b, s, h] -> [b, h, s]``): :func:`transpose_lowering` runs those as one
``md_transpose`` call and leaves the rest (moves of whole rows, such as attention's ``[b, s,
h, d] -> [b, h, s, d]``, which the generated kernel copies as vectors) to it.

Example:
    >>> merged_transpose((8, 64, 56, 56), (0, 2, 3, 1))
    (8, 64, 3136)
    >>> merged_transpose((8, 128, 12, 64), (0, 2, 1, 3)) is None
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from metadef.backends.x86.native import Arg, Lowering, NativeStep, Shape, needing, needs, transpose_call
from metadef.ir import Node


def merged_transpose(shape: Sequence[int], perm: Sequence[int]) -> tuple[int, int, int] | None:
    """``(n, rows, cols)`` when transposing ``shape`` by ``perm`` is ``[n, rows, cols] -> [n,
    cols, rows]`` on the same bytes (axes of length 1 dropped, neighbours in both orders merged),
    else None (also for a permutation that moves nothing).

    Example:
        >>> merged_transpose((3, 5), (1, 0)), merged_transpose((1, 7, 1, 9), (0, 3, 2, 1))
        ((1, 3, 5), (1, 7, 9))
    """
    kept = [a for a in perm if shape[a] != 1]
    runs: list[list[int]] = []
    for a in kept:  # output order; an axis following its input neighbour joins its run
        if runs and a == runs[-1][-1] + 1:
            runs[-1].append(a)
        else:
            runs.append([a])
    sizes = [math.prod(shape[a] for a in run) for run in runs]
    order = sorted(range(len(runs)), key=lambda i: runs[i][0])  # the runs in input order
    if order == [1, 0]:
        return 1, sizes[1], sizes[0]
    if len(runs) == 3 and order == [0, 2, 1]:
        return sizes[0], sizes[2], sizes[1]
    return None


def transpose_lowering(node: Node, otherwise: Lowering) -> Lowering:
    """A float32 (or other 4-byte) Transpose as one ``md_transpose`` call where its shape makes
    it a batched matrix transpose (:func:`merged_transpose`); ``otherwise`` (the generated
    kernel) for any other node or shape."""
    out = node.outputs[0].type if node.outputs and node.outputs[0] is not None else None
    if node.qualop != "Transpose" or out is None or np.dtype(out.dtype.numpy).itemsize != 4:
        return otherwise

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        shape = inputs[0]
        if shape is None or not shape or 0 in shape:
            return otherwise(inputs, outputs, symbols)
        perm = node.attrs.get("perm") or list(range(len(shape)))[::-1]
        merged = merged_transpose(shape, [int(a) % len(shape) for a in perm])
        if merged is None:
            return otherwise(inputs, outputs, symbols)
        n, rows, cols = merged

        return NativeStep((transpose_call(Arg("in", 0), Arg("out", 0), n, rows, cols, "transpose"),))

    return needing(lower, *needs(otherwise), "md_transpose")


__all__ = ["merged_transpose", "transpose_lowering"]
