/*
 * qnn_check.c: which xpu IR nodes the QNN plugin can express as QNN ops, and at what precision.
 * op_support and graph_analyze answer from here, and qnn_lower.c emits exactly what passes, so
 * a node that analyze accepts is a node prepare can build (no capability lie).
 */
#include <stdio.h>
#include <string.h>

#include "qnn_internal.h"
#include "xpu_validate.h"

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
    /* this walks every node, checked or not: a node without inputs has none to follow */
    if (nd->output == t && nd->n_inputs > 0 && (nd->op == XPU_OP_RESHAPE || nd->op == XPU_OP_PERMUTE || nd->op == XPU_OP_SLICE ||
                            nd->op == XPU_OP_CONCAT)) {
      float in = 0;
      if (!qnn_i8_scale(ir, nd->inputs[0], &in)) return 0;
      here = in;
    }
    if (nd->op == XPU_OP_MATMUL && nd->inputs[0] == t && ir->tensors[t].dtype == XPU_DT_I8)
      here = nd->fattr[1]; /* W8A8's activation scale (op set 3) */
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

static int shape_ok(const xpu_ir_tensor *t, char *reason, size_t cap) {
  for (uint32_t d = 0; d < t->rank; d++) {
    if (t->shape[d] == 0) REFUSE("zero-size tensors cannot be built on QNN");
    if (t->shape[d] > 0x7FFFFFFF) REFUSE("dimension does not fit QNN's uint32 dims");
  }
  if (t->dtype == XPU_DT_BF16) REFUSE("BF16 is not a QNN data type");
  if (t->dtype == XPU_DT_Q8_0 || t->dtype == XPU_DT_Q4_0 || (t->dtype >= XPU_DT_Q4_K && t->dtype <= XPU_DT_Q3_K))
    REFUSE("GGUF block formats (Q8_0/Q4_0, K-quants) have no QNN encoding; use per-tensor I8");
  return 1;
}

static int is_graph_output(const xpu_ir_graph *ir, uint32_t t) {
  for (uint32_t i = 0; i < ir->header->n_outputs; i++)
    if (ir->outputs[i] == t) return 1;
  return 0;
}

/* the ops OPS.md requires to be bit-exact (data movement, conversions, sign and comparison) */
static int must_be_exact(const xpu_ir_graph *ir, const xpu_ir_node *n) {
  (void)ir;
  switch (n->op) {
  case XPU_OP_RESHAPE: case XPU_OP_PERMUTE: case XPU_OP_SLICE: case XPU_OP_CONCAT: case XPU_OP_CAST:
  case XPU_OP_GET_ROWS: case XPU_OP_DEQUANTIZE: case XPU_OP_NEG: case XPU_OP_RELU: return 1;
  default: return 0;
  }
}

/* the HTP computes every float at half precision (the FP16 graph config); the CPU in f32 */
static uint32_t float_prec(uint32_t target) { return target == QNN_BACKEND_ID_HTP ? XPU_PREC_F16 : XPU_PREC_F32; }

/* positions of a ROPE, ids of a GET_ROWS: a graph input (checked before execute) or a constant
 * (checked at prepare), never computed in the graph, where nothing could check them */
static int checkable_ids(const xpu_ir_graph *ir, uint32_t t) {
  return ir->tensors[t].kind == XPU_TENSOR_CONST || (ir->tensors[t].kind != XPU_TENSOR_VALUE && is_graph_input(ir, t));
}

