/*
 * emu_ops.c: the ops the emulator accepts (README.md lists them), their parameter and shape
 * rules, checked at graphAddNode as a real backend validates a node, and their CPU kernels.
 * Kernels compute in f32 and round once to the output dtype; data-movement ops copy bytes.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/qnn_half.h"
#include "emu.h"

static const struct {
  const char *name;
  emu_op op;
} op_names[] = {
    {"ElementWiseAdd", EMU_OP_ADD},        {"ElementWiseSubtract", EMU_OP_SUB},
    {"ElementWiseMultiply", EMU_OP_MUL},   {"ElementWiseDivide", EMU_OP_DIV},
    {"ElementWiseMaximum", EMU_OP_MAX},    {"ElementWiseExp", EMU_OP_EXP},
    {"ElementWiseNeg", EMU_OP_NEG},        {"ElementWiseSin", EMU_OP_SIN},
    {"ElementWiseCos", EMU_OP_COS},        {"Relu", EMU_OP_RELU},
    {"Sigmoid", EMU_OP_SIGMOID},           {"Softmax", EMU_OP_SOFTMAX},
    {"RmsNorm", EMU_OP_RMSNORM},           {"LayerNorm", EMU_OP_LAYERNORM},
    {"MatMul", EMU_OP_MATMUL},             {"Gather", EMU_OP_GATHER},
    {"Reshape", EMU_OP_RESHAPE},           {"Transpose", EMU_OP_TRANSPOSE},
    {"StridedSlice", EMU_OP_STRIDEDSLICE}, {"Concat", EMU_OP_CONCAT},
    {"Cast", EMU_OP_CAST},                 {"Quantize", EMU_OP_QUANTIZE},
    {"Dequantize", EMU_OP_DEQUANTIZE},     {"ElementWiseGreaterEqual", EMU_OP_GREATER_EQUAL},
    {"ElementWiseSelect", EMU_OP_SELECT},  {"FullyConnected", EMU_OP_FC},
    {"Tanh", EMU_OP_TANH},
};

int emu_op_from_name(const char *type) {
  if (!type) return 0;
  for (size_t i = 0; i < sizeof op_names / sizeof op_names[0]; i++)
    if (strcmp(op_names[i].name, type) == 0) return (int)op_names[i].op;
  return 0;
}

const char *emu_op_name(emu_op op) {
  for (size_t i = 0; i < sizeof op_names / sizeof op_names[0]; i++)
    if (op_names[i].op == op) return op_names[i].name;
  return "?";
}

int emu_dtype_ok(Qnn_DataType_t dt) {
  return dt == QNN_DATATYPE_FLOAT_32 || dt == QNN_DATATYPE_FLOAT_16 || dt == QNN_DATATYPE_INT_32 ||
         dt == QNN_DATATYPE_UINT_32 || dt == QNN_DATATYPE_SFIXED_POINT_8 || dt == QNN_DATATYPE_SFIXED_POINT_32 ||
         dt == QNN_DATATYPE_SFIXED_POINT_16 ||
         dt == QNN_DATATYPE_BOOL_8;
}

static int is_float(Qnn_DataType_t dt) {
  return dt == QNN_DATATYPE_FLOAT_32 || dt == QNN_DATATYPE_FLOAT_16;
}

#define FAIL(code, ...)                                                                          \
  do {                                                                                           \
    snprintf(msg, cap, __VA_ARGS__);                                                             \
    return (code);                                                                               \
  } while (0)

/* ------------------------------------------------------------------ parameters */

static const Qnn_Param_t *find_param(const Qnn_OpConfigV1_t *c, const char *name) {
  for (uint32_t i = 0; i < c->numOfParams; i++)
    if (c->params[i].name && strcmp(c->params[i].name, name) == 0) return &c->params[i];
  return NULL;
}

/* a tensor parameter's data must be given in the param itself (clientBuf), as in QNN */
static const void *tensor_param(const Qnn_Param_t *p, Qnn_DataType_t want, uint32_t count) {
  if (p->paramType != QNN_PARAMTYPE_TENSOR) return NULL;
  const Qnn_TensorV1_t *t = &p->tensorParam.v1;
  if (t->dataType != want || t->memType != QNN_TENSORMEMTYPE_RAW || !t->clientBuf.data) return NULL;
  if (t->clientBuf.dataSize != count * qnn_dtype_bytes(want)) return NULL;
  return t->clientBuf.data;
}

static int scalar_u32(const Qnn_Param_t *p, uint32_t *out) {
  if (p->paramType != QNN_PARAMTYPE_SCALAR) return 0;
  switch (p->scalarParam.dataType) {
  case QNN_DATATYPE_UINT_32: *out = p->scalarParam.uint32Value; return 1;
  case QNN_DATATYPE_INT_32:
    if (p->scalarParam.int32Value < 0) return 0;
    *out = (uint32_t)p->scalarParam.int32Value;
    return 1;
  default: return 0;
  }
}

static int scalar_f32(const Qnn_Param_t *p, float *out) {
  if (p->paramType != QNN_PARAMTYPE_SCALAR || p->scalarParam.dataType != QNN_DATATYPE_FLOAT_32)
    return 0;
  *out = p->scalarParam.floatValue;
  return 1;
}

static int scalar_bool(const Qnn_Param_t *p, uint8_t *out) {
  if (p->paramType != QNN_PARAMTYPE_SCALAR || p->scalarParam.dataType != QNN_DATATYPE_BOOL_8)
    return 0;
  *out = p->scalarParam.bool8Value ? 1 : 0;
  return 1;
}

static int known_param(emu_op op, const char *name) {
  switch (op) {
  case EMU_OP_SOFTMAX: return !strcmp(name, "axis") || !strcmp(name, "beta");
  case EMU_OP_RMSNORM:
  case EMU_OP_LAYERNORM: return !strcmp(name, "epsilon") || !strcmp(name, "axes");
  case EMU_OP_MATMUL: return !strcmp(name, "transpose_in0") || !strcmp(name, "transpose_in1");
  case EMU_OP_FC: return !strcmp(name, "keep_dims");
  case EMU_OP_GATHER:
  case EMU_OP_CONCAT: return !strcmp(name, "axis");
  case EMU_OP_TRANSPOSE: return !strcmp(name, "perm");
  case EMU_OP_STRIDEDSLICE: return !strcmp(name, "ranges");
  default: return 0;
  }
}

