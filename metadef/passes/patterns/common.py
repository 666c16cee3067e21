"""What the recognition rules share: constant checks, the interior-use check, emission.

A recognized pattern becomes one node named after the root's scope
(``/encoder/layer.0/attention/self/MatMul_1`` -> ``/encoder/layer.0/attention/self/Attention``),
and the graph's opset import is raised to what the new op needs (``Gelu``: 20) when the op
is introduced, so that ``export_onnx`` writes a model ONNX Runtime accepts.

Example:
    >>> import numpy as np
    >>> from metadef.ir import Value
    >>> scalar(1.4142135623730951)(Value("c", None, np.array([1.4142135], np.float32)))
    True
    >>> scalar(2.0)(Value("c", None, np.array([2.0, 2.0], np.float32)))
    False
    >>> about(1 / 6)(0.16666667), about(1 / 6)(0.2)
    (True, False)
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

from metadef.core.errors import MetadefError
from metadef.ir import Node, Value
from metadef.ops import get_op
from metadef.rewrite import GraphEditor, Match, Refusal

RTOL = 1e-6
"""How close (relative) a constant must be to the value a pattern needs."""


def close(have: float, want: float) -> bool:
    """``have`` within :data:`RTOL` of ``want`` (exactly, when ``want`` is 0)."""
    return bool(abs(have - want) <= RTOL * abs(want))


def scalar(want: float | None = None) -> Callable[[Value], bool]:
    """A ``const(where=...)`` predicate: one element (any rank), equal to ``want`` within RTOL
    (any finite value when ``want`` is None)."""
    def check(v: Value) -> bool:
        c = v.const
        if c is None or np.size(c) != 1 or not np.issubdtype(np.asarray(c).dtype, np.floating):
            return False
        have = float(np.asarray(c).reshape(()))
        return bool(np.isfinite(have)) and (want is None or close(have, want))
    return check


def about(want: float) -> Callable[[Any], bool]:
    """An attribute predicate: a number within RTOL of ``want``."""
    return lambda have: have is not None and close(float(have), want)


def scalar_value(m: Match, name: str) -> float:
    """The float value of the one-element constant bound to ``name``."""
    return float(np.asarray(m.value(name).const).reshape(()))


def rank_of(v: Value) -> int | None:
    return None if v.type is None or v.type.shape is None else len(v.type.shape)


def escaping(m: Match, ed: GraphEditor, shared: Collection[str] = ()) -> Refusal | None:
    """Refuse when a value computed inside the match (other than the root's) is also read
    outside it; nodes bound to a name in ``shared`` may be (they are kept, not replaced)."""
    root = m.nodes[0]
    inside = {id(n) for n in m.nodes}
    allowed = {id(m.node(s)) for s in shared if m.has(s)}
    for n in m.nodes:
        if n is root or id(n) in allowed:
            continue
        for o in n.outputs:
            outside = sum(id(u) not in inside for u in ed.users(o)) + int(ed.is_output(o))
            if outside:
                return Refusal(f"%{o.name} has {ed.num_uses(o)} consumers ({outside} outside the pattern)")
    return None


def fused_name(root: Node, op: str) -> str:
    """``/scope/Add_1`` -> ``/scope/<op>``; a name without a scope gets ``<name>/<op>``."""
    scope = root.name.rsplit("/", 1)[0] if "/" in root.name else root.name
    return f"{scope}/{op}"


def require_opset(ed: GraphEditor, op: str, domain: str = "") -> None:
    """Raise the graph's opset import for ``domain`` to the first version that has ``op``."""
    key = "" if domain in ("", "ai.onnx") else domain
    since = get_op(op, domain).since[0]
    ed.graph.opset[key] = max(ed.graph.opset.get(key, since), since)


def emit(m: Match, ed: GraphEditor, op: str, inputs: Sequence[Value | None],
         attrs: dict[str, Any] | None = None, domain: str = "") -> Value | Refusal:
    """Add the one node replacing the match; refuse if it would not have the root's type."""
    root = m.nodes[0]
    old = root.outputs[0]
    try:
        y, = ed.add(op, inputs, attrs, name=fused_name(root, op), domain=domain, n_outputs=1)
    except MetadefError as e:
        return Refusal(f"{op} rejects the operands: {str(e).splitlines()[0]}")
    if old.type is not None and y.type != old.type:
        ed.remove(y.producer)
        return Refusal(f"the {op} would give {y.type}, the pattern gives {old.type}")
    require_opset(ed, op, domain)
    return y


__all__ = ["RTOL", "about", "close", "emit", "escaping", "fused_name", "rank_of", "require_opset",
           "scalar", "scalar_value"]
