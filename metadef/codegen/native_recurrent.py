"""One time step of a recurrent layer's cells, after its products (see :mod:`.native`).

``md_rnn_cell``, ``md_gru_cell`` and ``md_lstm_cell`` compute the new hidden state of every
batch row from the step's input projection ``xw`` (``X_t W^T + Wb``) and its recurrent
projection ``hr`` (``H_{t-1} R^T + Rb``), both ``[batch, gates * hidden]`` (rows ``xw_ld`` /
``hr_ld`` floats apart), as ONNX defines the three cells with their default activations::

    RNN   (cell 0): h = tanh(xw + hr)
    GRU   (cell 1): z = sigmoid(xw_z + hr_z), r = sigmoid(xw_r + hr_r), n = tanh(xw_h + r * hr_h),
                    h = (1 - z) n + z h_prev                       (linear_before_reset = 1)
    LSTM  (cell 2): i, o, f = sigmoid(xw + hr) of gates 0, 1, 2, g = tanh(xw_c + hr_c),
                    c = f c + i g (in place), h = o tanh(c)
    LSTM with peepholes (cell 5, ``md_lstm_peephole_cell``): ``P [3 * hidden]`` (i, o, f) adds
                    P_i c and P_f c (the previous c) to gates i and f, P_o c (the new c) to o

and a GRU with ``linear_before_reset = 0`` (ONNX's default), whose reset gate scales the state
before its product, in two halves around that product: cell 3 writes ``z`` over ``hr_z`` and
``r * h_prev`` to ``y`` (the next product's rows); cell 4, once ``hr_h`` holds
``(r * h_prev) R_h^T + Rb_h``, computes ``h = (1 - z) tanh(xw_h + hr_h) + z h_prev``.

The cells write ``h`` to ``y`` (rows ``y_ld`` apart; ``h_prev`` rows ``h_ld`` apart). Eight units a
step in vectors, the last few one at a time; sigmoid and tanh from one ``exp(-|x|)`` each (the
softmax routine's exp, :func:`.native_softmax._exp`), tanh of ``|x| < 0.625`` by Cephes'
odd polynomial (no cancellation near 0). Task ``task`` of ``tasks`` takes its share of the rows.

Example:
    >>> import ctypes, numpy as np
    >>> from metadef.codegen.native import ENTRY, native_function
    >>> xw, hr = np.full((1, 8), 0.5, np.float32), np.zeros((1, 8), np.float32)
    >>> h0, y = np.zeros((1, 8), np.float32), np.empty((1, 8), np.float32)
    >>> args = (ctypes.c_void_p * 5)(xw.ctypes.data, hr.ctypes.data, h0.ctypes.data, None, y.ctypes.data)
    >>> dims = cell_dims("RNN", 1, 8)
    >>> ENTRY(native_function("md_rnn_cell"))(args, (ctypes.c_int64 * len(dims))(*dims))
    >>> round(float(y[0, 0]), 6) == round(float(np.tanh(np.float32(0.5))), 6)
    True
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from metadef.codegen.native_ir import F32, I32, I64, PTR, V8, _arg, _define, _elem, _loop, _share, _splat
from metadef.codegen.native_softmax import _exp, _intrinsic

CELL_DIMS = ("cell", "batch", "hidden", "xw_ld", "hr_ld", "h_ld", "y_ld", "task", "tasks", "ragged", "t", "first")
"""The dims of the cell routines: args are ``[xw, hr, h_prev, c (LSTM; else null), y]`` and,
with ``ragged``, a sixth: the int32 length of each row's sequence (the peephole cell's seventh,
always: its ``P``). Then ``h_prev`` is the rows'
state, updated in place where the step ``t`` is inside a row's sequence; a row past its end
keeps its state and ``c`` and gets zeros in ``y``, and at the direction's ``first`` step a row
of length 0 (or less) gets zero states (ONNX Runtime's last states of an empty sequence)."""

CELLS = {"RNN": 0, "GRU": 1, "LSTM": 2, "GRU_RESET": 3, "GRU_UPDATE": 4, "LSTM_PEEPHOLE": 5}
"""The cell kinds the routines compute, by op (a GRU without ``linear_before_reset``:
its two halves)."""

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4, "GRU_RESET": 3, "GRU_UPDATE": 3, "LSTM_PEEPHOLE": 4}
"""Gates a cell's projections hold, by op."""

