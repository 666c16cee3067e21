"""The structure key of a kernel's body: what decides its code, so that bodies with the same
key share one compiled kernel (BERT's twelve layers, a model's same-shaped epilogues)."""

from __future__ import annotations

import hashlib
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


def structure_key(body: Any) -> str:
    """Everything that decides a kernel's code, as text: ops, attributes, dtypes, symbolic
    shapes (symbols renamed in order of appearance) and the constants' bytes (a digest).

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

    def ref(v: Any) -> str:
        if v is None:
            return "_"
        if id(v) not in ids:
            ids[id(v)] = len(ids)
            t = v.type
            text = f"{t.dtype.name if t else '?'}{_canonical_shape(t.shape if t else None, names)}"
            if v.const is not None:
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


__all__ = ["structure_key"]
