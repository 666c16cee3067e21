"""ResNet-50 v1.5, laid out as torchvision's `resnet50` exports (eval mode, no folding).

Stem: 7x7/2 Conv, BatchNormalization, Relu, 3x3/2 MaxPool. Four stages of bottleneck blocks
([3, 4, 6, 3], widths 64..512, expansion 4) with the stride on the 3x3 conv (v1.5) and a
1x1 Conv + BN downsample where the shape changes; residual Add then Relu. Head:
GlobalAveragePool, Flatten, Gemm 2048 -> 1000. Convs carry no bias; BN nodes stay unfused.
The last BN of each block has a small gamma (x0.2) so activations stay O(1) over 50 layers.
"""

from __future__ import annotations

import numpy as np
import onnx

from .builder import GraphBuilder, batch_norm, classifier, conv

SUMMARY = (
    "ResNet-50 v1.5 (torchvision layout), unfused BatchNormalization, 1000 classes"
)
INPUTS = (("input", "float32", ("batch", 3, 224, 224)),)
OUTPUTS = (("logits", "float32", ("batch", 1000)),)
EXAMPLE_DIMS = ({"batch": 1}, {"batch": 8})

STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))
"""(bottleneck width, blocks, stride of the first block) for layer1 .. layer4."""
DEPTHS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
"""Blocks per stage of the bottleneck ResNets (the zoo's ``resnet50`` is depth 50)."""
EXPANSION = 4
LAST_BN_GAMMA = 0.2
DOWNSAMPLE_BN_GAMMA = 0.7


def build(seed: int, depth: int = 50) -> onnx.ModelProto:
    """Build ResNet-50 (or 101, 152) with weights drawn from `seed`.

    Example: `model = build(0)`; `build(0, depth=101)` shares every block shape with ResNet-50.
    """
    if depth not in DEPTHS:
        raise ValueError(f"depth must be one of {sorted(DEPTHS)}, got {depth}")
    b = GraphBuilder(seed)
    x = b.input("input", np.float32, ("batch", 3, 224, 224))
    x = _stem(b, x)
    channels = 64
    stages = [(width, blocks, stride) for (width, _, stride), blocks in zip(STAGES, DEPTHS[depth])]
    for stage, (width, blocks, stride) in enumerate(stages, start=1):
        for index in range(blocks):
            with b.scope(f"layer{stage}", index):
                x = _bottleneck(b, x, channels, width, stride if index == 0 else 1)
            channels = width * EXPANSION
    classifier(b, x, channels, 1000, head="fc", output_name="logits")
    b.output("logits", np.float32, ("batch", 1000))
    return b.model(f"resnet{depth}")


def _stem(b: GraphBuilder, x: str) -> str:
    with b.scope("conv1"):
        x = conv(b, x, 3, 64, kernel=7, stride=2)
    with b.scope("bn1"):
        x = batch_norm(b, x, 64)
    with b.scope("relu"):
        x = b.op("Relu", x)
    with b.scope("maxpool"):
        return b.op(
            "MaxPool",
            x,
            ceil_mode=0,
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
            strides=[2, 2],
        )


def _bottleneck(b: GraphBuilder, x: str, c_in: int, width: int, stride: int) -> str:
    """conv1x1 -> conv3x3 (stride) -> conv1x1, each with BN, plus the shortcut."""
    c_out = width * EXPANSION
    convs = ((c_in, width, 1, 1), (width, width, 3, stride), (width, c_out, 1, 1))
    y = x
    for i, (cin, cout, kernel, conv_stride) in enumerate(convs, start=1):
        with b.scope(f"conv{i}"):
            y = conv(b, y, cin, cout, kernel=kernel, stride=conv_stride)
        with b.scope(f"bn{i}"):
            y = batch_norm(b, y, cout, gamma_scale=LAST_BN_GAMMA if i == 3 else 1.0)
        if i < 3:
            with b.scope("relu"):
                y = b.op("Relu", y)
    shortcut = x
    if stride != 1 or c_in != c_out:
        with b.scope("downsample", 0):
            shortcut = conv(b, x, c_in, c_out, kernel=1, stride=stride)
        with b.scope("downsample", 1):
            shortcut = batch_norm(b, shortcut, c_out, gamma_scale=DOWNSAMPLE_BN_GAMMA)
    y = b.op("Add", y, shortcut)
    with b.scope("relu"):
        return b.op("Relu", y)
