"""GatherElements, GatherND, ScatterND and ScatterElements inside the native program
(``metadef.backends.x86.indexing``) against the reference backend and ONNX Runtime: ranks,
axes, negative indices, batch_dims, dtypes, reductions, symbolic dims at several sizes; every
index checked (InputError naming the node and the range); the cases left to the reference
say why."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import metadef as md
from metadef.codegen.jit import compile_count
from metadef.core.errors import BackendError, InputError

pytestmark = pytest.mark.jit

RNG = np.random.default_rng(11)
Feeds = dict[str, np.ndarray]


def _model(op: str, inputs: Sequence[tuple[str, Any, Sequence[Any]]], opset: int = 18, **attrs: Any
           ) -> onnx.ModelProto:
    """One ``op`` node named ``node`` reading ``inputs`` ((name, dtype, shape), dims may be
    symbols) and writing ``y`` of the first input's dtype."""
    types = [helper.np_dtype_to_tensor_dtype(np.dtype(dtype)) for _, dtype, _ in inputs]
    graph = helper.make_graph([helper.make_node(op, [n for n, _, _ in inputs], ["y"], name="node", **attrs)], "g",
                              [helper.make_tensor_value_info(n, t, list(s)) for (n, _, s), t in zip(inputs, types)],
                              [helper.make_tensor_value_info("y", types[0], None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _values(shape: Sequence[int], dtype: Any) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return RNG.random(shape) < 0.5
    if dtype.kind in "iu":
        return RNG.integers(1, 9, shape).astype(dtype)
    if dtype.kind == "c":
        return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def _check(model: onnx.ModelProto, runs: Sequence[tuple[dict[str, int], Feeds]], kind: str, *,
           onnxruntime: bool = True, reference: bool = True, exact: bool = True) -> md.Session:
    """Each run (symbols, feeds) on x86 equals the reference's and ONNX Runtime's output, the
    step running natively with a ``kind`` call; new sizes compile nothing."""
    sess = md.compile(md.import_onnx(model), target="x86")
    assert sess.executable.plan[0].kind == "native", sess.executable.plan[0].reason
    oracles = []
    if reference:
        ref = md.compile(md.import_onnx(model), target="reference")
        oracles.append(lambda feeds: ref.run(feeds)["y"])
    if onnxruntime:
        theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        oracles.append(lambda feeds: theirs.run(None, feeds)[0])
    sess.run(runs[0][1])
    compiled = compile_count()
    for symbols, feeds in runs:
        got = sess.run(feeds)["y"]
        for oracle in oracles:
            want = oracle(feeds)
            assert got.dtype == want.dtype and got.shape == want.shape
            if exact:
                np.testing.assert_array_equal(got, want)
            else:
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        program = sess.executable.programs.bound(symbols)
        try:
            assert program.python_steps == 0, program.python_reasons
            assert program.call_kinds[kind] == (1 if np.prod(feeds["i"].shape) else 0)
        finally:
            sess.executable.programs.give_back(program)
    assert compile_count() == compiled  # new sizes compile nothing
    return sess


def _indices(shape: Sequence[int], size: int, dtype: Any = np.int64) -> np.ndarray:
    """Indices into an axis of ``size``, negative ones among them."""
    return RNG.integers(-size, size, shape).astype(dtype) if size else np.zeros(shape, dtype)


# --------------------------------------------------------------------------- GatherElements


@pytest.mark.parametrize(("data", "indices", "axis"), [
    ((7,), (9,), 0), (("n", 6), ("n", 3), 1), ((4, "n"), (2, "n"), 0), ((3, "n", 5), (3, "n", 2), -1),
    (("n", 4, 5), ("n", 7, 5), 1), ((2, 3, "n", 5), (2, 3, "n", 5), 0)])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_gather_elements_matches_the_reference_and_onnxruntime(data: tuple, indices: tuple, axis: int,
                                                               index_dtype: Any) -> None:
    model = _model("GatherElements", [("x", np.float32, data), ("i", index_dtype, indices)], axis=axis)
    runs = []
    for n in (3, 1, 0):
        shape, index_shape = (tuple(n if d == "n" else d for d in s) for s in (data, indices))
        feeds = {"x": _values(shape, np.float32), "i": _indices(index_shape, shape[axis], index_dtype)}
        runs.append(({"n": n}, feeds))
    _check(model, runs, "gather elements")


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.float16, np.int32, np.float64, np.int64])
def test_gather_elements_moves_every_element_size(dtype: Any) -> None:
    model = _model("GatherElements", [("x", dtype, [5, 8]), ("i", np.int64, [5, 11])], axis=1)
    _check(model, [({}, {"x": _values((5, 8), dtype), "i": _indices((5, 11), 8)})], "gather elements")


def test_gather_elements_with_indices_smaller_than_the_data_follows_onnx() -> None:
    """ONNX lets the indices be smaller on the other axes (ONNX Runtime computes it); the
    reference's take_along_axis refuses, so only ONNX Runtime is the oracle here."""
    model = _model("GatherElements", [("x", np.float32, [4, 6, 5]), ("i", np.int64, [2, 3, 4])], axis=1)
    feeds = {"x": _values((4, 6, 5), np.float32), "i": _indices((2, 3, 4), 6)}
    _check(model, [({}, feeds)], "gather elements", reference=False)
    with pytest.raises(BackendError):
        md.compile(md.import_onnx(model), target="reference").run(feeds)


# ------------------------------------------------------------------------------- GatherND


@pytest.mark.parametrize(("data", "indices", "batch_dims"), [
    ((5, 4, 3), (6, 1), 0), ((5, 4, 3), (6, 2), 0), ((5, 4, 3), (2, 3, 3), 0), (("n", 4, 3), ("n", 2, 1), 1),
    (("n", 4, 3), ("n", 5, 2), 1), (("n", 4, 3, 2), ("n", 4, 5, 1), 2), (("n", 4, 3, 2), ("n", 4, 2), 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float64])
def test_gather_nd_matches_the_reference_and_onnxruntime(data: tuple, indices: tuple, batch_dims: int,
                                                         dtype: Any) -> None:
    model = _model("GatherND", [("x", dtype, data), ("i", np.int64, indices)], batch_dims=batch_dims)
    runs = []
    for n in (3, 1, 0):
        shape, index_shape = (tuple(n if d == "n" else d for d in s) for s in (data, indices))
        columns = [_indices((*index_shape[:-1], 1), shape[batch_dims + j]) for j in range(index_shape[-1])]
        feeds = {"x": _values(shape, dtype), "i": np.concatenate(columns, -1)}
        runs.append(({"n": n}, feeds))
    _check(model, runs, "gather nd")


@pytest.mark.parametrize("dtype", [np.bool_, np.float16, np.uint8])
def test_gather_nd_of_single_small_elements(dtype: Any) -> None:
    model = _model("GatherND", [("x", dtype, [4, 3]), ("i", np.int64, [5, 2])])
    feeds = {"x": _values((4, 3), dtype), "i": np.stack([_indices(5, 4), _indices(5, 3)], 1)}
    _check(model, [({}, feeds)], "gather nd")


# ------------------------------------------------------------------------------ ScatterND


def _rows(count: int, size: int) -> np.ndarray:
    """``count`` distinct indices into an axis of ``size``, some negative."""
    picked = RNG.permutation(size)[:count]
    return np.where(RNG.random(count) < 0.5, picked - size, picked).astype(np.int64)


@pytest.mark.parametrize(("indices", "updates"), [((3, 1), (3, 5, 4)), ((4, 2), (4, 4)), ((2, 2, 3), (2, 2))])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
def test_scatter_nd_matches_the_reference_and_onnxruntime(indices: tuple, updates: tuple, dtype: Any) -> None:
    data = (6, 5, 4)
    model = _model("ScatterND", [("x", dtype, data), ("i", np.int64, indices), ("u", dtype, updates)])
    k, count = indices[-1], int(np.prod(indices[:-1]))
    flat = RNG.permutation(int(np.prod(data[:k])))[:count]  # distinct tuples (ONNX leaves repeats undefined)
    tuples = np.stack(np.unravel_index(flat, data[:k]), -1).reshape(indices)
    tuples = np.where(RNG.random(indices) < 0.3, tuples - np.array(data[:k]), tuples)
    _check(model, [({}, {"x": _values(data, dtype), "i": tuples, "u": _values(updates, dtype)})], "scatter nd")


def test_scatter_nd_with_a_symbolic_batch_and_repeated_indices_keeps_the_last_update() -> None:
    model = _model("ScatterND", [("x", np.float32, ["n", 7]), ("i", np.int64, ["m", 1]),
                                 ("u", np.float32, ["m", 7])])
    runs = []
    for n, m in ((5, 3), (2, 6), (4, 0)):
        feeds = {"x": _values((n, 7), np.float32), "i": _indices((m, 1), n), "u": _values((m, 7), np.float32)}
        runs.append(({"n": n, "m": m}, feeds))
    runs[1][1]["i"][:3] = [[1], [-1], [1]]  # repeated (1 twice, and -1 is the last row n - 1 = 1)
    _check(model, runs, "scatter nd", onnxruntime=False)


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float64, np.int32])
def test_scatter_nd_reductions_combine_repeated_indices(reduction: str, dtype: Any) -> None:
    model = _model("ScatterND", [("x", dtype, [6, 11]), ("i", np.int64, [9, 1]), ("u", dtype, [9, 11])],
                   reduction=reduction)
    feeds = {"x": _values((6, 11), dtype), "i": _indices((9, 1), 6), "u": _values((9, 11), dtype)}
    _check(model, [({}, feeds)], "scatter nd reduce", onnxruntime=dtype in (np.float32, np.int64, np.float64),
           exact=np.dtype(dtype).kind != "f")


