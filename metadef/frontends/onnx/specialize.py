"""Specializing an ONNX model on the structure of its feeds, and compiling it per structure.

:func:`import_for` imports a model for a given set of feeds: the lengths of the lists fed to
sequence inputs, which optionals are None, and, when the importer asks (a
:class:`~metadef.core.errors.SpecializationError` naming the inputs), the values of the tensor
inputs that decide a structure. :func:`compile_onnx` makes a
:class:`~metadef.runtime.specializing.SpecializingSession` that does this on each new
structure it is run with, as torch.compile does with Python lists.

Example:
    >>> import numpy as np
    >>> from onnx import helper, TensorProto as T
    >>> g = helper.make_graph(
    ...     [helper.make_node("SplitToSequence", ["x", "k"], ["parts"], axis=0)], "g",
    ...     [helper.make_tensor_value_info("x", T.FLOAT, [6]), helper.make_tensor_value_info("k", T.INT64, [])],
    ...     [helper.make_tensor_sequence_value_info("parts", T.FLOAT, None)])
    >>> model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)])
    >>> feeds = {"x": np.arange(6, dtype=np.float32), "k": np.array(4)}
    >>> graph = import_for(model, feeds)              # specialized on k = 4: two pieces
    >>> graph.metadata["io_structure"]["values"]
    [['k', 4]]
    >>> compile_onnx(model).run(feeds)["parts"]
    [array([0., 1., 2., 3.], dtype=float32), array([4., 5.], dtype=float32)]
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from metadef.backends import get_backend
from metadef.core import flags
from metadef.core.errors import SpecializationError
from metadef.frontends.onnx.importer import import_graph, load_model
from metadef.frontends.onnx.io_structure import structure_hints
from metadef.ir import Graph, verify
from metadef.passes import optimize
from metadef.runtime.session import Session
from metadef.runtime.specializing import SpecializingSession


def import_for(model: onnx.ModelProto, feeds: Mapping[str, Any], **options: Any) -> Graph:
    """``model`` imported and specialized for ``feeds`` (lists for sequence inputs, None for
    absent optionals): their lengths and presence, and the values of the inputs the importer
    asks for; ``options`` go to ``import_graph`` (``name``).

    Example:
        >>> from onnx import helper, TensorProto as T
        >>> g = helper.make_graph([helper.make_node("Identity", ["s"], ["t"])], "g",
        ...     [helper.make_tensor_sequence_value_info("s", T.FLOAT, [2])],
        ...     [helper.make_tensor_sequence_value_info("t", T.FLOAT, None)])
        >>> m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)])
        >>> [v.name for v in import_for(m, {"s": [np.ones(2), np.ones(2), np.ones(2)]}).inputs]
        ['s.0', 's.1', 's.2']
    """
    initializers = {t.name for t in model.graph.initializer}
    inputs = [vi for vi in model.graph.input if vi.name not in initializers]
    lengths, present = structure_hints(inputs, feeds)
    values: dict[str, np.ndarray] = {}
    while True:
        try:
            return import_graph(model, sequence_lengths=lengths, optional_present=present,
                                input_values=values, **options)
        except SpecializationError as e:
            wanted = [n for n in e.inputs if n in feeds and n not in values
                      and feeds[n] is not None and not isinstance(feeds[n], (list, tuple))]
            if not wanted:
                raise
            values.update({n: np.asarray(feeds[n]) for n in wanted})


def compile_onnx(source: str | os.PathLike | bytes | onnx.ModelProto, target: str = "reference", *,
                 level: str | None = None, **options: Any) -> SpecializingSession:
    """Compile an ONNX model for ``target``, specializing it on the structure of each run's
    feeds (a list for a sequence input, None for an absent optional): each structure met is
    imported, optimized at ``level`` (None: not optimized), compiled and kept, so a run with
    a structure seen before compiles nothing. ``options`` go to the backend's compile.

    Example:
        >>> import numpy as np
        >>> from onnx import helper, TensorProto as T
        >>> g = helper.make_graph([helper.make_node("Identity", ["s"], ["t"])], "g",
        ...     [helper.make_tensor_sequence_value_info("s", T.FLOAT, None)],
        ...     [helper.make_tensor_sequence_value_info("t", T.FLOAT, None)])
        >>> sess = compile_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)]))
        >>> sess.run({"s": [np.ones(1, np.float32)]})["t"], sess.run({"s": []})["t"]
        ([array([1.], dtype=float32)], [])
    """
    model = load_model(source)
    backend = get_backend(target)

    def specialize(feeds: Mapping[str, Any]) -> Session:
        graph = import_for(model, feeds)
        if level is not None:
            graph = optimize(graph, level=level)
        if flags.VERIFY.get():
            verify(graph, types=True, stage="compile")
        return Session(graph, backend.compile(graph, **options), target)

    return SpecializingSession(specialize, target)


__all__ = ["compile_onnx", "import_for"]
