"""Recurrent layers: ``RNN``, ``GRU`` and ``LSTM``, as ONNX defines them.

Each runs forward, reverse or bidirectional over a sequence, with optional biases, ragged
``sequence_lens``, initial states, LSTM peepholes ``P``, ``layout`` 0 (``X: [seq, batch,
input]``) or 1 (``[batch, seq, input]``), per-gate ``activations`` with their
``activation_alpha`` / ``activation_beta``, ``clip`` on gate pre-activations, LSTM's
``input_forget`` and GRU's ``linear_before_reset``. Outputs: ``Y`` (every step's hidden state;
zero past a sequence's length), ``Y_h`` (the last valid step's hidden state; for the reverse
direction, the state after step 0) and, for LSTM, ``Y_c`` (the same for the cell state). A
sequence of length 0 gives zero ``Y_h`` and ``Y_c``, not its initial state, as ONNX Runtime
does (ONNX's spec does not say).

A recurrence is not a comprehension, so each op is opaque, with a numpy reference: a loop
over time steps, vectorized over batch and hidden units, with the input projection of all
steps done in one matmul. An activation that takes ``alpha`` or ``beta`` consumes the next
value of those lists in the order the activations are listed (f, g, h for the forward
direction, then the reverse one); where the lists run out it takes ONNX Runtime's defaults
(LeakyRelu 0.01, HardSigmoid 0.2 / 0.5, Elu 1.0, otherwise 0).

Example:
    >>> from metadef.testing.onnx_cases import infer_text
    >>> infer_text("LSTM", ["f32[seq,batch,16]", "f32[2,128,16]", "f32[2,128,32]"],
    ...            {"direction": "bidirectional"})
    ['f32[seq,2,batch,32]', 'f32[2,batch,32]', 'f32[2,batch,32]']
    >>> infer_text("GRU", ["f32[batch,seq,8]", "f32[1,48,8]", "f32[1,48,16]"], {"layout": 1})
    ['f32[batch,seq,1,16]', 'f32[batch,1,16]']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from metadef.ops.infer import InferContext
from metadef.ops.interface import float_, floats, int_, string, strings
from metadef.ops.metaop import MetaOp, metaop
from metadef.ops.strategy import Role
from metadef.shape import Decision, Dim, equal, format_shape, mul

Array = np.ndarray
ActivationFn = Callable[[Array, float, float], Array]

# --- activations ------------------------------------------------------------------------


def _sigmoid(x: Array, alpha: float, beta: float) -> Array:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # 1 / (1 + e^-x) without overflow


# name (lower case) -> (function, takes alpha, takes beta, default alpha, default beta)
ACTIVATIONS: dict[str, tuple[ActivationFn, bool, bool, float, float]] = {
    "relu": (lambda x, a, b: np.maximum(x, 0), False, False, 0.0, 0.0),
    "tanh": (lambda x, a, b: np.tanh(x), False, False, 0.0, 0.0),
    "sigmoid": (_sigmoid, False, False, 0.0, 0.0),
    "affine": (lambda x, a, b: a * x + b, True, True, 0.0, 0.0),
    "leakyrelu": (lambda x, a, b: np.where(x >= 0, x, a * x), True, False, 0.01, 0.0),
    "thresholdedrelu": (lambda x, a, b: np.where(x >= a, x, 0), True, False, 0.0, 0.0),
    "scaledtanh": (lambda x, a, b: a * np.tanh(b * x), True, True, 0.0, 0.0),
    "hardsigmoid": (lambda x, a, b: np.clip(a * x + b, 0, 1), True, True, 0.2, 0.5),
    "elu": (lambda x, a, b: np.where(x >= 0, x, a * np.expm1(np.minimum(x, 0))), True, False, 1.0, 0.0),
    "softsign": (lambda x, a, b: x / (1 + np.abs(x)), False, False, 0.0, 0.0),
    "softplus": (lambda x, a, b: np.logaddexp(0, x), False, False, 0.0, 0.0),
}
"""The activation functions ONNX's recurrent ops name, by lower-case name."""


@dataclass(frozen=True)
class Activation:
    """One resolved activation: its function with its alpha and beta."""

    name: str
    fn: ActivationFn
    alpha: float = 0.0
    beta: float = 0.0

    def __call__(self, x: Array) -> Array:
        return self.fn(x, self.alpha, self.beta)


