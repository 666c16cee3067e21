"""The graph section: a Graph to compact JSON bytes and back (docs/format.md, "Graph section").

Types are stored once each in a table and parsed once; values, ops and wiring are integer
lists, so CPython's C JSON decoder does the parsing and Python only builds the objects.
Constants are not stored here: each names a record of the tensor index, and the caller
supplies the Value for it (the reader's values map their data lazily from the file).

Example:
    >>> import numpy as np
    >>> from metadef.ir import parse_graph, print_graph
    >>> from metadef.ir.graph import Value
    >>> g = parse_graph('''graph g(%x: f32[b,2]) -> (%y) {
    ...   %w: f32[2] = const [1.0, 2.0]
    ...   %y: f32[b,2] = Add(%x, %w) @add
    ...   return %y
    ... }''')
    >>> data = encode_graph(g, {"w": 0})
    >>> back = decode_graph(data, lambda name, t, i: Value(name, t, g.constants[i].const))
    >>> print_graph(back) == print_graph(g)
    True
"""

from __future__ import annotations

import base64
import gc
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from metadef.core.dtypes import from_numpy, from_onnx
from metadef.core.errors import FormatError, MetadefError
from metadef.format.errors import CompatError, CorruptFileError
from metadef.ir.graph import Graph, Node, Value
from metadef.shape import ShapeEnv, SymbolInfo, TensorType, parse_type

ConstFactory = Callable[[str, TensorType | None, int], Value]

_BIG_POWER = re.compile(r"\^\s*\d{3,}")
_PLAIN = (int, float, str, bool)


# --- encoding ------------------------------------------------------------------------------
def encode_attr(value: Any, where: str) -> Any:
    """One attribute value as JSON data (see the spec's tags); CompatError when impossible.

    Example:
        >>> encode_attr((1, 2), "n"), encode_attr([1.5], "n"), encode_attr(float("inf"), "n")
        ([1, 2], {'$list': [1.5]}, {'$float': 'inf'})
    """
    if isinstance(value, (bool, int, str)) and not isinstance(value, np.generic):
        return value
    if isinstance(value, float) and not isinstance(value, np.generic):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, tuple):
        return [encode_attr(v, where) for v in value]
    if isinstance(value, list):
        return {"$list": [encode_attr(v, where) for v in value]}
    if isinstance(value, np.ndarray):
        arr = value if value.flags.c_contiguous else value.copy(order="C")
        code = _onnx_code(arr.dtype, where)
        return {"$tensor": [code, list(arr.shape), base64.b64encode(_le_bytes(arr)).decode()]}
    if isinstance(value, np.generic):
        arr = np.asarray(value)
        return {"$scalar": [_onnx_code(arr.dtype, where), base64.b64encode(_le_bytes(arr)).decode()]}
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {"$dict": {str(k): encode_attr(v, where) for k, v in value.items()}}
    raise CompatError(f"{where}: attribute value of type {type(value).__name__} cannot be stored "
                      "in format 1.0 (subgraph attributes are not part of it yet)")


def _le_bytes(arr: np.ndarray) -> bytes:
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()


def _onnx_code(np_dtype: np.dtype, where: str) -> int:
    dt = from_numpy(np_dtype)
    if dt.is_string:
        raise CompatError(f"{where}: a string tensor cannot be stored in format 1.0 (its tensors hold "
                          "numbers); keep the model as ONNX")
    if not dt.onnx:
        raise CompatError(f"{where}: custom dtype {dt.name} has no code in format 1.0; "
                          "store it as a base dtype")
    return dt.onnx


def _number_values(graph: Graph) -> tuple[list[Value], dict[int, int]]:
    order: list[Value] = []
    ids: dict[int, int] = {}
    for v in [*graph.inputs, *graph.constants] + [o for n in graph.nodes for o in n.outputs]:
        if id(v) not in ids:
            ids[id(v)] = len(order)
            order.append(v)
    return order, ids


