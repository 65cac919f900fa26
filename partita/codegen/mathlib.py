"""Vectorizable f32 math functions as LLVM IR, inlined into every kernel that uses them.

LLVM's own ``llvm.exp.f32`` and friends lower to scalar libm calls, which stop the loop
vectorizer. These are straight-line code (polynomials, selects, bit casts), so once inlined the
vectorizer turns a whole fused chain with ``exp`` or ``tanh`` in it into 8-wide AVX2 code.
Accuracy (checked by tests/codegen/test_mathlib.py over the whole float range):

- ``exp``: range reduction by ``n = rint(x * log2 e)`` with ln 2 split in two (Cody and Waite),
  Cephes' degree-6 polynomial, the scale ``2**n`` applied as two exact powers of two so that
  denormal results come out right; overflow to inf above 88.72, 0 below -103.98, NaN kept.
- ``log``: Cephes' ``logf`` (frexp, a degree-8 polynomial around 1, ln 2 split in two);
  denormals scaled first; 0 -> -inf, negative -> NaN, inf -> inf.
- ``tanh``: below |x| = 0.625 the odd 13/6 rational minimax used by Eigen and ONNX Runtime's
  MLAS (``x`` itself below 4e-4); above, ``1 - 2e / (1 + e)`` with ``e = exp(-2|x|)``, so that
  ``1 + tanh(x)`` near -1 (GELU's tanh form) keeps its accuracy; one division a lane serves
  both branches (their numerators and denominators are selected first).
- ``erf``: no division. Below |x| = 0.921875 an odd polynomial ``x P(x^2)``; above,
  ``1 - exp(Q(|x|))`` with ``Q`` a polynomial fit of ``log erfc`` and |x| clamped at 3.925 (erf
  rounds to +-1 beyond), so that ``1 + erf(x)`` near -1 (GELU's exact form) keeps its accuracy.

f64 kernels call libm (``exp``, ``log``, ``tanh``, ``erf``), exact to the ulp but scalar.
"""

from __future__ import annotations

import math
import struct

__all__ = ["f32", "f64", "F32_FUNCTIONS", "F64_LIBM", "declarations", "exp_neg_ir", "gelu_vector_lines"]


def f32(value: float) -> str:
    """An f32 constant as LLVM IR spells it: the double the float rounds to, in hex."""
    as_f32 = struct.unpack("f", struct.pack("f", float(value)))[0]
    return "0x%016X" % struct.unpack("Q", struct.pack("d", as_f32))[0]


def f64(value: float) -> str:
    return "0x%016X" % struct.unpack("Q", struct.pack("d", float(value)))[0]


def _horner(var: str, coeffs: list[float], tag: str) -> tuple[list[str], str]:
    """Lines computing the polynomial ``coeffs[0] * v**k + ... + coeffs[-1]`` in ``var``."""
    lines = []
    acc = f32(coeffs[0])
    for i, c in enumerate(coeffs[1:]):  # one fused multiply-add a step (half the instructions)
        lines.append(f"  %{tag}a{i} = call float @llvm.fma.f32(float {acc}, float {var}, float {f32(c)})")
        acc = f"%{tag}a{i}"
    return lines, acc


