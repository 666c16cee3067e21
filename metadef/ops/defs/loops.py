"""Control flow: ``Loop`` and ``Scan``, with their bodies as graph attributes.

They follow ``If``'s convention for outer values (see :mod:`metadef.ops.defs.control`): the
values a body reads from enclosing scopes are passed explicitly, as the node's trailing inputs
and the body's trailing inputs. Unlike ``If``, both ops also take a variadic number of their
own inputs (loop-carried values, scan inputs), and an op has only one trailing variadic
parameter, so **the own values and the captured values share one variadic tail** ``inputs*``
and the integer attribute :data:`NUM_CAPTURED` (``num_captured``, default 0) says how many of
its last elements are captured. It is metadef's own attribute: the ONNX importer sets it to the
number of values it captured and the exporter drops it (:func:`node_captured_start` gives a
node's first captured input for either convention).

- ``Loop``: inputs ``(M?, cond?, *v_initial, *captured)``; body inputs ``(iteration_num,
  cond_in, *carried, *captured)``, body outputs ``(cond_out, *carried, *scan_outputs)``; the
  node's outputs are the final carried values, then each scan output stacked along a new first
  axis. ONNX's absent ``M``/``cond`` combinations hold (neither given: rejected as endless).
- ``Scan`` (opset 9+): inputs ``(*initial_states, *scan_inputs, *captured)`` with
  ``num_scan_inputs`` scan inputs; the body takes the states, one slice of each scan input
  (along ``scan_input_axes``, walked as ``scan_input_directions`` says), then the captured
  values, and gives the next states and one slice of each scan output (stacked along
  ``scan_output_axes``, in ``scan_output_directions`` order).
- ``Scan`` before opset 9 is batched: its adapter sets metadef's own attribute :data:`BATCHED`
  and the inputs are ``(sequence_lens?, *initial_states, *scan_inputs, *captured)``. Every state
  and scan input has the batch on axis 0, and scan inputs have the sequence on axis 1. Each
  batch element runs its own scan over its first ``sequence_lens[b]`` steps (all of them
  without ``sequence_lens``), walked as ``directions`` says; its scan outputs are padded with
  zeros to the longest sequence. The outputs are ``[batch, ...]`` states and
  ``[batch, sequence, ...]`` scan outputs.

**Shape rule.** The body is typed in the outer graph's symbols; a body input that is one symbol
binds to the value fed into it. A final carried value or state takes the body output's type
merged with the initial one (a loop may run zero times): equal dims kept, others fresh. A
``Loop`` scan output's length is ``M`` when ``M`` is a constant and there is no ``cond``, a
fresh symbol otherwise; a ``Scan`` output's length is the scan inputs' length.

**Semantics.** Opaque: the numpy reference runs the body once per iteration with
:func:`~metadef.ops.defs.fused.run_body` (duck typed: ``ops`` does not import the IR).

Example:
    >>> import numpy as np
    >>> from types import SimpleNamespace as NS
    >>> from metadef.ops import get_op, infer_types
    >>> from metadef.shape import parse_type
    >>> t = parse_type("f32[n]")
    >>> def v(name, text):
    ...     return NS(name=name, type=parse_type(text), const=None)
    >>> s, x, y = v("s", "f32[n]"), v("x", "f32[n]"), v("y", "f32[n]")
    >>> add = NS(name="add", metaop=get_op("Add"), attrs={}, inputs=(s, x), outputs=(y,))
    >>> body = NS(name="b", inputs=[s, x], outputs=[y, y], nodes=[add])  # running sum
    >>> attrs = {"body": body, "num_scan_inputs": 1}
    >>> [str(o) for o in infer_types(Scan, "/scan", [t, parse_type("f32[5,n]")], attrs)]
    ['f32[n]', 'f32[5,n]']
    >>> Scan.semantics.reference([np.zeros(2, np.float32), np.ones((3, 2), np.float32)], attrs)[1]
    array([[1., 1.],
           [2., 2.],
           [3., 3.]], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from metadef.core.dtypes import dtype as lookup_dtype
from metadef.core.errors import BackendError, MetadefError, UnsupportedOpError
from metadef.ops.defs.control import captured_start, input_bindings, merge_types, rebind
from metadef.ops.defs.fused import run_body
from metadef.ops.infer import InferContext
from metadef.ops.interface import REQUIRED, Param, graph_, int_, ints
from metadef.ops.metaop import MetaOp, metaop
from metadef.ops.strategy import Role
from metadef.shape import Dim, TensorType, bind_shape, evaluate_shape

NUM_CAPTURED = "num_captured"
"""The attribute that counts the captured values at the end of a Loop or Scan node's inputs."""
BATCHED = "batched"
"""metadef's attribute that marks a Scan node of the batched form of opsets below 9."""


