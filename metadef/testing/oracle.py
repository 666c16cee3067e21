"""Checking metadef against ONNX Runtime: the comparison behind ``metadef demo`` and the tests.

Example:
    >>> import metadef as md
    >>> check = compare_with_onnxruntime(md.zoo.build("mlp"), md.zoo.describe("mlp").example_inputs(batch=3))
    >>> check.ok
    True
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import onnx

import metadef as md
from metadef.core.errors import BackendError

RTOL, ATOL = 1e-4, 1e-5


@dataclass
class OutputCheck:
    name: str
    shape: tuple[int, ...]
    max_abs_err: float
    max_rel_err: float
    ok: bool


@dataclass
class OracleCheck:
    """The outcome of one model run on metadef and on ONNX Runtime with the same inputs."""

    outputs: list[OutputCheck] = field(default_factory=list)
    metadef_s: float = 0.0
    onnxruntime_s: float = 0.0

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)


def run_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of ONNX Runtime (CPU) for a model, by name."""
    try:
        import onnxruntime as ort  # the oracle is a dev dependency, loaded only when asked for
    except ImportError as e:
        raise BackendError("onnxruntime is not installed: `make demo` installs it, or "
                           "`pip install onnxruntime`") from e
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, dict(feeds))))


def compare_with_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], *,
                             graph: md.Graph | None = None, target: str = "reference",
                             rtol: float = RTOL, atol: float = ATOL, **options: Any) -> OracleCheck:
    """Run a model on metadef and on ONNX Runtime; compare every output (rtol, atol)."""
    graph = graph if graph is not None else md.import_onnx(model)
    sess = md.compile(graph, target=target, **options)
    t0 = time.perf_counter()
    ours = sess.run(feeds)
    t1 = time.perf_counter()
    theirs = run_onnxruntime(model, feeds)
    t2 = time.perf_counter()
    check = OracleCheck(metadef_s=t1 - t0, onnxruntime_s=t2 - t1)
    for name, want in theirs.items():
        got = ours[name]
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        rel = diff / np.maximum(np.abs(want.astype(np.float64)), 1e-30)
        ok = got.shape == want.shape and bool(np.allclose(got, want, rtol=rtol, atol=atol))
        check.outputs.append(OutputCheck(name, tuple(got.shape), float(diff.max(initial=0.0)),
                                         float(np.where(diff > atol, rel, 0).max(initial=0.0)), ok))
    return check


__all__ = ["ATOL", "OracleCheck", "OutputCheck", "RTOL", "compare_with_onnxruntime", "run_onnxruntime"]
