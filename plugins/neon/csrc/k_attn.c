/*
 * k_attn.c: ROPE and fused ATTENTION. Attention streams over the visible keys in blocks of
 * ATT_BLOCK with an online softmax (running max and sum, accumulator rescaled when the max
 * grows), so no score matrix is materialized and no K/V row past the last visible key is read.
 * With a tree mask (op set v2) the visible keys are the prefix before q_offset plus the masked
 * block's marked keys; each window of ATT_BLOCK key positions gathers a row's visible keys by
 * index, so a masked key is neither read nor given weight. Small heads (att_small) take a
 * window at a time instead, keys across the vector lanes, and give masked keys no weight.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "neon.h"
#include "neon_simd.h"
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#endif

#define ATT_BLOCK 32
#define ATT_MAX_GROUP 16 /* query heads per KV head processed together */
#define ATT_MAX_QB 16    /* query rows per task (they share each K/V row load) */
#define ATT_QB_FLOATS 16384

/* ---------------------------------------------------------------- rope */

typedef struct {
  const uint8_t *x;
  uint8_t *o;
  const int32_t *pos;
  uint32_t dt;
  int64_t B, T, H, D, nrot;
  int neox;
  double base, fscale;
  nv_run *r;
} rope_args;

#define ROPE_FREQS 128 /* rotary pairs whose frequencies a task keeps (head sizes up to 256) */

static void rope_task(void *p, int tid, int nth) {
  rope_args *A = (rope_args *)p;
  int64_t r0, r1, half = A->nrot / 2;
  nv_range(A->B * A->T, tid, nth, 1, &r0, &r1);
  float *cs = (float *)nv_scratch(A->r, tid), *sn = cs + half, *buf = sn + half;
  /* the frequencies do not depend on the row: pow once per task, not once per row and pair
   * (a verify pass ropes many rows of a small model, where libm's pow showed in profiles) */
  double freq[ROPE_FREQS];
  const int cached = half <= ROPE_FREQS;
  for (int64_t i = 0; cached && i < half; i++) freq[i] = pow(A->base, -2.0 * (double)i / (double)A->nrot);
  for (int64_t bt = r0; bt < r1; bt++) {
    int64_t t = bt % A->T;
    double pos = (double)A->pos[t] * A->fscale;
    for (int64_t i = 0; i < half; i++) {
      double th = pos * (cached ? freq[i] : pow(A->base, -2.0 * (double)i / (double)A->nrot));
      cs[i] = (float)cos(th);
      sn[i] = (float)sin(th);
    }
    for (int64_t h = 0; h < A->H; h++) {
      int64_t off = (bt * A->H + h) * A->D;
      const float *x;
      float *o;
      if (A->dt == XPU_DT_F32) {
        x = (const float *)A->x + off;
        o = (float *)A->o + off;
      } else {
        nv_f16_row_to_f32((const uint16_t *)A->x + off, buf, A->D);
        x = o = buf;
      }
      if (A->neox) {
        int64_t i = 0;
        for (; i + 4 <= half; i += 4) {
          float32x4_t u = vld1q_f32(x + i), v = vld1q_f32(x + i + half);
          float32x4_t c = vld1q_f32(cs + i), s = vld1q_f32(sn + i);
          vst1q_f32(o + i, v_fms(vmulq_f32(u, c), v, s));
          vst1q_f32(o + i + half, vfmaq_f32(vmulq_f32(u, s), v, c));
        }
        for (; i < half; i++) {
          float u = x[i], v = x[i + half];
          o[i] = u * cs[i] - v * sn[i];
          o[i + half] = u * sn[i] + v * cs[i];
        }
      } else {
        int64_t i = 0;
        for (; i + 4 <= half; i += 4) {
          float32x4x2_t uv = vld2q_f32(x + 2 * i); /* deinterleaves the (x[2i], x[2i+1]) pairs */
          float32x4_t c = vld1q_f32(cs + i), sn4 = vld1q_f32(sn + i), u = uv.val[0], v = uv.val[1];
          uv.val[0] = v_fms(vmulq_f32(u, c), v, sn4);
          uv.val[1] = vfmaq_f32(vmulq_f32(u, sn4), v, c);
          vst2q_f32(o + 2 * i, uv);
        }
        for (; i < half; i++) {
          float u = x[2 * i], v = x[2 * i + 1];
          o[2 * i] = u * cs[i] - v * sn[i];
          o[2 * i + 1] = u * sn[i] + v * cs[i];
        }
      }
      if (A->dt == XPU_DT_F32) {
        if (o != x) memcpy(o + A->nrot, x + A->nrot, (size_t)(A->D - A->nrot) * 4);
      } else {
        nv_f32_row_to_f16(buf, (uint16_t *)A->o + off, A->D);
      }
    }
  }
}

xpu_status nv_k_rope(nv_run *r, const xpu_ir_node *n) {
  const xpu_ir_tensor *x = &r->g->tensors[n->inputs[0]];
  rope_args A;
  memset(&A, 0, sizeof A);
  A.x = r->ptr[n->inputs[0]];
  A.o = r->ptr[n->output];
  A.pos = (const int32_t *)r->ptr[n->inputs[1]];
  A.dt = x->dtype;
  A.B = x->rank == 4 ? x->shape[0] : 1;
  A.T = x->shape[x->rank - 3];
  A.H = x->shape[x->rank - 2];
  A.D = x->shape[x->rank - 1];
  A.nrot = n->iattr[1] ? n->iattr[1] : A.D;
  A.neox = n->iattr[0] == 2;
  A.base = n->fattr[0] == 0 ? 10000.0 : (double)n->fattr[0];
  A.fscale = n->fattr[1] == 0 ? 1.0 : (double)n->fattr[1];
  A.r = r;
  if (A.B * A.T * A.H * A.D == 0) return XPU_OK;
  nv_parallel(r, A.B * A.T * A.H * A.D * 4, rope_task, &A);
  return XPU_OK;
}

/* ---------------------------------------------------------------- attention */

typedef struct {
  const uint8_t *q, *k, *v;
  const int8_t *mask; /* i8 [Tq, Tq] or NULL */
  uint8_t *o;
  uint32_t qt, kt, vt;
  int64_t Tq, Hq, Tk, Hkv, D, Dv, off;
  int64_t Hks; /* kv heads in a row of k and v: Hkv, or more when the node reads a head range
                * (op set v4; k and v then start at the range's first head) */
  int64_t gs;  /* query heads per task */
  int64_t qb; /* query rows per task */
  size_t krow, vrow; /* bytes of one head's row of k and of v (Q8_0/Q4_0: whole blocks) */
  int causal;
  float scale;
  float softcap; /* op set v5: scores become softcap * tanh(score / softcap); 0: none */
  int64_t window; /* op set v5: sliding window (keys j > i + off - window); 0: none */
  int64_t woff;   /* off - window, saturated: query i sees keys from i + woff + 1 on */
  int nsplit;     /* a decode row split along its keys: the threads that ran (att_split_task) */
  nv_run *r;
} att_args;

static inline int att_is_q(uint32_t dt) { return dt == XPU_DT_Q8_0 || dt == XPU_DT_Q4_0; }

/* s[j] = cap * tanh(s[j] / cap) for j < n (the soft-cap of op set v5), at the native width */
static void att_softcap(float *s, int64_t n, float cap);

/* bytes of one Q8_0 or Q4_0 block of 32 values */
static inline size_t att_qblock(uint32_t dt) { return dt == XPU_DT_Q8_0 ? 34 : 18; }

/* A Q8_0 or Q4_0 block's 32 codes (Q4_0's nibbles less 8) as floats in 8 vectors; returns the
 * block's scale d. The caller multiplies by d: d * q is exact in f32 (an f16 scale times an
 * integer of at most 8 bits), the value GET_ROWS gives, and a product p * d * q folds the scale
 * into the weight p. */
static inline float att_q32_neon(const uint8_t *blk, uint32_t dt, float32x4_t out[8]) {
  uint16_t h;
  memcpy(&h, blk, 2);
  int8x16_t q0, q1;
  if (dt == XPU_DT_Q8_0) {
    q0 = vld1q_s8((const int8_t *)blk + 2);
    q1 = vld1q_s8((const int8_t *)blk + 18);
  } else {
    uint8x16_t v = vld1q_u8(blk + 2);
    q0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F))), vdupq_n_s8(8));
    q1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
  }
  int16x8_t w[4] = {vmovl_s8(vget_low_s8(q0)), vmovl_s8(vget_high_s8(q0)), vmovl_s8(vget_low_s8(q1)),
                    vmovl_s8(vget_high_s8(q1))};
  for (int i = 0; i < 4; i++) {
    out[2 * i] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w[i])));
    out[2 * i + 1] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(w[i])));
  }
  return nv_h2f(h);
}

/* q . k for a Q8_0/Q4_0 row k of d values (d % 32 == 0) */
static float dot_kq(const float *q, const uint8_t *k, uint32_t kt, int64_t d) {
  float32x4_t s0 = vdupq_n_f32(0), s1 = s0;
  const size_t bb = att_qblock(kt);
  for (int64_t b = 0; b < d / 32; b++) {
    float32x4_t x[8];
    const float32x4_t vd = vdupq_n_f32(att_q32_neon(k + (size_t)b * bb, kt, x));
    const float *qb = q + b * 32;
    for (int i = 0; i < 8; i += 2) {
      s0 = vfmaq_f32(s0, vld1q_f32(qb + 4 * i), vmulq_f32(x[i], vd));
      s1 = vfmaq_f32(s1, vld1q_f32(qb + 4 * i + 4), vmulq_f32(x[i + 1], vd));
    }
  }
  return v_hsum(vaddq_f32(s0, s1));
}

#if !(defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
/* acc = acc * c + sum_j p[j] * v_j for Q8_0/Q4_0 rows v_j (dv % 32 == 0): a block's 32
 * accumulators stay in registers across the rows; the block's scale joins p[j] (the x86 AVX
 * builds take pv_block_qvec) */
static void pv_block_q(float *acc, float c, const float *p, const uint8_t *const *vrows, int64_t jb, uint32_t vt,
                       int64_t dv) {
  const size_t bb = att_qblock(vt);
  const float32x4_t vc = vdupq_n_f32(c);
  for (int64_t b = 0; b < dv / 32; b++) {
    float *ab = acc + b * 32;
    float32x4_t a[8];
    for (int i = 0; i < 8; i++) a[i] = vmulq_f32(vld1q_f32(ab + 4 * i), vc);
    for (int64_t j = 0; j < jb; j++) {
      float32x4_t x[8];
      const float32x4_t pd = vdupq_n_f32(p[j] * att_q32_neon(vrows[j] + (size_t)b * bb, vt, x));
      for (int i = 0; i < 8; i++) a[i] = vfmaq_f32(a[i], pd, x[i]);
    }
    for (int i = 0; i < 8; i++) vst1q_f32(ab + 4 * i, a[i]);
  }
}
#endif

static float dot_k(const float *q, const uint8_t *k, uint32_t kt, int64_t d) {
  float32x4_t s0 = vdupq_n_f32(0), s1 = s0;
  int64_t i = 0;
  float s;
  if (att_is_q(kt)) return dot_kq(q, k, kt, d);
  if (kt == XPU_DT_F32) {
    const float *kf = (const float *)k;
    for (; i + 8 <= d; i += 8) {
      s0 = vfmaq_f32(s0, vld1q_f32(q + i), vld1q_f32(kf + i));
      s1 = vfmaq_f32(s1, vld1q_f32(q + i + 4), vld1q_f32(kf + i + 4));
    }
    s = v_hsum(vaddq_f32(s0, s1));
    for (; i < d; i++) s += q[i] * kf[i];
  } else {
    const uint16_t *kh = (const uint16_t *)k;
    for (; i + 4 <= d; i += 4)
      s0 = vfmaq_f32(s0, vld1q_f32(q + i), v_ld_f16(kh + i));
    s = v_hsum(s0);
    for (; i < d; i++) s += q[i] * nv_f16_to_f32(kh[i]);
  }
  return s;
}

static void axpy_v(float *acc, float c, float p, const uint8_t *v, uint32_t vt, int64_t dv);

/* Native x86 vectors for the two loops that stream the KV cache (QK dot products, P times V):
 * through SIMDe they run 4 lanes at a time and stay well below the read bandwidth. Used when
 * the head size is a multiple of the vector width, which real models' are. */
#if defined(__x86_64__) && defined(__AVX512F__)
#define AW 16
typedef __m512 avec;
#define A_ZERO() _mm512_setzero_ps()
#define A_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define A_MUL(a, b) _mm512_mul_ps((a), (b))
#define A_ADD(a, b) _mm512_add_ps((a), (b))
#define A_SET1(x) _mm512_set1_ps(x)
#define A_LDF(p) _mm512_loadu_ps(p)
#define A_LDH(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define A_ST(p, v) _mm512_storeu_ps((p), (v))
#define A_HSUM(v) _mm512_reduce_add_ps(v)
#elif defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define AW 8
typedef __m256 avec;
static inline float a_hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#define A_ZERO() _mm256_setzero_ps()
#define A_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define A_MUL(a, b) _mm256_mul_ps((a), (b))
#define A_ADD(a, b) _mm256_add_ps((a), (b))
#define A_SET1(x) _mm256_set1_ps(x)
#define A_LDF(p) _mm256_loadu_ps(p)
#define A_LDH(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define A_ST(p, v) _mm256_storeu_ps((p), (v))
#define A_HSUM(v) a_hsum8(v)
#endif

