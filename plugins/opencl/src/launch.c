/*
 * launch.c: one node -> kernel launches. Shapes are padded to 4-d (leading 1s); broadcasting
 * and layout changes become element strides, so the few kernels of kernels.cl cover the op set.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "graph.h"

#define ATT_ROW_MAX 256 /* ATT_MAX of kernels.cl: head sizes attention_row holds privately */

/* Sets kernel arguments from a format: m cl_mem, u uint64, i int, l int64, f double (as
 * float), 4 const cl_long4 *, L local bytes (size_t). */
static cl_int args(cl_kernel k, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cl_int ce = CL_SUCCESS;
  for (cl_uint i = 0; fmt[i] && ce == CL_SUCCESS; i++) {
    switch (fmt[i]) {
    case 'm': { cl_mem v = va_arg(ap, cl_mem); ce = P.cl.clSetKernelArg(k, i, sizeof v, &v); break; }
    case 'u': { cl_ulong v = va_arg(ap, uint64_t); ce = P.cl.clSetKernelArg(k, i, sizeof v, &v); break; }
    case 'i': { cl_int v = va_arg(ap, int); ce = P.cl.clSetKernelArg(k, i, sizeof v, &v); break; }
    case 'l': { cl_long v = va_arg(ap, int64_t); ce = P.cl.clSetKernelArg(k, i, sizeof v, &v); break; }
    case 'f': { cl_float v = (cl_float)va_arg(ap, double); ce = P.cl.clSetKernelArg(k, i, sizeof v, &v); break; }
    case '4': { const cl_long4 *v = va_arg(ap, const cl_long4 *); ce = P.cl.clSetKernelArg(k, i, sizeof *v, v); break; }
    case 'L': { size_t v = va_arg(ap, size_t); ce = P.cl.clSetKernelArg(k, i, v, NULL); break; }
    default: ce = CL_INVALID_ARG_INDEX;
    }
  }
  va_end(ap);
  return ce;
}

static size_t pow2_floor(size_t v) {
  size_t p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}

static size_t local_for(ocl_ctx *c, int kid, size_t cap) {
  size_t l = c->kwg[kid] < cap ? c->kwg[kid] : cap;
  if (l > c->dev->max_item[0]) l = c->dev->max_item[0];
  return pow2_floor(l ? l : 1);
}

static cl_int run1d(ocl_ctx *c, cl_command_queue q, int kid, uint64_t n) {
  size_t l = local_for(c, kid, c->wg1d);
  size_t g = (size_t)((n + l - 1) / l * l);
  return P.cl.clEnqueueNDRangeKernel(q, c->k[kid], 1, NULL, &g, &l, 0, NULL, NULL);
}

/* independent items (CPU family): SIMD-width groups, at least one group per compute unit */
static cl_int run_items(ocl_ctx *c, cl_command_queue q, int kid, uint64_t n) {
  size_t l = local_for(c, kid, c->kpref[kid]);
  while (l > 1 && n / l < c->dev->info.compute_units) l /= 2;
  size_t g = (size_t)((n + l - 1) / l * l);
  return P.cl.clEnqueueNDRangeKernel(q, c->k[kid], 1, NULL, &g, &l, 0, NULL, NULL);
}

/* one work-group per row; the group is no wider than the row needs */
static cl_int run_rows(ocl_ctx *c, cl_command_queue q, int kid, uint64_t rows, size_t l) {
  size_t g = (size_t)rows * l;
  return P.cl.clEnqueueNDRangeKernel(q, c->k[kid], 1, NULL, &g, &l, 0, NULL, NULL);
}

static size_t row_local(ocl_ctx *c, int kid, int64_t len) {
  size_t l = local_for(c, kid, 256);
  while (l > 1 && (int64_t)(l / 2) >= len) l /= 2;
  return l;
}

/* bytes of the first n elements of a row of dtype dt (n a multiple of its block for Q8_0/Q4_0) */
static uint64_t head_bytes(uint32_t dt, int64_t n) {
  return (uint64_t)(n / xpu_dtype_block_len(dt)) * xpu_dtype_block_bytes(dt);
}

static void shape4(const xpu_ir_tensor *t, cl_long4 *s) {
  for (int i = 0; i < 4; i++) s->s[i] = 1;
  for (uint32_t d = 0; d < t->rank; d++) s->s[4 - t->rank + d] = t->shape[d];
}

