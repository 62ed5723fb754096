/*
 * k_sparse.c: SPARSE_FFN (OPS.md "SPARSE_FFN (v3)"), PowerInfer-2's neuron-bundle FFN.
 *
 * out[m, :] = sum over the listed neurons k of h(m, k) * down(k), each neuron one bundle row:
 * gate | up | down (or up | down, ungated). The bundles are usually a cache the host rewrites
 * between calls and idx changes on every call, so everything is read in place: nothing derived
 * from them is packed or kept.
 *
 * Per call: x is quantized to Q8_0 once (Q8_0/Q4_0 bundles); the listed ids are validated and
 * compacted and cut into contiguous chunks, which threads take as they finish; each neuron's
 * gate dot runs for all M rows with the plugin's Q4_0/Q8_0 x Q8_0 kernels (k_quant.c), rows
 * whose activation is exactly 0 are dropped, the up dot runs for the rest, and the down column
 * is decoded one 32-value block at a time into registers and added, scaled by each live row's
 * h, into its chunk's f32 sum. The chunks' sums are added in chunk order at the end, over
 * column ranges in parallel: the result does not depend on timing or on the thread count.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "neon.h"
#include "neon_simd.h"

#if defined(__x86_64__) && defined(__AVX2__)
#include <immintrin.h>
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))

static uint64_t al64(uint64_t v) { return (v + 63) & ~(uint64_t)63; }

#define SP_MAX_CHUNKS 16
#define SP_ACC_BYTES ((uint64_t)4 << 20)

/* where each part of a node's work areas lies (bytes from the area's start) */
typedef struct {
  int64_t M, D, Kn;
  int x16, o16, quant;
  int64_t chunks; /* the listed neurons are cut into this many chunks, each with its sum */
  /* shared: [f32 x][Q8_0 x: scales, sums, values][nv_qact per row][listed ids][f32 sum per chunk] */
  uint64_t sh_x, sh_qd, sh_qs, sh_qq, sh_act, sh_ids, sh_acc, sh_bytes;
  /* per thread: [g, u per row][live rows][nv_qact per live row] */
  uint64_t t_g, t_u, t_live, t_act, t_bytes;
} sp_layout;

static void sp_plan(const xpu_ir_graph *g, const xpu_ir_node *n, sp_layout *L) {
  const xpu_ir_tensor *x = &g->tensors[n->inputs[0]], *b = &g->tensors[n->inputs[1]];
  const xpu_ir_tensor *idx = &g->tensors[n->inputs[2]], *o = &g->tensors[n->output];
  memset(L, 0, sizeof *L);
  L->D = x->shape[x->rank - 1];
  L->M = x->rank == 2 ? x->shape[0] : 1;
  L->Kn = idx->shape[0];
  L->x16 = x->dtype == XPU_DT_F16;
  L->o16 = o->dtype == XPU_DT_F16;
  L->quant = b->dtype == XPU_DT_Q8_0 || b->dtype == XPU_DT_Q4_0;
  uint64_t M = (uint64_t)L->M, D = (uint64_t)L->D, off = 0;
  L->sh_x = off;
  if (L->x16) off += al64(M * D * 4);
  if (L->quant) {
    L->sh_qd = off;
    off += al64(M * (D / 32) * 4);
    L->sh_qs = off;
    off += al64(M * (D / 32) * 4);
    L->sh_qq = off;
    off += al64(M * D);
    L->sh_act = off;
    off += al64(M * sizeof(nv_qact));
  }
  L->sh_ids = off;
  off += al64((uint64_t)L->Kn * 4);
  /* Chunks, not threads, own the partial sums: threads take chunks as they finish (a thread that
   * is descheduled, or runs on a slower core, does not hold the others up) and the chunks' sums
   * are added in chunk order, so the result does not depend on which thread took what, nor on
   * the thread count. 16 chunks at decode (16 x 16 KB at D = 4096); fewer for large M, within
   * SP_ACC_BYTES. */
  uint64_t per = M * D * 4;
  L->chunks = per ? (int64_t)(SP_ACC_BYTES / per) : 1;
  if (L->chunks > SP_MAX_CHUNKS) L->chunks = SP_MAX_CHUNKS;
  if (L->chunks < 1) L->chunks = 1;
  L->sh_acc = off;
  off += (uint64_t)L->chunks * al64(per);
  L->sh_bytes = off;
  off = 0;
  L->t_g = off;
  off += al64(M * 4);
  L->t_u = off;
  off += al64(M * 4);
  L->t_live = off;
  off += al64(M * 4);
  L->t_act = off;
  off += L->quant ? al64(M * sizeof(nv_qact)) : 0;
  L->t_bytes = off;
}