def _exp() -> str:
    p_lines, p = _horner("%r", [1.9875691500E-4, 1.3981999507E-3, 8.3334519073E-3, 4.1665795894E-2,
                               1.6666665459E-1, 5.0000001201E-1], "p")
    body = "\n".join(p_lines)
    return f"""define internal float @pt_expf(float %x) alwaysinline {{
  %lo = call float @llvm.maxnum.f32(float %x, float {f32(-104.0)})
  %xc = call float @llvm.minnum.f32(float %lo, float {f32(89.0)})
  %t = fmul float %xc, {f32(1.44269504088896341)}
  %n = call float @llvm.rint.f32(float %t)
  %nh = fmul float %n, {f32(0.693359375)}
  %r1 = fsub float %xc, %nh
  %nl = fmul float %n, {f32(-2.12194440e-4)}
  %r = fsub float %r1, %nl
{body}
  %rr = fmul float %r, %r
  %q = fmul float {p}, %rr
  %q1 = fadd float %q, %r
  %y = fadd float %q1, {f32(1.0)}
  %ni = fptosi float %n to i32
  %n1 = ashr i32 %ni, 1
  %n2 = sub i32 %ni, %n1
  %b1 = add i32 %n1, 127
  %s1b = shl i32 %b1, 23
  %s1 = bitcast i32 %s1b to float
  %b2 = add i32 %n2, 127
  %s2b = shl i32 %b2, 23
  %s2 = bitcast i32 %s2b to float
  %y1 = fmul float %y, %s1
  %y2 = fmul float %y1, %s2
  %big = fcmp ogt float %x, {f32(88.72283935546875)}
  %y3 = select i1 %big, float 0x7FF0000000000000, float %y2
  %small = fcmp olt float %x, {f32(-103.97208404541016)}
  %y4 = select i1 %small, float 0.0, float %y3
  %nan = fcmp uno float %x, 0.0
  %res = select i1 %nan, float %x, float %y4
  ret float %res
}}"""


def exp_neg_ir(lanes: int = 1) -> str:
    """``exp(x)`` for x <= 0 (and -inf, NaN kept), on f32 (``lanes`` 1: ``@pt_expf_neg``) or
    ``<lanes x float>`` (``@pt_vexpf_neg{lanes}``): the range reduction and polynomial of
    ``pt_expf`` with one scale ``2**n`` (n >= -126 here) and 0 below -87, where exp is under
    the smallest normal f32 (1.2e-38). About two thirds of ``pt_expf``'s instructions: what
    the softmax of attention and GELU's erfc, whose arguments are never positive, use."""
    if lanes == 1:
        vt, vi, vb, name = "float", "i32", "i1", "pt_expf_neg"
        sfx = "f32"

        def s(c: float) -> str:
            return f32(c)

        def si(c: int) -> str:
            return str(c)
    else:
        vt, vi, vb, name = f"<{lanes} x float>", f"<{lanes} x i32>", f"<{lanes} x i1>", f"pt_vexpf_neg{lanes}"
        sfx = f"v{lanes}f32"

        def s(c: float) -> str:
            return f"splat (float {f32(c)})"

        def si(c: int) -> str:
            return f"splat (i32 {c})"
    coeffs = [1.9875691500E-4, 1.3981999507E-3, 8.3334519073E-3, 4.1665795894E-2, 1.6666665459E-1,
              5.0000001201E-1]
    lines = [f"define internal {vt} @{name}({vt} %x) alwaysinline nounwind {{",
             f"  %xc = call {vt} @llvm.maxnum.{sfx}({vt} %x, {vt} {s(-87.0)})",
             f"  %t = fmul {vt} %xc, {s(1.44269504088896341)}",
             f"  %n = call {vt} @llvm.rint.{sfx}({vt} %t)",
             f"  %r1 = call {vt} @llvm.fma.{sfx}({vt} %n, {vt} {s(-0.693359375)}, {vt} %xc)",
             f"  %r = call {vt} @llvm.fma.{sfx}({vt} %n, {vt} {s(2.12194440e-4)}, {vt} %r1)"]
    acc = s(coeffs[0])
    for i, c in enumerate(coeffs[1:]):
        lines.append(f"  %h{i} = call {vt} @llvm.fma.{sfx}({vt} {acc}, {vt} %r, {vt} {s(c)})")
        acc = f"%h{i}"
    lines += [f"  %rr = fmul {vt} %r, %r",
              f"  %q1 = call {vt} @llvm.fma.{sfx}({vt} {acc}, {vt} %rr, {vt} %r)",
              f"  %y = fadd {vt} %q1, {s(1.0)}",
              f"  %ni = fptosi {vt} %n to {vi}",
              f"  %nb = add {vi} %ni, {si(127)}",
              f"  %sb = shl {vi} %nb, {si(23)}",
              f"  %sc = bitcast {vi} %sb to {vt}",
              f"  %y1 = fmul {vt} %y, %sc",
              f"  %dead = fcmp olt {vt} %x, {s(-87.0)}",
              f"  %y2 = select {vb} %dead, {vt} zeroinitializer, {vt} %y1",
              f"  %nan = fcmp uno {vt} %x, %x",
              f"  %res = select {vb} %nan, {vt} %x, {vt} %y2",
              f"  ret {vt} %res",
              "}"]
    return "\n".join(lines)


