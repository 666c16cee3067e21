"""Writing .mdef files (docs/format.md): ``save_graph`` and ``write_compat``.

The file is written to a temporary name in the target directory, flushed to disk and renamed,
so a crash or an error never leaves a half-written file under the real name.

Example:
    >>> import tempfile, pathlib
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph('''graph g(%x: f32[b,2]) -> (%y) {
    ...   %w: f32[2] = const [1.0, 2.0]
    ...   %y: f32[b,2] = Add(%x, %w)
    ...   return %y
    ... }''')
    >>> path = save_graph(g, pathlib.Path(tempfile.mkdtemp()) / "g.mdef")
    >>> path.read_bytes()[:4], path.read_bytes()[-4:]
    (b'MDEF', b'MDEF')
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from metadef.core.dtypes import from_numpy
from metadef.core.errors import FormatError
from metadef.format import layout
from metadef.format.compat import SaveOptions, check_version
from metadef.format.errors import CompatError
from metadef.format.graph_codec import encode_graph
from metadef.format.quantize import EncodedTensor
from metadef.ir.graph import Graph, Value

METADATA_KEYS = ("hardware", "parameters", "auxiliary", "namespaces")


@dataclass
class _Tensor:
    name: str
    array: np.ndarray
    code: int
    shape: tuple[int, ...] = ()
    format: int = 0
    flags: int = 0
    offset: int = 0
    checksum: int = 0


def execution_order(graph: Graph) -> list[Value]:
    """Constants in the order nodes first read them, then those no node reads.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph('''graph g(%x: f32[2]) -> (%y) {
        ...   %a: f32[2] = const [1.0, 2.0]
        ...   %b: f32[2] = const [3.0, 4.0]
        ...   %t: f32[2] = Add(%x, %b)
        ...   %y: f32[2] = Add(%t, %a)
        ...   return %y
        ... }''')
        >>> [v.name for v in execution_order(g)]
        ['b', 'a']
    """
    consts = {id(v): v for v in graph.constants}
    order: dict[int, Value] = {}
    for n in graph.nodes:
        for v in n.inputs:
            if v is not None and id(v) in consts and id(v) not in order:
                order[id(v)] = v
    for v in graph.constants:
        order.setdefault(id(v), v)
    return list(order.values())


def _tensors(graph: Graph, encodings: Mapping[str, EncodedTensor]) -> list[_Tensor]:
    out = []
    seen: set[str] = set()
    for v in execution_order(graph):
        if v.name in seen:
            raise FormatError(f"graph {graph.name} has two constants named {v.name!r}; names must be unique")
        seen.add(v.name)
        arr = np.asarray(v.const)
        arr = arr if arr.flags.c_contiguous else arr.copy(order="C")  # (ascontiguousarray makes 0-d 1-d)
        dt = from_numpy(arr.dtype)
        if not dt.onnx:
            raise CompatError(f"constant {v.name!r} has custom dtype {dt.name}, which format 1.0 cannot "
                              "store; convert it to a base dtype first")
        if dt.is_string:
            raise CompatError(f"constant {v.name!r} is a string tensor {list(arr.shape)}, which format 1.0 "
                              "cannot store (its tensors hold numbers); feed it as a graph input instead, "
                              "or keep the model as ONNX")
        if arr.ndim > layout.MAX_RANK:
            raise CompatError(f"constant {v.name!r} has rank {arr.ndim}; format 1.0 holds at most {layout.MAX_RANK}")
        enc = encodings.get(v.name)
        if enc is not None:  # a weight in a quantized / pruned format: its bytes, its logical shape
            out.append(_Tensor(v.name, np.frombuffer(enc.blob, np.uint8), dt.onnx, arr.shape, enc.format, enc.flags))
            continue
        out.append(_Tensor(v.name, arr.astype(arr.dtype.newbyteorder("<"), copy=False), dt.onnx, arr.shape))
    return out


def _layout_tensors(tensors: list[_Tensor], start: int, alignment: int) -> int:
    """Assign absolute offsets from ``start``; returns the end of the data."""
    pos = start
    for t in tensors:
        pos = layout.align_up(pos, alignment)
        t.offset = pos
        pos += t.array.nbytes
    return pos


def _index_bytes(tensors: list[_Tensor], alignment: int) -> bytes:
    records = np.zeros(len(tensors), layout.INDEX_DTYPE)
    dims: list[int] = []
    names = bytearray()
    for i, t in enumerate(tensors):
        raw = t.name.encode()
        records[i] = (t.offset, t.array.nbytes, t.checksum, len(names), len(raw), len(dims),
                      t.code, len(t.shape), t.format, t.flags, 0)
        names += raw
        dims.extend(t.shape)
    return (layout.pack_index_head(len(tensors), len(dims), alignment) + records.tobytes()
            + np.asarray(dims, "<u8").tobytes() + bytes(names))


def _json(obj: Any, where: str) -> bytes:
    try:
        return json.dumps(obj, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        raise FormatError(f"metadata layer {where!r} must hold JSON values only: {e}") from None


def _check_metadata(metadata: Mapping[str, Any]) -> None:
    for key, value in metadata.items():
        if key not in METADATA_KEYS:
            raise FormatError(f"unknown metadata key {key!r}; the layers are {', '.join(METADATA_KEYS)}")
        if not isinstance(value, dict):
            raise FormatError(f"metadata[{key!r}] must be a dict, got {type(value).__name__}")
    for name, body in metadata.get("namespaces", {}).items():
        if not isinstance(body, dict):
            raise FormatError(f"custom namespace {name!r} must be a dict, got {type(body).__name__}")


def _io(values: list[Value]) -> list[dict[str, Any]]:
    return [{"name": v.name, "dtype": v.type.dtype.name if v.type else None,
             "shape": None if v.type is None or v.type.shape is None else [str(d) for d in v.type.shape]}
            for v in values]


def metadata_layers(graph: Graph, metadata: Mapping[str, Any], alignment: int) -> dict[str, dict[str, Any]]:
    """The four metadata layers: computed defaults with the caller's keys merged over them."""
    weight_bytes = int(sum(v.const.nbytes for v in graph.constants))
    dtypes = {from_numpy(v.const.dtype).name for v in graph.constants}
    dtypes |= {v.type.dtype.name for v in graph.inputs if v.type is not None}
    hardware = {"precision": sorted(dtypes), "min_memory_bytes": weight_bytes,
                "cpu_features": [], "devices": ["cpu"], **metadata.get("hardware", {})}
    summary = {"name": graph.name, "inputs": _io(graph.inputs), "outputs": _io(graph.outputs),
               "opset": dict(graph.opset), "ops": graph.op_counts(), "num_nodes": len(graph.nodes),
               "num_parameters": graph.num_parameters(),
               "symbols": {s.name: {"lo": s.lo, "hi": s.hi, "multiple_of": s.multiple_of}
                           for s in graph.env.symbols.values()}}
    parameters = {"order": "execution", "default": {"layout": "row-major", "quantization": None},
                  "tensors": {}, **metadata.get("parameters", {}), "alignment": alignment}
    auxiliary = {**metadata.get("auxiliary", {}), "namespaces": dict(metadata.get("namespaces", {}))}
    return {"hardware": hardware, "summary": summary, "parameters": parameters, "auxiliary": auxiliary}


