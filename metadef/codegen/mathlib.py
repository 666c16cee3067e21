"""Inline float32 transcendental functions, as LLVM IR the loop vectorizer can widen.

Calls to libm (``expf``) would stay scalar inside vector loops; these functions are plain
arithmetic on bits and polynomials, defined ``internal alwaysinline`` in every module, so a
loop over ``exp`` becomes AVX2/AVX-512 code. Such loops are bound by the count of vector
operations: ``exp`` rounds by the 1.5 * 2**23 "magic number" (one FMA), evaluates a degree-6
polynomial by Horner's scheme and handles its ranges with one vminps/vmaxps per bound and the
sign of ``x``, not with NaN selects. Accuracy (measured against float64 numpy over dense
samples of float32's range, tested in tests/codegen/test_mathlib.py): ``exp`` within 0.9 ulp,
subnormal results included; ``log`` 0.8 ulp (Cephes' polynomial); ``tanh`` 2.5 ulp (one
expm1-based formula, one division); ``sigmoid`` 2.5 ulp (0 where float32's ``exp(-x)``
overflows, as numpy's); ``erf`` within 1.4e-7 absolute (polynomials fitted here:
``erf(x)/x`` in ``x*x`` below 0.92, ``log(erfc)`` above, with no division); ``ndtr`` (the
normal CDF, GELU's ``x * ndtr(x)``) within 1.1e-7 absolute and relative in its lower tail (one
polynomial for ``log`` of Mills' ratio, one ``exp``); ``sin`` and
``cos`` within 1.6 ulp (1.58 measured over every float32), relative near their zeros too, for
``|x|`` up to 2**34 pi/2 = 2.7e10 (:data:`TRIG_BOUND`: the argument is reduced by pi/2 in
double precision, then Cephes' polynomials for both on [-pi/4, pi/4], one picked and its sign
set by the quadrant), finite and within [-1, 1] beyond.

Example:
    >>> "define internal float @md_expf" in MATH_IR
    True
    >>> float_literal(0.1)
    '0x3FB99999A0000000'
"""

from __future__ import annotations

import math
import struct

import numpy as np

from metadef.codegen.host import host_target

FUNCTIONS = {"exp": "md_expf", "expm1": "md_expm1f", "log": "md_logf", "tanh": "md_tanhf", "erf": "md_erff",
             "ndtr": "md_ndtrf", "sigmoid": "md_sigmoidf", "softplus": "md_softplusf", "sin": "md_sinf",
             "cos": "md_cosf"}
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


LOG2E = 1.4426950408889634
ROUND_MAGIC = 12582912.0
"""1.5 * 2**23: adding it rounds a float below 2**22 to an integer (to nearest even), which
then sits in the low bits of the sum's mantissa (the "magic number" rounding: one FMA)."""
LN2_HI, LN2_LO = 0.693359375, -2.12194440e-4
"""ln 2 in two parts (Cody and Waite): ``n * LN2_HI`` is exact for ``|n| < 2**15``."""
EXP_POLY = [0.001381459878757596, 0.008368716575205326, 0.04166838899254799, 0.1666652113199234,
             0.4999999403953552, 1.0, 1.0]
"""``e**r`` on ``[-ln2/2, ln2/2]``, degree 6 (highest first; fitted here for minimal relative
error, 3e-9, its two lowest coefficients exactly 1: one FMA fewer than Cephes' degree 7)."""


def _fma(b: _Body, a: str, x: str, c: str) -> str:
    return b(f"call float @llvm.fmuladd.f32(float {a}, float {x}, float {c})")


def _clamp(b: _Body, x: str, low: float, high: float) -> str:
    """``x`` clamped to ``[low, high]``, a NaN kept: each bound one ``vminps``/``vmaxps``
    (``llvm.minnum`` would return the bound for a NaN, and needs a select to undo that)."""
    x = b(f"select i1 {b(f'fcmp ult float {x}, {_c(high)}')}, float {x}, float {_c(high)}")
    return b(f"select i1 {b(f'fcmp ugt float {x}, {_c(low)}')}, float {x}, float {_c(low)}")


