"""RNN, GRU and LSTM layers as products and cell steps in the native program.

The reference runs a recurrence from Python, one numpy product and a dozen elementwise passes a
time step (an LSTM of 32 steps over 8 x 256: 5.7x ONNX Runtime's time). :func:`recurrent_node`
takes one with the default activations and nothing the cells do not compute (``clip``, LSTM's
``input_forget``) and lays it out, once the binding's sequence length and batch
are known, as calls of the native program, per direction:

- one ``md_gemm`` for the input projection of every step, ``X W^T + Wb`` (weights packed once;
  OpenBLAS's sgemm where the weights are fed at run time);
- per time step, in the direction's order, ``md_gemm`` for ``H_{t-1} R^T + Rb`` reading the
  previous step's rows of ``Y`` in place (ragged sequences, ``sequence_lens``: a state buffer
  that a row past its end keeps), then the cell routine (``md_lstm_cell``, ...)
  (:mod:`metadef.codegen.native_recurrent`) writing the step's rows of ``Y`` (and the LSTM cell
  state, kept in a scratch buffer);
- the last states copied to ``Y_h`` (and ``Y_c``).

Both layouts (``[seq, batch, input]`` and ``[batch, seq, input]``) are read and written in
place through row strides. With two threads or more, a bidirectional layer's directions run
side by side, each as one chain of calls on its own thread (its products then unsplit). The
same calls run a step from Python (:func:`run`'s path). Any other recurrent node runs its
reference kernel, with the reason.

Example:
    >>> import numpy as np
    >>> from metadef.ir import GraphBuilder
    >>> from metadef.shape import parse_type
    >>> g = GraphBuilder("rnn")
    >>> x = g.input("x", parse_type("f32[seq,n,4]"))
    >>> w, r = g.const("w", np.ones((1, 16, 4), np.float32)), g.const("r", np.ones((1, 16, 4), np.float32))
    >>> y, = g.node("LSTM", [x, w, r], {"hidden_size": 4})
    >>> recurrent_node(y.producer).reason
    'LSTM: md_gemm products and md_lstm_cell steps (our kernels)'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from metadef.backends.x86 import contractions as blas
from metadef.backends.x86.choice import Choice, attrs_of
from metadef.backends.x86.native import (
    NULL,
    PARALLEL_ELEMENTS,
    Arg,
    Call,
    NativeStep,
    Shape,
    binding_threads,
    needing,
    sequence,
    sgemm_call,
    timed_call,
)
from metadef.codegen.native import native_function
from metadef.codegen.native_gemm import gemm_dims, pack_gemm_weights
from metadef.codegen.native_recurrent import CELLS, cell_dims, cell_routine
from metadef.ir import Node
from metadef.ops.defs.rnn import GRU_CELL, LSTM_CELL, RNN_CELL, recurrent_reference
from metadef.shape import TensorType

DEFAULTS = {"RNN": RNN_CELL, "GRU": GRU_CELL, "LSTM": LSTM_CELL}
ROUTINES = ("md_gemm", "md_sgemm", "md_copy", "md_copy_rows")


@dataclass(frozen=True)
class _Product:
    """One direction's packed weights and padded bias for ``md_gemm`` (``x [m, k] -> [m, n]``)."""

    packed: np.ndarray
    bias: np.ndarray
    k: int
    n: int

    @staticmethod
    def of(weight: np.ndarray, bias: np.ndarray) -> _Product:
        """``x @ weight.T + bias`` for ``weight [n, k]`` (ONNX's ``W`` or ``R`` of a direction)."""
        packed = pack_gemm_weights(np.ascontiguousarray(weight.T, np.float32))
        padded = np.zeros(packed.shape[0] * packed.shape[2], np.float32)
        padded[:weight.shape[0]] = bias
        return _Product(packed, padded, weight.shape[1], weight.shape[0])

    def call(self, x: Arg, y: Arg, m: int, lda: int, what: str, ldy: int | None = None) -> Call:
        """``y = x @ W^T + bias`` for ``m`` rows of ``x`` (``lda`` floats apart; ``y``'s ``ldy``)."""
        panels = self.packed.shape[0]

        def tasks(count: int) -> list[tuple[int, ...]] | None:
            if count < 2 or m * self.n * self.k < 1 << 18 or panels < count:
                return None
            return [gemm_dims(m, self.n, self.k, lda=lda, ldy=ldy, task=t, tasks=count) for t in range(count)]

        return Call(native_function("md_gemm"), (x, Arg("addr", self.packed.ctypes.data),
                                                 Arg("addr", self.bias.ctypes.data), y),
                    gemm_dims(m, self.n, self.k, lda=lda, ldy=ldy), what, tasks)


