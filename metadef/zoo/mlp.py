"""A three-layer MNIST-style MLP: 784 -> 512 -> 256 -> 10, ReLU, Softmax.

The first and last layers are `Gemm(transB=1)` (as `nn.Linear` exports with 2-D inputs), the
middle one `MatMul` + `Add` (as it exports with N-D inputs), so both forms appear.
"""

from __future__ import annotations

import numpy as np
import onnx

from .builder import GraphBuilder

SUMMARY = "MLP 784-512-256-10 with ReLU and Softmax (Gemm and MatMul+Add layers)"
INPUTS = (("x", "float32", ("batch", 784)),)
OUTPUTS = (("probs", "float32", ("batch", 10)),)
EXAMPLE_DIMS = ({"batch": 1}, {"batch": 64})


def build(seed: int) -> onnx.ModelProto:
    """Build the MLP with weights drawn from `seed`. Example: `model = build(0)`."""
    b = GraphBuilder(seed)
    x = b.input("x", np.float32, ("batch", 784))
    with b.scope("fc1"):
        x = b.op("Relu", _gemm(b, x, 784, 512))
    with b.scope("fc2"):
        x = b.op("Relu", _matmul_add(b, x, 512, 256))
    with b.scope("fc3"):
        x = _gemm(b, x, 256, 10)
    b.op("Softmax", x, axis=-1, output_name="probs")
    b.output("probs", np.float32, ("batch", 10))
    return b.model("mlp")


def example_inputs(batch: int, seed: int) -> dict[str, np.ndarray]:
    """Random "pixels" in [0, 1). Example: `example_inputs(2, 0)["x"].shape == (2, 784)`."""
    rng = np.random.default_rng(seed)
    return {"x": rng.random((batch, 784), dtype=np.float32)}


def _gemm(b: GraphBuilder, x: str, n_in: int, n_out: int) -> str:
    weight = b.normal("weight", (n_out, n_in), std=float(np.sqrt(2.0 / n_in)))
    bias = b.normal("bias", (n_out,), std=0.05)
    return b.op("Gemm", x, weight, bias, alpha=1.0, beta=1.0, transB=1)


def _matmul_add(b: GraphBuilder, x: str, n_in: int, n_out: int) -> str:
    weight = b.normal("weight", (n_in, n_out), std=float(np.sqrt(2.0 / n_in)))
    bias = b.normal("bias", (n_out,), std=0.05)
    return b.op("Add", b.op("MatMul", x, weight), bias)
