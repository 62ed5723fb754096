/*
 * k_quant.c: Q8_0 / Q4_0 weight rows times activations quantized to Q8_0 on the fly (as
 * llama.cpp does): int8 dot products per 32-value block, scaled by both blocks' f16 scales.
 * Three dot implementations behind one interface: vdotq_s32 where the CPU has the dotprod
 * extension (chosen at run time on aarch64), widening multiplies otherwise, and AVX2 on the
 * x86-64 AVX2 build (SIMDe emulates vdotq_s32 lane by lane, which is slower than widening).
 *
 * Each call takes one weight row and up to NV_QROWS activation rows: a weight block is loaded
 * and unpacked once for all of them (prefill), and blocks go two at a time into separate
 * accumulators so a single row (decode) is not bound by the FMA latency.
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
 * the f16-rounded one, as a stored Q8_0 block would have it; s[b] = d * sum(q) lets a kernel
 * that multiplies unsigned Q4_0 nibbles subtract the 8 offset once per block. */
int nv_quantize_block_q8(const float *xb, float *d, int8_t *q) {
  float32x4_t m = vdupq_n_f32(0);
  for (int i = 0; i < 32; i += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(xb + i)));
  float amax = vmaxvq_f32(m);
  float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
  *d = nv_f16_to_f32(nv_f32_to_f16(dd));
  int sum = 0;
  for (int i = 0; i < 32; i++) {
    q[i] = nv_i8_code(roundf(xb[i] * id));
    sum += q[i];
  }
  return sum;
}

void nv_quantize_row_q8(const float *x, int64_t k, float *d, int8_t *q, float *s) {
  for (int64_t b = 0; b < k / 32; b++) {
    int sum = nv_quantize_block_q8(x + b * 32, &d[b], q + b * 32); /* sets d[b] first */
    s[b] = d[b] * (float)sum;
  }
}

static inline float f16at(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return nv_h2f(h);
}

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* ---------------------------------------------------------------- x86-64 AVX2 */
#if defined(__x86_64__) && defined(__AVX2__)
static float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* the 32 weights of a block as signed bytes */
ALWAYS_INLINE __m256i wblock_x86(const uint8_t *wb, int q4) {
  if (!q4) return _mm256_loadu_si256((const __m256i *)(wb + 2));
  __m128i v = _mm_loadu_si128((const __m128i *)(wb + 2));
  __m256i both = _mm256_insertf128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
  return _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(0x0F)), _mm256_set1_epi8(8));
}

/* maddubs needs one unsigned operand: |w| times a with w's sign; the int16 pairs cannot
 * overflow (|w| <= 128, |a| <= 127) */
#define X86_BLOCK(bi, slot)                                                                      \
  do {                                                                                           \
    const uint8_t *wb = w + (bi) * bs;                                                           \
    __m256i wv = wblock_x86(wb, q4), wabs = _mm256_abs_epi8(wv);                                 \
    float dw = f16at(wb);                                                                        \
    for (int r = 0; r < nr; r++) {                                                               \
      __m256i av = _mm256_loadu_si256((const __m256i *)(a[r].q + (bi) * 32));                    \
      __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(av, wv)), ones); \
      acc[r][slot] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * a[r].d[bi]), acc[r][slot]); \
    }                                                                                            \
  } while (0)

/* Q4_0 without the offset: the raw nibbles (0..15) are already the unsigned operand maddubs
 * wants, and the -8 of every weight comes back as 8 * sum(a) per block from the activation's
 * precomputed sums (the VNNI path's trick), which saves the subtract, abs and sign steps of
 * X86_BLOCK; pairs stay within int16 (2 * 15 * 127) */
