"""The strategy layer of a meta-op: hints the compiler reads, never a backend's code.

Backends attach their own strategies (their mapping tables) from their side; ``ops`` never
imports a backend.

Example:
    >>> Strategy(role=Role.CONTRACTION, parallel=("n", "k")).role.fusable
    True
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from metadef.shape import Dim


class Role(enum.Enum):
    """How an op takes part in fusion (TVM's pattern kinds, in order of increasing freedom lost)."""

    ELEMENTWISE = "elementwise"   # out[i] = f(in[i]) for same-shaped operands
    BROADCAST = "broadcast"       # elementwise with numpy broadcasting
    INJECTIVE = "injective"       # each output element reads one input element (reshape, gather)
    REDUCTION = "reduction"       # sums, maxima, norms over axes
    CONTRACTION = "contraction"   # matmul, conv: a sum over products; anchors a fused group
    OPAQUE = "opaque"             # runs alone (topk, control flow, data-dependent shapes)

    @property
    def fusable(self) -> bool:
        return self is not Role.OPAQUE


# Given the attributes and the input shapes, how many bytes of scratch memory a kernel needs.
WorkspaceFn = Callable[[Mapping[str, Any], Sequence[Sequence[Dim] | None]], Dim]


@dataclass(frozen=True)
class Strategy:
    """Compiler hints: fusion role, preferred layouts, parallel axes and workspace size."""

    role: Role = Role.OPAQUE
    layouts: tuple[str, ...] = ()
    parallel: tuple[str, ...] = ()
    workspace: WorkspaceFn | None = None
    commutative: bool = False
    passed: tuple[int, ...] = ()
    """Inputs whose one-element constants generated code reads at run time rather than compiles
    in: values that differ from node to node and fold into nothing (a quantized layer's scales
    and zero points), so that same-shaped nodes share one kernel."""


__all__ = ["Role", "Strategy", "WorkspaceFn"]