def node_captured_start(op: MetaOp, attrs: Mapping[str, Any], n_inputs: int) -> int | None:
    """The index of a node's first captured input (None when its op captures nothing): from
    ``num_captured`` for ops that declare it, else from the ``captured`` parameter (``If``).

    Example:
        >>> from metadef.ops import get_op
        >>> node_captured_start(Loop, {"num_captured": 1}, 5), node_captured_start(get_op("If"), {}, 3)
        (4, 1)
    """
    if NUM_CAPTURED in op.attrs:
        return n_inputs - int(attrs.get(NUM_CAPTURED) or 0)
    return captured_start(op)


# ------------------------------------------------------------------------- shared pieces


def _split(ctx: InferContext, first: int) -> tuple[list[TensorType | None], list[TensorType | None]]:
    """The node's own variadic values (from input ``first`` on) and its captured values."""
    k = int(ctx.attrs.get(NUM_CAPTURED) or 0)
    tail = ctx.inputs[first:]
    if not 0 <= k <= len(tail):
        ctx.fail(f"{NUM_CAPTURED}={k} but the node has {len(tail)} values after its fixed inputs")
    return tail[:len(tail) - k], tail[len(tail) - k:]


def _bind_body(ctx: InferContext, body: Any, given: Sequence[TensorType | None],
               what: str) -> dict[str, Dim]:
    """Bind the body's input symbols to ``given`` (one per body input)."""
    if len(body.inputs) != len(given):
        ctx.fail(f"the body takes {len(body.inputs)} inputs but the node feeds it {len(given)} ({what})",
                 f"a body's inputs are {what}")
    bindings, problem = input_bindings(body, given)
    if problem is not None:
        ctx.fail(f"body: {problem.replace('branch', 'body')}", "the body was built for other input types")
    return bindings


def _final(ctx: InferContext, initial: Sequence[TensorType | None], body_out: Sequence[Any],
           bindings: Mapping[str, Dim]) -> list[TensorType]:
    """Final carried values: the body's output types merged with the initial types."""
    result = []
    for i, (start, out) in enumerate(zip(initial, body_out)):
        t = rebind(out.type, bindings)
        if t is None or start is None:
            result.append(t or start)
            continue
        if t.dtype is not start.dtype:
            ctx.fail(f"carried value {i} enters as {start} but the body gives {t}",
                     "a carried value keeps its dtype; insert a Cast in the body")
        result.append(merge_types(start, t, lambda: ctx.fresh("loop")))
    return result


def _stacked(t: TensorType | None, length: Dim, axis: int) -> TensorType | None:
    if t is None or t.shape is None:
        return t
    return t.with_shape([*t.shape[:axis], length, *t.shape[axis:]])


def _empty_stack(out: Any, body: Any, fed: Sequence[np.ndarray | None]) -> np.ndarray:
    """A scan output of zero iterations, shaped like the body's output type (its symbols bound
    from the values the body would have been fed); ``(0,)`` where that shape is unknown."""
    t = out.type
    symbols: dict[str, int] = {}
    shape: tuple[int, ...] = ()
    try:
        for v, a in zip(body.inputs, fed):
            if a is not None and v.type is not None and v.type.shape is not None:
                bind_shape(v.type.shape, np.shape(a), symbols)
        if t is not None and t.shape is not None:
            shape = tuple(evaluate_shape(t.shape, symbols))
    except MetadefError:
        shape = ()
    return np.zeros((0, *shape), dtype=t.dtype.numpy if t is not None else np.float32)


