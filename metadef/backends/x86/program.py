"""A compiled graph as native programs over one planned arena, prepared once per binding.

For one binding of the symbolic dims (``{"batch": 8, "seq": 128}``), :func:`bind` works out
every tensor's shape, lowers each step (:mod:`metadef.backends.x86.native`), plans one arena
for all intermediates and scratch buffers from their lifetimes (:mod:`metadef.analysis.arena`)
and builds the entry tables: pointers and dims are prepared here, once. A run then only writes
the addresses of the caller's inputs and outputs into the tables and makes one ctypes call
(the GIL released) per *segment*: a maximal run of native steps. Steps without a native form
(reference fallbacks, contractions with odd broadcasts) run from Python between segments, on
numpy views of the arena, and copy their results into their planned place.

A view step (Reshape, Flatten, Squeeze, Unsqueeze, Identity) costs nothing: its output shares
its input's memory, whose lifetime grows to cover the view's readers. Graph outputs are never
in the arena: each run writes them into arrays the caller owns (new ones, or the ``outputs=``
buffers). Nor are string tensors (arrays of Python references, which native code must never
copy as bytes): a step that reads or writes one runs from Python, and an intermediate string
tensor is held by the program as the array its step made.

A :class:`BoundProgram` holds its arena and tables, so one serves one run at a time;
:class:`ProgramPool` keeps a few per binding for runs from several threads at once.

Example:
    >>> import numpy as np
    >>> from metadef.ir import parse_graph
    >>> from metadef.backends.x86 import X86Backend
    >>> g = parse_graph('''graph g(%x: f32[n,2,2], %w: f32[2,2]) -> (%y) {
    ...   %h: f32[n,2,2] = MatMul(%x, %w) @mm
    ...   %r: f32[n,4] = Flatten(%h) @view
    ...   %y: f32[n,4] = Relu(%r) @relu
    ...   return %y }''')
    >>> exe = X86Backend().compile(g, cache=False)
    >>> bound = exe.programs.bound({"n": 3})
    >>> print(bound.describe())
    native program for n=3: 3 steps (2 native calls in 1 segment, 0 from Python, 1 views);
      arena 64 bytes (lower bound 64)
    >>> exe.programs.give_back(bound)
    >>> x = np.arange(12, dtype=np.float32).reshape(3, 2, 2) - 6
    >>> exe.run({"x": x, "w": np.eye(2, dtype=np.float32)}, {"n": 3})[0][0]
    array([0., 0., 0., 0.], dtype=float32)
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from metadef.analysis.arena import ALIGNMENT, Buffer, plan_arena
from metadef.backends.x86.addresses import address
from metadef.backends.x86.layouts import settle
from metadef.backends.x86.native import ALIAS, BINDING_THREADS, Arg, Call, NativeStep
from metadef.backends.x86.threads import WorkerPool, current_threads, worker_pool
from metadef.codegen.kernel import kernel_store
from metadef.codegen.native import PROGRAM, native_function
from metadef.core.errors import BackendError, InputError, MetadefError
from metadef.ir import format_node
from metadef.shape import evaluate_shape

log = logging.getLogger("metadef.backends.x86")

BINDINGS_KEPT = 8
"""How many bindings of the symbols keep their prepared programs (least recently used go)."""

PROGRAMS_PER_BINDING = 4
"""How many prepared programs (arenas) one binding keeps for concurrent runs."""

INPUT, OUTPUT, CONST, ARENA, OBJECTS = "input", "output", "const", "arena", "objects"


@dataclass
class _Storage:
    """Where a value's bytes are: a graph input or output (per run), a constant, or the arena."""

    kind: str
    index: int  # the input / output position, the arena buffer, or the held object array
    shape: tuple[int, ...]
    dtype: np.dtype


_Entry = tuple[int, int, list[list[int]], "list[tuple[int, int, list[list[int]]]] | None"]
"""A call of a segment: its function, the index of its pointers, its dims (one per task), and
for a sequence (``md_run_sequence``, pointers -1) its calls in order (one dims each)."""


