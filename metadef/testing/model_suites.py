"""The ONNX model test suites shipped with the installed onnx: ``simple``, ``pytorch-converted``,
``pytorch-operator`` and ``light``.

The first three are directories of cases, each a ``model.onnx`` and ``test_data_set_*/`` of
``input_*.pb`` / ``output_*.pb`` (tolerances in an optional ``data.json``). The ``light`` suite
is the ``real`` model tests (AlexNet, ResNet-50, ...) with their weights replaced by
``ConstantOfShape``: ``light/light_<name>.onnx`` and the stored ``light_<name>_output_0.pb``;
the input is made as ONNX's own backend runner makes it (``Runner.generate_dummy_data`` with
``seed=0, random=False``), the tolerances come from the ``real/test_<name>/data.json``.

Every case takes the node tests' path (``conformance.check_model``): import, compile for a
target, run, compare. A case's result is grouped under its suite's name.

Example:
    >>> [c.name for c in load_suite("simple")][:2]
    ['test_expand_shape_model1', 'test_expand_shape_model2']
    >>> report = run_suite("pytorch-operator", pattern="relu|selu")    # doctest: +SKIP
    >>> report.totals()["pass"]                                       # doctest: +SKIP
    1
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.loader import DATA_DIR
from onnx.backend.test.runner import Runner

from metadef.testing.conformance import CaseResult, DataSet, Report, check_model, quiet_cases
from metadef.testing.known_failures import MODEL_KNOWN_FAILURES, MODEL_KNOWN_FAILURES_ON_TARGET

SUITES: tuple[str, ...] = ("simple", "pytorch-converted", "pytorch-operator", "light")

_LIGHT_URL = "onnx/backend/test/data/light/"
_RTOL, _ATOL = 1e-3, 1e-7  # onnx's loader defaults


@dataclass(frozen=True)
class ModelCase:
    """One model test: where its model lies, its tolerances, and where its data lies
    (``data_dirs`` for a directory case; ``expected`` output files for a light case, whose
    inputs are generated).

    Example:
        >>> case = load_suite("light")[0]
        >>> case.name, case.suite, case.rtol
        ('test_bvlc_alexnet', 'light', 0.001)
    """

    name: str
    suite: str
    model_path: Path
    rtol: float = _RTOL
    atol: float = _ATOL
    data_dirs: tuple[Path, ...] = ()
    expected: tuple[Path, ...] = ()

    def load(self) -> tuple[onnx.ModelProto, list[DataSet]]:
        """The model and its data sets (inputs and expected outputs, in graph order).

        Example:
            >>> model, data_sets = load_suite("simple")[0].load()
            >>> len(data_sets), data_sets[0][0][0].dtype
            (1, dtype('float32'))
        """
        model = onnx.load(self.model_path)
        if self.suite == "light":
            return model, [(light_inputs(model, self.name), _values(self.expected, model.graph.output))]
        data_sets = []
        for d in self.data_dirs:
            inputs = sorted(d.glob("input_*.pb"), key=_index)
            outputs = sorted(d.glob("output_*.pb"), key=_index)
            data_sets.append((_values(inputs, model.graph.input), _values(outputs, model.graph.output)))
        return model, data_sets


def load_suite(suite: str) -> list[ModelCase]:
    """The cases of one suite, sorted by name.

    Example:
        >>> len(load_suite("pytorch-operator"))
        35
    """
    if suite not in SUITES:
        raise ValueError(f"unknown model suite {suite!r}; choose from {', '.join(SUITES)}")
    return list(_cases(suite))


@functools.cache
def _cases(suite: str) -> tuple[ModelCase, ...]:
    data = Path(DATA_DIR)
    if suite == "light":
        return tuple(sorted(_light_cases(data), key=lambda c: c.name))
    cases = []
    for case_dir in sorted(p for p in (data / suite).iterdir() if (p / "model.onnx").exists()):
        tol = json.loads((case_dir / "data.json").read_text()) if (case_dir / "data.json").exists() else {}
        cases.append(ModelCase(case_dir.name, suite, case_dir / "model.onnx",
                               tol.get("rtol", _RTOL), tol.get("atol", _ATOL),
                               tuple(sorted(case_dir.glob("test_data_set*")))))
    return tuple(cases)


def _light_cases(data: Path) -> Iterable[ModelCase]:
    """The ``real`` cases whose url names a local light model, as onnx's runner reads them."""
    site = data.parents[3]  # .../site-packages: the url is relative to it
    for real in (data / "real").iterdir():
        if not (real / "data.json").exists():
            continue
        spec = json.loads((real / "data.json").read_text())
        if not spec.get("url", "").startswith(_LIGHT_URL):
            continue
        model_path = site / spec["url"]
        prefix = model_path.with_suffix("")
        expected = tuple(sorted(prefix.parent.glob(f"{prefix.name}_output_*.pb"), key=_index))
        yield ModelCase(real.name, "light", model_path, spec.get("rtol", _RTOL), spec.get("atol", _ATOL),
                        expected=expected)


