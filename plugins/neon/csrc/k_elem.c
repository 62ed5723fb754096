/* k_elem.c: elementwise ops with broadcasting, RMS/layer norm and softmax. */
#include <float.h>
#include <stdio.h>
#include <string.h>

#include "neon.h"
#include "neon_simd.h"

/* ---------------------------------------------------------------- binary */

typedef struct {
  const uint8_t *a, *b;
  uint8_t *o;
  uint32_t op, dt;
  int64_t od[4], sa[4], sb[4]; /* padded output dims, element strides (0 = broadcast) */
  int64_t rows;
  nv_run *r;
} bin_args;

static void pad4(const xpu_ir_tensor *t, int64_t d[4]) {
  for (int i = 0; i < 4; i++) d[i] = 1;
  for (uint32_t i = 0; i < t->rank; i++) d[4 - t->rank + i] = t->shape[i];
}

static void bcast_strides(const xpu_ir_tensor *t, int64_t s[4]) {
  int64_t d[4];
  pad4(t, d);
  int64_t st = 1;
  for (int i = 3; i >= 0; i--) {
    s[i] = d[i] == 1 ? 0 : st;
    st *= d[i];
  }
}

static void bin_row(uint32_t op, float *o, const float *a, int64_t sa, const float *b, int64_t sb, int64_t n) {
  int64_t i = 0;
  if (sa && sb) {
    for (; i + 4 <= n; i += 4) {
      float32x4_t x = vld1q_f32(a + i), y = vld1q_f32(b + i), z;
      switch (op) {
      case XPU_OP_ADD: z = vaddq_f32(x, y); break;
      case XPU_OP_SUB: z = vsubq_f32(x, y); break;
      case XPU_OP_MUL: z = vmulq_f32(x, y); break;
      default: z = v_div(x, y); break;
      }
      vst1q_f32(o + i, z);
    }
  } else if (sa) {
    float32x4_t y = vdupq_n_f32(b[0]);
    for (; i + 4 <= n; i += 4) {
      float32x4_t x = vld1q_f32(a + i), z;
      switch (op) {
      case XPU_OP_ADD: z = vaddq_f32(x, y); break;
      case XPU_OP_SUB: z = vsubq_f32(x, y); break;
      case XPU_OP_MUL: z = vmulq_f32(x, y); break;
      default: z = v_div(x, y); break;
      }
      vst1q_f32(o + i, z);
    }
  }
  for (; i < n; i++) {
    float x = a[i * sa], y = b[i * sb];
    switch (op) {
    case XPU_OP_ADD: o[i] = x + y; break;
    case XPU_OP_SUB: o[i] = x - y; break;
    case XPU_OP_MUL: o[i] = x * y; break;
    default: o[i] = x / y; break;
    }
  }
}

static void bin_task(void *p, int tid, int nth) {
  bin_args *A = (bin_args *)p;
  int64_t b0, e0;
  nv_range(A->rows, tid, nth, 1, &b0, &e0);
  int64_t n = A->od[3];
  float *s = (float *)nv_scratch(A->r, tid);
  for (int64_t row = b0; row < e0; row++) {
    int64_t i2 = row % A->od[2], i1 = (row / A->od[2]) % A->od[1], i0 = row / (A->od[2] * A->od[1]);
    int64_t oa = i0 * A->sa[0] + i1 * A->sa[1] + i2 * A->sa[2];
    int64_t ob = i0 * A->sb[0] + i1 * A->sb[1] + i2 * A->sb[2];
    if (A->dt == XPU_DT_F32) {
      bin_row(A->op, (float *)A->o + row * n, (const float *)A->a + oa, A->sa[3], (const float *)A->b + ob, A->sb[3], n);
    } else {
      float *fa = s, *fb = s + n, *fo = s + 2 * n;
      nv_f16_row_to_f32((const uint16_t *)A->a + oa, fa, A->sa[3] ? n : 1);
      nv_f16_row_to_f32((const uint16_t *)A->b + ob, fb, A->sb[3] ? n : 1);
      bin_row(A->op, fo, fa, A->sa[3], fb, A->sb[3], n);
      nv_f32_row_to_f16(fo, (uint16_t *)A->o + row * n, n);
    }
  }
}

