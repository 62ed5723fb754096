/*
 * xpu_validate.h: the OPS.md shape and attribute rules of every op, in C, once for every plugin.
 *
 * xpu_ir_parse checks the IR's structure (indices, order, each tensor's own shape); this header
 * checks each node against its op's rules: the number of inputs, the input dtypes and shapes
 * the op allows, its attributes, and that the output tensor is exactly what the inputs give.
 * core/infer.go is the Go statement of the same rules (the builder refuses what this refuses);
 * the two are kept in agreement by conformance's ABI(rejected-shapes) case.
 *
 * How a plugin uses it, in graph_analyze (and again in graph_prepare: never trust the caller
 * to have analysed first), once per node, before its own capability checks (dtype, size,
 * device limits), which may then read any input the op has without re-checking its arity:
 *
 *     #include "xpu_validate.h"
 *     const char *why = xpu_validate_node(&g, &g.nodes[i]);
 *     if (why) { verdict NO, reason = why; continue; }
 *     ... the plugin's own checks ...
 *
 * The reason is a static string (no allocation, no buffer); a plugin may copy it into its
 * verdict. Header-only, no state; it includes only xpu_ir.h (and through it xpu_backend.h).
 */
#ifndef XPU_VALIDATE_H
#define XPU_VALIDATE_H

#include "xpu_ir.h"

static inline int xpu_validate_is_float(uint32_t dt) { return dt == XPU_DT_F32 || dt == XPU_DT_F16; }

/* Q8_0, Q4_0 or a K-quant (I8 is not a block type) */
static inline int xpu_validate_is_block(uint32_t dt) { return xpu_dtype_block_len(dt) > 1; }

/* the dtypes the data-movement ops (PERMUTE, SLICE, CONCAT) move element by element */
static inline int xpu_validate_is_movable(uint32_t dt) {
  return dt == XPU_DT_F32 || dt == XPU_DT_F16 || dt == XPU_DT_BF16 || dt == XPU_DT_I32 || dt == XPU_DT_I8;
}

/* finite and > 0 (NaN fails) */
static inline int xpu_validate_pos_finite(float x) { return x > 0 && x <= 3.40282346638528859812e+38F; }

