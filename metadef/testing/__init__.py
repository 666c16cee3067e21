"""Testing tools that ship with metadef: the ONNX node-test conformance harness."""
