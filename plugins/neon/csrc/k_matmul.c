/*
 * k_matmul.c: MATMUL out[..., m, n] = sum_k a[..., m, k] * b[..., n, k].
 *
 *  - float b (F32/F16/BF16, and I8 with its scale), M >= GEMV_MAX_M: a packed, cache-blocked
 *    GEMM (Goto's loop order: B blocks of NC x KC packed once and shared by the threads, A blocks
 *    of MC x KC packed per thread, an MR x NR register micro-kernel). Packing converts b to f32,
 *    so every float b dtype shares one micro-kernel.
 *  - float b, one row (decode), or up to GEMV_MAX_M rows of a b not packed at prepare: one pass
 *    over b, a dot product per row, split over N.
 *  - float b packed at prepare (a constant of a node with M > 1), a few rows (a speculative
 *    verify, small_m; from 2 rows on: at stories260K 2 rows through the dot products took
 *    about as long as 4 through the panels): each packed panel against the unpacked rows of a,
 *    the sums over all of K in registers.
 *  - Q8_0/Q4_0 b: a quantized to Q8_0 per row, int8 block dot products (k_quant.c).
 *  - Q4_K/Q5_K/Q6_K b, constant: repacked at prepare, a quantized to Q8_K-like blocks, int8
 *    kernels (k_kquant.c). Other K-quant b (not constant, or Q2_K/Q3_K) take the float paths,
 *    dequantized per 256-value super-block while packing (GEMM) or per row (GEMV).
 */
#include <stdio.h>
#include <string.h>
#if defined(__x86_64__) && (defined(__AVX2__) || defined(__AVX512F__))
#include <immintrin.h>
#endif

#include "neon.h"
#include "neon_simd.h"

#if defined(__x86_64__) && defined(__AVX512F__)
#define MR 12
#define NR 32
#elif defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#define MR 6
#define NR 16
#else
#define MR 8
#define NR 8
#endif
#define KC 256 /* also a K-quant super-block: b_row_f32 dequantizes whole ones */
#define NC 1024
#define MC (MR * 8)
#define PK_TILE_M 4 /* activation rows per repacked-kernel call in prefill */
#define PK_MB 64    /* activation rows per L2 block in prefill */
#ifndef GEMV_MAX_M
#define GEMV_MAX_M 3
#endif

/* ---------------------------------------------------------------- row access */

/* kc values of b's row starting at column k0, as f32 */
static void b_row_f32(uint32_t bt, const uint8_t *row, int64_t k0, int64_t kc, float scale, float *dst) {
  switch (bt) {
  case XPU_DT_F32: memcpy(dst, (const float *)row + k0, (size_t)kc * 4); break;
  case XPU_DT_F16: nv_f16_row_to_f32((const uint16_t *)row + k0, dst, kc); break;
  case XPU_DT_BF16:
    for (int64_t k = 0; k < kc; k++) dst[k] = nv_bf16_to_f32(((const uint16_t *)row)[k0 + k]);
    break;
  case XPU_DT_I8:
    for (int64_t k = 0; k < kc; k++) dst[k] = scale * (float)((const int8_t *)row)[k0 + k];
    break;
  default: /* a K-quant: k0 and kc are multiples of 256 (KC is 256, K a multiple of it) */
    nv_kq_deq_row(bt, row + nv_kq_row_bytes(bt, k0), dst, kc);
    break;
  }
}

float nv_dot_f32(const float *a, const float *b, int64_t k) {
  float32x4_t s0 = vdupq_n_f32(0), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
    s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
    s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
  }
  for (; i + 4 <= k; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
  float s = v_hsum(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
  for (; i < k; i++) s += a[i] * b[i];
  return s;
}

/* four independent sums: two would leave the loop bound by the FMA latency */
float nv_dot_f16(const float *a, const uint16_t *b, int64_t k) {
  float32x4_t s0 = vdupq_n_f32(0), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    s0 = vfmaq_f32(s0, vld1q_f32(a + i), v_ld_f16(b + i));
    s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), v_ld_f16(b + i + 4));
    s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), v_ld_f16(b + i + 8));
    s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), v_ld_f16(b + i + 12));
  }
  for (; i + 4 <= k; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), v_ld_f16(b + i));
  float s = v_hsum(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
  for (; i < k; i++) s += a[i] * nv_f16_to_f32(b[i]);
  return s;
}

static float dot_bf16(const float *a, const uint16_t *b, int64_t k) {
  float32x4_t s0 = vdupq_n_f32(0);
  int64_t i = 0;
  for (; i + 4 <= k; i += 4) {
    uint32x4_t w = vshlq_n_u32(vmovl_u16(vld1_u16(b + i)), 16);
    s0 = vfmaq_f32(s0, vld1q_f32(a + i), vreinterpretq_f32_u32(w));
  }
  float s = v_hsum(s0);
  for (; i < k; i++) s += a[i] * nv_bf16_to_f32(b[i]);
  return s;
}

static float dot_i8(const float *a, const int8_t *b, int64_t k, float scale) {
  float32x4_t s0 = vdupq_n_f32(0), s1 = s0;
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    int16x8_t w = vmovl_s8(vld1_s8(b + i));
    s0 = vfmaq_f32(s0, vld1q_f32(a + i), vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))));
    s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))));
  }
  float s = v_hsum(vaddq_f32(s0, s1));
  for (; i < k; i++) s += a[i] * (float)b[i];
  return s * scale;
}

/* ---------------------------------------------------------------- micro-kernel */

/* C[mr x nr] (+)= Ap[kc x MR] * Bp[kc x NR]; Ap, Bp packed k-major, zero padded */
static void ukernel(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc, int mr, int nr,
                    int first) {
  float tile[MR * NR];
#if MR == 12 && NR == 32
  /* AVX-512: 24 zmm accumulators, two B loads and 12 broadcasts per k */
  __m512 acc[MR][2];
#pragma GCC unroll 12
  for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; k++, ap += MR, bp += NR) {
    __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
      __m512 a = _mm512_set1_ps(ap[i]);
      acc[i][0] = _mm512_fmadd_ps(a, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(a, b1, acc[i][1]);
    }
  }
  if (mr == MR && nr == NR) { /* a whole tile goes straight to C */
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
      float *cr = c + i * ldc;
      if (!first) {
        acc[i][0] = _mm512_add_ps(acc[i][0], _mm512_loadu_ps(cr));
        acc[i][1] = _mm512_add_ps(acc[i][1], _mm512_loadu_ps(cr + 16));
      }
      _mm512_storeu_ps(cr, acc[i][0]);
      _mm512_storeu_ps(cr + 16, acc[i][1]);
    }
    return;
  }
