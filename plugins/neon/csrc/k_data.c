/* k_data.c: GET_ROWS, CAST, QUANTIZE, DEQUANTIZE and the bit-exact data-movement ops. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "neon.h"
#include "neon_simd.h"

/* ---------------------------------------------------------------- dequantization rows */

/* 16 int8 values times d into dst */
static inline void deq16(int8x16_t q, float d, float *dst) {
  int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_s8(vget_high_s8(q));
  vst1q_f32(dst, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d));
  vst1q_f32(dst + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))), d));
  vst1q_f32(dst + 8, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d));
  vst1q_f32(dst + 12, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi))), d));
}

/* k values of one row of a table or quantized tensor as f32. d * q is exact in f32 (an f16
 * scale times an integer of at most 8 bits), so the vector path equals the scalar one. */
static void deq_row(uint32_t dt, const uint8_t *src, float *dst, int64_t k, float scale) {
  switch (dt) {
  case XPU_DT_F32: memcpy(dst, src, (size_t)k * 4); break;
  case XPU_DT_F16: nv_f16_row_to_f32((const uint16_t *)src, dst, k); break;
  case XPU_DT_BF16: {
    int64_t i = 0;
    for (; i + 4 <= k; i += 4)
      vst1q_f32(dst + i, vreinterpretq_f32_u32(vshlq_n_u32(vmovl_u16(vld1_u16((const uint16_t *)src + i)), 16)));
    for (; i < k; i++) dst[i] = nv_bf16_to_f32(((const uint16_t *)src)[i]);
    break;
  }
  case XPU_DT_I8: {
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) deq16(vld1q_s8((const int8_t *)src + i), scale, dst + i);
    for (; i < k; i++) dst[i] = scale * (float)((const int8_t *)src)[i];
    break;
  }
  case XPU_DT_Q8_0:
    for (int64_t b = 0; b < k / 32; b++, src += 34) {
      uint16_t h;
      memcpy(&h, src, 2);
      float d = nv_f16_to_f32(h);
      deq16(vld1q_s8((const int8_t *)src + 2), d, dst + b * 32);
      deq16(vld1q_s8((const int8_t *)src + 18), d, dst + b * 32 + 16);
    }
    break;
  case XPU_DT_Q4_0:
    for (int64_t b = 0; b < k / 32; b++, src += 18) {
      uint16_t h;
      memcpy(&h, src, 2);
      float d = nv_f16_to_f32(h);
      uint8x16_t v = vld1q_u8(src + 2);
      deq16(vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F))), vdupq_n_s8(8)), d, dst + b * 32);
      deq16(vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8)), d, dst + b * 32 + 16);
    }
    break;
  default: /* the K-quants: k is a multiple of 256 */
    nv_kq_deq_row(dt, src, dst, k);
    break;
  }
}


/* ---------------------------------------------------------------- get_rows */

typedef struct {
  const uint8_t *t;
  const int32_t *ids;
  float *o;
  uint32_t dt;
  int64_t n, k, rows;
  float scale;
} gr_args;

static void gr_task(void *p, int tid, int nth) {
  gr_args *A = (gr_args *)p;
  int64_t b, e;
  nv_range(A->n, tid, nth, 1, &b, &e);
  uint64_t rb = nv_row_bytes(A->dt, A->k);
  for (int64_t i = b; i < e; i++) {
    /* read once and check again: an output bound over the ids may have changed them since the
     * up-front check, and a stale id must never become an out-of-bounds read */
    int32_t id = A->ids[i];
    if (id < 0 || id >= A->rows) {
      memset(A->o + i * A->k, 0, (size_t)A->k * 4);
      continue;
    }
    deq_row(A->dt, A->t + (uint64_t)id * rb, A->o + i * A->k, A->k, A->scale);
  }
}

xpu_status nv_k_get_rows(nv_run *r, const xpu_ir_node *n) {
  const xpu_ir_tensor *t = &r->g->tensors[n->inputs[0]], *ids = &r->g->tensors[n->inputs[1]];
  gr_args A = {r->ptr[n->inputs[0]], (const int32_t *)r->ptr[n->inputs[1]], (float *)r->ptr[n->output], t->dtype,
               xpu_ir_numel(ids), t->shape[1], t->shape[0], n->fattr[0]};
  for (int64_t i = 0; i < A.n; i++)
    if (A.ids[i] < 0 || A.ids[i] >= t->shape[0]) {
      snprintf(r->err, sizeof r->err, "id %d at position %lld is outside the table's %lld rows", A.ids[i],
               (long long)i, (long long)t->shape[0]);
      return XPU_E_INVALID_ARG;
    }
  if (A.n == 0 || A.k == 0) return XPU_OK;
  nv_parallel(r, A.n * A.k, gr_task, &A);
  return XPU_OK;
}

/* ---------------------------------------------------------------- cast */

typedef struct {
  const uint8_t *x;
  uint8_t *o;
  uint32_t from, to;
  int64_t n;
} cast_args;