/* ------------------------------------------------------------------ shape rules */

static int same_dims(const emu_tensor *a, uint32_t rank, const uint32_t *dims) {
  if (a->rank != rank) return 0;
  for (uint32_t i = 0; i < rank; i++)
    if (a->dims[i] != dims[i]) return 0;
  return 1;
}

static void fmt_dims(char *buf, size_t cap, uint32_t rank, const uint32_t *d) {
  size_t n = 0;
  n += (size_t)snprintf(buf + n, cap - n, "[");
  for (uint32_t i = 0; i < rank && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, i ? ",%u" : "%u", d[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* numpy broadcast of a and b into out; 0 if they do not broadcast */
static int broadcast(const emu_tensor *a, const emu_tensor *b, uint32_t *rank, uint32_t *dims) {
  uint32_t r = a->rank > b->rank ? a->rank : b->rank;
  for (uint32_t i = 0; i < r; i++) {
    uint32_t da = i < r - a->rank ? 1 : a->dims[i - (r - a->rank)];
    uint32_t db = i < r - b->rank ? 1 : b->dims[i - (r - b->rank)];
    if (da != db && da != 1 && db != 1) return 0;
    dims[i] = da > db ? da : db;
    if (da == 0 || db == 0) dims[i] = 0;
  }
  *rank = r;
  return 1;
}

Qnn_ErrorHandle_t emu_node_check(const emu_graph *g, emu_node *n, const Qnn_OpConfigV1_t *cfg,
                                 char *msg, size_t cap) {
  const emu_tensor *in[EMU_MAX_IO], *out = &g->tensors[n->out[0]];
  for (uint32_t i = 0; i < n->n_in; i++) in[i] = &g->tensors[n->in[i]];
  for (uint32_t i = 0; i < cfg->numOfParams; i++) {
    const char *pn = cfg->params[i].name;
    if (!pn || !known_param(n->op, pn))
      FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: %s has no parameter \"%s\"", n->name,
           emu_op_name(n->op), pn ? pn : "(null)");
  }
  uint32_t want_in_min = 1, want_in_max = 1;
  switch (n->op) {
  case EMU_OP_ADD: case EMU_OP_SUB: case EMU_OP_MUL: case EMU_OP_DIV: case EMU_OP_MAX:
  case EMU_OP_MATMUL: case EMU_OP_GATHER: case EMU_OP_GREATER_EQUAL: want_in_min = want_in_max = 2; break;
  case EMU_OP_SELECT: want_in_min = want_in_max = 3; break;
  case EMU_OP_RMSNORM: case EMU_OP_LAYERNORM: want_in_min = 2; want_in_max = 3; break;
  case EMU_OP_FC: want_in_min = 2; want_in_max = 3; break;
  case EMU_OP_CONCAT: want_in_min = 1; want_in_max = EMU_MAX_IO; break;
  default: break;
  }
  if (n->n_in < want_in_min || n->n_in > want_in_max || n->n_out != 1)
    FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: %s takes %u..%u inputs and 1 output, got %u/%u",
         n->name, emu_op_name(n->op), want_in_min, want_in_max, n->n_in, n->n_out);

  /* the backend's published op-support table first: what a phone would refuse */
  Qnn_ErrorHandle_t re = emu_rule_check(g, n, msg, cap);
  if (re != QNN_SUCCESS) return re;

  uint32_t rank = 0, dims[EMU_MAX_RANK] = {0};
  const Qnn_Param_t *p;
  switch (n->op) {
  case EMU_OP_ADD: case EMU_OP_SUB: case EMU_OP_MUL: case EMU_OP_DIV: case EMU_OP_MAX:
    if (!(is_float(in[0]->dtype) || in[0]->dtype == QNN_DATATYPE_INT_32) || in[0]->dtype != in[1]->dtype ||
        out->dtype != in[0]->dtype)
      FAIL(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "node %s: %s needs FLOAT_32/FLOAT_16/INT_32 inputs and output of one dtype",
           n->name, emu_op_name(n->op));
    if (!broadcast(in[0], in[1], &rank, dims))
      FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: input shapes do not broadcast", n->name);
    break;
  case EMU_OP_GREATER_EQUAL:
    if (!(is_float(in[0]->dtype) || in[0]->dtype == QNN_DATATYPE_INT_32) || in[0]->dtype != in[1]->dtype ||
        out->dtype != QNN_DATATYPE_BOOL_8)
      FAIL(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "node %s: ElementWiseGreaterEqual needs float/INT_32 inputs of one dtype and a BOOL_8 output",
           n->name);
    if (!broadcast(in[0], in[1], &rank, dims))
      FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: input shapes do not broadcast", n->name);
    break;
  case EMU_OP_SELECT: {
    emu_tensor ab;
    if (in[0]->dtype != QNN_DATATYPE_BOOL_8 || !(is_float(in[1]->dtype) || in[1]->dtype == QNN_DATATYPE_INT_32) ||
        in[2]->dtype != in[1]->dtype || out->dtype != in[1]->dtype)
      FAIL(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "node %s: ElementWiseSelect needs a BOOL_8 condition and float values of one dtype",
           n->name);
    if (!broadcast(in[1], in[2], &ab.rank, ab.dims) || !broadcast(in[0], &ab, &rank, dims))
      FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: input shapes do not broadcast", n->name);
    break;
  }
  case EMU_OP_EXP: case EMU_OP_NEG: case EMU_OP_SIN: case EMU_OP_COS: case EMU_OP_RELU:
  case EMU_OP_SIGMOID: case EMU_OP_TANH: case EMU_OP_SOFTMAX:
    if (!is_float(in[0]->dtype) || out->dtype != in[0]->dtype)
      FAIL(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "node %s: %s needs a FLOAT_32/FLOAT_16 input and output of one dtype",
           n->name, emu_op_name(n->op));
    rank = in[0]->rank;
    memcpy(dims, in[0]->dims, sizeof dims);
    if (n->op == EMU_OP_SOFTMAX) {
      uint32_t axis = in[0]->rank - 1;
      n->beta = 1.0f;
      if ((p = find_param(cfg, "axis")) && !scalar_u32(p, &axis))
        FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: axis must be a UINT_32 scalar", n->name);
      if ((p = find_param(cfg, "beta")) && !scalar_f32(p, &n->beta))
        FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: beta must be a FLOAT_32 scalar", n->name);
      if (in[0]->rank == 0 || axis != in[0]->rank - 1)
        FAIL(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "node %s: Softmax only over the last axis", n->name);
    }
    break;
  case EMU_OP_RMSNORM: case EMU_OP_LAYERNORM: {
    if (!is_float(in[0]->dtype) || out->dtype != in[0]->dtype || in[0]->rank == 0)
      FAIL(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "node %s: %s needs a float input of rank >= 1", n->name,
           emu_op_name(n->op));
    uint32_t k = in[0]->dims[in[0]->rank - 1];
    for (uint32_t i = 1; i < n->n_in; i++)
      if (in[i]->dtype != in[0]->dtype || in[i]->rank != 1 || in[i]->dims[0] != k)
        FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: gamma/beta must be [%u] of the input dtype",
             n->name, k);
    n->epsilon = n->op == EMU_OP_RMSNORM ? 1e-6f : 1e-3f;
    if ((p = find_param(cfg, "epsilon")) && !scalar_f32(p, &n->epsilon))
      FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: epsilon must be a FLOAT_32 scalar", n->name);
    const uint32_t *axes;
    if (!(p = find_param(cfg, "axes")) || !(axes = tensor_param(p, QNN_DATATYPE_UINT_32, 1)) ||
        axes[0] != in[0]->rank - 1)
      FAIL(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "node %s: axes must be the UINT_32 tensor [last axis]", n->name);
    rank = in[0]->rank;
    memcpy(dims, in[0]->dims, sizeof dims);
    break;
  }
  case EMU_OP_MATMUL: {
    /* float x float -> float, or the integer path of W8A8: SFIXED_POINT_8 x SFIXED_POINT_8 ->
     * SFIXED_POINT_32 accumulators whose scale is the product (no requantization here) */
    int q8 = in[0]->dtype == QNN_DATATYPE_SFIXED_POINT_8 && in[1]->dtype == QNN_DATATYPE_SFIXED_POINT_8 &&
             out->dtype == QNN_DATATYPE_SFIXED_POINT_32;
    /* W8A8 with a requantized 16-bit output: int32 sums inside, scaled to the output's encoding */
    int q16 = in[0]->dtype == QNN_DATATYPE_SFIXED_POINT_8 && in[1]->dtype == QNN_DATATYPE_SFIXED_POINT_8 &&
              out->dtype == QNN_DATATYPE_SFIXED_POINT_16;
    if (q8 && (in[0]->offset || in[1]->offset || out->offset || in[1]->n_axis_scales ||
               fabsf(out->scale - in[0]->scale * in[1]->scale) > 1e-6f * out->scale))
      FAIL(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "node %s: 8-bit MatMul needs symmetric encodings and an output scale of "
           "in0.scale * in1.scale", n->name);
    if (q16 && (in[0]->offset || in[1]->offset || out->offset || in[0]->n_axis_scales))
      FAIL(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "node %s: 8-bit MatMul with a 16-bit output needs symmetric encodings "
           "(offset 0) and a per-tensor in[0]", n->name);
    if (!q8 && !q16 && (!is_float(in[0]->dtype) || in[1]->dtype != in[0]->dtype || out->dtype != in[0]->dtype))
      FAIL(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "node %s: MatMul needs float inputs and output of one dtype, or "
           "SFIXED_POINT_8 inputs and an SFIXED_POINT_16/32 output", n->name);
    if ((p = find_param(cfg, "transpose_in0")) && !scalar_bool(p, &n->transpose_in0))
      FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: transpose_in0 must be BOOL_8", n->name);
    if ((p = find_param(cfg, "transpose_in1")) && !scalar_bool(p, &n->transpose_in1))
      FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: transpose_in1 must be BOOL_8", n->name);
    /* per-channel weight scales: the axis of in[1] that indexes the output columns */
    if (in[1]->n_axis_scales &&
        (uint32_t)in[1]->axis != (n->transpose_in1 ? in[1]->rank - 2 : in[1]->rank - 1))
      FAIL(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "node %s: a per-axis in[1] must be quantized along the output-channel "
           "axis", n->name);
    const emu_tensor *a = in[0], *b = in[1];
    if (a->rank < 2 || b->rank < 2)
      FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: MatMul inputs need rank >= 2", n->name);
    uint32_t m = n->transpose_in0 ? a->dims[a->rank - 1] : a->dims[a->rank - 2];
    uint32_t ka = n->transpose_in0 ? a->dims[a->rank - 2] : a->dims[a->rank - 1];
    uint32_t kb = n->transpose_in1 ? b->dims[b->rank - 1] : b->dims[b->rank - 2];
    uint32_t nn = n->transpose_in1 ? b->dims[b->rank - 2] : b->dims[b->rank - 1];
    if (ka != kb) FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: MatMul K %u != %u", n->name, ka, kb);
    emu_tensor ba = *a, bb = *b; /* batch dims only */
    ba.rank -= 2;
    bb.rank -= 2;
    if (!broadcast(&ba, &bb, &rank, dims))
      FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: MatMul batch dims do not broadcast", n->name);
    dims[rank++] = m;
    dims[rank++] = nn;
    break;
  }
  case EMU_OP_FC: {
    /* in[0] [.., K] read as [batch, K], weights [M, K] -> [batch, M] (keep_dims false only) */
    uint8_t keep = 0;
    if ((p = find_param(cfg, "keep_dims")) && (!scalar_bool(p, &keep) || keep))
      FAIL(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "node %s: FullyConnected supports only keep_dims = false", n->name);
    const emu_tensor *a = in[0], *b = in[1];
    if (a->dtype != b->dtype || out->dtype != a->dtype || !is_float(a->dtype))
      FAIL(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "node %s: FullyConnected needs float inputs and output of one dtype", n->name);
    if (a->rank < 2 || b->rank != 2 || a->dims[a->rank - 1] != b->dims[1])
      FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: FullyConnected needs in[0] [.., K] of rank >= 2 and weights [M, K]",
           n->name);
    if (n->n_in > 2 && (in[2]->dtype != a->dtype || in[2]->rank != 1 || in[2]->dims[0] != b->dims[0]))
      FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: FullyConnected bias must be [M]", n->name);
    n->transpose_in1 = 1;
    rank = 2;
    dims[0] = (uint32_t)(a->numel / a->dims[a->rank - 1]);
    dims[1] = b->dims[0];
    break;
  }
  case EMU_OP_GATHER: {
    int32_t axis = 0;
    if ((p = find_param(cfg, "axis"))) {
      if (p->paramType != QNN_PARAMTYPE_SCALAR || p->scalarParam.dataType != QNN_DATATYPE_INT_32)
        FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: axis must be an INT_32 scalar", n->name);
      axis = p->scalarParam.int32Value;
    }
    if (!(p = find_param(cfg, "axis")))
      FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: Gather's axis is mandatory", n->name);
    if (axis < 0 || (uint32_t)axis >= in[0]->rank)
      FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: Gather axis %d outside [0, %u)", n->name, axis, in[0]->rank);
    if (in[1]->dtype != QNN_DATATYPE_INT_32 || in[0]->dtype != out->dtype || in[0]->rank < 1 ||
        in[0]->dtype == QNN_DATATYPE_UINT_32 || in[0]->rank - 1 + in[1]->rank > EMU_MAX_RANK)
      FAIL(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "node %s: Gather needs INT_32 indices and data of the output dtype",
           n->name);
    n->axis = axis;
    rank = 0;
    for (int32_t i = 0; i < axis; i++) dims[rank++] = in[0]->dims[i];
    for (uint32_t i = 0; i < in[1]->rank; i++) dims[rank++] = in[1]->dims[i];
    for (uint32_t i = (uint32_t)axis + 1; i < in[0]->rank; i++) dims[rank++] = in[0]->dims[i];
    break;
  }
  case EMU_OP_RESHAPE:
    if (in[0]->dtype != out->dtype || in[0]->numel != out->numel)
      FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: Reshape keeps dtype and element count", n->name);
    rank = out->rank;
    memcpy(dims, out->dims, sizeof dims);
    break;
  case EMU_OP_TRANSPOSE: {
    const uint32_t *perm;
    uint32_t r = in[0]->rank;
    if (in[0]->dtype != out->dtype || !(p = find_param(cfg, "perm")) ||
        !(perm = tensor_param(p, QNN_DATATYPE_UINT_32, r)))
      FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: Transpose needs a UINT_32 perm of the input rank",
           n->name);
    uint32_t seen = 0;
    for (uint32_t i = 0; i < r; i++) {
      if (perm[i] >= r || (seen & (1u << perm[i])))
        FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: perm is not a permutation", n->name);
      seen |= 1u << perm[i];
      n->perm[i] = perm[i];
      dims[i] = in[0]->dims[perm[i]];
    }
    rank = r;
    break;
  }
  case EMU_OP_STRIDEDSLICE: {
    const int32_t *rg;
    uint32_t r = in[0]->rank;
    if (in[0]->dtype != out->dtype || !(p = find_param(cfg, "ranges")) ||
        !(rg = tensor_param(p, QNN_DATATYPE_INT_32, r * 3)))
      FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: StridedSlice needs INT_32 ranges [rank,3]",
           n->name);
    for (uint32_t i = 0; i < r; i++) {
      int32_t b = rg[3 * i], e = rg[3 * i + 1], s = rg[3 * i + 2];
      if (s <= 0 || b < 0 || e < b || (uint32_t)e > in[0]->dims[i])
        FAIL(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "node %s: StridedSlice needs 0 <= begin <= end <= dim, stride > 0",
             n->name);
      n->ranges[i][0] = b;
      n->ranges[i][1] = e;
      n->ranges[i][2] = s;
      dims[i] = (uint32_t)((e - b + s - 1) / s);
    }
    rank = r;
    break;
  }
  case EMU_OP_CONCAT: {
    uint32_t axis = 0;
    if (!(p = find_param(cfg, "axis")) || !scalar_u32(p, &axis) || axis >= in[0]->rank)
      FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: Concat needs a UINT_32 axis < rank", n->name);
    n->axis = (int32_t)axis;
    rank = in[0]->rank;
    memcpy(dims, in[0]->dims, sizeof dims);
    for (uint32_t i = 1; i < n->n_in; i++) {
      if (in[i]->dtype != in[0]->dtype || in[i]->rank != rank)
        FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: Concat inputs differ in dtype or rank", n->name);
      for (uint32_t d = 0; d < rank; d++)
        if (d != axis && in[i]->dims[d] != dims[d])
          FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: Concat inputs differ off the axis", n->name);
      dims[axis] += in[i]->dims[axis];
    }
    if (out->dtype != in[0]->dtype)
      FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: Concat keeps the dtype", n->name);
    break;
  }
  case EMU_OP_CAST:
    /* float/INT_32 to float, SFIXED_POINT_8 to BOOL_8 (nonzero is true: an I8 mask) and BOOL_8
     * to INT_32/float (0 or 1) */
    if (!(((is_float(in[0]->dtype) || in[0]->dtype == QNN_DATATYPE_INT_32) && is_float(out->dtype)) ||
          (in[0]->dtype == QNN_DATATYPE_SFIXED_POINT_8 && out->dtype == QNN_DATATYPE_BOOL_8) ||
          (in[0]->dtype == QNN_DATATYPE_BOOL_8 && (out->dtype == QNN_DATATYPE_INT_32 || is_float(out->dtype)))))
      FAIL(QNN_GRAPH_ERROR_INVALID_OP_CONFIG,
           "node %s: Cast only FLOAT_32/FLOAT_16/INT_32 to FLOAT_32/FLOAT_16, SFIXED_POINT_8 to BOOL_8 and BOOL_8 to "
           "INT_32/float", n->name);
    rank = in[0]->rank;
    memcpy(dims, in[0]->dims, sizeof dims);
    break;
  case EMU_OP_QUANTIZE:
  case EMU_OP_DEQUANTIZE: {
    const emu_tensor *f = n->op == EMU_OP_QUANTIZE ? in[0] : out;
    const emu_tensor *q = n->op == EMU_OP_QUANTIZE ? out : in[0];
    if (q->n_axis_scales)
      FAIL(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "node %s: per-axis encodings only as a MatMul weight", n->name);
    if (!is_float(f->dtype) || !(q->dtype == QNN_DATATYPE_SFIXED_POINT_8 ||
                                 (n->op == EMU_OP_DEQUANTIZE && (q->dtype == QNN_DATATYPE_SFIXED_POINT_32 ||
                                                                 q->dtype == QNN_DATATYPE_SFIXED_POINT_16))))
      FAIL(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "node %s: %s converts FLOAT_32/16 <-> SFIXED_POINT_8 (and SFIXED_POINT_32 -> float) only",
           n->name, emu_op_name(n->op));
    rank = in[0]->rank;
    memcpy(dims, in[0]->dims, sizeof dims);
    break;
  }
  }
  if ((n->op == EMU_OP_GATHER || n->op == EMU_OP_RESHAPE || n->op == EMU_OP_TRANSPOSE ||
       n->op == EMU_OP_STRIDEDSLICE || n->op == EMU_OP_CONCAT) &&
      in[0]->dtype == QNN_DATATYPE_SFIXED_POINT_8)
    for (uint32_t i = 0; i < n->n_in; i++)
      if (in[i]->dtype == out->dtype && (in[i]->scale != out->scale || in[i]->offset != out->offset))
        FAIL(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "node %s: %s cannot change a fixed-point encoding", n->name,
             emu_op_name(n->op));
  if (!same_dims(out, rank, dims)) {
    char want[96], got[96];
    fmt_dims(want, sizeof want, rank, dims);
    fmt_dims(got, sizeof got, out->rank, out->dims);
    FAIL(QNN_GRAPH_ERROR_INVALID_TENSOR, "node %s: %s output is %s, the declared tensor is %s (static shapes)",
         n->name, emu_op_name(n->op), want, got);
  }
  return QNN_SUCCESS;
}

