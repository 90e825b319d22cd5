// kiln CPU kernel prelude: pasted at the top of every generated C++ file.
// It includes no headers, so a kernel file compiles in a fraction of a second; the math comes
// from compiler builtins that lower to libm (or to inline instructions).
typedef long long kiln_i64;

static inline float kiln_inf_f() { return __builtin_inff(); }
static inline double kiln_inf_d() { return __builtin_inf(); }
static inline float kiln_nan_f() { return __builtin_nanf(""); }
static inline double kiln_nan_d() { return __builtin_nan(""); }

// libm, declared here rather than through <cmath> (headers cost compile time).
#define KILN_LIBM(fn) float fn##f(float); double fn(double);
extern "C" {
KILN_LIBM(exp) KILN_LIBM(exp2) KILN_LIBM(expm1) KILN_LIBM(log) KILN_LIBM(log2) KILN_LIBM(log1p)
KILN_LIBM(sin) KILN_LIBM(cos) KILN_LIBM(tan) KILN_LIBM(tanh) KILN_LIBM(erf)
}
#undef KILN_LIBM

#ifdef KILN_HAVE_MVEC
// With glibc's libmvec, transcendental functions vectorize. A vectorized loop runs its body
// through the SIMD version and its remainder through a scalar one, and the two round
// differently (libmvec's expf and libm's expf differ in the last bit for some inputs). A value
// that kiln recomputes in two loops (a softmax's max pass and its output pass) must be the
// same number both times, as eager's one stored tensor is: so every call, vector or scalar,
// goes through one libmvec entry point (the canonical width: 256-bit where AVX2 is there,
// else 128-bit). `kiln_mv_<fn>` is declared as a SIMD function whose clones, for each width
// the vectorizer may pick, are defined here over that entry point (split or padded), and whose
// scalar version runs it on a broadcast lane. f(x) is then a function of x alone.
typedef float kiln_v4sf __attribute__((vector_size(16)));
typedef float kiln_v8sf __attribute__((vector_size(32)));
typedef float kiln_v16sf __attribute__((vector_size(64)));
typedef double kiln_v2df __attribute__((vector_size(16)));
typedef double kiln_v4df __attribute__((vector_size(32)));
typedef double kiln_v8df __attribute__((vector_size(64)));
#ifdef __AVX2__
#define KILN_MV_F(fn) _ZGVdN8v_##fn##f
#define KILN_MV_D(fn) _ZGVdN4v_##fn
typedef kiln_v8sf kiln_mv_vf;
typedef kiln_v4df kiln_mv_vd;
#else
#define KILN_MV_F(fn) _ZGVbN4v_##fn##f
#define KILN_MV_D(fn) _ZGVbN2v_##fn
typedef kiln_v4sf kiln_mv_vf;
typedef kiln_v2df kiln_mv_vd;
#endif
#define KILN_MV_HIDDEN __attribute__((visibility("hidden")))
// One clone: N lanes of T in a VT, computed CW lanes at a time by the canonical entry point
// (a clone narrower than CW is padded with its first lane).
#define KILN_MV_CLONE(T, VT, N, CVT, CW, CANON, sym, cname)                                  \
  extern "C" KILN_MV_HIDDEN VT cname(VT x) __asm__(sym);                                       \
  extern "C" VT cname(VT x) {                                                                  \
    VT r;                                                                                      \
    for (int o = 0; o < N; o += CW) {                                                          \
      CVT c;                                                                                   \
      for (int i = 0; i < CW; ++i) c[i] = x[o + i < N ? o + i : 0];                            \
      c = CANON(c);                                                                            \
      for (int i = 0; i < CW && o + i < N; ++i) r[o + i] = c[i];                               \
    }                                                                                          \
    return r;                                                                                  \
  }
