"""Our products against float64 numpy and the reference backend: ``md_gemm`` (constant
weights packed in panels; bounds, a residual, batches with strided rows, a padded row stride)
and ``md_bmm`` (attention's batched products), called directly on random shapes, and graphs
whose products they run."""

from __future__ import annotations

import math

import numpy as np
import pytest

import metadef as md
from metadef.codegen.native_bmm import bmm_dims
from metadef.codegen.native_gemm import gemm_dims, gemm_lda, pack_gemm_weights
from metadef.ir import GraphBuilder
from metadef.shape import parse_type
from tests.backends.x86.test_x86_own_kernels import _call, _guarded

pytestmark = pytest.mark.jit
RNG = np.random.default_rng(11)


@pytest.mark.parametrize(("m", "n", "k", "bounds", "tasks"), [
    (8, 512, 78, (0.0, math.inf), 1),
    (1, 40, 33, (-math.inf, math.inf), 1),
    (7, 10, 25, (-1.0, 1.0), 1),
    (13, 33, 5, (0.0, 6.0), 3),
    (6, 16, 1, (-math.inf, math.inf), 2),
    (27, 40, 131, (-math.inf, math.inf), 1),  # 12 + 12 + 2 + 1 rows (AVX-512) or 4 x 6 + 2 + 1
    (23, 17, 9, (0.0, math.inf), 2),  # 12 + 8 + 2 + 1
    (16, 40, 19, (-math.inf, math.inf), 2),  # 8 + 8 (Winograd's 16 tiles), not 12 + 4
    (19, 33, 7, (0.0, math.inf), 1),  # 8 + 8 + 2 + 1
    (20, 33, 7, (-math.inf, math.inf), 1),  # 12 + 8
    (128, 48, 64, (-math.inf, math.inf), 1),  # BERT's rows: 10 x 12 + 8
    (13, 70, 20, (-1.0, 1.0), 2),  # a last panel of 6 (AVX-512: 32 + 32 + 6) or 6 (16 x 4 + 6) columns
])
def test_gemm_matches_float64(m: int, n: int, k: int, bounds: tuple[float, float], tasks: int) -> None:
    x = RNG.standard_normal((m, k), dtype=np.float32)
    w = RNG.standard_normal((k, n), dtype=np.float32)
    packed = pack_gemm_weights(w)
    bias = np.zeros(packed.shape[0] * packed.shape[2], np.float32)
    bias[:n] = RNG.standard_normal(n, dtype=np.float32)
    y = np.full((m, n), np.nan, np.float32)
    for t in range(tasks):
        _call("md_gemm", [x, packed, bias, y], gemm_dims(m, n, k, lo=bounds[0], hi=bounds[1], task=t, tasks=tasks))
    want = np.clip(x.astype(np.float64) @ w + bias[:n], *bounds)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("m", "n", "tasks"), [(27, 40, 1), (13, 70, 2), (128, 64, 2), (1, 6, 1)])
def test_gemm_adds_a_residual_and_writes_no_column_past_its_rows(m: int, n: int, tasks: int) -> None:
    """A residual added before the bounds; a last panel narrower than the tile (40 = 32 + 8,
    70 = 2 x 32 + 6) goes through the stack: the output ends at a guard page."""
    k, bounds = 33, (-1.0, 1.5)
    x = RNG.standard_normal((m, k), dtype=np.float32)
    w = RNG.standard_normal((k, n), dtype=np.float32)
    packed = pack_gemm_weights(w)
    bias = np.zeros(packed.shape[0] * packed.shape[2], np.float32)
    bias[:n] = RNG.standard_normal(n, dtype=np.float32)
    res, release_res = _guarded((m, n), at_end=True)
    res[...] = RNG.standard_normal((m, n), dtype=np.float32)
    y, release_y = _guarded((m, n), at_end=True)
    try:
        y[...] = np.nan
        for t in range(tasks):
            _call("md_gemm", [x, packed, bias, y, res],
                  gemm_dims(m, n, k, lo=bounds[0], hi=bounds[1], task=t, tasks=tasks, residual=True))
        want = np.clip(x.astype(np.float64) @ w + bias[:n] + res, *bounds)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    finally:
        release_res()
        release_y()