static void contig4(const cl_long4 *s, cl_long4 *str) {
  int64_t st = 1;
  for (int i = 3; i >= 0; i--) {
    str->s[i] = st;
    st *= s->s[i];
  }
}

/* strides that read x broadcast over out's shape */
static void bcast4(const xpu_ir_tensor *x, const cl_long4 *os, cl_long4 *str) {
  cl_long4 xs;
  shape4(x, &xs);
  contig4(&xs, str);
  for (int i = 0; i < 4; i++)
    if (xs.s[i] == 1 && os->s[i] != 1) str->s[i] = 0;
}

static cl_int eltwise(ocl_ctx *c, cl_command_queue q, int op, const xpu_ir_tensor *a, ocl_ref ra,
                      const xpu_ir_tensor *b, ocl_ref rb, const xpu_ir_tensor *o, ocl_ref ro,
                      float p0, float p1) {
  uint64_t n = (uint64_t)xpu_ir_numel(o);
  /* F32 without broadcasting, or b repeating along the leading dims (a bias row): flat index */
  if (a->dtype == XPU_DT_F32 && o->dtype == XPU_DT_F32 && xpu_ir_numel(a) == (int64_t)n &&
      (!b || b->dtype == XPU_DT_F32)) {
    int flat = 1;
    uint64_t bn = 0;
    for (uint32_t d = 0; d < a->rank && a->rank == o->rank; d++) flat &= a->shape[d] == o->shape[d];
    if (a->rank != o->rank) flat = 0;
    if (b && flat) {
      uint32_t br = b->rank;
      while (br > 0 && b->shape[b->rank - br] == 1) br--; /* leading 1s broadcast anyway */
      for (uint32_t i = 0; i < br && flat; i++)
        flat = br <= o->rank && b->shape[b->rank - 1 - i] == o->shape[o->rank - 1 - i];
      bn = (uint64_t)xpu_ir_numel(b);
      if (bn == n) bn = 0;
    }
    if (flat) {
      cl_int ce = args(c->k[K_ELTWISE_F32], "imumuumuffu", op, ra.mem, ra.off, b ? rb.mem : ra.mem,
                       b ? rb.off : ra.off, bn, ro.mem, ro.off, (double)p0, (double)p1, n);
      return ce ? ce : run1d(c, q, K_ELTWISE_F32, (n + 15) / 16);
    }
  }
  cl_long4 os, sa, sb;
  shape4(o, &os);
  bcast4(a, &os, &sa);
  if (b) {
    bcast4(b, &os, &sb);
  } else {
    sb = sa;
    rb = ra;
  }
  cl_int ce = args(c->k[K_ELTWISE], "imuimuimui444ffu", op, ra.mem, ra.off, (int)a->dtype,
                   rb.mem, rb.off, (int)(b ? b->dtype : a->dtype), ro.mem, ro.off,
                   (int)o->dtype, &os, &sa, &sb, (double)p0, (double)p1, n);
  return ce ? ce : run1d(c, q, K_ELTWISE, n);
}

static cl_int copy(ocl_ctx *c, cl_command_queue q, ocl_ref rs, uint64_t soff, ocl_ref rd, uint64_t doff, int esize,
                   const cl_long4 *shape, const cl_long4 *ss, const cl_long4 *ds) {
  uint64_t n = (uint64_t)(shape->s[0] * shape->s[1] * shape->s[2] * shape->s[3]);
  if (n == 0) return CL_SUCCESS;
  cl_int ce = args(c->k[K_COPY], "mumui444u", rs.mem, rs.off + soff, rd.mem, rd.off + doff, esize,
                   shape, ss, ds, n);
  return ce ? ce : run1d(c, q, K_COPY, n);
}

