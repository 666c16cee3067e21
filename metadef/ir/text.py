"""Parse the IR's text form (see ``ir.printer``) back into a Graph.

Large constants print without their data; pass it as ``constants={"w": array}``. Types are
taken as written (``types="check"`` re-infers and compares them; ``"infer"`` ignores them).

Example:
    >>> g = parse_graph('''
    ... graph tiny(%x: f32[batch,4]) -> (%y) {
    ...   %y: f32[batch,4] = Relu(%x) @relu
    ...   return %y
    ... }''')
    >>> print_graph(parse_graph(print_graph(g))) == print_graph(g)
    True
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from metadef.core.dtypes import dtype as lookup_dtype
from metadef.core.errors import DSLSyntaxError
from metadef.ir.builder import GraphBuilder
from metadef.ir.graph import Graph, Value
from metadef.ir.printer import print_graph
from metadef.ir.verify import verify
from metadef.shape import TensorType, parse_type

_TOKENS = re.compile(r"""
    (?P<ws>\s+|\#[^\n]*)
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<num>-?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d+|inf|nan)(?![A-Za-z_]))
  | (?P<type>[A-Za-z][A-Za-z0-9_]*\[[^\]]*\])
  | (?P<name>[A-Za-z0-9_./][A-Za-z0-9_./\-]*(?:::[A-Za-z0-9_.]+)?)
  | (?P<punct>->|[%@(){}\[\],:=<>!])