class _Segment:
    """A maximal run of native steps: one call of the program driver. Each call of the
    segment has its dims, or one dims per task when it splits across the worker pool; with a
    pool the segment is a table of groups for ``md_run_tasks`` (a group's tasks run at once: a
    call's, and those of the calls that join it), else one table of its calls in order for
    ``md_run_program``. A sequence's task points at a table of its own calls."""

    def __init__(self, groups: list[list[_Entry]], args: list[list[int]], pool: WorkerPool | None,
                 labels: list[list[tuple[int, str]]] | None = None) -> None:
        self.pool = pool
        self.labels = labels or [[] for _ in groups]
        """Per group, (step index, what) of each of its calls: what :meth:`BoundProgram.profile` reports."""
        self.args = [(ctypes.c_void_p * max(1, len(a)))(*a) for a in args]
        self.dims: list[Any] = []  # (kept alive: the tables point at them)
        self.sequences: list[Any] = []
        entries: list[list[tuple[int, Any, Any]]] = []
        for group in groups:
            entries.append([])
            for fn, at, tasks, steps in group:
                if steps is not None:
                    table = ((ctypes.c_void_p * 3) * len(steps))()
                    for k, (inner_fn, inner_at, (dims,)) in enumerate(steps):
                        self.dims.append((ctypes.c_int64 * max(1, len(dims)))(*dims))
                        self._fill(table[k], (inner_fn, self.args[inner_at], self.dims[-1]))
                    pointers = (ctypes.c_void_p * 1)(ctypes.addressof(table))
                    self.sequences.append((table, pointers))
                for dims in tasks:
                    self.dims.append((ctypes.c_int64 * max(1, len(dims)))(*dims))
                    entries[-1].append((fn, pointers if steps is not None else self.args[at], self.dims[-1]))
        if pool is None:  # (one thread: every call in order, none joined or split)
            flat = [entry for group in entries for entry in group]
            self.count = len(flat)
            self.table = ((ctypes.c_void_p * 3) * max(1, len(flat)))()
            for i, entry in enumerate(flat):
                self._fill(self.table[i], entry)
            self.address = ctypes.addressof(self.table)
        else:
            self.count = len(entries)
            self.tables = []
            self.groups = ((ctypes.c_int64 * 2) * max(1, len(entries)))()
            for i, group in enumerate(entries):
                table = ((ctypes.c_void_p * 3) * len(group))()
                for t, entry in enumerate(group):
                    self._fill(table[t], entry)
                self.tables.append(table)
                self.groups[i][0] = ctypes.addressof(table)
                self.groups[i][1] = len(group)
            self.address = ctypes.addressof(self.groups)

    @staticmethod
    def _fill(entry: Any, values: tuple[int, Any, Any]) -> None:
        fn, args, dims = values
        entry[0] = fn
        entry[1] = ctypes.cast(args, ctypes.c_void_p).value
        entry[2] = ctypes.cast(dims, ctypes.c_void_p).value


_ENTRY_BYTES = ctypes.sizeof(ctypes.c_void_p * 3)  # (function, pointers, dims): a call of a table
_GROUP_BYTES = ctypes.sizeof(ctypes.c_int64 * 2)  # (table, count): a group of the pool's table


@dataclass
class _PythonStep:
    """A step run from Python: its kernel, where its inputs are, where its outputs go."""

    index: int
    inputs: list[_Storage | None]
    outputs: list[_Storage]
    types: list[Any]
    """The concrete output types for this binding (what the step's kernel is given)."""


