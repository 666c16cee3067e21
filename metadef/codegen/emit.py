"""From expression trees to one LLVM function: the loop nest, loads, reductions, stores.

The loop-nest IR is a tree of :class:`Frame` (a straight-line block) and :class:`Loop` items.
Each value is placed in the frame of the innermost loop whose variable it reads, so anything
invariant is computed outside the loops that do not change it, once; a reduction becomes a
loop (with its accumulator as a phi) placed the same way: softmax's max and sum run once per
row, before the loop over the row's elements, which only reads them. A reduction that keeps the
last axis (``sum[r] x[r, j]``, a softmax over channels) instead runs for a block of that axis at
once, each step a contiguous vector loop into a buffer on the stack (:meth:`_Emitter.column`).
Values are cached per frame, so a subtree read twice is emitted once.

Sizes are run-time arguments: the function is ``void @name(ptr %args, ptr %dims)`` where
``args`` holds the tensor pointers (inputs, then constants, then outputs) and ``dims`` the
value of every symbolic dim in :attr:`Emitted.slots` order. Strides follow from the
(contiguous) shapes; an axis that broadcasts only at run time gets a stride times
``(dim != 1)``. The innermost loop walks the last output axis, contiguous in the output and in
every input that is not broadcast along it, so LLVM's loop vectorizer widens it (the inner
function's pointers are ``noalias``).

Example:
    >>> from metadef.ir import GraphBuilder
    >>> from metadef.codegen.lower import compose
    >>> from metadef.shape import parse_type
    >>> b = GraphBuilder("g")
    >>> x = b.input("x", parse_type("f32[n]"))
    >>> y, = b.node("Neg", [x])
    >>> b.output(y)
    >>> emitted = emit_module(compose(b.build()), "neg")
    >>> [str(s) for s in emitted.slots], "fneg float" in emitted.ir
    (['__t', '__T', '__split0', 'n'], True)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from metadef.codegen.dtypes import llvm_type, memory_type
from metadef.codegen.errors import CodegenUnsupported
from metadef.codegen.exprs import Axis, Const, InBounds, IndexValue, Lin, Load, Node, Op, Reduce, Size, free_vars, walk
from metadef.codegen.instr import cast, constant, emit_op, intrinsic
from metadef.codegen.lower import Group, Output, out_var
from metadef.codegen.mathlib import MATH_DECLARATIONS, definitions_for
from metadef.codegen.merge import merge_reduce_axes
from metadef.shape import Dim, add, floordiv, mul, sym

I64 = np.dtype(np.int64)


@dataclass(eq=False)
class Frame:
    """A straight-line block at some loop depth; ``items`` are instruction lines and loops."""

    parent: Frame | None
    depth: int
    items: list = field(default_factory=list)
    cache: dict = field(default_factory=dict)


@dataclass(eq=False)
class Loop:
    """``for var in [start, extent)``, with accumulators ``(phi, type, init, next)``."""

    var: str
    extent: str
    body: Frame
    accs: list[tuple[str, str, str, str]] = field(default_factory=list)
    start: str = "0"


@dataclass(frozen=True)
class Emitted:
    """A module's text, its entry symbol, the dims it reads at run time, and each loop nest's
    extents (outermost first) for choosing the loop a parallel run splits."""

    ir: str
    symbol: str
    slots: tuple[Dim, ...]
    nests: tuple[tuple[Dim, ...], ...] = ()


TASK, TASKS = "__t", "__T"
"""The dims a kernel reads to run part of its work: task ``__t`` of ``__T`` computes the slice
``[ext * t / T, ext * (t + 1) / T)`` of loop ``__split<n>`` of nest ``n`` (the whole of every
loop with ``__T = 1``). Callers that do not split pass 0, 1 and 0."""


def split_slot(nest: int) -> str:
    """The dim naming which loop of nest ``nest`` a task splits (its position, outermost 0)."""
    return f"__split{nest}"


class _Emitter:
    def __init__(self, group: Group, name: str) -> None:
        self.group, self.name = group, name
        self.count = 0
        self.root = Frame(None, 0)
        self.frame = self.root
        self.var_frames: dict[str, Frame] = {}
        self.var_values: dict[str, str] = {}
        self.slots: dict[str, tuple[int, Dim]] = {}
        self.dim_values: dict[str, str] = {}
        self.declarations: set[str] = set()
        self.pointers = [f"%p{i}" for i in range(len(group.sources) + len(group.outputs))]
        self.nests: list[tuple[Dim, ...]] = []
        self.columns: dict[Reduce, tuple[str, Reduce]] = {}  # column reduction -> (its block's buffer, merged form)
        self.block_start = "0"  # the first element of the current block of the innermost output loop
        self.last = ""  # the innermost output variable of the nest being emitted

    # ------------------------------------------------------------------ plumbing
    def fresh(self, prefix: str = "v") -> str:
        self.count += 1
        return f"%{prefix}{self.count}"

    def emitter(self, frame: Frame):
        def out(text: str) -> str:
            name = self.fresh()
            frame.items.append(f"  {name} = {text}")
            return name
        out.declare = self.declarations.add  # type: ignore[attr-defined]
        return out

    def dim(self, d: Dim) -> str:
        """The i64 value of a dim: a literal, or loaded from the dims array (once)."""
        if isinstance(d, int):
            return str(d)
        key = str(d)
        if key not in self.dim_values:
            slot = self.slots.setdefault(key, (len(self.slots), d))[0]
            out = self.emitter(self.root)
            ptr = out(f"getelementptr inbounds i64, ptr %dims, i64 {slot}")
            self.dim_values[key] = out(f"load i64, ptr {ptr}, !invariant.load !0")
        return self.dim_values[key]

    def frame_of(self, node: Node) -> Frame:
        frames = [self.var_frames[v] for v in free_vars(node)]
        return max(frames, key=lambda f: f.depth, default=self.root)

    # ------------------------------------------------------------------ values
    def value(self, node: Node) -> str:
        if isinstance(node, Const):
            return constant(node.value, node.dtype or np.asarray(node.value).dtype)
        if isinstance(node, Size):
            return self.dim(node.dim)
        frame = self.frame_of(node)
        scope: Frame | None = frame
        while scope is not None:
            if node in scope.cache:
                return scope.cache[node]
            scope = scope.parent
        result = self._emit(node, frame)
        frame.cache[node] = result
        return result

    def _emit(self, node: Node, frame: Frame) -> str:
        out = self.emitter(frame)
        if isinstance(node, Op):
            args = [(self.value(a), a.dtype or I64) for a in node.args]
            return emit_op(out, node.name, args, node.dtype)
        if isinstance(node, IndexValue):
            return self.lin(node.index, frame)
        if isinstance(node, Load):
            return self.load(node, frame)
        if isinstance(node, InBounds):
            inside = self.offset(node.axes, frame)[1]
            return cast(out, inside, np.dtype(bool), node.dtype)
        if isinstance(node, Reduce) and node in self.columns:
            return self.column_value(node, frame)
        if isinstance(node, Reduce):
            return self.reduce(node, frame)
        raise CodegenUnsupported(f"cannot emit {type(node).__name__}")

    def lin(self, lin: Lin, frame: Frame) -> str:
        out = self.emitter(frame)
        total = self.dim(lin.offset)
        for v, c in lin.terms:
            term = self.var_values[v] if c == 1 else out(f"mul i64 {self.dim(c)}, {self.var_values[v]}")
            total = term if total == "0" else out(f"add i64 {total}, {term}")
        return total

    # ------------------------------------------------------------------ memory
    def offset(self, axes: tuple[Axis, ...], frame: Frame) -> tuple[str, str]:
        """(element offset, all-inside flag) of an access; strides from the contiguous shape."""
        dims = [a.dim for a in axes]
        strides: list[Dim] = [1] * len(dims)
        for i in range(len(dims) - 2, -1, -1):
            strides[i] = mul(strides[i + 1], dims[i + 1])
        out = self.emitter(frame)
        static = Lin()
        total, inside = "0", "true"
        for axis, stride in zip(axes, strides):
            if axis.mode == "zero":
                continue
            if axis.mode == "plain":
                static = static.plus(axis.index.scale(stride))
                continue
            index = self.lin(axis.index, frame)
            if axis.mode == "maybe":
                root = self.emitter(self.root)
                wide = root(f"icmp ne i64 {self.dim(axis.dim)}, 1")
                step = root(f"mul i64 {self.dim(stride)}, {root(f'zext i1 {wide} to i64')}")
                term = out(f"mul i64 {index}, {step}")
            else:
                ok = out(f"icmp ult i64 {index}, {self.dim(axis.dim)}")
                inside = ok if inside == "true" else out(f"and i1 {inside}, {ok}")
                term = out(f"mul i64 {out(f'select i1 {ok}, i64 {index}, i64 0')}, {self.dim(stride)}")
            total = term if total == "0" else out(f"add i64 {total}, {term}")
        if static.terms or static.offset != 0:
            base = self.lin(static, frame)
            total = base if total == "0" else out(f"add i64 {total}, {base}")
        return total, inside

    def load(self, node: Load, frame: Frame) -> str:
        out = self.emitter(frame)
        offset, inside = self.offset(node.axes, frame)
        mem = memory_type(node.dtype)
        ptr = out(f"getelementptr inbounds {mem}, ptr %p{node.tensor}, i64 {offset}")
        value = out(f"load {mem}, ptr {ptr}")
        if node.dtype.kind == "b":
            value = out(f"icmp ne i8 {value}, 0")
        if inside != "true":
            ty = llvm_type(node.dtype)
            value = out(f"select i1 {inside}, {ty} {value}, {ty} {constant(node.fill, node.dtype)}")
        return value

    # ------------------------------------------------------------------ loops
    def open_loop(self, var: str, extent: Dim, parent: Frame) -> Loop:
        body = Frame(parent, parent.depth + 1)
        loop = Loop(self.fresh("i"), self.dim(extent), body)
        self.var_frames[var], self.var_values[var] = body, loop.var
        return loop

    def reduce(self, node: Reduce, frame: Frame) -> str:
        node = merge_reduce_axes(node)  # (whole adjacent axes as one loop: a plain vector loop)
        acc_type = llvm_type(node.acc)
        init = constant(_identity(node.op, node.acc), node.acc)
        loops, parent = [], frame
        for var, extent in zip(node.vars, node.extents):
            loops.append(self.open_loop(var, extent, parent))
            parent = loops[-1].body
        phis = [self.fresh("acc") for _ in loops]
        body = cast(self.emitter(parent), self.value(node.body), node.body.dtype, node.acc)
        out = self.emitter(parent)
        extremum = node.op in ("max", "min") and node.acc.kind == "f"
        if extremum:  # x86's max / min (one instruction), a NaN seen kept apart: see _extremum
            nxt, nan_phis = _extremum(out, node.op, phis[-1], body, node.acc), [self.fresh("nan") for _ in loops]
            seen = out(f"or i1 {nan_phis[-1]}, {out(f'fcmp uno {acc_type} {body}, 0.0')}")
        else:
            nxt = _combine(out, node.op, phis[-1], body, node.acc)
        for k, loop in enumerate(loops):
            start = init if k == 0 else phis[k - 1]
            done = nxt if k == len(loops) - 1 else phis[k + 1]
            loop.accs.append((phis[k], acc_type, start, done))
            if extremum:
                loop.accs.append((nan_phis[k], "i1", "false" if k == 0 else nan_phis[k - 1],
                                  seen if k == len(loops) - 1 else nan_phis[k + 1]))
        for k in range(len(loops) - 1, 0, -1):
            loops[k - 1].body.items.append(loops[k])
        frame.items.append(loops[0])
        for var in node.vars:
            del self.var_frames[var]
        result = phis[0]
        if extremum:
            nan = constant(float("nan"), node.acc)
            result = self.emitter(frame)(f"select i1 {nan_phis[0]}, {acc_type} {nan}, {acc_type} {result}")
        return self.finish(node, result, frame)

    def finish(self, node: Reduce, result: str, frame: Frame) -> str:
        """A reduction's accumulated ``result`` as its value: divided by the count for a mean,
        cast to its dtype."""
        out = self.emitter(frame)
        if node.op == "mean":
            acc_type = llvm_type(node.acc)
            count = "1"
            for extent in node.extents:
                count = out(f"mul i64 {count}, {self.dim(extent)}")
            result = out(f"fdiv {acc_type} {result}, {out(f'sitofp i64 {count} to {acc_type}')}")
        return cast(out, result, node.acc, node.dtype)

    # ------------------------------------------------------------------ column reductions
    def element_of(self, buffer: str, acc_type: str, frame: Frame) -> str:
        """The address of the current element of the innermost output loop in a block buffer."""
        out = self.emitter(frame)
        var = self.var_values[self.last]
        return out(f"getelementptr inbounds {acc_type}, ptr {buffer}, i64 {out(f'sub i64 {var}, {self.block_start}')}")

    def column(self, original: Reduce, block: Frame, end: str) -> None:
        """Reduction ``original`` for every element of the current block of the innermost
        output loop at once, into a buffer: the identity stored, then for each step of the
        reduction a contiguous (vector) loop over the block combining into it."""
        node = merge_reduce_axes(original)
        acc_type = llvm_type(node.acc)
        buffer = self.fresh("col")
        self.root.items.insert(0, f"  {buffer} = alloca [{COLUMN_BLOCK} x {acc_type}], align 64")
        saved = self.var_frames[self.last], self.var_values[self.last]
        init = self.block_loop(block, end)
        ptr = self.element_of(buffer, acc_type, init.body)
        init.body.items.append(f"  store {acc_type} {constant(_identity(node.op, node.acc), node.acc)}, ptr {ptr}")
        block.items.append(init)
        loops, parent = [], block
        for var, extent in zip(node.vars, node.extents):
            loops.append(self.open_loop(var, extent, parent))
            parent = loops[-1].body
        inner = self.block_loop(parent, end)
        body = cast(self.emitter(inner.body), self.value(node.body), node.body.dtype, node.acc)
        out = self.emitter(inner.body)
        ptr = self.element_of(buffer, acc_type, inner.body)
        combined = _combine(out, node.op, out(f"load {acc_type}, ptr {ptr}"), body, node.acc)
        inner.body.items.append(f"  store {acc_type} {combined}, ptr {ptr}")
        parent.items.append(inner)
        for k in range(len(loops) - 1, 0, -1):
            loops[k - 1].body.items.append(loops[k])
        block.items.append(loops[0] if loops else inner)
        for var in node.vars:
            del self.var_frames[var]
        self.var_frames[self.last], self.var_values[self.last] = saved
        self.columns[original] = (buffer, node)

    def block_loop(self, parent: Frame, end: str) -> Loop:
        """A loop over the current block of the innermost output axis (its variable bound to it)."""
        loop = Loop(self.fresh("i"), end, Frame(parent, parent.depth + 1), start=self.block_start)
        self.var_frames[self.last], self.var_values[self.last] = loop.body, loop.var
        return loop

    def column_value(self, original: Reduce, frame: Frame) -> str:
        buffer, node = self.columns[original]
        acc_type = llvm_type(node.acc)
        ptr = self.element_of(buffer, acc_type, frame)
        return self.finish(node, self.emitter(frame)(f"load {acc_type}, ptr {ptr}"), frame)

    def nest(self, outputs: list[tuple[int, Output]]) -> None:
        """One loop nest computing the outputs (all of one shape). Where a reduction runs down
        the columns of the innermost output axis (``sum[r] x[r, j]``), that axis is walked in
        blocks of :data:`COLUMN_BLOCK`: a block loop after the axes the reductions depend on,
        each block's reductions first (:meth:`column`), then the other axes, then the block's
        elements innermost."""
        shape = outputs[0][1].shape
        trees = [o.tree for _, o in outputs]
        order = _loop_order(len(shape), trees)
        self.last = out_var(len(shape) - 1) if shape else ""
        columns = _column_reductions(trees, self.last) if shape else []
        plan: list[int | None] = list(order)  # output axes, None for the block loop
        if columns:
            used = _reduction_vars(trees)
            plan = [a for a in order if out_var(a) in used and a != len(shape) - 1] + [None] + \
                [a for a in order if out_var(a) not in used and a != len(shape) - 1]
        blocks = floordiv(add(shape[-1], COLUMN_BLOCK - 1), COLUMN_BLOCK) if columns else 1
        splittable = len(plan) if columns or len(plan) == 1 else len(plan) - 1  # never the innermost loop
        if splittable:
            task, tasks = self.dim(sym(TASK)), self.dim(sym(TASKS))
            split = self.dim(sym(split_slot(len(self.nests))))
        self.nests.append(tuple(blocks if a is None else shape[a] for a in plan) + ((COLUMN_BLOCK,) if columns else ()))
        loops, parent = [], self.root
        for k, axis in enumerate(plan):
            if axis is None:
                loop = Loop(self.fresh("b"), self.dim(blocks), Frame(parent, parent.depth + 1))
            else:
                loop = self.open_loop(out_var(axis), shape[axis], parent)
            if k < splittable:  # this task's slice when the split falls on this loop
                out = self.emitter(parent)
                mine = out(f"icmp eq i64 {split}, {k}")
                lo = out(f"sdiv i64 {out(f'mul i64 {loop.extent}, {task}')}, {tasks}")
                after = out(f"add i64 {task}, 1")
                hi = out(f"sdiv i64 {out(f'mul i64 {loop.extent}, {after}')}, {tasks}")
                loop.start = out(f"select i1 {mine}, i64 {lo}, i64 0")
                loop.extent = out(f"select i1 {mine}, i64 {hi}, i64 {loop.extent}")
            loops.append(loop)
            parent = loop.body
            if axis is None:  # the block's reductions
                out = self.emitter(parent)
                extent = self.dim(shape[-1])
                self.block_start = out(f"mul i64 {loop.var}, {COLUMN_BLOCK}")
                after = out(f"add i64 {self.block_start}, {COLUMN_BLOCK}")
                end = out(f"select i1 {out(f'icmp slt i64 {after}, {extent}')}, i64 {after}, i64 {extent}")
                self.var_frames[self.last], self.var_values[self.last] = parent, "0"  # (rebound per loop)
                for node in columns:
                    self.column(node, parent, end)
        if columns:  # the block's elements
            loops.append(self.block_loop(parent, end))
            parent = loops[-1].body
        index = Lin()
        stride: Dim = 1
        for axis in range(len(shape) - 1, -1, -1):
            index = index.plus(Lin.var(out_var(axis)).scale(stride))
            stride = mul(stride, shape[axis])
        for position, output in outputs:
            value = self.value(output.tree)
            out = self.emitter(parent)
            offset = self.lin(index, parent)
            mem = memory_type(output.dtype)
            if output.dtype.kind == "b":
                value = out(f"zext i1 {value} to i8")
            ptr = out(f"getelementptr inbounds {mem}, ptr %p{len(self.group.sources) + position}, i64 {offset}")
            parent.items.append(f"  store {mem} {value}, ptr {ptr}")
        for k in range(len(loops) - 1, 0, -1):
            loops[k - 1].body.items.append(loops[k])
        if loops:
            self.root.items.append(loops[0])
        self.var_frames.clear()
        self.columns.clear()
        self.block_start = "0"

    # ------------------------------------------------------------------ text
    def render(self, frame: Frame, label: str, lines: list[str]) -> str:
        for item in frame.items:
            if isinstance(item, str):
                lines.append(item)
                continue
            n = self.fresh("L")[1:]
            head, body, latch, done = f"{n}.head", f"{n}.body", f"{n}.latch", f"{n}.exit"
            lines += [f"  br label %{head}", f"{head}:",
                      f"  {item.var} = phi i64 [{item.start}, %{label}], [{item.var}.next, %{latch}]"]
            lines += [f"  {phi} = phi {ty} [{init}, %{label}], [{nxt}, %{latch}]"
                      for phi, ty, init, nxt in item.accs]
            lines += [f"  {item.var}.go = icmp slt i64 {item.var}, {item.extent}",
                      f"  br i1 {item.var}.go, label %{body}, label %{done}", f"{body}:"]
            self.render(item.body, body, lines)
            lines += [f"  br label %{latch}", f"{latch}:",
                      f"  {item.var}.next = add nuw nsw i64 {item.var}, 1",
                      f"  br label %{head}", f"{done}:"]
            label = done
        return label


def _identity(op: str, dtype: np.dtype) -> int | float | bool:
    if op in ("sum", "mean"):
        return 0
    if op == "prod":
        return 1
    if dtype.kind == "f":
        return -np.inf if op == "max" else np.inf
    info = np.iinfo(dtype) if dtype.kind != "b" else None
    if info is None:
        return op == "min"
    return info.min if op == "max" else info.max


def _combine(out, op: str, acc: str, value: str, dtype: np.dtype) -> str:
    ty = llvm_type(dtype)
    if op in ("max", "min"):
        if dtype.kind == "f":
            return intrinsic(out, "maximum" if op == "max" else "minimum", dtype, [acc, value])
        if dtype.kind == "b":
            return out(f"{'or' if op == 'max' else 'and'} i1 {acc}, {value}")
        prefix = "s" if dtype.kind == "i" else "u"
        return intrinsic(out, f"{prefix}{op}", dtype, [acc, value])
    if dtype.kind == "f":
        kind = "fmul" if op == "prod" else "fadd"
        return out(f"{kind} reassoc contract {ty} {acc}, {value}")
    return out(f"{'mul' if op == 'prod' else 'add'} {ty} {acc}, {value}")


COLUMN_BLOCK = 256
"""Elements of the innermost output axis whose column reductions run together (a buffer of
this many accumulators each, on the stack)."""


def _column_reductions(trees: list[Node], last: str) -> list[Reduce]:
    """The reductions (children first) that depend on the innermost output variable ``last``
    and read it only as the whole index of their tensors' last axes, their own variables on
    other axes: each step of such a reduction reads a contiguous run along ``last``, so a
    block of them accumulates as one vector loop (one at a time, each strode across rows)."""
    found = []
    for tree in trees:
        for node in walk(tree):
            if isinstance(node, Reduce) and last in free_vars(node) and _reads_columns(node, last) \
                    and node not in found:
                found.append(node)
    return found


def _reads_columns(node: Reduce, last: str) -> bool:
    own = set(node.vars)
    for n in walk(node.body):
        if isinstance(n, IndexValue) and last in n.index.variables:
            return False
        if isinstance(n, (Load, InBounds)):
            axes = [a for a in n.axes if a.mode != "zero"]
            for i, a in enumerate(axes):
                uses = set(a.index.variables)
                if last in uses and (i != len(axes) - 1 or a is not n.axes[-1] or a.index.bare != last
                                     or a.mode != "plain"):
                    return False
                if uses & own and a is n.axes[-1]:
                    return False
        if isinstance(n, Reduce) and n is not node and not _reads_columns(n, last):
            return False
    return True


def _reduction_vars(trees: list[Node]) -> set[str]:
    """The output variables some reduction of the trees depends on."""
    return {v for tree in trees for node in walk(tree) if isinstance(node, Reduce) for v in free_vars(node)}


def _extremum(out, op: str, acc: str, value: str, dtype: np.dtype) -> str:
    """A float max / min step of a reduction as ``llvm.maxnum`` / ``minnum`` marked ``nnan nsz``:
    one vmaxps / vminps a vector (``llvm.maximum`` is NaN-propagating and orders -0 below +0,
    five instructions). It may drop a NaN, so the reduction also tracks whether it saw one and
    answers NaN then (as numpy's max); with no NaN the result is exact, up to the sign of a
    zero among zeros."""
    ty = llvm_type(dtype)
    suffix = {"float": "f32", "double": "f64", "half": "f16"}[ty]
    name = f"llvm.{'maxnum' if op == 'max' else 'minnum'}.{suffix}"
    out.declare(f"declare {ty} @{name}({ty}, {ty})")
    return out(f"call nnan nsz {ty} @{name}({ty} {acc}, {ty} {value})")


def _loop_order(rank: int, trees: list[Node]) -> list[int]:
    """Output axes outermost-first: the axes that reductions depend on go first, so each
    reduction runs once per value of them (the rest keep their order, the last innermost)."""
    used = _reduction_vars(trees)
    axes = list(range(rank))
    return sorted(axes, key=lambda a: (out_var(a) not in used, a)) if used else axes


def _group_outputs(outputs: list[Output]) -> list[list[tuple[int, Output]]]:
    groups: dict[tuple[str, ...], list[tuple[int, Output]]] = {}
    for i, o in enumerate(outputs):
        groups.setdefault(tuple(str(d) for d in o.shape), []).append((i, o))
    return list(groups.values())


def emit_module(group: Group, name: str) -> Emitted:
    """The LLVM module of a composed group, with its entry ``@<name>``."""
    e = _Emitter(group, name)
    for outputs in _group_outputs(group.outputs):
        e.nest(outputs)
    lines: list[str] = []
    e.render(e.root, "entry", lines)
    params = ", ".join(f"ptr noalias {p}" for p in e.pointers)
    body = "\n".join(lines)
    loads = "\n".join(
        f"  %a{i} = getelementptr inbounds ptr, ptr %args, i64 {i}\n  %q{i} = load ptr, ptr %a{i}"
        for i in range(len(e.pointers)))
    call_args = ", ".join(f"ptr %q{i}" for i in range(len(e.pointers)))
    text = "\n".join([
        f"define internal void @{name}.body({params}, ptr noalias %dims) alwaysinline nounwind {{",
        "entry:", body, "  ret void", "}", "",
        f"define void @{name}(ptr %args, ptr %dims) nounwind {{", "entry:", loads,
        f"  call void @{name}.body({call_args}, ptr %dims)", "  ret void", "}", "",
        definitions_for(body), MATH_DECLARATIONS, *sorted(e.declarations - set(MATH_DECLARATIONS.split("\n"))),
        "!0 = !{}", ""])
    slots = tuple(d for _, d in sorted(e.slots.values(), key=lambda s: s[0]))
    return Emitted(text, name, slots, tuple(e.nests))


__all__ = ["COLUMN_BLOCK", "TASK", "TASKS", "Emitted", "Frame", "Loop", "emit_module", "split_slot"]
