"""Architectures beyond the zoo, as PyTorch's exporter writes them: metadef x86 vs ONNX Runtime.

The zoo has four models; users bring others. Each model here is built in PyTorch from its
layers (random weights: nothing is downloaded) and exported with ``torch.onnx.export``
(TorchScript exporter, opset 17, dynamic batch and sequence axes), then run by ONNX Runtime
(ORT_ENABLE_ALL, ``threads`` intra-op threads) and by metadef (``md.optimize`` at ``--level``,
x86 with ``threads``), interleaved in one process (``metadef.testing.timing``): medians in ms,
the ratio metadef / ORT, the largest difference from ORT's output relative to its largest
value, metadef's compile time, and the kinds of steps it ran.

- GPT-style decoder: 4 blocks of d 256, 4 heads, causal mask (``masked_fill`` of a ``tril``),
  tanh GELU, sequence 128;
- EfficientNet-style: MBConv blocks (expand 1x1, depthwise 3x3 / 5x5, squeeze-excitation with
  SiLU and Sigmoid, project 1x1, residuals), 224 x 224;
- ConvNeXt-style: depthwise 7x7, LayerNorm over channels-last, Linear 4x, GELU, layer scale;
- a speech encoder: a 2-layer bidirectional LSTM of 256 over 100 frames of 80 features;
- ViT-style: 16x16 patches, 4 ``nn.TransformerEncoderLayer`` of 192 (pre-norm, GELU).

    .venv/bin/python bench/x86_torch_models.py [--threads 1] [--batch 1] [--runs 20] [--only GPT LSTM]

Needs torch (``pip install torch==2.13.0``, in the test dependencies).
"""

from __future__ import annotations

import argparse
import functools
import io
import math
import statistics
import time
import warnings
from collections import Counter
from collections.abc import Callable

import numpy as np
import onnx
import torch
from torch import nn

import metadef as md
from metadef.cli_bench import ort_session
from metadef.testing.timing import time_interleaved


class _GPTBlock(nn.Module):
    def __init__(self, d: int = 256, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(d, dim=2))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
        y = (scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class _GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(1000, 256), nn.Embedding(512, 256)
        self.blocks = nn.Sequential(*[_GPTBlock() for _ in range(4)])
        self.norm, self.head = nn.LayerNorm(256), nn.Linear(256, 1000)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1]).unsqueeze(0)
        return self.head(self.norm(self.blocks(self.tokens(ids) + self.positions(positions))))


