"""Per-layer precision files: parsing, validation that names the bad key, and what gets stored."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import metadef as md
from metadef.format import open_mdef
from metadef.format.precision import PrecisionError, PrecisionPlan, load_precision
from metadef.format.quantize import FLOAT16, INT8, PLAIN


def test_the_file_users_write() -> None:
    plan = PrecisionPlan.from_yaml("default: fp16\nconv1: fp32\ndense_final: fp64\n'/layer4/*': int8\n")
    assert plan.default == "fp16"
    assert plan.rules == {"conv1": "fp32", "dense_final": "fp64", "/layer4/*": "int8"}
    assert plan.for_names(["conv1"]) == "fp32"
    assert plan.for_names(["/layer4/0/conv2/Conv"]) == "int8"
    assert plan.for_names(["/layer1/0/conv2/Conv"]) == "fp16"


def test_exact_names_win_over_globs_and_globs_go_in_file_order() -> None:
    plan = PrecisionPlan.from_dict({"/fc*": "int4", "/fc1/Gemm": "fp32", "/f*": "int8"})
    assert plan.for_names(["/fc1/Gemm"]) == "fp32"
    assert plan.for_names(["/fc2/Gemm"]) == "int4"
    assert plan.for_names(["/foo"]) == "int8"
    assert plan.for_names(["other"], default="fp16") == "fp16"
    assert PrecisionPlan.from_dict({"FLOAT16": "float16", "x": "BF16"}).rules == {"FLOAT16": "fp16", "x": "bf16"}


@pytest.mark.parametrize("text,match", [
    ("conv1: fp8", r"key 'conv1' has value 'fp8'; choose one of fp64, fp32"),
    ("default: 16", r"key 'default' has value 16 \(int\)"),
    ("- conv1\n- fp16", r"must be a mapping"),
    ("conv1: [fp16]", r"key 'conv1' has value \['fp16'\]"),
    ("a: b: c", r"not valid YAML"),
])
def test_errors_name_the_bad_key_and_value(text: str, match: str) -> None:
    with pytest.raises(PrecisionError if "YAML" not in match else md.FormatError, match=match):
        PrecisionPlan.from_yaml(text)


def test_a_key_matching_no_node_is_an_error_with_a_suggestion() -> None:
    graph = md.import_onnx(md.zoo.build("mlp"))
    with pytest.raises(PrecisionError, match=r"key '/fc1/Gem' matches no node of graph .*did you mean '/fc1/Gemm'"):
        load_precision({"/fc1/Gem": "fp32"}, graph)
    assert load_precision({"/fc*": "fp32"}, graph) is not None


def test_precision_file_on_disk_decides_what_each_layer_stores(tmp_path: Path) -> None:
    yaml_path = tmp_path / "layers.yaml"
    yaml_path.write_text("default: fp16\n/fc1/Gemm: fp32\n/fc2/MatMul: int8\n/fc3/Gemm: fp64\n")
    graph = md.import_onnx(md.zoo.build("mlp"))
    f = open_mdef(md.save(graph, tmp_path / "m.mdef", precision=yaml_path))
    formats = {n: f.tensor_info(n).format for n in f.tensor_names()}
    assert formats == {"fc1.weight": PLAIN, "fc1.bias": PLAIN, "fc2.weight": INT8, "fc2.bias": PLAIN,
                       "fc3.weight": PLAIN, "fc3.bias": PLAIN}
    f = open_mdef(md.save(graph, tmp_path / "n.mdef", precision={"/fc3/*": "int4"}, quantize="float16"))
    assert f.tensor_info("fc1.weight").format == FLOAT16
    assert f.tensor_info("fc3.weight").quantization["scheme"] == "int4"
    np.testing.assert_array_equal(f.tensor("fc1.bias"), graph.value("fc1.bias").const)


def test_a_missing_precision_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(md.FormatError, match=r"cannot read precision file .*nope\.yaml"):
        PrecisionPlan.from_yaml(tmp_path / "nope.yaml")