#if defined(AW)
/* d % AW == 0; two sums so that consecutive FMAs do not wait on each other */
static inline float dot_k_vec(const float *q, const uint8_t *k, uint32_t kt, int64_t d) {
  avec a0 = A_ZERO(), a1 = A_ZERO();
  int64_t i = 0;
  if (kt == XPU_DT_F32) {
    const float *kf = (const float *)k;
    for (; i + 2 * AW <= d; i += 2 * AW) {
      a0 = A_FMA(A_LDF(q + i), A_LDF(kf + i), a0);
      a1 = A_FMA(A_LDF(q + i + AW), A_LDF(kf + i + AW), a1);
    }
    if (i < d) a0 = A_FMA(A_LDF(q + i), A_LDF(kf + i), a0);
  } else {
    const uint16_t *kh = (const uint16_t *)k;
    for (; i + 2 * AW <= d; i += 2 * AW) {
      a0 = A_FMA(A_LDF(q + i), A_LDH(kh + i), a0);
      a1 = A_FMA(A_LDF(q + i + AW), A_LDH(kh + i + AW), a1);
    }
    if (i < d) a0 = A_FMA(A_LDF(q + i), A_LDH(kh + i), a0);
  }
  return A_HSUM(A_ADD(a0, a1));
}

/* s[g * sstride] = scale * (the sum of y_g's 8 lanes) for g = 0..3: per 128-bit lane, two
 * shuffling adds give [sum y0, sum y1, sum y2, sum y3] of that lane's 4 values, and the two
 * lanes are added once (instead of four full horizontal sums) */
static inline void sum4_store(__m256 y0, __m256 y1, __m256 y2, __m256 y3, float scale, float *s, int64_t sstride) {
  __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(y0, y1), _mm256_hadd_ps(y2, y3));
  __m128 r = _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)), _mm_set1_ps(scale));
  float t[4];
  _mm_storeu_ps(t, r);
  for (int g = 0; g < 4; g++) s[g * sstride] = t[g];
}

#if defined(__AVX512F__)
/* Four query heads against one K row (d % 16 == 0): the row is loaded and converted once, and
 * the four sums are reduced together (two shuffling adds instead of four full reductions). */
static inline void dot4_k_vec(const float *q, int64_t d, const uint8_t *k, uint32_t kt, float scale, float *s,
                              int64_t sstride) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < d; i += 16) {
    __m512 kv = kt == XPU_DT_F32 ? _mm512_loadu_ps((const float *)k + i)
                                 : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)k + i)));
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), kv, a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + d + i), kv, a1);
    a2 = _mm512_fmadd_ps(_mm512_loadu_ps(q + 2 * d + i), kv, a2);
    a3 = _mm512_fmadd_ps(_mm512_loadu_ps(q + 3 * d + i), kv, a3);
  }
#define HALVES(a) _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)))
  __m256 y0 = HALVES(a0), y1 = HALVES(a1), y2 = HALVES(a2), y3 = HALVES(a3);
#undef HALVES
  sum4_store(y0, y1, y2, y3, scale, s, sstride);
}
#endif

#if !defined(__AVX512F__)
/* Four query heads against one K row on AVX2 (d % 16 == 0), as dot4_k_vec does on AVX-512: the
 * row is loaded and converted once, two sums per head keep the FMAs from waiting on each
 * other, and the four totals come out of one shuffling reduction instead of four horizontal
 * sums (which were a quarter of a decode row's attention). */
static inline void dot4_k_vec8(const float *q, int64_t d, const uint8_t *k, uint32_t kt, float scale, float *s,
                               int64_t sstride) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  for (int64_t i = 0; i < d; i += 16) {
    __m256 k0, k1;
    if (kt == XPU_DT_F32) {
      k0 = _mm256_loadu_ps((const float *)k + i);
      k1 = _mm256_loadu_ps((const float *)k + i + 8);
    } else {
      k0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)k + i)));
      k1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)k + i + 8)));
    }
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), k0, a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + i), k0, a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 2 * d + i), k0, a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 3 * d + i), k0, a3);
    b0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), k1, b0);
    b1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + i + 8), k1, b1);
    b2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 2 * d + i + 8), k1, b2);
    b3 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 3 * d + i + 8), k1, b3);
  }
  a0 = _mm256_add_ps(a0, b0);
  a1 = _mm256_add_ps(a1, b1);
  a2 = _mm256_add_ps(a2, b2);
  a3 = _mm256_add_ps(a3, b3);
  sum4_store(a0, a1, a2, a3, scale, s, sstride);
}
#endif

/* pv_block for dv % AW == 0: 4 vectors of the accumulator in registers across the rows */
static void pv_block_vec(float *acc, float c, const float *p, const uint8_t *const *vrows, int64_t jb, uint32_t vt,
                         int64_t dv) {
  const avec vc = A_SET1(c);
  int64_t d = 0;
  for (; d + 4 * AW <= dv; d += 4 * AW) {
    avec a0 = A_MUL(A_LDF(acc + d), vc), a1 = A_MUL(A_LDF(acc + d + AW), vc);
    avec a2 = A_MUL(A_LDF(acc + d + 2 * AW), vc), a3 = A_MUL(A_LDF(acc + d + 3 * AW), vc);
    if (vt == XPU_DT_F32) {
      for (int64_t j = 0; j < jb; j++) {
        const float *v = (const float *)vrows[j] + d;
        avec pj = A_SET1(p[j]);
        a0 = A_FMA(pj, A_LDF(v), a0);
        a1 = A_FMA(pj, A_LDF(v + AW), a1);
        a2 = A_FMA(pj, A_LDF(v + 2 * AW), a2);
        a3 = A_FMA(pj, A_LDF(v + 3 * AW), a3);
      }
    } else {
      for (int64_t j = 0; j < jb; j++) {
        const uint16_t *v = (const uint16_t *)vrows[j] + d;
        avec pj = A_SET1(p[j]);
        a0 = A_FMA(pj, A_LDH(v), a0);
        a1 = A_FMA(pj, A_LDH(v + AW), a1);
        a2 = A_FMA(pj, A_LDH(v + 2 * AW), a2);
        a3 = A_FMA(pj, A_LDH(v + 3 * AW), a3);
      }
    }
    A_ST(acc + d, a0);
    A_ST(acc + d + AW, a1);
    A_ST(acc + d + 2 * AW, a2);
    A_ST(acc + d + 3 * AW, a3);
  }
  for (; d < dv; d += AW) {
    avec a0 = A_MUL(A_LDF(acc + d), vc);
    for (int64_t j = 0; j < jb; j++) {
      avec pj = A_SET1(p[j]);
      a0 = vt == XPU_DT_F32 ? A_FMA(pj, A_LDF((const float *)vrows[j] + d), a0)
                            : A_FMA(pj, A_LDH((const uint16_t *)vrows[j] + d), a0);
    }
    A_ST(acc + d, a0);
  }
}

/* Q8_0/Q4_0 K and V read natively: each 32-value block's codes are widened to floats in
 * registers (AQ vectors) and scaled there, never written out, so the cache is read at its
 * quantized size (34 or 18 bytes per 32 values against 64 for f16). */
#define AQ (32 / AW)
#if AW == 16
#define A_TO256(a) _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)))
#else
#define A_TO256(a) (a)
#endif

/* a block's 32 codes (Q4_0's nibbles less 8) as floats; returns its scale d (att_q32_neon) */
static inline float att_q32(const uint8_t *blk, uint32_t dt, avec x[AQ]) {
  uint16_t h;
  memcpy(&h, blk, 2);
#if AW == 16
  if (dt == XPU_DT_Q8_0) {
    const __m256i b = _mm256_loadu_si256((const __m256i *)(blk + 2));
    x[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(b)));
    x[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(b, 1)));
  } else {
    const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)));
    const __m512i eight = _mm512_set1_epi32(8);
    x[0] = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(w, _mm512_set1_epi32(15)), eight));
    x[1] = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(w, 4), eight));
  }
#else
  if (dt == XPU_DT_Q8_0) {
    for (int i = 0; i < 4; i++)
      x[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * i))));
  } else {
    const __m128i b = _mm_loadu_si128((const __m128i *)(blk + 2));
    const __m256i w0 = _mm256_cvtepu8_epi32(b), w1 = _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8));
    const __m256i m = _mm256_set1_epi32(15), eight = _mm256_set1_epi32(8);
    x[0] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(w0, m), eight));
    x[1] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(w1, m), eight));
    x[2] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(w0, 4), eight));
    x[3] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(w1, 4), eight));
  }
#endif
  return nv_h2f(h);
}

/* q . k for a Q8_0/Q4_0 row of d values (d % 32 == 0) */
static inline float dot_kq_vec(const float *q, const uint8_t *k, uint32_t kt, int64_t d) {
  avec a0 = A_ZERO(), a1 = A_ZERO();
  const size_t bb = att_qblock(kt);
  for (int64_t b = 0; b < d / 32; b++) {
    avec x[AQ];
    const avec vd = A_SET1(att_q32(k + (size_t)b * bb, kt, x));
    for (int i = 0; i < AQ; i += 2) {
      a0 = A_FMA(A_LDF(q + b * 32 + i * AW), A_MUL(x[i], vd), a0);
      a1 = A_FMA(A_LDF(q + b * 32 + (i + 1) * AW), A_MUL(x[i + 1], vd), a1);
    }
  }
  return A_HSUM(A_ADD(a0, a1));
}

/* four query heads against one Q8_0/Q4_0 K row, as dot4_k_vec: the block is widened and
 * scaled once for the four, two sums per head */
static inline void dot4_kq_vec(const float *q, int64_t d, const uint8_t *k, uint32_t kt, float scale, float *s,
                               int64_t sstride) {
  avec a[4][2];
  for (int g = 0; g < 4; g++) a[g][0] = a[g][1] = A_ZERO();
  const size_t bb = att_qblock(kt);
  for (int64_t b = 0; b < d / 32; b++) {
    avec x[AQ];
    const avec vd = A_SET1(att_q32(k + (size_t)b * bb, kt, x));
    for (int i = 0; i < AQ; i++) {
      const avec kv = A_MUL(x[i], vd);
      const float *qi = q + b * 32 + i * AW;
      for (int g = 0; g < 4; g++) a[g][i & 1] = A_FMA(A_LDF(qi + g * d), kv, a[g][i & 1]);
    }
  }
  sum4_store(A_TO256(A_ADD(a[0][0], a[0][1])), A_TO256(A_ADD(a[1][0], a[1][1])), A_TO256(A_ADD(a[2][0], a[2][1])),
             A_TO256(A_ADD(a[3][0], a[3][1])), scale, s, sstride);
}

/* pv_block_q on native vectors: two blocks (64 values) of accumulators in registers across
 * the rows where dv allows, so that 2 * AQ independent FMA chains run; a value is p * (d * q),
 * as pv4_block computes it */
static void pv_block_qvec(float *acc, float c, const float *p, const uint8_t *const *vrows, int64_t jb, uint32_t vt,
                          int64_t dv) {
  const size_t bb = att_qblock(vt);
  const avec vc = A_SET1(c);
  int64_t b = 0;
  for (; b + 2 <= dv / 32; b += 2) {
    float *ab = acc + b * 32;
    avec a[2 * AQ];
    for (int i = 0; i < 2 * AQ; i++) a[i] = A_MUL(A_LDF(ab + i * AW), vc);
    for (int64_t j = 0; j < jb; j++) {
      avec x[AQ], y[AQ];
      const uint8_t *vb = vrows[j] + (size_t)b * bb;
      const avec d0 = A_SET1(att_q32(vb, vt, x)), d1 = A_SET1(att_q32(vb + bb, vt, y)), pj = A_SET1(p[j]);
      for (int i = 0; i < AQ; i++) {
        a[i] = A_FMA(pj, A_MUL(x[i], d0), a[i]);
        a[AQ + i] = A_FMA(pj, A_MUL(y[i], d1), a[AQ + i]);
      }
    }
    for (int i = 0; i < 2 * AQ; i++) A_ST(ab + i * AW, a[i]);
  }
  if (b < dv / 32) {
    float *ab = acc + b * 32;
    avec a[AQ];
    for (int i = 0; i < AQ; i++) a[i] = A_MUL(A_LDF(ab + i * AW), vc);
    for (int64_t j = 0; j < jb; j++) {
      avec x[AQ];
      const avec vd = A_SET1(att_q32(vrows[j] + (size_t)b * bb, vt, x)), pj = A_SET1(p[j]);
      for (int i = 0; i < AQ; i++) a[i] = A_FMA(pj, A_MUL(x[i], vd), a[i]);
    }
    for (int i = 0; i < AQ; i++) A_ST(ab + i * AW, a[i]);
  }
}

#if AW == 16
/* One chunk of nv (1..4) vectors at value d of P x V for four heads of a group: each V row's
 * chunk is loaded and widened once for the four (up to 16 accumulators in registers), where
 * pv_block_vec/pv_block_qvec head by head converted every row once per head. Per accumulator
 * the operations are theirs in the same order (acc * c, then one FMA per row), so a head gets
 * the same bits either way. */
