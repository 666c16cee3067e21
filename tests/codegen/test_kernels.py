"""Single-node kernels vs the numpy evaluator (``run_node``), on random inputs."""

from __future__ import annotations

import numpy as np
import pytest

from metadef.codegen import compile_node
from tests.codegen.support import check_node, one_node, random

pytestmark = pytest.mark.jit

UNARY = ["Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Ceil", "Cos", "Cosh", "Elu",
         "Erf", "Exp", "Floor", "Gelu", "HardSigmoid", "HardSwish", "Identity", "LeakyRelu", "Log",
         "Mish", "Neg", "Reciprocal", "Relu", "Round", "Selu", "Shrink", "Sigmoid", "Sign", "Sin",
         "Sinh", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu", "Celu"]
DOMAIN_OF = {"SiLU": "ai.metadef"}
POSITIVE = {"Log", "Sqrt", "Acosh"}
UNIT = {"Acos", "Asin", "Atanh"}


def _unary_input(op: str, shape: tuple[int, ...]) -> np.ndarray:
    if op in POSITIVE:
        return random(shape, low=1.0, high=6.0)
    if op in UNIT:
        return random(shape, low=-0.95, high=0.95)
    return random(shape, low=-6, high=6)


@pytest.mark.parametrize("op", UNARY + ["SiLU"])
def test_unary(op: str) -> None:
    graph = one_node(op, ["f32[n,5,7]"], domain=DOMAIN_OF.get(op, ""))
    check_node(graph, [_unary_input(op, (3, 5, 7))])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_forms(approximate: str) -> None:
    graph = one_node("Gelu", ["f32[n,33]"], {"approximate": approximate})
    check_node(graph, [random((4, 33), low=-8, high=8)])


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mean", "Sum",
                                "Less", "Greater", "Equal", "LessOrEqual", "GreaterOrEqual", "PRelu"])
@pytest.mark.parametrize("shapes", [((2, 1, 4), (3, 1)), ((5, 6), (6,)), ((1,), (4, 3, 1))])
def test_binary_broadcast(op: str, shapes: tuple) -> None:
    a, b = shapes
    low = 0.5 if op == "Pow" else -3
    types = [f"f32[{','.join(map(str, a))}]", f"f32[{','.join(map(str, b))}]"]
    if op == "PRelu" and len(b) > len(a):
        pytest.skip("PRelu's slope broadcasts to X only")
    check_node(one_node(op, types), [random(a, low=low), random(b, low=low)])


SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 1e-20, 3e18, np.inf, -np.inf, np.nan], np.float32)


@pytest.mark.parametrize("exponent", [1.0, 2.0, 3.0, 4.0, -1.0, -2.0, 0.5, 2.5, -0.5, 0.0])
@pytest.mark.parametrize("dtype,text", [(np.float32, "f32"), (np.float64, "f64")])
def test_pow_by_a_scalar_constant(exponent: float, dtype: type, text: str) -> None:
    """A scalar exponent is compiled in (products, a division or a square root for the common
    ones); the results stay within two roundings of numpy's ``power``, special values alike."""
    x = np.concatenate([random((40,), low=-4, high=4), SPECIAL]).astype(dtype)
    graph = one_node("Pow", [f"{text}[n]", f"{text}[]"], consts={1: np.array(exponent, dtype)})
    with np.errstate(all="ignore"):
        check_node(graph, [x], rtol=3 * float(np.finfo(dtype).eps), atol=0)


def test_a_literal_square_is_a_product() -> None:
    from metadef.codegen.build import apply
    from metadef.codegen.exprs import Const, Load

    x = Load(0, (), np.dtype(np.float32))
    assert apply("pow", [x, Const(2.0, np.dtype(np.float32))]) == apply("*", [x, x])
    assert apply("pow", [x, Const(2.5, np.dtype(np.float32))]).name == "pow"


def test_a_single_node_kernel_compiles_its_scalar_constants_in() -> None:
    """``compile_node`` passes constant inputs as kernel inputs, but a scalar one is read as a
    literal: the tree of ``Pow(x, 2)`` is a product (its pointer is still passed, not read)."""
    from metadef.codegen.lower import compose
    from metadef.ir import GraphBuilder
    from metadef.shape import parse_type

    b = GraphBuilder("g")
    x, e = b.input("x", parse_type("f32[n]")), b.input("e", parse_type("f32[]"))
    e.const = np.array(2.0, np.float32)
    b.output(*b.node("Pow", [x, e]))
    tree = compose(b.build()).outputs[0].tree
    assert tree.name == "*" and tree.args[0] == tree.args[1]


def test_binary_symbolic_broadcast() -> None:
    graph = one_node("Add", ["f32[b,s,8]", "f32[s,8]"])
    check_node(graph, [random((3, 5, 8)), random((5, 8))])
    check_node(graph, [random((1, 2, 8)), random((2, 8))])


@pytest.mark.parametrize("dtype,text", [(np.int32, "i32"), (np.int64, "i64")])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Mod"])
def test_integer_ops(dtype: type, text: str, op: str) -> None:
    a, b = random((4, 6), dtype, -20, 20), random((6,), dtype, 1, 7)
    check_node(one_node(op, [f"{text}[4,6]", f"{text}[6]"]), [a, b])


