"""The byte layout of a .mdef file (docs/format.md): constants, header, section table, trailer.

Each struct packs to and unpacks from exactly the bytes the spec lists; unpacking checks
nothing but the size (the reader does the checking, where it knows the file).

Example:
    >>> h = Header(1, 0, flags=0, section_count=2, section_table_offset=64, file_length=999,
    ...            section_table_checksum=7)
    >>> back = Header.unpack(h.pack())
    >>> back.file_length, back.section_count, len(h.pack())
    (999, 2, 64)
    >>> align_up(65, 64)
    128
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import xxhash

MAGIC = b"MDEF"
MARKER = b"\r\n\x1a\n"
FORMAT_VERSION = (1, 0)
LITTLE_ENDIAN = 1

HEADER_SIZE = 64
SECTION_ENTRY_SIZE = 64
TRAILER_SIZE = 40
INDEX_HEAD_SIZE = 16
INDEX_RECORD_SIZE = 48
MAX_RANK = 32
SECTION_ALIGN = 8
DEFAULT_ALIGNMENT = 64

# Section type ids.
HARDWARE, SUMMARY, PARAMETERS, AUXILIARY, GRAPH, TENSOR_INDEX, TENSOR_DATA, CODE = range(1, 9)
SECTION_NAMES = {HARDWARE: "hardware", SUMMARY: "summary", PARAMETERS: "parameters",
                 AUXILIARY: "auxiliary", GRAPH: "graph", TENSOR_INDEX: "tensors",
                 TENSOR_DATA: "data", CODE: "code"}
SINGLETON_SECTIONS = frozenset(SECTION_NAMES) - {CODE}

# Section flags.
REQUIRED = 1 << 0
NO_CHECKSUM = 1 << 1

_HEADER = struct.Struct("<4s4sHHBBHIIQQQ8sQ")
_ENTRY = struct.Struct("<IIQQQ32s")
_TRAILER = struct.Struct("<QQQQHH4s")
_INDEX_HEAD = struct.Struct("<IIII")

INDEX_DTYPE = np.dtype([
    ("data_offset", "<u8"), ("byte_length", "<u8"), ("checksum", "<u8"),
    ("name_offset", "<u4"), ("name_length", "<u4"), ("dims_offset", "<u4"),
    ("dtype", "<u2"), ("rank", "u1"), ("format", "u1"), ("flags", "<u4"), ("reserved", "<u4"),
])
assert INDEX_DTYPE.itemsize == INDEX_RECORD_SIZE


def checksum(data: bytes | bytearray | memoryview) -> int:
    """xxh3-64 (seed 0) of a bytes-like object, the one hash of the format.

    Example:
        >>> checksum(b"") == checksum(memoryview(b"abc")[:0])
        True
    """
    return xxhash.xxh3_64_intdigest(data)


def align_up(n: int, alignment: int) -> int:
    """The smallest multiple of ``alignment`` (a power of two) at or above ``n``."""
    return (n + alignment - 1) & ~(alignment - 1)


def valid_alignment(alignment: int) -> bool:
    """Tensor alignment the spec allows: a power of two from 8 to 65536."""
    return 8 <= alignment <= 65536 and alignment & (alignment - 1) == 0


@dataclass(frozen=True)
class Header:
    """The fixed 64-byte header at offset 0."""

    major: int
    minor: int
    flags: int
    section_count: int
    section_table_offset: int
    file_length: int
    section_table_checksum: int
    endianness: int = LITTLE_ENDIAN
    entry_size: int = SECTION_ENTRY_SIZE
    magic: bytes = MAGIC
    marker: bytes = MARKER
    header_checksum: int = 0

    def pack(self) -> bytes:
        """The 64 bytes, with the header checksum computed over bytes 0..56."""
        body = _HEADER.pack(self.magic, self.marker, self.major, self.minor, self.endianness, 0,
                            self.entry_size, self.flags, self.section_count,
                            self.section_table_offset, self.file_length,
                            self.section_table_checksum, bytes(8), 0)[:56]
        return body + struct.pack("<Q", checksum(body))

    @classmethod
    def unpack(cls, data: bytes | memoryview) -> Header:
        """Read the fields of 64 bytes (no checking)."""
        (magic, marker, major, minor, endian, _r, entry_size, flags, count, table_offset,
         file_length, table_sum, _reserved, header_sum) = _HEADER.unpack(bytes(data[:HEADER_SIZE]))
        return cls(major, minor, flags, count, table_offset, file_length, table_sum, endian,
                   entry_size, magic, marker, header_sum)


@dataclass(frozen=True)
class SectionEntry:
    """One row of the section table."""

    type_id: int
    flags: int
    offset: int
    length: int
    checksum: int
    name: str

    @property
    def required(self) -> bool:
        return bool(self.flags & REQUIRED)

    @property
    def end(self) -> int:
        return self.offset + self.length

    def pack(self) -> bytes:
        raw = self.name.encode("ascii")
        if len(raw) > 32:
            raise ValueError(f"section name {self.name!r} is longer than 32 bytes")
        return _ENTRY.pack(self.type_id, self.flags, self.offset, self.length, self.checksum, raw)

    @classmethod
    def unpack(cls, data: bytes | memoryview) -> SectionEntry:
        type_id, flags, offset, length, check, raw = _ENTRY.unpack(bytes(data[:SECTION_ENTRY_SIZE]))
        name = raw.rstrip(b"\0").decode("ascii", errors="replace")
        return cls(type_id, flags, offset, length, check, name)


@dataclass(frozen=True)
class Trailer:
    """The 40 bytes at the end of the file; its last four bytes are the magic."""

    tensor_index_offset: int
    section_table_offset: int
    file_length: int
    major: int
    minor: int
    trailer_checksum: int = 0
    magic: bytes = MAGIC

    def pack(self) -> bytes:
        body = struct.pack("<QQQ", self.tensor_index_offset, self.section_table_offset, self.file_length)
        return body + _TRAILER.pack(0, 0, 0, checksum(body), self.major, self.minor, MAGIC)[24:]

    @classmethod
    def unpack(cls, data: bytes | memoryview) -> Trailer:
        index_off, table_off, length, check, major, minor, magic = _TRAILER.unpack(bytes(data[:TRAILER_SIZE]))
        return cls(index_off, table_off, length, major, minor, check, magic)


def pack_index_head(count: int, dims_count: int, alignment: int) -> bytes:
    """The 16-byte head of the tensor index section."""
    return _INDEX_HEAD.pack(count, INDEX_RECORD_SIZE, dims_count, alignment)


def unpack_index_head(data: bytes | memoryview) -> tuple[int, int, int, int]:
    """(count, record_size, dims_count, alignment) of the tensor index section."""
    return _INDEX_HEAD.unpack(bytes(data[:INDEX_HEAD_SIZE]))


__all__ = [
    "AUXILIARY", "CODE", "DEFAULT_ALIGNMENT", "FORMAT_VERSION", "GRAPH", "HARDWARE", "HEADER_SIZE",
    "Header", "INDEX_DTYPE", "INDEX_HEAD_SIZE", "INDEX_RECORD_SIZE", "MAGIC", "MARKER", "MAX_RANK",
    "NO_CHECKSUM", "PARAMETERS", "REQUIRED", "SECTION_ENTRY_SIZE", "SECTION_NAMES", "SUMMARY",
    "SectionEntry", "TENSOR_DATA", "TENSOR_INDEX", "TRAILER_SIZE", "Trailer", "align_up",
    "checksum", "pack_index_head", "unpack_index_head", "valid_alignment",
]
