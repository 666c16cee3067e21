"""The ONNX backend node-test conformance harness.

Each case from ``onnx.backend.test.case.node.collect_testcases`` (a one-node model, or its
``_expanded`` function body, with input and expected output arrays) goes through
``metadef.import_onnx`` and the reference backend; outputs are compared with the case's own
tolerances. A case is ``pass``, ``fail`` (wrong numbers or an unexpected error),
``unsupported`` (an op or dtype metadef does not cover: a typed error said so) or
``known`` (a listed expected failure, with its reason, see ``known_failures``).

Example:
    >>> report = run_cases(op="Relu")            # doctest: +SKIP
    >>> report.totals()["pass"] > 0              # doctest: +SKIP
    True
"""

from __future__ import annotations

import functools
import io
import logging
import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

import metadef as md
from metadef.core.errors import DTypeError, MetadefError, UnsupportedOpError
from metadef.frontends.onnx.specialize import import_for
from metadef.testing.known_failures import KNOWN_FAILURES

# The ops the Foundation issue lists (CNNs, transformers, MLPs at opsets 11-21).
FOUNDATION_OPS: tuple[str, ...] = (
    "Conv", "ConvTranspose", "BatchNormalization", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu",
    "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf", "Gelu", "Softmax", "LogSoftmax",
    "LayerNormalization", "InstanceNormalization", "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Exp",
    "Log", "Neg", "Abs", "Floor", "Ceil", "Round", "Reciprocal", "Min", "Max", "Equal", "Less",
    "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "IsNaN", "Where", "Cast",
    "MatMul", "Gemm", "Einsum", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ArgMax", "ArgMin",
    "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice", "Gather",
    "GatherElements", "GatherND", "ScatterND", "Expand", "Tile", "Pad", "Shape", "Size",
    "ConstantOfShape", "Range", "Identity", "Dropout", "Resize", "DepthToSpace", "SpaceToDepth",
    "TopK", "CumSum", "OneHot",
)


@dataclass(frozen=True)
class CaseResult:
    name: str
    op: str
    status: str          # pass | fail | unsupported | known
    detail: str = ""
    fallbacks: tuple[str, ...] = ()
    """On a compiled target: why each node that fell back to its reference kernel did."""


@dataclass
class Report:
    results: list[CaseResult] = field(default_factory=list)

    def totals(self) -> dict[str, int]:
        c = Counter(r.status for r in self.results)
        counts = {k: c.get(k, 0) for k in ("pass", "fail", "unsupported", "known")}
        return counts | {"total": len(self.results)}

    def by_op(self) -> dict[str, dict[str, int]]:
        table: dict[str, Counter] = {}
        for r in self.results:
            table.setdefault(r.op, Counter())[r.status] += 1
        return {op: dict(c) for op, c in sorted(table.items())}

    def failures(self) -> list[CaseResult]:
        return [r for r in self.results if r.status == "fail"]

    def fallbacks(self) -> Counter[str]:
        """On a compiled target: the reasons nodes fell back to reference kernels, counted."""
        return Counter(reason for r in self.results for reason in r.fallbacks)


@functools.lru_cache(maxsize=1)
def all_cases() -> tuple[Any, ...]:
    """Every node test case of the installed onnx (generated once per process, ~12 s)."""
    from onnx.backend.test.case import node  # heavy: only when conformance runs

    with warnings.catch_warnings(), redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        return tuple(node.collect_testcases(None))


def case_op(case: Any) -> str:
    """The op a case tests: its single node's op, or, for ``_expanded`` cases, the op of the
    unexpanded case of the same name."""
    nodes = case.model.graph.node
    if not case.name.endswith(("_expanded", "_expanded_ver18")) and nodes:
        return nodes[-1].op_type
    base = re.sub(r"_expanded(_ver18)?$", "", case.name)
    return _op_by_name().get(base, nodes[-1].op_type if nodes else "?")


@functools.lru_cache(maxsize=1)
def _op_by_name() -> dict[str, str]:
    return {c.name: c.model.graph.node[-1].op_type for c in all_cases()
            if c.model.graph.node and "_expanded" not in c.name}


