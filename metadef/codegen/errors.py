"""The error code generation raises when it cannot lower something.

Example:
    >>> str(CodegenUnsupported("Conv at /conv1: contractions run through BLAS"))
    'Conv at /conv1: contractions run through BLAS'
"""

from __future__ import annotations

from metadef.core.errors import BackendError


class CodegenUnsupported(BackendError):
    """Raised when a node or group cannot be compiled; str(e) is the one-line reason that the
    backend logs."""


__all__ = ["CodegenUnsupported"]