static inline __attribute__((always_inline)) void pv4_chunk(float *acc, int64_t dvs, const float *c, const float *p,
                                                            const uint8_t *const *vrows, int64_t jb, uint32_t vt,
                                                            int64_t d, const int nv) {
  __m512 a[4][4];
  for (int g = 0; g < 4; g++)
    for (int i = 0; i < nv; i++) a[g][i] = _mm512_mul_ps(_mm512_loadu_ps(acc + g * dvs + d + 16 * i), _mm512_set1_ps(c[g]));
  const size_t bb = att_is_q(vt) ? att_qblock(vt) : 0;
  for (int64_t j = 0; j < jb; j++) {
    __m512 x[4];
    if (bb) {
      for (int i = 0; i < nv; i += 2) {
        const __m512 vd = _mm512_set1_ps(att_q32(vrows[j] + (size_t)((d + 16 * i) / 32) * bb, vt, x + i));
        x[i] = _mm512_mul_ps(x[i], vd);
        x[i + 1] = _mm512_mul_ps(x[i + 1], vd);
      }
    } else if (vt == XPU_DT_F32) {
      for (int i = 0; i < nv; i++) x[i] = _mm512_loadu_ps((const float *)vrows[j] + d + 16 * i);
    } else {
      for (int i = 0; i < nv; i++) x[i] = A_LDH((const uint16_t *)vrows[j] + d + 16 * i);
    }
    for (int g = 0; g < 4; g++) {
      const __m512 pg = _mm512_set1_ps(p[g * ATT_BLOCK + j]);
      for (int i = 0; i < nv; i++) a[g][i] = _mm512_fmadd_ps(pg, x[i], a[g][i]);
    }
  }
  for (int g = 0; g < 4; g++)
    for (int i = 0; i < nv; i++) _mm512_storeu_ps(acc + g * dvs + d + 16 * i, a[g][i]);
}

/* acc_g = acc_g * c[g] + sum_j p[g][j] * v_j for the four heads g of a group (dv % 16 == 0,
 * and % 32 for a quantized V) */
static void pv4_block(float *acc, const float *c, const float *p, const uint8_t *const *vrows, int64_t jb, uint32_t vt,
                      int64_t dv) {
  int64_t d = 0;
  for (; d + 64 <= dv; d += 64) pv4_chunk(acc, dv, c, p, vrows, jb, vt, d, 4);
  if (dv - d >= 32) {
    pv4_chunk(acc, dv, c, p, vrows, jb, vt, d, 2);
    d += 32;
  }
  if (d < dv) pv4_chunk(acc, dv, c, p, vrows, jb, vt, d, 1);
}
#endif
#endif

/* acc = acc * c + sum_j p[j] * v_j: 16 accumulator lanes stay in registers across the block's
 * rows instead of being loaded and stored once per row */
static void pv_block(float *acc, float c, const float *p, const uint8_t *const *vrows, int64_t jb, uint32_t vt,
                     int64_t dv) {
  int64_t d = 0;
  const float32x4_t vc = vdupq_n_f32(c);
  for (; d + 16 <= dv; d += 16) {
    float32x4_t a0 = vmulq_f32(vld1q_f32(acc + d), vc), a1 = vmulq_f32(vld1q_f32(acc + d + 4), vc);
    float32x4_t a2 = vmulq_f32(vld1q_f32(acc + d + 8), vc), a3 = vmulq_f32(vld1q_f32(acc + d + 12), vc);
    if (vt == XPU_DT_F32) {
      for (int64_t j = 0; j < jb; j++) {
        const float *v = (const float *)vrows[j] + d;
        float32x4_t pj = vdupq_n_f32(p[j]);
        a0 = vfmaq_f32(a0, pj, vld1q_f32(v));
        a1 = vfmaq_f32(a1, pj, vld1q_f32(v + 4));
        a2 = vfmaq_f32(a2, pj, vld1q_f32(v + 8));
        a3 = vfmaq_f32(a3, pj, vld1q_f32(v + 12));
      }
    } else {
      for (int64_t j = 0; j < jb; j++) {
        const uint16_t *v = (const uint16_t *)vrows[j] + d;
        float32x4_t pj = vdupq_n_f32(p[j]);
        a0 = vfmaq_f32(a0, pj, v_ld_f16(v));
        a1 = vfmaq_f32(a1, pj, v_ld_f16(v + 4));
        a2 = vfmaq_f32(a2, pj, v_ld_f16(v + 8));
        a3 = vfmaq_f32(a3, pj, v_ld_f16(v + 12));
      }
    }
    vst1q_f32(acc + d, a0);
    vst1q_f32(acc + d + 4, a1);
    vst1q_f32(acc + d + 8, a2);
    vst1q_f32(acc + d + 12, a3);
  }
  if (d < dv) {
    for (int64_t j = 0; j < jb; j++) {
      const uint8_t *v = vrows[j] + (size_t)d * (vt == XPU_DT_F32 ? 4 : 2);
      axpy_v(acc + d, j == 0 ? c : 1.0f, p[j], v, vt, dv - d);
    }
  }
}

/* acc = acc * c + p * v */
static void axpy_v(float *acc, float c, float p, const uint8_t *v, uint32_t vt, int64_t dv) {
  float32x4_t vc = vdupq_n_f32(c), vp = vdupq_n_f32(p);
  int64_t i = 0;
  if (vt == XPU_DT_F32) {
    const float *vf = (const float *)v;
    for (; i + 4 <= dv; i += 4) vst1q_f32(acc + i, vfmaq_f32(vmulq_f32(vld1q_f32(acc + i), vc), vp, vld1q_f32(vf + i)));
    for (; i < dv; i++) acc[i] = acc[i] * c + p * vf[i];
  } else {
    const uint16_t *vh = (const uint16_t *)v;
    for (; i + 4 <= dv; i += 4)
      vst1q_f32(acc + i, vfmaq_f32(vmulq_f32(vld1q_f32(acc + i), vc), vp,
                                   v_ld_f16(vh + i)));
    for (; i < dv; i++) acc[i] = acc[i] * c + p * nv_f16_to_f32(vh[i]);
  }
}

#if defined(AW) && AW == 16
/* the 16 sums of v[0..15] in one vector, v[4g + i] in lane 4g + i: pairs interleaved and
 * added, then quads, then 128-bit halves and quarters (45 operations for 16 reductions) */
static inline __m512 att_reduce16(const __m512 v[16]) {
  __m512 u[8], w[4];
  for (int i = 0; i < 8; i++)
    u[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; i++)
    w[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0x44), _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0xEE));
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x44), _mm512_shuffle_f32x4(w[0], w[1], 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], 0x44), _mm512_shuffle_f32x4(w[2], w[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
}

/* Four query heads against four K rows (d % 16 == 0; Q8_0/Q4_0 rows widened as in
 * dot4_kq_vec): the 16 dot products are reduced together, where four calls of dot4_k_vec
 * reduced each row's four apart; s[g * ATT_BLOCK + kk] = scale * q_g . k_kk. At short heads the
 * reductions were as much work as the products. */
static inline void dot16_k(const float *q, int64_t d, const uint8_t *const kr[4], uint32_t kt, float scale, float *s) {
  __m512 a[16];
  for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
  if (att_is_q(kt)) {
    const size_t bb = att_qblock(kt);
    for (int64_t b = 0; b < d / 32; b++)
      for (int kk = 0; kk < 4; kk++) {
        __m512 x[2];
        const __m512 vd = _mm512_set1_ps(att_q32(kr[kk] + (size_t)b * bb, kt, x));
        for (int i = 0; i < 2; i++) {
          const __m512 kv = _mm512_mul_ps(x[i], vd);
          for (int g = 0; g < 4; g++)
            a[4 * g + kk] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * d + b * 32 + 16 * i), kv, a[4 * g + kk]);
        }
      }
  } else {
    for (int64_t i = 0; i < d; i += 16)
      for (int kk = 0; kk < 4; kk++) {
        const __m512 kv = kt == XPU_DT_F32 ? _mm512_loadu_ps((const float *)kr[kk] + i) : A_LDH((const uint16_t *)kr[kk] + i);
        for (int g = 0; g < 4; g++) a[4 * g + kk] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * d + i), kv, a[4 * g + kk]);
      }
  }
  const __m512 r = _mm512_mul_ps(att_reduce16(a), _mm512_set1_ps(scale));
  _mm_storeu_ps(s, _mm512_castps512_ps128(r));
  _mm_storeu_ps(s + ATT_BLOCK, _mm512_extractf32x4_ps(r, 1));
  _mm_storeu_ps(s + 2 * ATT_BLOCK, _mm512_extractf32x4_ps(r, 2));
  _mm_storeu_ps(s + 3 * ATT_BLOCK, _mm512_extractf32x4_ps(r, 3));
}
#endif

#if defined(AW)
#if AW == 16
static inline __m512 att_exp16(__m512 x);
#else
static inline __m256 att_exp8(__m256 x);
static inline float att_hmax8(__m256 v);
#endif

/* The online-softmax step of one head over a block's jb <= ATT_BLOCK scores, at the native
 * width (the generic loop's steps: the block's maximum with NaN scores skipped, the rescale c
 * of the earlier sum, the weights exp(s - m) in place of the scores, their sum added to l);
 * returns c. Per key and head this is as much work as a short head's dot product, so through
 * SIMDe's 4 lanes it was a third of a decode row's attention. */
static inline float att_block_weights(float *sg, int64_t jb, float *m, float *l) {
  const int nv = (int)((jb + AW - 1) / AW);
  avec x[ATT_BLOCK / AW], mx = A_SET1(-INFINITY);
#if AW == 16
  __mmask16 k[ATT_BLOCK / AW];
  for (int i = 0; i < nv; i++) {
    int64_t left = jb - i * AW;
    k[i] = left >= AW ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
    x[i] = _mm512_maskz_loadu_ps(k[i], sg + i * AW);
    /* a NaN score is skipped by the maximum, as fmaxf does; lanes past jb count as -inf */
    const __mmask16 ok = k[i] & _mm512_cmp_ps_mask(x[i], x[i], _CMP_ORD_Q);
    mx = _mm512_max_ps(mx, _mm512_mask_mov_ps(A_SET1(-INFINITY), ok, x[i]));
  }
  const float mb = _mm512_reduce_max_ps(mx);
#else
  __m256 k[ATT_BLOCK / AW];
  const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  for (int i = 0; i < nv; i++) {
    k[i] = _mm256_cmp_ps(lane, _mm256_set1_ps((float)(jb - i * AW)), _CMP_LT_OQ);
    x[i] = _mm256_maskload_ps(sg + i * AW, _mm256_castps_si256(k[i]));
    const __m256 ok = _mm256_and_ps(k[i], _mm256_cmp_ps(x[i], x[i], _CMP_ORD_Q));
    mx = _mm256_max_ps(mx, _mm256_blendv_ps(A_SET1(-INFINITY), x[i], ok));
  }
  const float mb = att_hmax8(mx);
#endif
  float c = 1.0f;
  if (mb > *m) {
    c = *m == -INFINITY ? 0.0f : expf(*m - mb);
    *l *= c;
    *m = mb;
  }
  const avec vm = A_SET1(*m);
  avec sum = A_ZERO();
  for (int i = 0; i < nv; i++) {
#if AW == 16
    const __m512 e = _mm512_maskz_mov_ps(k[i], att_exp16(_mm512_sub_ps(x[i], vm)));
    _mm512_mask_storeu_ps(sg + i * AW, k[i], e);
#else
    const __m256 e = _mm256_and_ps(k[i], att_exp8(_mm256_sub_ps(x[i], vm)));
    _mm256_maskstore_ps(sg + i * AW, _mm256_castps_si256(k[i]), e);
#endif
    sum = A_ADD(sum, e);
  }
  *l += A_HSUM(sum);
  return c;
}
#endif

/*
 * Asks for the K and V rows of KV head hk at key `key` + ATT_BLOCK, the same key of the next
 * window, so that they arrive while this window computes. A position's row holds every KV head,
 * so one head's walk over the keys strides a page every few keys, where the hardware
 * prefetchers stop; decode's cache is cold (the weights streamed since the layer's previous
 * token evicted it), and without this each window waited on memory a few rows at a time.
 * Called per key between the dot products, not as a burst, so the requests stay spread over
 * the window. Past the cache's last row nothing is asked. always_inline: GCC's pure-const
 * analysis judges a function whose only effect is __builtin_prefetch to have none, and drops
 * the call.
 */
static inline __attribute__((always_inline)) void att_prefetch_key(const att_args *A, int64_t key, int64_t hk) {
  const int64_t ahead = key + ATT_BLOCK;
  if (ahead >= A->Tk) return;
  const uint8_t *kr = A->k + (size_t)(ahead * A->Hks + hk) * A->krow;
  const uint8_t *vr = A->v + (size_t)(ahead * A->Hks + hk) * A->vrow;
  for (size_t b = 0; b < A->krow; b += 64) __builtin_prefetch(kr + b, 0, 3);
  for (size_t b = 0; b < A->vrow; b += 64) __builtin_prefetch(vr + b, 0, 3);
}

/*
 * One block of up to ATT_BLOCK keys (indices kidx) for one query row and the gs query heads of
 * its task: scores, the online-softmax update of m and l, and acc = acc * c + P x V. pf: ask
 * for the next window's rows (att_prefetch_key); once per task's window and KV head, not per
 * query row or head group.
 */