@dataclass(frozen=True)
class _BlasProduct:
    """``x @ W^T + bias`` by OpenBLAS's sgemm for weights known only at run time: ``weight`` and
    ``bias`` (or null) are the step's inputs (a direction's rows of ``W`` / ``R`` and ``B``)."""

    weight: Arg
    bias: Arg
    k: int
    n: int

    def call(self, x: Arg, y: Arg, m: int, lda: int, what: str, ldy: int | None = None) -> Call:
        """As :meth:`_Product.call`."""
        args = (x, self.weight, y, Arg("addr", blas.cblas_address("sgemm")), self.bias,
                Arg("addr", blas.cblas_address("sgemv")))
        return sgemm_call(args, 1, m, self.n, self.k, what, trans_b=True, lda=lda, ldc=ldy,
                          bias=None if self.bias is NULL else (0, 1))


_AnyProduct = _Product | _BlasProduct


def _unsupported(node: Node, attrs: Mapping[str, object]) -> str | None:
    """Why the native calls do not compute this node (None: they do)."""
    op = node.op
    x = node.inputs[0]
    if x is None or x.type is None or x.type.dtype.numpy != np.float32:
        return f"{op} of a dtype other than float32"
    if any(v is None or v.type is None or v.type.shape is None or not all(isinstance(d, int) for d in v.type.shape)
           for v in node.inputs[1:3]):
        return f"{op} whose W or R has a shape not known before running"
    if attrs.get("clip") is not None:
        return f"{op} with clip"
    if op == "LSTM" and attrs.get("input_forget"):
        return "LSTM with input_forget"
    defaults = [a.lower() for a in DEFAULTS[op].activations]
    names = [str(a).lower() for a in attrs.get("activations") or []]
    if names and names not in (defaults, defaults * 2):
        return (f"{op} with activations {', '.join(map(str, attrs.get('activations') or ()))} (only the "
                f"defaults run natively: {', '.join(DEFAULTS[op].activations)})")
    return None