int qnn_node_check(const xpu_ir_graph *ir, uint32_t node, uint32_t target, uint32_t *precision, char *reason,
                   size_t cap) {
  const xpu_ir_node *n = &ir->nodes[node];
  const xpu_ir_tensor *out = &ir->tensors[n->output];
  int htp = target == QNN_BACKEND_ID_HTP;
  *precision = XPU_PREC_DEFAULT;
  reason[0] = 0;
  /* arity, shapes and attributes (abi/OPS.md): after this every input the op takes exists, and
   * what follows is only what QNN and its backends add */
  const char *bad = xpu_validate_node(ir, n);
  if (bad) REFUSE("%s", bad);
  const xpu_ir_tensor *x = &ir->tensors[n->inputs[0]];
  if (!shape_ok(out, reason, cap)) return 0;
  /* CPU supplement: every float op is FLOAT_32 only */
  if (!htp && out->dtype == XPU_DT_F16) REFUSE("the QNN CPU backend has no FLOAT_16 ops (CPU op supplement: fp32 only)");
  /* CPU supplement: SFIXED_POINT_8 only through Quantize/Dequantize (its int8 ops are UFIXED_POINT_8) */
  if (!htp && out->dtype == XPU_DT_I8 && n->op != XPU_OP_QUANTIZE)
    REFUSE("the QNN CPU backend moves no SFIXED_POINT_8 data (CPU op supplement: int8 ops are UFIXED_POINT_8)");
  for (uint32_t i = 0; i < n->n_inputs; i++) {
    const xpu_ir_tensor *t = &ir->tensors[n->inputs[i]];
    if (!htp && t->dtype == XPU_DT_F16)
      REFUSE("the QNN CPU backend has no FLOAT_16 ops (CPU op supplement: fp32 only)");
    if (!htp && t->dtype == XPU_DT_I8 && !(n->op == XPU_OP_DEQUANTIZE || (n->op == XPU_OP_MATMUL && i == 1)))
      REFUSE("the QNN CPU backend moves no SFIXED_POINT_8 data (CPU op supplement: int8 ops are UFIXED_POINT_8)");
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
  if (out->rank > 4) REFUSE("rank > 4 (HTP op supplement: max rank 4 for most FP16 ops)");
  /* exact anyway: a cast to F16 is the rounding the boundary makes; F16 values (an F16 cast
   * source, an F16 table) fit a half-held FLOAT_32 exactly */
  int exact_anyway = (n->op == XPU_OP_CAST && (out->dtype == XPU_DT_F16 || x->dtype == XPU_DT_F16)) ||
                     (n->op == XPU_OP_GET_ROWS && x->dtype == XPU_DT_F16);
  if (htp && must_be_exact(ir, n) && !exact_anyway) {
    /* an FP16 graph converts FLOAT_32 graph inputs and outputs to half at the boundary: an op
     * OPS.md requires to be bit-exact cannot be, when its FLOAT_32 data enters or leaves there */
    int boundary = is_graph_output(ir, n->output) && out->dtype == XPU_DT_F32;
    for (uint32_t i = 0; i < n->n_inputs; i++)
      boundary |= ir->tensors[n->inputs[i]].dtype == XPU_DT_F32 && is_graph_input(ir, n->inputs[i]);
    if (boundary)
      REFUSE("%s must be bit-exact, but the HTP's FP16 graph (precision config FLOAT16) holds FLOAT_32 graph "
             "inputs/outputs at half precision", xpu_op_name(n->op));
  }
  switch (n->op) {
  case XPU_OP_ADD: case XPU_OP_SUB: case XPU_OP_MUL: case XPU_OP_DIV:
    break;
  case XPU_OP_SILU: case XPU_OP_GELU: case XPU_OP_RELU: case XPU_OP_EXP: case XPU_OP_NEG: case XPU_OP_SCALE:
  case XPU_OP_RMS_NORM: case XPU_OP_LAYER_NORM: case XPU_OP_TANH:
    if (htp && n->op == XPU_OP_EXP && out->dtype == XPU_DT_F32)
      REFUSE("EXP to FLOAT_32 on the HTP: its FP16 graph overflows to +Inf for x > 11.09 (half max 65504), "
             "where an F32 result is finite");
    break;
  case XPU_OP_SOFTMAX:
    if (n->iattr[0] == 1 && n->fattr[0] < 0) REFUSE("causal SOFTMAX with a negative scale");
    break;
  case XPU_OP_MATMUL: {
    const xpu_ir_tensor *b = &ir->tensors[n->inputs[1]];
    if (x->dtype == XPU_DT_I8 || n->n_inputs == 3) {
      /* W8A8 (op set 3): QNN MatMul, SFIXED_POINT_8 x SFIXED_POINT_8 (per-axis weights for
       * per-channel scales) -> SFIXED_POINT_16 with the output grid's scale, then Dequantize */
      if (!htp) REFUSE("W8A8 MATMUL needs the HTP: the QNN CPU backend's int8 ops take UFIXED_POINT_8");
      if (qnn_api_minor() < QNN_API_MINOR_SDK_2_39)
        REFUSE("W8A8 MATMUL needs the HTP's 8-bit MatMul with a SFIXED_POINT_16 output and its Dequantize "
               "(QNN SDK 2.39, core API 2.%u); this backend reports API 2.%u", QNN_API_MINOR_SDK_2_39, qnn_api_minor());
      if (x->dtype != XPU_DT_I8)
        REFUSE("per-channel I8 weight scales with a float activation: the plugin lowers them only in a W8A8 "
               "MATMUL (an I8 activation)");
      if (!(n->fattr[2] > 0))
        REFUSE("W8A8 MATMUL without an output grid (fattr[2] = 0): the HTP's 8-bit MatMul writes a 16-bit output "
               "whose scale the graph must give (W8A8Options.OutScale); a 32-bit accumulator cannot be dequantized");
      if (n->n_inputs == 3) {
        const xpu_ir_tensor *s = &ir->tensors[n->inputs[2]];
        if (s->kind != XPU_TENSOR_CONST || b->kind != XPU_TENSOR_CONST)
          REFUSE("per-channel scales become a per-axis encoding of static weights: the weight and its scales "
                 "must be constants");
      }
      *precision = XPU_PREC_INT8;
      return 1;
    }
    if (!(is_float(b->dtype) || b->dtype == XPU_DT_I8)) REFUSE("MATMUL weight must be F32/F16 or a per-tensor I8");
    /* a batched b must match a's batch dims: QNN MatMul does not broadcast (CPU supplement: in[1]
     * has in[0]'s rank and batch dims); a rank-2 b becomes a FullyConnected */
    if (b->rank > 2) {
      int same = b->rank == x->rank;
      for (uint32_t d = 0; same && d + 2 < b->rank; d++) same = b->shape[d] == x->shape[d];
      if (!same) REFUSE("MATMUL with a batched b whose batch dims differ from a's: QNN MatMul does not broadcast");
    }
    /* an int8 x int8 MatMul needs a calibrated 8/16-bit output encoding, which the IR does not
     * carry: I8 operands are dequantized and multiplied at the backend's float precision */
    break;
  }
  case XPU_OP_ROPE: {
    if (!checkable_ids(ir, n->inputs[1]))
      REFUSE("ROPE positions computed in the graph: the cos/sin table Gather needs them checked before execute");
    int64_t d = x->shape[x->rank - 1], nr = n->iattr[1] ? n->iattr[1] : d;
    if (nr <= 0 || nr > d || nr % 2) REFUSE("ROPE n_rot must be even and <= D");
    break;
  }
  case XPU_OP_ATTENTION: {
    if (n->iattr[2] != 0 || n->iattr[3] != 0) REFUSE("ATTENTION on a KV head range (op set 4) is not lowered by this plugin");
    if (n->iattr[4] != 0)
      REFUSE("ATTENTION with a sliding window (op set 5) is not lowered by this plugin: keys before the window "
             "must never be read, which needs a per-query lower bound on K/V rows the plugin does not build");
    /* a Q8_0/Q4_0 KV cache (op set 5) is refused with every GGUF block tensor by shape_ok */
    if (n->n_inputs > 4) { /* op set v2's tree mask: I8 [Tq, Tq], with a run-time q_offset, causal */
      if (!htp) REFUSE("ATTENTION mask: the QNN CPU backend has no SFIXED_POINT_8 Gather/Cast for it");
    }
    if (n->iattr[0] == 1 && n->fattr[0] < 0) REFUSE("causal ATTENTION with a negative scale");
    if (n->iattr[0] == 1 && n->n_inputs <= 3 && x->shape[0] + n->iattr[1] < 1)
      REFUSE("causal ATTENTION where no query sees a key");
    break;
  }
  case XPU_OP_GET_ROWS: {
    const xpu_ir_tensor *ids = &ir->tensors[n->inputs[1]];
    if (!(is_float(x->dtype) || x->dtype == XPU_DT_I8)) REFUSE("GET_ROWS table must be F32/F16/I8");
    if (ids->rank == 0) REFUSE("GET_ROWS ids of rank 0");
    if (!checkable_ids(ir, n->inputs[1])) REFUSE("GET_ROWS ids computed in the graph: QNN cannot report an id out of range");
    if (x->dtype == XPU_DT_I8 && !(n->fattr[0] > 0)) REFUSE("I8 table without a positive scale");
    *precision = XPU_PREC_DEFAULT;
    return 1;
  }
  case XPU_OP_CAST:
    if (x->dtype == XPU_DT_BF16 || out->dtype == XPU_DT_BF16) REFUSE("CAST supported between F32/F16 and from I32");
    *precision = XPU_PREC_DEFAULT;
    return 1;
  case XPU_OP_QUANTIZE:
    /* the HTP's Quantize reads FLOAT_16 before SDK 2.39, FLOAT_32 since: qnn_lower.c casts x */
    if (!is_float(x->dtype) || out->dtype != XPU_DT_I8 || !(n->fattr[0] > 0))
      REFUSE("QUANTIZE supported from F32/F16 to per-tensor I8 with a positive scale");
    *precision = XPU_PREC_INT8;
    return 1;
  case XPU_OP_DEQUANTIZE:
    if (x->dtype != XPU_DT_I8 || !(n->fattr[0] > 0))
      REFUSE("DEQUANTIZE supported from per-tensor I8 with a positive scale");
    *precision = XPU_PREC_INT8;
    return 1;
  case XPU_OP_RESHAPE: case XPU_OP_PERMUTE: case XPU_OP_SLICE: case XPU_OP_CONCAT:
    if (!(is_float(x->dtype) || x->dtype == XPU_DT_I32 || x->dtype == XPU_DT_I8))
      REFUSE("%s supported for F32/F16/I32/I8", xpu_op_name(n->op));
    if (x->dtype == XPU_DT_I8) {
      float si, so;
      qnn_i8_scale(ir, n->inputs[0], &si);
      qnn_i8_scale(ir, n->output, &so);
      if (si != so) REFUSE("I8 data movement between tensors of different scales would requantize");
    }
    *precision = XPU_PREC_DEFAULT;
    return 1;
  case XPU_OP_SHADOW_MATMUL:
    REFUSE("SHADOW_MATMUL is CPU work (mllm-NPU runs the outliers' float product on the CPU beside the NPU's "
           "int8 MatMul); the plugin has no QNN lowering for it");
  default:
    REFUSE("%s has no QNN mapping in this plugin", xpu_op_name(n->op));
  }
  *precision = float_prec(target);
  return 1;
}

uint32_t qnn_op_query(const xpu_op_query *q, uint32_t target) {
  uint32_t in = q->dtype_in, w = q->dtype_weight, out = q->dtype_out;
  if (q->rank > 4) return XPU_VERDICT_NO;
  if (target != QNN_BACKEND_ID_HTP && (in == XPU_DT_F16 || out == XPU_DT_F16 || w == XPU_DT_F16))
    return XPU_VERDICT_NO; /* the QNN CPU backend is FLOAT_32 only */
  if (in == XPU_DT_BF16 || out == XPU_DT_BF16 || w == XPU_DT_BF16 || w == XPU_DT_Q8_0 || w == XPU_DT_Q4_0)
    return XPU_VERDICT_NO;
  switch (q->op) {
  case XPU_OP_ADD: case XPU_OP_SUB: case XPU_OP_MUL: case XPU_OP_DIV: case XPU_OP_SILU: case XPU_OP_GELU:
  case XPU_OP_RELU: case XPU_OP_EXP: case XPU_OP_NEG: case XPU_OP_SCALE: case XPU_OP_RMS_NORM:
  case XPU_OP_LAYER_NORM: case XPU_OP_SOFTMAX: case XPU_OP_ROPE: case XPU_OP_ATTENTION: case XPU_OP_TANH:
    return is_float(in) && (out == 0 || out == in) ? XPU_VERDICT_MAYBE : XPU_VERDICT_NO;
  case XPU_OP_MATMUL:
    if (in == XPU_DT_I8) /* W8A8: the HTP only (SDK 2.39), with an output grid (graph_analyze checks it) */
      return target == QNN_BACKEND_ID_HTP && qnn_api_minor() >= QNN_API_MINOR_SDK_2_39 && (w == 0 || w == XPU_DT_I8) &&
                     (out == 0 || is_float(out))
                 ? XPU_VERDICT_MAYBE
                 : XPU_VERDICT_NO;
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
