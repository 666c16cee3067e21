"""The report's four figures, drawn with matplotlib's object API (Agg; no pyplot, no global
backend switch), each returned as a :class:`~matplotlib.figure.Figure`; :func:`png_bytes`
renders one.

One color scheme runs through the figures: the hue says what anchors a node (blue a
contraction, orange a reduction, green elementwise work, gray data movement, purple opaque
ops), a strong tone marks a fused group and a pale one a single op; see :func:`color_of`.

Example:
    >>> from metadef.report.layout import layout_dag
    >>> from metadef.report.collect import NodeInfo
    >>> infos = [NodeInfo("a", "Relu", "a", "elementwise", False, ("Relu",)),
    ...          NodeInfo("b", "MatMul+Add", "b", "contraction+epilogue", True, ("MatMul", "Add"))]
    >>> png = png_bytes(graph_figure(infos, layout_dag([[], [0]])))
    >>> png[:8] == b"\\x89PNG\\r\\n\\x1a\\n"
    True
"""

from __future__ import annotations

import io
import math
from collections import Counter
from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from metadef.cli_bench import METADEF, PEER_LABELS, BenchRow
from metadef.report.collect import MemoryTimeline, NodeInfo, StepTime
from metadef.report.layout import BOX_HEIGHT, BOX_WIDTH, GraphLayout

DPI = 150
"""The resolution the PNGs are rendered at (the page shows them at 96 per inch: sharp on a
high-density screen, and zoomable)."""
FUSED_COLORS = {
    "contraction+epilogue": "#5b9bd5",
    "prologue+contraction+epilogue": "#3f7fbf",
    "prologue+reduction": "#f0a04b",
    "reduction+epilogue": "#e07b39",
    "prologue+reduction+epilogue": "#c8643b",
    "elementwise": "#6dbf67",
}
"""Fused groups by kind: strong tones, hue by the anchor's role."""
SINGLE_COLORS = {
    "contraction": "#cfe0f3",
    "reduction": "#fbe0c3",
    "elementwise": "#dcefd9",
    "broadcast": "#dcefd9",
    "injective": "#e6e6e6",
    "opaque": "#e9ddef",
    "io": "#ffffff",
}
"""Single ops by fusion role (and graph inputs / outputs): pale tones."""
SPARE_COLORS = ("#b07cc6", "#d4a017", "#59a89c", "#e377c2", "#8c8c3c")
"""For a kind the tables above do not know (a new fusion rule): given in order of first use."""
LEGEND_COLUMNS = 4
"""The graph figure's legend sits top left in at most this many columns (in view when the
page shows a wide graph at its natural size)."""
EDGE_COLOR = "#7a7a7a"
STUB_COLOR = "#9a9a9a"
METADEF_COLOR = "#3f7fbf"
ORT_COLOR = "#9a9a9a"
FASTER_COLOR = "#2e7d32"
SLOWER_COLOR = "#c0392b"


def color_of(info: NodeInfo, spare: dict[str, str] | None = None) -> str:
    """The fill color of a node (see the module doc); ``spare`` remembers colors given to
    kinds no table knows, so one figure (or several) gives each the same one.

    Example:
        >>> color_of(NodeInfo("n", "Conv+Relu", "n", "contraction+epilogue", True, ("Conv", "Relu")))
        '#5b9bd5'
    """
    table = FUSED_COLORS if info.fused else SINGLE_COLORS
    if info.kind in table:
        return table[info.kind]
    spare = spare if spare is not None else {}
    key = info.category
    if key not in spare:
        spare[key] = SPARE_COLORS[len(spare) % len(SPARE_COLORS)]
    return spare[key]


def png_bytes(fig: Figure, dpi: int = DPI) -> bytes:
    """``fig`` rendered as PNG.

    Example:
        >>> png_bytes(Figure(figsize=(1, 1)), dpi=10)[:4]
        b'\\x89PNG'
    """
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, facecolor="white")
    return buf.getvalue()


def _legend_order(infos: Sequence[NodeInfo]) -> list[tuple[NodeInfo, int]]:
    """One node of each category with the category's count: fused groups first, most first."""
    counts = Counter(i.category for i in infos)
    first: dict[str, NodeInfo] = {}
    for i in infos:
        first.setdefault(i.category, i)
    return sorted(((first[c], n) for c, n in counts.items()),
                  key=lambda pair: (not pair[0].fused, pair[0].kind == "io", -pair[1], pair[0].category))


# ------------------------------------------------------------------------------ the graph