TANH_SMALL = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1)
"""Cephes' ``tanhf`` below |x| = 0.625: ``x + x * z * p(z)``, ``z = x*x`` (highest first)."""


def cell_dims(op: str, batch: int, hidden: int, *, xw_ld: int | None = None, hr_ld: int | None = None,
              h_ld: int | None = None, y_ld: int | None = None, task: int = 0, tasks: int = 1,
              ragged: bool = False, t: int = 0, first: bool = False) -> tuple[int, ...]:
    """The dims of one cell routine's call for ``op``'s cell (see :data:`CELL_DIMS`; the
    row strides default to packed rows).

    Example:
        >>> cell_dims("LSTM", 8, 256)[:4]
        (2, 8, 256, 1024)
    """
    width = GATES[op] * hidden
    values = {"cell": CELLS[op], "batch": batch, "hidden": hidden, "xw_ld": xw_ld or width, "hr_ld": hr_ld or width,
              "h_ld": h_ld or hidden, "y_ld": y_ld or hidden, "task": task, "tasks": tasks,
              "ragged": int(ragged), "t": t, "first": int(first)}
    return tuple(values[d] for d in CELL_DIMS)


def _constant(b: ir.IRBuilder, like: ir.Value, value: float) -> ir.Value:
    return _splat(b, F32(value), like.type.count) if isinstance(like.type, ir.VectorType) else F32(value)


def _sigmoid(b: ir.IRBuilder, module: ir.Module, x: ir.Value) -> ir.Value:
    """``1 / (1 + e^-x)`` from ``e = exp(-|x|)``: ``1 / (1 + e)`` or ``e / (1 + e)`` (no overflow)."""
    e = _exp(b, module, b.fneg(b.call(_intrinsic(module, "fabs", x.type, 1), [x])))
    inverse = b.fdiv(_constant(b, x, 1.0), b.fadd(_constant(b, x, 1.0), e))
    return b.select(b.fcmp_ordered(">=", x, _constant(b, x, 0.0)), inverse, b.fmul(e, inverse))


def _tanh(b: ir.IRBuilder, module: ir.Module, x: ir.Value) -> ir.Value:
    """``tanh(x)``: ``(1 - e) / (1 + e)`` with ``e = exp(-2|x|)``, its sign from ``x``; below
    0.625 Cephes' polynomial (NaN stays NaN: it fails the compare and takes the quotient)."""
    fma = _intrinsic(module, "fmuladd", x.type, 3)
    magnitude = b.call(_intrinsic(module, "fabs", x.type, 1), [x])
    e = _exp(b, module, b.fmul(magnitude, _constant(b, x, -2.0)))
    one = _constant(b, x, 1.0)
    large = b.call(_intrinsic(module, "copysign", x.type, 2), [b.fdiv(b.fsub(one, e), b.fadd(one, e)), x])
    z = b.fmul(x, x)
    p = _constant(b, x, TANH_SMALL[0])
    for coefficient in TANH_SMALL[1:]:
        p = b.call(fma, [p, z, _constant(b, x, coefficient)])
    small = b.call(fma, [b.fmul(x, z), p, x])
    return b.select(b.fcmp_ordered("<", magnitude, _constant(b, x, 0.625)), small, large)