class BoundProgram:
    """The executable prepared for one binding: arena, entry tables, Python steps."""

    def __init__(self, exe: Any, symbols: Mapping[str, int], threads: int = 1) -> None:
        self.exe = exe
        self.symbols = dict(symbols)
        self.threads = threads
        self.pool = worker_pool(threads) if threads > 1 else None
        token = BINDING_THREADS.set(threads)
        try:
            self._build()
        finally:
            BINDING_THREADS.reset(token)

    # -------------------------------------------------------------------------- building

    def _build(self) -> None:
        exe = self.exe
        graph = exe.graph
        types = exe._shape_plan(self.symbols)
        storage: dict[int, _Storage] = {}
        for k, (v, i) in enumerate(zip(graph.inputs, exe.input_ids)):
            if v.type.shape is None:  # (an ONNX input declared without a shape)
                raise Unplannable(f"input %{v.name} has an unknown rank, so its buffer cannot be planned")
            storage[i] = _Storage(INPUT, k, tuple(evaluate_shape(v.type.shape, self.symbols)), v.type.dtype.numpy)
        for i, data in exe.consts:
            storage[i] = _Storage(CONST, i, tuple(np.shape(data)), np.asarray(data).dtype)
        outputs = {i: k for k, i in enumerate(exe.output_ids)}
        buffers: list[list[int]] = []  # [size, start, end]
        self.objects: list[np.ndarray | None] = []  # the string tensors steps made (OBJECTS storage)
        # (a NativeStep, or why the step runs from Python; its inputs; outputs; scratch buffers; index)
        lowered: list[tuple[NativeStep | str, list[_Storage | None], list[_Storage], list[int], int]] = []
        viewed: set[int] = set()  # arena buffers read under another shape (a view) or returned
        self.views = 0
        for s, (step, out_types) in enumerate(zip(exe.steps, types)):
            if out_types is None:
                raise Unplannable(f"the output shapes of {step.node.name} ({step.node.qualop}) depend on "
                                   f"values, not only on the symbols")
            ins = [None if i is None else storage[i] for i in step.in_ids]
            for st in ins:
                if st is not None and st.kind == ARENA:
                    buffers[st.index][2] = s
            outs: list[_Storage] = []
            lowering = step.native
            if any(st is not None and st.dtype.hasobject for st in ins) or any(
                    t.dtype.numpy.hasobject for t in out_types):
                lowering = None  # string tensors: never through native code, never in the arena
            if lowering is ALIAS and ins[0] is not None and math.prod(ins[0].shape) != math.prod(out_types[0].shape):
                # (a size inference could not prove, such as a Reshape to a size the export baked in)
                raise InputError(f"{step.node.qualop} {step.node.name}: its input has {math.prod(ins[0].shape)} "
                                 f"elements {list(ins[0].shape)}, but its output {list(out_types[0].shape)} needs "
                                 f"{math.prod(out_types[0].shape)} at {_binding(self.symbols)}")
            if lowering is ALIAS and step.out_ids[0] not in outputs and ins[0] is not None:
                view = ins[0]
                storage[step.out_ids[0]] = _Storage(view.kind, view.index, tuple(out_types[0].shape), view.dtype)
                if view.kind == ARENA:
                    viewed.add(view.index)
                self.views += 1
                continue
            for i, t in zip(step.out_ids, out_types):
                shape, dtype = tuple(t.shape), t.dtype.numpy
                if i in outputs:
                    st = _Storage(OUTPUT, outputs[i], shape, dtype)
                elif dtype.hasobject:
                    self.objects.append(None)
                    st = _Storage(OBJECTS, len(self.objects) - 1, shape, dtype)
                else:
                    buffers.append([math.prod(shape) * dtype.itemsize, s, s])
                    st = _Storage(ARENA, len(buffers) - 1, shape, dtype)
                storage[i] = st
                outs.append(st)
            native = None
            if lowering is ALIAS:
                native = _copy_step(ins[0], outs[0])
            elif lowering is not None:
                try:
                    native = lowering([None if st is None else st.shape for st in ins], [o.shape for o in outs],
                                      self.symbols)
                except MetadefError as e:
                    native = f"{type(e).__name__}: {e}"
            lowered.append((native if isinstance(native, (NativeStep, str)) else "no native form", ins, outs, [], s))
        last = len(exe.steps) - 1
        for i in exe.output_ids:  # an output that is an intermediate's view: keep it to the end
            st = storage[i]
            if st.kind == ARENA:
                buffers[st.index][2] = last
                viewed.add(st.index)
        chosen, writers = settle(lowered, buffers, viewed,
                                 lambda st: st.index if st is not None and st.kind == ARENA else None)
        self.pixel_major = len(chosen)
        """How many values this binding stores pixel-major (:mod:`.layouts`)."""
        if chosen:
            log.debug("layouts at %s: %d values pixel-major, written by %s", _binding(self.symbols), len(chosen),
                      ", ".join(exe.steps[s].node.name for s in writers))
        for what, _, _, scratch, s in lowered:
            if isinstance(what, NativeStep):
                for size in what.scratch:
                    buffers.append([size, s, s])
                    scratch.append(len(buffers) - 1)
        self.plan = plan_arena([Buffer(size, start, end) for size, start, end in buffers])
        self.arena = np.empty(self.plan.peak + ALIGNMENT, np.uint8)
        base = self.arena.ctypes.data
        self.base = base + (-base) % ALIGNMENT
        self.offsets = self.plan.offsets
        self.output_storage = [storage[i] for i in exe.output_ids]
        self.key = (tuple(sorted(self.symbols.items())), self.threads)
        self.input_specs = [(storage[i].shape, storage[i].dtype) for i in exe.input_ids]
        self._assemble(lowered, types)

    def _address(self, st: _Storage | None) -> int | None:
        """A fixed address, or None for a graph input or output (patched per run)."""
        if st is None:
            return 0
        if st.kind == ARENA:
            return self.base + self.offsets[st.index]
        if st.kind == CONST:
            data = self.exe.const_arrays[st.index]
            return address(data)
        return None

    def _assemble(self, lowered: list[tuple[NativeStep | str, list[_Storage | None], list[_Storage], list[int], int]],
                  types: list[Any]) -> None:
        self._n_inputs = len(self.exe.input_ids)
        # (pointer array, slot, input position or outputs after, byte offset)
        self.patches: list[tuple[Any, int, int, int]] = []
        self.segments: list[_Segment | _PythonStep] = []
        self.kept: list[Any] = []
        self.checks: list[tuple[np.ndarray, Any]] = []  # (status words, message) read after each run
        pending: list[list[_Entry]] = []  # groups of (fn, args index, task dims, a sequence's calls)
        pending_args: list[list[int]] = []
        pending_patches: list[tuple[int, int, str, int, int]] = []
        pending_labels: list[list[tuple[int, str]]] = []
        self.native_calls = self.python_steps = self.parallel_calls = 0
        self.python_reasons: list[tuple[str, str]] = []
        self.call_kinds: Counter[str] = Counter()
        self.call_steps: list[tuple[str, str]] = []  # (step name, what) of each native call, in order
        for what, ins, outs, scratch, step_index in lowered:
            if not isinstance(what, NativeStep):
                self._flush(pending, pending_args, pending_patches, pending_labels)
                pending, pending_args, pending_patches, pending_labels = [], [], [], []
                self.segments.append(_PythonStep(step_index, ins, outs, types[step_index]))
                self.python_reasons.append((self.exe.steps[step_index].node.name, str(what)))
                self.python_steps += 1
                continue
            self.kept.append(what.keep)
            self.checks.extend(what.checks)
            for i, call in enumerate(what.calls):
                inner = []
                for one in call.steps or (call,):  # (a sequence: its calls, each with its pointers)
                    pointers: list[int] = []
                    for slot, arg in enumerate(one.args):
                        pointers.append(self._resolve(arg, ins, outs, scratch, len(pending_args), slot,
                                                      pending_patches))
                    tasks = one.tasks(self.threads) if one.tasks is not None and self.pool is not None \
                        and not call.steps else None
                    dims = [list(d) for d in tasks] if tasks else [list(one.dims)]
                    inner.append((one.address, len(pending_args), dims))
                    pending_args.append(pointers)
                    self.native_calls += 1
                    self.parallel_calls += bool(tasks)
                    self.call_kinds[one.what.split(" (")[0]] += 1
                    self.call_steps.append((self.exe.steps[step_index].node.name, one.what))
                entry = (call.address, -1, [list(call.dims)], inner) if call.steps else (*inner[0], None)
                label = (step_index, call.what)
                if call.joins and i > 0 and pending:  # (within one step: the group of the call before)
                    pending[-1].append(entry)
                    pending_labels[-1].append(label)
                else:
                    pending.append([entry])
                    pending_labels.append([label])
        self._flush(pending, pending_args, pending_patches, pending_labels)
        self._program = PROGRAM(native_function("md_run_program"))
        self._work: list[tuple[bool, Any]] = [
            (True, _driver(self._program, s)) if isinstance(s, _Segment) else (False, s) for s in self.segments]
        self._finish = [(k, st) for k, st in enumerate(self.output_storage) if st.kind != OUTPUT or st.index != k]
        self._finishing = bool(self._finish or self.objects or self.checks)
        """Whether a run has anything to do after its native calls (:meth:`_finish_run`)."""
        self.output_specs = [(st.shape, st.dtype) for st in self.output_storage]

    def _resolve(self, arg: Arg, ins: list[_Storage | None], outs: list[_Storage], scratch: list[int],
                 call: int, slot: int, patches: list[tuple[int, int, str, int, int]]) -> int:
        if arg.kind == "null":
            return 0
        if arg.kind == "addr":
            return arg.index + arg.offset
        if arg.kind == "scratch":
            return self.base + self.offsets[scratch[arg.index]] + arg.offset
        st = ins[arg.index] if arg.kind == "in" else outs[arg.index]
        address = self._address(st)
        if address is None:
            assert st is not None
            patches.append((call, slot, st.kind, st.index, arg.offset))
            return 0
        return address + arg.offset if address else address

    def _flush(self, pending: list[list[_Entry]], args: list[list[int]],
               patches: list[tuple[int, int, str, int, int]], labels: list[list[tuple[int, str]]]) -> None:
        if not pending:
            return
        segment = _Segment(pending, args, self.pool, labels)
        self.segments.append(segment)
        for call, slot, kind, position, offset in patches:
            self.patches.append((segment.args[call], slot, position if kind == INPUT else self._n_inputs + position,
                                 offset))

    # --------------------------------------------------------------------------- running

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        """Run on contiguous ``inputs`` (graph order) into contiguous ``outputs``."""
        self._patch(inputs, outputs)
        for native, work in self._work:
            if native:
                work[0](*work[1])
            else:
                self._run_python(work, inputs, outputs)
        if self._finishing:
            self._finish_run(inputs, outputs)

    def units(self) -> list[tuple[str, str, str, int]]:
        """What :meth:`timed_run` times, in order: (node, op, how, native calls) of each group
        of native calls the pool runs at once (each call, on one thread) and of each Python step."""
        steps = self.exe.steps
        units = []
        for segment in self.segments:
            if isinstance(segment, _PythonStep):
                node = steps[segment.index].node
                units.append((node.name, node.qualop, "from Python", 0))
                continue
            groups = segment.labels if segment.pool is not None else [[x] for g in segment.labels for x in g]
            for group in groups:
                node = steps[group[0][0]].node
                what = group[0][1] + (f" (+{len(group) - 1} joined)" if len(group) > 1 else "")
                units.append((node.name, node.qualop, what, len(group)))
        return units

    def timed_run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> list[float]:
        """:meth:`run`, each unit of :meth:`units` timed on its own: their seconds, in order.
        (Each group is its own call of the pool's driver: a barrier after each, as in a run.)"""
        self._patch(inputs, outputs)
        clock = time.perf_counter
        times: list[float] = []
        for native, work in self._work:
            if not native:
                start = clock()
                self._run_python(work, inputs, outputs)
                times.append(clock() - start)
                continue
            driver, args = work
            if len(args) == 2:  # md_run_program(table, count): a flat table of calls
                for i in range(args[1]):
                    start = clock()
                    driver(args[0] + i * _ENTRY_BYTES, 1)
                    times.append(clock() - start)
            else:  # md_run_tasks(pool, groups, count)
                for i in range(args[2]):
                    start = clock()
                    driver(args[0], args[1] + i * _GROUP_BYTES, 1)
                    times.append(clock() - start)
        self._finish_run(inputs, outputs)
        return times

    def _patch(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        """This run's input and output addresses into the calls' pointer tables."""
        if self.patches:
            addresses = [address(a) for a in inputs]
            addresses += [address(a) for a in outputs]
            for array, slot, position, offset in self.patches:
                array[slot] = addresses[position] + offset

    def _finish_run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        for k, st in self._finish:  # outputs no step wrote: inputs, constants, repeats
            np.copyto(outputs[k], self._view(st, inputs, outputs))
        self.objects[:] = [None] * len(self.objects)  # this run's string intermediates
        for status, why in self.checks:
            if status[0]:
                value, status[:] = int(status[1]), 0
                raise InputError(why(value))

    def _view(self, st: _Storage, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> np.ndarray:
        if st.kind == INPUT:
            return inputs[st.index].reshape(st.shape)
        if st.kind == OUTPUT:
            return outputs[st.index].reshape(st.shape)
        if st.kind == CONST:
            return np.asarray(self.exe.const_arrays[st.index]).reshape(st.shape)
        if st.kind == OBJECTS:
            return self.objects[st.index].reshape(st.shape)
        offset = self.base - self.arena.ctypes.data + self.offsets[st.index]
        count = math.prod(st.shape)
        return self.arena[offset:offset + count * st.dtype.itemsize].view(st.dtype).reshape(st.shape)

    def _run_python(self, step: _PythonStep, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        exe_step = self.exe.steps[step.index]
        args = [None if st is None else self._view(st, inputs, outputs) for st in step.inputs]
        try:
            results = exe_step.kernel(args, step.types)
        except MetadefError:
            raise
        except Exception as e:
            raise BackendError(f"x86 backend failed at node ({exe_step.kind} kernel):\n"
                               f"  {format_node(exe_step.node)}\n  {type(e).__name__}: {e}") from e
        for st, result in zip(step.outputs, results):
            if st.kind == OBJECTS:  # held as made (a string tensor is no bytes to copy)
                self.objects[st.index] = np.asarray(result, dtype=object).reshape(st.shape)
                continue
            target = self._view(st, inputs, outputs)
            if target.shape != np.shape(result):
                raise BackendError(f"x86: node {exe_step.node.name} made an output of shape "
                                   f"{list(np.shape(result))}, its type says {list(target.shape)}")
            np.copyto(target, result, casting="unsafe")

    def describe(self) -> str:
        """What the program holds: steps, native calls, segments, Python steps and views; then
        the arena's size next to the lifetime lower bound."""
        binding = _binding(self.symbols)
        segments = sum(isinstance(s, _Segment) for s in self.segments)
        threads = f", {self.parallel_calls} split over {self.threads} threads" if self.parallel_calls else ""
        rows = f", {self.pixel_major} values pixel-major" if self.pixel_major else ""
        return (f"native program for {binding}: {len(self.exe.steps)} steps ({self.native_calls} native calls{threads} "
                f"in {segments} segment{'s' if segments != 1 else ''}, {self.python_steps} from Python, "
                f"{self.views} views{rows});\n  arena {self.plan.peak} bytes (lower bound {self.plan.lower_bound})")


def _binding(symbols: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(symbols.items())) or "static shapes"


def _driver(program: Any, segment: _Segment) -> tuple[Any, tuple[int, ...]]:
    """The native call that runs a segment, and its arguments."""
    if segment.pool is None:
        return program, (segment.address, segment.count)
    return segment.pool.run_tasks, (segment.pool.address, segment.address, segment.count)


def _copy_step(src: _Storage | None, dst: _Storage) -> NativeStep | str:
    if src is None:
        return "no input"
    nbytes = math.prod(dst.shape) * dst.dtype.itemsize
    return NativeStep((Call(native_function("md_copy"), (Arg("in", 0), Arg("out", 0)), (nbytes,), "copy"),))


class Unplannable(BackendError):
    """The graph cannot be prepared as native programs for this binding (shapes depend on values)."""


class ProgramPool:
    """Prepared programs per binding (LRU over :data:`BINDINGS_KEPT` bindings), several per
    binding for concurrent runs; :meth:`run` takes one, runs it, and gives it back."""

    def __init__(self, exe: Any) -> None:
        self.exe = exe
        self._free: OrderedDict[Any, list[BoundProgram]] = OrderedDict()
        self._refused: dict[Any, str] = {}
        self._lock = threading.Lock()
        self.built = 0

    def bound(self, symbols: Mapping[str, int], threads: int | None = None) -> BoundProgram:
        """A prepared program for ``symbols`` (taken from the pool, or built) at ``threads``
        (default: the executable's); raises :class:`BackendError` when the graph's shapes
        depend on values."""
        if threads is None:
            threads = current_threads() if self.exe.threads is None else self.exe.threads
        items = tuple(symbols.items())  # (sorted only where there are several: a run's dispatch counts)
        key = (items if len(items) < 2 else tuple(sorted(items)), threads)
        free = self._free.get(key)
        if free:
            try:
                return free.pop()  # atomic under the GIL: two threads never get the same program
            except IndexError:
                pass
        why = self._refused.get(key)
        if why is not None:
            raise Unplannable(why)
        try:
            with kernel_store(self.exe.kernel_store()):  # a kernel first needed here: from the disk cache
                program = BoundProgram(self.exe, symbols, threads)
        except Unplannable as e:
            with self._lock:
                self._refused[key] = str(e)
            log.info("x86: %s runs step by step for %s: %s", self.exe.graph.name, dict(symbols), e)
            raise
        self.built += 1
        if self.exe.debug:
            log.debug("x86: %s", program.describe())
        return program

    def forget(self, symbols: Mapping[str, int]) -> None:
        """Let the prepared programs of this binding (at every thread count) go, their arenas
        with them (a binding that runs in pieces from now on)."""
        binding = tuple(sorted(symbols.items()))
        with self._lock:
            for key in [k for k in self._free if k[0] == binding]:
                del self._free[key]

    def give_back(self, program: BoundProgram) -> None:
        """Return a program taken with :meth:`bound` (kept for the next run of its binding)."""
        free = self._free.get(program.key)
        if free is not None and len(free) < PROGRAMS_PER_BINDING:
            free.append(program)
            return
        with self._lock:  # a new binding: make room for it, least recently prepared first
            free = self._free.setdefault(program.key, [])
            if len(free) < PROGRAMS_PER_BINDING:
                free.append(program)
            while len(self._free) > BINDINGS_KEPT:
                self._free.popitem(last=False)


__all__ = ["BINDINGS_KEPT", "PROGRAMS_PER_BINDING", "BoundProgram", "ProgramPool", "Unplannable"]
