/*
 * k_kquant.c: the K-quants (Q4_K, Q5_K, Q6_K, Q2_K, Q3_K; super-blocks of 256 values, OPS.md).
 *
 *  - Scalar dequantization of all five, in OPS.md's f32 order (bit-exact with ggml): GET_ROWS,
 *    DEQUANTIZE, and the float matmul paths for weights that are not repacked.
 *  - Q4_K, Q5_K and Q6_K matmul weights repacked at prepare into 16-row groups (the scheme of
 *    k_qpack.c's Q4_0 layout) and the int8 kernels that read them, against activations quantized
 *    on the fly to Q8_K-like blocks (256 values, one f32 scale, int8 codes, integer sums per 16
 *    and per 32 values for the min/offset terms).
 *
 * Repacked layout, per group of NV_PG = 16 rows and per super-block (a "group super-block"):
 *
 *   [16 f16 d][16 f16 dmin]*[NS x 16 int8 sub-block scales][4 x 16 x 2 u8 mins]*[4 segments]
 *   (* Q4_K/Q5_K only; NS = 8 sub-blocks of 32 for Q4_K/Q5_K, 16 of 16 for Q6_K)
 *
 * Every weight is first decoded to its unsigned code u (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63),
 * value = d * sc[s] * u - dmin * m[s] (Q4_K/Q5_K) or d * sc[t] * (u - 32) (Q6_K). Segment c
 * covers values 64c..64c+63: 8 chunks of 64 B, chunk q holding in bytes 4j..4j+3 (row j) the
 * low nibbles of values 64c+4q..+3 (low nibble) and 64c+32+4q..+3 (high nibble), as the Q4_0
 * chunks do; then, per extra bit (Q5_K one, Q6_K two), a 64-byte plane for the low and one for
 * the high values whose byte 4j+i has in bit q that bit of chunk q's value. Extracting it is a
 * shift and a mask per chunk, the same on every ISA. A chunk feeds one dot-product instruction
 * (vpdpbusd, sdot by lane) for 16 rows with 4 activation bytes broadcast; the sums per
 * sub-block are multiplied by each row's integer scale (int32), summed over the super-block in
 * integers, and converted once per super-block. Q6_K's -32 offset starts each sub-block sum at
 * -32 * sum(a); the Q4_K/Q5_K mins are one pairwise int16 dot of each row's mins against the
 * activation's per-32 sums.
 *
 * The repacked copy is 148 B per 256 values of a row for Q4_K (144 in GGUF), 180 for Q5_K (176)
 * and 210 for Q6_K (210): the scales are unpacked from 6 bits to bytes.
 */
#include <math.h>
#include <string.h>
#if defined(__x86_64__) && defined(__AVX2__)
#include <immintrin.h>
#endif

#include "neon.h"
#include "neon_simd.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

static inline float f16le(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return nv_f16_to_f32(h);
}

/* ---------------------------------------------------------------- decoding (OPS.md) */

/* the 6-bit scale and min of sub-block s from Q4_K/Q5_K's scales[12] */
static inline void scale_min6(int s, const uint8_t *q, int *sc, int *m) {
  if (s < 4) {
    *sc = q[s] & 63;
    *m = q[s + 4] & 63;
  } else {
    *sc = (q[s + 4] & 0xF) | ((q[s - 4] >> 6) << 4);
    *m = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
  }
}

/* One super-block of Q4_K, Q5_K or Q6_K as codes u[256] and integer scales: sc[8] and mn[8]
 * per 32 values (Q4_K, Q5_K) or sc[16] per 16 values (Q6_K). */
static void decode_sb(uint32_t dt, const uint8_t *blk, uint8_t *u, int *sc, int *mn) {
  if (dt == XPU_DT_Q6_K) {
    /* value 128h + 32j + l: ql[64h + 32(j%2) + l] nibble j/2, qh[32h + l] bits 2j..2j+1 */
    const uint8_t *ql = blk, *qh = blk + 128;
    for (int h = 0; h < 2; h++)
      for (int j = 0; j < 4; j++)
        for (int l = 0; l < 32; l++)
          u[128 * h + 32 * j + l] = (uint8_t)(((ql[64 * h + 32 * (j % 2) + l] >> (4 * (j / 2))) & 0xF) |
                                              (((qh[32 * h + l] >> (2 * j)) & 3) << 4));
    for (int t = 0; t < 16; t++) sc[t] = (int8_t)blk[192 + t];
    return;
  }
  const uint8_t *scales = blk + 4, *qh = blk + 16, *qs = blk + (dt == XPU_DT_Q5_K ? 48 : 16);
  for (int s = 0; s < 8; s++) scale_min6(s, scales, &sc[s], &mn[s]);
  /* value 64c + 32hi + l: qs[32c + l] nibble hi, and for Q5_K bit s = 2c + hi of qh[l] */
  for (int c = 0; c < 4; c++)
    for (int l = 0; l < 32; l++) {
      uint8_t q = qs[32 * c + l];
      u[64 * c + l] = q & 0xF;
      u[64 * c + 32 + l] = q >> 4;
    }
  if (dt == XPU_DT_Q5_K)
    for (int i = 0; i < 256; i++) u[i] |= (uint8_t)(((qh[i % 32] >> (i / 32)) & 1) << 4);
}

uint64_t nv_kq_row_bytes(uint32_t dt, int64_t k) { return (uint64_t)(k / 256) * xpu_dtype_block_bytes(dt); }

/* k values (a multiple of 256) of one K-quant row as f32, by OPS.md's formulas: (d*sc) first,
 * then times the code, then minus (dmin*m), each rounded to f32 (no contraction: -std=c11). */