xpu_status nv_k_binary(nv_run *r, const xpu_ir_node *n) {
  const xpu_ir_graph *g = r->g;
  const xpu_ir_tensor *o = &g->tensors[n->output];
  bin_args A;
  A.a = r->ptr[n->inputs[0]];
  A.b = r->ptr[n->inputs[1]];
  A.o = r->ptr[n->output];
  A.op = n->op;
  A.dt = o->dtype;
  A.r = r;
  pad4(o, A.od);
  bcast_strides(&g->tensors[n->inputs[0]], A.sa);
  bcast_strides(&g->tensors[n->inputs[1]], A.sb);
  A.rows = A.od[0] * A.od[1] * A.od[2];
  if (A.rows == 0 || A.od[3] == 0) return XPU_OK;
  nv_parallel(r, A.rows * A.od[3], bin_task, &A);
  return XPU_OK;
}

/* ---------------------------------------------------------------- unary */

typedef struct {
  const uint8_t *x;
  uint8_t *o;
  uint32_t op, dt;
  float s, b;
  int64_t n;
} un_args;

static void un_chunk(uint32_t op, float s, float bias, const float *x, float *o, int64_t n) {
  int64_t i = 0;
  const float32x4_t zero = vdupq_n_f32(0), vs = vdupq_n_f32(s), vb = vdupq_n_f32(bias);
  const float32x4_t half = vdupq_n_f32(0.5f), one = vdupq_n_f32(1.0f);
  const float32x4_t c0 = vdupq_n_f32(0.7978845608028654f), c1 = vdupq_n_f32(0.044715f);
  for (; i + 4 <= n; i += 4) {
    float32x4_t v = vld1q_f32(x + i), z;
    switch (op) {
    case XPU_OP_SILU: z = v_silu(v); break;
    case XPU_OP_GELU: {
      float32x4_t inner = vmulq_f32(c0, vfmaq_f32(v, c1, vmulq_f32(v, vmulq_f32(v, v))));
      z = vmulq_f32(vmulq_f32(half, v), vaddq_f32(one, v_tanh(inner)));
      break;
    }
    case XPU_OP_RELU: z = vbslq_f32(vcgtq_f32(v, zero), v, vbslq_f32(vceqq_f32(v, v), zero, v)); break;
    case XPU_OP_EXP: z = v_exp(v); break;
    case XPU_OP_NEG: z = vnegq_f32(v); break;
    case XPU_OP_TANH: z = v_tanh(v); break;
    default: z = vfmaq_f32(vb, v, vs); break;
    }
    vst1q_f32(o + i, z);
  }
  for (; i < n; i++) {
    float v = x[i];
    switch (op) {
    case XPU_OP_SILU: o[i] = v / (1.0f + expf(-v)); break;
    case XPU_OP_GELU: o[i] = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v))); break;
    case XPU_OP_RELU: o[i] = v > 0 ? v : (v != v ? v : 0.0f); break;
    case XPU_OP_EXP: o[i] = expf(v); break;
    case XPU_OP_NEG: o[i] = -v; break;
    case XPU_OP_TANH: o[i] = tanhf(v); break;
    default: o[i] = fmaf(v, s, bias); break;
    }
  }
}

static void un_task(void *p, int tid, int nth) {
  un_args *A = (un_args *)p;
  int64_t b0, e0;
  nv_range(A->n, tid, nth, 256, &b0, &e0);
  if (A->dt == XPU_DT_F32) {
    un_chunk(A->op, A->s, A->b, (const float *)A->x + b0, (float *)A->o + b0, e0 - b0);
    return;
  }
  float buf[256];
  for (int64_t i = b0; i < e0; i += 256) {
    int64_t m = e0 - i < 256 ? e0 - i : 256;
    nv_f16_row_to_f32((const uint16_t *)A->x + i, buf, m);
    un_chunk(A->op, A->s, A->b, buf, buf, m);
    nv_f32_row_to_f16(buf, (uint16_t *)A->o + i, m);
  }
}