def _exp_reduce(b: _Body, x: str, sign: float = 1.0) -> tuple[str, str]:
    """``(rounded, r)`` with ``exp(sign * x) = e**(sign * r) * 2**n`` for a finite ``|x| < 2**21``:
    ``n`` is ``sign * x / ln 2`` rounded, held in the low bits of ``rounded`` (as an integer,
    ``bits(rounded) << 23`` is ``n << 23``), ``|r| <= ln2/2``; four operations (the
    rounding by :data:`ROUND_MAGIC` instead of ``roundeven`` and ``fptosi``)."""
    rounded = _fma(b, x, _c(sign * LOG2E), _c(ROUND_MAGIC))
    n = b(f"fsub float {rounded}, {_c(ROUND_MAGIC)}")
    r = _fma(b, n, _c(-sign * LN2_HI), x)
    return rounded, _fma(b, n, _c(-sign * LN2_LO), r)


def _exp_poly(b: _Body, r: str, factor: float = 1.0, sign: float = 1.0) -> str:
    """``factor * e**(sign * r)`` for ``|r| <= ln2/2`` by Horner's scheme (the loops these run in
    are bound by the count of vector operations, not by the chain's latency), within 1 ulp;
    ``factor`` a power of two (exact)."""
    degree = len(EXP_POLY) - 1
    return b.horner(r, [factor * c * sign ** (degree - i) for i, c in enumerate(EXP_POLY)])


def _exponent_of(b: _Body, rounded: str) -> str:
    """``n << 23`` as an i32, for the ``n`` held by ``rounded`` (see :func:`_exp_reduce`): added to
    a float's bits, it multiplies that float by ``2**n`` while the result stays normal."""
    return b(f"shl i32 {b(f'bitcast float {rounded} to i32')}, 23")


def _pow2(b: _Body, rounded: str, bias: int | str) -> str:
    """``2**(n + bias / 2**23 - 127)`` for the ``n`` held by ``rounded``, ``bias`` an i32 (a
    constant or a value) with the exponent bias in bits 23-30, for a result in the normal range."""
    return b(f"bitcast i32 {b(f'add i32 {_exponent_of(b, rounded)}, {bias}')} to float")


def _exp_narrow(b: _Body, x: str) -> str:
    """``exp(x)`` for ``x`` in ``[-86, 88]`` (a normal result): the polynomial's exponent field
    plus ``n``, no multiplication; within 1 ulp."""
    rounded, r = _exp_reduce(b, x)
    y = b(f"bitcast float {_exp_poly(b, r)} to i32")
    return b(f"bitcast i32 {b(f'add i32 {y}, {_exponent_of(b, rounded)}')} to float")


def _expf() -> str:
    """``exp(x)`` within 0.9 ulp over float32's range, subnormal results rounded once, inf past
    88.7228, 0 below -103.98, NaN kept. ``x`` is clamped to ``[-104, 89]``; the result is
    ``e**r * 2**(n -+ 64) * 2**(+-64)`` (the sign of ``x`` picks): two normal factors reach
    float32's largest and subnormal values, and the last multiplication rounds (or
    overflows) once."""
    b = _Body()
    x = _clamp(b, "%x", -104.0, 89.0)
    rounded, r = _exp_reduce(b, x)
    y = _exp_poly(b, r)
    negative = b(f"fcmp olt float {x}, 0.0")
    scale = _pow2(b, rounded, b(f"select i1 {negative}, i32 {(127 + 64) << 23}, i32 {(127 - 64) << 23}"))
    rest = b(f"select i1 {negative}, float {_c(2.0 ** -64)}, float {_c(2.0 ** 64)}")
    return b.define("md_expf", b(f"fmul float {b(f'fmul float {y}, {scale}')}, {rest}"))