def activation_names(attrs: Mapping[str, Any], defaults: Sequence[str], directions: int) -> list[str]:
    """The node's activation names, one per gate function and direction: the attribute, or the
    op's defaults; one direction's list given to a bidirectional node serves both.

    Raises ValueError with the constraint when the count or a name is wrong."""
    names = list(attrs.get("activations") or defaults * directions)
    if len(names) == len(defaults) and directions == 2:
        names = names * 2
    if len(names) != len(defaults) * directions:
        raise ValueError(f"activations lists {len(names)} functions but this node takes "
                         f"{len(defaults)} per direction ({', '.join(defaults)}) for {directions} "
                         f"direction(s)")
    for n in names:
        if n.lower() not in ACTIVATIONS:
            raise ValueError(f"unknown activation {n!r}; ONNX names: Relu, Tanh, Sigmoid, Affine, "
                             "LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, "
                             "Softplus")
    return names


def resolve_activations(names: Sequence[str], alphas: Sequence[float] | None,
                        betas: Sequence[float] | None) -> list[Activation]:
    """Bind each activation to the next unused alpha and beta it takes (see the module doc).

    >>> [(a.name, a.alpha, a.beta) for a in resolve_activations(["LeakyRelu", "Tanh", "HardSigmoid"],
    ...                                                         [0.1], [0.3])]
    [('leakyrelu', 0.1, 0.0), ('tanh', 0.0, 0.0), ('hardsigmoid', 0.2, 0.3)]
    """
    alpha_left, beta_left = list(alphas or ()), list(betas or ())
    out = []
    for n in names:
        fn, takes_alpha, takes_beta, alpha, beta = ACTIVATIONS[n.lower()]
        if takes_alpha and alpha_left:
            alpha = alpha_left.pop(0)
        if takes_beta and beta_left:
            beta = beta_left.pop(0)
        out.append(Activation(n.lower(), fn, alpha, beta))
    return out


# --- the cells: one time step each --------------------------------------------------------


@dataclass(frozen=True)
class Weights:
    """One direction's recurrence weights and the node's cell options."""

    r: Array                  # [gates * hidden, hidden]
    rb: Array                 # [gates * hidden] (the recurrence bias; W's bias is in the input)
    p: Array | None           # LSTM peepholes [3 * hidden] (i, o, f) or None
    acts: Sequence[Activation]
    clip: float | None
    option: bool              # LSTM input_forget, GRU linear_before_reset


def _clip(x: Array, bound: float | None) -> Array:
    return x if bound is None else np.clip(x, -bound, bound)


def rnn_step(xw: Array, h: Array, c: Array | None, w: Weights) -> tuple[Array, Array | None]:
    """``Ht = f(Xt*Wi^T + Ht-1*Ri^T + Wbi + Rbi)``."""
    return w.acts[0](_clip(xw + h @ w.r.T + w.rb, w.clip)), None


def gru_step(xw: Array, h: Array, c: Array | None, w: Weights) -> tuple[Array, Array | None]:
    """One GRU step, gates z, r, h; ``w.option`` is ``linear_before_reset``."""
    f, g = w.acts
    n = h.shape[-1]
    zr = xw[:, :2 * n] + h @ w.r[:2 * n].T + w.rb[:2 * n]
    z, r = f(_clip(zr[:, :n], w.clip)), f(_clip(zr[:, n:], w.clip))
    rh, rbh = w.r[2 * n:], w.rb[2 * n:]
    if w.option:
        candidate = xw[:, 2 * n:] + r * (h @ rh.T + rbh)
    else:
        candidate = xw[:, 2 * n:] + (r * h) @ rh.T + rbh
    return (1 - z) * g(_clip(candidate, w.clip)) + z * h, None


def lstm_step(xw: Array, h: Array, c: Array | None, w: Weights) -> tuple[Array, Array | None]:
    """One LSTM step, gates i, o, f, c; ``w.option`` is ``input_forget`` (f = 1 - i)."""
    f, g, act_h = w.acts
    n = h.shape[-1]
    assert c is not None
    gates = xw + h @ w.r.T + w.rb
    gi, go, gf, gc = (gates[:, k * n:(k + 1) * n] for k in range(4))
    if w.p is not None:
        gi, gf = gi + w.p[:n] * c, gf + w.p[2 * n:] * c
    i = f(_clip(gi, w.clip))
    forget = 1 - i if w.option else f(_clip(gf, w.clip))
    cell = forget * c + i * g(_clip(gc, w.clip))
    if w.p is not None:
        go = go + w.p[n:2 * n] * cell
    return f(_clip(go, w.clip)) * act_h(cell), cell


