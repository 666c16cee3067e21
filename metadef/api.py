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

import os
from pathlib import Path
from typing import Any

from metadef.backends import get_backend
from metadef.core import flags
from metadef.core.errors import MetadefError
from metadef.format import open_mdef, save_graph
from metadef.ir import Graph, verify
from metadef.passes import optimize
from metadef.runtime.model import Model
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


def save(graph: Graph, path: str | os.PathLike, *, metadata: dict[str, Any] | None = None,
         quantize: str | None = None) -> Path:
    """Write a graph as one .mdef file (atomically: a temporary file, then a rename).

    ``metadata``: the hardware / parameters / auxiliary layers and custom ``namespaces``
    (see docs/format.md). Quantized weight formats (``quantize="float16" | "int8" | "int4"``)
    are not written yet: asking for one is an error rather than a silent float32 file.

    Example:
        >>> import tempfile, pathlib, metadef as md
        >>> md.save(md.import_onnx(md.zoo.build("mlp")), pathlib.Path(tempfile.mkdtemp()) / "m.mdef").suffix
        '.mdef'
    """
    if quantize is not None:
        raise MetadefError(f"quantize={quantize!r}: quantized weight formats are not implemented yet "
                           "(issue 6); save without quantize to get a float32 file")
    return save_graph(graph, path, metadata=metadata)


def load(path: str | os.PathLike, *, checksum_verify: str = "on_demand", version_strict: bool = True,
         mmap_enabled: bool = True) -> Model:
    """Open a .mdef file: header, metadata and graph read at once, weights mapped and read on
    first use (zero-copy), checksums verified as asked (``always`` | ``on_demand`` | ``never``).

    Example:
        >>> import tempfile, pathlib, metadef as md
        >>> p = md.save(md.import_onnx(md.zoo.build("mlp")), pathlib.Path(tempfile.mkdtemp()) / "m.mdef")
        >>> md.load(p).graph.outputs[0].name
        'probs'
    """
    return Model(open_mdef(path, checksum_verify=checksum_verify, version_strict=version_strict,
                           mmap_enabled=mmap_enabled), compile)


__all__ = ["compile", "load", "optimize", "save"]
