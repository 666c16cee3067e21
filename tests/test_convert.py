"""The converter: ``metadef convert`` / ``metadef-convert``, ``verify``, ``inspect`` of .mdef files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import metadef as md
from metadef.cli_convert import convert_command, convert_main, inspect_mdef, verify_command
from metadef.convert import AGGRESSIVE_NOTE, convert
from metadef.core.errors import MetadefError


@pytest.fixture
def mlp_onnx(tmp_path: Path) -> Path:
    return md.zoo.export("mlp", tmp_path / "mlp.onnx")


def test_metadef_convert_writes_a_quantized_file_with_a_summary(mlp_onnx: Path, tmp_path: Path) -> None:
    out = tmp_path / "mlp.mdef"
    r = CliRunner().invoke(convert_command, [str(mlp_onnx), "-o", str(out), "--optimize", "aggressive",
                                             "--quantize", "int8"])
    assert r.exit_code == 0, r.output
    assert "float32 file" in r.output and "rel L2" in r.output and "fc1.weight" in r.output
    assert "fused groups are formed at compile time" in r.output
    model = md.load(out)
    feeds = md.zoo.describe("mlp").example_inputs(batch=3)
    expected = md.compile(md.import_onnx(mlp_onnx)).run(feeds)["probs"]
    np.testing.assert_allclose(model.compile().run(feeds)["probs"], expected, atol=1e-2)


def test_standalone_metadef_convert_takes_equals_options_and_json(mlp_onnx: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.mdef"
    r = CliRunner().invoke(convert_main, [f"--input={mlp_onnx}", f"--output={out}", "--optimize=moderate",
                                          "--quantize=int4", "--prune=0.001", "--compat-backward=1.0", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert report["ratio"] < 0.15 and report["version"] == "1.0"
    assert {row["scheme"] for row in report["layers"]} == {"int4"}
    sections = {s["name"]: s for s in report["sections"]}
    assert sections["data"]["after"] < sections["data"]["before"] / 6
    assert set(report["stages"]) == {"read", "optimize", "quantize", "write", "verify"}


def test_errors_are_one_line_and_exit_2(mlp_onnx: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(convert_main, [f"--input={mlp_onnx}", f"--output={tmp_path / 'x.mdef'}",
                                          "--compat-backward=0.9"])
    assert r.exit_code == 2 and "cannot write format 0.9" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(convert_main, ["--input=nothing.onnx", f"--output={tmp_path / 'x.mdef'}"])
    assert r.exit_code == 2 and "nothing.onnx does not exist" in r.output
    yaml_path = tmp_path / "p.yaml"
    yaml_path.write_text("/fc9/Gemm: int8\n")
    r = CliRunner().invoke(convert_main, [f"--input={mlp_onnx}", f"--output={tmp_path / 'x.mdef'}",
                                          f"--precision={yaml_path}"])
    assert r.exit_code == 2 and "key '/fc9/Gemm' matches no node" in r.output
    assert not (tmp_path / "x.mdef").exists()


@pytest.mark.skipif(importlib.util.find_spec("tf2onnx") is not None, reason="tf2onnx is installed")
def test_tensorflow_without_tf2onnx_names_the_extra(tmp_path: Path) -> None:
    (tmp_path / "frozen.pb").write_bytes(b"\x0a\x00")
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "saved_model.pb").write_bytes(b"")
    for source in (tmp_path / "frozen.pb", saved):
        with pytest.raises(MetadefError, match=r"pip install 'metadef\[tensorflow\]'"):
            convert(source, tmp_path / "x.mdef")


def test_aggressive_stores_the_graph_without_fused_groups(tmp_path: Path) -> None:
    report = convert("mlp", tmp_path / "a.mdef", optimize="aggressive")
    assert report.notes == [AGGRESSIVE_NOTE] and report.layers == []
    graph = md.load(report.output).graph
    assert all(n.domain != "ai.metadef" or n.op != "Fused" for n in graph.nodes)
    assert abs(report.ratio - 1.0) < 1e-9


def test_verify_reports_ok_and_exits_1_on_a_bit_flip(tmp_path: Path) -> None:
    path = convert("mlp", tmp_path / "v.mdef", quantize="int8").output
    r = CliRunner().invoke(verify_command, [str(path)])
    assert r.exit_code == 0 and "all checksums match" in r.output
    offset = md.load(path).file.tensor_info("fc2.weight").offset + 7
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))
    r = CliRunner().invoke(verify_command, [str(path)])
    assert r.exit_code == 1 and "fc2.weight" in r.output and "checksum mismatch" in r.output
    path.write_bytes(bytes(data[:-100]))
    r = CliRunner().invoke(verify_command, [str(path)])
    assert r.exit_code == 1 and "FAILED" in r.output


def test_inspect_shows_four_layers_and_the_tensor_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = convert("mlp", tmp_path / "i.mdef", quantize="int4").output
    inspect_mdef(path)
    text = capsys.readouterr().out
    for word in ("hardware", "summary", "parameters", "auxiliary", "fc1.weight", "int4", "offset", "plain"):
        assert word in text
    inspect_mdef(path, as_json=True)
    info = json.loads(capsys.readouterr().out)
    assert set(info["layers"]) == {"hardware", "summary", "parameters", "auxiliary"}
    row = next(t for t in info["tensors"] if t["name"] == "fc1.weight")
    assert row["format"] == "int4" and row["shape"] == [512, 784] and row["offset"] % 64 == 0


def test_inspect_prints_the_hash_that_trusts_a_code_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    from metadef.format import save_graph
    from metadef.format.reader import code_hash_of
    from metadef.ir import parse_graph

    g = parse_graph("graph g(%x: f32[2]) -> (%y) { %y: f32[2] = Relu(%x) return %y }")
    path = save_graph(g, tmp_path / "c.mdef", code={"x86": b"object code"})
    inspect_mdef(path)
    assert f"precompiled code for x86: {code_hash_of(b'object code')}" in capsys.readouterr().out
    inspect_mdef(path, as_json=True)
    assert json.loads(capsys.readouterr().out)["code_hashes"] == {"x86": code_hash_of(b"object code")}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mobilenetv2", "resnet50", "bert"])
def test_zoo_file_size_targets(name: str, tmp_path: Path) -> None:
    base = convert(name, tmp_path / "f32.mdef", optimize="aggressive", verify=False)
    for scheme, target in (("int8", 0.27), ("int4", 0.15)):
        report = convert(name, tmp_path / f"{scheme}.mdef", optimize="aggressive", quantize=scheme, verify=False)
        assert abs(report.size_before - base.size_after) < 1024  # "before" is the float32 file
        assert report.ratio <= target, f"{name} {scheme}: {report.ratio:.3f} > {target}"
