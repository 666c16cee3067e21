"""``Gradient`` (domain ``ai.onnx.preview.training``): reverse-mode differentiation at import time.

A ``Gradient`` node names a forward computation by its tensors: ``xs`` (differentiated) and
``zs`` (not differentiated) are its independent inputs, ``y`` its result; the node's inputs are
the values of ``xs`` then ``zs`` to differentiate at, and its i-th output is ``dy/dxs[i]``. The
importer never makes a ``Gradient`` node. It differentiates symbolically instead and emits the
gradient as ordinary nodes (JAX's transpose rules in miniature):

1. the forward nodes are those between ``xs``/``zs`` and ``y`` (walking back from ``y``; values
   they read that are neither, such as weights, are read as they are);
2. when the node's inputs are not the very values ``xs``/``zs`` name, the forward nodes are
   emitted again on the given inputs;
3. a cotangent of ones shaped like ``y`` (so a ``y`` with many elements is differentiated as its
   sum) flows back through the nodes that depend on ``xs``, in reverse order, each op's rule
   of :data:`vjp_rules` giving its inputs' cotangents; cotangents of a value read twice add up;
   broadcasting is undone by summing back to the input's shape;
4. an ``x`` that ``y`` does not depend on gets zeros.

An op on the differentiated path without a rule fails with ``UnsupportedOpError`` naming the op
and the ops that have one.

Example:
    >>> import numpy as np
    >>> from onnx import helper, TensorProto as T
    >>> import metadef as md
    >>> g = helper.make_graph(
    ...     [helper.make_node("Mul", ["a", "a"], ["y"]),
    ...      helper.make_node("Gradient", ["a"], ["dy_da"], domain=DOMAIN, xs=["a"], y="y")], "g",
    ...     [helper.make_tensor_value_info("a", T.FLOAT, [2])],
    ...     [helper.make_tensor_value_info("dy_da", T.FLOAT, [2])])
    >>> model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18),
    ...                                              helper.make_opsetid(DOMAIN, 1)])
    >>> md.compile(md.import_onnx(model)).run({"a": np.array([1.0, 3.0], np.float32)})["dy_da"]
    array([2., 6.], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from metadef.core.errors import FormatError, UnsupportedOpError
from metadef.ir import GraphBuilder, Node, Value

DOMAIN = "ai.onnx.preview.training"


@dataclass
class Differentiation:
    """One ``Gradient`` node being expanded: the builder the gradient goes into, and helpers
    that emit one node each (the rules of :data:`vjp_rules` speak through them).

    Example:
        >>> from metadef.shape import parse_type
        >>> b = GraphBuilder("g")
        >>> g, bias = b.input("g", parse_type("f32[n,4,3]")), b.input("bias", parse_type("f32[4,1]"))
        >>> summed = Differentiation(b, "grad", "node grad").unbroadcast(g, bias)
        >>> [n.op for n in b.nodes], str(summed.type)
        (['ReduceSum', 'Reshape'], 'f32[4,1]')
    """

    b: GraphBuilder
    name: str
    where: str
    emitted: int = 0

    def op(self, op: str, *inputs: Value | None, **attrs: Any) -> Value:
        """Emit one single-output node; its output."""
        self.emitted += 1
        return self.b.node(op, list(inputs), attrs, name=f"{self.name}/{op}_{self.emitted}")[0]

    def const(self, data: Any, like: Value | None = None) -> Value:
        """A constant (in ``like``'s dtype when given, else int64)."""
        dtype = np.int64 if like is None else like.type.dtype.numpy
        return self.b.const(f"{self.name}/const", np.asarray(data, dtype))

    def rank(self, v: Value, what: str) -> int:
        if v.type is None or v.type.shape is None:
            raise UnsupportedOpError(f"{self.where}: the rank of {what} %{v.name} is unknown; "
                                     "differentiating through it needs it (declare the input shapes)")
        return len(v.type.shape)

    def shape_of(self, v: Value) -> Value:
        """``v``'s shape: a constant when it is static, else a ``Shape`` node."""
        if v.type is not None and v.type.is_static:
            return self.const(list(v.type.shape))
        return self.op("Shape", v)

    def filled(self, like: Value, fill: float) -> Value:
        """A tensor shaped like ``like``, every element ``fill``."""
        if like.type is not None and like.type.is_static:
            return self.b.const(f"{self.name}/filled", np.full(like.type.shape, fill, like.type.dtype.numpy))
        value = np.full(1, fill, like.type.dtype.numpy)
        return self.op("ConstantOfShape", self.op("Shape", like), value=value)

    def unbroadcast(self, g: Value, like: Value) -> Value:
        """``g`` summed over the axes broadcasting added to ``like`` (back to its shape)."""
        g_rank, rank = self.rank(g, "a cotangent"), self.rank(like, "an input")
        lead = g_rank - rank
        axes = list(range(lead))
        for i, dim in enumerate(like.type.shape):
            other = g.type.shape[lead + i]
            if str(dim) == str(other):
                continue
            if dim != 1:  # symbolic dims that may or may not broadcast: decide at run time
                return self._unbroadcast_at_run_time(g, like, lead)
            axes.append(lead + i)
        if not axes:
            return g
        summed = self.op("ReduceSum", g, self.const(axes), keepdims=1)
        return summed if lead == 0 else self.op("Reshape", summed, self.shape_of(like))

    def _unbroadcast_at_run_time(self, g: Value, like: Value, lead: int) -> Value:
        shape = self.op("Shape", like)
        padded = shape if lead == 0 else self.op("Concat", self.const(np.ones(lead)), shape, axis=0)
        axes = self.op("Reshape", self.op("NonZero", self.op("Equal", padded, self.const(1))), self.const([-1]))
        summed = self.op("ReduceSum", g, axes, keepdims=1, noop_with_empty_axes=1)
        return self.op("Reshape", summed, shape)


Cotangents = list[Value | None]
Rule = Callable[[Differentiation, Node, Cotangents], Cotangents]
"""A vector-Jacobian product: the node and its outputs' cotangents -> its inputs' cotangents
(None for an input that is not differentiated, such as reduction axes)."""


def _add(d: Differentiation, node: Node, g: Cotangents) -> Cotangents:
    a, b = node.inputs
    return [d.unbroadcast(g[0], a), d.unbroadcast(g[0], b)]


def _sub(d: Differentiation, node: Node, g: Cotangents) -> Cotangents:
    a, b = node.inputs
    return [d.unbroadcast(g[0], a), d.unbroadcast(d.op("Neg", g[0]), b)]


def _mul(d: Differentiation, node: Node, g: Cotangents) -> Cotangents:
    a, b = node.inputs
    return [d.unbroadcast(d.op("Mul", g[0], b), a), d.unbroadcast(d.op("Mul", g[0], a), b)]


def _div(d: Differentiation, node: Node, g: Cotangents) -> Cotangents:
    a, b = node.inputs
    y = node.outputs[0]  # d(a/b)/db = -a/b**2 = -y/b
    return [d.unbroadcast(d.op("Div", g[0], b), a),
            d.unbroadcast(d.op("Neg", d.op("Div", d.op("Mul", g[0], y), b)), b)]


def _swap_last(d: Differentiation, v: Value, rank: int) -> Value:
    return d.op("Transpose", v, perm=[*range(rank - 2), rank - 1, rank - 2])


def _matmul(d: Differentiation, node: Node, g: Cotangents) -> Cotangents:
    """numpy's matmul rules: a 1-D operand is a row (A) or a column (B) that the result drops."""
    a, b = node.inputs
    ra, rb = d.rank(a, "MatMul's A"), d.rank(b, "MatMul's B")
    if ra == 1 and rb == 1:
        return [d.op("Mul", g[0], b), d.op("Mul", g[0], a)]
    a2 = a if ra > 1 else d.op("Unsqueeze", a, d.const([0]))
    b2 = b if rb > 1 else d.op("Unsqueeze", b, d.const([1]))
    gy, rg = g[0], d.rank(g[0], "MatMul's cotangent")
    if ra == 1:
        gy = d.op("Unsqueeze", gy, d.const([rg - 1]))
    elif rb == 1:
        gy = d.op("Unsqueeze", gy, d.const([rg]))
    ga = d.unbroadcast(d.op("MatMul", gy, _swap_last(d, b2, max(rb, 2))), a2)
    gb = d.unbroadcast(d.op("MatMul", _swap_last(d, a2, max(ra, 2)), gy), b2)
    return [ga if ra > 1 else d.op("Squeeze", ga, d.const([0])),
            gb if rb > 1 else d.op("Squeeze", gb, d.const([1]))]


def _relu(d: Differentiation, node: Node, g: Cotangents) -> Cotangents:
    x = node.inputs[0]
    return [d.op("Where", d.op("Greater", x, d.const(0, x)), g[0], d.const(0, x))]


def _sigmoid(d: Differentiation, node: Node, g: Cotangents) -> Cotangents:
    y = node.outputs[0]
    return [d.op("Mul", g[0], d.op("Mul", y, d.op("Sub", d.const(1, y), y)))]


def _tanh(d: Differentiation, node: Node, g: Cotangents) -> Cotangents:
    y = node.outputs[0]
    return [d.op("Mul", g[0], d.op("Sub", d.const(1, y), d.op("Mul", y, y)))]


def _exp(d: Differentiation, node: Node, g: Cotangents) -> Cotangents:
    return [d.op("Mul", g[0], node.outputs[0])]


def _log(d: Differentiation, node: Node, g: Cotangents) -> Cotangents:
    return [d.op("Div", g[0], node.inputs[0])]


def _neg(d: Differentiation, node: Node, g: Cotangents) -> Cotangents:
    return [d.op("Neg", g[0])]


def _identity(d: Differentiation, node: Node, g: Cotangents) -> Cotangents:
    return [g[0]]


def _reduced_axes(d: Differentiation, node: Node, rank: int) -> list[int] | None:
    """The axes a ReduceSum/ReduceMean node reduces (sorted, non-negative); None: none (a no-op)."""
    axes_value = node.inputs[1] if len(node.inputs) > 1 else None
    if axes_value is not None and axes_value.const is None:
        raise UnsupportedOpError(f"{d.where}: {node.op} node {node.name} reduces axes known only at run "
                                 "time; differentiating through it needs constant axes")
    axes = [] if axes_value is None else [int(a) % rank for a in np.asarray(axes_value.const).reshape(-1)]
    if not axes:
        return None if node.attrs.get("noop_with_empty_axes") else list(range(rank))
    return sorted(set(axes))


def _reduce_sum(d: Differentiation, node: Node, g: Cotangents) -> Cotangents:
    x = node.inputs[0]
    axes = _reduced_axes(d, node, d.rank(x, f"{node.op}'s input"))
    if axes is None:
        return [g[0], None]
    gy = g[0]
    if not node.attrs.get("keepdims", 1) and axes:
        gy = d.op("Unsqueeze", gy, d.const(axes))
    return [d.op("Expand", gy, d.shape_of(x)), None]


def _reduce_mean(d: Differentiation, node: Node, g: Cotangents) -> Cotangents:
    x, y = node.inputs[0], node.outputs[0]
    spread = _reduce_sum(d, node, g)[0]
    count = d.op("Div", d.op("Cast", d.op("Size", x), to=x.type.dtype.onnx),
                 d.op("Cast", d.op("Size", y), to=x.type.dtype.onnx))
    return [d.op("Div", spread, count), None]


vjp_rules: dict[str, Rule] = {
    "Add": _add, "Sub": _sub, "Mul": _mul, "Div": _div, "Neg": _neg, "MatMul": _matmul,
    "Relu": _relu, "Sigmoid": _sigmoid, "Tanh": _tanh, "Exp": _exp, "Log": _log,
    "Identity": _identity, "ReduceSum": _reduce_sum, "ReduceMean": _reduce_mean,
}
"""Per op (domain ``ai.onnx``): its vector-Jacobian product. Adding an op to what ``Gradient``
differentiates is one entry here."""


# ------------------------------------------------------------------------------ the node


def _tensor(values: Mapping[str, Any], name: str, what: str, where: str) -> Value:
    v = values.get(name)
    if v is None:
        raise FormatError(f"{where}: {what} {name!r} is not defined before the Gradient node")
    if not isinstance(v, Value):
        raise UnsupportedOpError(f"{where}: {what} {name!r} is a sequence or an optional; Gradient "
                                 "differentiates tensors")
    return v


def _forward_nodes(b: GraphBuilder, y: Value, leaves: set[int]) -> list[Node]:
    """The nodes ``y`` is computed by, back to ``leaves`` (value ids), in graph order."""
    wanted: set[int] = set()
    stack = [y]
    while stack:
        v = stack.pop()
        if id(v) in leaves or v.producer is None or id(v.producer) in wanted:
            continue
        wanted.add(id(v.producer))
        stack += [i for i in v.producer.inputs if i is not None]
    return [n for n in b.nodes if id(n) in wanted]


def _replay(d: Differentiation, nodes: list[Node], given: dict[int, Value]) -> list[Node]:
    """The forward nodes emitted again with their inputs replaced as ``given`` maps them."""
    copies = []
    for n in nodes:
        inputs = [None if v is None else given.get(id(v), v) for v in n.inputs]
        outs = d.b.node(n.op, inputs, dict(n.attrs), name=f"{d.name}/forward/{n.name}", domain=n.domain,
                        outputs=[f"{d.name}/{o.name}" for o in n.outputs])
        given.update({id(o): new for o, new in zip(n.outputs, outs)})
        copies.append(outs[0].producer)
    return copies


def differentiate(d: Differentiation, nodes: Sequence[Node], y: Value, xs: Sequence[Value]) -> list[Value]:
    """``d(sum y)/dx`` for each of ``xs``, by reverse mode over ``nodes`` (``y``'s forward
    nodes, in graph order), emitted into ``d.b``.

    Example:
        >>> from metadef.shape import parse_type
        >>> b = GraphBuilder("g")
        >>> x = b.input("x", parse_type("f32[3]"))
        >>> y, = b.node("Tanh", [x])
        >>> dx, = differentiate(Differentiation(b, "grad", "node grad"), b.nodes, y, [x])
        >>> [n.op for n in b.nodes]
        ['Tanh', 'Mul', 'Sub', 'Mul']
    """
    active = {id(x) for x in xs}
    on_path = []
    for n in nodes:
        if any(v is not None and id(v) in active for v in n.inputs):
            on_path.append(n)
            active.update(id(o) for o in n.outputs)
    cotangent: dict[int, Value] = {id(y): d.filled(y, 1.0)} if id(y) in active else {}
    for n in reversed(on_path):
        outs = [cotangent.get(id(o)) for o in n.outputs]
        if all(g is None for g in outs):
            continue
        rule = vjp_rules.get(n.op) if n.domain in ("", "ai.onnx") else None
        if rule is None:
            raise UnsupportedOpError(
                f"{d.where}: cannot differentiate through op {n.op!r} (node {n.name}); Gradient "
                f"differentiates {', '.join(sorted(vjp_rules))}")
        for v, g in zip(n.inputs, rule(d, n, outs)):
            if v is None or g is None or id(v) not in active:
                continue
            seen = cotangent.get(id(v))
            cotangent[id(v)] = g if seen is None else d.op("Add", seen, g)
    return [cotangent[id(x)] if id(x) in cotangent else d.filled(x, 0.0) for x in xs]


def import_gradient(b: GraphBuilder, inputs: Sequence[Any], attrs: Mapping[str, Any],
                    values: Mapping[str, Any], name: str, where: str) -> list[Value]:
    """The outputs of one ``Gradient`` node (see the module doc), emitted into ``b``:
    ``inputs`` are the node's input values, ``values`` what each ONNX name stands for.

    Example:
        >>> from metadef.shape import parse_type
        >>> b = GraphBuilder("g")
        >>> a = b.input("a", parse_type("f32[3]"))
        >>> y, = b.node("Exp", [a])
        >>> grad, = import_gradient(b, [a], {"xs": ("a",), "y": "y"}, {"a": a, "y": y}, "grad", "node grad")
        >>> grad.producer.op, grad.producer.inputs[1] is y
        ('Mul', True)
    """
    xs, zs = list(attrs.get("xs") or ()), list(attrs.get("zs") or ())
    if "y" not in attrs or not xs:
        raise FormatError(f"{where}: Gradient needs the attributes xs (the differentiated inputs) and y")
    if len(inputs) != len(xs) + len(zs):
        raise FormatError(f"{where}: Gradient takes one input per name of xs and zs ({len(xs) + len(zs)}), "
                          f"got {len(inputs)}")
    named = [_tensor(values, n, "xs" if i < len(xs) else "zs", where) for i, n in enumerate(xs + zs)]
    y = _tensor(values, attrs["y"], "y", where)
    fed = [_tensor({"input": v}, "input", f"input {i}", where) for i, v in enumerate(inputs)]
    d = Differentiation(b, name, where)
    nodes = _forward_nodes(b, y, {id(v) for v in named})
    if any(v is not f for v, f in zip(named, fed)):  # differentiate at other values: replay the forward
        given = {id(v): f for v, f in zip(named, fed)}
        nodes = _replay(d, nodes, given)
        y = given.get(id(y), y)
    return differentiate(d, nodes, y, fed[:len(xs)])


gradient_rules: dict[tuple[str, str], Callable[..., list[Value]]] = {(DOMAIN, "Gradient"): import_gradient}
"""Ops the importer expands into ordinary nodes, by (domain, op): the same signature as
:func:`import_gradient`."""

__all__ = ["DOMAIN", "Differentiation", "differentiate", "gradient_rules", "import_gradient", "vjp_rules"]