def graph_figure(infos: Sequence[NodeInfo], layout: GraphLayout, min_width: float = 8.0) -> Figure:
    """Figure 1: each item of ``infos`` a box at its place in ``layout``, labelled with its op
    (or a group's member ops) over its short name, colored by :func:`color_of`; edges as the
    layout routes them; a legend of the categories with their counts on top (see the module
    example)."""
    spare: dict[str, str] = {}
    entries = _legend_order(infos)
    width = max(layout.width, min_width)
    columns = max(1, min(len(entries) + 1, int(width // 2.9), LEGEND_COLUMNS))
    band = 0.3 + 0.22 * math.ceil((len(entries) + 1) / columns)
    height = layout.height + band
    fig = Figure(figsize=(width, height))
    ax = fig.add_axes((0.0, 0.0, 1.0, layout.height / height))
    shift = (width - layout.width) / 2
    ax.set_xlim(-shift, width - shift)
    ax.set_ylim(layout.height, 0.0)
    ax.axis("off")
    places = {p.index: p for p in layout.places}
    stubs_in: Counter[int] = Counter()
    stubbed_out: set[int] = set()
    for link in layout.links:
        a, b = places[link.source], places[link.target]
        if link.route == "line":
            _arrow(ax, (a.x, a.y + BOX_HEIGHT / 2), (b.x, b.y - BOX_HEIGHT / 2), 0.0)
        elif link.route == "arc":
            start, end = (a.x + BOX_WIDTH / 2, a.y), (b.x + BOX_WIDTH / 2, b.y)
            distance = math.dist(start, end)
            _arrow(ax, start, end, -2 * link.bow / distance if distance else 0.0)
        else:
            if link.source not in stubbed_out:
                stubbed_out.add(link.source)
                ax.plot([a.x + 0.25, a.x + 0.4], [a.y + BOX_HEIGHT / 2, a.y + BOX_HEIGHT / 2 + 0.15],
                        color=STUB_COLOR, lw=0.9, ls=(0, (2, 1.5)), zorder=1)
            k = stubs_in[link.target]
            stubs_in[link.target] += 1
            x = b.x - 0.35 + 0.14 * k
            _arrow(ax, (x - 0.12, b.y - BOX_HEIGHT / 2 - 0.17), (x, b.y - BOX_HEIGHT / 2), 0.0,
                   color=STUB_COLOR, dashed=True)
    for p in layout.places:
        info = infos[p.index]
        ax.add_patch(FancyBboxPatch((p.x - BOX_WIDTH / 2, p.y - BOX_HEIGHT / 2), BOX_WIDTH, BOX_HEIGHT,
                                    boxstyle="round,pad=0,rounding_size=0.06", facecolor=color_of(info, spare),
                                    edgecolor="#333333" if info.fused else "#777777",
                                    linewidth=0.9 if info.fused else 0.6,
                                    linestyle="--" if info.kind == "io" else "-", zorder=2))
        named = info.short not in ("", info.label)
        ax.text(p.x, p.y - 0.075 if named else p.y, info.label, ha="center", va="center", fontsize=8,
                fontweight="bold" if info.fused else "normal", zorder=3)
        if named:
            ax.text(p.x, p.y + 0.105, info.short, ha="center", va="center", fontsize=6, color="#333333", zorder=3)
    handles: list[Patch | Line2D] = [
        Patch(facecolor=color_of(i, spare), edgecolor="#555555", label=f"{i.category} ({n})") for i, n in entries]
    handles.append(Line2D([], [], color=STUB_COLOR, ls=(0, (2, 1.5)), label="edge continued (far or next column)"))
    fig.legend(handles=handles, loc="upper left", ncol=columns, frameon=False, fontsize=8,
               bbox_to_anchor=(0.15 / width, 1.0), handlelength=1.6, columnspacing=1.4)
    return fig


def _arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float], rad: float, *,
           color: str = EDGE_COLOR, dashed: bool = False) -> None:
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=7, color=color, lw=0.8,
                                 linestyle=(0, (2, 1.5)) if dashed else "-", shrinkA=0, shrinkB=0,
                                 connectionstyle=f"arc3,rad={rad:.4f}", zorder=1))


# ----------------------------------------------------------------------------- the memory


def _byte_unit(n: int) -> tuple[float, str]:
    for size, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= size:
            return float(size), name
    return 1.0, "bytes"


def format_bytes(n: int) -> str:
    """``n`` bytes in the largest unit it reaches.

    Example:
        >>> format_bytes(3 * 2**20 // 2), format_bytes(100)
        ('1.50 MiB', '100 bytes')
    """
    size, unit = _byte_unit(n)
    return f"{n} bytes" if unit == "bytes" else f"{n / size:.2f} {unit}"