static void att_block(const att_args *A, const float *qf, float *acc, float *m, float *l, float *s,
                      const int64_t *kidx, int64_t jb, int64_t hk, int pf) {
  const int64_t gs = A->gs;
  int64_t j = 0;
#if defined(AW) && AW == 16
  /* four keys at a time for four heads: one reduction of the 16 dot products */
  if (gs % 4 == 0 && A->D % 16 == 0)
    for (; j + 4 <= jb; j += 4) {
      const uint8_t *kr4[4];
      for (int kk = 0; kk < 4; kk++) kr4[kk] = A->k + (size_t)(kidx[j + kk] * A->Hks + hk) * A->krow;
      if (pf)
        for (int kk = 0; kk < 4; kk++) att_prefetch_key(A, kidx[j + kk], hk);
      for (int64_t g = 0; g < gs; g += 4) dot16_k(qf + g * A->D, A->D, kr4, A->kt, A->scale, s + g * ATT_BLOCK + j);
    }
#endif
  for (; j < jb; j++) {
    const uint8_t *kr = A->k + (size_t)(kidx[j] * A->Hks + hk) * A->krow;
    if (pf) att_prefetch_key(A, kidx[j], hk);
    if (att_is_q(A->kt)) {
#if defined(AW)
      if (gs % 4 == 0) {
        for (int64_t g = 0; g < gs; g += 4)
          dot4_kq_vec(qf + g * A->D, A->D, kr, A->kt, A->scale, s + g * ATT_BLOCK + j, ATT_BLOCK);
      } else {
        for (int64_t g = 0; g < gs; g++) s[g * ATT_BLOCK + j] = A->scale * dot_kq_vec(qf + g * A->D, kr, A->kt, A->D);
      }
#else
      for (int64_t g = 0; g < gs; g++) s[g * ATT_BLOCK + j] = A->scale * dot_kq(qf + g * A->D, kr, A->kt, A->D);
#endif
      continue;
    }
#if defined(__AVX512F__)
    if (A->D % 16 == 0 && gs % 4 == 0) {
      for (int64_t g = 0; g < gs; g += 4)
        dot4_k_vec(qf + g * A->D, A->D, kr, A->kt, A->scale, s + g * ATT_BLOCK + j, ATT_BLOCK);
      continue;
    }
#endif
#if defined(AW) && !defined(__AVX512F__)
    if (A->D % 16 == 0 && gs % 4 == 0) {
      for (int64_t g = 0; g < gs; g += 4)
        dot4_k_vec8(qf + g * A->D, A->D, kr, A->kt, A->scale, s + g * ATT_BLOCK + j, ATT_BLOCK);
      continue;
    }
#endif
#if defined(AW)
    if (A->D % AW == 0) {
      for (int64_t g = 0; g < gs; g++) s[g * ATT_BLOCK + j] = A->scale * dot_k_vec(qf + g * A->D, kr, A->kt, A->D);
      continue;
    }
#endif
    for (int64_t g = 0; g < gs; g++) s[g * ATT_BLOCK + j] = A->scale * dot_k(qf + g * A->D, kr, A->kt, A->D);
  }
  if (A->softcap > 0.0f)
    for (int64_t g = 0; g < gs; g++) att_softcap(s + g * ATT_BLOCK, jb, A->softcap);
  float c[ATT_MAX_GROUP];
  for (int64_t g = 0; g < gs; g++) {
#if defined(AW)
    c[g] = att_block_weights(s + g * ATT_BLOCK, jb, &m[g], &l[g]);
    continue;
#endif
    float *sg = s + g * ATT_BLOCK, mb = -INFINITY;
    /* not fmaxf: without -ffinite-math it is a libm call per key; a NaN score is skipped
     * either way, and mb starts at -inf, so the result is fmaxf's */
    for (int64_t j = 0; j < jb; j++) mb = sg[j] > mb ? sg[j] : mb;
    c[g] = 1.0f;
    if (mb > m[g]) {
      c[g] = m[g] == -INFINITY ? 0.0f : expf(m[g] - mb);
      l[g] *= c[g];
      m[g] = mb;
    }
    int64_t j = 0;
    for (; j + 4 <= jb; j += 4) vst1q_f32(sg + j, v_exp(vsubq_f32(vld1q_f32(sg + j), vdupq_n_f32(m[g]))));
    for (; j < jb; j++) sg[j] = expf(sg[j] - m[g]);
    for (j = 0; j < jb; j++) l[g] += sg[j];
  }
  const uint8_t *vrows[ATT_BLOCK];
  for (int64_t j = 0; j < jb; j++) vrows[j] = A->v + (size_t)(kidx[j] * A->Hks + hk) * A->vrow;
#if defined(AW) && AW == 16
  if (gs % 4 == 0 && A->Dv % 16 == 0) { /* a quantized V's Dv is a multiple of 32 */
    for (int64_t g = 0; g < gs; g += 4) pv4_block(acc + g * A->Dv, c + g, s + g * ATT_BLOCK, vrows, jb, A->vt, A->Dv);
    return;
  }
#endif
  if (att_is_q(A->vt)) {
    for (int64_t g = 0; g < gs; g++)
#if defined(AW)
      pv_block_qvec(acc + g * A->Dv, c[g], s + g * ATT_BLOCK, vrows, jb, A->vt, A->Dv);
#else
      pv_block_q(acc + g * A->Dv, c[g], s + g * ATT_BLOCK, vrows, jb, A->vt, A->Dv);
#endif
    return;
  }
#if defined(AW)
  if (A->Dv % AW == 0) {
    for (int64_t g = 0; g < gs; g++) pv_block_vec(acc + g * A->Dv, c[g], s + g * ATT_BLOCK, vrows, jb, A->vt, A->Dv);
    return;
  }
#endif
  for (int64_t g = 0; g < gs; g++) pv_block(acc + g * A->Dv, c[g], s + g * ATT_BLOCK, vrows, jb, A->vt, A->Dv);
}

/*
 * Small heads (D or Dv not a multiple of 16, e.g. 8 for stories260K): a per-key dot product
 * of D < 16 floats spends more on its horizontal sum and the call than on the arithmetic. So a
 * window's K and V rows are transposed once per task into kt[D][ATT_BLOCK] and vt[Dv][ATT_BLOCK]
 * (f32, 4x4 register transposes), and everything per row runs across the keys: a row's
 * ATT_BLOCK scores come from D vector FMAs, and P x V accumulates lane-wise, each of the Dv
 * outputs a vector of partial sums over the keys of its lane, with the online-softmax sum l
 * kept the same way; the lanes are added once per row at the end. That leaves no horizontal
 * sum and no dependent chain longer than ATT_BLOCK/4 in the window loop.
 *
 * Masked keys get a -inf score by selection (a NaN K row cannot leak) and a weight of exactly
 * 0; 0 x a finite V value adds nothing, so the FMA needs no mask, unless the window holds a
 * non-finite V value (checked once per window, only when some row does not see every loaded
 * key): then the masked products are selected away instead. A row's result thus depends on
 * the keys it sees only, not on which other rows share the task: a verify row gets the same
 * bits as decoding that token alone.
 */
/* q: k or v is Q8_0/Q4_0 (head sizes multiples of 32), which only the large-head path reads */
static inline int att_small(int64_t d, int64_t dv, int q) { return !q && (d % 16 != 0 || dv % 16 != 0); }

enum { ATT_NV = ATT_BLOCK / 4 };
/* lanes of the lane-wise state: a row's window is ATT_BLOCK / ATT_LANES vectors */
#if defined(__x86_64__) && defined(__AVX512F__)
#define ATT_LANES 16
#elif defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define ATT_LANES 8
#else
#define ATT_LANES 4
#endif

static inline float att_ld1(const uint8_t *row, uint32_t dt, int64_t d) {
  return dt == XPU_DT_F32 ? ((const float *)row)[d] : nv_f16_to_f32(((const uint16_t *)row)[d]);
}

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/* On x86 the NEON 4x4 transposes (the #else branch) go through SIMDe, which builds vtrn1q/vtrn2q and vcombine
 * from single-lane inserts: a window's transpose then cost as much as every row's work on it
 * (a decode at position 480 spent more time transposing than computing). Native shuffles,
 * 8 keys at a time, instead. */
#define ATT_TR 8

static inline __m256 att_ld8x(const uint8_t *row, uint32_t dt, int64_t d) {
  return dt == XPU_DT_F32 ? _mm256_loadu_ps((const float *)row + d)
                          : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + d)));
}

static inline __m128 att_ld4x(const uint8_t *row, uint32_t dt, int64_t d) {
  return dt == XPU_DT_F32 ? _mm_loadu_ps((const float *)row + d)
                          : _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)((const uint16_t *)row + d)));
}

/* dst[d * ATT_BLOCK + r] = rows[r][d] for r < 8, d < n: 8x8 register transposes (pairs, quads,
 * then 128-bit halves), a 4x4 one per 4 rows for 4 remaining elements, single elements last */