#define X86_BLOCK_Q4(bi, slot)                                                                   \
  do {                                                                                           \
    const uint8_t *wb = w + (bi) * 18;                                                           \
    __m128i v = _mm_loadu_si128((const __m128i *)(wb + 2));                                      \
    __m256i wn = _mm256_and_si256(_mm256_insertf128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1), \
                                  _mm256_set1_epi8(0x0F));                                       \
    float dw = f16at(wb);                                                                        \
    for (int r = 0; r < nr; r++) {                                                               \
      __m256i av = _mm256_loadu_si256((const __m256i *)(a[r].q + (bi) * 32));                    \
      __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wn, av), ones);                         \
      acc[r][slot] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * a[r].d[bi]), acc[r][slot]); \
      corr[r][slot] += dw * a[r].s[bi];                                                          \
    }                                                                                            \
  } while (0)

/* the body of a dot whose blocks add a per-block correction, subtracted 8 times at the end (Q4_0
 * by the offset trick; 0 for Q8_0): two accumulator slots per row, blocks in pairs */
#define X86_QDOT_CORR(BLOCK)                                                                     \
  __m256 acc[NV_QROWS][2];                                                                       \
  float corr[NV_QROWS][2];                                                                       \
  for (int r = 0; r < nr; r++) {                                                                 \
    acc[r][0] = acc[r][1] = _mm256_setzero_ps();                                                 \
    corr[r][0] = corr[r][1] = 0.0f;                                                              \
  }                                                                                              \
  int64_t b = 0;                                                                                 \
  for (; b + 2 <= nb; b += 2) {                                                                  \
    BLOCK(b, 0);                                                                                 \
    BLOCK(b + 1, 1);                                                                             \
  }                                                                                              \
  if (b < nb) BLOCK(b, 0);                                                                       \
  for (int r = 0; r < nr; r++) out[r] = hsum8(_mm256_add_ps(acc[r][0], acc[r][1])) - 8.0f * (corr[r][0] + corr[r][1]);

ALWAYS_INLINE void qdot_x86(const uint8_t *w, int64_t nb, const nv_qact *a, const int nr, const int q4, float *out) {
  const __m256i ones = _mm256_set1_epi16(1);
  if (q4) {
    X86_QDOT_CORR(X86_BLOCK_Q4)
    return;
  }
  const int64_t bs = 34;
  X86_QDOT_CORR(X86_BLOCK)
}
#define QDOT_IMPL qdot_x86

/*
 * AVX512-VNNI (with VL, on 256-bit vectors), chosen at run time where the CPU has it: vpdpbusd
 * multiplies unsigned by signed bytes and sums into int32 in one instruction. Q8_0 keeps the
 * sign trick; Q4_0 multiplies the raw nibbles (0..15) and subtracts 8 * sum(a) per block from
 * the precomputed activation sums, which saves the offset, abs and sign steps.
 */
#define VNNI __attribute__((target("avx512vnni,avx512vl,avx2,fma,f16c")))

#define VNNI_BLOCK(bi, slot)                                                                     \
  do {                                                                                           \
    const uint8_t *wb = w + (bi) * bs;                                                           \
    float dw = f16at(wb);                                                                        \
    __m256i wv, wabs;                                                                            \
    if (q4) {                                                                                    \
      __m128i v = _mm_loadu_si128((const __m128i *)(wb + 2));                                    \
      wabs = _mm256_and_si256(_mm256_insertf128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1), \
                              _mm256_set1_epi8(0x0F));                                           \
      wv = wabs;                                                                                 \
    } else {                                                                                     \
      wv = _mm256_loadu_si256((const __m256i *)(wb + 2));                                        \
      wabs = _mm256_abs_epi8(wv);                                                                \
    }                                                                                            \
    for (int r = 0; r < nr; r++) {                                                               \
      __m256i av = _mm256_loadu_si256((const __m256i *)(a[r].q + (bi) * 32));                    \
      __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wabs, q4 ? av : _mm256_sign_epi8(av, wv)); \
      acc[r][slot] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * a[r].d[bi]), acc[r][slot]); \
      if (q4) corr[r][slot] += dw * a[r].s[bi];                                                  \
    }                                                                                            \
  } while (0)

