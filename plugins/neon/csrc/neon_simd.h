/*
 * neon_simd.h: one NEON source for both architectures. On aarch64 the intrinsics are native; on
 * x86-64 SIMDe maps them onto whatever the compile flags allow (SSE2 for the portable build,
 * AVX2/FMA/F16C for the avx2 variant). Intrinsics missing from the installed SIMDe (vdivq_f32,
 * vsqrtq_f32, vfmsq_f32) get portable helpers here so kernels never need an #ifdef.
 */
#ifndef NEON_SIMD_H
#define NEON_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__aarch64__)
#include <arm_neon.h>
#else
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/arm/neon.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif
#endif

/* GCC vector type used where SIMDe lacks an intrinsic: the compiler emits divps/sqrtps. */
typedef float nv_f4 __attribute__((vector_size(16)));

static inline float32x4_t v_div(float32x4_t a, float32x4_t b) {
#if defined(__aarch64__)
  return vdivq_f32(a, b);
#else
  nv_f4 x, y;
  memcpy(&x, &a, 16);
  memcpy(&y, &b, 16);
  x = x / y;
  float32x4_t r;
  memcpy(&r, &x, 16);
  return r;
#endif
}

/* a - b*c */
static inline float32x4_t v_fms(float32x4_t a, float32x4_t b, float32x4_t c) {
  return vfmaq_f32(a, vnegq_f32(b), c);
}

static inline float v_hsum(float32x4_t v) { return vaddvq_f32(v); }

/*
 * exp(x) for 4 lanes, max error about 1.5 ulp over the whole float range (the ARM optimized
 * routines' algorithm, as in ggml): n = round(x/ln2), a degree-5 polynomial for exp(b) on the
 * reduced argument, and a scale split in two factors so that results near the overflow and
 * underflow limits stay exact instead of wrapping. exp(+inf) = inf, exp(-inf) = 0, NaN stays NaN.
 */
static inline float32x4_t v_exp(float32x4_t x) {
  const float32x4_t r = vdupq_n_f32(0x1.8p23f);
  const float32x4_t z = vfmaq_f32(r, x, vdupq_n_f32(0x1.715476p+0f));
  const float32x4_t n = vsubq_f32(z, r);
  const float32x4_t b =
      v_fms(v_fms(x, n, vdupq_n_f32(0x1.62e4p-1f)), n, vdupq_n_f32(0x1.7f7d1cp-20f));
  const uint32x4_t e = vshlq_n_u32(vreinterpretq_u32_f32(z), 23);
  const float32x4_t k =
      vreinterpretq_f32_u32(vaddq_u32(e, vreinterpretq_u32_f32(vdupq_n_f32(1))));
  const uint32x4_t c = vcagtq_f32(n, vdupq_n_f32(126));
  const float32x4_t u = vmulq_f32(b, b);
  const float32x4_t j = vfmaq_f32(
      vmulq_f32(vdupq_n_f32(0x1.ffffecp-1f), b),
      vfmaq_f32(vfmaq_f32(vdupq_n_f32(0x1.fffdb6p-2f), vdupq_n_f32(0x1.555e66p-3f), b),
                vfmaq_f32(vdupq_n_f32(0x1.573e2ep-5f), vdupq_n_f32(0x1.0e4020p-7f), b), u),
      u);
  if (vmaxvq_u32(c) == 0) return vfmaq_f32(k, j, k);
  const uint32x4_t d = vandq_u32(vclezq_f32(n), vdupq_n_u32(0x82000000));
  const float32x4_t s1 = vreinterpretq_f32_u32(vaddq_u32(d, vdupq_n_u32(0x7f000000)));
  const float32x4_t s2 = vreinterpretq_f32_u32(vsubq_u32(e, d));
  float32x4_t res = vbslq_f32(vcagtq_f32(n, vdupq_n_f32(192)), vmulq_f32(s1, s1),
                              vbslq_f32(c, vmulq_f32(vfmaq_f32(s2, s2, j), s1),
                                        vfmaq_f32(k, k, j)));
  /* NaN lanes: the bit tricks above may turn them into numbers */
  return vbslq_f32(vceqq_f32(x, x), res, x);
}

/* x * sigmoid(x) = x / (1 + exp(-x)) */
static inline float32x4_t v_silu(float32x4_t x) {
  const float32x4_t one = vdupq_n_f32(1.0f);
  return v_div(x, vaddq_f32(one, v_exp(vnegq_f32(x))));
}

/*
 * tanh(y): for |y| >= NV_TANH_SMALL, sign(y) * (1 - 2/(exp(2|y|)+1)) (within a few ulp there,
 * where tanh >= 0.46; exactly +-1 at +-inf, NaN stays NaN); below it the odd Taylor series to
 * y^17, whose next term is under 1e-9 of the result: the exp form would cancel (its error is
 * an ulp of 1, not of tanh(y)), which a soft-cap c * tanh(s / c) multiplies by c.
 */
