"""x86 backend: contraction kernels vs the reference backend, the plan, fallbacks, bad inputs.

None of these needs LLVM: without ``metadef.codegen`` the generated kernels are replaced by
reference kernels (with a recorded reason), and these tests check exactly that path too.
"""

from __future__ import annotations

import ctypes
import logging

import numpy as np
import pytest

import metadef as md
from metadef.backends.reference import ReferenceBackend
from metadef.backends.x86 import X86Backend
from metadef.backends.x86.contractions import blas_info, blas_threads, conv_variant, set_blas_threads
from metadef.backends.x86.mapping import split_epilogue
from metadef.codegen.native import ENTRY, native_function
from metadef.core.errors import BackendError, InputError
from metadef.ir import Graph, GraphBuilder, Value
from metadef.runtime.session import Session
from metadef.shape import parse_type

RNG = np.random.default_rng(0)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape, dtype=np.float32)


def _session(graph: md.Graph, **options: object) -> Session:
    return Session(graph, X86Backend().compile(graph, **options), "x86")


def _check_vs_reference(graph: md.Graph, feeds: dict[str, np.ndarray], rtol: float = 1e-4) -> Session:
    sess = _session(graph)
    want = Session(graph, ReferenceBackend().compile(graph), "reference").run(feeds)
    got = sess.run(feeds)
    for name, w in want.items():
        assert got[name].shape == w.shape and got[name].dtype == w.dtype, name
        np.testing.assert_allclose(got[name], w, rtol=rtol, atol=1e-4)
    return sess


def _conv_graph(x_type: str, w_shape: tuple[int, ...], attrs: dict, bias: bool, relu: bool = False) -> md.Graph:
    b = GraphBuilder("conv")
    x = b.input("x", parse_type(x_type))
    inputs = [x, b.const("w", _rand(*w_shape))]
    if bias:
        inputs.append(b.const("b", _rand(w_shape[0])))
    y, = b.node("Conv", inputs, attrs, name="/conv")
    if relu:
        y, = b.node("Relu", [y], name="/relu")
    b.output(y)
    return b.build()