uint64_t nv_sparse_shared(const xpu_ir_graph *g, const xpu_ir_node *n) {
  sp_layout L;
  sp_plan(g, n, &L);
  return L.sh_bytes;
}

uint64_t nv_sparse_scratch(const xpu_ir_graph *g, const xpu_ir_node *n) {
  sp_layout L;
  sp_plan(g, n, &L);
  return L.t_bytes;
}

typedef struct {
  nv_run *r;
  const sp_layout *L;
  const uint8_t *b;
  uint32_t bdt;
  uint64_t row_bytes, seg_bytes, pf_bytes; /* pf_bytes: the segments a neuron may read */
  int act, ungated;
  const int32_t *ids; /* the listed neurons, compacted */
  int64_t n_ids;
  const float *x;     /* f32 [M, D] */
  const nv_qact *qa;  /* per row of x, its Q8_0 form (quantized bundles) */
  nv_qdot_fn qdot;
  float *acc;         /* L->chunks sums of M*D values, al64-strided */
  uint64_t acc_stride; /* floats */
  unsigned char used[SP_MAX_CHUNKS]; /* chunks that listed a neuron (their sum is written) */
  atomic_int next;     /* the next chunk to take */
  void *out;
} sp_args;

static inline float sp_act(int act, float v) {
  switch (act) {
  case 0: return v > 0.0f || v != v ? v : 0.0f; /* a NaN is not an exact 0: it propagates */
  case 1: {
    float r = v > 0.0f || v != v ? v : 0.0f;
    return r * r;
  }
  default: return v / (1.0f + expf(-v));
  }
}

static inline float f16at(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return nv_h2f(h);
}

/* The 32 values of block bi of a down column as f32 vectors, without the block scale (*d). */
ALWAYS_INLINE void sp_block(const uint8_t *down, uint32_t dt, int64_t bi, float32x4_t v[8], float *d) {
  int8x16_t lo, hi;
  switch (dt) {
  case XPU_DT_Q4_0: {
    const uint8_t *blk = down + bi * 18;
    *d = f16at(blk);
    uint8x16_t q = vld1q_u8(blk + 2);
    lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F))), vdupq_n_s8(8));
    hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(8));
    break;
  }
  case XPU_DT_Q8_0: {
    const uint8_t *blk = down + bi * 34;
    *d = f16at(blk);
    lo = vld1q_s8((const int8_t *)blk + 2);
    hi = vld1q_s8((const int8_t *)blk + 18);
    break;
  }
  case XPU_DT_F16: {
    const uint16_t *p = (const uint16_t *)down + bi * 32;
    *d = 1.0f;
    for (int k = 0; k < 8; k++) v[k] = v_ld_f16(p + 4 * k);
    return;
  }
  default: {
    const float *p = (const float *)down + bi * 32;
    *d = 1.0f;
    for (int k = 0; k < 8; k++) v[k] = vld1q_f32(p + 4 * k);
    return;
  }
  }
  int16x8_t w[4] = {vmovl_s8(vget_low_s8(lo)), vmovl_s8(vget_high_s8(lo)), vmovl_s8(vget_low_s8(hi)),
                    vmovl_s8(vget_high_s8(hi))};
  for (int k = 0; k < 4; k++) {
    v[2 * k] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w[k])));
    v[2 * k + 1] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(w[k])));
  }
}

