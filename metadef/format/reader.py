"""Reading .mdef files (docs/format.md): ``open_mdef`` maps a file and hands out zero-copy views.

Header, trailer, section table, metadata and tensor index are read and checked at open
(the index in place, as a numpy structured view: no per-tensor Python object until one is
asked for); the graph is decoded the first time it is asked for; tensor data stay in the
(read-only) mapping until used. Every offset, length, count and dimension is checked against
the file before it is used. A :class:`~metadef.format.loader.DynamicLoader` attached to the
file reads tensors ahead of their use on background threads.

Example:
    >>> import tempfile, pathlib, numpy as np
    >>> from metadef.ir import parse_graph
    >>> from metadef.format import save_graph
    >>> g = parse_graph('''graph g(%x: f32[b,2]) -> (%y) {
    ...   %w: f32[2] = const [1.0, 2.0]
    ...   %y: f32[b,2] = Add(%x, %w)
    ...   return %y
    ... }''')
    >>> path = save_graph(g, pathlib.Path(tempfile.mkdtemp()) / "g.mdef")
    >>> with open_mdef(path) as f:
    ...     f.tensor("w").tolist(), f.graph().nodes[0].op, f.version
    ([1.0, 2.0], 'Add', (1, 0))
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import os
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from metadef.core.dtypes import from_onnx
from metadef.core.errors import DTypeError, FormatError
from metadef.format import layout
from metadef.format.errors import (
    BadMagicError,
    ChecksumError,
    ClosedFileError,
    CorruptFileError,
    NotAnMdefFileError,
    TruncatedFileError,
    UnknownSectionError,
    VersionError,
)
from metadef.format.graph_codec import decode_graph
from metadef.format.quantize import decode_tensor, stored_nbytes
from metadef.format.records import MappedValue, TensorInfo, VerifyReport
from metadef.format.storage import FileBytes
from metadef.format.workers import parallel_map
from metadef.ir.graph import Graph, Value
from metadef.shape import TensorType

if TYPE_CHECKING:
    from metadef.format.loader import DynamicLoader

log = logging.getLogger("metadef.format")
ChecksumVerify = Literal["on_demand", "always", "never"]
_VERIFY_MODES = ("on_demand", "always", "never")
_JSON_LAYERS = {layout.HARDWARE: "hardware", layout.SUMMARY: "summary", layout.PARAMETERS: "parameters",
                layout.AUXILIARY: "auxiliary"}
_AGAIN = "the file is damaged: copy or write it again"


def _what_it_looks_like(head: bytes) -> str:
    hints = {b"PK\x03\x04": "a zip archive (a PyTorch .pt or a Keras file?)", b"\x08": "a protobuf (ONNX?)",
             b"\x80": "a Python pickle", b"GGUF": "a GGUF file", b"\x89HDF": "an HDF5 file"}
    for prefix, what in hints.items():
        if head.startswith(prefix):
            return f"; it looks like {what}"
    if len(head) >= 8 and int.from_bytes(head[:8], "little") < 1 << 32 and head[8:9] == b"{":
        return "; it looks like a safetensors file"
    return ""


FORGET_AFTER_CHECK = 1 << 20
"""A mapped tensor of at least this many bytes is unmapped from the process once its checksum
has been read (:meth:`~metadef.format.storage.FileBytes.forget`): checking every weight no
longer keeps the whole file in the RSS; its first use maps its pages again from the page
cache."""


class MdefFile:
    """An open .mdef file: metadata layers, the graph and lazily mapped tensors (see ``open_mdef``)."""

    def __init__(self, path: str | os.PathLike[str], *, checksum_verify: ChecksumVerify = "on_demand",
                 version_strict: bool = True, mmap_enabled: bool = True, threads: int = 1) -> None:
        if checksum_verify not in _VERIFY_MODES:
            raise ValueError(f"checksum_verify={checksum_verify!r}; choose one of {', '.join(_VERIFY_MODES)}")
        self.path = Path(path)
        self.checksum_verify = checksum_verify
        self.threads = max(1, int(threads))
        self._data = FileBytes.open(self.path, mmap_enabled)
        self._buf, self._mv = self._data.buf, self._data.mv
        self.mmapped, self.size = self._data.mmapped, self._data.size
        self._views: dict[int, np.ndarray] = {}
        self._infos: dict[int, TensorInfo] = {}
        self._rows: list[tuple[int, ...]] | None = None
        self._dim_list: list[int] = []
        self._verified: set[int] = set()
        self._graph: Graph | None = None
        self._graph_lock = threading.Lock()
        self._name_list: list[str] | None = None
        self._name_index: dict[str, int] | None = None
        self._loader: DynamicLoader | None = None
        self.open_report: VerifyReport | None = None
        try:
            self.header = self._check_header(version_strict)
            self.trailer = self._check_trailer()
            self.sections = self._check_sections()
            self._check_small_sections()
            self.layers = {name: self._json(t) for t, name in _JSON_LAYERS.items()}
            self._read_index()
            if checksum_verify == "always":
                self.open_report = self._verify_tensors(raise_on_failure=True)
                log.info("verified %s at open: %s", self.path, self.open_report)
        except BaseException:
            self._data.close()
            raise

    # --- header, trailer, sections --------------------------------------------------------
    def _check_header(self, version_strict: bool) -> layout.Header:
        size, mv = self.size, self._mv
        self._data.ensure(0, min(size, layout.HEADER_SIZE))  # (a private buffer is read range by range)
        self._data.ensure(max(0, size - layout.TRAILER_SIZE), min(size, layout.TRAILER_SIZE))
        head, tail = bytes(mv[:4]), bytes(mv[max(0, size - 4):])
        if head != layout.MAGIC and tail != layout.MAGIC:
            raise NotAnMdefFileError(f"{self.path} is not an .mdef file: it neither starts nor ends with "
                                     f"b'MDEF' (starts with {bytes(mv[:8])!r}){_what_it_looks_like(bytes(mv[:16]))}")
        if head != layout.MAGIC:
            raise BadMagicError(f"{self.path}: the magic at offset 0 is {head!r}, expected b'MDEF' (the "
                                f"trailing magic is intact): the header is damaged; {_AGAIN}")
        if size < layout.HEADER_SIZE + layout.TRAILER_SIZE:
            raise TruncatedFileError(f"{self.path} is {size} bytes, shorter than an .mdef header and trailer "
                                     f"({layout.HEADER_SIZE + layout.TRAILER_SIZE} bytes): it was cut off; {_AGAIN}")
        header = layout.Header.unpack(mv[:layout.HEADER_SIZE])
        if header.marker != layout.MARKER:
            raise BadMagicError(f"{self.path}: bytes 4..8 are {header.marker!r}, expected {layout.MARKER!r}: the file "
                                "went through a text-mode copy that rewrote line ends; copy it in binary mode")
        self._check_version(header.major, header.minor, version_strict)
        if self.checksum_verify != "never" and layout.checksum(mv[:56]) != header.header_checksum:
            raise ChecksumError(f"{self.path}: the header checksum (offset 56) does not match bytes 0..56; {_AGAIN}")
        if header.endianness != layout.LITTLE_ENDIAN or header.entry_size != layout.SECTION_ENTRY_SIZE:
            raise CorruptFileError(f"{self.path}: header says endianness {header.endianness} and section entries "
                                   f"of {header.entry_size} bytes; format 1.0 has 1 (little) and 64; {_AGAIN}")
        if header.file_length > size:
            raise TruncatedFileError(f"{self.path} is {size} bytes but its header (offset 32) says "
                                     f"{header.file_length}: the file was cut off (an interrupted copy or "
                                     "download?); copy it again")
        if header.file_length < size:
            raise CorruptFileError(f"{self.path} is {size} bytes but its header (offset 32) says "
                                   f"{header.file_length}: {size - header.file_length} unexpected bytes were "
                                   f"added at the end; {_AGAIN}")
        return header

    def _check_version(self, major: int, minor: int, version_strict: bool) -> None:
        have, mine = f"{major}.{minor}", f"{layout.FORMAT_VERSION[0]}.{layout.FORMAT_VERSION[1]}"
        if major > layout.FORMAT_VERSION[0] or major < 1:
            raise VersionError(f"{self.path} is format version {have}; this reader reads 1.0 to {mine}. "
                               "Upgrade metadef to read it, or write the file with --compat-backward=" + mine)
        if minor > layout.FORMAT_VERSION[1]:
            msg = (f"{self.path} is format version {have}, newer than this reader ({mine}); "
                   "upgrade metadef or write it with --compat-backward=" + mine)
            if version_strict:
                raise VersionError(msg + " (or open it with version_strict=False to read what this reader knows)")
            warnings.warn(msg + ": reading the parts this reader knows", stacklevel=3)
            log.warning("%s", msg)

    def _check_trailer(self) -> layout.Trailer:
        size, mv = self.size, self._mv
        if bytes(mv[size - 4:]) != layout.MAGIC:
            raise BadMagicError(f"{self.path}: the last four bytes (offset {size - 4}) are {bytes(mv[size - 4:])!r}, "
                                f"expected b'MDEF': the trailer is damaged; {_AGAIN}")
        at = size - layout.TRAILER_SIZE
        trailer = layout.Trailer.unpack(mv[at:])
        if self.checksum_verify != "never" and layout.checksum(mv[at:at + 24]) != trailer.trailer_checksum:
            raise ChecksumError(f"{self.path}: the trailer checksum (offset {at + 24}) does not match; {_AGAIN}")
        h = self.header
        if ((trailer.section_table_offset, trailer.file_length, trailer.major, trailer.minor)
                != (h.section_table_offset, h.file_length, h.major, h.minor)):
            raise CorruptFileError(f"{self.path}: the trailer (offset {at}) disagrees with the header about the "
                                   f"section table, length or version; {_AGAIN}")
        return trailer

    def _check_sections(self) -> list[layout.SectionEntry]:
        h, end = self.header, self.size - layout.TRAILER_SIZE
        table_end = h.section_table_offset + h.section_count * layout.SECTION_ENTRY_SIZE
        if h.section_table_offset < layout.HEADER_SIZE or table_end > end:
            raise CorruptFileError(f"{self.path}: the section table ({h.section_count} entries at offset "
                                   f"{h.section_table_offset}) does not fit in the file; {_AGAIN}")
        self._data.ensure(h.section_table_offset, table_end - h.section_table_offset)
        table = self._mv[h.section_table_offset:table_end]
        if self.checksum_verify != "never" and layout.checksum(table) != h.section_table_checksum:
            raise ChecksumError(f"{self.path}: the section table checksum (header offset 40) does not match the "
                                f"table at offset {h.section_table_offset}; {_AGAIN}")
        entries = [layout.SectionEntry.unpack(table[i:i + layout.SECTION_ENTRY_SIZE])
                   for i in range(0, len(table), layout.SECTION_ENTRY_SIZE)]
        known = []
        for e in entries:
            if e.offset < table_end or e.length > end - e.offset:
                raise CorruptFileError(f"{self.path}: section {e.name!r} (type {e.type_id}) claims bytes "
                                       f"{e.offset}..{e.offset + e.length}, outside {table_end}..{end}; {_AGAIN}")
            if e.type_id in layout.SECTION_NAMES:
                known.append(e)
            elif e.required:
                raise UnknownSectionError(f"{self.path} has a required section {e.name!r} (type {e.type_id}) "
                                          "that this reader does not know; upgrade metadef to read it")
        self._check_overlaps(known)
        return known

    def _check_overlaps(self, entries: list[layout.SectionEntry]) -> None:
        by_type = [e.type_id for e in entries if e.type_id in layout.SINGLETON_SECTIONS]
        if len(by_type) != len(set(by_type)):
            raise CorruptFileError(f"{self.path}: a section type appears twice in the section table; {_AGAIN}")
        for t in (layout.HARDWARE, layout.PARAMETERS, layout.GRAPH, layout.TENSOR_INDEX, layout.TENSOR_DATA):
            if t not in by_type:
                raise CorruptFileError(f"{self.path}: the required section {layout.SECTION_NAMES[t]!r} is missing; "
                                       + _AGAIN)
        ordered = sorted(entries, key=lambda e: e.offset)
        for a, b in itertools.pairwise(ordered):
            if a.end > b.offset:
                raise CorruptFileError(f"{self.path}: sections {a.name!r} and {b.name!r} overlap at offset "
                                       f"{b.offset}; {_AGAIN}")
        index = next(e for e in entries if e.type_id == layout.TENSOR_INDEX)
        if self.trailer.tensor_index_offset != index.offset:
            raise CorruptFileError(f"{self.path}: the trailer's tensor index offset disagrees with the section "
                                   f"table; {_AGAIN}")

    def _section(self, type_id: int) -> layout.SectionEntry:
        return next(e for e in self.sections if e.type_id == type_id)

    def _bytes(self, e: layout.SectionEntry) -> memoryview:
        self._data.ensure(e.offset, e.length)
        with self._data.using(f"section {e.name!r}"):
            return self._mv[e.offset:e.end]

    def _check_section(self, e: layout.SectionEntry) -> str | None:
        if e.flags & layout.NO_CHECKSUM or layout.checksum(self._bytes(e)) == e.checksum:
            return None
        return f"section {e.name!r} (type {e.type_id}) at offset {e.offset}, {e.length} bytes: checksum mismatch"

    def _check_small_sections(self) -> None:
        if self.checksum_verify == "never":
            return
        for e in self.sections:
            if e.type_id not in (layout.CODE, layout.TENSOR_DATA) and (why := self._check_section(e)):
                raise ChecksumError(f"{self.path}: {why}; {_AGAIN}")

    def _json(self, type_id: int) -> dict[str, Any]:
        e = next((e for e in self.sections if e.type_id == type_id), None)
        if e is None:
            return {}
        try:
            doc = json.loads(bytes(self._bytes(e)))
        except (ValueError, RecursionError) as err:
            raise CorruptFileError(f"{self.path}: section {e.name!r} at offset {e.offset} is not valid JSON "
                                   f"({err}); {_AGAIN}") from None
        if not isinstance(doc, dict):
            raise CorruptFileError(f"{self.path}: section {e.name!r} at offset {e.offset} is not a JSON object; "
                                   + _AGAIN)
        return doc

    # --- the tensor index -------------------------------------------------------------------
    def _read_index(self) -> None:
        e, data = self._section(layout.TENSOR_INDEX), self._section(layout.TENSOR_DATA)
        if e.length < layout.INDEX_HEAD_SIZE:
            raise CorruptFileError(f"{self.path}: the tensor index at offset {e.offset} is too short; {_AGAIN}")
        count, record_size, dims_count, alignment = layout.unpack_index_head(self._bytes(e))
        body = layout.INDEX_HEAD_SIZE + count * layout.INDEX_RECORD_SIZE + dims_count * 8
        if record_size != layout.INDEX_RECORD_SIZE or body > e.length or not layout.valid_alignment(alignment):
            raise CorruptFileError(f"{self.path}: the tensor index head at offset {e.offset} is malformed "
                                   f"({count} records of {record_size} bytes, {dims_count} dims, alignment "
                                   f"{alignment}, in {e.length} bytes); {_AGAIN}")
        self._bytes(e)  # (read into a private buffer, when the file is not mapped)
        at = e.offset + layout.INDEX_HEAD_SIZE
        self._records = np.frombuffer(self._buf, layout.INDEX_DTYPE, count, at)
        self._dims = np.frombuffer(self._buf, "<u8", dims_count, at + count * layout.INDEX_RECORD_SIZE)
        self._strings = bytes(self._mv[e.offset + body:e.end])
        self.alignment = alignment
        self._check_records(data)

    def _check_records(self, data: layout.SectionEntry) -> None:
        r = self._records
        off, n = r["data_offset"], r["byte_length"]
        bad = ((r["name_offset"].astype(np.uint64) + r["name_length"] > len(self._strings))
               | (r["dims_offset"].astype(np.uint64) + r["rank"] > len(self._dims))
               | (r["rank"] > layout.MAX_RANK) | (off < data.offset) | (n > data.length)
               | (off - np.minimum(off, data.offset) > data.length - n) | (off % self.alignment != 0))
        if bad.any():
            i = int(np.argmax(bad))
            at = self._section(layout.TENSOR_INDEX).offset + layout.INDEX_HEAD_SIZE + 48 * i
            raise CorruptFileError(f"{self.path}: tensor index record {i} (offset {at}) points "
                                   f"outside the file's names, dims or tensor data; {_AGAIN}")

    @property
    def _names(self) -> dict[str, int]:
        """Tensor name -> record, decoded from the string block the first time it is needed."""
        if self._name_index is None:
            strings = self._strings
            starts, lengths = self._records["name_offset"].tolist(), self._records["name_length"].tolist()
            try:
                names = [strings[a:a + n].decode() for a, n in zip(starts, lengths)]
            except UnicodeDecodeError:
                raise CorruptFileError(f"{self.path}: a tensor name is not UTF-8; {_AGAIN}") from None
            self._name_list, self._name_index = names, {name: i for i, name in enumerate(names)}
        return self._name_index

    def _name(self, i: int) -> str:
        if self._name_list is None:
            _ = self._names
        assert self._name_list is not None
        return self._name_list[i]

    def tensor_info(self, name: str) -> TensorInfo:
        """The checked index record of tensor ``name`` (KeyError when there is none)."""
        return self._info(self._index_of(name))

    def _index_of(self, name: str) -> int:
        if name not in self._names:
            near = ", ".join(sorted(self._names)[:5])
            raise KeyError(f"{self.path} has no tensor {name!r}; it has {len(self._names)} (e.g. {near})")
        return self._names[name]

    def _info(self, i: int) -> TensorInfo:
        """Record ``i``, checked, as a TensorInfo (made on first request, then kept)."""
        info = self._infos.get(i)
        if info is not None:
            return info
        if self._rows is None:  # the index as Python values, once, when a first tensor is asked for
            self._rows, self._dim_list = self._records.tolist(), self._dims.tolist()
        offset, length, check, _name_at, _name_len, dims_at, code, rank, fmt, flags, _ = self._rows[i]
        shape = tuple(self._dim_list[dims_at:dims_at + rank])
        try:
            dt = from_onnx(code)
        except DTypeError as e:
            raise CorruptFileError(f"{self.path}: tensor {self._name(i)!r} has dtype code {code}: {e}; "
                                   + _AGAIN) from None
        quant = None
        nbytes = math.prod(shape) * dt.itemsize
        if fmt or flags:  # a quantized or pruned weight: its parameters are in the parameter layer
            tensors = self.layers["parameters"].get("tensors")
            params = tensors.get(self._name(i)) if isinstance(tensors, dict) else None
            try:
                nbytes = stored_nbytes(shape, dt.numpy, fmt, flags, params)
            except FormatError as e:
                raise CorruptFileError(f"{self.path}: tensor {self._name(i)!r} (format {fmt}): {e}; {_AGAIN}") from None
            quant = params["quantization"]
        if nbytes != length:
            raise CorruptFileError(f"{self.path}: tensor {self._name(i)!r} has shape {list(shape)} of {dt.name} "
                                   f"({nbytes} bytes) but {length} bytes stored in format {fmt}; {_AGAIN}")
        info = self._infos[i] = TensorInfo(self._name(i), dt, shape, offset, nbytes, check, fmt, flags, quant)
        return info

    def _check_tensor(self, i: int) -> str | None:
        info = self._info(i)
        self._data.ensure(info.offset, info.nbytes)
        with self._data.using(f"tensor {info.name!r}"):
            ok = layout.checksum(self._mv[info.offset:info.offset + info.nbytes]) == info.checksum
        if ok:
            self._verified.add(i)
            if info.nbytes >= FORGET_AFTER_CHECK:  # mapped: its pages leave the RSS until it is used
                self._data.forget(info.offset, info.nbytes)
            return None
        return f"tensor {info.name!r} at offset {info.offset}, {info.nbytes} bytes: checksum mismatch"

    def _tensor_at(self, i: int) -> np.ndarray:
        view = self._views.get(i)
        if view is not None:
            return view
        data = self._data
        data.acquire(lambda: f"tensor {self._name(i)!r}")
        try:
            if self._loader is not None:
                self._loader.before_use(i)  # waits for (or takes over) its read; raises what it met
            info = self._info(i)
            if not data.mmapped:
                data.ensure(info.offset, info.nbytes)
            if self.checksum_verify != "never" and i not in self._verified and (why := self._check_tensor(i)):
                raise ChecksumError(f"{self.path}: {why}; {_AGAIN}")
            if info.format or info.flags:  # dequantized on first use, to the original dtype
                try:
                    view = decode_tensor(self._mv[info.offset:info.offset + info.nbytes], info.shape,
                                         info.dtype.numpy, info.format, info.flags,
                                         {"quantization": info.quantization})
                except FormatError as e:
                    raise CorruptFileError(f"{self.path}: tensor {info.name!r} at offset {info.offset}: {e}; "
                                           + _AGAIN) from None
            else:
                view = np.frombuffer(self._buf, info.dtype.numpy, info.nbytes // info.dtype.itemsize,
                                     info.offset).reshape(info.shape)
                view.flags.writeable = False
        finally:
            data.release()
        self._views[i] = view
        return view

    def _make_const(self, name: str, t: TensorType | None, record: int) -> Value:
        if type(record) is not int or not 0 <= record < len(self._records) or self._name(record) != name:
            raise CorruptFileError(f"{self.path}: constant %{name} points at tensor record {record!r}, which "
                                   f"does not hold it; {_AGAIN}")
        return MappedValue(name, t, lambda: self._tensor_at(record), self)

    def _verify_tensors(self, raise_on_failure: bool) -> VerifyReport:
        """Check every tensor, on ``self.threads`` threads (xxh3 releases the GIL on large
        buffers, so threads pay: see ``metadef.format.workers``)."""
        report, start = VerifyReport(), time.perf_counter()
        results = parallel_map(self._check_tensor, range(len(self._records)), self.threads)
        for why in results:
            if isinstance(why, BaseException):
                raise why
            if why and raise_on_failure:
                raise ChecksumError(f"{self.path}: {why}; {_AGAIN}")
            if why:
                report.failures.append(why)
        report.tensors = len(self._records)
        report.bytes = int(self._records["byte_length"].sum())
        report.seconds = time.perf_counter() - start
        return report

    def _prepare(self, i: int, verify: bool = False) -> str:
        """Bring tensor ``i``'s bytes in ahead of use (read into the private buffer, or
        ``madvise`` the mapping); with ``verify``, check its checksum instead when the mode
        asks and it is not checked yet (a ChecksumError if it fails). Thread-safe: the
        loader calls it from its threads. Returns what it did."""
        if self._data.closed:
            return "closed"
        if verify and self.checksum_verify != "never" and i not in self._verified:
            if why := self._check_tensor(i):
                raise ChecksumError(f"{self.path}: {why}; {_AGAIN}")
            return "verified"
        info = self._info(i)
        return self._data.populate(info.offset, info.nbytes)

    # --- the public face --------------------------------------------------------------------
    @property
    def version(self) -> tuple[int, int]:
        """The file's format version (major, minor)."""
        return (self.header.major, self.header.minor)

    def graph(self) -> Graph:
        """The graph, decoded the first time it is asked for; its constants map their data
        from the file on first use (through the attached loader, if any).

        The same Graph object is returned each call (passes return new graphs; do not edit it).
        """
        if self._graph is not None:
            return self._graph
        with self._graph_lock:
            if self._graph is None:
                if self._data.closed:
                    raise ClosedFileError(f"{self.path} is closed: its graph was never decoded; open it again")
                entry = self._section(layout.GRAPH)
                self._graph = decode_graph(self._bytes(entry), self._make_const, offset=entry.offset)
                if self._loader is not None:
                    self._loader.use_graph(self._graph)
        return self._graph

    def tensor(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a read-only zero-copy view (checked on first use under on_demand)."""
        return self._tensor_at(self._index_of(name))

    def tensor_names(self) -> list[str]:
        """Every tensor's name, in file (execution) order."""
        return list(self._names)

    @property
    def tensor_count(self) -> int:
        """How many tensors the index holds (no name is decoded)."""
        return len(self._records)

    @property
    def loader(self) -> DynamicLoader | None:
        """The :class:`~metadef.format.loader.DynamicLoader` attached to this file, if any."""
        return self._loader

    def attach_loader(self, loader: DynamicLoader | None) -> None:
        """Route first uses of tensors through ``loader`` (None: detach; an earlier loader is closed)."""
        old, self._loader = self._loader, loader
        if old is not None and old is not loader:
            old.close()

    def user_metadata(self) -> dict[str, dict[str, Any]]:
        """The layers as ``save_graph(metadata=...)`` takes them (saving them again is a no-op)."""
        aux = dict(self.layers["auxiliary"])
        namespaces = aux.pop("namespaces", {})
        return {"hardware": self.layers["hardware"], "parameters": self.layers["parameters"],
                "auxiliary": aux, "namespaces": namespaces}

    def code_targets(self) -> list[str]:
        """The targets that have a precompiled code section."""
        return [e.name[5:] for e in self.sections if e.type_id == layout.CODE]

    def code(self, target: str) -> memoryview | None:
        """The precompiled code bytes for ``target`` (checked under on_demand/always), or None.

        The caller decides whether to trust them; the reader never runs them.
        """
        e = next((e for e in self.sections if e.type_id == layout.CODE and e.name == f"code:{target}"), None)
        if e is None:
            return None
        if self._data.closed:
            raise ClosedFileError(f"{self.path} is closed: code section {e.name!r} cannot be read; open it again")
        if self.checksum_verify != "never" and (why := self._check_section(e)):
            raise ChecksumError(f"{self.path}: {why}; {_AGAIN}")
        return self._bytes(e)

    def code_hash(self, target: str) -> str | None:
        """``"blake2b-256:<hex>"`` of the code section for ``target`` (None when there is none):
        what a user pins to trust code built elsewhere (``safety.trusted_code_hashes``).

        Example:
            >>> import tempfile, pathlib
            >>> from metadef.ir import parse_graph
            >>> from metadef.format import save_graph
            >>> g = parse_graph("graph g(%x: f32[2]) -> (%y) { %y: f32[2] = Relu(%x) return %y }")
            >>> p = save_graph(g, pathlib.Path(tempfile.mkdtemp()) / "c.mdef", code={"toy": b"abc"})
            >>> open_mdef(p).code_hash("toy")[:12]
            'blake2b-256:'
        """
        blob = self.code(target)
        return None if blob is None else code_hash_of(blob)

    def verify(self) -> VerifyReport:
        """Check every checksum (sections and tensors); failures are listed, not raised."""
        start = time.perf_counter()
        report = self._verify_tensors(raise_on_failure=False)
        for e in self.sections:
            report.sections += 1
            report.bytes += 0 if e.flags & layout.NO_CHECKSUM else e.length
            if why := self._check_section(e):
                report.failures.append(why)
        report.seconds = time.perf_counter() - start
        return report

    def close(self) -> None:
        """Stop the attached loader's threads, then release the mapping (it lives on while
        views handed out are alive) or the file. Tensors already handed out stay valid."""
        if self._loader is not None:
            self._loader.close()
        self._data.close()

    @property
    def closed(self) -> bool:
        return self._data.closed

    def __enter__(self) -> MdefFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"MdefFile({self.path}, v{self.version[0]}.{self.version[1]}, {len(self._names)} tensors, "
                f"{self.size} bytes, {'mmap' if self.mmapped else 'private'})")


