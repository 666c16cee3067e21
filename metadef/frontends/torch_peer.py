"""A PyTorch peer for ``metadef bench --vs torch``: an ONNX model run eagerly with torch ops.

``onnx2torch`` (PyPI) converts the four zoo models correctly, but it imports torchvision,
and the only torchvision builds at hand are CUDA builds that do not load next to the CPU
torch 2.13 wheel ("operator torchvision::nms does not exist"). So this module is a small
converter of its own: one rule per ONNX op in :data:`torch_rules` (STYLE rule 2), each rule
turning a node's attributes into a function of torch tensors, checked numerically against
ONNX Runtime on :data:`SUPPORTED_MODELS` (``tests/frontends/test_torch_peer.py``).

The module is what ``torch.nn.Module`` users get from an exporter the other way round:
initializers and ``Constant`` nodes become tensors once; ``forward`` runs the nodes in order
under ``torch.inference_mode`` (shape arithmetic, as BERT's ``Shape -> Gather -> Concat ->
Reshape``, runs on int64 tensors, as ONNX has it). It runs eagerly, one Python call per node:
no ``torch.compile`` (which would compile at first run, minutes for BERT on two cores). Torch
is optional and imported on first use; without it :func:`torch_module` raises a
:class:`~metadef.core.errors.BackendError` that names ``pip install torch==2.13.0``.

Example:
    >>> import numpy as np, metadef as md
    >>> module = torch_module(md.zoo.build("mlp"))                # doctest: +SKIP
    >>> x = md.zoo.describe("mlp").example_inputs(batch=2)["x"]   # doctest: +SKIP
    >>> module.run({"x": x})["probs"].shape                       # doctest: +SKIP
    (2, 10)
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from metadef.core.errors import BackendError, UnsupportedOpError

TORCH_VERSION = "2.13.0"
"""The torch release the peer is tested with (the ``dev`` extra pins it)."""
INSTALL_HINT = f"pip install torch=={TORCH_VERSION}"
SUPPORTED_MODELS = ("mlp", "resnet50", "mobilenetv2", "bert")
"""The zoo models whose every op has a rule, checked against ONNX Runtime."""

Tensor = Any  # torch.Tensor, once torch is imported
Kernel = Callable[..., Sequence[Tensor]]
"""A node's function: its input tensors (None for an omitted optional input) -> its outputs."""
Rule = Callable[[Mapping[str, Any]], Kernel]
"""An op's rule: the node's attributes -> its kernel."""


def load_torch() -> Any:
    """The ``torch`` module, or a BackendError that says how to install it.

    Example:
        >>> load_torch().__name__                                  # doctest: +SKIP
        'torch'
    """
    try:
        return importlib.import_module("torch")
    except ImportError as e:
        raise BackendError(f"--vs torch needs PyTorch, which is not installed: {INSTALL_HINT} "
                           "(a CPU build; it is an optional peer, metadef never needs it)") from e


# ------------------------------------------------------------------------------- the rules


def _ints(attrs: Mapping[str, Any], name: str, default: Sequence[int]) -> list[int]:
    return [int(v) for v in attrs.get(name, default)]


def _symmetric_pads(op: str, pads: list[int], spatial: int) -> tuple[int, ...]:
    begin, end = pads[:spatial], pads[spatial:]
    if begin != end:
        raise UnsupportedOpError(f"torch peer: {op} with asymmetric pads {pads} has no rule yet")
    return tuple(begin)


def _conv(attrs: Mapping[str, Any]) -> Kernel:
    torch = load_torch()
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        raise UnsupportedOpError("torch peer: Conv with auto_pad has no rule yet (give explicit pads)")
    strides = tuple(_ints(attrs, "strides", (1, 1)))
    dilations = tuple(_ints(attrs, "dilations", (1, 1)))
    pads = _symmetric_pads("Conv", _ints(attrs, "pads", (0, 0, 0, 0)), len(strides))
    group = int(attrs.get("group", 1))
    return lambda x, w, b=None: [torch.nn.functional.conv2d(x, w, b, strides, pads, dilations, group)]


def _batch_norm(attrs: Mapping[str, Any]) -> Kernel:
    torch = load_torch()
    eps = float(attrs.get("epsilon", 1e-5))
    return lambda x, scale, bias, mean, var: [
        torch.nn.functional.batch_norm(x, mean, var, scale, bias, False, 0.0, eps)]


def _max_pool(attrs: Mapping[str, Any]) -> Kernel:
    torch = load_torch()
    kernel = tuple(_ints(attrs, "kernel_shape", ()))
    strides = tuple(_ints(attrs, "strides", [1] * len(kernel)))
    pads = _symmetric_pads("MaxPool", _ints(attrs, "pads", [0] * 2 * len(kernel)), len(kernel))
    dilations = tuple(_ints(attrs, "dilations", [1] * len(kernel)))
    ceil = bool(attrs.get("ceil_mode", 0))
    return lambda x: [torch.nn.functional.max_pool2d(x, kernel, strides, pads, dilations, ceil)]