def _as_body_input(value: np.ndarray, inner: Any) -> np.ndarray:
    """``value`` reshaped to a body input declared with one element (``[]`` or ``[1]``)."""
    t = inner.type
    if t is not None and t.shape is not None and all(isinstance(d, int) for d in t.shape):
        return value.reshape(t.shape)
    return value


# --------------------------------------------------------------------------------- Loop


def _loop_infer(ctx: InferContext) -> list[TensorType | None]:
    body = ctx.attrs["body"]
    carried, captured = _split(ctx, 2)
    scalar_types = [body.inputs[i].type if i < len(body.inputs) else None for i in (0, 1)]  # fed as declared
    bindings = _bind_body(ctx, body, [*scalar_types, *carried, *captured],
                          "iteration_num, cond, the carried values, then the captured values")
    n = len(carried)
    if len(body.outputs) < 1 + n:
        ctx.fail(f"the body gives {len(body.outputs)} outputs but must give cond and {n} carried values")
    trip = ctx.value(0)
    length: Dim = (int(np.asarray(trip).reshape(-1)[0]) if trip is not None and not ctx.has(1)
                   and np.asarray(trip).dtype != object else ctx.fresh("trips"))
    final = _final(ctx, carried, body.outputs[1:1 + n], bindings)
    return [*final, *(_stacked(rebind(o.type, bindings), length, 0) for o in body.outputs[1 + n:])]


def _loop_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> list[np.ndarray]:
    body = attrs["body"]
    k = int(attrs.get(NUM_CAPTURED) or 0)
    tail = inputs[2:]
    carried, captured = list(tail[:len(tail) - k]), list(tail[len(tail) - k:])
    trips = None if inputs[0] is None else int(np.asarray(inputs[0]).reshape(-1)[0])
    keep = True if inputs[1] is None else bool(np.asarray(inputs[1]).reshape(-1)[0])
    if trips is None and inputs[1] is None:
        raise UnsupportedOpError("Loop without a trip count M and without cond would never end")
    n = len(carried)
    scans: list[list[np.ndarray]] = [[] for _ in body.outputs[1 + n:]]
    i = 0
    while keep and (trips is None or i < trips):
        counter = _as_body_input(np.array(i, np.int64), body.inputs[0])
        flag = _as_body_input(np.array(keep), body.inputs[1])
        outs = run_body(body, [counter, flag, *carried, *captured])
        keep = bool(np.asarray(outs[0]).reshape(-1)[0])
        carried = list(outs[1:1 + n])
        for acc, value in zip(scans, outs[1 + n:]):
            acc.append(np.asarray(value))
        i += 1
    fed = [np.array(0, np.int64), np.array(True), *carried, *captured]
    stacked = [np.stack(acc) if acc else _empty_stack(o, body, fed) for acc, o in zip(scans, body.outputs[1 + n:])]
    return [*(np.asarray(c) for c in carried), *stacked]


Loop = metaop(
    "Loop",
    inputs=("M?: I", "cond?: B", Param("inputs", optional=True, variadic=True, type_var="V", mixed=True)),
    outputs=(Param("outputs", variadic=True, type_var="V", mixed=True),),
    attrs={"body": graph_(REQUIRED), NUM_CAPTURED: int_(0)},
    types="I in {int64}; B in {bool}; V in {all, string}",
    rule=_loop_infer,
    reference=_loop_reference,
    role=Role.OPAQUE,
    reads=(0,),
    since=(1, 11, 13, 16, 19, 21),
    doc="Run body while the trip count M and cond allow, carrying values and stacking scan outputs.",
)


# --------------------------------------------------------------------------------- Scan