Step = Callable[[Array, Array, Array | None, Weights], tuple[Array, Array | None]]


@dataclass(frozen=True)
class Cell:
    """What distinguishes RNN, GRU and LSTM for the shared rule and reference."""

    gates: int
    activations: tuple[str, ...]
    step: Step
    states: int               # outputs beside Y: Y_h, and Y_c for LSTM
    option: str | None = None


RNN_CELL = Cell(1, ("Tanh",), rnn_step, 1)
GRU_CELL = Cell(3, ("Sigmoid", "Tanh"), gru_step, 1, "linear_before_reset")
LSTM_CELL = Cell(4, ("Sigmoid", "Tanh", "Tanh"), lstm_step, 2, "input_forget")

# --- the reference ----------------------------------------------------------------------


def _directions(direction: str) -> int:
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ValueError(f"direction {direction!r} must be forward, reverse or bidirectional")
    return 2 if direction == "bidirectional" else 1


def recurrent_reference(cell: Cell, inputs: Sequence[Array | None],
                        attrs: Mapping[str, Any]) -> tuple[Array, ...]:
    """Run a recurrent op on arrays: ``(Y, Y_h)``, or ``(Y, Y_h, Y_c)`` for LSTM."""
    def opt(i: int) -> Array | None:
        return inputs[i] if len(inputs) > i else None

    x, w, r, b, lens = inputs[0], inputs[1], inputs[2], opt(3), opt(4)
    initial = [opt(5), opt(6)][:cell.states]
    batch_first = attrs.get("layout", 0) == 1
    if batch_first:
        x = x.swapaxes(0, 1)
        initial = [None if s is None else s.swapaxes(0, 1) for s in initial]
    work = np.promote_types(x.dtype, np.float32)
    x, w, r = x.astype(work), w.astype(work), r.astype(work)
    steps, batch, _ = x.shape
    dirs, hidden = w.shape[0], r.shape[-1]
    size = cell.gates * hidden
    b = np.zeros((dirs, 2 * size), work) if b is None else b.astype(work)
    lens = np.full(batch, steps) if lens is None else lens.astype(np.int64)
    names = activation_names(attrs, cell.activations, dirs)
    acts = resolve_activations(names, attrs.get("activation_alpha"), attrs.get("activation_beta"))
    per_dir = len(cell.activations)
    p = opt(7) if cell.states == 2 else None
    y = np.zeros((steps, dirs, batch, hidden), work)
    finals = np.zeros((cell.states, dirs, batch, hidden), work)
    for d in range(dirs):
        weights = Weights(r[d], b[d, size:], None if p is None else p[d].astype(work),
                          acts[d * per_dir:(d + 1) * per_dir], attrs.get("clip"),
                          bool(attrs.get(cell.option, 0)) if cell.option else False)
        xw = x @ w[d].T + b[d, :size]
        state = [np.zeros((batch, hidden), work) if s is None else s[d].astype(work) for s in initial]
        h, c = state[0], state[1] if cell.states == 2 else None
        backward = attrs.get("direction", "forward") == "reverse" or d == 1
        for t in (range(steps - 1, -1, -1) if backward else range(steps)):
            live = (t < lens)[:, None]
            h_new, c_new = cell.step(xw[t], h, c, weights)
            h = np.where(live, h_new, h)
            if c is not None and c_new is not None:
                c = np.where(live, c_new, c)
            y[t, d] = np.where(live, h_new, 0)
        ran = (lens > 0)[:, None]  # ONNX Runtime: a sequence of length 0 ends in zero states
        finals[0, d] = np.where(ran, h, 0)
        if c is not None:
            finals[-1, d] = np.where(ran, c, 0)
    if batch_first:
        y, finals = y.transpose(2, 0, 1, 3), finals.swapaxes(1, 2)
    return (y.astype(inputs[0].dtype), *(s.astype(inputs[0].dtype) for s in finals))


# --- the shape rule ---------------------------------------------------------------------


def _expect(ctx: InferContext, i: int, name: str, want: Sequence[Dim]) -> None:
    """Input ``i`` (when given) must have shape ``want``: fail when a dim surely differs."""
    got = ctx.shape(i) if ctx.has(i) else None
    if got is None:
        return
    if len(got) != len(want) or any(equal(g, e) is Decision.FALSE for g, e in zip(got, want)):
        ctx.fail(f"{name} has shape {format_shape(got)} but {format_shape(tuple(want))} is expected",
                 hint="W: [directions, gates*hidden, input], R: [directions, gates*hidden, hidden], "
                      "B: [directions, 2*gates*hidden]")


