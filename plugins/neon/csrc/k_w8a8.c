/*
 * k_w8a8.c: op set 3 (OPS.md "Int8 activations (v3)", "SHADOW_MATMUL").
 *
 * W8A8 MATMUL: an I8 activation row times I8 weight rows is an exact int32 sum (K < 2^17), then
 * one scaling, in double so the result and the optional 16-bit output grid round exactly as the
 * reference's (only the final f32/f16 store rounds). The int8 dot is vdotq_s32 on aarch64 with
 * dotprod, vpdpbusd where the x86-64 CPU has AVX512-VNNI (chosen at run time like k_quant.c's
 * Q8_0 kernels), widening multiply-adds otherwise. Threads split the weight rows (N); each
 * weight row is used for every activation row while it sits in L1.
 *
 * MATMUL with a float a and per-channel I8 weight scales goes through f32 (a weight row is
 * converted once per thread and used for every activation row).
 *
 * SHADOW_MATMUL costs in proportion to the outliers: x is scanned, and only an (m, c) with
 * |x| > t adds e·wt[c, :] to out[m, :]; threads split the output columns when the outliers
 * times N is large.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#if defined(__x86_64__) && defined(__AVX2__)
#include <immintrin.h>
#endif

#include "neon.h"
#include "neon_simd.h"

/* ---------------------------------------------------------------- exact int8 dots */

/* Σ a[i]·w[i] over k values; asum = Σ a[i] (only the VNNI kernel uses it) */
typedef int32_t (*i8dot_fn)(const int8_t *a, int32_t asum, const int8_t *w, int64_t k);

static inline int32_t dot_tail(const int8_t *a, const int8_t *w, int64_t i, int64_t k) {
  int32_t s = 0;
  for (; i < k; i++) s += (int32_t)a[i] * (int32_t)w[i];
  return s;
}

/* vmull_s8 products fit int16 (|-128·-128| = 2^14), pairwise sums int32 */
static int32_t i8dot_widen(const int8_t *a, int32_t asum, const int8_t *w, int64_t k) {
  (void)asum;
  int32x4_t acc0 = vdupq_n_s32(0), acc1 = acc0;
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    int8x16_t av = vld1q_s8(a + i), wv = vld1q_s8(w + i);
    acc0 = vpadalq_s16(acc0, vmull_s8(vget_low_s8(av), vget_low_s8(wv)));
    acc1 = vpadalq_s16(acc1, vmull_s8(vget_high_s8(av), vget_high_s8(wv)));
  }
  return vaddvq_s32(vaddq_s32(acc0, acc1)) + dot_tail(a, w, i, k);
}

#if defined(__x86_64__) && defined(__AVX2__)
/* sign-extend to int16, then madd: pairs of products sum to at most 2^15 in int32 */
static int32_t i8dot_avx2(const int8_t *a, int32_t asum, const int8_t *w, int64_t k) {
  (void)asum;
  __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0;
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    __m256i a0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(a + i)));
    __m256i a1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(a + i + 16)));
    __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + i)));
    __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + i + 16)));
    acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(a0, w0));
    acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(a1, w1));
  }
  __m256i s = _mm256_add_epi32(acc0, acc1);
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
  return _mm_cvtsi128_si32(h) + dot_tail(a, w, i, k);
}

/*
 * vpdpbusd multiplies unsigned by signed bytes. w ^ 0x80 is w + 128 as an unsigned byte, so the
 * sum is Σ (w+128)·a = Σ w·a + 128·Σ a: exact for every code including -128, with no
 * saturation (vpdpbusd, unlike vpdpbusds, wraps, and 4·255·128 is far from int32's range).
 */
#define W8VNNI __attribute__((target("avx512vnni,avx512vl,avx2")))
W8VNNI static int32_t i8dot_vnni(const int8_t *a, int32_t asum, const int8_t *w, int64_t k) {
  const __m256i flip = _mm256_set1_epi8((char)0x80);
  __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0;
  int64_t i = 0;
  for (; i + 64 <= k; i += 64) {
    __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + i)), flip);
    __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + i + 32)), flip);
    acc0 = _mm256_dpbusd_epi32(acc0, w0, _mm256_loadu_si256((const __m256i *)(a + i)));
    acc1 = _mm256_dpbusd_epi32(acc1, w1, _mm256_loadu_si256((const __m256i *)(a + i + 32)));
  }
  for (; i + 32 <= k; i += 32) {
    __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + i)), flip);
    acc0 = _mm256_dpbusd_epi32(acc0, w0, _mm256_loadu_si256((const __m256i *)(a + i)));
  }
  __m256i s = _mm256_add_epi32(acc0, acc1);
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
  int32_t head = 0; /* Σ a over the vector part: asum less the tail */
  for (int64_t j = i; j < k; j++) head += a[j];
  head = asum - head;
  return _mm_cvtsi128_si32(h) - 128 * head + dot_tail(a, w, i, k);
}

