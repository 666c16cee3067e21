"""The standard ONNX operators, one family a file. Importing this package registers them.

To add an op: declare it in the file of its family with ``metaop(...)``; nothing else changes.
"""

from metadef.ops.defs import (  # noqa: F401  (imported for their registrations)
    activation,
    composite,
    control,
    elementwise,
    fused,
    image,
    linalg,
    loops,
    loss,
    microsoft,
    microsoft_qlinear,
    ml,
    nn,
    nn_norm,
    nn_pool,
    nn_resize,
    onnx23,
    onnx27,
    preview,
    quantized,
    random_ops,
    reduce,
    rnn,
    signal,
    strings,
    tensor,
    tensor_index,
    text_ml,
    training,
    vision,
    vision2,
)
