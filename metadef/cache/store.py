"""The on-disk compile cache: one file per entry, atomic, checked, capped.

Layout under the root (``METADEF_CACHE_DIR``, default ``~/.cache/metadef``)::

    <root>/v1/<level>/<digest>.mdc     one entry: header, JSON manifest, blobs (object code, arrays)
    <root>/v1/stats.json               hit / miss / corrupt counts per level (updated under a lock)

An entry is ``MAGIC | manifest length (u32) | pad (u32) | payload length (u64) | xxh3-64 of
manifest + payload (u64) | manifest | payload``. It is written to a temporary file in the same
directory and renamed over the final name, so a reader sees a whole entry or none; several
processes writing the same key end with one valid entry (the last rename wins). A read checks
the magic, the lengths and the checksum: a damaged entry is deleted and reported as a miss
(the caller recompiles and writes it again), never loaded. A hit touches the file's mtime;
when the total size passes the cap, the least recently used entries go first.

Example:
    >>> import tempfile
    >>> from metadef.cache.keys import kernel_key
    >>> store = Store(tempfile.mkdtemp())
    >>> key = kernel_key("Relu", {"metadef": "0.1.0"})
    >>> store.get(key) is None
    True
    >>> store.put(key, {"symbol": "f"}, {"object": b"\\x7fELF..."})
    >>> entry = store.get(key)
    >>> entry.manifest["symbol"], entry.blobs["object"]
    ('f', b'\\x7fELF...')
    >>> store.info()["levels"]["kernel"]["entries"]
    1
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import struct
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from metadef.cache.keys import LEVELS, CacheKey, explain_difference
from metadef.codegen.host import record_folder
from metadef.core import flags

log = logging.getLogger("metadef.cache")

MAGIC = b"MDCACHE1"
_HEAD = struct.Struct("<8sIIQQ")
DEFAULT_MAX_BYTES = 2 << 30
"""The default size cap: 2 GiB (``Store(max_bytes=...)`` or ``METADEF_CACHE_MAX_BYTES``)."""
SUFFIX = ".mdc"


@dataclass(frozen=True)
class Entry:
    """A cache entry as read back: its manifest (JSON) and its named blobs."""

    manifest: dict[str, Any]
    blobs: dict[str, bytes]


class CorruptEntry(Exception):
    """An entry whose header, lengths or checksum do not hold (internal: turned into a miss)."""


def encode_entry(key: CacheKey, manifest: Mapping[str, Any], blobs: Mapping[str, bytes]) -> bytes:
    """The bytes of one entry (see the module doc); the key's components go in the manifest."""
    offsets: dict[str, list[int]] = {}
    at = 0
    for name, blob in blobs.items():
        offsets[name] = [at, len(blob)]
        at += len(blob)
    text = json.dumps({"level": key.level, "key": key.as_dict(), "blobs": offsets, **manifest},
                      separators=(",", ":")).encode()
    payload = b"".join(blobs.values())
    h = xxhash.xxh3_64()
    h.update(text)
    h.update(payload)
    return _HEAD.pack(MAGIC, len(text), 0, len(payload), h.intdigest()) + text + payload


def decode_entry(data: bytes) -> Entry:
    """Check and split the bytes of an entry; raises :class:`CorruptEntry` if anything is off."""
    if len(data) < _HEAD.size:
        raise CorruptEntry(f"{len(data)} bytes: shorter than the header")
    magic, mlen, _pad, plen, checksum = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise CorruptEntry(f"bad magic {magic!r}")
    if _HEAD.size + mlen + plen != len(data):
        raise CorruptEntry(f"lengths say {_HEAD.size + mlen + plen} bytes, the file has {len(data)}")
    body = memoryview(data)[_HEAD.size:]
    if xxhash.xxh3_64_intdigest(body) != checksum:
        raise CorruptEntry("checksum mismatch")
    try:
        manifest = json.loads(bytes(body[:mlen]))
    except ValueError as e:
        raise CorruptEntry(f"manifest is not JSON: {e}") from e
    payload = body[mlen:]
    blobs = {name: bytes(payload[o:o + n]) for name, (o, n) in manifest.get("blobs", {}).items()}
    return Entry(manifest, blobs)


