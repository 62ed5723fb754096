/*
 * qnn_check.c: which xpu IR nodes the QNN plugin can express as QNN ops, and at what precision.
 * op_support and graph_analyze answer from here, and qnn_lower.c emits exactly what passes, so
 * a node that analyze accepts is a node prepare can build (no capability lie).
 */
#include <stdio.h>
#include <string.h>

#include "qnn_internal.h"

#define REFUSE(...)                                                                              \
  do {                                                                                           \
    snprintf(reason, cap, __VA_ARGS__);                                                          \
    return 0;                                                                                    \
  } while (0)

Qnn_DataType_t qnn_dtype_of(uint32_t dt) {
  switch (dt) {
  case XPU_DT_F32: return QNN_DATATYPE_FLOAT_32;
  case XPU_DT_F16: return QNN_DATATYPE_FLOAT_16;
  case XPU_DT_I32: return QNN_DATATYPE_INT_32;
  case XPU_DT_I8: return QNN_DATATYPE_SFIXED_POINT_8;
  default: return QNN_DATATYPE_UNDEFINED;
  }
}

static int is_float(uint32_t dt) { return dt == XPU_DT_F32 || dt == XPU_DT_F16; }

static int is_graph_input(const xpu_ir_graph *ir, uint32_t t) {
  for (uint32_t i = 0; i < ir->header->n_inputs; i++)
    if (ir->inputs[i] == t) return 1;
  return 0;
}

/* A QNN tensor has one quantization encoding, so every I8 use of an xpu tensor must agree on the
 * scale (QUANTIZE's output, DEQUANTIZE/MATMUL/GET_ROWS inputs carry it in fattr[0]). Tensors
 * only moved around (RESHAPE, ...) take the scale of their source. 0: conflicting scales. */
int qnn_i8_scale(const xpu_ir_graph *ir, uint32_t t, float *scale);
int qnn_i8_scale(const xpu_ir_graph *ir, uint32_t t, float *scale) {
  float s = 0;
  for (uint32_t n = 0; n < ir->header->n_nodes; n++) {
    const xpu_ir_node *nd = &ir->nodes[n];
    float here = 0;
    if (nd->output == t && nd->op == XPU_OP_QUANTIZE) here = nd->fattr[0];
    if (nd->output == t && (nd->op == XPU_OP_RESHAPE || nd->op == XPU_OP_PERMUTE || nd->op == XPU_OP_SLICE ||
                            nd->op == XPU_OP_CONCAT)) {
      float in = 0;
      if (!qnn_i8_scale(ir, nd->inputs[0], &in)) return 0;
      here = in;
    }
    if ((nd->op == XPU_OP_DEQUANTIZE && nd->inputs[0] == t) ||
        ((nd->op == XPU_OP_MATMUL || nd->op == XPU_OP_GET_ROWS) && nd->n_inputs > 1 && nd->inputs[1] == t) ||
        (nd->op == XPU_OP_GET_ROWS && nd->inputs[0] == t))
      here = nd->fattr[0];
    if (here > 0) {
      if (s > 0 && s != here) return 0;
      s = here;
    }
  }
  *scale = s > 0 ? s : 1.0f; /* bytes only moved: any encoding keeps them */
  return 1;
}

int qnn_w8a8(const xpu_ir_graph *ir, const xpu_ir_node *n, uint32_t *quantized_a) {
  if (n->op != XPU_OP_MATMUL || n->n_inputs != 2) return 0;
  const xpu_ir_tensor *a = &ir->tensors[n->inputs[0]], *b = &ir->tensors[n->inputs[1]];
  if (b->dtype != XPU_DT_I8 || b->rank != 2 || a->kind != XPU_TENSOR_VALUE || a->rank < 2) return 0;
  for (uint32_t i = 0; i < ir->header->n_nodes; i++) {
    const xpu_ir_node *p = &ir->nodes[i];
    if (p->output != n->inputs[0]) continue;
    if (p->op != XPU_OP_DEQUANTIZE || ir->tensors[p->inputs[0]].dtype != XPU_DT_I8) return 0;
    if (quantized_a) *quantized_a = p->inputs[0];
    return 1;
  }
  return 0;
}

