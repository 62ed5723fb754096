/*
 * k_qpack.c: Q4_0 / Q8_0 matmul weights repacked once at graph_prepare into an interleaved
 * layout, and the kernels that read it (decode GEMV and prefill GEMM alike).
 *
 * Layout: rows in groups of NV_PG = 16 (the last group zero-padded), each group's blocks in K
 * order, one "group block" per 32 values of K:
 *
 *     [16 f16 row scales][chunk 0][chunk 1]...      Q4_0: 4 chunks, Q8_0: 8 chunks, 64 B each
 *
 * Chunk q holds, for row j = 0..15, the 4 bytes at offset 4q of row j's original block quants,
 * in bytes 4j..4j+3. So one 64-byte load gives 4 consecutive K values of 16 rows, one 32-bit
 * lane per row: a dot-product instruction (vpdpbusd, sdot by lane) with the matching 4
 * activation bytes broadcast adds 4 products into each row's lane, and the 16 row scales
 * convert with one instruction. A Q4_0 chunk's low nibbles are K values 4q..4q+3 and its high
 * nibbles 16+4q..16+4q+3 (the original nibble order), so nothing is reordered within a byte.
 * The group block is as large as the 16 original blocks (288 B for Q4_0, 544 B for Q8_0).
 *
 * Weights are multiplied as unsigned (Q4_0 nibbles 0..15; Q8_0 on x86-64 stored as q + 128,
 * since vpdpbusd wants one unsigned operand) and the offset comes off once per block in
 * integers: sum(w * a) = sum((w + off) * a) - off * sum(a), with sum(a) kept per activation
 * block by nv_quantize_row_q8s. Q8_0 stays signed on aarch64, where sdot is signed x signed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__x86_64__) && defined(__AVX2__)
#include <immintrin.h>
#endif

#include "neon.h"
#include "neon_simd.h"

#if defined(__x86_64__)
#define Q8_BIAS 128
#else
#define Q8_BIAS 0
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))

static int64_t group_block_bytes(int q4) { return q4 ? 32 + 4 * 64 : 32 + 8 * 64; }

uint64_t nv_qpack_bytes(uint32_t dtype, int64_t N, int64_t K) {
  if (nv_is_float_weight(dtype)) return nv_fpack_bytes(N, K);
  if (nv_is_kquant(dtype)) return nv_kq_pack_bytes(dtype, N, K);
  return (uint64_t)((N + NV_PG - 1) / NV_PG) * (uint64_t)(K / 32) * (uint64_t)group_block_bytes(dtype == XPU_DT_Q4_0);
}

void nv_qpack_groups(uint32_t dtype, const uint8_t *src, int64_t N, int64_t K, int64_t g0, int64_t g1, uint8_t *dst) {
  if (nv_is_kquant(dtype)) {
    nv_kq_pack_groups(dtype, src, N, K, g0, g1, dst);
    return;
  }
  const int q4 = dtype == XPU_DT_Q4_0, chunks = q4 ? 4 : 8;
  const int64_t nb = K / 32, bs = q4 ? 18 : 34, gb = group_block_bytes(q4);
  for (int64_t g = g0; g < g1; g++)
    for (int64_t b = 0; b < nb; b++) {
      uint8_t *o = dst + (g * nb + b) * gb;
      for (int j = 0; j < NV_PG; j++) {
        int64_t n = g * NV_PG + j;
        if (n >= N) {
          memset(o + 2 * j, 0, 2);
          for (int q = 0; q < chunks; q++) memset(o + 32 + q * 64 + 4 * j, 0, 4);
          continue;
        }
        const uint8_t *blk = src + n * nb * bs + b * bs;
        memcpy(o + 2 * j, blk, 2);
        for (int q = 0; q < chunks; q++) {
          uint8_t *c = o + 32 + q * 64 + 4 * j;
          memcpy(c, blk + 2 + 4 * q, 4);
          if (!q4 && Q8_BIAS)
            for (int i = 0; i < 4; i++) c[i] ^= 0x80;
        }
      }
    }
}

/* The same rounding as nv_quantize_row_q8 (so results match the unpacked path's activations),
 * with each block's integer sum instead of the scaled one. */