def _gemm(attrs: Mapping[str, Any]) -> Kernel:
    torch = load_torch()
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    trans_a, trans_b = bool(attrs.get("transA", 0)), bool(attrs.get("transB", 0))
    if (alpha, beta, trans_a, trans_b) == (1.0, 1.0, False, True):  # a linear layer
        return lambda a, b, c=None: [torch.nn.functional.linear(a, b, c)]

    def run(a: Tensor, b: Tensor, c: Tensor | None = None) -> list[Tensor]:
        y = (a.T if trans_a else a) @ (b.T if trans_b else b)
        y = y * alpha if alpha != 1.0 else y
        return [y if c is None else y + (c * beta if beta != 1.0 else c)]

    return run


def _softmax(attrs: Mapping[str, Any]) -> Kernel:
    torch = load_torch()
    axis = int(attrs.get("axis", -1))
    return lambda x: [torch.softmax(x, axis)]


def _flatten(attrs: Mapping[str, Any]) -> Kernel:
    axis = int(attrs.get("axis", 1))
    return lambda x: [x.reshape(math.prod(x.shape[:axis if axis >= 0 else axis + x.dim()]), -1)]


def _clip(attrs: Mapping[str, Any]) -> Kernel:
    torch = load_torch()
    return lambda x, lo=None, hi=None: [torch.clamp(x, lo, hi)]


def _gather(attrs: Mapping[str, Any]) -> Kernel:
    axis = int(attrs.get("axis", 0))
    return lambda x, i: [x[(slice(None),) * (axis % x.dim()) + (i,)]]


def _shape(attrs: Mapping[str, Any]) -> Kernel:
    torch = load_torch()
    start, end = attrs.get("start", 0), attrs.get("end")
    return lambda x: [torch.tensor(x.shape[start:end], dtype=torch.int64)]


def _unsqueeze(attrs: Mapping[str, Any]) -> Kernel:
    def run(x: Tensor, axes: Tensor) -> list[Tensor]:
        rank = x.dim() + axes.numel()
        for axis in sorted(int(a) % rank for a in axes.tolist()):
            x = x.unsqueeze(axis)
        return [x]

    return run


def _slice(attrs: Mapping[str, Any]) -> Kernel:
    def run(x: Tensor, starts: Tensor, ends: Tensor, axes: Tensor | None = None,
            steps: Tensor | None = None) -> list[Tensor]:
        index = [slice(None)] * x.dim()
        axis_list = axes.tolist() if axes is not None else list(range(starts.numel()))
        step_list = steps.tolist() if steps is not None else [1] * starts.numel()
        for axis, start, end, step in zip(axis_list, starts.tolist(), ends.tolist(), step_list):
            if step < 1:
                raise UnsupportedOpError(f"torch peer: Slice with step {step} has no rule yet")
            index[int(axis)] = slice(int(start), int(end), int(step))
        return [x[tuple(index)]]

    return run


def _reduce_mean(attrs: Mapping[str, Any]) -> Kernel:
    keepdims = bool(attrs.get("keepdims", 1))
    attr_axes = attrs.get("axes")

    def run(x: Tensor, axes: Tensor | None = None) -> list[Tensor]:
        dims = axes.tolist() if axes is not None else attr_axes
        return [x.mean(dim=tuple(dims) if dims else None, keepdim=keepdims)]

    return run


def _cast(attrs: Mapping[str, Any]) -> Kernel:
    torch = load_torch()
    dtype = getattr(torch, np.dtype(helper.tensor_dtype_to_np_dtype(int(attrs["to"]))).name)
    return lambda x: [x.to(dtype)]


def _concat(attrs: Mapping[str, Any]) -> Kernel:
    torch = load_torch()
    axis = int(attrs["axis"])
    return lambda *xs: [torch.cat(xs, axis)]


def _reshape(attrs: Mapping[str, Any]) -> Kernel:
    allow_zero = bool(attrs.get("allowzero", 0))

    def run(x: Tensor, shape: Tensor) -> list[Tensor]:
        dims = [int(d) for d in shape.tolist()]
        if not allow_zero:
            dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
        return [x.reshape(dims)]

    return run


def _transpose(attrs: Mapping[str, Any]) -> Kernel:
    perm = attrs.get("perm")
    return lambda x: [x.permute(*(perm if perm is not None else range(x.dim() - 1, -1, -1)))]


def _div(attrs: Mapping[str, Any]) -> Kernel:
    torch = load_torch()

    def run(a: Tensor, b: Tensor) -> list[Tensor]:
        if a.dtype.is_floating_point:
            return [a / b]
        return [torch.div(a, b, rounding_mode="trunc")]  # ONNX: integer division truncates

    return run


