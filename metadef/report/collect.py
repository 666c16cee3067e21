"""What a report shows, worked out from a model (nothing is drawn here).

- :func:`describe_node`: a node of the optimized graph as the figures label and color it (a
  fused group by its kind and member ops, a single node by its op and fusion role);
- :func:`memory_timeline`: every intermediate tensor's lifetime (:mod:`metadef.analysis`) and
  its place in one arena (:func:`~metadef.analysis.arena.plan_arena`), with the planned peak
  and the lifetime lower bound;
- :func:`step_timeline`: the time of each step (fused group or node) of an x86 session, from
  :func:`metadef.benchmark.step_times`;
- :func:`machine_summary`: the machine the numbers come from.

Example:
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph('''graph g(%x: f32[n,4]) -> (%z) {
    ...   %a: f32[n,4] = Relu(%x) @relu
    ...   %b: f32[n,4] = Exp(%a) @exp
    ...   %z: f32[n,4] = Neg(%b) @neg
    ...   return %z
    ... }''')
    >>> mem = memory_timeline(g, {"n": 2})
    >>> [(b.name, b.start, b.end, b.offset) for b in mem.buffers], mem.peak, mem.lower_bound
    ([('a', 0, 1, 0), ('b', 1, 2, 64)], 128, 128)
    >>> describe_node(g.nodes[0]).label, describe_node(g.nodes[0]).category
    ('Relu', 'single op: elementwise')
"""

from __future__ import annotations

import datetime
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import metadef
from metadef.analysis import lifetimes
from metadef.analysis.arena import ALIGNMENT, Buffer, plan_arena
from metadef.benchmark import step_times
from metadef.cli_bench import BenchRow
from metadef.core.errors import BackendError
from metadef.ir import Graph, Node, Value
from metadef.ops.defs.fused import Fused
from metadef.runtime.profile import DeviceProfile
from metadef.runtime.session import Session
from metadef.shape import evaluate

