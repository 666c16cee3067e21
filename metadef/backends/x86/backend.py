"""The x86 backend: generated kernels (LLVM, via ``metadef.codegen``), BLAS contractions, and
the whole graph run as native programs over one planned arena.

``X86Backend().compile(graph)`` walks the nodes once and picks each node's kernel from the
mapping table (:mod:`metadef.backends.x86.mapping`); every kernel is compiled then, with the
symbolic sizes left as run-time arguments, so running a new batch size or sequence length
compiles nothing. Nodes no strategy takes run on their reference kernel; each such fallback
is logged (logger ``metadef.backends.x86``) and listed, with its reason, in
``executable.fallbacks`` and ``executable.summary()``. On a cold compile, helper processes
compile the same graph's kernels from other nodes on, on the other cores, sharing them
through the compile cache's kernel level (:mod:`metadef.backends.x86.parallel`).

``run`` executes a :class:`~metadef.backends.x86.program.BoundProgram` prepared once per
binding of the symbols: each step lowered to native calls (generated kernels, ``sgemm``/
``sgemv`` called directly, own im2col and Winograd convolutions), pointers and sizes set up
front, intermediates in one arena planned from their lifetimes, and one ctypes call (the GIL
released) per run of native steps; steps without a native form run from Python between
them. ``run_steps`` is the step-by-step Python path (for graphs whose shapes depend on values,
and as a baseline). Generated kernels that write enough elements split their outermost loops
across a pool of worker threads that the native program drives (:mod:`.threads`); ``threads=``
fixes the executable's thread count and sets OpenBLAS's (process-wide), else both follow
:func:`~metadef.backends.x86.threads.set_threads` (default: the machine's cores).

Example:
    >>> import numpy as np
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph('''graph g(%x: f32[n,3], %w: f32[3,2]) -> (%y) {
    ...   %y: f32[n,2] = MatMul(%x, %w) @mm
    ...   return %y }''')
    >>> exe = X86Backend().compile(g)
    >>> exe.plan[0].kind, exe.plan[0].reason
    ('blas', 'blas sgemm (np.matmul)')
    >>> exe.run({"x": np.ones((2, 3), np.float32), "w": np.ones((3, 2), np.float32)}, {"n": 2})
    [array([[3., 3.],
           [3., 3.]], dtype=float32)]
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from metadef.analysis.samples import separable_symbol
from metadef.backends.base import plan_frees
from metadef.backends.x86.mapping import CODEGEN_MISSING, Choice, StepKernel, choose, replay
from metadef.backends.x86.native import Lowering, needs
from metadef.backends.x86.parallel import helpers
from metadef.backends.x86.pieces import Pieces, choose_pieces, output_specs, run_pieces
from metadef.backends.x86.program import ProgramPool, Unplannable
from metadef.backends.x86.threads import current_threads, set_threads
from metadef.backends.x86.winograd import winograd_limit
from metadef.cache import DiskKernelStore, PlanMismatch, Store, compile_cached, kernel_key
from metadef.codegen.host import source_digest
from metadef.codegen.kernel import CompiledElsewhere, KernelCode, KernelStore, record_kernels, replay_kernels
from metadef.codegen.native import native_function
from metadef.core.dtypes import from_numpy
from metadef.core.errors import BackendError, InputError, MetadefError
from metadef.core.flags import DEBUG
from metadef.core.run_profile import RunProfile, measure, median_rows
from metadef.ir import Graph, Node, format_node
from metadef.ir.verify import verify
from metadef.ops import infer_types
from metadef.shape import TensorType, evaluate_shape

log = logging.getLogger("metadef.backends.x86")
CODEGEN_READY = CODEGEN_MISSING is None

SHAPE_CACHE_SIZE = 64  # distinct symbol bindings whose output shapes are kept

CompileProgress = Callable[[int, int, str], None]
"""``progress(done, total, node)``: ``done`` of the graph's ``total`` nodes have their kernels."""


@dataclass(frozen=True)
class PlanEntry:
    """The kernel chosen for one node: its name, the kind of kernel and why."""

    node: str
    op: str
    kind: str
    reason: str
    fallback: bool
    strategy: str = "reference"
    kernels: tuple[str, ...] = ()
    """The kernel-level cache keys (digests) of the kernels compiled for the node, in order."""


