"""The ``metadef`` command line.

Example:
    $ metadef zoo list
    $ metadef zoo export resnet50 -o resnet50.onnx
    $ metadef inspect resnet50.onnx
    $ metadef run resnet50.onnx --input input=img.npy -o out/
    $ metadef demo
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click
import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import metadef as md
from metadef.analysis import find_repeats, lower_bound
from metadef.cli_bench import bench_command
from metadef.cli_cache import cache_group
from metadef.cli_convert import convert_command, inspect_mdef, verify_command
from metadef.cli_progress import progress_option, show_progress, stage_bars
from metadef.core.errors import MetadefError
from metadef.passes import LEVELS
from metadef.passes.fuse_groups import group_summary
from metadef.report import report_command
from metadef.rewrite import DecisionLog
from metadef.testing.conformance import format_report, run_cases
from metadef.testing.model_suites import SUITES, run_suite
from metadef.testing.opdocs import write_ops_doc
from metadef.testing.oracle import compare_with_onnxruntime

# Pipes and CI logs get 120 columns rather than rich's 80, so tables stay on one line a row.
console = Console(width=None if sys.stdout.isatty() else 120)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 120)


class _Group(click.Group):
    """Turns metadef's typed errors into one clear line and exit code 2, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MetadefError as e:
            err_console.print(f"[bold red]error[/] ({type(e).__name__}): {escape(str(e))}", highlight=False)
            sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(md.__version__, prog_name="metadef")
def main() -> None:
    """metadef: import a model, infer its shapes, run it, check it against ONNX Runtime.

    Example: metadef convert resnet50 -o resnet50.mdef && metadef bench resnet50.mdef --vs onnxruntime
    """


# --- zoo ---------------------------------------------------------------------------------


@main.group()
def zoo() -> None:
    """The built-in models (built by metadef itself; nothing is downloaded).

    Example: metadef zoo list --json
    """


@zoo.command("list")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def zoo_list(as_json: bool) -> None:
    """List the zoo's models.  Example: metadef zoo list"""
    rows = [md.zoo.describe(n) for n in md.zoo.names()]
    if as_json:
        click.echo(json.dumps([{"name": r.name, "summary": r.summary,
                                "inputs": [[n, d, list(map(str, s))] for n, d, s in r.inputs]} for r in rows]))
        return
    table = Table("model", "inputs", "summary")
    for r in rows:
        table.add_row(r.name, escape(", ".join(f"{n}: {d}[{','.join(map(str, s))}]" for n, d, s in r.inputs)),
                      r.summary)
    console.print(table)


@zoo.command("export")
@click.argument("name")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="the .onnx file to write")
@click.option("--seed", default=0, show_default=True, help="seed of the deterministic weights")
def zoo_export(name: str, output: Path, seed: int) -> None:
    """Write a zoo model as ONNX.  Example: metadef zoo export bert -o bert.onnx"""
    if name not in md.zoo.names():
        raise click.BadParameter(f"unknown model {name!r}; choose from {', '.join(md.zoo.names())}")
    path = md.zoo.export(name, output, seed=seed)
    console.print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")


# --- inspect / run -------------------------------------------------------------------------


def _load_graph(path: str) -> md.Graph:
    if path in md.zoo.names() and not Path(path).exists():
        return md.import_onnx(md.zoo.build(path), name=path)
    return md.import_onnx(path)


def optimizer_options(fn: Any) -> Any:
    """The options every command that optimizes shares."""
    fn = click.option("--debug-log", type=click.Path(dir_okay=False, path_type=Path),
                      help="write every optimizer decision as JSON lines to this file")(fn)
    fn = click.option("--disable-rule", "disable_rules", multiple=True, metavar="RULE",
                      help="do not apply this rewrite or fusion rule (repeatable)")(fn)
    fn = click.option("--no-fuse", "no_fuse", multiple=True, metavar="NAME_OR_GLOB",
                      help="exclude matching nodes from fusion (repeatable)")(fn)
    fn = click.option("--optimize", "level", type=click.Choice(LEVELS), default=None,
                      help="optimization level (default: none)")(fn)
    return fn


def _optimized(graph: md.Graph, level: str | None, no_fuse: tuple[str, ...], disable_rules: tuple[str, ...],
               debug_log: Path | None, log: DecisionLog) -> md.Graph:
    if level is None:
        if no_fuse or disable_rules or debug_log:
            raise click.BadParameter("--no-fuse, --disable-rule and --debug-log need --optimize LEVEL")
        return graph
    return md.optimize(graph, level=level, no_fuse=no_fuse, disable_rules=disable_rules, log=log,
                       debug_log=debug_log)


