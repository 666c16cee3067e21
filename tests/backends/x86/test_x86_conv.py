"""x86 Conv kernels vs the reference backend: depthwise (generated and numpy paths), grouped,
strided, dilated, padded, 1-D/3-D, and the reuse of the padded-input buffer."""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np
import pytest

import metadef as md
from metadef.backends.x86 import X86Backend
from metadef.backends.x86.contractions import conv_kernel
from metadef.backends.x86.mapping import CODEGEN_MISSING
from metadef.ir import GraphBuilder
from metadef.shape import parse_type

RNG = np.random.default_rng(1)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape, dtype=np.float32)


def _graph(x_type: str, w_shape: tuple[int, ...], attrs: dict, bias: bool) -> md.Graph:
    b = GraphBuilder("conv")
    x = b.input("x", parse_type(x_type))
    inputs = [x, b.const("w", _rand(*w_shape))]
    if bias:
        inputs.append(b.const("b", _rand(w_shape[0])))
    y, = b.node("Conv", inputs, attrs, name="/conv")
    b.output(y)
    return b.build()


CASES = {
    "dw_s1_pad1": ("f32[n,16,12,12]", (16, 1, 3, 3), {"group": 16, "pads": [1, 1, 1, 1]}),
    "dw_s2_pad1": ("f32[n,16,13,13]", (16, 1, 3, 3), {"group": 16, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "dw_s2_asym": ("f32[n,8,12,12]", (8, 1, 3, 3), {"group": 8, "pads": [0, 0, 1, 1], "strides": [2, 2]}),
    "dw_dilated": ("f32[n,8,15,15]", (8, 1, 3, 3), {"group": 8, "pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    "dw_5x5_same": ("f32[n,8,10,10]", (8, 1, 5, 5), {"group": 8, "auto_pad": "SAME_UPPER"}),
    "dw_5x5_s2": ("f32[n,8,20,18]", (8, 1, 5, 5), {"group": 8, "pads": [2, 2, 2, 2], "strides": [2, 2]}),
    "dw_7x7": ("f32[n,4,14,14]", (4, 1, 7, 7), {"group": 4, "pads": [3, 3, 3, 3]}),
    "dw_nopad": ("f32[n,4,9,9]", (4, 1, 3, 3), {"group": 4}),
    "dw_large": ("f32[n,4,96,96]", (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),
    "dw_multiplier": ("f32[n,4,9,9]", (8, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),
    "dw_1d": ("f32[n,6,20]", (6, 1, 5), {"group": 6, "pads": [2, 2], "strides": [2]}),
    "dw_3d": ("f32[n,3,6,7,8]", (3, 1, 3, 3, 3), {"group": 3, "pads": [1] * 6}),
    "grouped": ("f32[n,8,9,9]", (6, 4, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    "strided_dilated": ("f32[n,3,17,17]", (4, 3, 3, 3), {"strides": [2, 2], "dilations": [2, 2], "pads": [2] * 4}),
    "pointwise_strided": ("f32[n,8,9,9]", (5, 8, 1, 1), {"strides": [2, 2]}),
    "conv3d": ("f32[n,2,5,6,7]", (3, 2, 2, 3, 3), {"pads": [1, 0, 1, 0, 1, 1]}),
}


def _feeds(x_type: str, batch: int) -> dict[str, np.ndarray]:
    dims = [int(d) for d in x_type[4:-1].split(",")[1:]]
    return {"x": _rand(batch, *dims)}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_conv_matches_reference(case: str, bias: bool) -> None:
    x_type, w_shape, attrs = CASES[case]
    g = _graph(x_type, w_shape, attrs, bias)
    ours = md.compile(g, target="x86")
    want = md.compile(g, target="reference")
    for batch in (1, 3):  # a new batch size: the same kernels
        feeds = _feeds(x_type, batch)
        got, ref = ours.run(feeds), want.run(feeds)
        for name, w in ref.items():
            assert got[name].shape == w.shape and got[name].dtype == w.dtype
            np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["dw_1d", "grouped", "dw_s1_pad1", "pointwise_strided"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_low_precision_convs_sum_in_float32_and_round_once(case: str, dtype: str) -> None:
    # numpy's float16 matmul and the per-tap depthwise loop round along the way; the reference,
    # ORT and ONNX's expected outputs take float32 products and sums, rounded once
    x_type, w_shape, attrs = CASES[case]
    low = np.dtype(ml_dtypes.bfloat16) if dtype == "bf16" else np.dtype(np.float16)
    b = GraphBuilder("conv")
    x = b.input("x", parse_type(dtype + x_type[3:]))
    y, = b.node("Conv", [x, b.const("w", (_rand(*w_shape) * 4).astype(low))], attrs, name="/conv")
    b.output(y)
    g = b.build()
    feeds = {"x": (_feeds(x_type, 2)["x"] * 4).astype(low)}
    (got,) = md.compile(g, target="x86").run(feeds).values()
    (want,) = md.compile(g, target="reference").run(feeds).values()
    assert got.dtype == low
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


@pytest.mark.skipif(CODEGEN_MISSING is not None, reason="needs metadef.codegen (llvmlite)")
def test_depthwise_runs_our_kernel_or_generated_and_multiplier_does_not() -> None:
    plan = X86Backend().compile(_graph(*CASES["dw_s2_pad1"], True)).plan[0]
    assert plan.reason == "depthwise 3x3: md_depthwise (our kernel)"
    # (auto_pad, not optimized: simplify's explicit_pads would give it md_depthwise5)
    plan = X86Backend().compile(_graph(*CASES["dw_5x5_same"], True)).plan[0]
    assert plan.reason == "depthwise: padded input + generated window-sum kernel"
    plan = X86Backend().compile(_graph(*CASES["dw_7x7"], True)).plan[0]
    assert plan.reason == "depthwise 7x7: md_depthwise7 (our kernel)"
    plan = X86Backend().compile(_graph(*CASES["dw_multiplier"], True)).plan[0]
    assert plan.reason.startswith("depthwise im2col")


@pytest.mark.skipif(CODEGEN_MISSING is not None, reason="needs metadef.codegen (llvmlite)")
@pytest.mark.parametrize("case", ["dw_s1_pad1", "dw_s2_pad1", "dw_s2_asym", "dw_nopad", "dw_large", "dw_5x5_s2",
                                  "dw_7x7"])
def test_depthwise_step_by_step_runs_the_programs_routine(case: str) -> None:
    """A 3x3 (5x5, 7x7) depthwise conv (with its Relu6) whose planes are known runs step by step (graphs
    whose shapes depend on values) through the routine its program calls, and compiles no
    kernel of its own for that path."""
    from metadef.codegen import compile_count
    x_type, w_shape, attrs = CASES[case]
    b = GraphBuilder("dw")
    x = b.input("x", parse_type(x_type))
    y, = b.node("Conv", [x, b.const("w", _rand(*w_shape)), b.const("b", _rand(w_shape[0]))], attrs, name="/conv")
    y, = b.node("Clip", [y, b.const("lo", np.array(0.0, np.float32)), b.const("hi", np.array(6.0, np.float32))])
    b.output(y)
    g = md.optimize(b.build(), level="aggressive")
    sess = md.compile(g, target="x86")
    before = compile_count()
    want = md.compile(g, target="reference")
    for batch in (1, 3):
        feeds = _feeds(x_type, batch)
        steps = sess.executable.run_steps(feeds, {"n": batch})
        for got, ref in zip(steps, want.run(feeds).values()):
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(sess.run(feeds)[g.outputs[0].name], steps[0], rtol=1e-6, atol=1e-6)
    assert compile_count() == before
    assert "md_depthwise" in sess.executable.plan[0].reason


def test_padded_buffer_is_reused_and_left_clean() -> None:
    x_type, w_shape, attrs = CASES["grouped"]
    w = _rand(*w_shape)
    conv = conv_kernel(attrs)
    for _ in range(2):  # the second call writes the interior of the first call's buffer
        x = _rand(2, 8, 9, 9)
        got = conv([x, w, None])
        b = GraphBuilder("conv")
        xv = b.input("x", parse_type(x_type))
        y, = b.node("Conv", [xv, b.const("w", w)], attrs)
        b.output(y)
        want = md.compile(b.build(), target="reference").run({"x": x})
        np.testing.assert_allclose(got, next(iter(want.values())), rtol=1e-4, atol=1e-4)


def test_conv_kernel_is_thread_safe() -> None:
    _, w_shape, attrs = CASES["dw_s1_pad1"]
    w = _rand(*w_shape)
    conv = conv_kernel(attrs)
    inputs = [_rand(1, 16, 12, 12) for _ in range(4)]
    want = [conv([x, w, None]) for x in inputs]
    got: list[np.ndarray | None] = [None] * 4
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(20):
                got[i] = conv([inputs[i], w, None])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for g_, w_ in zip(got, want):
        np.testing.assert_array_equal(g_, w_)


@pytest.mark.jit
@pytest.mark.skipif(CODEGEN_MISSING is not None, reason="needs metadef.codegen")
def test_epilogues_of_strided_convs_compile_when_the_image_size_is_symbolic() -> None:
    """A strided conv's output is floor((h - 1)/2) + 1 high: its fused Relu and residual Add see
    that size but no h. The epilogue kernel takes it as a size of its own (one compile for
    every image size), instead of falling back to numpy."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper
    weights = {"w": _rand(8, 8, 3, 3), "b": _rand(8), "w2": _rand(8, 8, 3, 3)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = md.compile(md.optimize(md.import_onnx(model), level="aggressive"), target="x86")
    assert [p.kind for p in sess.executable.plan] == ["blas+generated epilogue"] * 2
    oracle = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape in ((1, 8, 9, 7), (2, 8, 16, 16), (1, 8, 5, 12)):
        x = _rand(*shape)
        np.testing.assert_allclose(sess.run({"x": x})["y"], oracle.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