#if defined(__x86_64__) && defined(__AVX2__)
/* roundf (half away from zero), exactly: truncate, then step one away from zero where the
 * dropped fraction is at least one half (v - trunc(v) is exact in float) */
static inline __m256i round_away(__m256 v) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
  __m256 step = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
  t = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ), step));
  return _mm256_cvttps_epi32(t);
}

void nv_quantize_row_q8s(const float *x, int64_t k, float *d, int8_t *q, int32_t *s) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < k / 32; b++) {
    const float *xb = x + b * 32;
    __m256 v[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
      v[i] = _mm256_loadu_ps(xb + 8 * i);
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float amax = _mm_cvtss_f32(h);
    float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
    d[b] = nv_f16_to_f32(nv_f32_to_f16(dd));
    __m256 vid = _mm256_set1_ps(id);
    __m256i r[4];
    for (int i = 0; i < 4; i++) r[i] = round_away(_mm256_mul_ps(v[i], vid));
    __m256i sum = _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    s[b] = _mm_cvtsi128_si32(s4);
    /* packs work per 128-bit lane: the permute puts the 8 dwords back in order */
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)(q + b * 32), p);
  }
}
#else
void nv_quantize_row_q8s(const float *x, int64_t k, float *d, int8_t *q, int32_t *s) {
  for (int64_t b = 0; b < k / 32; b++) s[b] = nv_quantize_block_q8(x + b * 32, &d[b], q + b * 32);
}
#endif

static inline int32_t ld32(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return v;
}

static inline void store_rows(float *o, const float *v, int nvalid) {
  memcpy(o, v, (size_t)nvalid * 4);
}

/* ---------------------------------------------------------------- generic (any CPU) */

/* Plain C over the same layout: the portable build and aarch64 without dotprod. */
static void pk_generic(const uint8_t *w, int64_t nb, const nv_pact *a, int mr, int q4, float *out, int64_t ldo,
                       int nvalid) {
  const int64_t gb = group_block_bytes(q4);
  const int off = q4 ? 8 : Q8_BIAS;
  for (int m = 0; m < mr; m++) {
    float acc[NV_PG] = {0};
    const uint8_t *wb = w;
    for (int64_t b = 0; b < nb; b++, wb += gb) {
      const int8_t *aq = a[m].q + b * 32;
      int32_t is[NV_PG];
      for (int j = 0; j < NV_PG; j++) is[j] = -off * a[m].s[b];
      if (q4) {
        for (int q = 0; q < 4; q++) {
          const uint8_t *c = wb + 32 + q * 64;
          for (int j = 0; j < NV_PG; j++)
            for (int i = 0; i < 4; i++)
              is[j] += (c[4 * j + i] & 0x0F) * aq[4 * q + i] + (c[4 * j + i] >> 4) * aq[16 + 4 * q + i];
        }
      } else {
        for (int q = 0; q < 8; q++) {
          const uint8_t *c = wb + 32 + q * 64;
          for (int j = 0; j < NV_PG; j++)
            for (int i = 0; i < 4; i++) {
              int wv = Q8_BIAS ? (int)c[4 * j + i] : (int)(int8_t)c[4 * j + i];
              is[j] += wv * aq[4 * q + i];
            }
        }
      }
      float da = a[m].d[b];
      for (int j = 0; j < NV_PG; j++) {
        uint16_t h;
        memcpy(&h, wb + 2 * j, 2);
        acc[j] += nv_h2f(h) * (da * (float)is[j]);
      }
    }
    store_rows(out + m * ldo, acc, nvalid);
  }
}

