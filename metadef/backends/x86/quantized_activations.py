"""A ``QLinearMatMul`` of two activations (attention's ``P V`` in a QOperator transformer,
whose depth is the symbolic sequence) natively, where the bound depth is at most 256.

8-bit values less their zero points lie in [-255, 255], so each product is below 2**16 and a
sum of at most 256 of them below 2**24: float32 holds every partial sum exactly. Per binding,
with the depth known: ``md_widen8`` each operand to float32 less its zero point (scratch),
``md_bmm`` the batched product, ``md_requant8`` the reference's requantization of the sums
(``rint(float32(sum) * mult) + zy``, clipped): the reference's bytes, with no pass through
Python. A longer depth, a broadcast batch, per-row or per-column scales run the step from
Python instead (the reason is the binding's).

Example:
    >>> import numpy as np
    >>> from metadef.ir import GraphBuilder
    >>> from metadef.shape import parse_type
    >>> b = GraphBuilder("g")
    >>> c = b.const
    >>> y, = b.node("QLinearMatMul", [b.input("p", parse_type("u8[h,s,s]")), c("sp", np.float32(1 / 255)),
    ...     c("zp", np.uint8(0)), b.input("v", parse_type("u8[h,s,8]")), c("sv", np.float32(0.1)),
    ...     c("zv", np.uint8(128)), c("sy", np.float32(0.1)), c("zy", np.uint8(128))])
    >>> b.output(y)
    >>> node = b.build().nodes[0]
    >>> lower = activations_lowering(node, [Arg("in", i) for i in range(8)], Arg("out", 0),
    ...                              [None if v is None else v.const for v in node.inputs])
    >>> [call.what for call in lower([(2, 16, 16), (), (), (2, 16, 8)] + [()] * 4, [(2, 16, 8)], {}).calls]
    ['widen a', 'widen b', 'exact integer sums (md_bmm)', 'requantize']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from metadef.backends.x86.native import PARALLEL_ELEMENTS, Arg, Call, Lowering, NativeStep, Shape, bmm_call, needing
from metadef.codegen.native import native_function
from metadef.codegen.native_bmm import BMM_STACK_FLOATS, bmm_packed_floats
from metadef.codegen.native_q8 import requant8_dims, widen8_dims
from metadef.ir import Node
from metadef.ops.defs.quantized import saturation

MAX_DEPTH = 256
"""The longest depth whose sums float32 holds exactly (``256 * 255 * 255 < 2**24``)."""


def _scalar(v: np.ndarray | None) -> bool:
    return v is not None and np.size(v) == 1


def _split(count: int, dims: Callable[..., tuple[int, ...]]) -> Callable[[int], list[tuple[int, ...]] | None]:
    """A call's ``tasks``: ``count`` elements shared out over the threads where there are enough."""
    def tasks(threads: int) -> list[tuple[int, ...]] | None:
        if threads < 2 or count < PARALLEL_ELEMENTS:
            return None
        return [dims(task=t, tasks=threads) for t in range(threads)]
    return tasks


