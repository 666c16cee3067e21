"""Backends (L7): plugins that run graphs. ``reference`` is the numpy oracle."""

from metadef.backends.base import Backend, Executable, available_backends, get_backend

__all__ = ["Backend", "Executable", "available_backends", "get_backend"]