#pragma GCC unroll 12
  for (int i = 0; i < MR; i++) {
    _mm512_storeu_ps(tile + i * NR, acc[i][0]);
    _mm512_storeu_ps(tile + i * NR + 16, acc[i][1]);
  }
#elif MR == 6 && NR == 16
  __m256 acc[MR][2];
#pragma GCC unroll 6
  for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kc; k++, ap += MR, bp += NR) {
    __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++) {
      __m256 a = _mm256_broadcast_ss(ap + i);
      acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
    }
  }
  if (mr == MR && nr == NR) { /* a whole tile goes straight to C */
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++) {
      float *cr = c + i * ldc;
      if (!first) {
        acc[i][0] = _mm256_add_ps(acc[i][0], _mm256_loadu_ps(cr));
        acc[i][1] = _mm256_add_ps(acc[i][1], _mm256_loadu_ps(cr + 8));
      }
      _mm256_storeu_ps(cr, acc[i][0]);
      _mm256_storeu_ps(cr + 8, acc[i][1]);
    }
    return;
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; i++) {
    _mm256_storeu_ps(tile + i * NR, acc[i][0]);
    _mm256_storeu_ps(tile + i * NR + 8, acc[i][1]);
  }
#else
  float32x4_t c00 = vdupq_n_f32(0), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
  float32x4_t c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
  for (int64_t k = 0; k < kc; k++, ap += MR, bp += NR) {
    float32x4_t b0 = vld1q_f32(bp), b1 = vld1q_f32(bp + 4);
    float32x4_t a0 = vld1q_f32(ap), a1 = vld1q_f32(ap + 4);
    c00 = vfmaq_laneq_f32(c00, b0, a0, 0);
    c01 = vfmaq_laneq_f32(c01, b1, a0, 0);
    c10 = vfmaq_laneq_f32(c10, b0, a0, 1);
    c11 = vfmaq_laneq_f32(c11, b1, a0, 1);
    c20 = vfmaq_laneq_f32(c20, b0, a0, 2);
    c21 = vfmaq_laneq_f32(c21, b1, a0, 2);
    c30 = vfmaq_laneq_f32(c30, b0, a0, 3);
    c31 = vfmaq_laneq_f32(c31, b1, a0, 3);
    c40 = vfmaq_laneq_f32(c40, b0, a1, 0);
    c41 = vfmaq_laneq_f32(c41, b1, a1, 0);
    c50 = vfmaq_laneq_f32(c50, b0, a1, 1);
    c51 = vfmaq_laneq_f32(c51, b1, a1, 1);
    c60 = vfmaq_laneq_f32(c60, b0, a1, 2);
    c61 = vfmaq_laneq_f32(c61, b1, a1, 2);
    c70 = vfmaq_laneq_f32(c70, b0, a1, 3);
    c71 = vfmaq_laneq_f32(c71, b1, a1, 3);
  }
  vst1q_f32(tile + 0, c00), vst1q_f32(tile + 4, c01), vst1q_f32(tile + 8, c10), vst1q_f32(tile + 12, c11);
  vst1q_f32(tile + 16, c20), vst1q_f32(tile + 20, c21), vst1q_f32(tile + 24, c30), vst1q_f32(tile + 28, c31);
  vst1q_f32(tile + 32, c40), vst1q_f32(tile + 36, c41), vst1q_f32(tile + 40, c50), vst1q_f32(tile + 44, c51);
  vst1q_f32(tile + 48, c60), vst1q_f32(tile + 52, c61), vst1q_f32(tile + 56, c70), vst1q_f32(tile + 60, c71);
#endif
  for (int i = 0; i < mr; i++) {
    float *cr = c + i * ldc;
    const float *t = tile + i * NR;
    if (first)
      memcpy(cr, t, (size_t)nr * 4);
    else
      for (int j = 0; j < nr; j++) cr[j] += t[j];
  }
}

/* ---------------------------------------------------------------- drivers */

typedef struct {
  nv_run *r;
  const float *a; /* f32 rows, lda = K */
  const uint8_t *b;
  uint32_t bt;
  float scale;
  float *c;
  int64_t M, N, K, bstride; /* bstride: bytes per b row */
  /* gemm block */
  float *bp;
  int64_t jc, nc, pc, kc;
  /* quantized */
  float *qd, *qs;
  int8_t *qq;
  nv_qdot_fn qdot;
  /* repacked weights */
  const uint8_t *pk;
  nv_qpk_fn pkfn;
  /* repacked K-quant weights: activations quantized to Q8_K-like blocks */
  nv_kpk_fn kpkfn;
  int16_t *kbs;
  /* next unit of work: threads take units until none is left, so a thread that loses its core
   * (another process, a little core of a big.LITTLE CPU) does not hold the others back */
  atomic_llong next;
} mm_args;

/* the next unit for the calling thread, or -1 when all n are taken */
static inline int64_t take(mm_args *A, int64_t n) {
  int64_t u = atomic_fetch_add_explicit(&A->next, 1, memory_order_relaxed);
  return u < n ? u : -1;
}

/* Packs rows [n0, n0+NR) x columns [pc, pc+kc) of b into one NR-row panel, k-major (rows from
 * nend on are zeros): four rows at a time are converted to f32 and transposed 4x4 in registers,
 * so packing costs vector loads and stores rather than one scattered store per element. */