void nv_kq_deq_row(uint32_t dt, const uint8_t *src, float *dst, int64_t k) {
  const int64_t bs = xpu_dtype_block_bytes(dt);
  for (int64_t b = 0; b < k / 256; b++, src += bs, dst += 256) {
    switch (dt) {
    case XPU_DT_Q4_K:
    case XPU_DT_Q5_K: {
      uint8_t u[256];
      int sc[16], mn[16];
      decode_sb(dt, src, u, sc, mn);
      float d = f16le(src), dmin = f16le(src + 2);
      for (int i = 0; i < 256; i++) {
        float d1 = d * (float)sc[i / 32], m1 = dmin * (float)mn[i / 32];
        dst[i] = d1 * (float)u[i] - m1;
      }
      break;
    }
    case XPU_DT_Q6_K: {
      uint8_t u[256];
      int sc[16], mn[16];
      decode_sb(dt, src, u, sc, mn);
      float d = f16le(src + 208);
      for (int i = 0; i < 256; i++) dst[i] = (d * (float)sc[i / 16]) * (float)((int)u[i] - 32);
      break;
    }
    case XPU_DT_Q2_K: {
      const uint8_t *scales = src, *qs = src + 16;
      float d = f16le(src + 80), dmin = f16le(src + 82);
      for (int i = 0; i < 256; i++) {
        int h = i / 128, j = (i % 128) / 32, l = i % 32;
        int q = (qs[32 * h + l] >> (2 * j)) & 3, bb = scales[i / 16];
        dst[i] = (d * (float)(bb & 0xF)) * (float)q - dmin * (float)(bb >> 4);
      }
      break;
    }
    case XPU_DT_Q3_K: {
      const uint8_t *hm = src, *qs = src + 32, *scales = src + 96;
      float d = f16le(src + 108);
      int sc[16];
      for (int t = 0; t < 16; t++) {
        int lo = t < 8 ? scales[t] & 0xF : scales[t - 8] >> 4;
        int hi = (scales[8 + t % 4] >> (2 * (t / 4))) & 3;
        sc[t] = (lo | hi << 4) - 32;
      }
      for (int i = 0; i < 256; i++) {
        int h = i / 128, j = (i % 128) / 32, l = i % 32;
        int q = ((qs[32 * h + l] >> (2 * j)) & 3) - ((hm[l] >> (4 * h + j)) & 1 ? 0 : 4);
        dst[i] = (d * (float)sc[i / 16]) * (float)q;
      }
      break;
    }
    default: memset(dst, 0, 256 * sizeof(float)); break;
    }
  }
}

/* ---------------------------------------------------------------- repacked layout */

typedef struct {
  int ns;   /* sub-blocks per super-block: 8 (of 32 values) or 16 (of 16) */
  int nhb;  /* bit planes beyond the nibble */
  int mins; /* Q4_K/Q5_K: d, dmin, scales and mins; Q6_K: d and scales */
  int off;  /* code offset (Q6_K: value = d * sc * (u - 32)) */
} kfmt;

ALWAYS_INLINE kfmt kq_fmt(int kind) {
  /* kind 0 = Q4_K, 1 = Q5_K, 2 = Q6_K */
  kfmt f = {kind == 2 ? 16 : 8, kind, kind != 2, kind == 2 ? 32 : 0};
  return f;
}

ALWAYS_INLINE int kq_kind(uint32_t dt) { return dt == XPU_DT_Q4_K ? 0 : dt == XPU_DT_Q5_K ? 1 : 2; }

/* offsets inside a group super-block */
#define KO_D 0
#define KO_DMIN 32
ALWAYS_INLINE int ko_sc(kfmt f) { return f.mins ? 64 : 32; }
ALWAYS_INLINE int ko_mn(kfmt f) { return ko_sc(f) + 16 * f.ns; }
ALWAYS_INLINE int ko_seg(kfmt f) { return ko_mn(f) + (f.mins ? 128 : 0); }
ALWAYS_INLINE int ko_segb(kfmt f) { return 512 + 128 * f.nhb; }
ALWAYS_INLINE int kq_gsb(kfmt f) { return ko_seg(f) + 4 * ko_segb(f); }

int nv_kq_repackable(uint32_t dt) { return dt == XPU_DT_Q4_K || dt == XPU_DT_Q5_K || dt == XPU_DT_Q6_K; }

uint64_t nv_kq_pack_bytes(uint32_t dt, int64_t N, int64_t K) {
  return (uint64_t)((N + NV_PG - 1) / NV_PG) * (uint64_t)(K / 256) * (uint64_t)kq_gsb(kq_fmt(kq_kind(dt)));
}

void nv_kq_pack_groups(uint32_t dt, const uint8_t *src, int64_t N, int64_t K, int64_t g0, int64_t g1, uint8_t *dst) {
  const kfmt f = kq_fmt(kq_kind(dt));
  const int64_t nsb = K / 256, bs = xpu_dtype_block_bytes(dt), gsb = kq_gsb(f);
  for (int64_t g = g0; g < g1; g++)
    for (int64_t b = 0; b < nsb; b++) {
      uint8_t *o = dst + (g * nsb + b) * gsb;
      memset(o, 0, (size_t)gsb); /* rows past N: d = 0 and codes 0 add nothing */
      for (int j = 0; j < NV_PG; j++) {
        int64_t n = g * NV_PG + j;
        if (n >= N) break;
        const uint8_t *blk = src + n * nsb * bs + b * bs;
        uint8_t u[256];
        int sc[16], mn[16];
        decode_sb(dt, blk, u, sc, mn);
        if (f.mins) {
          memcpy(o + KO_D + 2 * j, blk, 2);
          memcpy(o + KO_DMIN + 2 * j, blk + 2, 2);
          for (int p = 0; p < 4; p++) {
            o[ko_mn(f) + 32 * p + 2 * j] = (uint8_t)mn[2 * p];
            o[ko_mn(f) + 32 * p + 2 * j + 1] = (uint8_t)mn[2 * p + 1];
          }
        } else {
          memcpy(o + KO_D + 2 * j, blk + 208, 2);
        }
        for (int t = 0; t < f.ns; t++) o[ko_sc(f) + 16 * t + j] = (uint8_t)(int8_t)sc[t];
        for (int c = 0; c < 4; c++) {
          uint8_t *sg = o + ko_seg(f) + c * ko_segb(f);
          for (int i = 0; i < 4; i++) {
            const int at = 4 * j + i;
            unsigned pl[2][2] = {{0, 0}, {0, 0}}; /* bit planes of this byte position, over q */
            for (int q = 0; q < 8; q++) {
              unsigned lo = u[64 * c + 4 * q + i], hi = u[64 * c + 32 + 4 * q + i];
              sg[64 * q + at] = (uint8_t)((lo & 0xF) | (hi & 0xF) << 4);
              pl[0][0] |= ((lo >> 4) & 1) << q;
              pl[0][1] |= ((hi >> 4) & 1) << q;
              pl[1][0] |= ((lo >> 5) & 1) << q;
              pl[1][1] |= ((hi >> 5) & 1) << q;
            }
            for (int L = 0; L < f.nhb; L++) {
              sg[512 + 128 * L + at] = (uint8_t)pl[L][0];
              sg[512 + 128 * L + 64 + at] = (uint8_t)pl[L][1];
            }
          }
        }
      }
    }
}

