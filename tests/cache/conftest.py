"""Every cache test gets its own empty METADEF_CACHE_DIR (the user's cache is never touched)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from metadef.cache import forget_in_memory


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "mdcache"
    monkeypatch.setenv("METADEF_CACHE_DIR", str(root))
    forget_in_memory()
    yield root
    forget_in_memory()
