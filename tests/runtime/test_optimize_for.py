"""``Model.optimize_for(profile)``: target, threads, precision and kernel choices for fake
profiles (no AVX-512, no AVX2, VNNI), and the float16 weights checked against float32."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import metadef as md
from metadef.codegen.jit import host_target
from metadef.codegen.native_qgemm import has_int8_products
from metadef.runtime.model import store_weights_float16

NO_AVX512 = md.DeviceProfile(cpu_name="AVX2 box", features=frozenset({"avx", "avx2", "fma", "f16c", "sse4_2"}),
                             logical_cores=8, physical_cores=4)
NO_AVX2 = md.DeviceProfile(cpu_name="old box", features=frozenset({"sse4_2", "avx"}), logical_cores=4,
                           physical_cores=2)
VNNI = md.DeviceProfile(cpu_name="VNNI box", features=frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw",
                                                                  "avx512_vnni"}),
                        logical_cores=2, physical_cores=1)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> md.Model:
    path = md.save(md.import_onnx(md.zoo.build("mlp")), tmp_path_factory.mktemp("m") / "mlp.mdef")
    return md.load(path)


def test_a_profile_without_avx512_gets_x86_with_256_bit_vectors(mlp: md.Model) -> None:
    tuned = mlp.optimize_for(NO_AVX512)
    assert tuned is not mlp and mlp.choices == {}  # a new model; the loaded one is unchanged
    assert tuned.choices == {"target": "x86", "threads": 4, "vector_bits": 256, "weights": "float32",
                             "int8_kernels": True, "level": "aggressive"}
    assert set(tuned.reasons) == set(tuned.choices)
    assert "reduced precision not allowed" in tuned.reasons["weights"]
    assert "lacks AVX512-VNNI" in tuned.reasons["int8_kernels"] and "vpmaddwd" in tuned.reasons["int8_kernels"]
    if host_target().vector_bits != 256:
        assert "compile on the profiled machine" in tuned.reasons["vector_bits"]
    sess = tuned.compile()
    assert sess.target == "x86" and sess.executable.threads == 4
    x = md.zoo.describe("mlp").example_inputs(batch=3)
    want = mlp.compile(target="reference").run(x)["probs"]
    np.testing.assert_allclose(sess.run(x)["probs"], want, rtol=1e-4, atol=1e-6)


def test_a_profile_without_avx2_gets_the_reference_backend(mlp: md.Model) -> None:
    tuned = mlp.optimize_for(NO_AVX2, threads=3)
    assert (tuned.choices["target"], tuned.choices["threads"], tuned.choices["vector_bits"]) == ("reference", 3, 128)
    assert tuned.reasons["target"].startswith("the profile lacks AVX2")
    assert tuned.compile().target == "reference"
    assert tuned.compile(target="x86").target == "x86"  # an explicit target still wins


def test_reduced_precision_holds_contraction_weights_as_float16(mlp: md.Model) -> None:
    tuned = mlp.optimize_for(NO_AVX512, reduced_precision=True)
    assert tuned.choices["weights"] == "float16" and "3 weights held as float16" in tuned.reasons["weights"]
    halves = [v for v in tuned.graph.constants if v.const.dtype == np.float16]
    assert len(halves) == 3 and sum(n.op == "Cast" for n in tuned.graph.nodes) == 3
    x = md.zoo.describe("mlp").example_inputs(batch=2)
    want = mlp.compile(target="reference").run(x)["probs"]
    for target in ("reference", "x86"):
        np.testing.assert_allclose(tuned.compile(target=target).run(x)["probs"], want, rtol=2e-2, atol=1e-4)
    no_f16c = md.DeviceProfile(features=frozenset({"avx2", "fma"}))
    kept = mlp.optimize_for(no_f16c, reduced_precision=True)
    assert kept.choices["weights"] == "float32" and "lacks F16C" in kept.reasons["weights"]


def test_int8_kernels_follow_the_profile_isa(mlp: md.Model) -> None:
    # (what the x86 backend's quantized routines need: native_qgemm.has_int8_products)
    tuned = mlp.optimize_for(VNNI)
    assert tuned.choices["int8_kernels"] is True and tuned.choices["vector_bits"] == 512
    assert "has AVX512-VNNI" in tuned.reasons["int8_kernels"] and "vpdpbusd" in tuned.reasons["int8_kernels"]
    old = mlp.optimize_for(NO_AVX2)
    assert old.choices["int8_kernels"] is False and "lacks AVX2" in old.reasons["int8_kernels"]
    here = mlp.optimize_for()
    assert here.choices["int8_kernels"] is has_int8_products()


def test_float16_weights_skip_embeddings_and_small_constants() -> None:
    graph = md.optimize(md.import_onnx(md.zoo.build("bert")), level="aggressive")
    out, held = store_weights_float16(graph)
    names = {v.name for v in graph.constants}
    assert held and set(held) <= names
    tables = [v for v in out.constants if v.name.endswith(("word_embeddings.weight", "position_embeddings.weight"))]
    assert len(tables) == 2 and all(v.const.dtype == np.float32 for v in tables)  # read by Gather / Slice
    assert all(graph.value(name).const.dtype == np.float32 for name in held)  # the given graph is unchanged
    first_reader = {id(v): next(i for i, n in enumerate(out.nodes) if v in n.inputs) for v in out.constants}
    for i, n in enumerate(out.nodes):  # each Cast sits just before its first reader
        if n.op == "Cast" and n.inputs[0].const is not None and n.inputs[0].const.dtype == np.float16:
            assert first_reader[id(n.inputs[0])] == i and any(n.outputs[0] in m.inputs for m in out.nodes[i + 1:i + 2])


def test_choices_are_logged_under_metadef_debug(mlp: md.Model, monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("METADEF_DEBUG", "1")
    with caplog.at_level(logging.INFO, logger="metadef.runtime"):
        mlp.optimize_for(NO_AVX2)
    lines = [r.getMessage() for r in caplog.records if r.name == "metadef.runtime"]
    assert any("target = reference" in line for line in lines) and len(lines) == 6


def test_bad_requests_say_what_is_wrong(mlp: md.Model, tmp_path: Path) -> None:
    with pytest.raises(md.InputError, match="level 'fast'"):
        mlp.optimize_for(NO_AVX2, level="fast")
    with pytest.raises(md.InputError, match="threads=0"):
        mlp.optimize_for(NO_AVX2, threads=0)