class _MBConv(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, stride: int, expand: int = 6) -> None:
        super().__init__()
        mid = cin * expand
        self.expand = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.SiLU())
        self.depthwise = nn.Sequential(nn.Conv2d(mid, mid, k, stride, k // 2, groups=mid, bias=False),
                                       nn.BatchNorm2d(mid), nn.SiLU())
        self.excite = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(mid, cin // 4, 1), nn.SiLU(),
                                    nn.Conv2d(cin // 4, mid, 1), nn.Sigmoid())
        self.project = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.depthwise(self.expand(x))
        y = self.project(y * self.excite(y))
        return x + y if self.residual else y


class _EfficientNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU())
        self.blocks = nn.Sequential(_MBConv(32, 24, 3, 2), _MBConv(24, 24, 3, 1), _MBConv(24, 40, 5, 2),
                                    _MBConv(40, 40, 5, 1), _MBConv(40, 80, 3, 2), _MBConv(80, 112, 5, 1),
                                    _MBConv(112, 192, 5, 2))
        self.head = nn.Sequential(nn.Conv2d(192, 1280, 1), nn.SiLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(1280, 1000))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


class _ConvNeXtBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.depthwise, self.norm = nn.Conv2d(d, d, 7, padding=3, groups=d), nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.scale = nn.Parameter(torch.full((d,), 0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.depthwise(x).permute(0, 2, 3, 1))
        return x + (self.fc2(nn.functional.gelu(self.fc1(y))) * self.scale).permute(0, 3, 1, 2)


class _ConvNeXt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.down = nn.Conv2d(3, 96, 4, 4), nn.Conv2d(96, 192, 2, 2)
        self.stage1 = nn.Sequential(_ConvNeXtBlock(96), _ConvNeXtBlock(96))
        self.stage2 = nn.Sequential(_ConvNeXtBlock(192), _ConvNeXtBlock(192))
        self.head = nn.Linear(192, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stage2(self.down(self.stage1(self.stem(x)))).mean((2, 3)))


class _Speech(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.head = nn.LSTM(80, 256, num_layers=2, bidirectional=True), nn.Linear(512, 40)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0])


class _ViT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, 192, 16, 16)
        layer = nn.TransformerEncoderLayer(192, 3, 768, batch_first=True, norm_first=True, activation="gelu",
                                           dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        self.head = nn.Linear(192, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.patches(x).flatten(2).transpose(1, 2)).mean(1))


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[int], tuple[torch.Tensor, ...]], dict]] = {
    "GPT-style decoder, 4 x 256, seq 128": (_GPT, lambda b: (torch.randint(0, 1000, (b, 128)),),
                                            {"ids": {0: "b", 1: "s"}}),
    "EfficientNet-style, 224": (_EfficientNet, lambda b: (torch.randn(b, 3, 224, 224),), {"x": {0: "b"}}),
    "ConvNeXt-style, 224": (_ConvNeXt, lambda b: (torch.randn(b, 3, 224, 224),), {"x": {0: "b"}}),
    "LSTM speech encoder, 2 x bi 256, 100 frames": (_Speech, lambda b: (torch.randn(100, b, 80),),
                                                    {"x": {0: "t", 1: "b"}}),
    "ViT-style, 4 x 192, 224": (_ViT, lambda b: (torch.randn(b, 3, 224, 224),), {"x": {0: "b"}}),
}
"""name -> (the module, its example inputs for a batch, the exported inputs' dynamic axes)."""


def exported(name: str, batch: int) -> tuple[bytes, dict[str, np.ndarray]]:
    """The model's ONNX bytes and feeds for ``batch``."""
    build, inputs, dynamic = MODELS[name]
    torch.manual_seed(0)
    module, args = build().eval(), inputs(batch)
    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, buffer, input_names=list(dynamic), output_names=["y"],
                          dynamic_axes=dynamic, opset_version=17, dynamo=False)
    return buffer.getvalue(), {k: a.numpy() for k, a in zip(dynamic, args)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--level", default="aggressive")
    parser.add_argument("--only", nargs="*", default=[], help="models whose name contains one of these")
    args = parser.parse_args()
    print(f"threads {args.threads}, batch {args.batch}, level {args.level}\n"
          "| model | metadef ms | ORT ms | ratio | max diff | compile s | metadef steps |\n"
          "|---|---|---|---|---|---|---|")
    for name in MODELS:
        if args.only and not any(o.lower() in name.lower() for o in args.only):
            continue
        data, feeds = exported(name, args.batch)
        ort = ort_session(data, args.threads)
        t0 = time.perf_counter()
        sess = md.compile(md.optimize(md.import_onnx(onnx.load_from_string(data)), level=args.level),
                          target="x86", threads=args.threads)
        compiled = time.perf_counter() - t0
        ours, theirs = sess.run(feeds)["y"], ort.run(None, feeds)[0]
        diff = float(np.max(np.abs(ours - theirs)) / (np.max(np.abs(theirs)) + 1e-30))
        sample = time_interleaved({"metadef": functools.partial(sess.run, feeds),
                                   "ort": functools.partial(ort.run, None, feeds)}, warmup=2, iterations=args.runs)
        a, b = (statistics.median(sample.times[k]) * 1e3 for k in ("metadef", "ort"))
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(Counter(p.kind for p in sess.executable.plan).items()))
        print(f"| {name} | {a:.2f} | {b:.2f} | {a / b:.2f} | {diff:.0e} | {compiled:.2f} | {kinds} |", flush=True)


if __name__ == "__main__":
    main()