static void att_transpose8(const uint8_t *const rows[8], uint32_t dt, int64_t n, float *dst) {
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    __m256 x[8], t[8], u[8];
    for (int i = 0; i < 8; i++) x[i] = att_ld8x(rows[i], dt, d);
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(x[i], x[i + 1]); /* r_i[0] r_i+1[0] r_i[1] r_i+1[1] | [4], [5] */
      t[i + 1] = _mm256_unpackhi_ps(x[i], x[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) { /* rows i..i+3 of elements c | c+4, c = 0..3 */
      u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
      u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
      u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {
      _mm256_storeu_ps(dst + (d + c) * ATT_BLOCK, _mm256_permute2f128_ps(u[c], u[c + 4], 0x20));
      _mm256_storeu_ps(dst + (d + c + 4) * ATT_BLOCK, _mm256_permute2f128_ps(u[c], u[c + 4], 0x31));
    }
  }
  for (; d + 4 <= n; d += 4) {
    for (int h = 0; h < 8; h += 4) {
      __m128 a = att_ld4x(rows[h], dt, d), b = att_ld4x(rows[h + 1], dt, d);
      __m128 c = att_ld4x(rows[h + 2], dt, d), e = att_ld4x(rows[h + 3], dt, d);
      __m128 t0 = _mm_unpacklo_ps(a, b), t1 = _mm_unpackhi_ps(a, b);
      __m128 t2 = _mm_unpacklo_ps(c, e), t3 = _mm_unpackhi_ps(c, e);
      _mm_storeu_ps(dst + (d + 0) * ATT_BLOCK + h, _mm_movelh_ps(t0, t2));
      _mm_storeu_ps(dst + (d + 1) * ATT_BLOCK + h, _mm_movehl_ps(t2, t0));
      _mm_storeu_ps(dst + (d + 2) * ATT_BLOCK + h, _mm_movelh_ps(t1, t3));
      _mm_storeu_ps(dst + (d + 3) * ATT_BLOCK + h, _mm_movehl_ps(t3, t1));
    }
  }
  for (; d < n; d++)
    for (int r = 0; r < 8; r++) dst[d * ATT_BLOCK + r] = att_ld1(rows[r], dt, d);
}
#else
#define ATT_TR 4

static inline float32x4_t att_ld4(const uint8_t *row, uint32_t dt, int64_t d) {
  return dt == XPU_DT_F32 ? vld1q_f32((const float *)row + d) : v_ld_f16((const uint16_t *)row + d);
}

/* dst[d * ATT_BLOCK + r] = rows[r][d] for r < 4, d < n */
static void att_transpose4(const uint8_t *const rows[4], uint32_t dt, int64_t n, float *dst) {
  int64_t d = 0;
  for (; d + 4 <= n; d += 4) {
    float32x4_t q0 = att_ld4(rows[0], dt, d), q1 = att_ld4(rows[1], dt, d);
    float32x4_t q2 = att_ld4(rows[2], dt, d), q3 = att_ld4(rows[3], dt, d);
    float32x4_t t0 = vtrn1q_f32(q0, q1), t1 = vtrn2q_f32(q0, q1);
    float32x4_t t2 = vtrn1q_f32(q2, q3), t3 = vtrn2q_f32(q2, q3);
    vst1q_f32(dst + (d + 0) * ATT_BLOCK, vcombine_f32(vget_low_f32(t0), vget_low_f32(t2)));
    vst1q_f32(dst + (d + 1) * ATT_BLOCK, vcombine_f32(vget_low_f32(t1), vget_low_f32(t3)));
    vst1q_f32(dst + (d + 2) * ATT_BLOCK, vcombine_f32(vget_high_f32(t0), vget_high_f32(t2)));
    vst1q_f32(dst + (d + 3) * ATT_BLOCK, vcombine_f32(vget_high_f32(t1), vget_high_f32(t3)));
  }
  for (; d < n; d++)
    for (int r = 0; r < 4; r++) dst[d * ATT_BLOCK + r] = att_ld1(rows[r], dt, d);
}
#endif

/* kt and vt for the keys wb <= w0+j < wn; zeros elsewhere (read from zrow, a zero row of
 * max(D, Dv) elements, which is zero as f32 and as f16) */
static void att_window_load(const att_args *A, int64_t hk, int64_t w0, int64_t wb, int64_t wn, float *kt, float *vt,
                            const uint8_t *zrow) {
  for (int64_t j = 0; j < ATT_BLOCK; j += ATT_TR) {
    const uint8_t *kr[ATT_TR], *vr[ATT_TR];
    for (int r = 0; r < ATT_TR; r++) {
      int64_t key = w0 + j + r;
      size_t row = (size_t)(key * A->Hks + hk);
      int in = key >= wb && key < wn; /* keys before a sliding window are not read either */
      kr[r] = in ? A->k + row * A->krow : zrow;
      vr[r] = in ? A->v + row * A->vrow : zrow;
    }
#if ATT_TR == 8
    att_transpose8(kr, A->kt, A->D, kt + j);
    att_transpose8(vr, A->vt, A->Dv, vt + j);
#else
    att_transpose4(kr, A->kt, A->D, kt + j);
    att_transpose4(vr, A->vt, A->Dv, vt + j);
#endif
  }
}

/* whether every value of a loaded window's V is finite */
static int att_window_finite(const float *vt, int64_t dv) {
  const float32x4_t zero = vdupq_n_f32(0.0f);
  uint32x4_t ok = vdupq_n_u32(0xffffffffu);
  for (int64_t i = 0; i < dv * ATT_BLOCK; i += 4) {
    float32x4_t x = vld1q_f32(vt + i);
    ok = vandq_u32(ok, vceqq_f32(vsubq_f32(x, x), zero)); /* inf - inf and NaN are NaN */
  }
  return vminvq_u32(ok) != 0;
}

/* the soft-cap at the native width (att_tanh16, att_tanh8 or v_tanh: one algorithm), used by
 * every path of a build, so that a score is capped to the same bits on each */
#if ATT_LANES == 16
#define ATT_VSCAP(t, vc, vic) _mm512_mul_ps((vc), att_tanh16(_mm512_mul_ps((t), (vic))))
#elif ATT_LANES == 8
#define ATT_VSCAP(t, vc, vic) _mm256_mul_ps((vc), att_tanh8(_mm256_mul_ps((t), (vic))))
#else
#define ATT_VSCAP(t, vc, vic) vmulq_f32((vc), v_tanh(vmulq_f32((t), (vic))))
#endif

#if ATT_LANES == 4
/* One row's gs heads against a loaded window; vis[j] is all ones where the row sees key j (NULL:
 * every key). acc holds Dv vectors of ATT_LANES per head, l one such vector per head (lane-wise
 * partial sums). */
static void att_window_row(const att_args *A, const float *qf, float *acc, float *m, float *l, const float *kt,
                           const float *vt, const uint32_t *vis, int exact_zero) {
  const int64_t D = A->D, Dv = A->Dv, gs = A->gs;
  const float32x4_t ninf = vdupq_n_f32(-INFINITY), zero = vdupq_n_f32(0.0f), scale = vdupq_n_f32(A->scale);
  uint32x4_t vm[ATT_NV];
  for (int k = 0; k < ATT_NV; k++) vm[k] = vis ? vld1q_u32(vis + 4 * k) : vdupq_n_u32(0xffffffffu);
  for (int64_t g = 0; g < gs; g++) {
    const float *q = qf + g * D;
    float32x4_t t[ATT_NV];
    for (int k = 0; k < ATT_NV; k++) t[k] = zero;
    for (int64_t d = 0; d < D; d++) {
      const float32x4_t qd = vdupq_n_f32(q[d]);
      const float *kd = kt + d * ATT_BLOCK;
      for (int k = 0; k < ATT_NV; k++) t[k] = vfmaq_f32(t[k], qd, vld1q_f32(kd + 4 * k));
    }
    /* masked scores are replaced, not scaled: a NaN from a masked K row does not survive */
    float32x4_t mx = ninf;
    for (int k = 0; k < ATT_NV; k++) {
      t[k] = vmulq_f32(t[k], scale);
      if (A->softcap > 0.0f) t[k] = ATT_VSCAP(t[k], vdupq_n_f32(A->softcap), vdupq_n_f32(1.0f / A->softcap));
      t[k] = vbslq_f32(vm[k], t[k], ninf);
      mx = vmaxq_f32(mx, t[k]);
    }
    const float mb = vmaxvq_f32(mx);
    if (mb == -INFINITY) continue; /* nothing visible here */
    float c = 1.0f;
    if (mb > m[g]) {
      c = m[g] == -INFINITY ? 0.0f : expf(m[g] - mb);
      m[g] = mb;
    }
    const float32x4_t vmg = vdupq_n_f32(m[g]), vc = vdupq_n_f32(c);
    float32x4_t e[ATT_NV];
    float32x4_t lg = vld1q_f32(l + g * 4);
    if (c != 1.0f) lg = vmulq_f32(lg, vc);
    for (int k = 0; k < ATT_NV; k++) {
      e[k] = vbslq_f32(vm[k], v_exp(vsubq_f32(t[k], vmg)), zero);
      lg = vaddq_f32(lg, e[k]);
    }
    vst1q_f32(l + g * 4, lg);
    float *ag = acc + g * Dv * 4;
    for (int64_t d = 0; d < Dv; d++) {
      const float *vd = vt + d * ATT_BLOCK;
      float32x4_t a = vld1q_f32(ag + 4 * d);
      if (c != 1.0f) a = vmulq_f32(a, vc);
      if (exact_zero)
        for (int k = 0; k < ATT_NV; k++) a = vfmaq_f32(a, e[k], vld1q_f32(vd + 4 * k));
      else
        for (int k = 0; k < ATT_NV; k++) a = vaddq_f32(a, vbslq_f32(vm[k], vmulq_f32(e[k], vld1q_f32(vd + 4 * k)), zero));
      vst1q_f32(ag + 4 * d, a);
    }
  }
}

#endif

#if ATT_LANES == 16
/* exp(x) for 16 lanes: v_exp's algorithm and constants (neon_simd.h), the same result per lane */
static inline __m512 att_exp16(__m512 x) {
  const __m512 r = _mm512_set1_ps(0x1.8p23f);
  const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r);
  const __m512 n = _mm512_sub_ps(z, r);
  const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                    _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
  const __m512i e = _mm512_slli_epi32(_mm512_castps_si512(z), 23);
  const __m512 k = _mm512_castsi512_ps(_mm512_add_epi32(e, _mm512_castps_si512(_mm512_set1_ps(1.0f))));
  const __m512 an = _mm512_abs_ps(n);
  const __mmask16 c = _mm512_cmp_ps_mask(an, _mm512_set1_ps(126.0f), _CMP_GT_OQ);
  const __m512 u = _mm512_mul_ps(b, b);
  const __m512 j = _mm512_fmadd_ps(
      _mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
      _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f)));
  const __m512 jj = _mm512_fmadd_ps(j, u, _mm512_mul_ps(_mm512_set1_ps(0x1.ffffecp-1f), b));
  if (c == 0) return _mm512_fmadd_ps(k, jj, k);
  const __mmask16 neg = _mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ);
  const __m512i d = _mm512_maskz_mov_epi32(neg, _mm512_set1_epi32((int)0x82000000u));
  const __m512 s1 = _mm512_castsi512_ps(_mm512_add_epi32(d, _mm512_set1_epi32(0x7f000000)));
  const __m512 s2 = _mm512_castsi512_ps(_mm512_sub_epi32(e, d));
  __m512 res = _mm512_fmadd_ps(k, jj, k);
  res = _mm512_mask_mov_ps(res, c, _mm512_mul_ps(_mm512_fmadd_ps(s2, jj, s2), s1));
  res = _mm512_mask_mov_ps(res, _mm512_cmp_ps_mask(an, _mm512_set1_ps(192.0f), _CMP_GT_OQ), _mm512_mul_ps(s1, s1));
  /* NaN lanes: the bit tricks above may turn them into numbers */
  return _mm512_mask_mov_ps(res, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

/* tanh on 16 lanes: v_tanh's algorithm (neon_simd.h) */
static inline __m512 att_tanh16(__m512 y) {
  const __m512 ay = _mm512_abs_ps(y), y2 = _mm512_mul_ps(y, y);
  const __m512 e = att_exp16(_mm512_add_ps(ay, ay)), one = _mm512_set1_ps(1.0f);
  const __m512 big = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
  __m512 p = _mm512_set1_ps(NV_TANH_C17);
  p = _mm512_fmadd_ps(p, y2, _mm512_set1_ps(NV_TANH_C15));
  p = _mm512_fmadd_ps(p, y2, _mm512_set1_ps(NV_TANH_C13));
  p = _mm512_fmadd_ps(p, y2, _mm512_set1_ps(NV_TANH_C11));
  p = _mm512_fmadd_ps(p, y2, _mm512_set1_ps(NV_TANH_C9));
  p = _mm512_fmadd_ps(p, y2, _mm512_set1_ps(NV_TANH_C7));
  p = _mm512_fmadd_ps(p, y2, _mm512_set1_ps(NV_TANH_C5));
  p = _mm512_fmadd_ps(p, y2, _mm512_set1_ps(NV_TANH_C3));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, y2), ay, ay);
  const __m512 mag = _mm512_mask_mov_ps(big, _mm512_cmp_ps_mask(ay, _mm512_set1_ps(NV_TANH_SMALL), _CMP_LT_OQ), p);
  return _mm512_castsi512_ps(_mm512_or_si512(
      _mm512_castps_si512(mag), _mm512_and_si512(_mm512_castps_si512(y), _mm512_set1_epi32((int)0x80000000u))));
}

static inline float att_lane_sum(const float *p) { return _mm512_reduce_add_ps(_mm512_loadu_ps(p)); }

/* att_window_row on 16 lanes: a window is two vectors, so a row's scores, weights and P x V
 * take a quarter of the 4-lane instructions */
static void att_window_row16(const att_args *A, const float *qf, float *acc, float *m, float *l, const float *kt,
                             const float *vt, const uint32_t *vis, int exact_zero) {
  const int64_t D = A->D, Dv = A->Dv, gs = A->gs;
  const __m512 ninf = _mm512_set1_ps(-INFINITY), scale = _mm512_set1_ps(A->scale);
  __mmask16 v0 = 0xffff, v1 = 0xffff;
  if (vis) {
    v0 = _mm512_test_epi32_mask(_mm512_loadu_si512(vis), _mm512_loadu_si512(vis));
    v1 = _mm512_test_epi32_mask(_mm512_loadu_si512(vis + 16), _mm512_loadu_si512(vis + 16));
  }
  for (int64_t g = 0; g < gs; g++) {
    const float *q = qf + g * D;
    __m512 t0 = _mm512_setzero_ps(), t1 = t0;
    for (int64_t d = 0; d < D; d++) {
      const __m512 qd = _mm512_set1_ps(q[d]);
      t0 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(kt + d * ATT_BLOCK), t0);
      t1 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(kt + d * ATT_BLOCK + 16), t1);
    }
    /* masked scores are replaced, not scaled: a NaN from a masked K row does not survive */
    if (A->softcap > 0.0f) {
      const __m512 vc = _mm512_set1_ps(A->softcap), vic = _mm512_set1_ps(1.0f / A->softcap);
      t0 = _mm512_mask_mov_ps(ninf, v0, ATT_VSCAP(_mm512_mul_ps(t0, scale), vc, vic));
      t1 = _mm512_mask_mov_ps(ninf, v1, ATT_VSCAP(_mm512_mul_ps(t1, scale), vc, vic));
    } else {
      t0 = _mm512_mask_mul_ps(ninf, v0, t0, scale);
      t1 = _mm512_mask_mul_ps(ninf, v1, t1, scale);
    }
    const float mb = _mm512_reduce_max_ps(_mm512_max_ps(t0, t1));
    if (mb == -INFINITY) continue; /* nothing visible here */
    float c = 1.0f;
    if (mb > m[g]) {
      c = m[g] == -INFINITY ? 0.0f : expf(m[g] - mb);
      m[g] = mb;
    }
    const __m512 vmg = _mm512_set1_ps(m[g]), vc = _mm512_set1_ps(c);
    const __m512 e0 = _mm512_maskz_mov_ps(v0, att_exp16(_mm512_sub_ps(t0, vmg)));
    const __m512 e1 = _mm512_maskz_mov_ps(v1, att_exp16(_mm512_sub_ps(t1, vmg)));
    __m512 lg = _mm512_loadu_ps(l + g * 16);
    if (c != 1.0f) lg = _mm512_mul_ps(lg, vc);
    _mm512_storeu_ps(l + g * 16, _mm512_add_ps(_mm512_add_ps(lg, e0), e1));
    float *ag = acc + g * Dv * 16;
    for (int64_t d = 0; d < Dv; d++) {
      const float *vd = vt + d * ATT_BLOCK;
      __m512 a = _mm512_loadu_ps(ag + 16 * d);
      if (c != 1.0f) a = _mm512_mul_ps(a, vc);
      if (exact_zero) {
        a = _mm512_fmadd_ps(e0, _mm512_loadu_ps(vd), a);
        a = _mm512_fmadd_ps(e1, _mm512_loadu_ps(vd + 16), a);
      } else {
        a = _mm512_add_ps(a, _mm512_maskz_mul_ps(v0, e0, _mm512_loadu_ps(vd)));
        a = _mm512_add_ps(a, _mm512_maskz_mul_ps(v1, e1, _mm512_loadu_ps(vd + 16)));
      }
      _mm512_storeu_ps(ag + 16 * d, a);
    }
  }
}
#define att_window_row att_window_row16
#elif ATT_LANES == 8
/* v_exp's range reduction and polynomial (neon_simd.h) for 8 lanes: x = n ln2 + b, *k = 2^n
 * (right while |n| <= 126), *jj the polynomial (exp(x) = k + k jj), *e z's low bits moved to
 * the exponent and *n the integer n, for the wide-range path */
static inline void att_exp8_parts(__m256 x, __m256 *n, __m256i *e, __m256 *k, __m256 *jj) {
  const __m256 r = _mm256_set1_ps(0x1.8p23f);
  const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
  *n = _mm256_sub_ps(z, r);
  const __m256 b = _mm256_fnmadd_ps(*n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                    _mm256_fnmadd_ps(*n, _mm256_set1_ps(0x1.62e4p-1f), x));
  *e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
  *k = _mm256_castsi256_ps(_mm256_add_epi32(*e, _mm256_castps_si256(_mm256_set1_ps(1.0f))));
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 j = _mm256_fmadd_ps(
      _mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
      _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f)));
  *jj = _mm256_fmadd_ps(j, u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
}