static void pack_panel(uint32_t bt, const uint8_t *b, int64_t bstride, float scale, int64_t n0, int64_t nend,
                       int64_t pc, int64_t kc, float *dst) {
  float rows[4][KC];
  for (int j = 0; j < NR; j += 4) {
    for (int r = 0; r < 4; r++) {
      int64_t n = n0 + j + r;
      if (n < nend)
        b_row_f32(bt, b + n * bstride, pc, kc, scale, rows[r]);
      else
        memset(rows[r], 0, sizeof rows[r]);
    }
    int64_t k = 0;
    for (; k + 4 <= kc; k += 4) {
      float32x4_t q0 = vld1q_f32(rows[0] + k), q1 = vld1q_f32(rows[1] + k);
      float32x4_t q2 = vld1q_f32(rows[2] + k), q3 = vld1q_f32(rows[3] + k);
      float32x4_t t0 = vtrn1q_f32(q0, q1), t1 = vtrn2q_f32(q0, q1);
      float32x4_t t2 = vtrn1q_f32(q2, q3), t3 = vtrn2q_f32(q2, q3);
      vst1q_f32(dst + (k + 0) * NR + j, vcombine_f32(vget_low_f32(t0), vget_low_f32(t2)));
      vst1q_f32(dst + (k + 1) * NR + j, vcombine_f32(vget_low_f32(t1), vget_low_f32(t3)));
      vst1q_f32(dst + (k + 2) * NR + j, vcombine_f32(vget_high_f32(t0), vget_high_f32(t2)));
      vst1q_f32(dst + (k + 3) * NR + j, vcombine_f32(vget_high_f32(t1), vget_high_f32(t3)));
    }
    for (; k < kc; k++)
      for (int r = 0; r < 4; r++) dst[k * NR + j + r] = rows[r][k];
  }
}

/* Packs rows [jc, jc+nc) x columns [pc, pc+kc) of b into NR-row panels (the block of one GEMM step) */
static void pack_b_task(void *p, int tid, int nth) {
  mm_args *A = (mm_args *)p;
  int64_t panels = (A->nc + NR - 1) / NR, p0, p1;
  nv_range(panels, tid, nth, 1, &p0, &p1);
  for (int64_t pi = p0; pi < p1; pi++)
    pack_panel(A->bt, A->b, A->bstride, A->scale, A->jc + pi * NR, A->jc + A->nc, A->pc, A->kc,
               A->bp + pi * A->kc * NR);
}

/* ---------------------------------------------------------------- float weights packed at prepare */

int64_t nv_fpack_panel_count(int64_t N) { return (N + NR - 1) / NR; }

uint64_t nv_fpack_bytes(int64_t N, int64_t K) { return (uint64_t)nv_fpack_panel_count(N) * NR * (uint64_t)K * 4; }

/* where the GEMM's block (jc, pc) starts: the blocks before jc are whole (NC rows, a multiple
 * of NR), and a block holds its ncp padded rows times kc */
static int64_t fpack_block(int64_t N, int64_t K, int64_t jc, int64_t pc) {
  int64_t np = nv_fpack_panel_count(N) * NR, ncp = np - jc < NC ? np - jc : NC;
  return jc * K + ncp * pc;
}

void nv_fpack_panels(uint32_t dtype, const uint8_t *src, int64_t N, int64_t K, int64_t p0, int64_t p1, float *dst) {
  int64_t bstride = K * (int64_t)xpu_dtype_block_bytes(dtype);
  for (int64_t pi = p0; pi < p1; pi++) {
    int64_t n0 = pi * NR, jc = n0 / NC * NC;
    for (int64_t pc = 0; pc < K; pc += KC) {
      int64_t kc = K - pc < KC ? K - pc : KC;
      pack_panel(dtype, src, bstride, 0.0f, n0, N, pc, kc, dst + fpack_block(N, K, jc, pc) + (n0 - jc) / NR * kc * NR);
    }
  }
}

static void pack_a(const mm_args *A, int64_t m0, int64_t mrows, float *ap) {
  for (int64_t t = 0; t < (mrows + MR - 1) / MR; t++) {
    float *dst = ap + t * A->kc * MR;
    for (int i = 0; i < MR; i++) {
      int64_t m = m0 + t * MR + i;
      if (m < m0 + mrows) {
        const float *src = A->a + m * A->K + A->pc;
        for (int64_t k = 0; k < A->kc; k++) dst[k * MR + i] = src[k];
      } else {
        for (int64_t k = 0; k < A->kc; k++) dst[k * MR + i] = 0.0f;
      }
    }
  }
}

/* Units: blocks of MC rows of A (each packed once, then run against every panel) when M is
 * large enough to share, else groups of GEMM_PG panels (A, small then, packed per unit). */
#define GEMM_PG 4

static void gemm_task(void *p, int tid, int nth) {
  mm_args *A = (mm_args *)p;
  int64_t mtiles = (A->M + MR - 1) / MR, panels = (A->nc + NR - 1) / NR;
  int by_rows = mtiles >= 2 * nth || panels < nth;
  int64_t units = by_rows ? (mtiles + MC / MR - 1) / (MC / MR) : (panels + GEMM_PG - 1) / GEMM_PG;
  float *ap = (float *)nv_scratch(A->r, tid);
  for (int64_t u; (u = take(A, units)) >= 0;) {
    int64_t t0 = 0, t1 = mtiles, q0 = 0, q1 = panels;
    if (by_rows) {
      t0 = u * (MC / MR);
      t1 = t0 + MC / MR < mtiles ? t0 + MC / MR : mtiles;
    } else {
      q0 = u * GEMM_PG;
      q1 = q0 + GEMM_PG < panels ? q0 + GEMM_PG : panels;
    }
    for (int64_t tb = t0; tb < t1; tb += MC / MR) {
      int64_t te = tb + MC / MR < t1 ? tb + MC / MR : t1;
      int64_t m0 = tb * MR, mrows = (te * MR < A->M ? te * MR : A->M) - m0;
      pack_a(A, m0, mrows, ap);
      for (int64_t q = q0; q < q1; q++) {
        int64_t n0 = A->jc + q * NR;
        int nr = (int)(A->jc + A->nc - n0 < NR ? A->jc + A->nc - n0 : NR);
        for (int64_t t = tb; t < te; t++) {
          int64_t m = t * MR;
          int mr = (int)(A->M - m < MR ? A->M - m : MR);
          ukernel(A->kc, ap + (t - tb) * A->kc * MR, A->bp + q * A->kc * NR, A->c + m * A->N + n0, A->N, mr, nr,
                  A->pc == 0);
        }
      }
    }
  }
}