""", re.VERBOSE)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            m = _TOKENS.match(text, pos)
            if m is None:
                raise self._error_at(pos, f"unexpected character {text[pos]!r}")
            if m.lastgroup != "ws":
                self.toks.append((m.lastgroup or "", m.group(), pos))
            pos = m.end()
        self.toks.append(("end", "", len(text)))
        self.i = 0

    def _error_at(self, pos: int, what: str) -> DSLSyntaxError:
        line = self.text.count("\n", 0, pos) + 1
        start = self.text.rfind("\n", 0, pos) + 1
        end = self.text.find("\n", pos)
        src = self.text[start:end if end >= 0 else len(self.text)]
        return DSLSyntaxError(f"IR text, line {line}: {what}\n    {src}\n    {' ' * (pos - start)}^")

    def error(self, what: str) -> DSLSyntaxError:
        return self._error_at(self.toks[self.i][2], what)

    def peek(self, k: int = 0) -> tuple[str, str, int]:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def take(self, value: str | None = None, kind: str | None = None) -> str:
        tk, tv, _ = self.toks[self.i]
        if (value is not None and tv != value) or (kind is not None and tk != kind):
            raise self.error(f"expected {value or kind!r}, found {tv or 'end of text'!r}")
        self.i += 1
        return tv

    def ident(self) -> str:
        kind, text, _ = self.peek()
        if kind == "str":
            self.i += 1
            return json.loads(text)
        if kind in ("name", "num"):
            self.i += 1
            return text
        raise self.error(f"expected a name, found {text or 'end of text'!r}")

    def value_ref(self) -> str:
        self.take("%")
        return self.ident()

    def type_(self) -> TensorType | None:
        kind, text, _ = self.peek()
        if text == "?":
            self.i += 1
            return None
        if kind != "type":
            raise self.error(f"expected a type like f32[batch,4], found {text!r}")
        self.i += 1
        return parse_type(text)

    def attr_value(self) -> Any:
        kind, text, _ = self.peek()
        if kind == "num":
            self.i += 1
            return float(text) if any(c in text for c in ".eEn") else int(text)
        if kind == "str":
            self.i += 1
            return json.loads(text)
        if text == "[":
            self.i += 1
            items = []
            while self.peek()[1] != "]":
                items.append(self.attr_value())
                if self.peek()[1] == ",":
                    self.i += 1
            self.take("]")
            return items
        if kind == "name" and text == "tensor":
            self.i += 1
            self.take("<")
            t = self.type_()
            self.take(">")
            data = self.attr_value()
            assert t is not None
            return np.asarray(data, dtype=t.dtype.numpy).reshape(tuple(int(d) for d in t.shape or ()))
        raise self.error(f"cannot read attribute value {text!r} (subgraph attributes do not parse yet)")


def _coerce_list(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(v)
    return v


def parse_graph(text: str, constants: Mapping[str, np.ndarray] | None = None, *,
                types: str = "as_written") -> Graph:
    """Parse the text form into a Graph (see the module doc)."""
    p = _Parser(text)
    consts = dict(constants or {})
    p.take("graph")
    name = p.ident()
    b = GraphBuilder(name, infer=(types == "infer"))
    values: dict[str, Value] = {}
    p.take("(")
    while p.peek()[1] != ")":
        vname = p.value_ref()
        p.take(":")
        t = p.type_()
        values[vname] = b.input(vname, t)
        if p.peek()[1] == ",":
            p.i += 1
    p.take(")")
    p.take("->")
    p.take("(")
    out_names = []
    while p.peek()[1] != ")":
        out_names.append(p.value_ref())
        if p.peek()[1] == ",":
            p.i += 1
    p.take(")")
    p.take("{")
    while p.peek()[1] != "return":
        _statement(p, b, values, consts, types)
    p.take("return")
    while p.peek()[1] == "%":
        p.value_ref()
        if p.peek()[1] == ",":
            p.i += 1
    p.take("}")
    for n in out_names:
        if n not in values:
            raise DSLSyntaxError(f"IR text: graph output %{n} is never defined")
        b.output(values[n])
    g = b.build()
    if types == "check":
        verify(g, types=True, stage="parse_graph")
    return g


def _statement(p: _Parser, b: GraphBuilder, values: dict[str, Value],
               consts: dict[str, np.ndarray], types: str) -> None:
    decls: list[tuple[str, TensorType | None]] = []
    while True:
        vname = p.value_ref()
        p.take(":")
        decls.append((vname, p.type_()))
        if p.peek()[1] != ",":
            break
        p.i += 1
    p.take("=")
    if p.peek()[1] == "const":
        p.i += 1
        (vname, t), = decls
        if p.peek()[1] == "[":
            data = np.asarray(p.attr_value(), dtype=t.dtype.numpy if t else None)
            data = data.reshape(tuple(int(d) for d in (t.shape if t and t.shape is not None else data.shape)))
        elif vname in consts:
            data = np.asarray(consts[vname])
        else:
            raise p.error(f"constant %{vname} has no inline data and none was passed in constants=")
        if t is not None and lookup_dtype(t.dtype.name).numpy != data.dtype:
            data = data.astype(t.dtype.numpy)
        values[vname] = b.const(vname, data)
        return
    qual = p.take(kind="name")
    domain, op = qual.split("::", 1) if "::" in qual else ("", qual)
    p.take("(")
    inputs: list[Value | None] = []
    while p.peek()[1] != ")":
        if p.peek()[1] == "_":
            p.i += 1
            inputs.append(None)
        else:
            ref = p.value_ref()
            if ref not in values:
                raise p.error(f"%{ref} is used before it is defined")
            inputs.append(values[ref])
        if p.peek()[1] == ",":
            p.i += 1
    p.take(")")
    attrs: dict[str, Any] = {}
    if p.peek()[1] == "{":
        p.i += 1
        while p.peek()[1] != "}":
            key = p.ident()
            p.take("=")
            attrs[key] = _coerce_list(p.attr_value())
            if p.peek()[1] == ",":
                p.i += 1
        p.take("}")
    node_name = ""
    if p.peek()[1] == "@":
        p.i += 1
        node_name = p.ident()
    no_fuse = False
    if p.peek()[1] == "!":
        p.i += 1
        no_fuse = p.take("no_fuse") == "no_fuse"
    outs = b.node(op, inputs, attrs, name=node_name, domain=domain, outputs=[d[0] for d in decls],
                  types=None if types == "infer" else [d[1] for d in decls])
    if no_fuse:
        b.nodes[-1].meta["no_fuse"] = True
    for (vname, _t), v in zip(decls, outs):
        values[vname] = v


__all__ = ["parse_graph", "print_graph"]