#define PK_VARIANTS(IMPL, ATTR) PK_VARIANTS_W(IMPL, ATTR, 4)
/* WIDE: the most rows one call of IMPL takes (4 or 8) */
#define PK_VARIANTS_W(IMPL, ATTR, WIDE)                                                          \
  ATTR static void IMPL##_q4(const uint8_t *w, int64_t nb, const nv_pact *a, int mr, float *o, int64_t ldo, int nv) { \
    int m = 0;                                                                                   \
    for (; WIDE == 8 && m + 8 <= mr; m += 8) IMPL(w, nb, a + m, 8, 1, o + m * ldo, ldo, nv);     \
    for (; m + 4 <= mr; m += 4) IMPL(w, nb, a + m, 4, 1, o + m * ldo, ldo, nv);                  \
    for (; m + 2 <= mr; m += 2) IMPL(w, nb, a + m, 2, 1, o + m * ldo, ldo, nv);                  \
    for (; m < mr; m++) IMPL(w, nb, a + m, 1, 1, o + m * ldo, ldo, nv);                          \
  }                                                                                              \
  ATTR static void IMPL##_q8(const uint8_t *w, int64_t nb, const nv_pact *a, int mr, float *o, int64_t ldo, int nv) { \
    int m = 0;                                                                                   \
    for (; WIDE == 8 && m + 8 <= mr; m += 8) IMPL(w, nb, a + m, 8, 0, o + m * ldo, ldo, nv);     \
    for (; m + 4 <= mr; m += 4) IMPL(w, nb, a + m, 4, 0, o + m * ldo, ldo, nv);                  \
    for (; m + 2 <= mr; m += 2) IMPL(w, nb, a + m, 2, 0, o + m * ldo, ldo, nv);                  \
    for (; m < mr; m++) IMPL(w, nb, a + m, 1, 0, o + m * ldo, ldo, nv);                          \
  }

static void pk_generic_q4(const uint8_t *w, int64_t nb, const nv_pact *a, int mr, float *o, int64_t ldo, int nv) {
  pk_generic(w, nb, a, mr, 1, o, ldo, nv);
}
static void pk_generic_q8(const uint8_t *w, int64_t nb, const nv_pact *a, int mr, float *o, int64_t ldo, int nv) {
  pk_generic(w, nb, a, mr, 0, o, ldo, nv);
}

/* ---------------------------------------------------------------- aarch64 dotprod */
#if defined(__aarch64__)
#define DP __attribute__((target("arch=armv8.2-a+dotprod")))

/* sdot by lane: 4 rows per vector, 4 vectors per chunk; lane q of the 16 activation bytes that
 * cover the chunk's K values */
#define DP_CHUNK(q, LANE, ALO, AHI)                                                              \
  do {                                                                                           \
    const uint8_t *c = wb + 32 + (q) * 64;                                                       \
    for (int v = 0; v < 4; v++) {                                                                \
      uint8x16_t x = vld1q_u8(c + 16 * v);                                                       \
      if (q4) {                                                                                  \
        int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(x, vdupq_n_u8(0x0F)));                       \
        int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(x, 4));                                    \
        for (int m = 0; m < mr; m++) {                                                           \
          is[m][v] = vdotq_laneq_s32(is[m][v], lo, ALO[m], LANE);                                \
          is[m][v] = vdotq_laneq_s32(is[m][v], hi, AHI[m], LANE);                                \
        }                                                                                        \
      } else {                                                                                   \
        for (int m = 0; m < mr; m++) is[m][v] = vdotq_laneq_s32(is[m][v], vreinterpretq_s8_u8(x), ALO[m], LANE); \
      }                                                                                          \
    }                                                                                            \
  } while (0)

