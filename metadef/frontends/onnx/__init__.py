"""The ONNX frontend: import (ModelProto -> Graph) and export (Graph -> ModelProto)."""

from metadef.frontends.onnx.exporter import export_onnx, to_onnx
from metadef.frontends.onnx.importer import import_graph, import_onnx, load_model

__all__ = ["export_onnx", "import_graph", "import_onnx", "load_model", "to_onnx"]
