"""Where compiled kernels are kept outside a process: :class:`KernelCode` (a kernel apart from
its IR) and the :class:`KernelStore` protocol the compile cache implements, with the context
that says which store the kernels compiled in a block consult (:func:`kernel_store`).

Example:
    >>> with kernel_store(None):
    ...     current_store() is None
    True
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from metadef.shape import Dim


@dataclass(frozen=True)
class KernelCode:
    """A compiled kernel apart from its IR: object code and what :class:`Kernel` needs around
    it, so that a compile cache can rebuild the kernel without running LLVM."""

    symbol: str
    object_code: bytes
    outputs: tuple[tuple[np.dtype, tuple[Dim, ...]], ...]
    constants: tuple[np.ndarray, ...]
    slots: tuple[Dim, ...]
    broadcasts: tuple[tuple[Dim, Dim, str], ...]
    nests: tuple[tuple[Dim, ...], ...] = ()
    """Each loop nest's extents, outermost first (see :data:`metadef.codegen.emit.TASK`)."""


class KernelStore(Protocol):
    """Where compiled kernels come from and go to, outside this process (the compile cache,
    L7, implements it; codegen never imports it). ``structure`` is the kernel's structural key."""

    def load(self, structure: str, name: str) -> KernelCode | None: ...

    def save(self, structure: str, name: str, code: KernelCode) -> None: ...

    def seen(self, structure: str, name: str, code: KernelCode) -> None:
        """The kernel (``code``) was found in this process's own cache."""

    # Optional, for processes sharing one compile (see load_or_claim): claim(structure, name)
    # after a missed load, and release(structure) when the compile failed.


class CompiledElsewhere(Exception):
    """Raised by a kernel store's ``claim`` when another process compiles the kernel and this
    one should go on with other work (a helper process of a parallel compile)."""


def load_or_claim(store: KernelStore | None, structure: str, name: str, wait: bool = True) -> KernelCode | None:
    """The stored code for ``structure``, else None with the kernel claimed for this process
    (when the store coordinates several processes): the caller compiles it and calls
    ``store.save``, or :func:`release` when the compile fails. ``wait=False``: raise
    :class:`CompiledElsewhere` rather than wait for another process's compile.

    Example:
        >>> load_or_claim(None, "structure", "name") is None
        True
    """
    code = None if store is None else store.load(structure, name)
    claim = getattr(store, "claim", None)
    return code if code is not None or claim is None else claim(structure, name, wait)


def release(store: KernelStore | None, structure: str) -> None:
    """Give back the claim :func:`load_or_claim` took, when no code was saved."""
    if (give_back := getattr(store, "release", None)) is not None:
        give_back(structure)


_STORE: ContextVar[KernelStore | None] = ContextVar("metadef_kernel_store", default=None)


@contextmanager
def kernel_store(store: KernelStore | None) -> Iterator[None]:
    """Consult ``store`` for every kernel compiled inside the ``with`` block.

    Example:
        >>> with kernel_store(None):
        ...     pass
    """
    token = _STORE.set(store)
    try:
        yield
    finally:
        _STORE.reset(token)


def current_store() -> KernelStore | None:
    """The kernel store in effect here (None outside :func:`kernel_store`)."""
    return _STORE.get()


__all__ = ["CompiledElsewhere", "KernelCode", "KernelStore", "current_store", "kernel_store", "load_or_claim",
           "release"]