DP ALWAYS_INLINE void pk_dp(const uint8_t *w, int64_t nb, const nv_pact *a, const int mr, const int q4, float *out,
                            int64_t ldo, int nvalid) {
  const int64_t gb = group_block_bytes(q4);
  const int off = q4 ? 8 : 0;
  float32x4_t acc[4][4];
  for (int m = 0; m < mr; m++)
    for (int v = 0; v < 4; v++) acc[m][v] = vdupq_n_f32(0);
  const uint8_t *wb = w;
  for (int64_t b = 0; b < nb; b++, wb += gb) {
    int32x4_t is[4][4];
    int8x16_t a0[4], a1[4];
    for (int m = 0; m < mr; m++) {
      a0[m] = vld1q_s8(a[m].q + b * 32);
      a1[m] = vld1q_s8(a[m].q + b * 32 + 16);
      for (int v = 0; v < 4; v++) is[m][v] = vdupq_n_s32(-off * a[m].s[b]);
    }
    if (q4) {
      DP_CHUNK(0, 0, a0, a1);
      DP_CHUNK(1, 1, a0, a1);
      DP_CHUNK(2, 2, a0, a1);
      DP_CHUNK(3, 3, a0, a1);
    } else {
      DP_CHUNK(0, 0, a0, a0);
      DP_CHUNK(1, 1, a0, a0);
      DP_CHUNK(2, 2, a0, a0);
      DP_CHUNK(3, 3, a0, a0);
      DP_CHUNK(4, 0, a1, a1);
      DP_CHUNK(5, 1, a1, a1);
      DP_CHUNK(6, 2, a1, a1);
      DP_CHUNK(7, 3, a1, a1);
    }
    for (int v = 0; v < 4; v++) {
      float32x4_t dw = v_ld_f16((const uint16_t *)wb + 4 * v);
      for (int m = 0; m < mr; m++)
        acc[m][v] = vfmaq_f32(acc[m][v], dw, vmulq_n_f32(vcvtq_f32_s32(is[m][v]), a[m].d[b]));
    }
  }
  for (int m = 0; m < mr; m++) {
    float t[NV_PG];
    for (int v = 0; v < 4; v++) vst1q_f32(t + 4 * v, acc[m][v]);
    store_rows(out + m * ldo, t, nvalid);
  }
}
PK_VARIANTS(pk_dp, DP)
#endif

/* ---------------------------------------------------------------- x86-64 */
#if defined(__x86_64__) && defined(__AVX2__)

/* 256-bit: rows 0-7 then rows 8-15 of the group (two passes over a group that L1/L2 holds).
 * DOT4 is vpdpbusd (AVX512-VNNI on 256-bit vectors) or maddubs + madd (AVX2); maddubs would
 * saturate on the biased Q8_0 bytes (255 * 127 * 2), so the AVX2 Q8_0 path un-biases and uses
 * the sign trick instead (|w| times a with w's sign). */