/* ------------------------------------------------------------------ kernels */

static float load(const emu_tensor *t, const uint8_t *p, uint64_t i) {
  switch (t->dtype) {
  case QNN_DATATYPE_FLOAT_32: { float f; memcpy(&f, p + 4 * i, 4); return f; }
  case QNN_DATATYPE_FLOAT_16: { uint16_t h; memcpy(&h, p + 2 * i, 2); return qnn_half_to_float(h); }
  case QNN_DATATYPE_INT_32: { int32_t v; memcpy(&v, p + 4 * i, 4); return (float)v; }
  case QNN_DATATYPE_SFIXED_POINT_8: return t->scale * (float)((int32_t)(int8_t)p[i] + t->offset);
  case QNN_DATATYPE_SFIXED_POINT_32: {
    int32_t q;
    memcpy(&q, p + 4 * i, 4);
    return (float)((double)t->scale * ((double)q + t->offset));
  }
  case QNN_DATATYPE_SFIXED_POINT_16: {
    int16_t q;
    memcpy(&q, p + 2 * i, 2);
    return (float)((double)t->scale * ((double)q + t->offset));
  }
  case QNN_DATATYPE_BOOL_8: return p[i] ? 1.0f : 0.0f;
  default: return 0;
  }
}

static void store(const emu_tensor *t, uint8_t *p, uint64_t i, float v) {
  switch (t->dtype) {
  case QNN_DATATYPE_FLOAT_32: memcpy(p + 4 * i, &v, 4); break;
  case QNN_DATATYPE_FLOAT_16: { uint16_t h = qnn_float_to_half(v); memcpy(p + 2 * i, &h, 2); break; }
  case QNN_DATATYPE_SFIXED_POINT_8: {
    float q = roundf(v / t->scale) - (float)t->offset; /* HTP saturates to the type's range */
    q = q < -128.f ? -128.f : q > 127.f ? 127.f : q;
    p[i] = q == q ? (uint8_t)(int8_t)q : 0; /* NaN has no code (converting it is UB): 0 */
    break;
  }
  case QNN_DATATYPE_BOOL_8: p[i] = v != 0; break;
  case QNN_DATATYPE_INT_32: {
    int32_t iv = (int32_t)lrintf(v);
    memcpy(p + 4 * i, &iv, 4);
    break;
  }
  default: break;
  }
}

