/*
 * check.c: which nodes the kernels run. op_support answers from dtypes alone; node_check is
 * authoritative (graph_analyze, graph_prepare) and names the reason for every refusal.
 */
#include <stdio.h>
#include <string.h>

#include "ocl.h"
#include "graph.h"

static int isf(uint32_t dt) { return dt == XPU_DT_F32 || dt == XPU_DT_F16 || dt == XPU_DT_BF16; }
static int isq(uint32_t dt) { return dt == XPU_DT_Q8_0 || dt == XPU_DT_Q4_0; }
/* K-quants: read through ldk(), dequantized in the kernel; QUANTIZE to them is not implemented */
static int isk(uint32_t dt) { return dt >= XPU_DT_Q4_K && dt <= XPU_DT_Q3_K; }
static int ismove(uint32_t dt) { return isf(dt) || dt == XPU_DT_I32 || dt == XPU_DT_I8; }
static int isw(uint32_t dt) { return isf(dt) || isq(dt) || isk(dt) || dt == XPU_DT_I8; }

uint32_t ocl_op_static(const xpu_op_query *q) {
  uint32_t in = q->dtype_in, w = q->dtype_weight, o = q->dtype_out;
  int ok = 0;
  switch (q->op) {
  case XPU_OP_ADD: case XPU_OP_SUB: case XPU_OP_MUL: case XPU_OP_DIV: case XPU_OP_SILU:
  case XPU_OP_GELU: case XPU_OP_RELU: case XPU_OP_EXP: case XPU_OP_NEG: case XPU_OP_SCALE:
  case XPU_OP_RMS_NORM: case XPU_OP_LAYER_NORM: case XPU_OP_SOFTMAX: case XPU_OP_ROPE:
    ok = isf(in) && isf(o);
    break;
  case XPU_OP_MATMUL: ok = isf(in) && isf(o) && (w == 0 || isw(w)); break;
  case XPU_OP_ATTENTION:
    /* the local-memory need depends on the head sizes: analyze decides */
    return isf(in) && isf(o) ? XPU_VERDICT_MAYBE : XPU_VERDICT_NO;
  case XPU_OP_GET_ROWS: ok = isw(in) && o == XPU_DT_F32; break;
  case XPU_OP_CAST: ok = (isf(in) || in == XPU_DT_I32) && isf(o); break;
  case XPU_OP_QUANTIZE: ok = in == XPU_DT_F32 && (isq(o) || o == XPU_DT_I8); break;
  case XPU_OP_DEQUANTIZE: ok = (isq(in) || isk(in) || in == XPU_DT_I8) && o == XPU_DT_F32; break;
  case XPU_OP_RESHAPE: ok = in == o && in != XPU_DT_INVALID && in < XPU_DT_COUNT; break;
  case XPU_OP_PERMUTE: case XPU_OP_SLICE: case XPU_OP_CONCAT: ok = ismove(in) && in == o; break;
  default: ok = 0;
  }
  return ok && q->rank <= XPU_MAX_RANK ? XPU_VERDICT_YES : XPU_VERDICT_NO;
}

#define NO(...)                                                                                  \
  do {                                                                                           \
    snprintf(why, cap, __VA_ARGS__);                                                             \
    return 0;                                                                                    \
  } while (0)

