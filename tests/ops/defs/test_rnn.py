"""Recurrent layers (RNN, GRU, LSTM): shape inference, errors, numerics against ONNX Runtime.

ONNX Runtime runs only ``layout`` 0, so a ``layout`` 1 model is checked against ORT on the
transposed layout-0 model.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import metadef.ops.defs.rnn  # noqa: F401  (registers the ops until defs/__init__ does)
from metadef.core.errors import ShapeError
from metadef.ops import get_op
from metadef.ops.defs.rnn import ACTIVATIONS
from metadef.testing.onnx_cases import assert_same, infer_text, one_node_model, run_both, run_metadef
from metadef.testing.oracle import run_onnxruntime

OPS = ["RNN", "GRU", "LSTM"]
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
ACTS_PER_DIRECTION = {"RNN": 1, "GRU": 2, "LSTM": 3}
DIRECTIONS = ["forward", "reverse", "bidirectional"]


def weights(op: str, dirs: int, inp: int | str, hidden: int | str) -> list[str]:
    g = GATES[op]
    size = f"{g * hidden}" if isinstance(hidden, int) else f"{g}*{hidden}"
    return [f"f32[{dirs},{size},{inp}]", f"f32[{dirs},{size},{hidden}]"]


# ------------------------------------------------------------------ shapes


@pytest.mark.parametrize("op", OPS)
def test_shapes_symbolic_seq_and_batch(op: str) -> None:
    n_states = 3 if op == "LSTM" else 2
    w = weights(op, 1, 16, 32)
    assert infer_text(op, ["f32[seq,batch,16]", *w]) == \
        ["f32[seq,1,batch,32]", *["f32[1,batch,32]"] * (n_states - 1)]
    w2 = weights(op, 2, 16, 32)
    assert infer_text(op, ["f32[batch,seq,16]", *w2], {"layout": 1, "direction": "bidirectional"}) == \
        ["f32[batch,seq,2,32]", *["f32[batch,2,32]"] * (n_states - 1)]
    # hidden_size from the attribute, and every optional input present
    states = ["f32[1,batch,8]"] * (2 if op == "LSTM" else 1)
    extra = ["f32[1,24]"] if op == "LSTM" else []
    ins = ["f64[seq,batch,4]", *(s.replace("f32", "f64") for s in weights(op, 1, 4, 8)),
           f"f64[1,{2 * GATES[op] * 8}]", "i32[batch]",
           *(s.replace("f32", "f64") for s in states + extra)]
    out = infer_text(op, ins, {"hidden_size": 8, "direction": "reverse"})
    assert out[0] == "f64[seq,1,batch,8]" and out[1] == "f64[1,batch,8]"


def test_shapes_symbolic_hidden_and_output_count() -> None:
    # a symbolic hidden size flows from R through the gate-count products
    assert infer_text("LSTM", ["f16[s,b,4]", "f16[1,4*h,4]", "f16[1,4*h,h]"], n_outputs=2) == \
        ["f16[s,1,b,h]", "f16[1,b,h]"]


@pytest.mark.parametrize("op", OPS)
def test_errors_name_the_node_and_the_constraint(op: str) -> None:
    w = weights(op, 1, 16, 32)
    with pytest.raises(ShapeError, match=rf"{op} \(node /node\).*W has shape \[1,{GATES[op] * 32},15\] "
                                         rf"but \[1,{GATES[op] * 32},16\] is expected"):
        infer_text(op, ["f32[seq,batch,16]", *weights(op, 1, 15, 32)])
    with pytest.raises(ShapeError, match=r"W has shape \[1,.* but \[2,.* is expected"):
        infer_text(op, ["f32[seq,batch,16]", *w], {"direction": "bidirectional"})
    with pytest.raises(ShapeError, match=r"R has shape \[1,.*,31\] but \[1,.*,32\] is expected"):
        infer_text(op, ["f32[seq,batch,16]", w[0], w[1].replace(",32]", ",31]")], {"hidden_size": 32})
    with pytest.raises(ShapeError, match=r"unknown activation 'Gelu'"):
        infer_text(op, ["f32[seq,batch,16]", *w], {"activations": ["Gelu"] * ACTS_PER_DIRECTION[op]})
    with pytest.raises(ShapeError, match=rf"activations lists 5 functions but this node takes "
                                         rf"{ACTS_PER_DIRECTION[op]} per direction"):
        infer_text(op, ["f32[seq,batch,16]", *w], {"activations": ["Tanh"] * 5})
    with pytest.raises(ShapeError, match="direction 'sideways' must be forward, reverse or bidirectional"):
        infer_text(op, ["f32[seq,batch,16]", *w], {"direction": "sideways"})
    with pytest.raises(ShapeError, match="initial_h has shape"):
        infer_text(op, ["f32[seq,3,16]", *w, None, None, "f32[1,7,32]"])
    with pytest.raises(ShapeError, match="X has rank 2"):
        infer_text(op, ["f32[seq,16]", *w])


def test_roles_are_opaque() -> None:
    assert {get_op(op).role.value for op in OPS} == {"opaque"}


# ------------------------------------------------------------------ numerics vs ORT

RNG = np.random.default_rng(7)


def _random(*shape: int, scale: float = 0.5) -> np.ndarray:
    return (scale * RNG.standard_normal(shape)).astype(np.float32)


def _case(op: str, *, steps: int, batch: int, inp: int, hidden: int, direction: str = "forward",
          lens: list[int] | None = None, initial: bool = True, peepholes: bool = True,
          outputs: tuple[str, ...] | None = None, **attrs: object) -> tuple[dict, dict, list[str], list[str], dict]:
    """Feeds, constants, input names and output names of one layout-0 model."""
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    consts = {"W": _random(dirs, g * hidden, inp), "R": _random(dirs, g * hidden, hidden),
              "B": _random(dirs, 2 * g * hidden)}
    names = ["x", "W", "R", "B"]
    if lens is not None:
        consts["L"] = np.array(lens, np.int32)
    names.append("L" if lens is not None else "")
    state_names = ["h0", "c0"] if op == "LSTM" else ["h0"]
    for s in state_names:
        if initial:
            consts[s] = _random(dirs, batch, hidden)
        names.append(s if initial else "")
    if op == "LSTM" and peepholes:
        consts["P"] = _random(dirs, 3 * hidden)
        names.append("P")
    n_out = 3 if op == "LSTM" else 2
    outs = list(outputs) if outputs is not None else [f"out{i}" for i in range(n_out)]
    attrs = {"direction": direction, "hidden_size": hidden, **attrs}
    return {"x": _random(steps, batch, inp, scale=1.0)}, consts, names, outs, attrs


def _model(op: str, feeds: dict, consts: dict, names: list[str], outs: list[str],
           attrs: dict) -> onnx.ModelProto:
    """The node writes ``outs`` ("" for an output left out); the graph outputs the named ones."""
    model = one_node_model(op, feeds, consts, names, len(outs), 21, **attrs)
    del model.graph.node[0].output[:], model.graph.output[:]
    model.graph.node[0].output.extend(outs)
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(o) for o in outs if o)
    return model


def check(op: str, rtol: float = 1e-4, **kw: object) -> None:
    feeds, consts, names, outs, attrs = _case(op, **kw)  # type: ignore[arg-type]
    model = _model(op, feeds, consts, names, outs, attrs)
    got, want = run_both(model, feeds)
    assert_same(got, want, rtol=rtol, atol=1e-5)


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("op", OPS)
def test_ragged_sequence_lens_against_ort(op: str, direction: str) -> None:
    # lengths from 0 to the full sequence: Y is zero past each length, Y_h the last valid
    # step (zero for a length of 0)
    check(op, steps=6, batch=5, inp=3, hidden=4, direction=direction, lens=[6, 0, 3, 1, 5])
    check(op, steps=4, batch=2, inp=5, hidden=3, direction=direction, lens=[2, 4], initial=False,
          peepholes=False)


@pytest.mark.parametrize("op", OPS)
def test_random_shapes_and_options_against_ort(op: str) -> None:
    option = {"GRU": {"linear_before_reset": 1}, "LSTM": {"input_forget": 1}, "RNN": {}}[op]
    for seed in range(4):
        rng = np.random.default_rng(seed)
        steps, batch, inp, hidden = (int(v) for v in rng.integers(1, 7, 4))
        direction = DIRECTIONS[seed % 3]
        lens = [int(v) for v in rng.integers(0, steps + 1, batch)]
        check(op, steps=steps, batch=batch, inp=inp, hidden=hidden, direction=direction, lens=lens,
              clip=float(rng.uniform(0.3, 2.0)) if seed % 2 else None, **option)


@pytest.mark.parametrize("op", OPS)
def test_optional_outputs_against_ort(op: str) -> None:
    n = 3 if op == "LSTM" else 2
    for outs in [("", "yh"), ("y",), ("", "", "yc")[:n], ("y", "", "yc")[:n]]:
        if not any(outs):
            continue
        check(op, steps=3, batch=2, inp=3, hidden=2, direction="bidirectional", lens=[3, 1],
              outputs=outs)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_every_activation_against_ort(name: str) -> None:
    onnx_name = {"leakyrelu": "LeakyRelu", "thresholdedrelu": "ThresholdedRelu",
                 "scaledtanh": "ScaledTanh", "hardsigmoid": "HardSigmoid"}.get(name, name.capitalize())
    # as f of an RNN, as g of a GRU (alpha/beta consumed in order), as h of a bidirectional LSTM
    check("RNN", steps=4, batch=3, inp=3, hidden=3, lens=[4, 2, 3], activations=[onnx_name],
          activation_alpha=[0.7], activation_beta=[0.4])
    check("GRU", steps=4, batch=3, inp=3, hidden=3, activations=["Sigmoid", onnx_name],
          activation_alpha=[0.6], activation_beta=[0.2])
    check("LSTM", steps=3, batch=2, inp=3, hidden=2, direction="bidirectional",
          activations=["Sigmoid", "Tanh", onnx_name, "HardSigmoid", onnx_name, "Tanh"],
          activation_alpha=[0.8, 0.3, 0.5], activation_beta=[0.1])
    # defaults for alpha and beta when the lists are absent
    check("RNN", steps=3, batch=2, inp=3, hidden=3, activations=[onnx_name])


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("op", OPS)
def test_layout_1_matches_ort_on_the_transposed_model(op: str, direction: str) -> None:
    feeds, consts, names, outs, attrs = _case(op, steps=5, batch=3, inp=4, hidden=3,
                                              direction=direction, lens=[5, 2, 0])
    want = run_onnxruntime(_model(op, feeds, consts, names, outs, attrs), feeds)
    batch_first = dict(consts)
    for s in ("h0", "c0"):
        if s in batch_first:
            batch_first[s] = np.ascontiguousarray(consts[s].swapaxes(0, 1))
    feeds1 = {"x": np.ascontiguousarray(feeds["x"].swapaxes(0, 1))}
    got = run_metadef(_model(op, feeds1, batch_first, names, outs, {**attrs, "layout": 1}), feeds1)
    expect = [want[outs[0]].transpose(2, 0, 1, 3), *(want[o].swapaxes(0, 1) for o in outs[1:])]
    assert_same(got, [np.ascontiguousarray(e) for e in expect], rtol=1e-4, atol=1e-5)


def test_float64_runs_in_float64() -> None:
    # ORT's recurrent kernels take float32 only: compare with it at float32 precision
    x = RNG.standard_normal((3, 2, 2))
    w, r = RNG.standard_normal((1, 9, 2)), RNG.standard_normal((1, 9, 3))
    model64 = one_node_model("GRU", {"x": x}, {"W": w, "R": r}, ["x", "W", "R"], 2, 21, hidden_size=3)
    f32 = {"x": x.astype(np.float32)}
    model32 = one_node_model("GRU", f32, {"W": w.astype(np.float32), "R": r.astype(np.float32)},
                             ["x", "W", "R"], 2, 21, hidden_size=3)
    got = run_metadef(model64, {"x": x})
    want = run_onnxruntime(model32, f32)
    assert [g.dtype for g in got] == [np.float64] * 2
    assert_same([g.astype(np.float32) for g in got], [want["out0"], want["out1"]], rtol=1e-4, atol=1e-5)


def test_opset_1_output_sequence_and_float16() -> None:
    x = RNG.standard_normal((3, 2, 2)).astype(np.float32)
    w, r = _random(1, 12, 2), _random(1, 12, 3)
    old = one_node_model("LSTM", {"x": x}, {"W": w, "R": r}, ["x", "W", "R"], 2, 1, hidden_size=3,
                         output_sequence=1)
    new = one_node_model("LSTM", {"x": x}, {"W": w, "R": r}, ["x", "W", "R"], 2, 21, hidden_size=3)
    assert_same(run_metadef(old, {"x": x}), run_metadef(new, {"x": x}))
    half = {"x": x.astype(np.float16)}
    model16 = one_node_model("LSTM", half, {"W": w.astype(np.float16), "R": r.astype(np.float16)},
                             ["x", "W", "R"], 2, 21, hidden_size=3)
    got = run_metadef(model16, half)
    assert [g.dtype for g in got] == [np.float16] * 2
    assert_same([g.astype(np.float32) for g in got], run_metadef(new, {"x": x}), rtol=1e-2, atol=1e-2)


# ------------------------------------------------------------------ conformance


@pytest.mark.slow
def test_conformance() -> None:
    from metadef.testing.conformance import format_report, run_cases

    report = run_cases(op=OPS)
    assert report.totals()["pass"] == 18, format_report(report)
    assert not report.failures(), format_report(report)