/* element strides of t right-aligned into an output of rank r; broadcast dims get stride 0 */
static void bstrides(const emu_tensor *t, uint32_t r, uint64_t *st) {
  uint64_t s = 1;
  for (int i = (int)r - 1; i >= 0; i--) {
    int ti = i - (int)(r - t->rank);
    if (ti < 0 || t->dims[ti] == 1) {
      st[i] = 0;
    } else {
      st[i] = s;
    }
    if (ti >= 0) s *= t->dims[ti];
  }
}

/* The output is walked in rows of its innermost dimension: for each row, row_base gives every
 * operand's element offset of the row's first element (st: the operand's strides in output
 * coordinates), and the row itself is a tight loop with one stride per operand. */
static uint64_t row_base(const emu_tensor *o, uint64_t row, const uint64_t *st) {
  uint64_t off = 0;
  for (int d = (int)o->rank - 2; d >= 0; d--) {
    off += (row % o->dims[d]) * st[d];
    row /= o->dims[d];
  }
  return off;
}

static uint32_t inner_len(const emu_tensor *o) { return o->rank ? o->dims[o->rank - 1] : 1; }

static float apply2(emu_op op, float x, float y) {
  switch (op) {
  case EMU_OP_ADD: return x + y;
  case EMU_OP_SUB: return x - y;
  case EMU_OP_MUL: return x * y;
  case EMU_OP_DIV: return x / y;
  case EMU_OP_MAX: return x > y ? x : (isnan(x) ? x : y);
  case EMU_OP_GREATER_EQUAL: return x >= y ? 1.0f : 0.0f;
  default: return 0;
  }
}

