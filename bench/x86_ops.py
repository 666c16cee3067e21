"""Single ops vs ONNX Runtime, measured interleaved: the ops of users' models beyond the zoo.

Each case is a one- or two-node ONNX model. First the ops that used to leave x86's native
program: a decoder's 2x ConvTranspose, an Inception-style Concat of four branches (and a QOperator
model's QLinearConcat), BERT's embedding Gather, a tf2onnx-style Pad before a conv, YOLO's nearest
2x upsampling, a CastLike.
Then generated and routine kernels on common shapes: transcendental activations, the softmax
family (rows, and over channels), reductions along rows and down columns, norms (GroupNorm too),
transposes, ``Pow(x, 2)`` (RMSNorm's square), linear and cubic Resize, Tile, YOLO's 5x5 pool,
a reflect Pad, DepthToSpace and SpaceToDepth, a 1-D ConvTranspose, TopK, depthwise convs of
3x3 to 7x7 (MobileNet, EfficientNet, ConvNeXt), einsums, gathers and scatters, LSTM and GRU
layers.
metadef optimizes each at ``aggressive`` and compiles it for x86 (``threads``; ORT with as many
intra-op threads) and the two run alternately; the table gives medians in ms and the ratio
metadef / ORT, and the kinds of step metadef ran (``native``/``blas``/``generated``: in the
native program; ``reference``: numpy).

    .venv/bin/python bench/x86_ops.py [--runs 50] [--threads 1] [--only Softmax Reduce]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

import metadef as md
from metadef.cli_bench import ort_session

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT


def _model(nodes: list, inputs: list, consts: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "op", inputs, [helper.make_tensor_value_info("y", F, None)],
                              [onnx.numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def cases() -> dict[str, tuple[onnx.ModelProto, dict[str, np.ndarray]]]:
    """name -> (model, feeds)."""
    x = RNG.standard_normal((1, 64, 56, 56)).astype(np.float32)
    small = RNG.standard_normal((1, 128, 40, 40)).astype(np.float32)
    branches = {f"b{i}": RNG.standard_normal((1, 64, 28, 28)).astype(np.float32) for i in range(4)}
    ids = RNG.integers(0, 30522, (8, 128)).astype(np.int64)
    return {
        "ConvTranspose 64->32, k4 s2, 56x56": (_model(
            [helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1])],
            [helper.make_tensor_value_info("x", F, ["n", 64, 56, 56])],
            {"w": RNG.standard_normal((64, 32, 4, 4)).astype(np.float32)}), {"x": x}),
        "Concat of 4 x [64,28,28]": (_model(
            [helper.make_node("Concat", list(branches), ["y"], axis=1)],
            [helper.make_tensor_value_info(k, F, ["n", 64, 28, 28]) for k in branches], {}), branches),
        "QLinearConcat of [64|96|32,28,28] uint8 (QOperator Inception)": _qlinear_concat(),
        "Gather 8x128 rows of [30522,768]": (_model(
            [helper.make_node("Gather", ["table", "ids"], ["y"])],
            [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
            {"table": RNG.standard_normal((30522, 768)).astype(np.float32)}), {"ids": ids}),
        "Pad 1 pixel of [64,56,56]": (_model(
            [helper.make_node("Pad", ["x", "pads"], ["y"])],
            [helper.make_tensor_value_info("x", F, ["n", 64, 56, 56])],
            {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)}), {"x": x}),
        "Resize nearest 2x of [128,40,40] (YOLO)": (_model(
            [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")],
            [helper.make_tensor_value_info("x", F, ["n", 128, 40, 40])],
            {"scales": np.array([1, 1, 2, 2], np.float32)}), {"x": small}),
        "CastLike [64,56,56] to float16 and back": (_model(
            [helper.make_node("CastLike", ["x", "half"], ["h"]), helper.make_node("CastLike", ["h", "x"], ["y"])],
            [helper.make_tensor_value_info("x", F, ["n", 64, 56, 56])],
            {"half": np.zeros(1, np.float16)}), {"x": x}),
        **{f"{op} [512,768]": _one(op, (512, 768)) for op in ("Exp", "Tanh", "Sigmoid", "Erf", "Gelu", "Elu",
                                                                      "Sin", "Cos")},
        "Softmax rows [512,768]": _one("Softmax", (512, 768), axis=-1),
        "Softmax [8,12,128,128] (attention)": _one("Softmax", (8, 12, 128, 128), axis=-1),
        "Softmax over channels [8,19,64,64]": _one("Softmax", (8, 19, 64, 64), axis=1),
        "LogSoftmax rows [512,1000]": _one("LogSoftmax", (512, 1000), axis=-1),
        "ReduceMax rows [4096,256]": _one("ReduceMax", (4096, 256), {"axes": _axes(-1)}),
        "ReduceSum down columns [512,768] axis 0": _one("ReduceSum", (512, 768), {"axes": _axes(0)}),
        "ReduceMean over the sequence [8,128,768]": _one("ReduceMean", (8, 128, 768), {"axes": _axes(1)}),
        "InstanceNormalization [8,64,56,56]": _one("InstanceNormalization", (8, 64, 56, 56),
                                                   {"s": RNG.standard_normal(64).astype(np.float32),
                                                    "b": RNG.standard_normal(64).astype(np.float32)}),
        "GlobalAveragePool [8,2048,7,7]": _one("GlobalAveragePool", (8, 2048, 7, 7)),
        "Transpose NCHW -> NHWC [8,64,56,56]": _one("Transpose", (8, 64, 56, 56), perm=[0, 2, 3, 1]),
        "Transpose heads [8,128,12,64] -> [8,12,128,64]": _one("Transpose", (8, 128, 12, 64), perm=[0, 2, 1, 3]),
        "Pow(x, 2) [512,768]": _one("Pow", (512, 768), {"e": np.array(2.0, np.float32)}),
        "GroupNormalization [8,64,56,56], 32 groups": _one(
            "GroupNormalization", (8, 64, 56, 56), {"s": RNG.standard_normal(64).astype(np.float32),
                                                    "b": RNG.standard_normal(64).astype(np.float32)}, num_groups=32),
        "Resize linear 2x [8,64,56,56]": _one("Resize", (8, 64, 56, 56), {"roi": _EMPTY, "scales": _SCALES},
                                              mode="linear"),
        "Resize cubic 2x [2,64,56,56]": _one("Resize", (2, 64, 56, 56), {"roi": _EMPTY, "scales": _SCALES},
                                             mode="cubic"),
        "Tile [8,128,96] by (1,1,8)": _one("Tile", (8, 128, 96), {"r": _axes(1, 1, 8)}),
        "AveragePool 3x3 stride 1, pads counted [8,64,56,56] (Inception)": _one(
            "AveragePool", (8, 64, 56, 56), kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
        "MaxPool 5x5 stride 1 [8,256,20,20] (SPPF)": _one("MaxPool", (8, 256, 20, 20), kernel_shape=[5, 5],
                                                          pads=[2, 2, 2, 2]),
        "Pad reflect 1 pixel [8,64,56,56]": _one("Pad", (8, 64, 56, 56), {"p": _axes(0, 0, 1, 1, 0, 0, 1, 1)},
                                                 mode="reflect"),
        "DepthToSpace 2 [8,256,28,28]": _one("DepthToSpace", (8, 256, 28, 28), blocksize=2),
        "SpaceToDepth 2 [8,64,56,56]": _one("SpaceToDepth", (8, 64, 56, 56), blocksize=2),
        "ConvTranspose 1-D 64->32, k4 s2, [8,64,500]": _one("ConvTranspose", (8, 64, 500), {
            "w": (RNG.standard_normal((64, 32, 4)) * 0.05).astype(np.float32)}, strides=[2], pads=[1, 1]),
        "TopK 5 of [64,1000]": _topk(),
        **{f"Conv depthwise {k}x{k} s{st} [8,{c},{hw},{hw}] ({who})": _depthwise(k, st, c, hw)
           for k, st, c, hw, who in (
            (3, 1, 144, 56, "MobileNetV2"), (5, 1, 240, 28, "EfficientNet"), (5, 2, 144, 56, "EfficientNet"),
            (5, 1, 672, 14, "MobileNetV3"), (7, 1, 96, 56, "ConvNeXt"), (7, 1, 384, 14, "ConvNeXt"))},
        "Einsum bhqd,bhkd->bhqk [8,12,128,64]": _einsum("bhqd,bhkd->bhqk", (8, 12, 128, 64), (8, 12, 128, 64)),
        "Einsum bsd,ed->bse [8,128,768] x [3072,768]": _einsum("bsd,ed->bse", (8, 128, 768), (3072, 768)),
        "GatherElements [64,1000] by [64,100] along axis 1": _indexing(
            "GatherElements", (64, 1000), RNG.integers(0, 1000, (64, 100)), axis=1),
        "GatherND [8,128,768] by [8,16,1], batch_dims 1": _indexing(
            "GatherND", (8, 128, 768), RNG.integers(0, 128, (8, 16, 1)), batch_dims=1),
        "ScatterND [64,1000], 16 rows": _indexing("ScatterND", (64, 1000), RNG.permutation(64)[:16].reshape(16, 1),
                                                 RNG.standard_normal((16, 1000)).astype(np.float32)),
        "Conv3d 16->16, 3x3x3, [2,16,16,32,32]": _one("Conv", (2, 16, 16, 32, 32), {
            "w": (RNG.standard_normal((16, 16, 3, 3, 3)) * 0.05).astype(np.float32)}, pads=[1] * 6),
        "Conv 3x3 dilation 2, 64->64, [8,64,56,56] (DeepLab)": _one("Conv", (8, 64, 56, 56), {
            "w": (RNG.standard_normal((64, 64, 3, 3)) * 0.05).astype(np.float32)}, pads=[2] * 4, dilations=[2, 2]),
        "Conv1d 256->256, k3, [8,256,1000]": _one("Conv", (8, 256, 1000), {
            "w": (RNG.standard_normal((256, 256, 3)) * 0.05).astype(np.float32)}, pads=[1, 1]),
        "LSTM 32 steps, [8,256] -> 256": _recurrent("LSTM", 32, 8, 256, 256),
        "LSTM 100 steps, [1,64] -> 128": _recurrent("LSTM", 100, 1, 64, 128),
        "GRU 32 steps, [8,256] -> 256 (PyTorch's)": _recurrent("GRU", 32, 8, 256, 256, linear_before_reset=1),
        "GRU 32 steps, [8,256] -> 256 (ONNX's default)": _recurrent("GRU", 32, 8, 256, 256),
    }


def _indexing(op: str, shape: tuple[int, ...], indices: np.ndarray, updates: np.ndarray | None = None,
              **attrs: object) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``op(x, indices[, updates])`` with constant int64 indices (and updates)."""
    consts = {"i": indices.astype(np.int64), **({"u": updates} if updates is not None else {})}
    return _one(op, shape, consts, **attrs)


