"""metadef: a deep-learning graph compiler and model format.

Example:
    >>> import metadef as md
    >>> graph = md.import_onnx(md.zoo.build("mlp"))        # -> md.Graph, shapes inferred
    >>> [str(v.type) for v in graph.inputs]
    ['f32[batch,784]']
"""

import importlib
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from metadef.api import compile, load, optimize, save
from metadef.core.dtypes import register_dtype
from metadef.core.errors import (
    DTypeError,
    FormatError,
    GraphError,
    InputError,
    MetadefError,
    ShapeError,
    SpecializationError,
    UnsupportedOpError,
)
from metadef.format.custom_metadata import BaseMetadata, register_metadata_type
from metadef.ir import Graph, Node, Value
from metadef.ops import metaop
from metadef.runtime.model import Model
from metadef.runtime.profile import DeviceProfile, choose_variant
from metadef.runtime.session import Session
from metadef.runtime.specializing import SpecializingSession

if TYPE_CHECKING:
    from metadef import zoo
    from metadef.frontends.onnx import compile_onnx, export_onnx, import_onnx

__version__ = "0.1.0"

_ON_FIRST_USE = {"zoo": ("metadef.zoo", None), "import_onnx": ("metadef.frontends.onnx", "import_onnx"),
                 "export_onnx": ("metadef.frontends.onnx", "export_onnx"),
                 "compile_onnx": ("metadef.frontends.onnx", "compile_onnx")}
"""Public names whose modules load on first use: they need the ``onnx`` package (~15 MB and
0.1 s), which loading a .mdef file and running it do not."""


def __getattr__(name: str) -> Any:
    """``md.zoo``, ``md.import_onnx``, ``md.export_onnx``, ``md.compile_onnx``: imported when
    first asked for (PEP 562), so ``import metadef`` does not load ``onnx``.

    Example:
        >>> import metadef as md
        >>> md.import_onnx.__name__, md.zoo.names()[0]
        ('import_onnx', 'mlp')
    """
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module 'metadef' has no attribute {name!r}")
    module, attribute = _ON_FIRST_USE[name]
    value = importlib.import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value


def load_best(paths: Sequence[str | os.PathLike[str]], profile: DeviceProfile | None = None,
              **load_options: Any) -> Model:
    """Load the variant of one model (its .mdef files in fp32 / fp16 / int8 ...) that suits
    ``profile`` (default: ``DeviceProfile.detect()``), chosen by each file's hardware layer
    (see ``metadef.runtime.profile.choose_variant``); ``load_options`` go to ``load``.

    Example:
        >>> import tempfile, pathlib, metadef as md
        >>> d, g = pathlib.Path(tempfile.mkdtemp()), md.import_onnx(md.zoo.build("mlp"))
        >>> paths = [md.save(g, d / "fp32.mdef"),
        ...          md.save(g, d / "int8.mdef", quantize="int8", metadata={"hardware": {"cpu_features": ["avx512f"]}})]
        >>> md.load_best(paths, md.DeviceProfile(features=frozenset({"avx2", "fma"}))).file.path.name
        'fp32.mdef'
    """
    return load(choose_variant(paths, profile).path, **load_options)


__all__ = [
    "BaseMetadata", "register_metadata_type",
    "DTypeError", "DeviceProfile", "FormatError", "Graph", "GraphError", "InputError", "MetadefError", "Model", "Node",
    "Session", "ShapeError", "SpecializationError", "SpecializingSession", "UnsupportedOpError", "Value",
    "__version__", "compile", "compile_onnx",
    "export_onnx", "import_onnx", "load", "load_best", "metaop", "optimize", "register_dtype", "save", "zoo",
]