static void binary_op(emu_op op, const emu_tensor *a, const emu_tensor *b, const emu_tensor *o,
                      const uint8_t *pa, const uint8_t *pb, uint8_t *po) {
  uint64_t sa[EMU_MAX_RANK], sb[EMU_MAX_RANK];
  bstrides(a, o->rank, sa);
  bstrides(b, o->rank, sb);
  uint32_t inner = inner_len(o);
  uint64_t rows = inner ? o->numel / inner : 0, da = sa[o->rank - 1], db = sb[o->rank - 1];
  int f32 = a->dtype == QNN_DATATYPE_FLOAT_32 && b->dtype == QNN_DATATYPE_FLOAT_32 && o->dtype == QNN_DATATYPE_FLOAT_32;
  int i32 = a->dtype == QNN_DATATYPE_INT_32 && b->dtype == QNN_DATATYPE_INT_32;
  for (uint64_t r = 0; r < rows; r++) {
    uint64_t ia = row_base(o, r, sa), ib = row_base(o, r, sb), io = r * inner;
    if (i32) { /* exact integer arithmetic (indices, positions): int64, wrapped to int32 */
      for (uint32_t j = 0; j < inner; j++) {
        int32_t x, y;
        memcpy(&x, pa + 4 * (ia + j * da), 4);
        memcpy(&y, pb + 4 * (ib + j * db), 4);
        int64_t z = 0;
        switch (op) {
        case EMU_OP_ADD: z = (int64_t)x + y; break;
        case EMU_OP_SUB: z = (int64_t)x - y; break;
        case EMU_OP_MUL: z = (int64_t)x * y; break;
        case EMU_OP_DIV: z = y ? (int64_t)x / y : 0; break;
        case EMU_OP_MAX: z = x > y ? x : y; break;
        case EMU_OP_GREATER_EQUAL: z = x >= y; break;
        default: break;
        }
        if (o->dtype == QNN_DATATYPE_BOOL_8) {
          po[io + j] = z != 0;
        } else {
          int32_t w = (int32_t)(uint32_t)z;
          memcpy(po + 4 * (io + j), &w, 4);
        }
      }
      continue;
    }
    if (f32) { /* the common case without a per-element type switch */
      const float *x = (const float *)pa + ia, *y = (const float *)pb + ib;
      float *z = (float *)po + io;
      for (uint32_t j = 0; j < inner; j++) z[j] = apply2(op, x[j * da], y[j * db]);
      continue;
    }
    for (uint32_t j = 0; j < inner; j++) store(o, po, io + j, apply2(op, load(a, pa, ia + j * da), load(b, pb, ib + j * db)));
  }
}

