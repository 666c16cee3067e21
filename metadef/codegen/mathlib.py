"""Inline float32 transcendental functions, as LLVM IR the loop vectorizer can widen.

Calls to libm (``expf``) would stay scalar inside vector loops; these functions are plain
arithmetic on bits and polynomials, defined ``internal alwaysinline`` in every module, so a
loop over ``exp`` becomes AVX2/AVX-512 code. Accuracy (tested against the reference
evaluator): ``exp``, ``log``, ``tanh`` within a few ulp (Cephes' polynomials); ``erf`` within
1.4e-7 absolute (polynomials fitted here: ``erf(x)/x`` in ``x*x`` below 0.92, ``log(erfc)``
above, with no division).

Example:
    >>> "define internal float @md_expf" in MATH_IR
    True
    >>> float_literal(0.1)
    '0x3FB99999A0000000'
"""

from __future__ import annotations

import struct

import numpy as np

FUNCTIONS = {"exp": "md_expf", "log": "md_logf", "tanh": "md_tanhf", "erf": "md_erff",
             "sigmoid": "md_sigmoidf", "softplus": "md_softplusf"}
"""Semantic function name -> the inline float32 implementation."""


def float_literal(value: float, dtype: np.dtype | str = "float32") -> str:
    """An LLVM constant of a float type: hex of the value rounded to that type."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        bits = struct.unpack("<H", struct.pack("<e", float(value)))[0]
        return f"0xH{bits:04X}"
    rounded = float(np.asarray(value, dtype))
    bits = struct.unpack("<Q", struct.pack("<d", rounded))[0]
    return f"0x{bits:016X}"


class _Body:
    """Straight-line IR text with fresh names."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.count = 0

    def __call__(self, text: str) -> str:
        name = f"%v{self.count}"
        self.count += 1
        self.lines.append(f"  {name} = {text}")
        return name

    def horner(self, x: str, coefs: list[float]) -> str:
        acc = float_literal(coefs[0])
        for c in coefs[1:]:
            acc = self(f"call float @llvm.fmuladd.f32(float {acc}, float {x}, float {float_literal(c)})")
        return acc

    def estrin(self, x: str, coefs: list[float]) -> str:
        """The polynomial with ``coefs`` (highest degree first, as :meth:`horner`) by Estrin's
        scheme: pairs ``c0 + c1 x``, then pairs of those with ``x**2``, ``x**4``, ...: a chain
        of about log2(degree) FMAs where Horner's is the degree long. In a vectorized loop the
        chain's latency, not the count of operations, bounds how fast an ``erf`` or ``exp``
        goes (the core holds too few iterations to overlap 30-deep chains)."""
        terms = [float_literal(c) for c in reversed(coefs)]  # lowest degree first
        power = x
        while len(terms) > 1:
            pairs = [self(f"call float @llvm.fmuladd.f32(float {hi}, float {power}, float {lo})")
                     for lo, hi in zip(terms[::2], terms[1::2])]
            terms = pairs + terms[len(pairs) * 2:]
            if len(terms) > 1:
                power = self(f"fmul float {power}, {power}")
        return terms[0]

    def define(self, name: str, result: str) -> str:
        body = "\n".join(self.lines)
        return (f"define internal float @{name}(float %x) alwaysinline nounwind {{\n{body}\n"
                f"  ret float {result}\n}}\n")


def _c(value: float) -> str:
    return float_literal(value)


def _pow2(b: _Body, k: str) -> str:
    """2**k as a float, for k in the normal exponent range."""
    biased = b(f"add i32 {k}, 127")
    return b(f"bitcast i32 {b(f'shl i32 {biased}, 23')} to float")


def _exp(b: _Body, x: str, wide: bool = True) -> str:
    """``exp(x)`` for a finite ``x`` in ``[-104, 89]`` (``wide``: the result scaled by two
    powers of two, reaching float32's largest and subnormal values) or ``[-87, 0]`` (one power
    of two: a shorter chain), Cephes' reduction and polynomial, the polynomial by Estrin."""
    n = b(f"call float @llvm.roundeven.f32(float {b(f'fmul float {x}, {_c(1.4426950408889634)}')})")
    r = b(f"call float @llvm.fmuladd.f32(float {n}, float {_c(-0.693359375)}, float {x})")
    r = b(f"call float @llvm.fmuladd.f32(float {n}, float {_c(2.12194440e-4)}, float {r})")
    p = b.estrin(r, [1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                     1.6666665459e-1, 5.0000001201e-1])
    r2 = b(f"fmul float {r}, {r}")
    y = b(f"call float @llvm.fmuladd.f32(float {p}, float {r2}, float {r})")
    y = b(f"fadd float {y}, 1.0")
    k = b(f"fptosi float {n} to i32")
    if not wide:
        return b(f"fmul float {y}, {_pow2(b, k)}")
    k1 = b(f"ashr i32 {k}, 1")
    k2 = b(f"sub i32 {k}, {k1}")
    s1, s2 = _pow2(b, k1), _pow2(b, k2)
    return b(f"fmul float {b(f'fmul float {y}, {s1}')}, {s2}")