def _einsum(equation: str, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """An Einsum of two inputs (the first's leading axis dynamic)."""
    graph = helper.make_graph(
        [helper.make_node("Einsum", ["x", "z"], ["y"], equation=equation)], "op",
        [helper.make_tensor_value_info("x", F, ["n", *a[1:]]), helper.make_tensor_value_info("z", F, list(b))],
        [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return model, {"x": RNG.standard_normal(a).astype(np.float32), "z": RNG.standard_normal(b).astype(np.float32)}


def _recurrent(op: str, steps: int, batch: int, inputs: int, hidden: int,
               **attrs: object) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-direction recurrent layer over ``x [seq, batch, inputs]`` (seq dynamic)."""
    gates = {"GRU": 3, "LSTM": 4}[op] * hidden
    return _one(op, (steps, batch, inputs), {"w": (RNG.standard_normal((1, gates, inputs)) * 0.05).astype(np.float32),
                                             "r": (RNG.standard_normal((1, gates, hidden)) * 0.05).astype(np.float32)},
                hidden_size=hidden, **attrs)


def _depthwise(k: int, stride: int, c: int, hw: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A depthwise ``k x k`` conv with bias, 'same' padding."""
    return _one("Conv", (8, c, hw, hw), {"w": (RNG.standard_normal((c, 1, k, k)) * 0.1).astype(np.float32),
                                         "b": RNG.standard_normal(c).astype(np.float32)},
                group=c, kernel_shape=[k, k], pads=[k // 2] * 4, strides=[stride] * 2)


def _topk() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    graph = helper.make_graph(
        [helper.make_node("TopK", ["x", "k"], ["y", "i"], axis=-1)], "op",
        [helper.make_tensor_value_info("x", F, ["n", 1000])],
        [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("i", TensorProto.INT64, None)],
        [onnx.numpy_helper.from_array(np.array([5], np.int64), "k")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return model, {"x": RNG.standard_normal((64, 1000)).astype(np.float32)}


_EMPTY = np.array([], np.float32)
_SCALES = np.array([1, 1, 2, 2], np.float32)


def _axes(*axes: int) -> np.ndarray:
    return np.array(axes, np.int64)


def _one(op: str, shape: tuple[int, ...], consts: dict[str, np.ndarray] | None = None,
          **attrs: object) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A model of one ``op`` reading ``x [n, ...shape[1:]]`` and ``consts`` (initializers, in
    order), opset 21 (Gelu's, GroupNormalization's per-channel scale)."""
    consts = consts or {}
    graph = helper.make_graph(
        [helper.make_node(op, ["x", *consts], ["y"], **attrs)], "op",
        [helper.make_tensor_value_info("x", F, ["n", *shape[1:]])], [helper.make_tensor_value_info("y", F, None)],
        [onnx.numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return model, {"x": RNG.standard_normal(shape).astype(np.float32)}


def _qlinear_concat() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """ORT's QLinearConcat of three uint8 branches, one at the output's scale and zero point."""
    consts = {"sy": np.float32(0.05), "zy": np.uint8(4), "s1": np.float32(0.05), "z1": np.uint8(4),
              "s2": np.float32(0.02), "z2": np.uint8(9), "s3": np.float32(0.3), "z3": np.uint8(200)}
    feeds = {f"x{i}": RNG.integers(0, 256, (1, c, 28, 28)).astype(np.uint8) for i, c in ((1, 64), (2, 96), (3, 32))}
    node = helper.make_node("QLinearConcat", ["sy", "zy", "x1", "s1", "z1", "x2", "s2", "z2", "x3", "s3", "z3"],
                            ["y"], domain="com.microsoft", axis=1)
    inputs = [helper.make_tensor_value_info(k, TensorProto.UINT8, ["n", *v.shape[1:]]) for k, v in feeds.items()]
    graph = helper.make_graph(
        [node], "op", inputs, [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    opsets = [helper.make_opsetid("", 19), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets), feeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=[], help="cases whose name contains one of these")
    args = parser.parse_args()
    print(f"threads {args.threads}\n| op | metadef ms | ORT ms | ratio | metadef step |\n|---|---|---|---|---|")
    for name, (model, feeds) in cases().items():
        if args.only and not any(word.lower() in name.lower() for word in args.only):
            continue
        sess = md.compile(md.optimize(md.import_onnx(model), level="aggressive"), target="x86", threads=args.threads)
        ort_sess = ort_session(model.SerializeToString(), args.threads)
        kinds = ", ".join(sorted({p.kind for p in sess.executable.plan}))
        ours, theirs = [], []
        for _ in range(3):
            sess.run(feeds), ort_sess.run(None, feeds)
        for _ in range(args.runs):  # interleaved: foreign load hits both alike
            t0 = time.perf_counter()
            sess.run(feeds)
            t1 = time.perf_counter()
            ort_sess.run(None, feeds)
            t2 = time.perf_counter()
            ours.append(t1 - t0)
            theirs.append(t2 - t1)
        a, b = statistics.median(ours) * 1e3, statistics.median(theirs) * 1e3
        print(f"| {name} | {a:.3f} | {b:.3f} | {a / b:.2f} | {kinds} |", flush=True)


if __name__ == "__main__":
    main()