@pytest.mark.parametrize(("batch", "m", "n", "k", "tasks"), [(3, 27, 40, 33, 1), (2, 13, 70, 20, 3), (4, 1, 6, 5, 2)])
def test_gemm_batched_with_strided_rows(batch: int, m: int, n: int, k: int, tasks: int) -> None:
    """``batch`` products with the same weights (a pointwise conv's images, pixel-major): each
    ``x`` ``xs`` floats after the last, each output and residual ``ys``, their rows ``lda`` and
    ``ldy`` apart; the padding between rows is neither read nor written."""
    lda, ldy, bounds = k + 3, n + 5, (0.0, math.inf)
    x = np.full((batch, m, lda), np.nan, np.float32)
    x[:, :, :k] = RNG.standard_normal((batch, m, k), dtype=np.float32)
    w = RNG.standard_normal((k, n), dtype=np.float32)
    packed = pack_gemm_weights(w)
    bias = np.zeros(packed.shape[0] * packed.shape[2], np.float32)
    bias[:n] = RNG.standard_normal(n, dtype=np.float32)
    res = np.full((batch, m, ldy), np.nan, np.float32)
    res[:, :, :n] = RNG.standard_normal((batch, m, n), dtype=np.float32)
    y = np.full((batch, m, ldy), np.nan, np.float32)
    for t in range(tasks):
        _call("md_gemm", [x, packed, bias, y, res], gemm_dims(m, n, k, lo=bounds[0], hi=bounds[1], task=t, tasks=tasks,
                                                              lda=lda, residual=True, ldy=ldy, batch=batch,
                                                              xs=m * lda, ys=m * ldy))
    want = np.clip(x[:, :, :k].astype(np.float64) @ w + bias[:n] + res[:, :, :n], *bounds)
    np.testing.assert_allclose(y[:, :, :n], want, rtol=1e-5, atol=1e-5)
    assert np.isnan(y[:, :, n:]).all()


def test_a_product_with_a_skip_connection_adds_it_in_its_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    """``MatMul + bias + residual`` (a transformer's output projection) is one ``md_gemm`` call
    with the residual added before the store: no epilogue pass."""
    from metadef.backends.x86 import gemm
    monkeypatch.setattr(gemm, "PREFER", gemm.OWN)
    g = GraphBuilder("skip")
    x = g.input("x", parse_type("f32[n,s,64]"))
    r = g.input("r", parse_type("f32[n,s,40]"))
    h, = g.node("MatMul", [x, g.const("w", RNG.standard_normal((64, 40), dtype=np.float32) / 8)])
    h, = g.node("Add", [h, g.const("b", RNG.standard_normal(40, dtype=np.float32))])
    y, = g.node("Add", [h, r])
    g.output(y)
    graph = md.optimize(g.build(), level="aggressive")
    exe, ref = md.compile(graph, target="x86", cache=False), md.compile(graph, target="reference")
    for n, s in ((1, 7), (3, 16)):
        feeds = {"x": RNG.standard_normal((n, s, 64), dtype=np.float32),
                 "r": RNG.standard_normal((n, s, 40), dtype=np.float32)}
        got, want = exe.run(feeds), ref.run(feeds)
        np.testing.assert_allclose(got[graph.outputs[0].name], want[graph.outputs[0].name], rtol=1e-4, atol=1e-4)
        kinds = exe.executable.programs.bound({"n": n, "s": s}).call_kinds
        assert kinds == {"gemm own kernel + epilogue": 1}, kinds


@pytest.mark.parametrize("tasks", [1, 2])
def test_gemm_reads_rows_at_a_padded_stride(tasks: int) -> None:
    m, n, k = 25, 40, 1024
    lda = gemm_lda(k)
    assert lda > k  # k a multiple of 1024: one more cache line a row
    x = RNG.standard_normal((m, k), dtype=np.float32)
    rows = np.full((m, lda), np.nan, np.float32)  # the padding is never read
    rows[:, :k] = x
    w = RNG.standard_normal((k, n), dtype=np.float32)
    packed = pack_gemm_weights(w)
    bias = np.zeros(packed.shape[0] * packed.shape[2], np.float32)
    y = np.full((m, n), np.nan, np.float32)
    for t in range(tasks):
        _call("md_gemm", [rows, packed, bias, y], gemm_dims(m, n, k, task=t, tasks=tasks, lda=lda))
    np.testing.assert_allclose(y, x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)


