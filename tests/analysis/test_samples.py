"""Separable graphs: a batch's outputs are its samples' outputs stacked, checked on the oracle.

Each graph that :func:`separable_symbol` calls separable along ``n`` is run on the reference
backend for a batch and for each of its samples alone, and the results must agree; the graphs
that mix samples (a reduction, a softmax or a gather over the batch, a transposed product, a
batch read as a value) must be refused.
"""

from __future__ import annotations

import numpy as np
import pytest

import metadef as md
from metadef.analysis.samples import separable_symbol
from metadef.ir import parse_graph

RNG = np.random.default_rng(3)

SEPARABLE = {
    "conv, pool, flatten, gemm, softmax": """graph g(%x: f32[n,3,8,8]) -> (%y) {
      %w: f32[4,3,3,3] = const
      %c: f32[n,4,8,8] = Conv(%x, %w) {pads=[1,1,1,1]} @conv
      %r: f32[n,4,8,8] = Relu(%c) @relu
      %p: f32[n,4,4,4] = MaxPool(%r) {kernel_shape=[2,2], strides=[2,2]} @pool
      %f: f32[n,64] = Flatten(%p) @flat
      %wg: f32[10,64] = const
      %g: f32[n,10] = Gemm(%f, %wg) {transB=1} @fc
      %y: f32[n,10] = Softmax(%g) {axis=1} @softmax
      return %y }""",
    "batched matmul, broadcast add, reduction over the features": """graph g(%x: f32[n,5,6], %b: f32[6]) -> (%y) {
      %w: f32[6,6] = const
      %m: f32[n,5,6] = MatMul(%x, %w) @mm
      %a: f32[n,5,6] = Add(%m, %b) @add
      %t: f32[n,6,5] = Transpose(%a) {perm=[0,2,1]} @t
      %ax: i64[1] = const
      %y: f32[n,6,1] = ReduceMax(%t, %ax) @max
      return %y }""",
    "global pool and a reshape": """graph g(%x: f32[n,4,3,3]) -> (%y) {
      %p: f32[n,4,1,1] = GlobalAveragePool(%x) @gap
      %s: i64[2] = const
      %y: f32[n,4] = Reshape(%p, %s) @reshape
      return %y }""",
}

MIXING = {
    "softmax over the batch": """graph g(%x: f32[n,4]) -> (%y) {
      %y: f32[n,4] = Softmax(%x) {axis=0} @softmax
      return %y }""",
    "a reduction over the batch": """graph g(%x: f32[n,4]) -> (%y) {
      %y: f32[1,4] = ReduceSum(%x) {keepdims=1} @sum
      return %y }""",
    "the batch read as a value": """graph g(%x: f32[n,4]) -> (%y) {
      %s: i64[2] = Shape(%x) @shape
      %f: f32[2] = Cast(%s) {to=1} @cast
      %y: f32[n,4] = Mul(%x, %f) @scale
      return %y }""",
    "a transposed product (the batch is summed over)": """graph g(%x: f32[n,4]) -> (%y) {
      %t: f32[4,n] = Transpose(%x) {perm=[1,0]} @t
      %y: f32[4,4] = MatMul(%t, %x) @gram
      return %y }""",
    "a batch gathered along itself": """graph g(%x: f32[n,4], %i: i64[n]) -> (%y) {
      %y: f32[n,4] = Gather(%x, %i) {axis=0} @shuffle
      return %y }""",
}


def _graph(text: str) -> md.Graph:
    consts = {"w": RNG.standard_normal((4, 3, 3, 3) if "f32[4,3,3,3]" in text else (6, 6), dtype=np.float32),
              "wg": RNG.standard_normal((10, 64), dtype=np.float32), "s": np.array([0, 4], np.int64),
              "ax": np.array([2], np.int64)}
    return parse_graph(text, constants={k: v for k, v in consts.items() if f"%{k}:" in text})


def _feeds(g: md.Graph, n: int) -> dict[str, np.ndarray]:
    feeds = {}
    for v in g.inputs:
        shape = [n if not isinstance(d, int) else d for d in v.type.shape]
        feeds[v.name] = RNG.integers(0, n, shape) if v.type.dtype.name == "int64" else \
            RNG.standard_normal(shape).astype(np.float32)
    return feeds


@pytest.mark.parametrize("name", sorted(SEPARABLE))
def test_a_separable_graphs_batch_is_its_samples_stacked(name: str) -> None:
    g = _graph(SEPARABLE[name])
    assert separable_symbol(g) == "n"
    sess = md.compile(g, target="reference")
    feeds = _feeds(g, 3)
    whole = sess.run(feeds)
    for i in range(3):
        one = sess.run({k: v[i:i + 1] if v.shape and v.shape[0] == 3 and k != "b" else v for k, v in feeds.items()})
        for k in whole:
            np.testing.assert_allclose(whole[k][i:i + 1], one[k], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", sorted(MIXING))
def test_a_graph_that_mixes_samples_is_not_separable(name: str) -> None:
    assert separable_symbol(_graph(MIXING[name])) is None


@pytest.mark.parametrize(("model", "symbol"), [("mlp", "batch"), ("resnet50", "batch"), ("mobilenetv2", "batch"),
                                               ("bert", None)])
def test_the_zoo_models_at_every_level(model: str, symbol: str | None) -> None:
    # BERT folds the batch into its products' rows ([batch*seq, 768]): not separable
    proto = md.zoo.build(model)
    for level in ("safe", "aggressive"):
        assert separable_symbol(md.optimize(md.import_onnx(proto), level=level)) == symbol
