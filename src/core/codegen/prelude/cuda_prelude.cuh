// kiln CUDA kernel prelude: pasted at the top of every generated .cu source compiled by NVRTC.
// Self-contained (NVRTC sees no system headers): math comes from CUDA's device builtins.
typedef long long kiln_i64;

__device__ __forceinline__ float kiln_inf_f() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ double kiln_inf_d() { return __longlong_as_double(0x7ff0000000000000LL); }
__device__ __forceinline__ float kiln_nan_f() { return __int_as_float(0x7fffffff); }
__device__ __forceinline__ double kiln_nan_d() { return __longlong_as_double(0x7fffffffffffffffLL); }

#define KILN_UNARY_F(name, fexpr, dexpr) \
  __device__ __forceinline__ float name(float x) { return fexpr; } \
  __device__ __forceinline__ double name(double x) { return dexpr; }
KILN_UNARY_F(kiln_exp, expf(x), exp(x))
KILN_UNARY_F(kiln_exp2, exp2f(x), exp2(x))
KILN_UNARY_F(kiln_expm1, expm1f(x), expm1(x))
KILN_UNARY_F(kiln_log, logf(x), log(x))
KILN_UNARY_F(kiln_log2, log2f(x), log2(x))
KILN_UNARY_F(kiln_log1p, log1pf(x), log1p(x))
KILN_UNARY_F(kiln_sin, sinf(x), sin(x))
KILN_UNARY_F(kiln_cos, cosf(x), cos(x))
KILN_UNARY_F(kiln_tan, tanf(x), tan(x))
KILN_UNARY_F(kiln_tanh, tanhf(x), tanh(x))
KILN_UNARY_F(kiln_erf, erff(x), erf(x))
KILN_UNARY_F(kiln_sqrt, sqrtf(x), sqrt(x))
KILN_UNARY_F(kiln_rsqrt, rsqrtf(x), rsqrt(x))
KILN_UNARY_F(kiln_sigmoid, 1.0f / (1.0f + expf(-x)), 1.0 / (1.0 + exp(-x)))
KILN_UNARY_F(kiln_floor, floorf(x), floor(x))
KILN_UNARY_F(kiln_ceil, ceilf(x), ceil(x))
KILN_UNARY_F(kiln_trunc, truncf(x), trunc(x))
KILN_UNARY_F(kiln_abs, fabsf(x), fabs(x))
KILN_UNARY_F(kiln_reciprocal, 1.0f / x, 1.0 / x)
#undef KILN_UNARY_F