static inline int xpu_validate_same_shape(const xpu_ir_tensor *a, const xpu_ir_tensor *b) {
  if (a->rank != b->rank) return 0;
  for (uint32_t d = 0; d < a->rank && d < XPU_MAX_RANK; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}

/* numpy broadcasting of the first ra dims of a and the first rb of b gives exactly the first ro
 * dims of o (ro must be max(ra, rb)) */
static inline int xpu_validate_broadcasts(const int64_t *a, uint32_t ra, const int64_t *b, uint32_t rb,
                                          const int64_t *o, uint32_t ro) {
  uint32_t r = ra > rb ? ra : rb;
  if (ro != r) return 0;
  for (uint32_t i = 0; i < r; i++) {
    int64_t da = i + ra >= r ? a[i + ra - r] : 1, db = i + rb >= r ? b[i + rb - r] : 1;
    if (da != db && da != 1 && db != 1) return 0;
    if (o[i] != (da == 1 ? db : da)) return 0;
  }
  return 1;
}

static inline const char *xpu__validate_matmul(const xpu_ir_graph *g, const xpu_ir_node *n) {
  if (n->n_inputs != 2 && n->n_inputs != 3) return "MATMUL takes 2 or 3 inputs (a, b [, b_scale])";
  const xpu_ir_tensor *a = xpu_ir_input(g, n, 0), *b = xpu_ir_input(g, n, 1), *o = &g->tensors[n->output];
  int w8a8 = a->dtype == XPU_DT_I8;
  if (!xpu_validate_is_float(a->dtype) && !w8a8) return "MATMUL: a must be f32, f16 or (with an i8 b) i8";
  if (w8a8) {
    if (b->dtype != XPU_DT_I8) return "MATMUL: an i8 a needs an i8 b";
    if (!xpu_validate_pos_finite(n->fattr[1])) return "MATMUL: an i8 a needs a positive finite scale in fattr[1]";
    if (!(n->fattr[2] >= 0) || !(n->fattr[2] <= 3.40282346638528859812e+38F))
      return "MATMUL: the output grid scale fattr[2] must be 0 or positive and finite";
    if (a->rank > 0 && a->shape[a->rank - 1] >= ((int64_t)1 << 17))
      return "MATMUL: an i8 a needs K < 2^17 (exact int32 sums)";
    if (o->dtype != XPU_DT_F32 && o->dtype != XPU_DT_F16) return "MATMUL: an i8 a gives an f32 or f16 output";
  } else {
    if (n->fattr[1] != 0 || n->fattr[2] != 0) return "MATMUL: fattr[1] (a scale) and fattr[2] (output grid) need an i8 a";
    if (o->dtype != a->dtype) return "MATMUL: the output dtype must be a's";
  }
  if (n->n_inputs == 3) {
    const xpu_ir_tensor *s = xpu_ir_input(g, n, 2);
    if (b->dtype != XPU_DT_I8) return "MATMUL: per-channel scales (3rd input) need an i8 b";
    if (n->fattr[0] != 0) return "MATMUL: with per-channel scales fattr[0] must be 0";
    if (b->rank != 2 || s->dtype != XPU_DT_F32 || s->rank != 1 || s->shape[0] != b->shape[0])
      return "MATMUL: per-channel scales must be f32 [N]";
  } else if (b->dtype == XPU_DT_I8 && !xpu_validate_pos_finite(n->fattr[0])) {
    return "MATMUL: an i8 b needs a positive finite scale in fattr[0] (or per-channel scales)";
  }
  if (a->rank < 1 || b->rank < 2) return "MATMUL: a needs rank >= 1 and b rank >= 2";
  switch (b->dtype) {
  case XPU_DT_F32: case XPU_DT_F16: case XPU_DT_BF16: break;
  case XPU_DT_I8: case XPU_DT_Q8_0: case XPU_DT_Q4_0: case XPU_DT_Q4_K: case XPU_DT_Q5_K: case XPU_DT_Q6_K:
  case XPU_DT_Q2_K: case XPU_DT_Q3_K:
    if (b->rank != 2) return "MATMUL: a quantized or i8 b must be rank 2";
    break;
  default: return "MATMUL: b dtype not allowed";
  }
  int64_t K = a->shape[a->rank - 1], N = b->shape[b->rank - 2];
  if (b->shape[b->rank - 1] != K) return "MATMUL: inner dimensions differ (b is [N,K])";
  if (a->rank == 1) {
    if (b->rank != 2) return "MATMUL: a rank-1 a needs a rank-2 b";
    if (o->rank != 1 || o->shape[0] != N) return "MATMUL: a rank-1 a gives an output [N]";
    return NULL;
  }
  if (o->rank < 2 || !xpu_validate_broadcasts(a->shape, a->rank - 2, b->shape, b->rank - 2, o->shape, o->rank - 2))
    return "MATMUL: batch dimensions do not broadcast to the output's";
  if (o->shape[o->rank - 2] != a->shape[a->rank - 2] || o->shape[o->rank - 1] != N)
    return "MATMUL: the output is not [..., M, N]";
  return NULL;
}

static inline const char *xpu__validate_shadow(const xpu_ir_graph *g, const xpu_ir_node *n) {
  if (n->n_inputs != 2 && n->n_inputs != 3) return "SHADOW_MATMUL takes 2 or 3 inputs (x, wt [, ids])";
  const xpu_ir_tensor *x = xpu_ir_input(g, n, 0), *wt = xpu_ir_input(g, n, 1), *o = &g->tensors[n->output];
  if (!xpu_validate_is_float(x->dtype) || (x->rank != 1 && x->rank != 2))
    return "SHADOW_MATMUL: x must be f32 or f16 [M,K] or [K]";
  if (!xpu_validate_is_float(wt->dtype) || wt->rank != 2) return "SHADOW_MATMUL: wt must be f32 or f16 [C,N]";
  int64_t K = x->shape[x->rank - 1], C = wt->shape[0], N = wt->shape[1];
  if (n->n_inputs == 3) {
    const xpu_ir_tensor *ids = xpu_ir_input(g, n, 2);
    if (ids->dtype != XPU_DT_I32 || ids->rank != 1 || ids->shape[0] != C)
      return "SHADOW_MATMUL: ids must be i32 [C] (one per row of wt)";
  } else if (C != K) {
    return "SHADOW_MATMUL: without ids wt needs one row per input channel";
  }
  if (!(n->fattr[0] > 0)) return "SHADOW_MATMUL: the threshold fattr[0] must be positive";
  if (o->dtype != x->dtype || o->rank != x->rank || o->shape[o->rank - 1] != N ||
      (x->rank == 2 && o->shape[0] != x->shape[0]))
    return "SHADOW_MATMUL: the output must be [M,N] (or [N]) of x's dtype";
  return NULL;
}

static inline const char *xpu__validate_sparse_ffn(const xpu_ir_graph *g, const xpu_ir_node *n) {
  if (n->n_inputs != 3) return "SPARSE_FFN takes 3 inputs (x, bundles, idx)";
  const xpu_ir_tensor *x = xpu_ir_input(g, n, 0), *b = xpu_ir_input(g, n, 1), *idx = xpu_ir_input(g, n, 2);
  const xpu_ir_tensor *o = &g->tensors[n->output];
  if (!xpu_validate_is_float(x->dtype) || (x->rank != 1 && x->rank != 2))
    return "SPARSE_FFN: x must be f32 or f16 [M,D] or [D]";
  if (b->dtype != XPU_DT_F32 && b->dtype != XPU_DT_F16 && b->dtype != XPU_DT_Q8_0 && b->dtype != XPU_DT_Q4_0)
    return "SPARSE_FFN: bundles must be f32, f16, q8_0 or q4_0";
  if (b->rank != 2) return "SPARSE_FFN: bundles must be [S,R]";
  if (idx->dtype != XPU_DT_I32 || idx->rank != 1) return "SPARSE_FFN: idx must be i32 [K]";
  if (n->iattr[0] < 0 || n->iattr[0] > 2) return "SPARSE_FFN: activation iattr[0] must be 0 (ReLU), 1 (ReLU^2) or 2 (SiLU)";
  if (n->iattr[1] != 0 && n->iattr[1] != 1) return "SPARSE_FFN: iattr[1] (ungated) must be 0 or 1";
  int64_t D = x->shape[x->rank - 1], R = b->shape[1], seg = n->iattr[1] ? 2 : 3;
  if (D == 0 || R < seg * D) return "SPARSE_FFN: bundle rows cannot hold their segments of D values";
  if (xpu_validate_is_block(b->dtype) && (D % 32 != 0 || R % 32 != 0))
    return "SPARSE_FFN: quantized bundles need D and R multiples of 32";
  if (o->dtype != x->dtype || !xpu_validate_same_shape(x, o)) return "SPARSE_FFN: the output must be x's dtype and shape";
  return NULL;
}

static inline const char *xpu__validate_attention(const xpu_ir_graph *g, const xpu_ir_node *n) {
  if (n->n_inputs < 3 || n->n_inputs > 5) return "ATTENTION takes 3 to 5 inputs (q, k, v [, q_offset [, mask]])";
  const xpu_ir_tensor *q = xpu_ir_input(g, n, 0), *k = xpu_ir_input(g, n, 1), *v = xpu_ir_input(g, n, 2);
  const xpu_ir_tensor *o = &g->tensors[n->output];
  if (!xpu_validate_is_float(q->dtype)) return "ATTENTION: q must be f32 or f16";
  if (q->rank != 3 || k->rank != 3 || v->rank != 3) return "ATTENTION: q, k, v must be rank 3 [T,H,D]";
  for (int i = 0; i < 2; i++) {
    const xpu_ir_tensor *t = i ? v : k;
    if (t->dtype == XPU_DT_Q8_0 || t->dtype == XPU_DT_Q4_0) {
      if (t->shape[2] % 32 != 0) return "ATTENTION: a q8_0 or q4_0 k or v needs a head dim that is a multiple of 32";
    } else if (!xpu_validate_is_float(t->dtype)) {
      return "ATTENTION: k and v must be f32, f16, q8_0 or q4_0";
    }
  }
  if (!(n->fattr[1] >= 0) || n->fattr[1] > 3.40282346638528859812e+38F)
    return "ATTENTION: the soft-cap fattr[1] must be finite and >= 0";
  if (n->iattr[4] < 0) return "ATTENTION: the sliding window iattr[4] must be >= 0";
  if (n->iattr[4] > 0 && (n->iattr[0] != 1 || n->n_inputs == 5))
    return "ATTENTION: a sliding window needs causal attention and no mask";
  if (k->shape[0] != v->shape[0] || k->shape[1] != v->shape[1]) return "ATTENTION: k and v differ in length or heads";
  if (q->shape[2] != k->shape[2]) return "ATTENTION: q and k head dims differ";
  int64_t kvh = xpu_ir_attention_kv_heads(n, k->shape[1]);
  if (kvh < 0) return "ATTENTION: the kv head range lies outside k's heads";
  if (kvh == 0 || q->shape[1] % kvh != 0) return "ATTENTION: query heads not a multiple of kv heads";
  if (n->n_inputs >= 4) {
    const xpu_ir_tensor *qo = xpu_ir_input(g, n, 3);
    if (qo->dtype != XPU_DT_I32 || xpu_ir_numel(qo) != 1) return "ATTENTION: q_offset must be i32 [1]";
  }
  if (n->n_inputs == 5) {
    const xpu_ir_tensor *m = xpu_ir_input(g, n, 4);
    if (n->iattr[0] != 1) return "ATTENTION: a mask needs causal attention (iattr[0] = 1)";
    if (m->dtype != XPU_DT_I8 || m->rank != 2 || m->shape[0] != q->shape[0] || m->shape[1] != q->shape[0])
      return "ATTENTION: the mask must be i8 [Tq,Tq]";
  }
  if (o->dtype != q->dtype || o->rank != 3 || o->shape[0] != q->shape[0] || o->shape[1] != q->shape[1] ||
      o->shape[2] != v->shape[2])
    return "ATTENTION: the output must be [Tq,Hq,Dv] of q's dtype";
  return NULL;
}

static inline const char *xpu__validate_movement(const xpu_ir_graph *g, const xpu_ir_node *n) {
  const xpu_ir_tensor *x = xpu_ir_input(g, n, 0), *o = &g->tensors[n->output];
  switch (n->op) {
  case XPU_OP_RESHAPE:
    if (o->dtype != x->dtype) return "RESHAPE: the output dtype must be the input's";
    if (xpu_ir_numel(o) != xpu_ir_numel(x)) return "RESHAPE: changes the element count";
    return NULL;
  case XPU_OP_PERMUTE: {
    if (!xpu_validate_is_movable(x->dtype)) return "PERMUTE: dtype cannot be moved element-wise";
    if (o->dtype != x->dtype || o->rank != x->rank) return "PERMUTE: the output dtype or rank differs from the input's";
    int seen[XPU_MAX_RANK] = {0};
    for (uint32_t d = 0; d < x->rank; d++) {
      int64_t p = n->iattr[d];
      if (p < 0 || p >= (int64_t)x->rank || seen[p]) return "PERMUTE: iattr is not a permutation of the axes";
      seen[p] = 1;
      if (o->shape[d] != x->shape[p]) return "PERMUTE: the output shape does not follow the permutation";
    }
    return NULL;
  }
  case XPU_OP_SLICE: {
    if (!xpu_validate_is_movable(x->dtype)) return "SLICE: dtype cannot be moved element-wise";
    int64_t axis = n->iattr[0], start = n->iattr[1];
    if (axis < 0 || axis >= (int64_t)x->rank) return "SLICE: axis out of range";
    if (o->dtype != x->dtype || o->rank != x->rank) return "SLICE: the output dtype or rank differs from the input's";
    for (uint32_t d = 0; d < x->rank; d++)
      if ((int64_t)d != axis && o->shape[d] != x->shape[d]) return "SLICE: changes an axis other than iattr[0]";
    /* start <= 2^40 here, so start + len cannot overflow */
    if (start < 0 || start > x->shape[axis] || start + o->shape[axis] > x->shape[axis])
      return "SLICE: range out of bounds";
    return NULL;
  }
  default: { /* CONCAT */
    int64_t axis = n->iattr[0];
    if (axis < 0 || axis >= (int64_t)x->rank) return "CONCAT: axis out of range";
    if (o->dtype != x->dtype || o->rank != x->rank) return "CONCAT: the output dtype or rank differs from input 0's";
    int64_t total = 0;
    for (uint32_t i = 0; i < n->n_inputs; i++) {
      const xpu_ir_tensor *t = xpu_ir_input(g, n, i);
      if (!xpu_validate_is_movable(t->dtype)) return "CONCAT: dtype cannot be moved element-wise";
      if (t->dtype != x->dtype || t->rank != x->rank) return "CONCAT: an input differs in dtype or rank from input 0";
      for (uint32_t d = 0; d < x->rank; d++)
        if ((int64_t)d != axis && t->shape[d] != x->shape[d]) return "CONCAT: an input differs from input 0 off the axis";
      total += t->shape[axis]; /* at most 8 terms of <= 2^40 */
    }
    for (uint32_t d = 0; d < x->rank; d++)
      if ((int64_t)d != axis && o->shape[d] != x->shape[d]) return "CONCAT: the output differs from input 0 off the axis";
    if (o->shape[axis] != total) return "CONCAT: the output's length along the axis is not the inputs' sum";
    return NULL;
  }
  }
}

/*
 * Checks node n of a graph xpu_ir_parse accepted against its op's OPS.md rules. Returns NULL
 * when the node is well-formed, else a static string saying why not (starting with the op's
 * name). Afterwards xpu_ir_input(g, n, i) is non-NULL for every input the op requires.
 */
static inline const char *xpu_validate_node(const xpu_ir_graph *g, const xpu_ir_node *n) {
  if (!g || !n) return "null graph or node";
  const xpu_ir_tensor *o = &g->tensors[n->output];
  const xpu_ir_tensor *a = xpu_ir_input(g, n, 0), *b = xpu_ir_input(g, n, 1);
  uint32_t op = n->op;
  switch (op) {
  case XPU_OP_ADD: case XPU_OP_SUB: case XPU_OP_MUL: case XPU_OP_DIV:
    if (n->n_inputs != 2) return "binary op takes 2 inputs";
    if (!xpu_validate_is_float(a->dtype)) return "binary op: inputs must be f32 or f16";
    if (a->dtype != b->dtype) return "binary op: input dtypes differ";
    if (o->dtype != a->dtype) return "binary op: the output dtype must be the inputs'";
    if (!xpu_validate_broadcasts(a->shape, a->rank, b->shape, b->rank, o->shape, o->rank))
      return "binary op: the input shapes do not broadcast to the output shape";
    return NULL;
  case XPU_OP_SILU: case XPU_OP_GELU: case XPU_OP_RELU: case XPU_OP_EXP: case XPU_OP_NEG: case XPU_OP_SCALE:
  case XPU_OP_TANH: case XPU_OP_RMS_NORM: case XPU_OP_LAYER_NORM: case XPU_OP_SOFTMAX:
    if (n->n_inputs != 1) return "unary op takes 1 input";
    if (!xpu_validate_is_float(a->dtype)) return "unary op: the input must be f32 or f16";
    if ((op == XPU_OP_RMS_NORM || op == XPU_OP_LAYER_NORM || op == XPU_OP_SOFTMAX) && a->rank == 0)
      return "norm or softmax needs rank >= 1";
    if (op == XPU_OP_SOFTMAX && n->iattr[0] != 0 && a->rank < 2) return "SOFTMAX: causal softmax needs rank >= 2";
    if (o->dtype != a->dtype || !xpu_validate_same_shape(a, o)) return "unary op: the output must be the input's dtype and shape";
    return NULL;
  case XPU_OP_MATMUL: return xpu__validate_matmul(g, n);
  case XPU_OP_SHADOW_MATMUL: return xpu__validate_shadow(g, n);
  case XPU_OP_SPARSE_FFN: return xpu__validate_sparse_ffn(g, n);
  case XPU_OP_ATTENTION: return xpu__validate_attention(g, n);
  case XPU_OP_ROPE: {
    if (n->n_inputs != 2) return "ROPE takes 2 inputs (x, pos)";
    if (!xpu_validate_is_float(a->dtype)) return "ROPE: x must be f32 or f16";
    if (a->rank != 3 && a->rank != 4) return "ROPE: x must be [T,H,D] or [B,T,H,D]";
    int64_t T = a->shape[a->rank - 3], D = a->shape[a->rank - 1];
    if (b->dtype != XPU_DT_I32 || b->rank != 1 || b->shape[0] != T) return "ROPE: positions must be i32 [T]";
    int64_t nrot = n->iattr[1] ? n->iattr[1] : D;
    if (nrot < 0 || nrot > D || nrot % 2 != 0) return "ROPE: rotary dims iattr[1] must be even and <= the head dim";
    if (n->iattr[0] != 0 && n->iattr[0] != 2) return "ROPE: mode iattr[0] must be 0 (normal) or 2 (NeoX)";
    if (o->dtype != a->dtype || !xpu_validate_same_shape(a, o)) return "ROPE: the output must be x's dtype and shape";
    return NULL;
  }
  case XPU_OP_GET_ROWS:
    if (n->n_inputs != 2) return "GET_ROWS takes 2 inputs (table, ids)";
    if (a->rank != 2) return "GET_ROWS: the table must be rank 2";
    if (!xpu_validate_is_float(a->dtype) && a->dtype != XPU_DT_BF16 && a->dtype != XPU_DT_I8 &&
        !xpu_validate_is_block(a->dtype))
      return "GET_ROWS: table dtype not allowed";
    if (b->dtype != XPU_DT_I32 || b->rank > XPU_MAX_RANK - 1) return "GET_ROWS: ids must be i32 of rank <= 3";
    if (o->dtype != XPU_DT_F32 || o->rank != b->rank + 1 || o->shape[b->rank] != a->shape[1])
      return "GET_ROWS: the output must be f32 [ids..., K]";
    for (uint32_t d = 0; d < b->rank; d++)
      if (o->shape[d] != b->shape[d]) return "GET_ROWS: the output must be f32 [ids..., K]";
    return NULL;
  case XPU_OP_CAST:
    if (n->n_inputs != 1) return "CAST takes 1 input";
    if (!(xpu_validate_is_float(a->dtype) || a->dtype == XPU_DT_BF16 || a->dtype == XPU_DT_I32) ||
        !(xpu_validate_is_float(o->dtype) || o->dtype == XPU_DT_BF16))
      return "CAST: only f32, f16, bf16 and i32 to f32, f16, bf16";
    if (!xpu_validate_same_shape(a, o)) return "CAST: the output shape differs from the input's";
    return NULL;
  case XPU_OP_QUANTIZE:
    if (n->n_inputs != 1) return "QUANTIZE takes 1 input";
    if (a->dtype != XPU_DT_F32) return "QUANTIZE: needs an f32 input";
    if (!xpu_validate_is_block(o->dtype) && o->dtype != XPU_DT_I8) return "QUANTIZE: the output must be quantized or i8";
    if (o->dtype == XPU_DT_I8 && !(n->fattr[0] > 0)) return "QUANTIZE: i8 needs a positive scale in fattr[0]";
    if (!xpu_validate_same_shape(a, o)) return "QUANTIZE: the output shape differs from the input's";
    return NULL;
  case XPU_OP_DEQUANTIZE:
    if (n->n_inputs != 1) return "DEQUANTIZE takes 1 input";
    if (!xpu_validate_is_block(a->dtype) && a->dtype != XPU_DT_I8)
      return "DEQUANTIZE: the input must be q8_0, q4_0, a K-quant or i8";
    if (o->dtype != XPU_DT_F32 || !xpu_validate_same_shape(a, o)) return "DEQUANTIZE: the output must be f32 of the input's shape";
    return NULL;
  case XPU_OP_RESHAPE: case XPU_OP_PERMUTE: case XPU_OP_SLICE:
    if (n->n_inputs != 1) return "data-movement op takes 1 input";
    return xpu__validate_movement(g, n);
  case XPU_OP_CONCAT:
    if (n->n_inputs < 1) return "CONCAT takes 1 to 8 inputs";
    return xpu__validate_movement(g, n);
  }
  return "unknown op";
}

#endif /* XPU_VALIDATE_H */