/* ---------------------------------------------------------------- activations (Q8_K-like) */

/* nearest integer, ties to even (vcvtnq_s32_f32 is missing from SIMDe) */
static inline int32x4_t rne_s32(float32x4_t v) { return vcvtq_s32_f32(vrndnq_f32(v)); }

/* Per 256 values: d = amax/127 (f32, not rounded to f16), q = x/d rounded to nearest even,
 * bs[0..15] the sums of q per 16 values, bs[16..23] per 32. */
void nv_quantize_row_q8k(const float *x, int64_t k, float *d, int8_t *q, int16_t *bs) {
  for (int64_t b = 0; b < k / 256; b++, x += 256, q += 256, bs += NV_KBS) {
    float32x4_t m = vdupq_n_f32(0);
    for (int i = 0; i < 256; i += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x + i)));
    float amax = vmaxvq_f32(m);
    float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
    d[b] = dd;
    for (int i = 0; i < 256; i += 16) {
      int16x8_t lo = vcombine_s16(vqmovn_s32(rne_s32(vmulq_n_f32(vld1q_f32(x + i), id))),
                                  vqmovn_s32(rne_s32(vmulq_n_f32(vld1q_f32(x + i + 4), id))));
      int16x8_t hi = vcombine_s16(vqmovn_s32(rne_s32(vmulq_n_f32(vld1q_f32(x + i + 8), id))),
                                  vqmovn_s32(rne_s32(vmulq_n_f32(vld1q_f32(x + i + 12), id))));
      vst1q_s8(q + i, vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi)));
      bs[i / 16] = (int16_t)vaddvq_s16(vaddq_s16(lo, hi));
    }
    for (int s = 0; s < 8; s++) bs[16 + s] = (int16_t)(bs[2 * s] + bs[2 * s + 1]);
  }
}

/* ---------------------------------------------------------------- generic kernel (any CPU) */

static inline int32_t ld32(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return v;
}

static inline float h2f_at(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return nv_h2f(h);
}

/* Plain C over the repacked layout: the portable build and aarch64 without dotprod (the Go
 * test TestKQuantKernelsAgree holds every SIMD kernel to it, through the portable build). */
static void kpk_generic(const uint8_t *w, int64_t nsb, const nv_kact *a, int mr, int kind, float *out, int64_t ldo,
                        int nvalid) {
  const kfmt f = kq_fmt(kind);
  const int64_t gsb = kq_gsb(f);
  for (int m = 0; m < mr; m++) {
    float acc[NV_PG] = {0};
    const uint8_t *wb = w;
    for (int64_t b = 0; b < nsb; b++, wb += gsb) {
      const int8_t *aq = a[m].q + b * 256;
      const int16_t *bs = a[m].bs + b * NV_KBS;
      int32_t tot[NV_PG] = {0}, mt[NV_PG] = {0};
      for (int c = 0; c < 4; c++) {
        const uint8_t *sg = wb + ko_seg(f) + c * ko_segb(f);
        for (int j = 0; j < NV_PG; j++) {
          int32_t il[2], ih[2];
          for (int h = 0; h < 2; h++) {
            il[h] = -f.off * bs[4 * c + h];
            ih[h] = -f.off * bs[4 * c + 2 + h];
          }
          for (int q = 0; q < 8; q++)
            for (int i = 0; i < 4; i++) {
              int at = 4 * j + i, byte = sg[64 * q + at];
              int lo = byte & 0xF, hi = byte >> 4;
              for (int L = 0; L < f.nhb; L++) {
                lo |= ((sg[512 + 128 * L + at] >> q) & 1) << (4 + L);
                hi |= ((sg[512 + 128 * L + 64 + at] >> q) & 1) << (4 + L);
              }
              il[q / 4] += lo * aq[64 * c + 4 * q + i];
              ih[q / 4] += hi * aq[64 * c + 32 + 4 * q + i];
            }
          const int8_t *sc = (const int8_t *)(wb + ko_sc(f));
          if (f.ns == 16)
            tot[j] += sc[16 * (4 * c) + j] * il[0] + sc[16 * (4 * c + 1) + j] * il[1] + sc[16 * (4 * c + 2) + j] * ih[0] +
                      sc[16 * (4 * c + 3) + j] * ih[1];
          else
            tot[j] += sc[16 * (2 * c) + j] * (il[0] + il[1]) + sc[16 * (2 * c + 1) + j] * (ih[0] + ih[1]);
        }
      }
      if (f.mins)
        for (int j = 0; j < NV_PG; j++)
          for (int s = 0; s < 8; s++) mt[j] += wb[ko_mn(f) + 32 * (s / 2) + 2 * j + s % 2] * bs[16 + s];
      float da = a[m].d[b];
      for (int j = 0; j < NV_PG; j++) {
        acc[j] += h2f_at(wb + KO_D + 2 * j) * (da * (float)tot[j]);
        if (f.mins) acc[j] -= h2f_at(wb + KO_DMIN + 2 * j) * (da * (float)mt[j]);
      }
    }
    memcpy(out + m * ldo, acc, (size_t)nvalid * 4);
  }
}

