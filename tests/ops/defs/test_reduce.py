"""Reductions and scans: shape inference, errors, old-opset adapters, numerics against ORT."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metadef as md
from metadef.core.errors import AttributeError_, ShapeError
from metadef.ops import get_op, infer_types
from metadef.ops.defs.reduce import reduce_expression, reduce_reference
from metadef.ops.numpy_eval.evaluate import evaluate
from metadef.shape import parse_type
from metadef.testing.onnx_cases import assert_same as assert_outputs_same
from metadef.testing.onnx_cases import one_node_model, run_both

REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
              "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]
ALL_OPS = [*REDUCE_OPS, "ArgMax", "ArgMin", "CumSum", "TopK"]


def infer(op: str, types: list[str | None], attrs: dict | None = None,
          values: list | None = None) -> list[str]:
    ins = [None if t is None else parse_type(t) for t in types]
    vals = [None if v is None else np.asarray(v, np.int64) for v in (values or [])]
    return [str(t) for t in infer_types(get_op(op), "/r/node", ins, attrs or {}, vals)]


# ------------------------------------------------------------------ one-node ONNX models

def one_node(op: str, feeds: dict[str, np.ndarray], consts: dict[str, np.ndarray],
             inputs: list[str], n_out: int = 1, opset: int = 18, **attrs) -> onnx.ModelProto:
    return one_node_model(op, feeds, consts, inputs, n_out, opset, **attrs)


def assert_same(got: list, want: list, rtol: float = 1e-5) -> None:
    assert_outputs_same(got, want, rtol=rtol, atol=1e-6)


RNG = np.random.default_rng(0)


# ------------------------------------------------------------------ Reduce*: shapes


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_shapes_with_constant_axes(op: str) -> None:
    x = "f32[batch,3,seq]"
    assert infer(op, [x, "i64[1]"], {}, [None, [1]]) == ["f32[batch,1,seq]"]
    assert infer(op, [x, "i64[2]"], {"keepdims": 0}, [None, [-1, 0]]) == ["f32[3]"]
    assert infer(op, [x], {"keepdims": 0}) == ["f32[]"]
    assert infer(op, [x]) == ["f32[1,1,1]"]
    assert infer(op, [x, "i64[0]"], {"noop_with_empty_axes": 1}) == ["f32[batch,3,seq]"]
    assert infer(op, [x, "i64[0]"], {"keepdims": 0}) == ["f32[]"]


def test_reduce_shapes_with_runtime_axes() -> None:
    # keepdims: the rank is known, a dim of 1 stays 1, the others are fresh symbols
    assert infer("ReduceSum", ["f32[batch,1,8]", "i64[2]"]) == ["f32[reduced_0,1,reduced_1]"]
    # no keepdims, two axes: rank 3 - 2
    assert infer("ReduceMean", ["f32[batch,3,8]", "i64[2]"], {"keepdims": 0}) == ["f32[reduced_0]"]
    # no keepdims, an unknown number of axes: unknown rank
    assert infer("ReduceMax", ["f32[batch,3,8]", "i64[n]"], {"keepdims": 0}) == ["f32[?]"]
    assert infer("ReduceMax", ["f32[?]", "i64[1]"], {}, [None, [0]]) == ["f32[?]"]
    # an empty axes tensor needs no value
    assert infer("ReduceProd", ["f32[b,3]", "i64[0]"], {"noop_with_empty_axes": 1}) == ["f32[b,3]"]


def test_reduce_errors_name_the_node_and_constraint() -> None:
    with pytest.raises(ShapeError, match=r"node /r/node.*axis 3 is out of range for rank 3"):
        infer("ReduceSum", ["f32[b,3,4]", "i64[1]"], {}, [None, [3]])
    with pytest.raises(ShapeError, match=r"ReduceL2 \(node /r/node\).*name an axis twice"):
        infer("ReduceL2", ["f32[b,3,4]", "i64[2]"], {}, [None, [1, -2]])
    with pytest.raises(ShapeError, match="axes must be a 1-D tensor"):
        infer("ReduceMin", ["f32[b,3,4]", "i64[1,1]"])


# ------------------------------------------------------------------ Reduce*: numerics


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([0, 2], 0), ([-1], 1), (None, 0)])
def test_reduce_matches_onnxruntime(op: str, axes: list | None, keepdims: int) -> None:
    data = RNG.uniform(0.5, 2.0, (3, 4, 5)).astype(np.float32)
    consts = {} if axes is None else {"axes": np.array(axes, np.int64)}
    inputs = ["data"] + ([] if axes is None else ["axes"])
    model = one_node(op, {"data": data}, consts, inputs, keepdims=keepdims)
    assert_same(*run_both(model, {"data": data}))


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"])
def test_reduce_integers_match_onnxruntime(op: str) -> None:
    data = RNG.integers(-4, 5, (2, 3, 4)).astype(np.int64)
    model = one_node(op, {"data": data}, {"axes": np.array([1], np.int64)}, ["data", "axes"])
    assert_same(*run_both(model, {"data": data}))


def test_reduce_axes_fed_at_run_time_and_noop() -> None:
    data = RNG.normal(size=(2, 3, 4)).astype(np.float32)
    model = one_node("ReduceSum", {"data": data, "axes": np.array([0, 2], np.int64)}, {},
                     ["data", "axes"], keepdims=0)
    sess = md.compile(md.import_onnx(model), target="reference")
    for axes in ([0, 2], [-1, 1]):
        got = sess.run({"data": data, "axes": np.array(axes, np.int64)})["out0"]
        np.testing.assert_allclose(got, data.sum(axis=tuple(axes)), rtol=1e-5)
    noop = one_node("ReduceSum", {"data": data}, {"axes": np.zeros(0, np.int64)},
                    ["data", "axes"], noop_with_empty_axes=1)
    assert_same(*run_both(noop, {"data": data}))


def test_reduce_empty_sets() -> None:
    ref = {op: reduce_reference(op) for op in REDUCE_OPS}
    x = np.zeros((2, 0, 3), np.float32)
    attrs = {"keepdims": 1, "noop_with_empty_axes": 0}
    axes = np.array([1], np.int64)
    assert (ref["ReduceSum"]([x, axes], attrs) == 0).all()
    assert (ref["ReduceProd"]([x, axes], attrs) == 1).all()
    assert (ref["ReduceMax"]([x, axes], attrs) == -np.inf).all()
    assert (ref["ReduceMin"]([x, axes], attrs) == np.inf).all()
    assert (ref["ReduceLogSumExp"]([x, axes], attrs) == -np.inf).all()
    assert (ref["ReduceMax"]([x.astype(np.int32), axes], attrs) == np.iinfo(np.int32).min).all()
    assert ref["ReduceMax"]([x, axes], attrs).shape == (2, 1, 3)


def test_reduce_float16_accumulates_in_float32() -> None:
    data = np.full((4096,), 1.0, np.float16)
    model = one_node("ReduceSum", {"data": data}, {}, ["data"], keepdims=0)
    got, want = run_both(model, {"data": data})
    assert got[0].dtype == np.float16 and float(got[0]) == float(want[0]) == 4096.0


# ------------------------------------------------------------------ old opsets


@pytest.mark.parametrize("op,opset", [("ReduceSum", 11), ("ReduceMean", 13), ("ReduceL2", 13),
                                      ("ReduceLogSumExp", 17), ("ReduceMax", 13)])
def test_old_opset_axes_attribute_becomes_input(op: str, opset: int) -> None:
    data = RNG.normal(size=(2, 3, 4)).astype(np.float32)
    model = one_node(op, {"data": data}, {}, ["data"], opset=opset, axes=[-1, 0], keepdims=0)
    graph = md.import_onnx(model)
    node = graph.nodes[0]
    assert "axes" not in node.attrs and node.inputs[1].const.tolist() == [-1, 0]
    assert str(graph.outputs[0].type) == "f32[3]"
    assert_same(*run_both(model, {"data": data}))


def test_new_opset_rejects_axes_attribute_by_name() -> None:
    data = np.ones((2, 3), np.float32)
    model = one_node("ReduceMean", {"data": data}, {}, ["data"], opset=18, axes=[1])
    with pytest.raises(AttributeError_, match="unknown attribute 'axes'"):
        md.import_onnx(model)


# ------------------------------------------------------------------ the index expressions


def test_reduce_expression_text() -> None:
    assert reduce_expression("ReduceSum", 3, (1,), True) == \
        "reduced[i0, z1, i2] = sum[i1] data[i0, i1, i2]"
    assert reduce_expression("ReduceMean", 2, (), False) == "reduced[i0, i1] = data[i0, i1]"
    assert reduce_expression("ReduceMax", 2, None, True) == "reduced[...] = data[...]"


def _numpy_reduce(op: str, x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    attrs = {"keepdims": int(keepdims), "noop_with_empty_axes": 0}
    return reduce_reference(op)([x, np.array(axes, np.int64)], attrs) if axes else \
        reduce_reference(op)([x, None], attrs)


rank_and_axes = st.integers(0, 4).flatmap(lambda r: st.tuples(
    st.just(r), st.lists(st.integers(0, max(r - 1, 0)), unique=True, max_size=r)
    if r else st.just([]), st.lists(st.booleans(), min_size=4, max_size=4), st.booleans()))


@settings(max_examples=60, deadline=None)
@given(rank_and_axes, st.sampled_from(REDUCE_OPS))
def test_expression_matches_the_reference(case: tuple, op: str) -> None:
    rank, axes, _signs, keepdims = case
    axes = tuple(sorted(axes)) if axes else tuple(range(rank))
    x = RNG.uniform(0.5, 2.0, (2, 3, 1, 4)[:rank]).astype(np.float64)
    want = _numpy_reduce(op, x, axes, keepdims)
    got = evaluate(reduce_expression(op, rank, axes, keepdims), {"data": x}, {},
                   {"reduced": want.shape})["reduced"]
    np.testing.assert_allclose(got, want, rtol=1e-10)


@settings(max_examples=100, deadline=None)
@given(rank_and_axes, st.sampled_from(REDUCE_OPS))
def test_shapes_match_numpy(case: tuple, op: str) -> None:
    rank, axes, signs, keepdims = case
    axes = [a - rank if neg else a for a, neg in zip(axes, signs)]
    shape = (2, 3, 1, 4)[:rank]
    want = np.sum(np.zeros(shape), axis=tuple(axes) if axes else None, keepdims=keepdims).shape
    values = [None, axes] if axes else []
    types = [f"f32[{','.join(map(str, shape))}]"] + ([f"i64[{len(axes)}]"] if axes else [])
    (got,) = infer(op, types, {"keepdims": int(keepdims)}, values)
    assert got == f"f32[{','.join(map(str, want))}]"


# ------------------------------------------------------------------ ArgMax, ArgMin


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_shapes_and_errors(op: str) -> None:
    assert infer(op, ["f32[batch,3,seq]"], {"axis": -1}) == ["i64[batch,3,1]"]
    assert infer(op, ["f32[batch,3,seq]"], {"axis": 1, "keepdims": 0}) == ["i64[batch,seq]"]
    with pytest.raises(ShapeError, match=rf"{op} \(node /r/node\).*axis 3 is out of range"):
        infer(op, ["f32[b,3,4]"], {"axis": 3})
    with pytest.raises(ShapeError, match="axis 1 has size 0"):
        infer(op, ["f32[b,0]"], {"axis": 1})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_ties_match_onnxruntime(op: str, last: int) -> None:
    data = RNG.integers(0, 3, (4, 5)).astype(np.float32)  # many ties
    model = one_node(op, {"data": data}, {}, ["data"], opset=13, axis=1, keepdims=0,
                     select_last_index=last)
    assert_same(*run_both(model, {"data": data}))


# ------------------------------------------------------------------ CumSum


def test_cumsum_shapes_and_errors() -> None:
    assert infer("CumSum", ["f32[batch,8]", "i32[]"]) == ["f32[batch,8]"]
    with pytest.raises(ShapeError, match=r"CumSum \(node /r/node\).*axis 2 is out of range"):
        infer_types(get_op("CumSum"), "/r/node", [parse_type("f32[b,8]"), parse_type("i64[]")],
                    {}, [None, np.array(2)])


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("dtype,axis", [(np.float32, 1), (np.int32, 0), (np.float64, -1)])
def test_cumsum_matches_onnxruntime(exclusive: int, reverse: int, dtype: type, axis: int) -> None:
    x = RNG.integers(-5, 6, (3, 4)).astype(dtype)
    model = one_node("CumSum", {"x": x}, {"axis": np.array(axis, np.int64)}, ["x", "axis"],
                     opset=14, exclusive=exclusive, reverse=reverse)
    assert_same(*run_both(model, {"x": x}))


# ------------------------------------------------------------------ TopK


def test_topk_shapes_and_errors() -> None:
    assert infer("TopK", ["f32[batch,10]", "i64[1]"], {}, [None, [3]]) == \
        ["f32[batch,3]", "i64[batch,3]"]
    assert infer("TopK", ["f32[batch,10]", "i64[1]"], {"axis": 0}) == \
        ["f32[k_0,10]", "i64[k_0,10]"]
    with pytest.raises(ShapeError, match=r"TopK \(node /r/node\).*K = 11 must be in \[0, 10\]"):
        infer("TopK", ["f32[batch,10]", "i64[1]"], {}, [None, [11]])


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32])  # ORT has no uint64 TopK
def test_topk_ties_match_onnxruntime(largest: int, dtype: type) -> None:
    x = RNG.integers(0, 4, (3, 8)).astype(dtype)
    model = one_node("TopK", {"x": x}, {"k": np.array([5], np.int64)}, ["x", "k"], n_out=2,
                     opset=11, axis=1, largest=largest)
    assert_same(*run_both(model, {"x": x}))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(8, 60), st.integers(1, 15), st.booleans(), st.integers(0, 2),
       st.sampled_from([np.float32, np.int64, np.uint8]), st.integers(0, 2**31))
def test_topk_by_partition_matches_the_full_sort(rows: int, n: int, k: int, largest: bool, axis: int,
                                                 dtype: type, seed: int) -> None:
    """The partition path (a few of many) against the stable full sort, ties crowded at the
    k-th value (few distinct values), on any axis."""
    from metadef.ops.defs.reduce import _sorted_order, _topk_partial
    k = min(k, n)
    shape = [rows, 3, rows]
    shape[axis] = n
    x = np.random.default_rng(seed).integers(0, 6, shape).astype(dtype)
    values, index = _topk_partial(x, k, axis, largest)
    want_index = np.take(_sorted_order(x, axis, largest), np.arange(k), axis=axis)
    np.testing.assert_array_equal(index, want_index)
    np.testing.assert_array_equal(values, np.take_along_axis(x, want_index, axis=axis))


def test_topk_of_a_few_among_many_with_ties_and_nan_match_onnxruntime() -> None:
    x = RNG.integers(0, 30, (16, 400)).astype(np.float32)
    for largest in (0, 1):
        model = one_node("TopK", {"x": x}, {"k": np.array([7], np.int64)}, ["x", "k"], n_out=2,
                         opset=11, axis=1, largest=largest)
        assert_same(*run_both(model, {"x": x}))
    x[3, 17] = np.nan  # (the full sort: numpy's NaN order)
    assert np.isnan(md.compile(md.import_onnx(model), target="reference").run({"x": x})["out0"][3]).any()


def test_topk_opset9_k_attribute() -> None:
    x = RNG.normal(size=(2, 6)).astype(np.float32)
    model = one_node("TopK", {"x": x}, {}, ["x"], n_out=2, opset=9, k=2)
    graph = md.import_onnx(model)
    assert [str(v.type) for v in graph.outputs] == ["f32[2,2]", "i64[2,2]"]
    assert_same(*run_both(model, {"x": x}))


# ------------------------------------------------------------------ roles and conformance


def test_roles() -> None:
    assert {get_op(op).role.value for op in [*REDUCE_OPS, "ArgMax", "ArgMin"]} == {"reduction"}
    assert get_op("TopK").role.value == get_op("CumSum").role.value == "opaque"


@pytest.mark.slow
def test_conformance() -> None:
    from metadef.testing.conformance import format_report, run_cases

    report = run_cases(op=ALL_OPS)
    assert not report.failures(), format_report(report)
