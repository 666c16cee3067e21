"""RNN, GRU and LSTM run as ``md_gemm`` products and cell-routine steps: against the
reference (every direction, both layouts, initial states or none, hidden sizes off the vector
width, several sequence lengths and batches with nothing compiled between them, one and two
threads), against ONNX Runtime, step by step, and the nodes the cells do not compute run their
reference kernel with the reason."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import metadef as md
from metadef.codegen.jit import compile_count
from metadef.ir import GraphBuilder
from metadef.shape import parse_type

pytestmark = pytest.mark.jit

RNG = np.random.default_rng(21)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _graph(op: str, direction: str, layout: int, states: bool, hidden: int, inputs: int = 5,
           **attrs: object) -> md.Graph:
    dirs = 2 if direction == "bidirectional" else 1
    size = GATES[op] * hidden
    g = GraphBuilder("rnn")
    x = g.input("x", parse_type(f"f32[{'n,seq' if layout else 'seq,n'},{inputs}]"))
    w = g.const("w", (RNG.standard_normal((dirs, size, inputs)) * 0.4).astype(np.float32))
    r = g.const("r", (RNG.standard_normal((dirs, size, hidden)) * 0.4).astype(np.float32))
    b = g.const("b", RNG.standard_normal((dirs, 2 * size)).astype(np.float32))
    args = [x, w, r, b]
    if states:
        shape = f"f32[{'n,' + str(dirs) if layout else str(dirs) + ',n'},{hidden}]"
        args += [None, g.input("h0", parse_type(shape))]
        if op == "LSTM":
            args.append(g.input("c0", parse_type(shape)))
    if op == "GRU":
        attrs.setdefault("linear_before_reset", 1)
    outs = g.node(op, args, {"hidden_size": hidden, "direction": direction, "layout": layout, **attrs},
                  outputs=["y", "y_h", "y_c"][:3 if op == "LSTM" else 2])
    for v in outs:
        g.output(v)
    return g.build()


def _feeds(graph: md.Graph, seq: int, batch: int) -> dict[str, np.ndarray]:
    feeds = {}
    for v in graph.inputs:
        shape = [seq if d == "seq" else batch if d == "n" else d for d in (str(s) for s in v.type.shape)]
        feeds[v.name] = RNG.standard_normal([int(d) for d in shape]).astype(np.float32)
    return feeds


@pytest.mark.parametrize("op", ["LSTM", "GRU", "GRU0", "RNN"])
@pytest.mark.parametrize(("direction", "layout", "states", "hidden"), [
    ("forward", 0, False, 16), ("reverse", 0, True, 13), ("bidirectional", 0, True, 8),
    ("forward", 1, True, 5), ("bidirectional", 1, False, 24),
])
def test_recurrent_layers_match_the_reference(op: str, direction: str, layout: int, states: bool,
                                              hidden: int) -> None:
    """(GRU0: a GRU without linear_before_reset, ONNX's default.)"""
    graph = _graph(op.rstrip("0"), direction, layout, states, hidden,
                   **({"linear_before_reset": 0} if op == "GRU0" else {}))
    ref = md.compile(graph, target="reference")
    for threads in (1, 2):
        sess = md.compile(graph, target="x86", cache=False, threads=threads)
        assert sess.executable.plan[0].reason.endswith("(our kernels)")
        compiled = None
        for seq, batch in ((7, 3), (1, 1), (20, 9)):
            feeds = _feeds(graph, seq, batch)
            got, want = sess.run(feeds), ref.run(feeds)
            for name in want:
                np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)
            compiled = compile_count() if compiled is None else compiled
        assert compile_count() == compiled  # (a new length or batch compiles nothing)