VNNI ALWAYS_INLINE void qdot_vnni(const uint8_t *w, int64_t nb, const nv_qact *a, const int nr, const int q4,
                                  float *out) {
  const int64_t bs = q4 ? 18 : 34;
  X86_QDOT_CORR(VNNI_BLOCK)
}

static int have_vnni(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
}
#endif

/* ---------------------------------------------------------------- NEON */

ALWAYS_INLINE void wblock_neon(const uint8_t *wb, int q4, int8x16_t *w0, int8x16_t *w1) {
  if (!q4) {
    *w0 = vld1q_s8((const int8_t *)wb + 2);
    *w1 = vld1q_s8((const int8_t *)wb + 18);
    return;
  }
  uint8x16_t v = vld1q_u8(wb + 2);
  *w0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F))), vdupq_n_s8(8));
  *w1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
}

ALWAYS_INLINE int32x4_t dot32_widen(int8x16_t w0, int8x16_t w1, const int8_t *a) {
  int8x16_t a0 = vld1q_s8(a), a1 = vld1q_s8(a + 16);
  int32x4_t acc = vpadalq_s16(vdupq_n_s32(0), vmull_s8(vget_low_s8(w0), vget_low_s8(a0)));
  acc = vpadalq_s16(acc, vmull_s8(vget_high_s8(w0), vget_high_s8(a0)));
  acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(w1), vget_low_s8(a1)));
  return vpadalq_s16(acc, vmull_s8(vget_high_s8(w1), vget_high_s8(a1)));
}

#define NEON_BLOCK(bi, slot, DOT)                                                                \
  do {                                                                                           \
    const uint8_t *wb = w + (bi) * bs;                                                           \
    int8x16_t w0, w1;                                                                            \
    wblock_neon(wb, q4, &w0, &w1);                                                               \
    float dw = f16at(wb);                                                                        \
    for (int r = 0; r < nr; r++) {                                                               \
      int32x4_t p = DOT(w0, w1, a[r].q + (bi) * 32);                                             \
      acc[r][slot] = vfmaq_n_f32(acc[r][slot], vcvtq_f32_s32(p), dw * a[r].d[bi]);               \
    }                                                                                            \
  } while (0)

#define NEON_QDOT_BODY(DOT)                                                                      \
  const int64_t bs = q4 ? 18 : 34;                                                               \
  float32x4_t acc[NV_QROWS][2];                                                                  \
  for (int r = 0; r < nr; r++) acc[r][0] = acc[r][1] = vdupq_n_f32(0);                           \
  int64_t b = 0;                                                                                 \
  for (; b + 2 <= nb; b += 2) {                                                                  \
    NEON_BLOCK(b, 0, DOT);                                                                       \
    NEON_BLOCK(b + 1, 1, DOT);                                                                   \
  }                                                                                              \
  if (b < nb) NEON_BLOCK(b, 0, DOT);                                                             \
  for (int r = 0; r < nr; r++) out[r] = vaddvq_f32(vaddq_f32(acc[r][0], acc[r][1]));

ALWAYS_INLINE void qdot_widen(const uint8_t *w, int64_t nb, const nv_qact *a, const int nr, const int q4, float *out) {
  NEON_QDOT_BODY(dot32_widen)
}

#if defined(__aarch64__)
#define DP __attribute__((target("arch=armv8.2-a+dotprod")))
DP ALWAYS_INLINE int32x4_t dot32_dp(int8x16_t w0, int8x16_t w1, const int8_t *a) {
  return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w0, vld1q_s8(a)), w1, vld1q_s8(a + 16));
}

DP ALWAYS_INLINE void qdot_dp(const uint8_t *w, int64_t nb, const nv_qact *a, const int nr, const int q4, float *out) {
  NEON_QDOT_BODY(dot32_dp)
}
#else
#define DP
#endif