#define KPK_VARIANTS(IMPL, ATTR)                                                                 \
  ATTR static void IMPL##_rows(int kind, const uint8_t *w, int64_t nsb, const nv_kact *a, int mr, float *o,   \
                               int64_t ldo, int nv) {                                            \
    int m = 0;                                                                                   \
    for (; m + 4 <= mr; m += 4) IMPL(w, nsb, a + m, 4, kind, o + m * ldo, ldo, nv);              \
    for (; m + 2 <= mr; m += 2) IMPL(w, nsb, a + m, 2, kind, o + m * ldo, ldo, nv);              \
    for (; m < mr; m++) IMPL(w, nsb, a + m, 1, kind, o + m * ldo, ldo, nv);                      \
  }                                                                                              \
  ATTR static void IMPL##_q4k(const uint8_t *w, int64_t nsb, const nv_kact *a, int mr, float *o, int64_t ldo, int nv) { \
    IMPL##_rows(0, w, nsb, a, mr, o, ldo, nv);                                                   \
  }                                                                                              \
  ATTR static void IMPL##_q5k(const uint8_t *w, int64_t nsb, const nv_kact *a, int mr, float *o, int64_t ldo, int nv) { \
    IMPL##_rows(1, w, nsb, a, mr, o, ldo, nv);                                                   \
  }                                                                                              \
  ATTR static void IMPL##_q6k(const uint8_t *w, int64_t nsb, const nv_kact *a, int mr, float *o, int64_t ldo, int nv) { \
    IMPL##_rows(2, w, nsb, a, mr, o, ldo, nv);                                                   \
  }

static void kpk_generic_q4k(const uint8_t *w, int64_t nsb, const nv_kact *a, int mr, float *o, int64_t ldo, int nv) {
  kpk_generic(w, nsb, a, mr, 0, o, ldo, nv);
}
static void kpk_generic_q5k(const uint8_t *w, int64_t nsb, const nv_kact *a, int mr, float *o, int64_t ldo, int nv) {
  kpk_generic(w, nsb, a, mr, 1, o, ldo, nv);
}
static void kpk_generic_q6k(const uint8_t *w, int64_t nsb, const nv_kact *a, int mr, float *o, int64_t ldo, int nv) {
  kpk_generic(w, nsb, a, mr, 2, o, ldo, nv);
}

/* ---------------------------------------------------------------- aarch64 dotprod */
#if defined(__aarch64__)
#define DP __attribute__((target("arch=armv8.2-a+dotprod")))

/* bit (level) of chunk q's code moved to bit 4 + level of each byte */
ALWAYS_INLINE uint8x16_t plane_bits(uint8x16_t p, int q, int level) {
  return vandq_u8(vshlq_u8(p, vdupq_n_s8((int8_t)(4 + level - q))), vdupq_n_u8((uint8_t)(0x10 << level)));
}

