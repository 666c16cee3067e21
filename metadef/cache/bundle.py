"""Compile-cache entries packed into one blob (what ``metadef.save(precompile=...)`` stores in
a model file's ``code:<target>`` section), and installed back into a cache.

Layout (little-endian)::

    magic "MDCODE1\\0" (8) | manifest length u32 | reserved u32 (0) | MAC (32 bytes)
    | manifest (JSON) | the entries' bytes, one after another

The manifest holds ``target``, ``environment`` (the cache-key components of the machine that
compiled: metadef, LLVM and llvmlite versions, triple, CPU features, codegen pipeline and
source digest), ``machine`` (the public id of that machine), ``created`` and ``entries``:
``[[level, digest, offset, length], ...]`` into the payload. The MAC is keyed BLAKE2b-256
of manifest + payload under the building machine's secret key: only that machine can tell
that it made the blob. Each entry keeps the on-disk cache's own format and checksum
(:mod:`metadef.cache.store`), and is checked again when installed.

Example:
    >>> import tempfile
    >>> from metadef.cache.keys import kernel_key
    >>> store = Store(tempfile.mkdtemp())
    >>> store.put(kernel_key("Relu", {"metadef": "0.1.0"}), {"symbol": "f"}, {"object": b"\\x7f"})
    >>> blob = pack_bundle(list(store.entries()), {"target": "toy"}, key=b"k" * 32)
    >>> bundle = unpack_bundle(blob)
    >>> bundle.manifest["target"], bundle.signed_by(b"k" * 32), bundle.signed_by(b"x" * 32)
    ('toy', True, False)
    >>> install(bundle, Store(tempfile.mkdtemp()))
    1
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from metadef.cache.store import CorruptEntry, Store

MAGIC = b"MDCODE1\0"
_HEAD = struct.Struct("<8sII32s")
MAX_MANIFEST = 64 << 20


class BundleError(ValueError):
    """A code blob that is not a bundle, or whose manifest or entry table does not hold."""


def mac(key: bytes, data: bytes | memoryview) -> bytes:
    """Keyed BLAKE2b-256 of ``data``.

    Example:
        >>> len(mac(b"k" * 32, b"abc"))
        32
    """
    return hashlib.blake2b(data, key=key, digest_size=32).digest()


def pack_bundle(entries: Sequence[tuple[str, str, bytes]], info: Mapping[str, Any], key: bytes) -> bytes:
    """One blob holding ``entries`` (``(level, digest, entry bytes)``, as ``Store.entries``
    gives them) and ``info`` (target, environment, machine ...) in its manifest, MACed with ``key``."""
    table, at = [], 0
    for level, digest, data in entries:
        table.append([level, digest, at, len(data)])
        at += len(data)
    manifest = json.dumps({**info, "entries": table}, separators=(",", ":"), sort_keys=True).encode()
    body = manifest + b"".join(data for _, _, data in entries)
    return _HEAD.pack(MAGIC, len(manifest), 0, mac(key, body)) + body


@dataclass(frozen=True)
class Bundle:
    """A checked bundle: its manifest, the bytes it covers and their MAC."""

    manifest: dict[str, Any]
    body: memoryview
    tag: bytes
    payload_at: int

    def signed_by(self, key: bytes) -> bool:
        """Whether ``key`` made the MAC (the blob was built on the machine that holds ``key``)."""
        return hmac.compare_digest(mac(key, self.body), self.tag)

    def entries(self) -> Iterator[tuple[str, str, memoryview]]:
        """``(level, digest, entry bytes)`` for every entry."""
        for level, digest, offset, length in self.manifest["entries"]:
            start = self.payload_at + offset
            yield level, digest, self.body[start:start + length]


def unpack_bundle(data: bytes | memoryview) -> Bundle:
    """Check and split a blob made by :func:`pack_bundle` (BundleError when it is not one)."""
    view = memoryview(data)
    if len(view) < _HEAD.size:
        raise BundleError(f"{len(view)} bytes: shorter than a bundle header ({_HEAD.size})")
    magic, length, _reserved, tag = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise BundleError(f"magic {bytes(magic)!r} is not {MAGIC!r}")
    if length > min(MAX_MANIFEST, len(view) - _HEAD.size):
        raise BundleError(f"the manifest length {length} runs past the blob ({len(view)} bytes)")
    body = view[_HEAD.size:]
    try:
        manifest = json.loads(bytes(body[:length]))
    except (ValueError, RecursionError) as e:
        raise BundleError(f"the manifest is not JSON ({e})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("entries"), list):
        raise BundleError("the manifest is not an object with an entry table")
    payload = len(body) - length
    for row in manifest["entries"]:
        ok = (isinstance(row, list) and len(row) == 4 and all(isinstance(x, str) for x in row[:2])
              and all(type(x) is int and x >= 0 for x in row[2:]))
        if not ok or row[2] + row[3] > payload:
            raise BundleError(f"entry {str(row)[:80]} is malformed or runs past the payload ({payload} bytes)")
    return Bundle(manifest, body, bytes(tag), length)


def install(bundle: Bundle, store: Store) -> int:
    """Write the bundle's entries that ``store`` lacks; each is checked first (CorruptEntry
    when one is damaged: nothing after it is written). Returns how many were written."""
    written = 0
    for level, digest, data in bundle.entries():
        try:
            written += store.put_bytes(level, digest, bytes(data))
        except CorruptEntry as e:
            raise CorruptEntry(f"{level} entry {digest[:10]}: {e}") from None
    store.evict()
    return written


def missing(bundle: Bundle, store: Store) -> int:
    """How many of the bundle's entries ``store`` does not have (by name; not read)."""
    return sum(not store.has(level, digest) for level, digest, _ in bundle.entries())


__all__ = ["MAGIC", "Bundle", "BundleError", "install", "mac", "missing", "pack_bundle", "unpack_bundle"]