def _inspect_info(g: md.Graph) -> dict[str, Any]:
    return {
        "name": g.name,
        "inputs": [{"name": v.name, "type": str(v.type)} for v in g.inputs],
        "outputs": [{"name": v.name, "type": str(v.type)} for v in g.outputs],
        "ops": g.op_counts(),
        "nodes": len(g.nodes),
        "parameters": g.num_parameters(),
        "parameter_bytes": int(sum(v.const.nbytes for v in g.constants)),
        "symbols": sorted(g.env.symbols),
    }


def _example_bindings(g: md.Graph) -> dict[str, int]:
    return {s: (128 if s == "seq" else 1) for s in g.env.symbols}


@main.command()
@click.argument("model")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--graph", "show_graph", is_flag=True, help="print the whole graph in text form")
@optimizer_options
def inspect(model: str, as_json: bool, show_graph: bool, level: str | None, no_fuse: tuple[str, ...],
            disable_rules: tuple[str, ...], debug_log: Path | None) -> None:
    """Ops, symbolic shapes and parameters of a model (an .onnx file or a zoo name); with
    --optimize, the optimized graph: op counts before and after, fused groups, repeated
    subgraphs, the live-memory lower bound and the optimizer's decisions (METADEF_DEBUG=1).

    Example: metadef inspect resnet50.onnx --optimize aggressive --no-fuse '/layer1/*'
    """
    if model.endswith(".mdef"):
        inspect_mdef(model, as_json=as_json)
        return
    before = _load_graph(model)
    log = DecisionLog()
    g = _optimized(before, level, no_fuse, disable_rules, debug_log, log)
    info = _inspect_info(g)
    if level is not None:
        bindings = _example_bindings(g)
        info["level"] = level
        info["ops_before"] = before.op_counts()
        info["fused_groups"] = [{"node": n, "kind": k, "members": m} for n, k, m in group_summary(g)]
        info["repeats"] = [{"count": r.count, "nodes": r.size,
                            "instances": [i.scope for i in r.instances]} for r in find_repeats(g)]
        info["live_memory_lower_bound"] = {"bindings": bindings, "bytes": lower_bound(g, bindings),
                                           "symbolic": str(lower_bound(g))}
        info["decisions"] = {"taken": len(log.taken()), "refused": len(log.refused())}
    if as_json:
        click.echo(json.dumps(info, indent=2, default=str))
        return
    if show_graph:
        click.echo(str(g))
        return
    _print_inspect(g, info, log)


def _print_inspect(g: md.Graph, info: dict[str, Any], log: DecisionLog) -> None:
    console.print(f"[bold]{escape(g.name)}[/]: {info['nodes']} nodes, {info['parameters']:,} parameters "
                  f"({info['parameter_bytes'] / 1e6:.1f} MB), symbols: {', '.join(info['symbols']) or 'none'}")
    io = Table("", "name", "type")
    for v in g.inputs:
        io.add_row("input", escape(v.name), escape(str(v.type)))
    for v in g.outputs:
        io.add_row("output", escape(v.name), escape(str(v.type)))
    console.print(io)
    before = info.get("ops_before")
    ops = Table("op", "count") if before is None else Table("op", "before", "after")
    for op in sorted(set(info["ops"]) | set(before or {}), key=lambda o: -(info["ops"].get(o, 0))):
        if before is None:
            ops.add_row(escape(op), str(info["ops"][op]))
        else:
            ops.add_row(escape(op), str(before.get(op, 0)), str(info["ops"].get(op, 0)))
    console.print(ops)
    if before is None:
        return
    console.print(f"optimized at [bold]{info['level']}[/]: {sum(before.values())} -> {info['nodes']} nodes; "
                  f"{len(log.taken())} rewrites taken, {len(log.refused())} refused")
    kinds: dict[str, int] = {}
    for grp in info["fused_groups"]:
        kinds[grp["kind"]] = kinds.get(grp["kind"], 0) + 1
    if kinds:
        console.print("fused groups: " + ", ".join(f"{n} x {escape(k)}" for k, n in sorted(kinds.items())))
    for r in info["repeats"]:
        console.print(f"repeated subgraph: {r['count']} x {r['nodes']} nodes "
                      f"({escape(r['instances'][0])} ... {escape(r['instances'][-1])})")
    lb = info["live_memory_lower_bound"]
    console.print(f"live-memory lower bound: {lb['bytes'] / 2**20:.2f} MiB at "
                  f"{', '.join(f'{k}={v}' for k, v in lb['bindings'].items())} "
                  f"(symbolic: {escape(lb['symbolic'])} bytes)")
    for d in log.refused()[:20]:
        console.print(f"  {escape(d.line())}", highlight=False)
    if len(log.refused()) > 20:
        console.print(f"  ... {len(log.refused()) - 20} more refusals (METADEF_DEBUG=1 or --debug-log lists all)")


