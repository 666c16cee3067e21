"""The compact typed text form of the IR (printing; ``ir.text`` parses it back).

::

    graph tiny(%x: f32[batch,4]) -> (%y) {
      %w: f32[4,4] = const
      %y: f32[batch,4] = Relu(%x) @"/relu"
      %2: f32[batch,64,56,56] = Conv(%x, %w) {strides=[2,2]}
      return %y
    }

Names that are not plain (letters, digits, ``_ . / -``) are quoted: ``%"onnx::Add_3"``.
Constants of at most 16 elements are printed inline (``= const [1, 2]``) so they round-trip;
larger ones print as ``= const`` and their data travels beside the text.

Example:
    >>> quote_name("x"), quote_name("onnx::Add_3")
    ('x', '"onnx::Add_3"')
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import numpy as np

from metadef.core.dtypes import from_numpy

if TYPE_CHECKING:
    from metadef.ir.graph import Graph, Node, Value

_PLAIN = re.compile(r"^[A-Za-z0-9_./\-]+$")
INLINE_LIMIT = 16


def quote_name(name: str) -> str:
    """The name as it appears after ``%`` or ``@``: bare when plain, else JSON-quoted."""
    return name if _PLAIN.match(name) else json.dumps(name)


def format_attr(value: Any, indent: str = "  ") -> str:
    """One attribute value in text form."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if np.isfinite(value) else ("inf" if value > 0 else "-inf" if value < 0 else "nan")
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, np.ndarray):
        body = json.dumps(value.reshape(-1).tolist()) if value.size <= 64 else "..."
        return f"tensor<{from_numpy(value.dtype).short}{list(value.shape)}>{body}".replace(" ", "")
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_attr(v, indent) for v in value) + "]"
    if hasattr(value, "nodes") and hasattr(value, "inputs"):
        inner = print_graph(value).rstrip("\n").replace("\n", "\n" + indent)
        return inner
    return json.dumps(str(value))


def _value_decl(v: Value) -> str:
    return f"%{quote_name(v.name)}: {v.type if v.type is not None else '?'}"


def format_node(node: Node, indent: str = "  ") -> str:
    """One node: ``%y: f32[b,4] = Relu(%x) {alpha=0.1} @"name"``."""
    outs = ", ".join(_value_decl(o) for o in node.outputs)
    args = ", ".join("_" if v is None else f"%{quote_name(v.name)}" for v in node.inputs)
    attrs = ""
    shown = {k: v for k, v in node.attrs.items() if v is not None}
    if shown:
        attrs = " {" + ", ".join(f"{k}={format_attr(v, indent + '  ')}" for k, v in shown.items()) + "}"
    name = f" @{quote_name(node.name)}" if node.name else ""
    meta = ""
    if node.meta.get("no_fuse"):
        meta = " !no_fuse"
    return f"{outs} = {node.qualop}({args}){attrs}{name}{meta}"


def _const_line(v: Value) -> str:
    data = v.const
    if data is not None and data.size <= INLINE_LIMIT and data.dtype.kind in "biuf":
        return f"{_value_decl(v)} = const {json.dumps(data.reshape(-1).tolist())}"
    return f"{_value_decl(v)} = const"


def print_graph(graph: Graph) -> str:
    """The whole graph as text (see the module doc)."""
    ins = ", ".join(_value_decl(v) for v in graph.inputs)
    outs = ", ".join(f"%{quote_name(v.name)}" for v in graph.outputs)
    lines = [f"graph {quote_name(graph.name or 'main')}({ins}) -> ({outs}) {{"]
    lines += ["  " + _const_line(v) for v in graph.constants]
    lines += ["  " + format_node(n) for n in graph.nodes]
    lines.append(f"  return {outs}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def nearby(graph: Graph, node: Node, radius: int = 2) -> str:
    """The text of a node and its neighbours in order, for error messages."""
    idx = next((i for i, n in enumerate(graph.nodes) if n is node), None)
    if idx is None:
        return ""
    lo, hi = max(0, idx - radius), min(len(graph.nodes), idx + radius + 1)
    return "\n".join(("> " if i == idx else "  ") + format_node(graph.nodes[i]) for i in range(lo, hi))


__all__ = ["format_attr", "format_node", "nearby", "print_graph", "quote_name"]