def memory_figure(memory: MemoryTimeline, infos: Sequence[NodeInfo]) -> Figure:
    """Figure 2: one rectangle per buffer (steps ``start..end`` across, ``offset..offset+size``
    up), colored by the node that writes it; the planned peak, the lifetime lower bound and
    the bytes live at each step as lines.

    Example:
        >>> from metadef.report.collect import MemoryBuffer
        >>> info = NodeInfo("a", "Relu", "a", "elementwise", False, ("Relu",))
        >>> mem = MemoryTimeline({"n": 1}, 2, [MemoryBuffer("a", 0, 64, 0, 1, 0)], 64, 64, [64, 64])
        >>> memory_figure(mem, [info]).axes[0].get_ylabel()
        'arena offset (bytes)'
    """
    spare: dict[str, str] = {}
    fig = Figure(figsize=(11.0, 5.4), layout="constrained")
    ax = fig.add_subplot()
    unit, unit_name = _byte_unit(max(memory.peak, 1))
    for b in memory.buffers:
        ax.add_patch(Rectangle((b.start, b.offset / unit), b.end - b.start + 1, b.size / unit,
                               facecolor=color_of(infos[b.producer], spare), edgecolor="white", linewidth=0.4))
    steps = max(memory.steps, 1)
    if memory.live:
        live = [v / unit for v in [*memory.live, memory.live[-1]]]
        ax.step(range(len(live)), live, where="post", color="#222222", lw=0.8, label="bytes live at each step")
    ax.axhline(memory.peak / unit, color=SLOWER_COLOR, ls="--", lw=1.2,
               label=f"planned arena peak: {format_bytes(memory.peak)}")
    ax.axhline(memory.lower_bound / unit, color=FASTER_COLOR, ls=":", lw=1.6,
               label=f"lifetime lower bound: {format_bytes(memory.lower_bound)}")
    if not memory.buffers:
        ax.text(0.5, 0.5, "no intermediate tensors: every node output is a graph output", transform=ax.transAxes,
                ha="center", va="center", color="#555555")
    ax.set_xlim(0, steps)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, max(memory.peak / unit, 1e-9) * 1.1)
    ax.set_xlabel("step (node of the optimized graph, in execution order)")
    ax.set_ylabel(f"arena offset ({unit_name})")
    binding = ", ".join(f"{k}={v}" for k, v in memory.bindings.items()) or "static shapes"
    ax.set_title(f"{len(memory.buffers)} intermediate tensors at {binding}: peak / lower bound = {memory.ratio:.3f}",
                 fontsize=10)
    kinds = {infos[b.producer].category: infos[b.producer] for b in memory.buffers}
    patches = [Patch(facecolor=color_of(i, spare), label=f"written by {c}") for c, i in sorted(kinds.items())]
    lines, _ = ax.get_legend_handles_labels()
    ax.legend(handles=[*lines, *patches], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5,
              frameon=False)
    ax.grid(axis="y", color="#e5e5e5", lw=0.6)
    ax.set_axisbelow(True)
    return fig


# ------------------------------------------------------------------------------ the steps


def top_steps(steps: Sequence[StepTime], top: int) -> list[StepTime]:
    """The ``top`` slowest steps, slowest first.

    Example:
        >>> [s.node for s in top_steps([StepTime(0, 1.0), StepTime(1, 3.0), StepTime(2, 2.0)], 2)]
        [1, 2]
    """
    return sorted(steps, key=lambda s: (-s.ms, s.node))[:top]


def _step_label(info: NodeInfo) -> str:
    return info.label if info.short in ("", info.label) else f"{info.label}  \u00b7  {info.short}"