def _parse_inputs(specs: tuple[str, ...]) -> dict[str, np.ndarray]:
    feeds = {}
    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep:
            raise click.BadParameter(f"--input expects NAME=FILE.npy, got {spec!r}")
        try:
            feeds[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise click.BadParameter(f"cannot read {file!r} for input {name!r}: {e}") from e
    return feeds


@main.command()
@click.argument("model")
@click.option("--input", "-i", "inputs", multiple=True, metavar="NAME=FILE.npy",
              help="an input array (repeat for each input); zoo models get example inputs if omitted")
@click.option("--target", default="reference", show_default=True, help="backend to run on")
@click.option("-o", "--output-dir", type=click.Path(file_okay=False, path_type=Path),
              help="save each output as NAME.npy here")
@click.option("--batch", default=1, show_default=True, help="batch of the example inputs (zoo models)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output (each output's stats, the times)")
@click.option("--profile", "profile_runs", type=click.IntRange(min=0), default=0, metavar="RUNS",
              help="then time each node over RUNS runs and print the slowest (Session.profile)")
@progress_option
@optimizer_options
def run(model: str, inputs: tuple[str, ...], target: str, output_dir: Path | None, batch: int, as_json: bool,
        profile_runs: int, progress: bool | None, level: str | None, no_fuse: tuple[str, ...],
        disable_rules: tuple[str, ...], debug_log: Path | None) -> None:
    """Run a model on inputs from .npy files and print (or save) its outputs; with
    ``--profile``, where a run's time goes, node by node.

    Example: metadef run mlp.onnx --input x=x.npy -o out/ --optimize aggressive
    """
    g = _optimized(_load_graph(model), level, no_fuse, disable_rules, debug_log, DecisionLog())
    feeds = _parse_inputs(inputs)
    if not feeds and model in md.zoo.names():
        feeds = md.zoo.describe(model).example_inputs(batch=batch)
    t0 = time.perf_counter()
    with stage_bars(["compile"], show_progress(progress, as_json)) as bar:
        options = {"progress": lambda done, total, _node: bar("compile", done, total)} if target == "x86" else {}
        sess = md.compile(g, target=target, **options)
    compile_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    outs = sess.run(feeds)
    elapsed = time.perf_counter() - t0
    rows = []
    for name, arr in outs.items():
        numeric = arr.dtype.kind in "fiub" and arr.size
        stats = {k: float(f(arr)) for k, f in (("min", np.min), ("max", np.max), ("mean", np.mean))} if numeric \
            else {}
        rows.append({"name": name, "shape": list(arr.shape), "dtype": str(arr.dtype), **stats})
        if output_dir is not None:
            output_dir.mkdir(parents=True, exist_ok=True)
            np.save(output_dir / f"{name.replace('/', '_')}.npy", arr)
    profile = sess.profile(feeds, runs=profile_runs) if profile_runs else None
    if as_json:
        click.echo(json.dumps({"model": model, "target": target, "compile_ms": compile_ms,
                               "run_ms": elapsed * 1e3, "outputs": rows,
                               **({"profile": profile.to_dict()} if profile is not None else {})}))
        return
    table = Table("output", "shape", "dtype", "min", "max", "mean")
    for row in rows:
        table.add_row(escape(row["name"]), str(row["shape"]), row["dtype"],
                      *(f"{row[k]:.5g}" if k in row else "" for k in ("min", "max", "mean")))
    console.print(table)
    console.print(f"compiled for {target} in {compile_ms:.0f} ms; ran in {elapsed * 1e3:.1f} ms")
    if profile is not None:
        click.echo(profile.table())


# --- demo --------------------------------------------------------------------------------


def _demo_runs(name: str) -> list[dict[str, int]]:
    if name == "bert":
        return [{"batch": 1, "seq": 128}, {"batch": 3, "seq": 37}]
    return [{"batch": 1}, {"batch": 3}]


@main.command()
@click.option("--model", "models", multiple=True, help="zoo model(s) to run (default: all)")
@click.option("--target", "targets", multiple=True, type=click.Choice(["reference", "x86"]),
              help="backend(s) to run on (default: both; x86 runs the graph optimized at aggressive)")
def demo(models: tuple[str, ...], targets: tuple[str, ...]) -> None:
    """Build each zoo model, import it with symbolic shapes, run it on the reference backend (the
    numpy oracle) and compiled for x86, and check both against ONNX Runtime.

    Example: metadef demo --model resnet50 --target x86
    """
    names = list(models) or md.zoo.names()
    failed = 0
    for name in names:
        failed += _demo_model(name, list(targets) or ["reference", "x86"])
    if failed:
        err_console.print(f"[red]{failed} output(s) differ from ONNX Runtime beyond rtol 1e-4, atol 1e-5, "
                          "and are further from the exact result than ONNX Runtime is[/]")
        sys.exit(1)
    console.print("[green]every output matches ONNX Runtime (rtol 1e-4, atol 1e-5), or, where both differ "
                  "by float32 rounding, is as close to the exact float64 result as ONNX Runtime[/]")


def _demo_model(name: str, targets: list[str]) -> int:
    t0 = time.perf_counter()
    proto = md.zoo.build(name)
    t1 = time.perf_counter()
    graph = md.import_onnx(proto, name=name)
    t2 = time.perf_counter()
    console.rule(f"[bold]{name}[/]: {len(graph.nodes)} nodes, {graph.num_parameters():,} parameters")
    console.print(f"built in {t1 - t0:.2f} s; imported and shape-inferred in {(t2 - t1) * 1e3:.0f} ms")
    for v in graph.inputs:
        console.print(f"  input  {v.name}: {v.type}", markup=False)
    for v in graph.outputs:
        console.print(f"  output {v.name}: {v.type}", markup=False)
    table = Table("target", "dims", "output", "|err| vs ORT", "vs exact: ours / ORT",
                  "metadef ms (first run)", "ORT ms (session + run)", "match")
    failed = 0
    for target in targets:
        runnable = graph
        if target == "x86":
            t3 = time.perf_counter()
            runnable = md.optimize(graph, level="aggressive")
            t4 = time.perf_counter()
            md.compile(runnable, target="x86")  # compiled once: later calls reuse every kernel
            console.print(f"x86: optimized in {(t4 - t3) * 1e3:.0f} ms ({len(runnable.nodes)} nodes), "
                          f"compiled in {(time.perf_counter() - t4) * 1e3:.0f} ms")
        for dims in _demo_runs(name):
            feeds = md.zoo.describe(name).example_inputs(**dims)
            check = compare_with_onnxruntime(proto, feeds, graph=runnable, target=target)
            for o in check.outputs:
                failed += not o.ok
                exact = "" if o.truth_err is None else f"{o.truth_err:.1e} / {o.peer_truth_err:.1e}"
                table.add_row(target, ", ".join(f"{k}={v}" for k, v in dims.items()), o.name,
                              f"{o.max_abs_err:.1e}", exact, f"{check.metadef_s * 1e3:.0f}",
                              f"{check.onnxruntime_s * 1e3:.0f}", "[green]yes[/]" if o.ok else "[red]NO[/]")
    console.print(table)
    return failed


# --- conformance and docs --------------------------------------------------------------


@main.command()
@click.option("--op", "ops", multiple=True, help="only this op's cases (repeatable)")
@click.option("--suite", "suites", multiple=True, type=click.Choice([*SUITES, "all"]),
              help="run this ONNX model suite instead of the node tests (repeatable; all: every suite)")
@click.option("-k", "pattern", help="only cases whose name matches this regex")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--target", default="reference", show_default=True,
              help="the backend to compile each case for (x86: fallbacks to reference kernels are counted)")
