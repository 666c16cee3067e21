"""Symbolic dimensions: a small hash-consed expression type.

A dimension is a plain ``int`` when known, or an :class:`Expr` when it depends on named
symbols (ONNX ``dim_param`` such as ``batch``). Every ``Expr`` is kept in one canonical form,
a polynomial with integer coefficients over *atoms*; an atom is a symbol or an opaque
function node (floor/ceil division, mod, min, max) whose arguments are canonical too.
Canonical forms are interned, so structural equality is identity and hashing is O(1).

Why not sympy: inferring BERT-base's shapes makes ~20k dimension operations; sympy spends
~40 µs on each and ~0.4 s importing, while this type spends ~1-3 µs (see docs/design/shapes.md
for the measurement). We need only integer arithmetic on non-negative dims, not a CAS.

Example:
    >>> b = sym("batch")
    >>> str(b * 64 + b * 2)
    'batch*66'
    >>> floordiv(b * 4 + 2, 2)
    Expr(batch*2 + 1)
    >>> str(floordiv(b + 1, 2))
    'floor((batch + 1)/2)'
    >>> (b * 3).evaluate({"batch": 5})
    15
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping

from metadef.core.errors import ShapeError

# A monomial is a sorted tuple of (atom, power); the constant monomial is ().
Monomial = tuple
Terms = tuple  # sorted tuple of (Monomial, coefficient)

_intern: dict[tuple, Expr] = {}
_atoms: dict[tuple, Atom] = {}
_lock = threading.Lock()


class Expr:
    """A canonical symbolic integer expression (interned: compare with ``is`` or ``==``)."""

    __slots__ = ("__weakref__", "_hash", "_key", "terms")

    terms: Terms

    def __new__(cls, terms: Terms) -> Expr:
        key = (cls, terms)
        found = _intern.get(key)
        if found is not None:
            return found
        with _lock:
            found = _intern.get(key)
            if found is None:
                found = object.__new__(cls)
                found.terms = terms
                found._hash = hash(key)
                found._key = None
                _intern[key] = found
        return found

    # --- arithmetic -----------------------------------------------------------------
    def __add__(self, other: Dim) -> Dim:
        return add(self, other)

    __radd__ = __add__

    def __sub__(self, other: Dim) -> Dim:
        return sub(self, other)

    def __rsub__(self, other: Dim) -> Dim:
        return sub(other, self)

    def __mul__(self, other: Dim) -> Dim:
        return mul(self, other)

    __rmul__ = __mul__

    def __neg__(self) -> Dim:
        return mul(self, -1)

    def __floordiv__(self, other: Dim) -> Dim:
        return floordiv(self, other)

    def __rfloordiv__(self, other: Dim) -> Dim:
        return floordiv(other, self)

    def __mod__(self, other: Dim) -> Dim:
        return mod(self, other)

    def __rmod__(self, other: Dim) -> Dim:
        return mod(other, self)

    # --- identity -------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        return (Expr, (self.terms,))

    def __repr__(self) -> str:
        return f"Expr({self})"

    def __str__(self) -> str:
        return _format_terms(self.terms)

    def sort_key(self) -> str:
        """A deterministic ordering key (the printed form)."""
        if self._key is None:
            self._key = str(self)
        return self._key

    # --- queries --------------------------------------------------------------------
    @property
    def free_symbols(self) -> frozenset[str]:
        """Names of the symbols this expression depends on."""
        out: set[str] = set()
        for mono, _ in self.terms:
            for atom, _p in mono:
                out |= atom.free_symbols
        return frozenset(out)

    def evaluate(self, env: Mapping[str, int]) -> int:
        """The value for concrete symbol values; a missing symbol is a ShapeError."""
        total = 0
        for mono, coef in self.terms:
            value = coef
            for atom, power in mono:
                value *= atom.evaluate(env) ** power
            total += value
        return total

    def substitute(self, env: Mapping[str, Dim]) -> Dim:
        """Replace symbols by dims (ints or expressions) and re-simplify."""
        total: Dim = 0
        for mono, coef in self.terms:
            value: Dim = coef
            for atom, power in mono:
                a = atom.substitute(env)
                for _ in range(power):
                    value = mul(value, a)
            total = add(total, value)
        return total

    def as_atom(self) -> Atom | None:
        """The atom if this expression is exactly one atom with coefficient 1."""
        if len(self.terms) == 1:
            mono, coef = self.terms[0]
            if coef == 1 and len(mono) == 1 and mono[0][1] == 1:
                return mono[0][0]
        return None


Dim = int | Expr


class Atom:
    """A leaf of the polynomial form: a symbol or an opaque integer function."""

    __slots__ = ("__weakref__", "_hash", "_order", "key")

    def __new__(cls, key: tuple) -> Atom:
        found = _atoms.get(key)
        if found is None:
            with _lock:
                found = _atoms.get(key)
                if found is None:
                    found = object.__new__(cls)
                    found.key = key
                    found._hash = hash(key)
                    found._order = None
                    _atoms[key] = found
        return found

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        return (Atom, (self.key,))

    def __lt__(self, other: Atom) -> bool:
        return self.order() < other.order()

    def order(self) -> tuple:
        if self._order is None:
            self._order = (0 if self.key[0] == "sym" else 1, str(self))
        return self._order

    @property
    def free_symbols(self) -> frozenset[str]:
        if self.key[0] == "sym":
            return frozenset({self.key[1]})
        out: set[str] = set()
        for arg in self.key[1:]:
            if isinstance(arg, Expr):
                out |= arg.free_symbols
        return frozenset(out)

    def evaluate(self, env: Mapping[str, int]) -> int:
        kind = self.key[0]
        if kind == "sym":
            try:
                return int(env[self.key[1]])
            except KeyError:
                raise ShapeError(f"symbol {self.key[1]!r} has no value; known: {sorted(env)}") from None
        args = [a.evaluate(env) if isinstance(a, Expr) else a for a in self.key[1:]]
        return int(_FUNCS[kind](*args))

    def substitute(self, env: Mapping[str, Dim]) -> Dim:
        kind = self.key[0]
        if kind == "sym":
            return env.get(self.key[1], _atom_expr(self))
        args = [a.substitute(env) if isinstance(a, Expr) else a for a in self.key[1:]]
        return _BUILDERS[kind](*args)

    def __str__(self) -> str:
        kind = self.key[0]
        if kind == "sym":
            return self.key[1]
        args = [str(a) for a in self.key[1:]]
        if kind in ("floordiv", "ceildiv"):
            word = "floor" if kind == "floordiv" else "ceil"
            return f"{word}({_paren(self.key[1])}/{_paren(self.key[2])})"
        if kind == "mod":
            return f"({_paren(self.key[1])} % {_paren(self.key[2])})"
        return f"{kind}({', '.join(args)})"

    def __repr__(self) -> str:
        return f"Atom({self})"


def _paren(d: Dim) -> str:
    text = str(d)
    simple = isinstance(d, int) or (isinstance(d, Expr) and d.as_atom() is not None)
    return text if simple else f"({text})"


def _atom_expr(atom: Atom) -> Expr:
    return Expr(((((atom, 1),), 1),))


def _format_terms(terms: Terms) -> str:
    if not terms:
        return "0"
    parts: list[str] = []
    for mono, coef in sorted(terms, key=lambda t: (len(t[0]) == 0, [str(a) for a, _ in t[0]])):
        factors = [str(a) if p == 1 else f"{a}^{p}" for a, p in mono]
        if not factors:
            body = str(abs(coef))
        elif abs(coef) == 1:
            body = "*".join(factors)
        else:
            body = "*".join(factors) + f"*{abs(coef)}"
        sign = "-" if coef < 0 else "+"
        parts.append((sign, body))
    text = ("-" if parts[0][0] == "-" else "") + parts[0][1]
    for sign, body in parts[1:]:
        text += f" {sign} {body}"
    return text


# --- canonicalization ---------------------------------------------------------------


def _terms_of(d: Dim) -> dict:
    if isinstance(d, Expr):
        return dict(d.terms)
    if isinstance(d, bool) or not isinstance(d, int):
        raise TypeError(f"a dimension must be an int or a symbolic Expr, got {type(d).__name__} {d!r}")
    return {(): d} if d else {}


_mono_keys: dict[Monomial, tuple] = {}


def _mono_key(mono: Monomial) -> tuple:
    key = _mono_keys.get(mono)
    if key is None:
        key = tuple((a.order(), p) for a, p in mono)
        _mono_keys[mono] = key
    return key


def _term_key(term: tuple) -> tuple:
    return _mono_key(term[0])


def _make(terms: dict) -> Dim:
    items = tuple(sorted(((m, c) for m, c in terms.items() if c != 0), key=_term_key))
    if not items:
        return 0
    if len(items) == 1 and items[0][0] == ():
        return items[0][1]
    return Expr(items)


def sym(name: str) -> Expr:
    """A named symbolic dimension such as ``batch``.

    Example:
        >>> str(sym("seq") + 1)
        'seq + 1'
    """
    if not name or not isinstance(name, str):
        raise ShapeError(f"a symbol needs a non-empty name, got {name!r}")
    return _atom_expr(Atom(("sym", name)))


def add(a: Dim, b: Dim) -> Dim:
    """``a + b``, simplified."""
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if isinstance(b, int) and b == 0:
        return a
    if isinstance(a, int) and a == 0:
        return b
    terms = _terms_of(a)
    for mono, coef in _terms_of(b).items():
        terms[mono] = terms.get(mono, 0) + coef
    return _make(terms)


def sub(a: Dim, b: Dim) -> Dim:
    """``a - b``, simplified."""
    if isinstance(a, int) and isinstance(b, int):
        return a - b
    return add(a, mul(b, -1))


def _mono_mul(m1: Monomial, m2: Monomial) -> Monomial:
    powers: dict[Atom, int] = dict(m1)
    for atom, p in m2:
        powers[atom] = powers.get(atom, 0) + p
    return tuple(sorted(powers.items(), key=lambda t: t[0].order()))


def mul(a: Dim, b: Dim) -> Dim:
    """``a * b``, simplified (polynomial product)."""
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if isinstance(a, int):
        a, b = b, a
    if isinstance(b, int):  # scaling keeps the order of terms
        if b == 0:
            return 0
        if b == 1:
            return a
        return Expr(tuple((m, c * b) for m, c in a.terms))
    out: dict = {}
    for m1, c1 in _terms_of(a).items():
        for m2, c2 in _terms_of(b).items():
            m = _mono_mul(m1, m2)
            out[m] = out.get(m, 0) + c1 * c2
    return _make(out)


def _split_divisible(a: Dim, b: int) -> tuple[Dim, Dim]:
    """Split ``a`` into ``b*q + r`` where q collects every term whose coefficient b divides."""
    q: dict = {}
    r: dict = {}
    for mono, coef in _terms_of(a).items():
        if coef % b == 0:
            q[mono] = coef // b
        else:
            r[mono] = coef
    return _make(q), _make(r)


def floordiv(a: Dim, b: Dim) -> Dim:
    """``floor(a / b)``; exact parts are divided out: ``(4*n + 2) // 2 == 2*n + 1``."""
    if isinstance(b, int):
        if b == 0:
            raise ShapeError(f"division by zero in dimension expression {a} / 0")
        if isinstance(a, int):
            return a // b
        if b == 1:
            return a
        q, r = _split_divisible(a, b)
        if isinstance(r, int):
            return add(q, r // b)
        if q != 0 and not isinstance(r, int):
            return add(q, floordiv(r, b))
        inner = r.as_atom() if isinstance(r, Expr) else None
        if inner is not None and inner.key[0] == "floordiv" and isinstance(inner.key[2], int):
            return floordiv(inner.key[1], inner.key[2] * b)
    elif isinstance(a, Expr) and a is b:
        return 1
    return _atom_expr(Atom(("floordiv", a, b)))


def ceildiv(a: Dim, b: Dim) -> Dim:
    """``ceil(a / b)``."""
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise ShapeError(f"division by zero in dimension expression ceil({a} / 0)")
        return -((-a) // b)
    if isinstance(b, int):
        if b == 1:
            return a
        q, r = _split_divisible(a, b)
        if isinstance(r, int):
            return add(q, -((-r) // b))
    return _atom_expr(Atom(("ceildiv", a, b)))


def mod(a: Dim, b: Dim) -> Dim:
    """``a mod b`` (Python sign rule; dims are non-negative)."""
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise ShapeError(f"modulo by zero in dimension expression {a} % 0")
        return a % b
    if isinstance(b, int):
        if b == 1:
            return 0
        _q, r = _split_divisible(a, b)
        if isinstance(r, int):
            return r % b
        a = r
    return _atom_expr(Atom(("mod", a, b)))


def _minmax(kind: str, args: Iterable[Dim]) -> Dim:
    pick = min if kind == "min" else max
    flat: list[Dim] = []
    for d in args:
        atom = d.as_atom() if isinstance(d, Expr) else None
        if atom is not None and atom.key[0] == kind:
            flat.extend(atom.key[1:])
        else:
            flat.append(d)
    ints = [d for d in flat if isinstance(d, int)]
    exprs: list[Expr] = []
    for d in flat:
        if isinstance(d, Expr) and d not in exprs:
            exprs.append(d)
    # Drop an expression that differs from a kept one by a constant: that one decides.
    kept: list[Dim] = [pick(ints)] if ints else []
    for e in exprs:
        replaced = False
        for i, k in enumerate(kept):
            diff = sub(e, k)
            if isinstance(diff, int):
                kept[i] = pick(e, k, key=lambda x: sub(x, k) if isinstance(sub(x, k), int) else 0)
                replaced = True
                break
        if not replaced:
            kept.append(e)
    if len(kept) == 1:
        return kept[0]
    ordered = sorted(kept, key=lambda d: (isinstance(d, Expr), str(d)))
    return _atom_expr(Atom((kind, *ordered)))


def min_(*args: Dim) -> Dim:
    """``min(a, b, ...)``, folded where it can be decided."""
    return _minmax("min", args)


def max_(*args: Dim) -> Dim:
    """``max(a, b, ...)``, folded where it can be decided."""
    return _minmax("max", args)


_FUNCS = {
    "floordiv": lambda a, b: a // b,
    "ceildiv": lambda a, b: -((-a) // b),
    "mod": lambda a, b: a % b,
    "min": min,
    "max": max,
}
_BUILDERS = {
    "floordiv": floordiv,
    "ceildiv": ceildiv,
    "mod": mod,
    "min": min_,
    "max": max_,
}


def is_static(d: Dim) -> bool:
    """True when the dimension is a plain integer."""
    return isinstance(d, int)


def evaluate(d: Dim, env: Mapping[str, int]) -> int:
    """The integer value of a dim for concrete symbol values."""
    return d if isinstance(d, int) else d.evaluate(env)


def substitute(d: Dim, env: Mapping[str, Dim]) -> Dim:
    """Replace symbols in a dim by other dims."""
    return d if isinstance(d, int) else d.substitute(env)


def free_symbols(d: Dim) -> frozenset[str]:
    """The symbols a dim depends on (empty for an int)."""
    return frozenset() if isinstance(d, int) else d.free_symbols


def gcd_of(d: Dim) -> int:
    """The largest integer known to divide ``d`` (0 for the constant 0)."""
    if isinstance(d, int):
        return abs(d)
    return math.gcd(*[c for _m, c in d.terms])


__all__ = [
    "Atom", "Dim", "Expr", "add", "ceildiv", "evaluate", "floordiv", "free_symbols", "gcd_of",
    "is_static", "max_", "min_", "mod", "mul", "sub", "substitute", "sym",
]