CONV_CASES = {
    "plain_3x3_padded": ("f32[n,3,9,9]", (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    "pointwise": ("f32[n,8,5,5]", (6, 8, 1, 1), {}),
    "pointwise_strided": ("f32[n,8,6,6]", (6, 8, 1, 1), {"strides": [2, 2]}),
    "grouped": ("f32[n,8,7,7]", (6, 4, 3, 3), {"group": 2, "pads": [1, 0, 2, 1]}),
    "depthwise": ("f32[n,6,10,10]", (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),
    "depthwise_large_loop": ("f32[n,2,96,96]", (2, 1, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    "depthwise_multiplier": ("f32[n,3,8,8]", (6, 1, 3, 3), {"group": 3}),
    "depthwise_strided": ("f32[n,4,11,11]", (4, 1, 3, 3), {"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "strided": ("f32[n,3,11,11]", (5, 3, 3, 3), {"strides": [2, 3]}),
    "dilated": ("f32[n,3,12,12]", (4, 3, 3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    "same_upper": ("f32[n,3,10,10]", (4, 3, 4, 4), {"auto_pad": "SAME_UPPER", "strides": [3, 3]}),
    "conv1d": ("f32[n,4,20]", (5, 4, 5), {"pads": [2, 1], "strides": [2]}),
    "conv3d": ("f32[n,2,5,6,7]", (3, 2, 2, 3, 3), {"pads": [1, 0, 1, 0, 1, 1], "dilations": [1, 1, 2]}),
}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_variants_match_reference(case: str, bias: bool) -> None:
    x_type, w_shape, attrs = CONV_CASES[case]
    g = _conv_graph(x_type, w_shape, attrs, bias)
    sess = _check_vs_reference(g, {"x": _rand(2, *[int(d) for d in x_type[4:-1].split(",")[1:]])})
    assert sess.executable.plan[0].kind == "blas"


def test_conv_variant_choice_is_recorded() -> None:
    assert conv_variant({"group": 1}, (1, 8, 5, 5), (6, 8, 1, 1)).startswith("1x1")
    assert conv_variant({"group": 1, "pads": [1] * 4}, (1, 3, 9, 9), (4, 3, 3, 3)) == "im2col + one sgemm per group"
    assert conv_variant({"group": 2}, (1, 2, 96, 96), (2, 1, 3, 3)).startswith("depthwise loop")
    g = _conv_graph("f32[n,6,10,10]", (6, 1, 3, 3), {"group": 6}, True)
    assert X86Backend().compile(g).plan[0].reason == "depthwise 3x3: md_depthwise (our kernel)"


def test_fused_conv_group_runs_blas_then_epilogue() -> None:
    g = md.optimize(_conv_graph("f32[n,3,9,9]", (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}, True, relu=True),
                    level="aggressive")
    assert [n.op for n in g.nodes] == ["Fused"]
    sess = _check_vs_reference(g, {"x": _rand(3, 3, 9, 9)})
    assert sess.executable.plan[0].kind.startswith("blas+")
    split = split_epilogue(g.nodes[0])
    assert split.anchor.op == "Conv" and [n.op for n in split.body.nodes] == ["Relu"]
    assert [n.op for n in g.nodes[0].attrs["body"].nodes] == ["Conv", "Relu"]  # body untouched


@pytest.mark.parametrize("attrs,a,b,c", [
    ({}, (5, 4), (4, 3), (3,)),
    ({"transA": 1, "alpha": 0.5}, (4, 5), (4, 3), (5, 3)),
    ({"transB": 1, "beta": 2.0}, (5, 4), (3, 4), (1, 3)),
    ({"transA": 1, "transB": 1}, (4, 5), (3, 4), None),
])
def test_gemm_matches_reference(attrs: dict, a: tuple, b: tuple, c: tuple | None) -> None:
    bld = GraphBuilder("gemm")
    x = bld.input("a", parse_type(f"f32[{a[0]},{a[1]}]"))
    ins = [x, bld.const("b", _rand(*b))] + ([bld.const("c", _rand(*c))] if c else [])
    y, = bld.node("Gemm", ins, attrs, name="/gemm")
    bld.output(y)
    _check_vs_reference(bld.build(), {"a": _rand(*a)})


@pytest.mark.parametrize("a,b", [("f32[n,5]", "f32[5]"), ("f32[5]", "f32[5,n]"),
                                 ("f32[n,2,3,4]", "f32[4,6]"), ("f32[n,1,3,4]", "f32[2,4,5]")])
def test_matmul_shapes_match_reference(a: str, b: str) -> None:
    bld = GraphBuilder("mm")
    x, w = bld.input("a", parse_type(a)), bld.input("b", parse_type(b))
    y, = bld.node("MatMul", [x, w], name="/mm")
    bld.output(y)
    g = bld.build()
    shapes = {"f32[n,5]": (3, 5), "f32[5]": (5,), "f32[5,n]": (5, 3), "f32[n,2,3,4]": (3, 2, 3, 4),
              "f32[4,6]": (4, 6), "f32[n,1,3,4]": (3, 1, 3, 4), "f32[2,4,5]": (2, 4, 5)}
    _check_vs_reference(g, {"a": _rand(*shapes[a]), "b": _rand(*shapes[b])})


def test_einsum_and_attention_match_reference() -> None:
    bld = GraphBuilder("ea")
    q = bld.input("q", parse_type("f32[b,2,s,4]"))
    k = bld.input("k", parse_type("f32[b,2,s,4]"))
    v = bld.input("v", parse_type("f32[b,2,s,3]"))
    mask = bld.input("mask", parse_type("f32[b,1,1,s]"))
    y, = bld.node("Attention", [q, k, v, mask], {"scale": 0.5}, name="/attn", domain="ai.metadef")
    e, = bld.node("Einsum", [q, k], {"equation": "bhsd,bhtd->bhst"}, name="/ein")
    bld.output(y, e)
    g = bld.build()
    feeds = {"q": _rand(2, 2, 5, 4), "k": _rand(2, 2, 5, 4), "v": _rand(2, 2, 5, 3),
             "mask": np.where(RNG.random((2, 1, 1, 5)) < 0.3, -1e4, 0).astype(np.float32)}
    sess = _check_vs_reference(g, feeds)
    kinds = {p.node: p.kind for p in sess.executable.plan}
    assert kinds == {"/attn": "blas", "/ein": "blas"}
    # the Python kernel and the native lowering share one softmax kernel: the plan records it once
    assert len({p.node: p.kernels for p in sess.executable.plan}["/attn"]) == 1


def test_fallbacks_are_listed_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    bld = GraphBuilder("fb")
    x = bld.input("x", parse_type("f32[n,4]"))
    s, = bld.node("CumSum", [x, bld.const("a", np.array(1))], name="/cumsum")
    bld.output(s)
    with caplog.at_level(logging.INFO, logger="metadef.backends.x86"):
        exe = X86Backend().compile(bld.build())
    assert [(f.node, f.kind) for f in exe.fallbacks] == [("/cumsum", "reference")]
    assert "opaque op CumSum" in exe.fallbacks[0].reason
    assert "/cumsum" in caplog.text and "fall back" in caplog.text
    assert "fallbacks: 1" in exe.summary()


def test_mlp_plan_names_every_node_and_runs_any_batch() -> None:
    proto = md.zoo.build("mlp")
    g = md.optimize(md.import_onnx(proto), level="aggressive")
    sess = _session(g)
    assert [p.node for p in sess.executable.plan] == [n.name for n in g.nodes]
    assert all(p.reason for p in sess.executable.plan)
    for batch in (1, 3, 8):
        feeds = md.zoo.describe("mlp").example_inputs(batch=batch)
        want = Session(g, ReferenceBackend().compile(g), "reference").run(feeds)
        np.testing.assert_allclose(sess.run(feeds)["probs"], want["probs"], rtol=1e-4, atol=1e-6)


def test_bad_inputs_give_clear_errors_and_non_contiguous_works() -> None:
    g = md.optimize(md.import_onnx(md.zoo.build("mlp")), level="aggressive")
    sess = _session(g)
    x = md.zoo.describe("mlp").example_inputs(batch=3)["x"]
    with pytest.raises(InputError, match="dtype float64"):
        sess.run({"x": x.astype(np.float64)})
    with pytest.raises(InputError, match="'x' has shape"):
        sess.run({"x": x[0]})
    with pytest.raises(InputError, match="missing input"):
        sess.run({})
    wide = np.repeat(x, 2, axis=1)[:, ::2]  # a strided view
    assert not wide.flags.c_contiguous
    np.testing.assert_allclose(sess.run({"x": wide})["probs"], sess.run({"x": x})["probs"], rtol=1e-6)
    np.testing.assert_allclose(sess.run({"x": np.asfortranarray(x)})["probs"], sess.run({"x": x})["probs"],
                               rtol=1e-6)


def test_a_dim_breaking_a_constraint_is_refused() -> None:
    bld = GraphBuilder("c")
    x = bld.input("x", parse_type("f32[s,4]"))
    y, = bld.node("MatMul", [x, bld.const("w", _rand(4, 2))], name="/mm")
    bld.output(y)
    g = bld.build()
    g.env.constrain("s", hi=8)
    sess = _session(g)
    assert sess.run({"x": _rand(8, 4)})[g.outputs[0].name].shape == (8, 2)
    with pytest.raises(InputError, match="constraints"):
        sess.run({"x": _rand(9, 4)})
    with pytest.raises(InputError, match="'x' has shape"):
        sess.run({"x": _rand(3, 5)})  # the static dim 4


def test_kernel_errors_name_the_node() -> None:
    bld = GraphBuilder("e")
    x = bld.input("x", parse_type("f32[n,4]"))
    y, = bld.node("MatMul", [x, bld.const("w", _rand(4, 2))], name="/mm")
    bld.output(y)
    exe = X86Backend().compile(bld.build())
    with pytest.raises(BackendError, match="/mm"):
        exe.run({"x": _rand(3, 5)}, {"n": 3})  # bypassing the Session's checks


def test_threads_set_the_blas_thread_count() -> None:
    if blas_info().library is None:
        pytest.skip("numpy's BLAS is not a loaded OpenBLAS")
    before = blas_threads()
    try:
        exe = X86Backend().compile(md.import_onnx(md.zoo.build("mlp")), threads=1)
        assert exe.threads == 1 and blas_threads() == 1
    finally:
        set_blas_threads(before)
    with pytest.raises(BackendError, match="threads"):
        X86Backend().compile(md.import_onnx(md.zoo.build("mlp")), threads=0)
    with pytest.raises(BackendError, match="only threads"):
        X86Backend().compile(md.import_onnx(md.zoo.build("mlp")), arena=True)


@pytest.mark.parametrize("products", ["own micro-kernel (md_bmm)", "sgemm"])
@pytest.mark.parametrize("threads", [1, 2])
def test_attention_products_by_our_kernel_or_sgemm_match_reference(products: str, threads: int,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Attention's two products through md_bmm (each head's Kᵀ and V packed, the scale in the
    packing; a last panel narrower than the kernel's) or OpenBLAS, with a mask, on 1 and 2
    threads: the reference's answers and the chosen calls."""
    from metadef.backends.x86 import attention
    monkeypatch.setattr(attention, "attention_products", lambda *args: products)
    bld = GraphBuilder("attn")
    q = bld.input("q", parse_type("f32[b,3,s,20]"))
    k = bld.input("k", parse_type("f32[b,3,t,20]"))
    v = bld.input("v", parse_type("f32[b,3,t,9]"))
    mask = bld.input("mask", parse_type("f32[b,1,1,t]"))
    y, = bld.node("Attention", [q, k, v, mask], {"scale": 0.25}, name="/attn", domain="ai.metadef")
    bld.output(y)
    g = bld.build()
    sess = md.compile(g, target="x86", threads=threads, cache=False)
    ref = md.compile(g, target="reference")
    for b, s, t in ((2, 37, 41), (1, 5, 70)):
        feeds = {"q": _rand(b, 3, s, 20), "k": _rand(b, 3, t, 20), "v": _rand(b, 3, t, 9),
                 "mask": np.where(RNG.random((b, 1, 1, t)) < 0.3, -1e4, 0).astype(np.float32)}
        np.testing.assert_allclose(sess.run(feeds)[y.name],
                                   ref.run(feeds)[y.name], rtol=1e-4, atol=1e-5)
    kinds = sess.executable.programs.bound({"b": 1, "s": 5, "t": 70}).call_kinds
    own = products.startswith("own")
    scores = kinds["attention scores own kernel" if own else "attention scores"]
    assert scores >= 1 and kinds["attention values own kernel" if own else "attention values"] == scores
    assert kinds["attention softmax rows"] == scores  # (one each, or one each a sequence of heads)


def _attention_graph(types: list[str], mask_type: str | None, attrs: dict) -> tuple[Graph, Value]:
    """One ``ai.metadef::Attention`` of inputs q, k, v (and a mask of ``mask_type``)."""
    bld = GraphBuilder("attn")
    inputs = [bld.input(name, parse_type(t)) for name, t in zip("qkv", types)]
    inputs += [bld.input("mask", parse_type(mask_type))] if mask_type else []
    y, = bld.node("Attention", inputs, attrs, name="/attn", domain="ai.metadef")
    bld.output(y)
    return bld.build(), y


# (mask shape, whether md_softmax_rows walks it; else the generated softmax kernel broadcasts it)
_MASKS = [("f32[b,1,1,t]", True), ("f32[b,3,s,t]", True), ("f32[1,3,1,t]", True), ("f32[s,t]", True),
          ("f32[1,t]", True), ("f32[b,1,s,t]", True), ("f32[b,3,s,1]", False), (None, True)]


@pytest.mark.parametrize(("mask_type", "native"), _MASKS)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("chunk_bytes", [None, 1])
def test_attention_softmax_rows_take_every_mask_shape(mask_type: str | None, native: bool, threads: int,
                                                      chunk_bytes: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The softmax between attention's products runs as ``md_softmax_rows`` for masks whose
    broadcast reduces to its strides (and the generated kernel for the others): the reference's
    answers for each, on 1 and 2 threads, rows of 41 columns (two vectors and a tail of 9); in
    sequences of whole batch items (two threads) or of single heads (``chunk_bytes`` 1), each
    finding its rows of the mask."""
    from metadef.backends.x86 import attention
    if chunk_bytes is not None:
        monkeypatch.setattr(attention, "ATTENTION_CHUNK_BYTES", chunk_bytes)
    g, y = _attention_graph(["f32[b,3,s,8]", "f32[b,3,t,8]", "f32[b,3,t,5]"], mask_type, {"scale": 0.5})
    sess = md.compile(g, target="x86", threads=threads, cache=False)
    ref = md.compile(g, target="reference")
    b, s, t = 2, 7, 41
    feeds = {"q": _rand(b, 3, s, 8), "k": _rand(b, 3, t, 8), "v": _rand(b, 3, t, 5)}
    if mask_type:
        dims = {"b": b, "s": s, "t": t}
        shape = [dims.get(d) or int(d) for d in mask_type[4:-1].split(",")]
        # (masked by -30, not -1e4: a [b, 3, s, 1] mask adds its value to a whole row, and a score
        # plus -1e4 keeps ~1e-3 of its precision in float32, which either side rounds its own way)
        feeds["mask"] = np.where(RNG.random(shape) < 0.3, -30.0, RNG.standard_normal(shape)).astype(np.float32)
    np.testing.assert_allclose(sess.run(feeds)[y.name], ref.run(feeds)[y.name], rtol=1e-4, atol=1e-5)
    kinds = sess.executable.programs.bound({"b": b, "s": s, "t": t}).call_kinds
    sequences = 1 if not native else b * 3 if chunk_bytes else 2 if threads == 2 else 1
    assert kinds["attention softmax rows" if native else "attention softmax"] == sequences, kinds


@pytest.mark.parametrize("products", ["own micro-kernel (md_bmm)", "sgemm"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("chunk_bytes", [None, 1])
@pytest.mark.parametrize("mask_type", ["f32[b,1,1,t]", "f32[s,t]", "f32[b,3,s,1]", None])
def test_attention_with_heads_after_the_sequence_reads_and_writes_in_place(
        products: str, threads: int, chunk_bytes: int | None, mask_type: str | None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``layout="bshd"`` (Q, K, V, Y ``[b, s, h, d]``): both products read each head's rows
    ``h * d`` apart and write Y in place, through md_bmm or a batched sgemm per batch item, in
    one sequence or head by head (``chunk_bytes`` 1), with a mask the softmax rows walk or one
    the generated kernel broadcasts: the reference's answers, with no Transpose run."""
    from metadef.backends.x86 import attention
    monkeypatch.setattr(attention, "attention_products", lambda *args: products)
    if chunk_bytes is not None:
        monkeypatch.setattr(attention, "ATTENTION_CHUNK_BYTES", chunk_bytes)
    g, y = _attention_graph(["f32[b,s,3,20]", "f32[b,t,3,20]", "f32[b,t,3,9]"], mask_type,
                            {"scale": 0.25, "layout": "bshd"})
    sess = md.compile(g, target="x86", threads=threads, cache=False)
    ref = md.compile(g, target="reference")
    for b, s, t in ((2, 37, 41), (1, 5, 70)):
        feeds = {"q": _rand(b, s, 3, 20), "k": _rand(b, t, 3, 20), "v": _rand(b, t, 3, 9)}
        if mask_type:
            dims = {"b": b, "s": s, "t": t}
            shape = [dims.get(d) or int(d) for d in mask_type[4:-1].split(",")]
            feeds["mask"] = np.where(RNG.random(shape) < 0.3, -30.0, 0.0).astype(np.float32)
        np.testing.assert_allclose(sess.run(feeds)[y.name], ref.run(feeds)[y.name], rtol=1e-4, atol=1e-5)
    kinds = sess.executable.programs.bound({"b": 2, "s": 37, "t": 41}).call_kinds
    assert kinds["attention scores own kernel" if products.startswith("own") else "attention scores"] >= 1, kinds
    assert not any("Transpose" in kind for kind in kinds), kinds


def test_softmax_rows_match_numpy_with_nan_and_tasks() -> None:
    """``md_softmax_rows`` directly: a row with a NaN comes out all NaN (as numpy's), very
    negative scores give zeros, not NaN, and three tasks cover every row once."""
    from metadef.codegen.native_softmax import softmax_dims
    fn = ENTRY(native_function("md_softmax_rows"))
    s = (RNG.standard_normal((6, 5, 35)) * 8).astype(np.float32)
    s[1, 2, 17] = np.nan
    s[2, 0, :] = -1e30
    s[2, 0, 3] = 0.0
    mask = RNG.standard_normal((2, 1, 35)).astype(np.float32)  # (items 6 = 2 outer x 3 heads)
    p = np.full_like(s, 7.0)
    for task in range(3):
        dims = softmax_dims(6, 3, 5, 35, mask=(35, 0, 0), task=task, tasks=3)
        fn((ctypes.c_void_p * 3)(s.ctypes.data, mask.ctypes.data, p.ctypes.data), (ctypes.c_int64 * len(dims))(*dims))
    x = s.reshape(2, 3, 5, 35) + mask[:, None]
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(-1, keepdims=True))
        want = (e / e.sum(-1, keepdims=True)).reshape(6, 5, 35)
    np.testing.assert_allclose(p, want, rtol=2e-6, atol=1e-7)
    assert np.isnan(p[1, 2]).all() and not np.isnan(np.delete(p.reshape(30, 35), 7, axis=0)).any()
    assert p[2, 0, 3] == pytest.approx(1.0) and p[2, 0].sum() == pytest.approx(1.0)