def _expf_scalef() -> str:
    """``md_expf`` for hosts with AVX-512: the polynomial times ``2**n`` by ``llvm.ldexp``,
    which a vector loop makes one ``vscalefps`` (overflow to inf and subnormal results rounded
    once, as the portable form's two scalings do): the same results, 1.8x faster here (Zen 4,
    393,216 floats: 171 -> 92 us). Without AVX-512 ``ldexp`` would be a libm call an element."""
    b = _Body()
    x = _clamp(b, "%x", -104.0, 89.0)
    rounded, r = _exp_reduce(b, x)
    n = b(f"fptosi float {b(f'fsub float {rounded}, {_c(ROUND_MAGIC)}')} to i32")
    return b.define("md_expf", b(f"call float @llvm.ldexp.f32.i32(float {_exp_poly(b, r)}, i32 {n})"))


def _expm1f() -> str:
    """``exp(x) - 1``: the degree-6 polynomial less its constant, times ``x``, where ``|x| <=
    ln2 / 2`` (no cancellation: within 1.5 ulp, ``-0`` kept), else ``md_expf(x) - 1`` (where
    ``exp(x)`` is at least ``sqrt 2`` or at most ``1 / sqrt 2`` away from 1: within 3 ulp; inf,
    -1 and NaN as ``exp``'s)."""
    b = _Body()
    small = b(f"fmul float {b.horner('%x', EXP_POLY[:-1])}, %x")
    large = b(f"fsub float {b('call float @md_expf(float %x)')}, 1.0")
    pick = b(f"fcmp olt float {b('call float @llvm.fabs.f32(float %x)')}, {_c(0.34657359027997264)}")
    return b.define("md_expm1f", b(f"select i1 {pick}, float {small}, float {large}"))


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
    """``tanh(x) = -m / (2 + m)`` with ``m = expm1(-2|x|)``, the sign of ``x``: one formula
    for every ``x`` (no small-``|x|`` branch), within 2.6 ulp. ``expm1(t) = (2**n - 1) + 2**n *
    (e**r - 1)`` keeps the relative accuracy of ``e**r - 1`` (a polynomial with no constant
    term) where ``n`` is 0; ``|x|`` is clamped to 9 (past 8.5 the result rounds to 1), a NaN
    kept."""
    b = _Body()
    a = _clamp(b, b("call float @llvm.fabs.f32(float %x)"), 0.0, 9.0)
    t = b(f"fmul float {a}, -2.0")
    rounded, r = _exp_reduce(b, t)
    p = b(f"fmul float {b.horner(r, EXP_POLY[:-1])}, {r}")  # e**r - 1
    s = _pow2(b, rounded, 127 << 23)
    m = _fma(b, s, p, b(f"fsub float {s}, 1.0"))
    t = b(f"fdiv float {m}, {b(f'fsub float -2.0, {m}')}")
    return b.define("md_tanhf", b(f"call float @llvm.copysign.f32(float {t}, float %x)"))


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
    erfc = _exp_narrow(b, b.estrin(a, _ERF_LARGE))  # log(erfc) lies in [-17, -1.6]: no clamps
    large = b(f"call float @llvm.copysign.f32(float {b(f'fsub float 1.0, {erfc}')}, float %x)")
    pick = b(f"fcmp olt float {b('call float @llvm.fabs.f32(float %x)')}, {_c(_ERF_SPLIT)}")
    r = b(f"select i1 {pick}, float {small}, float {large}")
    return b.define("md_erff", b(f"select i1 {b('fcmp uno float %x, 0.0')}, float %x, float {r}"))


_NDTR_BOUND = 4 * math.sqrt(2)
_NDTR_LOG_MILLS = [1.7362838944379178e-09, -6.464647839266036e-08, 1.070132043423655e-06, -1.028331826091744e-05,
                   6.153318099677563e-05, -0.00020846350525971502, 9.74625345406821e-06, 0.004821282811462879,
                   -0.036362748593091965, 0.18169911205768585, -0.7978856563568115, -0.6931471824645996]
"""``log(Phi(-t)) + t*t/2`` (the log of Mills' ratio times the normal density's constant) as a
polynomial in ``t`` on ``[0, 4 sqrt 2]``: smooth from ``log 1/2`` to about ``-log(t sqrt(2 pi))``,
so degree 11 holds it to 3e-8 (least squares at 8,000 Chebyshev nodes against float64
``log(erfc)``, coefficients rounded to float32)."""