def _log() -> str:
    p_lines, p = _horner("%m", [7.0376836292E-2, -1.1514610310E-1, 1.1676998740E-1, -1.2420140846E-1,
                               1.4249322787E-1, -1.6668057665E-1, 2.0000714765E-1, -2.4999993993E-1,
                               3.3333331174E-1], "p")
    body = "\n".join(p_lines)
    return f"""define internal float @pt_logf(float %x) alwaysinline {{
  %den = fcmp olt float %x, {f32(1.1754943508222875e-38)}
  %xs = fmul float %x, {f32(8388608.0)}
  %xn = select i1 %den, float %xs, float %x
  %eadj = select i1 %den, i32 -23, i32 0
  %bits = bitcast float %xn to i32
  %eb = lshr i32 %bits, 23
  %ebm = and i32 %eb, 255
  %e0 = sub i32 %ebm, 126
  %e1 = add i32 %e0, %eadj
  %mb = and i32 %bits, 8388607
  %mb1 = or i32 %mb, 1056964608
  %m0 = bitcast i32 %mb1 to float
  %lt = fcmp olt float %m0, {f32(0.707106781186547524)}
  %m2 = fadd float %m0, %m0
  %ma = fsub float %m2, 1.0
  %mbb = fsub float %m0, 1.0
  %m = select i1 %lt, float %ma, float %mbb
  %ed = sub i32 %e1, 1
  %e = select i1 %lt, i32 %ed, i32 %e1
  %fe = sitofp i32 %e to float
  %z = fmul float %m, %m
{body}
  %y0 = fmul float {p}, %m
  %y1 = fmul float %y0, %z
  %c1 = fmul float %fe, {f32(-2.12194440e-4)}
  %y2 = fadd float %y1, %c1
  %hz = fmul float %z, -0.5
  %y3 = fadd float %y2, %hz
  %r0 = fadd float %m, %y3
  %c2 = fmul float %fe, {f32(0.693359375)}
  %r1 = fadd float %r0, %c2
  %zero = fcmp oeq float %x, 0.0
  %r2 = select i1 %zero, float 0xFFF0000000000000, float %r1
  %neg = fcmp olt float %x, 0.0
  %r3 = select i1 %neg, float 0x7FF8000000000000, float %r2
  %inf = fcmp oeq float %x, 0x7FF0000000000000
  %r4 = select i1 %inf, float %x, float %r3
  %nan = fcmp uno float %x, 0.0
  %res = select i1 %nan, float %x, float %r4
  ret float %res
}}"""


def _tanh() -> str:
    """One division a lane. Below |x| = 0.625 the odd 13/6 rational ``x P(x^2) / Q(x^2)``
    (accurate to a few ulp, no cancellation; ``x`` itself below 4e-4); above it
    ``1 - 2e / (1 + e)``, ``e = exp(-2|x|)``, with the sign of x, which keeps ``1 + tanh(x)``
    (GELU's tanh form near -1) accurate: the rational's few ulp near -1 become a large relative
    error there. Both numerators and both denominators are computed, the branch's pair is
    selected, and a single division serves both (the vectorized loop computes every lane's two
    branches anyway); ``exp`` is ``pt_expf_neg``, its argument never positive."""
    n_lines, n = _horner("%x2", _TANH_NUM, "n")
    d_lines, d = _horner("%x2", _TANH_DEN, "d")
    return f"""define internal float @pt_tanhf(float %x) alwaysinline {{
  %ax = call float @llvm.fabs.f32(float %x)
  %m2 = fmul float %ax, -2.0
  %e = call float @pt_expf_neg(float %m2)
  %x2 = fmul float %x, %x
{chr(10).join(n_lines)}
  %p = fmul float {n}, %x
{chr(10).join(d_lines)}
  %e2 = fmul float %e, 2.0
  %e1 = fadd float %e, 1.0
  %big = fcmp oge float %ax, {f32(0.625)}
  %num = select i1 %big, float %e2, float %p
  %den = select i1 %big, float %e1, float {d}
  %q = fdiv float %num, %den
  %t = fsub float 1.0, %q
  %l = call float @llvm.copysign.f32(float %t, float %x)
  %tiny = fcmp olt float %ax, {f32(0.0004)}
  %s = select i1 %tiny, float %x, float %q
  %r = select i1 %big, float %l, float %s
  ret float %r
}}"""