def _small_sections(graph: Graph, tensors: list[_Tensor], metadata: Mapping[str, Any],
                    alignment: int, code: Mapping[str, bytes]) -> list[tuple[int, int, str, bytes]]:
    layers = metadata_layers(graph, metadata, alignment)
    graph_bytes = encode_graph(graph, {t.name: i for i, t in enumerate(tensors)})
    out = [(layout.HARDWARE, layout.REQUIRED, "hardware", _json(layers["hardware"], "hardware")),
           (layout.SUMMARY, 0, "summary", _json(layers["summary"], "summary")),
           (layout.PARAMETERS, layout.REQUIRED, "parameters", _json(layers["parameters"], "parameters")),
           (layout.AUXILIARY, 0, "auxiliary", _json(layers["auxiliary"], "auxiliary")),
           (layout.GRAPH, layout.REQUIRED, "graph", graph_bytes)]
    for target, blob in sorted(code.items()):
        name = f"code:{target}"
        if not name.isascii() or len(name) > 32:
            raise FormatError(f"code target {target!r} must be ASCII and at most 27 characters")
        out.append((layout.CODE, 0, name, bytes(blob)))
    return out


def _plan(graph: Graph, metadata: Mapping[str, Any], alignment: int, code: Mapping[str, bytes],
          encodings: Mapping[str, EncodedTensor] | None = None,
          ) -> tuple[list[layout.SectionEntry], list[bytes], list[_Tensor], int]:
    """Every section's entry and bytes (data excluded), the tensors placed, and the file length."""
    tensors = _tensors(graph, encodings or {})
    small = _small_sections(graph, tensors, metadata, alignment, code)
    n_sections = len(small) + 2
    pos = layout.HEADER_SIZE + n_sections * layout.SECTION_ENTRY_SIZE
    placed: list[tuple[int, int, str, bytes, int]] = []
    for type_id, flags, name, blob in small:
        pos = layout.align_up(pos, layout.SECTION_ALIGN)
        placed.append((type_id, flags, name, blob, pos))
        pos += len(blob)
    index_len = (layout.INDEX_HEAD_SIZE + len(tensors) * layout.INDEX_RECORD_SIZE
                 + 8 * sum(len(t.shape) for t in tensors) + sum(len(t.name.encode()) for t in tensors))
    index_offset = layout.align_up(pos, layout.SECTION_ALIGN)
    data_offset = layout.align_up(index_offset + index_len, alignment)
    data_end = _layout_tensors(tensors, data_offset, alignment)
    for t in tensors:
        t.checksum = layout.checksum(memoryview(t.array.reshape(-1)).cast("B"))
    index = _index_bytes(tensors, alignment)
    assert len(index) == index_len
    entries = [layout.SectionEntry(t, f, off, len(b), layout.checksum(b), n) for t, f, n, b, off in placed]
    entries.append(layout.SectionEntry(layout.TENSOR_INDEX, layout.REQUIRED, index_offset, index_len,
                                       layout.checksum(index), "tensors"))
    entries.append(layout.SectionEntry(layout.TENSOR_DATA, layout.REQUIRED | layout.NO_CHECKSUM, data_offset,
                                  data_end - data_offset, 0, "data"))
    blobs = [b for *_, b, _off in placed] + [index]
    file_length = layout.align_up(data_end, layout.SECTION_ALIGN) + layout.TRAILER_SIZE
    return entries, blobs, tensors, file_length