# ------------------------------------------------------------------------ ScatterElements


@pytest.mark.parametrize(("data", "indices", "axis"), [
    ((9,), (4,), 0), (("n", 6), ("n", 3), 1), ((5, "n"), (2, "n"), 0), ((3, "n", 5), (2, "n", 2), -1),
    (("n", 4, 5), ("n", 3, 5), 1)])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_scatter_elements_matches_the_reference_and_onnxruntime(data: tuple, indices: tuple, axis: int,
                                                                index_dtype: Any) -> None:
    model = _model("ScatterElements", [("x", np.float32, data), ("i", index_dtype, indices),
                                       ("u", np.float32, indices)], axis=axis)
    runs = []
    for n in (3, 1, 0):
        shape, index_shape = (tuple(n if d == "n" else d for d in s) for s in (data, indices))
        lines = np.moveaxis(np.zeros(index_shape, index_dtype), axis, -1)  # distinct along the axis per line
        lines[...] = _rows(lines.shape[-1], shape[axis]) if lines.size else 0
        feeds = {"x": _values(shape, np.float32), "i": np.ascontiguousarray(np.moveaxis(lines, -1, axis)),
                 "u": _values(index_shape, np.float32)}
        runs.append(({"n": n}, feeds))
    _check(model, runs, "scatter elements")


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float64, np.int64])
def test_scatter_elements_reductions_and_repeats_match_the_reference(reduction: str, dtype: Any) -> None:
    model = _model("ScatterElements", [("x", dtype, [4, 6]), ("i", np.int64, [4, 9]), ("u", dtype, [4, 9])],
                   axis=1, reduction=reduction)
    feeds = {"x": _values((4, 6), dtype), "i": _indices((4, 9), 6), "u": _values((4, 9), dtype)}
    feeds["x"][0, 0] = feeds["u"][1, 2] = np.nan if np.dtype(dtype).kind == "f" else 0  # (max and min keep NaN)
    kind = "scatter elements" if reduction == "none" else "scatter elements reduce"
    _check(model, [({}, feeds)], kind, onnxruntime=False)