def light_inputs(model: onnx.ModelProto, name: str = "") -> list[np.ndarray]:
    """The inputs onnx's backend runner feeds a light model: one per graph input that is not an
    initializer, made by ``Runner.generate_dummy_data(x, seed=0, random=False)`` (``arange / n``
    in the declared shape, a free dim read as 1).

    Example:
        >>> model, _ = load_suite("light")[0].load()
        >>> x = light_inputs(model)[0]
        >>> x.shape, bool(x.flat[1] == np.float32(1 / x.size))
        ((1, 3, 224, 224), True)
    """
    inits = {i.name for i in model.graph.initializer}
    return [Runner.generate_dummy_data(x, seed=0, name=name, random=False)
            for x in model.graph.input if x.name not in inits]


def _index(path: Path) -> int:
    return int(re.findall(r"_(\d+)\.pb$", path.name)[0])


def _values(paths: Iterable[Path], infos: Any) -> list[Any]:
    """Read each .pb as its value info's type says (as ``Runner._load_proto`` does): a tensor
    as an array, a sequence as a list, an optional as its value or None."""
    values: list[Any] = []
    for path, info in zip(paths, infos):
        content = path.read_bytes()
        kind = info.type.WhichOneof("value")
        if kind == "sequence_type":
            seq = onnx.SequenceProto()
            seq.ParseFromString(content)
            values.append(numpy_helper.to_list(seq))
        elif kind == "optional_type":
            opt = onnx.OptionalProto()
            opt.ParseFromString(content)
            values.append(numpy_helper.to_optional(opt))
        else:
            tensor = onnx.TensorProto()
            tensor.ParseFromString(content)
            values.append(numpy_helper.to_array(tensor))
    return values


def run_model_case(case: ModelCase, target: str = "reference") -> CaseResult:
    """Run one model case (or report it known, with its reason: on every target, or on
    ``target`` only).

    Example:
        >>> case = next(c for c in load_suite("simple") if c.name == "test_single_relu_model")
        >>> run_model_case(case).status
        'pass'
    """
    known = MODEL_KNOWN_FAILURES.get(case.name) or MODEL_KNOWN_FAILURES_ON_TARGET.get(target, {}).get(case.name)
    if known:
        return CaseResult(case.name, case.suite, "known", known)
    try:
        model, data_sets = case.load()
    except Exception as e:  # unreadable data: a failure of the case, not of the run
        return CaseResult(case.name, case.suite, "fail", f"loading {type(e).__name__}: {e}"[:300])
    return check_model(case.name, case.suite, model, data_sets, rtol=case.rtol, atol=case.atol, target=target)


def run_suite(suite: str | Iterable[str], target: str = "reference", pattern: str | None = None,
              progress: Callable[[int, int, str], None] | None = None) -> Report:
    """Run one suite (or several, or ``"all"``), optionally only the cases whose name matches
    ``pattern``, compiled for ``target``. ``progress(done, total, name)`` is called after each.

    Example:
        >>> report = run_suite("simple", pattern="relu")
        >>> report.totals()["pass"], report.by_op()
        (1, {'simple': {'pass': 1}})
    """
    suites = SUITES if suite == "all" else (suite,) if isinstance(suite, str) else tuple(suite)
    cases = [c for s in suites for c in load_suite(s) if pattern is None or re.search(pattern, c.name)]
    report = Report()
    with quiet_cases():
        for i, case in enumerate(cases):
            report.results.append(run_model_case(case, target))
            if progress is not None:
                progress(i + 1, len(cases), case.name)
    return report