def _write_all(f: BinaryIO, graph: Graph, metadata: Mapping[str, Any], alignment: int,
               code: Mapping[str, bytes], version: tuple[int, int], encodings: Mapping[str, EncodedTensor]) -> None:
    entries, blobs, tensors, file_length = _plan(graph, metadata, alignment, code, encodings)
    table = b"".join(e.pack() for e in entries)
    header = layout.Header(version[0], version[1], 0, len(entries), layout.HEADER_SIZE, file_length,
                           layout.checksum(table))
    f.write(header.pack() + table)
    pos = layout.HEADER_SIZE + len(table)
    for entry, blob in zip(entries, blobs):
        f.write(bytes(entry.offset - pos) + blob)
        pos = entry.offset + len(blob)
    for t in tensors:
        f.write(bytes(t.offset - pos))
        if t.array.nbytes:
            f.write(memoryview(t.array.reshape(-1)).cast("B"))
        pos = t.offset + t.array.nbytes
    trailer_at = file_length - layout.TRAILER_SIZE
    index = entries[-2]
    f.write(bytes(trailer_at - pos) + layout.Trailer(index.offset, layout.HEADER_SIZE, file_length, *version).pack())


def _atomic_write(path: Path, write: Any) -> Path:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _with_weight_formats(meta: dict[str, Any], encodings: Mapping[str, EncodedTensor]) -> None:
    """The hardware layer's ``weight_formats`` belongs to the writer too: the sorted storage
    schemes of the encoded weights (``["int8"]``), absent when every weight is stored as it is,
    so that a reader can tell the precision variants of one model apart (``load_best``)."""
    hardware = dict(meta.get("hardware", {}))
    hardware.pop("weight_formats", None)
    schemes = sorted({enc.params.get("quantization", {}).get("scheme", "plain")
                      for enc in encodings.values()} - {"plain"})
    if schemes:
        hardware["weight_formats"] = schemes
    if hardware or "hardware" in meta:
        meta["hardware"] = hardware