def _cell(b: ir.IRBuilder, module: ir.Module, kind: str, at: Callable[[int, ir.Type], tuple[ir.Value, ...]],
          typ: ir.Type) -> dict[str, ir.Value]:
    """One cell's units (a vector or one) from ``at(gate, typ)`` = ``(xw, hr)`` of that gate
    and ``at(-1, typ)`` = ``(h_prev, c)`` (``at(-2, typ)``: the peepholes ``(P_i, P_o, P_f)``):
    what to store, by where (``y``, ``c``, ``hr_z``)."""
    def gate(k: int) -> ir.Value:
        xw, hr = at(k, typ)
        return b.fadd(xw, hr)

    if kind == "RNN":
        return {"y": _tanh(b, module, gate(0))}
    h_prev, c = at(-1, typ)
    if kind in ("GRU", "GRU_UPDATE"):
        xw, hr = at(2, typ)
        if kind == "GRU":
            z, r = _sigmoid(b, module, gate(0)), _sigmoid(b, module, gate(1))
            hr = b.fmul(r, hr)
        else:  # (z where cell 3 left it)
            z = at(0, typ)[1]
        n = _tanh(b, module, b.fadd(xw, hr))
        return {"y": b.fadd(n, b.fmul(z, b.fsub(h_prev, n)))}  # (1 - z) n + z h
    if kind == "GRU_RESET":
        return {"hr_z": _sigmoid(b, module, gate(0)), "y": b.fmul(_sigmoid(b, module, gate(1)), h_prev)}
    if kind == "LSTM_PEEPHOLE":
        p_i, p_o, p_f = at(-2, typ)
        i = _sigmoid(b, module, b.fadd(gate(0), b.fmul(p_i, c)))
        f = _sigmoid(b, module, b.fadd(gate(2), b.fmul(p_f, c)))
        cell = b.fadd(b.fmul(f, c), b.fmul(i, _tanh(b, module, gate(3))))
        o = _sigmoid(b, module, b.fadd(gate(1), b.fmul(p_o, cell)))
        return {"y": b.fmul(o, _tanh(b, module, cell)), "c": cell}
    i, o, f = (_sigmoid(b, module, gate(k)) for k in range(3))
    cell = b.fadd(b.fmul(f, c), b.fmul(i, _tanh(b, module, gate(3))))
    return {"y": b.fmul(o, _tanh(b, module, cell)), "c": cell}


CELL_ROUTINES = {"md_rnn_cell": ("RNN",), "md_gru_cell": ("GRU", "GRU_RESET", "GRU_UPDATE"),
                 "md_lstm_cell": ("LSTM",), "md_lstm_peephole_cell": ("LSTM_PEEPHOLE",)}
"""The cell routines and the cell kinds each computes (a model compiles the ones it has: the
five kinds in one routine were 440 ms of LLVM)."""


def cell_routine(op: str) -> str:
    """The routine computing ``op``'s cells (RNN, GRU, LSTM, LSTM_PEEPHOLE).

    Example:
        >>> cell_routine("GRU"), cell_routine("LSTM_PEEPHOLE")
        ('md_gru_cell', 'md_lstm_peephole_cell')
    """
    return f"md_{op.lower()}_cell"


def _length(b: ir.IRBuilder, ragged: ir.Value, lens: ir.Value, r: ir.Value) -> ir.Value:
    """Row ``r``'s sequence length where ``ragged`` (an int32 of ``lens``), else 2**62 (every
    step inside); the load sits behind the branch (``lens`` is null otherwise)."""
    pre = b.block
    with b.if_then(ragged):
        loaded, inside = b.sext(b.load(b.gep(lens, [r], source_etype=I32), typ=I32), I64), b.block
    length = b.phi(I64)
    length.add_incoming(I64(1 << 62), pre)
    length.add_incoming(loaded, inside)
    return length


