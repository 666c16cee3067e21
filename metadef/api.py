"""The public face (L8): import, compile, run and export.

Example:
    >>> import numpy as np, metadef as md
    >>> graph = md.import_onnx(md.zoo.build("mlp"))
    >>> sess = md.compile(graph, target="reference")
    >>> x = np.zeros((3, 784), np.float32)
    >>> sess.run({"x": x})["probs"].shape
    (3, 10)
"""

from __future__ import annotations

from typing import Any

from metadef.backends import get_backend
from metadef.core import flags
from metadef.ir import Graph, verify
from metadef.runtime.session import Session


def compile(graph: Graph, target: str = "reference", **options: Any) -> Session:
    """Compile a graph for a target (``"reference"``: the numpy oracle) and return a Session.

    The session runs any value of the graph's symbolic dims (batch size, sequence length)
    without compiling again.

    Example:
        >>> import metadef as md
        >>> md.compile(md.import_onnx(md.zoo.build("mlp"))).target
        'reference'
    """
    if flags.VERIFY.get():
        verify(graph, types=True, stage="compile")
    backend = get_backend(target)
    return Session(graph, backend.compile(graph, **options), target)


__all__ = ["compile"]
