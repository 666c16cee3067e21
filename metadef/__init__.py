"""metadef: a deep-learning graph compiler and model format.

Example:
    >>> import metadef as md
    >>> graph = md.import_onnx(md.zoo.build("mlp"))        # -> md.Graph, shapes inferred
    >>> [str(v.type) for v in graph.inputs]
    ['f32[batch,784]']
"""

from metadef import zoo
from metadef.api import compile, load, optimize, save
from metadef.core.dtypes import register_dtype
from metadef.core.errors import (
    DTypeError,
    FormatError,
    GraphError,
    InputError,
    MetadefError,
    ShapeError,
    UnsupportedOpError,
)
from metadef.format.custom_metadata import BaseMetadata, register_metadata_type
from metadef.frontends.onnx import export_onnx, import_onnx
from metadef.ir import Graph, Node, Value
from metadef.ops import metaop
from metadef.runtime.model import Model
from metadef.runtime.session import Session

__version__ = "0.1.0"

__all__ = [
    "BaseMetadata", "register_metadata_type",
    "DTypeError", "FormatError", "Graph", "GraphError", "InputError", "MetadefError", "Model", "Node",
    "Session", "ShapeError", "UnsupportedOpError", "Value", "__version__", "compile",
    "export_onnx", "import_onnx", "load", "metaop", "optimize", "register_dtype", "save", "zoo",
]
