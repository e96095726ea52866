"""The helper prelude of generated Triton modules: its text for each target, the
LLVM library its NVIDIA form calls, and its loading as a module of its own.

* `PRELUDE`: @triton.jit helpers of tl.* ops every module uses, on the GPU and in
  the interpreter alike; `PTX_HELPERS` / `TL_HELPERS`: those printed per target
  (`prelude_text`).
* `nvptx_math.ll` (`NVPTX_MATH_LIB`): LLVM IR that NVIDIA kernels link through
  Triton's `extern_libs` (`compile_options`); `install_link_filter` keeps Triton
  from linking libraries a kernel does not call.
* A graph's module starts with `prelude_header`: the prelude is a module of its own
  beside it (`load_prelude`), built once a process and shared by every graph, its
  file named by its text's hash.

It lives with the runtime because generated modules import it, in this process and
in the compile workers: it imports neither torch nor sympy (nor the codegen
package, which does), so a worker is up in the time Triton takes to import.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
from pathlib import Path
from typing import Any

from fuselens.compiler.runtime.atomic_file import write_atomically
from fuselens.private_dirs import cache_dir, check_private_file

# Helper functions every generated module starts with. They are plain @triton.jit
# functions of tl.* ops, so they run on the GPU and in the interpreter alike.
PRELUDE = '''
import triton
import triton.language as tl
{libdevice_import}
{target_helpers}

@triton.jit
def _fl_maximum(a, b):
    # torch.maximum propagates NaN; PTX max.f32 (and tl.maximum's default) does not
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _fl_minimum(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _fl_imaximum(a, b):
    return tl.maximum(a, b)


@triton.jit
def _fl_iminimum(a, b):
    return tl.minimum(a, b)


@triton.jit
def _fl_prod(a, b):
    return a * b


@triton.jit
def _fl_floordiv_int(a, b):
    # Python floor division whatever `//` does on this target (C truncation on
    # the GPU): correct the quotient when the remainder has the other sign
    q = a // b
    r = a - q * b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)


@triton.jit
def _fl_truncdiv_int(a, b):
    q = a // b
    r = a - q * b
    return tl.where((r != 0) & ((r < 0) != (a < 0)), q + 1, q)


@triton.jit
def _fl_remainder_int(a, b):
    return a - _fl_floordiv_int(a, b) * b


@triton.jit
def _fl_fmod_int(a, b):
    return a - _fl_truncdiv_int(a, b) * b


@triton.jit
def _fl_trunc(x):
    return tl.where(x < 0, _fl_ceil(x), _fl_floor(x))


@triton.jit
def _fl_round(x):
    # round half to even (torch.round / nearbyint)
    r = _fl_floor(x + 0.5)
    tie = (r - x) == 0.5
    odd = (r - 2.0 * _fl_floor(r * 0.5)) != 0.0
    return tl.where(tie & odd, r - 1.0, r)


@triton.jit
def _fl_lgamma(x):
    # log|Gamma(x)| in float64 (the interpreter's form; GPUs take libdevice's): Lanczos
    # (g = 7, 9 terms, ~1e-15 relative) for x >= 0.5, the reflection
    # log(pi / |sin(pi x)|) - lgamma(1 - x) below; poles and +-inf give inf, as torch
    z = x.to(tl.float64)
    w = tl.where(z < 0.5, 1.0 - z, z) - 1.0
    a = 0.99999999999980993 + 676.5203681218851 / (w + 1.0) - 1259.1392167224028 / (w + 2.0)
    a = a + 771.32342877765313 / (w + 3.0) - 176.61502916214059 / (w + 4.0)
    a = a + 12.507343278686905 / (w + 5.0) - 0.13857109526572012 / (w + 6.0)
    a = a + 9.9843695780195716e-6 / (w + 7.0) + 1.5056327351493116e-7 / (w + 8.0)
    t = w + 7.5
    lg = 0.91893853320467274 + (w + 0.5) * tl.log(t) - t + tl.log(a)
    r = tl.where(z < 0.5, tl.log(3.141592653589793 / tl.abs(tl.sin(3.141592653589793 * z))) - lg, lg)
    pole = (z <= 0.0) & (_fl_floor(z) == z)  # sin(pi z) is not exactly 0 there in floating point
    return tl.where(pole | (tl.abs(z) == float("inf")), float("inf"), r).to(x.dtype)


@triton.jit
def _fl_nextafter(a, b):
    # C's nextafter for float32/float64 from a's bits, exact: one step of the integer
    # view away from zero when b lies beyond a, towards it otherwise (the view of a
    # negative float grows with its magnitude); +-0 steps to the smallest subnormal
    if a.dtype == tl.float64:
        ia = a.to(tl.int64, bitcast=True)
        tiny = tl.full(a.shape, 1, tl.int64).to(tl.float64, bitcast=True)
    else:
        ia = a.to(tl.int32, bitcast=True)
        tiny = tl.full(a.shape, 1, tl.int32).to(tl.float32, bitcast=True)
    r = (ia + tl.where((b > a) == (a > 0), 1, -1)).to(a.dtype, bitcast=True)
    r = tl.where(a == 0, tl.where(b > 0, tiny, -tiny), r)
    r = tl.where(a == b, b, r)
    return tl.where((a != a) | (b != b), a + b, r)


@triton.jit
def _fl_take_large(x, a, q, r, qb, rb):
    # where |x| > 8192, the reduction (qb, rb) of a = |x| in place of Cody-Waite's (q, r),
    # with x's sign: x = -(n pi/2 + r) = (-n) pi/2 + (-r). inf and nan give a nan r.
    big = a > 8192.0
    neg = x < 0.0
    q = tl.where(big, tl.where(neg, -qb, qb), q)
    r = tl.where(big, tl.where(neg, -rb, rb), r)
    r = tl.where(a < float("inf"), r, x - x)
    return q, r


@triton.jit
def _fl_cody_waite(x):
    # x = q pi/2 + r, r in [-pi/4, pi/4]: Cody-Waite by pi/2 in three parts, exact
    # products for |q| < 2^13 (|x| <= 8192). Returns (q, r).
    k = _fl_floor(x * 0.6366197723675814 + 0.5)
    r = x - k * 1.5703125
    r = r - k * 4.837512969970703125e-4
    r = r - k * 7.54978995489188216e-8
    return k.to(tl.int32), r


@triton.jit
def _fl_sincos_poly(q, r):
    # sin and cos of q pi/2 + r: cephes' minimax polynomials on [-pi/4, pi/4], then
    # the quadrant's swap and signs
    z = r * r
    s = ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * r + r
    c = ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2) * z * z - 0.5 * z + 1.0
    swap = (q & 1) != 0
    sn = tl.where(swap, c, s)
    cs = tl.where(swap, s, c)
    sn = tl.where((q & 2) != 0, -sn, sn)
    cs = tl.where(((q + 1) & 2) != 0, -cs, cs)
    return sn, cs


@triton.jit
def _fl_sin(x):
    sn, cs = _fl_sincos(x)
    return sn


@triton.jit
def _fl_cos(x):
    sn, cs = _fl_sincos(x)
    return cs


@triton.jit
def _fl_reduce_large(a):
    # |x| = n pi/2 + r for finite float32 |x| >= 2, r in [-pi/4, pi/4]: ARM
    # optimized-routines' reduce_large (sincosf.h). The 24-bit mantissa times a
    # 96-bit window of 2/pi's bits (where the exponent says) gives x 2/pi mod 4 in
    # 2.62 fixed point, exactly; r is accurate to 33 bits. Returns (n, r).
    # The portable form (TL_HELPERS); on NVIDIA GPUs nvptx_math.ll holds the same
    # reduction. Kernels have no constant arrays: the window (ARM's __inv_pio4 table entries
    # i, i + 4 and i + 8) is cut from 2/pi's first 192 bits, three uint64 words, by
    # shifts; a tree of selects over the table took 24 more registers a thread
    # (occupancy: sin^2+cos^2 0.150 against 0.136 ms on the H200) for the same bits.
    xi = a.to(tl.uint32, bitcast=True)
    idx = ((xi >> 26) & 15).to(tl.uint64)
    m = (((xi & 0xffffff) | 0x800000) << ((xi >> 23) & 7)).to(tl.uint64)
    z = m * 0  # a uint64 zero of the block's shape: gives the constants their type
    # hi: 64 bits of 2/pi after the first 152 - 8 idx, from the word pair (hiw, low)
    t = (z + 152) - idx * 8
    ge128 = t >= 128
    ge64 = t >= 64
    low = tl.where(ge128, z + 0xa2f9836e4e441529, tl.where(ge64, z + 0xfc2757d1f534ddc0, z + 0xdb6295993c439041))
    hiw = tl.where(ge128, z, tl.where(ge64, z + 0xa2f9836e4e441529, z + 0xfc2757d1f534ddc0))
    s = t - tl.where(ge128, z + 128, tl.where(ge64, z + 64, z))
    hi = (low >> s) | ((hiw << 1) << (63 - s))  # two shifts: one by 64 would be undefined
    # lo: the next 32 bits
    u = t - 32
    geu = u >= 64
    lowu = tl.where(geu, z + 0xfc2757d1f534ddc0, z + 0xdb6295993c439041)
    hiu = tl.where(geu, z + 0xa2f9836e4e441529, z + 0xfc2757d1f534ddc0)
    su = u - tl.where(geu, z + 64, z)
    lo = ((lowu >> su) | ((hiu << 1) << (63 - su))) & 0xffffffff
    res = m * hi + ((m * lo) >> 32)
    n = (res + (z + 0x2000000000000000)) >> 62
    res = res - (n << 62)
    r = res.to(tl.int64, bitcast=True).to(tl.float64) * 3.4061215800865545e-19  # pi/2 * 2^-62
    return n.to(tl.int32), r.to(tl.float32)


@triton.jit
def _fl_erf_16bit(x):
    # erf for kernels whose every output is rounded to bfloat16/float16 (code generator:
    # `TritonKernel.out16`): Abramowitz & Stegun 7.1.26, 1 - (a1 t + ... + a5 t^5) exp(-x^2)
    # with t = 1 / (1 + p|x|); max abs error 6.0e-7 in float32 on [-12, 12] (measured on the
    # H200 against float64). Fewer instructions than libdevice's two-branch erf: gelu(x+b)
    # bf16 16384x4096 0.099 -> 0.087 ms; 0.11% of its outputs land one bfloat16 ulp off the
    # correctly rounded float32 result (libdevice 0.07%; A&S 7.1.28, 0.081 ms, 0.37%:
    # benchmarks/gpu_erf_variants.py); with the approximate rcp and ex2 below, 0.073 ms.
    # nan stays nan, +-inf gives +-1.
    a = tl.abs(x)
    t = _fl_rcp_approx(1.0 + 0.3275911 * a)
    p = 1.061405429 * t - 1.453152027
    p = p * t + 1.421413741
    p = p * t - 0.284496736
    p = p * t + 0.254829592
    r = 1.0 - p * t * _fl_ex2_approx(a * (a * -1.4426950408889634))
    return tl.where(x < 0, -r, r)


@triton.jit
def _fl_gelu_16bit(x):
    # gelu(x) = x Phi(x) (erf-GELU) for kernels whose every output is rounded to 16 bits,
    # what `TritonOps.mul` prints for the decomposition x*0.5*(1 + erf(x/sqrt2)). Phi from
    # the same A&S 7.1.26 as _fl_erf_16bit, written as x (1 - h) for x >= 0 and x h below,
    # h = 0.5 erfc(|x|/sqrt2) = P(t) t exp(-x^2/2) with P's coefficients halved: no
    # cancellation in 1 + erf for negative x, so more outputs round as the exact GELU
    # would (0.101% one bfloat16 ulp off against 0.146%). With the approximate rcp and
    # ex2: gelu(x+b) bf16 16384x4096 0.086 -> 0.069 ms on the H200, the time of x + b
    # alone (benchmarks/gpu_erf_variants.py). Like CUDA's eager
    # x * normcdf(x): gelu(inf) = inf, gelu(-inf) = nan, nan stays nan.
    a = tl.abs(x)
    t = _fl_rcp_approx(1.0 + 0.23164188450029695 * a)  # 0.3275911 / sqrt(2)
    p = 0.5307027145 * t - 0.7265760135
    p = p * t + 0.7107068705
    p = p * t - 0.142248368
    p = p * t + 0.127414796
    h = p * t * _fl_ex2_approx(a * (a * -0.7213475204444817))  # exp(-x^2/2) = 2^(-x^2 log2(e)/2)
    return x * tl.where(x >= 0.0, 1.0 - h, h)


@triton.jit
def _fl_expm1(x):
    # Kahan's expm1: exact to a few ulp without an expm1 instruction
    u = tl.exp(x)
    um1 = u - 1.0
    r = tl.where(u == 1.0, x, um1 * x / tl.log(u))
    r = tl.where(um1 == -1.0, -1.0, r)
    return tl.where(x > 80.0, u, r)


@triton.jit
def _fl_log1p(x):
    u = 1.0 + x
    r = tl.where(u == 1.0, x, tl.log(u) * x / (u - 1.0))
    return tl.where(x == float("inf"), x, r)


@triton.jit
def _fl_tanh(x):
    ax = tl.abs(x)
    t = tl.exp(-2.0 * ax)
    big = (1.0 - t) / (1.0 + t)
    z = x * x
    small = x * (1.0 + z * (-0.3333333333 + z * (0.1333333333 + z * (-0.0539682540 + z * 0.0218694885))))
    r = tl.where(x < 0, -big, big)
    return tl.where(ax < 0.25, small, r)


@triton.jit
def _fl_sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _fl_atan(x):
    # Cephes atanf: range reduction to |x| <= tan(pi/8), then a degree-9 polynomial
    ax = tl.abs(x)
    big = ax > 2.414213562373095
    mid = ax > 0.4142135623730950
    y0 = tl.where(big, 1.5707963267948966, tl.where(mid, 0.7853981633974483, 0.0))
    xr = tl.where(big, -1.0 / ax, tl.where(mid, (ax - 1.0) / (ax + 1.0), ax))
    z = xr * xr
    p = (((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z - 3.33329491539e-1) * z * xr + xr
    r = y0 + p
    return tl.where(x < 0, -r, r)


@triton.jit
def _fl_atan2(y, x):
    a = _fl_atan(y / x)
    pi = 3.141592653589793
    r = tl.where(x < 0, tl.where(y < 0, a - pi, a + pi), a)
    r = tl.where((x == 0) & (y > 0), 0.5 * pi, r)
    r = tl.where((x == 0) & (y < 0), -0.5 * pi, r)
    return tl.where((x == 0) & (y == 0), tl.where(x.to(tl.int32, bitcast=True) < 0, pi, 0.0) * tl.where(y.to(tl.int32, bitcast=True) < 0, -1.0, 1.0), r)


@triton.jit
def _fl_asin(x):
    return _fl_atan(x / tl.sqrt(1.0 - x * x))


@triton.jit
def _fl_acos(x):
    return 1.5707963267948966 - _fl_asin(x)


@triton.jit
def _fl_sinh(x):
    e = _fl_expm1(tl.abs(x))
    r = 0.5 * (e + e / (e + 1.0))
    return tl.where(x < 0, -r, r)


@triton.jit
def _fl_cosh(x):
    e = tl.exp(tl.abs(x))
    return 0.5 * (e + 1.0 / e)


@triton.jit
def _fl_asinh(x):
    ax = tl.abs(x)
    r = _fl_log1p(ax + ax * ax / (1.0 + tl.sqrt(1.0 + ax * ax)))
    return tl.where(x < 0, -r, r)


@triton.jit
def _fl_acosh(x):
    return tl.log(x + tl.sqrt(x * x - 1.0))


@triton.jit
def _fl_atanh(x):
    return 0.5 * _fl_log1p(2.0 * x / (1.0 - x))


@triton.jit
def _fl_pow(a, b):
    # a ** b from exp2/log2 with torch's special cases (negative bases with
    # integral exponents, 0 ** negative = inf, x ** 0 = 1, 1 ** y = 1).
    # One shape for both: a 0-d base (2 ** x prints tl.full([], 2.0)) compared and
    # &-ed with a block mask fails in Triton's interpreter (numpy bitwise_and).
    a, b = tl.broadcast(a, b)
    r = tl.exp2(b * tl.log2(tl.abs(a)))
    bi = _fl_floor(b)
    isint = bi == b
    odd = isint & ((bi - 2.0 * _fl_floor(bi * 0.5)) != 0.0)
    r = tl.where((a < 0) & odd, -r, r)
    r = tl.where((a < 0) & (bi != b), float("nan"), r)
    r = tl.where(b == 0, 1.0, r)
    return tl.where(a == 1, 1.0, r)


@triton.jit
def _fl_pow_int(a, b):
    # integer power by squaring (exponents < 64 bits), 0 for negative exponents
    # except base 1 / -1 (torch raises for int ** negative; eager checks first)
    r = tl.full(a.shape, 1, a.dtype) + 0 * b
    base = a + 0 * b
    e = b + 0 * a
    for _ in range(63):
        r = tl.where((e & 1) != 0, r * base, r)
        base = base * base
        e = e >> 1
    return tl.where(b < 0, tl.where(a == 1, 1, tl.where(a == -1, tl.where((b & 1) != 0, -1, 1), 0)), r)
'''


# Helpers printed per target. On NVIDIA GPUs:
# * 1/x and 2^x to about an ulp in one special-function instruction each, for the
#   prelude's 16-bit-output math (_fl_erf_16bit, _fl_gelu_16bit): PTX's approximate
#   forms with denormals flushed to zero. Triton's `/` and `tl.exp2` add range checks and
#   rescaling around the same instruction (gelu(x+b) bf16: 0.078 -> 0.068 ms).
# * floor, ceil and rsqrt of float32 as their one PTX instruction, as CUDA's floorf,
#   ceilf and rsqrtf compile: Triton's tl.floor, tl.ceil and tl.rsqrt call libdevice,
#   and a kernel calling libdevice at all has the whole library parsed and linked
#   into it, 25-57 ms of its compile (layernorm's rsqrt, sin/cos's floor).
# * `_fl_sincos` finishes the range reduction in nvptx_math.ll (see there): an
#   element with |x| > 8192 calls its one compiled copy of the large-argument
#   reduction (sin^2+cos^2 compiled ~0.1 s slower with it written in Triton).
# The interpreter has no inline assembly and runs no LLVM, and ROCm has no PTX:
# there they are plain tl.* ops and the large-argument reduction in Triton, taken by
# a block holding any |x| > 8192, inf or nan.
PTX_HELPERS = '''
from triton.language import core as _fl_core


@triton.jit
def _fl_to_bf16(x):
    return x.to(tl.bfloat16)  # the hardware conversion rounds to nearest even


@triton.jit
def _fl_rcp_approx(x):
    return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _fl_ex2_approx(x):
    return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)


@_fl_core.extern
def _fl_sincos_arg(x, q, r, _semantic=None):
    # (q, r) packed as (q << 32) | bits(r): Cody-Waite's where |x| <= 8192
    return _fl_core.extern_elementwise(
        "fuselens", {lib!r}, [x, q, r],
        {{(_fl_core.dtype("fp32"), _fl_core.dtype("int32"), _fl_core.dtype("fp32")):
          ("__fl_sincos_arg", _fl_core.dtype("int64"))}},
        is_pure=True, _semantic=_semantic)


@triton.jit
def _fl_sincos(x):
    # sin and cos of float32 values, never libdevice's (its sinf/cosf inline a
    # Payne-Hanek reduction per element: 0.3-0.5 s of Triton time for sin^2+cos^2);
    # <= 1.4 ulp over all floats
    q, r = _fl_cody_waite(x)
    p = _fl_sincos_arg(x, q, r)
    return _fl_sincos_poly((p >> 32).to(tl.int32), (p & 0xffffffff).to(tl.uint32).to(tl.float32, bitcast=True))
'''
TL_HELPERS = '''
@triton.jit
def _fl_to_bf16(x):
    # float32 -> bfloat16, rounded to nearest even in integer arithmetic: Triton's
    # interpreter truncates (-8.4784 became -8.4375 where eager gives -8.5)
    b = x.to(tl.float32).to(tl.uint32, bitcast=True)
    r = b + 0x7FFF + ((b >> 16) & 1)
    r = tl.where(x != x, b | 0x400000, r)
    return (r >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _fl_rcp_approx(x):
    return 1.0 / x


@triton.jit
def _fl_ex2_approx(x):
    return tl.exp2(x)


@triton.jit
def _fl_sincos(x):
    # sin and cos of float32 values, never libdevice's (its sinf/cosf inline a
    # Payne-Hanek reduction per element); <= 1.4 ulp over all floats. Blocks
    # holding |x| > 8192, inf or nan also take `_fl_reduce_large`.
    q, r = _fl_cody_waite(x)
    a = tl.abs(x)
    if tl.max(tl.where(a <= 8192.0, 0.0, 1.0)) > 0.0:
        qb, rb = _fl_reduce_large(a)
        q, r = _fl_take_large(x, a, q, r, qb, rb)
    return _fl_sincos_poly(q, r)
'''
# float32 floor, ceil and rsqrt as their one PTX instruction (see above); other dtypes
# keep the tl.* op, and so does every dtype in the portable form
_PTX_F32 = {"floor": "cvt.rmi.f32.f32", "ceil": "cvt.rpi.f32.f32", "rsqrt": "rsqrt.approx.f32"}
_ONE_OP_PTX = '''
@triton.jit
def _fl_{op}(x):
    if x.dtype == tl.float32:
        y = tl.inline_asm_elementwise("{asm} $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
    else:
        y = tl.{op}(x)
    return y
'''
_ONE_OP_TL = '''
@triton.jit
def _fl_{op}(x):
    return tl.{op}(x)
'''
NVPTX_MATH_LIB = str(Path(__file__).with_name("nvptx_math.ll"))
_link_filter: list = []


def install_link_filter() -> None:
    """Triton links every library of a kernel's `extern_libs` into it once the kernel
    declares any external function, and libdevice is always one of them: a kernel
    calling only nvptx_math.ll would pay for parsing libdevice (25-57 ms). Kernels
    compiled with nvptx_math.ll among their libraries (ours) link only the libraries
    they call: nvptx_math.ll where they declare a `__fl_` function, the others where
    they declare anything else. Every other kernel (Inductor's) links as Triton
    decides. Idempotent; where this Triton lacks the module API, linking is Triton's."""
    if _link_filter:
        return
    try:
        from triton._C.libtriton import llvm
    except ImportError:
        return
    link = llvm.link_extern_libs

    def link_needed(mod: Any, paths: list) -> Any:
        if NVPTX_MATH_LIB not in paths:
            return link(mod, paths)
        try:
            names = [f.name for f in mod.get_functions() if f.is_declaration()]
        except Exception:  # noqa: BLE001 - another Triton: link everything, as it would
            return link(mod, paths)
        ours = any(n.startswith("__fl_") for n in names)
        others = any(not n.startswith(("__fl_", "llvm.")) for n in names)
        keep = [p for p in paths if (ours if p == NVPTX_MATH_LIB else others)]
        return link(mod, keep) if keep else None

    llvm.link_extern_libs = link_needed
    _link_filter.append(link)


def uses_ptx(interpret: bool) -> bool:
    """Whether the prelude takes its NVIDIA form (inline PTX, nvptx_math.ll): torch's
    build says so where torch is loaded; a compile worker (no torch) asks Triton's
    target, which it was started with."""
    if interpret:
        return False
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.version.hip is None
    from triton.runtime import driver

    return driver.active.get_current_target().backend == "cuda"


def prelude_text(interpret: bool) -> str:
    if uses_ptx(interpret):
        helpers = PTX_HELPERS.format(lib=NVPTX_MATH_LIB) + "".join(
            _ONE_OP_PTX.format(op=op, asm=asm) for op, asm in _PTX_F32.items())
    else:
        helpers = TL_HELPERS + "".join(_ONE_OP_TL.format(op=op) for op in _PTX_F32)
    imp = "" if interpret else "from triton.language.extra import libdevice"
    return PRELUDE.format(libdevice_import=imp, target_helpers=helpers)


def compile_options(interpret: bool) -> dict:
    """Triton compile options the prelude needs: on NVIDIA, nvptx_math.ll linked like
    libdevice (only into kernels that call it)."""
    if not uses_ptx(interpret):
        return {}
    install_link_filter()
    return {"extern_libs": {"fuselens": NVPTX_MATH_LIB}}


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def prelude_file_name(prelude: str) -> str:
    return f"fl_prelude_{hashlib.sha256(prelude.encode()).hexdigest()[:32]}.py"


def prelude_header(prelude: str) -> str:
    """The first lines of a graph's module: Triton, then the prelude's names."""
    return ("import triton\nimport triton.language as tl\n"
            "from fuselens.compiler.runtime.triton_prelude import load_prelude as _fl_load_prelude\n\n"
            f"globals().update(_fl_load_prelude(__file__, {prelude_file_name(prelude)!r}))\n")


_preludes: dict[str, dict] = {}  # prelude file name (its text's hash) -> its names
_prelude_lock = threading.Lock()


def load_prelude(module_file: str, name: str) -> dict:
    """The names of the helper prelude `name` for a graph module at `module_file`:
    the prelude is a module of its own in the same directory, written by the first
    process that needs it (its name is its text's hash, so a reader finds it
    complete or writes it), imported once a process, wherever it was first found."""
    return _prelude_names(os.path.dirname(os.path.abspath(module_file)), name)


def warm_prelude() -> dict:
    """This process's prelude, loaded before any graph asks (compile workers)."""
    name = prelude_file_name(prelude_text(_interpreting()))
    # In the user's private cache, never a shared folder: another account that made
    # /tmp/fuselens_prelude_<uid> first used to get its module imported here.
    return _prelude_names(cache_dir("triton_prelude"), name)


def _prelude_names(directory: str, name: str) -> dict:
    with _prelude_lock:
        names = _preludes.get(name)
        if names is None:
            names = _preludes[name] = _import_prelude(directory, name)
    return names


def _import_prelude(directory: str, name: str) -> dict:
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        text = prelude_text(_interpreting())
        if prelude_file_name(text) != name:
            raise RuntimeError(f"a module in {directory} was generated for another Triton prelude than this "
                               f"process prints ({name}): a module of another fuselens or target")
        write_atomically(path, text)
    check_private_file(path)  # raises UnsafePathError for a file or folder another account can write
    mod_name = name[:-3]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod  # Triton reads helpers' sources and globals through their module
    spec.loader.exec_module(mod)
    return {k: v for k, v in vars(mod).items() if not k.startswith("__")}