def test_step_by_step_and_empty_sequences_match_the_reference() -> None:
    graph = _graph("LSTM", "bidirectional", 0, True, 11)
    sess, ref = md.compile(graph, target="x86", cache=False), md.compile(graph, target="reference")
    feeds = _feeds(graph, 6, 4)
    steps = sess.executable.run_steps(feeds, {"seq": 6, "n": 4})
    for got, want in zip(steps, ref.run(feeds).values()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    feeds = _feeds(graph, 0, 4)  # (ONNX Runtime's zero states, as the reference)
    got, want = sess.run(feeds), ref.run(feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_recurrent_layers_match_onnxruntime(op: str) -> None:
    from metadef.testing.onnx_cases import one_node_model
    hidden, size = 32, GATES[op] * 32
    x = RNG.standard_normal((12, 5, 20)).astype(np.float32)
    consts = {"w": (RNG.standard_normal((2, size, 20)) * 0.3).astype(np.float32),
              "r": (RNG.standard_normal((2, size, hidden)) * 0.3).astype(np.float32),
              "b": RNG.standard_normal((2, 2 * size)).astype(np.float32)}
    extra = {"linear_before_reset": 1} if op == "GRU" else {}
    model = one_node_model(op, {"x": x}, consts, ["x", "w", "r", "b"], n_out=2, opset=14, hidden_size=hidden,
                           direction="bidirectional", **extra)
    sess = md.compile(md.import_onnx(model), target="x86", cache=False)
    assert sess.executable.plan[0].kind == "native"
    got = sess.run({"x": x})
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got["out0"], theirs[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["out1"], theirs[1], rtol=1e-4, atol=1e-5)


def test_only_the_last_state_wanted() -> None:
    """An LSTM whose Y nobody reads (an encoder's last state) still runs natively."""
    g = GraphBuilder("enc")
    x = g.input("x", parse_type("f32[seq,n,6]"))
    w, r = (g.const(k, (RNG.standard_normal((1, 40, s)) * 0.3).astype(np.float32)) for k, s in (("w", 6), ("r", 10)))
    _, h = g.node("LSTM", [x, w, r], {"hidden_size": 10}, outputs=["y", "h"])
    g.output(h)
    graph = g.build()
    feeds = {"x": RNG.standard_normal((9, 2, 6)).astype(np.float32)}
    sess = md.compile(graph, target="x86", cache=False)
    assert sess.executable.plan[0].kind == "native"
    np.testing.assert_allclose(sess.run(feeds)["h"], md.compile(graph, target="reference").run(feeds)["h"],
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("ragged", [False, True])
def test_lstm_peepholes_run_their_own_cell(ragged: bool) -> None:
    """LSTM's peepholes ``P`` (i, o, f) through ``md_lstm_peephole_cell``, with ragged sequences
    too, in both directions: the reference's answers."""
    hidden = 7
    g = GraphBuilder("peep")
    x = g.input("x", parse_type("f32[seq,n,3]"))
    w, r = (g.const(k, (RNG.standard_normal((2, 4 * hidden, s)) * 0.4).astype(np.float32)) for k, s in (("w", 3),
                                                                                                     ("r", hidden)))
    p = g.const("p", RNG.standard_normal((2, 3 * hidden)).astype(np.float32))
    lens = g.input("lens", parse_type("i32[n]")) if ragged else None
    outs = g.node("LSTM", [x, w, r, None, lens, None, None, p], {"hidden_size": hidden, "direction": "bidirectional"},
                  outputs=["y", "y_h", "y_c"])
    for v in outs:
        g.output(v)
    graph = g.build()
    sess, ref = md.compile(graph, target="x86", cache=False), md.compile(graph, target="reference")
    assert sess.executable.plan[0].reason == "LSTM: md_gemm products and md_lstm_peephole_cell steps (our kernels)"
    feeds = _feeds(graph, 6, 4)
    if ragged:
        feeds["lens"] = np.array([6, 0, 3, 1], np.int32)
    got, want = sess.run(feeds), ref.run(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize(("op", "attrs", "why"), [
    ("LSTM", {"clip": 1.0}, "LSTM with clip"),
    ("LSTM", {"input_forget": 1}, "LSTM with input_forget"),
    ("RNN", {"activations": ["Relu"]}, "RNN with activations Relu (only the defaults run natively: Tanh)"),
])
def test_other_recurrent_layers_run_their_reference_and_say_why(op: str, attrs: dict, why: str) -> None:
    graph = _graph(op, "forward", 0, False, 6, **attrs)
    sess = md.compile(graph, target="x86", cache=False)
    assert sess.executable.plan[0].fallback and why in sess.executable.plan[0].reason
    feeds = _feeds(graph, 4, 2)
    got, want = sess.run(feeds), md.compile(graph, target="reference").run(feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize("op", ["LSTM", "GRU", "GRU0", "RNN"])
@pytest.mark.parametrize(("direction", "layout"), [("forward", 0), ("reverse", 1), ("bidirectional", 0)])
def test_ragged_sequences_keep_each_rows_last_state(op: str, direction: str, layout: int) -> None:
    """``sequence_lens``: a row past its end keeps its state (and LSTM's cell) and gets zeros in
    Y; a row of length 0 ends in zero states; the reverse direction starts at each row's end."""
    dirs, hidden = (2 if direction == "bidirectional" else 1), 9
    size = GATES[op.rstrip("0")] * hidden
    g = GraphBuilder("ragged")
    x = g.input("x", parse_type(f"f32[{'n,seq' if layout else 'seq,n'},3]"))
    lens, h0 = g.input("lens", parse_type("i32[n]")), g.input("h0", parse_type(
        f"f32[{'n,' + str(dirs) if layout else str(dirs) + ',n'},{hidden}]"))
    w, r = (g.const(k, (RNG.standard_normal((dirs, size, s)) * 0.4).astype(np.float32)) for k, s in (("w", 3),
                                                                                                   ("r", hidden)))
    attrs = {"hidden_size": hidden, "direction": direction, "layout": layout,
             **({"linear_before_reset": int(op == "GRU")} if op.startswith("GRU") else {})}
    outs = g.node(op.rstrip("0"), [x, w, r, None, lens, h0], attrs,
                  outputs=["y", "y_h", "y_c"][:3 if op == "LSTM" else 2])
    for v in outs:
        g.output(v)
    graph = g.build()
    sess, ref = md.compile(graph, target="x86", cache=False), md.compile(graph, target="reference")
    assert sess.executable.plan[0].reason.endswith("(our kernels)")
    for threads_sess in (sess, md.compile(graph, target="x86", cache=False, threads=2)):
        for seq in (6, 1):
            feeds = _feeds(graph, seq, 5)
            feeds["lens"] = np.array([seq, 0, max(seq - 2, 0), 1, seq], np.int32)
            got, want = threads_sess.run(feeds), ref.run(feeds)
            for name in want:
                np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)
    feeds = _feeds(graph, 6, 4)
    feeds["lens"] = np.array([6, 0, 4, 1], np.int32)
    steps = sess.executable.run_steps(feeds, {"seq": 6, "n": 4})  # (node by node: the same calls from Python)
    for got, want in zip(steps, ref.run(feeds).values()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_weights_fed_at_run_time_go_through_sgemm(op: str) -> None:
    """W, R and B as graph inputs (ONNX's node tests feed them): OpenBLAS reads them in place."""
    hidden, size = 7, GATES[op] * 7
    g = GraphBuilder("fed")
    x = g.input("x", parse_type("f32[seq,n,3]"))
    w, r = g.input("w", parse_type(f"f32[2,{size},3]")), g.input("r", parse_type(f"f32[2,{size},{hidden}]"))
    b = g.input("b", parse_type(f"f32[2,{2 * size}]"))
    outs = g.node(op, [x, w, r, b], {"hidden_size": hidden, "direction": "bidirectional"}, outputs=["y", "y_h"])
    for v in outs:
        g.output(v)
    graph = g.build()
    sess = md.compile(graph, target="x86", cache=False)
    assert sess.executable.plan[0].reason == f"{op}: sgemm products and md_{op.lower()}_cell steps (our kernels)"
    feeds = _feeds(graph, 5, 3)
    got, want = sess.run(feeds), md.compile(graph, target="reference").run(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)