/* picks, never computes: an unselected NaN stays out of the result */
static void select_op(const emu_graph *g, const emu_node *n, uint8_t *const *ptr) {
  const emu_tensor *c = &g->tensors[n->in[0]], *a = &g->tensors[n->in[1]], *b = &g->tensors[n->in[2]];
  const emu_tensor *o = &g->tensors[n->out[0]];
  uint64_t sc[EMU_MAX_RANK], sa[EMU_MAX_RANK], sb[EMU_MAX_RANK];
  uint32_t es = qnn_dtype_bytes(o->dtype), inner = inner_len(o);
  bstrides(c, o->rank, sc);
  bstrides(a, o->rank, sa);
  bstrides(b, o->rank, sb);
  uint64_t rows = inner ? o->numel / inner : 0, dc = sc[o->rank - 1], da = sa[o->rank - 1], db = sb[o->rank - 1];
  const uint8_t *pc = ptr[n->in[0]], *pa = ptr[n->in[1]], *pb = ptr[n->in[2]];
  uint8_t *po = ptr[n->out[0]];
  for (uint64_t r = 0; r < rows; r++) {
    uint64_t ic = row_base(o, r, sc), ia = row_base(o, r, sa), ib = row_base(o, r, sb), io = r * inner;
    for (uint32_t j = 0; j < inner; j++) {
      const uint8_t *src = pc[ic + j * dc] ? pa + (ia + j * da) * es : pb + (ib + j * db) * es;
      memcpy(po + (io + j) * es, src, es);
    }
  }
}

/* the integer dot product of W8A8: exact int64 accumulation, saturated to int32 */
static int32_t dot_q8(const emu_node *n, const uint8_t *pa, const uint8_t *pb, uint64_t offa, uint64_t offb,
                      uint32_t i, uint32_t j, uint32_t m, uint32_t nn, uint32_t k) {
  int64_t acc = 0;
  for (uint32_t kk = 0; kk < k; kk++) {
    uint64_t ai = n->transpose_in0 ? (uint64_t)kk * m + i : (uint64_t)i * k + kk;
    uint64_t bi = n->transpose_in1 ? (uint64_t)j * k + kk : (uint64_t)kk * nn + j;
    acc += (int64_t)(int8_t)pa[offa + ai] * (int8_t)pb[offb + bi];
  }
  return acc > INT32_MAX ? INT32_MAX : acc < INT32_MIN ? INT32_MIN : (int32_t)acc;
}

