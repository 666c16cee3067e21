"""Claims: several processes sharing one compile through the kernel level, each kernel compiled once.

A parallel compile (``metadef.backends.x86.parallel``) runs helper processes that compile the
same graph's kernels in another order. Before compiling a kernel a process *claims* it: it
creates ``<cache>/v1/claims/<kernel digest>`` exclusively (``O_CREAT | O_EXCL``), holding its
pid. Whoever holds the claim compiles and saves the kernel, then removes the claim. Another
process that needs the kernel meanwhile either waits for the entry to appear (the process
that builds the executable) or skips the kernel (a helper: :class:`CompiledElsewhere`). A
claim whose process has died, or older than :data:`STALE_S`, is taken over, so a crashed
helper costs time, never a hang.

Example:
    >>> import os, tempfile
    >>> from pathlib import Path
    >>> claims = Claims(Path(tempfile.mkdtemp()))
    >>> claims.take("abc"), claims.holder("abc") == os.getpid()
    (True, True)
    >>> claims.drop("abc"); claims.holder("abc") is None
    True
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from metadef.codegen.kernel import CompiledElsewhere

T = TypeVar("T")

STALE_S = 120.0
"""A claim older than this is taken over even when its process still runs (one kernel never
takes LLVM that long)."""
POLL_S = 0.002
"""How often a waiting process looks for the entry it waits for."""


class Claims:
    """The claim files under ``root`` (see the module doc). ``skip``: a helper process, which
    skips a kernel another process has claimed instead of waiting for it."""

    def __init__(self, root: Path, *, skip: bool = False) -> None:
        self.root = root
        self.skip = skip
        self.waited = 0.0
        """Seconds this process spent waiting for kernels other processes compiled."""

    def _path(self, digest: str) -> Path:
        return self.root / digest

    def take(self, digest: str) -> bool:
        """Claim ``digest`` for this process: False when a live process holds it."""
        path = self._path(digest)
        for _ in range(2):  # a stale claim is removed, then taken
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileNotFoundError:
                path.parent.mkdir(parents=True, exist_ok=True)
                continue
            except FileExistsError:
                if self.holder(digest) is not None:
                    return False
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            return True
        return False

    def holder(self, digest: str) -> int | None:
        """The pid of the live process holding ``digest``'s claim, or None (no claim, its
        process has exited, or it is stale)."""
        path = self._path(digest)
        try:
            age = time.time() - path.stat().st_mtime
            pid = int(path.read_text() or 0)
        except (OSError, ValueError):
            return None
        if age > STALE_S or pid <= 0:
            return None
        if pid == os.getpid():
            return pid
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:  # alive, another user's
            return pid
        return None if _reaped_zombie(pid) else pid

    def drop(self, digest: str) -> None:
        """Remove this process's claim on ``digest`` (after saving the kernel, or giving up)."""
        path = self._path(digest)
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text() or 0) == os.getpid():
                path.unlink()

    def acquire(self, digest: str, name: str, stored: Callable[[], T | None], wait: bool = True) -> T | None:
        """``stored()`` once it holds what another process compiled, or None with the claim
        taken by this process (which then compiles). A helper, or a call with ``wait=False``,
        raises :class:`CompiledElsewhere` instead of waiting."""
        start = time.monotonic()
        try:
            while True:
                if self.take(digest):
                    got = stored()  # saved between our miss and our claim
                    if got is not None:
                        self.drop(digest)
                    return got
                if self.skip or not wait:
                    raise CompiledElsewhere(name)
                time.sleep(POLL_S)
                got = stored()
                if got is not None:
                    return got
        finally:
            self.waited += time.monotonic() - start


def _reaped_zombie(pid: int) -> bool:
    """Whether ``pid`` is this process's exited child (a zombie, which ``kill(pid, 0)`` still
    finds), reaping it."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child: it is alive
        return False
    return done == pid


__all__ = ["POLL_S", "STALE_S", "Claims"]
