"""ONNX export of optimized graphs (fused groups and metadef ops as local functions) and of
quantized .mdef models (stored integers + DequantizeLinear), checked against ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import metadef as md
from metadef.frontends.onnx import to_onnx
from metadef.ir import Graph, parse_graph
from metadef.passes.base import PassContext
from metadef.passes.fuse_groups import fuse_groups

RTOL = 1e-4


def _feeds(graph: Graph, batch: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for v in graph.inputs:
        shape = [d if isinstance(d, int) else batch for d in v.type.shape]
        if v.type.dtype.numpy.kind in "iu":
            feeds[v.name] = np.ones(shape, v.type.dtype.numpy)
        else:
            feeds[v.name] = rng.standard_normal(shape).astype(v.type.dtype.numpy)
    return feeds


def _run_onnx(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    onnx.checker.check_model(onnx.load(str(path)))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _check_against_metadef(graph: Graph, path: Path) -> None:
    feeds = _feeds(graph)
    got = _run_onnx(path, feeds)
    want = md.compile(graph, target="reference").run(feeds)
    want = list(want.values()) if isinstance(want, dict) else list(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        scale = float(np.abs(w).max()) or 1.0
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=RTOL * scale)


def _export_optimized(name: str, tmp_path: Path) -> None:
    graph = md.optimize(md.import_onnx(md.zoo.build(name)), level="aggressive")
    path = md.export_onnx(graph, tmp_path / f"{name}.onnx")
    model = onnx.load(str(path))
    ops = {n.domain for n in model.graph.node}
    assert "ai.metadef" not in ops or all(f.domain for f in model.functions)
    assert model.functions, "an aggressive graph has fused groups, exported as functions"
    _check_against_metadef(graph, path)


@pytest.mark.parametrize("name", ["mlp", "mobilenetv2"])
def test_optimized_zoo_model_runs_in_onnxruntime(name: str, tmp_path: Path) -> None:
    _export_optimized(name, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "resnet50"])
def test_optimized_large_zoo_model_runs_in_onnxruntime(name: str, tmp_path: Path) -> None:
    _export_optimized(name, tmp_path)


def test_fused_groups_share_one_function_per_structure() -> None:
    graph = md.optimize(md.import_onnx(md.zoo.build("mlp")), level="aggressive")
    model = to_onnx(graph)
    calls = [n for n in model.graph.node if n.domain == "ai.metadef.fused"]
    assert len(calls) == 2
    assert {f.name for f in model.functions} == {n.op_type for n in calls}
    assert all(f.name.startswith("contraction_epilogue_") for f in model.functions)
    plain = to_onnx(graph, functions=False)
    assert not plain.functions and any(n.op_type == "Fused" for n in plain.graph.node)


FUSED_SILU = """graph g(%x: f32[n,8], %w: f32[8,8], %b: f32[8]) -> (%y) {
  %m: f32[n,8] = MatMul(%x, %w) @mm
  %a: f32[n,8] = Add(%m, %b) @bias
  %y: f32[n,8] = ai.metadef::SiLU(%a) @silu
  return %y
}"""


def _fused_silu_graph() -> Graph:
    g = parse_graph(FUSED_SILU)
    rng = np.random.default_rng(1)
    w, b = g.value("w"), g.value("b")
    w.const = rng.standard_normal((8, 8)).astype(np.float32)
    b.const = rng.standard_normal(8).astype(np.float32)
    g.inputs = [g.inputs[0]]
    g.constants = [w, b]
    return fuse_groups(g, PassContext())


def test_fused_body_with_metadef_op_exports_and_runs(tmp_path: Path) -> None:
    graph = _fused_silu_graph()
    assert [n.op for n in graph.nodes] == ["Fused"]
    path = md.export_onnx(graph, tmp_path / "silu.onnx")
    model = onnx.load(str(path))
    names = {(f.domain, f.name) for f in model.functions}
    assert ("ai.metadef", "SiLU") in names and ("ai.metadef.fused", "contraction_epilogue_0") in names
    _check_against_metadef(graph, path)


def _attention_graph() -> Graph:
    text = """graph g(%q: f32[b,2,5,4], %k: f32[b,2,5,4], %v: f32[b,2,5,4], %mask: f32[b,1,1,5]) -> (%y) {
      %y: f32[b,2,5,4] = ai.metadef::Attention(%q, %k, %v, %mask) {scale=0.5} @attn
      return %y
    }"""
    return parse_graph(text)


def test_attention_exports_as_local_function(tmp_path: Path) -> None:
    graph = _attention_graph()
    path = md.export_onnx(graph, tmp_path / "attn.onnx")
    model = onnx.load(str(path))
    (fn,) = model.functions
    assert [n.op_type for n in fn.node] == ["Transpose", "MatMul", "Constant", "CastLike", "Mul", "Add",
                                            "Softmax", "MatMul"]
    _check_against_metadef(graph, path)


def test_attention_with_heads_after_the_sequence_exports_with_its_transposes(tmp_path: Path) -> None:
    """``layout="bshd"``: Q and V get their heads swapped first, K goes straight to Kᵀ, Y is
    swapped back; ONNX Runtime's answers are metadef's."""
    graph = parse_graph("""graph g(%q: f32[b,5,2,4], %k: f32[b,6,2,4], %v: f32[b,6,2,3], %mask: f32[b,1,1,6]) -> (%y) {
      %y: f32[b,5,2,3] = ai.metadef::Attention(%q, %k, %v, %mask) {scale=0.5, layout="bshd"} @attn
      return %y
    }""")
    path = md.export_onnx(graph, tmp_path / "attn.onnx")
    (fn,) = onnx.load(str(path)).functions
    assert [n.op_type for n in fn.node] == ["Transpose", "Transpose", "Transpose", "MatMul", "Constant", "CastLike",
                                            "Mul", "Add", "Softmax", "MatMul", "Transpose"]
    _check_against_metadef(graph, path)


# --- quantized .mdef ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mlp_graph() -> Graph:
    return md.import_onnx(md.zoo.build("mlp"))


@pytest.fixture(scope="module")
def float_size(mlp_graph: Graph, tmp_path_factory: pytest.TempPathFactory) -> int:
    return md.export_onnx(mlp_graph, tmp_path_factory.mktemp("f32") / "mlp.onnx").stat().st_size


QUANTIZED = [  # scheme, stored initializer type, restoring op, largest size vs float32
    ("int8", onnx.TensorProto.INT8, "DequantizeLinear", 0.35),
    ("int4", onnx.TensorProto.INT4, "DequantizeLinear", 0.25),
    ("float16", onnx.TensorProto.FLOAT16, "Cast", 0.6),
]


@pytest.mark.parametrize(("scheme", "stored", "op", "ratio"), QUANTIZED)
def test_quantized_mdef_exports_its_stored_weights(scheme: str, stored: int, op: str, ratio: float,
                                                   mlp_graph: Graph, float_size: int, tmp_path: Path) -> None:
    model = md.load(md.save(mlp_graph, tmp_path / f"mlp.{scheme}.mdef", quantize=scheme))
    path = md.export_onnx(model, tmp_path / f"mlp.{scheme}.onnx")
    proto = onnx.load(str(path))
    kinds = {t.name: t.data_type for t in proto.graph.initializer}
    assert kinds["fc1.weight_quantized" if op == "DequantizeLinear" else "fc1.weight_float16"] == stored
    assert "fc1.weight" not in kinds
    assert any(n.op_type == op and n.output[0] == "fc1.weight" for n in proto.graph.node)
    if scheme == "int4":
        assert max(o.version for o in proto.opset_import if o.domain == "") >= 21
        dq = next(n for n in proto.graph.node if n.op_type == "DequantizeLinear")
        assert {a.name for a in dq.attribute} == {"axis", "block_size"}
    assert path.stat().st_size < ratio * float_size
    _check_against_metadef(model.graph, path)


def test_a_loaded_graph_finds_its_file(mlp_graph: Graph, tmp_path: Path) -> None:
    model = md.load(md.save(mlp_graph, tmp_path / "mlp.int8.mdef", quantize="int8"))
    found = to_onnx(model.graph)  # its constants know the file they are stored in
    given = to_onnx(model.graph, source=model.file)
    assert any(n.op_type == "DequantizeLinear" for n in found.graph.node)
    assert found.SerializeToString() == given.SerializeToString()


def test_optimized_quantized_model_exports_and_runs(mlp_graph: Graph, tmp_path: Path) -> None:
    model = md.load(md.save(mlp_graph, tmp_path / "mlp.int4.mdef", quantize="int4"))
    graph = md.optimize(model.graph, level="aggressive")
    path = md.export_onnx(graph, tmp_path / "opt.int4.onnx", source=model.file)
    proto = onnx.load(str(path))
    assert proto.functions and any(n.op_type == "DequantizeLinear" for n in proto.graph.node)
    _check_against_metadef(graph, path)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantized_conv_weights_export_and_run(scheme: str, tmp_path: Path) -> None:
    """Conv weights ``[K,C,R,S]``: int4 blocks span C*R*S, dequantized as stored then reshaped."""
    graph = md.import_onnx(md.zoo.build("mobilenetv2"))
    model = md.load(md.save(graph, tmp_path / f"mnv2.{scheme}.mdef", quantize=scheme))
    path = md.export_onnx(model, tmp_path / f"mnv2.{scheme}.onnx")
    proto = onnx.load(str(path))
    assert any(n.op_type == "DequantizeLinear" for n in proto.graph.node)
    if scheme == "int4":
        assert any(n.op_type == "Reshape" and n.output[0].endswith(".weight") for n in proto.graph.node)
    _check_against_metadef(model.graph, path)