static void cast_task(void *p, int tid, int nth) {
  cast_args *A = (cast_args *)p;
  int64_t b, e;
  nv_range(A->n, tid, nth, 256, &b, &e);
  float buf[256];
  for (int64_t i = b; i < e; i += 256) {
    int64_t m = e - i < 256 ? e - i : 256;
    const float *src = buf;
    switch (A->from) {
    case XPU_DT_F32: src = (const float *)A->x + i; break;
    case XPU_DT_F16: nv_f16_row_to_f32((const uint16_t *)A->x + i, buf, m); break;
    case XPU_DT_BF16:
      for (int64_t j = 0; j < m; j++) buf[j] = nv_bf16_to_f32(((const uint16_t *)A->x)[i + j]);
      break;
    default:
      for (int64_t j = 0; j < m; j++) buf[j] = (float)((const int32_t *)A->x)[i + j];
      break;
    }
    switch (A->to) {
    case XPU_DT_F32: memcpy((float *)A->o + i, src, (size_t)m * 4); break;
    case XPU_DT_F16:
      if (A->from == XPU_DT_I32) {
        /* int -> half in one rounding: through double, exact for every int32 */
        for (int64_t j = 0; j < m; j++) {
          double dv = (double)((const int32_t *)A->x)[i + j];
          float f = (float)dv;
          /* a float rounding that lands on a half-way f16 point would round twice */
          if ((double)f != dv && fabs(dv) < 65520.0) f = (float)dv;
          ((uint16_t *)A->o)[i + j] = nv_f32_to_f16(f);
        }
      } else {
        nv_f32_row_to_f16(src, (uint16_t *)A->o + i, m);
      }
      break;
    default:
      for (int64_t j = 0; j < m; j++) ((uint16_t *)A->o)[i + j] = nv_f32_to_bf16(src[j]);
      break;
    }
  }
}

xpu_status nv_k_cast(nv_run *r, const xpu_ir_node *n) {
  const xpu_ir_tensor *x = &r->g->tensors[n->inputs[0]], *o = &r->g->tensors[n->output];
  cast_args A = {r->ptr[n->inputs[0]], r->ptr[n->output], x->dtype, o->dtype, xpu_ir_numel(x)};
  if (A.n == 0) return XPU_OK;
  nv_parallel(r, A.n * 4, cast_task, &A);
  return XPU_OK;
}

/* ---------------------------------------------------------------- quantize / dequantize */

static void quant_q8_block(const float *x, uint8_t *out) {
  float amax = 0.0f;
  for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
  float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  uint16_t h = nv_f32_to_f16(d);
  memcpy(out, &h, 2);
  for (int i = 0; i < 32; i++) ((int8_t *)out)[2 + i] = nv_i8_code(roundf(x[i] * id));
}

static void quant_q4_block(const float *x, uint8_t *out) {
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < 32; i++)
    if (amax < fabsf(x[i])) {
      amax = fabsf(x[i]);
      max = x[i];
    }
  float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  uint16_t h = nv_f32_to_f16(d);
  memcpy(out, &h, 2);
  for (int j = 0; j < 16; j++) {
    int q0 = nv_i8_code(x[j] * id + 8.5f), q1 = nv_i8_code(x[j + 16] * id + 8.5f);
    if (q0 > 15) q0 = 15;
    if (q1 > 15) q1 = 15;
    out[2 + j] = (uint8_t)(q0 | (q1 << 4));
  }
}

typedef struct {
  const uint8_t *x;
  uint8_t *o;
  uint32_t dt;
  int64_t n; /* blocks (Q8_0/Q4_0) or elements (I8) */
  float scale;
} q_args;

static void quant_task(void *p, int tid, int nth) {
  q_args *A = (q_args *)p;
  int64_t b, e;
  nv_range(A->n, tid, nth, 32, &b, &e);
  const float *x = (const float *)A->x;
  for (int64_t i = b; i < e; i++) {
    if (A->dt == XPU_DT_Q8_0) {
      quant_q8_block(x + i * 32, A->o + i * 34);
    } else if (A->dt == XPU_DT_Q4_0) {
      quant_q4_block(x + i * 32, A->o + i * 18);
    } else {
      float v = roundf(x[i] / A->scale);
      if (v != v) v = 0.0f;
      v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
      ((int8_t *)A->o)[i] = (int8_t)v;
    }
  }
}

xpu_status nv_k_quantize(nv_run *r, const xpu_ir_node *n) {
  const xpu_ir_tensor *o = &r->g->tensors[n->output];
  int64_t numel = xpu_ir_numel(o);
  q_args A = {r->ptr[n->inputs[0]], r->ptr[n->output], o->dtype, o->dtype == XPU_DT_I8 ? numel : numel / 32,
              n->fattr[0]};
  if (A.n == 0) return XPU_OK;
  nv_parallel(r, numel * 4, quant_task, &A);
  return XPU_OK;
}

static void deq_task(void *p, int tid, int nth) {
  q_args *A = (q_args *)p;
  int64_t b, e;
  /* rows of 32 values (whole blocks for Q8_0/Q4_0), of 256 for the K-quants' super-blocks */
  const int64_t len = nv_is_kquant(A->dt) ? 256 : 32;
  nv_range(A->n, tid, nth, 1, &b, &e);
  uint64_t rb = nv_row_bytes(A->dt, len);
  for (int64_t i = b; i < e; i++) deq_row(A->dt, A->x + i * rb, (float *)A->o + i * len, len, A->scale);
}