static cl_int matmul(ocl_ctx *c, cl_command_queue q, const xpu_ir_node *nd, const xpu_ir_tensor *a, ocl_ref ra,
                     const xpu_ir_tensor *b, ocl_ref rb, const xpu_ir_tensor *o, ocl_ref ro) {
  int64_t K = a->shape[a->rank - 1], N = b->shape[b->rank - 2];
  int64_t M = a->rank >= 2 ? a->shape[a->rank - 2] : 1;
  /* batch dims right-aligned into two slots: out [B0, B1, M, N] */
  int64_t ob[2] = {1, 1}, sa[2] = {0, 0}, sb[2] = {0, 0};
  int64_t ast = M * K, bst = N * K;
  for (int i = 0; i < 2; i++) { /* i = 0: innermost batch dim */
    int od = (int)o->rank - 3 - i, ad = (int)a->rank - 3 - i, bd = (int)b->rank - 3 - i;
    if (od >= 0) ob[1 - i] = o->shape[od];
    if (ad >= 0) {
      sa[1 - i] = a->shape[ad] == 1 ? 0 : ast;
      ast *= a->shape[ad];
    }
    if (bd >= 0) {
      sb[1 - i] = b->shape[bd] == 1 ? 0 : bst;
      bst *= b->shape[bd];
    }
  }
  int f32 = a->dtype == XPU_DT_F32 && b->dtype == XPU_DT_F32 && o->dtype == XPU_DT_F32;
  float bscale = b->dtype == XPU_DT_I8 ? nd->fattr[0] : 1.0f;
  cl_int ce;
  int kid;
  /* CPU devices and skinny products (decode) take the barrier-free kernel: local-memory tiles
   * pay off only where work-items of a group really run in lock-step and M fills a tile */
  if (!c->gpu_kernels || M < 4) {
    int rm = M >= 4 ? 4 : 1;
    int quant = (b->dtype == XPU_DT_Q8_0 || b->dtype == XPU_DT_Q4_0 ||
                 (b->dtype >= XPU_DT_Q4_K && b->dtype <= XPU_DT_Q3_K)) && a->dtype != XPU_DT_BF16;
    kid = f32 ? (rm == 4 ? K_GEMM_BLK_F32_4 : K_GEMM_BLK_F32_1)
          : quant ? (rm == 4 ? K_GEMM_Q_4 : K_GEMM_Q_1)
              : (rm == 4 ? K_GEMM_BLK_ANY_4 : K_GEMM_BLK_ANY_1);
    /* neighbouring items share the operand they both read: step along M when b is larger, so
     * b's rows stay in cache while a streams, else along N */
    int mfast = N > M && M >= 4 * rm;
    if (f32)
      ce = args(c->k[kid], "mumumulllllllli", ra.mem, ra.off, rb.mem, rb.off, ro.mem, ro.off, M, N,
                K, ob[1], sa[0], sa[1], sb[0], sb[1], mfast);
    else
      ce = args(c->k[kid], "muimuifmuilllllllli", ra.mem, ra.off, (int)a->dtype, rb.mem, rb.off,
                (int)b->dtype, (double)bscale, ro.mem, ro.off, (int)o->dtype, M, N, K, ob[1],
                sa[0], sa[1], sb[0], sb[1], mfast);
    if (ce) return ce;
    size_t cols = (size_t)((N + 3) / 4), rows = (size_t)((M + rm - 1) / rm);
    size_t d0 = mfast ? rows : cols, d1 = mfast ? cols : rows;
    /* one SIMD width (CPU) or warp (GPU) per group: the items share no local memory, and PoCL
     * runs a group as one loop vectorised across its items */
    size_t l = local_for(c, kid, c->kpref[kid]);
    while (l > 1 && (l / 2 >= d0 || (d0 / l) * d1 * (size_t)(ob[0] * ob[1]) < c->dev->info.compute_units))
      l /= 2; /* no wider than the work, and at least one group per compute unit */
    size_t lsz[3] = {l, 1, 1};
    size_t gsz[3] = {(d0 + l - 1) / l * l, d1, (size_t)(ob[0] * ob[1])};
    return P.cl.clEnqueueNDRangeKernel(q, c->k[kid], 3, NULL, gsz, lsz, 0, NULL, NULL);
  }
  size_t s = c->gemm_side, tile = 4 * s;
  size_t lsz[3] = {s, s, 1};
  size_t gsz[3] = {(size_t)((N + tile - 1) / tile) * s, (size_t)((M + tile - 1) / tile) * s,
                   (size_t)(ob[0] * ob[1])};
  size_t lb = tile * 16 * sizeof(float);
  if (f32) {
    kid = K_GEMM_F32;
    ce = args(c->k[kid], "mumumullllllllLL", ra.mem, ra.off, rb.mem, rb.off, ro.mem, ro.off, M, N,
              K, ob[1], sa[0], sa[1], sb[0], sb[1], lb, lb);
  } else {
    kid = K_GEMM_ANY;
    ce = args(c->k[kid], "muimuifmuillllllllLL", ra.mem, ra.off, (int)a->dtype, rb.mem, rb.off,
              (int)b->dtype, (double)bscale, ro.mem, ro.off, (int)o->dtype, M, N, K, ob[1], sa[0],
              sa[1], sb[0], sb[1], lb, lb);
  }
  if (ce) return ce;
  return P.cl.clEnqueueNDRangeKernel(q, c->k[kid], 3, NULL, gsz, lsz, 0, NULL, NULL);
}

