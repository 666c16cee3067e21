"""``decompose``: GroupNormalization as LayerNormalization and Tile as Expand, each against the
original op on the reference backend (and ONNX Runtime through the x86 backend)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import metadef as md
from metadef.ir import parse_graph, verify
from metadef.passes.base import PassContext
from metadef.passes.decompose import decompose
from metadef.testing.onnx_cases import one_node_model

RNG = np.random.default_rng(2)


def _decomposed(graph: md.Graph) -> tuple[md.Graph, list[str]]:
    ctx = PassContext()
    after = decompose(graph, ctx)
    verify(after, types=True)
    return after, ctx.log.lines()


@pytest.mark.parametrize("shape,groups,opset", [((2, 8, 5, 7), 4, 21), ((3, 6, 10), 3, 21), ((2, 8, 5, 7), 2, 18),
                                                ((2, 4, 3, 3), 4, 21)])
def test_group_normalization_as_layer_normalization(shape: tuple[int, ...], groups: int, opset: int) -> None:
    x = (RNG.standard_normal(shape) * 3 + 1).astype(np.float32)
    affine = shape[1] if opset == 21 else groups
    scale, bias = RNG.standard_normal(affine).astype(np.float32), RNG.standard_normal(affine).astype(np.float32)
    model = one_node_model("GroupNormalization", {"x": x}, {"scale": scale, "bias": bias}, opset=opset,
                           num_groups=groups, epsilon=1e-3)
    graph = md.import_onnx(model)
    after, log = _decomposed(graph)
    assert "GroupNormalization" not in [n.op for n in after.nodes] and log[0].startswith("taken groupnorm_as_layernorm")
    want = md.compile(graph, target="reference").run({"x": x})["out0"]
    np.testing.assert_allclose(md.compile(after, target="reference").run({"x": x})["out0"], want, rtol=1e-5, atol=1e-5)
    got = md.compile(md.optimize(graph, level="aggressive"), target="x86", cache=False).run({"x": x})["out0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    if opset == 21:
        theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        np.testing.assert_allclose(got, theirs[0], rtol=1e-4, atol=1e-4)


def test_group_normalization_with_unknown_channels_is_refused() -> None:
    g = parse_graph("""graph g(%x: f32[n,c,h], %s: f32[c], %b: f32[c]) -> (%y) {
      %y: f32[n,c,h] = GroupNormalization(%x, %s, %b) {num_groups=2} @gn
      return %y }""")
    after, log = _decomposed(g)
    assert [n.op for n in after.nodes] == ["GroupNormalization"]
    assert log == ["refused groupnorm_as_layernorm at gn: the channels (c) are not known to split into 2 groups"]
    per_group = parse_graph("""graph g(%x: f32[n,4,h], %s: f32[4], %b: f32[2]) -> (%y) {
      %y: f32[n,4,h] = GroupNormalization(%x, %s, %b) {num_groups=2} @gn
      return %y }""")
    after, log = _decomposed(per_group)  # (refused after looking at both: nothing added for the scale)
    assert [n.op for n in after.nodes] == ["GroupNormalization"] and not after.constants
    assert log == ["refused groupnorm_as_layernorm at gn: %b holds a value per group and is not a constant"]


@pytest.mark.parametrize("repeats", [(1, 1, 8), (2, 1, 3), (1, 3, 1), (1, 1, 1)])
@pytest.mark.parametrize("batch", ["n", "2"])
def test_tile_as_expand(repeats: tuple[int, ...], batch: str) -> None:
    first = batch if repeats[0] == 1 else str(repeats[0] * 2) if batch == "2" else f"{repeats[0]}*n"
    g = parse_graph(f"""graph g(%x: f32[{batch},5,6]) -> (%y) {{
      %r: i64[3] = const [{', '.join(map(str, repeats))}]
      %y: f32[{first},{5 * repeats[1]},{6 * repeats[2]}] = Tile(%x, %r) @tile
      return %y }}""")
    after, _ = _decomposed(g)
    ops = [n.op for n in after.nodes]
    assert ("Tile" in ops) == (repeats == (1, 1, 1))
    assert ("Concat" in ops) == (sum(r > 1 for r in repeats) == 1)  # one axis: copies side by side
    x = RNG.standard_normal((2, 5, 6)).astype(np.float32)
    np.testing.assert_array_equal(md.compile(after, target="reference").run({"x": x})["y"], np.tile(x, repeats))
    got = md.compile(md.optimize(g, level="aggressive"), target="x86", cache=False).run({"x": x})["y"]
    np.testing.assert_array_equal(got, np.tile(x, repeats))


@pytest.mark.parametrize("op,attrs,shape", [("DepthToSpace", {"blocksize": 2}, (2, 12, 3, 5)),
                                            ("DepthToSpace", {"blocksize": 2, "mode": "CRD"}, (2, 12, 3, 5)),
                                            ("DepthToSpace", {"blocksize": 3}, (1, 18, 2, 2)),
                                            ("SpaceToDepth", {"blocksize": 2}, (2, 3, 6, 4))])
def test_depth_and_space_as_reshape_transpose_reshape(op: str, attrs: dict, shape: tuple[int, ...]) -> None:
    x = RNG.standard_normal(shape).astype(np.float32)
    model = one_node_model(op, {"x": x}, opset=13, **attrs)
    graph = md.import_onnx(model)
    after, log = _decomposed(graph)
    assert [n.op for n in after.nodes] == ["Reshape", "Transpose", "Reshape"], log
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(md.compile(after, target="reference").run({"x": x})["out0"], want)
    got = md.compile(md.optimize(graph, level="aggressive"), target="x86", cache=False).run({"x": x})["out0"]
    np.testing.assert_array_equal(got, want)
