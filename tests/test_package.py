"""What ``import metadef`` costs: the deployment path (load a .mdef, run it) needs neither onnx
nor LLVM, so importing the package loads neither; the names that need them load them on use."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import metadef as md

SCRIPT = """
import json, sys
import metadef as md
before = {m: m in sys.modules for m in ("onnx", "llvmlite.binding", "metadef.zoo", "metadef.frontends.onnx")}
md.zoo.names()
after_zoo = "onnx" in sys.modules
from metadef import import_onnx
print(json.dumps({"before": before, "after_zoo": after_zoo, "import_onnx": import_onnx.__module__}))
"""


def test_import_metadef_loads_neither_onnx_nor_llvm() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["before"] == {"onnx": False, "llvmlite.binding": False, "metadef.zoo": False,
                             "metadef.frontends.onnx": False}
    assert got["after_zoo"] and got["import_onnx"].startswith("metadef.frontends.onnx")


def test_the_names_loaded_on_first_use_are_the_real_ones() -> None:
    from metadef import zoo
    from metadef.frontends.onnx import compile_onnx, export_onnx, import_onnx

    assert (md.import_onnx, md.export_onnx, md.compile_onnx, md.zoo) == (import_onnx, export_onnx, compile_onnx, zoo)
    assert {"import_onnx", "export_onnx", "compile_onnx", "zoo"} <= set(md.__all__)


def test_an_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        md.not_a_name  # noqa: B018
