"""Every zoo model saves to .mdef and loads back with identical graph text, identical tensors
and identical outputs on the reference backend (BERT and ResNet-50 are slow: seconds each)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import metadef as md
from metadef.format import open_mdef, save_graph
from metadef.ir import print_graph

MODELS = [
    pytest.param("mlp", {"batch": 3}),
    pytest.param("mobilenetv2", {"batch": 1}, marks=pytest.mark.slow),
    pytest.param("resnet50", {"batch": 1}, marks=pytest.mark.slow),
    pytest.param("bert", {"batch": 2, "seq": 16}, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name,dims", MODELS)
def test_zoo_model_round_trips(name: str, dims: dict[str, int], tmp_path: Path) -> None:
    graph = md.import_onnx(md.zoo.build(name), name=name)
    path = save_graph(graph, tmp_path / f"{name}.mdef")
    f = open_mdef(path, checksum_verify="always")
    loaded = f.graph()
    assert print_graph(loaded) == print_graph(graph)
    assert loaded.env.symbols == graph.env.symbols
    mapped = np.frombuffer(f._buf, np.uint8)
    for a, b in zip(graph.constants, loaded.constants):
        assert a.name == b.name and a.const.dtype == b.const.dtype and a.const.shape == b.const.shape
        assert np.array_equal(a.const, b.const)
        assert b.const.size == 0 or np.shares_memory(b.const, mapped)
    feeds = md.zoo.describe(name).example_inputs(**dims)
    expected = md.compile(graph).run(feeds)
    got = md.compile(loaded).run(feeds)
    assert expected.keys() == got.keys()
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key])
