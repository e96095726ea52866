"""The C++ helpers every generated library starts with.

glibc's vector math (libmvec) is only used by g++ under -ffast-math, which
breaks NaN/inf semantics, so loops calling std::exp/std::sin are not vectorized
(checked with -fopt-info-vec on g++ 12). The float32 exp/log/sin/cos/tanh/erf
below are branch-free (selects only), so g++ vectorizes loops that call them:
exp and log are Cephes' polynomials (exp: max rel. error 7.4e-8 against glibc's
double exp over every 97th float, results below ~1.8e-38 flush to zero, checked by
tests/test_cpp_prelude_math.py); sin/cos reduce the argument in double
(accurate for |x| up to ~1e9); erf is Abramowitz-Stegun 7.1.26 (abs. error
1.5e-7, what ATen's own vectorized CPU erf uses). Float64 uses <cmath>.
"""

PRELUDE = r"""
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cfloat>
#include <limits>
#include <algorithm>

static inline float fl_i2f(int32_t i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline int32_t fl_f2i(float f) { int32_t i; std::memcpy(&i, &f, 4); return i; }

// bfloat16 is stored as its 16 bits and computed on as float (ATen's opmath). The
// conversions are c10's own (round to nearest even, NaN made quiet), branch-free so that
// g++ vectorizes the loops around them. (float16 stays in ATen on this target: g++ 12 does
// not vectorize _Float16 conversions; tests/compiler_failures.md P4.)
static inline float fl_from_bf16(uint16_t h) { return fl_i2f((int32_t)((uint32_t)h << 16)); }
static inline uint16_t fl_to_bf16(float f) {
  uint32_t u = (uint32_t)fl_f2i(f);
  uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (uint16_t)(f != f ? 0x7FC0u : r);
}
static inline float fl_round_bf16(float f) { return fl_from_bf16(fl_to_bf16(f)); }
static inline uint16_t fl_bits_bf16(float f) { return (uint16_t)((uint32_t)fl_f2i(f) >> 16); }  // f representable

#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define FL_FMAF(a, b, c) std::fma((a), (b), (c))
#else  // std::fma would be a libm call: keep the loop vectorizable
#define FL_FMAF(a, b, c) ((a) * (b) + (c))
#endif

// exp(xc) = p * 2^k: kf = 1.5 * 2^23 + k with k = round(xc / ln 2) in its low mantissa bits
// (one FMA, no round or convert instruction), p = exp(xc - k ln 2) from Cody-Waite reduction
// and Cephes' polynomial (Horner: 1 + r + r^2 P(r)), p in [0.7, 1.42]. Shared by the exps below.
static inline float fl_exp_kf(float xc) { return FL_FMAF(xc, 1.44269504088896341f, 12582912.0f); }
static inline float fl_exp_p(float xc, float kf) {
  float k = kf - 12582912.0f;
  float r = FL_FMAF(k, -0.693359375f, xc);
  r = FL_FMAF(k, 2.12194440e-4f, r);
  float p = 1.9875691500E-4f;
  p = FL_FMAF(p, r, 1.3981999507E-3f); p = FL_FMAF(p, r, 8.3334519073E-3f);
  p = FL_FMAF(p, r, 4.1665795894E-2f); p = FL_FMAF(p, r, 1.6666665459E-1f);
  p = FL_FMAF(p, r, 5.0000001201E-1f); p = FL_FMAF(p, r, 1.0f);
  return FL_FMAF(p, r, 1.0f);
}
// 2^(k + bias) as a float, from kf's bits.
static inline float fl_exp_scale(float kf, int32_t bias) {
  return fl_i2f((int32_t)(((uint32_t)fl_f2i(kf) + (uint32_t)(bias - 0x4B400000)) << 23));
}

static inline float fl_exp(float x) {
  // x is clamped to [-87, 89] on its bit pattern: an unsigned min caps negatives (and -inf,
  // negative NaNs), a signed min caps positives (+inf, positive NaNs). g++ turns float
  // selects into compare-and-blend sequences four times as long, and the clamp keeps k in
  // [-126, 128], where the scale 2^(k-1) is 0 (k = -126: results below exp(-86.99) ~ 1.8e-38
  // flush to zero; eager returns subnormals there, an absolute difference < 1.8e-38), a
  // normal float, or 2^127 (overflow to inf by the multiply). So the only select left
  // restores NaN. (p * 2) first: the product stays normal wherever the result is.
  // Softmax 2k x 2k kernel: 1.00 -> 0.84 ms against the select version, measured.
  uint32_t u = (uint32_t)fl_f2i(x);
  u = u < 0xC2AE0000u ? u : 0xC2AE0000u;  // -87.0f
  int32_t i = (int32_t)u;
  i = i < 0x42B20000 ? i : 0x42B20000;  // 89.0f
  float xc = fl_i2f(i);
  float kf = fl_exp_kf(xc);
  float res = (fl_exp_p(xc, kf) * 2.0f) * fl_exp_scale(kf, 126);
  return x != x ? x : res;
}
static inline double fl_exp(double x) { return std::exp(x); }

static inline float fl_log(float x) {
  bool sub = x < FLT_MIN;
  float xs = sub ? x * 8388608.0f : x;
  int32_t i = fl_f2i(xs);
  int32_t e = ((i >> 23) & 0xff) - 126 - (sub ? 23 : 0);
  float m = fl_i2f((i & 0x007fffff) | 0x3f000000);
  bool small = m < 0.707106781186547524f;
  e = small ? e - 1 : e;
  m = small ? m + m - 1.0f : m - 1.0f;
  float z = m * m;
  float y = 7.0376836292E-2f;
  y = y * m - 1.1514610310E-1f; y = y * m + 1.1676998740E-1f; y = y * m - 1.2420140846E-1f;
  y = y * m + 1.4249322787E-1f; y = y * m - 1.6668057665E-1f; y = y * m + 2.0000714765E-1f;
  y = y * m - 2.4999993993E-1f; y = y * m + 3.3333331174E-1f;
  y = y * m * z;
  float fe = (float)e;
  y = y + -2.12194440e-4f * fe;
  y = y + -0.5f * z;
  float r = m + y;
  r = r + 0.693359375f * fe;
  r = x == INFINITY ? x : r;
  r = x == 0.0f ? -INFINITY : r;
  return (x < 0.0f || x != x) ? NAN : r;
}
static inline double fl_log(double x) { return std::log(x); }

static inline float fl_sin_q(float x, int32_t shift) {
  double xd = x;
  double k = std::nearbyint(xd * 0.63661977236758134308);
  double rd = xd - k * 1.57079632679489655800e+00;
  rd = rd - k * 6.12323399573676603587e-17;
  float r = (float)rd;
  int32_t q = ((int32_t)(int64_t)k + shift) & 3;
  float z = r * r;
  float s = r + r * z * (-1.6666654611E-1f + z * (8.3321608736E-3f + z * -1.9515295891E-4f));
  float c = 1.0f - 0.5f * z + z * z * (4.166664568298827E-2f + z * (-1.388731625493765E-3f + z * 2.443315711809948E-5f));
  float res = (q & 1) ? c : s;
  res = (q & 2) ? -res : res;
  return (x - x) != 0.0f ? NAN : res;
}
static inline float fl_sin(float x) { return fl_sin_q(x, 0); }
static inline float fl_cos(float x) { return fl_sin_q(x, 1); }
static inline double fl_sin(double x) { return std::sin(x); }
static inline double fl_cos(double x) { return std::cos(x); }
// fl_sin_q's reduction is exact below 2^24 only (k * pi/2 in two double parts). Kernels
// note larger arguments in their vectorized loop and redo that block with these (glibc's
// double sin/cos reduce exactly over the whole range), see cpp.py's _trig_redo.
#define FL_TRIG_FAST_MAX 16777216.0f
static inline float fl_sin_exact(float x) { return (float)std::sin((double)x); }
static inline float fl_cos_exact(float x) { return (float)std::cos((double)x); }
static inline double fl_sin_exact(double x) { return std::sin(x); }
static inline double fl_cos_exact(double x) { return std::cos(x); }

static inline float fl_tanh(float x) {
  float a = std::fabs(x);
  float e = fl_exp(2.0f * (a < 44.0f ? a : 44.0f));
  float big = 1.0f - 2.0f / (e + 1.0f);
  float z = x * x;
  float p = -5.70498872745E-3f;
  p = p * z + 2.06390887954E-2f; p = p * z - 5.37397155531E-2f;
  p = p * z + 1.33314422036E-1f; p = p * z - 3.33332819422E-1f;
  float small = x + x * z * p;
  float r = a < 0.625f ? small : std::copysign(big, x);
  return x != x ? x : r;
}
static inline double fl_tanh(double x) { return std::tanh(x); }

// exp(x) for x <= 0 only (erf's exp(-x*x)): one exponent scale, no NaN/overflow
// selects; results below FLT_MIN flush to 0, which erf cannot show (1 - tiny).
// ~15% faster GELU than fl_exp there (8M elements, 2 threads, measured).
static inline float fl_exp_nonpos(float x) {
  float xc = x < -87.0f ? -87.0f : x;
  float kf = fl_exp_kf(xc);
  return fl_exp_p(xc, kf) * fl_exp_scale(kf, 127);
}

static inline float fl_erf(float x) {
  float a = std::fabs(x);
  float t = 1.0f / (1.0f + 0.3275911f * a);
  float y = (((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f;
  y = 1.0f - y * t * fl_exp_nonpos(-a * a);
  return x != x ? x : std::copysign(y, x);
}
static inline double fl_erf(double x) { return std::erf(x); }

template <typename T> static inline T fl_sigmoid(T x) { return T(1) / (T(1) + fl_exp(-x)); }

template <typename T> static inline T fl_maximum(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) return (a != a || b != b) ? std::numeric_limits<T>::quiet_NaN() : (a > b ? a : b);
  else return a > b ? a : b;
}
template <typename T> static inline T fl_minimum(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) return (a != a || b != b) ? std::numeric_limits<T>::quiet_NaN() : (a < b ? a : b);
  else return a < b ? a : b;
}
// Index clamps (padding, pooling windows, gathers) take int64 by value: std::min and
// std::max take references, and inside an `omp simd` loop g++ 12 then keeps each
// argument in a per-lane array, which stops the loop's vectorization (ResNet-50's max-pool
// over a 3x3 window: 1.5 ms scalar, 0.5 ms vectorized).
static inline int64_t fl_imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t fl_imax(int64_t a, int64_t b) { return a > b ? a : b; }
template <typename T> static inline T fl_floordiv(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) {
    if (b == 0) return a / b;
    T mod = std::fmod(a, b);
    T div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= T(1);
    T fl;
    if (div != 0) { fl = std::floor(div); if (div - fl > T(0.5)) fl += T(1); }
    else fl = std::copysign(T(0), a / b);
    return fl;
  } else {
    if (b == 0) return 0;
    T q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
    return q;
  }
}
template <typename T> static inline T fl_truncdiv(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) return std::trunc(a / b);
  else return b == 0 ? T(0) : T(a / b);
}
template <typename T> static inline T fl_remainder(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) {
    T r = std::fmod(a, b);
    return (r != 0 && ((b < 0) != (r < 0))) ? r + b : r;
  } else {
    if (b == 0) return 0;
    T r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? T(r + b) : r;
  }
}
template <typename T> static inline T fl_fmod(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) return std::fmod(a, b);
  else return b == 0 ? T(0) : T(a % b);
}
template <typename T> static inline T fl_pow(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) return std::pow(a, b);
  else {
    if (b < 0) return a == 1 ? T(1) : (a == -1 ? ((b & 1) ? T(-1) : T(1)) : T(0));
    T r = 1;
    while (b) { if (b & 1) r = T(r * a); a = T(a * a); b >>= 1; }
    return r;
  }
}
template <typename T> static inline T fl_sign(T x) {
  if constexpr (std::is_floating_point<T>::value) return x != x ? x : T((x > 0) - (x < 0));
  else if constexpr (std::is_same<T, bool>::value) return x;
  else return T((x > 0) - (x < 0));
}
template <typename T> static inline T fl_relu(T x) {
  if constexpr (std::is_same<T, bool>::value) return x;
  else return (x != x) ? x : (x > T(0) ? x : T(0));
}
template <typename T> static inline T fl_abs(T x) {
  if constexpr (std::is_floating_point<T>::value) return std::fabs(x);
  else if constexpr (std::is_same<T, bool>::value || std::is_unsigned<T>::value) return x;
  else return T(x < 0 ? -x : x);
}
template <typename T> static inline T fl_shl(T a, T b) {
  return (b < 0 || b >= T(sizeof(T) * 8)) ? T(0) : T(a << b);
}
template <typename T> static inline T fl_shr(T a, T b) {
  if constexpr (std::is_signed<T>::value) return (b < 0 || b >= T(sizeof(T) * 8)) ? T(a < 0 ? -1 : 0) : T(a >> b);
  else return (b >= T(sizeof(T) * 8)) ? T(0) : T(a >> b);
}
template <typename T> static inline T fl_frac(T x) { return x - std::trunc(x); }

// Philox4x32-10 at counter (offset lo, offset hi, 0, 0) and key (seed lo, seed hi): Triton's
// tl.rand / tl.randn bit for bit (the uniform), so both targets draw the same numbers
// (compiler/random_ops.py). Branch-free, so loops calling it vectorize.
struct fl_philox_words { uint32_t c0, c1; };
static inline fl_philox_words fl_philox(int64_t seed, int64_t offset) {
  uint32_t c0 = (uint32_t)offset, c1 = (uint32_t)((uint64_t)offset >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)((uint64_t)seed >> 32);
  for (int r = 0; r < 10; ++r) {
    uint64_t pb = (uint64_t)0xCD9E8D57u * c2, pa = (uint64_t)0xD2511F53u * c0;
    c0 = (uint32_t)(pb >> 32) ^ c1 ^ k0;
    c2 = (uint32_t)(pa >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)pb;
    c3 = (uint32_t)pa;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {c0, c1};
}
static inline float fl_uniform_bits(uint32_t w) {
  int32_t x = (int32_t)w;
  return (float)(x < 0 ? ~x : x) * 4.6566127342e-10f;
}
static inline float fl_rand(int64_t seed, int64_t offset) { return fl_uniform_bits(fl_philox(seed, offset).c0); }
static inline float fl_randn(int64_t seed, int64_t offset) {
  fl_philox_words w = fl_philox(seed, offset);
  float u1 = std::max(1.0e-7f, fl_uniform_bits(w.c0));
  float th = 6.283185307179586f * fl_uniform_bits(w.c1);
  return std::sqrt(-2.0f * fl_log(u1)) * fl_cos(th);
}
"""