def _recurrent_cell(module: ir.Module, name: str) -> None:
    b, args, dims = _define(module, name)
    xw, hr, h_prev, c, y = (_arg(b, args, i, PTR) for i in range(5))
    d = {name: _arg(b, dims, i, I64) for i, name in enumerate(CELL_DIMS)}
    hidden = d["hidden"]
    ragged = b.icmp_signed("!=", d["ragged"], I64(0))
    pre = b.block
    with b.if_then(ragged):  # (a sixth arg only where there is one)
        given, inside = _arg(b, args, 5, PTR), b.block
    lens = b.phi(PTR)
    lens.add_incoming(ir.Constant(PTR, None), pre)
    lens.add_incoming(given, inside)
    peepholes = _arg(b, args, 6, PTR) if "LSTM_PEEPHOLE" in CELL_ROUTINES[name] else None
    first, last = _share(b, d["batch"], d)
    blocks = b.sdiv(hidden, I64(8))
    after = b.append_basic_block("done")
    kinds = {kind: b.append_basic_block(kind.lower()) for kind in CELL_ROUTINES[name]}
    switch = b.switch(d["cell"], after)
    for kind, block in kinds.items():
        switch.add_case(I64(CELLS[kind]), block)
        b.position_at_end(block)

        def row(r: ir.Value, kind: str = kind) -> None:
            rows = {name: b.mul(r, d[f"{name}_ld"]) for name in ("xw", "hr", "h", "y")}

            def units(j: ir.Value, typ: ir.Type) -> None:
                def at(k: int, typ: ir.Type) -> tuple[ir.Value, ...]:
                    if k == -2:
                        assert peepholes is not None
                        return tuple(b.load(_elem(b, peepholes, b.add(b.mul(I64(g), hidden), j)), typ=typ, align=4)
                                     for g in range(3))
                    if k < 0:
                        state = b.load(_elem(b, h_prev, b.add(rows["h"], j)), typ=typ, align=4)
                        cell = b.load(_elem(b, c, b.add(b.mul(r, hidden), j)), typ=typ, align=4) \
                            if kind.startswith("LSTM") else None
                        return state, cell
                    column = b.add(b.mul(I64(k), hidden), j)
                    return (b.load(_elem(b, xw, b.add(rows["xw"], column)), typ=typ, align=4),
                            b.load(_elem(b, hr, b.add(rows["hr"], column)), typ=typ, align=4))

                at_row = {"y": (y, b.add(rows["y"], j)), "c": (c, b.add(b.mul(r, hidden), j)),
                          "hr_z": (hr, b.add(rows["hr"], j)), "state": (h_prev, b.add(rows["h"], j))}
                stores = _cell(b, module, kind, at, typ)
                if kind != "GRU_RESET":  # (ragged: the state in place too; read only when ragged)
                    with b.if_then(ragged):
                        base, index = at_row["state"]
                        b.store(stores["y"], _elem(b, base, index), align=4)
                for where, value in stores.items():
                    base, index = at_row[where]
                    b.store(value, _elem(b, base, index), align=4)

            def zeros(j: ir.Value, typ: ir.Type, wheres: tuple[str, ...]) -> None:
                at_row = {"y": (y, rows["y"]), "state": (h_prev, rows["h"]), "c": (c, b.mul(r, hidden))}
                zero = ir.Constant(typ, [0.0] * typ.count) if isinstance(typ, ir.VectorType) else F32(0.0)
                for where in wheres:
                    base, start = at_row[where]
                    b.store(zero, _elem(b, base, b.add(start, j)), align=4)

            def each(work: Callable[[ir.Value, ir.Type], None]) -> None:
                _loop(b, I64(0), blocks, lambda k: work(b.mul(k, I64(8)), V8))
                _loop(b, b.mul(blocks, I64(8)), hidden, lambda j: work(j, F32))

            length = _length(b, ragged, lens, r)
            with b.if_else(b.icmp_signed("<", d["t"], length)) as (inside_sequence, past_end):
                with inside_sequence:
                    each(units)
                with past_end:  # (a ragged row past its end: GRU's reset half has nothing to do)
                    if kind != "GRU_RESET":
                        each(lambda j, typ: zeros(j, typ, ("y",)))
                        empty = b.and_(b.icmp_signed("!=", d["first"], I64(0)), b.icmp_signed("<=", length, I64(0)))
                        kept = ("state", "c") if kind.startswith("LSTM") else ("state",)
                        with b.if_then(empty):
                            each(lambda j, typ: zeros(j, typ, kept))

        _loop(b, first, last, row)
        b.branch(after)
    b.position_at_end(after)
    b.ret_void()


__all__ = ["CELLS", "CELL_DIMS", "CELL_ROUTINES", "GATES", "cell_dims", "cell_routine"]
