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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from metadef.backends import get_backend
from metadef.core import flags
from metadef.format import open_mdef, save_graph
from metadef.format.custom_metadata import encode_metadata
from metadef.format.loader import DynamicLoader
from metadef.format.precision import PrecisionPlan, load_precision
from metadef.format.quantize import encode_weights
from metadef.ir import Graph, verify
from metadef.passes import optimize
from metadef.runtime import precompiled
from metadef.runtime.loader_config import LoaderConfig, as_loader_config
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
         quantize: str | None = None, prune: float | None = None,
         precision: str | os.PathLike | dict[str, str] | PrecisionPlan | None = None,
         precompile: Sequence[str] = (), **options: Any) -> Path:
    """Write a graph as one .mdef file (atomically: a temporary file, then a rename).

    ``metadata``: the hardware / parameters / auxiliary layers and custom ``namespaces``
    (dicts, or instances of registered ``metadef.BaseMetadata`` classes; see docs/format.md).
    ``quantize``: ``"float16" | "bfloat16" | "int8" | "int4"`` for the weights of
    contractions (dequantized at load); ``prune``: zero weights with ``|w| < prune`` and store
    them compactly; ``precision``: per-layer precision (a YAML path or text, or a dict such as
    ``{"default": "fp16", "conv1": "fp32"}``). ``precompile``: targets (``["x86"]``) to compile
    the saved model for, in a fresh process, storing the compiled code in the file: a
    ``load`` on this machine (or one that trusts the code's hash) then compiles without LLVM
    (see ``metadef.runtime.precompiled``). ``options`` go to ``save_graph`` (``alignment``,
    ``version``, ``code``).

    Example:
        >>> import tempfile, pathlib, metadef as md
        >>> md.save(md.import_onnx(md.zoo.build("mlp")), pathlib.Path(tempfile.mkdtemp()) / "m.mdef").suffix
        '.mdef'
        >>> p = md.save(md.import_onnx(md.zoo.build("mlp")), pathlib.Path(tempfile.mkdtemp()) / "q.mdef",
        ...             quantize="int8")
        >>> md.load(p).file.tensor_info("fc1.weight").quantization["scheme"]
        'int8'
    """
    plan = load_precision(precision, graph)
    encodings = encode_weights(graph, quantize=quantize, prune=prune, plan=plan) \
        if quantize or prune or plan else None
    meta = encode_metadata(metadata)
    if not precompile:
        return save_graph(graph, path, metadata=meta, encodings=encodings, **options)
    code = dict(options.pop("code", None) or {})
    if clash := sorted(set(precompile) & set(code)):
        raise ValueError(f"save: code= already holds a section for {clash}; precompile= would replace it")
    path = Path(path)
    draft = path.with_name(f".{path.name}.precompile.mdef")  # what the fresh process compiles
    try:
        save_graph(graph, draft, metadata=meta, encodings=encodings, code=code, **options)
        code.update(precompiled.precompile(draft, list(precompile)))
    finally:
        draft.unlink(missing_ok=True)
    return save_graph(graph, path, metadata=meta, encodings=encodings, code=code, **options)


def load(path: str | os.PathLike, *, config: LoaderConfig | dict[str, Any] | str | os.PathLike | None = None,
         checksum_verify: str | None = None, version_strict: bool | None = None,
         mmap_enabled: bool | None = None, trust: Sequence[str] = ()) -> Model:
    """Open a .mdef file: header, metadata and graph read at once, weights mapped and read on
    first use (zero-copy; quantized weights are dequantized then), checksums verified as asked
    (``always`` | ``on_demand`` | ``never``).

    ``config``: a ``LoaderConfig``, a dict or a YAML path (``execution``, ``memory``,
    ``safety`` sections; see ``metadef.runtime.loader_config``); the keyword arguments, when
    given, override it. Unless ``memory.prefetch_buffer`` is 0, a
    :class:`~metadef.format.loader.DynamicLoader` reads the weights ahead of their first use,
    in the order the graph needs them, on ``execution.max_threads`` background threads.

    Precompiled code in the file (``save(precompile=...)``) seeds the compile cache when it
    matches this machine's CPU and compiler and is trusted: built on this machine, or its hash
    (``MdefFile.code_hash``) listed in ``trust`` or ``safety.trusted_code_hashes``; else it is
    ignored (``METADEF_DEBUG=1`` says why) and the model compiles as usual.

    Example:
        >>> import tempfile, pathlib, metadef as md
        >>> p = md.save(md.import_onnx(md.zoo.build("mlp")), pathlib.Path(tempfile.mkdtemp()) / "m.mdef")
        >>> md.load(p).graph.outputs[0].name
        'probs'
    """
    cfg = as_loader_config(config)
    options = cfg.open_options()
    given = {"checksum_verify": checksum_verify, "version_strict": version_strict, "mmap_enabled": mmap_enabled}
    options.update({k: v for k, v in given.items() if v is not None})
    file = open_mdef(path, **options)
    if cfg.prefetch_buffer:  # reads ahead from the first use of a weight on; opening reads nothing
        DynamicLoader(file, **cfg.loader_options())
    if file.code_targets():
        precompiled.seed_compile_cache(file, trusted=(*cfg.trusted_code_hashes, *trust))
    return Model(file, compile)


__all__ = ["compile", "load", "optimize", "save"]