def _expf() -> str:
    b = _Body()
    x = b(f"call float @llvm.minnum.f32(float %x, float {_c(89.0)})")
    x = b(f"call float @llvm.maxnum.f32(float {x}, float {_c(-104.0)})")
    nan = b("fcmp uno float %x, 0.0")
    y = _exp(b, b(f"select i1 {nan}, float 0.0, float {x}"))
    return b.define("md_expf", b(f"select i1 {nan}, float %x, float {y}"))


def _logf() -> str:
    b = _Body()
    tiny = b(f"fcmp olt float %x, {_c(1.1754943508222875e-38)}")
    scaled = b(f"select i1 {tiny}, float {b(f'fmul float %x, {_c(8388608.0)}')}, float %x")
    bits = b(f"bitcast float {scaled} to i32")
    top = b(f"lshr i32 {bits}, 23")
    e = b(f"sub i32 {b(f'and i32 {top}, 255')}, 126")
    e = b(f"sub i32 {e}, {b(f'select i1 {tiny}, i32 23, i32 0')}")
    mantissa = b(f"and i32 {bits}, 8388607")
    m = b(f"bitcast i32 {b(f'or i32 {mantissa}, 1056964608')} to float")
    low = b(f"fcmp olt float {m}, {_c(0.707106781186547524)}")
    e = b(f"sub i32 {e}, {b(f'zext i1 {low} to i32')}")
    twice = b(f"fadd float {m}, {m}")
    m = b(f"fsub float {b(f'select i1 {low}, float {twice}, float {m}')}, 1.0")
    z = b(f"fmul float {m}, {m}")
    p = b.horner(m, [7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
                     1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
                     3.3333331174e-1])
    y = b(f"fmul float {b(f'fmul float {p}, {m}')}, {z}")
    ef = b(f"sitofp i32 {e} to float")
    y = b(f"call float @llvm.fmuladd.f32(float {ef}, float {_c(-2.12194440e-4)}, float {y})")
    y = b(f"call float @llvm.fmuladd.f32(float {z}, float {_c(-0.5)}, float {y})")
    r = b(f"fadd float {m}, {y}")
    r = b(f"call float @llvm.fmuladd.f32(float {ef}, float {_c(0.693359375)}, float {r})")
    r = b(f"select i1 {b('fcmp oeq float %x, 0x7FF0000000000000')}, float %x, float {r}")
    r = b(f"select i1 {b('fcmp oeq float %x, 0.0')}, float 0xFFF0000000000000, float {r}")
    r = b(f"select i1 {b('fcmp ult float %x, 0.0')}, float 0x7FF8000000000000, float {r}")
    return b.define("md_logf", b(f"select i1 {b('fcmp uno float %x, 0.0')}, float %x, float {r}"))


def _tanhf() -> str:
    b = _Body()
    a = b("call float @llvm.fabs.f32(float %x)")
    s = b("fmul float %x, %x")
    p = b.horner(s, [-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
                     -3.33332819422e-1])
    small = b(f"call float @llvm.fmuladd.f32(float {b(f'fmul float {p}, {s}')}, float %x, float %x)")
    e = b(f"call float @md_expf(float {b(f'fadd float {a}, {a}')})")
    e1 = b(f"fadd float {e}, 1.0")
    t = b(f"fsub float 1.0, {b(f'fdiv float 2.0, {e1}')}")
    large = b(f"call float @llvm.copysign.f32(float {t}, float %x)")
    pick = b(f"fcmp olt float {a}, {_c(0.625)}")
    return b.define("md_tanhf", b(f"select i1 {pick}, float {small}, float {large}"))


_ERF_SPLIT = 0.921875
_ERF_SMALL = [8.43876831643416e-05, -0.0008160783794642724, 0.005202835679525913, -0.02686024115996487,
              0.11283713845485904, -0.3761263529970337, 1.1283791669248353]