def _ndtrf() -> str:
    """``Phi(x)``, the standard normal CDF (``0.5 * erfc(-x / sqrt 2)``; GELU is ``x * Phi(x)``):
    ``h = Phi(-|x|) = exp(P(t) - t*t/2)`` for ``t = |x|`` up to ``4 sqrt 2`` (0 past it, where
    ``Phi(-t) < 8e-9``), then ``h`` or ``1 - h`` by the sign of ``x``. One branch, one ``exp``
    and no division: about 30 vector operations where ``0.5 * (1 + erf(x / sqrt 2))`` takes
    ``md_erff``'s two branches; within 1.1e-7 absolute, and relative in the lower tail (3e-6
    where ``md_erff``'s ``1 + erf`` cancels to nothing)."""
    b = _Body()
    t = b("call float @llvm.fabs.f32(float %x)")
    inside = b(f"fcmp ult float {t}, {_c(_NDTR_BOUND)}")  # (a NaN stays: it flows through to the result)
    clamped = b(f"select i1 {inside}, float {t}, float {_c(_NDTR_BOUND)}")
    log_phi = _fma(b, clamped, b(f"fmul float {clamped}, {_c(-0.5)}"), b.estrin(clamped, _NDTR_LOG_MILLS))
    h = b(f"select i1 {inside}, float {_exp_narrow(b, log_phi)}, float 0.0")  # log(Phi) in [-18.7, -0.69]
    upper = b(f"fsub float 1.0, {h}")
    return b.define("md_ndtrf", b(f"select i1 {b('fcmp olt float %x, 0.0')}, float {h}, float {upper}"))


def _sigmoidf() -> str:
    """``1 / (1 + exp(-x))`` within 2.5 ulp, with ``x`` clamped to ``[-89, 80]`` (a NaN kept).
    ``exp(-x)`` needs no subnormal results (``1 + tiny`` is 1) but must overflow to inf as
    float32's does (a result of 0 below -88.72, subnormal ones just above, as numpy's float32
    ``1 / (1 + exp(-x))``): it is ``(2 e**r) * 2**(n - 1)``, the factor 2 in the polynomial's
    coefficients, so one multiplication by a normal power of two reaches ``2**128``."""
    b = _Body()
    x = _clamp(b, "%x", -89.0, 80.0)
    rounded, r = _exp_reduce(b, x, sign=-1.0)
    e = b(f"fmul float {_exp_poly(b, r, factor=2.0, sign=-1.0)}, {_pow2(b, rounded, 126 << 23)}")
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


TRIG_BOUND = 2.0 ** 33 * math.pi
"""``md_sinf`` and ``md_cosf`` are within 1.6 ulp up to here (2**34 pi/2 = 2.7e10) on any host,
1.58 measured over every float32 below it with ``llvm.fmuladd`` fused and not: ``k`` (see
:func:`_trig_reduce`) has at most 34 bits, and so ``k`` times each of the first two
:data:`_HALF_PI_PARTS` is exact either way. Beyond (measured on a million samples a binade):
where ``fmuladd`` fuses (x86 with FMA) still within 1.6 ulp below 1.4e14 (every float32 up
to there), then 2e-3 absolute below 2**48, 0.015 below 2**49, 0.1 below 2**51; unfused, at
most 2**-53 * ``|x|`` absolute (2.8e-6 below 6.9e10, 1.2e-4 below 2.2e12). From 2**51, where
``k`` outgrows its rounding, no accuracy (3e38 gives 0.72 for 0.87): finite values in [-1, 1],
as everywhere."""
_HALF_PI_PARTS = (1.5707969665527344, -6.397585821105167e-07, 7.443547480486623e-13)
"""pi/2 in three doubles (Cody and Waite): pi/2 rounded to 19 significant bits, the rest
rounded to 19, the rest rounded to 53; their sum is within 1.3e-29 (2**-96) of pi/2 (computed
with mpmath's 400-bit pi)."""
_TWO_OVER_PI = 0.6366197723675814
_ROUND_MAGIC_64 = 6755399441055744.0
"""1.5 * 2**52: :data:`ROUND_MAGIC` for doubles (below 2**51, the integer sits in the low bits
of the sum's mantissa)."""
_SIN_POLY = [-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1]
"""``(sin(r) - r) / r**3`` as a polynomial in ``r*r`` on ``[-pi/4, pi/4]``: Cephes' sinf.c
(``sincof``), within 2**-26.9 of sin relative (its float32 coefficients, float64 arithmetic; a
least-squares fit here came out the same)."""
_COS_POLY = [2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2]
"""``(cos(r) - 1 + r*r/2) / r**4`` in ``r*r`` on ``[-pi/4, pi/4]``: Cephes' sinf.c (``coscof``),
within 2**-32 of cos relative."""
_TRIG_CLAMP = 0.8
"""Past every reduced argument below :data:`TRIG_BOUND` (pi/4, plus 5e-6 where ``k``'s rounding
misses): clamped to it, arguments that reduce badly keep the polynomials, and so the results,
in [-1, 1]. On [-0.8, 0.8] the polynomials are still within 2**-26 relative: above the bound,
a fused ``k`` that leaves ``r`` up to 0.009 past pi/4 (2/pi's rounding times 2**47) costs
nothing."""


