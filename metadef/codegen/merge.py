"""A reduction over neighbouring whole axes as one loop: ``sum[h, w] x[n, c, h, w]`` becomes
``sum[hw] x[n, c, hw]`` over the ``h*w`` contiguous elements.

Two nested reduction loops over ``56 x 56`` pixels were fully unrolled inside (56 is a
literal), and LLVM then vectorized the outer loop with gathers 56 floats apart:
InstanceNormalization over ``[8, 64, 56, 56]`` ran 6.5x ONNX Runtime's time. One loop of 3136
contiguous elements is a plain vector loop. Two variables merge where every read of them is
whole adjacent axes of their full lengths, in order (``x[.., u, v, ..]`` with ``dim == extent``,
both axes in bounds by construction); any other use (a window ``p + r``, an index read as a
value, a broadcast decided at run time) keeps the loops apart.

Example:
    >>> import numpy as np
    >>> from metadef.codegen.exprs import Axis, Lin, Load, Reduce
    >>> x = Load(0, (Axis(Lin.var("n"), 8, "plain"), Axis(Lin.var("h"), 7, "plain"),
    ...              Axis(Lin.var("w"), 7, "plain")), np.dtype("float32"))
    >>> r = merge_reduce_axes(Reduce("sum", ("h", "w"), (7, 7), x, np.dtype("float32"), np.dtype("float32")))
    >>> r.vars, r.extents, [str(a.index) for a in r.body.axes], [a.dim for a in r.body.axes]
    (('h_w',), (49,), ['n', 'h_w'], [8, 49])
"""

from __future__ import annotations

from dataclasses import replace

from metadef.codegen.exprs import Axis, InBounds, IndexValue, Lin, Load, Node, Op, Reduce
from metadef.codegen.shapes import same
from metadef.shape import Dim, mul


def merge_reduce_axes(node: Reduce) -> Reduce:
    """``node`` with each pair of neighbouring variables that read only whole adjacent axes
    merged into one (see the module doc); ``node`` itself when none can be."""
    names, extents, body = list(node.vars), list(node.extents), node.body
    k = 0
    while k + 1 < len(names):
        merged_name = f"{names[k]}_{names[k + 1]}"
        merged = _merge(body, names[k], names[k + 1], extents[k], extents[k + 1], merged_name)
        if merged is None:
            k += 1
            continue
        names[k:k + 2] = [merged_name]
        extents[k:k + 2] = [mul(extents[k], extents[k + 1])]
        body = merged
    if len(names) == len(node.vars):
        return node
    return Reduce(node.op, tuple(names), tuple(extents), body, node.acc, node.dtype)


def _mentions(lin: Lin, names: tuple[str, str]) -> bool:
    return any(v in names for v in lin.variables)


def _merge_axes(axes: tuple[Axis, ...], u: str, v: str, eu: Dim, ev: Dim, name: str) -> tuple[Axis, ...] | None:
    """The axes with ``u``'s and ``v``'s merged into one, or None where they are not whole
    adjacent axes; unchanged when neither appears."""
    used = [i for i, a in enumerate(axes) if a.mode != "zero" and _mentions(a.index, (u, v))]
    if not used:
        return axes
    if len(used) != 2 or used[1] != used[0] + 1:
        return None
    outer, inner = axes[used[0]], axes[used[1]]
    if (outer.mode, inner.mode) != ("plain", "plain") or outer.index.bare != u or inner.index.bare != v \
            or not same(outer.dim, eu) or not same(inner.dim, ev):
        return None
    whole = Axis(Lin.var(name), mul(eu, ev), "plain")
    return (*axes[:used[0]], whole, *axes[used[1] + 1:])


def _merge(node: Node, u: str, v: str, eu: Dim, ev: Dim, name: str) -> Node | None:
    """``node`` reading variable ``name`` where it read ``u`` and ``v``, or None."""
    if isinstance(node, (Load, InBounds)):
        axes = _merge_axes(node.axes, u, v, eu, ev, name)
        return None if axes is None else replace(node, axes=axes)
    if isinstance(node, IndexValue):
        return None if _mentions(node.index, (u, v)) else node
    if isinstance(node, Op):
        args = [_merge(a, u, v, eu, ev, name) for a in node.args]
        return None if any(a is None for a in args) else replace(node, args=tuple(args))
    if isinstance(node, Reduce):
        body = _merge(node.body, u, v, eu, ev, name)
        return None if body is None else replace(node, body=body)
    return node  # a literal or a size


__all__ = ["merge_reduce_axes"]
