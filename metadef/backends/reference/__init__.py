"""The reference backend: numpy evaluation of every op from its semantics (the oracle)."""

from metadef.backends.reference.backend import (
    ReferenceBackend,
    ReferenceExecutable,
    run_node,
    tensor_names,
)

__all__ = ["ReferenceBackend", "ReferenceExecutable", "run_node", "tensor_names"]