xpu_status nv_k_dequantize(nv_run *r, const xpu_ir_node *n) {
  const xpu_ir_tensor *x = &r->g->tensors[n->inputs[0]];
  int64_t numel = xpu_ir_numel(x);
  if (numel == 0) return XPU_OK;
  if (x->dtype == XPU_DT_I8 && numel % 32) {
    deq_row(XPU_DT_I8, r->ptr[n->inputs[0]], (float *)r->ptr[n->output], numel, n->fattr[0]);
    return XPU_OK;
  }
  q_args A = {r->ptr[n->inputs[0]], r->ptr[n->output], x->dtype, numel / (nv_is_kquant(x->dtype) ? 256 : 32),
              n->fattr[0]};
  nv_parallel(r, numel * 4, deq_task, &A);
  return XPU_OK;
}

/* ---------------------------------------------------------------- data movement */

xpu_status nv_k_reshape(nv_run *r, const xpu_ir_node *n) {
  const xpu_ir_tensor *x = &r->g->tensors[n->inputs[0]];
  if (xpu_ir_nbytes(x) && r->ptr[n->output] != r->ptr[n->inputs[0]]) memmove(r->ptr[n->output], r->ptr[n->inputs[0]], xpu_ir_nbytes(x));
  return XPU_OK;
}

xpu_status nv_k_permute(nv_run *r, const xpu_ir_node *n) {
  const xpu_ir_tensor *x = &r->g->tensors[n->inputs[0]], *o = &r->g->tensors[n->output];
  uint32_t es = nv_elem_size(x->dtype), rank = x->rank;
  if (xpu_ir_numel(o) == 0) return XPU_OK;
  /* input strides (elements), then the stride of each output axis in the input */
  int64_t xs[XPU_MAX_RANK], st = 1;
  for (int d = (int)rank - 1; d >= 0; d--) {
    xs[d] = st;
    st *= x->shape[d];
  }
  int64_t od[4] = {1, 1, 1, 1}, os[4] = {0, 0, 0, 0};
  for (uint32_t d = 0; d < rank; d++) {
    od[4 - rank + d] = o->shape[d];
    os[4 - rank + d] = xs[n->iattr[d]];
  }
  const uint8_t *src = r->ptr[n->inputs[0]];
  uint8_t *dst = r->ptr[n->output];
  int64_t idx = 0;
  for (int64_t a = 0; a < od[0]; a++)
    for (int64_t b = 0; b < od[1]; b++)
      for (int64_t c = 0; c < od[2]; c++) {
        const uint8_t *s = src + (a * os[0] + b * os[1] + c * os[2]) * es;
        if (os[3] == 1) {
          memcpy(dst + idx * es, s, (size_t)(od[3] * es));
          idx += od[3];
        } else {
          for (int64_t e = 0; e < od[3]; e++, idx++) memcpy(dst + idx * es, s + e * os[3] * es, es);
        }
      }
  return XPU_OK;
}

/* outer = product of dims before axis, inner = bytes of one step along axis */
static void split_axis(const xpu_ir_tensor *t, int64_t axis, int64_t *outer, int64_t *inner) {
  int64_t o = 1, in = nv_elem_size(t->dtype);
  for (int64_t d = 0; d < axis; d++) o *= t->shape[d];
  for (int64_t d = axis + 1; d < (int64_t)t->rank; d++) in *= t->shape[d];
  *outer = o;
  *inner = in;
}

xpu_status nv_k_slice(nv_run *r, const xpu_ir_node *n) {
  const xpu_ir_tensor *x = &r->g->tensors[n->inputs[0]], *o = &r->g->tensors[n->output];
  int64_t axis = n->iattr[0], start = n->iattr[1], outer, inner;
  split_axis(x, axis, &outer, &inner);
  int64_t xl = x->shape[axis], ol = o->shape[axis];
  if (ol * inner == 0) return XPU_OK;
  for (int64_t i = 0; i < outer; i++)
    memcpy(r->ptr[n->output] + i * ol * inner, r->ptr[n->inputs[0]] + (i * xl + start) * inner, (size_t)(ol * inner));
  return XPU_OK;
}

xpu_status nv_k_concat(nv_run *r, const xpu_ir_node *n) {
  const xpu_ir_tensor *o = &r->g->tensors[n->output];
  int64_t axis = n->iattr[0], outer, inner;
  split_axis(o, axis, &outer, &inner);
  int64_t ol = o->shape[axis], at = 0;
  for (uint32_t k = 0; k < n->n_inputs; k++) {
    const xpu_ir_tensor *x = &r->g->tensors[n->inputs[k]];
    int64_t xl = x->shape[axis];
    for (int64_t i = 0; i < outer && xl * inner > 0; i++)
      memcpy(r->ptr[n->output] + (i * ol + at) * inner, r->ptr[n->inputs[k]] + i * xl * inner, (size_t)(xl * inner));
    at += xl;
  }
  return XPU_OK;
}
