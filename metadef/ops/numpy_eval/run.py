"""Running one node on numpy arrays: from its semantic expression, or its opaque reference.

This is the one place that turns a meta-op plus arrays into arrays; the reference backend and
constant folding both call it.

Example:
    >>> import numpy as np
    >>> from metadef.ops import get_op
    >>> from metadef.shape import parse_type
    >>> run_node(get_op("Relu"), {}, [np.array([-1.0, 2.0], np.float32)], [parse_type("f32[2]")])
    [array([0., 2.], dtype=float32)]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metadef.core.dtypes import STRING
from metadef.core.errors import BackendError, MetadefError
from metadef.ops.metaop import MetaOp
from metadef.ops.numpy_eval.evaluate import evaluate
from metadef.shape import TensorType


def tensor_names(op: MetaOp, count: int, outputs: bool = False) -> list[str]:
    """The names a node's tensors take in the op's semantics: the parameter names, with
    ``name_0, name_1, ...`` for a variadic parameter."""
    params = op.outputs if outputs else op.inputs
    names: list[str] = []
    for i in range(count):
        if i < len(params) and not params[i].variadic:
            names.append(params[i].name)
        else:
            var = params[-1]
            names.append(f"{var.name}_{i - (len(params) - 1)}")
    return names


def _holds_text(inputs: Sequence[Any], out_dtypes: Sequence[np.dtype]) -> bool:
    """Whether a node reads or writes a string tensor (a numpy object array)."""
    return STRING.numpy in out_dtypes or any(isinstance(a, np.ndarray) and a.dtype == STRING.numpy for a in inputs)


def run_node(op: MetaOp, attrs: Mapping[str, Any], inputs: Sequence[np.ndarray | None],
             out_types: Sequence[TensorType], node: str = "") -> list[np.ndarray]:
    """Run one node on concrete arrays (attrs already resolved with defaults).

    ``out_types`` are the node's output types with concrete shapes (or None dims where they
    depend on values). Used by the interpreter and by constant folding.
    """
    out_dtypes = [t.dtype.numpy for t in out_types]
    shapes = [None if a is None else a.shape for a in inputs]
    values = [a if i in op.reads else None for i, a in enumerate(inputs)]
    if op.semantics.reference is not None and _holds_text(inputs, out_dtypes):
        instance = None  # expressions compute numbers: on string tensors the op's reference runs
    else:
        instance = op.semantics.instantiate(attrs, shapes, values)
    if instance is None:
        try:
            result = op.semantics.reference(list(inputs), attrs)
        except MetadefError as e:  # a reference does not know its node: say which
            raise type(e)(f"{op.name} node {node}: {e}") from e
        outs = list(result) if isinstance(result, (tuple, list)) else [result]
    else:
        program, params = instance
        names = tensor_names(op, len(inputs))
        tensors = {n: a for n, a in zip(names, inputs) if a is not None}
        out_names = tensor_names(op, len(out_types), outputs=True)
        out_shapes = {n: tuple(t.shape) for n, t in zip(out_names, out_types)
                      if t.shape is not None and all(isinstance(d, int) for d in t.shape)}
        got = evaluate(program, tensors, params, out_shapes,
                       {n: d for n, d in zip(out_names, out_dtypes)})
        outs = [got[n] for n in out_names]
    if len(outs) < len(out_types):
        raise BackendError(f"{op.name} node {node}: its reference gave {len(outs)} outputs, "
                           f"{len(out_types)} expected")
    return [np.asarray(o).astype(d, copy=False) for o, d in zip(outs, out_dtypes)]


__all__ = ["run_node", "tensor_names"]