/* rows 4v..4v+3 of the group: one int32x4 per sum */
DP ALWAYS_INLINE void kpk_dp(const uint8_t *w, int64_t nsb, const nv_kact *a, const int mr, const int kind, float *out,
                             int64_t ldo, int nvalid) {
  const kfmt f = kq_fmt(kind);
  const int64_t gsb = kq_gsb(f);
  float32x4_t acc[4][4];
  for (int m = 0; m < mr; m++)
    for (int v = 0; v < 4; v++) acc[m][v] = vdupq_n_f32(0);
  const uint8_t *wb = w;
  for (int64_t b = 0; b < nsb; b++, wb += gsb) {
    const int8_t *aq[4];
    const int16_t *bs[4];
    for (int m = 0; m < mr; m++) {
      aq[m] = a[m].q + b * 256;
      bs[m] = a[m].bs + b * NV_KBS;
    }
    for (int v = 0; v < 4; v++) {
      int32x4_t tot[4];
      for (int m = 0; m < mr; m++) tot[m] = vdupq_n_s32(0);
      for (int c = 0; c < 4; c++) {
        const uint8_t *sg = wb + ko_seg(f) + c * ko_segb(f);
        int32x4_t il[4][2], ih[4][2];
        int8x16_t al[4][2], ah[4][2];
        for (int m = 0; m < mr; m++)
          for (int h = 0; h < 2; h++) {
            il[m][h] = vdupq_n_s32(-f.off * bs[m][4 * c + h]);
            ih[m][h] = vdupq_n_s32(-f.off * bs[m][4 * c + 2 + h]);
            al[m][h] = vld1q_s8(aq[m] + 64 * c + 16 * h);
            ah[m][h] = vld1q_s8(aq[m] + 64 * c + 32 + 16 * h);
          }
        uint8x16_t pl[2][2];
        for (int L = 0; L < f.nhb; L++) {
          pl[L][0] = vld1q_u8(sg + 512 + 128 * L + 16 * v);
          pl[L][1] = vld1q_u8(sg + 512 + 128 * L + 64 + 16 * v);
        }
#define KDP_CHUNK(q)                                                                             \
  do {                                                                                           \
    uint8x16_t x = vld1q_u8(sg + 64 * (q) + 16 * v);                                             \
    uint8x16_t lo = vandq_u8(x, vdupq_n_u8(0x0F)), hi = vshrq_n_u8(x, 4);                        \
    for (int L = 0; L < f.nhb; L++) {                                                            \
      lo = vorrq_u8(lo, plane_bits(pl[L][0], (q), L));                                           \
      hi = vorrq_u8(hi, plane_bits(pl[L][1], (q), L));                                           \
    }                                                                                            \
    for (int m = 0; m < mr; m++) {                                                               \
      il[m][(q) / 4] = vdotq_laneq_s32(il[m][(q) / 4], vreinterpretq_s8_u8(lo), al[m][(q) / 4], (q) % 4); \
      ih[m][(q) / 4] = vdotq_laneq_s32(ih[m][(q) / 4], vreinterpretq_s8_u8(hi), ah[m][(q) / 4], (q) % 4); \
    }                                                                                            \
  } while (0)
        KDP_CHUNK(0);
        KDP_CHUNK(1);
        KDP_CHUNK(2);
        KDP_CHUNK(3);
        KDP_CHUNK(4);
        KDP_CHUNK(5);
        KDP_CHUNK(6);
        KDP_CHUNK(7);
#undef KDP_CHUNK
        const int8_t *sc = (const int8_t *)(wb + ko_sc(f)) + 4 * v;
#define SC4(t) vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u32(vld1_dup_u32((const uint32_t *)(const void *)(sc + 16 * (t)))))))
        if (f.ns == 16) {
          int32x4_t s0 = SC4(4 * c), s1 = SC4(4 * c + 1), s2 = SC4(4 * c + 2), s3 = SC4(4 * c + 3);
          for (int m = 0; m < mr; m++) {
            tot[m] = vmlaq_s32(tot[m], il[m][0], s0);
            tot[m] = vmlaq_s32(tot[m], il[m][1], s1);
            tot[m] = vmlaq_s32(tot[m], ih[m][0], s2);
            tot[m] = vmlaq_s32(tot[m], ih[m][1], s3);
          }
        } else {
          int32x4_t s0 = SC4(2 * c), s1 = SC4(2 * c + 1);
          for (int m = 0; m < mr; m++) {
            tot[m] = vmlaq_s32(tot[m], vaddq_s32(il[m][0], il[m][1]), s0);
            tot[m] = vmlaq_s32(tot[m], vaddq_s32(ih[m][0], ih[m][1]), s1);
          }
        }
#undef SC4
      }
      float32x4_t dv = v_ld_f16((const uint16_t *)(const void *)(wb + KO_D) + 4 * v);
      for (int m = 0; m < mr; m++) acc[m][v] = vfmaq_f32(acc[m][v], dv, vmulq_n_f32(vcvtq_f32_s32(tot[m]), a[m].d[b]));
      if (f.mins) {
        float32x4_t dm = v_ld_f16((const uint16_t *)(const void *)(wb + KO_DMIN) + 4 * v);
        for (int m = 0; m < mr; m++) {
          int32x4_t mt = vdupq_n_s32(0);
          for (int p = 0; p < 4; p++) {
            /* rows 4v..4v+3, (min 2p, min 2p+1) each, against (sum 2p, sum 2p+1) */
            int16x8_t mv = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(wb + ko_mn(f) + 32 * p + 8 * v)));
            int16x4_t s2 = vreinterpret_s16_s32(vdup_n_s32(ld32((const int8_t *)(bs[m] + 16 + 2 * p))));
            int32x4_t lo = vmull_s16(vget_low_s16(mv), s2), hi = vmull_s16(vget_high_s16(mv), s2);
            mt = vaddq_s32(mt, vpaddq_s32(lo, hi));
          }
          acc[m][v] = v_fms(acc[m][v], dm, vmulq_n_f32(vcvtq_f32_s32(mt), a[m].d[b]));
        }
      }
    }
  }
  for (int m = 0; m < mr; m++) {
    float t[NV_PG];
    for (int v = 0; v < 4; v++) vst1q_f32(t + 4 * v, acc[m][v]);
    memcpy(out + m * ldo, t, (size_t)nvalid * 4);
  }
}
KPK_VARIANTS(kpk_dp, DP)
#endif

/* ---------------------------------------------------------------- x86-64 */
#if defined(__x86_64__) && defined(__AVX2__)

/* bit (level) of chunk q's code moved to bit 4 + level of each byte: 16-bit shifts, whose
 * spill between the two bytes of a lane never reaches the bit kept (shifts are at most 5) */
#define PLANE_SHIFT(P, SLLI, SRLI, q, level)                                                     \
  ((4 + (level) - (q)) >= 0 ? SLLI((P), (4 + (level) - (q))) : SRLI((P), ((q) - 4 - (level))))

/* 256-bit: rows 0-7 then rows 8-15 (two passes over a group super-block that L1 holds).
 * DOT4 is vpdpbusd (AVX512-VNNI on 256-bit vectors) or maddubs + madd (AVX2; u <= 63 and
 * |a| <= 127 keep maddubs' int16 pairs from saturating). */
