"""Deciding relations between dims, broadcasting, and constraints on symbols.

Every question about symbolic dims has three answers: yes, no, or *cannot decide*
(``Decision.UNKNOWN``). Callers choose what to do with the third: shape inference keeps a
run-time check, the optimizer refuses a rewrite.

Example:
    >>> b = sym("batch")
    >>> equal(b + 1, b + 1), equal(b + 1, b), equal(b, sym("seq"))
    (<Decision.TRUE: 1>, <Decision.FALSE: 0>, <Decision.UNKNOWN: 2>)
    >>> broadcast_dim(b, 1)
    (Expr(batch), <Decision.TRUE: 1>)
"""

from __future__ import annotations

import enum
import functools
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from metadef.core.errors import ShapeError
from metadef.shape.expr import Dim, Expr, evaluate, free_symbols, max_, sub, sym


class Decision(enum.Enum):
    """The outcome of a symbolic question."""

    FALSE = 0
    TRUE = 1
    UNKNOWN = 2

    def __bool__(self) -> bool:
        return self is Decision.TRUE

    @staticmethod
    def of(value: bool) -> Decision:
        return Decision.TRUE if value else Decision.FALSE


@dataclass(frozen=True)
class SymbolInfo:
    """What is known about one symbol: its range (inclusive) and a divisor it is a multiple of."""

    name: str
    lo: int = 0
    hi: int | None = None
    multiple_of: int = 1

    def check(self, value: int) -> str | None:
        """None if ``value`` satisfies the constraints, else why not."""
        if value < self.lo:
            return f"{self.name}={value} is below its minimum {self.lo}"
        if self.hi is not None and value > self.hi:
            return f"{self.name}={value} is above its maximum {self.hi}"
        if value % self.multiple_of:
            return f"{self.name}={value} is not a multiple of {self.multiple_of}"
        return None


@dataclass
class ShapeEnv:
    """The symbols of one graph with their constraints, and a source of fresh symbols.

    Example:
        >>> env = ShapeEnv()
        >>> env.constrain("batch", lo=1, hi=64)
        >>> env.check({"batch": 128})
        ['batch=128 is above its maximum 64']
    """

    symbols: dict[str, SymbolInfo] = field(default_factory=dict)
    _counter: itertools.count = field(default_factory=itertools.count, repr=False)

    def declare(self, name: str) -> Expr:
        """The symbol ``name``, registered with default constraints if new."""
        self.symbols.setdefault(name, SymbolInfo(name))
        return sym(name)

    def fresh(self, hint: str = "unk") -> Expr:
        """A new symbol no other dim uses (for data-dependent output sizes)."""
        while True:
            name = f"{hint}_{next(self._counter)}"
            if name not in self.symbols:
                return self.declare(name)

    def constrain(self, name: str, *, lo: int | None = None, hi: int | None = None,
                  multiple_of: int | None = None) -> None:
        """Narrow what is known about ``name``."""
        old = self.symbols.get(name, SymbolInfo(name))
        self.symbols[name] = SymbolInfo(
            name,
            lo=max(old.lo, lo) if lo is not None else old.lo,
            hi=(min(old.hi, hi) if old.hi is not None else hi) if hi is not None else old.hi,
            multiple_of=multiple_of * old.multiple_of if multiple_of else old.multiple_of,
        )

    def check(self, values: Mapping[str, int]) -> list[str]:
        """Every violated constraint for concrete symbol values."""
        problems = []
        for name, value in values.items():
            info = self.symbols.get(name)
            if info is not None and (why := info.check(value)) is not None:
                problems.append(why)
        return problems

    def lower_bound(self, d: Dim) -> int | None:
        """A lower bound of ``d`` when every term is a symbol product with a positive coefficient."""
        if isinstance(d, int):
            return d
        total = 0
        for mono, coef in d.terms:
            if not mono:
                total += coef
                continue
            if coef < 0:
                return None
            value = coef
            for atom, power in mono:
                if atom.key[0] != "sym":
                    return None
                value *= self.symbols.get(atom.key[1], SymbolInfo(atom.key[1])).lo ** power
            total += value
        return total


