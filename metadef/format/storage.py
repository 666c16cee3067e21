"""The bytes of an open .mdef file: a read-only mapping, or a private buffer filled on demand.

``FileBytes.open`` maps the file read-only. When mapping is off (``mmap_enabled=False``) or
fails, it allocates one private buffer the size of the file *without touching it* (the
kernel hands out zero pages lazily) and reads each range the reader asks for
(:meth:`FileBytes.ensure`) with ``os.preadv``, which releases the GIL: a tensor costs memory
only once it is read, and a background thread can read ahead while another computes. Either
way ``buf`` / ``mv`` cover the whole file, so the reader slices them the same way.

:meth:`FileBytes.populate` brings a mapped range into memory ahead of use with ``madvise``
through ctypes (the call releases the GIL): ``MADV_WILLNEED`` (start reading what is not
in the page cache) or ``MADV_POPULATE_READ`` (Linux 5.14+: read and map every page); where
madvise is missing, it touches one byte per page.

Example:
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "f.bin")
    >>> with open(path, "wb") as f:
    ...     _ = f.write(bytes(range(256)) * 64)
    >>> private = FileBytes.open(path, mmap_enabled=False)
    >>> private.ensure(256, 4)
    >>> bytes(private.mv[256:260]), private.mmapped, private.size
    (b'\\x00\\x01\\x02\\x03', False, 16384)
    >>> private.close()
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import mmap
import os
import stat
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from metadef.format.errors import ClosedFileError, TruncatedFileError

log = logging.getLogger("metadef.format")

PAGE = mmap.PAGESIZE
MADV_WILLNEED = getattr(mmap, "MADV_WILLNEED", 3)
MADV_POPULATE_READ = 22  # Linux 5.14+; older kernels answer EINVAL and we touch pages instead
MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", 4)


def _libc(name: str, *argtypes: Any) -> Any:
    """A libc function through ctypes (which releases the GIL around the call), or None."""
    try:
        fn = getattr(ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = list(argtypes)
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _libc("madvise", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_MINCORE = _libc("mincore", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
_POPULATE_WORKS = [_MADVISE is not None]  # cleared the first time the kernel refuses it


class _Range:
    """One range of a private buffer: read once; waiters learn whether the read worked."""

    __slots__ = ("done", "ok")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False


class FileBytes:
    """An open file's bytes: ``buf`` (for ``numpy.frombuffer``) and ``mv`` span the whole file.

    Readers slice ``mv`` inside :meth:`using`, so :meth:`close` (from any thread) waits for
    them before it closes the file or releases the mapping, and a use after it is a
    :class:`~metadef.format.errors.ClosedFileError`.
    """

    def __init__(self, path: str | os.PathLike[str], buf: Any, size: int, fd: int | None) -> None:
        self.path = path
        self.buf = buf
        self.mv = memoryview(buf)
        self.size = size
        self.mmapped = fd is None
        self._fd = fd
        self._address = np.frombuffer(buf, np.uint8, min(size, 1)).ctypes.data if size else 0
        self._loaded: dict[tuple[int, int], _Range] = {}
        self._lock = threading.Lock()
        self._users = 0
        self._no_users = threading.Condition(self._lock)
        self.closed = False

    @classmethod
    def open(cls, path: str | os.PathLike[str], mmap_enabled: bool = True) -> FileBytes:
        """Map ``path`` read-only, or (mapping off or failing) prepare a private buffer; a
        failed mapping logs ``MMAP_FAILED`` with the reason, the permissions and the size."""
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(fd)
            size = st.st_size
            mapped, why = None, "mmap_enabled=False" if not mmap_enabled else "the file is empty"
            if mmap_enabled and size > 0:
                try:
                    mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                except (OSError, ValueError, OverflowError) as e:
                    why = f"{type(e).__name__}: {e}"
            if mapped is None:
                log.warning("MMAP_FAILED: %s: reading %s into private memory instead, range by range as it is "
                            "used (permissions %s, size %d bytes)", why, path, stat.filemode(st.st_mode), size)
                return cls(path, np.zeros(size, np.uint8), size, fd)  # calloc: untouched pages cost nothing
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        data = cls(path, mapped, size, None)
        _register(data)
        return data

    def acquire(self, what: str | Callable[[], str] = "bytes") -> None:
        """Hold the file open until :meth:`release` (``close`` waits); ClosedFileError naming
        ``what`` (text, or a function that makes it) when it is closed."""
        with self._lock:
            if self.closed:
                text = what() if callable(what) else what
                raise ClosedFileError(f"{self.path} is closed: {text} cannot be read; open the file again")
            self._users += 1

    def release(self) -> None:
        """The end of an :meth:`acquire`."""
        with self._lock:
            self._users -= 1
            if self.closed and not self._users:
                self._no_users.notify_all()

    @contextlib.contextmanager
    def using(self, what: str | Callable[[], str] = "bytes") -> Iterator[None]:
        """:meth:`acquire` for the block, :meth:`release` after it."""
        self.acquire(what)
        try:
            yield
        finally:
            self.release()

    def ensure(self, offset: int, length: int) -> None:
        """Make bytes ``offset .. offset + length`` (checked by the caller to lie in the file)
        readable through ``mv``: a no-op when mapped; a read (once) into the private buffer."""
        if self.mmapped or length <= 0:
            return
        key = (offset, length)
        with self._lock:
            got = self._loaded.get(key)
            if got is not None and got.ok:
                return
            mine = got is None
            if mine:
                got = self._loaded[key] = _Range()
        assert got is not None
        if not mine:
            got.done.wait()
            if not got.ok:
                self.ensure(offset, length)  # the first reader failed: try again, and raise here
            return
        try:
            with self.using(f"bytes {offset}..{offset + length}"):
                self._read(offset, length)
            got.ok = True
        finally:
            if not got.ok:
                with self._lock:
                    self._loaded.pop(key, None)
            got.done.set()

    def _read(self, offset: int, length: int) -> None:
        assert self._fd is not None
        at, end = offset, offset + length
        while at < end:
            done = os.preadv(self._fd, [self.mv[at:end]], at)
            if done <= 0:
                raise TruncatedFileError(f"{self.path}: reading bytes {offset}..{end} stopped at {at}: the file "
                                         "became shorter after it was opened (was it rewritten?); open it again")
            at += done

    def forget(self, offset: int, length: int) -> int:
        """Unmap the whole pages of a mapped range from this process (``MADV_DONTNEED``): they
        stop counting in its RSS, and the next read maps them again from the page cache (or
        the file), unchanged: the mapping is read-only. Returns the bytes let go (0: not
        mapped, nothing whole inside, or madvise refused)."""
        if not self.mmapped or _MADVISE is None:
            return 0
        start = -(-offset // PAGE) * PAGE
        end = (offset + length) // PAGE * PAGE
        if end <= start:
            return 0
        with self.using(f"bytes {offset}..{offset + length}"):
            return end - start if _MADVISE(self._address + start, end - start, MADV_DONTNEED) == 0 else 0

    def holds(self, address: int, nbytes: int) -> int | None:
        """The offset of memory ``address .. address + nbytes`` in this mapping, or None."""
        if not self.mmapped or self.closed or not self._address:
            return None
        offset = address - self._address
        return offset if offset >= 0 and offset + nbytes <= self.size else None

    def resident(self, offset: int, length: int) -> bool | None:
        """Whether every page of a mapped range is in memory (``mincore``); None when unknown.

        (About 12 ms for 400 MB: dearer than ``MADV_WILLNEED`` on pages already cached.)"""
        if not self.mmapped or _MINCORE is None or length <= 0:
            return None
        start = offset - offset % PAGE
        pages = np.empty((offset + length - start + PAGE - 1) // PAGE, np.uint8)
        with self.using(f"bytes {offset}..{offset + length}"):
            if _MINCORE(self._address + start, offset + length - start, pages.ctypes.data) != 0:
                return None
        return bool((pages & 1).all())

    def populate(self, offset: int, length: int, advice: str = "willneed") -> str:
        """Bring ``offset .. offset + length`` into memory ahead of use; returns how.

        Mapped: ``madvise`` through ctypes, which releases the GIL: ``"willneed"``
        (``MADV_WILLNEED``: the kernel starts reading what is not in the page cache and
        returns) or ``"populate"`` (``MADV_POPULATE_READ``, Linux 5.14+: reads and maps every
        page before it returns); where madvise is missing or refused, one byte per page is
        touched (``"touch"``). Private buffer: the range is read (``"read"``).
        """
        if length <= 0:
            return "nothing"
        if not self.mmapped:
            self.ensure(offset, length)
            return "read"
        start = offset - offset % PAGE
        with self.using(f"bytes {offset}..{offset + length}"):
            if _MADVISE is not None:
                populate = advice == "populate" and _POPULATE_WORKS[0]
                if _MADVISE(self._address + start, offset + length - start,
                            MADV_POPULATE_READ if populate else MADV_WILLNEED) == 0:
                    return "populate" if populate else "willneed"
                if populate and ctypes.get_errno() == errno.EINVAL:  # before Linux 5.14, or not this file system
                    _POPULATE_WORKS[0] = False
                    log.debug("madvise(MADV_POPULATE_READ) is refused here: touching pages instead")
            view = np.frombuffer(self.buf, np.uint8, offset + length - start, start)
            int(view[::PAGE].max())  # one byte per page: the loop runs in C, without the GIL
            return "touch"

    def close(self, timeout: float = 30.0) -> None:
        """Wait for readers in :meth:`using` (up to ``timeout`` seconds), then release the
        mapping (it lives on while views handed out are alive) or close the file."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if not self._no_users.wait_for(lambda: self._users == 0, timeout):
                log.warning("%s: closing while %d readers still use it", self.path, self._users)
                return  # (they keep the file; the garbage collector closes it)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            return
        try:
            self.mv.release()
            self.buf.close()
        except BufferError:
            log.debug("%s stays mapped while views of it are alive", self.path)


_MAPPED: weakref.WeakSet[FileBytes] = weakref.WeakSet()
_MAPPED_LOCK = threading.Lock()


def _register(data: FileBytes) -> None:
    if data.mmapped:
        with _MAPPED_LOCK:
            _MAPPED.add(data)


def release_mapped(array: np.ndarray) -> int:
    """Let go of the pages of ``array`` in this process's RSS when it is a view of an open
    .mdef file's read-only mapping (a weight that a backend has copied into a layout of its
    own, and reads no more): the whole pages inside it are unmapped, and a later read maps
    them again, unchanged. Returns the bytes let go (0 for any other array).

    Example:
        >>> release_mapped(np.zeros(1 << 20, np.float32))
        0
    """
    address, nbytes = array.__array_interface__["data"][0], array.nbytes
    with _MAPPED_LOCK:
        files = list(_MAPPED)
    for data in files:
        offset = data.holds(address, nbytes)
        if offset is not None:
            try:
                return data.forget(offset, nbytes)
            except ClosedFileError:
                return 0
    return 0


__all__ = ["MADV_DONTNEED", "MADV_POPULATE_READ", "PAGE", "FileBytes", "release_mapped"]