#define KPK256_BODY(DOT4)                                                                        \
  const kfmt f = kq_fmt(kind);                                                                   \
  const int64_t gsb = kq_gsb(f);                                                                 \
  const __m256i m4 = _mm256_set1_epi8(0x0F);                                                     \
  for (int h2 = 0; h2 < 2; h2++) {                                                               \
    __m256 acc[4];                                                                               \
    for (int m = 0; m < mr; m++) acc[m] = _mm256_setzero_ps();                                   \
    const uint8_t *wb = w;                                                                       \
    for (int64_t b = 0; b < nsb; b++, wb += gsb) {                                               \
      const int8_t *aq[4];                                                                       \
      const int16_t *bs[4];                                                                      \
      __m256i tot[4];                                                                            \
      for (int m = 0; m < mr; m++) {                                                             \
        aq[m] = a[m].q + b * 256;                                                                \
        bs[m] = a[m].bs + b * NV_KBS;                                                            \
        tot[m] = _mm256_setzero_si256();                                                         \
      }                                                                                          \
      for (int c = 0; c < 4; c++) {                                                              \
        const uint8_t *sg = wb + ko_seg(f) + c * ko_segb(f) + 32 * h2;                           \
        __m256i il[4][2], ih[4][2], pl[2][2];                                                    \
        for (int m = 0; m < mr; m++)                                                             \
          for (int h = 0; h < 2; h++) {                                                          \
            il[m][h] = _mm256_set1_epi32(-f.off * bs[m][4 * c + h]);                             \
            ih[m][h] = _mm256_set1_epi32(-f.off * bs[m][4 * c + 2 + h]);                         \
          }                                                                                      \
        for (int L = 0; L < f.nhb; L++) {                                                        \
          pl[L][0] = _mm256_loadu_si256((const __m256i *)(sg + 512 + 128 * L));                  \
          pl[L][1] = _mm256_loadu_si256((const __m256i *)(sg + 512 + 128 * L + 64));             \
        }                                                                                        \
        _Pragma("GCC unroll 8") for (int q = 0; q < 8; q++) {                                    \
          __m256i x = _mm256_loadu_si256((const __m256i *)(sg + 64 * q));                        \
          __m256i lo = _mm256_and_si256(x, m4), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4); \
          for (int L = 0; L < f.nhb; L++) {                                                      \
            __m256i bit = _mm256_set1_epi8((char)(0x10 << L));                                   \
            lo = _mm256_or_si256(lo, _mm256_and_si256(PLANE_SHIFT(pl[L][0], _mm256_slli_epi16, _mm256_srli_epi16, q, L), bit)); \
            hi = _mm256_or_si256(hi, _mm256_and_si256(PLANE_SHIFT(pl[L][1], _mm256_slli_epi16, _mm256_srli_epi16, q, L), bit)); \
          }                                                                                      \
          for (int m = 0; m < mr; m++) {                                                         \
            il[m][q / 4] = DOT4(il[m][q / 4], lo, _mm256_set1_epi32(ld32(aq[m] + 64 * c + 4 * q))); \
            ih[m][q / 4] = DOT4(ih[m][q / 4], hi, _mm256_set1_epi32(ld32(aq[m] + 64 * c + 32 + 4 * q))); \
          }                                                                                      \
        }                                                                                        \
        const int8_t *sc = (const int8_t *)(wb + ko_sc(f)) + 8 * h2;                             \
        if (f.ns == 16) {                                                                        \
          for (int h = 0; h < 2; h++) {                                                          \
            __m256i sl = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16 * (4 * c + h)))); \
            __m256i sh = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16 * (4 * c + 2 + h)))); \
            for (int m = 0; m < mr; m++)                                                         \
              tot[m] = _mm256_add_epi32(tot[m], _mm256_add_epi32(_mm256_mullo_epi32(il[m][h], sl), \
                                                                 _mm256_mullo_epi32(ih[m][h], sh))); \
          }                                                                                      \
        } else {                                                                                 \
          __m256i sl = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16 * (2 * c)))); \
          __m256i sh = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16 * (2 * c + 1)))); \
          for (int m = 0; m < mr; m++)                                                           \
            tot[m] = _mm256_add_epi32(tot[m], _mm256_add_epi32(                                  \
                _mm256_mullo_epi32(_mm256_add_epi32(il[m][0], il[m][1]), sl),                    \
                _mm256_mullo_epi32(_mm256_add_epi32(ih[m][0], ih[m][1]), sh)));                  \
        }                                                                                        \
      }                                                                                          \
      __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wb + KO_D + 16 * h2)));      \
      for (int m = 0; m < mr; m++)                                                               \
        acc[m] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(tot[m]), _mm256_set1_ps(a[m].d[b])), dv, acc[m]); \
      if (f.mins) {                                                                              \
        __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wb + KO_DMIN + 16 * h2))); \
        __m256i mv[4];                                                                           \
        for (int p = 0; p < 4; p++)                                                              \
          mv[p] = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(wb + ko_mn(f) + 32 * p + 16 * h2))); \
        for (int m = 0; m < mr; m++) {                                                           \
          __m256i mt = _mm256_setzero_si256();                                                   \
          for (int p = 0; p < 4; p++)                                                            \
            mt = _mm256_add_epi32(mt, _mm256_madd_epi16(mv[p], _mm256_set1_epi32(ld32((const int8_t *)(bs[m] + 16 + 2 * p))))); \
          acc[m] = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(mt), _mm256_set1_ps(a[m].d[b])), dm, acc[m]); \
        }                                                                                        \
      }                                                                                          \
    }                                                                                            \
    for (int m = 0; m < mr; m++) {                                                               \
      float t[8];                                                                                \
      _mm256_storeu_ps(t, acc[m]);                                                               \
      int nv = nvalid - 8 * h2;                                                                  \
      if (nv > 0) memcpy(out + m * ldo + 8 * h2, t, (size_t)(nv < 8 ? nv : 8) * 4);              \
    }                                                                                            \
  }

#define KDOT4_AVX2(acc, w, a) _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((w), (a)), _mm256_set1_epi16(1)))
ALWAYS_INLINE void kpk_avx2(const uint8_t *w, int64_t nsb, const nv_kact *a, const int mr, const int kind, float *out,
                            int64_t ldo, int nvalid) {
  KPK256_BODY(KDOT4_AVX2)
}
KPK_VARIANTS(kpk_avx2, )

#if !defined(__AVX512F__)
#define KVNNI256 __attribute__((target("avx512vnni,avx512vl,avx2,fma,f16c")))
#define KDOT4_VNNI(acc, w, a) _mm256_dpbusd_epi32((acc), (w), (a))
KVNNI256 ALWAYS_INLINE void kpk_vnni256(const uint8_t *w, int64_t nsb, const nv_kact *a, const int mr, const int kind,
                                        float *out, int64_t ldo, int nvalid) {
  KPK256_BODY(KDOT4_VNNI)
}
KPK_VARIANTS(kpk_vnni256, KVNNI256)
#endif

static int cpu_has_vnni(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
}

#if defined(__AVX512F__)
static int cpu_has_gfni(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("gfni");
}