#define PK256_BODY(DOT4, SIGNED_Q8)                                                              \
  const int64_t gb = group_block_bytes(q4);                                                      \
  const int off = q4 ? 8 : (SIGNED_Q8 ? 0 : Q8_BIAS);                                            \
  const __m256i m4 = _mm256_set1_epi8(0x0F);                                                     \
  for (int h = 0; h < 2; h++) {                                                                  \
    __m256 acc[4];                                                                               \
    for (int m = 0; m < mr; m++) acc[m] = _mm256_setzero_ps();                                   \
    const uint8_t *wb = w;                                                                       \
    for (int64_t b = 0; b < nb; b++, wb += gb) {                                                 \
      __m256i is[4], it[4];                                                                      \
      for (int m = 0; m < mr; m++) {                                                             \
        is[m] = _mm256_set1_epi32(-off * a[m].s[b]);                                             \
        it[m] = _mm256_setzero_si256();                                                          \
      }                                                                                          \
      const int8_t *aq[4];                                                                       \
      for (int m = 0; m < mr; m++) aq[m] = a[m].q + b * 32;                                      \
      if (q4) {                                                                                  \
        for (int q = 0; q < 4; q++) {                                                            \
          __m256i c = _mm256_loadu_si256((const __m256i *)(wb + 32 + q * 64 + h * 32));          \
          __m256i lo = _mm256_and_si256(c, m4), hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), m4); \
          for (int m = 0; m < mr; m++) {                                                         \
            is[m] = DOT4(is[m], lo, _mm256_set1_epi32(ld32(aq[m] + 4 * q)));                     \
            it[m] = DOT4(it[m], hi, _mm256_set1_epi32(ld32(aq[m] + 16 + 4 * q)));                \
          }                                                                                      \
        }                                                                                        \
      } else {                                                                                   \
        for (int q = 0; q < 8; q++) {                                                            \
          __m256i c = _mm256_loadu_si256((const __m256i *)(wb + 32 + q * 64 + h * 32)), sw = c;  \
          if (SIGNED_Q8) {                                                                       \
            sw = _mm256_xor_si256(c, _mm256_set1_epi8((char)0x80));                              \
            c = _mm256_abs_epi8(sw);                                                             \
          }                                                                                      \
          for (int m = 0; m < mr; m++) {                                                         \
            __m256i av = _mm256_set1_epi32(ld32(aq[m] + 4 * q));                                 \
            if (SIGNED_Q8) av = _mm256_sign_epi8(av, sw);                                        \
            if (q & 1)                                                                           \
              it[m] = DOT4(it[m], c, av);                                                        \
            else                                                                                 \
              is[m] = DOT4(is[m], c, av);                                                        \
          }                                                                                      \
        }                                                                                        \
      }                                                                                          \
      __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wb + 16 * h)));              \
      for (int m = 0; m < mr; m++)                                                               \
        acc[m] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(is[m], it[m])), \
                                               _mm256_set1_ps(a[m].d[b])),                       \
                                 dw, acc[m]);                                                    \
    }                                                                                            \
    for (int m = 0; m < mr; m++) {                                                               \
      float t[8];                                                                                \
      _mm256_storeu_ps(t, acc[m]);                                                               \
      int nv = nvalid - 8 * h;                                                                   \
      if (nv > 0) store_rows(out + m * ldo + 8 * h, t, nv < 8 ? nv : 8);                         \
    }                                                                                            \
  }

#define DOT4_AVX2(acc, w, a) _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((w), (a)), _mm256_set1_epi16(1)))
ALWAYS_INLINE void pk_avx2(const uint8_t *w, int64_t nb, const nv_pact *a, const int mr, const int q4, float *out,
                           int64_t ldo, int nvalid) {
  PK256_BODY(DOT4_AVX2, 1)
}
PK_VARIANTS(pk_avx2, )

#if !defined(__AVX512F__)
#define VNNI256 __attribute__((target("avx512vnni,avx512vl,avx2,fma,f16c")))
#define DOT4_VNNI(acc, w, a) _mm256_dpbusd_epi32((acc), (w), (a))
VNNI256 ALWAYS_INLINE void pk_vnni256(const uint8_t *w, int64_t nb, const nv_pact *a, const int mr, const int q4,
                                      float *out, int64_t ldo, int nvalid) {
  PK256_BODY(DOT4_VNNI, 0)
}
PK_VARIANTS(pk_vnni256, VNNI256)
#endif

static int cpu_has_vnni(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
}

#if defined(__AVX512F__)
/* 512-bit: one vector is the whole group of 16 rows. Each block's int32 sums start from the
 * offset correction, two chains (low and high chunk halves) keep vpdpbusd's latency covered. */