def _json_plain(obj: Any, where: str) -> Any:
    try:
        json.dumps(obj, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise CompatError(f"{where} must hold JSON values (str, number, bool, list, dict): {e}") from None
    return obj


def encode_graph(graph: Graph, tensor_records: Mapping[str, int]) -> bytes:
    """The graph section's bytes; ``tensor_records`` maps each constant's name to its index record."""
    values, ids = _number_values(graph)
    types: dict[str, int] = {}
    strings: dict[str, int] = {}

    def type_id(t: TensorType | None) -> int:
        return types.setdefault("" if t is None else str(t), len(types))

    def string_id(s: str) -> int:
        return strings.setdefault(s, len(strings))

    def ref(v: Value | None, where: str) -> int:
        if v is None:
            return -1
        if id(v) not in ids:
            raise FormatError(f"{where} reads %{v.name}, which no input, constant or node of graph "
                              f"{graph.name} defines: verify the graph before saving it")
        return ids[id(v)]

    nodes = []
    for n in graph.nodes:
        where = f"node {n.name or '?'} ({n.qualop})"
        attrs = {k: encode_attr(v, f"{where} attribute {k!r}") for k, v in n.attrs.items()} or None
        nodes.append([string_id(n.op), string_id(n.domain), n.name,
                      [ref(v, where) for v in n.inputs], [ids[id(o)] for o in n.outputs],
                      attrs, _json_plain(n.meta, f"{where} meta") or None])
    doc = {
        "format": "mdef-graph", "name": graph.name, "opset": dict(graph.opset),
        "metadata": _json_plain(graph.metadata, f"graph {graph.name} metadata"),
        "symbols": [[s.name, s.lo, s.hi, s.multiple_of]  # sorted: the env's order follows set order
                    for s in sorted(graph.env.symbols.values(), key=lambda s: s.name)],
        "values": [[v.name, type_id(v.type)] for v in values],
        "inputs": [ids[id(v)] for v in graph.inputs],
        "outputs": [ref(v, "graph output") for v in graph.outputs],
        "constants": [[ids[id(v)], tensor_records[v.name]] for v in graph.constants],
        "nodes": nodes,
    }
    doc["types"] = [t or None for t in types]
    doc["strings"] = list(strings)
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


# --- decoding ------------------------------------------------------------------------------
def decode_attr(data: Any) -> Any:
    """The inverse of :func:`encode_attr`.

    Example:
        >>> decode_attr([1, [2, 3]]), decode_attr({"$list": [1]})
        ((1, (2, 3)), [1])
    """
    if isinstance(data, list):
        return tuple(decode_attr(v) for v in data)
    if not isinstance(data, dict):
        return data
    (tag, body), = data.items()
    if tag == "$list":
        return [decode_attr(v) for v in body]
    if tag == "$float":
        return float({"nan": "nan", "inf": "inf", "-inf": "-inf"}[body])
    if tag == "$tensor":
        code, shape, b64 = body
        dt = from_onnx(code).numpy.newbyteorder("<")
        return np.frombuffer(base64.b64decode(b64), dt).reshape(shape).astype(dt.newbyteorder("="))
    if tag == "$scalar":
        code, b64 = body
        dt = from_onnx(code).numpy.newbyteorder("<")
        return np.frombuffer(base64.b64decode(b64), dt)[0]
    if tag == "$bytes":
        return base64.b64decode(body)
    if tag == "$dict":
        return {k: decode_attr(v) for k, v in body.items()}
    raise ValueError(f"unknown attribute tag {tag!r}")


def _parse_types(texts: list[Any]) -> list[TensorType | None]:
    out: list[TensorType | None] = []
    for t in texts:
        if t is None:
            out.append(None)
            continue
        if not isinstance(t, str) or len(t) > 4096 or _BIG_POWER.search(t):
            raise ValueError(f"bad type text {str(t)[:80]!r}")
        out.append(parse_type(t))
    return out


def decode_graph(data: bytes | memoryview, make_const: ConstFactory, *, offset: int = 0) -> Graph:
    """A Graph from graph-section bytes; ``make_const(name, type, record)`` supplies constants.

    A malformed section raises CorruptFileError naming ``offset`` (the section's place in the file).
    """
    collecting = gc.isenabled()
    gc.disable()  # thousands of small objects: a collection pass in the middle only costs time
    try:
        doc = json.loads(bytes(data))
        if not isinstance(doc, dict) or doc.get("format") != "mdef-graph":
            raise ValueError("it is not an mdef-graph JSON object")
        return _build(doc, make_const)
    except FormatError:
        raise
    except (MetadefError, KeyError, IndexError, TypeError, ValueError, AttributeError,
            RecursionError, UnicodeDecodeError) as e:
        raise CorruptFileError(f"the graph section at offset {offset} is malformed ({type(e).__name__}: "
                               f"{str(e)[:200]}); the file is damaged: write it again") from None
    finally:
        if collecting:
            gc.enable()


def _build(doc: dict[str, Any], make_const: ConstFactory) -> Graph:
    types = _parse_types(doc["types"])
    strings: list[str] = doc["strings"]
    const_records = {vid: rec for vid, rec in doc["constants"]}
    values: list[Value] = []
    for i, (name, tid) in enumerate(doc["values"]):
        if not isinstance(name, str):
            raise TypeError(f"value {i} has a name of type {type(name).__name__}")
        t = types[_check_index(tid, len(types))]
        values.append(make_const(name, t, const_records[i]) if i in const_records else Value(name, t))
    by_id: dict[int, Value | None] = dict(enumerate(values))
    by_id[-1] = None  # an omitted optional input
    ref = by_id.__getitem__  # a KeyError for anything that is not a value id
    nodes = []
    for op, domain, name, ins, outs, attrs, meta in doc["nodes"]:
        outputs = tuple(map(ref, outs))
        if None in outputs:
            raise ValueError(f"node {name!r} has an omitted output")
        node = Node(strings[_check_index(op, len(strings))], tuple(map(ref, ins)), outputs,
                    {k: v if type(v) in _PLAIN else decode_attr(v) for k, v in attrs.items()} if attrs else {},
                    str(name), strings[_check_index(domain, len(strings))], dict(meta) if meta else {})
        for o in outputs:
            o.producer = node
        nodes.append(node)
    env = ShapeEnv({s[0]: SymbolInfo(str(s[0]), int(s[1]), None if s[2] is None else int(s[2]), int(s[3]))
                    for s in doc["symbols"]})
    inputs, outputs = list(map(ref, doc["inputs"])), list(map(ref, doc["outputs"]))
    if None in inputs or None in outputs:
        raise ValueError("a graph input or output refers to value -1")
    return Graph(str(doc["name"]), inputs, outputs, nodes, [values[_check_index(v, len(values))]
                 for v, _ in doc["constants"]],
                 {str(k): int(v) for k, v in doc["opset"].items()}, env, dict(doc["metadata"]))


def _check_index(i: Any, n: int) -> int:
    if type(i) is not int or not 0 <= i < n:
        raise IndexError(f"reference {i!r} is outside 0..{n - 1}")
    return i


__all__ = ["decode_attr", "decode_graph", "encode_attr", "encode_graph"]