#define KILN_MV_CW_F ((int)(sizeof(kiln_mv_vf) / sizeof(float)))
#define KILN_MV_CW_D ((int)(sizeof(kiln_mv_vd) / sizeof(double)))
// The float and double clones of ISA letter L (the vector ABI's b, c, d, e), NF and ND lanes.
#define KILN_MV_CLONES_AT(L, VF, NF, VD, ND, fn)                                                          \
  KILN_MV_CLONE(float, VF, NF, kiln_mv_vf, KILN_MV_CW_F, KILN_MV_F(fn), "_ZGV" #L "N" #NF "v_kiln_mv_" #fn "f", \
                kiln_mv_##fn##f_##L)                                                                      \
  KILN_MV_CLONE(double, VD, ND, kiln_mv_vd, KILN_MV_CW_D, KILN_MV_D(fn), "_ZGV" #L "N" #ND "v_kiln_mv_" #fn,   \
                kiln_mv_##fn##_##L)
#ifdef __AVX512F__
#define KILN_MV_CLONES_E(fn) KILN_MV_CLONES_AT(e, kiln_v16sf, 16, kiln_v8df, 8, fn)
#else
#define KILN_MV_CLONES_E(fn)
#endif
#ifdef __AVX2__
#define KILN_MV_CLONES_D(fn) KILN_MV_CLONES_AT(d, kiln_v8sf, 8, kiln_v4df, 4, fn)
#else
#define KILN_MV_CLONES_D(fn)
#endif
#ifdef __AVX__
#define KILN_MV_CLONES_C(fn) KILN_MV_CLONES_AT(c, kiln_v8sf, 8, kiln_v4df, 4, fn)
#else
#define KILN_MV_CLONES_C(fn)
#endif
// Declared for every function (cheap); the scalar version and the clones are defined only
// for the functions a file uses (`KILN_MVEC_DEFINE`, written after this prelude by the code
// generator), since compiling them costs more than a small kernel does.
#define KILN_MVEC_DECLARE(fn)                                                                         \
  extern "C" kiln_mv_vf KILN_MV_F(fn)(kiln_mv_vf);                                                    \
  extern "C" kiln_mv_vd KILN_MV_D(fn)(kiln_mv_vd);                                                    \
  extern "C" __attribute__((simd("notinbranch"), const, nothrow)) KILN_MV_HIDDEN float kiln_mv_##fn##f(float); \
  extern "C" __attribute__((simd("notinbranch"), const, nothrow)) KILN_MV_HIDDEN double kiln_mv_##fn(double);
#define KILN_MVEC_DEFINE(fn)                                                                          \
  extern "C" KILN_MV_HIDDEN float kiln_mv_##fn##f_s(float x) __asm__("kiln_mv_" #fn "f");             \
  extern "C" float kiln_mv_##fn##f_s(float x) { kiln_mv_vf v = {}; v[0] = x; return KILN_MV_F(fn)(v)[0]; } \
  extern "C" KILN_MV_HIDDEN double kiln_mv_##fn##_s(double x) __asm__("kiln_mv_" #fn);                \
  extern "C" double kiln_mv_##fn##_s(double x) { kiln_mv_vd v = {}; v[0] = x; return KILN_MV_D(fn)(v)[0]; } \
  KILN_MV_CLONES_AT(b, kiln_v4sf, 4, kiln_v2df, 2, fn) KILN_MV_CLONES_C(fn) KILN_MV_CLONES_D(fn) KILN_MV_CLONES_E(fn)
KILN_MVEC_DECLARE(exp) KILN_MVEC_DECLARE(exp2) KILN_MVEC_DECLARE(expm1) KILN_MVEC_DECLARE(log)
KILN_MVEC_DECLARE(log2) KILN_MVEC_DECLARE(log1p) KILN_MVEC_DECLARE(sin) KILN_MVEC_DECLARE(cos)
KILN_MVEC_DECLARE(tan) KILN_MVEC_DECLARE(tanh) KILN_MVEC_DECLARE(erf)
#define KILN_M(fn) kiln_mv_##fn
#else
#define KILN_M(fn) fn
#define KILN_MVEC_DEFINE(fn)
#endif

#define KILN_UNARY_F(name, fexpr, dexpr) \
  static inline float name(float x) { return fexpr; } \
  static inline double name(double x) { return dexpr; }
KILN_UNARY_F(kiln_exp, KILN_M(expf)(x), KILN_M(exp)(x))
KILN_UNARY_F(kiln_exp2, KILN_M(exp2f)(x), KILN_M(exp2)(x))
KILN_UNARY_F(kiln_expm1, KILN_M(expm1f)(x), KILN_M(expm1)(x))
KILN_UNARY_F(kiln_log, KILN_M(logf)(x), KILN_M(log)(x))
KILN_UNARY_F(kiln_log2, KILN_M(log2f)(x), KILN_M(log2)(x))
KILN_UNARY_F(kiln_log1p, KILN_M(log1pf)(x), KILN_M(log1p)(x))
KILN_UNARY_F(kiln_sin, KILN_M(sinf)(x), KILN_M(sin)(x))
KILN_UNARY_F(kiln_cos, KILN_M(cosf)(x), KILN_M(cos)(x))
KILN_UNARY_F(kiln_tan, KILN_M(tanf)(x), KILN_M(tan)(x))
KILN_UNARY_F(kiln_tanh, KILN_M(tanhf)(x), KILN_M(tanh)(x))
KILN_UNARY_F(kiln_erf, KILN_M(erff)(x), KILN_M(erf)(x))
KILN_UNARY_F(kiln_sqrt, __builtin_sqrtf(x), __builtin_sqrt(x))
KILN_UNARY_F(kiln_rsqrt, 1.0f / __builtin_sqrtf(x), 1.0 / __builtin_sqrt(x))
KILN_UNARY_F(kiln_sigmoid, 1.0f / (1.0f + KILN_M(expf)(-x)), 1.0 / (1.0 + KILN_M(exp)(-x)))
KILN_UNARY_F(kiln_floor, __builtin_floorf(x), __builtin_floor(x))
KILN_UNARY_F(kiln_ceil, __builtin_ceilf(x), __builtin_ceil(x))
KILN_UNARY_F(kiln_trunc, __builtin_truncf(x), __builtin_trunc(x))
KILN_UNARY_F(kiln_abs, __builtin_fabsf(x), __builtin_fabs(x))
KILN_UNARY_F(kiln_reciprocal, 1.0f / x, 1.0 / x)
#undef KILN_UNARY_F

// A value cast to float16 / bfloat16 inside a fused kernel stays in a float register, yet
// must carry only the precision the narrow type has: round to nearest even, overflow to inf,
// float16's subnormals in steps of 2^-24. Bit arithmetic, so no header is needed.
static inline unsigned kiln_f2u(float x) { unsigned u; __builtin_memcpy(&u, &x, 4); return u; }
static inline float kiln_u2f(unsigned u) { float x; __builtin_memcpy(&x, &u, 4); return x; }
static inline unsigned kiln_mask(bool c) { return 0u - (unsigned)c; }  // all ones where c
static inline unsigned kiln_pick(bool c, unsigned a, unsigned b) { return (a & kiln_mask(c)) | (b & ~kiln_mask(c)); }
static inline float kiln_round_f16(float x) {
  // Selects through masks, not branches or ?: chains, which g++ leaves as control flow (the
  // loop then does not vectorize).
  unsigned u = kiln_f2u(x), sign = u & 0x80000000u, a = u ^ sign;
  unsigned normal = (a + 0xfffu + ((a >> 13) & 1u)) & ~0x1fffu;
  unsigned subnormal = kiln_f2u((kiln_u2f(a) + 0.5f) - 0.5f);  // 2^-24 is the ulp of 0.5
  unsigned r = kiln_pick(a >= 0x38800000u, normal, subnormal);
  r = kiln_pick(a >= 0x477ff000u, 0x7f800000u, r);  // past 65504 + half an ulp
  return kiln_u2f(kiln_pick(a >= 0x7f800000u, u, sign | r));  // inf, nan: as they are
}
static inline float kiln_round_bf16(float x) {
  unsigned u = kiln_f2u(x);
  return kiln_u2f(kiln_pick((u & 0x7fffffffu) > 0x7f800000u, u, (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u));  // nan as it is
}

// float16 / bfloat16 in memory. Kernels compute in float: a 16-bit buffer's element converts
// to float when read and rounds (to nearest even) when written. The conversions are selects
// over integer arithmetic, with no branch and no table, so loops over them vectorize.
static inline float kiln_f16_to_f32(unsigned short h) {
  unsigned sign = (unsigned)(h & 0x8000u) << 16, em = h & 0x7fffu;
  // The exponent is rebiased (15 -> 127) by a multiply, which also makes subnormals normal.
  unsigned finite = kiln_f2u(kiln_u2f(em << 13) * 0x1p112f);
  return kiln_u2f(sign | kiln_pick(em >= 0x7c00u, (em << 13) | 0x7f800000u, finite));
}
static inline unsigned short kiln_f32_to_f16(float x) {
  unsigned u = kiln_f2u(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  unsigned normal = (a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
  // Below 2^-14 the result is a multiple of 2^-24, the ulp of 0.5: the float add rounds there.
  unsigned subnormal = kiln_f2u(kiln_u2f(a) + 0.5f) - 0x3f000000u;
  unsigned r = kiln_pick(a >= 0x38800000u, normal, subnormal);
  r = kiln_pick(a >= 0x477ff000u, 0x7c00u, r);
  r = kiln_pick(a > 0x7f800000u, 0x7e00u, r);
  return (unsigned short)(sign | r);
}
static inline float kiln_bf16_to_f32(unsigned short h) { return kiln_u2f((unsigned)h << 16); }
static inline unsigned short kiln_f32_to_bf16(float x) {
  unsigned u = kiln_f2u(x);
  return (unsigned short)((u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// Buffer element types: kernels read and write `.bits` through the conversions above.
struct kiln_half { unsigned short bits; };
struct kiln_bf16 { unsigned short bits; };

// x converted to int32/int64 and back, as x86's conversion (what torch's CPU kernels run) gives
// it: truncated in range, the lowest integer for nan and out of range. Written out because g++
// (-fno-trapping-math) would fold (float)(long long)x into trunc(x), keeping -0.0, inf and nan;
// + 0 turns the -0.0 of trunc(-0.25) into the +0.0 the integer has.
#define KILN_THROUGH_INT(name, lo)                                                             \
  static inline float name(float x) { return (x >= (float)(lo) && x < -(float)(lo)) ? kiln_trunc(x) + 0.0f : (float)(lo); } \
  static inline double name(double x) { return (x >= (double)(lo) && x < -(double)(lo)) ? kiln_trunc(x) + 0.0 : (double)(lo); }
KILN_THROUGH_INT(kiln_through_int32, -2147483648.0)
KILN_THROUGH_INT(kiln_through_int64, -9223372036854775808.0)
#undef KILN_THROUGH_INT

// x converted to int32/int64 as x86's conversion gives it: the lowest integer for nan and out of
// range. A plain cast is undefined there, and g++ folds it where it knows x (to 0 for a nan made
// by a reduction's nan branch), while torch's kernels get the instruction's answer at run time.
#define KILN_TO_INT(name, T, lo)                                                               \
  static inline T name(float x) { return (x >= (float)(lo) && x < -(float)(lo)) ? (T)x : (T)(lo); } \
  static inline T name(double x) { return (x >= (double)(lo) && x < -(double)(lo)) ? (T)x : (T)(lo); }
KILN_TO_INT(kiln_to_int32, int, -2147483648.0)
KILN_TO_INT(kiln_to_int64, long long, -9223372036854775808.0)
#undef KILN_TO_INT

// Integer forms: rounding is the identity, abs and the rest as torch defines them.
template <typename T> static inline T kiln_floor(T x) { return x; }
template <typename T> static inline T kiln_ceil(T x) { return x; }
template <typename T> static inline T kiln_trunc(T x) { return x; }
template <typename T> static inline T kiln_abs(T x) { return x < 0 ? (T)-x : x; }
template <typename T> static inline T kiln_relu(T x) { return x < (T)0 ? (T)0 : x; }

// NaN-propagating max/min, as torch.maximum / amax.
// Ties keep a, as std::max / std::min do in torch's kernels (clamp(-0.0, min=0) is -0.0).
template <typename T> static inline T kiln_max(T a, T b) { return (a != a) ? a : ((b != b) ? b : (a < b ? b : a)); }
template <typename T> static inline T kiln_min(T a, T b) { return (a != a) ? a : ((b != b) ? b : (b < a ? b : a)); }

// Floor division and modulo of size expressions whose numerator may be negative (a slice
// length over a dynamic size): Python's semantics. Divisors are sizes, never zero.
static inline long long kiln_ifloordiv(long long a, long long b) {
  long long q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline long long kiln_imod(long long a, long long b) {
  long long r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

// Integer division by zero must not trap: the kernel records it and the executor raises
// torch's ZeroDivisionError after the call. One flag for the library: a graph compiled as
// several translation units defines it (and kiln_take_error) in the first, the others
// (KILN_SECONDARY_UNIT) refer to it.
extern "C" __attribute__((visibility("hidden"))) int kiln_error_flag;
#ifndef KILN_SECONDARY_UNIT
int kiln_error_flag = 0;
extern "C" int kiln_take_error() {
  int e = __atomic_exchange_n(&kiln_error_flag, 0, __ATOMIC_RELAXED);
  return e;
}
#endif
static inline void kiln_raise_div_by_zero() { __atomic_store_n(&kiln_error_flag, 1, __ATOMIC_RELAXED); }

// Python semantics: floor division and a remainder with the divisor's sign.
// INT_MIN / -1 traps on x86; torch wraps around (to INT_MIN), as negation does under -fwrapv.
template <typename T> static inline T kiln_floordiv(T a, T b) {
  if (b == 0) return kiln_raise_div_by_zero(), (T)0;
  if (b == (T)-1) return (T)-a;
  T q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? (T)(q - 1) : q;
}
template <typename T> static inline T kiln_truncdiv(T a, T b) {
  if (b == 0) return kiln_raise_div_by_zero(), (T)0;
  if (b == (T)-1) return (T)-a;
  return (T)(a / b);
}
// Floating floor division as torch computes it: from fmod, so that 1.0 // 0.1 is 9, not 10.
#define KILN_FLOORDIV_F(T, FMOD, FLOOR, COPYSIGN)                         \
  static inline T kiln_floordiv(T a, T b) {                              \
    if (b == 0) return a / b;                                            \
    T mod = FMOD(a, b);                                                  \
    T div = (a - mod) / b;                                               \
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;                    \
    if (div == 0) return COPYSIGN((T)0, a / b);                          \
    T fl = FLOOR(div);                                                   \
    if (div - fl > (T)0.5) fl += 1;                                      \
    return fl;                                                           \
  }
KILN_FLOORDIV_F(float, __builtin_fmodf, __builtin_floorf, __builtin_copysignf)
KILN_FLOORDIV_F(double, __builtin_fmod, __builtin_floor, __builtin_copysign)
#undef KILN_FLOORDIV_F
template <typename T> static inline T kiln_mod(T a, T b) {
  if (b == 0) return kiln_raise_div_by_zero(), (T)0;
  if (b == (T)-1) return (T)0;
  T r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r;
}
static inline float kiln_mod(float a, float b) {
  float r = __builtin_fmodf(a, b);
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline double kiln_mod(double a, double b) {
  double r = __builtin_fmod(a, b);
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"): the first word
// of the block at counter (counter, 0) under key `seed`, as a float in [0, 1) with 24 random bits.
static inline float kiln_rand(long long seed, long long counter) {
  unsigned int c0 = (unsigned int)counter, c1 = (unsigned int)((unsigned long long)counter >> 32), c2 = 0, c3 = 0;
  unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)((unsigned long long)seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const unsigned long long p0 = 0xD2511F53ull * c0, p1 = 0xCD9E8D57ull * c2;
    const unsigned int n0 = (unsigned int)(p1 >> 32) ^ c1 ^ k0, n2 = (unsigned int)(p0 >> 32) ^ c3 ^ k1;
    c1 = (unsigned int)p1;
    c3 = (unsigned int)p0;
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return (float)(c0 >> 8) * (1.0f / 16777216.0f);
}
static inline float kiln_pow(float a, float b) { return __builtin_powf(a, b); }
static inline double kiln_pow(double a, double b) { return __builtin_pow(a, b); }
// Integer powers as torch's: a negative exponent gives 1 for base 1, +-1 for base -1, else 0.
template <typename T> static inline T kiln_pow(T a, T b) {
  if (b < 0) return a == 1 ? (T)1 : a == -1 ? (T)((b & 1) ? -1 : 1) : (T)0;
  T r = 1;
  while (b > 0) {
    if (b & 1) r = (T)((unsigned long long)r * (unsigned long long)a);  // wraps, as torch's
    a = (T)((unsigned long long)a * (unsigned long long)a);
    b >>= 1;
  }
  return r;
}