@progress_option
def conformance(ops: tuple[str, ...], suites: tuple[str, ...], pattern: str | None, as_json: bool,
                target: str, progress: bool | None) -> None:
    """Run the ONNX backend node tests through import and a backend (the reference by default),
    or, with --suite, the ONNX model suites (simple, pytorch-converted, pytorch-operator, light).

    Example: metadef conformance --op Conv --target x86

    Example: metadef conformance --suite all --target x86
    """
    if suites and ops:
        raise click.UsageError("--op selects node tests and --suite model suites: give one of them")
    with stage_bars(["cases"], show_progress(progress, as_json)) as bar:
        if suites:
            report = run_suite(SUITES if "all" in suites else suites, target=target, pattern=pattern,
                               progress=lambda done, total, _name: bar("cases", done, total))
        else:
            report = run_cases(list(ops) or None, pattern, target=target,
                               progress=lambda done, total: bar("cases", done, total))
    if as_json:
        click.echo(json.dumps({"target": target, "totals": report.totals(), "by_op": report.by_op(),
                               "fallbacks": dict(report.fallbacks()),
                               "failures": [r.__dict__ for r in report.failures()]}, indent=2))
    else:
        click.echo(format_report(report))
    sys.exit(1 if report.failures() else 0)


@main.group()
def docs() -> None:
    """Generate documentation from the registry.

    Example: metadef docs ops -o docs/ops.md --no-conformance
    """


@docs.command("ops")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("docs/ops.md"),
              show_default=True)
@click.option("--no-conformance", is_flag=True, help="skip running the node tests (faster)")
def docs_ops(output: Path, no_conformance: bool) -> None:
    """Write docs/ops.md: each op, its opsets, its semantics and its conformance.

    Example: metadef docs ops -o docs/ops.md
    """
    path = write_ops_doc(output, conformance=not no_conformance)
    console.print(f"wrote {path}")


main.add_command(convert_command)
main.add_command(verify_command)
main.add_command(bench_command)
main.add_command(cache_group)
main.add_command(report_command)

if __name__ == "__main__":
    main()
