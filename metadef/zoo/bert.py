"""BERT-base encoder, laid out as PyTorch exports Hugging Face's `BertModel` (no fused ops).

Vocabulary 30522, hidden 768, 12 layers of 12 heads, intermediate 3072, 512 positions. The
token type is always 0, so its embedding row is a constant added to every token. Everything
an exporter decomposes stays decomposed: LayerNorm (ReduceMean, Sub, Pow, ReduceMean, Add,
Sqrt, Div, Mul, Add), GELU (Div, Erf, Add, Mul, Mul), head reshapes built from
Shape -> Gather -> Unsqueeze -> Concat so `batch` and `seq` stay symbolic. Linear weights are
stored [in, out] for `MatMul` (as exporters store them). Weights are normal(0, 0.02) as BERT
initializes them; LayerNorm gamma is 1 and beta 0, each plus normal(0, 0.02) noise, and biases
are normal(0, 0.02), so that a compiler that swaps or drops them is caught.
"""

from __future__ import annotations

import numpy as np
import onnx

from .builder import GraphBuilder

SUMMARY = "BERT-base encoder (12 layers, hidden 768, 12 heads) with pooler, exporter-style ops"
INPUTS = (
    ("input_ids", "int64", ("batch", "seq")),
    ("attention_mask", "int64", ("batch", "seq")),
)
OUTPUTS = (
    ("last_hidden_state", "float32", ("batch", "seq", 768)),
    ("pooler_output", "float32", ("batch", 768)),
)
EXAMPLE_DIMS = (
    {"batch": 1, "seq": 128},
    {"batch": 8, "seq": 128},
    {"batch": 1, "seq": 512},
)

VOCAB = 30522
HIDDEN = 768
LAYERS = 12
HEADS = 12
INTERMEDIATE = 3072
MAX_POSITIONS = 512
HEAD_DIM = HIDDEN // HEADS
INIT_STD = 0.02
LAYER_NORM_EPS = 1e-12
CLS, SEP, PAD = 101, 102, 0


def build(seed: int) -> onnx.ModelProto:
    """Build BERT-base with weights drawn from `seed`. Example: `model = build(0)`."""
    b = GraphBuilder(seed)
    input_ids = b.input("input_ids", np.int64, ("batch", "seq"))
    attention_mask = b.input("attention_mask", np.int64, ("batch", "seq"))
    with b.scope("embeddings"):
        x = _embeddings(b, input_ids)
    mask = _extended_mask(b, attention_mask)
    for index in range(LAYERS):
        with b.scope("encoder", "layer", index):
            x = _layer(
                b,
                x,
                mask,
                output_name="last_hidden_state" if index == LAYERS - 1 else None,
            )
    with b.scope("pooler"):
        _pooler(b, x)
    b.output("last_hidden_state", np.float32, ("batch", "seq", HIDDEN))
    b.output("pooler_output", np.float32, ("batch", HIDDEN))
    return b.model("bert")