#ifndef NV_PK_PREFETCH
#define NV_PK_PREFETCH 8
#endif
#define VNNI512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
VNNI512 ALWAYS_INLINE void pk_vnni512(const uint8_t *w, int64_t nb, const nv_pact *a, const int mr, const int q4,
                                      float *out, int64_t ldo, int nvalid) {
  const int64_t gb = group_block_bytes(q4);
  const int off = q4 ? 8 : Q8_BIAS;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  /* up to 4 rows keep two chains per row; 8 rows are 8 chains already, and two would spill */
  const int two = mr <= 4;
  __m512 acc[8];
  for (int m = 0; m < mr; m++) acc[m] = _mm512_setzero_ps();
  const uint8_t *wb = w;
  for (int64_t b = 0; b < nb; b++, wb += gb) {
    /* the weights stream once: fetch NV_PK_PREFETCH group blocks ahead, across the 4 KB pages
     * where the hardware prefetchers stop (measured: 20-30% less CPU time on a cold Q4_0
     * GEMV). Past the last block it touches nothing: prefetches do not fault. */
    for (int64_t l = 0; l < gb; l += 64) _mm_prefetch((const char *)(wb + NV_PK_PREFETCH * gb + l), _MM_HINT_T0);
    __m512i is[8], it[8];
    const int8_t *aq[8];
    for (int m = 0; m < mr; m++) {
      is[m] = _mm512_set1_epi32(-off * a[m].s[b]);
      if (two) it[m] = _mm512_setzero_si512();
      aq[m] = a[m].q + b * 32;
    }
    if (q4) {
#pragma GCC unroll 4
      for (int q = 0; q < 4; q++) {
        __m512i c = _mm512_loadu_si512(wb + 32 + q * 64);
        __m512i lo = _mm512_and_si512(c, m4), hi = _mm512_and_si512(_mm512_srli_epi16(c, 4), m4);
        for (int m = 0; m < mr; m++) {
          is[m] = _mm512_dpbusd_epi32(is[m], lo, _mm512_set1_epi32(ld32(aq[m] + 4 * q)));
          if (two)
            it[m] = _mm512_dpbusd_epi32(it[m], hi, _mm512_set1_epi32(ld32(aq[m] + 16 + 4 * q)));
          else
            is[m] = _mm512_dpbusd_epi32(is[m], hi, _mm512_set1_epi32(ld32(aq[m] + 16 + 4 * q)));
        }
      }
    } else {
#pragma GCC unroll 8
      for (int q = 0; q < 8; q++) {
        __m512i c = _mm512_loadu_si512(wb + 32 + q * 64);
        for (int m = 0; m < mr; m++) {
          if (two && (q & 1))
            it[m] = _mm512_dpbusd_epi32(it[m], c, _mm512_set1_epi32(ld32(aq[m] + 4 * q)));
          else
            is[m] = _mm512_dpbusd_epi32(is[m], c, _mm512_set1_epi32(ld32(aq[m] + 4 * q)));
        }
      }
    }
    __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wb));
    for (int m = 0; m < mr; m++) {
      __m512i sum = two ? _mm512_add_epi32(is[m], it[m]) : is[m];
      acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(a[m].d[b])), dw, acc[m]);
    }
  }
  __mmask16 k = (__mmask16)((1u << nvalid) - 1);
  for (int m = 0; m < mr; m++) _mm512_mask_storeu_ps(out + m * ldo, k, acc[m]);
}
PK_VARIANTS_W(pk_vnni512, VNNI512, 8)
#endif
#endif

nv_qpk_fn nv_qpk_select(uint32_t dtype, int int8dot) {
  const int q4 = dtype == XPU_DT_Q4_0;
  (void)int8dot;
#if defined(__aarch64__)
  if (int8dot && nv_have_dotprod()) return q4 ? pk_dp_q4 : pk_dp_q8;
#elif defined(__x86_64__) && defined(__AVX2__)
  if (int8dot && cpu_has_vnni()) {
#if defined(__AVX512F__)
    return q4 ? pk_vnni512_q4 : pk_vnni512_q8;
#else
    return q4 ? pk_vnni256_q4 : pk_vnni256_q8;
#endif
  }
  return q4 ? pk_avx2_q4 : pk_avx2_q8;
#endif
  return q4 ? pk_generic_q4 : pk_generic_q8;
}

/* ---------------------------------------------------------------- the per-context cache */

typedef struct {
  uint32_t dtype;
  const uint8_t *src;
  int64_t N, K;
  uint8_t *dst;
} pack_args;