def _compare(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> str | None:
    want = np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape} != expected {want.shape}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != expected {want.dtype}"
    if want.dtype == object:  # strings: equal element by element
        bad = sum(g != w for g, w in zip(got.reshape(-1).tolist(), want.reshape(-1).tolist()))
        return None if bad == 0 else f"{bad} of {want.size} strings differ"
    if want.dtype.kind in "biu" or want.dtype == np.bool_:
        bad = int(np.sum(got != want))
        return None if bad == 0 else f"{bad} of {want.size} elements differ"
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    close = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
    if close.all():
        return None
    worst = float(np.nanmax(np.abs(g - w)[~close])) if (~close).any() else 0.0
    return f"{int((~close).sum())} of {w.size} elements off (max abs err {worst:.3g})"


def _arrays(values: list[Any]) -> list[Any]:
    """Case data as numpy: TensorProtos (float8, int4, bfloat16 data) are converted, in
    sequences (lists) too; SequenceProto and OptionalProto become lists and None."""
    return [_value(v) for v in values]


def _value(v: Any) -> Any:
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, onnx.SequenceProto):
        return _value(numpy_helper.to_list(v))
    if isinstance(v, onnx.OptionalProto):
        return _value(numpy_helper.to_optional(v))
    if isinstance(v, (list, tuple)):
        return [_value(x) for x in v]
    return v


def _compare_value(got: Any, want: Any, rtol: float, atol: float) -> str | None:
    """Why an output (a tensor, a list for a sequence, None for an empty optional) differs
    from the expected one, or None."""
    if want is None or got is None:
        return None if got is None and want is None else f"got {type(got).__name__}, expected {type(want).__name__}"
    if isinstance(want, (list, tuple)) or isinstance(got, (list, tuple)):
        if not isinstance(got, (list, tuple)) or not isinstance(want, (list, tuple)):
            return f"got {type(got).__name__}, expected {type(want).__name__}"
        if len(got) != len(want):
            return f"a sequence of {len(got)} items, expected {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            why = _compare_value(g, w, rtol, atol)
            if why is not None:
                return f"item {i}: {why}"
        return None
    return _compare(np.asarray(got), np.asarray(want), rtol, atol)


def run_case(case: Any, target: str = "reference") -> CaseResult:
    """Import, compile (for ``target``) and run one case; compare every output. On a compiled
    target, the nodes that fell back to reference kernels are listed with their reasons."""
    op = case_op(case)
    if case.name in KNOWN_FAILURES:
        return CaseResult(case.name, op, "known", KNOWN_FAILURES[case.name])
    return check_model(case.name, op, case.model, case.data_sets,
                       rtol=case.rtol, atol=case.atol, target=target)


DataSet = tuple[list[Any], list[Any]]
"""One run of a case: its input values and its expected outputs, in graph order."""


def check_model(name: str, op: str, model: onnx.ModelProto, data_sets: Iterable[DataSet], *,
                rtol: float, atol: float, target: str = "reference") -> CaseResult:
    """The path every case takes, node test or model suite: import ``model``, compile it for
    ``target``, run each data set and compare every output within ``rtol`` / ``atol``.

    A typed ``UnsupportedOpError`` or ``DTypeError`` makes the case ``unsupported``; any other
    error, or a wrong number, makes it ``fail``. ``op`` is what the report groups it under.
    Sequences (lists) and optionals (None) in the data are fed as such: the model is imported
    specialized on each structure the data sets have (``frontends.onnx.specialize.import_for``),
    and list and None outputs are compared item by item.

    Example:
        >>> import numpy as np
        >>> from metadef.testing.onnx_cases import one_node_model
        >>> x = np.array([-1.0, 2.0], np.float32)
        >>> r = check_model("relu", "Relu", one_node_model("Relu", {"x": x}),
        ...                 [([x], [np.maximum(x, 0)])], rtol=1e-6, atol=0.0)
        >>> r.status
        'pass'
    """
    fallbacks: tuple[str, ...] = ()
    sessions: list[md.Session] = []  # one per structure of the data sets' sequences and optionals
    initializers = {t.name for t in model.graph.initializer}
    graph_inputs = [vi for vi in model.graph.input if vi.name not in initializers]

    def session(feeds: dict[str, Any]) -> md.Session:
        nonlocal fallbacks
        for sess in sessions:
            if sess.structure is None or sess.structure.accepts(feeds):
                return sess
        sess = md.compile(import_for(model, feeds), target=target)  # specialized on the feeds' structure
        fallbacks = tuple(f"{p.op}: {p.reason}"[:160] for p in getattr(sess.executable, "fallbacks", []))
        sessions.append(sess)
        return sess

    try:
        data_sets = [(_arrays(inputs), _arrays(outputs)) for inputs, outputs in data_sets]
        first = data_sets[0][0] if data_sets else []
        session(dict(zip((vi.name for vi in graph_inputs), first)))  # import errors come first
        for inputs, outputs in data_sets:
            feeds = {vi.name: x if x is None or isinstance(x, list) else np.asarray(x)
                     for vi, x in zip(graph_inputs, inputs)}
            got = session(feeds).run(feeds)
            for (out, value), want in zip(got.items(), outputs):
                why = _compare_value(value, want, rtol, atol)
                if why is not None:
                    return CaseResult(name, op, "fail", f"output {out}: {why}", fallbacks)
    except (UnsupportedOpError, DTypeError) as e:
        return CaseResult(name, op, "unsupported", f"{type(e).__name__}: {e}"[:300])
    except MetadefError as e:
        return CaseResult(name, op, "fail", f"{type(e).__name__}: {e}"[:300], fallbacks)
    except Exception as e:  # a bug in metadef: report it as a failure, keep going
        return CaseResult(name, op, "fail", f"crash {type(e).__name__}: {e}"[:300], fallbacks)
    return CaseResult(name, op, "pass", "", fallbacks)


