/*
 * k_quant.c: Q8_0 / Q4_0 weight rows times activations quantized to Q8_0 on the fly (as
 * llama.cpp does): int8 dot products per 32-value block, scaled by both blocks' f16 scales.
 * Three dot implementations behind one interface: vdotq_s32 where the CPU has the dotprod
 * extension (chosen at run time on aarch64), widening multiplies otherwise, and AVX2 on the
 * x86-64 AVX2 build (SIMDe emulates vdotq_s32 lane by lane, which is slower than widening).
 */
#include <math.h>
#include <string.h>
#if defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif
#if defined(__x86_64__) && defined(__AVX2__)
#include <immintrin.h>
#endif

#include "neon.h"
#include "neon_simd.h"

int nv_have_dotprod(void) {
#if defined(__aarch64__)
  return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
  return 0;
#endif
}

/* ggml's quantize_row_q8_0 rule (OPS.md): d = amax/127, q = round(x/d). The scale kept here is
 * the f16-rounded one, as a stored Q8_0 block would have it. */
void nv_quantize_row_q8(const float *x, int64_t k, float *d, int8_t *q) {
  for (int64_t b = 0; b < k / 32; b++) {
    const float *xb = x + b * 32;
    float32x4_t m = vdupq_n_f32(0);
    for (int i = 0; i < 32; i += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(xb + i)));
    float amax = vmaxvq_f32(m);
    float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
    d[b] = nv_f16_to_f32(nv_f32_to_f16(dd));
    for (int i = 0; i < 32; i++) q[b * 32 + i] = (int8_t)roundf(xb[i] * id);
  }
}

static inline float f16at(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return nv_h2f(h);
}

#if defined(__aarch64__)
/* two blocks per step into two accumulators, so the FMA latency does not bound the loop */
#define DP __attribute__((target("arch=armv8.2-a+dotprod")))
DP static inline int32x4_t dp32(int8x16_t w0, int8x16_t w1, const int8_t *a) {
  return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w0, vld1q_s8(a)), w1, vld1q_s8(a + 16));
}

DP static float dot_q8_dp(const uint8_t *w, const float *ad, const int8_t *aq, int64_t nb) {
  float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2, w += 68) {
    int32x4_t p0 = dp32(vld1q_s8((const int8_t *)w + 2), vld1q_s8((const int8_t *)w + 18), aq + b * 32);
    int32x4_t p1 = dp32(vld1q_s8((const int8_t *)w + 36), vld1q_s8((const int8_t *)w + 52), aq + b * 32 + 32);
    acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), f16at(w) * ad[b]);
    acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(p1), f16at(w + 34) * ad[b + 1]);
  }
  for (; b < nb; b++, w += 34) {
    int32x4_t p0 = dp32(vld1q_s8((const int8_t *)w + 2), vld1q_s8((const int8_t *)w + 18), aq + b * 32);
    acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), f16at(w) * ad[b]);
  }
  return vaddvq_f32(vaddq_f32(acc0, acc1));
}

DP static float dot_q4_dp(const uint8_t *w, const float *ad, const int8_t *aq, int64_t nb) {
  float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
  const uint8x16_t mask = vdupq_n_u8(0x0F);
  const int8x16_t eight = vdupq_n_s8(8);
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2, w += 36) {
    uint8x16_t v0 = vld1q_u8(w + 2), v1 = vld1q_u8(w + 20);
    int32x4_t p0 = dp32(vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v0, mask)), eight),
                        vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v0, 4)), eight), aq + b * 32);
    int32x4_t p1 = dp32(vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v1, mask)), eight),
                        vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v1, 4)), eight), aq + b * 32 + 32);
    acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), f16at(w) * ad[b]);
    acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(p1), f16at(w + 18) * ad[b + 1]);
  }
  for (; b < nb; b++, w += 18) {
    uint8x16_t v0 = vld1q_u8(w + 2);
    int32x4_t p0 = dp32(vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v0, mask)), eight),
                        vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v0, 4)), eight), aq + b * 32);
    acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), f16at(w) * ad[b]);
  }
  return vaddvq_f32(vaddq_f32(acc0, acc1));
}
#endif

#if defined(__x86_64__) && defined(__AVX2__)
/* 32 int8 products summed to 8 int32 lanes: maddubs needs one unsigned operand, so the sign of
 * w moves onto a (|w| * sign(w)a); int16 pairs cannot overflow since |w| <= 127 or 8. */
static inline __m256i dot32_avx2(__m256i w, __m256i a) {
  __m256i aw = _mm256_abs_epi8(w);
  __m256i sa = _mm256_sign_epi8(a, w);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sa), _mm256_set1_epi16(1));
}