/* 512-bit: one vector is the whole group of 16 rows */
#ifndef NV_KPK_PREFETCH
#define NV_KPK_PREFETCH 2
#endif
#define KVNNI512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
/* GF2P8AFFINEQB matrices (the qword's byte 7 - i selects the input bits whose parity is output
 * bit i): KGF_M1(q) moves bit q to bit 4; KGF_M2(j) moves bit j to bit 4 and bit 4 + j to bit 5;
 * KGF_SHR4 moves bits 4-7 to bits 0-3 */
#define KGF_M1(q) ((long long)(1ull << (q)) << 24)
#define KGF_SHR4 0x1020408000000000ll
#define KGF_M2(j) ((long long)(((1ull << (j)) << 24) | ((1ull << (4 + (j))) << 16)))
/* without GFNI the affine branch is dead code; KGF_NONE keeps its intrinsic out of a function
 * whose target lacks it */
#define KGF_NONE(x, m, b) ((void)(m), (x))
#define KPK512_BODY(GF, AFF)                                                                                                         \
  const kfmt f = kq_fmt(kind);                                                                                                       \
  const int64_t gsb = kq_gsb(f);                                                                                                     \
  const __m512i m4 = _mm512_set1_epi8(0x0F);                                                                                         \
  __m512 acc[4];                                                                                                                     \
  for (int m = 0; m < mr; m++) acc[m] = _mm512_setzero_ps();                                                                         \
  const uint8_t *wb = w;                                                                                                             \
  for (int64_t b = 0; b < nsb; b++, wb += gsb) {                                                                                     \
    const int8_t *aq[4];                                                                                                             \
    const int16_t *bs[4];                                                                                                            \
    __m512i tot[4];                                                                                                                  \
    for (int m = 0; m < mr; m++) {                                                                                                   \
      aq[m] = a[m].q + b * 256;                                                                                                      \
      bs[m] = a[m].bs + b * NV_KBS;                                                                                                  \
      tot[m] = _mm512_setzero_si512();                                                                                               \
    }                                                                                                                                \
    for (int c = 0; c < 4; c++) {                                                                                                    \
      const uint8_t *sg = wb + ko_seg(f) + c * ko_segb(f);                                                                           \
      /* decode streams the weights once: fetch ahead across the 4 KB pages where the hardware                                       \
       * prefetchers stop, as the Q4_0 kernel does (a group super-block is 2.3-3.4 KB). A quarter                                    \
       * of the lines per segment, unrolled: one loop over all of them before the super-block                                        \
       * cost more in its own adds and branches than the fetches, and all of them unrolled in                                        \
       * one burst stalled the demand loads of a decode that streams from memory */                                                  \
      if (mr == 1) {                                                                                                                 \
        _Pragma("GCC unroll 16")                                                                                                     \
        for (int64_t l = (c * gsb / 4) & ~63; l < (c + 1) * gsb / 4; l += 64)                                                        \
          _mm_prefetch((const char *)(wb + NV_KPK_PREFETCH * gsb + l), _MM_HINT_T0);                                                 \
      }                                                                                                                              \
      __m512i il[4][2], ih[4][2], pl[2][2];                                                                                          \
      for (int m = 0; m < mr; m++)                                                                                                   \
        for (int h = 0; h < 2; h++) {                                                                                                \
          il[m][h] = _mm512_set1_epi32(-f.off * bs[m][4 * c + h]);                                                                   \
          ih[m][h] = _mm512_set1_epi32(-f.off * bs[m][4 * c + 2 + h]);                                                               \
        }                                                                                                                            \
      for (int L = 0; L < f.nhb; L++) {                                                                                              \
        pl[L][0] = _mm512_loadu_si512(sg + 512 + 128 * L);                                                                           \
        pl[L][1] = _mm512_loadu_si512(sg + 512 + 128 * L + 64);                                                                      \
      }                                                                                                                              \
      /* two planes (Q6_K): per half, pa holds bit q of plane 0 in bit q and of plane 1 in bit                                       \
       * 4 + q for chunks 0-3, pb the same for chunks 4-7, so that one affine serves both */                                         \
      __m512i pa[2] = {m4, m4}, pb[2] = {m4, m4};                                                                                    \
      if (GF && f.nhb == 2)                                                                                                          \
        for (int h = 0; h < 2; h++) {                                                                                                \
          pa[h] = _mm512_ternarylogic_epi32(pl[0][h], _mm512_slli_epi16(pl[1][h], 4), m4, 0xE4);                                     \
          pb[h] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(pl[0][h], 4), pl[1][h], m4, 0xE4);                                     \
        }                                                                                                                            \
      _Pragma("GCC unroll 8")                                                                                                        \
      for (int q = 0; q < 8; q++) {                                                                                                  \
        __m512i x = _mm512_loadu_si512(sg + 64 * q), lo, hi;                                                                         \
        if (GF && f.nhb) {                                                                                                           \
          /* one affine picks the plane bits of chunk q into bits 4 (and 5), zero elsewhere,                                         \
           * and a bit-select puts them above the nibble: 2 instructions for the low half and 3 for                                  \
           * the high, where the shifts and masks take 5 and 6 (Q6_K) */                                                             \
          const __m512i mq = _mm512_set1_epi64(f.nhb == 1 ? KGF_M1(q) : KGF_M2(q % 4));                                              \
          __m512i tl = f.nhb == 1 ? pl[0][0] : q < 4 ? pa[0] : pb[0], th = f.nhb == 1 ? pl[0][1] : q < 4 ? pa[1] : pb[1];            \
          lo = _mm512_ternarylogic_epi32(x, AFF(tl, mq, 0), m4, 0xE4);                                                               \
          hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(x, 4), AFF(th, mq, 0), m4, 0xE4);                                         \
        } else if (GF) {                                                                                                             \
          /* Q4_K: the high nibbles in one affine (a shift and a mask without it) */                                                 \
          lo = _mm512_and_si512(x, m4);                                                                                              \
          hi = AFF(x, _mm512_set1_epi64(KGF_SHR4), 0);                                                                               \
        } else {                                                                                                                     \
          lo = _mm512_and_si512(x, m4);                                                                                              \
          hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);                                                                        \
          for (int L = 0; L < f.nhb; L++) {                                                                                          \
            __m512i bit = _mm512_set1_epi8((char)(0x10 << L));                                                                       \
            /* lo |= shifted & bit, in one ternary-logic instruction */                                                              \
            lo = _mm512_ternarylogic_epi32(lo, PLANE_SHIFT(pl[L][0], _mm512_slli_epi16, _mm512_srli_epi16, q, L), bit, 0xF8);        \
            hi = _mm512_ternarylogic_epi32(hi, PLANE_SHIFT(pl[L][1], _mm512_slli_epi16, _mm512_srli_epi16, q, L), bit, 0xF8);        \
          }                                                                                                                          \
        }                                                                                                                            \
        for (int m = 0; m < mr; m++) {                                                                                               \
          il[m][q / 4] = _mm512_dpbusd_epi32(il[m][q / 4], lo, _mm512_set1_epi32(ld32(aq[m] + 64 * c + 4 * q)));                     \
          ih[m][q / 4] = _mm512_dpbusd_epi32(ih[m][q / 4], hi, _mm512_set1_epi32(ld32(aq[m] + 64 * c + 32 + 4 * q)));                \
        }                                                                                                                            \
      }                                                                                                                              \
      const int8_t *sc = (const int8_t *)(wb + ko_sc(f));                                                                            \
      if (f.ns == 16) {                                                                                                              \
        for (int h = 0; h < 2; h++) {                                                                                                \
          __m512i sl = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sc + 16 * (4 * c + h))));                              \
          __m512i sh = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sc + 16 * (4 * c + 2 + h))));                          \
          for (int m = 0; m < mr; m++)                                                                                               \
            tot[m] = _mm512_add_epi32(tot[m], _mm512_add_epi32(_mm512_mullo_epi32(il[m][h], sl), _mm512_mullo_epi32(ih[m][h], sh))); \
        }                                                                                                                            \
      } else {                                                                                                                       \
        __m512i sl = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sc + 16 * (2 * c))));                                    \
        __m512i sh = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sc + 16 * (2 * c + 1))));                                \
        for (int m = 0; m < mr; m++)                                                                                                 \
          tot[m] = _mm512_add_epi32(tot[m], _mm512_add_epi32(_mm512_mullo_epi32(_mm512_add_epi32(il[m][0], il[m][1]), sl),           \
                                                             _mm512_mullo_epi32(_mm512_add_epi32(ih[m][0], ih[m][1]), sh)));         \
      }                                                                                                                              \
    }                                                                                                                                \
    __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wb + KO_D)));                                                   \
    for (int m = 0; m < mr; m++)                                                                                                     \
      acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(tot[m]), _mm512_set1_ps(a[m].d[b])), dv, acc[m]);                    \
    if (f.mins) {                                                                                                                    \
      __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wb + KO_DMIN)));                                              \
      __m512i mv[4];                                                                                                                 \
      for (int p = 0; p < 4; p++) mv[p] = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(wb + ko_mn(f) + 32 * p)));       \
      for (int m = 0; m < mr; m++) {                                                                                                 \
        __m512i mt = _mm512_setzero_si512();                                                                                         \
        for (int p = 0; p < 4; p++)                                                                                                  \
          mt = _mm512_dpwssd_epi32(mt, mv[p], _mm512_set1_epi32(ld32((const int8_t *)(bs[m] + 16 + 2 * p))));                        \
        acc[m] = _mm512_fnmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(mt), _mm512_set1_ps(a[m].d[b])), dm, acc[m]);                     \
      }                                                                                                                              \
    }                                                                                                                                \
  }                                                                                                                                  \
  __mmask16 k = (__mmask16)((1u << nvalid) - 1);                                                                                     \
  for (int m = 0; m < mr; m++) _mm512_mask_storeu_ps(out + m * ldo, k, acc[m]);                                                      \
  (void)0
