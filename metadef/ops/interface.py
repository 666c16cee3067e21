"""The interface layer of a meta-op: parameters, attributes and dtype constraints.

Example:
    >>> p = Param.parse("B?")
    >>> p.name, p.optional, p.type_var
    ('B', True, 'T')
    >>> sorted(d.name for d in parse_type_constraints("T in {float16, float32}")["T"])
    ['float16', 'float32']
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from metadef.core import dtypes as dt
from metadef.core.errors import AttributeError_, DSLSyntaxError

# --- parameters -----------------------------------------------------------------------

_PARAM = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*([?*]?)\s*(?::\s*([A-Za-z_][A-Za-z0-9_]*))?\s*$")


@dataclass(frozen=True)
class Param:
    """One input or output: ``"X"``, optional ``"B?"``, variadic ``"inputs*"``, typed ``"shape: int64"``.

    ``type_var`` is a type variable of the op's constraints (``T``) or a concrete dtype name.
    ``mixed``: the elements of a variadic parameter may each have their own dtype from the
    type variable's set (control flow's captured values, a fused group's inputs), instead of
    all binding it to one dtype.
    """

    name: str
    optional: bool = False
    variadic: bool = False
    type_var: str = "T"
    mixed: bool = False

    @staticmethod
    def parse(spec: str | Param) -> Param:
        if isinstance(spec, Param):
            return spec
        m = _PARAM.match(spec)
        if m is None:
            raise DSLSyntaxError(f"bad parameter spec {spec!r}: expected NAME, NAME?, NAME* or NAME: TYPE")
        return Param(m.group(1), m.group(2) == "?", m.group(2) == "*", m.group(3) or "T")

    def __str__(self) -> str:
        mark = "?" if self.optional else "*" if self.variadic else ""
        return f"{self.name}{mark}: {self.type_var}"


# --- attributes -----------------------------------------------------------------------

REQUIRED = object()
ATTR_KINDS = ("int", "float", "string", "ints", "floats", "strings", "tensor", "graph", "graphs")


@dataclass(frozen=True)
class AttrSpec:
    """An attribute's kind and default (``REQUIRED`` when it must be given; None: may be absent)."""

    kind: str
    default: Any = None
    doc: str = ""

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


def int_(default: Any = None) -> AttrSpec:
    """An integer attribute."""
    return AttrSpec("int", default)


def float_(default: Any = None) -> AttrSpec:
    """A float attribute."""
    return AttrSpec("float", default)


def string(default: Any = None) -> AttrSpec:
    """A string attribute."""
    return AttrSpec("string", default)


def ints(default: Any = None) -> AttrSpec:
    """A list-of-ints attribute."""
    return AttrSpec("ints", default if default is None or default is REQUIRED else tuple(default))


def floats(default: Any = None) -> AttrSpec:
    """A list-of-floats attribute."""
    return AttrSpec("floats", default if default is None or default is REQUIRED else tuple(default))


def strings(default: Any = None) -> AttrSpec:
    """A list-of-strings attribute."""
    return AttrSpec("strings", default if default is None or default is REQUIRED else tuple(default))


def tensor_(default: Any = None) -> AttrSpec:
    """A tensor attribute (a numpy array)."""
    return AttrSpec("tensor", default)


def graph_(default: Any = None) -> AttrSpec:
    """A subgraph attribute (control flow)."""
    return AttrSpec("graph", default)


def _coerce(kind: str, value: Any) -> Any:
    if kind == "int":
        if isinstance(value, (bool, int, np.integer)):
            return int(value)
    elif kind == "float":
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
            return float(value)
    elif kind == "string":
        if isinstance(value, bytes):
            return value.decode()
        if isinstance(value, str):
            return value
    elif kind == "ints":
        if isinstance(value, (list, tuple, np.ndarray)) and all(
                isinstance(v, (int, np.integer)) for v in value):
            return tuple(int(v) for v in value)
    elif kind == "floats":
        if isinstance(value, (list, tuple, np.ndarray)):
            return tuple(float(v) for v in value)
    elif kind == "strings":
        if isinstance(value, (list, tuple)):
            return tuple(v.decode() if isinstance(v, bytes) else str(v) for v in value)
    elif kind == "tensor":
        if isinstance(value, np.ndarray):
            return value
    else:  # graph(s): checked by the IR
        return value
    raise TypeError(kind)