"""``erf(x) / x`` as a polynomial in ``x*x`` on ``[0, 0.921875]`` (least squares at 4,000 Chebyshev
nodes against float64 erf; checked in tests/codegen/test_mathlib.py)."""
_ERF_LARGE = [-5.14524306380968e-08, 1.226307280698221e-06, -1.1220687661502894e-05, 3.196410868658216e-05,
              0.00029362911125673847, -0.003971806958977823, 0.025035268508085847, -0.10845022282509842,
              -0.6330528754608676, -1.1296993855025048, 0.0002179623734597598]
"""``log(erfc(a))`` as a polynomial in ``a`` on ``[0.921875, 4]`` (fitted the same way); past 4,
erfc is below float32's resolution of 1."""


def _erff() -> str:
    """``x * Q(x*x)`` below 0.921875, ``sign(x) * (1 - exp(P(min(|x|, 4))))`` above: no
    division (the earlier rational forms took two per element, the GELU epilogue's main cost),
    within 1.4e-7 absolute and 2e-7 relative near 0."""
    b = _Body()
    x2 = b("fmul float %x, %x")
    small = b(f"fmul float {b.horner(x2, _ERF_SMALL)}, %x")  # (not the longest chain: Horner)
    a = b(f"call float @llvm.minnum.f32(float {b('call float @llvm.fabs.f32(float %x)')}, float {_c(4.0)})")
    erfc = _exp(b, b.estrin(a, _ERF_LARGE), wide=False)  # log(erfc) lies in [-17, -1.6]: no clamps
    large = b(f"call float @llvm.copysign.f32(float {b(f'fsub float 1.0, {erfc}')}, float %x)")
    pick = b(f"fcmp olt float {b('call float @llvm.fabs.f32(float %x)')}, {_c(_ERF_SPLIT)}")
    r = b(f"select i1 {pick}, float {small}, float {large}")
    return b.define("md_erff", b(f"select i1 {b('fcmp uno float %x, 0.0')}, float %x, float {r}"))


def _sigmoidf() -> str:
    b = _Body()
    e = b(f"call float @md_expf(float {b('fneg float %x')})")
    return b.define("md_sigmoidf", b(f"fdiv float 1.0, {b(f'fadd float {e}, 1.0')}"))


def _softplusf() -> str:
    """``max(x, 0) + log1p(exp(-|x|))``, log1p by Goldberg's ``log(u) * t / (u - 1)``."""
    b = _Body()
    t = b(f"call float @md_expf(float {b('fneg float ' + b('call float @llvm.fabs.f32(float %x)'))})")
    u = b(f"fadd float {t}, 1.0")
    ratio = b(f"fdiv float {t}, {b(f'fsub float {u}, 1.0')}")
    log_u = b(f"call float @md_logf(float {u})")
    log1p = b(f"fmul float {log_u}, {ratio}")
    log1p = b(f"select i1 {b(f'fcmp oeq float {u}, 1.0')}, float {t}, float {log1p}")
    pos = b("select i1 " + b("fcmp ogt float %x, 0.0") + ", float %x, float 0.0")
    return b.define("md_softplusf", b(f"fadd float {pos}, {log1p}"))


_DECLARATIONS = "\n".join(
    f"declare float @llvm.{name}.f32({', '.join(['float'] * arity)})"
    for name, arity in [("fmuladd", 3), ("minnum", 2), ("maxnum", 2), ("roundeven", 1),
                        ("fabs", 1), ("copysign", 2)])

DEFINITIONS = {"md_expf": _expf(), "md_logf": _logf(), "md_tanhf": _tanhf(), "md_erff": _erff(),
               "md_sigmoidf": _sigmoidf(), "md_softplusf": _softplusf()}
"""Each inline function's definition."""

MATH_IR = "\n".join(DEFINITIONS.values())
"""All the definitions, to paste into a module."""


def definitions_for(text: str) -> str:
    """The definitions that ``text`` calls, with the ones they call (only those: optimizing
    unused functions would cost compile time)."""
    wanted = {name for name in DEFINITIONS if f"@{name}(" in text}
    for name in list(wanted):
        wanted |= {other for other in DEFINITIONS if f"@{other}(" in DEFINITIONS[name]}
    return "\n".join(DEFINITIONS[name] for name in DEFINITIONS if name in wanted)

MATH_DECLARATIONS = _DECLARATIONS
"""The intrinsics the definitions call (a module declares each intrinsic once)."""

__all__ = ["DEFINITIONS", "FUNCTIONS", "MATH_DECLARATIONS", "MATH_IR", "definitions_for",
           "float_literal"]
