"""Progress bars for the long commands (convert, compile, bench, conformance), on stderr.

A bar shows when stderr is a terminal, or when the user asks with ``--progress``; never by
default with ``--json`` (scripts read stdout, and a log of stderr should not fill with bar
frames). The library never prints progress: its long functions take a callback
``progress(stage, done, total)`` (``metadef.convert``, ``metadef bench``'s ``run_bench``, the
x86 backend's ``compile(progress=...)``) or ``progress(done, total[, name])`` (the conformance
runners), and :func:`stage_bars` turns such calls into one bar per stage.

Example:
    >>> with stage_bars(["compile", "measure"], enabled=False) as progress:
    ...     progress("compile", 3, 10)
    >>> show_progress(None, as_json=True)
    False
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

StageProgress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: ``done`` of ``total`` steps of ``stage`` are finished."""


def show_progress(flag: bool | None, as_json: bool = False) -> bool:
    """Whether to draw bars: as ``--progress/--no-progress`` says, else when stderr is a
    terminal and the output is not ``--json``."""
    if flag is not None:
        return flag
    return sys.stderr.isatty() and not as_json


def progress_option(fn: Callable[..., object]) -> Callable[..., object]:
    """The ``--progress/--no-progress`` option of the long commands."""
    return click.option("--progress/--no-progress", "progress", default=None,
                        help="progress bars on stderr (default: when stderr is a terminal and not --json)")(fn)


@contextmanager
def stage_bars(stages: Sequence[str], enabled: bool, width: int = 12) -> Iterator[StageProgress]:
    """One bar per stage on stderr (removed when done); yields the callback that moves them.
    A stage not listed in ``stages`` gets its bar on its first call. Disabled: the callback
    does nothing. Enabled while stderr is no terminal (``--progress`` asked for them), the
    bars are drawn all the same, as a terminal would show them."""
    terminal = sys.stderr.isatty()
    console = Console(stderr=True, width=None if terminal else 120, force_terminal=enabled or None)
    columns = (TextColumn(f"{{task.description:<{width}}}"), BarColumn(),
               TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=not enabled) as bars:
        tasks: dict[str, TaskID] = {s: bars.add_task(s, total=None, start=False) for s in stages}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bars.add_task(stage, total=None, start=False)
            bars.start_task(tasks[stage])
            bars.update(tasks[stage], completed=done, total=max(total, 1))

        yield progress


__all__ = ["StageProgress", "progress_option", "show_progress", "stage_bars"]
