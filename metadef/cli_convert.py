"""The .mdef commands: ``metadef convert``, ``metadef verify``, the .mdef side of ``metadef
inspect``, and the standalone ``metadef-convert``.

Example:
    $ metadef convert model.onnx -o model.mdef --optimize aggressive --quantize int8
    $ metadef-convert --input=model.onnx --output=model.mdef --optimize=moderate --quantize=int4
    $ metadef inspect model.mdef
    $ metadef verify model.mdef
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from metadef.cli_progress import progress_option, show_progress, stage_bars
from metadef.convert import STAGES, ConvertReport, convert
from metadef.core.errors import MetadefError
from metadef.format import open_mdef
from metadef.passes import LEVELS

console = Console(width=None if sys.stdout.isatty() else 120)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 120)
QUANTIZE_CHOICES = ("float16", "bfloat16", "int8", "int4")
FORMAT_NAMES = {0: "plain", 1: "float16", 2: "bfloat16", 3: "int8", 4: "int4", 5: "float32"}


def _mb(n: int) -> str:
    return f"{n / 1e6:,.2f} MB" if n >= 10**5 else f"{n:,} B"


def convert_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options ``metadef convert`` and ``metadef-convert`` share."""
    for option in reversed([
        click.option("--optimize", "level", type=click.Choice([lv for lv in LEVELS if lv != "none"]),
                     help="optimization level (default: none)"),
        click.option("--quantize", type=click.Choice(QUANTIZE_CHOICES), help="store contraction weights as this"),
        click.option("--prune", type=float, metavar="T", help="zero weights with |w| < T, stored compactly"),
        click.option("--precision", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="per-layer precision YAML (default: fp16, conv1: fp32, ...)"),
        click.option("--compat-backward", metavar="X.Y", help="write this older format version"),
        click.option("--alignment", type=int, default=64, show_default=True, help="tensor alignment (64 or 4096)"),
        click.option("--tf-inputs", help="TensorFlow .pb: input names (x:0,...)"),
        click.option("--tf-outputs", help="TensorFlow .pb: output names"),
        click.option("--json", "as_json", is_flag=True, help="print the report as JSON"),
        progress_option,
    ]):
        fn = option(fn)
    return fn


def _run(source: str, output: Path, level: str | None, quantize: str | None, prune: float | None,
         precision: Path | None, compat_backward: str | None, alignment: int, tf_inputs: str | None,
         tf_outputs: str | None, as_json: bool, progress: bool | None) -> None:
    with stage_bars(STAGES, show_progress(progress, as_json)) as bar:
        report = convert(source, output, optimize=level, quantize=quantize, prune=prune, precision=precision,
                         compat_backward=compat_backward, alignment=alignment, progress=bar,
                         tf_inputs=tf_inputs, tf_outputs=tf_outputs)
    if as_json:
        click.echo(json.dumps(report_json(report), indent=2))
    else:
        print_report(report)


def report_json(report: ConvertReport) -> dict[str, Any]:
    """The report as JSON-able data."""
    return {"input": report.input, "output": str(report.output), "optimize": report.level,
            "version": ".".join(map(str, report.version)), "ratio": report.ratio, "notes": report.notes,
            "stages": {s.name: s.seconds for s in report.stages},
            "sections": [s.__dict__ for s in report.sections],
            "layers": [{**row.__dict__, "shape": list(row.shape)} for row in report.layers]}


def print_report(report: ConvertReport) -> None:
    """The summary: sizes per section before/after, quantization error per layer."""
    for note in report.notes:
        console.print(f"[yellow]note[/]: {escape(note)}")
    sizes = Table("section", "float32 file", "written", "ratio", title=f"{escape(str(report.output))}")
    for s in report.sections:
        ratio = f"{s.after / s.before:.3f}" if s.before else ""
        style = "bold" if s.name == "file" else ""
        sizes.add_row(escape(s.name), _mb(s.before), _mb(s.after), ratio, style=style)
    console.print(sizes)
    if report.layers:
        errs = Table("tensor", "node", "stored", "shape", "bytes", "max |err|", "rel L2")
        for row in report.layers:
            stored = row.scheme + (" sparse" if row.sparse else "")
            errs.add_row(escape(row.tensor), escape(row.node), stored, "x".join(map(str, row.shape)),
                         f"{_mb(row.bytes_before)} -> {_mb(row.bytes_after)}", f"{row.max_abs_error:.3g}",
                         f"{row.rel_l2_error:.3g}")
        console.print(errs)
        worst = max(report.layers, key=lambda r: r.rel_l2_error)
        console.print(f"{len(report.layers)} weights stored quantized or pruned; worst relative L2 error "
                      f"{worst.rel_l2_error:.3g} ({escape(worst.tensor)})")
    times = ", ".join(f"{s.name} {s.seconds:.2f} s" for s in report.stages)
    console.print(f"wrote {escape(str(report.output))}: {_mb(report.size_after)}, {report.ratio:.3f} of the "
                  f"float32 file ({times})")