def code_hash_of(blob: bytes | memoryview) -> str:
    """``"blake2b-256:<hex>"`` of a code section's bytes (see :meth:`MdefFile.code_hash`).

    Example:
        >>> code_hash_of(b"")[:20]
        'blake2b-256:0e5751c0'
    """
    return "blake2b-256:" + hashlib.blake2b(blob, digest_size=32).hexdigest()


def open_mdef(path: str | os.PathLike[str], *, checksum_verify: ChecksumVerify = "on_demand",
              version_strict: bool = True, mmap_enabled: bool = True, threads: int = 1) -> MdefFile:
    """Open an .mdef file (see the module docstring for an example).

    ``checksum_verify``: ``"on_demand"`` checks the small sections at open and each tensor the
    first time it is used; ``"always"`` checks everything at open; ``"never"`` checks no
    checksum (bounds are always checked). ``version_strict=False`` reads a newer minor version
    with a warning. ``mmap_enabled=False`` reads into private memory instead of mapping, each
    range when it is first used. ``threads``: how many threads check tensor checksums under
    ``"always"`` and in :meth:`MdefFile.verify`.
    """
    return MdefFile(path, checksum_verify=checksum_verify, version_strict=version_strict,
                    mmap_enabled=mmap_enabled, threads=threads)


__all__ = ["MappedValue", "MdefFile", "TensorInfo", "VerifyReport", "code_hash_of", "open_mdef"]