static int shape_ok(const xpu_ir_tensor *t, char *reason, size_t cap) {
  for (uint32_t d = 0; d < t->rank; d++) {
    if (t->shape[d] == 0) REFUSE("zero-size tensors cannot be built on QNN");
    if (t->shape[d] > 0x7FFFFFFF) REFUSE("dimension does not fit QNN's uint32 dims");
  }
  if (t->dtype == XPU_DT_BF16) REFUSE("BF16 is not a QNN data type");
  if (t->dtype == XPU_DT_Q8_0 || t->dtype == XPU_DT_Q4_0)
    REFUSE("GGUF block formats (Q8_0/Q4_0) have no QNN encoding; use per-tensor I8");
  return 1;
}

static uint32_t float_prec(uint32_t dt, int float_as_f16) {
  return (dt == XPU_DT_F16 || float_as_f16) ? XPU_PREC_F16 : XPU_PREC_F32;
}

int qnn_node_check(const xpu_ir_graph *ir, uint32_t node, int float_as_f16, uint32_t *precision, char *reason,
                   size_t cap) {
  const xpu_ir_node *n = &ir->nodes[node];
  const xpu_ir_tensor *out = &ir->tensors[n->output];
  const xpu_ir_tensor *x = n->n_inputs ? &ir->tensors[n->inputs[0]] : NULL;
  *precision = XPU_PREC_DEFAULT;
  reason[0] = 0;
  if (!x) REFUSE("node without inputs");
  if (!shape_ok(out, reason, cap)) return 0;
  for (uint32_t i = 0; i < n->n_inputs; i++) {
    const xpu_ir_tensor *t = &ir->tensors[n->inputs[i]];
    int weight = (n->op == XPU_OP_MATMUL && i == 1) || (n->op == XPU_OP_GET_ROWS && i == 0);
    if (weight && (t->dtype == XPU_DT_Q8_0 || t->dtype == XPU_DT_Q4_0))
      REFUSE("%s weight in a GGUF block format: QNN has only per-tensor/per-axis scale-offset encodings",
             xpu_op_name(n->op));
    if (!shape_ok(t, reason, cap)) return 0;
    if (t->dtype == XPU_DT_I8) {
      float s;
      if (!qnn_i8_scale(ir, n->inputs[i], &s)) REFUSE("I8 tensor used with two different scales");
    }
  }
  if (out->dtype == XPU_DT_I8) {
    float s;
    if (!qnn_i8_scale(ir, n->output, &s)) REFUSE("I8 tensor used with two different scales");
  }
  if (out->rank > 4) REFUSE("rank > 4");
  switch (n->op) {
  case XPU_OP_ADD: case XPU_OP_SUB: case XPU_OP_MUL: case XPU_OP_DIV:
    if (!is_float(x->dtype) || ir->tensors[n->inputs[1]].dtype != x->dtype || out->dtype != x->dtype)
      REFUSE("%s needs F32/F16 operands of one dtype", xpu_op_name(n->op));
    break;
  case XPU_OP_SILU: case XPU_OP_GELU: case XPU_OP_RELU: case XPU_OP_EXP: case XPU_OP_NEG: case XPU_OP_SCALE:
  case XPU_OP_RMS_NORM: case XPU_OP_LAYER_NORM:
    if (!is_float(x->dtype) || out->dtype != x->dtype) REFUSE("%s needs F32/F16", xpu_op_name(n->op));
    if ((n->op == XPU_OP_RMS_NORM || n->op == XPU_OP_LAYER_NORM) && x->rank == 0) REFUSE("norm of a scalar");
    break;
  case XPU_OP_SOFTMAX:
    if (!is_float(x->dtype) || out->dtype != x->dtype) REFUSE("SOFTMAX needs F32/F16");
    if (x->rank == 0) REFUSE("SOFTMAX of a scalar");
    if (n->iattr[0] == 1 && n->fattr[0] < 0) REFUSE("causal SOFTMAX with a negative scale");
    break;
  case XPU_OP_MATMUL: {
    const xpu_ir_tensor *b = &ir->tensors[n->inputs[1]];
    if (!is_float(x->dtype) || out->dtype != x->dtype) REFUSE("MATMUL needs an F32/F16 activation");
    if (!(is_float(b->dtype) || (b->dtype == XPU_DT_I8 && b->rank == 2)))
      REFUSE("MATMUL weight must be F32/F16 or a rank-2 per-tensor I8");
    if (b->rank < 2) REFUSE("MATMUL b of rank < 2");
    if (x->rank <= 1 && b->rank != 2) REFUSE("MATMUL of a vector with a batched b");
    if (b->dtype == XPU_DT_I8 && !(n->fattr[0] > 0)) REFUSE("I8 weight without a positive scale");
    if (qnn_w8a8(ir, n, NULL)) {
      *precision = XPU_PREC_INT8; /* W8A8: both operands stay int8, int32 accumulation */
      return 1;
    }
    break;
  }
  case XPU_OP_ROPE: {
    const xpu_ir_tensor *pos = &ir->tensors[n->inputs[1]];
    if (!is_float(x->dtype) || out->dtype != x->dtype || (x->rank != 3 && x->rank != 4))
      REFUSE("ROPE needs F32/F16 x of rank 3 or 4");
    if (pos->dtype != XPU_DT_I32) REFUSE("ROPE positions must be I32");
    int64_t d = x->shape[x->rank - 1], nr = n->iattr[1] ? n->iattr[1] : d;
    if (n->iattr[0] != 0 && n->iattr[0] != 2) REFUSE("ROPE mode %lld (only normal 0 and NeoX 2)", (long long)n->iattr[0]);
    if (nr <= 0 || nr > d || nr % 2) REFUSE("ROPE n_rot must be even and <= D");
    break;
  }
  case XPU_OP_ATTENTION: {
    /* op set v2's tree mask: the lowering does not apply it yet (h/qnn-htp adds it) */
    if (n->n_inputs > 4) REFUSE("ATTENTION with a tree mask is not lowered yet");
    if (n->n_inputs > 3) {
      const xpu_ir_tensor *qo = &ir->tensors[n->inputs[3]];
      if (qo->dtype != XPU_DT_I32 || xpu_ir_numel(qo) != 1) REFUSE("ATTENTION q_offset must be I32 [1]");
    }
    const xpu_ir_tensor *k = &ir->tensors[n->inputs[1]], *v = &ir->tensors[n->inputs[2]];
    if (!is_float(x->dtype) || !is_float(k->dtype) || !is_float(v->dtype) || out->dtype != x->dtype)
      REFUSE("ATTENTION needs F32/F16 q, k, v");
    if (x->rank != 3 || k->rank != 3 || v->rank != 3) REFUSE("ATTENTION needs rank-3 q, k, v");
    if (n->iattr[0] == 1 && n->fattr[0] < 0) REFUSE("causal ATTENTION with a negative scale");
    if (n->iattr[0] == 1 && n->n_inputs <= 3 && x->shape[0] + n->iattr[1] < 1)
      REFUSE("causal ATTENTION where no query sees a key");
    break;
  }
  case XPU_OP_GET_ROWS: {
    const xpu_ir_tensor *ids = &ir->tensors[n->inputs[1]];
    if (!(is_float(x->dtype) || x->dtype == XPU_DT_I8) || x->rank != 2) REFUSE("GET_ROWS table must be F32/F16/I8 [R,K]");
    if (ids->dtype != XPU_DT_I32 || out->dtype != XPU_DT_F32) REFUSE("GET_ROWS needs I32 ids and an F32 output");
    if (ids->rank == 0 || ids->rank > 3) REFUSE("GET_ROWS ids of rank 0 or > 3");
    if (ids->kind == XPU_TENSOR_VALUE || !is_graph_input(ir, n->inputs[1]))
      if (ids->kind != XPU_TENSOR_CONST)
        REFUSE("GET_ROWS ids computed in the graph: QNN cannot report an id out of range");
    if (x->dtype == XPU_DT_I8 && !(n->fattr[0] > 0)) REFUSE("I8 table without a positive scale");
    *precision = XPU_PREC_DEFAULT;
    return 1;
  }
  case XPU_OP_CAST:
    if (!(is_float(x->dtype) || x->dtype == XPU_DT_I32) || !is_float(out->dtype))
      REFUSE("CAST supported between F32/F16 and from I32");
    *precision = XPU_PREC_DEFAULT;
    return 1;
  case XPU_OP_QUANTIZE:
    if (!is_float(x->dtype) || out->dtype != XPU_DT_I8 || !(n->fattr[0] > 0))
      REFUSE("QUANTIZE supported from F32/F16 to per-tensor I8 with a positive scale");
    *precision = XPU_PREC_INT8;
    return 1;
  case XPU_OP_DEQUANTIZE:
    if (x->dtype != XPU_DT_I8 || !is_float(out->dtype) || !(n->fattr[0] > 0))
      REFUSE("DEQUANTIZE supported from per-tensor I8 with a positive scale");
    *precision = XPU_PREC_INT8;
    return 1;
  case XPU_OP_RESHAPE: case XPU_OP_PERMUTE: case XPU_OP_SLICE: case XPU_OP_CONCAT:
    if (!(is_float(x->dtype) || x->dtype == XPU_DT_I32 || x->dtype == XPU_DT_I8) || out->dtype != x->dtype)
      REFUSE("%s supported for F32/F16/I32/I8", xpu_op_name(n->op));
    for (uint32_t i = 1; i < n->n_inputs; i++)
      if (ir->tensors[n->inputs[i]].dtype != x->dtype) REFUSE("CONCAT inputs of different dtypes");
    if (n->op == XPU_OP_RESHAPE && xpu_ir_numel(x) != xpu_ir_numel(out)) REFUSE("RESHAPE changes the element count");
    if (n->op == XPU_OP_SLICE && (n->iattr[0] < 0 || n->iattr[0] >= (int64_t)(x->rank ? x->rank : 1) ||
                                  n->iattr[1] < 0 ||
                                  n->iattr[1] + out->shape[n->iattr[0]] > x->shape[n->iattr[0]]))
      REFUSE("SLICE range outside the input");
    if (n->op == XPU_OP_CONCAT && (n->iattr[0] < 0 || n->iattr[0] >= (int64_t)x->rank)) REFUSE("CONCAT axis out of range");
    if (n->op == XPU_OP_PERMUTE)
      for (uint32_t d = 0; d < x->rank; d++)
        if (n->iattr[d] < 0 || n->iattr[d] >= (int64_t)x->rank) REFUSE("PERMUTE axis out of range");
    if (x->dtype == XPU_DT_I8) {
      float si, so;
      qnn_i8_scale(ir, n->inputs[0], &si);
      qnn_i8_scale(ir, n->output, &so);
      if (si != so) REFUSE("I8 data movement between tensors of different scales would requantize");
    }
    *precision = XPU_PREC_DEFAULT;
    return 1;
  default:
    REFUSE("%s has no QNN mapping in this plugin", xpu_op_name(n->op));
  }
  *precision = float_prec(x->dtype, float_as_f16);
  return 1;
}