def _f64(value: float) -> str:
    return float_literal(value, "float64")


def _fma64(b: _Body, a: str, x: float, c: str) -> str:
    return b(f"call double @llvm.fmuladd.f64(double {a}, double {_f64(x)}, double {c})")


def _trig_reduce(b: _Body) -> tuple[str, str]:
    """``(r, q)``: ``|x| = k pi/2 + r`` with ``|r| <= pi/4`` (a float) and ``q`` the low bits of
    ``k`` (an i32), reduced in double precision: ``k`` rounded by :data:`_ROUND_MAGIC_64`, then
    ``r = |x| - k C1 - k C2 - k C3`` (:data:`_HALF_PI_PARTS`). Below :data:`TRIG_BOUND`, ``k C1``
    and ``k C2`` are exact and so is ``|x| - k C1`` (Sterbenz); ``r``'s error is at most 2**-53
    of ``r`` plus 2**-59 (the roundings next to ``k C3``, up to 0.013, and pi/2's remainder
    times ``k``), and no float32 below the bound lies closer than 2**-27.8 to a multiple of pi/2
    (252.898, found by exact arithmetic on 2/pi's bits, binade by binade): ``r`` is within
    2**-31 of ``|x| mod pi/2`` relative before it is rounded to float. Beyond, ``r`` is
    clamped to :data:`_TRIG_CLAMP` (inf and NaN give NaN)."""
    d = b(f"fpext float {b('call float @llvm.fabs.f32(float %x)')} to double")
    rounded = _fma64(b, d, _TWO_OVER_PI, _f64(_ROUND_MAGIC_64))
    k = b(f"fsub double {rounded}, {_f64(_ROUND_MAGIC_64)}")
    r = d
    for part in _HALF_PI_PARTS:
        r = _fma64(b, k, -part, r)
    r = _clamp(b, b(f"fptrunc double {r} to float"), -_TRIG_CLAMP, _TRIG_CLAMP)
    return r, b(f"trunc i64 {b(f'bitcast double {rounded} to i64')} to i32")


def _trig_polys(b: _Body, r: str) -> tuple[str, str]:
    """``(sin r, cos r)`` for ``|r| <= pi/4`` (:data:`_SIN_POLY`, :data:`_COS_POLY`):
    ``r + r**3 S(r*r)`` and ``(1 - r*r/2) + r**4 C(r*r)``, 9 operations."""
    z = b(f"fmul float {r}, {r}")
    sin = _fma(b, b(f"fmul float {r}, {z}"), b.horner(z, _SIN_POLY), r)
    cos = _fma(b, b(f"fmul float {z}, {z}"), b.horner(z, _COS_POLY), _fma(b, z, _c(-0.5), _c(1.0)))
    return sin, cos