def test_integer_division_by_zero_does_not_crash() -> None:
    a, b = np.array([7, -7, 3, -2**31], np.int32), np.array([2, 0, -2, -1], np.int32)
    kernel = compile_node(one_node("Div", ["i32[4]", "i32[4]"]).nodes[0])
    out = np.empty(4, np.int32)
    kernel([a, b], [out])  # no SIGFPE; C's truncation where defined
    assert out[[0, 2]].tolist() == [3, -1]


def test_where_and_logic() -> None:
    c, x, y = random((2, 1, 4), bool), random((3, 1)), random((4,))
    check_node(one_node("Where", ["bool[2,1,4]", "f32[3,1]", "f32[4]"]), [c, x, y])
    for op in ("And", "Or", "Xor"):
        check_node(one_node(op, ["bool[5]", "bool[5]"]), [random((5,), bool), random((5,), bool)])
    check_node(one_node("Not", ["bool[n]"]), [random((6,), bool)])


@pytest.mark.parametrize("to,dtype", [(7, np.int64), (6, np.int32), (9, bool), (10, np.float16),
                                      (11, np.float64), (1, np.float32)])
def test_cast(to: int, dtype: type) -> None:
    x = random((3, 9), low=-50, high=50)
    x[0, :3] = 0
    check_node(one_node("Cast", ["f32[n,9]"], {"to": to}), [x])


@pytest.mark.parametrize("src,text", [(np.int64, "i64"), (bool, "bool"), (np.float16, "f16")])
def test_cast_to_float(src: type, text: str) -> None:
    check_node(one_node("Cast", [f"{text}[n,4]"], {"to": 1}), [random((3, 4), src, -9, 9)])


@pytest.mark.parametrize("axis", [-1, 1, 0])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax(op: str, axis: int) -> None:
    check_node(one_node(op, ["f32[b,6,9]"], {"axis": axis}), [random((2, 6, 9), low=-10, high=10)])


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
                                "ReduceSumSquare", "ReduceL2", "ReduceLogSumExp"])
@pytest.mark.parametrize("axes,keepdims", [([-1], 1), ([1], 0), ([0, 2], 1)])
def test_reductions(op: str, axes: list[int], keepdims: int) -> None:
    graph = one_node(op, ["f32[b,5,7]", "i64[?]"], {"keepdims": keepdims},
                     consts={1: np.array(axes, np.int64)})
    low, high = (0.8, 1.2) if op == "ReduceProd" else (-3, 3)
    check_node(graph, [random((3, 5, 7), low=low, high=high)])


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceLogSumExp"])
@pytest.mark.parametrize("axes", [[1, 2], [2, 3], [1, 2, 3], [0, 1], [1, 3]])
@pytest.mark.parametrize("types", [("f32[b,4,5,6]", (3, 4, 5, 6)), ("f32[b,c,h,w]", (2, 3, 7, 17))])
def test_reductions_over_adjacent_axes(op: str, axes: list[int], types: tuple[str, tuple[int, ...]]) -> None:
    """Whole adjacent axes reduce as one loop (``codegen.merge``), symbolic lengths too; [1, 3]
    keeps two loops."""
    graph = one_node(op, [types[0], "i64[?]"], {"keepdims": 0}, consts={1: np.array(axes, np.int64)})
    check_node(graph, [random(types[1])], atol=1e-5)  # (sums of ~100 terms of 3: their order differs from numpy's)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceLogSumExp"])
@pytest.mark.parametrize("axes,shape", [([0], (9, 700)), ([1], (2, 5, 300)), ([0, 1], (3, 4, 257)),
                                        ([0, 2], (3, 4, 5, 260))])
def test_reductions_down_columns(op: str, axes: list[int], shape: tuple[int, ...]) -> None:
    """Reductions that keep the last axis run down its columns in blocks of COLUMN_BLOCK
    (several blocks, the last one partial), the dims symbolic."""
    dims = ",".join(f"d{i}" for i in range(len(shape)))
    graph = one_node(op, [f"f32[{dims}]", "i64[?]"], {"keepdims": 1}, consts={1: np.array(axes, np.int64)})
    check_node(graph, [random(shape)], rtol=1e-5, atol=1e-5)


def test_only_reductions_that_keep_the_last_axis_run_down_columns() -> None:
    from metadef.codegen.emit import COLUMN_BLOCK, emit_module
    from metadef.codegen.lower import compose

    def nests(op: str, attrs: dict) -> tuple:
        return emit_module(compose(one_node(op, ["f32[a,b,c]"], attrs)), "k").nests

    # the axis the reductions keep (a), the blocks of c, the softmax's axis (b), a block's elements
    assert [str(d) for d in nests("Softmax", {"axis": 1})[0]] == ["a", "floor((c + 255)/256)", "b", str(COLUMN_BLOCK)]
    assert [str(d) for d in nests("Softmax", {"axis": -1})[0]] == ["a", "b", "c"]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [0, 1])