def recurrent_rule(cell: Cell, ctx: InferContext) -> list[Any]:
    """Output shapes of RNN, GRU or LSTM from X, W and R (and checks of the other inputs)."""
    try:
        dirs = _directions(ctx.attrs["direction"])
        activation_names(ctx.attrs, cell.activations, dirs)
    except ValueError as e:
        ctx.fail(str(e))
    if ctx.attrs["layout"] not in (0, 1):
        ctx.fail(f"layout {ctx.attrs['layout']} must be 0 ([seq, batch, input]) or 1 ([batch, seq, input])")
    batch_first = ctx.attrs["layout"] == 1
    x, r = ctx.shape(0), ctx.shape(2)
    hidden: Dim | None = ctx.attrs.get("hidden_size")
    if hidden is None and r is not None and len(r) == 3:
        hidden = r[2]
    if x is None or hidden is None:
        return [None] * (1 + cell.states)
    if len(x) != 3:
        ctx.fail(f"X has rank {len(x)}; it must be 3-D: "
                 f"{'[batch, seq, input]' if batch_first else '[seq, batch, input]'}")
    steps, batch = (x[1], x[0]) if batch_first else (x[0], x[1])
    size = mul(cell.gates, hidden)
    _expect(ctx, 1, "W", (dirs, size, x[2]))
    _expect(ctx, 2, "R", (dirs, size, hidden))
    _expect(ctx, 3, "B", (dirs, mul(2, size)))
    _expect(ctx, 4, "sequence_lens", (batch,))
    state = (batch, dirs, hidden) if batch_first else (dirs, batch, hidden)
    for i in range(5, 5 + cell.states):
        _expect(ctx, i, "initial_h" if i == 5 else "initial_c", state)
    if cell.states == 2:
        _expect(ctx, 7, "P", (dirs, mul(3, hidden)))
    y = (batch, steps, dirs, hidden) if batch_first else (steps, dirs, batch, hidden)
    return [y, *[state] * cell.states]


def _drop_output_sequence(opset: int, attrs: dict, n_inputs: int) -> tuple[dict, dict]:
    """Opset 1's ``output_sequence`` only said whether Y is wanted; the outputs say that now."""
    attrs = dict(attrs)
    attrs.pop("output_sequence", None)
    return attrs, {}


def _declare(name: str, cell: Cell, since: tuple[int, ...], doc: str) -> MetaOp:
    extra_in = ("initial_c?", "P?") if cell.states == 2 else ()
    attrs = {"activation_alpha": floats(), "activation_beta": floats(), "activations": strings(),
             "clip": float_(), "direction": string("forward"), "hidden_size": int_(),
             "layout": int_(0)}
    if cell.option:
        attrs[cell.option] = int_(0)

    def rule(ctx: InferContext) -> list[Any]:
        return recurrent_rule(cell, ctx)

    def reference(inputs: list[Array | None], attrs: Mapping[str, Any]) -> tuple[Array, ...]:
        return recurrent_reference(cell, inputs, attrs)

    return metaop(
        name, inputs=("X", "W", "R", "B?", "sequence_lens?: T1", "initial_h?", *extra_in),
        outputs=("Y?", "Y_h?", *(("Y_c?",) if cell.states == 2 else ())),
        attrs=attrs, types="T in {float16, bfloat16, float32, float64}; T1 in {int32}",
        rule=rule, reference=reference, role=Role.OPAQUE, parallel=("batch",),
        since=since, adapt=_drop_output_sequence, doc=doc,
    )


RNN = _declare("RNN", RNN_CELL, (1, 7, 14, 22), "A one-layer simple RNN: Ht = f(Xt*W^T + Ht-1*R^T + Wb + Rb).")
GRU = _declare("GRU", GRU_CELL, (1, 3, 7, 14, 22), "A one-layer GRU (gates z, r, h).")
LSTM = _declare("LSTM", LSTM_CELL, (1, 7, 14, 22), "A one-layer LSTM (gates i, o, f, c; peepholes i, o, f).")

__all__ = ["ACTIVATIONS", "GRU", "LSTM", "RNN", "Activation", "Cell", "activation_names",
           "gru_step", "lstm_step", "recurrent_reference", "recurrent_rule", "resolve_activations",
           "rnn_step"]