/* ---------------------------------------------------------------- small M on packed weights */

/* A few rows of a (small_m) against float weights packed at prepare (a speculative verify of
 * a few tokens): each NR-row panel is run against the rows of a as they lie, SK_ROWS at a time,
 * over the whole of K with the sums in registers. The GEMM's steps (packing a per unit of
 * panels, a partial MR tile through a scratch tile, one region per KC block) cost more than
 * the arithmetic at these sizes. */
#define SK_ROWS 4

/* Up to 8 rows always (verify-4 and -8: ~8% less CPU per pass at stories260K than the GEMM);
 * up to 32 while a panel's k-slice is one KC block (16 KB on AVX2), which then stays in L1 for
 * all the row groups (verify-16 and -32: ~5% less; a longer K would stream the panel again for
 * every 4 rows, where the GEMM's KC blocking keeps it in L1). */
static int small_m(int64_t M, int64_t K) { return M <= 8 || (M <= 32 && K <= KC); }

/* c[i][0..nr) = sum_k a[i][k] * panel[k][..] for i < mr over every KC block of panel q; rows of
 * a from mr on repeat row 0 (computed, not stored) so that the loop has no row branches */
static void small_m_panel(const mm_args *A, const float *fp, int64_t q, int64_t m0, int mr, int nr) {
  const float *ar[SK_ROWS];
  for (int i = 0; i < SK_ROWS; i++) ar[i] = A->a + (m0 + (i < mr ? i : 0)) * A->K;
  int64_t n0 = q * NR, jc = n0 / NC * NC;
  float tile[SK_ROWS * NR];
#if NR == 32
  __m512 acc[SK_ROWS][2];
#pragma GCC unroll 4
  for (int i = 0; i < SK_ROWS; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
#elif NR == 16
  __m256 acc[SK_ROWS][2];
#pragma GCC unroll 4
  for (int i = 0; i < SK_ROWS; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
#else
  float32x4_t acc[SK_ROWS][2];
#pragma GCC unroll 4
  for (int i = 0; i < SK_ROWS; i++) acc[i][0] = acc[i][1] = vdupq_n_f32(0);
#endif
  for (int64_t pc = 0; pc < A->K; pc += KC) {
    int64_t kc = A->K - pc < KC ? A->K - pc : KC;
    const float *bp = fp + fpack_block(A->N, A->K, jc, pc) + (n0 - jc) / NR * kc * NR;
    for (int64_t k = 0; k < kc; k++, bp += NR) {
#if NR == 32
      __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
#pragma GCC unroll 4
      for (int i = 0; i < SK_ROWS; i++) {
        __m512 a = _mm512_set1_ps(ar[i][pc + k]);
        acc[i][0] = _mm512_fmadd_ps(a, b0, acc[i][0]);
        acc[i][1] = _mm512_fmadd_ps(a, b1, acc[i][1]);
      }
#elif NR == 16
      __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
#pragma GCC unroll 4
      for (int i = 0; i < SK_ROWS; i++) {
        __m256 a = _mm256_broadcast_ss(ar[i] + pc + k);
        acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
      }
#else
      float32x4_t b0 = vld1q_f32(bp), b1 = vld1q_f32(bp + 4);
#pragma GCC unroll 4
      for (int i = 0; i < SK_ROWS; i++) {
        float32x4_t a = vdupq_n_f32(ar[i][pc + k]);
        acc[i][0] = vfmaq_f32(acc[i][0], a, b0);
        acc[i][1] = vfmaq_f32(acc[i][1], a, b1);
      }
#endif
    }
  }
  float *c = A->c + m0 * A->N + n0;
#pragma GCC unroll 4
  for (int i = 0; i < SK_ROWS; i++) {
    float *dst = nr == NR && i < mr ? c + i * A->N : tile + i * NR;
#if NR == 32
    _mm512_storeu_ps(dst, acc[i][0]);
    _mm512_storeu_ps(dst + 16, acc[i][1]);
#elif NR == 16
    _mm256_storeu_ps(dst, acc[i][0]);
    _mm256_storeu_ps(dst + 8, acc[i][1]);
#else
    vst1q_f32(dst, acc[i][0]);
    vst1q_f32(dst + 4, acc[i][1]);
#endif
  }
  if (nr < NR)
    for (int i = 0; i < mr; i++) memcpy(c + i * A->N, tile + i * NR, (size_t)nr * 4);
}

static void small_m_task(void *p, int tid, int nth) {
  mm_args *A = (mm_args *)p;
  (void)tid;
  (void)nth;
  int64_t panels = nv_fpack_panel_count(A->N), units = (panels + GEMM_PG - 1) / GEMM_PG;
  for (int64_t u; (u = take(A, units)) >= 0;) {
    int64_t q1 = (u + 1) * GEMM_PG < panels ? (u + 1) * GEMM_PG : panels;
    for (int64_t q = u * GEMM_PG; q < q1; q++) {
      int nr = (int)(A->N - q * NR < NR ? A->N - q * NR : NR);
      for (int64_t m = 0; m < A->M; m += SK_ROWS)
        small_m_panel(A, A->bp, q, m, (int)(A->M - m < SK_ROWS ? A->M - m : SK_ROWS), nr);
    }
  }
}

/* rows of b per unit of the GEMV and the quantized matmul: long enough to stream */
static void gemv_rows(mm_args *A, int64_t n0, int64_t n1);
#define ROWS_PER_UNIT 64

static void gemv_task(void *p, int tid, int nth) {
  mm_args *A = (mm_args *)p;
  (void)tid;
  (void)nth;
  int64_t units = (A->N + ROWS_PER_UNIT - 1) / ROWS_PER_UNIT;
  for (int64_t u; (u = take(A, units)) >= 0;) {
    int64_t n0 = u * ROWS_PER_UNIT, n1 = n0 + ROWS_PER_UNIT < A->N ? n0 + ROWS_PER_UNIT : A->N;
    gemv_rows(A, n0, n1);
  }
}

static void gemv_rows(mm_args *A, int64_t n0, int64_t n1) {
  if (nv_is_kquant(A->bt)) {
    /* one super-block of the row at a time, dequantized once for every activation row */
    float buf[256];
    for (int64_t n = n0; n < n1; n++) {
      float acc[GEMV_MAX_M] = {0};
      for (int64_t k0 = 0; k0 < A->K; k0 += 256) {
        b_row_f32(A->bt, A->b + n * A->bstride, k0, 256, 0, buf);
        for (int64_t m = 0; m < A->M; m++) acc[m] += nv_dot_f32(A->a + m * A->K + k0, buf, 256);
      }
      for (int64_t m = 0; m < A->M; m++) A->c[m * A->N + n] = acc[m];
    }
    return;
  }
  for (int64_t n = n0; n < n1; n++) {
    const uint8_t *row = A->b + n * A->bstride;
    for (int64_t m = 0; m < A->M; m++) {
      const float *a = A->a + m * A->K;
      float s;
      switch (A->bt) {
      case XPU_DT_F32: s = nv_dot_f32(a, (const float *)row, A->K); break;
      case XPU_DT_F16: s = nv_dot_f16(a, (const uint16_t *)row, A->K); break;
      case XPU_DT_BF16: s = dot_bf16(a, (const uint16_t *)row, A->K); break;
      default: s = dot_i8(a, (const int8_t *)row, A->K, A->scale); break;
      }
      A->c[m * A->N + n] = s;
    }
  }
}

static void quant_a_task(void *p, int tid, int nth) {
  mm_args *A = (mm_args *)p;
  int64_t m0, m1;
  nv_range(A->M, tid, nth, 1, &m0, &m1);
  for (int64_t m = m0; m < m1; m++) nv_quantize_row_q8(A->a + m * A->K, A->K, A->qd + m * (A->K / 32), A->qq + m * A->K,
                                                          A->qs + m * (A->K / 32));
}

static void qmm_rows(mm_args *A, int64_t n0, int64_t n1);

static void qmm_task(void *p, int tid, int nth) {
  mm_args *A = (mm_args *)p;
  (void)tid;
  (void)nth;
  int64_t units = (A->N + ROWS_PER_UNIT - 1) / ROWS_PER_UNIT;
  for (int64_t u; (u = take(A, units)) >= 0;) {
    int64_t n0 = u * ROWS_PER_UNIT, n1 = n0 + ROWS_PER_UNIT < A->N ? n0 + ROWS_PER_UNIT : A->N;
    qmm_rows(A, n0, n1);
  }
}

static void qmm_rows(mm_args *A, int64_t n0, int64_t n1) {
  int64_t nb = A->K / 32;
  /* 8 weight rows stay in L1 while the activation rows pass over them, NV_QROWS at a time so
   * that each weight block is unpacked once per group */
  for (int64_t nc = n0; nc < n1; nc += 8) {
    int64_t ne = nc + 8 < n1 ? nc + 8 : n1;
    for (int64_t m = 0; m < A->M; m += NV_QROWS) {
      int nr = (int)(A->M - m < NV_QROWS ? A->M - m : NV_QROWS);
      nv_qact act[NV_QROWS];
      for (int r = 0; r < nr; r++) act[r] = (nv_qact){A->qd + (m + r) * nb, A->qq + (m + r) * A->K, A->qs + (m + r) * nb};
      for (int64_t n = nc; n < ne; n++) {
        float out[NV_QROWS];
        A->qdot(A->b + n * A->bstride, nb, act, nr, out);
        for (int r = 0; r < nr; r++) A->c[(m + r) * A->N + n] = out[r];
      }
    }
  }
}

/* ---------------------------------------------------------------- repacked Q4_0/Q8_0 */

#define PK_GROUPS_PER_UNIT 4 /* 64 rows: a few KB to a few hundred KB of one sequential stream */
#define PK_SOLO_M 8          /* up to this many rows every thread quantizes a itself: no barrier */

static uint64_t pk_act_bytes(int64_t M, int64_t K) { return (uint64_t)M * ((uint64_t)K + (uint64_t)K / 32 * 8) + 64; }

/* activation rows quantized at q (values), then scales, then sums */
static void pk_act_views(int64_t M, int64_t K, uint8_t *base, int8_t **q, float **d, int32_t **s) {
  *q = (int8_t *)base;
  *d = (float *)(base + (((uint64_t)M * K + 15) & ~(uint64_t)15));
  *s = (int32_t *)(*d + M * (K / 32));
}

static void pk_groups(mm_args *A, int64_t g0, int64_t g1, const nv_pact *act) {
  int64_t nb = A->K / 32, gbytes = (int64_t)nv_qpack_bytes(A->bt, NV_PG, A->K);
  for (int64_t g = g0; g < g1; g++) {
    int nvalid = (int)(A->N - g * NV_PG < NV_PG ? A->N - g * NV_PG : NV_PG);
    A->pkfn(A->pk + g * gbytes, nb, act, (int)A->M, A->c + g * NV_PG, A->N, nvalid);
  }
}

static void pk_run_units(mm_args *A, const nv_pact *act) {
  int64_t groups = (A->N + NV_PG - 1) / NV_PG, units = (groups + PK_GROUPS_PER_UNIT - 1) / PK_GROUPS_PER_UNIT;
  for (int64_t u; (u = take(A, units)) >= 0;) {
    int64_t g0 = u * PK_GROUPS_PER_UNIT, g1 = g0 + PK_GROUPS_PER_UNIT < groups ? g0 + PK_GROUPS_PER_UNIT : groups;
    pk_groups(A, g0, g1, act);
  }
}

/* decode: each thread quantizes the few activation rows into its own scratch, then takes units */
static void pk_solo_task(void *p, int tid, int nth) {
  mm_args *A = (mm_args *)p;
  (void)nth;
  int8_t *q;
  float *d;
  int32_t *s;
  pk_act_views(A->M, A->K, (uint8_t *)nv_scratch(A->r, tid), &q, &d, &s);
  nv_pact act[PK_SOLO_M];
  int64_t nb = A->K / 32;
  for (int64_t m = 0; m < A->M; m++) {
    nv_quantize_row_q8s(A->a + m * A->K, A->K, d + m * nb, q + m * A->K, s + m * nb);
    act[m] = (nv_pact){d + m * nb, q + m * A->K, s + m * nb};
  }
  pk_run_units(A, act);
}

static void pk_quant_task(void *p, int tid, int nth) {
  mm_args *A = (mm_args *)p;
  int64_t m0, m1, nb = A->K / 32;
  nv_range(A->M, tid, nth, 1, &m0, &m1);
  for (int64_t m = m0; m < m1; m++)
    nv_quantize_row_q8s(A->a + m * A->K, A->K, A->qd + m * nb, A->qq + m * A->K, (int32_t *)A->qs + m * nb);
}

/* prefill: the activation rows were quantized once for all threads; a unit is a few groups of
 * weight rows against every activation row (a group stays in L1 while the rows pass over it) */
static void pk_task(void *p, int tid, int nth) {
  mm_args *A = (mm_args *)p;
  (void)tid;
  (void)nth;
  nv_pact act[PK_TILE_M];
  int64_t nb = A->K / 32, groups = (A->N + NV_PG - 1) / NV_PG;
  int64_t units = (groups + PK_GROUPS_PER_UNIT - 1) / PK_GROUPS_PER_UNIT;
  int64_t gbytes = (int64_t)nv_qpack_bytes(A->bt, NV_PG, A->K);
  for (int64_t u; (u = take(A, units)) >= 0;) {
    int64_t g0 = u * PK_GROUPS_PER_UNIT, g1 = g0 + PK_GROUPS_PER_UNIT < groups ? g0 + PK_GROUPS_PER_UNIT : groups;
    /* the unit's weights stay in L2 while blocks of PK_MB activation rows (also in L2) pass */
    for (int64_t mb = 0; mb < A->M; mb += PK_MB) {
      int64_t me = mb + PK_MB < A->M ? mb + PK_MB : A->M;
      for (int64_t g = g0; g < g1; g++) {
        int nvalid = (int)(A->N - g * NV_PG < NV_PG ? A->N - g * NV_PG : NV_PG);
        for (int64_t m0 = mb; m0 < me; m0 += PK_TILE_M) {
          int mt = (int)(me - m0 < PK_TILE_M ? me - m0 : PK_TILE_M);
          for (int i = 0; i < mt; i++) {
            int64_t m = m0 + i;
            act[i] = (nv_pact){A->qd + m * nb, A->qq + m * A->K, (const int32_t *)A->qs + m * nb};
          }
          A->pkfn(A->pk + g * gbytes, nb, act, mt, A->c + m0 * A->N + g * NV_PG, A->N, nvalid);
        }
      }
    }
  }
}

/* ---------------------------------------------------------------- repacked K-quants */

/* activation rows as Q8_K-like blocks: values, then f32 scales, then int16 sums */
static uint64_t kq_act_bytes(int64_t M, int64_t K) {
  return (uint64_t)M * ((uint64_t)K + (uint64_t)K / 256 * (4 + 2 * NV_KBS)) + 128;
}

static void kq_act_views(int64_t M, int64_t K, uint8_t *base, int8_t **q, float **d, int16_t **bs) {
  *q = (int8_t *)base;
  *d = (float *)(base + (((uint64_t)M * K + 63) & ~(uint64_t)63));
  *bs = (int16_t *)(*d + M * (K / 256));
}

static inline nv_kact kq_act_row(const mm_args *A, int64_t m) {
  int64_t nsb = A->K / 256;
  return (nv_kact){A->qd + m * nsb, A->qq + m * A->K, A->kbs + m * nsb * NV_KBS};
}

static void kq_groups(mm_args *A, int64_t g0, int64_t g1, const nv_kact *act) {
  int64_t nsb = A->K / 256, gbytes = (int64_t)nv_qpack_bytes(A->bt, NV_PG, A->K);
  for (int64_t g = g0; g < g1; g++) {
    int nvalid = (int)(A->N - g * NV_PG < NV_PG ? A->N - g * NV_PG : NV_PG);
    A->kpkfn(A->pk + g * gbytes, nsb, act, (int)A->M, A->c + g * NV_PG, A->N, nvalid);
  }
}

/* decode: as pk_solo_task, each thread quantizes the few rows itself, then takes units */
static void kq_solo_task(void *p, int tid, int nth) {
  mm_args *A = (mm_args *)p;
  (void)nth;
  int8_t *q;
  float *d;
  int16_t *bs;
  kq_act_views(A->M, A->K, (uint8_t *)nv_scratch(A->r, tid), &q, &d, &bs);
  nv_kact act[PK_SOLO_M];
  int64_t nsb = A->K / 256;
  for (int64_t m = 0; m < A->M; m++) {
    nv_quantize_row_q8k(A->a + m * A->K, A->K, d + m * nsb, q + m * A->K, bs + m * nsb * NV_KBS);
    act[m] = (nv_kact){d + m * nsb, q + m * A->K, bs + m * nsb * NV_KBS};
  }
  int64_t groups = (A->N + NV_PG - 1) / NV_PG, units = (groups + PK_GROUPS_PER_UNIT - 1) / PK_GROUPS_PER_UNIT;
  for (int64_t u; (u = take(A, units)) >= 0;) {
    int64_t g0 = u * PK_GROUPS_PER_UNIT, g1 = g0 + PK_GROUPS_PER_UNIT < groups ? g0 + PK_GROUPS_PER_UNIT : groups;
    kq_groups(A, g0, g1, act);
  }
}

static void kq_quant_task(void *p, int tid, int nth) {
  mm_args *A = (mm_args *)p;
  int64_t m0, m1, nsb = A->K / 256;
  nv_range(A->M, tid, nth, 1, &m0, &m1);
  for (int64_t m = m0; m < m1; m++)
    nv_quantize_row_q8k(A->a + m * A->K, A->K, A->qd + m * nsb, A->qq + m * A->K, A->kbs + m * nsb * NV_KBS);
}

/* prefill: pk_task's blocking (a unit of weight groups in L2, PK_MB activation rows passing) */
static void kq_task(void *p, int tid, int nth) {
  mm_args *A = (mm_args *)p;
  (void)tid;
  (void)nth;
  nv_kact act[PK_TILE_M];
  int64_t nsb = A->K / 256, groups = (A->N + NV_PG - 1) / NV_PG;
  int64_t units = (groups + PK_GROUPS_PER_UNIT - 1) / PK_GROUPS_PER_UNIT;
  int64_t gbytes = (int64_t)nv_qpack_bytes(A->bt, NV_PG, A->K);
  for (int64_t u; (u = take(A, units)) >= 0;) {
    int64_t g0 = u * PK_GROUPS_PER_UNIT, g1 = g0 + PK_GROUPS_PER_UNIT < groups ? g0 + PK_GROUPS_PER_UNIT : groups;
    for (int64_t mb = 0; mb < A->M; mb += PK_MB) {
      int64_t me = mb + PK_MB < A->M ? mb + PK_MB : A->M;
      for (int64_t g = g0; g < g1; g++) {
        int nvalid = (int)(A->N - g * NV_PG < NV_PG ? A->N - g * NV_PG : NV_PG);
        for (int64_t m0 = mb; m0 < me; m0 += PK_TILE_M) {
          int mt = (int)(me - m0 < PK_TILE_M ? me - m0 : PK_TILE_M);
          for (int i = 0; i < mt; i++) act[i] = kq_act_row(A, m0 + i);
          A->kpkfn(A->pk + g * gbytes, nsb, act, mt, A->c + m0 * A->N + g * NV_PG, A->N, nvalid);
        }
      }
    }
  }
}

typedef struct {
  const uint16_t *src;
  float *dst;
  int64_t n;
} cvt_args;

static void cvt_task(void *p, int tid, int nth) {
  cvt_args *A = (cvt_args *)p;
  int64_t b, e;
  nv_range(A->n, tid, nth, 1024, &b, &e);
  nv_f16_row_to_f32(A->src + b, A->dst + b, e - b);
}

static int is_quant(uint32_t bt) { return bt == XPU_DT_Q8_0 || bt == XPU_DT_Q4_0; }

int nv_fpack_wanted(const xpu_ir_graph *g, const xpu_ir_node *n) {
  const xpu_ir_tensor *a = &g->tensors[n->inputs[0]], *b = &g->tensors[n->inputs[1]];
  int64_t M = a->rank >= 2 ? a->shape[a->rank - 2] : 1, N = b->shape[b->rank - 2], K = b->shape[b->rank - 1];
  return nv_is_float_weight(b->dtype) && M > 1 && N > 0 && K > 0 && nv_fpack_bytes(N, K) <= NV_FPACK_MAX;
}

/* per-thread: the packed A block (GEMM) */
uint64_t nv_matmul_scratch(const xpu_ir_graph *g, const xpu_ir_node *n) {
  uint64_t s = (uint64_t)MC * KC * 4 + 64;
  const xpu_ir_tensor *a = &g->tensors[n->inputs[0]], *b = &g->tensors[n->inputs[1]];
  int64_t K = a->shape[a->rank - 1], M = a->rank >= 2 ? a->shape[a->rank - 2] : 1;
  if (is_quant(b->dtype) && M <= PK_SOLO_M && pk_act_bytes(M, K) > s) s = pk_act_bytes(M, K);
  if (nv_kq_repackable(b->dtype) && M <= PK_SOLO_M && kq_act_bytes(M, K) > s) s = kq_act_bytes(M, K);
  return s;
}

/* bytes of the node-wide work area after the f16 copy of a: packed B block or quantized a */
/* quantized activations: scales, then block sums, then values */
static uint64_t qscale_bytes(uint64_t M, uint64_t K) { return (M * (K / 32) * 4 + 63) / 64 * 64; }

static uint64_t work_bytes(uint32_t bt, uint64_t M, uint64_t K) {
  if (is_quant(bt)) return 2 * qscale_bytes(M, K) + (M * K + 63) / 64 * 64;
  /* a K-quant b is repacked (quantized activations) or not (the float GEMM's packed block) */
  if (nv_kq_repackable(bt) && kq_act_bytes((int64_t)M, (int64_t)K) > (uint64_t)NC * KC * 4)
    return (kq_act_bytes((int64_t)M, (int64_t)K) + 63) / 64 * 64;
  return (uint64_t)NC * KC * 4;
}

/* shared by the threads of one node: [f32 copy of an f16 a][work area][f32 result of an f16 out] */
uint64_t nv_matmul_shared(const xpu_ir_graph *g, const xpu_ir_node *n) {
  const xpu_ir_tensor *a = &g->tensors[n->inputs[0]], *b = &g->tensors[n->inputs[1]];
  const xpu_ir_tensor *o = &g->tensors[n->output];
  uint64_t K = (uint64_t)a->shape[a->rank - 1], M = a->rank >= 2 ? (uint64_t)a->shape[a->rank - 2] : 1;
  uint64_t N = (uint64_t)b->shape[b->rank - 2];
  uint64_t s = work_bytes(b->dtype, M, K);
  if (a->dtype == XPU_DT_F16) s += (M * K * 4 + 63) / 64 * 64;
  if (o->dtype == XPU_DT_F16) s += M * N * 4;
  return s;
}

xpu_status nv_k_matmul(nv_run *r, const xpu_ir_node *n) {
  const xpu_ir_graph *g = r->g;
  const xpu_ir_tensor *ta = &g->tensors[n->inputs[0]], *tb = &g->tensors[n->inputs[1]], *to = &g->tensors[n->output];
  int64_t K = ta->shape[ta->rank - 1], M = ta->rank >= 2 ? ta->shape[ta->rank - 2] : 1;
  int64_t N = tb->shape[tb->rank - 2];
  uint32_t bt = tb->dtype;
  int64_t bstride = (int64_t)nv_row_bytes(bt, K);
  /* batch: up to two leading dims of the output, broadcast over a and b */
  int64_t ob[2] = {1, 1}, sa[2] = {0, 0}, sb[2] = {0, 0};
  uint32_t obr = to->rank >= 2 ? to->rank - 2 : 0;
  for (uint32_t i = 0; i < obr; i++) ob[2 - obr + i] = to->shape[i];
  if (ta->rank > 2) {
    int64_t st = M * K;
    for (int i = (int)ta->rank - 3, j = 1; i >= 0; i--, j--) {
      sa[j] = ta->shape[i] == 1 ? 0 : st;
      st *= ta->shape[i];
    }
  }
  if (tb->rank > 2) {
    int64_t st = N * K;
    for (int i = (int)tb->rank - 3, j = 1; i >= 0; i--, j--) {
      sb[j] = tb->shape[i] == 1 ? 0 : st;
      st *= tb->shape[i];
    }
  }
  if (M == 0 || N == 0) return XPU_OK;
  const nv_qpacked *pk = r->packed ? r->packed[n - g->nodes] : NULL;
  const float *fp = pk && nv_is_float_weight(bt) ? (const float *)pk->data : NULL;
  int a16 = ta->dtype == XPU_DT_F16;
  uint8_t *shared = r->shared;
  float *abuf = NULL;
  if (a16) {
    abuf = (float *)shared;
    shared += ((uint64_t)M * K * 4 + 63) / 64 * 64;
  }
  float *cbuf = NULL;
  int c16 = to->dtype == XPU_DT_F16;
  for (int64_t b0 = 0; b0 < ob[0]; b0++)
    for (int64_t b1 = 0; b1 < ob[1]; b1++) {
      int64_t bi = b0 * ob[1] + b1;
      mm_args A;
      memset(&A, 0, sizeof A);
      A.r = r;
      A.M = M;
      A.N = N;
      A.K = K;
      A.bt = bt;
      A.scale = n->fattr[0];
      A.bstride = bstride;
      int64_t aoff = b0 * sa[0] + b1 * sa[1];
      if (a16) {
        cvt_args C = {(const uint16_t *)r->ptr[n->inputs[0]] + aoff, abuf, M * K};
        nv_parallel(r, M * K, cvt_task, &C);
        A.a = abuf;
      } else {
        A.a = (const float *)r->ptr[n->inputs[0]] + aoff;
      }
      /* element offset of this batch in b, in bytes per element of the plain dtypes */
      /* K = 0 (an empty sum, zeros below) has no rows of b to step over */
      A.b = K ? r->ptr[n->inputs[1]] + (b0 * sb[0] + b1 * sb[1]) / K * bstride : r->ptr[n->inputs[1]];
      if (c16) {
        /* f16 output: compute into f32 then round once; reuse the per-thread-free shared tail */
        cbuf = (float *)(shared + work_bytes(bt, (uint64_t)M, (uint64_t)K));
        A.c = cbuf;
      } else {
        A.c = (float *)r->ptr[n->output] + bi * M * N;
      }
      if (K == 0) {
        memset(A.c, 0, (size_t)(M * N) * 4);
      } else if (is_quant(bt) && pk) {
        A.pk = pk->data;
        A.pkfn = nv_qpk_select(bt, r->int8dot);
        atomic_store(&A.next, 0);
        if (M <= PK_SOLO_M) {
          nv_parallel(r, M * N * K, pk_solo_task, &A);
        } else {
          A.qd = (float *)shared;
          A.qs = (float *)(shared + qscale_bytes((uint64_t)M, (uint64_t)K));
          A.qq = (int8_t *)(shared + 2 * qscale_bytes((uint64_t)M, (uint64_t)K));
          nv_parallel(r, M * K, pk_quant_task, &A);
          nv_parallel(r, M * N * K, pk_task, &A);
        }
      } else if (nv_is_kquant(bt) && pk) {
        A.pk = pk->data;
        A.kpkfn = nv_kpk_select(bt, r->int8dot);
        atomic_store(&A.next, 0);
        if (M <= PK_SOLO_M) {
          nv_parallel(r, M * N * K, kq_solo_task, &A);
        } else {
          kq_act_views(M, K, shared, &A.qq, &A.qd, &A.kbs);
          nv_parallel(r, M * K, kq_quant_task, &A);
          nv_parallel(r, M * N * K, kq_task, &A);
        }
      } else if (is_quant(bt)) {
        A.qd = (float *)shared;
        A.qs = (float *)(shared + qscale_bytes((uint64_t)M, (uint64_t)K));
        A.qq = (int8_t *)(shared + 2 * qscale_bytes((uint64_t)M, (uint64_t)K));
        A.qdot = nv_qdot_select(bt, r->int8dot);
        nv_parallel(r, M * K, quant_a_task, &A);
        atomic_store(&A.next, 0);
        nv_parallel(r, M * N * K, qmm_task, &A);
      } else if (fp && small_m(M, K)) {
        A.bp = (float *)fp;
        atomic_store(&A.next, 0);
        nv_parallel(r, M * N * K, small_m_task, &A);
      } else if (M <= GEMV_MAX_M) {
        atomic_store(&A.next, 0);
        nv_parallel(r, M * N * K, gemv_task, &A);
      } else {
        A.bp = (float *)shared;
        for (A.jc = 0; A.jc < N; A.jc += NC) {
          A.nc = N - A.jc < NC ? N - A.jc : NC;
          for (A.pc = 0; A.pc < K; A.pc += KC) {
            A.kc = K - A.pc < KC ? K - A.pc : KC;
            if (fp)
              A.bp = (float *)fp + fpack_block(N, K, A.jc, A.pc);
            else
              nv_parallel(r, A.nc * A.kc * 16, pack_b_task, &A);
            atomic_store(&A.next, 0);
            nv_parallel(r, M * A.nc * A.kc, gemm_task, &A);
          }
        }
      }
      if (c16) nv_f32_row_to_f16(cbuf, (uint16_t *)r->ptr[n->output] + bi * M * N, M * N);
    }
  return XPU_OK;
}
