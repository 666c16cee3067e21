"""The ONNX frontend: import (ModelProto -> Graph) and export (Graph -> ModelProto)."""

from metadef.frontends.onnx.exporter import export_onnx, to_onnx
from metadef.frontends.onnx.importer import import_graph, import_onnx, load_model
from metadef.frontends.onnx.specialize import compile_onnx, import_for

__all__ = ["compile_onnx", "export_onnx", "import_for", "import_graph", "import_onnx", "load_model", "to_onnx"]