def test_a_product_of_depth_1024_copies_its_rows_to_the_padded_stride(monkeypatch: pytest.MonkeyPatch) -> None:
    from metadef.backends.x86 import gemm
    monkeypatch.setattr(gemm, "PREFER", gemm.OWN)
    g = GraphBuilder("deep")
    x = g.input("x", parse_type("f32[n,1024]"))
    h, = g.node("MatMul", [x, g.const("w", RNG.standard_normal((1024, 48), dtype=np.float32) / 32)])
    h, = g.node("Add", [h, g.const("b", RNG.standard_normal(48, dtype=np.float32))])
    y, = g.node("Relu", [h])
    g.output(y)
    graph = md.optimize(g.build(), level="aggressive")
    exe, ref = md.compile(graph, target="x86", threads=2), md.compile(graph, target="reference")
    for batch in (1, 13, 40):
        feeds = {"x": RNG.standard_normal((batch, 1024), dtype=np.float32)}
        np.testing.assert_allclose(exe.run(feeds)[y.name], ref.run(feeds)[y.name], rtol=1e-4, atol=1e-4)
    kinds = exe.executable.programs.bound({"n": 13}).call_kinds
    assert kinds["gemm rows to a padded stride"] == 1 and kinds["gemm own kernel + epilogue"] == 1, kinds


@pytest.mark.parametrize(("batch", "m", "n", "k", "trans_b", "shared_b", "tasks"), [
    (3, 13, 70, 9, False, False, 1),  # a last panel of 6 columns, rows 12 + 1
    (2, 5, 33, 7, True, False, 2),  # k not a multiple of 8: the transposed pack's last steps
    (4, 27, 64, 24, True, True, 3),  # one b for every item (stride 0)
    (1, 1, 1, 1, False, False, 1),
])
def test_bmm_matches_float64(batch: int, m: int, n: int, k: int, trans_b: bool, shared_b: bool, tasks: int) -> None:
    a = RNG.standard_normal((batch, m, k), dtype=np.float32)
    b = RNG.standard_normal((1 if shared_b else batch, *((n, k) if trans_b else (k, n))), dtype=np.float32)
    flat = np.full(batch * m * n + 40, np.nan, np.float32)  # 40 floats more: they must stay untouched
    y = flat[:batch * m * n].reshape(batch, m, n)
    for t in range(tasks):
        _call("md_bmm", [a, b, y], bmm_dims(batch, m, n, k, trans_b=trans_b, alpha=0.5,
                                            strides=(m * k, 0 if shared_b else n * k, m * n), task=t, tasks=tasks))
    bt = b.transpose(0, 2, 1) if trans_b else b
    np.testing.assert_allclose(y, 0.5 * (a.astype(np.float64) @ bt), rtol=1e-5, atol=1e-5)
    assert np.isnan(flat[batch * m * n:]).all()


