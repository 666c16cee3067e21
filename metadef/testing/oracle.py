"""Checking metadef against ONNX Runtime: the comparison behind ``metadef demo`` and the tests.

Example:
    >>> import metadef as md
    >>> check = compare_with_onnxruntime(md.zoo.build("mlp"), md.zoo.describe("mlp").example_inputs(batch=3))
    >>> check.ok
    True
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

import metadef as md
from metadef.core.dtypes import FLOAT32, FLOAT64
from metadef.core.errors import BackendError

RTOL, ATOL = 1e-4, 1e-5


@dataclass
class OutputCheck:
    """One output: the largest differences from ONNX Runtime, and whether it matches.

    When an output differs from ONNX Runtime beyond the tolerance, both are compared with the
    exact result (the graph run in float64 on the reference backend): ``truth_err`` and
    ``peer_truth_err`` are the two distances, and the output still counts as a match when
    metadef is at least as close to the exact result as ONNX Runtime is (the difference is
    then float32 rounding on both sides, not a bug).
    """

    name: str
    shape: tuple[int, ...]
    max_abs_err: float
    max_rel_err: float
    ok: bool
    truth_err: float | None = None
    peer_truth_err: float | None = None


@dataclass
class OracleCheck:
    """The outcome of one model run on metadef and on ONNX Runtime with the same inputs."""

    outputs: list[OutputCheck] = field(default_factory=list)
    metadef_s: float = 0.0
    onnxruntime_s: float = 0.0

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)


# ONNX Runtime's uint8 x int8 kernel on x86 hosts without VNNI (AVX2's ``vpmaddubsw``) adds the
# products two at a time in int16, saturating: its integer products differ from the exact ones
# (and from ours) when a pair's sum passes 32767. Weights within +-64 keep every pair exact
# (2 * 255 * 64 = 32640), the range ORT's own quantizer gives weights with ``reduce_range``.
ORT_EXACT_INT8 = 64


def ort_exact_int8(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random int8 weights ONNX Runtime multiplies with uint8 activations exactly on any x86 host.

    On hosts without AVX512-VNNI or AVX-VNNI, ORT's u8s8 products saturate a pair's int16 sum;
    weights within +-:data:`ORT_EXACT_INT8` never reach it, so an exact comparison with ORT holds
    on every machine the tests run on.

    Example:
        >>> w = ort_exact_int8(np.random.default_rng(0), (40, 30))
        >>> w.dtype, int(np.abs(w.astype(np.int32)).max()) <= ORT_EXACT_INT8
        (dtype('int8'), True)
    """
    return rng.integers(-ORT_EXACT_INT8, ORT_EXACT_INT8 + 1, shape).astype(np.int8)


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
    exact: dict[str, np.ndarray] | None = None
    for name, want in theirs.items():
        got = ours[name]
        if want.dtype == object:  # strings: equal or not
            same = got.shape == want.shape and got.tolist() == want.tolist()
            check.outputs.append(OutputCheck(name, tuple(got.shape), 0.0 if same else np.inf, 0.0, same))
            continue
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        rel = diff / np.maximum(np.abs(want.astype(np.float64)), 1e-30)
        ok = got.shape == want.shape and bool(np.allclose(got, want, rtol=rtol, atol=atol))
        out = OutputCheck(name, tuple(got.shape), float(diff.max(initial=0.0)),
                          float(np.where(diff > atol, rel, 0).max(initial=0.0)), ok)
        if not ok and got.shape == want.shape and got.dtype == np.float32:
            exact = exact if exact is not None else run_in_float64(graph, feeds)
            truth = exact[name]
            out.truth_err = float(np.abs(got - truth).max(initial=0.0))
            out.peer_truth_err = float(np.abs(want - truth).max(initial=0.0))
            out.ok = out.truth_err <= 1.5 * out.peer_truth_err + atol
        check.outputs.append(out)
    return check


def run_in_float64(graph: md.Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph's outputs computed in float64 on the reference backend: every float32 value
    and constant promoted (inside fused groups' bodies too), so what remains is (almost) the
    exact result."""
    g = graph.clone()
    _promote(g)
    wide = {k: x.astype(np.float64) if x.dtype == np.float32 else x for k, x in feeds.items()}
    return md.compile(g, target="reference").run(wide)


def _promote(g: md.Graph) -> None:
    for v in g.values():
        if v.type is not None and v.type.dtype is FLOAT32:
            v.type = v.type.with_dtype(FLOAT64)
        if v.const is not None and v.const.dtype == np.float32:
            v.const = v.const.astype(np.float64)
    for n in g.nodes:
        if n.attrs.get("to") == FLOAT32.onnx and "to" in n.metaop.attrs:  # casts to f32 become casts to f64
            n.attrs = {**n.attrs, "to": FLOAT64.onnx}
        for a in n.attrs.values():
            if isinstance(a, md.Graph):
                _promote(a)


__all__ = ["ATOL", "OracleCheck", "OutputCheck", "RTOL", "compare_with_onnxruntime", "run_in_float64",
           "run_onnxruntime"]