# ------------------------------------------------------------------- indices out of range


@pytest.mark.parametrize(("model", "feeds", "message"), [
    (_model("GatherElements", [("x", np.float32, [3, 6]), ("i", np.int32, [3, 2])], axis=1),
     {"x": np.zeros((3, 6), np.float32), "i": np.array([[0, 1], [6, 0], [0, 0]], np.int32)},
     r"GatherElements node: index 6 is out of range for axis 1 of %x, which has 6 entries \(valid: -6 to 5\)"),
    (_model("GatherND", [("x", np.float32, [2, 4, 3]), ("i", np.int64, [2, 5, 2])], batch_dims=1),
     {"x": np.zeros((2, 4, 3), np.float32), "i": np.array([[[0, 0]] * 5, [[1, 2]] * 4 + [[0, -4]]], np.int64)},
     r"GatherND node: index -4 is out of range for axis 2 of %x, which has 3 entries \(valid: -3 to 2\)"),
    (_model("ScatterND", [("x", np.float32, [4, 3]), ("i", np.int64, [2, 1]), ("u", np.float32, [2, 3])]),
     {"x": np.zeros((4, 3), np.float32), "i": np.array([[1], [2**40]], np.int64), "u": np.ones((2, 3), np.float32)},
     rf"ScatterND node: index {2**40} is out of range for axis 0 of %x, which has 4 entries \(valid: -4 to 3\)"),
    (_model("ScatterElements", [("x", np.float32, [4, 3]), ("i", np.int64, [1, 3]), ("u", np.float32, [1, 3])],
            reduction="add"),
     {"x": np.zeros((4, 3), np.float32), "i": np.array([[0, -2**62, 3]], np.int64), "u": np.ones((1, 3), np.float32)},
     r"ScatterElements node: index -4611686018427387904 is out of range for axis 0 of %x, which has 4 entries"),
])
def test_an_index_out_of_range_raises_naming_the_node_and_the_range(model: onnx.ModelProto, feeds: Feeds,
                                                                     message: str) -> None:
    sess = md.compile(md.import_onnx(model), target="x86")
    assert sess.executable.plan[0].kind == "native"
    with pytest.raises(InputError, match=message):
        sess.run(feeds)
    good = {k: np.zeros_like(v) if k == "i" else v for k, v in feeds.items()}
    want = md.compile(md.import_onnx(model), target="reference").run(good)["y"]
    np.testing.assert_array_equal(sess.run(good)["y"], want)  # usable again, nothing left raised


