/*
 * graph.c: what the kernels accept (the OPS.md rules, re-checked here because a plugin must not
 * trust its input to stay in bounds) and the memory plan of an executable.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "neon.h"

static int is_float(uint32_t dt) { return dt == XPU_DT_F32 || dt == XPU_DT_F16; }
static int is_movable(uint32_t dt) {
  return dt == XPU_DT_F32 || dt == XPU_DT_F16 || dt == XPU_DT_BF16 || dt == XPU_DT_I32 || dt == XPU_DT_I8;
}

#define NO(...)                                                                                  \
  do {                                                                                           \
    snprintf(reason, cap, __VA_ARGS__);                                                          \
    return 0;                                                                                    \
  } while (0)

static int same_shape(const xpu_ir_tensor *a, const xpu_ir_tensor *b) {
  if (a->rank != b->rank) return 0;
  for (uint32_t d = 0; d < a->rank; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}

/* numpy broadcasting of a and b must give exactly o */
static int broadcasts_to(const xpu_ir_tensor *a, const xpu_ir_tensor *b, const xpu_ir_tensor *o) {
  uint32_t r = a->rank > b->rank ? a->rank : b->rank;
  if (o->rank != r) return 0;
  for (uint32_t i = 0; i < r; i++) {
    int64_t da = 1, db = 1;
    if (i + a->rank >= r) da = a->shape[i + a->rank - r];
    if (i + b->rank >= r) db = b->shape[i + b->rank - r];
    int64_t want = da == 1 ? db : da;
    if (da != db && da != 1 && db != 1) return 0;
    if (o->shape[i] != want) return 0;
  }
  return 1;
}

/* op set 3: MATMUL with an I8 a (W8A8) or per-channel I8 weight scales (k_w8a8.c) */
static int w8a8_supported(const xpu_ir_graph *g, const xpu_ir_node *n, uint32_t *precision, char *reason,
                          size_t cap) {
  const xpu_ir_tensor *a = xpu_ir_input(g, n, 0), *b = xpu_ir_input(g, n, 1), *o = &g->tensors[n->output];
  if (n->n_inputs != 2 && n->n_inputs != 3) NO("needs 2 or 3 inputs");
  if (b->dtype != XPU_DT_I8 || b->rank != 2) NO("an i8 a or per-channel scales need an i8 [N,K] b");
  if (a->rank < 1) NO("a needs rank >= 1");
  int64_t K = b->shape[1], N = b->shape[0];
  if (a->shape[a->rank - 1] != K) NO("inner dimensions differ");
  if (n->n_inputs == 3) {
    const xpu_ir_tensor *s = xpu_ir_input(g, n, 2);
    if (s->dtype != XPU_DT_F32 || s->rank != 1 || s->shape[0] != N) NO("per-channel scales must be f32 [N]");
    if (n->fattr[0] != 0) NO("fattr[0] must be 0 with per-channel scales");
  } else if (!(n->fattr[0] > 0)) {
    NO("i8 b needs a positive scale");
  }
  if (a->dtype == XPU_DT_I8) {
    if (!(n->fattr[1] > 0)) NO("an i8 a needs a positive scale in fattr[1]");
    if (!(n->fattr[2] >= 0)) NO("the output grid scale fattr[2] must be 0 or positive");
    if (K >= (1 << 17)) NO("K must be below 2^17 (exact int32 sums)");
    if (o->dtype != XPU_DT_F32 && o->dtype != XPU_DT_F16) NO("the output must be f32 or f16");
    *precision = XPU_PREC_INT8;
  } else {
    if (!is_float(a->dtype) || o->dtype != a->dtype) NO("a must be i8, f32 or f16 and a float output of its dtype");
    if (n->fattr[1] != 0 || n->fattr[2] != 0) NO("fattr[1] and fattr[2] need an i8 a");
  }
  if (o->rank != a->rank || (a->rank == 1 ? o->shape[0] != N : o->shape[o->rank - 1] != N)) NO("output is not [..., M, N]");
  for (uint32_t d = 0; d + 1 < a->rank; d++)
    if (o->shape[d] != a->shape[d]) NO("output is not [..., M, N]");
  return 1;
}

