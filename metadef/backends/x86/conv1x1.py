"""Pointwise convolutions through our own micro-kernel, with the group's epilogue in its stores.

A 1x1, stride-1, unpadded, ungrouped float32 Conv with constant weights runs as one
``md_conv1x1`` call (:mod:`metadef.codegen.native_gemm`): the input read in place, the weights
packed once, and, when the fused group's epilogue is ``act(y + residual)`` (``act``: nothing,
Relu or Clip with constant bounds; the residual: a tensor of the output's shape), the epilogue
applied in registers before the one store. Against OpenBLAS (bias written first, sgemm, then
the epilogue as its own kernel: three passes over the output) it is chosen by measurement on
one image of the real shape, like the Winograd convs (:func:`.native.measured_choice`).

Example:
    >>> import numpy as np
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph('''graph g(%x: f32[1,8,4,4], %r: f32[1,4,4,4]) -> (%z) {
    ...   %w: f32[4,8,1,1] = const
    ...   %y: f32[1,4,4,4] = Conv(%x, %w) @conv
    ...   %s: f32[1,4,4,4] = Add(%y, %r) @add
    ...   %z: f32[1,4,4,4] = Relu(%s) @relu
    ...   return %z }''', constants={"w": np.full((4, 8, 1, 1), 0.5, np.float32)})
    >>> epilogue_form(g.nodes[1:], g.nodes[0].outputs[0], g.outputs[0])
    (Value(%r: f32[1,4,4,4]), 0.0, inf)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from metadef.backends.x86 import contractions as blas
from metadef.backends.x86.depthwise_rows import depthwise_rows_form
from metadef.backends.x86.native import (
    NULL,
    PARALLEL_ELEMENTS,
    Arg,
    Call,
    Lowering,
    NativeStep,
    Shape,
    known_choice,
    measured_choice,
    needing,
    needs,
    pixel_stride,
    sgemm_dims,
    timed_call,
    transpose_call,
)
from metadef.codegen import native_inplace
from metadef.codegen.native import native_function
from metadef.codegen.native_depthwise import (
    DEPTHWISE_KERNELS,
    depthwise_dims,
    depthwise_routine,
    in_place,
    stack_floats,
)
from metadef.codegen.native_dwrows import dwrows_routine
from metadef.codegen.native_gemm import (
    aligned_empty,
    conv1x1_chunks,
    conv1x1_dims,
    conv1x1_rows,
    conv1x1_width,
    conv1x1t_dims,
    gemm_dims,
    gemm_lda,
    gemm_panel,
    pack_conv1x1_weights,
    pack_rows,
    transpose_dims,
)
from metadef.format import release_mapped
from metadef.ir import Node, Value

OWN = "own micro-kernel, epilogue fused"
OWN_C = "own micro-kernel, channels outer"
ORDERS = {OWN: 0, OWN_C: 1}
"""``md_conv1x1``'s walk for each way of calling it (see :mod:`metadef.codegen.native_gemm`)."""
OWN_T = "own micro-kernel, pixels as rows"
PARALLEL_PRODUCT = 1 << 20
"""A product of our kernels splits across threads from this many multiply-adds (~10 us of work)."""
PRODUCT_ROUTINES = ("md_conv1x1", "md_conv1x1t", "md_transpose", "md_gemm", "md_sgemm", "md_copy")
"""The routines a :class:`WeightProduct` may call (or time)."""
MIN_PIXELS = 64
"""Below this many pixels ``md_conv1x1``'s row of 16-pixel blocks wastes too much on its
overlapped last block (7x7: 64 computed for 49): it is not measured there (``md_conv1x1t``,
with the pixels as rows, is)."""

PIXELS_OUTER_HANDICAP = 1.05
"""``OWN`` (pixel blocks outer) wins a race only this much faster than the others. In a race,
its data in cache, it ties ``OWN_C`` (chunks, channels outer) to a few percent either way; in
a model, each input coming from L3 or memory, the chunks read it once where ``OWN`` reads
the weights once a block: ResNet-50's layer1 conv3 at batch 8, one thread, 13.3 ms a conv
with ``OWN``, 9.2 with ``OWN_C`` (`Session.profile`, every product forced one way)."""

