"""Composing a group's semantic programs into one expression tree per output.

Every node of the body is instantiated with the body's symbolic shapes; each statement of its
program becomes a :class:`Definition` of one tensor (a body value, or a temporary such as
softmax's ``t_max``). An output is then the definition of its value *read* at the output
loop variables: reading a definition substitutes the reader's indices for its left-hand
variables and lowers its right-hand side in place, so elementwise chains stay in registers and
no intermediate array exists. Reductions become :class:`~metadef.codegen.exprs.Reduce` nodes
whose variables get canonical names, so the same reduction read twice is one node.

Broadcasting follows the evaluator: a whole-index variable on an axis of literal length 1
ignores its index (stride 0); on an axis whose length may be 1 only at run time the stride
is chosen at run time; other indices must stay inside the tensor (checked reads fill 0).

Example:
    >>> from metadef.ir import GraphBuilder
    >>> from metadef.shape import parse_type
    >>> b = GraphBuilder("g")
    >>> x = b.input("x", parse_type("f32[n,4]"))
    >>> y, = b.node("Relu", [x])
    >>> b.output(y)
    >>> group = compose(b.build())
    >>> [str(d) for d in group.outputs[0].shape], group.outputs[0].tree.name
    (['n', '4'], 'max')
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from metadef.codegen.build import apply, convert
from metadef.codegen.dtypes import SUPPORTED, accumulator
from metadef.codegen.errors import CodegenUnsupported
from metadef.codegen.exprs import Axis, Const, InBounds, IndexValue, Lin, Load, Node, Op, Reduce, Size
from metadef.codegen.shapes import expand_ellipsis, extents, same, to_lin
from metadef.codegen.structure import runtime_scalars
from metadef.ops.interface import resolve_attrs
from metadef.ops.numpy_eval.run import tensor_names
from metadef.ops.semantics import Access, Binary, Call, Expr, Number, Param, Unary, Var
from metadef.ops.semantics import Reduce as SReduce
from metadef.ops.strategy import Role
from metadef.shape import Dim
from metadef.shape import Expr as DimExpr


@dataclass(frozen=True)
class Source:
    """A tensor the kernel reads: input ``index`` of the kernel (body inputs, then constants)."""

    index: int
    shape: tuple[Dim, ...]
    dtype: np.dtype


@dataclass
class Definition:
    """One statement: ``key[lhs] = rhs`` with its params, extents and the node it came from."""

    key: str
    lhs: tuple[str, ...]
    rhs: Expr
    names: dict[str, str]
    params: dict[str, Any]
    extents: dict[str, Dim]
    shape: tuple[Dim, ...]
    cast: np.dtype | None
    where: str


@dataclass(frozen=True)
class Output:
    """One kernel output: its tree over variables ``o0..``, shape and dtype."""

    tree: Node
    shape: tuple[Dim, ...]
    dtype: np.dtype


@dataclass
class Group:
    """What lowering gives the emitter: the sources (inputs), the outputs and their trees."""

    sources: list[Source]
    outputs: list[Output]
    constants: list[np.ndarray] = field(default_factory=list)
    broadcasts: list[tuple[Dim, Dim, str]] = field(default_factory=list)
    """(dim, extent, where): at run time the dim must be 1 or the extent."""


def out_var(i: int) -> str:
    """The loop variable of output axis ``i``."""
    return f"o{i}"


class _Composer:
    def __init__(self, body: Any) -> None:
        self.body = body
        self.tensors: dict[str, Source | Const | Definition] = {}
        self.keys: dict[int, str] = {}
        self.constants: list[np.ndarray] = []
        self.sources: list[Source] = []
        self.const_sources: list[Source] = []
        self.broadcasts: list[tuple[Dim, Dim, str]] = []
        self.reduce_ids: dict[tuple, int] = {}
        self.holders = 0
        self.memo: dict[tuple, Node] = {}
        passed = runtime_scalars(body)  # (scalars read at run time: a quantized layer's scales)
        for v in body.inputs:
            self.sources.append(self._source(v, len(self.sources)))
            if v.const is not None and np.ndim(v.const) == 0 and id(v) not in passed:  # a scalar the kernel
                self.tensors[self.keys[id(v)]] = self._constant(v)  # is compiled for (its pointer is passed, not read)

    # ---------------------------------------------------------------- tensors and names
    def key(self, value: Any) -> str:
        got = self.keys.get(id(value))
        if got is None:
            got = self.keys[id(value)] = f"%{value.name}#{len(self.keys)}"
        if got not in self.tensors and value.const is not None:
            self.tensors[got] = self._constant(value)
        return got

    def _source(self, value: Any, index: int) -> Source:
        t = value.type
        if t is None or t.shape is None or t.dtype.numpy not in SUPPORTED:
            raise CodegenUnsupported(f"input %{value.name} has type {t}, which has no code generation")
        source = Source(index, tuple(t.shape), t.dtype.numpy)
        self.keys[id(value)] = key = f"%{value.name}#{len(self.keys)}"
        self.tensors[key] = source
        return source

    def _constant(self, value: Any) -> Source | Const:
        array = np.asarray(value.const)
        if array.dtype not in SUPPORTED:
            raise CodegenUnsupported(f"constant %{value.name} has dtype {array.dtype}")
        if array.ndim == 0:
            return Const(array.item(), array.dtype)
        self.constants.append(array)
        source = Source(len(self.body.inputs) + len(self.constants) - 1, array.shape, array.dtype)
        self.const_sources.append(source)
        return source

    def shape(self, key: str) -> tuple[Dim, ...]:
        t = self.tensors[key]
        return () if isinstance(t, Const) else t.shape

    # ---------------------------------------------------------------------- nodes
    def add_node(self, node: Any) -> None:
        op = node.metaop
        where = f"{op.name} at {node.name or '?'}"
        if op.role is Role.CONTRACTION:
            raise CodegenUnsupported(f"{where}: a contraction (the backend runs it through BLAS)")
        if op.semantics.opaque:
            raise CodegenUnsupported(f"{where}: an opaque op (no index expression)")
        attrs = resolve_attrs(op.name, f"(node {node.name})", op.attrs, node.attrs)
        shapes = [None if v is None or v.type is None else v.type.shape for v in node.inputs]
        values = [v.const if v is not None and i in op.reads else None
                  for i, v in enumerate(node.inputs)]
        instance = op.semantics.instantiate(attrs, shapes, values)
        if instance is None:
            raise CodegenUnsupported(f"{where}: no index expression for these attributes/shapes")
        program, params = instance
        names = {n: self.key(v) for n, v in zip(tensor_names(op, len(node.inputs)), node.inputs)
                 if v is not None}
        outs = dict(zip(tensor_names(op, len(node.outputs), outputs=True), node.outputs))
        for n in program.temporaries + program.outputs:
            names.setdefault(n, self.key(outs[n]) if n in outs else f"{node.name}:{n}")
        for stmt in program.statements:
            self._add_statement(stmt, names, params, outs.get(stmt.name), where)

    def _add_statement(self, stmt: Any, names: dict[str, str], params: dict[str, Any],
                       value: Any, where: str) -> None:
        key = names[stmt.name]
        shapes = {n: self.shape(k) for n, k in names.items() if k in self.tensors}
        out_type = None if value is None else value.type
        if value is not None and (out_type is None or out_type.shape is None):
            raise CodegenUnsupported(f"{where}: output %{value.name} has no known shape")
        out_shape = None if out_type is None else tuple(out_type.shape)
        stmt = expand_ellipsis(stmt, shapes, None if out_shape is None else len(out_shape))
        ranges = extents(stmt, shapes, params, out_shape)
        lhs = tuple(i.var_name for i in stmt.lhs.indices)
        if None in lhs:
            raise CodegenUnsupported(f"{where}: output index of {stmt.lhs} is not a plain variable")
        shape = out_shape if out_shape is not None else tuple(ranges[v] for v in lhs)
        cast = None if out_type is None else out_type.dtype.numpy
        if cast is not None and cast not in SUPPORTED:
            raise CodegenUnsupported(f"{where}: dtype {cast} has no code generation")
        self.tensors[key] = Definition(key, lhs, stmt.rhs, names, params, ranges, shape, cast,
                                       where)  # type: ignore[arg-type]

    # ---------------------------------------------------------------- reading tensors
    def read(self, key: str, index: list[Lin], modes: list[str] | None = None, fill: Any = 0,
             where: str = "") -> Node:
        """The value of tensor ``key`` at ``index`` (forms in the reader's variables)."""
        tensor = self.tensors[key]
        modes = modes or ["plain"] * len(index)
        if isinstance(tensor, Const):
            return tensor
        if isinstance(tensor, Source):
            axes = tuple(Axis(i, d, m) for i, d, m in zip(index, tensor.shape, modes))
            return Load(tensor.index, axes, tensor.dtype, fill)
        if any(m in ("maybe", "checked") for m in modes):
            raise CodegenUnsupported(f"{where}: reads intermediate {key} with a broadcast or an "
                                     f"index that may leave it (fuse less, or materialize it)")
        env = {v: (Lin() if m == "zero" else i) for v, i, m in zip(tensor.lhs, index, modes)}
        memo_key = (key, tuple(sorted(env.items())))
        got = self.memo.get(memo_key)
        if got is None:
            got = self.lower(tensor.rhs, tensor, env, 0)
            if tensor.cast is not None:
                got = convert(got, tensor.cast)
            self.memo[memo_key] = got
        return got

    def _access(self, a: Access, d: Definition, env: dict[str, Lin]) -> tuple[str, list[Lin], list[str]]:
        key = d.names[a.tensor]
        shape = self.shape(key)
        index, modes = [], []
        for idx, dim in zip(a.indices, shape):
            local = to_lin(idx, d.params, d.where)  # type: ignore[arg-type]
            bare = local.bare
            if bare is not None:
                extent = d.extents[bare]
                mode = "zero" if same(dim, 1) and not same(extent, 1) else \
                    "plain" if same(dim, extent) else "maybe"
                if mode == "maybe":
                    self.broadcasts.append((dim, extent, f"{d.where}: {a}"))
            else:
                mode = "plain" if _inside(local, d.extents, dim) else "checked"
            index.append(local.substitute(env))
            modes.append(mode)
        return key, index, modes

    # ------------------------------------------------------------------ expressions
    def lower(self, e: Expr, d: Definition, env: dict[str, Lin], depth: int) -> Node:
        if isinstance(e, Number):
            return Const(e.value)
        if isinstance(e, Param):
            value = d.params.get(e.name)
            if isinstance(value, DimExpr):
                return Size(value)
            if not isinstance(value, (int, float, bool)):
                raise CodegenUnsupported(f"{d.where}: param {e.name} is {value!r}")
            return Const(value)
        if isinstance(e, Var):
            return IndexValue(env[e.name])
        if isinstance(e, Access):
            key, index, modes = self._access(e, d, env)
            return self.read(key, index, modes, where=d.where)
        if isinstance(e, Unary):
            return apply(e.op, [self.lower(e.operand, d, env, depth)])
        if isinstance(e, Binary):
            return apply(e.op, [self.lower(e.left, d, env, depth), self.lower(e.right, d, env, depth)])
        if isinstance(e, Call):
            return self._call(e, d, env, depth)
        if isinstance(e, SReduce):
            return self._reduce(e, d, env, depth)
        raise CodegenUnsupported(f"{d.where}: cannot lower {e}")

    def _call(self, e: Call, d: Definition, env: dict[str, Lin], depth: int) -> Node:
        if e.func in ("fill", "inbounds"):
            access = e.args[0]
            assert isinstance(access, Access)
            key, index, modes = self._access(access, d, env)
            tensor = self.tensors[key]
            if not isinstance(tensor, Source):
                raise CodegenUnsupported(f"{d.where}: {e.func} of an intermediate tensor")
            axes = tuple(Axis(i, dim, m) for i, dim, m in zip(index, tensor.shape, modes))
            if e.func == "inbounds":
                return InBounds(axes, tensor.dtype)
            fill = self.lower(e.args[1], d, env, depth)
            if not isinstance(fill, Const):
                raise CodegenUnsupported(f"{d.where}: the fill value {e.args[1]} is not a literal")
            return Load(tensor.index, axes, tensor.dtype, fill.value)
        return apply(e.func, [self.lower(a, d, env, depth) for a in e.args])

    def _reduce(self, e: SReduce, d: Definition, env: dict[str, Lin], depth: int) -> Node:
        holders = [f"?{self.holders + j}" for j in range(len(e.vars))]
        self.holders += len(holders)
        inner = dict(env) | {v: Lin.var(h) for v, h in zip(e.var_names, holders)}
        body = self.lower(e.body, d, inner, depth + 1)
        if body.dtype is None:
            raise CodegenUnsupported(f"{d.where}: a reduction of a constant ({e})")
        sizes = tuple(d.extents[v] for v in e.var_names)
        shape_key = (e.op, tuple(str(s) for s in sizes),
                     rename(body, {h: f"?.{j}" for j, h in enumerate(holders)}))
        ident = self.reduce_ids.setdefault(shape_key, len(self.reduce_ids))
        names = tuple(f"r{ident}.{j}" for j in range(len(holders)))
        body = rename(body, dict(zip(holders, names)))
        acc, dtype = accumulator(e.op, body.dtype)
        return Reduce(e.op, names, sizes, body, acc, dtype)


def _inside(index: Lin, ranges: dict[str, Dim], dim: Dim) -> bool:
    """Whether ``index`` provably stays in ``[0, dim)`` (sizes are at least 1)."""
    if not isinstance(index.offset, int) or index.offset < 0:
        return False
    high: Dim = index.offset
    for v, c in index.terms:
        if isinstance(c, int) and c < 0:
            return False
        high = high + c * (ranges[v] - 1)
    if index.is_const() and index.offset == 0:
        return isinstance(dim, DimExpr) or dim >= 1
    room = dim - 1 - high
    return isinstance(room, int) and room >= 0


def rename(node: Node, names: dict[str, str]) -> Node:
    """``node`` with loop variables renamed."""
    env = {old: Lin.var(new) for old, new in names.items()}

    def axes(a: tuple[Axis, ...]) -> tuple[Axis, ...]:
        return tuple(replace(x, index=x.index.substitute(env)) for x in a)

    def go(n: Node) -> Node:
        if isinstance(n, (Load, InBounds)):
            return replace(n, axes=axes(n.axes))
        if isinstance(n, IndexValue):
            return replace(n, index=n.index.substitute(env))
        if isinstance(n, Op):
            return replace(n, args=tuple(go(a) for a in n.args))
        if isinstance(n, Reduce):
            return replace(n, vars=tuple(names.get(v, v) for v in n.vars), body=go(n.body))
        return n
    return go(node)


def compose(body: Any) -> Group:
    """Lower a body graph (inputs, nodes, outputs) to one tree per output."""
    composer = _Composer(body)
    for node in body.nodes:
        composer.add_node(node)
    outputs = []
    for v in body.outputs:
        key = composer.key(v)
        t = v.type
        if t is None or t.shape is None or t.dtype.numpy not in SUPPORTED:
            raise CodegenUnsupported(f"output %{v.name} has type {t}, which has no code generation")
        index = [Lin.var(out_var(i)) for i in range(len(t.shape))]
        tree = convert(composer.read(key, index, where=f"output %{v.name}"), t.dtype.numpy)
        outputs.append(Output(tree, tuple(t.shape), t.dtype.numpy))
    return Group(composer.sources + composer.const_sources, outputs, composer.constants,
                 composer.broadcasts)


__all__ = ["Definition", "Group", "Output", "Source", "compose", "out_var", "rename"]