def steps_figure(steps: Sequence[StepTime], infos: Sequence[NodeInfo], top: int, runs: int) -> Figure:
    """Figure 3: the ``top`` slowest steps (fused groups and single nodes) as horizontal bars,
    slowest on top, each with its time and share of the whole.

    Example:
        >>> info = NodeInfo("a", "Relu", "a", "elementwise", False, ("Relu",))
        >>> steps_figure([StepTime(0, 1.5)], [info], top=5, runs=3).axes[0].get_title()
        'top 1 of 1 steps: 100% of the 1.50 ms the steps took (median of 3 profiled runs)'
    """
    spare: dict[str, str] = {}
    shown = top_steps(steps, top)
    total = sum(s.ms for s in steps) or 1.0
    fig = Figure(figsize=(11.0, 1.3 + 0.3 * max(len(shown), 1)), layout="constrained")
    ax = fig.add_subplot()
    labels = [_step_label(infos[s.node]) for s in shown]
    bars = ax.barh(range(len(shown)), [s.ms for s in shown], color=[color_of(infos[s.node], spare) for s in shown],
                   edgecolor="#555555", linewidth=0.5)
    for bar, s in zip(bars, shown):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {s.ms:.3f} ms ({100 * s.ms / total:.1f}%)",
                va="center", fontsize=7.5)
    ax.set_yticks(range(len(shown)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max((s.ms for s in shown), default=1.0) * 1.22)
    ax.set_xlabel("median time per run (ms)")
    covered = sum(s.ms for s in shown)
    ax.set_title(f"top {len(shown)} of {len(steps)} steps: {100 * covered / total:.0f}% of the {total:.2f} ms "
                 f"the steps took (median of {runs} profiled runs)", fontsize=10)
    ax.grid(axis="x", color="#e5e5e5", lw=0.6)
    ax.set_axisbelow(True)
    kinds = {infos[s.node].category: infos[s.node] for s in shown}
    ax.legend(handles=[Patch(facecolor=color_of(i, spare), edgecolor="#555555", label=c)
                       for c, i in sorted(kinds.items())], loc="lower right", fontsize=7.5, frameon=False)
    return fig


# ------------------------------------------------------------------------------ the bench


RUNTIME_COLORS = {METADEF: METADEF_COLOR, "onnxruntime": ORT_COLOR, "torch": "#d08c60"}


def bench_figure(rows: Sequence[BenchRow]) -> Figure:
    """Figure 4: each runtime's median latency side by side for each (threads, batch), a
    whisker up to its p90, and the ratio metadef / peer above each group (green: metadef
    faster).

    Example:
        >>> from metadef.testing.timing import LatencyStats
        >>> stats = LatencyStats.of([0.002, 0.003])
        >>> row = BenchRow("m", 1, 1, {}, {"metadef": stats, "onnxruntime": stats}, {"onnxruntime": 1.0},
        ...                {"onnxruntime": 0.1}, 0.0, 0.0, 1)
        >>> len(bench_figure([row]).axes[0].patches)
        2
    """
    runtimes = list(rows[0].latency) if rows else [METADEF]
    fig = Figure(figsize=(max(7.0, 1.2 * len(runtimes) * len(rows) + 2.5), 4.6), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / len(runtimes)
    top = max((s.p90_ms for r in rows for s in r.latency.values()), default=1.0)
    for j, name in enumerate(runtimes):
        xs = [k + (j - (len(runtimes) - 1) / 2) * width for k in range(len(rows))]
        p50 = [r.latency[name].p50_ms for r in rows]
        p90 = [r.latency[name].p90_ms for r in rows]
        ax.bar(xs, p50, width * 0.95, color=RUNTIME_COLORS.get(name, SPARE_COLORS[j % len(SPARE_COLORS)]),
               label=f"{PEER_LABELS.get(name, name)} p50")
        ax.errorbar(xs, p50, yerr=[[0.0] * len(rows), [max(b - a, 0.0) for a, b in zip(p50, p90)]], fmt="none",
                    ecolor="#333333", elinewidth=0.8, capsize=3)
        for x, ms in zip(xs, p50):
            ax.text(x, ms / 2, f"{ms:.3g}", ha="center", va="center", fontsize=7.5, color="white")
    for k, r in enumerate(rows):
        high = max(s.p90_ms for s in r.latency.values())
        lines = [f"{ratio:.2f}\u00d7" + (f" vs {PEER_LABELS.get(p, p)}" if len(r.ratio) > 1 else "")
                 for p, ratio in r.ratio.items()]
        worst = max(r.ratio.values(), default=1.0)
        ax.text(k, high + 0.04 * top, "\n".join(lines), ha="center", va="bottom", fontsize=10, fontweight="bold",
                color=FASTER_COLOR if worst <= 1.0 else SLOWER_COLOR)
    ax.set_xticks(range(len(rows)), [f"threads {r.threads}\nbatch {r.batch}" for r in rows])
    ax.set_xlim(-0.7, len(rows) - 0.3)
    ax.set_ylim(0, top * (1.25 + 0.08 * max((len(r.ratio) for r in rows), default=1)))
    ax.set_ylabel("latency (ms): bar p50, whisker to p90")
    ax.set_title("above each group: metadef p50 / peer p50 (below 1: metadef faster)", fontsize=10)
    ax.legend(loc="upper left", fontsize=8, frameon=False)
    ax.grid(axis="y", color="#e5e5e5", lw=0.6)
    ax.set_axisbelow(True)
    return fig


__all__ = ["DPI", "FUSED_COLORS", "SINGLE_COLORS", "bench_figure", "color_of", "format_bytes", "graph_figure",
           "memory_figure", "png_bytes", "steps_figure", "top_steps"]
