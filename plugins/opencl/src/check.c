/*
 * check.c: which nodes the kernels run. op_support answers from dtypes alone; node_check is
 * authoritative (graph_analyze, graph_prepare) and names the reason for every refusal: the
 * OPS.md rules through the shared abi/xpu_validate.h, then what these kernels add.
 */
#include <stdio.h>
#include <string.h>

#include "ocl.h"
#include "graph.h"
#include "xpu_validate.h"

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
  case XPU_OP_TANH:
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
  for (uint32_t i = 0; i < n->n_inputs; i++) {
    const xpu_ir_tensor *t = &g->tensors[n->inputs[i]];
    if (t->kind == XPU_TENSOR_CONST && c && !const_ok(c, t, why, cap)) return 0;
  }
  /* arity, shapes and attributes (abi/OPS.md): after this every input the op takes exists */
  const char *bad = xpu_validate_node(g, n);
  if (bad) NO("%s", bad);
  const xpu_ir_tensor *a = xpu_ir_input(g, n, 0), *b = xpu_ir_input(g, n, 1);
  /* what the kernels add to the rules: dtypes, one weight scale, local memory */
  xpu_op_query q = {sizeof q, n->op, a->dtype, 0, o->dtype, o->rank};
  if (n->op == XPU_OP_MATMUL) q.dtype_weight = b->dtype;
  if (n->op == XPU_OP_GET_ROWS) q.dtype_weight = a->dtype;
  if (ocl_op_static(&q) == XPU_VERDICT_NO)
    NO("%s: dtypes %u -> %u are not supported", xpu_op_name(n->op), a->dtype, o->dtype);
  switch (n->op) {
  case XPU_OP_MATMUL:
    if (n->n_inputs != 2) NO("per-channel weight scales are not supported");
    return 1;
  case XPU_OP_ATTENTION: {
    int64_t D = a->shape[2], Dv = xpu_ir_input(g, n, 2)->shape[2];
    if (c && (uint64_t)(D + Dv + 64) * sizeof(float) > c->dev->local_mem)
      NO("head sizes %lld + %lld exceed the device's %llu bytes of local memory", (long long)D,
         (long long)Dv, (unsigned long long)c->dev->local_mem);
    return 1;
  }
  case XPU_OP_GET_ROWS:
    if (a->dtype == XPU_DT_I8 && !(n->fattr[0] > 0.0f)) NO("I8 table needs fattr[0] scale");
    return 1;
  }
  return 1;
}
