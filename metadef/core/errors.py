"""The typed errors of metadef.

Every error a user can meet is a :class:`MetadefError`. Each subclass names one kind of
failure, and each message says what went wrong, where (node, op, input, file, pass), what
was expected and what to do about it.

Example:
    >>> try:
    ...     raise ShapeError("MatMul /enc/MatMul_7 expects K to agree: got 768 and 512")
    ... except MetadefError as e:
    ...     print(type(e).__name__)
    ShapeError
"""

from __future__ import annotations


class MetadefError(Exception):
    """Base class of every error metadef raises on purpose."""


class DTypeError(MetadefError, TypeError):
    """A dtype is unknown, unsupported (e.g. strings) or does not satisfy a constraint."""


class ShapeError(MetadefError, ValueError):
    """A shape rule failed: the message names the node, the shapes and the constraint."""


class UnsupportedOpError(MetadefError):
    """No meta-operator covers an op (name, domain) at the requested opset."""


class AttributeError_(MetadefError, ValueError):
    """An attribute is unknown, missing or of the wrong kind for an op."""


class GraphError(MetadefError):
    """The graph is malformed: the verifier's findings, or a bad edit through the builder."""


class InputError(MetadefError, ValueError):
    """The inputs handed to ``Session.run`` do not match what the graph expects."""


class SpecializationError(InputError):
    """The structure of a sequence or optional input (its length, whether it is present), or
    the value of an input that decides the structure, is not known when it must be (import),
    or a run's feeds differ from what the graph was specialized for; the message names the
    input and the keyword that specializes it, and ``inputs`` holds the inputs' names.

    Example:
        >>> SpecializationError("graph input 'k' decides a split", inputs=("k",)).inputs
        ('k',)
    """

    def __init__(self, message: str, *, inputs: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.inputs = tuple(inputs)


class FormatError(MetadefError):
    """A model file (ONNX or .mdef) is corrupt, truncated or of an unknown version."""


class DSLSyntaxError(MetadefError, SyntaxError):
    """A type-rule or semantic expression does not parse; the message points at the spot."""


class SemanticsError(MetadefError):
    """A semantic index expression cannot be evaluated or lowered as written."""


class BackendError(MetadefError):
    """A backend cannot run a graph (unknown target, missing mapping, failed compile)."""


__all__ = [
    "AttributeError_",
    "BackendError",
    "DSLSyntaxError",
    "DTypeError",
    "FormatError",
    "GraphError",
    "InputError",
    "MetadefError",
    "SemanticsError",
    "ShapeError",
    "SpecializationError",
    "UnsupportedOpError",
]