xpu_status nv_k_unary(nv_run *r, const xpu_ir_node *n) {
  const xpu_ir_tensor *o = &r->g->tensors[n->output];
  un_args A = {r->ptr[n->inputs[0]], r->ptr[n->output], n->op, o->dtype, n->fattr[0], n->fattr[1], xpu_ir_numel(o)};
  if (A.n == 0) return XPU_OK;
  nv_parallel(r, A.n * 8, un_task, &A);
  return XPU_OK;
}

/* ---------------------------------------------------------------- norms and softmax */

typedef struct {
  const uint8_t *x;
  uint8_t *o;
  uint32_t op, dt;
  int64_t rows, k, m; /* m: rows of each [M, N] matrix (softmax causal) */
  float eps, scale;
  int causal;
  int64_t offset;
  nv_run *r;
} row_args;

static float sum_sq(const float *x, int64_t k) {
  float32x4_t s0 = vdupq_n_f32(0), s1 = vdupq_n_f32(0);
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    float32x4_t a = vld1q_f32(x + i), b = vld1q_f32(x + i + 4);
    s0 = vfmaq_f32(s0, a, a);
    s1 = vfmaq_f32(s1, b, b);
  }
  float s = v_hsum(vaddq_f32(s0, s1));
  for (; i < k; i++) s += x[i] * x[i];
  return s;
}

static float sum_f(const float *x, int64_t k) {
  float32x4_t s0 = vdupq_n_f32(0);
  int64_t i = 0;
  for (; i + 4 <= k; i += 4) s0 = vaddq_f32(s0, vld1q_f32(x + i));
  float s = v_hsum(s0);
  for (; i < k; i++) s += x[i];
  return s;
}

/* o = (x - sub) * mul */
static void shift_scale(const float *x, float *o, int64_t k, float sub, float mul) {
  float32x4_t vs = vdupq_n_f32(sub), vm = vdupq_n_f32(mul);
  int64_t i = 0;
  for (; i + 4 <= k; i += 4) vst1q_f32(o + i, vmulq_f32(vsubq_f32(vld1q_f32(x + i), vs), vm));
  for (; i < k; i++) o[i] = (x[i] - sub) * mul;
}