@pytest.mark.parametrize("shape", [(768, 3072), (3, 20), (5, 37), (7, 16), (4, 9), (6, 70)])
@pytest.mark.parametrize("layout", ["c", "fortran", "transposed view", "column slice"])
@pytest.mark.parametrize("width", [16, 32])
def test_gemm_weights_pack_into_zero_padded_panels(shape: tuple[int, int], layout: str, width: int) -> None:
    k, n = shape
    base = RNG.standard_normal((k, n + 3), dtype=np.float32)
    w = {"c": np.ascontiguousarray(base[:, :n]), "fortran": np.asfortranarray(base[:, :n]),
         "transposed view": np.ascontiguousarray(base[:, :n].T).T, "column slice": base[:, :n]}[layout]
    panels = -(-n // width)
    want = np.zeros((panels, k, width), np.float32)
    for q in range(panels):
        block = w[:, q * width:(q + 1) * width]
        want[q, :, :block.shape[1]] = block
    np.testing.assert_array_equal(pack_gemm_weights(w, width), want)


def _mlp() -> md.Graph:
    """Gemm (transB) + Relu; MatMul + Add(bias) + Clip; a plain Gemm with a [1, n] C."""
    g = GraphBuilder("mlp")
    x = g.input("x", parse_type("f32[n,20]"))
    h, = g.node("Gemm", [x, g.const("w1", RNG.standard_normal((24, 20), dtype=np.float32)),
                         g.const("b1", RNG.standard_normal(24, dtype=np.float32))], {"transB": 1})
    h, = g.node("Relu", [h])
    h, = g.node("MatMul", [h, g.const("w2", RNG.standard_normal((24, 17), dtype=np.float32))])
    h, = g.node("Add", [h, g.const("b2", RNG.standard_normal(17, dtype=np.float32))])
    h, = g.node("Clip", [h, g.const("lo", np.array(0.0, np.float32)), g.const("hi", np.array(6.0, np.float32))])
    y, = g.node("Gemm", [h, g.const("w3", RNG.standard_normal((17, 5), dtype=np.float32)),
                         g.const("b3", RNG.standard_normal((1, 5), dtype=np.float32))])
    g.output(y)
    return g.build()


@pytest.mark.parametrize("prefer", ["own micro-kernel, epilogue fused", "sgemm"])
def test_products_run_our_gemm(prefer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from metadef.backends.x86 import gemm
    monkeypatch.setattr(gemm, "PREFER", prefer)
    graph = md.optimize(_mlp(), level="aggressive")
    exe, ref = md.compile(graph, target="x86"), md.compile(graph, target="reference")
    for batch in (1, 8, 11):
        feeds = {"x": RNG.standard_normal((batch, 20), dtype=np.float32)}
        got, want = exe.run(feeds), ref.run(feeds)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
    kinds = exe.executable.programs.bound({"n": 8}).call_kinds
    if prefer == gemm.OWN:
        assert kinds["gemm own kernel + epilogue"] == 3 and "epilogue" not in kinds, kinds
    else:  # a Gemm's C is written into its output before its sgemm; a bounded group's epilogue follows
        assert not any("own kernel" in k for k in kinds), kinds
        assert kinds == {"sgemm + bias": 2, "sgemm": 1, "epilogue": 2}, kinds


def test_a_product_that_sgemm_won_before_packs_no_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decision already made (in this process, or stored in the compile cache) is taken
    before the weights are packed: where sgemm won, no packed copy is made."""
    from metadef.backends.x86 import gemm, native
    packs: list[tuple[int, ...]] = []
    monkeypatch.setattr(gemm, "pack_gemm_weights", lambda w: packs.append(w.shape) or pack_gemm_weights(w))
    monkeypatch.setattr(native, "_CONV_CHOICES", {})
    for rows, winner in ((4, gemm.BLAS), (8, gemm.OWN)):
        native._CONV_CHOICES[gemm._choice_key(rows, 96, 64, (-math.inf, math.inf))] = (winner, "set by the test")
    g = GraphBuilder("product")
    y, = g.node("MatMul", [g.input("x", parse_type("f32[n,64]")),
                           g.const("w", RNG.standard_normal((64, 96), dtype=np.float32))])
    y, = g.node("Add", [y, g.const("b", RNG.standard_normal(96, dtype=np.float32))])
    g.output(y)
    graph = md.optimize(g.build(), level="aggressive")
    exe, ref = md.compile(graph, target="x86"), md.compile(graph, target="reference")
    for rows, packed in ((4, []), (8, [(64, 96)])):
        feeds = {"x": RNG.standard_normal((rows, 64), dtype=np.float32)}
        got, want = exe.run(feeds), ref.run(feeds)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
        assert packs == packed, (rows, packs)
        kinds = exe.executable.programs.bound({"n": rows}).call_kinds
        assert ("gemm own kernel + epilogue" in kinds) == (rows == 8), kinds


@pytest.mark.parametrize("winner", ["own micro-kernel, epilogue fused", "sgemm", None])
def test_a_tiny_product_races_and_takes_its_bias_in_one_call(winner: str | None, monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """However small, a product races OpenBLAS (an MLP's last layer, 1 x 16 -> 5 here): either
    winner is one call with its bias (``sgemv`` with the bias, or our kernel), not an
    ``sgemm`` and a pass for the bias after it. (None: the race decides.)"""
    from metadef.backends.x86 import gemm, native
    monkeypatch.setattr(native, "_CONV_CHOICES", {})
    if winner is not None:
        native._CONV_CHOICES[gemm._choice_key(1, 5, 16, (-math.inf, math.inf))] = (winner, "set by the test")
    g = GraphBuilder("tiny")
    y, = g.node("Gemm", [g.input("x", parse_type("f32[n,16]")),
                         g.const("w", RNG.standard_normal((5, 16), dtype=np.float32)),
                         g.const("b", RNG.standard_normal(5, dtype=np.float32))], {"transB": 1})
    g.output(y)
    graph = md.optimize(g.build(), level="aggressive")
    exe, ref = md.compile(graph, target="x86"), md.compile(graph, target="reference")
    feeds = {"x": RNG.standard_normal((1, 16), dtype=np.float32)}
    np.testing.assert_allclose(exe.run(feeds)[graph.outputs[0].name], ref.run(feeds)[graph.outputs[0].name],
                               rtol=1e-5, atol=1e-5)
    assert gemm._choice_key(1, 5, 16, (-math.inf, math.inf)) in native._CONV_CHOICES
    kinds = exe.executable.programs.bound({"n": 1}).call_kinds
    assert sum(kinds.values()) == 1 and set(kinds) <= {"gemm own kernel + epilogue", "sgemm + bias"}, kinds