static void matmul(const emu_node *n, const emu_tensor *a, const emu_tensor *b, const emu_tensor *o,
                   const uint8_t *pa, const uint8_t *pb, uint8_t *po) {
  uint32_t m = o->dims[o->rank - 2], nn = o->dims[o->rank - 1];
  uint32_t k = n->transpose_in0 ? a->dims[a->rank - 2] : a->dims[a->rank - 1];
  emu_tensor ba = *a, bb = *b, bo = *o;
  ba.rank -= 2;
  bb.rank -= 2;
  bo.rank -= 2;
  uint64_t sa[EMU_MAX_RANK], sb[EMU_MAX_RANK];
  bstrides(&ba, bo.rank, sa);
  bstrides(&bb, bo.rank, sb);
  uint64_t batches = 1;
  for (uint32_t d = 0; d < bo.rank; d++) batches *= bo.dims[d];
  int f32 = a->dtype == QNN_DATATYPE_FLOAT_32 && b->dtype == QNN_DATATYPE_FLOAT_32 && o->dtype == QNN_DATATYPE_FLOAT_32;
  uint32_t idx[EMU_MAX_RANK] = {0};
  for (uint64_t bt = 0; bt < batches; bt++) {
    uint64_t ia = 0, ib = 0;
    for (uint32_t d = 0; d < bo.rank; d++) {
      ia += idx[d] * sa[d];
      ib += idx[d] * sb[d];
    }
    uint64_t offa = ia * (uint64_t)m * k, offb = ib * (uint64_t)nn * k, offo = bt * (uint64_t)m * nn;
    for (uint32_t i = 0; i < m; i++)
      for (uint32_t j = 0; j < nn; j++) {
        if (o->dtype == QNN_DATATYPE_SFIXED_POINT_32) {
          int32_t q = dot_q8(n, pa, pb, offa, offb, i, j, m, nn, k);
          memcpy(po + 4 * (offo + (uint64_t)i * nn + j), &q, 4);
          continue;
        }
        if (o->dtype == QNN_DATATYPE_SFIXED_POINT_16) {
          /* int32 sum, then requantized to the output encoding: round half away from zero,
           * saturated to int16 */
          double sb = b->n_axis_scales ? (double)b->axis_scales[j] : (double)b->scale;
          double v = round((double)dot_q8(n, pa, pb, offa, offb, i, j, m, nn, k) * a->scale * sb / o->scale);
          int16_t q = v != v ? 0 : (int16_t)(v > 32767 ? 32767 : v < -32768 ? -32768 : v);
          memcpy(po + 2 * (offo + (uint64_t)i * nn + j), &q, 2);
          continue;
        }
        if (f32) { /* pointer walk without a per-element type switch; same f64 accumulation */
          const float *x = (const float *)pa + offa + (n->transpose_in0 ? i : (uint64_t)i * k);
          const float *y = (const float *)pb + offb + (n->transpose_in1 ? (uint64_t)j * k : j);
          uint64_t dx = n->transpose_in0 ? m : 1, dy = n->transpose_in1 ? 1 : nn;
          double acc = 0;
          for (uint32_t kk = 0; kk < k; kk++) acc += (double)x[kk * dx] * y[kk * dy];
          ((float *)po)[offo + (uint64_t)i * nn + j] = (float)acc;
          continue;
        }
        double acc = 0;
        for (uint32_t kk = 0; kk < k; kk++) {
          uint64_t ai = n->transpose_in0 ? (uint64_t)kk * m + i : (uint64_t)i * k + kk;
          uint64_t bi = n->transpose_in1 ? (uint64_t)j * k + kk : (uint64_t)kk * nn + j;
          acc += (double)load(a, pa, offa + ai) * load(b, pb, offb + bi);
        }
        store(o, po, offo + (uint64_t)i * nn + j, (float)acc);
      }
    for (int d = (int)bo.rank - 1; d >= 0; d--) {
      if (++idx[d] < bo.dims[d]) break;
      idx[d] = 0;
    }
  }
}

static void row_op(const emu_node *n, const emu_tensor *x, const emu_tensor *o, const uint8_t *px,
                   uint8_t *po, const emu_tensor *gm, const uint8_t *pg, const emu_tensor *bt,
                   const uint8_t *pb) {
  uint32_t k = x->dims[x->rank - 1];
  uint64_t rows = k ? x->numel / k : 0;
  for (uint64_t r = 0; r < rows; r++) {
    uint64_t base = r * k;
    if (n->op == EMU_OP_SOFTMAX) {
      float mx = -INFINITY;
      for (uint32_t i = 0; i < k; i++) {
        float z = load(x, px, base + i) * n->beta;
        if (z > mx) mx = z;
      }
      double sum = 0;
      for (uint32_t i = 0; i < k; i++) sum += exp((double)(load(x, px, base + i) * n->beta - mx));
      for (uint32_t i = 0; i < k; i++)
        store(o, po, base + i, (float)(exp((double)(load(x, px, base + i) * n->beta - mx)) / sum));
      continue;
    }
    double mean = 0, ss = 0;
    if (n->op == EMU_OP_LAYERNORM) {
      for (uint32_t i = 0; i < k; i++) mean += load(x, px, base + i);
      mean /= k;
    }
    for (uint32_t i = 0; i < k; i++) {
      double d = load(x, px, base + i) - mean;
      ss += d * d;
    }
    double inv = 1.0 / sqrt(ss / k + n->epsilon);
    for (uint32_t i = 0; i < k; i++) {
      double y = (load(x, px, base + i) - mean) * inv * load(gm, pg, i);
      if (bt) y += load(bt, pb, i);
      store(o, po, base + i, (float)y);
    }
  }
}

/* copies elements of x to o, o walked in rows: st are x's strides per output dimension and
 * start x's offset of output element 0 */
static void gather_rows(const emu_tensor *x, const emu_tensor *o, const uint64_t *st, uint64_t start,
                        const uint8_t *px, uint8_t *po) {
  uint32_t es = qnn_dtype_bytes(x->dtype), inner = inner_len(o);
  uint64_t rows = inner ? o->numel / inner : 0, step = st[o->rank - 1];
  for (uint64_t r = 0; r < rows; r++) {
    const uint8_t *src = px + (start + row_base(o, r, st)) * es;
    uint8_t *dst = po + r * inner * es;
    if (step == 1) {
      memcpy(dst, src, (size_t)inner * es);
      continue;
    }
    for (uint32_t j = 0; j < inner; j++) memcpy(dst + (size_t)j * es, src + j * step * es, es);
  }
}

static void dense_strides(const emu_tensor *x, uint64_t *xs) {
  uint64_t s = 1;
  for (int d = (int)x->rank - 1; d >= 0; d--) {
    xs[d] = s;
    s *= x->dims[d];
  }
}

static void transpose(const emu_node *n, const emu_tensor *x, const emu_tensor *o, const uint8_t *px,
                      uint8_t *po) {
  uint64_t xs[EMU_MAX_RANK], st[EMU_MAX_RANK];
  dense_strides(x, xs);
  for (uint32_t d = 0; d < o->rank; d++) st[d] = xs[n->perm[d]];
  gather_rows(x, o, st, 0, px, po);
}

static void strided_slice(const emu_node *n, const emu_tensor *x, const emu_tensor *o,
                          const uint8_t *px, uint8_t *po) {
  uint64_t xs[EMU_MAX_RANK], st[EMU_MAX_RANK], start = 0;
  dense_strides(x, xs);
  for (uint32_t d = 0; d < o->rank; d++) {
    st[d] = xs[d] * (uint64_t)n->ranges[d][2];
    start += (uint64_t)n->ranges[d][0] * xs[d];
  }
  gather_rows(x, o, st, start, px, po);
}