@dataclass
class _Step:
    node: Node
    kernel: StepKernel
    kind: str
    in_ids: list[int | None]
    out_ids: list[int]
    native: Lowering | None = None


class X86Executable:
    """A graph compiled for x86: one chosen kernel per node (see the module doc)."""

    def __init__(self, graph: Graph, threads: int | None = None,
                 kernel_id: Callable[[str], str] | None = None, progress: CompileProgress | None = None) -> None:
        """Choose each node's kernel from the mapping table (compiling it); with ``kernel_id``
        (structural key -> cache digest) each plan entry lists the kernels its node compiled;
        ``progress(done, total, node)`` is called after each node."""
        choices: list[tuple[Choice, tuple[str, ...]]] = []
        for i, n in enumerate(graph.nodes):
            if kernel_id is None:
                choices.append((choose(n), ()))
            else:
                with record_kernels() as structures:
                    choice = choose(n)
                choices.append((choice, tuple(kernel_id(k) for k in structures)))
            if CODEGEN_READY:  # in node order, like compile helpers (.parallel); one that a
                for routine in needs(choices[-1][0].native):  # helper compiles: linked at the end
                    with contextlib.suppress(CompiledElsewhere):
                        native_function(routine, wait=False)
            if progress is not None:
                progress(i + 1, len(graph.nodes), n.name)
        self._assemble(graph, threads, choices)

    @classmethod
    def from_plan(cls, graph: Graph, threads: int | None, plan: list[Any],
                  load: Callable[[str], KernelCode], progress: CompileProgress | None = None) -> X86Executable:
        """The executable a stored plan describes (``PlanEntry`` fields as dicts): each node
        runs its recorded strategy with its recorded kernels, loaded by digest. Raises
        :class:`PlanMismatch` when the plan does not fit the graph. ``progress`` as for
        ``__init__``, after each node's kernels are linked."""
        if len(plan) != len(graph.nodes):
            raise PlanMismatch(f"the plan has {len(plan)} nodes, the graph {len(graph.nodes)}")
        try:
            codes = {d: load(d) for d in dict.fromkeys(d for p in plan for d in p["kernels"])}
            choices = []
            for i, (n, p) in enumerate(zip(graph.nodes, plan)):
                choices.append((cls._replay(n, p, codes), tuple(p["kernels"])))
                if progress is not None:
                    progress(i + 1, len(plan), n.name)
        except (KeyError, TypeError) as e:
            raise PlanMismatch(f"a plan entry is malformed ({type(e).__name__}: {e})") from e
        executable = cls.__new__(cls)
        executable._assemble(graph, threads, choices)
        return executable

    @staticmethod
    def _replay(n: Node, p: Mapping[str, Any], codes: Mapping[str, KernelCode]) -> Choice:
        if p["node"] != n.name or p["op"] != n.qualop:
            raise PlanMismatch(f"the plan has {p['node']} ({p['op']}) where the graph has {n.name} ({n.qualop})")
        with replay_kernels([codes[d] for d in p["kernels"]]) as left:
            try:
                got = replay(n, str(p["strategy"]), str(p["reason"]), bool(p["fallback"]))
            except MetadefError as e:
                got = f"{type(e).__name__}: {e}"
        if isinstance(got, str) or got.kind != p["kind"] or left:
            why = got if isinstance(got, str) else (f"{len(left)} kernels unused" if left else f"kind {got.kind}")
            raise PlanMismatch(f"{n.name} ({n.qualop}): {why}, the plan says {p['strategy']} -> {p['kind']}")
        return got

    def _assemble(self, graph: Graph, threads: int | None,
                  choices: list[tuple[Choice, tuple[str, ...]]]) -> None:
        self.graph = graph
        self.threads = threads
        ids = {id(v): i for i, v in enumerate(graph.values())}
        self.slots = len(ids)
        self.input_ids = [ids[id(v)] for v in graph.inputs]
        self.consts = [(ids[id(v)], v.const) for v in graph.constants]
        self.output_ids = [ids[id(v)] for v in graph.outputs]
        self.steps: list[_Step] = []
        self.plan: list[PlanEntry] = []
        for n, (choice, kernels) in zip(graph.nodes, choices):
            self.plan.append(PlanEntry(n.name, n.qualop, choice.kind, choice.reason, choice.fallback,
                                       choice.strategy, kernels))
            if choice.fallback:
                log.info("x86: %s (%s) runs on %s: %s", n.name, n.qualop, choice.kind, choice.reason)
            self.steps.append(_Step(n, choice.kernel, choice.kind,
                                    [None if v is None else ids[id(v)] for v in n.inputs],
                                    [ids[id(v)] for v in n.outputs], choice.native))
        self.frees = plan_frees(self.steps, set(self.output_ids) | {i for i, _ in self.consts})
        self._shapes: dict[tuple[tuple[str, int], ...], list[list[TensorType] | None]] = {}
        self._lock = threading.Lock()
        self.const_arrays = {i: np.asarray(data, order="C") for i, data in self.consts}
        self.debug = DEBUG.get()
        self.kernel_store: Callable[[], KernelStore | None] = lambda: None
        """Where kernels compiled when a binding is prepared come from (the compile cache's)."""
        self.programs = ProgramPool(self)
        self._pieces: dict[tuple[tuple[tuple[str, int], ...], int], Pieces | None] = {}
        if CODEGEN_READY:  # now, inside the compile cache's store: a run compiles nothing
            routines = {"md_run_program", "md_run_tasks", "md_copy", *(r for s in self.steps for r in needs(s.native))}
            for routine in sorted(routines):
                native_function(routine)
        if self.fallbacks:
            log.warning("x86: %d of %d nodes of %s fall back to reference kernels; "
                        "executable.summary() lists why", len(self.fallbacks), len(self.plan), graph.name)

    @property
    def fallbacks(self) -> list[PlanEntry]:
        """The plan entries that run (at least partly) on a reference kernel, with reasons."""
        return [p for p in self.plan if p.fallback]

    def summary(self) -> str:
        """The kernels chosen, counted by kind, and the fallbacks counted by reason.

        Example:
            >>> from metadef.ir import parse_graph
            >>> g = parse_graph("graph g(%x: f32[n,4]) -> (%y) { %y: i64[n,1] = ArgMax(%x) {axis=1} @a return %y }")
            >>> print(X86Backend().compile(g).summary())
            x86 plan for g: 1 nodes: reference 1
            fallbacks: 1
              1 x ArgMax is opaque (no index expression to generate code from)
        """
        kinds = Counter(p.kind for p in self.plan)
        lines = [f"x86 plan for {self.graph.name}: {len(self.plan)} nodes: "
                 + ", ".join(f"{k} {c}" for k, c in kinds.most_common())]
        lines.append(f"fallbacks: {len(self.fallbacks)}")
        for reason, count in Counter(p.reason for p in self.fallbacks).most_common():
            lines.append(f"  {count} x {reason}")
        return "\n".join(lines)

    def _shape_plan(self, symbols: Mapping[str, int]) -> list[list[TensorType] | None]:
        """Each step's concrete output types for these symbols (None: they depend on values),
        computed once per binding."""
        key = tuple(sorted(symbols.items()))
        got = self._shapes.get(key)
        if got is not None:
            return got
        plan: list[list[TensorType] | None] = []
        for step in self.steps:
            try:
                types = [o.type for o in step.node.outputs]
                if any(t is None or t.shape is None for t in types):
                    raise BackendError("untyped output")
                plan.append([t.with_shape(evaluate_shape(t.shape, symbols)) for t in types])
            except MetadefError:
                plan.append(None)
        with self._lock:
            if len(self._shapes) >= SHAPE_CACHE_SIZE:
                self._shapes.clear()
            self._shapes[key] = plan
        return plan

    @staticmethod
    def _infer(step: _Step, args: list[np.ndarray | None]) -> list[TensorType]:
        concrete = [None if a is None else TensorType(from_numpy(a.dtype), a.shape) for a in args]
        return infer_types(step.node.metaop, step.node.name, concrete, step.node.attrs, args,
                           n_outputs=len(step.node.outputs))

    writes_outputs = True
    """``run`` takes ``outputs=``: the caller's buffers, written in place."""

    def run(self, feeds: Mapping[str, np.ndarray], symbols: Mapping[str, int],
            outputs: Sequence[np.ndarray | None] | None = None) -> list[np.ndarray]:
        """The graph outputs, in order, for inputs by name and the values of the symbols;
        with ``outputs``, written into those arrays (C-contiguous, of the outputs' dtypes and
        shapes; None: a new array), which are returned.

        The graph runs as native programs prepared for this binding of the symbols (see
        :mod:`metadef.backends.x86.program`); when its shapes depend on values it runs step by
        step from Python instead."""
        inputs = [np.asarray(feeds[name], order="C") for name in self._input_names]  # 0-d stays 0-d
        if self.samples is not None and symbols.get(self.samples, 0) >= 2:  # a batch: maybe in pieces
            way, answered = self._pieces_of(inputs, symbols, outputs)
            if answered is not None:  # (the first run's measurement wrote the outputs)
                return answered
            if way is not None:
                outs = _checked(outputs, output_specs(self, symbols), inputs) if outputs is not None else None
                return run_pieces(self, inputs, symbols, way, outs)
        return self.run_whole(inputs, symbols, outputs)

    @functools.cached_property
    def _input_names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.graph.inputs)

    @functools.cached_property
    def samples(self) -> str | None:
        """The symbol along which the graph computes each sample on its own, so that a batch
        may run in pieces (:mod:`.pieces`), or None."""
        return separable_symbol(self.graph)

    def pieces_for(self, symbols: Mapping[str, int]) -> Pieces | None:
        """How runs of this binding go at the current thread count: the pieces chosen on its
        first run (:mod:`.pieces`), or None (the whole batch at once, or not run yet).

        Example:
            >>> from metadef.ir import parse_graph
            >>> exe = X86Backend().compile(parse_graph("graph g(%x: f32[n,4]) -> (%y) { %y: f32[n,4] = Relu(%x) "
            ...                                        "@relu return %y }"))
            >>> _ = exe.run({"x": np.ones((8, 4), np.float32)}, {"n": 8})
            >>> exe.pieces_for({"n": 8}) is None    # 128 bytes of activations: run whole
            True
        """
        threads = current_threads() if self.threads is None else self.threads
        return self._pieces.get((tuple(sorted(symbols.items())), threads))

    def _pieces_of(self, inputs: list[np.ndarray], symbols: Mapping[str, int],
                   outputs: Sequence[np.ndarray | None] | None) -> tuple[Pieces | None, list[np.ndarray] | None]:
        """The pieces this binding runs in (None: whole), chosen on its first run, and the
        outputs when choosing them ran the graph on these inputs (else None)."""
        threads = current_threads() if self.threads is None else self.threads
        key = (tuple(sorted(symbols.items())), threads)
        if key in self._pieces:
            return self._pieces[key], None
        outs = _checked(outputs, output_specs(self, symbols), inputs) if outputs is not None else \
            [np.empty(shape, dtype) for shape, dtype in output_specs(self, symbols)]
        try:
            way, measured = choose_pieces(self, inputs, symbols, threads, outs)
        except Unplannable:
            way, measured = None, False
        with self._lock:
            if len(self._pieces) >= SHAPE_CACHE_SIZE:
                self._pieces.clear()
            self._pieces[key] = way
        return way, (list(outs) if measured else None)

    def run_whole(self, inputs: list[np.ndarray], symbols: Mapping[str, int],
                  outputs: Sequence[np.ndarray | None] | None = None) -> list[np.ndarray]:
        """``run`` on the whole batch at once: one prepared program (or step by step)."""
        try:
            program = self.programs.bound(symbols)
        except Unplannable:
            feeds = {v.name: a for v, a in zip(self.graph.inputs, inputs)}
            results = self.run_steps(feeds, symbols)
            if outputs is None:
                return _owned(results, [*feeds.values(), *(data for _, data in self.consts)])
            buffers = _checked(outputs, [(r.shape, r.dtype) for r in results], inputs)
            for buffer, result in zip(buffers, results):
                np.copyto(buffer, result)
            return buffers
        try:
            for array, (shape, dtype) in zip(inputs, program.input_specs):
                if array.shape != shape or array.dtype != dtype:
                    self._check_inputs(program, inputs)
            outs = [np.empty(shape, dtype) for shape, dtype in program.output_specs] if outputs is None else \
                _checked(outputs, program.output_specs, inputs)
            program.run(inputs, outs)
        finally:
            self.programs.give_back(program)
        return outs

    def profile(self, feeds: Mapping[str, np.ndarray], symbols: Mapping[str, int], runs: int = 10,
                warmup: int = 2) -> RunProfile:
        """Time each group of native calls of this binding's program (each node's calls, and
        the calls that run beside them in the worker pool) over ``runs`` runs after ``warmup``:
        the medians, and the median of whole runs. Profiles the program a whole batch runs
        as, also where runs of this batch go in pieces (the note says so).

        Example:
            >>> from metadef.ir import parse_graph
            >>> exe = X86Backend().compile(parse_graph("graph g(%x: f32[n,4]) -> (%y) { %y: f32[n,4] = "
            ...                                        "Relu(%x) @relu return %y }"))
            >>> p = exe.profile({"x": np.ones((2, 4), np.float32)}, {"n": 2}, runs=3)
            >>> [(r.node, r.op) for r in p.rows]
            [('relu', 'Relu')]
        """
        inputs = [np.asarray(feeds[v.name], order="C") for v in self.graph.inputs]
        try:
            program = self.programs.bound(symbols)
        except Unplannable as e:
            raise BackendError(f"x86: {self.graph.name} runs step by step from Python at {dict(symbols)} ({e}); "
                               f"only native programs are profiled") from e
        try:
            self._check_inputs(program, inputs)
            outs = [np.empty(shape, dtype) for shape, dtype in program.output_specs]
            timings, wall = measure(lambda: program.run(inputs, outs), lambda: program.timed_run(inputs, outs),
                                    runs, warmup)
            units = program.units()
            threads = program.threads
        finally:
            self.programs.give_back(program)
        way = self.pieces_for(symbols)
        note = f"{threads} thread{'s' if threads != 1 else ''}" + (
            f"; runs of this batch go in pieces ({way}), profiled here as one program" if way is not None else "")
        return RunProfile(median_rows(timings, units), max(1, runs), "x86", dict(symbols), wall, note)

    def _check_inputs(self, program: Any, inputs: Sequence[np.ndarray]) -> None:
        """Native code trusts the planned shapes: check each input against them (``run`` may
        be called without a Session's checks)."""
        for v, array, (shape, dtype) in zip(self.graph.inputs, inputs, program.input_specs):
            if array.shape != shape or array.dtype != dtype:
                readers = [n.name for n in self.graph.nodes if any(i is v for i in n.inputs)]
                raise BackendError(f"x86: input %{v.name} is {array.dtype}{list(array.shape)}, but the symbols "
                                   f"{dict(program.symbols)} make it {np.dtype(dtype)}{list(shape)} "
                                   f"(read by {', '.join(readers[:3]) or 'no node'})")

    def run_steps(self, feeds: Mapping[str, np.ndarray], symbols: Mapping[str, int]) -> list[np.ndarray]:
        """The graph outputs computed step by step from Python (each step's kernel called on
        numpy arrays, outputs allocated by numpy): the path for graphs whose shapes depend on
        values, and the baseline the native programs are checked against."""
        slots: list[Any] = [None] * self.slots
        for v, i in zip(self.graph.inputs, self.input_ids):
            slots[i] = feeds[v.name]
        for i, data in self.consts:
            slots[i] = data
        for step, frees, types in zip(self.steps, self.frees, self._shape_plan(symbols)):
            args = [None if i is None else slots[i] for i in step.in_ids]
            try:
                outs = step.kernel(args, types if types is not None else self._infer(step, args))
            except MetadefError:
                raise
            except Exception as e:  # numpy's own errors: say which node and which kernel
                raise BackendError(f"x86 backend failed at node ({step.kind} kernel):\n"
                                   f"  {format_node(step.node)}\n  {type(e).__name__}: {e}") from e
            for i, o in zip(step.out_ids, outs):
                slots[i] = o
            for i in frees:
                slots[i] = None
        return [slots[i] for i in self.output_ids]