def _axes(ctx: InferContext | None, attrs: Mapping[str, Any], key: str, ranks: Sequence[int | None],
          default: int = 0) -> list[int]:
    """``attrs[key]`` (one per value; ``default`` each when absent), negatives made positive."""
    given = attrs.get(key)
    values = list(given) if given else [default] * len(ranks)
    if len(values) != len(ranks):
        message = f"{key} has {len(values)} entries but there are {len(ranks)} values"
        if ctx is None:
            raise ValueError(message)
        ctx.fail(message)
    out = []
    for a, r in zip(values, ranks):
        if r is not None and not -r <= a < r:
            message = f"{key} holds {a}, out of range for rank {r}"
            if ctx is None:
                raise ValueError(message)
            ctx.fail(message)
        out.append(a + r if a < 0 and r is not None else a)
    return out


def _unbatched(t: TensorType | None, axes: int, what: str, ctx: InferContext) -> TensorType | None:
    """``t`` without its first ``axes`` axes (batch, and sequence for a scan input)."""
    if t is None or t.shape is None:
        return t
    if len(t.shape) < axes:
        ctx.fail(f"{what} {t} must have at least {axes} axes (batch{', sequence' if axes > 1 else ''})")
    return t.with_shape(t.shape[axes:])


def _batched(t: TensorType | None, lead: Sequence[Dim]) -> TensorType | None:
    return t if t is None or t.shape is None else t.with_shape([*lead, *t.shape])


def _scan8_infer(ctx: InferContext) -> list[TensorType | None]:
    """The batched Scan of opsets below 9 (see the module doc)."""
    body = ctx.attrs["body"]
    own, captured = _split(ctx, 1)
    m = int(ctx.attrs["num_scan_inputs"])
    if not 1 <= m <= len(own):
        ctx.fail(f"num_scan_inputs={m} but the node has {len(own)} state and scan inputs")
    if len(ctx.attrs.get("directions") or [0] * m) != m:
        ctx.fail(f"directions has {len(ctx.attrs['directions'])} entries but there are {m} scan inputs")
    states, scanned = own[:len(own) - m], own[len(own) - m:]
    lead: list[Dim] | None = None
    for t in scanned:
        if t is not None and t.shape is not None and len(t.shape) >= 2:
            lead = lead or list(t.shape[:2])
    bindings = _bind_body(ctx, body, [*(_unbatched(t, 1, "state", ctx) for t in states),
                                      *(_unbatched(t, 2, "scan input", ctx) for t in scanned), *captured],
                          "the states, one step of each scan input, then the captured values")
    n = len(states)
    if len(body.outputs) < n:
        ctx.fail(f"the body gives {len(body.outputs)} outputs but must give {n} states first")
    if lead is None:
        lead = [ctx.fresh("batch"), ctx.fresh("scan")]
    final = _final(ctx, [_unbatched(t, 1, "state", ctx) for t in states], body.outputs[:n], bindings)
    return [*(_batched(t, lead[:1]) for t in final),
            *(_batched(rebind(o.type, bindings), lead) for o in body.outputs[n:])]


def _scan_infer(ctx: InferContext) -> list[TensorType | None]:
    if ctx.attrs.get(BATCHED):
        return _scan8_infer(ctx)
    body = ctx.attrs["body"]
    own, captured = _split(ctx, 0)
    m = int(ctx.attrs["num_scan_inputs"])
    if not 1 <= m <= len(own):
        ctx.fail(f"num_scan_inputs={m} but the node has {len(own)} state and scan inputs")
    states, scanned = own[:len(own) - m], own[len(own) - m:]
    ranks = [None if t is None or t.shape is None else len(t.shape) for t in scanned]
    axes = _axes(ctx, ctx.attrs, "scan_input_axes", ranks)
    length: Dim | None = None
    slices: list[TensorType | None] = []
    for i, (t, axis) in enumerate(zip(scanned, axes)):
        if t is None or t.shape is None:
            slices.append(t)
            continue
        dim = t.shape[axis]
        if length is not None and isinstance(dim, int) and isinstance(length, int) and dim != length:
            ctx.fail(f"scan input {i} has length {dim} along axis {axis} but an earlier one has {length}",
                     "all scan inputs must have the same number of slices")
        length = dim if length is None or not isinstance(length, int) else length
        slices.append(t.with_shape([*t.shape[:axis], *t.shape[axis + 1:]]))
    bindings = _bind_body(ctx, body, [*states, *slices, *captured],
                          "the states, one slice of each scan input, then the captured values")
    n = len(states)
    if len(body.outputs) < n:
        ctx.fail(f"the body gives {len(body.outputs)} outputs but must give {n} states first")
    outs = [rebind(o.type, bindings) for o in body.outputs[n:]]
    out_ranks = [None if t is None or t.shape is None else len(t.shape) + 1 for t in outs]
    out_axes = _axes(ctx, ctx.attrs, "scan_output_axes", out_ranks)
    length = ctx.fresh("scan") if length is None else length
    final = _final(ctx, states, body.outputs[:n], bindings)
    return [*final, *(_stacked(t, length, a) for t, a in zip(outs, out_axes))]