SMALL_IMAGE = 256
"""On images of fewer pixels the column walks (``OWN``, ``OWN_C``) are not raced where pixels
as rows (``OWN_T``) can run, unless the input is fresh (Winograd's tiles): their blocks overlap
(196 = 6 x 32 + 4 pixels: 224 computed) and read each channel's short row a few lines at a
time, and in a model, the input out of cache, they lost to pixels as rows by 7-18 % where
they had tied in the race, their data in cache (ResNet-50's layer3 conv3, 256 -> 1024
channels at 14x14: b8t1 4.97-5.54 against 4.22 ms on Zen 5; 10.0-10.2 against 9.3-9.8 ms on
Zen 4). A handicap of 10 % (the thirteenth session's) still let them win where a burst of
foreign load slowed the other candidates' runs."""

PREFER: str | None = None
"""Set to ``OWN``, ``OWN_T`` or ``BLAS`` to take that path for every product with conv weights
without measuring (tests; benchmarks that compare them)."""

DEPTHWISE = True
"""3x3 depthwise convs run as ``md_depthwise`` (False: padded copy + generated kernel + epilogue)."""
DEPTHWISE_ROWS = True
"""Depthwise convs with constant weights offer a pixel-rows form (False: they run on NCHW only,
for benchmarks that compare the two in one process)."""
STACK_FLOATS = 1 << 16
"""The largest padded plane (floats) ``md_depthwise`` puts on a thread's stack; larger planes
take the padded copy and the generated kernel."""
BLAS = "sgemm"


def _constant(v: Value | None) -> float | None:
    if v is None or v.const is None or np.size(v.const) != 1:
        return None
    return float(np.asarray(v.const).reshape(()))


def epilogue_form(nodes: Sequence[Node], y: Value, out: Value) -> tuple[Value | None, float, float] | None:
    """``(residual, lo, hi)`` when ``nodes`` compute ``out = clip(y (+ residual), lo, hi)`` from
    ``y`` (Add of a same-shaped tensor, then at most one Relu or Clip with constant bounds),
    else None."""
    current, residual = y, None
    ops = list(nodes)
    if ops and ops[0].op == "Add":
        a, b = ops[0].inputs
        other = b if a is current else a if b is current else None
        if other is None or other is current or other.type is None or current.type is None \
                or other.type.shape != current.type.shape or other.type.dtype != current.type.dtype:
            return None
        residual, current = other, ops[0].outputs[0]
        ops = ops[1:]
    found = activation_form(ops, current, out)
    return None if found is None else (residual, *found)


def activation_form(nodes: Sequence[Node], y: Value, out: Value) -> tuple[float, float] | None:
    """``(lo, hi)`` when ``nodes`` are nothing (``out`` is ``y``), one Relu, or one Clip with
    constant bounds, from ``y`` to ``out``; else None."""
    lo, hi, current, ops = -math.inf, math.inf, y, list(nodes)
    if ops and ops[0].op in ("Relu", "Clip") and ops[0].inputs[0] is current:
        if ops[0].op == "Relu":
            lo = 0.0
        else:
            bounds = list(ops[0].inputs[1:]) + [None, None]
            found = [_constant(v) for v in bounds[:2]]
            if any(v is not None and f is None for v, f in zip(bounds[:2], found)):
                return None
            lo = -math.inf if found[0] is None else found[0]
            hi = math.inf if found[1] is None else found[1]
        current, ops = ops[0].outputs[0], ops[1:]
    if ops or current is not out:
        return None
    return lo, hi


def pointwise(attrs: Mapping[str, Any], weight: np.ndarray | None, dtype: np.dtype) -> bool:
    """Whether a Conv node can run as ``md_conv1x1`` (before its shapes are known)."""
    kernel = tuple(attrs.get("kernel_shape") or (weight.shape[2:] if weight is not None else ()))
    return (weight is not None and weight.ndim == 4 and weight.shape[2:] == (1, 1) and kernel == (1, 1)
            and dtype == np.float32 and int(attrs.get("group") or 1) == 1
            and list(attrs.get("strides") or [1, 1]) == [1, 1] and not any(attrs.get("pads") or [0])
            and str(attrs.get("auto_pad") or "NOTSET") in ("NOTSET", "VALID"))