# tanh's odd rational below |x| = 0.625 (Eigen's and MLAS's minimax): numerator and denominator
# coefficients in x^2, highest power first.
_TANH_NUM = [-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
             1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03]
_TANH_DEN = [1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03]


def _erf() -> str:
    """No division. Below |x| = 0.921875 the odd polynomial ``x P(x^2)`` (its constant term
    split in two floats, so small x is within half an ulp); above, ``1 - exp(Q(|x|))`` with the
    sign of x, ``Q`` a degree-6 fit of ``log erfc`` on [0.921875, 3.925] (erfc's absolute error
    1.5e-9 in float64), |x| clamped at 3.925 where erf rounds to +-1; ``exp`` is
    ``pt_expf_neg`` (its argument is never positive). ``1 + erf(x)`` near -1 (GELU's exact
    form) stays within about an ulp of 1. NaN goes through the polynomial branch, unchanged."""
    p_lines, p = _horner("%s", _ERF_SMALL, "p")
    q_lines, q = _horner("%ac", _ERF_LOG_ERFC, "q")
    return f"""define internal float @pt_erff(float %x) alwaysinline {{
  %s = fmul float %x, %x
{chr(10).join(p_lines)}
  %pl = call float @llvm.fma.f32(float {p}, float %s, float {f32(_ERF_C0_LO)})
  %xp = fmul float %x, %pl
  %small = call float @llvm.fma.f32(float %x, float {f32(_ERF_C0_HI)}, float %xp)
  %a = call float @llvm.fabs.f32(float %x)
  %ac = call float @llvm.minnum.f32(float %a, float {f32(_ERF_CLAMP)})
{chr(10).join(q_lines)}
  %e = call float @pt_expf_neg(float {q})
  %one = fsub float 1.0, %e
  %big = call float @llvm.copysign.f32(float %one, float %x)
  %sm = fcmp ult float %a, {f32(_ERF_SPLIT)}
  %r = select i1 %sm, float %small, float %big
  ret float %r
}}"""



def gelu_vector_lines(tag: str, v: str, lanes: int) -> list[str]:
    """IR giving ``tag`` = GELU(``v``) = v / 2 * (1 + erf(v / sqrt 2)) on ``<lanes x float>``,
    erf as ``pt_erff`` computes it (no division); NaN stays NaN. The module declares
    ``llvm.fma``, ``llvm.fabs`` and ``llvm.minnum`` on that vector type and ``pt_vexpf_neg{lanes}``
    (``exp_neg_ir(lanes)``): a drop-in for the direct convolutions' GELU epilogue."""
    vt, vb, fma = f"<{lanes} x float>", f"<{lanes} x i1>", f"@llvm.fma.v{lanes}f32"

    def c(x: float) -> str:
        return f"splat (float {f32(x)})"

    def horner(name: str, var: str, coeffs: list[float]) -> tuple[list[str], str]:
        lines, acc = [], c(coeffs[0])
        for i, k in enumerate(coeffs[1:]):
            lines.append(f"  {tag}.{name}{i} = call {vt} {fma}({vt} {acc}, {vt} {var}, {vt} {c(k)})")
            acc = f"{tag}.{name}{i}"
        return lines, acc

    out = [f"  {tag}.z = fmul {vt} {v}, {c(math.sqrt(0.5))}", f"  {tag}.s = fmul {vt} {tag}.z, {tag}.z"]
    p_lines, p = horner("p", f"{tag}.s", _ERF_SMALL)
    out += p_lines + [f"  {tag}.pl = call {vt} {fma}({vt} {p}, {vt} {tag}.s, {vt} {c(_ERF_C0_LO)})",
                      f"  {tag}.xp = fmul {vt} {tag}.z, {tag}.pl",
                      f"  {tag}.sm = call {vt} {fma}({vt} {tag}.z, {vt} {c(_ERF_C0_HI)}, {vt} {tag}.xp)",
                      f"  {tag}.a = call {vt} @llvm.fabs.v{lanes}f32({vt} {tag}.z)",
                      f"  {tag}.ac = call {vt} @llvm.minnum.v{lanes}f32({vt} {tag}.a, {vt} {c(_ERF_CLAMP)})"]
    q_lines, q = horner("q", f"{tag}.ac", _ERF_LOG_ERFC)
    out += q_lines + [f"  {tag}.e = call {vt} @pt_vexpf_neg{lanes}({vt} {q})",
                      f"  {tag}.one = fsub {vt} {c(1.0)}, {tag}.e",
                      f"  {tag}.neg = fcmp olt {vt} {tag}.z, zeroinitializer",
                      f"  {tag}.mone = fneg {vt} {tag}.one",
                      f"  {tag}.big = select {vb} {tag}.neg, {vt} {tag}.mone, {vt} {tag}.one",
                      f"  {tag}.in = fcmp ult {vt} {tag}.a, {c(_ERF_SPLIT)}",
                      f"  {tag}.erf = select {vb} {tag}.in, {vt} {tag}.sm, {vt} {tag}.big",
                      f"  {tag}.e1 = fadd {vt} {tag}.erf, {c(1.0)}",
                      f"  {tag}.hv = fmul {vt} {v}, {c(0.5)}",
                      f"  {tag} = fmul {vt} {tag}.hv, {tag}.e1"]
    return out