def _scan_steps(body: Any, states: list[np.ndarray | None], scanned: Sequence[np.ndarray],
                axes: Sequence[int], reverse: Sequence[int], length: int,
                captured: list[np.ndarray | None]) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """Run the body over the first ``length`` slices of each scan input (along its axis, from
    the end where ``reverse``): the final states and each scan output's slices, in order."""
    n = len(states)
    collected: list[list[np.ndarray]] = [[] for _ in body.outputs[n:]]
    for t in range(length):
        pieces = [np.take(x, length - 1 - t if r else t, axis=a) for x, a, r in zip(scanned, axes, reverse)]
        outs = run_body(body, [*states, *pieces, *captured])
        states = list(outs[:n])
        for acc, value in zip(collected, outs[n:]):
            acc.append(np.asarray(value))
    return [np.asarray(s) for s in states], collected


def _scan8_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """The batched Scan of opsets below 9: one scan per batch element (see the module doc)."""
    body = attrs["body"]
    k = int(attrs.get(NUM_CAPTURED) or 0)
    lens, own, captured = inputs[0], inputs[1:len(inputs) - k], list(inputs[len(inputs) - k:])
    m = int(attrs["num_scan_inputs"])
    states, scanned = list(own[:len(own) - m]), [np.asarray(x) for x in own[len(own) - m:]]
    batch, longest = scanned[0].shape[:2]
    steps = [longest] * batch if lens is None else [int(v) for v in np.asarray(lens).reshape(-1)]
    if len(steps) != batch or any(not 0 <= v <= longest for v in steps):
        raise BackendError(f"Scan: sequence_lens {steps} must give, for each of the {batch} batch "
                           f"elements, a length from 0 to the sequence axis' {longest}")
    reverse = list(attrs.get("directions") or [0] * m)
    finals, outputs = [], []
    for b, length in enumerate(steps):
        final, collected = _scan_steps(body, [np.asarray(s)[b] for s in states], [x[b] for x in scanned],
                                       [0] * m, reverse, length, captured)
        finals.append(final)
        outputs.append(collected)
    stacked = []
    for i, o in enumerate(body.outputs[len(states):]):
        pieces = [acc[i] for acc in outputs]
        example = next((p[0] for p in pieces if p), None)
        if example is None:
            fed = [*(np.asarray(s)[0] if batch else None for s in states),
                   *(x[0, 0] if batch and longest else None for x in scanned), *captured]
            example = np.zeros(_empty_stack(o, body, fed).shape[1:], o.type.dtype.numpy if o.type else np.float32)
        padded = np.zeros((batch, longest, *example.shape), example.dtype)
        for b, p in enumerate(pieces):
            if p:
                padded[b, :len(p)] = np.stack(p)
        stacked.append(padded)
    return [*(np.stack([f[j] for f in finals]) for j in range(len(states))), *stacked]