/* exp(x) for 8 lanes: v_exp's algorithm and constants, the same result per lane */
static inline __m256 att_exp8(__m256 x) {
  __m256 n, k, jj;
  __m256i e;
  att_exp8_parts(x, &n, &e, &k, &jj);
  const __m256 an = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
  const __m256 c = _mm256_cmp_ps(an, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
  if (_mm256_movemask_ps(c) == 0) return _mm256_fmadd_ps(k, jj, k);
  const __m256i d = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                     _mm256_set1_epi32((int)0x82000000u));
  const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(d, _mm256_set1_epi32(0x7f000000)));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, d));
  __m256 res = _mm256_fmadd_ps(k, jj, k);
  res = _mm256_blendv_ps(res, _mm256_mul_ps(_mm256_fmadd_ps(s2, jj, s2), s1), c);
  res = _mm256_blendv_ps(res, _mm256_mul_ps(s1, s1), _mm256_cmp_ps(an, _mm256_set1_ps(192.0f), _CMP_GT_OQ));
  /* NaN lanes: the bit tricks above may turn them into numbers */
  return _mm256_blendv_ps(res, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* tanh on 8 lanes: v_tanh's algorithm (neon_simd.h) */
static inline __m256 att_tanh8(__m256 y) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 ay = _mm256_andnot_ps(sign, y), y2 = _mm256_mul_ps(y, y);
  const __m256 e = att_exp8(_mm256_add_ps(ay, ay)), one = _mm256_set1_ps(1.0f);
  const __m256 big = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
  __m256 p = _mm256_set1_ps(NV_TANH_C17);
  p = _mm256_fmadd_ps(p, y2, _mm256_set1_ps(NV_TANH_C15));
  p = _mm256_fmadd_ps(p, y2, _mm256_set1_ps(NV_TANH_C13));
  p = _mm256_fmadd_ps(p, y2, _mm256_set1_ps(NV_TANH_C11));
  p = _mm256_fmadd_ps(p, y2, _mm256_set1_ps(NV_TANH_C9));
  p = _mm256_fmadd_ps(p, y2, _mm256_set1_ps(NV_TANH_C7));
  p = _mm256_fmadd_ps(p, y2, _mm256_set1_ps(NV_TANH_C5));
  p = _mm256_fmadd_ps(p, y2, _mm256_set1_ps(NV_TANH_C3));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, y2), ay, ay);
  const __m256 mag = _mm256_blendv_ps(big, p, _mm256_cmp_ps(ay, _mm256_set1_ps(NV_TANH_SMALL), _CMP_LT_OQ));
  return _mm256_or_ps(mag, _mm256_and_ps(sign, y));
}

/* exp(x) for x <= 0, -inf or NaN (a score less the maximum), without att_exp8's branch to its
 * wide-range path: x is clamped to -87 (where 2^n stays a normal float) and lanes below it,
 * -inf (masked keys) included, give exactly 0 instead of a subnormal weight under 2^-125,
 * nothing beside the maximum's weight of 1; a NaN stays NaN (max returns its second operand
 * then). Every lane of the two-pass path takes it, decode's and verify's rows alike. */
static inline __m256 att_exp8_le0(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  __m256 n, k, jj;
  __m256i e;
  att_exp8_parts(_mm256_max_ps(lo, x), &n, &e, &k, &jj);
  return _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), _mm256_fmadd_ps(k, jj, k));
}

static inline float att_lane_sum(const float *p) {
  __m128 s = _mm_add_ps(_mm_loadu_ps(p), _mm_loadu_ps(p + 4));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static inline float att_hmax8(__m256 v) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

/* att_window_row on 8 lanes (AVX2): a window is four vectors; through SIMDe the 4-lane
 * version's selects, maxima and exp spill and take several instructions each */
static void att_window_row8(const att_args *A, const float *qf, float *acc, float *m, float *l, const float *kt,
                            const float *vt, const uint32_t *vis, int exact_zero) {
  const int64_t D = A->D, Dv = A->Dv, gs = A->gs;
  const __m256 ninf = _mm256_set1_ps(-INFINITY), scale = _mm256_set1_ps(A->scale);
  __m256 vm[4];
  for (int k = 0; k < 4; k++)
    vm[k] = vis ? _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(vis + 8 * k)))
                : _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  for (int64_t g = 0; g < gs; g++) {
    const float *q = qf + g * D;
    __m256 t[4];
    for (int k = 0; k < 4; k++) t[k] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
      const __m256 qd = _mm256_set1_ps(q[d]);
      const float *kd = kt + d * ATT_BLOCK;
      for (int k = 0; k < 4; k++) t[k] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kd + 8 * k), t[k]);
    }
    /* masked scores are replaced, not scaled: a NaN from a masked K row does not survive */
    __m256 mx = ninf;
    for (int k = 0; k < 4; k++) {
      t[k] = _mm256_mul_ps(t[k], scale);
      if (A->softcap > 0.0f) t[k] = ATT_VSCAP(t[k], _mm256_set1_ps(A->softcap), _mm256_set1_ps(1.0f / A->softcap));
      t[k] = _mm256_blendv_ps(ninf, t[k], vm[k]);
      mx = _mm256_max_ps(mx, t[k]);
    }
    const float mb = att_hmax8(mx);
    if (mb == -INFINITY) continue; /* nothing visible here */
    float c = 1.0f;
    if (mb > m[g]) {
      c = m[g] == -INFINITY ? 0.0f : expf(m[g] - mb);
      m[g] = mb;
    }
    const __m256 vmg = _mm256_set1_ps(m[g]), vc = _mm256_set1_ps(c);
    __m256 e[4];
    __m256 lg = _mm256_loadu_ps(l + g * 8);
    if (c != 1.0f) lg = _mm256_mul_ps(lg, vc);
    for (int k = 0; k < 4; k++) {
      e[k] = _mm256_and_ps(vm[k], att_exp8(_mm256_sub_ps(t[k], vmg)));
      lg = _mm256_add_ps(lg, e[k]);
    }
    _mm256_storeu_ps(l + g * 8, lg);
    float *ag = acc + g * Dv * 8;
    for (int64_t d = 0; d < Dv; d++) {
      const float *vd = vt + d * ATT_BLOCK;
      __m256 a = _mm256_loadu_ps(ag + 8 * d);
      if (c != 1.0f) a = _mm256_mul_ps(a, vc);
      if (exact_zero)
        for (int k = 0; k < 4; k++) a = _mm256_fmadd_ps(e[k], _mm256_loadu_ps(vd + 8 * k), a);
      else
        for (int k = 0; k < 4; k++)
          a = _mm256_add_ps(a, _mm256_and_ps(vm[k], _mm256_mul_ps(e[k], _mm256_loadu_ps(vd + 8 * k))));
      _mm256_storeu_ps(ag + 8 * d, a);
    }
  }
}
#define att_window_row att_window_row8
#else
static inline float att_lane_sum(const float *p) { return vaddvq_f32(vld1q_f32(p)); }
#endif

static void att_softcap(float *s, int64_t n, float cap) {
  const float ic = 1.0f / cap;
  int64_t j = 0;
#if ATT_LANES == 16
  const __m512 vc = _mm512_set1_ps(cap), vic = _mm512_set1_ps(ic);
  for (; j + 16 <= n; j += 16) _mm512_storeu_ps(s + j, ATT_VSCAP(_mm512_loadu_ps(s + j), vc, vic));
#elif ATT_LANES == 8
  const __m256 vc = _mm256_set1_ps(cap), vic = _mm256_set1_ps(ic);
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(s + j, ATT_VSCAP(_mm256_loadu_ps(s + j), vc, vic));
#else
  const float32x4_t vc = vdupq_n_f32(cap), vic = vdupq_n_f32(ic);
  for (; j + 4 <= n; j += 4) vst1q_f32(s + j, ATT_VSCAP(vld1q_f32(s + j), vc, vic));
#endif
  if (j < n) { /* the tail padded to a vector, through the same code */
    float t[ATT_LANES] = {0};
    memcpy(t, s + j, (size_t)(n - j) * 4);
    att_softcap(t, ATT_LANES, cap);
    memcpy(s + j, t, (size_t)(n - j) * 4);
  }
}

#if ATT_LANES == 8
/*
 * The small-head path in two passes per row and head (AVX2): every window of the task's KV
 * head is transposed first (into kt[w][D][ATT_BLOCK], vt[w][Dv][ATT_BLOCK]), then each row
 * and head takes all its scores and their maximum, and then the weights and P x V with the
 * accumulators in registers. The one-pass online softmax spent most of a window on a chain of
 * dependent steps: the window's maximum reduced to a scalar, compared, a libm expf for the
 * rescale, the accumulators loaded, rescaled and stored; with the maximum known, none of that
 * remains. A row's result depends on the keys it sees only, as in the one-pass path.
 */
#define ATT_2P_MAXDV 16 /* accumulators kept in registers (two per value when Dv > 8) */

static int64_t att_row_floats(int64_t d, int64_t dv, int q);

/* the two-pass path's scratch after the rows' queries: kt, vt and the scores of all keys */
static int64_t att_2p_floats(int64_t tk, int64_t d, int64_t dv) {
  int64_t tpad = (tk + ATT_BLOCK - 1) / ATT_BLOCK * ATT_BLOCK;
  return (d + dv + 1) * tpad + (d > dv ? d : dv);
}

/* whether the two-pass path serves a graph: decided by shapes only, so that every graph of a
 * cache (decode, verify) takes the same path and gives a row the same bits */
static int att_2p(int64_t tk, int64_t d, int64_t dv) { return dv <= ATT_2P_MAXDV && att_2p_floats(tk, d, dv) <= (1 << 20); }

static int att_all_finite(const float *x, int64_t n) {
  __m256 bad = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(v, v), _mm256_setzero_ps(), _CMP_NEQ_UQ));
  }
  int ok = _mm256_movemask_ps(bad) == 0;
  for (; i < n; i++) ok &= isfinite(x[i]) != 0;
  return ok;
}

/* row r's gs heads (see att_small_rows2); inlined with constant D and Dv where they are known */
static inline __attribute__((always_inline)) void att_2p_row(const att_args *A, const float *qf, const float *kt,
                                                             const float *vt, float *sc, int64_t i0, int64_t r,
                                                             int64_t h0, int64_t start, int64_t end,
                                                             const int64_t D, const int64_t Dv) {
  const int64_t gs = A->gs;
  const __m256 ninf = _mm256_set1_ps(-INFINITY), scale = _mm256_set1_ps(A->scale);
  float ob[ATT_2P_MAXDV];
  {
    const int8_t *mrow = A->mask ? A->mask + (i0 + r) * A->Tq : NULL;
    const int64_t nwr = (end + ATT_BLOCK - 1) / ATT_BLOCK, ws = start / ATT_BLOCK;
    /* keys from start below full are seen by the row; from full to end, those its mask row marks */
    const int64_t full = A->mask && A->off < end ? (A->off > 0 ? A->off : 0) : end;
    for (int64_t g = 0; g < gs; g++) {
      const float *q = qf + (r * gs + g) * D;
      __m256 vmax = ninf;
      for (int64_t w = ws; w < nwr; w++) {
        const float *kw = kt + w * D * ATT_BLOCK;
        /* two sums per vector of keys (even and odd d): eight independent chains */
        __m256 t[4], t2[4];
        for (int k = 0; k < 4; k++) t[k] = t2[k] = _mm256_setzero_ps();
        int64_t d = 0;
        for (; d + 2 <= D; d += 2) {
          const __m256 qd = _mm256_set1_ps(q[d]), qe = _mm256_set1_ps(q[d + 1]);
          for (int k = 0; k < 4; k++) {
            t[k] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kw + d * ATT_BLOCK + 8 * k), t[k]);
            t2[k] = _mm256_fmadd_ps(qe, _mm256_loadu_ps(kw + (d + 1) * ATT_BLOCK + 8 * k), t2[k]);
          }
        }
        if (d < D) {
          const __m256 qd = _mm256_set1_ps(q[d]);
          for (int k = 0; k < 4; k++) t[k] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kw + d * ATT_BLOCK + 8 * k), t[k]);
        }
        for (int k = 0; k < 4; k++) t[k] = _mm256_add_ps(t[k], t2[k]);
        const int64_t w0 = w * ATT_BLOCK;
        for (int k = 0; k < 4; k++) t[k] = _mm256_mul_ps(t[k], scale);
        if (A->softcap > 0.0f)
          for (int k = 0; k < 4; k++)
            t[k] = ATT_VSCAP(t[k], _mm256_set1_ps(A->softcap), _mm256_set1_ps(1.0f / A->softcap));
        if (w0 < start || w0 + ATT_BLOCK > full) {
          /* masked scores are replaced: a NaN from a masked K row does not survive */
          uint32_t vis[ATT_BLOCK];
          for (int64_t j = 0; j < ATT_BLOCK; j++) {
            int64_t k = w0 + j;
            vis[j] = k >= start && k < end && (k < full || !mrow || mrow[k - A->off]) ? 0xffffffffu : 0u;
          }
          for (int k = 0; k < 4; k++)
            t[k] = _mm256_blendv_ps(ninf, t[k], _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(vis + 8 * k))));
        }
        for (int k = 0; k < 4; k++) {
          _mm256_storeu_ps(sc + w0 + 8 * k, t[k]);
          vmax = _mm256_max_ps(vmax, t[k]);
        }
      }
      float mb = nwr > 0 ? att_hmax8(vmax) : -INFINITY;
      if (mb == -INFINITY) /* the maxima drop NaNs: a visible NaN score must still reach the output */
        for (int64_t j = ws * ATT_BLOCK; j < nwr * ATT_BLOCK; j++)
          if (isnan(sc[j])) mb = sc[j];
      const int64_t row = (i0 + r) * A->Hq + h0 + g;
      if (mb == -INFINITY) {
        memset(ob, 0, sizeof ob); /* nothing visible: zeros, as the one-pass path gives */
      } else {
        /* masked keys' scores are -inf, so their weights are exactly 0, and every V value is
         * finite: the products need no mask */
        const __m256 vmb = _mm256_set1_ps(mb);
        __m256 lv = _mm256_setzero_ps(), acc[ATT_2P_MAXDV];
        for (int64_t d = 0; d < Dv; d++) acc[d] = _mm256_setzero_ps();
        /* the weights first, in place of the scores, then P x V: apart, neither loop runs out
         * of registers (exp's constants, Dv accumulators) */
        for (int64_t j = ws * ATT_BLOCK; j < nwr * ATT_BLOCK; j += 8) {
          const __m256 e = att_exp8_le0(_mm256_sub_ps(_mm256_loadu_ps(sc + j), vmb));
          lv = _mm256_add_ps(lv, e);
          _mm256_storeu_ps(sc + j, e);
        }
        for (int64_t w = ws; w < nwr; w++) {
          const float *vw = vt + w * Dv * ATT_BLOCK, *sw = sc + w * ATT_BLOCK;
          for (int k = 0; k < 4; k++) {
            const __m256 e = _mm256_loadu_ps(sw + 8 * k);
            for (int64_t d = 0; d < Dv; d++) acc[d] = _mm256_fmadd_ps(e, _mm256_loadu_ps(vw + d * ATT_BLOCK + 8 * k), acc[d]);
          }
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, lv);
        const float sum = att_lane_sum(lanes), inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        for (int64_t d = 0; d < Dv; d++) {
          _mm256_storeu_ps(lanes, acc[d]);
          ob[d] = att_lane_sum(lanes) * inv;
        }
      }
      if (A->qt == XPU_DT_F32)
        memcpy((float *)A->o + row * Dv, ob, (size_t)Dv * 4);
      else
        nv_f32_row_to_f16(ob, (uint16_t *)A->o + row * Dv, Dv);
    }
  }
}

