"""``metadef report MODEL -o report.html``: the command around :func:`~metadef.report.write_report`.

Progress bars go to stderr (:mod:`metadef.cli_progress`: when stderr is a terminal, or with
``--progress``), and so do the benchmark's warnings; ``--json`` prints what was written to
stdout.

Example:
    $ metadef report resnet50 -o resnet50.html --threads 1 2 --runs 20
    $ metadef report model.onnx -o model.html --no-bench --json
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from metadef.cli_bench import spread_list_options
from metadef.cli_progress import progress_option, show_progress, stage_bars
from metadef.report.build import STAGES, write_report


class _ListOptions(click.Command):
    """Lets ``--threads 1 2`` mean ``--threads 1 --threads 2`` (as ``metadef bench`` does)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, spread_list_options(args, ["--threads"]))


@click.command("report", cls=_ListOptions)
@click.argument("model")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="the HTML file to write (default: MODEL's name + .html); figures go to <name>_files/")
@click.option("--runs", type=int, default=10, show_default=True,
              help="timed runs per benchmark configuration (and up to 10 profiled runs)")
@click.option("--threads", "threads", type=int, multiple=True, default=(1, 2), show_default=True,
              help="thread counts to benchmark (repeat the option, or list them: --threads 1 2)")
@click.option("--batch", type=int, default=1, show_default=True, help="batch size of every measurement")
@click.option("--top", type=int, default=20, show_default=True, help="steps shown in the time-per-group figure")
@click.option("--no-bench", "no_bench", is_flag=True, help="skip the comparison with ONNX Runtime")
@click.option("--json", "as_json", is_flag=True, help="print a summary of what was written, as JSON")
@progress_option
def report_command(model: str, output: Path | None, runs: int, threads: tuple[int, ...], batch: int, top: int,
                   no_bench: bool, as_json: bool, progress: bool | None) -> None:
    """An HTML report on MODEL (a zoo name, an .onnx or an .mdef file): the optimized graph with
    its fused groups, the memory timeline, the time per fused group on x86, and the latency
    against ONNX Runtime, each figure with its numbers.

    Example: metadef report resnet50 -o resnet50.html --threads 1 2 --runs 20
    """
    def echo(line: str) -> None:
        click.echo(line, err=True)

    target = output if output is not None else Path(f"{Path(model).stem}.html")
    stages = [s for s in STAGES if not (no_bench and s.startswith("bench"))]
    with stage_bars(stages, show_progress(progress, as_json)) as bar:
        result = write_report(model, target, runs=runs, threads=threads, batch=batch, bench=not no_bench, top=top,
                              progress=bar, echo=echo)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=1))
    else:
        click.echo(f"wrote {result.html} ({len(result.figures)} figures in {result.html.stem}_files/) "
                   f"in {result.seconds:.1f} s")


__all__ = ["report_command"]