def _with_quantization(meta: dict[str, Any], graph: Graph, encodings: Mapping[str, EncodedTensor]) -> None:
    """The parameter layer's per-tensor ``quantization`` slot belongs to the writer: set for each
    encoded tensor, removed for the others (a loaded, dequantized graph saves as plain)."""
    _with_weight_formats(meta, encodings)
    params = dict(meta.get("parameters", {}))
    tensors = {k: dict(v) for k, v in params.get("tensors", {}).items() if isinstance(v, dict)}
    if not encodings and not any("quantization" in v for v in tensors.values()):
        return
    names = {v.name for v in graph.constants}
    for name in list(tensors):
        tensors[name].pop("quantization", None)
        if not tensors[name]:
            del tensors[name]
    for name, enc in encodings.items():
        if name not in names:
            raise FormatError(f"an encoding names {name!r}, which is not a constant of graph {graph.name}")
        tensors.setdefault(name, {}).update(enc.params)
    meta["parameters"] = {**params, "tensors": tensors}


def section_sizes(graph: Graph, *, metadata: Mapping[str, Any] | None = None,
                  alignment: int = layout.DEFAULT_ALIGNMENT, code: Mapping[str, bytes] | None = None,
                  encodings: Mapping[str, EncodedTensor] | None = None) -> dict[str, int]:
    """Bytes per section (and ``"file"``) that ``save_graph`` would write, without writing.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: f32[2]) -> (%y) { %y: f32[2] = Relu(%x) return %y }")
        >>> sorted(section_sizes(g))[:3]
        ['auxiliary', 'data', 'file']
    """
    meta = dict(metadata or {})
    _check_metadata(meta)
    _with_quantization(meta, graph, encodings or {})
    entries, _blobs, _tensors, file_length = _plan(graph, meta, alignment, dict(code or {}), encodings)
    return {**{e.name: e.length for e in entries}, "file": file_length}


def save_graph(graph: Graph, path: str | os.PathLike[str], *, metadata: Mapping[str, Any] | None = None,
               alignment: int = layout.DEFAULT_ALIGNMENT, version: tuple[int, int] = layout.FORMAT_VERSION,
               code: Mapping[str, bytes] | None = None,
               encodings: Mapping[str, EncodedTensor] | None = None) -> Path:
    """Write ``graph`` (with its weights) as one .mdef file and return its path.

    ``metadata`` holds the caller's part of the layers: ``{"hardware": {...}, "parameters":
    {...}, "auxiliary": {...}, "namespaces": {"my_app/v1": {...}}}``. ``alignment`` is 64 or
    4096 (any power of two from 8 to 65536). ``code`` maps a target name to precompiled bytes.
    ``encodings`` maps a constant's name to its stored form (``metadef.format.quantize``:
    float16, int8, int4, pruned); the others are stored as they are.
    See the module docstring for an example.
    """
    if not layout.valid_alignment(alignment):
        raise FormatError(f"alignment {alignment} is not a power of two from 8 to 65536 (use 64 or 4096)")
    meta = dict(metadata or {})
    _check_metadata(meta)
    encodings = dict(encodings or {})
    _with_quantization(meta, graph, encodings)
    options = SaveOptions(alignment, meta, dict(code or {}))
    check_version(graph, options, version)
    return _atomic_write(Path(path), lambda f: _write_all(f, graph, meta, alignment, options.code,
                                                          tuple(version), encodings))


def write_compat(graph: Graph, path: str | os.PathLike[str], version: tuple[int, int] = (1, 0),
                 **options: Any) -> Path:
    """Write an older format version (``--compat-backward=X.Y``); CompatError lists, by name,
    each feature of the model that X.Y cannot hold.

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: f32[2]) -> (%y) { %y: f32[2] = Relu(%x) return %y }")
        >>> write_compat(g, "/nonexistent/g.mdef", version=(0, 9))
        Traceback (most recent call last):
        ...
        metadef.format.errors.CompatError: cannot write format 0.9: this writer writes 1.0 to 1.0
    """
    return save_graph(graph, path, version=version, **options)


__all__ = ["METADATA_KEYS", "execution_order", "metadata_layers", "save_graph", "section_sizes", "write_compat"]