def activations_lowering(node: Node, sources: Sequence[Arg], out: Arg, consts: Sequence[np.ndarray | None]
                         ) -> Lowering | None:
    """The node's lowering (see the module doc), or None where it is no ``QLinearMatMul`` of
    two activations with constant per-tensor scales and zero points."""
    values = list(consts) + [None] * (8 - len(consts))
    if node.op != "QLinearMatMul" or values[0] is not None or values[3] is not None \
            or not all(_scalar(values[i]) for i in (1, 2, 4, 5, 6, 7)):
        return None
    sa, za, sb, zb, sy, zy = (np.asarray(values[i]).reshape(()) for i in (1, 2, 4, 5, 6, 7))
    if zy.dtype not in (np.uint8, np.int8):
        return None
    # the reference's multiplier, in its float32 steps: (a_scale * b_scale) / y_scale
    mult = float(np.float32(sa) * np.float32(sb) / np.float32(sy))
    a_signed, b_signed = (node.inputs[i].type.dtype.numpy == np.int8 for i in (0, 3))
    signed = zy.dtype == np.int8

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        a, b = inputs[0], inputs[3]
        if a is None or b is None or len(a) < 2 or len(b) < 2:
            return "an operand is absent or of rank below 2"
        if tuple(a[:-2]) != tuple(b[:-2]):
            return f"the operands' batch axes differ ({list(a[:-2])} and {list(b[:-2])})"
        batch, (m, k), n = math.prod(a[:-2]), a[-2:], b[-1]
        if k > MAX_DEPTH:
            return f"a depth of {k}: float32 sums are exact up to {MAX_DEPTH} (chunks from Python)"
        if bmm_packed_floats(n, k) > BMM_STACK_FLOATS:
            return f"a [{k}, {n}] operand outgrows md_bmm's stack buffer"
        sizes = (math.prod(a), math.prod(b), batch * m * n)
        if 0 in sizes:
            return NativeStep(())

        def widen(source: Arg, scratch: int, what: str, count: int, signed_x: bool, zero: np.ndarray) -> Call:
            def dims(task: int = 0, tasks: int = 1) -> tuple[int, ...]:
                return widen8_dims(count, signed=signed_x, zero=float(np.float32(zero)), task=task, tasks=tasks)
            return Call(native_function("md_widen8"), (source, Arg("scratch", scratch)), dims(), what,
                        _split(count, dims))

        def requantized(task: int = 0, tasks: int = 1) -> tuple[int, ...]:
            return requant8_dims(sizes[2], mult=mult, zero=float(np.float32(zy)), signed=signed, task=task,
                                 tasks=tasks)

        calls = (widen(sources[0], 0, "widen a", sizes[0], a_signed, za),
                 widen(sources[3], 1, "widen b", sizes[1], b_signed, zb),
                 bmm_call((Arg("scratch", 0), Arg("scratch", 1), Arg("scratch", 2)), batch, m, n, k,
                          "exact integer sums (md_bmm)"),
                 Call(native_function("md_requant8"), (Arg("scratch", 2), out), requantized(), "requantize",
                      _split(sizes[2], requantized)))
        return NativeStep(calls, tuple(4 * s for s in sizes))

    return needing(lower, "md_widen8", "md_bmm", "md_requant8")


def activations_product(node: Node, args: Sequence[np.ndarray | None],
                        reference: Callable[[Node, Sequence[np.ndarray | None]], np.ndarray]) -> np.ndarray:
    """A QLinearMatMul of two activations (attention's products in a QOperator model): the
    integer sums exact through float32 batched products (BLAS) over chunks of 256 depths (8-bit
    values less their zero points: each chunk's sums below 2**24), the chunks summed in float64
    (exact) and rounded once to float32, as the reference's int32 sum is; requantized in place
    as the reference does. Other forms (per-row scales, a QGemm) run ``reference``. (The step from
    Python: :func:`activations_lowering` is the native one.)"""
    a, sa, za, b, sb, zb, sy, zy = (list(args) + [None] * 8)[:8]
    if node.op != "QLinearMatMul" or a is None or b is None or np.ndim(a) < 2 or np.ndim(b) < 2 \
            or not all(_scalar(v) for v in (sa, za, sy, zy)) or np.size(zb) not in (1, np.shape(b)[-1]):
        return reference(node, args)
    fa = np.subtract(a, np.float32(np.asarray(za).reshape(())), dtype=np.float32)
    fb = np.subtract(b, np.asarray(zb, np.float32).reshape(-1 if np.size(zb) > 1 else ()), dtype=np.float32)
    depth = fa.shape[-1]
    if depth <= 256:  # one chunk: its float32 sums are the integers themselves
        acc = np.matmul(fa, fb)
    else:  # chunks summed in float64 (exact), rounded once to float32 as the int32 sum would be
        acc64 = np.matmul(fa[..., :256], fb[..., :256, :]).astype(np.float64)
        for k0 in range(256, depth, 256):
            acc64 += np.matmul(fa[..., k0:k0 + 256], fb[..., k0:k0 + 256, :])
        acc = acc64.astype(np.float32)
    multiplier = np.asarray(sa, np.float32).reshape(()) * np.asarray(sb, np.float32).reshape(
        -1 if np.size(sb) > 1 else ()) / np.asarray(sy, np.float32).reshape(())
    acc *= multiplier
    np.rint(acc, out=acc)
    acc += np.float32(np.asarray(zy).reshape(()))
    return np.clip(acc, *saturation(np.asarray(zy).dtype), out=acc).astype(np.asarray(zy).dtype)


__all__ = ["MAX_DEPTH", "activations_lowering", "activations_product"]
