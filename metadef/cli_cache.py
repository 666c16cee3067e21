"""``metadef cache info`` and ``metadef cache clear``: look at and empty the compile cache.

Example:
    $ metadef cache info            # entries, size and hit/miss counts per level
    $ metadef cache info --json
    $ metadef cache clear
"""

from __future__ import annotations

import json

import click

from metadef.cache import LEVELS, Store


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"  # pragma: no cover


@click.group("cache")
def cache_group() -> None:
    """The on-disk compile cache (METADEF_CACHE_DIR, default ~/.cache/metadef).

    Example: metadef cache info --json
    """


@cache_group.command("info")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def cache_info(as_json: bool) -> None:
    """Entries, size and hit/miss counts per level.  Example: metadef cache info"""
    info = Store().info()
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"cache {info['root']}: {_size(info['bytes'])} of {_size(info['max_bytes'])}, "
               f"{info['evictions']} evictions")
    click.echo(f"{'level':<8}{'entries':>9}{'size':>12}{'hits':>8}{'misses':>8}{'corrupt':>9}")
    for level in LEVELS:
        row = info["levels"][level]
        click.echo(f"{level:<8}{row['entries']:>9}{_size(row['bytes']):>12}{row['hits']:>8}"
                   f"{row['misses']:>8}{row['corrupt']:>9}")


@cache_group.command("clear")
def cache_clear() -> None:
    """Delete every entry and the counters.  Example: metadef cache clear"""
    store = Store()
    removed = store.clear()
    click.echo(f"removed {removed} entries from {store.root}")


__all__ = ["cache_group"]
