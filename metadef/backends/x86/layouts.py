"""Which values a bound program stores pixel-major: where producer and consumers agree.

Pointwise convs that take the pixels as their tile's rows (``md_conv1x1t``) transpose their
NCHW input into pixel rows first and store their output column by column back into NCHW. Where
such convs follow each other (a ResNet stage at 14x14 and 7x7: each block's output feeds the
next block's first conv and, as the residual, its last), the value between them can stay
pixel-major (:class:`.native.PixelRows`): the consumer reads it in place, the producer stores
it row by row (``md_gemm``). A value can be stored so when its producer can write it so and
every step that reads it can read it so. A step whose residual and output are in different
layouts transposes the residual first (its tile reads both alike), so :func:`agree` starts
from every value that can, and gives back, value by value, those that save no transpose.
Depthwise convs (:mod:`.depthwise_rows`) run in either layout, a transpose where their input
and output differ, and pointwise convs whose product on pixel rows outruns their best way on
NCHW (:mod:`.pointwise`) count NCHW as a transpose's worth: MobileNet's blocks go pixel-major
through both.

Example:
    >>> from metadef.backends.x86.native import NativeStep, PixelRows, pixel_stride
    >>> conv = lambda *reads, residual=None: PixelRows(reads, residual, 0, lambda args: None)
    >>> steps = [(conv(0), ["x"], ["a"]),                 # a = conv(x)
    ...          (conv(0), ["a"], ["b"]),                 # b = conv(a)
    ...          (conv(0, residual=1), ["b", "a"], ["c"]),  # c = conv(b) + a
    ...          (None, ["c"], ["y"])]                    # y = something else of c
    >>> sorted(agree(steps))  # (a pixel-major: c's residual transposed back, for b's transpose saved)
    ['b']
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Any

from metadef.backends.x86.native import NativeStep, PixelRows, pixel_stride

ENABLED = True
"""False: every value stays NCHW (tests; benchmarks that compare the two in one process)."""

StepValues = tuple["PixelRows | None", Sequence["Hashable | None"], Sequence["Hashable | None"]]
"""A step's pixel-rows form (None: it reads and writes values only as they are), the values
it reads and those it writes, in its input and output positions (None: a value that is not a
candidate: absent, a graph input or output, a constant)."""


def agree(steps: Sequence[StepValues], pinned: Collection[Hashable] = ()) -> set[Hashable]:
    """The values to store pixel-major: written by a step that can store them so, read only by
    steps that can read them so, not ``pinned`` (read through a view of another shape, say),
    and, of those, the ones whose layout saves transposes (:func:`transposes`); ties go, and
    none unless they save one in all.

    Example:
        >>> conv = PixelRows((0,), None, 0, lambda args: None)
        >>> agree([(conv, ["x"], ["a"]), (conv, ["a"], ["b"])]), agree([(conv, ["x"], ["a"]), (None, ["a"], ["b"])])
        ({'a'}, set())
    """
    producer: dict[Hashable, int] = {}
    if not ENABLED:
        return set()
    for s, (rows, _, outs) in enumerate(steps):
        if rows is not None and rows.writes is not None and rows.writes < len(outs):
            value = outs[rows.writes]
            if value is not None:
                producer[value] = s
    chosen = set(producer) - set(pinned)
    for rows, ins, _ in steps:
        for k, value in enumerate(ins):
            if value in chosen and (rows is None or (k not in rows.reads and k != rows.residual)):
                chosen.discard(value)
    touching: dict[Hashable, list[StepValues]] = {value: [] for value in chosen}  # (its cost changes there only)
    for step in steps:
        if step[0] is not None:
            for value in {*step[1], *step[2]} & chosen:
                touching[value].append(step)
    changed = True
    while changed:
        changed = False
        for value in sorted(chosen, key=producer.__getitem__):
            near = touching[value]
            if transposes(near, chosen - {value}) <= transposes(near, chosen):  # (a tie: NCHW, as written)
                chosen.discard(value)
                changed = True
    return chosen if transposes(steps, chosen) < transposes(steps, ()) else set()


def transposes(steps: Sequence[StepValues], chosen: Collection[Hashable]) -> int:
    """How many transposes the steps with a pixel-rows form make with the values in ``chosen``
    pixel-major: one for each input they read as pixel rows that is not, and one for each
    residual in the other layout than their output; or what a form's own ``cost`` says.

    Example:
        >>> from metadef.backends.x86.native import NativeStep, PixelRows, pixel_stride
        >>> step = (PixelRows((0,), 1, 0, lambda args: None), ["x", "r"], ["y"])
        >>> transposes([step], set()), transposes([step], {"x", "r"}), transposes([step], {"x", "y"})
        (1, 1, 1)
    """
    count = 0
    for rows, ins, outs in steps:
        if rows is None:
            continue
        if rows.cost is not None:
            count += rows.cost(pixel_major_args(rows, ins, outs, chosen))
            continue
        count += sum(1 for k in rows.reads if ins[k] is None or ins[k] not in chosen)
        if rows.residual is not None:
            out = outs[rows.writes] if rows.writes is not None else None
            count += (ins[rows.residual] in chosen) != (out is not None and out in chosen)
    return count


def pixel_major_args(rows: PixelRows, ins: Sequence[Hashable | None], outs: Sequence[Hashable | None],
                     chosen: Collection[Hashable]) -> frozenset[tuple[str, int]]:
    """The args (``("in", i)``, ``("out", j)``) of a step with the pixel-rows form ``rows`` whose
    values are in ``chosen``.

    Example:
        >>> rows = PixelRows((0,), 1, 0, lambda args: None)
        >>> sorted(pixel_major_args(rows, ["a", "b"], ["c"], {"b", "c"}))
        [('in', 1), ('out', 0)]
    """
    args = {("in", k) for k in (*rows.reads, *(() if rows.residual is None else (rows.residual,)))
            if ins[k] is not None and ins[k] in chosen}
    if rows.writes is not None and outs[rows.writes] is not None and outs[rows.writes] in chosen:
        args.add(("out", rows.writes))
    return frozenset(args)


def settle(lowered: list[Any], buffers: list[list[int]], pinned: Collection[Hashable],
           key: Callable[[Any], Hashable | None]) -> tuple[set[Hashable], list[int]]:
    """Agree the layouts of a program being bound (:func:`agree`): ``lowered`` holds each
    step's ``(NativeStep or why not, input storages, output storages, scratch, step index)``,
    ``buffers`` the arena's ``[size, start, end]``, ``key`` a storage's value (its arena
    buffer; None: not a candidate). The steps that read or write a chosen value are lowered
    again with it pixel-major, in place in ``lowered``, and its buffer sized for rows of
    :func:`.native.pixel_stride` floats. Returns the chosen values and the step indices that
    write them.

    Example:
        >>> settle([("numpy", [None], [None], [], 0)], [], (), lambda st: None)
        (set(), [])
    """
    keys = [([key(st) for st in ins], [key(st) for st in outs]) for _, ins, outs, _, _ in lowered]
    forms = [what.rows if isinstance(what, NativeStep) else None for what, *_ in lowered]
    chosen = agree([(rows, ins, outs) for rows, (ins, outs) in zip(forms, keys)], pinned)
    if not chosen:
        return chosen, []
    for at, (rows, (ins, outs)) in enumerate(zip(forms, keys)):
        args = pixel_major_args(rows, ins, outs, chosen) if rows is not None else frozenset()
        if args:
            _, step_ins, step_outs, scratch, s = lowered[at]
            lowered[at] = (rows.lower(args), step_ins, step_outs, scratch, s)
            for kind, index in args:
                st = (step_ins if kind == "in" else step_outs)[index]
                assert st is not None and len(st.shape) == 4, st
                n, c, h, w = st.shape
                buffers[st.index][0] = n * h * w * pixel_stride(c) * st.dtype.itemsize
    return chosen, [lowered[at][4] for at, (_, outs) in enumerate(keys) if any(v in chosen for v in outs)]


__all__ = ["ENABLED", "StepValues", "agree", "pixel_major_args", "settle", "transposes"]
