"""``MetaOp``: one operator, declared once as data, with its three layers.

- **interface**: parameters, attributes, dtype constraints and a shape rule (type-rule DSL text
  or a Python function over an :class:`~metadef.ops.infer.InferContext`);
- **semantics**: a tensor index expression (text, or a function of the attributes and input
  shapes returning the text for one node) from which the reference evaluator and the code
  generator both derive; or, for ops that are not comprehensions, an explicit numpy
  ``reference`` and ``opaque=True``;
- **strategy**: fusion role, layouts, parallel axes, workspace.

Example (a custom elementwise op is one call)::

    >>> from metadef.ops import metaop, Role, get_op
    >>> Softsign2 = metaop("Softsign2", domain="com.example", inputs=("X",), outputs=("Y",),
    ...                    types="T in {float}", rule=SAME_AS_FIRST,
    ...                    semantics="Y[...] = X[...] / (1 + abs(X[...]))", role=Role.ELEMENTWISE)
    >>> get_op("Softsign2", "com.example") is Softsign2
    True
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from metadef.core.errors import DSLSyntaxError, SemanticsError
from metadef.ops.interface import AttrSpec, Interface, Param, parse_type_constraints
from metadef.ops.semantics import Program, parse_semantics
from metadef.ops.strategy import Role, Strategy, WorkspaceFn
from metadef.ops.typerule import TypeRule, compile_rule
from metadef.shape import Dim

if TYPE_CHECKING:  # typing only: infer imports this module
    from metadef.ops.infer import InferContext

ShapeRule = Callable[["InferContext"], Sequence[Any]]
# A node's semantics: text, or text (and params) from its attributes, input shapes and
# (optionally, as a third argument) the constant values of its ``reads`` inputs; None: no
# expression for this node, run the reference.
SemanticsFn = Callable[..., str | tuple[str, Mapping[str, Any]] | None]
Reference = Callable[[list[np.ndarray | None], Mapping[str, Any]], Any]
# Old-opset forms: (opset, attrs, number of inputs[, number of outputs]) ->
# (new attrs, {input index: constant}); the fourth argument is passed when the adapter takes it.
Adapter = Callable[..., tuple[dict[str, Any], dict[int, np.ndarray]]]

SAME_AS_FIRST = "same_as_first"   # a shape rule: one output like input 0 (dtype from its type var)
BROADCAST_ALL = "broadcast_all"   # a shape rule: numpy broadcasting of every input


@dataclass(frozen=True)
class Semantics:
    """What an op computes: an index expression, or an opaque numpy reference."""

    expression: str | SemanticsFn | None = None
    reference: Reference | None = None

    @property
    def opaque(self) -> bool:
        return self.expression is None

    def instantiate(self, attrs: Mapping[str, Any], shapes: Sequence[Sequence[Dim] | None],
                    values: Sequence[np.ndarray | None] = ()) -> tuple[Program, dict[str, Any]] | None:
        """The parsed program and its params for one node, or None when this node has no
        expression (the function said so, e.g. reduction axes known only at run time): the
        op's numpy ``reference`` then runs it.

        A plain-text expression takes the node's scalar attributes as params. ``values`` are
        the constant values of the op's ``reads`` inputs (None where unknown).
        """
        if self.expression is None:
            return None
        params = {k: v for k, v in attrs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if isinstance(self.expression, str):
            return parse_semantics(self.expression), params
        result = self.expression(attrs, shapes, values) if _takes_values(self.expression) \
            else self.expression(attrs, shapes)
        if result is None:
            if self.reference is None:
                raise SemanticsError("a semantics function returned None but the op has no reference")
            return None
        if isinstance(result, tuple):
            text, extra = result
            params.update(extra)
        else:
            text = result
        return parse_semantics(text), params


@functools.cache
def _takes_values(fn: Callable[..., Any]) -> bool:
    """Whether a semantics function accepts the third argument (the ``reads`` input values)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3 or any(p.kind is p.VAR_POSITIONAL for p in params)