@click.command("convert")
@click.argument("source")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="the .mdef file to write")
@convert_options
def convert_command(source: str, output: Path, **options: Any) -> None:
    """Convert a model (.onnx, a zoo name, TensorFlow .pb / SavedModel via tf2onnx) to one .mdef file.

    Example: metadef convert model.onnx -o model.mdef --optimize aggressive --quantize int8
    """
    _run(source, output, **options)


def inspect_mdef(path: str | Path, as_json: bool = False) -> None:
    """Print the four metadata layers and the tensor table of an .mdef file (``metadef inspect``)."""
    with open_mdef(path, checksum_verify="never") as f:
        rows = [f.tensor_info(n) for n in f.tensor_names()]
        if as_json:
            click.echo(json.dumps({"path": str(f.path), "version": list(f.version), "size": f.size,
                                   "layers": f.layers, "code_targets": f.code_targets(),
                                   "code_hashes": {t: f.code_hash(t) for t in f.code_targets()},
                                   "tensors": [{"name": r.name, "dtype": r.dtype.name, "shape": list(r.shape),
                                                "format": FORMAT_NAMES.get(r.format, str(r.format)),
                                                "sparse": bool(r.flags & 1), "bytes": r.nbytes,
                                                "offset": r.offset} for r in rows]}, indent=2))
            return
        console.print(f"[bold]{escape(str(f.path))}[/]: format {f.version[0]}.{f.version[1]}, {_mb(f.size)}, "
                      f"{len(rows)} tensors, {'mapped' if f.mmapped else 'read into memory'}")
        layers = Table("layer", "key", "value", title="metadata layers")
        for name in ("hardware", "summary", "parameters", "auxiliary"):
            for key, value in f.layers[name].items():
                if name == "parameters" and key == "tensors" and len(value) > 4:
                    value = f"<{len(value)} entries: see the tensor table and inspect --json>"
                text = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))
                layers.add_row(name, escape(key), escape(text if len(text) <= 300 else text[:297] + "..."))
                name = ""
        console.print(layers)
        table = Table("name", "dtype", "shape", "format", "bytes", "offset", "rel L2 err", title="tensors (file order)")
        for r in rows:
            fmt = FORMAT_NAMES.get(r.format, str(r.format)) + (" sparse" if r.flags & 1 else "")
            err = (r.quantization or {}).get("rel_l2_error")
            table.add_row(escape(r.name), r.dtype.name, "x".join(map(str, r.shape)) or "scalar", fmt,
                          f"{r.nbytes:,}", f"{r.offset:,}", "" if err is None else f"{err:.3g}")
        console.print(table)
        for target in f.code_targets():  # the hash is what safety.trusted_code_hashes pins
            console.print(f"precompiled code for {escape(target)}: {f.code_hash(target)}")


@click.command("verify")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True,
              help="machine-readable output: path, ok, sections, tensors, bytes, seconds, failures")
def verify_command(path: Path, as_json: bool) -> None:
    """Check every checksum of an .mdef file (header, table, sections, tensors); exit code 1 on
    any failure.

    Example: metadef verify model.mdef --json
    """
    try:
        with open_mdef(path, checksum_verify="never") as f:
            report = f.verify()
    except MetadefError as e:  # the structure itself is damaged: that is a verification failure
        if as_json:
            click.echo(json.dumps({"path": str(path), "ok": False, "failures": [f"{type(e).__name__}: {e}"]},
                                  indent=2))
            sys.exit(1)
        err_console.print(f"[bold red]FAILED[/] {escape(str(path))}: {escape(str(e))}", highlight=False,
                          soft_wrap=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps({"path": str(path), "ok": report.ok, **asdict(report)}, indent=2))
        sys.exit(0 if report.ok else 1)
    if report.ok:
        console.print(f"[green]OK[/] {escape(str(path))}: {escape(str(report))}", highlight=False)
        return
    err_console.print(f"[bold red]FAILED[/] {escape(str(path))}: {escape(str(report))}", highlight=False)
    sys.exit(1)


class _Standalone(click.Command):
    """``metadef-convert``: typed errors become one clear line and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MetadefError as e:
            err_console.print(f"[bold red]error[/] ({type(e).__name__}): {escape(str(e))}", highlight=False,
                              soft_wrap=True)
            sys.exit(2)


@click.command("metadef-convert", cls=_Standalone, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--input", "-i", "source", required=True, help="the model: .onnx, a zoo name, .pb or SavedModel")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="the .mdef file to write")
@convert_options
def convert_main(source: str, output: Path, **options: Any) -> None:
    """Convert a model to one .mdef file (the same as ``metadef convert``).

    Example: metadef-convert --input=model.onnx --output=model.mdef --optimize=aggressive --quantize=int8
    """
    _run(source, output, **options)


__all__ = ["convert_command", "convert_main", "inspect_mdef", "print_report", "report_json", "verify_command"]