/* op set 3: SHADOW_MATMUL (k_w8a8.c) */
static int shadow_supported(const xpu_ir_graph *g, const xpu_ir_node *n, char *reason, size_t cap) {
  const xpu_ir_tensor *x = xpu_ir_input(g, n, 0), *wt = xpu_ir_input(g, n, 1), *o = &g->tensors[n->output];
  if (n->n_inputs != 2 && n->n_inputs != 3) NO("needs x, wt and optional ids");
  if (!is_float(x->dtype) || (x->rank != 1 && x->rank != 2)) NO("x must be f32/f16 [M,K] or [K]");
  if (!is_float(wt->dtype) || wt->rank != 2) NO("wt must be f32/f16 [C,N]");
  int64_t K = x->shape[x->rank - 1], C = wt->shape[0], N = wt->shape[1];
  if (n->n_inputs == 3) {
    const xpu_ir_tensor *ids = xpu_ir_input(g, n, 2);
    if (ids->dtype != XPU_DT_I32 || ids->rank != 1 || ids->shape[0] != C) NO("ids must be i32 [C]");
  } else if (C != K) {
    NO("without ids wt needs one row per input channel");
  }
  if (!(n->fattr[0] > 0)) NO("the threshold fattr[0] must be positive");
  if (o->dtype != x->dtype || o->rank != x->rank || o->shape[o->rank - 1] != N || (x->rank == 2 && o->shape[0] != x->shape[0]))
    NO("output must be [M,N] of x's dtype");
  return 1;
}

/* op set 3: SPARSE_FFN (k_sparse.c). Bundles are read in place on every call (they are usually a
 * runtime cache that the host rewrites), so nothing here depends on them being constant. */
static int sparse_supported(const xpu_ir_graph *g, const xpu_ir_node *n, uint32_t *precision, char *reason,
                            size_t cap) {
  if (n->n_inputs != 3) NO("needs x, bundles and idx");
  const xpu_ir_tensor *x = xpu_ir_input(g, n, 0), *b = xpu_ir_input(g, n, 1), *idx = xpu_ir_input(g, n, 2);
  const xpu_ir_tensor *o = &g->tensors[n->output];
  if (!is_float(x->dtype) || (x->rank != 1 && x->rank != 2)) NO("x must be f32/f16 [M,D] or [D]");
  uint32_t bt = b->dtype;
  if (bt != XPU_DT_F32 && bt != XPU_DT_F16 && bt != XPU_DT_Q8_0 && bt != XPU_DT_Q4_0) NO("bundles dtype %u not supported", bt);
  if (b->rank != 2) NO("bundles must be [S,R]");
  if (idx->dtype != XPU_DT_I32 || idx->rank != 1) NO("idx must be i32 [K]");
  if (n->iattr[0] < 0 || n->iattr[0] > 2) NO("activation iattr[0] must be 0 (ReLU), 1 (ReLU²) or 2 (SiLU)");
  if (n->iattr[1] != 0 && n->iattr[1] != 1) NO("iattr[1] (ungated) must be 0 or 1");
  int64_t D = x->shape[x->rank - 1], R = b->shape[1], seg = n->iattr[1] ? 2 : 3;
  if (D <= 0 || R < seg * D) NO("bundle rows of %lld values cannot hold %lld segments of D = %lld", (long long)R,
                               (long long)seg, (long long)D);
  int quant = bt == XPU_DT_Q8_0 || bt == XPU_DT_Q4_0;
  if (quant && (D % 32 != 0 || R % 32 != 0)) NO("quantized bundles need D and R multiples of 32");
  if (o->dtype != x->dtype || !same_shape(x, o)) NO("output must be x's dtype and shape");
  *precision = quant ? XPU_PREC_INT8 : XPU_PREC_F32;
  return 1;
}