static void pack_task(void *p, int tid, int nth) {
  pack_args *A = (pack_args *)p;
  int64_t g0, g1;
  if (nv_is_float_weight(A->dtype)) {
    nv_range(nv_fpack_panel_count(A->N), tid, nth, 1, &g0, &g1);
    nv_fpack_panels(A->dtype, A->src, A->N, A->K, g0, g1, (float *)A->dst);
    return;
  }
  nv_range((A->N + NV_PG - 1) / NV_PG, tid, nth, 1, &g0, &g1);
  nv_qpack_groups(A->dtype, A->src, A->N, A->K, g0, g1, A->dst);
}

/* 1 when [lo, hi) lies inside one shared mapping of this process (MAP_SHARED: a file, as the
 * host maps a GGUF, or a memfd). Dropping such pages loses nothing: a later read faults them
 * back from the file or the shared memory. A private mapping's pages may hold the only copy of
 * their bytes (the host's heap, a private copy of a file), so they are never dropped. A line
 * longer than the buffer is read in pieces; only a line's first piece is parsed. */
static int in_shared_mapping(uintptr_t lo, uintptr_t hi) {
  FILE *f = fopen("/proc/self/maps", "re");
  if (!f) return 0;
  char line[256];
  int start = 1, shared = 0;
  while (fgets(line, sizeof line, f)) {
    int first = start;
    start = strchr(line, '\n') != NULL;
    unsigned long a, b;
    char perms[5];
    if (!first || sscanf(line, "%lx-%lx %4s", &a, &b, perms) != 3) continue;
    if (lo >= a && hi <= b) {
      shared = perms[3] == 's';
      break;
    }
  }
  fclose(f);
  return shared;
}

/* The original bytes of a repacked weight are not read again by the kernels. Where they are
 * the host's memory (an mmap'd GGUF, imported zero-copy) or a mapped fd, the pages that lie
 * wholly inside the weight are handed back: without this a repacked model is resident twice
 * (the file's pages and the copy), which on a phone decides whether a model fits. In a shared
 * mapping MADV_DONTNEED drops them from this process (the page cache keeps them for the next
 * start; a later reader, e.g. GET_ROWS on a tied embedding, faults them back in). Elsewhere
 * only MADV_COLD is safe: the pages stay, first in line when memory runs short. Plugin-owned
 * buffers are left alone. A host that replaces a shared mapping under the plugin by a copy
 * (xpu's gguf does when the file is overwritten) makes the copy shared memory too, so that a
 * drop racing with the replacement loses nothing either. */
