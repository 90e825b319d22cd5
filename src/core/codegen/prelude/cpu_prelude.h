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

// Vector math: glibc's libmvec (KILN_HAVE_MVEC), else torch's Sleef (KILN_SLEEF, on AVX2
// machines: the functions eager's kernels call, reached through a table of pointers the runtime
// hands each loaded library), else kiln's own float functions below (compile/cpu_compiler.h).
#if defined(KILN_HAVE_MVEC)
#define KILN_VECTOR_MATH 2
#elif defined(KILN_SLEEF) && defined(__AVX2__)
#define KILN_VECTOR_MATH 1
#endif
#ifdef KILN_VECTOR_MATH
// With a vector library, transcendental functions vectorize. A vectorized loop runs its body
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
#if KILN_VECTOR_MATH == 1
// The table holds the 256-bit functions (float, then double) and, where torch exports them
// (KILN_SLEEF_512), the 512-bit ones after them: on an AVX-512 machine, whose loops GCC's generic
// tuning vectorizes 16 floats wide, one call does a vector's work instead of two.
#if defined(__AVX512F__) && defined(KILN_SLEEF_512)
typedef kiln_v16sf kiln_mv_vf;
typedef kiln_v8df kiln_mv_vd;
#define KILN_SLEEF_WIDTHS 4
#define KILN_SLEEF_BASE (2 * kiln_sleef_count)
#else
typedef kiln_v8sf kiln_mv_vf;
typedef kiln_v4df kiln_mv_vd;
#define KILN_SLEEF_WIDTHS 2
#define KILN_SLEEF_BASE 0
#endif
enum { kiln_sleef_exp, kiln_sleef_exp2, kiln_sleef_expm1, kiln_sleef_log, kiln_sleef_log2, kiln_sleef_log1p,
       kiln_sleef_sin, kiln_sleef_cos, kiln_sleef_tan, kiln_sleef_tanh, kiln_sleef_erf, kiln_sleef_count };
// Float functions, then double ones; one table for the library (as kiln_error_flag below).
extern "C" __attribute__((visibility("hidden"))) void* kiln_sleef[KILN_SLEEF_WIDTHS * kiln_sleef_count];
#ifndef KILN_SECONDARY_UNIT
void* kiln_sleef[KILN_SLEEF_WIDTHS * kiln_sleef_count];
extern "C" void kiln_set_sleef(void* const* t) {
  for (int i = 0; i < KILN_SLEEF_WIDTHS * kiln_sleef_count; ++i) kiln_sleef[i] = t[i];
}
#endif
#define KILN_MV_F(fn) ((kiln_mv_vf(*)(kiln_mv_vf))kiln_sleef[KILN_SLEEF_BASE + kiln_sleef_##fn])
#define KILN_MV_D(fn) ((kiln_mv_vd(*)(kiln_mv_vd))kiln_sleef[KILN_SLEEF_BASE + kiln_sleef_count + kiln_sleef_##fn])
#define KILN_MV_DECLARE_CANON(fn)
#elif defined(__AVX512F__) && defined(KILN_HAVE_MVEC_512)
// AVX-512: GCC's generic tuning vectorizes 16 floats wide, so the 512-bit functions are the
// canonical ones (an 8-lane canonical made every 16-lane call two calls and a shuffle). All but
// float erf: glibc 2.39's 512-bit erff is up to 3 ULPs off near |x| = 3.67, where its 256-bit
// one keeps the bound (tests/python/test_vector_math.py), so erff runs as two 8-lane halves.
#define KILN_MV_F(fn) KILN_MV512_F_##fn
#define KILN_MV_D(fn) _ZGVeN8v_##fn
#define KILN_MV512_F_exp _ZGVeN16v_expf
#define KILN_MV512_F_exp2 _ZGVeN16v_exp2f
#define KILN_MV512_F_expm1 _ZGVeN16v_expm1f
#define KILN_MV512_F_log _ZGVeN16v_logf
#define KILN_MV512_F_log2 _ZGVeN16v_log2f
#define KILN_MV512_F_log1p _ZGVeN16v_log1pf
#define KILN_MV512_F_sin _ZGVeN16v_sinf
#define KILN_MV512_F_cos _ZGVeN16v_cosf
#define KILN_MV512_F_tan _ZGVeN16v_tanf
#define KILN_MV512_F_tanh _ZGVeN16v_tanhf
#define KILN_MV512_F_erf kiln_mv512_erff
typedef kiln_v16sf kiln_mv_vf;
typedef kiln_v8df kiln_mv_vd;
extern "C" kiln_v8sf _ZGVdN8v_erff(kiln_v8sf);
static inline kiln_v16sf kiln_mv512_erff(kiln_v16sf x) {
  kiln_v8sf lo, hi;
  for (int i = 0; i < 8; ++i) lo[i] = x[i], hi[i] = x[i + 8];
  lo = _ZGVdN8v_erff(lo);
  hi = _ZGVdN8v_erff(hi);
  kiln_v16sf r;
  for (int i = 0; i < 8; ++i) r[i] = lo[i], r[i + 8] = hi[i];
  return r;
}
#define KILN_MV_DECLARE_CANON(fn) extern "C" kiln_v16sf _ZGVeN16v_##fn##f(kiln_v16sf); extern "C" kiln_v8df _ZGVeN8v_##fn(kiln_v8df);
#elif defined(__AVX2__)
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
#ifndef KILN_MV_DECLARE_CANON
#define KILN_MV_DECLARE_CANON(fn) extern "C" kiln_mv_vf KILN_MV_F(fn)(kiln_mv_vf); extern "C" kiln_mv_vd KILN_MV_D(fn)(kiln_mv_vd);
#endif
#define KILN_MVEC_DECLARE(fn)                                                                         \
  KILN_MV_DECLARE_CANON(fn)                                                                           \
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

