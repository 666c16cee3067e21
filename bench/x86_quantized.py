"""Quantized models, as ONNX Runtime's own quantizer writes them: metadef x86 vs ONNX Runtime.

Each zoo model is pre-processed (``quant_pre_process``: shape inference, BatchNormalization
folded) and quantized by ``onnxruntime.quantization.quantize_static`` in QDQ form (its default)
with per-tensor int8 weights and activations of ``--activations`` (int8, ORT's default, or
uint8, the U8S8 form ORT recommends for x86), calibrated on four random batches. ONNX Runtime
(ORT_ENABLE_ALL: its QDQ selectors run the layers as integer kernels) and metadef
(``md.optimize`` at ``--level``: QDQ MatMuls and Convs become QLinearMatMul / QLinearConv, run
by ``md_qgemm`` / ``md_qconv``) run interleaved in one process (``metadef.testing.timing``):
medians in ms, the ratio metadef / ORT, the largest difference from ORT's output (in units of
its largest value), metadef's compile time, and how many products ran as integer kernels.

``--format qoperator`` writes the static model in ORT's QOperator form (``QLinearConv``,
``QLinearMatMul``, ``com.microsoft::QLinearAdd`` / ``QLinearGlobalAveragePool`` / ``QGemm``)
instead of QDQ. ``--method dynamic`` quantizes with ``quantize_dynamic`` instead (int8 weights; the activations'
scale and zero point computed per run by ``DynamicQuantizeLinear``, each product a
``MatMulInteger`` or ``ConvInteger`` scaled back to float32: how most transformers are quantized
for the CPU), with no calibration and no pre-processing.

    .venv/bin/python bench/x86_quantized.py [--method static|dynamic] [--format qdq|qoperator]
        [--activations int8|uint8]
        [--threads 1] [--batch 1] [--runs 20] [--only resnet50 bert]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import statistics
import tempfile
import time

import numpy as np
import onnx

import metadef as md
from metadef.cli_bench import ort_session
from metadef.testing.timing import time_interleaved


def quantized(name: str, activations: str, folder: str, operators: bool = False) -> bytes:
    """The zoo model ``name``, pre-processed and quantized to QDQ (``operators``: QOperator) by
    ONNX Runtime's tools."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    source, pre, out = (os.path.join(folder, f"{name}.{s}.onnx") for s in ("float", "pre", "qdq"))
    onnx.save(md.zoo.build(name), source)
    quant_pre_process(source, pre, skip_symbolic_shape=True)
    described = md.zoo.describe(name)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([described.example_inputs(batch=1) for _ in range(4)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    kind = QuantType.QUInt8 if activations == "uint8" else QuantType.QInt8
    with contextlib.chdir(folder):  # (the calibrator leaves a large model's weights in the working folder)
        quantize_static(pre, out, Reader(), quant_format=QuantFormat.QOperator if operators else QuantFormat.QDQ,
                        activation_type=kind, weight_type=QuantType.QInt8)
    with open(out, "rb") as f:
        return f.read()


def dynamic(name: str, folder: str) -> bytes:
    """The zoo model ``name`` quantized by ONNX Runtime's ``quantize_dynamic`` (int8 weights)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    source, out = (os.path.join(folder, f"{name}.{s}.onnx") for s in ("float", "dynamic"))
    onnx.save(md.zoo.build(name), source)
    quantize_dynamic(source, out, weight_type=QuantType.QInt8)
    with open(out, "rb") as f:
        return f.read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=("static", "dynamic"), default="static")
    parser.add_argument("--format", choices=("qdq", "qoperator"), default="qdq",
                        help="static only: QDQ (ORT's default) or QOperator (QLinearConv, QLinearAdd, ...)")
    parser.add_argument("--activations", choices=("int8", "uint8"), default="int8",
                        help="static only (dynamic's are uint8)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--level", default="aggressive")
    parser.add_argument("--only", nargs="*", default=[], help="zoo models whose name contains one of these")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # (the quantizer's advice to pre-process, which we did)
    what = f"{args.format}, activations {args.activations}" if args.method == "static" else "quantize_dynamic"
    print(f"{what}, threads {args.threads}, batch {args.batch}, level {args.level}\n"
          "| model | metadef ms | ORT ms | ratio | max diff | compile s | integer products |\n"
          "|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for name in md.zoo.names():
            if args.only and not any(o.lower() in name.lower() for o in args.only):
                continue
            data = quantized(name, args.activations, folder, args.format == "qoperator") \
                if args.method == "static" else dynamic(name, folder)
            feeds = md.zoo.describe(name).example_inputs(batch=args.batch)
            ort = ort_session(data, args.threads)
            t0 = time.perf_counter()
            graph = md.optimize(md.import_onnx(onnx.load_from_string(data)), level=args.level)
            sess = md.compile(graph, target="x86", threads=args.threads)
            compiled = time.perf_counter() - t0
            ours, theirs = next(iter(sess.run(feeds).values())), ort.run(None, feeds)[0]
            diff = float(np.max(np.abs(ours - theirs)) / (np.max(np.abs(theirs)) + 1e-30))
            sample = time_interleaved({"metadef": functools.partial(sess.run, feeds),
                                       "ort": functools.partial(ort.run, None, feeds)}, warmup=2,
                                      iterations=args.runs)
            a, b = (statistics.median(sample.times[k]) * 1e3 for k in ("metadef", "ort"))
            integer = sum("md_qgemm" in e.reason or "md_qconv" in e.reason for e in sess.executable.plan)
            kinds = ("MatMul", "Gemm", "Conv", "MatMulInteger", "ConvInteger", "QLinearConv", "QLinearMatMul", "QGemm")
            products = sum(n.op_type in kinds for n in onnx.load_from_string(data).graph.node)
            print(f"| {name} | {a:.2f} | {b:.2f} | {a / b:.2f} | {diff:.0e} | {compiled:.2f} | "
                  f"{integer} of {products} |", flush=True)


if __name__ == "__main__":
    main()