// float16 / bfloat16 in memory; kernels compute in float. An element converts to float when
// read and rounds to nearest even when written, with the GPU's conversion instructions (no
// cuda_fp16.h: NVRTC sees no headers). Kernels read and write a buffer element's `.bits`.
struct kiln_half { unsigned short bits; };
struct kiln_bf16 { unsigned short bits; };
__device__ __forceinline__ float kiln_f16_to_f32(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ unsigned short kiln_f32_to_f16(float x) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}
__device__ __forceinline__ float kiln_bf16_to_f32(unsigned short h) { return __uint_as_float((unsigned)h << 16); }
// Through the packing conversion (cvt.rn.bf16x2.f32, F2FP in SASS) with a zero beside x, as
// ptxas already does for float16: the single-value cvt.rn.bf16.f32 becomes F2F, a slow
// conversion instruction (bf16 tanh-GELU, nine roundings an element: 45.4 -> 29.7 us over 16M
// elements on an H100). Rounding is the same: nearest even.
__device__ __forceinline__ unsigned kiln_f32_to_bf16x2(float hi, float lo) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ unsigned short kiln_f32_to_bf16(float x) {
#if __CUDA_ARCH__ >= 800
  return (unsigned short)kiln_f32_to_bf16x2(0.0f, x);
#else
  unsigned u = __float_as_uint(x);
  return (unsigned short)((u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}

// Casts to float16 / bfloat16 fused into a kernel: the value stays a float but is rounded to
// the narrow type's precision (nearest even, overflow to inf, float16 subnormals): a round trip
// through the conversion instructions, two instructions where the bit arithmetic took ten.
__device__ __forceinline__ float kiln_round_f16(float x) { return kiln_f16_to_f32(kiln_f32_to_f16(x)); }
__device__ __forceinline__ float kiln_round_bf16(float x) {
#if __CUDA_ARCH__ >= 800
  return __uint_as_float(kiln_f32_to_bf16x2(x, 0.0f));  // x's bfloat16 in the high half: its float bits
#else
  return kiln_bf16_to_f32(kiln_f32_to_bf16(x));
#endif
}

template <typename T> __device__ __forceinline__ T kiln_floor(T x) { return x; }
template <typename T> __device__ __forceinline__ T kiln_ceil(T x) { return x; }
// x converted to int32/int64 and back, as the GPU's conversion does it (saturating; nan is 0).
__device__ __forceinline__ float kiln_through_int32(float x) { return (float)(int)x; }
__device__ __forceinline__ double kiln_through_int32(double x) { return (double)(int)x; }
__device__ __forceinline__ float kiln_through_int64(float x) { return (float)(long long)x; }
__device__ __forceinline__ double kiln_through_int64(double x) { return (double)(long long)x; }
// x converted to int32/int64 as the GPU's conversion does it (what torch's CUDA kernels give).
__device__ __forceinline__ int kiln_to_int32(float x) { return (int)x; }
__device__ __forceinline__ int kiln_to_int32(double x) { return (int)x; }
__device__ __forceinline__ long long kiln_to_int64(float x) { return (long long)x; }
__device__ __forceinline__ long long kiln_to_int64(double x) { return (long long)x; }
template <typename T> __device__ __forceinline__ T kiln_trunc(T x) { return x; }
template <typename T> __device__ __forceinline__ T kiln_abs(T x) { return x < 0 ? (T)-x : x; }
template <typename T> __device__ __forceinline__ T kiln_relu(T x) { return x < (T)0 ? (T)0 : x; }
// Ties keep a, as std::max / std::min do in torch's kernels (clamp(-0.0, min=0) is -0.0).
// Floor division and modulo of size expressions whose numerator may be negative (a slice
// length over a dynamic size): Python's semantics. Divisors are sizes, never zero.
__device__ __forceinline__ long long kiln_ifloordiv(long long a, long long b) {
  long long q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
__device__ __forceinline__ long long kiln_imod(long long a, long long b) {
  long long r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
template <typename T> __device__ __forceinline__ T kiln_select(bool c, T a, T b) { return c ? a : b; }
template <typename T> __device__ __forceinline__ T kiln_max(T a, T b) { return (a != a) ? a : ((b != b) ? b : (a < b ? b : a)); }
template <typename T> __device__ __forceinline__ T kiln_min(T a, T b) { return (a != a) ? a : ((b != b) ? b : (b < a ? b : a)); }
// Integer division by zero does not trap on the GPU; like torch's CUDA kernels, kiln's give
// an unspecified value there.
// INT_MIN / -1 overflows; torch wraps around (to INT_MIN).
template <typename T> __device__ __forceinline__ T kiln_floordiv(T a, T b) {
  if (b == 0) return (T)-1;
  if (b == (T)-1) return (T)(0 - (unsigned long long)a);
  T q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? (T)(q - 1) : q;
}
template <typename T> __device__ __forceinline__ T kiln_truncdiv(T a, T b) {
  return b == 0 ? (T)-1 : b == (T)-1 ? (T)(0 - (unsigned long long)a) : (T)(a / b);
}
// Floating floor division as torch computes it: from fmod, so that 1.0 // 0.1 is 9, not 10.
#define KILN_FLOORDIV_F(T, FMOD, FLOOR, COPYSIGN)                         \
  __device__ __forceinline__ T kiln_floordiv(T a, T b) {                 \
    if (b == 0) return a / b;                                            \
    T mod = FMOD(a, b);                                                  \
    T div = (a - mod) / b;                                               \
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;                    \
    if (div == 0) return COPYSIGN((T)0, a / b);                          \
    T fl = FLOOR(div);                                                   \
    if (div - fl > (T)0.5) fl += 1;                                      \
    return fl;                                                           \
  }
KILN_FLOORDIV_F(float, fmodf, floorf, copysignf)
KILN_FLOORDIV_F(double, fmod, floor, copysign)
#undef KILN_FLOORDIV_F
template <typename T> __device__ __forceinline__ T kiln_mod(T a, T b) {
  if (b == 0) return (T)-1;
  if (b == (T)-1) return (T)0;
  T r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r;
}
__device__ __forceinline__ float kiln_mod(float a, float b) {
  float r = fmodf(a, b);
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
__device__ __forceinline__ double kiln_mod(double a, double b) {
  double r = fmod(a, b);
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"): the first word
// of the block at counter (counter, 0) under key `seed`, as a float in [0, 1) with 24 random bits.
__device__ __forceinline__ float kiln_rand(long long seed, long long counter) {
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
__device__ __forceinline__ float kiln_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double kiln_pow(double a, double b) { return pow(a, b); }
// Integer powers as torch's: a negative exponent gives 1 for base 1, +-1 for base -1, else 0.
template <typename T> __device__ __forceinline__ T kiln_pow(T a, T b) {
  if (b < 0) return a == 1 ? (T)1 : a == -1 ? (T)((b & 1) ? -1 : 1) : (T)0;
  T r = 1;
  while (b > 0) {
    if (b & 1) r = (T)((unsigned long long)r * (unsigned long long)a);  // wraps, as torch's
    a = (T)((unsigned long long)a * (unsigned long long)a);
    b >>= 1;
  }
  return r;
}

// Combines of reductions, shared by the thread-local loop and the block-wide tree.
struct KilnSum { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; } };
struct KilnProd { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a * b; } };
struct KilnMax { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return kiln_max(a, b); } };
struct KilnMin { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return kiln_min(a, b); } };

// Warp shuffles move 32- and 64-bit words: narrower types travel as int.
template <typename T> __device__ __forceinline__ T kiln_shfl_xor(T v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ bool kiln_shfl_xor(bool v, int o) { return __shfl_xor_sync(0xffffffffu, (int)v, o) != 0; }
__device__ __forceinline__ signed char kiln_shfl_xor(signed char v, int o) { return (signed char)__shfl_xor_sync(0xffffffffu, (int)v, o); }
__device__ __forceinline__ unsigned char kiln_shfl_xor(unsigned char v, int o) { return (unsigned char)__shfl_xor_sync(0xffffffffu, (int)v, o); }
__device__ __forceinline__ short kiln_shfl_xor(short v, int o) { return (short)__shfl_xor_sync(0xffffffffu, (int)v, o); }

// Reduction within one warp (kernels that give each row a warp): every lane receives the result.
template <typename T, typename Op>
__device__ __forceinline__ T kiln_warp_reduce(T v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, kiln_shfl_xor(v, o));
  return v;
}

// V neighbouring elements moved by one load or store instruction (16 bytes at most).
template <typename T, int V> struct alignas(sizeof(T) * V) kiln_vec { T v[V]; };
// A group of V elements at p: one instruction where p is aligned for it (`aligned`, tested
// once per kernel), else V (a view's offset).
template <typename T, int V> __device__ __forceinline__ kiln_vec<T, V> kiln_vload(const T* p, bool aligned) {
  if (aligned) return *reinterpret_cast<const kiln_vec<T, V>*>(p);
  kiln_vec<T, V> r;
#pragma unroll
  for (int j = 0; j < V; ++j) r.v[j] = p[j];
  return r;
}
template <typename T, int V> __device__ __forceinline__ void kiln_vstore(T* p, const kiln_vec<T, V>& x, bool aligned) {
  if (aligned) {
    *reinterpret_cast<kiln_vec<T, V>*>(p) = x;
    return;
  }
#pragma unroll
  for (int j = 0; j < V; ++j) p[j] = x.v[j];
}

// Block-wide reduction: warp shuffles, then one value per warp through shared memory. Every
// thread of the block receives the result (later stages of the kernel read it).
template <typename T, typename Op>
__device__ __forceinline__ T kiln_block_reduce(T v, Op op, T* smem) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = op(v, kiln_shfl_xor(v, o));
  __syncthreads();  // smem may still be read from the previous reduction
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  const unsigned nwarps = (blockDim.x + 31u) >> 5;
  v = smem[0];
  for (unsigned w = 1; w < nwarps; ++w) v = op(v, smem[w]);
  return v;
}
