"""The model zoo: the models metadef builds itself, since nothing may be downloaded at run time.

Each model is an ONNX ModelProto (opset 17, IR version 8) laid out as PyTorch's exporter
would emit it, with deterministic weights drawn from a seed and symbolic `batch` (and `seq`)
dimensions on its inputs and outputs. This package imports only numpy, onnx and the stdlib.

Example:
    >>> from metadef import zoo
    >>> zoo.names()
    ['mlp', 'resnet50', 'mobilenetv2', 'bert']
    >>> model = zoo.build("mlp", seed=0)
    >>> feeds = zoo.describe("mlp").example_inputs(batch=2)
    >>> feeds["x"].shape
    (2, 784)
"""

from __future__ import annotations

import os
import pathlib
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np
import onnx
from onnx import helper

from . import bert, mlp, mobilenet, resnet
from .builder import Dim

__all__ = ["ZooModel", "build", "describe", "export", "names"]

TensorSpec = tuple[str, str, tuple[Dim, ...]]
"""(name, dtype, symbolic shape), e.g. ("input", "float32", ("batch", 3, 224, 224))."""


@dataclass(frozen=True)
class ZooModel:
    """What a zoo model takes and gives, and how to make inputs for it.

    Example:
        >>> info = describe("bert")
        >>> [name for name, _, _ in info.inputs]
        ['input_ids', 'attention_mask']
        >>> info.example_inputs(batch=2, seq=16)["attention_mask"].shape
        (2, 16)
    """

    name: str
    summary: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    example_dims: tuple[Mapping[str, int], ...]
    """Typical sizes for the symbolic dims, e.g. ({"batch": 1, "seq": 128}, ...)."""
    make_inputs: Callable[[int, int | None, int], dict[str, np.ndarray]] = field(
        repr=False, compare=False
    )
    build_model: Callable[[int], onnx.ModelProto] = field(repr=False, compare=False)

    def example_inputs(
        self, batch: int = 1, seq: int | None = None, seed: int = 0
    ) -> dict[str, np.ndarray]:
        """Valid random inputs of `batch` rows (and `seq` tokens, for sequence models).

        `seq` defaults to 128 for BERT; passing it to a model without a `seq` dim is an error.
        Example: `describe("resnet50").example_inputs(batch=4)["input"].shape == (4, 3, 224, 224)`.
        """
        if batch < 1:
            raise ValueError(
                f"batch must be >= 1 for zoo model {self.name!r}, got {batch}"
            )
        return self.make_inputs(batch, seq, seed)


def _image_inputs(batch: int, seq: int | None, seed: int) -> dict[str, np.ndarray]:
    _reject_seq("an image model", seq)
    rng = np.random.default_rng(seed)
    return {"input": rng.standard_normal((batch, 3, 224, 224), dtype=np.float32)}


def _mlp_inputs(batch: int, seq: int | None, seed: int) -> dict[str, np.ndarray]:
    _reject_seq("mlp", seq)
    return mlp.example_inputs(batch, seed)


def _bert_inputs(batch: int, seq: int | None, seed: int) -> dict[str, np.ndarray]:
    return bert.example_inputs(batch, 128 if seq is None else seq, seed)


def _reject_seq(model: str, seq: int | None) -> None:
    if seq is not None:
        raise ValueError(
            f"{model} has no 'seq' dimension; call example_inputs without seq (got seq={seq})"
        )


def _entry(name: str, module: ModuleType, make_inputs: Callable) -> ZooModel:
    return ZooModel(
        name=name,
        summary=module.SUMMARY,
        inputs=module.INPUTS,
        outputs=module.OUTPUTS,
        example_dims=module.EXAMPLE_DIMS,
        make_inputs=make_inputs,
        build_model=module.build,
    )


_ZOO: dict[str, ZooModel] = {
    "mlp": _entry("mlp", mlp, _mlp_inputs),
    "resnet50": _entry("resnet50", resnet, _image_inputs),
    "mobilenetv2": _entry("mobilenetv2", mobilenet, _image_inputs),
    "bert": _entry("bert", bert, _bert_inputs),
}


def names() -> list[str]:
    """The zoo's model names, in a fixed order.

    Example: `names() == ["mlp", "resnet50", "mobilenetv2", "bert"]`.
    """
    return list(_ZOO)


def describe(name: str) -> ZooModel:
    """The inputs, outputs and example sizes of model `name` (builds nothing).

    Example: `describe("mlp").inputs == (("x", "float32", ("batch", 784)),)`.
    """
    if name not in _ZOO:
        raise KeyError(f"unknown zoo model {name!r}; known models: {', '.join(_ZOO)}")
    return _ZOO[name]


def build(name: str, *, seed: int = 0) -> onnx.ModelProto:
    """Build model `name` with weights drawn from `seed`; same seed, same bytes.

    Example: `model = build("resnet50", seed=0)`, then `onnx.checker.check_model(model)`.
    """
    info = describe(name)
    model = info.build_model(seed)
    model.doc_string = f"Built by metadef's zoo: {name}, seed {seed}. {info.summary}."
    helper.set_model_props(
        model, {"metadef.zoo.model": name, "metadef.zoo.seed": str(seed)}
    )
    return model


def export(name: str, path: str | os.PathLike[str], *, seed: int = 0) -> pathlib.Path:
    """Build model `name` and write it to `path` atomically (temp file, then os.replace).

    Example: `export("mlp", "mlp.onnx")` returns `Path("mlp.onnx")`; load with `onnx.load`.
    """
    target = pathlib.Path(path)
    data = build(name, seed=seed).SerializeToString()
    fd, temp = tempfile.mkstemp(
        dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(fd, "wb") as file:
            os.fchmod(file.fileno(), 0o644)  # mkstemp makes 0o600; a model is no secret
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, target)
    except BaseException:
        pathlib.Path(temp).unlink(missing_ok=True)
        raise
    return target