/* acc[live[i], :] += h[i] * down for the nl live rows; the down column is decoded once per block
 * for all of them. Float columns may end in a partial block (D is any size there). */
ALWAYS_INLINE void sp_axpy_impl(const uint8_t *down, uint32_t dt, int64_t D, const float *h, const int32_t *live,
                                int nl, float *acc) {
  int64_t nb = D / 32;
  for (int64_t bi = 0; bi < nb; bi++) {
    float32x4_t v[8];
    float d;
    sp_block(down, dt, bi, v, &d);
    for (int i = 0; i < nl; i++) {
      float *o = acc + (int64_t)live[i] * D + bi * 32;
      float s = h[i] * d;
      for (int k = 0; k < 8; k++) vst1q_f32(o + 4 * k, vfmaq_n_f32(vld1q_f32(o + 4 * k), v[k], s));
    }
  }
  for (int64_t j = nb * 32; j < D; j++) {
    float w = dt == XPU_DT_F16 ? nv_f16_to_f32(((const uint16_t *)down)[j]) : ((const float *)down)[j];
    for (int i = 0; i < nl; i++) acc[(int64_t)live[i] * D + j] += h[i] * w;
  }
}

static void sp_axpy_q4(const uint8_t *w, int64_t D, const float *h, const int32_t *live, int nl, float *acc) {
  sp_axpy_impl(w, XPU_DT_Q4_0, D, h, live, nl, acc);
}
static void sp_axpy_q8(const uint8_t *w, int64_t D, const float *h, const int32_t *live, int nl, float *acc) {
  sp_axpy_impl(w, XPU_DT_Q8_0, D, h, live, nl, acc);
}
static void sp_axpy_f16(const uint8_t *w, int64_t D, const float *h, const int32_t *live, int nl, float *acc) {
  sp_axpy_impl(w, XPU_DT_F16, D, h, live, nl, acc);
}
static void sp_axpy_f32(const uint8_t *w, int64_t D, const float *h, const int32_t *live, int nl, float *acc) {
  sp_axpy_impl(w, XPU_DT_F32, D, h, live, nl, acc);
}

/*
 * Decode (M = 1): the down columns of up to SP_BATCH live neurons are added block by block, so
 * each 32-value block of the accumulator is loaded and stored once per batch rather than once
 * per neuron; the neurons are added in list order, so the sums round exactly as one at a time.
 */
#define SP_BATCH 8

ALWAYS_INLINE void sp_flush_impl(uint32_t dt, const uint8_t *const *down, const float *h, int n, int64_t D,
                                 float *acc) {
  int64_t nb = D / 32;
  for (int64_t bi = 0; bi < nb; bi++) {
    float *o = acc + bi * 32;
    float32x4_t a[8];
    for (int k = 0; k < 8; k++) a[k] = vld1q_f32(o + 4 * k);
    for (int i = 0; i < n; i++) {
      float32x4_t v[8];
      float d;
      sp_block(down[i], dt, bi, v, &d);
      float s = h[i] * d;
      for (int k = 0; k < 8; k++) a[k] = vfmaq_n_f32(a[k], v[k], s);
    }
    for (int k = 0; k < 8; k++) vst1q_f32(o + 4 * k, a[k]);
  }
  for (int64_t j = nb * 32; j < D; j++)
    for (int i = 0; i < n; i++) {
      float w = dt == XPU_DT_F16 ? nv_f16_to_f32(((const uint16_t *)down[i])[j]) : ((const float *)down[i])[j];
      acc[j] += h[i] * w;
    }
}

#if defined(__x86_64__) && defined(__AVX2__)
/* The quantized blocks with AVX2 directly: SIMDe maps each NEON widening step of sp_block to
 * one or two SSE instructions, which made the decode loop compute-bound on x86-64. */