def _read_manifest(path: Path) -> dict[str, Any] | None:
    """Only the manifest of an entry (unchecked: for explaining misses, never for loading)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD.size)
            if len(head) < _HEAD.size:
                return None
            magic, mlen, *_ = _HEAD.unpack(head)
            return json.loads(f.read(mlen)) if magic == MAGIC else None
    except (OSError, ValueError):
        return None


def _max_bytes_default() -> int:
    text = os.environ.get("METADEF_CACHE_MAX_BYTES")
    return int(text) if text else DEFAULT_MAX_BYTES



def _write_atomically(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a temporary file in the same folder, then a rename: a
    reader sees the old entry, the whole new one, or none; never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem[:8]}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise

class Store:
    """The on-disk cache (see the module doc). ``root`` defaults to ``METADEF_CACHE_DIR``."""

    def __init__(self, root: str | os.PathLike | None = None, max_bytes: int | None = None) -> None:
        self.root = Path(root if root is not None else flags.CACHE_DIR.get()) / "v1"
        self.max_bytes = max_bytes if max_bytes is not None else _max_bytes_default()
        self._pending: Counter[str] = Counter()

    def path(self, key: CacheKey) -> Path:
        return self.root / key.level / f"{key.digest}{SUFFIX}"

    # --- reading and writing ------------------------------------------------------------
    def get(self, key: CacheKey) -> Entry | None:
        """The entry for ``key``, or None (a miss; a damaged entry is deleted and counts as one)."""
        path = self.path(key)
        try:
            data = path.read_bytes()
        except OSError:
            self._miss(key)
            return None
        try:
            entry = decode_entry(data)
            if entry.manifest.get("key") != key.as_dict():
                raise CorruptEntry("the stored key differs from the file's name")
        except CorruptEntry as e:
            log.warning("cache: %s entry %s is damaged (%s): deleted, will be rebuilt", key.level, key.short, e)
            self._pending[f"{key.level}.corrupt"] += 1
            with contextlib.suppress(OSError):
                path.unlink()
            self._miss(key, explain=False)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)
        self._pending[f"{key.level}.hits"] += 1
        return entry

    def get_digest(self, level: str, digest: str, env: Mapping[str, str]) -> Entry | None:
        """The entry of ``level`` named ``digest`` (as a stored plan names its kernels), or None.

        The entry's own key must hash to ``digest`` and agree with ``env`` on every component
        ``env`` has (versions, triple, CPU features): a kernel built elsewhere is never loaded.
        """
        path = self.root / level / f"{digest}{SUFFIX}"
        try:
            data = path.read_bytes()
        except OSError:
            self._pending[f"{level}.misses"] += 1
            return None
        try:
            entry = decode_entry(data)
            stored = entry.manifest.get("key")
            if not isinstance(stored, dict) or CacheKey(level, tuple(sorted(stored.items()))).digest != digest:
                raise CorruptEntry("the stored key differs from the file's name")
        except CorruptEntry as e:
            log.warning("cache: %s entry %s is damaged (%s): deleted, will be rebuilt", level, digest[:10], e)
            self._pending[f"{level}.corrupt"] += 1
            self._pending[f"{level}.misses"] += 1
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        if any(stored.get(k) != v for k, v in env.items()):
            self._pending[f"{level}.misses"] += 1
            return None
        with contextlib.suppress(OSError):
            os.utime(path)
        self._pending[f"{level}.hits"] += 1
        return entry

    # --- whole entries, as bytes (for shipping them inside a model file) ------------------
    def entries(self) -> Iterator[tuple[str, str, bytes]]:
        """Every entry as ``(level, digest, bytes)`` (unchecked: :meth:`put_bytes` checks)."""
        for path in sorted(self._files()):
            with contextlib.suppress(OSError):
                yield path.parent.name, path.stem, path.read_bytes()

    def has(self, level: str, digest: str) -> bool:
        """Whether an entry file for ``digest`` exists at ``level`` (not read, not checked)."""
        return (self.root / level / f"{digest}{SUFFIX}").is_file()

    def put_bytes(self, level: str, digest: str, data: bytes) -> bool:
        """Write a whole entry as :meth:`entries` gave it, atomically, unless one is there;
        raises :class:`CorruptEntry` when the bytes are damaged or their key does not hash
        to ``digest``. Returns whether it wrote."""
        if level not in LEVELS or len(digest) != 32 or not all(c in "0123456789abcdef" for c in digest):
            raise CorruptEntry(f"level {level!r} / digest {digest[:40]!r} is not an entry name")
        stored = decode_entry(bytes(data)).manifest.get("key")
        if not isinstance(stored, dict) or CacheKey(level, tuple(sorted(stored.items()))).digest != digest:
            raise CorruptEntry("the stored key does not hash to the entry's name")
        path = self.root / level / f"{digest}{SUFFIX}"
        if path.is_file():
            return False
        _write_atomically(path, data)
        self._pending[f"{level}.imports"] += 1
        return True

    def put(self, key: CacheKey, manifest: Mapping[str, Any], blobs: Mapping[str, bytes]) -> None:
        """Write the entry atomically (temporary file, then rename), then keep under the cap."""
        _write_atomically(self.path(key), encode_entry(key, manifest, blobs))
        self._pending[f"{key.level}.writes"] += 1
        self.evict()

    def _miss(self, key: CacheKey, explain: bool = True) -> None:
        self._pending[f"{key.level}.misses"] += 1
        if explain and flags.DEBUG.get():
            log.info("%s", self.explain_miss(key))

    def explain_miss(self, key: CacheKey) -> str:
        """One line: which key components differ from the nearest stored entry of the level.

        The nearest entry is the one with the fewest differing components.
        """
        wanted = key.as_dict()
        best: tuple[int, dict[str, str]] | None = None
        for path in self._files(key.level):
            stored = (_read_manifest(path) or {}).get("key")
            if not isinstance(stored, dict):
                continue
            n = sum(wanted.get(k) != stored.get(k) for k in set(wanted) | set(stored))
            if best is None or n < best[0]:
                best = (n, stored)
        if best is None:
            return f"miss {key.level} {key.short}: no {key.level} entry in the cache yet"
        return f"miss {key.level} {key.short}: {explain_difference(wanted, best[1])}"

    # --- size, eviction, statistics -----------------------------------------------------
    def _files(self, level: str | None = None) -> Iterator[Path]:
        for lv in [level] if level else LEVELS:
            folder = self.root / lv
            if folder.is_dir():
                yield from (p for p in folder.iterdir() if p.suffix == SUFFIX)

    def evict(self) -> int:
        """Delete least recently used entries until the total size is under the cap; how many."""
        entries = []
        for p in self._files():
            with contextlib.suppress(OSError):
                st = p.stat()
                entries.append((st.st_mtime_ns, st.st_size, p))
        total = sum(size for _, size, _ in entries)
        removed = 0
        for _, size, p in sorted(entries):
            if total <= self.max_bytes:
                break
            with contextlib.suppress(OSError):
                p.unlink()
                removed += 1
            total -= size
        if removed:
            self._pending["evictions"] += removed
            log.info("cache: evicted %d least recently used entries (cap %d bytes)", removed, self.max_bytes)
        return removed

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "stats.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def stats(self) -> dict[str, int]:
        """The persisted counters plus this process's unflushed ones."""
        try:
            saved = json.loads((self.root / "stats.json").read_text())
        except (OSError, ValueError):
            saved = {}
        total = Counter({k: int(v) for k, v in saved.items() if isinstance(v, int)})
        total.update(self._pending)
        return dict(total)

    def flush_stats(self) -> None:
        """Add this process's counters to ``stats.json`` (under a file lock, atomically)."""
        if not self._pending:
            return
        with self._locked():
            merged = self.stats()
            target = self.root / "stats.json"
            tmp = target.with_name(f".stats.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(merged, sort_keys=True))
            os.replace(tmp, target)
            self._pending.clear()

    def info(self) -> dict[str, Any]:
        """Entries, bytes and counters per level, the root and the cap."""
        counts = self.stats()
        levels: dict[str, dict[str, int]] = {}
        for level in LEVELS:
            files = list(self._files(level))
            size = 0
            for p in files:
                with contextlib.suppress(OSError):
                    size += p.stat().st_size
            levels[level] = {"entries": len(files), "bytes": size,
                             **{c: counts.get(f"{level}.{c}", 0) for c in ("hits", "misses", "corrupt", "writes")}}
        return {"root": str(self.root), "max_bytes": self.max_bytes, "levels": levels,
                "evictions": counts.get("evictions", 0),
                "bytes": sum(v["bytes"] for v in levels.values())}

    def clear(self) -> int:
        """Delete every entry, the counters and the host records beside them (the next process
        asks LLVM to describe the host again); how many entries were deleted."""
        removed = 0
        for p in list(self._files()):
            with contextlib.suppress(OSError):
                p.unlink()
                removed += 1
        for p in record_folder(self.root.parent).glob("*.json"):
            with contextlib.suppress(OSError):
                p.unlink()
        with contextlib.suppress(OSError):
            (self.root / "stats.json").unlink()
        self._pending.clear()
        return removed


__all__ = ["DEFAULT_MAX_BYTES", "MAGIC", "CorruptEntry", "Entry", "Store", "decode_entry", "encode_entry"]