static void concat(const emu_graph *g, const emu_node *n, uint8_t *const *ptr) {
  const emu_tensor *o = &g->tensors[n->out[0]];
  uint32_t es = qnn_dtype_bytes(o->dtype), ax = (uint32_t)n->axis;
  uint64_t outer = 1, inner = es;
  for (uint32_t d = 0; d < ax; d++) outer *= o->dims[d];
  for (uint32_t d = ax + 1; d < o->rank; d++) inner *= o->dims[d];
  uint8_t *dst = ptr[n->out[0]];
  for (uint64_t r = 0; r < outer; r++)
    for (uint32_t i = 0; i < n->n_in; i++) {
      const emu_tensor *t = &g->tensors[n->in[i]];
      uint64_t chunk = (uint64_t)t->dims[ax] * inner;
      memcpy(dst, ptr[n->in[i]] + r * chunk, chunk);
      dst += chunk;
    }
}

Qnn_ErrorHandle_t emu_node_run(const emu_graph *g, const emu_node *n, uint8_t *const *ptr,
                               char *msg, size_t cap) {
  const emu_tensor *x = &g->tensors[n->in[0]], *o = &g->tensors[n->out[0]];
  const uint8_t *px = ptr[n->in[0]];
  uint8_t *po = ptr[n->out[0]];
  switch (n->op) {
  case EMU_OP_ADD: case EMU_OP_SUB: case EMU_OP_MUL: case EMU_OP_DIV: case EMU_OP_MAX:
  case EMU_OP_GREATER_EQUAL:
    binary_op(n->op, x, &g->tensors[n->in[1]], o, px, ptr[n->in[1]], po);
    break;
  case EMU_OP_SELECT:
    select_op(g, n, ptr);
    break;
  case EMU_OP_EXP: case EMU_OP_NEG: case EMU_OP_SIN: case EMU_OP_COS: case EMU_OP_RELU:
  case EMU_OP_SIGMOID: case EMU_OP_TANH: case EMU_OP_CAST: case EMU_OP_QUANTIZE: case EMU_OP_DEQUANTIZE:
    for (uint64_t i = 0; i < o->numel; i++) {
      float v = load(x, px, i);
      switch (n->op) {
      case EMU_OP_EXP: v = expf(v); break;
      case EMU_OP_NEG: v = -v; break;
      case EMU_OP_SIN: v = sinf(v); break;
      case EMU_OP_COS: v = cosf(v); break;
      case EMU_OP_RELU: v = v > 0 ? v : (isnan(v) ? v : 0.0f); break;
      case EMU_OP_SIGMOID: v = (float)(1.0 / (1.0 + exp(-(double)v))); break;
      case EMU_OP_TANH: v = (float)tanh((double)v); break;
      default: break;
      }
      if (n->op == EMU_OP_CAST && x->dtype == QNN_DATATYPE_INT_32) {
        int32_t iv; /* exact int -> float rounding, not through float's 24-bit path twice */
        memcpy(&iv, px + 4 * i, 4);
        v = (float)iv;
      }
      store(o, po, i, v);
    }
    break;
  case EMU_OP_SOFTMAX:
    row_op(n, x, o, px, po, NULL, NULL, NULL, NULL);
    break;
  case EMU_OP_RMSNORM: case EMU_OP_LAYERNORM:
    row_op(n, x, o, px, po, &g->tensors[n->in[1]], ptr[n->in[1]],
           n->n_in > 2 ? &g->tensors[n->in[2]] : NULL, n->n_in > 2 ? ptr[n->in[2]] : NULL);
    break;
  case EMU_OP_MATMUL:
    matmul(n, x, &g->tensors[n->in[1]], o, px, ptr[n->in[1]], po);
    break;
  case EMU_OP_FC: { /* [batch, K] x [M, K]^T: a MatMul on 2-D views */
    emu_tensor a2 = *x;
    a2.rank = 2;
    a2.dims[1] = x->dims[x->rank - 1];
    a2.dims[0] = (uint32_t)(x->numel / a2.dims[1]);
    matmul(n, &a2, &g->tensors[n->in[1]], o, px, ptr[n->in[1]], po);
    if (n->n_in > 2) {
      const emu_tensor *bias = &g->tensors[n->in[2]];
      for (uint64_t i = 0; i < o->numel; i++)
        store(o, po, i, load(o, po, i) + load(bias, ptr[n->in[2]], i % bias->numel));
    }
    break;
  }
  case EMU_OP_GATHER: {
    const emu_tensor *ids = &g->tensors[n->in[1]];
    uint32_t ax = (uint32_t)n->axis, dim = x->dims[ax];
    uint64_t outer = 1, inner = qnn_dtype_bytes(x->dtype);
    for (uint32_t d = 0; d < ax; d++) outer *= x->dims[d];
    for (uint32_t d = ax + 1; d < x->rank; d++) inner *= x->dims[d];
    for (uint64_t i = 0; i < ids->numel; i++) {
      int32_t id;
      memcpy(&id, ptr[n->in[1]] + 4 * i, 4);
      if (id < 0 || (uint32_t)id >= dim)
        FAIL(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: Gather index %d outside [0, %u)", n->name, id, dim);
    }
    for (uint64_t o2 = 0; o2 < outer; o2++)
      for (uint64_t i = 0; i < ids->numel; i++) {
        int32_t id;
        memcpy(&id, ptr[n->in[1]] + 4 * i, 4);
        memcpy(po + (o2 * ids->numel + i) * inner, px + (o2 * dim + (uint64_t)id) * inner, inner);
      }
    break;
  }
  case EMU_OP_RESHAPE:
    memmove(po, px, o->nbytes);
    break;
  case EMU_OP_TRANSPOSE:
    transpose(n, x, o, px, po);
    break;
  case EMU_OP_STRIDEDSLICE:
    strided_slice(n, x, o, px, po);
    break;
  case EMU_OP_CONCAT:
    concat(g, n, ptr);
    break;
  }
  /* an FP16 graph on the HTP keeps every float value at half precision, FLOAT_32 tensors
   * included: round what this node wrote */
  if (g->fp16 && o->dtype == QNN_DATATYPE_FLOAT_32) {
    float *f = (float *)po;
    for (uint64_t i = 0; i < o->numel; i++) f[i] = emu_round_half(f[i]);
  }
  return QNN_SUCCESS;
}