def _owned(results: Sequence[np.ndarray], held: Sequence[Any]) -> list[np.ndarray]:
    """The step-by-step results as arrays the caller owns: a copy of each that shares memory
    with a feed, a constant (``held``) or an earlier result, as a view kernel's output
    (Reshape, Identity) may; string tensors too, whose elements are references.

    Example:
        >>> x = np.array(["a", "b"], dtype=object)
        >>> y, = _owned([x.reshape(2, 1)], [x])
        >>> bool(np.shares_memory(y, x)), y.tolist()
        (False, [['a'], ['b']])
    """
    arrays = [a for a in held if isinstance(a, np.ndarray)]
    owned: list[np.ndarray] = []
    for result in results:
        result = np.asarray(result)
        owned.append(result.copy() if any(np.may_share_memory(result, a) for a in (*arrays, *owned)) else result)
    return owned


def _checked(outputs: Sequence[np.ndarray | None], expected: Sequence[tuple[tuple[int, ...], np.dtype]],
             inputs: Sequence[np.ndarray] = ()) -> list[np.ndarray]:
    """The caller's output buffers, checked (one per output, of its shape and dtype,
    C-contiguous, writeable, sharing no memory with an input or another buffer: the native
    code reads inputs while it writes outputs); a new array where the caller gives None."""
    if len(outputs) != len(expected):
        raise InputError(f"outputs= has {len(outputs)} entries, the model has {len(expected)} outputs")
    checked = []
    for k, (array, (shape, dtype)) in enumerate(zip(outputs, expected)):
        if array is None:
            checked.append(np.empty(shape, dtype))
            continue
        if not isinstance(array, np.ndarray) or array.shape != tuple(shape) or array.dtype != dtype:
            got = f"{array.dtype}{list(array.shape)}" if isinstance(array, np.ndarray) else type(array).__name__
            raise InputError(f"output buffer {k} is {got}; this run makes {np.dtype(dtype)}{list(shape)}")
        if not (array.flags.c_contiguous and array.flags.writeable):
            raise InputError(f"output buffer {k} must be a writeable C-contiguous array "
                             f"(np.empty({tuple(shape)}, np.{np.dtype(dtype).name}))")
        for j, other in enumerate([*inputs, *checked]):
            if np.may_share_memory(array, other):
                what = f"input {j}" if j < len(inputs) else f"output buffer {j - len(inputs)}"
                raise InputError(f"output buffer {k} shares memory with {what}: pass a separate array")
        checked.append(array)
    return checked


