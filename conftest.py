"""Test-wide settings: compiled code is cached in a temporary directory, never in the user's
cache (tests/cache/ gives each of its tests an empty one of its own); compiles run in one
process (pytest-xdist already keeps every core busy; tests/backends/x86/test_parallel_compile.py
runs compile helpers)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    old = os.environ.get("METADEF_CACHE_DIR")
    os.environ["METADEF_CACHE_DIR"] = str(tmp_path_factory.mktemp("metadef-cache"))
    os.environ.setdefault("METADEF_COMPILE_WORKERS", "1")
    yield
    if old is None:
        os.environ.pop("METADEF_CACHE_DIR", None)
    else:
        os.environ["METADEF_CACHE_DIR"] = old