def _trig(name: str, shift: int) -> str:
    """``sin(x)`` (``shift`` 0) or ``cos(x)`` (``shift`` 1: ``cos(|x|) = sin(|x| + pi/2)``), with
    ``(r, q)`` of :func:`_trig_reduce`: ``sin(|x|)`` is ``sin r``, ``cos r``, ``-sin r``, ``-cos
    r`` for ``q + shift`` = 0, 1, 2, 3 mod 4: bit 0 selects the polynomial, bit 1 the sign,
    xored into the result's bits with, for sin, the sign of ``x`` (``sin(x) = sign(x)
    sin(|x|)``, so ``sin(-0) = -0``). About 30 operations, 8 of them on doubles; no branch."""
    b = _Body()
    r, q = _trig_reduce(b)
    sin, cos = _trig_polys(b, r)
    q = b(f"add i32 {q}, {shift}") if shift else q
    odd = b(f"icmp ne i32 {b(f'and i32 {q}, 1')}, 0")
    value = b(f"bitcast float {b(f'select i1 {odd}, float {cos}, float {sin}')} to i32")
    sign = b(f"shl i32 {q}, 30")
    if name == "md_sinf":
        sign = b(f"xor i32 {sign}, {b('bitcast float %x to i32')}")
    sign = b(f"and i32 {sign}, -2147483648")
    return b.define(name, b(f"bitcast i32 {b(f'xor i32 {value}, {sign}')} to float"))


_DECLARATIONS = "\n".join(
    [f"declare float @llvm.{name}.f32({', '.join(['float'] * arity)})"
     for name, arity in [("fmuladd", 3), ("minnum", 2), ("maxnum", 2), ("fabs", 1), ("copysign", 2)]]
    + ["declare float @llvm.ldexp.f32.i32(float, i32)",
       "declare double @llvm.fmuladd.f64(double, double, double)"])

DEFINITIONS = {"md_expf": _expf(), "md_expm1f": _expm1f(), "md_logf": _logf(), "md_tanhf": _tanhf(), "md_erff": _erff(),
               "md_ndtrf": _ndtrf(), "md_sigmoidf": _sigmoidf(), "md_softplusf": _softplusf(),
               "md_sinf": _trig("md_sinf", 0),
               "md_cosf": _trig("md_cosf", 1)}
"""Each inline function's definition."""

MATH_IR = "\n".join(DEFINITIONS.values())
"""All the definitions, to paste into a module."""


SCALEF_EXP: bool | None = None
"""Whether ``md_expf`` takes its AVX-512 form (:func:`_expf_scalef`); None: where the host has
AVX-512 (tests set it to check both forms)."""

_EXP_SCALEF = _expf_scalef()


def definitions_for(text: str, scalef: bool | None = None) -> str:
    """The definitions that ``text`` calls, with the ones they call (only those: optimizing
    unused functions would cost compile time); ``md_expf`` in its AVX-512 form where
    ``scalef`` (default :data:`SCALEF_EXP`, else whether the host has AVX-512) says so."""
    wanted = {name for name in DEFINITIONS if f"@{name}(" in text}
    for name in list(wanted):
        wanted |= {other for other in DEFINITIONS if f"@{other}(" in DEFINITIONS[name]}
    scalef = SCALEF_EXP if scalef is None else scalef
    if scalef is None:
        scalef = "md_expf" in wanted and host_target().has("avx512f")
    chosen = {**DEFINITIONS, "md_expf": _EXP_SCALEF} if scalef else DEFINITIONS
    return "\n".join(chosen[name] for name in chosen if name in wanted)

MATH_DECLARATIONS = _DECLARATIONS
"""The intrinsics the definitions call (a module declares each intrinsic once)."""

__all__ = ["DEFINITIONS", "EXP_POLY", "FUNCTIONS", "LN2_HI", "LN2_LO", "LOG2E", "MATH_DECLARATIONS", "MATH_IR",
           "ROUND_MAGIC", "SCALEF_EXP", "TRIG_BOUND", "definitions_for", "float_literal"]
