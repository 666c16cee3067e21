"""From measured data to the report's PNGs (:func:`draw`) and its page (:func:`compose`): a
header about the model and the machine, then one section per figure with the numbers behind
it in tables.

Example:
    >>> from metadef.report.collect import NodeInfo
    >>> rows = [NodeInfo("a", "Relu", "a", "elementwise", False, ("Relu",))]
    >>> "<table>" in _groups_table(rows)
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from matplotlib.figure import Figure

from metadef.cli_bench import METADEF, PEER_LABELS, BenchRow
from metadef.report import figures
from metadef.report.collect import NodeInfo, ReportData, environment, machine_summary
from metadef.report.figures import format_bytes, top_steps
from metadef.report.html import FigureImage, Section, details, paragraph, render_page, table
from metadef.report.layout import layout_dag

TITLES = {
    "graph": "1. The optimized graph, fused groups colored",
    "memory": "2. Memory: tensor lifetimes in the arena",
    "steps": "3. Time per fused group (x86 backend)",
    "bench": "4. metadef against ONNX Runtime",
}


def draw(data: ReportData, graph_items: tuple[list[NodeInfo], list[list[int]]], top: int,
         on_figure: Callable[[int], None] | None = None) -> tuple[dict[str, bytes], dict[str, float]]:
    """The PNG of each figure and its width in inches (figure 4 only with benchmark rows);
    ``on_figure(done)`` after each. :func:`metadef.report.write_report` calls it (and shows
    it at work in its example)."""
    items, parents = graph_items
    makers: dict[str, Callable[[], Figure]] = {
        "graph": lambda: figures.graph_figure(items, layout_dag(parents)),
        "memory": lambda: figures.memory_figure(data.memory, data.infos),
        "steps": lambda: figures.steps_figure(data.steps, data.infos, top, data.step_runs),
    }
    if data.rows:
        makers["bench"] = lambda: figures.bench_figure(data.rows)
    pngs: dict[str, bytes] = {}
    widths: dict[str, float] = {}
    for name, make in makers.items():
        fig = make()
        pngs[name], widths[name] = figures.png_bytes(fig), float(fig.get_size_inches()[0])
        if on_figure is not None:
            on_figure(len(pngs))
    return pngs, widths


def _header(data: ReportData) -> list[tuple[str, str]]:
    env = environment()
    g, before = data.graph, data.before
    binding = ", ".join(f"{k}={v}" for k, v in data.bindings.items()) or "static shapes"
    groups = sum(i.fused for i in data.infos)
    rows = [
        ("model", f"{data.name} ({data.source})"),
        ("inputs", "; ".join(f"{v.name}: {v.type} -> {list(data.feeds[v.name].shape)}" for v in g.inputs)),
        ("outputs", "; ".join(f"{v.name}: {v.type}" for v in g.outputs)),
        ("measured at", binding),
        ("nodes", f"{len(before.nodes)} imported -> {len(g.nodes)} after optimizing at aggressive "
                  f"({groups} fused groups)"),
        ("parameters", f"{before.num_parameters():,}"),
        ("optimize / compile", f"{data.optimize_s:.2f} s import and optimize, {data.compile_s:.2f} s x86 compile"),
        ("metadef", env["metadef"]),
        ("python / numpy", f"{env['python']} / {env['numpy']}"),
    ]
    rows += [(f"machine: {k}", v) for k, v in machine_summary().items()]
    rows.append(("generated", env["generated"]))
    return rows


def _groups_table(infos: Sequence[NodeInfo]) -> str:
    return table(["node", "kind", "ops"], [[i.name, i.category, " + ".join(i.members)] for i in infos])


def _graph_section(data: ReportData, image: FigureImage) -> Section:
    before, after = data.before.op_counts(), data.graph.op_counts()
    ops = sorted(set(before) | set(after), key=lambda op: (-after.get(op, 0), -before.get(op, 0), op))
    fused = [i for i in data.infos if i.fused]
    body = [
        paragraph(f"Each box is a node of the optimized graph ({len(data.graph.nodes)} nodes), placed by topological "
                  "depth (top to bottom, then the next column); a fused group shows its member ops in bold and a "
                  "single node its op, over its name. Strong colors are fused groups, pale ones single ops, by kind. "
                  "Edges that skip a few levels bow to the right; edges to a far level or another column are drawn "
                  "as dashed stubs at both ends. Click the figure to fit it to the page."),
        image.html(),
        details(f"fused groups ({len(fused)})", _groups_table(fused)),
        details("op counts before and after optimization",
                table(["op", "imported", "optimized"], [[op, before.get(op, 0), after.get(op, 0)] for op in ops])),
    ]
    return Section("graph", TITLES["graph"], "".join(body))


def _memory_section(data: ReportData, image: FigureImage) -> Section:
    m = data.memory
    total = sum(b.size for b in m.buffers)
    summary = [
        ["binding", ", ".join(f"{k}={v}" for k, v in m.bindings.items()) or "static shapes"],
        ["intermediate tensors", len(m.buffers)],
        ["planned arena peak", format_bytes(m.peak)],
        ["lifetime lower bound (most bytes live at one step)", format_bytes(m.lower_bound)],
        ["peak / lower bound", f"{m.ratio:.3f}"],
        ["all intermediates, no reuse", format_bytes(total)],
    ]
    if data.program_arena is not None:
        summary.append(["the x86 program's own arena (views share bytes; kernel scratch included)",
                        format_bytes(data.program_arena)])
    buffers = sorted(m.buffers, key=lambda b: (-b.size, b.start))
    body = [
        paragraph("Each rectangle is one intermediate tensor (a node output that is not a graph output): it spans "
                  "the steps from the one that writes it to the last one that reads it, at its offset in the arena "
                  "planned by metadef.analysis.arena.plan_arena. Its color is the kind of the node that writes it."),
        image.html(),
        table(["quantity", "value"], summary),
        details(f"every tensor ({len(buffers)}), largest first",
                table(["tensor", "written by", "bytes", "steps", "offset"],
                      [[b.name, data.infos[b.producer].name, b.size, f"{b.start}..{b.end}", b.offset]
                       for b in buffers])),
    ]
    return Section("memory", TITLES["memory"], "".join(body))


def _steps_section(data: ReportData, image: FigureImage, top: int) -> Section:
    total = sum(s.ms for s in data.steps) or 1.0
    shown = top_steps(data.steps, top)
    body = [
        paragraph(f"The compiled graph's native program on the x86 backend, each group of native calls "
                  f"timed as it runs in a whole run, a step's groups summed (metadef.benchmark.step_times, "
                  f"Session.profile; median of {data.step_runs} runs, "
                  f"at {', '.join(f'{k}={v}' for k, v in data.bindings.items()) or 'static shapes'}). "
                  "Each group timed apart carries a call's overhead, about a microsecond."),
        image.html(),
        table(["#", "step", "ops", "kind", "ms", "share"],
              [[k + 1, data.infos[s.node].name, data.infos[s.node].label, data.infos[s.node].category,
                round(s.ms, 4), f"{100 * s.ms / total:.1f}%"] for k, s in enumerate(shown)]),
    ]
    return Section("steps", TITLES["steps"], "".join(body))


def _bench_table(rows: Sequence[BenchRow]) -> str:
    peers = list(rows[0].ratio) if rows else []
    headers = ["threads", "batch", "metadef p50 ms", "metadef p90 ms"]
    for p in peers:
        label = PEER_LABELS.get(p, p)
        headers += [f"{label} p50 ms", f"{label} p90 ms", f"ratio vs {label}", f"{label} setup s"]
    headers += ["runs", "foreign cores", "attempts"]
    body = []
    for r in rows:
        cells: list[object] = [r.threads, r.batch, round(r.latency[METADEF].p50_ms, 4),
                               round(r.latency[METADEF].p90_ms, 4)]
        for p in peers:
            cells += [round(r.latency[p].p50_ms, 4), round(r.latency[p].p90_ms, 4), round(r.ratio[p], 3),
                      round(r.setup_s[p], 2)]
        body.append([*cells, r.latency[METADEF].runs, round(r.foreign_cores, 2), r.attempts])
    return table(headers, body)


def _bench_section(data: ReportData, image: FigureImage | None) -> Section:
    if image is None:
        body = "".join(paragraph(n, "note") for n in data.notes if "ONNX Runtime" in n)
        return Section("bench", TITLES["bench"], body or paragraph("no benchmark rows", "note"))
    body = [
        paragraph("Latency of the whole model on metadef's x86 backend and on ONNX Runtime (ORT_ENABLE_ALL), run "
                  "turn by turn in one process (metadef.cli_bench.run_bench), so that foreign load hits both alike; "
                  "the ratio is metadef p50 / ORT p50. ORT's setup is its session creation."),
        image.html(),
        _bench_table(data.rows),
        *(paragraph(f"warning: {w}", "note") for r in data.rows for w in r.warnings),
    ]
    return Section("bench", TITLES["bench"], "".join(body))


def compose(data: ReportData, pngs: dict[str, bytes], widths: dict[str, float], top: int) -> str:
    """The report page, the figures inline (see :func:`metadef.report.write_report`)."""
    images = {name: FigureImage(png, widths[name], TITLES[name], natural=name == "graph")
              for name, png in pngs.items()}
    sections = [
        _graph_section(data, images["graph"]),
        _memory_section(data, images["memory"]),
        _steps_section(data, images["steps"], top),
        _bench_section(data, images.get("bench")),
    ]
    return render_page(f"metadef report: {data.name}", _header(data), sections,
                       subtitle="the optimized graph, its memory, where the time goes, and how it compares")


__all__ = ["TITLES", "compose", "draw"]