uint32_t qnn_op_query(const xpu_op_query *q) {
  uint32_t in = q->dtype_in, w = q->dtype_weight, out = q->dtype_out;
  if (q->rank > 4) return XPU_VERDICT_NO;
  if (in == XPU_DT_BF16 || out == XPU_DT_BF16 || w == XPU_DT_BF16 || w == XPU_DT_Q8_0 || w == XPU_DT_Q4_0)
    return XPU_VERDICT_NO;
  switch (q->op) {
  case XPU_OP_ADD: case XPU_OP_SUB: case XPU_OP_MUL: case XPU_OP_DIV: case XPU_OP_SILU: case XPU_OP_GELU:
  case XPU_OP_RELU: case XPU_OP_EXP: case XPU_OP_NEG: case XPU_OP_SCALE: case XPU_OP_RMS_NORM:
  case XPU_OP_LAYER_NORM: case XPU_OP_SOFTMAX: case XPU_OP_ROPE: case XPU_OP_ATTENTION:
    return is_float(in) && (out == 0 || out == in) ? XPU_VERDICT_MAYBE : XPU_VERDICT_NO;
  case XPU_OP_MATMUL:
    return is_float(in) && (w == 0 || is_float(w) || w == XPU_DT_I8) ? XPU_VERDICT_MAYBE : XPU_VERDICT_NO;
  case XPU_OP_GET_ROWS: {
    uint32_t table = w ? w : in;
    return (is_float(table) || table == XPU_DT_I8) && (out == 0 || out == XPU_DT_F32) ? XPU_VERDICT_MAYBE
                                                                                      : XPU_VERDICT_NO;
  }
  case XPU_OP_CAST: return (is_float(in) || in == XPU_DT_I32) && (out == 0 || is_float(out)) ? XPU_VERDICT_MAYBE : XPU_VERDICT_NO;
  case XPU_OP_QUANTIZE: return is_float(in) && (out == 0 || out == XPU_DT_I8) ? XPU_VERDICT_MAYBE : XPU_VERDICT_NO;
  case XPU_OP_DEQUANTIZE: return in == XPU_DT_I8 && (out == 0 || is_float(out)) ? XPU_VERDICT_MAYBE : XPU_VERDICT_NO;
  case XPU_OP_RESHAPE: case XPU_OP_PERMUTE: case XPU_OP_SLICE: case XPU_OP_CONCAT:
    return is_float(in) || in == XPU_DT_I32 || in == XPU_DT_I8 ? XPU_VERDICT_MAYBE : XPU_VERDICT_NO;
  default: return XPU_VERDICT_NO;
  }
}
