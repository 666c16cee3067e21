"""What a strategy of the x86 mapping table returns: a :class:`Choice` (how one node runs).

Example:
    >>> import numpy as np
    >>> c = Choice(lambda args, types: [np.negative(args[0])], "generated", "a test")
    >>> c.kind, c.strategy, c.native is None
    ('generated', 'reference', True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from metadef.backends.x86.native import Lowering
from metadef.ir import Node
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

__all__ = ["Choice", "StepKernel", "Strategy"]