static int same_shape(const xpu_ir_tensor *a, const xpu_ir_tensor *b) {
  if (a->rank != b->rank) return 0;
  for (uint32_t d = 0; d < a->rank; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}

/* numpy broadcasting of x into out */
static int broadcasts(const xpu_ir_tensor *x, const xpu_ir_tensor *out) {
  if (x->rank > out->rank) return 0;
  for (uint32_t i = 0; i < x->rank; i++) {
    int64_t xd = x->shape[x->rank - 1 - i], od = out->shape[out->rank - 1 - i];
    if (xd != od && xd != 1) return 0;
  }
  return 1;
}

static int64_t lastdim(const xpu_ir_tensor *t) { return t->rank ? t->shape[t->rank - 1] : 1; }

/* the constant's buffer is this context's and holds its bytes, at an aligned offset */
static int const_ok(ocl_ctx *c, const xpu_ir_tensor *t, char *why, size_t cap) {
  ocl_buf *b = xpu_reg_get(&P.reg, t->const_buffer, T_BUF);
  if (!b) NO("constant refers to an invalid buffer handle");
  if (b->ctx != c) NO("constant lives in another context's buffer");
  uint64_t nb = xpu_ir_nbytes(t);
  if (t->const_offset > b->size || nb > b->size - t->const_offset)
    NO("constant [%llu, +%llu) does not fit its %llu-byte buffer",
       (unsigned long long)t->const_offset, (unsigned long long)nb, (unsigned long long)b->size);
  if (!isq(t->dtype) && !isk(t->dtype) && t->const_offset % xpu_dtype_block_bytes(t->dtype) != 0)
    NO("constant offset %llu is not a multiple of its element size",
       (unsigned long long)t->const_offset);
  return 1;
}

int ocl_node_check(ocl_ctx *c, const xpu_ir_graph *g, uint32_t ni, char *why, size_t cap) {
  const xpu_ir_node *n = &g->nodes[ni];
  const xpu_ir_tensor *o = &g->tensors[n->output];
  const xpu_ir_tensor *a = xpu_ir_input(g, n, 0), *b = xpu_ir_input(g, n, 1);
  for (uint32_t i = 0; i < n->n_inputs; i++) {
    const xpu_ir_tensor *t = &g->tensors[n->inputs[i]];
    if (t->kind == XPU_TENSOR_CONST && c && !const_ok(c, t, why, cap)) return 0;
  }
  if (!a) NO("%s has no input", xpu_op_name(n->op));
  xpu_op_query q = {sizeof q, n->op, a->dtype, 0, o->dtype, o->rank};
  if (n->op == XPU_OP_MATMUL && b) q.dtype_weight = b->dtype;
  if (n->op == XPU_OP_GET_ROWS) q.dtype_weight = a->dtype;
  if (ocl_op_static(&q) == XPU_VERDICT_NO)
    NO("%s: dtypes %u -> %u are not supported", xpu_op_name(n->op), a->dtype, o->dtype);
  switch (n->op) {
  case XPU_OP_ADD: case XPU_OP_SUB: case XPU_OP_MUL: case XPU_OP_DIV:
    if (n->n_inputs != 2 || !isf(b->dtype)) NO("needs two float inputs");
    if (!broadcasts(a, o) || !broadcasts(b, o)) NO("inputs do not broadcast to the output");
    for (uint32_t d = 0; d < o->rank; d++) {
      int64_t ad = d + a->rank >= o->rank ? a->shape[d + a->rank - o->rank] : 1;
      int64_t bd = d + b->rank >= o->rank ? b->shape[d + b->rank - o->rank] : 1;
      if (o->shape[d] != (ad > bd ? ad : bd) && !(ad == 0 || bd == 0))
        NO("output dim %u is not the broadcast of the inputs", d);
    }
    return 1;
  case XPU_OP_SILU: case XPU_OP_GELU: case XPU_OP_RELU: case XPU_OP_EXP: case XPU_OP_NEG:
  case XPU_OP_SCALE: case XPU_OP_RMS_NORM: case XPU_OP_LAYER_NORM: case XPU_OP_SOFTMAX:
  case XPU_OP_CAST: case XPU_OP_DEQUANTIZE:
    if (!same_shape(a, o)) NO("output shape differs from the input's");
    return 1;
  case XPU_OP_QUANTIZE:
    if (!same_shape(a, o)) NO("output shape differs from the input's");
    if (o->dtype == XPU_DT_I8 && !(n->fattr[0] > 0.0f)) NO("I8 scale fattr[0] must be > 0");
    return 1;
  case XPU_OP_MATMUL: {
    if (n->n_inputs != 2) NO("needs a and b");
    if (a->rank < 1 || b->rank < 2) NO("a must have rank >= 1 and b rank >= 2");
    if (!isf(b->dtype) && b->rank != 2) NO("a quantized or I8 b must be rank 2");
    int64_t K = lastdim(a), N = b->shape[b->rank - 2];
    if (b->shape[b->rank - 1] != K) NO("K of a (%lld) and b differ", (long long)K);
    if (isq(b->dtype) && K % 32) NO("K must be a multiple of 32 for a quantized b");
    if (isk(b->dtype) && K % 256) NO("K must be a multiple of 256 for a K-quant b");
    if (b->dtype == XPU_DT_I8 && !(n->fattr[0] > 0.0f)) NO("I8 b needs its scale in fattr[0]");
    if (a->rank == 1) {
      if (o->rank != 1 || o->shape[0] != N) NO("output must be [N]");
      return 1;
    }
    if (o->rank < 2 || o->shape[o->rank - 1] != N || o->shape[o->rank - 2] != a->shape[a->rank - 2])
      NO("output must be [..., M, N]");
    if (o->rank > 4 || o->rank < a->rank || o->rank < b->rank) NO("output rank mismatch");
    for (uint32_t i = 2; i < o->rank; i++) {
      int64_t od = o->shape[o->rank - 1 - i];
      int64_t ad = i < a->rank ? a->shape[a->rank - 1 - i] : 1;
      int64_t bd = i < b->rank ? b->shape[b->rank - 1 - i] : 1;
      if ((ad != od && ad != 1) || (bd != od && bd != 1)) NO("batch dims do not broadcast");
    }
    return 1;
  }
  case XPU_OP_ROPE: {
    if (n->n_inputs != 2 || b->dtype != XPU_DT_I32 || b->rank != 1) NO("needs x and I32 pos [T]");
    if (a->rank != 3 && a->rank != 4) NO("x must be [T, H, D] or [B, T, H, D]");
    if (!same_shape(a, o)) NO("output shape differs from the input's");
    int64_t D = a->shape[a->rank - 1], T = a->shape[a->rank - 3], nrot = n->iattr[1];
    if (b->shape[0] != T) NO("pos has %lld entries for T = %lld", (long long)b->shape[0], (long long)T);
    if (nrot == 0) nrot = D;
    if (nrot < 0 || nrot > D || nrot % 2) NO("n_rot %lld must be even and <= D", (long long)nrot);
    if (n->iattr[0] != 0 && n->iattr[0] != 2) NO("rope mode %lld unknown", (long long)n->iattr[0]);
    return 1;
  }
  case XPU_OP_ATTENTION: {
    const xpu_ir_tensor *v = xpu_ir_input(g, n, 2), *qo = xpu_ir_input(g, n, 3);
    if (n->n_inputs < 3 || n->n_inputs > 5) NO("needs q, k, v [, q_offset [, mask]]");
    if (a->rank != 3 || b->rank != 3 || v->rank != 3) NO("q, k, v must be rank 3");
    if (!isf(b->dtype) || !isf(v->dtype)) NO("k and v must be float");
    if (qo && (qo->dtype != XPU_DT_I32 || xpu_ir_numel(qo) != 1)) NO("q_offset must be I32 [1]");
    if (n->n_inputs == 5) {
      const xpu_ir_tensor *mk = xpu_ir_input(g, n, 4);
      if (n->iattr[0] != 1) NO("a mask needs causal attention");
      if (mk->dtype != XPU_DT_I8 || mk->rank != 2 || mk->shape[0] != a->shape[0] || mk->shape[1] != a->shape[0])
        NO("mask must be I8 [Tq, Tq]");
    }
    int64_t Hq = a->shape[1], Hkv = b->shape[1], D = a->shape[2], Dv = v->shape[2];
    if (b->shape[2] != D) NO("q and k head sizes differ");
    if (v->shape[0] != b->shape[0] || v->shape[1] != Hkv) NO("k and v disagree on [Tk, Hkv]");
    int64_t kvh = xpu_ir_attention_kv_heads(n, Hkv);
    if (kvh < 0) NO("kv head range outside k's heads");
    if (kvh == 0 || Hq % kvh) NO("Hq %% Hkv != 0");
    if (o->rank != 3 || o->shape[0] != a->shape[0] || o->shape[1] != Hq || o->shape[2] != Dv)
      NO("output must be [Tq, Hq, Dv]");
    if (c && (uint64_t)(D + Dv + 64) * sizeof(float) > c->dev->local_mem)
      NO("head sizes %lld + %lld exceed the device's %llu bytes of local memory", (long long)D,
         (long long)Dv, (unsigned long long)c->dev->local_mem);
    return 1;
  }
  case XPU_OP_GET_ROWS: {
    if (n->n_inputs != 2 || b->dtype != XPU_DT_I32) NO("needs a table and I32 ids");
    if (a->rank != 2) NO("table must be [R, K]");
    if (a->dtype == XPU_DT_I8 && !(n->fattr[0] > 0.0f)) NO("I8 table needs fattr[0] scale");
    if (xpu_ir_numel(o) != xpu_ir_numel(b) * a->shape[1] || lastdim(o) != a->shape[1])
      NO("output must be [..ids, K]");
    return 1;
  }
  case XPU_OP_RESHAPE:
    if (xpu_ir_numel(a) != xpu_ir_numel(o)) NO("element counts differ");
    return 1;
  case XPU_OP_PERMUTE: {
    if (a->rank != o->rank) NO("rank changes");
    uint32_t seen = 0;
    for (uint32_t d = 0; d < o->rank; d++) {
      int64_t p = n->iattr[d];
      if (p < 0 || p >= (int64_t)a->rank || (seen >> p) & 1) NO("iattr is not a permutation");
      seen |= 1u << p;
      if (o->shape[d] != a->shape[p]) NO("output dim %u is not x dim %lld", d, (long long)p);
    }
    return 1;
  }
  case XPU_OP_SLICE: {
    int64_t ax = n->iattr[0], st = n->iattr[1];
    if (a->rank != o->rank || ax < 0 || ax >= (int64_t)a->rank) NO("bad axis");
    if (st < 0 || st + o->shape[ax] > a->shape[ax]) NO("slice out of range");
    for (uint32_t d = 0; d < a->rank; d++)
      if ((int64_t)d != ax && a->shape[d] != o->shape[d]) NO("non-axis dims differ");
    return 1;
  }
  case XPU_OP_CONCAT: {
    int64_t ax = n->iattr[0], sum = 0;
    if (ax < 0 || ax >= (int64_t)o->rank) NO("bad axis");
    for (uint32_t i = 0; i < n->n_inputs; i++) {
      const xpu_ir_tensor *t = xpu_ir_input(g, n, i);
      if (t->dtype != o->dtype || t->rank != o->rank) NO("input %u dtype or rank differs", i);
      for (uint32_t d = 0; d < o->rank; d++)
        if ((int64_t)d != ax && t->shape[d] != o->shape[d]) NO("input %u dims differ", i);
      sum += t->shape[ax];
    }
    if (sum != o->shape[ax]) NO("axis lengths do not add up");
    return 1;
  }
  }
  NO("op %u is not in op set v1", n->op);
}