def resolve_attrs(op_name: str, where: str, specs: Mapping[str, AttrSpec],
                  given: Mapping[str, Any]) -> dict[str, Any]:
    """Check given attributes against the specs and fill in defaults.

    Raises AttributeError_ naming the op, the node and the attribute for an unknown, missing or
    ill-typed attribute.
    """
    out: dict[str, Any] = {}
    for name, value in given.items():
        spec = specs.get(name)
        if spec is None:
            known = ", ".join(sorted(specs)) or "none"
            raise AttributeError_(f"{op_name} {where}: unknown attribute {name!r} "
                                  f"(known attributes: {known})")
        try:
            out[name] = _coerce(spec.kind, value)
        except TypeError:
            raise AttributeError_(f"{op_name} {where}: attribute {name!r} must be of kind {spec.kind}, "
                                  f"got {type(value).__name__} {value!r}") from None
    for name, spec in specs.items():
        if name in out:
            continue
        if spec.required:
            raise AttributeError_(f"{op_name} {where}: required attribute {name!r} ({spec.kind}) is missing")
        out[name] = spec.default
    return out


# --- dtype constraints ----------------------------------------------------------------

TYPE_GROUPS: dict[str, frozenset[dt.DType]] = {
    "float": frozenset({dt.FLOAT16, dt.BFLOAT16, dt.FLOAT32, dt.FLOAT64}),
    "float8": frozenset({dt.FLOAT8E4M3FN, dt.FLOAT8E4M3FNUZ, dt.FLOAT8E5M2, dt.FLOAT8E5M2FNUZ}),
    "sint": frozenset({dt.INT8, dt.INT16, dt.INT32, dt.INT64}),
    "uint": frozenset({dt.UINT8, dt.UINT16, dt.UINT32, dt.UINT64}),
    "int4": frozenset({dt.INT4, dt.UINT4}),
    "lowbit": frozenset({dt.INT2, dt.UINT2, dt.FLOAT4E2M1, dt.FLOAT6E2M3, dt.FLOAT6E3M2, dt.FLOAT8E8M0}),
    "bool": frozenset({dt.BOOL}),
    "string": frozenset({dt.STRING}),  # in no numeric group: an op takes strings only by name
}
TYPE_GROUPS["int"] = TYPE_GROUPS["sint"] | TYPE_GROUPS["uint"]
TYPE_GROUPS["signed"] = TYPE_GROUPS["float"] | TYPE_GROUPS["sint"]
TYPE_GROUPS["numeric"] = TYPE_GROUPS["float"] | TYPE_GROUPS["int"]
TYPE_GROUPS["all"] = (TYPE_GROUPS["numeric"] | TYPE_GROUPS["bool"] | TYPE_GROUPS["float8"]
                      | TYPE_GROUPS["int4"] | TYPE_GROUPS["lowbit"])

_CONSTRAINT = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s+in\s+\{([^}]*)\}\s*$")


def parse_type_constraints(text: str) -> dict[str, frozenset[dt.DType]]:
    """Parse ``"T in {float16, float32}; I in {int32, int64}"``; groups such as ``float``,
    ``int``, ``numeric`` and ``all`` name sets of dtypes (``all`` is every numeric and bool
    type; ``string`` must be named).
    """
    out: dict[str, frozenset[dt.DType]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        m = _CONSTRAINT.match(part)
        if m is None:
            raise DSLSyntaxError(f"bad type constraint {part!r}: expected 'T in {{float32, ...}}'")
        allowed: set[dt.DType] = set()
        for name in filter(None, (n.strip() for n in m.group(2).split(","))):
            allowed |= TYPE_GROUPS.get(name) or {dt.dtype(name)}
        out[m.group(1)] = frozenset(allowed)
    return out


@dataclass(frozen=True)
class Interface:
    """What an op takes and gives: parameters, attributes and dtype constraints."""

    inputs: tuple[Param, ...]
    outputs: tuple[Param, ...]
    attrs: Mapping[str, AttrSpec] = field(default_factory=dict)
    types: Mapping[str, frozenset[dt.DType]] = field(default_factory=dict)

    def allowed(self, type_var: str) -> frozenset[dt.DType] | None:
        """The dtypes a type variable admits (None: a concrete dtype name, not a variable)."""
        return self.types.get(type_var)


__all__ = [
    "ATTR_KINDS", "AttrSpec", "Interface", "Param", "REQUIRED", "TYPE_GROUPS", "float_",
    "floats", "graph_", "int_", "ints", "parse_type_constraints", "resolve_attrs", "string",
    "strings", "tensor_",
]