int nv_node_supported(const xpu_ir_graph *g, const xpu_ir_node *n, uint32_t *precision, char *reason,
                      size_t cap) {
  const xpu_ir_tensor *o = &g->tensors[n->output];
  const xpu_ir_tensor *a = xpu_ir_input(g, n, 0), *b = xpu_ir_input(g, n, 1);
  *precision = XPU_PREC_F32;
  reason[0] = 0;
  uint32_t op = n->op;
  if (op >= XPU_OP_ADD && op <= XPU_OP_DIV) {
    if (n->n_inputs != 2) NO("needs 2 inputs");
    if (!is_float(a->dtype) || a->dtype != b->dtype || o->dtype != a->dtype) NO("needs f32 or f16 inputs and output of one dtype");
    if (!broadcasts_to(a, b, o)) NO("shapes do not broadcast to the output shape");
    return 1;
  }
  if ((op >= XPU_OP_SILU && op <= XPU_OP_SCALE) || op == XPU_OP_RMS_NORM || op == XPU_OP_LAYER_NORM ||
      op == XPU_OP_SOFTMAX) {
    if (n->n_inputs != 1) NO("needs 1 input");
    if (!is_float(a->dtype) || o->dtype != a->dtype) NO("needs an f32 or f16 input and output of one dtype");
    if (!same_shape(a, o)) NO("output shape differs from the input's");
    if ((op == XPU_OP_RMS_NORM || op == XPU_OP_LAYER_NORM || op == XPU_OP_SOFTMAX) && a->rank < 1)
      NO("needs rank >= 1");
    if (op == XPU_OP_SOFTMAX && n->iattr[0] != 0 && a->rank < 2) NO("causal softmax needs rank >= 2");
    if (op == XPU_OP_SOFTMAX && n->iattr[0] != 0 && n->iattr[0] != 1) NO("causal flag must be 0 or 1");
    return 1;
  }
  switch (op) {
  case XPU_OP_MATMUL: {
    if (nv_is_w8a8(g, n)) return w8a8_supported(g, n, precision, reason, cap);
    if (n->n_inputs != 2) NO("needs 2 inputs");
    if (!is_float(a->dtype) || o->dtype != a->dtype) NO("a must be f32 or f16 and the output of its dtype");
    uint32_t bt = b->dtype;
    if (bt != XPU_DT_F32 && bt != XPU_DT_F16 && bt != XPU_DT_BF16 && bt != XPU_DT_Q8_0 && bt != XPU_DT_Q4_0 &&
        bt != XPU_DT_I8 && !nv_is_kquant(bt))
      NO("b dtype %u not supported", bt);
    if (a->rank < 1 || b->rank < 2) NO("a needs rank >= 1, b rank >= 2");
    int quant = bt == XPU_DT_Q8_0 || bt == XPU_DT_Q4_0 || bt == XPU_DT_I8 || nv_is_kquant(bt);
    if (quant && b->rank != 2) NO("a quantized b must be rank 2");
    if (bt == XPU_DT_I8 && !(n->fattr[0] > 0)) NO("i8 b needs a positive scale");
    int64_t K = a->shape[a->rank - 1], N = b->shape[b->rank - 2];
    if (b->shape[b->rank - 1] != K) NO("inner dimensions differ");
    if ((bt == XPU_DT_Q8_0 || bt == XPU_DT_Q4_0) && K % 32 != 0) NO("K must be a multiple of 32");
    if (nv_is_kquant(bt) && K % 256 != 0) NO("K must be a multiple of 256");
    if (a->rank == 1) {
      if (b->rank != 2 || o->rank != 1 || o->shape[0] != N) NO("rank-1 a needs rank-2 b and gives [N]");
    } else {
      /* output = broadcast(batch a, batch b) + [M, N] */
      xpu_ir_tensor ba = *a, bb = *b, bo = *o;
      ba.rank -= 2;
      bb.rank -= 2;
      if (o->rank < 2) NO("output rank too small");
      bo.rank -= 2;
      if (!broadcasts_to(&ba, &bb, &bo)) NO("batch dimensions do not broadcast to the output's");
      if (o->shape[o->rank - 2] != a->shape[a->rank - 2] || o->shape[o->rank - 1] != N) NO("output is not [..., M, N]");
    }
    if (bt == XPU_DT_Q8_0 || bt == XPU_DT_Q4_0) *precision = XPU_PREC_INT8;
    /* constant Q4_K/Q5_K/Q6_K weights are repacked for the int8 kernels; other K-quant b are
     * dequantized to f32 */
    if (nv_kq_repackable(bt) && b->kind == XPU_TENSOR_CONST) *precision = XPU_PREC_INT8;
    return 1;
  }
  case XPU_OP_SHADOW_MATMUL: return shadow_supported(g, n, reason, cap);
  case XPU_OP_SPARSE_FFN: return sparse_supported(g, n, precision, reason, cap);
  case XPU_OP_ROPE: {
    if (n->n_inputs != 2) NO("needs 2 inputs");
    if (!is_float(a->dtype) || o->dtype != a->dtype || !same_shape(a, o)) NO("x must be f32/f16 and the output like x");
    if (a->rank != 3 && a->rank != 4) NO("x must be [T,H,D] or [B,T,H,D]");
    int64_t T = a->shape[a->rank - 3], D = a->shape[a->rank - 1];
    if (b->dtype != XPU_DT_I32 || b->rank != 1 || b->shape[0] != T) NO("positions must be i32 [T]");
    int64_t nrot = n->iattr[1] ? n->iattr[1] : D;
    if (nrot < 0 || nrot > D || nrot % 2) NO("rotary dims must be even and <= D");
    if (n->iattr[0] != 0 && n->iattr[0] != 2) NO("rope mode must be 0 (normal) or 2 (neox)");
    return 1;
  }
  case XPU_OP_ATTENTION: {
    if (n->n_inputs < 3 || n->n_inputs > 5) NO("needs q, k, v, an optional q_offset and an optional mask");
    const xpu_ir_tensor *v = xpu_ir_input(g, n, 2);
    if (!is_float(a->dtype) || !is_float(b->dtype) || !is_float(v->dtype) || o->dtype != a->dtype)
      NO("q, k, v must be f32/f16 and the output of q's dtype");
    if (a->rank != 3 || b->rank != 3 || v->rank != 3 || o->rank != 3) NO("q, k, v and the output must be rank 3");
    if (b->shape[0] != v->shape[0] || b->shape[1] != v->shape[1]) NO("k and v differ in length or heads");
    if (a->shape[2] != b->shape[2]) NO("q and k head dims differ");
    int64_t kvh = xpu_ir_attention_kv_heads(n, b->shape[1]);
    if (kvh < 0) NO("kv head range outside k's heads");
    if (kvh == 0 || a->shape[1] % kvh) NO("query heads not a multiple of kv heads");
    if (o->shape[0] != a->shape[0] || o->shape[1] != a->shape[1] || o->shape[2] != v->shape[2]) NO("output must be [Tq, Hq, Dv]");
    if (n->iattr[0] != 0 && n->iattr[0] != 1) NO("causal flag must be 0 or 1");
    if (n->n_inputs >= 4) {
      const xpu_ir_tensor *qo = xpu_ir_input(g, n, 3);
      if (qo->dtype != XPU_DT_I32 || xpu_ir_numel(qo) != 1) NO("q_offset must be i32 [1]");
    }
    if (n->n_inputs == 5) {
      const xpu_ir_tensor *mk = xpu_ir_input(g, n, 4);
      if (n->iattr[0] != 1) NO("a mask needs causal attention");
      if (mk->dtype != XPU_DT_I8 || mk->rank != 2 || mk->shape[0] != a->shape[0] || mk->shape[1] != a->shape[0])
        NO("mask must be i8 [Tq, Tq]");
    }
    return 1;
  }
  case XPU_OP_GET_ROWS: {
    if (n->n_inputs != 2) NO("needs 2 inputs");
    uint32_t t = a->dtype;
    if (a->rank != 2) NO("table must be rank 2");
    if (t != XPU_DT_F32 && t != XPU_DT_F16 && t != XPU_DT_BF16 && t != XPU_DT_Q8_0 && t != XPU_DT_Q4_0 && t != XPU_DT_I8 &&
        !nv_is_kquant(t))
      NO("table dtype %u not supported", t);
    if (nv_is_kquant(t) && a->shape[1] % 256 != 0) NO("a K-quant table needs rows of a multiple of 256");
    if (b->dtype != XPU_DT_I32 || b->rank > 3) NO("ids must be i32 of rank <= 3");
    if (o->dtype != XPU_DT_F32 || o->rank != b->rank + 1 || o->shape[o->rank - 1] != a->shape[1]) NO("output must be f32 [..., K]");
    for (uint32_t d = 0; d < b->rank; d++)
      if (o->shape[d] != b->shape[d]) NO("output must be f32 [ids..., K]");
    *precision = XPU_PREC_DEFAULT;
    return 1;
  }
  case XPU_OP_CAST: {
    if (n->n_inputs != 1) NO("needs 1 input");
    uint32_t f = a->dtype, t = o->dtype;
    if (!(f == XPU_DT_F32 || f == XPU_DT_F16 || f == XPU_DT_BF16 || f == XPU_DT_I32) ||
        !(t == XPU_DT_F32 || t == XPU_DT_F16 || t == XPU_DT_BF16))
      NO("cast %u -> %u not supported", f, t);
    if (!same_shape(a, o)) NO("output shape differs");
    *precision = XPU_PREC_DEFAULT;
    return 1;
  }
  case XPU_OP_QUANTIZE: {
    if (n->n_inputs != 1) NO("needs 1 input");
    if (a->dtype != XPU_DT_F32) NO("needs an f32 input");
    if (o->dtype != XPU_DT_Q8_0 && o->dtype != XPU_DT_Q4_0 && o->dtype != XPU_DT_I8) NO("output must be q8_0, q4_0 or i8");
    if (o->dtype == XPU_DT_I8 && !(n->fattr[0] > 0)) NO("i8 needs a positive scale");
    if (!same_shape(a, o)) NO("output shape differs");
    *precision = XPU_PREC_DEFAULT;
    return 1;
  }
  case XPU_OP_DEQUANTIZE: {
    if (n->n_inputs != 1) NO("needs 1 input");
    if (a->dtype != XPU_DT_Q8_0 && a->dtype != XPU_DT_Q4_0 && a->dtype != XPU_DT_I8 && !nv_is_kquant(a->dtype))
      NO("input must be q8_0, q4_0, a K-quant or i8");
    if (nv_is_kquant(a->dtype) && (a->rank < 1 || a->shape[a->rank - 1] % 256 != 0))
      NO("a K-quant input needs a last dimension of a multiple of 256");
    if (o->dtype != XPU_DT_F32 || !same_shape(a, o)) NO("output must be f32 of the input's shape");
    *precision = XPU_PREC_DEFAULT;
    return 1;
  }
  case XPU_OP_RESHAPE:
    if (n->n_inputs != 1) NO("needs 1 input");
    if (a->dtype != o->dtype || xpu_ir_nbytes(a) != xpu_ir_nbytes(o) || xpu_ir_numel(a) != xpu_ir_numel(o))
      NO("reshape changes the dtype or the element count");
    *precision = XPU_PREC_DEFAULT;
    return 1;
  case XPU_OP_PERMUTE: {
    if (n->n_inputs != 1) NO("needs 1 input");
    if (!is_movable(a->dtype) || o->dtype != a->dtype || o->rank != a->rank) NO("dtype or rank mismatch");
    int seen[XPU_MAX_RANK] = {0};
    for (uint32_t d = 0; d < a->rank; d++) {
      int64_t p = n->iattr[d];
      if (p < 0 || p >= (int64_t)a->rank || seen[p]) NO("perm is not a permutation");
      seen[p] = 1;
      if (o->shape[d] != a->shape[p]) NO("output shape does not match the permutation");
    }
    *precision = XPU_PREC_DEFAULT;
    return 1;
  }
  case XPU_OP_SLICE: {
    if (n->n_inputs != 1) NO("needs 1 input");
    if (!is_movable(a->dtype) || o->dtype != a->dtype || o->rank != a->rank) NO("dtype or rank mismatch");
    int64_t axis = n->iattr[0], start = n->iattr[1];
    if (axis < 0 || axis >= (int64_t)a->rank) NO("axis out of range");
    for (uint32_t d = 0; d < a->rank; d++)
      if ((int64_t)d != axis && o->shape[d] != a->shape[d]) NO("slice changes another axis");
    if (start < 0 || start + o->shape[axis] > a->shape[axis]) NO("slice range out of bounds");
    *precision = XPU_PREC_DEFAULT;
    return 1;
  }
  case XPU_OP_CONCAT: {
    if (n->n_inputs < 1) NO("needs at least 1 input");
    int64_t axis = n->iattr[0];
    if (axis < 0 || axis >= (int64_t)a->rank) NO("axis out of range");
    if (!is_movable(a->dtype) || o->dtype != a->dtype || o->rank != a->rank) NO("dtype or rank mismatch");
    int64_t total = 0;
    for (uint32_t i = 0; i < n->n_inputs; i++) {
      const xpu_ir_tensor *x = xpu_ir_input(g, n, i);
      if (x->dtype != a->dtype || x->rank != a->rank) NO("input %u differs in dtype or rank", i);
      for (uint32_t d = 0; d < a->rank; d++)
        if ((int64_t)d != axis && x->shape[d] != o->shape[d]) NO("input %u differs off the axis", i);
      total += x->shape[axis];
    }
    if (total != o->shape[axis]) NO("output length along the axis is not the inputs' sum");
    *precision = XPU_PREC_DEFAULT;
    return 1;
  }
  }
  NO("unknown op %u", op);
}