static void norm_row(const row_args *A, const float *x, float *o) {
  int64_t k = A->k;
  if (A->op == XPU_OP_RMS_NORM) {
    float ms = sum_sq(x, k) / (float)k;
    shift_scale(x, o, k, 0.0f, 1.0f / sqrtf(ms + A->eps));
  } else {
    float mean = sum_f(x, k) / (float)k;
    float32x4_t vm = vdupq_n_f32(mean), acc = vdupq_n_f32(0);
    int64_t i = 0;
    for (; i + 4 <= k; i += 4) {
      float32x4_t d = vsubq_f32(vld1q_f32(x + i), vm);
      acc = vfmaq_f32(acc, d, d);
    }
    float var = v_hsum(acc);
    for (; i < k; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= (float)k;
    shift_scale(x, o, k, mean, 1.0f / sqrtf(var + A->eps));
  }
}

/* softmax of z = x*scale over the first `valid` elements; the rest of the row is 0 */
void nv_softmax_row(const float *x, float *o, int64_t n, int64_t valid, float scale) {
  if (valid < 0) valid = 0;
  if (valid > n) valid = n;
  float mx = -INFINITY;
  for (int64_t j = 0; j < valid; j++) mx = fmaxf(mx, x[j] * scale);
  float32x4_t vmx = vdupq_n_f32(mx), vsc = vdupq_n_f32(scale), acc = vdupq_n_f32(0);
  int64_t j = 0;
  for (; j + 4 <= valid; j += 4) {
    float32x4_t e = v_exp(vsubq_f32(vmulq_f32(vld1q_f32(x + j), vsc), vmx));
    vst1q_f32(o + j, e);
    acc = vaddq_f32(acc, e);
  }
  float sum = v_hsum(acc);
  for (; j < valid; j++) {
    o[j] = expf(x[j] * scale - mx);
    sum += o[j];
  }
  float inv = 1.0f / sum;
  shift_scale(o, o, valid, 0.0f, inv);
  for (j = valid; j < n; j++) o[j] = 0.0f;
}

static void row_task(void *p, int tid, int nth) {
  row_args *A = (row_args *)p;
  int64_t b0, e0;
  nv_range(A->rows, tid, nth, 1, &b0, &e0);
  float *s = (float *)nv_scratch(A->r, tid);
  for (int64_t row = b0; row < e0; row++) {
    const float *x;
    float *o;
    if (A->dt == XPU_DT_F32) {
      x = (const float *)A->x + row * A->k;
      o = (float *)A->o + row * A->k;
    } else {
      nv_f16_row_to_f32((const uint16_t *)A->x + row * A->k, s, A->k);
      x = o = s;
    }
    if (A->op == XPU_OP_SOFTMAX) {
      int64_t valid = A->k;
      if (A->causal) {
        int64_t i = row % A->m;
        valid = i + A->offset + 1;
      }
      nv_softmax_row(x, o, A->k, valid, A->scale);
    } else {
      norm_row(A, x, o);
    }
    if (A->dt != XPU_DT_F32) nv_f32_row_to_f16(s, (uint16_t *)A->o + row * A->k, A->k);
  }
}

static xpu_status rows_op(nv_run *r, const xpu_ir_node *n) {
  const xpu_ir_tensor *x = &r->g->tensors[n->inputs[0]];
  row_args A;
  memset(&A, 0, sizeof A);
  A.x = r->ptr[n->inputs[0]];
  A.o = r->ptr[n->output];
  A.op = n->op;
  A.dt = x->dtype;
  A.k = x->shape[x->rank - 1];
  A.rows = A.k ? xpu_ir_numel(x) / A.k : 0;
  A.m = x->rank >= 2 ? x->shape[x->rank - 2] : 1;
  A.eps = n->fattr[0];
  A.scale = n->fattr[0] == 0 ? 1.0f : n->fattr[0];
  A.causal = n->op == XPU_OP_SOFTMAX && n->iattr[0] == 1;
  A.offset = n->iattr[1];
  /* past these bounds every offset means the same; clamping keeps i + offset from overflowing */
  if (A.offset > A.k) A.offset = A.k;
  if (A.offset < -A.m - 1) A.offset = -A.m - 1;
  A.r = r;
  if (A.rows == 0 || A.k == 0) return XPU_OK;
  nv_parallel(r, A.rows * A.k * 4, row_task, &A);
  return XPU_OK;
}

xpu_status nv_k_norm(nv_run *r, const xpu_ir_node *n) { return rows_op(r, n); }
xpu_status nv_k_softmax(nv_run *r, const xpu_ir_node *n) { return rows_op(r, n); }

/* ---------------------------------------------------------------- scratch sizes */

uint64_t nv_node_shared(const xpu_ir_graph *g, const xpu_ir_node *n) {
  if (n->op == XPU_OP_SHADOW_MATMUL) return nv_shadow_shared(g, n);
  if (n->op == XPU_OP_SPARSE_FFN) return nv_sparse_shared(g, n);
  if (n->op != XPU_OP_MATMUL) return 0;
  return nv_is_w8a8(g, n) ? nv_w8a8_shared(g, n) : nv_matmul_shared(g, n);
}

uint64_t nv_node_scratch(const xpu_ir_graph *g, const xpu_ir_node *n) {
  const xpu_ir_tensor *o = &g->tensors[n->output];
  uint64_t last = o->rank ? (uint64_t)o->shape[o->rank - 1] : 1;
  switch (n->op) {
  case XPU_OP_ADD: case XPU_OP_SUB: case XPU_OP_MUL: case XPU_OP_DIV: return 3 * last * 4 + 64;
  case XPU_OP_RMS_NORM: case XPU_OP_LAYER_NORM: case XPU_OP_SOFTMAX: return last * 4 + 64;
  case XPU_OP_ROPE: return 2 * last * 4 + 64;
  case XPU_OP_MATMUL: return nv_is_w8a8(g, n) ? nv_w8a8_scratch(g, n) : nv_matmul_scratch(g, n);
  case XPU_OP_ATTENTION: return nv_attention_scratch(g, n);
  case XPU_OP_SPARSE_FFN: return nv_sparse_scratch(g, n);
  default: return 0;
  }
}