static int w8_have_vnni(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
}
#endif

#if defined(__aarch64__)
#define W8DP __attribute__((target("arch=armv8.2-a+dotprod")))
W8DP static int32_t i8dot_dp(const int8_t *a, int32_t asum, const int8_t *w, int64_t k) {
  (void)asum;
  int32x4_t acc0 = vdupq_n_s32(0), acc1 = acc0;
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    acc0 = vdotq_s32(acc0, vld1q_s8(a + i), vld1q_s8(w + i));
    acc1 = vdotq_s32(acc1, vld1q_s8(a + i + 16), vld1q_s8(w + i + 16));
  }
  for (; i + 16 <= k; i += 16) acc0 = vdotq_s32(acc0, vld1q_s8(a + i), vld1q_s8(w + i));
  return vaddvq_s32(vaddq_s32(acc0, acc1)) + dot_tail(a, w, i, k);
}
#endif

static i8dot_fn i8dot_select(int int8dot) {
  (void)int8dot;
#if defined(__aarch64__)
  if (int8dot && nv_have_dotprod()) return i8dot_dp;
#elif defined(__x86_64__) && defined(__AVX2__)
  if (int8dot && w8_have_vnni()) return i8dot_vnni;
  return i8dot_avx2;
#endif
  return i8dot_widen;
}

/* ---------------------------------------------------------------- W8A8 MATMUL */

int nv_is_w8a8(const xpu_ir_graph *g, const xpu_ir_node *n) {
  return n->op == XPU_OP_MATMUL && (n->n_inputs == 3 || g->tensors[n->inputs[0]].dtype == XPU_DT_I8);
}

typedef struct {
  nv_run *r;
  const uint8_t *a; /* I8 codes, or f32/f16 values */
  uint32_t adt;
  const int8_t *b;
  const float *sbv; /* per-channel scales, or NULL: sb */
  double sa, sb, so;
  int64_t M, N, K;
  uint8_t *out;
  int o16;
  i8dot_fn dot;
  const int32_t *asum; /* per activation row (I8 a) */
} w8_args;

static inline void w8_store(const w8_args *A, int64_t m, int64_t j, double v) {
  if (A->so > 0) {
    double q = round(v / A->so); /* half away from zero, as OPS.md's grid */
    v = A->so * (q > 32767 ? 32767 : q < -32767 ? -32767 : q);
  }
  if (A->o16)
    ((uint16_t *)A->out)[m * A->N + j] = nv_f32_to_f16((float)v);
  else
    ((float *)A->out)[m * A->N + j] = (float)v;
}

static void w8_task(void *arg, int tid, int nth) {
  const w8_args *A = (const w8_args *)arg;
  int64_t j0, j1;
  nv_range(A->N, tid, nth, 4, &j0, &j1);
  const int8_t *qa = (const int8_t *)A->a;
  for (int64_t j = j0; j < j1; j++) {
    const int8_t *w = A->b + j * A->K;
    double sb = A->sbv ? (double)A->sbv[j] : A->sb;
    for (int64_t m = 0; m < A->M; m++) {
      int32_t acc = A->dot(qa + m * A->K, A->asum[m], w, A->K);
      w8_store(A, m, j, (double)acc * A->sa * sb); /* grouped as the reference's */
    }
  }
}