# erf's fits (float64 minimax by Lawson's iteration on Chebyshev nodes, coefficients then rounded
# to f32). Below the split: erf(x) / x = C0 + x^2 P(x^2), P highest power first, C0 = HI + LO.
_ERF_SPLIT = 0.921875
_ERF_CLAMP = 3.925
_ERF_SMALL = [-0.0005990952486172318, 0.004993203561753035, -0.026766635477542877, 0.1128181666135788,
              -0.37612494826316833]
_ERF_C0_HI = 1.1283791065216064
_ERF_C0_LO = 4.3085652379204475e-08
# Above it: log(erfc(x)) as a polynomial in x, highest power first.
_ERF_LOG_ERFC = [0.00019473429711069912, -0.0030315988697111607, 0.022181391716003418, -0.10383889079093933,
                 -0.6372857689857483, -1.1276154518127441, -0.00020991572819184512]


# name -> (the function's IR, the functions it calls)
F32_FUNCTIONS = {"pt_expf": _exp(), "pt_expf_neg": exp_neg_ir(1), "pt_logf": _log(), "pt_tanhf": _tanh(),
                 "pt_erff": _erf()}

# f64 math through libm: partita op -> the C function.
F64_LIBM = {"exp": "exp", "log": "log", "tanh": "tanh", "erf": "erf", "sin": "sin", "cos": "cos"}

_INTRINSICS = """declare float @llvm.maxnum.f32(float, float)
declare float @llvm.fma.f32(float, float, float)
declare float @llvm.minnum.f32(float, float)
declare float @llvm.maximum.f32(float, float)
declare float @llvm.minimum.f32(float, float)
declare double @llvm.maximum.f64(double, double)
declare double @llvm.minimum.f64(double, double)
declare float @llvm.rint.f32(float)
declare float @llvm.fabs.f32(float)
declare float @llvm.copysign.f32(float, float)
declare double @llvm.fabs.f64(double)
declare float @llvm.sqrt.f32(float)
declare double @llvm.sqrt.f64(double)
declare float @llvm.sin.f32(float)
declare float @llvm.cos.f32(float)
declare float @llvm.pow.f32(float, float)
declare double @llvm.pow.f64(double, double)"""


def declarations(used: set[str]) -> str:
    """The declarations and helper bodies a module that calls ``used`` functions needs."""
    parts = [_INTRINSICS] + list(F32_FUNCTIONS.values())  # the caller keeps the ones it calls
    for name in sorted(used):
        if name not in F32_FUNCTIONS:
            parts.append(f"declare double @{name}(double)")
    return "\n\n".join(parts)