def test_softmax_down_columns(op: str, axis: int) -> None:
    check_node(one_node(op, ["f32[a,b,c]"], {"axis": axis}), [random((3, 6, 300), low=-6, high=6)])


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_max_and_min_keep_a_nan_and_infinities(op: str) -> None:
    """Float max / min reductions take one instruction a vector and may drop a NaN, so they
    track one: a row with a NaN anywhere (a vector's lane or the tail) is NaN, as numpy's."""
    x = random((6, 37), low=-50, high=50)
    x[0, 3], x[1, 36], x[2, 20] = np.nan, np.nan, np.inf
    x[3, :] = -np.inf
    x[4, 0], x[4, 1] = np.nan, np.inf
    graph = one_node(op, ["f32[n,37]", "i64[1]"], {"keepdims": 0}, consts={1: np.array([-1], np.int64)})
    check_node(graph, [x])
    check_node(one_node("GlobalMaxPool", ["f32[n,2,5,7]"]), [np.where(random((2, 2, 5, 7)) > 2.5, np.nan, 1.0)
                                                          .astype(np.float32)])


def test_instance_normalization_over_planes() -> None:
    check_node(one_node("InstanceNormalization", ["f32[n,c,h,w]", "f32[c]", "f32[c]"]),
               [random((2, 3, 9, 11)), random((3,)), random((3,))], rtol=1e-4, atol=1e-5)
    check_node(one_node("InstanceNormalization", ["f32[n,4,56,56]", "f32[4]", "f32[4]"]),
               [random((1, 4, 56, 56)), random((4,)), random((4,))], rtol=1e-4, atol=1e-5)


def test_a_window_keeps_its_loops_apart() -> None:
    from metadef.codegen.exprs import Axis, Lin, Load, Reduce
    from metadef.codegen.merge import merge_reduce_axes

    f32 = np.dtype(np.float32)
    window = Load(0, (Axis(Lin.var("p").plus(Lin.var("r")), 9, "checked"), Axis(Lin.var("s"), 3, "plain")), f32)
    r = Reduce("sum", ("r", "s"), (3, 3), window, f32, f32)
    assert merge_reduce_axes(r) is r
    swapped = Load(0, (Axis(Lin.var("s"), 3, "plain"), Axis(Lin.var("r"), 3, "plain")), f32)
    assert merge_reduce_axes(Reduce("sum", ("r", "s"), (3, 3), swapped, f32, f32)).vars == ("r", "s")


def test_layer_normalization() -> None:
    graph = one_node("LayerNormalization", ["f32[b,s,32]", "f32[32]", "f32[32]"], {"axis": -1})
    check_node(graph, [random((2, 3, 32)), random((32,)), random((32,))])
    symbolic = one_node("LayerNormalization", ["f32[b,s,h]", "f32[h]", "f32[h]"], {"axis": -1})
    check_node(symbolic, [random((2, 3, 20)), random((20,)), random((20,))])


def test_batch_normalization_inference() -> None:
    types = ["f32[n,3,h,w]"] + ["f32[3]"] * 4
    arrays = [random((2, 3, 4, 5)), random((3,)), random((3,)), random((3,)),
              random((3,), low=0.5, high=2)]
    check_node(one_node("BatchNormalization", types), arrays)


def test_clip_and_leaky_relu() -> None:
    check_node(one_node("Clip", ["f32[n,8]", "f32[]", "f32[]"]),
               [random((3, 8)), np.array(-1, np.float32), np.array(2, np.float32)])
    check_node(one_node("Clip", ["f32[n,8]"]), [random((3, 8))])
    check_node(one_node("LeakyRelu", ["f32[n,8]"], {"alpha": 0.3}), [random((3, 8))])


def test_pooling_reductions() -> None:
    check_node(one_node("GlobalAveragePool", ["f32[n,3,5,6]"]), [random((2, 3, 5, 6))])
    check_node(one_node("GlobalMaxPool", ["f32[n,3,5,6]"]), [random((2, 3, 5, 6))])


def test_transpose_and_expand() -> None:
    check_node(one_node("Transpose", ["f32[n,3,4]"], {"perm": [2, 0, 1]}), [random((2, 3, 4))])


def test_instance_normalization() -> None:
    graph = one_node("InstanceNormalization", ["f32[n,3,h,w]", "f32[3]", "f32[3]"])
    check_node(graph, [random((2, 3, 4, 5)), random((3,)), random((3,))])


def test_nan_and_inf_propagate() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, 88.0, -100.0], np.float32)
    for op in ("Exp", "Tanh", "Sigmoid", "Relu", "Erf", "Softplus", "Abs"):
        check_node(one_node(op, ["f32[n]"]), [x])


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 0}),
    ("AveragePool", {"kernel_shape": [2, 2], "strides": [2, 2]}),
])
def test_pooling_with_padding(op: str, attrs: dict) -> None:
    """Affine (strided, padded) reads: out-of-range reads give the fill value."""
    check_node(one_node(op, ["f32[n,3,9,8]"], attrs), [random((2, 3, 9, 8))])