/* float a times per-channel I8 weights: a weight row to f32 once, then f32 dots */
static void w8f_task(void *arg, int tid, int nth) {
  const w8_args *A = (const w8_args *)arg;
  int64_t j0, j1;
  nv_range(A->N, tid, nth, 4, &j0, &j1);
  float *wf = (float *)nv_scratch(A->r, tid), *af = wf + ((A->K + 15) & ~(int64_t)15);
  for (int64_t j = j0; j < j1; j++) {
    const int8_t *w = A->b + j * A->K;
    for (int64_t k = 0; k < A->K; k++) wf[k] = (float)w[k];
    double s = A->sbv ? (double)A->sbv[j] : A->sb;
    for (int64_t m = 0; m < A->M; m++) {
      const float *ar = (const float *)A->a + m * A->K;
      if (A->adt == XPU_DT_F16) {
        nv_f16_row_to_f32((const uint16_t *)A->a + m * A->K, af, A->K);
        ar = af;
      }
      float32x4_t s0 = vdupq_n_f32(0), s1 = s0;
      int64_t k = 0;
      for (; k + 8 <= A->K; k += 8) {
        s0 = vfmaq_f32(s0, vld1q_f32(ar + k), vld1q_f32(wf + k));
        s1 = vfmaq_f32(s1, vld1q_f32(ar + k + 4), vld1q_f32(wf + k + 4));
      }
      float d = vaddvq_f32(vaddq_f32(s0, s1));
      for (; k < A->K; k++) d += ar[k] * wf[k];
      w8_store(A, m, j, (double)d * s);
    }
  }
}

uint64_t nv_w8a8_scratch(const xpu_ir_graph *g, const xpu_ir_node *n) {
  const xpu_ir_tensor *a = &g->tensors[n->inputs[0]];
  if (a->dtype == XPU_DT_I8) return 0;
  uint64_t K = (uint64_t)a->shape[a->rank - 1];
  return 2 * ((K + 15) & ~(uint64_t)15) * 4 + 64;
}

uint64_t nv_w8a8_shared(const xpu_ir_graph *g, const xpu_ir_node *n) {
  const xpu_ir_tensor *a = &g->tensors[n->inputs[0]];
  if (a->dtype != XPU_DT_I8) return 0;
  uint64_t rows = 1;
  for (uint32_t d = 0; d + 1 < a->rank; d++) rows *= (uint64_t)a->shape[d];
  return rows * 4 + 64; /* Σ a per row */
}

xpu_status nv_k_w8a8(nv_run *r, const xpu_ir_node *n) {
  const xpu_ir_graph *g = r->g;
  const xpu_ir_tensor *ta = &g->tensors[n->inputs[0]], *tb = &g->tensors[n->inputs[1]];
  const xpu_ir_tensor *to = &g->tensors[n->output];
  w8_args A;
  memset(&A, 0, sizeof A);
  A.r = r;
  A.K = tb->shape[1];
  A.N = tb->shape[0];
  A.M = 1;
  for (uint32_t d = 0; d + 1 < ta->rank; d++) A.M *= ta->shape[d];
  A.a = r->ptr[n->inputs[0]];
  A.adt = ta->dtype;
  A.b = (const int8_t *)r->ptr[n->inputs[1]];
  A.sb = n->fattr[0];
  A.sa = n->fattr[1];
  A.so = n->fattr[2];
  A.out = r->ptr[n->output];
  A.o16 = to->dtype == XPU_DT_F16;
  if (n->n_inputs == 3) {
    A.sbv = (const float *)r->ptr[n->inputs[2]];
    for (int64_t j = 0; j < A.N; j++)
      if (!(A.sbv[j] > 0) || isinf(A.sbv[j])) {
        snprintf(r->err, sizeof r->err, "per-channel scale %lld is %g, must be positive and finite",
                 (long long)j, (double)A.sbv[j]);
        return XPU_E_INVALID_ARG;
      }
  }
  if (A.M == 0 || A.N == 0) return XPU_OK;
  if (ta->dtype != XPU_DT_I8) {
    nv_parallel(r, A.M * A.N * A.K, w8f_task, &A);
    return XPU_OK;
  }
  int32_t *asum = (int32_t *)r->shared;
  const int8_t *qa = (const int8_t *)A.a;
  for (int64_t m = 0; m < A.M; m++) {
    int32_t s = 0;
    for (int64_t k = 0; k < A.K; k++) s += qa[m * A.K + k];
    asum[m] = s;
  }
  A.asum = asum;
  A.dot = i8dot_select(r->int8dot);
  nv_parallel(r, A.M * A.N * A.K, w8_task, &A);
  return XPU_OK;
}

/* ---------------------------------------------------------------- SHADOW_MATMUL */

typedef struct {
  const uint8_t *x, *wt;
  uint32_t xdt, wdt;
  const int32_t *ids; /* NULL: c */
  float t;
  int64_t M, K, C, N;
  float *out; /* f32 [M, N], zeroed */
} sh_args;