// Without a vector library: kiln's own float32 exp, expm1, exp2, log, log2, log1p, tanh, erf
// and sigmoid (float16 and bfloat16 compute through them too). Each is computed in double from
// branch-free code, so a loop over it vectorizes on any x86 machine, and rounds once to float: the result is the correctly rounded one but for a double's error of about 1e-12 of
// a float ulp (within 1 ulp of Sleef's, which eager runs). Plain multiplies and adds, no fma:
// the vector and the scalar remainder of a loop compute the same number.
static inline double kiln_d_of_bits(long long b) { double d; __builtin_memcpy(&d, &b, 8); return d; }
static inline long long kiln_bits_of_d(double d) { long long b; __builtin_memcpy(&b, &d, 8); return b; }
// e^x for |x| <= 150 (float arguments, clamped there): x = n ln2 + r with |r| <= ln2/2 (n by the
// 1.5 * 2^52 shift, whose low mantissa bits then hold n), e^r by its Taylor series to r^9
// (error below 1e-11), times 2^n through the exponent bits.
static inline double kiln_exp_core(double x) {
  const double shift = 0x1.8p52;
  double t = x * 0x1.71547652b82fep0 + shift;
  double n = t - shift;
  double r = (x - n * 0x1.62e42feep-1) - n * 0x1.a39ef35793c76p-33;  // ln2 split: n * hi is exact
  double p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 + r * (1.0 / 720 +
             r * (1.0 / 5040 + r * (1.0 / 40320 + r * (1.0 / 362880)))))))));
  return kiln_d_of_bits(kiln_bits_of_d(p) + (long long)((unsigned long long)kiln_bits_of_d(t) << 52));
}
static inline double kiln_clamp150(double x) { return x > 150.0 ? 150.0 : (x < -150.0 ? -150.0 : x); }
// e^x - 1 for |x| <= 150, accurate near 0 (Taylor to x^10 below 1/4).
static inline double kiln_expm1_core(double x) {
  double small = x * (1.0 + x * (0.5 + x * (1.0 / 6 + x * (1.0 / 24 + x * (1.0 / 120 + x * (1.0 / 720 +
                 x * (1.0 / 5040 + x * (1.0 / 40320 + x * (1.0 / 362880 + x * (1.0 / 3628800))))))))));
  double a = x < 0 ? -x : x;
  return a < 0.25 ? small : kiln_exp_core(x) - 1.0;
}
// log(x) for a positive finite double: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) as
// 2 atanh(s), s = (m - 1)/(m + 1), |s| < 0.172, to s^17. e reaches a double through the
// 2^52 trick (no int64 -> double conversion, which AVX2 lacks).
static inline double kiln_log_core(double x) {
  long long b = kiln_bits_of_d(x);
  double m = kiln_d_of_bits((b & 0x000fffffffffffffLL) | 0x3ff0000000000000LL);
  double e = kiln_d_of_bits(((b >> 52) & 0x7ff) | 0x4330000000000000LL) - 0x1p52 - 1023.0;
  bool big = m > 0x1.6a09e667f3bcdp0;
  m = big ? m * 0.5 : m;
  e = big ? e + 1.0 : e;
  double s = (m - 1.0) / (m + 1.0), s2 = s * s;
  double q = 1.0 + s2 * (1.0 / 3 + s2 * (1.0 / 5 + s2 * (1.0 / 7 + s2 * (1.0 / 9 + s2 * (1.0 / 11 + s2 * (1.0 / 13 +
             s2 * (1.0 / 15 + s2 * (1.0 / 17))))))));
  return e * 0x1.62e42fefa39efp-1 + 2.0 * s * q;
}
// log of a float's value with IEEE's special cases (nan below 0, -inf at 0, inf at inf).
static inline float kiln_log_special(float x, double r) {
  return x != x ? x : (x < 0.0f ? __builtin_nanf("") : (x == 0.0f ? -__builtin_inff() : (x == __builtin_inff() ? x : (float)r)));
}
static inline float kiln_f_exp(float x) { return x != x ? x : (float)kiln_exp_core(kiln_clamp150(x)); }
static inline float kiln_f_exp2(float x) { return x != x ? x : (float)kiln_exp_core(kiln_clamp150((double)x * 0x1.62e42fefa39efp-1)); }
static inline float kiln_f_expm1(float x) { return x != x ? x : (float)kiln_expm1_core(kiln_clamp150(x)); }
static inline float kiln_f_log(float x) {
  double d = x > 0.0f ? (double)x : 1.0;
  return kiln_log_special(x, kiln_log_core(d));
}
static inline float kiln_f_log2(float x) {
  double d = x > 0.0f ? (double)x : 1.0;
  return kiln_log_special(x, kiln_log_core(d) * 0x1.71547652b82fep0);
}
static inline float kiln_f_log1p(float x) {
  double d = x, a = d < 0 ? -d : d;
  double small = d * (1.0 - d * (0.5 - d * (1.0 / 3 - d * 0.25)));  // |x| < 1e-5: to x^4
  double u = x > -1.0f ? 1.0 + d : 1.0;
  double r = a < 1e-5 ? small : kiln_log_core(u == __builtin_inf() ? 1.0 : u);
  return x != x ? x : (x < -1.0f ? __builtin_nanf("") : (x == -1.0f ? -__builtin_inff() : (x == __builtin_inff() ? x : (float)r)));
}
// tanh(x) = t / (t + 2), t = e^(2x) - 1; 1 in float past |x| = 9.1.
static inline float kiln_f_tanh(float x) {
  double d = x > 20.0f ? 20.0 : (x < -20.0f ? -20.0 : (double)x);
  double t = kiln_expm1_core(2.0 * d);
  return x != x ? x : (float)(t / (t + 2.0));
}
static inline float kiln_f_sigmoid(float x) { return x != x ? x : (float)(1.0 / (1.0 + kiln_exp_core(kiln_clamp150(-(double)x)))); }
// erf: below 1, x times its Taylor series in x^2 (to x^31, error below 1e-13); from 1 on,
// 1 - e^(-x^2) g(x) with g(x) = erfc(x) e^(x^2) as a degree-16 polynomial in (x - 2.5)/1.5,
// fitted on [1, 4] (relative error 7e-12). Past 4 the float result is 1.
static inline float kiln_f_erf(float x) {
  double d = x, a = d < 0 ? -d : d, z = d * d;
  double small = d * (0x1.20dd750429b6dp+0 + z * (-0x1.812746b0379e7p-2 + z * (0x1.ce2f21a042be2p-4 + z * (-0x1.b82ce31288b51p-6 +
                 z * (0x1.565bcd0e6a53fp-8 + z * (-0x1.c02db40040b86p-11 + z * (0x1.f9a326f9b89b7p-14 + z * (-0x1.f4d25c3e0c2ebp-17 +
                 z * (0x1.b9e6c9dc651a3p-20 + z * (-0x1.5f742ec43e71ap-23 + z * (0x1.fcc5720624c1cp-27 + z * (-0x1.51d7181c5d36dp-30 +
                 z * (0x1.9e6ad5e55a730p-34 + z * (-0x1.d8453cb0c46eap-38 + z * (0x1.f683ae4a97007p-42 + z * -0x1.f56f071a885cfp-46)))))))))))))));
  double c = a > 4.0 ? 4.0 : (a < 1.0 ? 1.0 : a);
  double u = (c - 2.5) * (1.0 / 1.5);
  double g = 0x1.afbb3f3b74e1ap-3 + u * (-0x1.c8ca43e6defbfp-4 + u * (0x1.cba83bc5cef02p-5 + u * (-0x1.ba746d74a108dp-6 +
             u * (0x1.994077dca7b93p-7 + u * (-0x1.6d14bbc0b9f4ep-8 + u * (0x1.3b0cc3fd8e3a7p-9 + u * (-0x1.07b15b2b7d3e9p-10 +
             u * (0x1.acffbb216246cp-12 + u * (-0x1.533c6ab904985p-13 + u * (0x1.05fee2786847cp-14 + u * (-0x1.93dfcbc73d33dp-16 +
             u * (0x1.2aa9f23f95f77p-17 + u * (-0x1.66489deb43f50p-19 + u * (0x1.f5ca031f2c5dep-21 + u * (-0x1.55fce53c38f43p-21 +
             u * 0x1.d7907eace176fp-23)))))))))))))));
  double large = 1.0 - kiln_exp_core(-c * c) * g;
  large = d < 0 ? -large : large;
  return x != x ? x : (float)(a < 1.0 ? small : large);
}