ALWAYS_INLINE void sp_flush_avx2(int q4, const uint8_t *const *down, const float *h, int n, int64_t D, float *acc) {
  const int64_t nb = D / 32, bs = q4 ? 18 : 34;
  for (int64_t bi = 0; bi < nb; bi++) {
    float *o = acc + bi * 32;
    __m256 a0 = _mm256_loadu_ps(o), a1 = _mm256_loadu_ps(o + 8), a2 = _mm256_loadu_ps(o + 16),
           a3 = _mm256_loadu_ps(o + 24);
    for (int i = 0; i < n; i++) {
      const uint8_t *blk = down[i] + bi * bs;
      uint16_t hb;
      memcpy(&hb, blk, 2);
      __m256 s = _mm256_set1_ps(h[i] * nv_h2f(hb));
      __m128i lo, hi; /* values 0..15 and 16..31 as int8 */
      if (q4) {
        __m128i q = _mm_loadu_si128((const __m128i *)(blk + 2)), m = _mm_set1_epi8(0x0F), e = _mm_set1_epi8(8);
        lo = _mm_sub_epi8(_mm_and_si128(q, m), e);
        hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m), e);
      } else {
        lo = _mm_loadu_si128((const __m128i *)(blk + 2));
        hi = _mm_loadu_si128((const __m128i *)(blk + 18));
      }
      a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), s, a0);
      a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), s, a1);
      a2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), s, a2);
      a3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), s, a3);
    }
    _mm256_storeu_ps(o, a0);
    _mm256_storeu_ps(o + 8, a1);
    _mm256_storeu_ps(o + 16, a2);
    _mm256_storeu_ps(o + 24, a3);
  }
}
#endif

static void sp_flush(uint32_t dt, const uint8_t *const *down, const float *h, int n, int64_t D, float *acc) {
  switch (dt) {
#if defined(__x86_64__) && defined(__AVX2__)
  case XPU_DT_Q4_0: sp_flush_avx2(1, down, h, n, D, acc); break;
  case XPU_DT_Q8_0: sp_flush_avx2(0, down, h, n, D, acc); break;
#else
  case XPU_DT_Q4_0: sp_flush_impl(XPU_DT_Q4_0, down, h, n, D, acc); break;
  case XPU_DT_Q8_0: sp_flush_impl(XPU_DT_Q8_0, down, h, n, D, acc); break;
#endif
  case XPU_DT_F16: sp_flush_impl(XPU_DT_F16, down, h, n, D, acc); break;
  default: sp_flush_impl(XPU_DT_F32, down, h, n, D, acc); break;
  }
}

/* out[i] = dot(segment seg, x row rows[i]) for the n rows listed (all M when rows is NULL) */
static void sp_dots(const sp_args *A, const uint8_t *seg, const int32_t *rows, int n, nv_qact *lact, float *out) {
  const sp_layout *L = A->L;
  if (A->qdot) {
    const nv_qact *acts = A->qa;
    if (rows) {
      for (int i = 0; i < n; i++) lact[i] = A->qa[rows[i]];
      acts = lact;
    }
    A->qdot(seg, L->D / 32, acts, n, out);
    return;
  }
  for (int i = 0; i < n; i++) {
    const float *xr = A->x + (int64_t)(rows ? rows[i] : i) * L->D;
    out[i] = A->bdt == XPU_DT_F16 ? nv_dot_f16(xr, (const uint16_t *)seg, L->D) : nv_dot_f32(xr, (const float *)seg, L->D);
  }
}

static void sp_chunk(sp_args *A, int tid, int64_t c);

static void sp_task(void *arg, int tid, int nth) {
  sp_args *A = (sp_args *)arg;
  (void)nth;
  for (int c; (c = atomic_fetch_add_explicit(&A->next, 1, memory_order_relaxed)) < A->L->chunks;) sp_chunk(A, tid, c);
}