@dataclass(frozen=True, eq=False)
class MetaOp:
    """An operator declared once: interface, semantics and strategy (see the module doc)."""

    name: str
    domain: str
    interface: Interface
    rule: TypeRule | ShapeRule | str
    semantics: Semantics
    strategy: Strategy
    reads: tuple[int, ...] = ()
    since: tuple[int, ...] = (1,)
    adapt: Adapter | None = None
    doc: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    pure: bool = True
    """False for an op whose outputs are not a function of its inputs and attributes (a random
    draw without a seed): constant folding and common-subexpression elimination leave it be."""

    @property
    def qualname(self) -> str:
        return f"{self.domain}::{self.name}" if self.domain else self.name

    @property
    def inputs(self) -> tuple[Param, ...]:
        return self.interface.inputs

    @property
    def outputs(self) -> tuple[Param, ...]:
        return self.interface.outputs

    @property
    def attrs(self) -> Mapping[str, AttrSpec]:
        return self.interface.attrs

    @property
    def role(self) -> Role:
        return self.strategy.role

    def __repr__(self) -> str:
        return f"MetaOp({self.qualname})"


def metaop(
    name: str,
    *,
    inputs: Sequence[str | Param],
    outputs: Sequence[str | Param],
    attrs: Mapping[str, AttrSpec] | None = None,
    types: str = "T in {all}",
    rule: str | ShapeRule,
    semantics: str | SemanticsFn | None = None,
    reference: Reference | None = None,
    role: Role = Role.OPAQUE,
    layouts: tuple[str, ...] = (),
    parallel: tuple[str, ...] = (),
    workspace: WorkspaceFn | None = None,
    reads: tuple[int, ...] = (),
    passed: tuple[int, ...] = (),
    since: tuple[int, ...] = (1,),
    adapt: Adapter | None = None,
    domain: str = "",
    doc: str = "",
    register: bool = True,
    pure: bool = True,
) -> MetaOp:
    """Declare (and by default register) a meta-op.

    ``rule`` is type-rule DSL text (``rule name: ... where ...``), :data:`SAME_AS_FIRST`,
    :data:`BROADCAST_ALL`, or a Python function of an InferContext returning one entry per
    output: a shape tuple (the dtype then comes from the output's type variable) or a
    TensorType. ``semantics`` or ``reference`` must be given; an op with only a reference is
    opaque. ``reads`` lists the inputs whose *values* shape inference uses when constant;
    ``passed`` those whose one-element constants generated code reads at run time
    (:attr:`Strategy.passed`).
    """
    if semantics is None and reference is None:
        raise DSLSyntaxError(f"meta-op {name}: give its semantics (an index expression) or, "
                             "for an op that is not a comprehension, a numpy reference")
    interface = Interface(
        inputs=tuple(Param.parse(p) for p in inputs),
        outputs=tuple(Param.parse(p) for p in outputs),
        attrs=dict(attrs or {}),
        types=parse_type_constraints(types),
    )
    compiled: TypeRule | ShapeRule | str
    if isinstance(rule, str) and rule not in (SAME_AS_FIRST, BROADCAST_ALL):
        compiled = compile_rule(rule)
    else:
        compiled = rule
    if isinstance(semantics, str):
        parse_semantics(semantics)  # fail at declaration, not at first use
    op = MetaOp(
        name=name, domain=domain, interface=interface, rule=compiled,
        semantics=Semantics(semantics, reference),
        strategy=Strategy(role=role, layouts=layouts, parallel=parallel, workspace=workspace, passed=passed),
        reads=reads, since=since, adapt=adapt, doc=doc, pure=pure,
    )
    if register:
        REGISTRY.register(op)
    return op


class Registry:
    """Every meta-op by (domain, name). ``""`` and ``"ai.onnx"`` are the same domain."""

    def __init__(self) -> None:
        self._ops: dict[tuple[str, str], MetaOp] = {}

    @staticmethod
    def _key(name: str, domain: str) -> tuple[str, str]:
        return ("" if domain in ("", "ai.onnx") else domain, name)

    def register(self, op: MetaOp, *, replace: bool = False) -> MetaOp:
        key = self._key(op.name, op.domain)
        if key in self._ops and not replace:
            raise DSLSyntaxError(f"meta-op {op.qualname} is already registered; "
                                 "pass replace=True to override it")
        self._ops[key] = op
        return op

    def get(self, name: str, domain: str = "") -> MetaOp | None:
        return self._ops.get(self._key(name, domain))

    def __contains__(self, key: tuple[str, str]) -> bool:
        return self._key(key[1], key[0]) in self._ops

    def __iter__(self):
        return iter(sorted(self._ops.values(), key=lambda o: (o.domain, o.name)))

    def __len__(self) -> int:
        return len(self._ops)


REGISTRY = Registry()

__all__ = ["BROADCAST_ALL", "MetaOp", "REGISTRY", "Registry", "SAME_AS_FIRST", "Semantics",
           "metaop"]
