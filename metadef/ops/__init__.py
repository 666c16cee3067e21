"""Meta-operators (L2): the registry, the three layers, the type-rule DSL and the op defs.

Example:
    >>> from metadef.ops import get_op
    >>> get_op("Conv").role
    <Role.CONTRACTION: 'contraction'>
"""

from metadef.core.errors import UnsupportedOpError
from metadef.ops.infer import InferContext, infer_types
from metadef.ops.interface import (
    REQUIRED,
    AttrSpec,
    Param,
    float_,
    floats,
    graph_,
    int_,
    ints,
    string,
    strings,
    tensor_,
)
from metadef.ops.metaop import (
    BROADCAST_ALL,
    REGISTRY,
    SAME_AS_FIRST,
    MetaOp,
    Semantics,
    metaop,
)
from metadef.ops.semantics import Program, parse_semantics
from metadef.ops.strategy import Role, Strategy
from metadef.ops.typerule import TypeRule, compile_rule

REGISTER_HINT = ("declare it with metadef.ops.metaop(NAME, domain=DOMAIN, inputs=..., outputs=..., "
                 "rule=..., semantics=...) before importing the model (see docs/custom_ops.md)")


def get_op(name: str, domain: str = "") -> MetaOp:
    """The meta-op registered as (domain, name); UnsupportedOpError names both and how to add one.

    Example:
        >>> get_op("Relu").name
        'Relu'
    """
    op = REGISTRY.get(name, domain)
    if op is None:
        where = f"domain {domain!r}" if domain not in ("", "ai.onnx") else "the default ONNX domain"
        raise UnsupportedOpError(f"no meta-op covers op {name!r} of {where}; {REGISTER_HINT}")
    return op


def all_ops() -> list[MetaOp]:
    """Every registered meta-op, sorted by domain and name."""
    return list(REGISTRY)


from metadef.ops import defs  # noqa: E402,F401  (registers the standard ops; needs the names above)

__all__ = [
    "BROADCAST_ALL", "REGISTRY", "REQUIRED", "SAME_AS_FIRST", "AttrSpec", "InferContext",
    "MetaOp", "Param", "Program", "Role", "Semantics", "Strategy", "TypeRule", "all_ops",
    "compile_rule", "float_", "floats", "get_op", "graph_", "infer_types", "int_", "ints",
    "metaop", "parse_semantics", "string", "strings", "tensor_",
]
