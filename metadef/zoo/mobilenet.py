"""MobileNetV2 (width 1.0), laid out as torchvision's `mobilenet_v2` exports (eval mode).

features.0: 3x3/2 Conv 3 -> 32, BN, ReLU6. features.1 .. 17: inverted residual blocks (1x1
expand by t, 3x3 depthwise Conv via `group`, 1x1 linear projection; residual Add when the
stride is 1 and the width is kept). features.18: 1x1 Conv 320 -> 1280, BN, ReLU6. Head:
GlobalAveragePool, Flatten, Gemm 1280 -> 1000. ReLU6 is `Clip` with min 0 and max 6 given as
Constant inputs (the opset >= 11 form); BN nodes stay unfused and convs carry no bias.
"""

from __future__ import annotations

import numpy as np
import onnx

from .builder import GraphBuilder, batch_norm, classifier, conv

SUMMARY = (
    "MobileNetV2 1.0 (torchvision layout), depthwise convs, ReLU6 as Clip, 1000 classes"
)
INPUTS = (("input", "float32", ("batch", 3, 224, 224)),)
OUTPUTS = (("logits", "float32", ("batch", 1000)),)
EXAMPLE_DIMS = ({"batch": 1}, {"batch": 8})

SETTINGS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)
"""(expansion t, output channels c, repeats n, first stride s), as in the paper and torchvision."""
LAST_CHANNELS = 1280


def build(seed: int) -> onnx.ModelProto:
    """Build MobileNetV2 with weights drawn from `seed`. Example: `model = build(0)`."""
    b = GraphBuilder(seed)
    x = b.input("input", np.float32, ("batch", 3, 224, 224))
    with b.scope("features", 0):
        x = _conv_bn_relu6(b, x, 3, 32, kernel=3, stride=2)
    channels, index = 32, 1
    for expansion, c_out, repeats, first_stride in SETTINGS:
        for repeat in range(repeats):
            with b.scope("features", index):
                x = _inverted_residual(
                    b, x, channels, c_out, first_stride if repeat == 0 else 1, expansion
                )
            channels, index = c_out, index + 1
    with b.scope("features", index):
        x = _conv_bn_relu6(b, x, channels, LAST_CHANNELS, kernel=1)
    classifier(b, x, LAST_CHANNELS, 1000, head="classifier.1", output_name="logits")
    b.output("logits", np.float32, ("batch", 1000))
    return b.model("mobilenetv2")


def _conv_bn_relu6(
    b: GraphBuilder,
    x: str,
    c_in: int,
    c_out: int,
    kernel: int,
    stride: int = 1,
    group: int = 1,
) -> str:
    """torchvision's Conv2dNormActivation: children 0 (Conv), 1 (BN), 2 (ReLU6)."""
    with b.scope(0):
        x = conv(b, x, c_in, c_out, kernel=kernel, stride=stride, group=group)
    with b.scope(1):
        x = batch_norm(b, x, c_out)
    with b.scope(2):
        return b.op("Clip", x, b.const(0.0, np.float32), b.const(6.0, np.float32))


def _inverted_residual(
    b: GraphBuilder, x: str, c_in: int, c_out: int, stride: int, expansion: int
) -> str:
    """[1x1 expand] -> 3x3 depthwise -> 1x1 linear projection (+ x when shapes allow)."""
    hidden = c_in * expansion
    y, child = x, 0
    with b.scope("conv"):
        if expansion != 1:
            with b.scope(child):
                y = _conv_bn_relu6(b, y, c_in, hidden, kernel=1)
            child += 1
        with b.scope(child):
            y = _conv_bn_relu6(
                b, y, hidden, hidden, kernel=3, stride=stride, group=hidden
            )
        with b.scope(child + 1):
            y = conv(b, y, hidden, c_out, kernel=1)
        with b.scope(child + 2):
            y = batch_norm(b, y, c_out)
    if stride == 1 and c_in == c_out:
        return b.op("Add", x, y)
    return y
