"""Code generation (L6): fused groups and nodes, from their semantic expressions, to LLVM.

The only home of llvmlite in metadef. A group body is composed into one expression tree per
output (:mod:`.lower`), emitted as one loop nest in LLVM IR (:mod:`.emit`, :mod:`.instr`,
:mod:`.mathlib`), optimized at O3 and JIT-compiled for the host (:mod:`.jit`), and wrapped in
a :class:`Kernel` that checks its arguments (:mod:`.kernel`).

Example:
    >>> host_target().vector_bits in (128, 256, 512)
    True
"""

from metadef.codegen.errors import CodegenUnsupported
from metadef.codegen.host import HostTarget, host_target
from metadef.codegen.kernel import Kernel, compile_group, compile_node
from metadef.codegen.link import compile_count

__all__ = ["CodegenUnsupported", "HostTarget", "Kernel", "compile_count", "compile_group",
           "compile_node", "host_target"]