cl_int ocl_launch_node(ocl_ctx *c, cl_command_queue q, const xpu_ir_graph *g, uint32_t ni, const ocl_ref *refs,
                       cl_mem flag, char *why, size_t cap) {
  const xpu_ir_node *n = &g->nodes[ni];
  const xpu_ir_tensor *o = &g->tensors[n->output];
  const xpu_ir_tensor *a = xpu_ir_input(g, n, 0), *b = xpu_ir_input(g, n, 1);
  ocl_ref ro = refs[n->output], ra = refs[n->inputs[0]];
  ocl_ref rb = n->n_inputs > 1 ? refs[n->inputs[1]] : ra;
  int64_t numel = xpu_ir_numel(o);
  cl_int ce = CL_SUCCESS;
  const char *what = "clSetKernelArg/clEnqueueNDRangeKernel";
  if (numel == 0) return CL_SUCCESS; /* zero-size: nothing is written */
  switch (n->op) {
  case XPU_OP_ADD: case XPU_OP_SUB: case XPU_OP_MUL: case XPU_OP_DIV:
    ce = eltwise(c, q, (int)n->op, a, ra, b, rb, o, ro, 1.0f, 1.0f);
    break;
  case XPU_OP_SILU: case XPU_OP_GELU: case XPU_OP_RELU: case XPU_OP_EXP: case XPU_OP_NEG:
  case XPU_OP_TANH:
    ce = eltwise(c, q, (int)n->op, a, ra, NULL, ra, o, ro, 1.0f, 1.0f);
    break;
  case XPU_OP_SCALE:
    ce = eltwise(c, q, (int)n->op, a, ra, NULL, ra, o, ro, n->fattr[0], n->fattr[1]);
    break;
  case XPU_OP_CAST:
    ce = eltwise(c, q, 0, a, ra, NULL, ra, o, ro, 1.0f, 1.0f);
    break;
  case XPU_OP_DEQUANTIZE:
    ce = eltwise(c, q, 0, a, ra, NULL, ra, o, ro, a->dtype == XPU_DT_I8 ? n->fattr[0] : 1.0f, 1.0f);
    break;
  case XPU_OP_QUANTIZE:
    if (o->dtype == XPU_DT_I8) {
      ce = eltwise(c, q, 0, a, ra, NULL, ra, o, ro, 1.0f, n->fattr[0]);
    } else {
      uint64_t nblk = (uint64_t)numel / 32;
      ce = args(c->k[K_QUANTIZE], "mumuiu", ra.mem, ra.off, ro.mem, ro.off, (int)o->dtype, nblk);
      if (!ce) ce = run1d(c, q, K_QUANTIZE, nblk);
    }
    break;
  case XPU_OP_MATMUL:
    ce = matmul(c, q, n, a, ra, b, rb, o, ro);
    break;
  case XPU_OP_RMS_NORM: case XPU_OP_LAYER_NORM: {
    int64_t K = a->rank ? a->shape[a->rank - 1] : 1;
    if (!c->gpu_kernels) {
      uint64_t rows = (uint64_t)(numel / K);
      ce = args(c->k[K_NORM_ROW], "muimuilfiu", ra.mem, ra.off, (int)a->dtype, ro.mem, ro.off,
                (int)o->dtype, K, (double)n->fattr[0], n->op == XPU_OP_LAYER_NORM ? 1 : 0, rows);
      if (!ce) ce = run_items(c, q, K_NORM_ROW, rows);
      break;
    }
    size_t l = row_local(c, K_NORM, K);
    ce = args(c->k[K_NORM], "muimuilfiL", ra.mem, ra.off, (int)a->dtype, ro.mem, ro.off,
              (int)o->dtype, K, (double)n->fattr[0], n->op == XPU_OP_LAYER_NORM ? 1 : 0,
              l * sizeof(float));
    if (!ce) ce = run_rows(c, q, K_NORM, (uint64_t)(numel / K), l);
    break;
  }
  case XPU_OP_SOFTMAX: {
    int64_t N = a->rank ? a->shape[a->rank - 1] : 1, M = a->rank >= 2 ? a->shape[a->rank - 2] : 1;
    float scale = n->fattr[0] != 0.0f ? n->fattr[0] : 1.0f;
    if (!c->gpu_kernels) {
      uint64_t rows = (uint64_t)(numel / N);
      ce = args(c->k[K_SOFTMAX_ROW], "muimuillfilu", ra.mem, ra.off, (int)a->dtype, ro.mem, ro.off,
                (int)o->dtype, N, M, (double)scale, n->iattr[0] == 1 ? 1 : 0, n->iattr[1], rows);
      if (!ce) ce = run_items(c, q, K_SOFTMAX_ROW, rows);
      break;
    }
    size_t l = row_local(c, K_SOFTMAX, N);
    ce = args(c->k[K_SOFTMAX], "muimuillfilL", ra.mem, ra.off, (int)a->dtype, ro.mem, ro.off,
              (int)o->dtype, N, M, (double)scale, n->iattr[0] == 1 ? 1 : 0, n->iattr[1],
              l * sizeof(float));
    if (!ce) ce = run_rows(c, q, K_SOFTMAX, (uint64_t)(numel / N), l);
    break;
  }
  case XPU_OP_ROPE: {
    int64_t D = a->shape[a->rank - 1], H = a->shape[a->rank - 2], T = a->shape[a->rank - 3];
    int64_t nrot = n->iattr[1] ? n->iattr[1] : D;
    ce = args(c->k[K_ROPE], "muimumuilllliffu", ra.mem, ra.off, (int)a->dtype, rb.mem, rb.off,
              ro.mem, ro.off, (int)o->dtype, T, H, D, nrot, n->iattr[0] == 2 ? 1 : 0,
              (double)(n->fattr[0] != 0.0f ? n->fattr[0] : 10000.0f),
              (double)(n->fattr[1] != 0.0f ? n->fattr[1] : 1.0f), (uint64_t)numel);
    if (!ce) ce = run1d(c, q, K_ROPE, (uint64_t)numel);
    break;
  }
  case XPU_OP_ATTENTION: {
    const xpu_ir_tensor *v = xpu_ir_input(g, n, 2);
    ocl_ref rv = refs[n->inputs[2]];
    ocl_ref rq = n->n_inputs > 3 ? refs[n->inputs[3]] : ra;
    int64_t Tq = a->shape[0], Hq = a->shape[1], D = a->shape[2];
    /* op set 4: the KV heads read may be a range of the Hks in each row, from its first head */
    int64_t Tk = b->shape[0], Hks = b->shape[1], Hkv = xpu_ir_attention_kv_heads(n, Hks), Dv = v->shape[2];
    rb.off += head_bytes(b->dtype, n->iattr[2] * D);
    rv.off += head_bytes(v->dtype, n->iattr[2] * Dv);
    /* op set v5: soft-cap (fattr[1]) and sliding window (iattr[4]) */
    float softcap = n->fattr[1] > 0.0f ? n->fattr[1] : 0.0f;
    int64_t window = n->iattr[4] > 0 ? n->iattr[4] : 0;
    float scale = n->fattr[0] != 0.0f ? n->fattr[0] : 1.0f / sqrtf((float)D);
    int causal = n->iattr[0] == 1, has_qo = n->n_inputs > 3, has_mask = n->n_inputs > 4;
    ocl_ref rm = has_mask ? refs[n->inputs[4]] : ra; /* a valid buffer the kernel ignores */
    if (!c->gpu_kernels && D <= ATT_ROW_MAX && Dv <= ATT_ROW_MAX) {
      uint64_t rows = (uint64_t)(Tq * Hq);
      ce = args(c->k[K_ATTENTION_ROW], "muimuimuimuilllllfimuilumuillfl", ra.mem, ra.off, (int)a->dtype,
                rb.mem, rb.off, (int)b->dtype, rv.mem, rv.off, (int)v->dtype, ro.mem, ro.off,
                (int)o->dtype, Hq, Tk, Hkv, D, Dv, (double)scale, causal, rq.mem, rq.off, has_qo,
                n->iattr[1], rows, rm.mem, rm.off, has_mask, Tq, Hks, (double)softcap, window);
      if (!ce) ce = run_items(c, q, K_ATTENTION_ROW, rows);
      break;
    }
    size_t l = local_for(c, K_ATTENTION, 64);
    while (l > 1 && (D + Dv + (int64_t)l) * sizeof(float) > c->dev->local_mem) l /= 2;
    ce = args(c->k[K_ATTENTION], "muimuimuimuilllllfimuilLLLmuillfl", ra.mem, ra.off, (int)a->dtype,
              rb.mem, rb.off, (int)b->dtype, rv.mem, rv.off, (int)v->dtype, ro.mem, ro.off,
              (int)o->dtype, Hq, Tk, Hkv, D, Dv, (double)scale, causal, rq.mem, rq.off, has_qo,
              n->iattr[1], (size_t)D * sizeof(float), (size_t)Dv * sizeof(float),
              l * sizeof(float), rm.mem, rm.off, has_mask, Tq, Hks, (double)softcap, window);
    if (!ce) ce = run_rows(c, q, K_ATTENTION, (uint64_t)(Tq * Hq), l);
    break;
  }
  case XPU_OP_GET_ROWS: {
    int64_t R = a->shape[0], K = a->shape[1];
    ce = args(c->k[K_GET_ROWS], "muifmumullmiu", ra.mem, ra.off, (int)a->dtype,
              (double)(a->dtype == XPU_DT_I8 ? n->fattr[0] : 1.0f), rb.mem, rb.off, ro.mem, ro.off,
              R, K, flag, (int)ni + 1, (uint64_t)numel);
    if (!ce) ce = run1d(c, q, K_GET_ROWS, (uint64_t)numel);
    break;
  }
  case XPU_OP_RESHAPE:
    what = "clEnqueueCopyBuffer";
    ce = P.cl.clEnqueueCopyBuffer(q, ra.mem, ro.mem, ra.off, ro.off, xpu_ir_nbytes(o), 0, NULL,
                                  NULL);
    break;
  case XPU_OP_PERMUTE: {
    cl_long4 os, xs, xstr, ss, ds;
    shape4(o, &os);
    shape4(a, &xs);
    contig4(&xs, &xstr);
    contig4(&os, &ds);
    for (int i = 0; i < 4; i++) ss.s[i] = 0;
    for (uint32_t d = 0; d < o->rank; d++)
      ss.s[4 - o->rank + d] = xstr.s[4 - a->rank + n->iattr[d]];
    ce = copy(c, q, ra, 0, ro, 0, (int)xpu_dtype_block_bytes(o->dtype), &os, &ss, &ds);
    break;
  }
  case XPU_OP_SLICE: {
    cl_long4 os, xs, ss, ds;
    shape4(o, &os);
    shape4(a, &xs);
    contig4(&xs, &ss);
    contig4(&os, &ds);
    int esz = (int)xpu_dtype_block_bytes(o->dtype);
    uint64_t soff = (uint64_t)(n->iattr[1] * ss.s[4 - a->rank + n->iattr[0]]) * (uint64_t)esz;
    ce = copy(c, q, ra, soff, ro, 0, esz, &os, &ss, &ds);
    break;
  }
  case XPU_OP_CONCAT: {
    cl_long4 os, ds;
    shape4(o, &os);
    contig4(&os, &ds);
    int esz = (int)xpu_dtype_block_bytes(o->dtype);
    int64_t at = 0, axs = ds.s[4 - o->rank + n->iattr[0]];
    for (uint32_t i = 0; i < n->n_inputs && !ce; i++) {
      const xpu_ir_tensor *t = xpu_ir_input(g, n, i);
      cl_long4 ts, ss;
      shape4(t, &ts);
      contig4(&ts, &ss);
      ce = copy(c, q, refs[n->inputs[i]], 0, ro, (uint64_t)(at * axs) * (uint64_t)esz, esz, &ts, &ss,
                &ds);
      at += t->shape[n->iattr[0]];
    }
    break;
  }
  default:
    snprintf(why, cap, "node %u: op %s has no kernel", ni, xpu_op_name(n->op));
    return CL_INVALID_OPERATION;
  }
  if (ce != CL_SUCCESS)
    snprintf(why, cap, "node %u (%s): %s failed: %s (%d)", ni, xpu_op_name(n->op), what,
             cl_err_name(ce), (int)ce);
  return ce;
}
