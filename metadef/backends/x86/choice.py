"""What a strategy of the x86 mapping table returns: a :class:`Choice` (how one node runs),
and the two helpers every strategy module uses: :func:`attrs_of` and :func:`reference`.

Example:
    >>> import numpy as np
    >>> c = Choice(lambda args, types: [np.negative(args[0])], "generated", "a test")
    >>> c.kind, c.strategy, c.native is None
    ('generated', 'reference', True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from metadef.backends.x86.native import Lowering
from metadef.ir import Node
from metadef.ops.interface import resolve_attrs
from metadef.ops.numpy_eval import run_node
from metadef.shape import TensorType

StepKernel = Callable[[Sequence[np.ndarray | None], Sequence[TensorType]], list[np.ndarray]]
"""A step's kernel: the node's input arrays and concrete output types -> its output arrays."""


@dataclass(frozen=True)
class Choice:
    """How one node runs: its kernel, the kind of kernel, and why it was chosen."""

    kernel: StepKernel
    kind: str
    reason: str
    fallback: bool = False
    strategy: str = "reference"
    """The name of the strategy that made the choice (see ``mapping.strategy_named``)."""
    native: Lowering | None = None
    """How the step runs inside a native program (:mod:`metadef.backends.x86.native`), or
    None: it runs from Python."""


Strategy = Callable[[Node], "Choice | str"]
"""A node -> its Choice, or why the strategy does not take it."""


def attrs_of(node: Node) -> dict[str, Any]:
    """The node's attributes with the meta-op's defaults filled in."""
    op = node.metaop
    return resolve_attrs(op.name, f"(node {node.name})", op.attrs, node.attrs)


def reference(node: Node, reason: str) -> Choice:
    """The node's reference kernel (the numpy oracle), with the reason it was chosen."""
    op, attrs = node.metaop, attrs_of(node)

    def run(args: Sequence[np.ndarray | None], out_types: Sequence[TensorType]) -> list[np.ndarray]:
        return run_node(op, attrs, args, out_types, node.name)

    return Choice(run, "reference", reason, fallback=True)


__all__ = ["Choice", "StepKernel", "Strategy", "attrs_of", "reference"]
