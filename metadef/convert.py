"""The conversion pipeline behind ``metadef convert`` and ``metadef-convert`` (L8, beside api).

A conversion is a named list of stages: ``read`` (ONNX; a zoo name; TensorFlow through
tf2onnx when installed), ``optimize``, ``quantize`` (weights only), ``write`` (atomically,
optionally as an older format version) and ``verify`` (every checksum of the written file).
The report holds each section's size in the float32 file and in the written one, and the
quantization error of each weight (max abs and relative L2, dequantized vs original).

On ``aggressive``: the optimizer's last step forms fused groups (``ai.metadef::Fused`` nodes
holding a ``body`` subgraph), which format 1.0 cannot store. Fused groups are a compile-time
decision (they depend on the target's kernels), so the converter stores the graph with every
other aggressive rewrite applied (folding, pattern recognition, layout choice) and the fusion
rules disabled, and says so in the log and the report; ``model.compile`` forms the groups.

Example:
    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "mlp.mdef"
    >>> report = convert("mlp", out, optimize="aggressive", quantize="int8")
    >>> report.ratio < 0.27, [s.name for s in report.stages]
    (True, ['read', 'optimize', 'quantize', 'write', 'verify'])
    >>> sorted({row.scheme for row in report.layers})
    ['int8']
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metadef import zoo
from metadef.core.errors import MetadefError
from metadef.format import open_mdef, save_graph
from metadef.format.custom_metadata import encode_metadata
from metadef.format.precision import PrecisionPlan, load_precision
from metadef.format.quantize import EncodedTensor, Weight, encode_weights, find_weights
from metadef.format.writer import section_sizes
from metadef.frontends.onnx import import_onnx
from metadef.ir import Graph
from metadef.passes import LEVELS, optimize
from metadef.passes.fuse_groups import RULES as FUSION_RULES

log = logging.getLogger("metadef.convert")
Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: called as each stage advances (the CLI draws a bar)."""
STAGES = ("read", "optimize", "quantize", "write", "verify")
AGGRESSIVE_NOTE = ("--optimize aggressive: fused groups are formed at compile time (format 1.0 stores no "
                   "subgraphs), so the file holds the aggressive graph without them")


@dataclass(frozen=True)
class SectionSize:
    """One section's bytes in the float32 file and in the written file."""

    name: str
    before: int
    after: int


@dataclass(frozen=True)
class LayerError:
    """One stored weight: where it is read, how it is stored, its error against the original."""

    tensor: str
    node: str
    scheme: str
    shape: tuple[int, ...]
    bytes_before: int
    bytes_after: int
    max_abs_error: float
    rel_l2_error: float
    sparse: bool = False


@dataclass(frozen=True)
class StageTime:
    name: str
    seconds: float


@dataclass
class ConvertReport:
    """What a conversion did: paths, level, stages and times, sizes and per-layer errors."""

    input: str
    output: Path
    level: str | None
    version: tuple[int, int]
    sections: list[SectionSize] = field(default_factory=list)
    layers: list[LayerError] = field(default_factory=list)
    stages: list[StageTime] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def size_before(self) -> int:
        return sum(s.before for s in self.sections if s.name == "file")

    @property
    def size_after(self) -> int:
        return sum(s.after for s in self.sections if s.name == "file")

    @property
    def ratio(self) -> float:
        """Written file size / float32 file size."""
        return self.size_after / self.size_before if self.size_before else 1.0