@functools.cache
def backend_source() -> str:
    """A digest of this backend's source files, part of every model-level cache key: a stored
    plan names strategies and reasons that a change here (a new lowering) would make stale
    (codegen's own source is in every key already).

    Example:
        >>> len(backend_source())
        16
    """
    return source_digest(Path(__file__).parent)


class X86Backend:
    """The x86 backend (``metadef.compile(graph, target="x86")``).

    ``threads``: the executable's thread count (generated code, through the worker pool) and
    numpy's OpenBLAS thread count, set at compile time for the whole process. ``progress``:
    ``progress(done, total, node)`` after each node's kernel is compiled or linked from the
    cache (a progress bar's hook; it is no part of the compile cache's key).

    Example:
        >>> X86Backend().name
        'x86'
    """

    name = "x86"

    def compile(self, graph: Graph, *, threads: int | None = None, cache: bool = True,
                progress: CompileProgress | None = None, **options: Any) -> X86Executable:
        """Compile ``graph``; with ``cache`` (the default) through the compile cache
        (:mod:`metadef.cache`): the same graph again in this process returns the same
        executable, and every kernel already on disk is linked without running LLVM. On a
        model-level hit the executable is rebuilt from the stored plan (each node's strategy
        and kernel keys) without searching the mapping table. Weights enter the model key by
        dtype and shape only: kernels take them as run-time arguments, and a constant that a
        kernel compiles in is part of that kernel's key, which the plan records."""
        if options:
            raise BackendError(f"the x86 backend takes only threads=, cache= and progress=, got {sorted(options)}")
        if threads is not None:
            set_threads(threads)
        winograd_limit()  # a bad METADEF_WINOGRAD is refused here, not found by a lowering
        if not cache:
            verify(graph, types=True)
            return X86Executable(graph, threads, progress=progress)

        def build() -> X86Executable:
            # native code trusts the declared types: one that inference contradicts (a
            # hand-written graph) would write past a buffer. A cache hit's graph has the key's
            # types, which were checked when the entry was built.
            verify(graph, types=True)
            with helpers(graph):
                return X86Executable(graph, threads, lambda structure: kernel_key(structure).digest, progress)

        executable = compile_cached(
            graph, self.name, {"threads": threads}, build, backend=backend_source(),
            replay=lambda plan, load: X86Executable.from_plan(graph, threads, plan, load, progress), weights=False)
        executable.kernel_store = lambda: DiskKernelStore(Store())
        return executable


__all__ = ["CompileProgress", "PlanEntry", "X86Backend", "X86Executable"]