def example_inputs(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    """Token ids `[CLS] ... [SEP] [PAD]...` and a mask of ones then trailing zeros.

    Row 0 always has padding (when seq >= 4); other rows keep a random length >= seq / 2.
    Example: `example_inputs(2, 16, 0)["input_ids"].shape == (2, 16)`.
    """
    if not 2 <= seq <= MAX_POSITIONS:
        raise ValueError(f"BERT needs 2 <= seq <= {MAX_POSITIONS}, got seq={seq}")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(2, seq // 2), seq + 1, size=batch)
    lengths[0] = max(2, seq - max(1, seq // 4))
    positions = np.arange(seq)[None, :]
    attention_mask = (positions < lengths[:, None]).astype(np.int64)
    input_ids = rng.integers(1000, VOCAB, size=(batch, seq), dtype=np.int64)
    input_ids[:, 0] = CLS
    input_ids[np.arange(batch), lengths - 1] = SEP
    input_ids[attention_mask == 0] = PAD
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def _embeddings(b: GraphBuilder, input_ids: str) -> str:
    """word[ids] + position[:seq] + token_type[0], then LayerNorm."""
    with b.scope("word_embeddings"):
        words = b.op(
            "Gather", b.normal("weight", (VOCAB, HIDDEN), INIT_STD), input_ids, axis=0
        )
    with b.scope("position_embeddings"):
        table = b.normal("weight", (MAX_POSITIONS, HIDDEN), INIT_STD)
        seq = b.op("Unsqueeze", _dim(b, input_ids, 1), b.const([0]))
        positions = b.op("Slice", table, b.const([0]), seq, b.const([0]))
    with b.scope("token_type_embeddings"):
        token_type = b.normal("weight_row0", (HIDDEN,), INIT_STD)
    x = b.op("Add", b.op("Add", words, positions), token_type)
    with b.scope("LayerNorm"):
        return _layer_norm(b, x)


def _extended_mask(b: GraphBuilder, attention_mask: str) -> str:
    """(1 - mask[:, None, None, :]) * -10000 as float32: [batch, 1, 1, seq]."""
    mask = b.op("Unsqueeze", attention_mask, b.const([1]))
    mask = b.op("Unsqueeze", mask, b.const([2]))
    mask = b.op("Cast", mask, to=onnx.TensorProto.FLOAT)
    mask = b.op("Sub", b.const(1.0, np.float32), mask)
    return b.op("Mul", mask, b.const(-10000.0, np.float32))


def _layer(b: GraphBuilder, x: str, mask: str, output_name: str | None) -> str:
    """One encoder layer: self-attention block, then the feed-forward block."""
    with b.scope("attention"):
        with b.scope("self"):
            context = _self_attention(b, x, mask)
        with b.scope("output"):
            x = _dense_residual_norm(b, context, x, HIDDEN, HIDDEN)
    with b.scope("intermediate"):
        with b.scope("dense"):
            hidden = _linear(b, x, HIDDEN, INTERMEDIATE)
        with b.scope("intermediate_act_fn"):
            hidden = _gelu(b, hidden)
    with b.scope("output"):
        return _dense_residual_norm(b, hidden, x, INTERMEDIATE, HIDDEN, output_name)


def _self_attention(b: GraphBuilder, x: str, mask: str) -> str:
    """softmax(Q K^T / sqrt(d) + mask) V over 12 heads, merged back to [batch, seq, 768]."""
    heads = {}
    for name in ("query", "key", "value"):
        with b.scope(name):
            projected = _linear(b, x, HIDDEN, HIDDEN)
        heads[name] = _split_heads(b, projected, key=name == "key")
    scores = b.op("MatMul", heads["query"], heads["key"])
    scores = b.op("Div", scores, b.const(np.sqrt(HEAD_DIM), np.float32))
    scores = b.op("Add", scores, mask)
    probs = b.op("Softmax", scores, axis=-1)
    context = b.op("MatMul", probs, heads["value"])
    context = b.op("Transpose", context, perm=[0, 2, 1, 3])
    shape = b.op(
        "Concat",
        _dim_1d(b, context, 0),
        _dim_1d(b, context, 1),
        b.const([HIDDEN]),
        axis=0,
    )
    return b.op("Reshape", context, shape)


def _split_heads(b: GraphBuilder, x: str, key: bool) -> str:
    """[batch, seq, 768] -> [batch, 12, seq, 64], or [batch, 12, 64, seq] for the keys."""
    pieces = (_dim_1d(b, x, 0), _dim_1d(b, x, 1), b.const([HEADS]), b.const([HEAD_DIM]))
    x = b.op("Reshape", x, b.op("Concat", *pieces, axis=0))
    return b.op("Transpose", x, perm=[0, 2, 3, 1] if key else [0, 2, 1, 3])


def _dim(b: GraphBuilder, x: str, axis: int) -> str:
    """Shape(x)[axis] as an int64 scalar, the way exporters read a symbolic size."""
    return b.op("Gather", b.op("Shape", x), b.const(axis), axis=0)


def _dim_1d(b: GraphBuilder, x: str, axis: int) -> str:
    """Shape(x)[axis] as a 1-element int64 tensor, ready for Concat."""
    return b.op("Unsqueeze", _dim(b, x, axis), b.const([0]))


def _dense_residual_norm(
    b: GraphBuilder,
    x: str,
    residual: str,
    n_in: int,
    n_out: int,
    output_name: str | None = None,
) -> str:
    """LayerNorm(dense(x) + residual): BertSelfOutput and BertOutput."""
    with b.scope("dense"):
        x = _linear(b, x, n_in, n_out)
    x = b.op("Add", x, residual)
    with b.scope("LayerNorm"):
        return _layer_norm(b, x, output_name)


def _linear(b: GraphBuilder, x: str, n_in: int, n_out: int) -> str:
    """nn.Linear on a 3-D input: MatMul by the [in, out] weight, then Add the bias."""
    weight = b.normal("weight", (n_in, n_out), INIT_STD)
    bias = b.normal("bias", (n_out,), INIT_STD)
    return b.op("Add", b.op("MatMul", x, weight), bias)


def _layer_norm(b: GraphBuilder, x: str, output_name: str | None = None) -> str:
    """LayerNorm over the last axis, decomposed exactly as exporters emit it."""
    gamma = b.normal("weight", (HIDDEN,), INIT_STD, mean=1.0)
    beta = b.normal("bias", (HIDDEN,), INIT_STD)
    mean = b.op("ReduceMean", x, axes=[-1], keepdims=1)
    centered = b.op("Sub", x, mean)
    variance = b.op(
        "ReduceMean",
        b.op("Pow", centered, b.const(2.0, np.float32)),
        axes=[-1],
        keepdims=1,
    )
    std = b.op("Sqrt", b.op("Add", variance, b.const(LAYER_NORM_EPS, np.float32)))
    normed = b.op("Div", centered, std)
    return b.op("Add", b.op("Mul", normed, gamma), beta, output_name=output_name)


def _gelu(b: GraphBuilder, x: str) -> str:
    """x * 0.5 * (1 + erf(x / sqrt(2))), as the exporter emits nn.GELU: Div, Erf, Add, Mul, Mul."""
    erf = b.op("Erf", b.op("Div", x, b.const(np.sqrt(2.0), np.float32)))
    return b.op(
        "Mul",
        b.op("Mul", x, b.op("Add", erf, b.const(1.0, np.float32))),
        b.const(0.5, np.float32),
    )


def _pooler(b: GraphBuilder, x: str) -> str:
    """tanh(dense(hidden[:, 0])): the pooled [CLS] vector."""
    first = b.op("Gather", x, b.const(0), axis=1)
    with b.scope("dense"):
        weight = b.normal("weight", (HIDDEN, HIDDEN), INIT_STD)
        bias = b.normal("bias", (HIDDEN,), INIT_STD)
        pooled = b.op("Gemm", first, weight, bias, alpha=1.0, beta=1.0, transB=1)
    with b.scope("activation"):
        return b.op("Tanh", pooled, output_name="pooler_output")