static void sp_chunk(sp_args *A, int tid, int64_t c) {
  const sp_layout *L = A->L;
  uint8_t *ws = (uint8_t *)nv_scratch(A->r, tid);
  float *acc = A->acc + (uint64_t)c * A->acc_stride;
  float *g = (float *)(ws + L->t_g), *u = (float *)(ws + L->t_u);
  int32_t *live = (int32_t *)(ws + L->t_live);
  nv_qact *lact = (nv_qact *)(ws + L->t_act);
  int M = (int)L->M;
  const int64_t D = L->D, MD = L->M * L->D;
  void (*axpy)(const uint8_t *, int64_t, const float *, const int32_t *, int, float *) =
      A->bdt == XPU_DT_Q4_0 ? sp_axpy_q4 : A->bdt == XPU_DT_Q8_0 ? sp_axpy_q8 : A->bdt == XPU_DT_F16 ? sp_axpy_f16 : sp_axpy_f32;
  int64_t k0, k1;
  nv_range(A->n_ids, (int)c, (int)L->chunks, 1, &k0, &k1);
  if (k0 >= k1) return;
  memset(acc, 0, (size_t)MD * 4);
  A->used[c] = 1;
  const uint8_t *bdown[SP_BATCH];
  float bh[SP_BATCH];
  int nbatch = 0;
  for (int64_t k = k0; k < k1; k++) {
    const uint8_t *row = A->b + (uint64_t)A->ids[k] * A->row_bytes;
    /* the next bundle is somewhere else in the table (no hardware stream covers it): ask for all
     * of its lines now, so they arrive while this one is computed */
    if (k + 1 < k1) {
      const uint8_t *nx = A->b + (uint64_t)A->ids[k + 1] * A->row_bytes;
      for (uint64_t off = 0; off < A->pf_bytes; off += 64) __builtin_prefetch(nx + off, 0, 3);
    }
    sp_dots(A, row, NULL, M, lact, g);
    int nl = 0;
    for (int m = 0; m < M; m++) {
      float a = sp_act(A->act, g[m]);
      if (a == 0.0f) continue; /* OPS.md: no up and no down work for this row */
      live[nl] = m;
      g[nl++] = a;
    }
    if (!nl) continue;
    const uint8_t *down = row + A->seg_bytes;
    if (!A->ungated) {
      sp_dots(A, row + A->seg_bytes, nl == M ? NULL : live, nl, lact, u);
      for (int i = 0; i < nl; i++) g[i] *= u[i];
      down += A->seg_bytes;
    }
    if (M == 1) {
      bdown[nbatch] = down;
      bh[nbatch] = g[0];
      if (++nbatch == SP_BATCH) {
        sp_flush(A->bdt, bdown, bh, nbatch, D, acc);
        nbatch = 0;
      }
      continue;
    }
    axpy(down, D, g, live, nl, acc);
  }
  if (nbatch) sp_flush(A->bdt, bdown, bh, nbatch, D, acc);
}

/* out = the sum of the used chunks' sums in chunk order (0 where none is), over a range of the
 * M*D values */
static void sp_reduce_task(void *arg, int tid, int nth) {
  sp_args *A = (sp_args *)arg;
  const sp_layout *L = A->L;
  int64_t e0, e1, MD = L->M * L->D;
  nv_range(MD, tid, nth, 64, &e0, &e1);
  if (e0 >= e1) return;
  float tmp[256];
  for (int64_t b0 = e0; b0 < e1; b0 += 256) {
    int64_t n = e1 - b0 < 256 ? e1 - b0 : 256;
    memset(tmp, 0, sizeof tmp);
    for (int64_t c = 0; c < L->chunks; c++) {
      if (!A->used[c]) continue;
      const float *src = A->acc + (uint64_t)c * A->acc_stride + b0;
      int64_t i = 0;
      for (; i + 4 <= n; i += 4) vst1q_f32(tmp + i, vaddq_f32(vld1q_f32(tmp + i), vld1q_f32(src + i)));
      for (; i < n; i++) tmp[i] += src[i];
    }
    if (L->o16)
      nv_f32_row_to_f16(tmp, (uint16_t *)A->out + b0, n);
    else
      memcpy((float *)A->out + b0, tmp, (size_t)n * 4);
  }
}

typedef struct {
  const uint16_t *src;
  float *dst;
  int64_t n;
} sp_cvt_args;