static void release_original(const nv_buffer *b, uint64_t off, uint64_t len) {
  if (b->owned == 1) return;
  long pg = sysconf(_SC_PAGESIZE);
  if (pg <= 0) return;
  uintptr_t lo = (uintptr_t)(b->data + off), hi = lo + len;
  lo = (lo + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
  hi &= ~((uintptr_t)pg - 1);
  if (hi <= lo) return;
  if (in_shared_mapping(lo, hi)) {
    (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
    return;
  }
#if defined(MADV_COLD)
  (void)madvise((void *)lo, hi - lo, MADV_COLD);
#endif
}

static const char *dtype_name(uint32_t dt) {
  switch (dt) {
  case XPU_DT_Q4_0: return "q4_0";
  case XPU_DT_Q8_0: return "q8_0";
  case XPU_DT_Q4_K: return "q4_k";
  case XPU_DT_Q5_K: return "q5_k";
  case XPU_DT_Q6_K: return "q6_k";
  default: return "quantized";
  }
}

/* bytes of one group of NV_PG rows in the repacked layout of a quantized [*, K] weight: the
 * layout is group-major, so a group-aligned row range is a contiguous piece of it */
static uint64_t group_bytes(uint32_t dtype, int64_t K) { return nv_qpack_bytes(dtype, NV_PG, K); }

/* A cached copy (not a view) of the same buffer, generation, dtype and K that holds rows
 * [off, off + N rows) from a whole group on, or NULL. Float weights are packed in blocks of
 * the GEMM's walk, not by rows: they have no views. Under pkmu. */
static nv_qpacked *covering(nv_context *c, const nv_buffer *buf, uint64_t off, unsigned gen, uint32_t dtype,
                            int64_t N, int64_t K) {
  if (nv_is_float_weight(dtype)) return NULL;
  uint64_t row = nv_row_bytes(dtype, K);
  for (nv_qpacked *p = c->pk; p; p = p->next) {
    if (p->parent || p->buf != buf || p->gen != gen || p->dtype != dtype || p->K != K || off < p->off) continue;
    uint64_t d = off - p->off;
    if (d % (row * NV_PG) == 0 && d / row + (uint64_t)N <= (uint64_t)p->N) return p;
  }
  return NULL;
}

nv_qpacked *nv_qpack_get(nv_context *c, nv_buffer *buf, uint64_t off, uint32_t dtype, int64_t N, int64_t K) {
  unsigned gen = atomic_load(&buf->gen);
  pthread_mutex_lock(&c->pkmu);
  for (nv_qpacked *p = c->pk; p; p = p->next)
    if (p->buf == buf && p->off == off && p->gen == gen && p->dtype == dtype && p->N == N && p->K == K) {
      p->refs++;
      pthread_mutex_unlock(&c->pkmu);
      return p;
    }
  nv_qpacked *p = (nv_qpacked *)calloc(1, sizeof *p);
  if (!p) {
    pthread_mutex_unlock(&c->pkmu);
    return NULL;
  }
  nv_qpacked *whole = covering(c, buf, off, gen, dtype, N, K);
  if (whole) {
    uint64_t row = nv_row_bytes(dtype, K);
    whole->refs++;
    *p = (nv_qpacked){c->pk, buf, off, gen, dtype, N, K, 1,
                      whole->data + (off - whole->off) / (row * NV_PG) * group_bytes(dtype, K), 0, whole};
    c->pk = p;
    pthread_mutex_unlock(&c->pkmu);
    xpu_log(&nv_reg, XPU_LOG_DEBUG, "neon: a %lldx%lld %s weight is a view of a cached %lldx%lld copy",
            (long long)N, (long long)K, dtype_name(dtype), (long long)whole->N, (long long)whole->K);
    return p;
  }
  /* packed under the lock: a second executable sharing the weight waits for this copy instead
   * of making its own */
  uint64_t bytes = nv_qpack_bytes(dtype, N, K);
  uint8_t *d = (uint8_t *)nv_alloc(bytes);
  if (!d) {
    free(p);
    pthread_mutex_unlock(&c->pkmu);
    return NULL;
  }
  pack_args A = {dtype, buf->data + off, N, K, d};
  nv_pool_run(c->pool, NULL, nv_pool_size(c->pool), pack_task, &A);
  /* a float weight's original stays in use: the decode graphs' GEMV reads it */
  if (!nv_is_float_weight(dtype))
    release_original(buf, off, (uint64_t)N * nv_row_bytes(dtype, K));
  *p = (nv_qpacked){c->pk, buf, off, gen, dtype, N, K, 1, d, bytes, NULL};
  c->pk = p;
  c->pk_bytes += bytes;
  uint64_t total = c->pk_bytes;
  pthread_mutex_unlock(&c->pkmu);
  xpu_log(&nv_reg, XPU_LOG_DEBUG, "neon: repacked a %lldx%lld %s weight: %llu bytes (context total %llu)",
          (long long)N, (long long)K, dtype_name(dtype), (unsigned long long)bytes,
          (unsigned long long)total);
  return p;
}

void nv_qpack_put(nv_context *c, nv_qpacked *p) {
  pthread_mutex_lock(&c->pkmu);
  /* a view's last reference drops its parent's */
  while (p && --p->refs == 0) {
    for (nv_qpacked **pp = &c->pk; *pp; pp = &(*pp)->next)
      if (*pp == p) {
        *pp = p->next;
        break;
      }
    nv_qpacked *parent = p->parent;
    if (!parent) {
      c->pk_bytes -= p->bytes;
      free(p->data);
    }
    free(p);
    p = parent;
  }
  pthread_mutex_unlock(&c->pkmu);
}
