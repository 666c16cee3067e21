"""Compiled kernels: ``compile_group`` / ``compile_node`` and the :class:`Kernel` wrapper.

A kernel is compiled once per *structure* (ops, attributes, dtypes, symbolic shapes with the
symbols renamed in order of appearance, constant values): the in-process cache returns the
same :class:`Kernel` for the same structure, and one kernel serves every value of the
symbolic dims, which are run-time arguments.

The call checks what the caller passes (dtypes, ranks, dims against the symbolic shapes, the
output buffers) and raises :class:`BackendError` naming the kernel and the input; then it
calls the machine code through ctypes (which releases the GIL for the duration).

Example:
    >>> import numpy as np
    >>> from metadef.ir import GraphBuilder
    >>> from metadef.shape import parse_type
    >>> b = GraphBuilder("g")
    >>> x = b.input("x", parse_type("f32[n,3]"))
    >>> y, = b.node("Relu", [x])
    >>> b.output(y)
    >>> kernel = compile_group(b.build(), "relu")
    >>> out = np.empty((2, 3), np.float32)
    >>> kernel([np.array([[-1, 2, -3], [4, -5, 6]], np.float32)], [out])
    >>> out.tolist()
    [[0.0, 2.0, 0.0], [4.0, 0.0, 6.0]]
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np

from metadef.codegen.emit import TASK, TASKS, emit_module, split_slot
from metadef.codegen.errors import CodegenUnsupported
from metadef.codegen.exprs import Reduce, walk
from metadef.codegen.host import generate
from metadef.codegen.kernel_store import (
    CompiledElsewhere,
    KernelCode,
    KernelStore,
    current_store,
    kernel_store,
    load_or_claim,
    release,
)
from metadef.codegen.link import load_object
from metadef.codegen.lower import compose
from metadef.codegen.sizes import abstract_sizes, flat_form, plain_symbol
from metadef.codegen.structure import structure_key
from metadef.core.errors import BackendError
from metadef.ir.graph import Graph, Node, Value
from metadef.shape import Dim, evaluate, free_symbols

_ENTRY = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64))
_EMPTY = np.zeros(8, np.float64)  # a valid address for zero-size tensors
_EMPTY_ADDRESS = _EMPTY.ctypes.data
_CACHE: dict[str, tuple[Kernel, KernelCode]] = {}
_PLANS: dict[tuple[Any, ...], tuple[list, list]] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class TensorSpec:
    """What the kernel expects of one input or output: name, dtype and symbolic shape."""

    name: str
    dtype: np.dtype
    shape: tuple[Dim, ...]


class Kernel:
    """A compiled kernel for one node or one fused group. Sizes are run-time arguments: one
    Kernel serves every value of the symbolic dims (batch, seq) without compiling again.

    Outputs must not overlap inputs (the generated code assumes no aliasing).
    """

    def __init__(self, name: str, inputs: list[TensorSpec], outputs: list[TensorSpec],
                 constants: list[np.ndarray], slots: tuple[Dim, ...],
                 broadcasts: list[tuple[Dim, Dim, str]], address: int, symbol: str,
                 nests: tuple[tuple[Dim, ...], ...] = (), flat: bool = False) -> None:
        self.name = name
        self.flat = flat  # (compiled flat: it takes operands of any one shape, as one run of elements)
        self.symbol = symbol
        self.nests = nests
        self.inputs, self.outputs = inputs, outputs
        self.input_dtypes = tuple(s.dtype for s in inputs)
        self.output_dtypes = tuple(s.dtype for s in outputs)
        self._constants = [np.ascontiguousarray(c) for c in constants]
        self._slots = slots
        self._broadcasts = broadcasts
        self.address = address
        self._function = _ENTRY(address)
        self._pointer_type = ctypes.c_void_p * (len(inputs) + len(constants) + len(outputs))
        self._dims_type = ctypes.c_int64 * max(1, len(slots))
        self._constant_pointers = [c.ctypes.data if c.size else _EMPTY_ADDRESS
                                   for c in self._constants]
        self._plan()

    def __repr__(self) -> str:
        return f"Kernel({self.name}: {len(self.inputs)} inputs, {len(self.outputs)} outputs)"

    def _fail(self, message: str) -> BackendError:
        return BackendError(f"kernel {self.name}: {message}")

    def _plan(self) -> None:
        """Precompute the per-call work: how each dim binds or checks, how each slot is computed
        (shared by the kernels of one code and one shape form: BERT's twelve layers plan once)."""
        key = (self.symbol, tuple(s.shape for s in [*self.inputs, *self.outputs]))
        found = _PLANS.get(key)
        if found is not None:
            self._axis_plans, self._slot_plans = found
            return
        self._plan_anew()
        _PLANS[key] = (self._axis_plans, self._slot_plans)

    def _plan_anew(self) -> None:
        bound: set[str] = set()
        self._axis_plans = []
        for spec in [*self.inputs, *self.outputs]:
            plan = []
            for axis, dim in enumerate(spec.shape):
                name = plain_symbol(dim)
                plan.append((axis, dim, name))
                if name is not None:
                    bound.add(name)
            self._axis_plans.append(plan)
        needed = set().union(*(_shape_symbols(d) for d in self._slots if not isinstance(d, int)),
                             *(free_symbols(d) for b in self._broadcasts for d in b[:2]
                               if not isinstance(d, int)))
        if needed - bound:
            raise CodegenUnsupported(f"{self.name}: the sizes {sorted(needed - bound)} come from "
                                     f"no input or output shape")
        self._slot_plans = [(d, None) if isinstance(d, int) else (d, _symbol(d)) for d in self._slots]

    def _bind(self, plan: list, spec: TensorSpec, shape: tuple[int, ...], env: dict[str, int],
              later: list[tuple[Dim, int, str]], what: str) -> None:
        for axis, dim, name in plan:
            actual = shape[axis]
            if name is None:
                if isinstance(dim, int):
                    if dim != actual:
                        raise self._fail(f"{what} has shape {shape} but dim {axis} must be {dim} "
                                         f"(expected {_format(spec.shape)})")
                else:
                    later.append((dim, actual, f"{what} dim {axis}"))
            elif name not in env:
                env[name] = actual
            elif env[name] != actual:
                later.append((dim, actual, f"{what} dim {axis}"))

    def _check(self, spec: TensorSpec, array: Any, what: str) -> np.ndarray:
        if not isinstance(array, np.ndarray):
            raise self._fail(f"{what} is a {type(array).__name__}, not a numpy array")
        if array.dtype != spec.dtype:
            raise self._fail(f"{what} has dtype {array.dtype}, expected {spec.dtype}")
        if array.ndim != len(spec.shape):
            raise self._fail(f"{what} has rank {array.ndim} (shape {array.shape}), expected "
                             f"{len(spec.shape)} ({_format(spec.shape)})")
        return array

    def __call__(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        """Compute into the caller-allocated, C-contiguous ``outputs`` (shapes concrete).

        Inputs may be any numpy arrays of the right dtype (made contiguous if they are not).
        """
        if len(inputs) != len(self.inputs) or len(outputs) != len(self.outputs):
            raise self._fail(f"takes {len(self.inputs)} inputs and {len(self.outputs)} outputs, "
                             f"got {len(inputs)} and {len(outputs)}")
        if self.flat:
            inputs, outputs = self._flattened(inputs, outputs)
        env: dict[str, int] = {}
        later: list[tuple[Dim, int, str]] = []
        pointers = self._pointer_type()
        plans = self._axis_plans
        keep = []
        for i, (spec, array) in enumerate(zip(self.inputs, inputs)):
            if type(array) is not np.ndarray or array.dtype != spec.dtype or array.ndim != len(spec.shape):
                array = self._check(spec, array, f"input {i} (%{spec.name})")
            self._bind(plans[i], spec, array.shape, env, later, f"input {i} (%{spec.name})")
            if not array.flags.c_contiguous:
                array = np.ascontiguousarray(array)
                keep.append(array)
            pointers[i] = array.ctypes.data if array.size else _EMPTY_ADDRESS
        base = len(self.inputs)
        for j, address in enumerate(self._constant_pointers):
            pointers[base + j] = address
        base += len(self._constant_pointers)
        for k, (spec, array) in enumerate(zip(self.outputs, outputs)):
            what = f"output {k} (%{spec.name})"
            array = self._check(spec, array, what)
            if not (array.flags.c_contiguous and array.flags.writeable):
                raise self._fail(f"{what} must be a writeable C-contiguous array")
            self._bind(plans[len(self.inputs) + k], spec, array.shape, env, later, what)
            pointers[base + k] = array.ctypes.data if array.size else _EMPTY_ADDRESS
        if later or self._broadcasts:
            self._check_later(env, later)
        _task_env(env, len(self.nests))
        dims = self._dims_type(*(d if name is None and isinstance(d, int) else
                                 env[name] if name is not None else evaluate(d, env)
                                 for d, name in self._slot_plans))
        self._function(pointers, dims)

    def _flat_shapes(self, shapes: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """A flat kernel's operand shapes (inputs, then outputs) as the kernel runs them: each
        tensor one run of its elements, after checking they all have one shape."""
        specs = [*self.inputs, *self.outputs]
        common: tuple[tuple[int, ...], str] | None = None
        flat = []
        for i, (spec, shape) in enumerate(zip(specs, shapes)):
            what = self._label(i)
            shape = tuple(shape)
            if not spec.shape:  # (a scalar)
                if shape:
                    raise self._fail(f"{what} has shape {shape}, expected a scalar")
                flat.append(())
                continue
            if common is None:
                common = (shape, what)
            elif shape != common[0]:
                raise self._fail(f"{what} has shape {shape}, but {common[1]} has {common[0]}: the operands "
                                 f"of this elementwise kernel share one shape")
            flat.append((math.prod(shape),))
        return flat

    def _label(self, k: int) -> str:
        """Operand ``k`` (inputs, then outputs) as the kernel's errors name it."""
        n_in = len(self.inputs)
        return f"input {k} (%{self.inputs[k].name})" if k < n_in else f"output {k - n_in}"

    def _run_shapes(self, inputs: Sequence[tuple[int, ...]], outputs: Sequence[tuple[int, ...]]
                    ) -> tuple[Sequence[tuple[int, ...]], Sequence[tuple[int, ...]]]:
        if not self.flat:
            return inputs, outputs
        shapes = self._flat_shapes([*inputs, *outputs])
        return shapes[:len(self.inputs)], shapes[len(self.inputs):]

    def _flattened(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """A flat kernel's operands as one run of elements each (views; an input that is not
        contiguous is copied first), after checking they share one shape."""
        specs, arrays = [*self.inputs, *self.outputs], [*inputs, *outputs]
        n_in = len(self.inputs)
        for k, array in enumerate(arrays):
            if not isinstance(array, np.ndarray):
                raise self._fail(f"{self._label(k)} is a {type(array).__name__}, not a numpy array")
        self._flat_shapes([a.shape for a in arrays])
        flat = []
        for k, (spec, array) in enumerate(zip(specs, arrays)):
            if spec.shape:  # (scalars stay as they are)
                if k < n_in:
                    array = np.ascontiguousarray(array).reshape(-1)
                elif not (array.flags.c_contiguous and array.flags.writeable):
                    raise self._fail(f"{self._label(k)} must be a writeable C-contiguous array")
                else:
                    array = array.reshape(-1)
            flat.append(array)
        return flat[:n_in], flat[n_in:]

    @property
    def constant_pointers(self) -> list[int]:
        """The addresses of the constants compiled with the kernel (between inputs and outputs
        in its pointer arguments); they live as long as the kernel."""
        return list(self._constant_pointers)

    def dims_for(self, input_shapes: Sequence[tuple[int, ...]], output_shapes: Sequence[tuple[int, ...]],
                 task: int = 0, tasks: int = 1, splits: Sequence[int] | None = None) -> list[int]:
        """The ``dims`` argument for these concrete shapes, after checking them against the
        kernel's symbolic shapes (a native program prepares it once per binding).

        Example:
            >>> from metadef.ir import parse_graph
            >>> g = parse_graph("graph g(%x: f32[n,3]) -> (%y) { %y: f32[n,3] = Relu(%x) return %y }")
            >>> compile_group(g, "relu").dims_for([(5, 3)], [(5, 3)])  # (compiled flat: 15 elements)
            [0, 1, 0, 15]

        ``task`` of ``tasks`` with ``splits`` (the loop each nest splits): the dims of one part
        of a parallel run (see :meth:`split_plan`).
        """
        if len(input_shapes) != len(self.inputs) or len(output_shapes) != len(self.outputs):
            raise self._fail(f"takes {len(self.inputs)} inputs and {len(self.outputs)} outputs, "
                             f"got {len(input_shapes)} and {len(output_shapes)} shapes")
        input_shapes, output_shapes = self._run_shapes(input_shapes, output_shapes)
        env: dict[str, int] = {}
        later: list[tuple[Dim, int, str]] = []
        specs = [*self.inputs, *self.outputs]
        for i, (spec, shape, plan) in enumerate(zip(specs, [*input_shapes, *output_shapes], self._axis_plans)):
            what = f"input {i} (%{spec.name})" if i < len(self.inputs) else f"output {i - len(self.inputs)}"
            if len(shape) != len(spec.shape):
                raise self._fail(f"{what} has rank {len(shape)}, expected {len(spec.shape)} ({_format(spec.shape)})")
            self._bind(plan, spec, tuple(shape), env, later, what)
        self._check_later(env, later)
        _task_env(env, len(self.nests), task, tasks, splits)
        return [d if name is None and isinstance(d, int) else env[name] if name is not None else evaluate(d, env)
                for d, name in self._slot_plans]

    def split_plan(self, input_shapes: Sequence[tuple[int, ...]], output_shapes: Sequence[tuple[int, ...]]
                   ) -> tuple[list[int], int]:
        """For a parallel run on these shapes: the loop each nest splits (the longest loop but
        the innermost) and the fewest iterations any nest's split loop has (how many tasks
        could share the work).

        Example:
            >>> from metadef.ir import parse_graph
            >>> g = parse_graph("graph g(%x: f32[n,3]) -> (%y) { %y: f32[n,3] = Relu(%x) return %y }")
            >>> compile_group(g, "relu").split_plan([(64, 3)], [(64, 3)])
            ([0], 192)
        """
        input_shapes, output_shapes = self._run_shapes(input_shapes, output_shapes)
        env: dict[str, int] = {}
        later: list[tuple[Dim, int, str]] = []
        for spec, shape, plan in zip([*self.inputs, *self.outputs], [*input_shapes, *output_shapes],
                                     self._axis_plans):
            self._bind(plan, spec, tuple(shape), env, later, spec.name)
        splits, fewest = [], None
        for nest in self.nests:
            extents = [_value(d, env) for d in nest]
            candidates = extents[:-1] if len(extents) > 1 else extents
            if not candidates:
                splits.append(0)
                fewest = 0
                continue
            k = max(range(len(candidates)), key=lambda i: candidates[i])
            splits.append(k)
            fewest = candidates[k] if fewest is None else min(fewest, candidates[k])
        return splits, fewest or 0

    def _check_later(self, env: dict[str, int], later: list[tuple[Dim, int, str]]) -> None:
        for dim, actual, what in later:
            expected = _value(dim, env)
            if expected != actual:
                raise self._fail(f"{what} is {actual} but must be {dim} = {expected} here")
        for dim, extent, where in self._broadcasts:
            d, e = _value(dim, env), _value(extent, env)
            if d not in (1, e):
                raise self._fail(f"{where}: a dim of {d} does not broadcast to {e}")


def _shape_symbols(d: Dim) -> set[str]:
    """The symbols of a slot that shapes must give (not the task dims ``__t``, ``__T``, ...)."""
    return {s for s in free_symbols(d) if not s.startswith("__")}


def _task_env(env: dict[str, int], nests: int, task: int = 0, tasks: int = 1,
              splits: Sequence[int] | None = None) -> dict[str, int]:
    env[TASK], env[TASKS] = task, tasks
    for n in range(nests):
        env[split_slot(n)] = splits[n] if splits is not None else 0
    return env


def _symbol(d: Dim) -> str | None:
    atom = None if isinstance(d, int) else d.as_atom()
    return atom.key[1] if atom is not None and atom.key[0] == "sym" else None


def _value(d: Dim, env: dict[str, int]) -> int:
    if isinstance(d, int):
        return d
    missing = free_symbols(d) - set(env)
    if missing:
        raise BackendError(f"the size {d} depends on {', '.join(sorted(missing))}, which no "
                           f"input or output shape gives")
    return evaluate(d, env)


def _format(shape: tuple[Dim, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


_LINKED: dict[str, int] = {}  # symbol -> address of every object linked into the JIT
_REPLAYED: dict[str, Kernel] = {}  # symbol -> the kernel a replayed plan made of it
_REPLAY: ContextVar[list[KernelCode] | None] = ContextVar("metadef_kernel_replay", default=None)
_RECORD: ContextVar[list[str] | None] = ContextVar("metadef_kernel_record", default=None)


@contextmanager
def replay_kernels(codes: Sequence[KernelCode]) -> Iterator[list[KernelCode]]:
    """Inside the block, each kernel compiled takes the next of ``codes`` (a stored plan's
    kernels, in the order they were compiled) instead of computing its structural key: no
    key, no LLVM. Yields what is left (empty when every code was used); once the codes run
    out, kernels compile as usual. A code whose outputs do not fit the body raises
    :class:`BackendError`.

    Example:
        >>> with replay_kernels([]) as left:
        ...     pass
        >>> left
        []
    """
    left = list(codes)
    token = _REPLAY.set(left)
    try:
        yield left
    finally:
        _REPLAY.reset(token)


@contextmanager
def record_kernels() -> Iterator[list[str]]:
    """Yield a list that receives the structural key of every kernel compiled in the block
    (whether generated, loaded or found in this process; not those that failed), in order.

    Example:
        >>> with record_kernels() as keys:
        ...     pass
        >>> keys
        []
    """
    keys: list[str] = []
    token = _RECORD.set(keys)
    try:
        yield keys
    finally:
        _RECORD.reset(token)


def _link(code: KernelCode) -> int:
    """The address of ``code``'s entry point, linking its object code once per process."""
    address = _LINKED.get(code.symbol)
    if address is None:
        address = _LINKED[code.symbol] = load_object(code.object_code, [code.symbol], code.symbol)[code.symbol]
    return address


def _fits(body: Any, code: KernelCode) -> bool:
    """``code``'s outputs have the body's output dtypes and ranks."""
    return len(code.outputs) == len(body.outputs) and all(
        v.type is not None and v.type.dtype.numpy == dtype and len(v.type.shape or ()) == len(shape)
        for v, (dtype, shape) in zip(body.outputs, code.outputs))


def _kernel(body: Any, name: str, code: KernelCode, address: int, check: bool = False, flat: bool = False
            ) -> Kernel:
    if check and not _fits(body, code):
        raise BackendError(f"kernel {name}: the code {code.symbol} does not fit the body's outputs")
    specs = [TensorSpec(v.name, v.type.dtype.numpy, tuple(v.type.shape)) for v in body.inputs]
    outs = [TensorSpec(v.name, dtype, shape) for v, (dtype, shape) in zip(body.outputs, code.outputs)]
    return Kernel(name, specs, outs, list(code.constants), code.slots, list(code.broadcasts), address, code.symbol,
                  code.nests, flat)


def _prepared(body: Any) -> tuple[Any, bool]:
    """The body a kernel is compiled from (sizes no shape gives abstracted; flat where it can
    be: :func:`~metadef.codegen.sizes.flat_form`) and whether it is flat."""
    body = abstract_sizes(body)
    flat = flat_form(body)
    return (body, False) if flat is None else (flat, True)


def _compile(body: Any, name: str) -> Kernel:
    body, flat = _prepared(body)
    replay = _REPLAY.get()
    if replay:
        code = replay.pop(0)
        done = _REPLAYED.get(code.symbol)  # made for another node of the plan (BERT's layers): its
        if done is not None and _fits(body, code) and done.flat == flat:  # names are the code's, as with a hit
            return done
        with _LOCK:
            return _REPLAYED.setdefault(code.symbol, _kernel(body, name, code, _link(code), True, flat))
    key = structure_key(body) + ("|flat" if flat else "")  # (a flat kernel takes operands of any shape)
    kernel = _compile_keyed(body, name, key, flat)
    record = _RECORD.get()
    if record is not None:
        record.append(key)
    return kernel


def _compile_keyed(body: Any, name: str, key: str, flat: bool = False) -> Kernel:
    store = current_store()
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            if store is not None:  # (compiled for another store, or none: the store gets it too)
                store.seen(key, name, hit[1])
            return hit[0]
        code = load_or_claim(store, key, name)
        if code is not None:
            address = _link(code)
        else:
            try:
                code, address = _generate(body, key)
            except BaseException:
                release(store, key)
                raise
            _LINKED[code.symbol] = address
            if store is not None:
                store.save(key, name, code)
        kernel = _kernel(body, name, code, address, flat=flat)
        _CACHE[key] = (kernel, code)
        return kernel


def _generate(body: Any, key: str) -> tuple[KernelCode, int]:
    """Lower, emit and JIT one kernel: its code and its address."""
    group = compose(body)
    symbol = f"md_kernel_{len(_CACHE)}_{hashlib.sha1(key.encode()).hexdigest()[:12]}"
    if symbol in _LINKED:  # linked from a stored plan under this name: pick another
        symbol = f"{symbol}_{len(_LINKED)}"
    emitted = emit_module(group, symbol)
    # unrolling pays where a reduction (a window sum, a dot) runs inside the loops; an
    # elementwise nest only grows (and takes LLVM up to a second) when unrolled
    reduces = any(isinstance(n, Reduce) for out in group.outputs for n in walk(out.tree))
    addresses, obj = generate(emitted.ir, [symbol], symbol, unroll=reduces)
    address = addresses[symbol]
    code = KernelCode(symbol, obj, tuple((o.dtype, tuple(o.shape)) for o in group.outputs),
                      tuple(group.constants), tuple(emitted.slots), tuple(group.broadcasts), emitted.nests)
    return code, address


def compile_group(body: Graph, name: str) -> Kernel:
    """One kernel for a whole fused group body (the ``body`` attribute of an
    ``ai.metadef::Fused`` node: its inputs/outputs correspond to the node's), lowered from the
    semantic expressions of its nodes composed into one loop nest. Raises CodegenUnsupported
    with the reason when some node of the body cannot be lowered (an opaque op, a contraction).
    """
    return _compile(body, name)


def compile_node(node: Node) -> Kernel:
    """One kernel for a single (non-fused) node, from its semantic expression.

    The kernel's inputs are the node's present (non-omitted) inputs in order, constants
    included; the values of constant inputs that the op reads (axes, ...) and of scalar
    constants (``Pow``'s exponent, an ``Add``'s ``1.0``) are compiled in, so the generated
    code can fold them (``x ** 2`` is ``x * x``).

    Example:
        >>> import numpy as np
        >>> from metadef.ir import GraphBuilder
        >>> from metadef.shape import parse_type
        >>> b = GraphBuilder("g")
        >>> x = b.input("x", parse_type("f32[n,4]"))
        >>> y, = b.node("Softmax", [x], {"axis": -1})
        >>> b.output(y)
        >>> k = compile_node(b.build().nodes[0])
        >>> out = np.empty((1, 4), np.float32)
        >>> k([np.zeros((1, 4), np.float32)], [out])
        >>> out.tolist()
        [[0.25, 0.25, 0.25, 0.25]]
    """
    inputs = [v for v in node.inputs if v is not None]
    for v in inputs:
        if v.type is None:
            raise BackendError(f"{node.op} at {node.name}: input %{v.name} has no type")
    body = Graph(node.name or node.op, [Value(v.name, v.type) for v in inputs], list(node.outputs),
                 [], [])
    renamed = {id(v): b for v, b in zip(inputs, body.inputs)}
    reads = node.metaop.reads
    for i, v in enumerate(node.inputs):
        if v is not None and (i in reads or (v.const is not None and np.ndim(v.const) == 0)):
            renamed[id(v)].const = v.const
    clone = Node(node.op, tuple(None if v is None else renamed[id(v)] for v in node.inputs),
                 node.outputs, dict(node.attrs), node.name, node.domain)
    body.nodes.append(clone)
    return _compile(body, f"{node.op} at {node.name}")


__all__ = ["CompiledElsewhere", "Kernel", "KernelCode", "KernelStore", "TensorSpec", "compile_group", "compile_node",
           "kernel_store", "load_or_claim", "record_kernels", "release", "replay_kernels"]