class WeightProduct:
    """``y[i] = clip(W x[i] + bias (+ res[i]), lo, hi)`` for a constant ``W [cout, depth]`` and
    each image's ``x[i] [depth, p]`` (a pointwise conv's input, or an im2col of one image),
    through our kernels where they measure faster than OpenBLAS on one image of the shape:
    ``md_conv1x1`` (pixels as the tile's columns; ``OWN``: pixel blocks outer; ``OWN_C``: a
    weight panel stays while a chunk of pixels passes, which streams a residual row by row), or
    ``md_transpose`` into a workspace then ``md_conv1x1t`` (pixels as the tile's rows, ``OWN_T``: no pixel computed
    twice, the input read along its channels). The weights are packed for the winner only,
    once (the measurement runs on arrays of ones in the packed shapes)."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None, bias_arg: Arg, residual: bool,
                 bounds: tuple[float, float]) -> None:
        self.weight: np.ndarray | None = np.asarray(weight, np.float32).reshape(weight.shape[0], -1)
        """The unpacked weights; None once :meth:`drop_weights` let them go (whoever did gives
        them back before packing another way)."""
        self.cout, self.depth = self.weight.shape
        self.bias, self.bias_arg, self.residual, self.bounds = bias, bias_arg, residual, bounds
        self._packed: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        # md_conv1x1t reads the bias a panel of channels at a time: a bias read through its
        # argument must span whole panels, else the padded copy of a constant bias is read
        self.rows_possible = bias_arg is NULL or self.cout % gemm_panel() == 0 or bias is not None

    @staticmethod
    def layout(kind: str) -> str:
        """The packed layout ``kind`` reads: the orders of ``md_conv1x1`` share one.

        Example:
            >>> WeightProduct.layout(OWN_C) == WeightProduct.layout(OWN), WeightProduct.layout(OWN_T)
            (True, 'own micro-kernel, pixels as rows')
        """
        return OWN if kind in ORDERS else kind

    def packed(self, kind: str) -> tuple[np.ndarray, np.ndarray]:
        """The weights in the layout of ``kind`` and a bias to read (zeros, or the padded bias)."""
        kind = self.layout(kind)
        if kind not in self._packed:
            weight = self.weight
            assert weight is not None, "weights dropped: give them back before packing another way"
            if kind == OWN:
                self._packed[kind] = (pack_conv1x1_weights(weight), np.zeros(self.cout, np.float32))
            else:
                w = pack_rows(weight, gemm_panel())  # = pack_gemm_weights(Wᵀ), without a transposed copy
                b = np.zeros(w.shape[0] * w.shape[2], np.float32)
                if self.bias is not None and self.bias_arg is not NULL:
                    b[:self.cout] = np.asarray(self.bias, np.float32).reshape(-1)
                self._packed[kind] = (w, b)
            release_mapped(weight)  # a weight mapped from a .mdef file: its pages leave the RSS
        return self._packed[kind]

    def is_packed(self, kind: str) -> bool:
        """Whether the weights are packed for ``kind`` already (:meth:`packed` needs no weights then)."""
        return self.layout(kind) in self._packed

    def drop_weights(self) -> None:
        """Let the unpacked weights go: the packed ones are what the calls read (for Winograd's
        transformed weights, a second copy of each product's: ResNet-50's took 90 MB)."""
        self.weight = None

    def choice(self, p: int, bands: Sequence[int] = (), fresh: bool = False) -> str:
        """``OWN``, ``OWN_C``, ``OWN_T`` or ``BLAS`` for images of ``p`` pixels, measured once
        per shape (on arrays filled with ones: pages of zeros that were never written all map
        one shared page, which would make every read a cache hit). ``bands``: the pixels of
        each band of columns ``md_conv1x1`` would take in turn (an im2col done in bands of
        output rows): it is timed that way, a band's columns in cache. ``fresh``: the input is
        written just before, in cache (Winograd's tiles): the column walks race on small
        images too (see :data:`SMALL_IMAGE`)."""
        if PREFER is not None:  # (md_conv1x1 needs a block of pixels; md_conv1x1t a bias it can read)
            own = p >= conv1x1_width()
            possible = self.rows_possible if PREFER == OWN_T else own if PREFER in ORDERS else True
            return PREFER if possible else BLAS
        cout, depth = self.cout, self.depth
        key = ("weights x image", depth, cout, p, self.residual, *self.bounds, *((tuple(bands),) if bands else ()),
               *(("fresh",) if fresh else ()))
        names = self.kinds(p, fresh)
        known = known_choice(key, names)
        if known is not None:
            return known
        candidates, _arrays = self.timers(p, bands, names)
        assert sorted(candidates) == sorted(names)
        return measured_choice(key, candidates, {OWN: PIXELS_OUTER_HANDICAP})[0]

    def kinds(self, p: int, fresh: bool = True) -> list[str]:
        """The ways :meth:`choice` races for images of ``p`` pixels (``fresh``: as there; with
        True, every way that can run)."""
        # (channels outer also wins without a residual where few input channels make many
        # outputs: MobileNetV2's 16 -> 96 over 112x112, 0.55 -> 0.43 ms on one core)
        small = p < SMALL_IMAGE and not fresh and self.rows_possible
        columns = (OWN, OWN_C) if p >= MIN_PIXELS and not small else ()
        return [BLAS, *columns, *((OWN_T,) if self.rows_possible else ())]

    def timers(self, p: int, bands: Sequence[int] = (), kinds: Sequence[str] | None = None
               ) -> tuple[dict[str, Callable[[], Any]], tuple[Any, ...]]:
        """One run of each of ``kinds`` (default: every way that can run, :meth:`kinds`; those
        that cannot are left out) for images of ``p`` pixels (``bands``: as in :meth:`choice`),
        on arrays of ones, and those arrays (keep them while the runs are called)."""
        cout, depth, (lo, hi) = self.cout, self.depth, self.bounds
        possible = self.kinds(p)
        wanted = [k for k in kinds or possible if k in possible]
        columns = tuple(k for k in (OWN, OWN_C) if k in wanted)
        x = np.ones((depth, p), np.float32)
        ldx = gemm_lda(depth)  # (a pixel's channels one cache line further apart where they would alias)
        xt = np.ones((p, ldx), np.float32)
        y = np.ones((cout, p), np.float32)
        res = np.ones((cout, p), np.float32)
        panel = gemm_panel()  # (md_conv1x1t's panels of channels)
        bias = np.ones(-(-cout // panel) * panel, np.float32)
        res_address = res.ctypes.data if self.residual else 0
        candidates: dict[str, Callable[[], Any]] = {}
        w = np.ones((self.cout, self.depth), np.float32)
        sgemm = timed_call(native_function("md_sgemm"), [w.ctypes.data, x.ctypes.data, y.ctypes.data,
                                                         blas.cblas_address("sgemm"), bias.ctypes.data, 0],
                           sgemm_dims(1, cout, p, depth, bias=(1, 0)))
        # the BLAS path's epilogue is a kernel of its own: one more pass over the output
        epilogue = timed_call(native_function("md_copy"), [y.ctypes.data, res.ctypes.data], (y.nbytes,))
        fused = self.residual or self.bounds != (-math.inf, math.inf)
        if BLAS in wanted:
            candidates[BLAS] = (lambda: (sgemm(), epilogue())) if fused else sgemm
        if columns:
            packed = np.ones((-(-cout // conv1x1_rows()), depth, conv1x1_rows()), np.float32)
            for kind in columns:
                order = ORDERS[kind]
                parts, at = [], 0
                for width in bands or (p,):  # (each band's columns in x, as each band's im2col leaves them)
                    parts.append(timed_call(native_function("md_conv1x1"), [
                        x.ctypes.data, packed.ctypes.data, bias.ctypes.data, res_address + 4 * at * bool(res_address),
                        y.ctypes.data + 4 * at], conv1x1_dims(1, depth, cout, width, residual=self.residual, lo=lo,
                                                             hi=hi, order=order, y_stride=p)))
                    at += width
                candidates[kind] = parts[0] if len(parts) == 1 else lambda parts=parts: [part() for part in parts]
        if OWN_T in wanted:
            panels = np.ones((-(-cout // panel), depth, panel), np.float32)
            flip = timed_call(native_function("md_transpose"), [x.ctypes.data, xt.ctypes.data],
                              transpose_dims(1, depth, p, ld=ldx))
            rows = timed_call(native_function("md_conv1x1t"), [
                xt.ctypes.data, panels.ctypes.data, bias.ctypes.data, res_address, y.ctypes.data],
                conv1x1t_dims(1, depth, cout, p, residual=self.residual, lo=lo, hi=hi, ldx=ldx))
            candidates[OWN_T] = lambda: (flip(), rows())
        arrays = (x, xt, y, res, bias, w, *((packed,) if columns else ()), *((panels,) if OWN_T in wanted else ()))
        return candidates, arrays

    def calls(self, kind: str, n: int, p: int, x: Arg, residual: Arg | None, out: Arg, work: Arg,
              what: str, y_stride: int | None = None, split_from: int = PARALLEL_PRODUCT,
              rows: Collection[str] = (), gather: tuple[int, int, int] | None = None) -> tuple[list[Call], int]:
        """The calls of ``kind`` (``OWN``, ``OWN_C`` or ``OWN_T``) over ``n`` images of ``p``
        pixels, and the bytes of workspace they need at ``work``; ``y_stride`` (``OWN`` and
        ``OWN_C`` only): the floats between rows of the output and residual, when ``x`` holds
        a band of an image's pixels; ``split_from``: the multiply-adds from which a product
        splits across threads; ``rows`` (``OWN_T`` only): which of ``"x"``, ``"residual"`` and
        ``"out"`` are pixel-major (:class:`.native.PixelRows`): the input read in place, the
        output stored by ``md_gemm`` row by row; a residual in the other layout than the
        output is transposed into the workspace first. ``gather``: ``(output rows, stride,
        input width)`` of a strided pointwise conv whose pixel-major input (``"x"`` in ``rows``)
        has every ``stride``-th pixel of every ``stride``-th row copied into the workspace as
        pixel rows (``md_copy_rows``, an output row a call), in place of a transpose."""
        lo, hi = self.bounds
        cout, depth = self.cout, self.depth
        packed, zeros = self.packed(kind)
        bias = self.bias_arg if self.bias_arg is not NULL and (kind != OWN_T or cout % gemm_panel() == 0) \
            else Arg("addr", zeros.ctypes.data)
        res = residual if residual is not None else NULL
        base = {"residual": residual is not None, "lo": lo, "hi": hi}
        epilogue = " + epilogue" if residual is not None or self.bounds != (-math.inf, math.inf) else ""
        if y_stride is not None:
            assert kind in ORDERS, kind
            base["y_stride"] = y_stride
        if kind in ORDERS:
            order = ORDERS[kind]
            if order == 0:
                outer = -(-p // conv1x1_width())  # (pixel blocks)
            else:  # (chunks times panels, at most: parts split panels)
                outer = -(-p // conv1x1_chunks(n, depth, p)[0]) * -(-cout // conv1x1_rows())

            def tasks(count: int) -> list[tuple[int, ...]] | None:
                if count < 2 or n * cout * p * depth < split_from or n * outer < count:
                    return None
                return [conv1x1_dims(n, depth, cout, p, **base, order=order, task=t, tasks=count)
                        for t in range(count)]
            return [Call(native_function("md_conv1x1"), (x, Arg("addr", packed.ctypes.data), bias, res, out),
                         conv1x1_dims(n, depth, cout, p, **base, order=order), what + " own kernel" + epilogue,
                         tasks)], 0

        assert not set(rows) - {"x", "residual", "out"}, rows
        ldx, ldy = pixel_stride(depth), pixel_stride(cout)  # (the transposed copy's too: no aliasing rows)
        weights, units = Arg("addr", packed.ctypes.data), n * -(-cout // gemm_panel())

        def shares(dims: Callable[[int, int], tuple[int, ...]]) -> Callable[[int], list[tuple[int, ...]] | None]:
            """A product's split into ``count`` tasks over its (image, panel) units, where it pays."""
            def split(count: int) -> list[tuple[int, ...]] | None:
                if count < 2 or n * cout * p * depth < split_from or units < count:
                    return None
                return [dims(t, count) for t in range(count)]
            return split

        calls, used, xt = [], 0, x
        assert gather is None or "x" in rows, "a strided input is read pixel-major"
        if gather is not None:  # its pixels `stride` apart in rows `stride` apart, as pixel rows in the workspace
            oh, stride, width = gather
            ow = p // oh
            for row in range(n * oh):  # (image i's output row oy: row i * oh + oy, input row stride * row)
                calls.append(Call(native_function("md_copy_rows"),
                                  (x.at(4 * row * stride * width * ldx), work.at(4 * row * ow * ldx)),
                                  (ow, 4 * depth, 4 * stride * ldx, 4 * ldx), what + " pixel rows gathered",
                                  joins=row > 0))  # (disjoint rows: one group of the pool, no barriers between)
            xt, used = work, n * ldx * p * 4
        elif "x" not in rows:  # (each image's channels-major input as pixel rows, in the workspace)
            calls.append(transpose_call(x, work, n, depth, p, what + " transpose", ld=ldx))
            xt, used = work, n * ldx * p * 4
        if "out" in rows:
            if residual is not None and "residual" not in rows:  # (as pixel rows: the tile reads both alike)
                calls.append(transpose_call(residual, work.at(used), n, cout, p, what + " residual transpose", ld=ldy))
                residual, used = work.at(used), used + n * ldy * p * 4

            stored = dict(lda=ldx, residual=residual is not None, ldy=ldy, batch=n, xs=p * ldx, ys=p * ldy)
            args = (xt, weights, bias, out, *((residual,) if residual is not None else ()))
            calls.append(Call(native_function("md_gemm"), args, gemm_dims(p, cout, depth, lo=lo, hi=hi, **stored),
                              what + " own kernel, pixel rows stored" + epilogue,
                              shares(lambda t, count: gemm_dims(p, cout, depth, lo=lo, hi=hi, task=t, tasks=count,
                                                                **stored))))
            return calls, used
        if residual is not None and "residual" in rows:  # (back to channels-major for the transposed stores)
            calls.append(transpose_call(residual, work.at(used), n, p, cout, what + " residual transpose", xs=ldy))
            res, used = work.at(used), used + n * cout * p * 4

        calls.append(Call(native_function("md_conv1x1t"), (xt, weights, bias, res, out),
                          conv1x1t_dims(n, depth, cout, p, **base, ldx=ldx),
                          what + " own kernel, pixel rows" + epilogue,
                          shares(lambda t, count: conv1x1t_dims(n, depth, cout, p, **base, task=t, tasks=count,
                                                                ldx=ldx))))
        return calls, used

    def keep(self) -> tuple[np.ndarray, ...]:
        """The packed arrays the calls read by address."""
        return tuple(a for pair in self._packed.values() for a in pair)


def pack_back_to_back(products: Sequence[WeightProduct], kind: str) -> None:
    """Pack the weights of ``products`` (of one shape) for ``kind`` into one array, each
    product's panels right after the one before's, unless they already lie so: the kernels ask
    for the next panel's lines as they go (:func:`.native_tile._ahead`), and past a product's
    last panel that is the next product's first, not another allocation. Winograd's ``a²``
    products of a conv, their weights out of cache as in a model, one core, medians of 80
    interleaved rounds: layer 3's 36 of 256 x 256 0.85-1.10 -> 0.67-0.88 ms, layer 4's 16 of
    512 x 512 1.25-1.34 -> 0.97 ms.

    Example:
        >>> from metadef.backends.x86.native import NULL
        >>> ps = [WeightProduct(np.ones((32, 16), np.float32), None, NULL, False, (0.0, 6.0)) for _ in range(3)]
        >>> pack_back_to_back(ps, OWN_T)
        >>> a, b = (p.packed(OWN_T)[0] for p in ps[:2])
        >>> b.ctypes.data - a.ctypes.data == a.nbytes
        True
    """
    if kind == BLAS or len(products) < 2:
        return
    if all(p.is_packed(kind) for p in products):
        arrays = [p.packed(kind)[0] for p in products]
        if all(b.ctypes.data == a.ctypes.data + a.nbytes for a, b in itertools.pairwise(arrays)):
            return
    packs = [p.packed(kind) for p in products]
    whole = aligned_empty((len(packs), *packs[0][0].shape))
    for product, (weights, bias), place in zip(products, packs, whole):
        place[...] = weights
        product._packed[WeightProduct.layout(kind)] = (place, bias)


def static_planes(node: Node) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The planes (height, width) of a 4-D node's first input and first output where both are
    known before any binding (a batch dimension may still be symbolic), else None.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: f32[n,4,8,8]) -> (%y) { %y: f32[n,4,4,4] = "
        ...                 "MaxPool(%x) {kernel_shape=[2,2], strides=[2,2]} @pool return %y }")
        >>> static_planes(g.nodes[0])
        ((8, 8), (4, 4))
    """
    shapes = [v.type.shape if v is not None and v.type is not None else None
              for v in (node.inputs[0] if node.inputs else None, node.outputs[0] if node.outputs else None)]
    if any(s is None or len(s) != 4 or not all(isinstance(d, int) for d in s[2:]) for s in shapes):
        return None
    (_, _, h, w), (_, _, oh, ow) = shapes  # type: ignore[misc]
    return (int(h), int(w)), (int(oh), int(ow))


def in_place_routine(routine: str, hw: tuple[int, int], out_hw: tuple[int, int], begin: tuple[int, int],
                     strides: tuple[int, int]) -> str:
    """``routine`` (``md_depthwise`` or ``md_maxpool3x3``), or its variant for planes read in
    place at their stride where these planes are (:func:`.native_depthwise.in_place`): a
    sixth of the routine's LLVM time.

    Example:
        >>> in_place_routine("md_maxpool3x3", (112, 112), (56, 56), (1, 1), (2, 2))
        'md_maxpool3x3_inplace2'
        >>> in_place_routine("md_depthwise", (10, 10), (8, 8), (0, 0), (1, 1))
        'md_depthwise'
    """
    if not native_inplace.DIRECT:  # (planes through the padded copy: the whole routine)
        return routine
    return f"{routine}_inplace{strides[0]}" if in_place(hw, out_hw, strides, begin) else routine


def routine_fits(routine: str, hw: tuple[int, int], out_hw: tuple[int, int], strides: tuple[int, int],
                 begin: tuple[int, int], k: int = 3) -> bool:
    """Whether ``routine`` (``md_depthwise``, ``md_maxpool3x3`` or a variant of either from
    :func:`in_place_routine`) runs planes of these shapes: its padded plane fits its stack, and
    a variant reads them in place (``k``: the window's side).

    Example:
        >>> routine_fits("md_depthwise_inplace1", (16, 16), (16, 16), (1, 1), (1, 1))
        True
        >>> [routine_fits(r, (8, 8), (8, 8), (1, 1), (1, 1)) for r in ("md_depthwise_inplace1", "md_depthwise")]
        [False, True]
    """
    return stack_floats(hw, out_hw, strides, begin, k) <= STACK_FLOATS and (
        "_inplace" not in routine or in_place(hw, out_hw, strides, begin))


def depthwise_window(attrs: Mapping[str, Any], sw: Shape | None, dtype: np.dtype) -> int | None:
    """The side ``k`` of a Conv node's window where it is a ``k x k``, dilation-1 depthwise conv
    that a routine of :func:`.native_depthwise.depthwise_routine` runs (3, 5, 7), else None.

    Example:
        >>> depthwise_window({"group": 32, "kernel_shape": [5, 5]}, (32, 1, 5, 5), np.dtype(np.float32))
        5
    """
    kernel = tuple(attrs.get("kernel_shape") or (sw[2:] if sw is not None else ()))
    group = int(attrs.get("group") or 1)
    square = len(kernel) == 2 and kernel[0] == kernel[1] and kernel[0] in DEPTHWISE_KERNELS
    if (sw is not None and len(sw) == 4 and sw[1] == 1 and sw[0] == group and group > 1 and square
            and dtype == np.float32 and list(attrs.get("dilations") or [1, 1]) == [1, 1]
            and str(attrs.get("auto_pad") or "NOTSET") == "NOTSET"):
        return int(kernel[0])
    return None


def depthwise_lowering(attrs: Mapping[str, Any], x: Arg, w: Arg, bias: Arg, out: Arg, bounds: tuple[float, float],
                       otherwise: Lowering, planes: tuple[tuple[int, int], tuple[int, int]] | None = None,
                       k: int = 3, weight: np.ndarray | None = None, bias_value: np.ndarray | None = None
                       ) -> Lowering:
    """A ``k x k`` depthwise conv (:func:`depthwise_window` is ``k`` for its shapes) as one
    ``md_depthwise`` (``md_depthwise{k}``) call writing ``out`` with its bounds (Relu, Clip)
    applied; ``otherwise`` for other shapes. ``planes``: the input's and output's (height,
    width) where known before binding (:func:`static_planes`): planes read in place need only a
    variant of the routine. With the ``weight`` constant (and ``bias_value``, the bias's value
    where constant) the step also has a pixel-rows form (:mod:`.depthwise_rows`)."""
    zeros: list[np.ndarray] = []
    pads = list(attrs.get("pads") or [0, 0, 0, 0])
    strides = tuple(attrs.get("strides") or (1, 1))
    routine = depthwise_routine(k)
    if planes is not None and routine == "md_depthwise":
        routine = in_place_routine(routine, *planes, (pads[0], pads[1]), (int(strides[0]), int(strides[1])))

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        sx, sw = inputs[0], inputs[1]
        side = depthwise_window(attrs, sw, np.dtype(np.float32))
        if sx is None or len(sx) != 4 or side != k or sx[1] != sw[0]:
            return otherwise(inputs, outputs, symbols)
        n, c, h, wd = sx
        out_hw = tuple(outputs[0][2:])
        if not routine_fits(routine, (h, wd), out_hw, strides, (pads[0], pads[1]), side):
            return otherwise(inputs, outputs, symbols)
        if not zeros:
            zeros.append(np.zeros(c, np.float32))
        b = bias if bias is not NULL else Arg("addr", zeros[0].ctypes.data)
        base = dict(lo=bounds[0], hi=bounds[1])

        def tasks(count: int) -> list[tuple[int, ...]] | None:
            if count < 2 or n * c < count or n * c * out_hw[0] * out_hw[1] < PARALLEL_ELEMENTS:
                return None
            return [depthwise_dims(n, c, (h, wd), out_hw, strides, (pads[0], pads[1]), **base, task=t, tasks=count)
                    for t in range(count)]

        call = Call(native_function(routine), (x, w, b, out),
                    depthwise_dims(n, c, (h, wd), out_hw, strides, (pads[0], pads[1]), **base),
                    f"depthwise {side}x{side}" + (" + bounds" if bounds != (-math.inf, math.inf) else ""), tasks)
        step = NativeStep((call,), (), tuple(zeros))
        if weight is None or not DEPTHWISE_ROWS:
            return step
        form = depthwise_rows_form(step, weight, bias_value, x, bias, out, n, ((h, wd), out_hw),  # type: ignore[arg-type]
                                   (int(strides[0]), int(strides[1])), (int(pads[0]), int(pads[1])), bounds)
        return step if form is None else replace(step, rows=form)

    return needing(lower, *needs(otherwise), routine, "md_transpose", dwrows_routine(k))


__all__ = ["ORDERS", "OWN", "OWN_C", "OWN_T", "PRODUCT_ROUTINES", "WeightProduct", "activation_form",
           "depthwise_lowering", "depthwise_window", "epilogue_form", "in_place_routine", "pack_back_to_back",
           "pointwise", "routine_fits", "static_planes"]