# ------------------------------------------------------------------------------ fallbacks


def test_a_reduction_the_routines_do_not_combine_runs_its_reference_and_says_why() -> None:
    model = _model("ScatterND", [("x", np.uint8, [4, 3]), ("i", np.int64, [2, 1]), ("u", np.uint8, [2, 3])],
                   reduction="add")
    sess = md.compile(md.import_onnx(model), target="x86")
    step = sess.executable.plan[0]
    assert step.kind == "reference" and "reduction 'add' on uint8" in step.reason
    feeds = {"x": _values((4, 3), np.uint8), "i": np.array([[1], [1]], np.int64), "u": _values((2, 3), np.uint8)}
    want = md.compile(md.import_onnx(model), target="reference").run(feeds)["y"]
    np.testing.assert_array_equal(sess.run(feeds)["y"], want)


def test_gather_elements_broadcasting_the_data_runs_from_python_and_says_why() -> None:
    """Indices larger than the data on another axis: the reference broadcasts the data, which
    the routine does not; that binding's step runs from Python with the reason."""
    model = _model("GatherElements", [("x", np.float32, [1, 6]), ("i", np.int64, ["n", 2])], axis=1)
    sess = md.compile(md.import_onnx(model), target="x86")
    program = sess.executable.programs.bound({"n": 3})
    try:
        assert program.python_steps == 1 and "exceed data [1, 6] on axis 0" in program.python_reasons[0][1]
    finally:
        sess.executable.programs.give_back(program)
    feeds = {"x": _values((1, 6), np.float32), "i": _indices((3, 2), 6)}
    want = md.compile(md.import_onnx(model), target="reference").run(feeds)["y"]
    np.testing.assert_array_equal(sess.run(feeds)["y"], want)


@pytest.mark.slow
def test_the_onnx_node_tests_pass_on_x86_and_run_natively() -> None:
    from metadef.testing.conformance import format_report, run_cases

    report = run_cases(("GatherElements", "GatherND", "ScatterND", "ScatterElements", "Scatter"), target="x86")
    assert report.totals()["pass"] == report.totals()["total"] >= 22, format_report(report)
    assert not report.fallbacks(), format_report(report)
