"""ConvTranspose on x86: per image, one sgemm of the weights' transpose with the image
(``W^T X``: every input pixel's contribution to each output channel and kernel tap, the
columns), then ``md_col2im`` adds each column into the output plane where its tap lands, the
bias first (channels split across the worker pool). Two-dimensional float32, and one-dimensional
(a vocoder's upsampling) as planes of one row; anything else runs the reference kernel.

Example:
    >>> from metadef.ir import parse_graph
    >>> import numpy as np
    >>> g = parse_graph('''graph g(%x: f32[n,4,5,5]) -> (%y) {
    ...   %w: f32[4,2,3,3] = const
    ...   %y: f32[n,2,11,11] = ConvTranspose(%x, %w) {strides=[2,2]} @up
    ...   return %y }''', constants={"w": np.ones((4, 2, 3, 3), np.float32)})
    >>> from metadef.backends.x86.native import Arg
    >>> lower = convtranspose_lowering(g.nodes[0], [Arg("in", 0), Arg("in", 1)], Arg("out", 0))
    >>> [c.what for c in lower([(2, 4, 5, 5), (4, 2, 3, 3)], [(2, 2, 11, 11)], {"n": 2}).calls]
    ['convtranspose sgemm', 'convtranspose col2im', 'convtranspose sgemm', 'convtranspose col2im']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metadef.backends.x86.choice import attrs_of
from metadef.backends.x86.native import (
    NULL,
    PARALLEL_ELEMENTS,
    Arg,
    Call,
    Lowering,
    NativeStep,
    _blas,
    needing,
    sgemm_call,
)
from metadef.codegen.native import COL2IM_DIMS, native_function
from metadef.core.errors import MetadefError
from metadef.ir import Node
from metadef.ops.defs.nn import convtranspose_reference, transpose_geometry

Shape = tuple[int, ...]


def convtranspose_kernel(attrs: Mapping[str, Any], node: Node) -> tuple[Any, str]:
    """The Python path (node by node): the reference kernel (one einsum, then col2im in numpy)."""
    return (lambda args: convtranspose_reference(list(args), attrs)), "sgemm (W^T X) + col2im"


def convtranspose_lowering(node: Node, sources: Sequence[Arg], out: Arg,
                           consts: Sequence[np.ndarray | None] = ()) -> Lowering | None:
    """The native form of a 1-D or 2-D float32 ConvTranspose (None for any other)."""
    x = node.inputs[0].type
    if x is None or x.shape is None or len(x.shape) not in (3, 4) or x.dtype.numpy != np.float32:
        return None
    flat = len(x.shape) == 3  # (1-D: planes of one row)
    attrs = attrs_of(node)
    group = int(attrs["group"])
    bias = sources[2] if len(sources) > 2 else NULL

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        sx, sw = inputs[0], inputs[1]
        if sx is None or sw is None or len(sx) != len(sw) or len(sx) != len(x.shape):
            return "an input is absent or of another rank"
        out_shape = tuple(outputs[0])
        if flat:  # one row a plane
            sx, sw, out_shape = (*sx[:2], 1, sx[2]), (*sw[:2], 1, sw[2]), (*out_shape[:2], 1, out_shape[2])
        n, c, h, w = sx
        cin, k_group, kh, kw = sw
        try:
            begin, _, size = transpose_geometry(attrs, (w,) if flat else (h, w), (kw,) if flat else (kh, kw))
        except MetadefError as e:
            return str(e)
        if flat:
            begin, size = [0, *begin], [1, *size]
        k, (oh, ow) = k_group * group, out_shape[2:]
        if cin != c or c % group or tuple(size) != (oh, ow) or min(begin) < 0:
            return f"shapes {list(inputs[0])} * {list(inputs[1])} -> {list(outputs[0])} are not a plain ConvTranspose"
        strides = (1, *(attrs.get("strides") or (1,))) if flat else tuple(attrs.get("strides") or (1, 1))
        dilations = (1, *(attrs.get("dilations") or (1,))) if flat else tuple(attrs.get("dilations") or (1, 1))
        rows, pixels, depth = k_group * kh * kw, h * w, c // group
        cols = Arg("scratch", 0)
        dims = {"c": k, "kh": kh, "kw": kw, "h": h, "w": w, "oh": oh, "ow": ow, "sh": strides[0], "sw": strides[1],
                "dh": dilations[0], "dw": dilations[1], "bh": begin[0], "bw": begin[1], "has_bias": int(bias != NULL),
                "task": 0, "tasks": 1}

        def tasks(count: int) -> list[tuple[int, ...]] | None:
            if count < 2 or k < count or k * oh * ow < PARALLEL_ELEMENTS:
                return None
            return [tuple({**dims, "task": t, "tasks": count}[d] for d in COL2IM_DIMS) for t in range(count)]

        calls = []
        for i in range(n):
            calls.append(sgemm_call((sources[1], sources[0].at(4 * i * c * pixels), cols, *_blas(), NULL,
                                     *_blas("sgemv")), group, rows, pixels, depth, "convtranspose sgemm",
                                    trans_a=True, lda=rows, ldb=pixels, ldc=pixels,
                                    strides=(depth * rows, depth * pixels, rows * pixels)))
            calls.append(Call(native_function("md_col2im"), (cols, bias, out.at(4 * i * k * oh * ow)),
                              tuple(dims[d] for d in COL2IM_DIMS), "convtranspose col2im", tasks))
        return NativeStep(tuple(calls), (group * rows * pixels * 4,))

    return needing(lower, "md_sgemm", "md_col2im")


__all__ = ["convtranspose_kernel", "convtranspose_lowering"]