KVNNI512 ALWAYS_INLINE void kpk_vnni512(const uint8_t *w, int64_t nsb, const nv_kact *a, const int mr, const int kind,
                                        float *out, int64_t ldo, int nvalid) {
  KPK512_BODY(0, KGF_NONE);
}
KPK_VARIANTS(kpk_vnni512, KVNNI512)

/* with GFNI (Zen 4, Ice Lake and later): the Q5_K/Q6_K bit planes and the Q4_K high nibbles by
 * affine byte transforms */
#define KGFNI512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,gfni,avx2,fma,f16c")))
KGFNI512 ALWAYS_INLINE void kpk_gfni512(const uint8_t *w, int64_t nsb, const nv_kact *a, const int mr, const int kind,
                                        float *out, int64_t ldo, int nvalid) {
  KPK512_BODY(1, _mm512_gf2p8affine_epi64_epi8);
}
KPK_VARIANTS(kpk_gfni512, KGFNI512)
#endif
#endif

nv_kpk_fn nv_kpk_select(uint32_t dt, int int8dot) {
  const int kind = kq_kind(dt);
  (void)int8dot;
#define KPICK(IMPL) return kind == 0 ? IMPL##_q4k : kind == 1 ? IMPL##_q5k : IMPL##_q6k
#if defined(__aarch64__)
  if (int8dot && nv_have_dotprod()) KPICK(kpk_dp);
#elif defined(__x86_64__) && defined(__AVX2__)
  if (int8dot && cpu_has_vnni()) {
#if defined(__AVX512F__)
    if (cpu_has_gfni()) KPICK(kpk_gfni512);
    KPICK(kpk_vnni512);
#else
    KPICK(kpk_vnni256);
#endif
  }
  KPICK(kpk_avx2);
#endif
  KPICK(kpk_generic);
#undef KPICK
}