#ifdef KILN_VECTOR_MATH
#define KILN_OWN_OR_M(fn) KILN_M(fn##f)(x)
#define KILN_SIGMOID_F 1.0f / (1.0f + KILN_M(expf)(-x))
#else
#define KILN_OWN_OR_M(fn) kiln_f_##fn(x)
#define KILN_SIGMOID_F kiln_f_sigmoid(x)
#endif
#define KILN_UNARY_F(name, fexpr, dexpr) \
  static inline float name(float x) { return fexpr; } \
  static inline double name(double x) { return dexpr; }
KILN_UNARY_F(kiln_exp, KILN_OWN_OR_M(exp), KILN_M(exp)(x))
KILN_UNARY_F(kiln_exp2, KILN_OWN_OR_M(exp2), KILN_M(exp2)(x))
KILN_UNARY_F(kiln_expm1, KILN_OWN_OR_M(expm1), KILN_M(expm1)(x))
KILN_UNARY_F(kiln_log, KILN_OWN_OR_M(log), KILN_M(log)(x))
KILN_UNARY_F(kiln_log2, KILN_OWN_OR_M(log2), KILN_M(log2)(x))
KILN_UNARY_F(kiln_log1p, KILN_OWN_OR_M(log1p), KILN_M(log1p)(x))
KILN_UNARY_F(kiln_sin, KILN_M(sinf)(x), KILN_M(sin)(x))
KILN_UNARY_F(kiln_cos, KILN_M(cosf)(x), KILN_M(cos)(x))
KILN_UNARY_F(kiln_tan, KILN_M(tanf)(x), KILN_M(tan)(x))
KILN_UNARY_F(kiln_tanh, KILN_OWN_OR_M(tanh), KILN_M(tanh)(x))
KILN_UNARY_F(kiln_erf, KILN_OWN_OR_M(erf), KILN_M(erf)(x))
KILN_UNARY_F(kiln_sqrt, __builtin_sqrtf(x), __builtin_sqrt(x))
KILN_UNARY_F(kiln_rsqrt, 1.0f / __builtin_sqrtf(x), 1.0 / __builtin_sqrt(x))
KILN_UNARY_F(kiln_sigmoid, KILN_SIGMOID_F, 1.0 / (1.0 + KILN_M(exp)(-x)))
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

// c ? a : b as a bit blend, which g++ vectorizes where a ?: over a vector math call's result
// stays a branch (scalar_emitter's floating selects).
static inline float kiln_select(bool c, float a, float b) { return kiln_u2f(kiln_pick(c, kiln_f2u(a), kiln_f2u(b))); }
static inline double kiln_select(bool c, double a, double b) {
  unsigned long long m = 0ULL - (unsigned long long)c, ua, ub;
  __builtin_memcpy(&ua, &a, 8);
  __builtin_memcpy(&ub, &b, 8);
  unsigned long long r = (ua & m) | (ub & ~m);
  double d;
  __builtin_memcpy(&d, &r, 8);
  return d;
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
