"""Our micro-kernels against OpenBLAS on the zoo's product shapes, one thread, in cache.

First the core's FMA peak with 256-bit and 512-bit vectors (a loop of independent FMAs, JIT-
compiled here), which is what the tiles' widths are chosen by; then, for each shape, ``--reps``
rounds each calling our routine and OpenBLAS's ``sgemm`` through numpy once, one after the
other (one thread: run with ``OPENBLAS_NUM_THREADS=1``, which this script sets before numpy
loads): the best of each in GFLOP/s, and the median of the rounds' time ratios ours / OpenBLAS
(below 1.0: ours is faster) with their middle half. On a shared host (another tenant's load
moves a kernel's rate by 20 % from one second to the next) the ratio of two calls made side by
side is the steady figure; the best of each, taken at different moments, is not.

- ``md_gemm`` (constant weights, packed once): BERT's products at 128 rows, the MLP's at 8;
- ``md_conv1x1`` (a pointwise conv, pixels as the tile's columns): ResNet-50's and MobileNetV2's;
- ``md_bmm`` (two activations, the second packed per call): BERT's attention heads.

    .venv/bin/python bench/x86_tiles.py
    .venv/bin/python bench/x86_tiles.py --reps 50
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import ctypes
import statistics
import time
from collections.abc import Callable

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from metadef.codegen.jit import _target_machine, host_target
from metadef.codegen.native import ENTRY, native_function
from metadef.codegen.native_bmm import bmm_dims
from metadef.codegen.native_gemm import (
    conv1x1_dims,
    gemm_dims,
    gemm_lda,
    pack_conv1x1_weights,
    pack_gemm_weights,
    tile_lanes,
)

KEEP: list[object] = []


def side_by_side(ours: Callable[[], object], blas: Callable[[], object], reps: int) -> tuple[list[float], list[float]]:
    """The times of ``reps`` rounds, each calling ``ours`` then ``blas`` once (after one call of each)."""
    ours(), blas()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(reps):
        for fn, out in zip((ours, blas), times):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return times


def best(fn: Callable[[], object], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def fma_peak(lanes: int, chains: int | None = None, steps: int = 20_000_000) -> float:
    """GFLOP/s of ``chains`` independent FMA chains on ``lanes``-float vectors: 16 by default,
    12 without AVX-512, whose 16 vector registers 16 chains and the two operands overflow (the
    spills halved the figure on a Zen 3 host)."""
    chains = chains or (16 if host_target().has("avx512f") else 12)
    f32, i64 = ir.FloatType(), ir.IntType(64)
    vector = ir.VectorType(f32, lanes)
    module = ir.Module()
    module.triple = host_target().triple
    fma = ir.Function(module, ir.FunctionType(vector, [vector] * 3), f"llvm.fma.v{lanes}f32")
    fn = ir.Function(module, ir.FunctionType(f32, [i64]), "peak")
    b = ir.IRBuilder(fn.append_basic_block())
    entry, loop, done = b.block, b.append_basic_block(), b.append_basic_block()
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(i64)
    i.add_incoming(i64(0), entry)
    accs = [b.phi(vector) for _ in range(chains)]
    factor, addend = ir.Constant(vector, [1.0001] * lanes), ir.Constant(vector, [0.999] * lanes)
    for j, acc in enumerate(accs):
        acc.add_incoming(ir.Constant(vector, [float(j)] * lanes), entry)
    new = [b.call(fma, [acc, factor, addend]) for acc in accs]
    for acc, value in zip(accs, new):
        acc.add_incoming(value, loop)
    nxt = b.add(i, i64(1))
    i.add_incoming(nxt, loop)
    b.cbranch(b.icmp_signed("<", nxt, fn.args[0]), loop, done)
    b.position_at_end(done)
    total = new[0]
    for value in new[1:]:
        total = b.fadd(total, value)
    b.ret(b.extract_element(total, ir.IntType(32)(0)))
    parsed = llvm.parse_assembly(str(module))
    engine = llvm.create_mcjit_compiler(parsed, _target_machine())
    engine.finalize_object()
    KEEP.append(engine)
    run = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64)(engine.get_function_address("peak"))
    return steps * chains * lanes * 2 / best(lambda: run(steps), 3) / 1e9


def call(name: str, arrays: list[np.ndarray | None], dims: tuple[int, ...]) -> Callable[[], None]:
    args = (ctypes.c_void_p * len(arrays))(*[None if a is None else a.ctypes.data for a in arrays])
    values = (ctypes.c_int64 * len(dims))(*dims)
    fn = ENTRY(native_function(name))
    KEEP.extend([args, values, arrays])
    return lambda: fn(args, values)


def row(what: str, flops: float, times: tuple[list[float], list[float]]) -> None:
    ours, blas = times
    ratios = [a / b for a, b in zip(ours, blas)]
    low, mid, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    print(f"| {what} | {flops / min(ours) / 1e9:.0f} | {flops / min(blas) / 1e9:.0f} | "
          f"{mid:.2f} ({low:.2f}-{high:.2f}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=30, help="rounds a shape (each: ours, then OpenBLAS)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"host: {host_target().cpu}, tile vectors of {tile_lanes()} floats; FMA peak on one core: "
          f"{fma_peak(8):.0f} GFLOP/s with 256-bit vectors, "
          f"{fma_peak(16) if host_target().has('avx512f') else float('nan'):.0f} with 512-bit")
    print("\n| product | ours GFLOP/s | OpenBLAS GFLOP/s | time ratio, median (middle half) |\n|---|---|---|---|")
    for m, k, n in [(128, 768, 768), (128, 768, 3072), (128, 3072, 768), (1024, 768, 768), (8, 784, 512)]:
        x, w = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
        packed = pack_gemm_weights(w)
        y = np.empty((m, n), np.float32)
        lda = gemm_lda(k)  # as the backend runs it: x copied to a padded stride first where k aliases
        rows = x if lda == k else np.zeros((m, lda), np.float32)
        product = call("md_gemm", [rows, packed, np.zeros(packed.shape[0] * packed.shape[2], np.float32), y],
                       gemm_dims(m, n, k, lda=lda))
        copy = call("md_copy_rows", [x, rows], (m, 4 * k, 4 * k, 4 * lda))
        ours = product if lda == k else lambda product=product, copy=copy: (copy(), product())
        times = side_by_side(ours, lambda x=x, w=w, y=y: np.matmul(x, w, out=y), args.reps)
        row(f"md_gemm {m}x{k} @ {k}x{n}" + (f" (x copied to stride {lda} first)" if lda != k else ""),
            2 * m * n * k, times)
    for cin, cout, pixels in [(64, 256, 3136), (256, 64, 3136), (512, 128, 784), (1024, 256, 196), (96, 24, 3136)]:
        x, w = rng.standard_normal((cin, pixels), dtype=np.float32), rng.standard_normal((cout, cin), dtype=np.float32)
        y = np.empty((cout, pixels), np.float32)
        ours = call("md_conv1x1", [x, pack_conv1x1_weights(w), np.zeros(cout, np.float32), None, y],
                    conv1x1_dims(1, cin, cout, pixels))
        times = side_by_side(ours, lambda x=x, w=w, y=y: np.matmul(w, x, out=y), args.reps)
        row(f"md_conv1x1 {cin}->{cout} channels, {pixels} pixels", 2 * cin * cout * pixels, times)
    for batch, m, n, k, trans_b in [(12, 128, 128, 64, True), (12, 128, 64, 128, False)]:
        a = rng.standard_normal((batch, m, k), dtype=np.float32)
        b = rng.standard_normal((batch, n, k) if trans_b else (batch, k, n), dtype=np.float32)
        y = np.empty((batch, m, n), np.float32)
        operand = b.transpose(0, 2, 1) if trans_b else b
        times = side_by_side(call("md_bmm", [a, b, y], bmm_dims(batch, m, n, k, trans_b=trans_b)),
                             lambda a=a, operand=operand, y=y: np.matmul(a, operand, out=y), args.reps)
        what = "Q Kᵀ" if trans_b else "P V"
        row(f"md_bmm {batch} heads, {what} ({m}x{k} @ {k}x{n})", 2 * batch * m * n * k, times)


if __name__ == "__main__":
    main()