static float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* two blocks per step into two accumulators: one FMA chain would bound a block to its latency */
static float dot_q8_x86(const uint8_t *w, const float *ad, const int8_t *aq, int64_t nb) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2, w += 68) {
    __m256i p0 = dot32_avx2(_mm256_loadu_si256((const __m256i *)(w + 2)), _mm256_loadu_si256((const __m256i *)(aq + b * 32)));
    __m256i p1 = dot32_avx2(_mm256_loadu_si256((const __m256i *)(w + 36)),
                            _mm256_loadu_si256((const __m256i *)(aq + b * 32 + 32)));
    acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(f16at(w) * ad[b]), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_set1_ps(f16at(w + 34) * ad[b + 1]), acc1);
  }
  for (; b < nb; b++, w += 34) {
    __m256i p0 = dot32_avx2(_mm256_loadu_si256((const __m256i *)(w + 2)), _mm256_loadu_si256((const __m256i *)(aq + b * 32)));
    acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(f16at(w) * ad[b]), acc0);
  }
  return hsum8(_mm256_add_ps(acc0, acc1));
}

static inline __m256i q4_unpack(const uint8_t *qs) {
  const __m256i mask = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
  __m128i v = _mm_loadu_si128((const __m128i *)qs);
  __m256i both = _mm256_insertf128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
  return _mm256_sub_epi8(_mm256_and_si256(both, mask), eight);
}

static float dot_q4_x86(const uint8_t *w, const float *ad, const int8_t *aq, int64_t nb) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2, w += 36) {
    __m256i p0 = dot32_avx2(q4_unpack(w + 2), _mm256_loadu_si256((const __m256i *)(aq + b * 32)));
    __m256i p1 = dot32_avx2(q4_unpack(w + 20), _mm256_loadu_si256((const __m256i *)(aq + b * 32 + 32)));
    acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(f16at(w) * ad[b]), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_set1_ps(f16at(w + 18) * ad[b + 1]), acc1);
  }
  for (; b < nb; b++, w += 18) {
    __m256i p0 = dot32_avx2(q4_unpack(w + 2), _mm256_loadu_si256((const __m256i *)(aq + b * 32)));
    acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(f16at(w) * ad[b]), acc0);
  }
  return hsum8(_mm256_add_ps(acc0, acc1));
}
#endif

static inline int32x4_t dot16_widen(int8x16_t w, int8x16_t a, int32x4_t acc) {
  int16x8_t lo = vmull_s8(vget_low_s8(w), vget_low_s8(a));
  int16x8_t hi = vmull_s8(vget_high_s8(w), vget_high_s8(a));
  return vpadalq_s16(vpadalq_s16(acc, lo), hi);
}

static float dot_q8_widen(const uint8_t *w, const float *ad, const int8_t *aq, int64_t nb) {
  float32x4_t acc = vdupq_n_f32(0);
  for (int64_t b = 0; b < nb; b++, w += 34) {
    int32x4_t p = dot16_widen(vld1q_s8((const int8_t *)w + 2), vld1q_s8(aq + b * 32), vdupq_n_s32(0));
    p = dot16_widen(vld1q_s8((const int8_t *)w + 18), vld1q_s8(aq + b * 32 + 16), p);
    acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), f16at(w) * ad[b]);
  }
  return vaddvq_f32(acc);
}

static float dot_q4_widen(const uint8_t *w, const float *ad, const int8_t *aq, int64_t nb) {
  float32x4_t acc = vdupq_n_f32(0);
  const uint8x16_t mask = vdupq_n_u8(0x0F);
  const int8x16_t eight = vdupq_n_s8(8);
  for (int64_t b = 0; b < nb; b++, w += 18) {
    uint8x16_t v = vld1q_u8(w + 2);
    int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, mask)), eight);
    int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), eight);
    int32x4_t p = dot16_widen(lo, vld1q_s8(aq + b * 32), vdupq_n_s32(0));
    p = dot16_widen(hi, vld1q_s8(aq + b * 32 + 16), p);
    acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), f16at(w) * ad[b]);
  }
  return vaddvq_f32(acc);
}

nv_qdot_fn nv_qdot_select(uint32_t dtype, int dotprod) {
  (void)dotprod;
#if defined(__aarch64__)
  if (dotprod) return dtype == XPU_DT_Q8_0 ? dot_q8_dp : dot_q4_dp;
#elif defined(__x86_64__) && defined(__AVX2__)
  return dtype == XPU_DT_Q8_0 ? dot_q8_x86 : dot_q4_x86;
#endif
  return dtype == XPU_DT_Q8_0 ? dot_q8_widen : dot_q4_widen;
}