#define NV_TANH_SMALL 0.5f
#define NV_TANH_C3 (-3.33333333333e-1f)
#define NV_TANH_C5 1.33333333333e-1f
#define NV_TANH_C7 (-5.39682539683e-2f)
#define NV_TANH_C9 2.18694885362e-2f
#define NV_TANH_C11 (-8.86323552990e-3f)
#define NV_TANH_C13 3.59212803657e-3f
#define NV_TANH_C15 (-1.45583438705e-3f)
#define NV_TANH_C17 5.90027440945e-4f
static inline float32x4_t v_tanh(float32x4_t y) {
  const float32x4_t one = vdupq_n_f32(1.0f), two = vdupq_n_f32(2.0f), ay = vabsq_f32(y), y2 = vmulq_f32(y, y);
  const float32x4_t e = v_exp(vaddq_f32(ay, ay));
  const float32x4_t big = vsubq_f32(one, v_div(two, vaddq_f32(e, one)));
  float32x4_t p = vdupq_n_f32(NV_TANH_C17);
  p = vfmaq_f32(vdupq_n_f32(NV_TANH_C15), p, y2);
  p = vfmaq_f32(vdupq_n_f32(NV_TANH_C13), p, y2);
  p = vfmaq_f32(vdupq_n_f32(NV_TANH_C11), p, y2);
  p = vfmaq_f32(vdupq_n_f32(NV_TANH_C9), p, y2);
  p = vfmaq_f32(vdupq_n_f32(NV_TANH_C7), p, y2);
  p = vfmaq_f32(vdupq_n_f32(NV_TANH_C5), p, y2);
  p = vfmaq_f32(vdupq_n_f32(NV_TANH_C3), p, y2);
  p = vfmaq_f32(ay, vmulq_f32(p, y2), ay);
  /* both forms give tanh(|y|) >= 0 (or NaN); the sign goes on last, so tanh(-0) = -0 */
  const uint32x4_t mag = vreinterpretq_u32_f32(vbslq_f32(vcltq_f32(ay, vdupq_n_f32(NV_TANH_SMALL)), p, big));
  return vreinterpretq_f32_u32(vorrq_u32(mag, vandq_u32(vreinterpretq_u32_f32(y), vdupq_n_u32(0x80000000u))));
}

/* ---------------------------------------------------------------- half and bfloat16 */

static inline float nv_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);
  } else if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {
      /* subnormal: value = man * 2^-24, exact in f32 */
      float f = (float)man * 0x1p-24f;
      memcpy(&bits, &f, 4);
      bits |= sign;
    }
  } else {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* round to nearest even; overflow to inf; NaN stays a (quiet) NaN */
static inline uint16_t nv_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
  if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* >= 65520 rounds to inf */
  if (ax < 0x38800000u) {
    /* result is subnormal or zero: round ax as a multiple of 2^-24 */
    if (ax < 0x33000000u) return (uint16_t)sign; /* < 2^-25: rounds to 0 */
    uint32_t e = ax >> 23, m = (ax & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24+ */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
  }
  uint32_t r = ax + 0xC8000FFFu + ((ax >> 13) & 1u); /* rebias exponent by -112<<23, RNE */
  return (uint16_t)(sign | (r >> 13));
}

static inline float nv_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static inline uint16_t nv_f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x40u);
  return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

/* one f16 scale (quantized blocks): a single instruction where the CPU converts halves */
static inline float nv_h2f(uint16_t h) {
#if defined(__aarch64__)
  __fp16 x;
  memcpy(&x, &h, 2);
  return (float)x;
#elif defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return nv_f16_to_f32(h);
#endif
}

/* 4 halves to f32: SIMDe converts lane by lane, F16C does it in one instruction */
static inline float32x4_t v_ld_f16(const uint16_t *p) {
#if !defined(__aarch64__) && defined(__F16C__)
  __m128 v = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)p));
  float32x4_t r;
  memcpy(&r, &v, 16);
  return r;
#else
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
#endif
}

/* row conversions used by every kernel that accepts F16 activations */
static inline void nv_f16_row_to_f32(const uint16_t *src, float *dst, int64_t n) {
  int64_t vec = n > 0 ? n & ~(int64_t)3 : 0;
  for (int64_t i = 0; i < vec; i += 4) vst1q_f32(dst + i, v_ld_f16(src + i));
  for (int64_t i = vec; i < n; i++) dst[i] = nv_f16_to_f32(src[i]);
}

static inline void nv_f32_row_to_f16(const float *src, uint16_t *dst, int64_t n) {
  int64_t i = 0;
#if !defined(__aarch64__) && defined(__F16C__)
  /* F16C rounds to nearest even and keeps NaN a NaN, like nv_f32_to_f16 */
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; i++) dst[i] = nv_f32_to_f16(src[i]);
}

#endif /* NEON_SIMD_H */