/* one function per (implementation, dtype, row count): the row loop unrolls into registers */
#define QDOT_VARIANTS(IMPL, ATTR)                                                                \
  ATTR static void IMPL##_q8_1(const uint8_t *w, int64_t nb, const nv_qact *a, int nr, float *o) { (void)nr; IMPL(w, nb, a, 1, 0, o); } \
  ATTR static void IMPL##_q8_2(const uint8_t *w, int64_t nb, const nv_qact *a, int nr, float *o) { (void)nr; IMPL(w, nb, a, 2, 0, o); } \
  ATTR static void IMPL##_q8_4(const uint8_t *w, int64_t nb, const nv_qact *a, int nr, float *o) { (void)nr; IMPL(w, nb, a, 4, 0, o); } \
  ATTR static void IMPL##_q4_1(const uint8_t *w, int64_t nb, const nv_qact *a, int nr, float *o) { (void)nr; IMPL(w, nb, a, 1, 1, o); } \
  ATTR static void IMPL##_q4_2(const uint8_t *w, int64_t nb, const nv_qact *a, int nr, float *o) { (void)nr; IMPL(w, nb, a, 2, 1, o); } \
  ATTR static void IMPL##_q4_4(const uint8_t *w, int64_t nb, const nv_qact *a, int nr, float *o) { (void)nr; IMPL(w, nb, a, 4, 1, o); } \
  ATTR static void IMPL##_any(int q4, const uint8_t *w, int64_t nb, const nv_qact *a, int nr, float *o) { \
    int r = 0;                                                                                   \
    for (; r + 4 <= nr; r += 4) (q4 ? IMPL##_q4_4 : IMPL##_q8_4)(w, nb, a + r, 4, o + r);        \
    for (; r + 2 <= nr; r += 2) (q4 ? IMPL##_q4_2 : IMPL##_q8_2)(w, nb, a + r, 2, o + r);        \
    for (; r < nr; r++) (q4 ? IMPL##_q4_1 : IMPL##_q8_1)(w, nb, a + r, 1, o + r);                \
  }                                                                                              \
  ATTR static void IMPL##_q8(const uint8_t *w, int64_t nb, const nv_qact *a, int nr, float *o) { IMPL##_any(0, w, nb, a, nr, o); } \
  ATTR static void IMPL##_q4(const uint8_t *w, int64_t nb, const nv_qact *a, int nr, float *o) { IMPL##_any(1, w, nb, a, nr, o); }

QDOT_VARIANTS(qdot_widen, )
#if defined(__aarch64__)
QDOT_VARIANTS(qdot_dp, DP)
#endif
#if defined(QDOT_IMPL)
QDOT_VARIANTS(qdot_x86, )
QDOT_VARIANTS(qdot_vnni, VNNI)
#endif

/* The int8 dot product the quantized matmul kernels take on this CPU (int8dot on), by the
 * tests nv_qdot_select and nv_kpk_select make: named in the device's name, so that `xpu
 * devices` and a run's --stats say which path a figure was measured on. */
const char *nv_int8_path(void) {
#if defined(__aarch64__)
  return nv_have_dotprod() ? "arm64 dotprod" : "arm64 NEON widening";
#elif defined(QDOT_IMPL) && defined(__AVX512F__)
  return have_vnni() ? "AVX-512 VNNI" : "AVX-512 without VNNI (AVX2 int8)";
#elif defined(QDOT_IMPL)
  return have_vnni() ? "AVX2, VNNI on 256-bit vectors" : "AVX2";
#else
  return "portable (SSE2 widening)";
#endif
}

nv_qdot_fn nv_qdot_select(uint32_t dtype, int int8dot) {
  (void)int8dot;
  int q8 = dtype == XPU_DT_Q8_0;
#if defined(__aarch64__)
  if (int8dot && nv_have_dotprod()) return q8 ? qdot_dp_q8 : qdot_dp_q4;
#elif defined(QDOT_IMPL)
  if (int8dot && have_vnni()) return q8 ? qdot_vnni_q8 : qdot_vnni_q4;
  return q8 ? qdot_x86_q8 : qdot_x86_q4;
#endif
  return q8 ? qdot_widen_q8 : qdot_widen_q4;
}