@contextmanager
def quiet_cases() -> Iterator[None]:
    """Silence what test cases provoke on purpose: warnings, and the shape log's warnings
    (node tests slice past dims, model suites declare shapes loosely)."""
    shape_log = logging.getLogger("metadef.shape")
    level = shape_log.level
    shape_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        shape_log.setLevel(level)


def run_cases(op: str | Iterable[str] | None = None, pattern: str | None = None,
              progress: Callable[[int, int], None] | None = None, target: str = "reference") -> Report:
    """Run the cases of some ops (or all), optionally those whose name matches ``pattern``,
    compiled for ``target``."""
    ops = {op} if isinstance(op, str) else set(op) if op is not None else None
    cases = [c for c in all_cases()
             if (ops is None or case_op(c) in ops) and (pattern is None or re.search(pattern, c.name))]
    report = Report()
    with quiet_cases():
        for i, case in enumerate(cases):
            report.results.append(run_case(case, target))
            if progress is not None:
                progress(i + 1, len(cases))
    return report


def format_report(report: Report, *, show_failures: bool = True) -> str:
    """Per-op table and totals as plain text."""
    lines = [f"{'op':28} {'pass':>5} {'fail':>5} {'unsup':>5} {'known':>5}"]
    for op, c in report.by_op().items():
        lines.append(f"{op:28} {c.get('pass', 0):5} {c.get('fail', 0):5} "
                     f"{c.get('unsupported', 0):5} {c.get('known', 0):5}")
    t = report.totals()
    lines.append(f"{'TOTAL':28} {t['pass']:5} {t['fail']:5} {t['unsupported']:5} {t['known']:5}"
                 f"   ({t['total']} cases)")
    fallbacks = report.fallbacks()
    if fallbacks:
        cases = sum(1 for r in report.results if r.fallbacks)
        lines.append(f"fallbacks to reference kernels: {sum(fallbacks.values())} nodes in {cases} cases")
        for reason, count in fallbacks.most_common(12 if show_failures else 5):
            lines.append(f"  {count:5} x {reason}")
    if show_failures:
        for r in report.failures():
            lines.append(f"FAIL {r.name} [{r.op}]: {r.detail}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m metadef.testing.conformance [--op OP ...] [-k PATTERN]``."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", action="append", help="only cases of this op (repeatable)")
    ap.add_argument("-k", dest="pattern", help="only cases whose name matches this regex")
    ap.add_argument("-v", action="store_true", help="list unsupported cases too")
    args = ap.parse_args(argv)
    report = run_cases(args.op, args.pattern)
    print(format_report(report))
    if args.v:
        for r in report.results:
            if r.status == "unsupported":
                print(f"UNSUPPORTED {r.name} [{r.op}]: {r.detail}")
    return 0 if not report.failures() else 1


if __name__ == "__main__":
    raise SystemExit(main())
