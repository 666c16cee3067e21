"""A small helper that builds ONNX graphs the way PyTorch's exporter lays them out.

Nodes are named after the module path that made them (`/layer1/0/conv1/Conv`, with `_1`,
`_2`, ... for repeats in one scope), their outputs `<node name>_output_0`, and parameters
after the dotted module path (`layer1.0.conv1.weight`). Weights come from one seeded
`numpy.random.Generator`, drawn in build order, so a model is a pure function of its seed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

OPSET = 17
IR_VERSION = 8

Dim = int | str
"""One dimension of a graph input or output: a size, or a symbol such as "batch"."""


class GraphBuilder:
    """Collects nodes, initializers, inputs and outputs under hierarchical scopes.

    Example:
        >>> b = GraphBuilder(seed=0)
        >>> x = b.input("x", np.float32, ("batch", 4))
        >>> with b.scope("fc"):
        ...     w = b.normal("weight", (2, 4), std=0.1)
        ...     y = b.op("Gemm", x, w, b.zeros("bias", (2,)), transB=1, output_name="y")
        >>> b.output("y", np.float32, ("batch", 2))
        >>> b.model("tiny", doc="a tiny example").graph.node[0].name
        '/fc/Gemm'
    """

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self._scope: list[str] = []
        self._name_counts: dict[str, int] = {}
        # Built in place: copying 440 MB of BERT weights into a new proto costs a second.
        self._model = onnx.ModelProto()
        self._graph = self._model.graph

    @contextlib.contextmanager
    def scope(self, *parts: str | int) -> Iterator[None]:
        """Name everything made inside the block under `parts` (e.g. "layer1", 0)."""
        self._scope.extend(str(part) for part in parts)
        try:
            yield
        finally:
            del self._scope[len(self._scope) - len(parts) :]

    # -- parameters -------------------------------------------------------------------------

    def param(self, name: str, value: np.ndarray) -> str:
        """Add `value` as an initializer named after the current scope; return its name."""
        full_name = ".".join([*self._scope, name])
        self._graph.initializer.append(numpy_helper.from_array(value, full_name))
        return full_name

    def normal(
        self, name: str, shape: Sequence[int], std: float, mean: float = 0.0
    ) -> str:
        """Add a float32 parameter drawn from normal(mean, std)."""
        value = self.rng.standard_normal(tuple(shape), dtype=np.float32)
        value *= np.float32(std)
        value += np.float32(mean)
        return self.param(name, value)

    def uniform(self, name: str, shape: Sequence[int], low: float, high: float) -> str:
        """Add a float32 parameter drawn from uniform[low, high)."""
        value = self.rng.random(tuple(shape), dtype=np.float32)
        value *= np.float32(high - low)
        value += np.float32(low)
        return self.param(name, value)

    def zeros(self, name: str, shape: Sequence[int]) -> str:
        """Add a float32 parameter of zeros."""
        return self.param(name, np.zeros(tuple(shape), dtype=np.float32))

    # -- nodes ------------------------------------------------------------------------------

    def op(
        self,
        op_type: str,
        *inputs: str,
        output_name: str | None = None,
        **attrs: object,
    ) -> str:
        """Add one node with a single output and return that output's name.

        `output_name` names the output (for graph outputs); otherwise it is derived from the
        node's name. Attributes are passed as keywords: `b.op("Softmax", x, axis=-1)`.
        """
        name = self._unique_name(op_type)
        output = output_name or f"{name}_output_0"
        self._graph.node.append(
            helper.make_node(op_type, list(inputs), [output], name=name, **attrs)
        )
        return output

    def const(
        self, value: float | Sequence[int] | np.ndarray, dtype: type = np.int64
    ) -> str:
        """Add a Constant node (as exporters emit for scalars and shape pieces)."""
        array = np.asarray(value, dtype=dtype)
        return self.op("Constant", value=numpy_helper.from_array(array))

    def _unique_name(self, op_type: str) -> str:
        base = "/" + "/".join([*self._scope, op_type])
        count = self._name_counts.get(base, 0)
        self._name_counts[base] = count + 1
        return base if count == 0 else f"{base}_{count}"

    # -- graph inputs, outputs and the model --------------------------------------------------

    def input(self, name: str, dtype: type, shape: Sequence[Dim]) -> str:
        """Declare a graph input; return its name."""
        self._graph.input.append(_value_info(name, dtype, shape))
        return name

    def output(self, name: str, dtype: type, shape: Sequence[Dim]) -> None:
        """Declare a graph output (made by a node given `output_name=name`)."""
        self._graph.output.append(_value_info(name, dtype, shape))

    def model(
        self, graph_name: str, doc: str = "", metadata: Mapping[str, str] | None = None
    ) -> onnx.ModelProto:
        """Finish the ModelProto (opset 17, IR version 8) and hand it over."""
        self._graph.name = graph_name
        model = self._model
        model.ir_version = IR_VERSION
        model.opset_import.append(helper.make_opsetid("", OPSET))
        model.producer_name = "metadef.zoo"
        model.doc_string = doc
        helper.set_model_props(model, dict(metadata or {}))
        return model


def _value_info(name: str, dtype: type, shape: Sequence[Dim]) -> onnx.ValueInfoProto:
    elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return helper.make_tensor_value_info(name, elem_type, list(shape))


# -- layers shared by the convolutional models ----------------------------------------------


def conv(
    b: GraphBuilder,
    x: str,
    c_in: int,
    c_out: int,
    kernel: int,
    stride: int = 1,
    group: int = 1,
) -> str:
    """A bias-free Conv with He-normal weights and "same"-style padding, as torchvision uses.

    Example: `y = conv(b, x, 64, 256, kernel=1)` inside `with b.scope("conv3"):`.
    """
    fan_in = c_in // group * kernel * kernel
    weight = b.normal(
        "weight",
        (c_out, c_in // group, kernel, kernel),
        std=float(np.sqrt(2.0 / fan_in)),
    )
    pad = kernel // 2
    return b.op(
        "Conv", x, weight,
        dilations=[1, 1], group=group, kernel_shape=[kernel, kernel],
        pads=[pad, pad, pad, pad], strides=[stride, stride],
    )  # fmt: skip


def batch_norm(b: GraphBuilder, x: str, channels: int, gamma_scale: float = 1.0) -> str:
    """An unfused BatchNormalization with plausible trained statistics.

    gamma ~ U(0.5, 1.5) * gamma_scale, beta and running mean ~ N(0, 0.05), running var ~
    U(0.5, 1.5). Example: `y = batch_norm(b, y, 256, gamma_scale=0.2)`.
    """
    gamma = b.uniform("weight", (channels,), 0.5 * gamma_scale, 1.5 * gamma_scale)
    beta = b.normal("bias", (channels,), std=0.05)
    mean = b.normal("running_mean", (channels,), std=0.05)
    var = b.uniform("running_var", (channels,), 0.5, 1.5)
    return b.op(
        "BatchNormalization", x, gamma, beta, mean, var, epsilon=1e-5, momentum=0.9
    )


def classifier(
    b: GraphBuilder, x: str, features: int, classes: int, head: str, output_name: str
) -> str:
    """GlobalAveragePool, Flatten, then a Gemm head in scope `head` (torchvision's `fc`).

    Example: `logits = classifier(b, x, 2048, 1000, head="fc", output_name="logits")`.
    """
    pooled = b.op("GlobalAveragePool", x)
    flat = b.op("Flatten", pooled, axis=1)
    bound = 1.0 / np.sqrt(features)
    with b.scope(*head.split(".")):
        weight = b.uniform("weight", (classes, features), -bound, bound)
        bias = b.uniform("bias", (classes,), -bound, bound)
        return b.op(
            "Gemm",
            flat,
            weight,
            bias,
            alpha=1.0,
            beta=1.0,
            transB=1,
            output_name=output_name,
        )
