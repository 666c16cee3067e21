"""The structure key of a kernel's body: what decides its code, so that bodies with the same
key share one compiled kernel (BERT's twelve layers, a model's same-shaped epilogues)."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from typing import Any

import numpy as np

from metadef.shape import Dim, free_symbols, substitute, sym


def _canonical_shape(shape: tuple[Dim, ...] | None, names: dict[str, str]) -> str:
    if shape is None:
        return "?"
    dims = []
    for d in shape:
        for s in sorted(free_symbols(d)) if not isinstance(d, int) else ():
            names.setdefault(s, f"s{len(names)}")
        dims.append(str(d if isinstance(d, int) else substitute(d, {k: sym(v) for k, v in names.items()})))
    return "[" + ",".join(dims) + "]"


def runtime_scalars(body: Any) -> set[int]:
    """The ids of ``body``'s inputs holding a one-element constant that every reader reads at
    run time (:attr:`~metadef.ops.strategy.Strategy.passed`: a quantized model's scales and zero
    points, different at every layer, folding into nothing): the kernel reads them through the
    pointer it is passed, and same-shaped layers share one kernel (a QDQ BERT compiled 156
    kernels in 5.6 s).

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph('''graph g(%x: f32[n], %s: f32[]) -> (%y) {
        ...   %y: u8[n] = QuantizeLinear(%x, %s) return %y }''')
        >>> g.inputs[1].const = np.float32(0.5)
        >>> runtime_scalars(g) == {id(g.inputs[1])}
        True
    """
    uses: dict[int, list[bool]] = defaultdict(list)
    for n in body.nodes:
        for i, v in enumerate(n.inputs):
            if v is not None:
                uses[id(v)].append(i in n.metaop.strategy.passed)
    outputs = {id(v) for v in body.outputs}
    return {id(v) for v in body.inputs
            if v.const is not None and np.size(v.const) == 1 and uses.get(id(v)) and id(v) not in outputs
            and all(uses[id(v)])}


def structure_key(body: Any) -> str:
    """Everything that decides a kernel's code, as text: ops, attributes, dtypes, symbolic
    shapes (symbols renamed in order of appearance) and the constants' bytes (a digest; not
    those of :func:`runtime_scalars`, which the kernel reads at run time).

    Example:
        >>> from metadef.ir import parse_graph
        >>> a = parse_graph("graph g(%x: f32[n,3]) -> (%y) { %y: f32[n,3] = Relu(%x) return %y }")
        >>> b = parse_graph("graph g(%z: f32[batch,3]) -> (%w) { %w: f32[batch,3] = Relu(%z) return %w }")
        >>> structure_key(a) == structure_key(b)
        True
    """
    names: dict[str, str] = {}
    ids: dict[int, int] = {}
    parts = []
    passed = runtime_scalars(body)

    def ref(v: Any) -> str:
        if v is None:
            return "_"
        if id(v) not in ids:
            ids[id(v)] = len(ids)
            t = v.type
            text = f"{t.dtype.name if t else '?'}{_canonical_shape(t.shape if t else None, names)}"
            if v.const is not None and id(v) not in passed:
                text += "=" + hashlib.sha1(np.ascontiguousarray(v.const).tobytes()).hexdigest()
            parts.append(f"v{ids[id(v)]}:{text}")
        return f"v{ids[id(v)]}"

    for v in body.inputs:
        ref(v)
    parts.append("|")
    for n in body.nodes:
        attrs = sorted((k, repr(a)) for k, a in n.attrs.items())
        ins = ",".join(ref(v) for v in n.inputs)
        outs = ",".join(ref(v) for v in n.outputs)
        parts.append(f"{n.domain}::{n.op}({ins})->{outs}{attrs}")
    parts.append("->" + ",".join(ref(v) for v in body.outputs))
    return "\n".join(parts)


__all__ = ["runtime_scalars", "structure_key"]
