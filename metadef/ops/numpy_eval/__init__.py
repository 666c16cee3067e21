"""Numpy evaluation of semantic index expressions (vectorized) and of whole nodes.

Both the reference backend and constant folding evaluate ops through this package, so the
oracle and the optimizer cannot disagree about what an op computes.
"""

from metadef.ops.numpy_eval.evaluate import evaluate
from metadef.ops.numpy_eval.run import run_node, tensor_names

__all__ = ["evaluate", "run_node", "tensor_names"]