def _scan_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> list[np.ndarray]:
    if attrs.get(BATCHED):
        return _scan8_reference(inputs, attrs)
    body = attrs["body"]
    k = int(attrs.get(NUM_CAPTURED) or 0)
    own, captured = inputs[:len(inputs) - k], list(inputs[len(inputs) - k:])
    m = int(attrs["num_scan_inputs"])
    states, scanned = list(own[:len(own) - m]), [np.asarray(x) for x in own[len(own) - m:]]
    axes = _axes(None, attrs, "scan_input_axes", [x.ndim for x in scanned])
    reverse = list(attrs.get("scan_input_directions") or [0] * m)
    length = scanned[0].shape[axes[0]] if scanned else 0
    states, collected = _scan_steps(body, states, scanned, axes, reverse, length, captured)
    out_axes = _axes(None, attrs, "scan_output_axes",
                     [None if not acc else acc[0].ndim + 1 for acc in collected])
    out_reverse = list(attrs.get("scan_output_directions") or [0] * len(collected))
    stacked = []
    for acc, axis, r, o in zip(collected, out_axes, out_reverse, body.outputs[len(states):]):
        if not acc:
            slices = [np.take(x, [], axis=a).sum(axis=a) for x, a in zip(scanned, axes)]  # slice shapes
            fed = [*states, *slices, *captured]
            stacked.append(np.moveaxis(_empty_stack(o, body, fed), 0, axis))
            continue
        stacked.append(np.stack(acc[::-1] if r else acc, axis=axis))
    return [*(np.asarray(s) for s in states), *stacked]


def _scan_adapt(version: int, attrs: dict[str, Any], n_inputs: int) -> tuple[dict[str, Any], dict[int, Any]]:
    """Opsets below 9 have the batched form, with ``sequence_lens`` first: marked :data:`BATCHED`."""
    return ({**attrs, BATCHED: 1} if version < 9 else attrs), {}


Scan = metaop(
    "Scan",
    inputs=(Param("inputs", variadic=True, type_var="V", mixed=True),),
    outputs=(Param("outputs", variadic=True, type_var="V", mixed=True),),
    attrs={"body": graph_(REQUIRED), "num_scan_inputs": int_(REQUIRED),
           "scan_input_axes": ints(), "scan_input_directions": ints(),
           "scan_output_axes": ints(), "scan_output_directions": ints(), NUM_CAPTURED: int_(0),
           "directions": ints(), BATCHED: int_(0)},
    types="V in {all, string}",
    rule=_scan_infer,
    reference=_scan_reference,
    role=Role.OPAQUE,
    adapt=_scan_adapt,
    since=(8, 9, 11, 16, 19, 21),
    doc="Run body once per slice of the scan inputs, carrying states and stacking scan outputs.",
)

# ------------------------------------------------------------------ untyped body inputs


def _loop_body_inputs(attrs: Mapping[str, Any], own: Sequence[TensorType | None]) -> list[TensorType | None]:
    carried = own[2:]
    return [TensorType(lookup_dtype("int64"), ()), TensorType(lookup_dtype("bool"), ()), *carried]


def _scan_body_inputs(attrs: Mapping[str, Any], own: Sequence[TensorType | None]) -> list[TensorType | None]:
    m = int(attrs["num_scan_inputs"])
    states, scanned = list(own[:len(own) - m]), own[len(own) - m:]
    ranks = [None if t is None or t.shape is None else len(t.shape) for t in scanned]
    axes = _axes(None, attrs, "scan_input_axes", ranks)
    return [*states, *(t if t is None or t.shape is None else t.with_shape([*t.shape[:a], *t.shape[a + 1:]])
                       for t, a in zip(scanned, axes))]


body_input_rules: dict[str, Callable[[Mapping[str, Any], Sequence[TensorType | None]], list[TensorType | None]]] = {
    "Loop": _loop_body_inputs,
    "Scan": _scan_body_inputs,
}
"""Per op: the types a node feeds its body's own (non-captured) inputs, given the node's
attributes and own input types (``None`` where absent). An importer uses them for body inputs
that ONNX leaves untyped (function-expanded models do); a loop-carried value is assumed to keep
its initial type.

Example:
    >>> from metadef.shape import parse_type
    >>> attrs = {"num_scan_inputs": 1, "scan_input_axes": (1,)}
    >>> [str(t) for t in body_input_rules["Scan"](attrs, [parse_type("f32[2]"), parse_type("f32[b,7,2]")])]
    ['f32[2]', 'f32[b,2]']
"""

__all__ = ["BATCHED", "NUM_CAPTURED", "Loop", "Scan", "body_input_rules", "node_captured_start"]