def parse_version(text: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """``"1.0"`` -> ``(1, 0)`` (``--compat-backward``).

    Example:
        >>> parse_version("1.0"), parse_version(None)
        ((1, 0), None)
    """
    if text is None or isinstance(text, tuple):
        return text
    major, dot, minor = str(text).strip().partition(".")
    if not (dot and major.isdigit() and minor.isdigit()):
        raise MetadefError(f"--compat-backward expects a format version MAJOR.MINOR such as 1.0, got {text!r}")
    return int(major), int(minor)


def _is_tensorflow(path: Path) -> bool:
    return path.suffix == ".pb" or (path.is_dir() and (path / "saved_model.pb").exists())


def tensorflow_to_onnx(path: Path, workdir: Path, inputs: str | None = None, outputs: str | None = None) -> Path:
    """Convert a TensorFlow ``.pb`` or SavedModel directory to ONNX with tf2onnx (the optional
    extra); without tf2onnx a MetadefError says what to install. Nothing is downloaded."""
    if importlib.util.find_spec("tf2onnx") is None:
        raise MetadefError(f"{path} is a TensorFlow model; reading it needs the optional tf2onnx converter, "
                           "which is not installed: pip install 'metadef[tensorflow]' (tf2onnx and tensorflow-cpu), "
                           "or export ONNX yourself (python -m tf2onnx.convert ...) and convert the .onnx file")
    out = workdir / f"{path.stem or 'model'}.onnx"
    cmd = [sys.executable, "-m", "tf2onnx.convert", "--opset", "17", "--output", str(out)]
    if path.is_dir():
        cmd += ["--saved-model", str(path)]
    else:
        if not (inputs and outputs):
            raise MetadefError(f"{path} is a frozen TensorFlow graph: name its inputs and outputs "
                               "(--tf-inputs x:0 --tf-outputs y:0), tf2onnx cannot guess them")
        cmd += ["--graphdef", str(path), "--inputs", inputs, "--outputs", outputs]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not out.exists():
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise MetadefError(f"tf2onnx could not convert {path} (exit {done.returncode}):\n{tail}")
    return out


def read_model(source: str | os.PathLike, *, workdir: Path | None = None, tf_inputs: str | None = None,
               tf_outputs: str | None = None) -> Graph:
    """An ONNX file, a zoo model's name, or a TensorFlow model (through tf2onnx) as a Graph."""
    path = Path(source)
    if not path.exists():
        if str(source) in zoo.names():
            return import_onnx(zoo.build(str(source)), name=str(source))
        raise MetadefError(f"{source} does not exist (give an .onnx file, a TensorFlow .pb or SavedModel "
                           f"directory, or a zoo model: {', '.join(zoo.names())})")
    if _is_tensorflow(path):
        with tempfile.TemporaryDirectory(dir=workdir) as tmp:
            return import_onnx(tensorflow_to_onnx(path, Path(tmp), tf_inputs, tf_outputs), name=path.stem)
    if path.is_dir():
        raise MetadefError(f"{path} is a directory without saved_model.pb: not a TensorFlow SavedModel")
    return import_onnx(path, name=path.stem)


def optimize_for_file(graph: Graph, level: str | None, notes: list[str]) -> Graph:
    """The graph a file stores at ``level`` (``aggressive`` without fused groups: see the module doc)."""
    if level is None or level == "none":
        return graph
    if level not in LEVELS:
        raise MetadefError(f"unknown optimization level {level!r}; choose one of {', '.join(LEVELS)}")
    if level == "aggressive":
        log.info("%s", AGGRESSIVE_NOTE)
        notes.append(AGGRESSIVE_NOTE)
        return optimize(graph, level=level, disable_rules=FUSION_RULES)
    return optimize(graph, level=level)


def _layer_rows(graph: Graph, encodings: dict[str, EncodedTensor]) -> list[LayerError]:
    consts = {v.name: v for v in graph.constants}
    rows = []
    for name, enc in encodings.items():
        q, arr = enc.quantization, consts[name].const
        rows.append(LayerError(name, q.get("node", ""), q["scheme"], tuple(arr.shape), arr.nbytes, len(enc.blob),
                               q.get("max_abs_error", 0.0), q.get("rel_l2_error", 0.0), "sparse" in q))
    return rows


class _Stages:
    """Runs the named stages, timing each and reporting progress."""

    def __init__(self, report: ConvertReport, progress: Progress | None) -> None:
        self.report, self.progress = report, progress or (lambda stage, done, total: None)

    def run(self, name: str, fn: Callable[[], Any], total: int = 1) -> Any:
        self.progress(name, 0, total)
        t0 = time.perf_counter()
        try:
            result = fn()
        except MetadefError as e:
            raise type(e)(f"convert, stage {name}: {e}") from e
        self.report.stages.append(StageTime(name, time.perf_counter() - t0))
        self.progress(name, total, total)
        log.info("convert: %s took %.2f s", name, self.report.stages[-1].seconds)
        return result


def convert(source: str | os.PathLike, output: str | os.PathLike, *, optimize: str | None = None,
            quantize: str | None = None, prune: float | None = None,
            precision: str | os.PathLike | dict[str, str] | PrecisionPlan | None = None,
            compat_backward: str | tuple[int, int] | None = None, metadata: dict[str, Any] | None = None,
            alignment: int = 64, verify: bool = True, progress: Progress | None = None,
            tf_inputs: str | None = None, tf_outputs: str | None = None) -> ConvertReport:
    """Convert a model to one .mdef file; returns a ConvertReport (see the module docstring).

    ``quantize``: float16 | bfloat16 | int8 | int4 (weights of contractions); ``prune``:
    zero ``|w| < prune``; ``precision``: per-layer precision (YAML path, text or dict);
    ``compat_backward``: write an older format version (``"1.0"``).
    """
    output = Path(output)
    version = parse_version(compat_backward) or (1, 0)
    report = ConvertReport(str(source), output, optimize, version)
    stages = _Stages(report, progress)
    graph = stages.run("read", lambda: read_model(source, workdir=output.parent, tf_inputs=tf_inputs,
                                                  tf_outputs=tf_outputs))
    graph = stages.run("optimize", lambda: optimize_for_file(graph, optimize, report.notes))
    plan = load_precision(precision, graph)
    meta = encode_metadata(metadata) or {}
    wanted = bool(quantize or prune or plan)
    total = len(find_weights(graph)) if wanted else 0
    done: list[Weight] = []

    def tick(weight: Weight, _encoded: EncodedTensor | None) -> None:
        done.append(weight)
        stages.progress("quantize", len(done), total)

    encodings = stages.run("quantize", lambda: encode_weights(graph, quantize=quantize, prune=prune, plan=plan,
                                                              on_tensor=tick) if wanted else {}, total=total)
    stages.run("write", lambda: save_graph(graph, output, metadata=meta, alignment=alignment, version=version,
                                           encodings=encodings))
    if verify:
        stages.run("verify", lambda: _verify(output))
    before = section_sizes(graph, metadata=meta, alignment=alignment)
    with open_mdef(output, checksum_verify="never") as f:
        after = {e.name: e.length for e in f.sections} | {"file": f.size}
    report.sections = [SectionSize(name, before.get(name, 0), after.get(name, 0))
                       for name in [*before, *(n for n in after if n not in before)]]
    report.layers = _layer_rows(graph, encodings)
    return report


def _verify(path: Path) -> None:
    with open_mdef(path, checksum_verify="never") as f:
        result = f.verify()
    if not result.ok:
        raise MetadefError(f"the written file {path} does not verify: {result}")


__all__ = ["AGGRESSIVE_NOTE", "STAGES", "ConvertReport", "LayerError", "SectionSize", "StageTime", "convert",
           "optimize_for_file", "parse_version", "read_model", "tensorflow_to_onnx"]