def recurrent_node(node: Node) -> Choice | str:
    """An RNN, GRU or LSTM node as native products and cell steps, or why not."""
    op = node.op
    if op not in CELLS:
        return f"{op} is not a recurrent layer"
    attrs = attrs_of(node)
    why = _unsupported(node, attrs)
    if why is not None:
        return why
    given = [i < len(node.inputs) and node.inputs[i] is not None for i in range(8)]
    (dirs, size, width), hidden = node.inputs[1].type.shape, node.inputs[2].type.shape[-1]
    # a GRU without linear_before_reset multiplies its state by the reset gate before R's last
    # third: two products a step, the cell in two halves around the second
    split = op == "GRU" and not attrs.get("linear_before_reset")
    parts = [(0, 2 * hidden), (2 * hidden, size)] if split else [(0, size)]
    w, r, b = (node.inputs[i].const if given[i] else None for i in (1, 2, 3))
    products: list[tuple[_AnyProduct, list[_AnyProduct]]] = []
    if w is not None and r is not None and (b is not None or not given[3]):  # weights packed once
        w, r = np.asarray(w, np.float32), np.asarray(r, np.float32)
        b = np.zeros((dirs, 2 * size), np.float32) if b is None else np.asarray(b, np.float32)
        products = [(_Product.of(w[d], b[d, :size]), [_Product.of(r[d, lo:hi], b[d, size + lo:size + hi])
                                                     for lo, hi in parts]) for d in range(dirs)]
    else:  # weights fed at run time: OpenBLAS reads them as they are
        def bias(d: int, at: int) -> Arg:
            return Arg("in", 3).at(4 * (2 * d * size + at)) if given[3] else NULL

        products = [(_BlasProduct(Arg("in", 1).at(4 * d * size * width), bias(d, 0), width, size),
                     [_BlasProduct(Arg("in", 2).at(4 * (d * size + lo) * hidden), bias(d, size + lo), hidden, hi - lo)
                      for lo, hi in parts]) for d in range(dirs)]
    batch_first = attrs["layout"] == 1
    reverse = attrs["direction"] == "reverse"
    outputs = len(node.outputs)
    ragged = given[4]
    peepholes = op == "LSTM" and given[7]
    cells = "LSTM_PEEPHOLE" if peepholes else op  # (the cell kind: its routine is compiled alone)

    def calls(steps: int, batch: int, side_by_side: bool = False
              ) -> tuple[list[Call], tuple[int, ...], tuple[np.ndarray, ...]]:
        """The calls for ``steps`` steps of ``batch`` rows, their scratch buffers (bytes) and the
        arrays they read by address; ``side_by_side``: the two directions as two chains of calls
        that two threads run at once (each with its own scratch buffers)."""
        zeros = np.zeros(batch * hidden, np.float32)
        f = 4  # bytes a float
        chains: list[list[Call]] = []
        x_rows = steps * batch
        # row (t, b) of X, XW and Y: at t*batch + b (layout 0) or b*steps + t (layout 1)
        step_at, row_at = (1, steps) if batch_first else (batch, 1)
        state_ld = dirs * hidden if batch_first else hidden  # initial_h / Y_h rows
        kept = 3 if op == "LSTM" or split else 2  # (LSTM's c; a split GRU's r * h)
        # ragged sequences: the state in its own buffer (a row past its end keeps it), after the rest
        buffers = kept + int(ragged)
        lens = (Arg("in", 4),) if ragged else ()

        def cell_call(kind: str, args: tuple[Arg, ...], dims: dict[str, int]) -> Call:
            def tasks(count: int) -> list[tuple[int, ...]] | None:
                if count < 2 or batch < count or batch * size < PARALLEL_ELEMENTS:
                    return None
                return [cell_dims(kind, batch, hidden, **dims, task=k, tasks=count) for k in range(count)]

            return Call(native_function(cell_routine(cells)), args, cell_dims(kind, batch, hidden, **dims),
                        f"{op} cell", tasks)

        for d in range(dirs):
            base = buffers * d if side_by_side else 0
            xw, hr = Arg("scratch", base), Arg("scratch", base + 1)
            cell = Arg("scratch", base + 2) if kept == 3 else NULL
            out: list[Call] = []
            chains.append(out)
            into, over = products[d]
            out.append(into.call(Arg("in", 0), xw, x_rows, into.k, f"{op} input projection"))
            state_at = (d * hidden if batch_first else d * batch * hidden) * f
            if op == "LSTM":
                source = Arg("in", 6).at(state_at) if given[6] else Arg("addr", zeros.ctypes.data)
                out.append(Call(native_function("md_copy_rows"), (source, cell),
                                (batch, hidden * f, (state_ld if given[6] else hidden) * f, hidden * f),
                                "LSTM initial cell state"))
            h, h_ld = (Arg("in", 5).at(state_at), state_ld) if given[5] else (Arg("addr", zeros.ctypes.data), hidden)
            if ragged:
                state = Arg("scratch", base + kept)
                out.append(Call(native_function("md_copy_rows"), (h, state), (batch, hidden * f, h_ld * f, hidden * f),
                                f"{op} initial state"))
                h, h_ld = state, hidden
            # Y [seq, dirs, batch, hidden] (layout 0) or [batch, seq, dirs, hidden] (layout 1)
            y_ld, y_step = (steps * dirs * hidden, hidden) if batch_first else (hidden, batch * hidden)
            order = range(steps - 1, -1, -1) if reverse or d == 1 else range(steps)
            for t in order:
                y = Arg("out", 0).at((t * dirs + d) * y_step * f)
                xw_t = xw.at(t * step_at * size * f)
                dims = {"xw_ld": row_at * size, "h_ld": h_ld, "y_ld": y_ld, "ragged": ragged, "t": t,
                        "first": t == order[0]}
                out.append(over[0].call(h, hr, batch, h_ld, f"{op} recurrence", ldy=size))
                if split:  # z over hr_z and r * h into the scratch rows, their product, then h
                    out.append(cell_call("GRU_RESET", (xw_t, hr, h, NULL, cell, *lens), {**dims, "y_ld": hidden}))
                    out.append(over[1].call(cell, hr.at(2 * hidden * f), batch, hidden, "GRU reset recurrence",
                                            ldy=size))
                    out.append(cell_call("GRU_UPDATE", (xw_t, hr, h, NULL, y, *lens), dims))
                else:
                    extra = (lens[0] if lens else NULL, Arg("in", 7).at(4 * 3 * hidden * d)) if peepholes else lens
                    out.append(cell_call(cells, (xw_t, hr, h, cell, y, *extra), dims))
                if not ragged:  # (the next step reads this one's rows of Y; ragged: the state buffer)
                    h, h_ld = y, y_ld
            finals = [(h, h_ld)] + ([(cell, hidden)] if op == "LSTM" else [])
            for k, (source, ld) in enumerate(finals[:outputs - 1]):
                out.append(Call(native_function("md_copy_rows"), (source, Arg("out", k + 1).at(state_at)),
                                (batch, hidden * f, ld * f, state_ld * f), f"{op} last state"))
        sizes = (x_rows * size * f, batch * size * f, batch * hidden * f)[:kept] \
            + ((batch * hidden * f,) if ragged else ())
        scratch = sizes * (dirs if side_by_side else 1)
        if side_by_side:
            return [sequence(chains[0]), sequence(chains[1], joins=True)], scratch, (zeros,)
        return [c for chain in chains for c in chain], scratch, (zeros,)

    def shape_of(x: Shape) -> tuple[int, int]:
        return (x[1], x[0]) if batch_first else (x[0], x[1])

    def lower(ins: Sequence[Shape | None], outs: Sequence[Shape], symbols: Mapping[str, int]) -> NativeStep | str:
        if ins[0] is None or len(ins[0]) != 3:
            return "X's shape is not known"
        steps, batch = shape_of(ins[0])
        if steps == 0 or batch == 0:
            return "an empty sequence or batch (its reference kernel writes the zero states)"
        found, scratch, keep = calls(steps, batch, side_by_side=dirs == 2 and binding_threads() >= 2)
        return NativeStep(tuple(found), scratch, (*keep, products))  # (packed weights kept with the step)

    def run(args: Sequence[np.ndarray | None], out_types: Sequence[TensorType]) -> list[np.ndarray]:
        x = args[0]
        if x is None or x.ndim != 3 or 0 in shape_of(x.shape):
            return list(recurrent_reference(DEFAULTS[op], list(args), attrs))
        arrays = [None if a is None else np.ascontiguousarray(a, np.int32 if i == 4 else np.float32)
                  for i, a in enumerate(args)]  # (sequence_lens: int32)
        results = [np.empty(tuple(t.shape), np.float32) for t in out_types]
        found, scratch, _ = calls(*shape_of(x.shape))
        buffers = [np.empty(max(size, 4), np.uint8) for size in scratch]

        def address(arg: Arg) -> int:
            base = {"in": lambda: arrays[arg.index].ctypes.data, "out": lambda: results[arg.index].ctypes.data,
                    "scratch": lambda: buffers[arg.index].ctypes.data, "addr": lambda: arg.index,
                    "null": lambda: 0}[arg.kind]()
            return base + arg.offset if base else 0

        for c in found:
            timed_call(c.address, [address(a) for a in c.args], c.dims)()
        return results

    products_by = "md_gemm" if isinstance(products[0][0], _Product) else "sgemm"
    reason = f"{op}: {products_by} products and {cell_routine(cells)} steps (our kernels)"
    return Choice(run, "native", reason, native=needing(lower, *ROUTINES, cell_routine(cells)))


__all__ = ["recurrent_node"]