LABEL_LIMIT = 24
"""The longest op label a box shows before it is shortened (``MatMul+Add+...(+3)``)."""
NAME_LIMIT = 26
"""The longest node name a box shows before it is shortened (``layer/0/.../query``)."""
IO_KIND = "io"
"""The kind of the graph figure's boxes for graph inputs and outputs."""
SHOWN_FEATURES = ("sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                  "avx512_bf16", "amx_tile", "neon", "sve")
"""The CPU features the report's header lists, when the machine has them."""


# ------------------------------------------------------------------------------ the nodes


@dataclass(frozen=True)
class NodeInfo:
    """A node as the figures show it: ``label`` (its op, or a group's member ops joined by
    ``+``), ``short`` (its name, shortened), ``kind`` (a group's kind or a node's fusion role).

    Example:
        >>> NodeInfo("/fc1/Gemm/fused", "Gemm+Relu", "fc1", "contraction+epilogue", True, ("Gemm", "Relu")).category
        'fused group: contraction+epilogue'
    """

    name: str
    label: str
    short: str
    kind: str
    fused: bool
    members: tuple[str, ...]

    @property
    def category(self) -> str:
        """The color key: ``fused group: <kind>``, ``single op: <role>`` or ``graph input / output``."""
        if self.kind == IO_KIND:
            return "graph input / output"
        return f"fused group: {self.kind}" if self.fused else f"single op: {self.kind}"


def io_info(value: Value, role: str) -> NodeInfo:
    """A graph input or output as the graph figure shows it: its name over its type.

    Example:
        >>> from metadef.shape import parse_type
        >>> io_info(Value("x", parse_type("f32[batch,4]")), "input").short
        'f32[batch,4]'
    """
    return NodeInfo(value.name, value.name if len(value.name) <= LABEL_LIMIT else value.name[:LABEL_LIMIT - 1] + "…",
                    str(value.type), IO_KIND, False, (role,))


ABBREVIATIONS = {"Normalization": "Norm", "Average": "Avg", "Convolution": "Conv"}
"""Word parts an op label may shorten when the whole label is too long for its box."""


def _abbreviated(op: str) -> str:
    for word, short in ABBREVIATIONS.items():
        op = op.replace(word, short)
    return op


def ops_label(ops: Sequence[str], limit: int = LABEL_LIMIT) -> str:
    """Member ops joined by ``+``, the tail counted when the whole would pass ``limit``.

    Example:
        >>> ops_label(["MatMul", "Add", "Gelu"]), ops_label(["Cast", "Sub", "Mul", "Add", "Mul", "Exp"], 16)
        ('MatMul+Add+Gelu', 'Cast+Sub+…(+4)')
        >>> ops_label(["Add", "Add", "LayerNormalization"])
        'Add+Add+LayerNorm'
    """
    text = "+".join(ops)
    if len(text) <= limit:
        return text
    ops = [_abbreviated(op) for op in ops]
    text = "+".join(ops)
    if len(text) <= limit:
        return text
    for keep in range(len(ops) - 1, 0, -1):
        text = "+".join(ops[:keep]) + f"+…(+{len(ops) - keep})"
        if len(text) <= limit:
            return text
    return f"{ops[0][:limit - 6]}…(+{len(ops) - 1})"


def short_name(name: str, op: str, limit: int = NAME_LIMIT) -> str:
    """A node name as a box shows it: without ``/fused`` and without a last part that only
    repeats the op; when still too long, the part up to the first number, ``…``, and the end.

    Example:
        >>> short_name("/encoder/layer/0/attention/self/query/MatMul/fused", "MatMul")
        'layer/0/…/self/query'
        >>> short_name("/layer1/0/conv2/Conv_bn/fused", "Conv")
        'layer1/0/conv2'
    """
    parts = [p for p in name.strip("/").split("/") if p]
    if parts and parts[-1] == "fused":
        parts.pop()
    if len(parts) > 1 and parts[-1].startswith(op):
        parts.pop()
    text = "/".join(parts)
    if len(text) <= limit:
        return text
    head: list[str] = []
    rest = parts
    for k, part in enumerate(parts[:-1]):
        if part.isdigit() and k > 0:
            head, rest = parts[k - 1:k + 1], parts[k + 1:]
            break
    tail: list[str] = []
    for part in reversed(rest):
        if len("/".join([*head, "…", part, *tail])) > limit and tail:
            break
        tail.insert(0, part)
    text = "/".join([*head, "…", *tail]) if head else "…/" + "/".join(tail)
    return text if len(text) <= limit else "…" + text[-(limit - 1):]


def describe_node(node: Node) -> NodeInfo:
    """How the figures show ``node`` (see :class:`NodeInfo`)."""
    if node.metaop is Fused:
        members = tuple(m.op for m in node.attrs["body"].nodes)
        anchor = node.attrs["body"].nodes[0].op if members else node.op
        return NodeInfo(node.name, ops_label(members), short_name(node.name, anchor),
                        str(node.attrs.get("kind", "fused")), True, members)
    return NodeInfo(node.name, node.op, short_name(node.name, node.op), node.metaop.role.value, False, (node.op,))


# ----------------------------------------------------------------------------- the memory


@dataclass(frozen=True)
class MemoryBuffer:
    """One intermediate tensor: produced at step ``start``, last read at ``end``, ``size``
    bytes at ``offset`` in the arena; ``producer`` is the index of the node that writes it.

    Example:
        >>> MemoryBuffer("h", producer=0, size=4096, start=0, end=2, offset=0).end
        2
    """

    name: str
    producer: int
    size: int
    start: int
    end: int
    offset: int


@dataclass(frozen=True)
class MemoryTimeline:
    """The arena of one binding: buffers, the planned ``peak``, the lifetime ``lower_bound``
    and the bytes live at each step (``live``; its maximum is the lower bound). Sizes are
    aligned to :data:`~metadef.analysis.arena.ALIGNMENT`, as the arena places them.

    Example:
        >>> MemoryTimeline({"n": 1}, 2, [MemoryBuffer("h", 0, 64, 0, 1, 0)], 64, 64, [64, 64]).ratio
        1.0
    """

    bindings: dict[str, int]
    steps: int
    buffers: list[MemoryBuffer]
    peak: int
    lower_bound: int
    live: list[int]

    @property
    def ratio(self) -> float:
        """``peak / lower_bound`` (1.0 when nothing is live)."""
        return self.peak / self.lower_bound if self.lower_bound else 1.0


def _aligned(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def memory_timeline(graph: Graph, bindings: Mapping[str, int]) -> MemoryTimeline:
    """Lifetimes of the node outputs that are not graph outputs (those the caller owns), for
    ``bindings``, placed by :func:`~metadef.analysis.arena.plan_arena`. As in
    :mod:`metadef.analysis.lifetimes`, views share nothing here (every output is a buffer).

    Example:
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: f32[n]) -> (%y) { %y: f32[n] = Relu(%x) return %y }")
        >>> memory_timeline(g, {"n": 4}).buffers
        []
    """
    step_of = {id(n): s for s, n in enumerate(graph.nodes)}
    kept = [t for t in lifetimes(graph) if t.kind == "node" and not t.is_output]
    sizes = [int(evaluate(t.size, bindings)) for t in kept]
    plan = plan_arena([Buffer(size, t.start, t.end) for size, t in zip(sizes, kept)])
    buffers = [MemoryBuffer(t.value.name, step_of[id(t.value.producer)], size, t.start, t.end, offset)
               for t, size, offset in zip(kept, sizes, plan.offsets)]
    live = [0] * len(graph.nodes)
    for b in buffers:
        for step in range(b.start, b.end + 1):
            live[step] += _aligned(b.size)
    return MemoryTimeline(dict(bindings), len(graph.nodes), buffers, plan.peak, plan.lower_bound, live)


# ------------------------------------------------------------------------------ the steps


@dataclass(frozen=True)
class StepTime:
    """The median time (ms) of one step of the compiled graph: ``node`` is its index.

    Example:
        >>> StepTime(node=3, ms=0.25).ms
        0.25
    """

    node: int
    ms: float


def step_timeline(session: Session, feeds: Mapping[str, np.ndarray], bindings: Mapping[str, int],
                  runs: int) -> list[StepTime]:
    """The time of each step of ``session`` (an x86 session: one step per node of the graph it
    compiled), from :func:`metadef.benchmark.step_times`, in step order.

    Example:
        >>> import metadef as md
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: f32[n]) -> (%y) { %y: f32[n] = Relu(%x) @relu return %y }")
        >>> [s.node for s in step_timeline(md.compile(g, target="x86"), {"x": np.ones(4, np.float32)}, {"n": 4}, 2)]
        [0]
    """
    times = step_times(session, feeds, bindings, runs=runs)
    if times is None:
        raise BackendError(f"the {type(session.executable).__name__} executable has no step-by-step path, "
                           "so its time per fused group cannot be measured; compile for x86")
    return [StepTime(k, ms) for k, ms in enumerate(times.values())]


# ---------------------------------------------------------------------------- the machine


def machine_summary(profile: DeviceProfile | None = None) -> dict[str, Any]:
    """The header's lines about the machine (:meth:`DeviceProfile.detect` when not given).

    Example:
        >>> m = machine_summary(DeviceProfile(cpu_name="Test CPU", features=frozenset({"avx2"})))
        >>> m["cpu"], m["features"]
        ('Test CPU', 'avx2')
    """
    p = profile or DeviceProfile.detect()
    features = [f for f in SHOWN_FEATURES if p.has(f)]
    return {
        "cpu": p.cpu_name,
        "cores": f"{p.physical_cores} physical, {p.logical_cores} logical",
        "memory": f"{p.memory_bytes / 2**30:.1f} GiB" if p.memory_bytes else "unknown",
        "features": ", ".join(features) or "none of " + ", ".join(SHOWN_FEATURES[:4]),
        "llvm cpu": p.llvm_cpu or "unknown",
        "gpus": ", ".join(g.name for g in p.gpus) or "none",
    }


# ------------------------------------------------------------------------- the whole report


@dataclass
class ReportData:
    """Everything a report shows, measured, before any drawing: the model (``before`` and
    after optimization: ``graph``, with ``infos`` for its nodes), the binding and inputs the
    measurements used, the step times, the arena, the benchmark rows and notes for the page.
    :func:`metadef.report.write_report` gathers it; :mod:`metadef.report.page` draws it.

    Example:
        >>> from dataclasses import fields
        >>> [f.name for f in fields(ReportData)][:5]
        ['name', 'source', 'before', 'graph', 'infos']
    """

    name: str
    source: str
    before: Graph
    graph: Graph
    infos: list[NodeInfo]
    bindings: dict[str, int]
    feeds: dict[str, np.ndarray]
    optimize_s: float
    compile_s: float
    steps: list[StepTime]
    step_runs: int
    memory: MemoryTimeline
    program_arena: int | None
    rows: list[BenchRow]
    notes: list[str]


def environment() -> dict[str, str]:
    """Versions and the time, for the header.

    Example:
        >>> environment()["python"] == platform.python_version()
        True
    """
    return {"metadef": metadef.__version__, "python": platform.python_version(), "numpy": np.__version__,
            "generated": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")}


__all__ = ["IO_KIND", "MemoryBuffer", "MemoryTimeline", "NodeInfo", "ReportData", "StepTime", "describe_node",
           "environment", "io_info", "machine_summary", "memory_timeline", "ops_label", "short_name", "step_timeline"]
