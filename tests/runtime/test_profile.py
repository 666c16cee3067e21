"""Device profiles (detection, feature spellings, the precision rule) and choosing a precision
variant of one model by its hardware-requirements layer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import metadef as md
from metadef.codegen.host import beyond_isa
from metadef.codegen.jit import host_target
from metadef.core import flags as env_flags
from metadef.runtime.profile import (
    DeviceProfile,
    GpuInfo,
    choose_variant,
    normalize_feature,
    parse_gpu_line,
    variant_precision,
)

NO_AVX512 = DeviceProfile(cpu_name="AVX2 box", vendor="AuthenticAMD",
                          features=frozenset({"avx", "avx2", "fma", "f16c", "sse4_2"}), memory_bytes=2**34)
VNNI = DeviceProfile(cpu_name="Sapphire Rapids", vendor="GenuineIntel",
                     features=frozenset({"avx2", "fma", "f16c", "avx512f", "avx512_vnni", "amx_tile", "amx_int8",
                                         "amx_bf16", "avx512_bf16", "avx512_fp16"}), memory_bytes=2**34)


# ----------------------------------------------------------------------------- detection


def test_detect_reads_this_machine() -> None:
    p = DeviceProfile.detect()
    assert p.cpu_name and p.vendor
    assert p.logical_cores == os.cpu_count()
    assert 1 <= p.physical_cores <= p.logical_cores
    assert p.memory_bytes > 2**27
    assert p.devices[0] == "cpu"
    data = json.loads(json.dumps(p.to_dict()))
    assert data["features"] == sorted(p.features)
    assert data["best_precision"] in ("int8", "float16", "bfloat16", "float32")


def test_detect_takes_the_union_of_cpuinfo_and_llvm() -> None:
    p = DeviceProfile.detect()
    assert set(p.sources["cpuinfo"]) | set(p.sources["llvm"]) == set(p.features)
    llvm_on = {normalize_feature(f) for f in host_target().features.split(",") if f.startswith("+")}
    assert llvm_on <= p.features
    with open("/proc/cpuinfo") as f:
        flags = next(line for line in f if line.startswith("flags")).split(":", 1)[1].split()
    level = env_flags.MAX_ISA.get()  # (a run under METADEF_MAX_ISA: only what the cap leaves)
    for flag in ("avx2", "avx512f", "avx512_vnni", "amx_tile", "f16c", "fma"):
        listed = flag in flags and (level is None or not beyond_isa(flag, level))
        assert listed <= p.has(flag), flag  # whatever /proc/cpuinfo lists, the profile has
    assert p.has("avx512") == ("avx512f" in p.features)


def test_detect_under_an_isa_cap_lists_only_what_generated_code_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    with open("/proc/cpuinfo") as f:
        flags = next(line for line in f if line.startswith("flags")).split(":", 1)[1].split()
    monkeypatch.setenv("METADEF_MAX_ISA", "avx2")
    host_target.cache_clear()
    try:
        p = DeviceProfile.detect()
    finally:
        monkeypatch.delenv("METADEF_MAX_ISA")
        host_target.cache_clear()
    assert not any(p.has(f) for f in ("avx512f", "avx512_vnni", "amx_tile", "avx_vnni"))
    assert p.has("avx2") == ("avx2" in flags) and p.has("fma") == ("fma" in flags)
    assert not p.has("avx512") and p.sources["llvm"] and not any("avx512" in f for f in p.sources["llvm"])


@pytest.mark.parametrize(("spelling", "canonical"), [
    ("+avx512vnni", "avx512_vnni"), ("avx512-vnni", "avx512_vnni"), ("AVX512_VNNI", "avx512_vnni"),
    ("avxvnni", "avx_vnni"), ("amx-tile", "amx_tile"), ("amx-int8", "amx_int8"), ("amx-bf16", "amx_bf16"),
    ("sse4.2", "sse4_2"), ("avx512fp16", "avx512_fp16"), ("avx512", "avx512f"), ("f16c", "f16c"),
])
def test_feature_spellings(spelling: str, canonical: str) -> None:
    assert normalize_feature(spelling) == canonical


def test_nvidia_gpus_through_the_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200, 143771'\necho 'NVIDIA H200, 143771'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    p = DeviceProfile.detect()
    assert p.gpus == (GpuInfo("NVIDIA H200", 143771 * 2**20),) * 2
    assert p.devices == ("cpu", "cuda") and p.supports("gpu") and p.runs_fast("float16")


def test_no_gpus_without_the_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert DeviceProfile.detect().gpus == ()
    assert parse_gpu_line("garbage") is None


# --------------------------------------------------------------- requirements, precision


def test_supports_features_devices_and_a_hardware_layer() -> None:
    assert NO_AVX512.supports("avx2") and NO_AVX512.supports(["avx2", "fma", "cpu"])
    assert not NO_AVX512.supports("avx512f") and not NO_AVX512.supports("vnni")
    assert VNNI.supports("vnni") and VNNI.supports("amx")
    layer = {"cpu_features": ["avx512f"], "devices": ["cpu"], "min_memory_bytes": 10}
    assert VNNI.supports(layer)
    assert NO_AVX512.missing(layer) == ["avx512f"]
    assert not VNNI.supports({"devices": ["cuda"]})
    assert not VNNI.supports({"min_memory_bytes": 2**40})


@pytest.mark.parametrize(("features", "gpus", "best"), [
    ({"avx2", "fma", "f16c"}, (), "float32"),
    ({"avx2", "f16c", "avx512f"}, (), "float32"),
    ({"avx2", "avx_vnni"}, (), "int8"),
    ({"avx512f", "avx512_vnni"}, (), "int8"),
    ({"amx_tile", "amx_int8"}, (), "int8"),
    ({"f16c", "avx512f", "avx512_fp16"}, (), "float16"),
    ({"avx2"}, (GpuInfo("NVIDIA H200", 2**37),), "float16"),
    ({"avx512f", "avx512_bf16"}, (), "bfloat16"),
])
def test_best_precision_rule(features: set[str], gpus: tuple[GpuInfo, ...], best: str) -> None:
    p = DeviceProfile(features=frozenset(features), gpus=gpus)
    assert p.best_precision() == best
    assert p.preferred_precisions()[-1] == "float32"


# ------------------------------------------------------------------------------ variants


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("variants")
    g = md.import_onnx(md.zoo.build("mlp"))
    return {"fp32": md.save(g, d / "mlp.fp32.mdef"),
            "fp16": md.save(g, d / "mlp.fp16.mdef", quantize="float16"),
            "int8": md.save(g, d / "mlp.int8.mdef", quantize="int8",
                            metadata={"hardware": {"cpu_features": ["avx512f", "avx512_vnni"]}})}


def test_the_writer_records_weight_formats(variants: dict[str, Path], tmp_path: Path) -> None:
    hardware = {k: md.load(p).layers["hardware"] for k, p in variants.items()}
    assert "weight_formats" not in hardware["fp32"]
    assert hardware["fp16"]["weight_formats"] == ["float16"]
    assert hardware["int8"]["weight_formats"] == ["int8"]
    assert hardware["int8"]["cpu_features"] == ["avx512f", "avx512_vnni"]
    model = md.load(variants["int8"])  # saved again as plain, with its metadata: the writer drops the key
    plain = md.load(md.save(model.graph, tmp_path / "plain.mdef", metadata=model.metadata))
    assert "weight_formats" not in plain.layers["hardware"]
    assert plain.layers["hardware"]["cpu_features"] == ["avx512f", "avx512_vnni"]


def test_a_profile_without_avx512_never_picks_the_variant_that_needs_it(variants: dict[str, Path]) -> None:
    paths = [variants["int8"], variants["fp16"], variants["fp32"]]
    chosen = choose_variant(paths, NO_AVX512)
    assert chosen.path == variants["fp32"] and chosen.precision == "float32"
    model = md.load_best(paths, NO_AVX512)
    assert Path(model.file.path) == variants["fp32"]
    sess = model.compile(target="reference")
    assert sess.run(md.zoo.describe("mlp").example_inputs(batch=2))["probs"].shape == (2, 10)


def test_a_vnni_profile_picks_int8(variants: dict[str, Path]) -> None:
    paths = [variants["fp32"], variants["fp16"], variants["int8"]]
    assert choose_variant(paths, VNNI).path == variants["int8"]
    assert choose_variant([variants["fp32"], variants["fp16"]], VNNI).path == variants["fp16"]


def test_a_gpu_profile_without_avx512_picks_float16(variants: dict[str, Path]) -> None:
    gpu = DeviceProfile(features=NO_AVX512.features, gpus=(GpuInfo("NVIDIA H200", 2**37),))
    assert choose_variant(list(variants.values()), gpu).path == variants["fp16"]


def test_no_runnable_variant_says_what_each_needs(variants: dict[str, Path]) -> None:
    with pytest.raises(md.InputError, match=r"mlp\.int8\.mdef \(int8\) needs avx512f, avx512_vnni"):
        choose_variant([variants["int8"]], NO_AVX512)
    with pytest.raises(md.InputError, match="no files"):
        choose_variant([], NO_AVX512)


def test_files_without_weight_formats_read_their_parameter_layer() -> None:
    old = {"hardware": {"precision": ["float32"]},
           "parameters": {"tensors": {"w": {"quantization": {"scheme": "int8"}}, "b": {"layout": "row-major"}}}}
    assert variant_precision(old) == "int8"
    assert variant_precision({"hardware": {}, "parameters": {"tensors": {}}}) == "float32"
