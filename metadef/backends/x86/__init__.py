"""The x86 backend: generated LLVM kernels for fused groups, BLAS for contractions.

Example:
    >>> X86Backend().name
    'x86'
"""

from metadef.backends.x86.backend import PlanEntry, X86Backend, X86Executable
from metadef.backends.x86.mapping import choose, contraction_kernels, op_strategies, role_strategies

__all__ = ["PlanEntry", "X86Backend", "X86Executable", "choose", "contraction_kernels", "op_strategies",
           "role_strategies"]