/* returns 0 (nothing written) where a loaded V value is not finite: the one-pass path then
 * keeps masked keys' 0 x inf out */
static int att_small_rows2(const att_args *A, float *base, int64_t i0, int64_t nr, int64_t h0, int64_t hk,
                           const int64_t *starts, const int64_t *ends, int64_t wbeg, int64_t wend) {
  const int64_t D = A->D, Dv = A->Dv, gs = A->gs, qb = A->qb;
  const int64_t nw = (wend + ATT_BLOCK - 1) / ATT_BLOCK, wf = wbeg / ATT_BLOCK;
  const int64_t tpad = (A->Tk + ATT_BLOCK - 1) / ATT_BLOCK * ATT_BLOCK;
  float *qf = base, *kt = base + qb * gs * att_row_floats(D, Dv, 0), *vt = kt + D * tpad, *sc = vt + Dv * tpad;
  float *zrow = sc + tpad;
  memset(zrow, 0, (size_t)(D > Dv ? D : Dv) * 4);
  for (int64_t w = wf; w < nw; w++) {
    int64_t w0 = w * ATT_BLOCK, wn = w0 + ATT_BLOCK < wend ? w0 + ATT_BLOCK : wend;
    att_window_load(A, hk, w0, wbeg, wn, kt + w * D * ATT_BLOCK, vt + w * Dv * ATT_BLOCK, (const uint8_t *)zrow);
  }
  if (wf < nw && !att_all_finite(vt + wf * Dv * ATT_BLOCK, (nw - wf) * Dv * ATT_BLOCK)) return 0;
  for (int64_t r = 0; r < nr; r++) {
    /* stories260K's head size compiled apart: the loops over D and Dv unrolled, the
     * accumulators in registers instead of spilled around a variable-length loop */
    if (D == 8 && Dv == 8)
      att_2p_row(A, qf, kt, vt, sc, i0, r, h0, starts[r], ends[r], 8, 8);
    else
      att_2p_row(A, qf, kt, vt, sc, i0, r, h0, starts[r], ends[r], D, Dv);
  }
  return 1;
}
#endif

/* the small-head path of a task: rows i0 .. i0+nr of the heads h0 .. h0+gs of KV head hk */
static void att_small_rows(const att_args *A, float *base, int64_t i0, int64_t nr, int64_t h0, int64_t hk,
                           const int64_t *starts, const int64_t *ends, int64_t wbeg, int64_t wend) {
  const int64_t D = A->D, Dv = A->Dv, gs = A->gs, qb = A->qb;
  float *qf = base, *acc = qf + qb * gs * D, *m = acc + qb * gs * Dv * ATT_LANES, *l = m + qb * gs;
  float *kt = l + qb * gs * ATT_LANES;
  float *vt = kt + D * ATT_BLOCK, *zrow = vt + Dv * ATT_BLOCK, *ob = zrow + (D > Dv ? D : Dv);
  memset(zrow, 0, (size_t)(D > Dv ? D : Dv) * 4);
  memset(acc, 0, (size_t)(nr * gs * Dv * ATT_LANES) * 4);
  memset(l, 0, (size_t)(nr * gs * ATT_LANES) * 4);
  for (int64_t r = 0; r < nr * gs; r++) m[r] = -INFINITY;
  /* the keys every row sees: the prefix before the mask's block, up to the shortest end */
  int64_t common = wend;
  for (int64_t r = 0; r < nr; r++) common = ends[r] < common ? ends[r] : common;
  if (A->mask && A->off < common) common = A->off > 0 ? A->off : 0;
  /* and from the latest start (a sliding window's) */
  int64_t cstart = 0;
  for (int64_t r = 0; r < nr; r++) cstart = starts[r] > cstart ? starts[r] : cstart;
  for (int64_t w0 = wbeg / ATT_BLOCK * ATT_BLOCK; w0 < wend; w0 += ATT_BLOCK) {
    int64_t wn = w0 + ATT_BLOCK < wend ? w0 + ATT_BLOCK : wend;
    att_window_load(A, hk, w0, wbeg, wn, kt, vt, (const uint8_t *)zrow);
    int finite = -1; /* not checked yet */
    for (int64_t r = 0; r < nr; r++) {
      float *rq = qf + r * gs * D, *racc = acc + r * gs * Dv * ATT_LANES, *rm = m + r * gs;
      float *rl = l + r * gs * ATT_LANES;
      if (w0 >= cstart && w0 + ATT_BLOCK <= common) { /* the row sees the whole window */
        att_window_row(A, rq, racc, rm, rl, kt, vt, NULL, 1);
        continue;
      }
      const int8_t *mrow = A->mask ? A->mask + (i0 + r) * A->Tq : NULL;
      uint32_t vis[ATT_BLOCK];
      int any = 0, all = 1;
      for (int64_t j = 0; j < ATT_BLOCK; j++) {
        int64_t k = w0 + j;
        int see = k >= starts[r] && k < ends[r] && (!mrow || k < A->off || mrow[k - A->off]);
        vis[j] = see ? 0xffffffffu : 0u;
        any |= see;
        if (k >= wbeg && k < wn && !see) all = 0;
      }
      if (!any) continue;
      if (!all && finite < 0) finite = att_window_finite(vt, Dv);
      att_window_row(A, rq, racc, rm, rl, kt, vt, vis, all || finite);
    }
  }
  for (int64_t r = 0; r < nr; r++) {
    for (int64_t g = 0; g < gs; g++) {
      int64_t rg = r * gs + g, row = (i0 + r) * A->Hq + h0 + g;
      float sum = att_lane_sum(l + rg * ATT_LANES), inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      const float *ag = acc + rg * Dv * ATT_LANES;
      for (int64_t d = 0; d < Dv; d++) ob[d] = att_lane_sum(ag + d * ATT_LANES) * inv;
      if (A->qt == XPU_DT_F32)
        memcpy((float *)A->o + row * Dv, ob, (size_t)Dv * 4);
      else
        nv_f32_row_to_f16(ob, (uint16_t *)A->o + row * Dv, Dv);
    }
  }
}

/* the end of the candidate keys of query row i: keys [0, end); with a mask, those at off+j are
 * skipped unless mask[i, j] (att_window_keys) */
static inline int64_t att_row_end(const att_args *A, int64_t i) {
  int64_t end = A->Tk;
  if (A->causal) {
    int64_t lim = A->mask ? A->off + A->Tq : i + A->off + 1;
    if (lim < end) end = lim;
  }
  return end < 0 ? 0 : end;
}

/* the first key query row i may see: 0, or with a sliding window the window's first key;
 * keys before it are never read */
static inline int64_t att_row_start(const att_args *A, int64_t i) {
  if (!A->window) return 0;
  int64_t s = i + A->woff + 1;
  return s > 0 ? s : 0;
}

/* the first window (a multiple of ATT_BLOCK, so that a row's windows are the same whichever
 * rows share its task: a verify row keeps a decode row's bits) holding a key row i sees */
static inline int64_t att_first_window(const att_args *A, int64_t i) {
  return att_row_start(A, i) / ATT_BLOCK * ATT_BLOCK;
}

/* the keys query row i sees among [w0, e), into kidx; returns their count */
static inline int64_t att_window_keys(const att_args *A, int64_t i, int64_t w0, int64_t e, int64_t *kidx) {
  const int8_t *mrow = A->mask ? A->mask + i * A->Tq : NULL;
  int64_t jb = 0, st = att_row_start(A, i);
  for (int64_t j = w0 > st ? w0 : st; j < e; j++)
    if (!mrow || j < A->off || mrow[j - A->off]) kidx[jb++] = j;
  return jb;
}

/* head row `row` of q (rows of [Tq, Hq]) as f32 */
static inline void att_load_q(const att_args *A, int64_t row, float *dst) {
  if (A->qt == XPU_DT_F32)
    memcpy(dst, (const float *)A->q + row * A->D, (size_t)A->D * 4);
  else
    nv_f16_row_to_f32((const uint16_t *)A->q + row * A->D, dst, A->D);
}

/* head row `row` of the output: the accumulator over the softmax sum l (zeros where no key was
 * visible); scales acc in place */
static inline void att_store_row(const att_args *A, int64_t row, float *acc, float l) {
  float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (int64_t d = 0; d < A->Dv; d++) acc[d] *= inv;
  if (A->qt == XPU_DT_F32)
    memcpy((float *)A->o + row * A->Dv, acc, (size_t)A->Dv * 4);
  else
    nv_f32_row_to_f16(acc, (uint16_t *)A->o + row * A->Dv, A->Dv);
}

/*
 * One query row (decode) on the large-head path: the thread's head groups are walked inside
 * each key window instead of one after another over all the keys. A position's K (and V) row
 * holds every kv head side by side, so the groups together read each window's rows whole and
 * in order, where group after group each strode through the cache a head's slice at a time
 * (Hkv slices apart, a few rows to a page): decode's KV cache is cold, evicted by the weights
 * streamed since the layer's previous token, and the strided walk waited on memory. Each group
 * sees the same windows in the same order with the same arithmetic as on the other path, so
 * the result is bit for bit the same (a verify row still matches a decode row). The groups'
 * state lives side by side in the scratch: at most Hq heads' worth (nv_attention_scratch).
 */
static void att_row_keys_outer(const att_args *A, float *base, int64_t t0, int64_t t1, int64_t wbeg, int64_t wend,
                               int store) {
  const int64_t group = A->Hq / A->Hkv, gs = A->gs, nt = t1 - t0, D = A->D, Dv = A->Dv;
  float *qf = base, *acc = qf + nt * gs * D, *m = acc + nt * gs * Dv, *l = m + nt * gs, *s = l + nt * gs;
  const int64_t end = att_row_end(A, 0) < wend ? att_row_end(A, 0) : wend;
  for (int64_t r = 0; r < nt * gs; r++) {
    att_load_q(A, t0 * gs + r, qf + r * D);
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }
  memset(acc, 0, (size_t)(nt * gs * Dv) * 4);
  for (int64_t w0 = wbeg; w0 < end; w0 += ATT_BLOCK) {
    int64_t kidx[ATT_BLOCK], jb = att_window_keys(A, 0, w0, w0 + ATT_BLOCK < end ? w0 + ATT_BLOCK : end, kidx);
    if (jb == 0) continue;
    for (int64_t t = 0; t < nt; t++) {
      const int64_t hk = ((t0 + t) * gs) / group;
      att_block(A, qf + t * gs * D, acc + t * gs * Dv, m + t * gs, l + t * gs, s, kidx, jb, hk,
                t == 0 || hk != ((t0 + t - 1) * gs) / group);
    }
  }
  if (store)
    for (int64_t r = 0; r < nt * gs; r++) att_store_row(A, t0 * gs + r, acc + r * Dv, l[r]);
}

/*
 * Flash-decoding: one decode row whose head groups are fewer than the threads splits its keys
 * instead. Each thread runs every head over a contiguous range of the key windows (so each K
 * and V row is still read once, for the whole group) and leaves its unnormalized state, the
 * running max m, the sum l and the accumulator, in its scratch; att_split_merge then combines
 * the threads' states. Split by heads, such a row kept one thread per group busy and the
 * others idle, or (groups cut to single heads) read the cache once per query head.
 */