int nv_check_tensors(const xpu_ir_graph *g, char *err, size_t cap) {
  for (uint32_t t = 0; t < g->header->n_tensors; t++) {
    const xpu_ir_tensor *x = &g->tensors[t];
    uint64_t n = 1;
    for (uint32_t d = 0; d < x->rank; d++)
      if (__builtin_mul_overflow(n, (uint64_t)x->shape[d], &n) || n > NV_MAX_ELEMS) {
        snprintf(err, cap, "tensor %u has more than 2^44 elements", t);
        return 0;
      }
  }
  return 1;
}

uint32_t nv_op_support(const xpu_op_query *q) {
  uint32_t op = q->op, in = q->dtype_in, w = q->dtype_weight, out = q->dtype_out;
  if (op == XPU_OP_INVALID || op >= XPU_OP_COUNT) return XPU_VERDICT_NO;
  if (q->rank > XPU_MAX_RANK) return XPU_VERDICT_NO;
  switch (op) {
  case XPU_OP_MATMUL:
    if (in == XPU_DT_I8) /* W8A8 (op set 3) */
      return (!w || w == XPU_DT_I8) && (!out || out == XPU_DT_F32 || out == XPU_DT_F16) ? XPU_VERDICT_YES
                                                                                     : XPU_VERDICT_NO;
    if (!is_float(in) || (out && out != in)) return XPU_VERDICT_NO;
    if (w && w != XPU_DT_F32 && w != XPU_DT_F16 && w != XPU_DT_BF16 && w != XPU_DT_Q8_0 && w != XPU_DT_Q4_0 &&
        w != XPU_DT_I8 && !nv_is_kquant(w))
      return XPU_VERDICT_NO;
    return XPU_VERDICT_YES;
  case XPU_OP_GET_ROWS:
    if (in != XPU_DT_F32 && in != XPU_DT_F16 && in != XPU_DT_BF16 && in != XPU_DT_Q8_0 && in != XPU_DT_Q4_0 &&
        in != XPU_DT_I8 && !nv_is_kquant(in))
      return XPU_VERDICT_NO;
    return (out == 0 || out == XPU_DT_F32) ? XPU_VERDICT_YES : XPU_VERDICT_NO;
  case XPU_OP_CAST:
    if (!(in == XPU_DT_F32 || in == XPU_DT_F16 || in == XPU_DT_BF16 || in == XPU_DT_I32)) return XPU_VERDICT_NO;
    return (out == XPU_DT_F32 || out == XPU_DT_F16 || out == XPU_DT_BF16) ? XPU_VERDICT_YES : XPU_VERDICT_NO;
  case XPU_OP_QUANTIZE:
    return in == XPU_DT_F32 && (out == XPU_DT_Q8_0 || out == XPU_DT_Q4_0 || out == XPU_DT_I8) ? XPU_VERDICT_YES
                                                                                              : XPU_VERDICT_NO;
  case XPU_OP_DEQUANTIZE:
    return (in == XPU_DT_Q8_0 || in == XPU_DT_Q4_0 || in == XPU_DT_I8 || nv_is_kquant(in)) && (out == 0 || out == XPU_DT_F32)
               ? XPU_VERDICT_YES
               : XPU_VERDICT_NO;
  case XPU_OP_RESHAPE:
    return in > XPU_DT_INVALID && in < XPU_DT_COUNT ? XPU_VERDICT_YES : XPU_VERDICT_NO;
  case XPU_OP_PERMUTE:
  case XPU_OP_SLICE:
  case XPU_OP_CONCAT:
    return is_movable(in) ? XPU_VERDICT_YES : XPU_VERDICT_NO;
  case XPU_OP_ATTENTION:
    if (!is_float(in) || (w && !is_float(w))) return XPU_VERDICT_NO;
    return XPU_VERDICT_YES;
  case XPU_OP_SHADOW_MATMUL:
    return is_float(in) && (out == 0 || out == in) ? XPU_VERDICT_YES : XPU_VERDICT_NO;
  case XPU_OP_SPARSE_FFN: /* the weight is the bundles' dtype */
    if (!is_float(in) || (out && out != in)) return XPU_VERDICT_NO;
    return !w || w == XPU_DT_F32 || w == XPU_DT_F16 || w == XPU_DT_Q8_0 || w == XPU_DT_Q4_0 ? XPU_VERDICT_YES
                                                                                          : XPU_VERDICT_NO;
  default:
    /* elementwise, norms, softmax, rope: f32/f16 in and out */
    return is_float(in) && (out == 0 || out == in) ? XPU_VERDICT_YES : XPU_VERDICT_NO;
  }
}