static inline float sh_x(const sh_args *A, int64_t m, int64_t c) {
  int64_t i = m * A->K + (A->ids ? A->ids[c] : c);
  return A->xdt == XPU_DT_F16 ? nv_f16_to_f32(((const uint16_t *)A->x)[i]) : ((const float *)A->x)[i];
}

/* e(v) = v − clamp(v, −t, t); 0 inside the clip, NaN stays NaN */
static inline float sh_e(float v, float t) {
  if (v > t) return v - t;
  if (v < -t) return v + t;
  return v != v ? v : 0.0f;
}

static void sh_task(void *arg, int tid, int nth) {
  const sh_args *A = (const sh_args *)arg;
  int64_t j0, j1;
  nv_range(A->N, tid, nth, 16, &j0, &j1);
  if (j0 >= j1) return;
  for (int64_t m = 0; m < A->M; m++) {
    float *o = A->out + m * A->N;
    for (int64_t c = 0; c < A->C; c++) {
      float e = sh_e(sh_x(A, m, c), A->t);
      if (e == 0.0f) continue;
      float32x4_t ev = vdupq_n_f32(e);
      int64_t j = j0;
      if (A->wdt == XPU_DT_F16) {
        const uint16_t *w = (const uint16_t *)A->wt + c * A->N;
        for (; j + 4 <= j1; j += 4) vst1q_f32(o + j, vfmaq_f32(vld1q_f32(o + j), ev, v_ld_f16(w + j)));
        for (; j < j1; j++) o[j] += e * nv_f16_to_f32(w[j]);
      } else {
        const float *w = (const float *)A->wt + c * A->N;
        for (; j + 4 <= j1; j += 4) vst1q_f32(o + j, vfmaq_f32(vld1q_f32(o + j), ev, vld1q_f32(w + j)));
        for (; j < j1; j++) o[j] += e * w[j];
      }
    }
  }
}

uint64_t nv_shadow_shared(const xpu_ir_graph *g, const xpu_ir_node *n) {
  const xpu_ir_tensor *o = &g->tensors[n->output];
  return o->dtype == XPU_DT_F16 ? (uint64_t)xpu_ir_numel(o) * 4 + 64 : 0;
}

xpu_status nv_k_shadow(nv_run *r, const xpu_ir_node *n) {
  const xpu_ir_graph *g = r->g;
  const xpu_ir_tensor *tx = &g->tensors[n->inputs[0]], *tw = &g->tensors[n->inputs[1]];
  const xpu_ir_tensor *to = &g->tensors[n->output];
  sh_args A;
  memset(&A, 0, sizeof A);
  A.x = r->ptr[n->inputs[0]];
  A.wt = r->ptr[n->inputs[1]];
  A.xdt = tx->dtype;
  A.wdt = tw->dtype;
  A.K = tx->shape[tx->rank - 1];
  A.M = tx->rank == 2 ? tx->shape[0] : 1;
  A.C = tw->shape[0];
  A.N = tw->shape[1];
  A.t = n->fattr[0];
  if (n->n_inputs == 3) {
    A.ids = (const int32_t *)r->ptr[n->inputs[2]];
    for (int64_t c = 0; c < A.C; c++)
      if (A.ids[c] < 0 || A.ids[c] >= A.K) {
        snprintf(r->err, sizeof r->err, "id %d at position %lld is outside the %lld input channels", A.ids[c],
                 (long long)c, (long long)A.K);
        return XPU_E_INVALID_ARG;
      }
  }
  int o16 = to->dtype == XPU_DT_F16;
  A.out = o16 ? (float *)r->shared : (float *)r->ptr[n->output];
  int64_t MN = A.M * A.N;
  if (MN == 0) return XPU_OK;
  memset(A.out, 0, (size_t)MN * 4);
  /* the scan is cheap next to one outlier's N-wide update: count first, to size the region */
  int64_t outliers = 0;
  for (int64_t m = 0; m < A.M; m++)
    for (int64_t c = 0; c < A.C; c++) outliers += sh_e(sh_x(&A, m, c), A.t) != 0.0f;
  /* threads only when the outliers' updates outweigh waking them (nv_parallel's threshold) */
  if (outliers) nv_parallel(r, outliers * A.N, sh_task, &A);
  if (o16) nv_f32_row_to_f16(A.out, (uint16_t *)r->ptr[n->output], MN);
  return XPU_OK;
}