def _function(name: str) -> Rule:
    """A rule for an op that is one torch function of its inputs, with no attributes."""
    def rule(attrs: Mapping[str, Any]) -> Kernel:
        fn = getattr(load_torch(), name)
        return lambda *xs: [fn(*xs)]

    rule.__name__ = f"_{name}"
    return rule


torch_rules: dict[str, Rule] = {
    "Add": _function("add"), "Sub": _function("sub"), "Mul": _function("mul"), "Div": _div,
    "Pow": _function("pow"), "Sqrt": _function("sqrt"), "Erf": _function("erf"), "Tanh": _function("tanh"),
    "Relu": _function("relu"), "MatMul": _function("matmul"), "Gemm": _gemm, "Softmax": _softmax,
    "Conv": _conv, "BatchNormalization": _batch_norm, "MaxPool": _max_pool,
    "GlobalAveragePool": lambda attrs: (lambda x: [x.mean(dim=tuple(range(2, x.dim())), keepdim=True)]),
    "Flatten": _flatten, "Clip": _clip, "Gather": _gather, "Shape": _shape, "Unsqueeze": _unsqueeze,
    "Slice": _slice, "ReduceMean": _reduce_mean, "Cast": _cast, "Concat": _concat, "Reshape": _reshape,
    "Transpose": _transpose,
}
"""ONNX op (default domain) -> its rule. ``Constant`` nodes are folded when the module is built."""


# ------------------------------------------------------------------------------ the module


class TorchModule:
    """An ONNX model as torch ops (see the module doc); ``run`` takes and returns numpy.

    ``module(*tensors)`` runs it on torch tensors (graph input order) and returns the outputs
    as a tuple of tensors, like an ``nn.Module``'s ``forward``.
    """

    def __init__(self, model: onnx.ModelProto) -> None:
        torch = load_torch()
        self.torch = torch
        graph = model.graph
        self.name = graph.name
        self.constants: dict[str, Tensor] = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy())
                                             for t in graph.initializer}
        self.input_names = [i.name for i in graph.input if i.name not in self.constants]
        self.output_names = [o.name for o in graph.output]
        self.steps: list[tuple[Kernel, list[str], list[str]]] = []
        for node in graph.node:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                self.constants[node.output[0]] = torch.from_numpy(_constant_value(node, attrs).copy())
                continue
            rule = torch_rules.get(node.op_type) if node.domain in ("", "ai.onnx") else None
            if rule is None:
                raise UnsupportedOpError(
                    f"torch peer: op {node.domain + '::' if node.domain else ''}{node.op_type} "
                    f"(node {node.name or node.output[0]}) has no rule in metadef.frontends.torch_peer."
                    f"torch_rules; the peer covers {', '.join(SUPPORTED_MODELS)} of the zoo "
                    f"({len(torch_rules)} ops): add a rule, or bench without --vs torch")
            self.steps.append((rule(attrs), list(node.input), list(node.output)))

    def __call__(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        values: dict[str, Tensor | None] = {"": None, **self.constants, **dict(zip(self.input_names, inputs))}
        with self.torch.inference_mode():
            for kernel, ins, outs in self.steps:
                for name, value in zip(outs, kernel(*(values[i] for i in ins))):
                    values[name] = value
        return tuple(values[o] for o in self.output_names)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs by name, for inputs by name (numpy in, numpy out)."""
        outs = self(*(self.torch.from_numpy(np.asarray(feeds[n])) for n in self.input_names))
        return {n: o.numpy() for n, o in zip(self.output_names, outs)}

    def __repr__(self) -> str:
        return f"TorchModule({self.name!r}, {len(self.steps)} steps on torch {self.torch.__version__})"


def _constant_value(node: onnx.NodeProto, attrs: Mapping[str, Any]) -> np.ndarray:
    if "value" in attrs:
        return numpy_helper.to_array(attrs["value"])
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                       ("value_ints", np.int64)):
        if key in attrs:
            return np.asarray(attrs[key], dtype)
    raise UnsupportedOpError(f"torch peer: Constant {node.name or node.output[0]} holds "
                             f"{sorted(attrs)}, which has no rule yet")


def torch_module(model: onnx.ModelProto | bytes, threads: int | None = None) -> TorchModule:
    """The torch peer of an ONNX model (a ModelProto or its bytes); ``threads`` sets torch's
    intra-op thread count (process-wide, as ``torch.set_num_threads`` is).

    Example:
        >>> import metadef as md
        >>> torch_module(md.zoo.build("mlp"), threads=1)          # doctest: +SKIP
        TorchModule('mlp', 7 steps on torch 2.13.0+cpu)
    """
    torch = load_torch()
    if isinstance(model, bytes):
        model = onnx.load_from_string(model)
    if threads is not None:
        torch.set_num_threads(threads)
    return TorchModule(model)


__all__ = ["INSTALL_HINT", "SUPPORTED_MODELS", "TORCH_VERSION", "TorchModule", "load_torch", "torch_module",
           "torch_rules"]
