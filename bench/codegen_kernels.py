"""Compile times and kernel speed of generated code (run: ``python bench/codegen_kernels.py``).

Prints, from one run: the median compile time per kernel, the total for the non-contraction
groups and nodes of each zoo model, and for big elementwise/reduction cases the time of the
compiled kernel, the numpy evaluator (the reference backend's way) and plain numpy, as ratios.
The machine is shared: timings are medians of interleaved repeats.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np

import metadef as md
from metadef.codegen import CodegenUnsupported, compile_group, compile_node
from metadef.codegen.kernel import _CACHE
from metadef.ops import get_op
from metadef.ops.interface import resolve_attrs
from metadef.ops.numpy_eval import run_node
from metadef.ops.numpy_eval.functions import erf  # numpy-only erf (scipy is not a dependency)
from metadef.testing.onnx_cases import one_node_graph

RNG = np.random.default_rng(0)


def random(shape: tuple[int, ...]) -> np.ndarray:
    return RNG.uniform(-3, 3, shape).astype(np.float32)


one_node = one_node_graph


def _median_time(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def compile_times() -> None:
    cases = [("Relu", ["f32[n,s,h]"], {}), ("Add", ["f32[b,s,h]", "f32[h]"], {}),
             ("Gelu", ["f32[b,s,3072]"], {}), ("Softmax", ["f32[b,12,s,s]"], {"axis": -1}),
             ("LayerNormalization", ["f32[b,s,768]", "f32[768]", "f32[768]"], {"axis": -1}),
             ("Sigmoid", ["f32[n,c]"], {}), ("ReduceMean", ["f32[n,c,h,w]", "i64[2]"], {"keepdims": 1})]
    times = []
    for op, types, attrs in cases:
        consts = {1: np.array([2, 3], np.int64)} if op == "ReduceMean" else None
        node = one_node(op, types, attrs, consts=consts).nodes[0]
        _CACHE.clear()
        start = time.perf_counter()
        compile_node(node)
        times.append(time.perf_counter() - start)
        print(f"  compile {op:20s} {times[-1] * 1e3:7.1f} ms")
    print(f"median compile time per kernel: {statistics.median(times) * 1e3:.1f} ms")
    for name in md.zoo.names():
        graph = md.optimize(md.import_onnx(md.zoo.build(name, seed=0)), level="aggressive")
        _CACHE.clear()
        start, count, unsupported = time.perf_counter(), 0, 0
        for node in graph.nodes:
            try:
                if node.op == "Fused":
                    compile_group(node.attrs["body"], node.name)
                else:
                    compile_node(node)
                count += 1
            except CodegenUnsupported:
                unsupported += 1
        print(f"{name:12s}: {count} kernels compiled ({len(_CACHE)} distinct) in "
              f"{(time.perf_counter() - start) * 1e3:.0f} ms; {unsupported} contractions/opaque skipped")


def _numpy_gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + erf(x * np.float32(0.7071067811865476)))


def _numpy_layer_norm(x: np.ndarray, s: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    centered = x - mean
    return centered / np.sqrt((centered * centered).mean(-1, keepdims=True) + 1e-5) * s + b


def _numpy_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def speed() -> None:
    cases = [
        ("Gelu", ["f32[b,s,3072]"], {}, [(3, 128, 3072)], _numpy_gelu),
        ("LayerNormalization", ["f32[b,s,768]", "f32[768]", "f32[768]"], {"axis": -1},
         [(3, 128, 768), (768,), (768,)], _numpy_layer_norm),
        ("Softmax", ["f32[b,12,s,s]"], {"axis": -1}, [(3, 12, 128, 128)], _numpy_softmax),
        ("Softmax", ["f32[b,12,s,s]"], {"axis": 1}, [(3, 12, 128, 128)], None),
        ("Add", ["f32[b,s,h]", "f32[h]"], {}, [(3, 128, 3072), (3072,)], np.add),
        ("ReduceMean", ["f32[b,s,h]", "i64[1]"], {"keepdims": 1}, [(3, 128, 3072)],
         lambda x: x.mean(-1, keepdims=True)),
    ]
    print(f"{'case':34s} {'kernel':>9s} {'evaluator':>10s} {'numpy':>9s}  eval/kernel numpy/kernel")
    for op, types, attrs, shapes, baseline in cases:
        consts = {1: np.array([-1], np.int64)} if op == "ReduceMean" else None
        graph = one_node(op, types, attrs, consts=consts)
        node = graph.nodes[0]
        kernel = compile_node(node)
        arrays = [random(s) for s in shapes]
        args = arrays + ([np.array([-1], np.int64)] if consts else [])
        metaop = get_op(op)
        resolved = resolve_attrs(op, "(bench)", metaop.attrs, node.attrs)
        out_types = [v.type.with_shape(_concrete(v.type.shape, shapes, graph)) for v in graph.outputs]
        want = run_node(metaop, resolved, args, out_types)
        out = np.empty(want[0].shape, np.float32)
        repeat = 20
        t_kernel = _median_time(partial(kernel, args, [out]), repeat)
        t_eval = _median_time(partial(run_node, metaop, resolved, args, out_types), 5)
        t_numpy = _median_time(partial(baseline, *arrays), repeat) if baseline else float("nan")
        np.testing.assert_allclose(out, want[0], rtol=1e-4, atol=1e-5)
        label = f"{op}{attrs.get('axis', '')} {shapes[0]}"
        print(f"{label:34s} {t_kernel * 1e3:8.3f}ms {t_eval * 1e3:9.3f}ms {t_numpy * 1e3:8.3f}ms"
              f"  {t_eval / t_kernel:10.1f}x {t_numpy / t_kernel:11.2f}x")


def _concrete(shape: tuple, shapes: list[tuple[int, ...]], graph: md.Graph) -> list[int]:
    env: dict[str, int] = {}
    for v, s in zip(graph.inputs, shapes):
        for d, n in zip(v.type.shape, s):
            if not isinstance(d, int):
                env[str(d)] = n
    return [d if isinstance(d, int) else env[str(d)] for d in shape]


if __name__ == "__main__":
    compile_times()
    speed()