/*
 * Memory plan: inputs and outputs live in the bound buffers, constants in their buffers, every
 * other value in the execution's arena. Arena regions are reused once a value's last reader ran
 * (greedy first fit over a list of free regions).
 */
typedef struct region {
  uint64_t off, size;
} region;

xpu_status nv_plan(nv_executable *e, char *err, size_t cap) {
  const xpu_ir_graph *g = &e->g;
  uint32_t nt = g->header->n_tensors, nn = g->header->n_nodes;
  e->plan = (nv_tensor_plan *)calloc(nt ? nt : 1, sizeof(nv_tensor_plan));
  int32_t *last_use = (int32_t *)malloc((nt ? nt : 1) * sizeof(int32_t));
  region *free_list = (region *)malloc((nt + 1) * sizeof(region));
  e->consts = (nv_buffer **)calloc(nt ? nt : 1, sizeof(nv_buffer *));
  if (!e->plan || !last_use || !free_list || !e->consts) {
    free(last_use);
    free(free_list);
    snprintf(err, cap, "out of memory");
    return XPU_E_OUT_OF_MEMORY;
  }
  xpu_status st = XPU_OK;
  for (uint32_t t = 0; t < nt; t++) {
    last_use[t] = -1;
    e->plan[t].nbytes = xpu_ir_nbytes(&g->tensors[t]);
    e->plan[t].loc = LOC_ARENA;
  }
  for (uint32_t i = 0; i < g->header->n_inputs; i++) {
    e->plan[g->inputs[i]].loc = LOC_IO;
    e->plan[g->inputs[i]].io = i;
  }
  /* a tensor listed twice as an output lives in its first binding; exec.c copies it to the rest */
  for (uint32_t i = g->header->n_outputs; i-- > 0;) {
    e->plan[g->outputs[i]].loc = LOC_IO;
    e->plan[g->outputs[i]].io = g->header->n_inputs + i;
  }
  for (uint32_t t = 0; t < nt && st == XPU_OK; t++) {
    const xpu_ir_tensor *x = &g->tensors[t];
    if (x->kind == XPU_TENSOR_CONST) {
      nv_buffer *b = (nv_buffer *)xpu_reg_get(&nv_reg, x->const_buffer, OBJ_BUFFER);
      if (!b || b->ctx != e->ctx) {
        snprintf(err, cap, "tensor %u: constant buffer handle unknown or of another context", t);
        st = XPU_E_INVALID_HANDLE;
        break;
      }
      if (x->const_offset > b->size || e->plan[t].nbytes > b->size - x->const_offset) {
        snprintf(err, cap, "tensor %u: constant [%llu, +%llu) lies outside its %llu-byte buffer", t,
                 (unsigned long long)x->const_offset, (unsigned long long)e->plan[t].nbytes,
                 (unsigned long long)b->size);
        st = XPU_E_INVALID_ARG;
        break;
      }
      atomic_fetch_add(&b->refs, 1);
      e->consts[e->n_consts++] = b;
      e->plan[t].loc = LOC_CONST;
      e->plan[t].cdata = b->data + x->const_offset;
    } else if (x->kind == XPU_TENSOR_INPUT && e->plan[t].loc != LOC_IO) {
      snprintf(err, cap, "tensor %u is an INPUT but not in the graph's input list", t);
      st = XPU_E_INVALID_ARG;
    }
  }
  if (st != XPU_OK) {
    free(last_use);
    free(free_list);
    return st;
  }
  for (uint32_t n = 0; n < nn; n++)
    for (uint32_t i = 0; i < g->nodes[n].n_inputs; i++) last_use[g->nodes[n].inputs[i]] = (int32_t)n;

  uint64_t top = 0, scratch = 0, shared = 0;
  uint32_t nfree = 0;
  for (uint32_t n = 0; n < nn; n++) {
    const xpu_ir_node *nd = &g->nodes[n];
    uint64_t s = nv_node_scratch(g, nd);
    if (s > scratch) scratch = s;
    s = nv_node_shared(g, nd);
    if (s > shared) shared = s;
    nv_tensor_plan *p = &e->plan[nd->output];
    if (p->loc == LOC_ARENA) {
      uint64_t need = (p->nbytes + NV_ALIGN - 1) / NV_ALIGN * NV_ALIGN;
      uint32_t best = nfree;
      for (uint32_t f = 0; f < nfree; f++)
        if (free_list[f].size >= need && (best == nfree || free_list[f].size < free_list[best].size)) best = f;
      if (best < nfree) {
        p->offset = free_list[best].off;
        free_list[best].off += need;
        free_list[best].size -= need;
      } else {
        p->offset = top;
        top += need;
        if (top > ((uint64_t)1 << 48)) {
          free(last_use);
          free(free_list);
          snprintf(err, cap, "intermediate values need more than 2^48 bytes");
          return XPU_E_OUT_OF_MEMORY;
        }
      }
    }
    /* free the arena values whose last reader is this node (not the output itself) */
    for (uint32_t i = 0; i < nd->n_inputs; i++) {
      uint32_t t = nd->inputs[i];
      int dup = 0;
      for (uint32_t k = 0; k < i; k++) dup |= nd->inputs[k] == t;
      if (dup || last_use[t] != (int32_t)n || e->plan[t].loc != LOC_ARENA || t == nd->output) continue;
      uint64_t sz = (e->plan[t].nbytes + NV_ALIGN - 1) / NV_ALIGN * NV_ALIGN;
      if (sz && nfree < nt + 1) free_list[nfree++] = (region){e->plan[t].offset, sz};
    }
    /* an output nobody reads is still written; it is free right after */
    if (p->loc == LOC_ARENA && last_use[nd->output] < 0) {
      uint64_t sz = (p->nbytes + NV_ALIGN - 1) / NV_ALIGN * NV_ALIGN;
      if (sz && nfree < nt + 1) free_list[nfree++] = (region){p->offset, sz};
    }
  }
  e->arena_bytes = top;
  e->scratch_bytes = (scratch + NV_ALIGN - 1) / NV_ALIGN * NV_ALIGN;
  e->shared_bytes = (shared + NV_ALIGN - 1) / NV_ALIGN * NV_ALIGN;
  free(last_use);
  free(free_list);
  return XPU_OK;
}