static void sp_cvt_task(void *arg, int tid, int nth) {
  const sp_cvt_args *C = (const sp_cvt_args *)arg;
  int64_t e0, e1;
  nv_range(C->n, tid, nth, 64, &e0, &e1);
  if (e0 < e1) nv_f16_row_to_f32(C->src + e0, C->dst + e0, e1 - e0);
}

typedef struct {
  const float *x;
  float *qd, *qs;
  int8_t *qq;
  int64_t M, D;
} sp_quant_args;

static void sp_quant_task(void *arg, int tid, int nth) {
  const sp_quant_args *Q = (const sp_quant_args *)arg;
  int64_t m0, m1, nb = Q->D / 32;
  nv_range(Q->M, tid, nth, 1, &m0, &m1);
  for (int64_t m = m0; m < m1; m++) nv_quantize_row_q8(Q->x + m * Q->D, Q->D, Q->qd + m * nb, Q->qq + m * Q->D, Q->qs + m * nb);
}

xpu_status nv_k_sparse_ffn(nv_run *r, const xpu_ir_node *n) {
  const xpu_ir_graph *g = r->g;
  const xpu_ir_tensor *tb = &g->tensors[n->inputs[1]];
  sp_layout L;
  sp_plan(g, n, &L);
  int64_t S = tb->shape[0], R = tb->shape[1];
  const int32_t *idx = (const int32_t *)r->ptr[n->inputs[2]];
  int32_t *ids = (int32_t *)(r->shared + L.sh_ids);
  int64_t n_ids = 0;
  for (int64_t k = 0; k < L.Kn; k++) {
    int32_t id = idx[k];
    if (id < -1 || id >= S) {
      snprintf(r->err, sizeof r->err, "idx[%lld] = %d is outside [-1, %lld)", (long long)k, id, (long long)S);
      return XPU_E_INVALID_ARG;
    }
    if (id >= 0) ids[n_ids++] = id;
  }
  if (L.M == 0) return XPU_OK;
  sp_args args, *A = &args;
  memset(A, 0, sizeof *A);
  A->r = r;
  A->L = &L;
  A->b = r->ptr[n->inputs[1]];
  A->bdt = tb->dtype;
  A->row_bytes = nv_row_bytes(A->bdt, R);
  A->seg_bytes = nv_row_bytes(A->bdt, L.D);
  A->act = (int)n->iattr[0];
  A->pf_bytes = A->seg_bytes * (n->iattr[1] == 1 ? 2 : 3);
  A->ungated = n->iattr[1] == 1;
  A->ids = ids;
  A->n_ids = n_ids;
  A->out = r->ptr[n->output];
  A->acc = (float *)(r->shared + L.sh_acc);
  A->acc_stride = al64((uint64_t)L.M * L.D * 4) / 4;
  int64_t MD = L.M * L.D;
  if (L.x16) {
    sp_cvt_args C = {(const uint16_t *)r->ptr[n->inputs[0]], (float *)(r->shared + L.sh_x), MD};
    nv_parallel(r, MD, sp_cvt_task, &C);
    A->x = C.dst;
  } else {
    A->x = (const float *)r->ptr[n->inputs[0]];
  }
  if (L.quant) {
    sp_quant_args Q = {A->x, (float *)(r->shared + L.sh_qd), (float *)(r->shared + L.sh_qs),
                       (int8_t *)(r->shared + L.sh_qq), L.M, L.D};
    nv_parallel(r, MD, sp_quant_task, &Q);
    nv_qact *qa = (nv_qact *)(r->shared + L.sh_act);
    int64_t nb = L.D / 32;
    for (int64_t m = 0; m < L.M; m++) qa[m] = (nv_qact){Q.qd + m * nb, Q.qq + m * L.D, Q.qs + m * nb};
    A->qa = qa;
    A->qdot = nv_qdot_select(A->bdt, r->int8dot);
  }
  atomic_store(&A->next, 0);
  nv_parallel(r, n_ids * MD * (A->ungated ? 2 : 3), sp_task, A);
  nv_parallel(r, MD * L.chunks, sp_reduce_task, A);
  return XPU_OK;
}