def equal(a: Dim, b: Dim, env: ShapeEnv | None = None) -> Decision:
    """Are two dims equal for every value of their symbols?"""
    if a is b or a == b:
        return Decision.TRUE
    diff = sub(a, b)
    if isinstance(diff, int):
        return Decision.of(diff == 0)
    if env is not None:
        lb = env.lower_bound(diff)
        if lb is not None and lb > 0:
            return Decision.FALSE
        lb = env.lower_bound(sub(b, a))
        if lb is not None and lb > 0:
            return Decision.FALSE
    return Decision.UNKNOWN


def broadcast_dim(a: Dim, b: Dim) -> tuple[Dim, Decision]:
    """Numpy broadcasting of two dims: the result and whether the pair is known to be valid.

    When undecided (two different symbols, or a symbol against a constant other than 1), the
    result is the one every valid case gives, ``max(a, b)`` (the constant when one is a
    constant), and the caller keeps a run-time check.
    """
    if a == 1:
        return b, Decision.TRUE
    if b == 1:
        return a, Decision.TRUE
    same = equal(a, b)
    if same is Decision.TRUE:
        return a, Decision.TRUE
    if isinstance(a, int) and isinstance(b, int):
        return a, Decision.FALSE
    if isinstance(a, int) and a != 0:
        return a, Decision.UNKNOWN
    if isinstance(b, int) and b != 0:
        return b, Decision.UNKNOWN
    return max_(a, b), Decision.UNKNOWN


def broadcast_shapes(*shapes: Sequence[Dim]) -> tuple[tuple[Dim, ...], list[tuple[int, Dim, Dim]]]:
    """Broadcast several shapes numpy-style.

    Returns the result and the undecided pairs ``(axis, a, b)`` that need a run-time check.
    Raises ShapeError when two static dims cannot broadcast.

    Example:
        >>> broadcast_shapes((sym("b"), 1, 4), (3, 1))
        ((Expr(b), 3, 4), [])
    """
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    undecided: list[tuple[int, Dim, Dim]] = []
    for axis in range(rank):
        dim: Dim = 1
        for s in shapes:
            k = axis - (rank - len(s))
            if k < 0:
                continue
            new, ok = broadcast_dim(dim, s[k])
            if ok is Decision.FALSE:
                raise ShapeError(
                    f"shapes {format_shape(shapes[0])} and others cannot broadcast: "
                    f"axis {axis} has {dim} and {s[k]} (neither is 1)")
            if ok is Decision.UNKNOWN:
                undecided.append((axis, dim, s[k]))
            dim = new
        out.append(dim)
    return tuple(out), undecided


def format_shape(shape: Sequence[Dim] | None) -> str:
    """``[batch,3,224,224]``; ``?`` for an unknown rank."""
    if shape is None:
        return "[?]"
    if isinstance(shape, tuple):
        return _format_tuple(shape)
    return "[" + ",".join(str(d) for d in shape) + "]"


@functools.lru_cache(maxsize=4096)
def _format_tuple(shape: tuple[Dim, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def evaluate_shape(shape: Sequence[Dim], env: Mapping[str, int]) -> tuple[int, ...]:
    """Concrete dims for concrete symbol values."""
    return tuple(evaluate(d, env) for d in shape)


def bind_shape(shape: Sequence[Dim], actual: Sequence[int], bindings: dict[str, int]) -> str | None:
    """Match a concrete shape against a symbolic one, extending ``bindings``.

    Returns None on success, else a sentence naming the first axis that disagrees. A dim
    that is a single symbol binds it; any other expression is checked after binding.
    """
    if len(shape) != len(actual):
        return f"rank {len(actual)} but {len(shape)} expected"
    later: list[tuple[int, Expr]] = []
    for axis, (want, got) in enumerate(zip(shape, actual)):
        if isinstance(want, int):
            if want != got:
                return f"dim {axis} is {got} but {want} expected"
            continue
        atom = want.as_atom()
        if atom is not None and atom.key[0] == "sym":
            name = atom.key[1]
            if name in bindings and bindings[name] != got:
                return (f"dim {axis} is {got} but symbol {name} is already {bindings[name]} "
                        "from another input")
            bindings[name] = got
        else:
            later.append((axis, want))
    for axis, want in later:
        if not free_symbols(want) <= bindings.keys():
            continue
        value = want.evaluate(bindings)
        if value != actual[axis]:
            return f"dim {axis} is {actual[axis]} but {want} = {value} expected"
    return None


__all__ = [
    "Decision", "ShapeEnv", "SymbolInfo", "bind_shape", "broadcast_dim", "broadcast_shapes",
    "equal", "evaluate_shape", "format_shape",
]
