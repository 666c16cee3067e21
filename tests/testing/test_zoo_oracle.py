"""Every zoo model, imported and run on the reference backend, matches ONNX Runtime
(rtol 1e-4, atol 1e-5) at batch 1 and 3 (and sequence 128 and 37 for BERT)."""

import functools

import pytest

import metadef as md
from metadef.testing.oracle import compare_with_onnxruntime

RUNS = {
    "mlp": [{"batch": 1}, {"batch": 3}],
    "mobilenetv2": [{"batch": 1}, {"batch": 3}],
    "resnet50": [{"batch": 1}, {"batch": 3}],
    "bert": [{"batch": 1, "seq": 128}, {"batch": 3, "seq": 37}],
}


@functools.cache
def _model(name):
    proto = md.zoo.build(name)
    return proto, md.import_onnx(proto, name=name)


@pytest.mark.parametrize("name", ["mlp", "mobilenetv2", "resnet50", "bert"])
def test_symbolic_shapes_survive_import(name):
    _, graph = _model(name)
    for v in [*graph.inputs, *graph.outputs]:
        assert v.type is not None and v.type.shape is not None
        assert "batch" in v.type.free_symbols, f"{v.name}: {v.type}"
    if name == "bert":
        assert str(graph.outputs[0].type) == "f32[batch,seq,768]"


@pytest.mark.slow
@pytest.mark.parametrize("name,dims", [(n, d) for n, runs in RUNS.items() for d in runs],
                         ids=lambda p: p if isinstance(p, str) else "-".join(f"{k}{v}" for k, v in p.items()))
def test_reference_matches_onnxruntime(name, dims):
    proto, graph = _model(name)
    feeds = md.zoo.describe(name).example_inputs(**dims)
    check = compare_with_onnxruntime(proto, feeds, graph=graph)
    assert check.ok, [o for o in check.outputs if not o.ok]