static void att_split_task(void *p, int tid, int nth) {
  att_args *A = (att_args *)p;
  const int64_t first = att_first_window(A, 0), end = att_row_end(A, 0);
  const int64_t nwin = end > first ? (end - first + ATT_BLOCK - 1) / ATT_BLOCK : 0;
  int64_t w0, w1;
  nv_range(nwin, tid, nth, 1, &w0, &w1);
  if (tid == 0) A->nsplit = nth;
  att_row_keys_outer(A, (float *)nv_scratch(A->r, tid), 0, A->Hq / A->gs, first + w0 * ATT_BLOCK,
                     first + w1 * ATT_BLOCK, 0);
}

/* the output of a split decode row: per head, the threads' states rescaled to the largest max
 * and added (a thread whose range held no visible key has m = -inf and adds nothing) */
static void att_split_merge(const att_args *A) {
  const int64_t Hq = A->Hq, D = A->D, Dv = A->Dv;
  float *b0 = (float *)nv_scratch(A->r, 0), *acc0 = b0 + Hq * D, *m0 = acc0 + Hq * Dv, *l0 = m0 + Hq;
  for (int t = 1; t < A->nsplit; t++) {
    const float *bt = (const float *)nv_scratch(A->r, t), *acct = bt + Hq * D, *mt = acct + Hq * Dv, *lt = mt + Hq;
    for (int64_t h = 0; h < Hq; h++) {
      if (mt[h] == -INFINITY) continue;
      const float mx = mt[h] > m0[h] ? mt[h] : m0[h];
      const float c0 = m0[h] == -INFINITY ? 0.0f : expf(m0[h] - mx), ct = expf(mt[h] - mx);
      for (int64_t d = 0; d < Dv; d++) acc0[h * Dv + d] = acc0[h * Dv + d] * c0 + acct[h * Dv + d] * ct;
      l0[h] = l0[h] * c0 + lt[h] * ct;
      m0[h] = mx;
    }
  }
  for (int64_t h = 0; h < Hq; h++) att_store_row(A, h, acc0 + h * Dv, l0[h]);
}

/*
 * One task is a block of qb query rows and a KV head hk with the `gs` query heads that read it
 * (all of the group, or one head when there are too few groups to keep the threads busy). Each
 * K and V row is loaded from memory once for the whole group and all qb rows: decode with
 * grouped-query attention reads the KV cache once instead of once per query head, and a chunk
 * (a prefill chunk, a draft tree being verified) once per qb rows instead of once per row. The
 * keys go by windows of ATT_BLOCK positions; each row takes the ones it sees from a window (a
 * prefix for causal rows; with a tree mask, the prefix before q_offset and the block keys its
 * mask row marks) while the window's rows are still in the core's cache.
 */
static void att_task(void *p, int tid, int nth) {
  att_args *A = (att_args *)p;
  const int64_t group = A->Hq / A->Hkv, gs = A->gs, per_row = A->Hq / gs, qb = A->qb;
  const int64_t nblocks = (A->Tq + qb - 1) / qb;
  const int small = att_small(A->D, A->Dv, att_is_q(A->kt) || att_is_q(A->vt));
  int64_t t0, t1;
  nv_range(nblocks * per_row, tid, nth, 1, &t0, &t1);
  float *base = (float *)nv_scratch(A->r, tid);
  if (A->Tq == 1 && !small) {
    if (t1 > t0) att_row_keys_outer(A, base, t0, t1, att_first_window(A, 0), INT64_MAX, 1);
    return;
  }
  /* both paths keep the queries first; the large-head path's state follows them */
  float *qf = base, *acc = qf + qb * gs * A->D, *m = acc + qb * gs * A->Dv, *l = m + qb * gs, *s = l + qb * gs;
  for (int64_t task = t0; task < t1; task++) {
    int64_t i0 = (task / per_row) * qb, h0 = (task % per_row) * gs, hk = h0 / group;
    int64_t nr = A->Tq - i0 < qb ? A->Tq - i0 : qb, ends[ATT_MAX_QB], starts[ATT_MAX_QB], wend = 0, wbeg = INT64_MAX;
    for (int64_t r = 0; r < nr; r++) {
      ends[r] = att_row_end(A, i0 + r);
      starts[r] = att_row_start(A, i0 + r);
      if (ends[r] > wend) wend = ends[r];
      if (starts[r] < wbeg) wbeg = starts[r];
      for (int64_t g = 0; g < gs; g++) att_load_q(A, (i0 + r) * A->Hq + h0 + g, qf + (r * gs + g) * A->D);
    }
    if (small) {
#if ATT_LANES == 8
      if (att_2p(A->Tk, A->D, A->Dv) && att_small_rows2(A, base, i0, nr, h0, hk, starts, ends, wbeg, wend)) continue;
#endif
      att_small_rows(A, base, i0, nr, h0, hk, starts, ends, wbeg, wend);
      continue;
    }
    for (int64_t r = 0; r < nr * gs; r++) {
      m[r] = -INFINITY;
      l[r] = 0.0f;
    }
    memset(acc, 0, (size_t)(nr * gs * A->Dv) * 4);
    for (int64_t w0 = wbeg / ATT_BLOCK * ATT_BLOCK; w0 < wend; w0 += ATT_BLOCK) {
      for (int64_t r = 0; r < nr; r++) {
        int64_t kidx[ATT_BLOCK], jb = att_window_keys(A, i0 + r, w0, w0 + ATT_BLOCK < ends[r] ? w0 + ATT_BLOCK : ends[r], kidx);
        if (jb > 0)
          att_block(A, qf + r * gs * A->D, acc + r * gs * A->Dv, m + r * gs, l + r * gs, s, kidx, jb, hk, r == 0);
      }
    }
    for (int64_t r = 0; r < nr; r++)
      for (int64_t g = 0; g < gs; g++)
        att_store_row(A, (i0 + r) * A->Hq + h0 + g, acc + (r * gs + g) * A->Dv, l[r * gs + g]);
  }
}

/* query heads sharing one task: the whole group when it is small enough for the stack arrays */
static int64_t att_group(int64_t hq, int64_t hkv) {
  int64_t group = hkv > 0 ? hq / hkv : 1;
  return group >= 1 && group <= ATT_MAX_GROUP ? group : 1;
}

/* floats of per-row state of one head: the query, the accumulator, m and l (the small-head
 * path keeps the accumulator and l lane-wise, 4 floats for each value) */
static int64_t att_row_floats(int64_t d, int64_t dv, int q) {
  return att_small(d, dv, q) ? d + ATT_LANES * dv + 1 + ATT_LANES : d + dv + 2; }

/* query rows sharing one task, at most: ATT_MAX_QB, fewer when the per-row state of gs heads
 * would pass ATT_QB_FLOATS floats of scratch */
static int64_t att_qb_max(int64_t tq, int64_t gs, int64_t d, int64_t dv, int q) {
  int64_t qb = ATT_MAX_QB, per = gs * att_row_floats(d, dv, q);
  while (qb > 1 && qb * per > ATT_QB_FLOATS) qb /= 2;
  return tq < qb ? (tq > 0 ? tq : 1) : qb;
}

/* per thread: the rows' state, then the large-head path's scores (gs x ATT_BLOCK) or the
 * small-head path's transposed window (kt, vt), a zero row and an output row */
uint64_t nv_attention_scratch(const xpu_ir_graph *g, const xpu_ir_node *n) {
  const xpu_ir_tensor *q = &g->tensors[n->inputs[0]], *k = &g->tensors[n->inputs[1]], *v = &g->tensors[n->inputs[2]];
  int64_t d = q->shape[2], dv = v->shape[2];
  const int qz = att_is_q(k->dtype) || att_is_q(v->dtype), small = att_small(d, dv, qz);
  int64_t gs = att_group(q->shape[1], xpu_ir_attention_kv_heads(n, k->shape[1])), qb = att_qb_max(q->shape[0], gs, d, dv, qz);
  uint64_t tail = small ? (uint64_t)((d + dv) * ATT_BLOCK + (d > dv ? d : dv) + dv) : (uint64_t)(gs * ATT_BLOCK);
#if ATT_LANES == 8
  if (small && att_2p(k->shape[0], d, dv) && (uint64_t)att_2p_floats(k->shape[0], d, dv) > tail)
    tail = (uint64_t)att_2p_floats(k->shape[0], d, dv);
#endif
  uint64_t floats = (uint64_t)(gs * qb * att_row_floats(d, dv, qz)) + tail;
  /* one row on the large-head path: every head group of a thread's range at once
   * (att_row_keys_outer), at most all Hq heads, whatever group size the run picks */
  if (q->shape[0] == 1 && !small && (uint64_t)(q->shape[1] * (d + dv + 2) + gs * ATT_BLOCK) > floats)
    floats = (uint64_t)(q->shape[1] * (d + dv + 2) + gs * ATT_BLOCK);
  return floats * 4 + 64;
}

xpu_status nv_k_attention(nv_run *r, const xpu_ir_node *n) {
  const xpu_ir_graph *g = r->g;
  const xpu_ir_tensor *q = &g->tensors[n->inputs[0]], *k = &g->tensors[n->inputs[1]], *v = &g->tensors[n->inputs[2]];
  att_args A;
  memset(&A, 0, sizeof A);
  A.q = r->ptr[n->inputs[0]];
  A.k = r->ptr[n->inputs[1]];
  A.v = r->ptr[n->inputs[2]];
  A.o = r->ptr[n->output];
  A.qt = q->dtype;
  A.kt = k->dtype;
  A.vt = v->dtype;
  A.Tq = q->shape[0];
  A.Hq = q->shape[1];
  A.D = q->shape[2];
  A.Tk = k->shape[0];
  A.Hks = k->shape[1];
  A.Hkv = xpu_ir_attention_kv_heads(n, A.Hks); /* analyze checked the range */
  A.Dv = v->shape[2];
  /* a head row of Q8_0/Q4_0 is D/32 whole blocks (analyze checked D % 32 == 0) */
  A.krow = (size_t)nv_row_bytes(A.kt, A.D);
  A.vrow = (size_t)nv_row_bytes(A.vt, A.Dv);
  /* a head range starts at its first head; the rows keep their stride */
  A.k += (size_t)n->iattr[2] * A.krow;
  A.v += (size_t)n->iattr[2] * A.vrow;
  A.causal = n->iattr[0] == 1;
  int64_t off = n->iattr[1];
  if (n->n_inputs >= 4) {
    int32_t o32;
    memcpy(&o32, r->ptr[n->inputs[3]], 4);
    off = o32;
  }
  if (n->n_inputs == 5) A.mask = (const int8_t *)r->ptr[n->inputs[4]];
  /* any offset past these bounds means the same (all keys or none): clamping keeps i + off
   * from overflowing */
  A.off = off > A.Tk ? A.Tk : off < -A.Tq - 1 ? -A.Tq - 1 : off;
  /* a sliding window (causal only, analyze checked) starts query i at key i + off - window + 1:
   * off - window, from the unclamped offset, saturated where it means no key or every key
   * (shapes stay below 2^44) */
  if (A.causal && n->iattr[4] > 0) {
    const int64_t lim = (int64_t)1 << 50;
    int64_t wo;
    if (__builtin_sub_overflow(off, n->iattr[4], &wo)) wo = -lim;
    A.window = n->iattr[4];
    A.woff = wo > lim ? lim : wo < -lim ? -lim : wo;
  }
  A.softcap = n->fattr[1] > 0.0f ? n->fattr[1] : 0.0f;
  A.scale = n->fattr[0] != 0 ? n->fattr[0] : (A.D > 0 ? 1.0f / sqrtf((float)A.D) : 1.0f);
  A.r = r;
  if (A.Tq * A.Hq * A.Dv == 0) return XPU_OK;
  /* the work is over the keys the rows can see: a decode row at position p of a long cache
   * reads p + 1 keys, not the cache's length */
  int64_t keys = att_row_end(&A, A.Tq - 1) - att_row_start(&A, A.Tq - 1);
  const int64_t work = A.Tq * A.Hq * ((keys > 0 ? keys : 0) + 1) * (A.D + A.Dv);
  /* a decode row with fewer head groups than twice the threads and keys enough for every
   * thread to take a few windows: split along the keys (att_split_task) */
  A.gs = att_group(A.Hq, A.Hkv);
  if (A.Tq == 1 && r->nth > 1 && !att_small(A.D, A.Dv, att_is_q(A.kt) || att_is_q(A.vt)) &&
      A.Hq / A.gs < 2 * (int64_t)r->nth && keys >= 4 * ATT_BLOCK * (int64_t)r->nth) {
    A.nsplit = 1;
    nv_parallel(r, work, att_split_task, &A);
    att_split_merge(&A);
    return XPU_OK;
  }
  /* whole groups per task, unless that leaves threads without work */
  if (A.gs > 1 && A.Tq * (A.Hq / A.gs) < 2 * (int64_t)r->nth) A.gs = 1;
  /* as many rows per task as keep every thread busy, within the scratch nv_attention_scratch
   * sized for the whole group */
  A.qb = att_qb_max(A.Tq, att_group(A.Hq, A.Hkv), A.D, A.Dv, att_is_q(A.kt) || att_is_q(A.vt));
  while (A.qb > 1 && (A.Tq + A.qb - 1) / A.qb * (A.Hq / A.gs) < 2 * (int64_t)r->nth) A.qb = (A.qb + 1) / 2;
  nv_parallel(r, work, att_task, &A);
  return XPU_OK;
}
