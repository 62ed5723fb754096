/*
 * qnn_lower.c: emits an xpu IR graph as a QNN graph: one QNN tensor per IR tensor (inputs
 * APP_WRITE, outputs APP_READ, constants STATIC, the rest NATIVE), then the QNN ops of each node.
 * Ops without a QNN counterpart are composed: SILU = x*Sigmoid(x), GELU (tanh form) =
 * x*Sigmoid(2c(x+0.044715x^3)), causal SOFTMAX = Softmax(Select(visible, x, -big)) * keep,
 * ROPE = x*C + Gather(x, pair swap)*S with C/S gathered from static cos/sin tables, ATTENTION
 * from Transpose/MatMul/Softmax with INT_32 visibility masks (and K/V sliced or zeroed past the
 * visible keys, so masked rows are never used). Everything emitted stays within the target
 * backend's published op support (plugins/qnn/README.md has the table): rank <= 4, FP16-safe
 * constants, no broadcasting MatMul, no Sin/Cos.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qnn_half.h"
#include "qnn_internal.h"

int qnn_i8_scale(const xpu_ir_graph *ir, uint32_t t, float *scale);

#define QMAX_RANK 6

typedef struct qt {
  Qnn_Tensor_t t;
  uint32_t dims[QMAX_RANK];
  char name[48];
} qt;

typedef struct lower {
  const qnn_lower_cfg *cfg;
  const QnnInterfaceTable_t *fn;
  qt **ts; /* IR tensors first (index = IR index, NULL until created), then temporaries */
  uint32_t n, cap;
  void **owned; /* static data we made; QNN may read it until graphFinalize */
  uint32_t n_owned, cap_owned;
  uint32_t node_seq, cur_node;
  char *err;
  size_t errcap;
  struct { /* ROPE cos/sin tables, shared by every ROPE node with the same parameters */
    Qnn_DataType_t dt;
    uint32_t d, nr, mode;
    float base, fs;
    int ca, sa, cb, sb;
  } rope[8];
  uint32_t n_rope;
} lower;

static int fail(lower *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(lower *L, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int k = snprintf(L->err, L->errcap, "node %u (%s): ", L->cur_node,
                   xpu_op_name(L->cfg->ir->nodes[L->cur_node].op));
  if (k > 0 && (size_t)k < L->errcap) vsnprintf(L->err + k, L->errcap - (size_t)k, fmt, ap);
  va_end(ap);
  return -1;
}

static void *own(lower *L, size_t n) {
  if (L->n_owned == L->cap_owned) {
    uint32_t nc = L->cap_owned ? L->cap_owned * 2 : 32;
    void **no = realloc(L->owned, nc * sizeof *no);
    if (!no) return NULL;
    L->owned = no;
    L->cap_owned = nc;
  }
  void *p = calloc(1, n ? n : 1);
  if (p) L->owned[L->n_owned++] = p;
  return p;
}

static int push(lower *L, qt *q) {
  if (L->n == L->cap) {
    uint32_t nc = L->cap * 2;
    qt **nt = realloc(L->ts, nc * sizeof *nt);
    if (!nt) return -1;
    memset(nt + L->cap, 0, (nc - L->cap) * sizeof *nt);
    L->ts = nt;
    L->cap = nc;
  }
  L->ts[L->n] = q;
  return (int)L->n++;
}

/* creates a QNN tensor; data non-NULL makes it STATIC (bytes must outlive finalize); axis_so
 * non-NULL gives an 8-bit tensor a per-axis encoding along axis 0 (one entry per index) */
static int mk_enc(lower *L, int slot, Qnn_TensorType_t type, Qnn_DataType_t dt, float scale,
                  Qnn_ScaleOffset_t *axis_so, uint32_t rank, const uint32_t *dims, const void *data) {
  qt *q = own(L, sizeof *q);
  if (!q) return fail(L, "out of memory");
  if (rank == 0) { /* QNN has no rank 0: a scalar is [1] */
    rank = 1;
    q->dims[0] = 1;
  } else {
    memcpy(q->dims, dims, rank * sizeof *dims);
  }
  uint64_t nbytes = qnn_dtype_bytes(dt);
  for (uint32_t i = 0; i < rank; i++) nbytes *= q->dims[i];
  snprintf(q->name, sizeof q->name, slot >= 0 ? "t%d" : "tmp%u", slot >= 0 ? slot : (int)L->n);
  Qnn_TensorV1_t *v = &q->t.v1;
  q->t.version = QNN_TENSOR_VERSION_1;
  v->name = q->name;
  v->type = type;
  v->dataFormat = QNN_TENSOR_DATA_FORMAT_DENSE;
  v->dataType = dt;
  v->quantizeParams.encodingDefinition = QNN_DEFINITION_UNDEFINED;
  v->quantizeParams.quantizationEncoding = QNN_QUANTIZATION_ENCODING_UNDEFINED;
  if (dt == QNN_DATATYPE_SFIXED_POINT_8 || dt == QNN_DATATYPE_SFIXED_POINT_16 || dt == QNN_DATATYPE_SFIXED_POINT_32) {
    v->quantizeParams.encodingDefinition = QNN_DEFINITION_DEFINED;
    v->quantizeParams.quantizationEncoding = QNN_QUANTIZATION_ENCODING_SCALE_OFFSET;
    v->quantizeParams.scaleOffsetEncoding.scale = scale;
    v->quantizeParams.scaleOffsetEncoding.offset = 0;
    if (axis_so) {
      v->quantizeParams.quantizationEncoding = QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET;
      v->quantizeParams.axisScaleOffsetEncoding = (Qnn_AxisScaleOffset_t){0, rank ? dims[0] : 1, axis_so};
    }
  }
  v->rank = rank;
  v->dimensions = q->dims;
  v->memType = QNN_TENSORMEMTYPE_RAW;
  if (data) {
    if (nbytes > UINT32_MAX) return fail(L, "constant of %llu bytes is larger than QNN's 4 GiB client buffer",
                                         (unsigned long long)nbytes);
    v->clientBuf.data = (void *)data;
    v->clientBuf.dataSize = (uint32_t)nbytes;
  }
  Qnn_ErrorHandle_t e = L->fn->tensorCreateGraphTensor(L->cfg->graph, &q->t);
  if (e != QNN_SUCCESS)
    return fail(L, "tensorCreateGraphTensor: error %llu: %s", (unsigned long long)e, qnn_lib_errmsg(L->cfg->lib, e));
  if (slot >= 0) {
    L->ts[slot] = q;
    return slot;
  }
  int idx = push(L, q);
  return idx < 0 ? fail(L, "out of memory") : idx;
}

static int mk(lower *L, int slot, Qnn_TensorType_t type, Qnn_DataType_t dt, float scale, uint32_t rank,
              const uint32_t *dims, const void *data) {
  return mk_enc(L, slot, type, dt, scale, NULL, rank, dims, data);
}

static uint32_t rank_of(lower *L, int t) { return L->ts[t]->t.v1.rank; }
static const uint32_t *dims_of(lower *L, int t) { return L->ts[t]->dims; }
static Qnn_DataType_t dt_of(lower *L, int t) { return L->ts[t]->t.v1.dataType; }

/* the QNN tensor of IR tensor i, created on first use */
static int irt(lower *L, uint32_t i) {
  if (L->ts[i]) return (int)i;
  const xpu_ir_graph *ir = L->cfg->ir;
  const xpu_ir_tensor *t = &ir->tensors[i];
  uint32_t dims[QMAX_RANK];
  for (uint32_t d = 0; d < t->rank; d++) dims[d] = (uint32_t)t->shape[d];
  Qnn_TensorType_t type = QNN_TENSOR_TYPE_NATIVE;
  const void *data = NULL;
  float scale = 1.0f;
  if (t->dtype == XPU_DT_I8) qnn_i8_scale(ir, i, &scale);
  if (t->kind == XPU_TENSOR_INPUT) type = QNN_TENSOR_TYPE_APP_WRITE;
  for (uint32_t o = 0; o < ir->header->n_outputs; o++)
    if (ir->outputs[o] == i) type = QNN_TENSOR_TYPE_APP_READ;
  if (t->kind == XPU_TENSOR_CONST) {
    type = QNN_TENSOR_TYPE_STATIC;
    char msg[256];
    data = L->cfg->const_bytes(L->cfg->const_user, t->const_buffer, t->const_offset, xpu_ir_nbytes(t), msg, sizeof msg);
    if (!data) return fail(L, "constant tensor %u: %s", i, msg);
  }
  return mk(L, (int)i, type, qnn_dtype_of(t->dtype), scale, t->rank, dims, data);
}

static int tmp(lower *L, Qnn_DataType_t dt, uint32_t rank, const uint32_t *dims) {
  return mk(L, -1, QNN_TENSOR_TYPE_NATIVE, dt, 1.0f, rank, dims, NULL);
}

/* a static tensor of float values in dtype dt (FLOAT_32 or FLOAT_16) */
static int cst_f(lower *L, Qnn_DataType_t dt, uint32_t rank, const uint32_t *dims, const float *vals) {
  uint64_t n = 1;
  for (uint32_t i = 0; i < rank; i++) n *= dims[i];
  uint8_t *data = own(L, n * qnn_dtype_bytes(dt));
  if (!data) return fail(L, "out of memory");
  for (uint64_t i = 0; i < n; i++) {
    if (dt == QNN_DATATYPE_FLOAT_16) {
      uint16_t h = qnn_float_to_half(vals[i]);
      memcpy(data + 2 * i, &h, 2);
    } else {
      memcpy(data + 4 * i, &vals[i], 4);
    }
  }
  return mk(L, -1, QNN_TENSOR_TYPE_STATIC, dt, 1.0f, rank, dims, data);
}

static int cst_scalar(lower *L, Qnn_DataType_t dt, float v) {
  uint32_t one = 1;
  return cst_f(L, dt, 1, &one, &v);
}

/* a [k] tensor filled with v */
static int cst_fill(lower *L, Qnn_DataType_t dt, uint32_t k, float v) {
  float *vals = own(L, (size_t)k * sizeof(float));
  if (!vals) return fail(L, "out of memory");
  for (uint32_t i = 0; i < k; i++) vals[i] = v;
  return cst_f(L, dt, 1, &k, vals);
}

/* a static INT_32 tensor */
static int cst_i32(lower *L, uint32_t rank, const uint32_t *dims, const int32_t *vals) {
  uint64_t n = 1;
  for (uint32_t i = 0; i < rank; i++) n *= dims[i];
  int32_t *data = own(L, n * 4);
  if (!data) return fail(L, "out of memory");
  memcpy(data, vals, n * 4);
  return mk(L, -1, QNN_TENSOR_TYPE_STATIC, QNN_DATATYPE_INT_32, 1.0f, rank, dims, data);
}

static int cst_i32_scalar(lower *L, int32_t v) {
  uint32_t one = 1;
  return cst_i32(L, 1, &one, &v);
}

static int htp(const lower *L) { return L->cfg->target == QNN_BACKEND_ID_HTP; }

/* the score a masked key gets before Softmax(beta): picked by Select, never added, so it only has
 * to make exp() vanish. On the HTP every float is FP16, where -1e30 would be -inf (and a fully
 * masked row NaN): the most negative finite half, divided by beta so beta * it stays finite. */
static float masked_score(const lower *L, float beta) {
  if (!htp(L)) return -1e30f;
  return -65504.0f / (beta > 1.0f ? beta : 1.0f);
}

/* ---------------------------------------------------------------- params and nodes */

static Qnn_Param_t p_scalar(const char *name, Qnn_DataType_t dt) {
  Qnn_Param_t p;
  memset(&p, 0, sizeof p);
  p.paramType = QNN_PARAMTYPE_SCALAR;
  p.name = name;
  p.scalarParam.dataType = dt;
  return p;
}
static Qnn_Param_t p_u32(const char *name, uint32_t v) {
  Qnn_Param_t p = p_scalar(name, QNN_DATATYPE_UINT_32);
  p.scalarParam.uint32Value = v;
  return p;
}
static Qnn_Param_t p_f32(const char *name, float v) {
  Qnn_Param_t p = p_scalar(name, QNN_DATATYPE_FLOAT_32);
  p.scalarParam.floatValue = v;
  return p;
}
static Qnn_Param_t p_bool(const char *name, int v) {
  Qnn_Param_t p = p_scalar(name, QNN_DATATYPE_BOOL_8);
  p.scalarParam.bool8Value = v ? 1 : 0;
  return p;
}

/* a tensor parameter: a STATIC tensor created in the graph, its description copied in */
static int p_tensor(lower *L, Qnn_Param_t *p, const char *name, Qnn_DataType_t dt, uint32_t rank,
                    const uint32_t *dims, const void *vals) {
  uint64_t n = qnn_dtype_bytes(dt);
  for (uint32_t i = 0; i < rank; i++) n *= dims[i];
  void *data = own(L, n);
  if (!data) return fail(L, "out of memory");
  memcpy(data, vals, n);
  int t = mk(L, -1, QNN_TENSOR_TYPE_STATIC, dt, 1.0f, rank, dims, data);
  if (t < 0) return -1;
  memset(p, 0, sizeof *p);
  p->paramType = QNN_PARAMTYPE_TENSOR;
  p->name = name;
  p->tensorParam = L->ts[t]->t;
  return 0;
}

static int emit(lower *L, const char *type, const int *in, uint32_t n_in, int out, Qnn_Param_t *params,
                uint32_t n_params) {
  Qnn_Tensor_t ins[XPU_MAX_INPUTS + 1], outs[1];
  for (uint32_t i = 0; i < n_in; i++) ins[i] = L->ts[in[i]]->t;
  outs[0] = L->ts[out]->t;
  char name[48];
  snprintf(name, sizeof name, "n%u_%u_%s", L->cur_node, L->node_seq++, type);
  Qnn_OpConfig_t op;
  memset(&op, 0, sizeof op);
  op.version = QNN_OPCONFIG_VERSION_1;
  op.v1.name = name;
  op.v1.packageName = QNN_OP_PACKAGE_NAME_QTI_AISW;
  op.v1.typeName = type;
  op.v1.numOfParams = n_params;
  op.v1.params = n_params ? params : NULL;
  op.v1.numOfInputs = n_in;
  op.v1.inputTensors = ins;
  op.v1.numOfOutputs = 1;
  op.v1.outputTensors = outs;
  Qnn_ErrorHandle_t e = L->fn->graphAddNode(L->cfg->graph, op);
  if (e != QNN_SUCCESS)
    return fail(L, "graphAddNode %s: error %llu: %s", type, (unsigned long long)e, qnn_lib_errmsg(L->cfg->lib, e));
  return 0;
}

/* out = op(a, b); out < 0 makes a temporary of the given shape */
static int op2(lower *L, const char *type, int a, int b, int out, uint32_t rank, const uint32_t *dims) {
  if (a < 0 || b < 0) return -1;
  if (out < 0 && (out = tmp(L, dt_of(L, a), rank, dims)) < 0) return -1;
  int in[2] = {a, b};
  return emit(L, type, in, 2, out, NULL, 0) < 0 ? -1 : out;
}

static int op1(lower *L, const char *type, int a, int out, Qnn_DataType_t dt, uint32_t rank, const uint32_t *dims) {
  if (a < 0) return -1;
  if (out < 0 && (out = tmp(L, dt, rank, dims)) < 0) return -1;
  return emit(L, type, &a, 1, out, NULL, 0) < 0 ? -1 : out;
}

/* elementwise op2 whose output has the broadcast shape of a and b */
static int bin(lower *L, const char *type, int a, int b, int out) {
  if (a < 0 || b < 0) return -1;
  uint32_t ra = rank_of(L, a), rb = rank_of(L, b), r = ra > rb ? ra : rb, dims[QMAX_RANK];
  for (uint32_t i = 0; i < r; i++) {
    uint32_t da = i < r - ra ? 1 : dims_of(L, a)[i - (r - ra)];
    uint32_t db = i < r - rb ? 1 : dims_of(L, b)[i - (r - rb)];
    dims[i] = da > db ? da : db;
  }
  return op2(L, type, a, b, out, r, dims);
}

static int reshape(lower *L, int a, int out, uint32_t rank, const uint32_t *dims) {
  return op1(L, "Reshape", a, out, a >= 0 ? dt_of(L, a) : QNN_DATATYPE_FLOAT_32, rank, dims);
}

static int cast(lower *L, int a, Qnn_DataType_t dt) {
  if (a < 0) return -1;
  if (dt_of(L, a) == dt) return a;
  return op1(L, "Cast", a, -1, dt, rank_of(L, a), dims_of(L, a));
}

static int transpose(lower *L, int a, int out, const uint32_t *perm) {
  if (a < 0) return -1;
  uint32_t r = rank_of(L, a), dims[QMAX_RANK];
  for (uint32_t i = 0; i < r; i++) dims[i] = dims_of(L, a)[perm[i]];
  if (out < 0 && (out = tmp(L, dt_of(L, a), r, dims)) < 0) return -1;
  Qnn_Param_t p;
  if (p_tensor(L, &p, "perm", QNN_DATATYPE_UINT_32, 1, &r, perm) < 0) return -1;
  return emit(L, "Transpose", &a, 1, out, &p, 1) < 0 ? -1 : out;
}

/* a[.., begin:end, ..] along axis */
static int slice(lower *L, int a, int out, uint32_t axis, uint32_t begin, uint32_t end) {
  if (a < 0) return -1;
  uint32_t r = rank_of(L, a), dims[QMAX_RANK], rdims[2] = {r, 3};
  int32_t ranges[QMAX_RANK * 3];
  memcpy(dims, dims_of(L, a), r * sizeof *dims);
  for (uint32_t i = 0; i < r; i++) {
    ranges[3 * i] = i == axis ? (int32_t)begin : 0;
    ranges[3 * i + 1] = i == axis ? (int32_t)end : (int32_t)dims[i];
    ranges[3 * i + 2] = 1;
  }
  dims[axis] = end - begin;
  if (out < 0 && (out = tmp(L, dt_of(L, a), r, dims)) < 0) return -1;
  Qnn_Param_t p;
  if (p_tensor(L, &p, "ranges", QNN_DATATYPE_INT_32, 2, rdims, ranges) < 0) return -1;
  return emit(L, "StridedSlice", &a, 1, out, &p, 1) < 0 ? -1 : out;
}

static int concat(lower *L, const int *in, uint32_t n, uint32_t axis, int out) {
  for (uint32_t i = 0; i < n; i++)
    if (in[i] < 0) return -1;
  uint32_t r = rank_of(L, in[0]), dims[QMAX_RANK];
  memcpy(dims, dims_of(L, in[0]), r * sizeof *dims);
  for (uint32_t i = 1; i < n; i++) dims[axis] += dims_of(L, in[i])[axis];
  if (out < 0 && (out = tmp(L, dt_of(L, in[0]), r, dims)) < 0) return -1;
  Qnn_Param_t p = p_u32("axis", axis);
  return emit(L, "Concat", in, n, out, &p, 1) < 0 ? -1 : out;
}

static int matmul(lower *L, int a, int b, int out, int transpose_b) {
  if (a < 0 || b < 0) return -1;
  uint32_t ra = rank_of(L, a), rb = rank_of(L, b), r = ra > rb ? ra : rb, dims[QMAX_RANK];
  for (uint32_t i = 0; i + 2 < r; i++) {
    uint32_t da = i < r - ra ? 1 : dims_of(L, a)[i - (r - ra)];
    uint32_t db = i < r - rb ? 1 : dims_of(L, b)[i - (r - rb)];
    dims[i] = da > db ? da : db;
  }
  dims[r - 2] = dims_of(L, a)[ra - 2];
  dims[r - 1] = transpose_b ? dims_of(L, b)[rb - 2] : dims_of(L, b)[rb - 1];
  if (out < 0 && (out = tmp(L, dt_of(L, a), r, dims)) < 0) return -1;
  Qnn_Param_t p[2] = {p_bool("transpose_in0", 0), p_bool("transpose_in1", transpose_b)};
  int in[2] = {a, b};
  return emit(L, "MatMul", in, 2, out, p, 2) < 0 ? -1 : out;
}

static int softmax(lower *L, int a, int out, float beta) {
  if (a < 0) return -1;
  if (out < 0 && (out = tmp(L, dt_of(L, a), rank_of(L, a), dims_of(L, a))) < 0) return -1;
  Qnn_Param_t p[2] = {p_u32("axis", rank_of(L, a) - 1), p_f32("beta", beta)};
  return emit(L, "Softmax", &a, 1, out, p, 2) < 0 ? -1 : out;
}

/* ---------------------------------------------------------------- composed ops */

/* a >= b (INT_32 or float operands) as a BOOL_8 tensor of the broadcast shape */
static int greater_equal(lower *L, int a, int b, uint32_t rank, const uint32_t *dims) {
  if (a < 0 || b < 0) return -1;
  int out = tmp(L, QNN_DATATYPE_BOOL_8, rank, dims);
  int in[2] = {a, b};
  return out < 0 || emit(L, "ElementWiseGreaterEqual", in, 2, out, NULL, 0) < 0 ? -1 : out;
}

static int select3(lower *L, int c, int a, int b, uint32_t rank, const uint32_t *dims) {
  if (c < 0 || a < 0 || b < 0) return -1;
  int out = tmp(L, dt_of(L, a), rank, dims);
  int ins[3] = {c, a, b};
  return out < 0 || emit(L, "ElementWiseSelect", ins, 3, out, NULL, 0) < 0 ? -1 : out;
}

/* an INT_32 ramp: vals[i] = i % period + add, of the given dims (exact: never a float index) */
static int ramp(lower *L, uint32_t rank, const uint32_t *dims, uint32_t n, uint32_t period, int64_t add) {
  int32_t *v = own(L, (size_t)n * sizeof(int32_t));
  if (!v) return fail(L, "out of memory");
  for (uint32_t i = 0; i < n; i++) v[i] = (int32_t)((int64_t)(i % period) + add);
  return cst_i32(L, rank, dims, v);
}

/* causal visibility as BOOL_8 [rows, cols]: key j is visible to row r iff j <= r % period + off,
 * off a constant or (qo >= 0) the INT_32 [1] tensor qo plus the constant. *any_empty says whether
 * some row sees no key (only known for a constant offset; assumed with a run-time one). */
static int visibility(lower *L, uint32_t rows, uint32_t period, uint32_t cols, int64_t off, int qo, int *any_empty) {
  uint32_t dr1[2] = {rows, 1}, d1c[2] = {1, cols}, drc[2] = {rows, cols};
  if (off > INT32_MAX - (int64_t)rows || off < INT32_MIN + (int64_t)cols) return fail(L, "causal offset out of INT_32 range");
  int lim = ramp(L, 2, dr1, rows, period, qo >= 0 ? 0 : off);
  if (qo >= 0) lim = bin(L, "ElementWiseAdd", lim, qo, -1);
  *any_empty = qo >= 0;
  for (uint32_t r = 0; qo < 0 && r < rows; r++) *any_empty |= (int64_t)(r % period) + off < 0;
  return greater_equal(L, lim, ramp(L, 2, d1c, cols, cols, 0), 2, drc);
}

/* 1 where cond, else 0, in dtype dt */
static int keep_of(lower *L, int cond, Qnn_DataType_t dt, uint32_t rank, const uint32_t *dims) {
  return select3(L, cond, cst_scalar(L, dt, 1.0f), cst_scalar(L, dt, 0.0f), rank, dims);
}

static int lower_softmax(lower *L, const xpu_ir_node *n, int x, int out) {
  float beta = n->fattr[0] != 0 ? n->fattr[0] : 1.0f;
  if (n->iattr[0] != 1) return softmax(L, x, out, beta);
  Qnn_DataType_t dt = dt_of(L, x);
  uint32_t r = rank_of(L, x), cols = dims_of(L, x)[r - 1], rows = r >= 2 ? dims_of(L, x)[r - 2] : 1;
  uint32_t drc[2] = {rows, cols}, mr = r >= 2 ? 2 : 1;
  const uint32_t *md = r >= 2 ? drc : &drc[1];
  int empty;
  int cond = visibility(L, rows, rows, cols, n->iattr[1], -1, &empty);
  if (r == 1) cond = reshape(L, cond, -1, 1, &cols);
  int t = select3(L, cond, x, cst_scalar(L, dt, masked_score(L, beta)), r, dims_of(L, x));
  if (!empty) return softmax(L, t, out, beta);
  int s = softmax(L, t, -1, beta); /* a row that sees nothing gives 0: multiply by the mask */
  return bin(L, "ElementWiseMultiply", s, keep_of(L, cond, dt, mr, md), out);
}

/* The cos/sin of ROPE without Sin/Cos on the NPU and without evaluating a large angle in FP16:
 * theta(p) = (64a + b) * w with a = p / 64, b = p % 64, so cos/sin come from two static tables
 * of cos/sin(64a*w) and cos/sin(b*w) (computed here in double) by angle addition. Tables are
 * laid out per output dim d: the rotation sign of d is folded into the sin tables, a dim past
 * n_rot has angle 0 (cos 1, sin 0), so out = x*C + swap(x)*S with swap the pair partner. */
static int rope_tables(lower *L, Qnn_DataType_t dt, uint32_t D, uint32_t nr, uint32_t mode, float base, float fs,
                       int *ca, int *sa, int *cb, int *sb) {
  for (uint32_t i = 0; i < L->n_rope; i++)
    if (L->rope[i].dt == dt && L->rope[i].d == D && L->rope[i].nr == nr && L->rope[i].mode == mode &&
        L->rope[i].base == base && L->rope[i].fs == fs) {
      *ca = L->rope[i].ca, *sa = L->rope[i].sa, *cb = L->rope[i].cb, *sb = L->rope[i].sb;
      return 0;
    }
  const uint32_t ra = QNN_ROPE_MAX_POS / QNN_ROPE_SPLIT, rb = QNN_ROPE_SPLIT;
  float *tc = own(L, (size_t)ra * D * sizeof(float)), *ts = own(L, (size_t)ra * D * sizeof(float));
  if (!tc || !ts) return fail(L, "out of memory");
  uint32_t half = nr / 2;
  for (int which = 0; which < 2; which++) {
    uint32_t rows = which == 0 ? ra : rb;
    double step = which == 0 ? (double)QNN_ROPE_SPLIT : 1.0;
    for (uint32_t p = 0; p < rows; p++)
      for (uint32_t d = 0; d < D; d++) {
        double ang = 0, sign = 0;
        if (d < nr) {
          uint32_t i = mode == 2 ? (d < half ? d : d - half) : d / 2;
          sign = mode == 2 ? (d < half ? -1.0 : 1.0) : (d % 2 == 0 ? -1.0 : 1.0);
          ang = (double)p * step * (double)fs * pow((double)base, -2.0 * i / nr);
        }
        tc[(size_t)p * D + d] = (float)cos(ang);
        ts[(size_t)p * D + d] = (float)(sign * sin(ang));
      }
    uint32_t td[2] = {rows, D};
    int c = cst_f(L, dt, 2, td, tc), sn = cst_f(L, dt, 2, td, ts);
    if (c < 0 || sn < 0) return -1;
    if (which == 0) *ca = c, *sa = sn;
    else *cb = c, *sb = sn;
  }
  if (L->n_rope < sizeof L->rope / sizeof L->rope[0])
    L->rope[L->n_rope++] = (__typeof__(L->rope[0])){dt, D, nr, mode, base, fs, *ca, *sa, *cb, *sb};
  return 0;
}

static int gather(lower *L, int table, int ids, int32_t axis, int out) {
  if (table < 0 || ids < 0) return -1;
  uint32_t d[QMAX_RANK], rk = 0, tr = rank_of(L, table);
  for (int32_t i = 0; i < axis; i++) d[rk++] = dims_of(L, table)[i];
  for (uint32_t i = 0; i < rank_of(L, ids); i++) d[rk++] = dims_of(L, ids)[i];
  for (uint32_t i = (uint32_t)axis + 1; i < tr; i++) d[rk++] = dims_of(L, table)[i];
  if (out < 0 && (out = tmp(L, dt_of(L, table), rk, d)) < 0) return -1;
  Qnn_Param_t p = p_scalar("axis", QNN_DATATYPE_INT_32);
  p.scalarParam.int32Value = axis;
  int in[2] = {table, ids};
  return emit(L, "Gather", in, 2, out, &p, 1) < 0 ? -1 : out;
}

static int lower_rope(lower *L, const xpu_ir_node *n, int x, int pos, int out) {
  Qnn_DataType_t dt = dt_of(L, x);
  uint32_t r = rank_of(L, x), T = dims_of(L, x)[r - 3], D = dims_of(L, x)[r - 1];
  uint32_t nr = n->iattr[1] ? (uint32_t)n->iattr[1] : D, half = nr / 2, mode = (uint32_t)n->iattr[0];
  float base = n->fattr[0] != 0 ? n->fattr[0] : 10000.0f, fs = n->fattr[1] != 0 ? n->fattr[1] : 1.0f;
  int ca = -1, sa = -1, cb = -1, sb = -1;
  if (rope_tables(L, dt, D, nr, mode, base, fs, &ca, &sa, &cb, &sb) < 0) return -1;
  /* a = pos / 64, b = pos - 64a: exact INT_32 arithmetic */
  int split = cst_i32_scalar(L, QNN_ROPE_SPLIT);
  int a = bin(L, "ElementWiseDivide", pos, split, -1);
  int b = bin(L, "ElementWiseSubtract", pos, bin(L, "ElementWiseMultiply", a, split, -1), -1);
  int cA = gather(L, ca, a, 0, -1), sA = gather(L, sa, a, 0, -1);
  int cB = gather(L, cb, b, 0, -1), sB = gather(L, sb, b, 0, -1);
  int c = bin(L, "ElementWiseSubtract", bin(L, "ElementWiseMultiply", cA, cB, -1), bin(L, "ElementWiseMultiply", sA, sB, -1), -1);
  int sn = bin(L, "ElementWiseAdd", bin(L, "ElementWiseMultiply", sA, cB, -1), bin(L, "ElementWiseMultiply", cA, sB, -1), -1);
  uint32_t cd[3] = {T, 1, D};
  c = reshape(L, c, -1, 3, cd);
  sn = reshape(L, sn, -1, 3, cd);
  /* the pair partner of every dim, by a Gather on the last axis (no rank-5 view, no slices) */
  int32_t *perm = own(L, (size_t)D * sizeof(int32_t));
  if (!perm) return fail(L, "out of memory");
  for (uint32_t d = 0; d < D; d++)
    perm[d] = (int32_t)(d >= nr ? d : mode == 2 ? (d < half ? d + half : d - half) : (d ^ 1u));
  int sw = gather(L, x, cst_i32(L, 1, &D, perm), (int32_t)(r - 1), -1);
  return bin(L, "ElementWiseAdd", bin(L, "ElementWiseMultiply", x, c, -1), bin(L, "ElementWiseMultiply", sw, sn, -1), out);
}

/* K/V rows past the last visible key replaced by zeros with Select (which picks, so garbage, NaN
 * included, never reaches the arithmetic): row j is kept iff j <= Tq - 1 + q_offset */
static int zero_hidden_rows(lower *L, int qo, uint32_t Tq, uint32_t Tk, int *k, int *v) {
  uint32_t dk11[3] = {Tk, 1, 1};
  int last = bin(L, "ElementWiseAdd", cst_i32_scalar(L, (int32_t)Tq - 1), qo, -1);
  int kvc = greater_equal(L, last, ramp(L, 3, dk11, Tk, Tk, 0), 3, dk11);
  Qnn_DataType_t dt = dt_of(L, *k);
  int zero = cst_scalar(L, dt, 0.0f);
  int nk = select3(L, kvc, *k, zero, rank_of(L, *k), dims_of(L, *k));
  int nv = select3(L, kvc, *v, zero, rank_of(L, *v), dims_of(L, *v));
  if (nk < 0 || nv < 0) return -1;
  *k = nk;
  *v = nv;
  return 0;
}

/* op set v2's tree mask as BOOL_8 [Tq, Tk]: with d = j - q_offset, key j is visible iff d < 0
 * (the prefix), or 0 <= d < Tq and mask[i, d] != 0 (the tree block); keys at d >= Tq never are.
 * mask[i, d] is read by a Gather along the mask's columns with d clamped into [0, Tq), all index
 * arithmetic in INT_32; the picks are Selects on INT_32 0/1 values (the HTP selects no BOOL_8). */
static int tree_visibility(lower *L, int mask, int qo, uint32_t Tq, uint32_t Tk) {
  uint32_t d1k[2] = {1, Tk}, dqk[2] = {Tq, Tk};
  int d = bin(L, "ElementWiseSubtract", ramp(L, 2, d1k, Tk, Tk, 0), qo, -1);
  int lt0 = greater_equal(L, cst_i32_scalar(L, -1), d, 2, d1k);
  int geq = greater_equal(L, d, cst_i32_scalar(L, (int32_t)Tq), 2, d1k);
  int zero = cst_i32_scalar(L, 0), one = cst_i32_scalar(L, 1);
  int idx = select3(L, lt0, zero, select3(L, geq, zero, d, 2, d1k), 2, d1k);
  uint32_t dk = Tk;
  int picked = gather(L, mask, reshape(L, idx, -1, 1, &dk), 1, -1); /* [Tq, Tk] of the mask's bytes */
  int mb = tmp(L, QNN_DATATYPE_BOOL_8, 2, dqk);
  if (picked < 0 || mb < 0 || emit(L, "Cast", &picked, 1, mb, NULL, 0) < 0) return -1; /* nonzero is true */
  int mi = tmp(L, QNN_DATATYPE_INT_32, 2, dqk);
  if (mi < 0 || emit(L, "Cast", &mb, 1, mi, NULL, 0) < 0) return -1;
  int v = select3(L, lt0, one, select3(L, geq, zero, mi, 2, dqk), 2, dqk);
  return greater_equal(L, v, one, 2, dqk);
}

static int lower_attention(lower *L, const xpu_ir_node *n, int q, int k, int v, int qo, int mask, int out) {
  Qnn_DataType_t dt = dt_of(L, q);
  uint32_t Tq = dims_of(L, q)[0], Hq = dims_of(L, q)[1], D = dims_of(L, q)[2];
  uint32_t Tk = dims_of(L, k)[0], Hkv = dims_of(L, k)[1], Dv = dims_of(L, v)[2];
  if (Hkv == 0 || Hq % Hkv) return fail(L, "query heads %u not a multiple of kv heads %u", Hq, Hkv);
  uint32_t G = Hq / Hkv, R = G * Tq;
  int causal = n->iattr[0] == 1;
  int64_t off = n->iattr[1];
  float scale = n->fattr[0] != 0 ? n->fattr[0] : (float)(1.0 / sqrt((double)D));
  uint32_t len = Tk;
  k = cast(L, k, dt);
  v = cast(L, v, dt);
  if (causal && qo >= 0) {
    if (zero_hidden_rows(L, qo, Tq, Tk, &k, &v) < 0) return -1;
  } else if (causal && (int64_t)Tq + off < (int64_t)Tk) {
    /* keys past the last visible one are never read: a KV cache bound at full capacity may
     * hold anything (NaN included) there */
    len = (uint32_t)((int64_t)Tq + off);
    k = slice(L, k, -1, 0, 0, len);
    v = slice(L, v, -1, 0, 0, len);
  }
  static const uint32_t p102[3] = {1, 0, 2};
  uint32_t qd[3] = {Hkv, R, D}, sd[3] = {Hkv, R, len}, rd[2] = {R, len};
  int qg = reshape(L, transpose(L, q, -1, p102), -1, 3, qd);
  int kt = transpose(L, k, -1, p102);
  int vt = transpose(L, v, -1, p102);
  int sc = matmul(L, qg, kt, -1, 1);
  if (n->fattr[1] > 0) {
    /* soft-cap (op set v5): c * Tanh(scale * s / c), then a softmax of beta 1; the masked score
     * of beta 1 stays below every capped one (|score| <= c) */
    float cap = n->fattr[1];
    int t = op1(L, "Tanh", bin(L, "ElementWiseMultiply", sc, cst_scalar(L, dt, scale / cap), -1), -1, dt, 3,
                (const uint32_t[3]){Hkv, R, len});
    sc = bin(L, "ElementWiseMultiply", t, cst_scalar(L, dt, cap), -1);
    scale = 1.0f;
  }
  int p;
  if (mask >= 0) {
    /* scores [Hkv, G*Tq, Tk] seen as [Hkv, G, Tq, Tk], so the [Tq, Tk] visibility broadcasts */
    uint32_t s4[4] = {Hkv, G, Tq, len}, dqk[2] = {Tq, len};
    int cond = tree_visibility(L, mask, qo, Tq, len);
    int s = select3(L, cond, reshape(L, sc, -1, 4, s4), cst_scalar(L, dt, masked_score(L, scale)), 4, s4);
    int p4 = bin(L, "ElementWiseMultiply", softmax(L, s, -1, scale), keep_of(L, cond, dt, 2, dqk), -1);
    p = reshape(L, p4, -1, 3, sd); /* a row that sees no key gives 0 */
  } else if (causal) {
    int empty;
    int cond = visibility(L, R, Tq, len, qo >= 0 ? 0 : off, qo, &empty);
    p = softmax(L, select3(L, cond, sc, cst_scalar(L, dt, masked_score(L, scale)), 3, sd), -1, scale);
    if (empty) p = bin(L, "ElementWiseMultiply", p, keep_of(L, cond, dt, 2, rd), -1); /* no visible key: 0 */
  } else {
    p = softmax(L, sc, -1, scale);
  }
  int o = matmul(L, p, vt, -1, 0);
  uint32_t od[3] = {Hq, Tq, Dv};
  return transpose(L, reshape(L, o, -1, 3, od), out, p102);
}

static int lower_gelu(lower *L, int x, int out) {
  Qnn_DataType_t dt = dt_of(L, x);
  /* 0.5x(1+tanh(z)) == x*sigmoid(2z), z = sqrt(2/pi)(x + 0.044715x^3) */
  int x2 = bin(L, "ElementWiseMultiply", x, x, -1);
  int x3 = bin(L, "ElementWiseMultiply", x2, x, -1);
  int inner = bin(L, "ElementWiseAdd", x, bin(L, "ElementWiseMultiply", x3, cst_scalar(L, dt, 0.044715f), -1), -1);
  int z2 = bin(L, "ElementWiseMultiply", inner, cst_scalar(L, dt, 1.5957691216057308f), -1);
  int sg = op1(L, "Sigmoid", z2, -1, dt, rank_of(L, x), dims_of(L, x));
  return bin(L, "ElementWiseMultiply", x, sg, out);
}

/* constant ids (GET_ROWS ids, ROPE positions) in [0, rows), checked once at prepare */
static int check_ids(lower *L, const xpu_ir_node *n, int64_t rows) {
  const xpu_ir_graph *ir = L->cfg->ir;
  const xpu_ir_tensor *ids = &ir->tensors[n->inputs[1]];
  if (ids->kind == XPU_TENSOR_CONST) { /* known now: check once */
    char msg[256];
    const int32_t *v = L->cfg->const_bytes(L->cfg->const_user, ids->const_buffer, ids->const_offset,
                                           xpu_ir_nbytes(ids), msg, sizeof msg);
    if (!v) return fail(L, "ids: %s", msg);
    for (int64_t i = 0; i < xpu_ir_numel(ids); i++) {
      int32_t id;
      memcpy(&id, (const uint8_t *)v + 4 * i, 4);
      if (id < 0 || id >= rows) return fail(L, "%s id %d outside [0, %lld)", xpu_op_name(n->op), id, (long long)rows);
    }
    return 0;
  }
  return 0; /* ids bound at execution: qnn_io_describe marks them for the check before execute */
}

/* The per-channel I8 weight of a W8A8 MATMUL: static SFIXED_POINT_8 [N, K] with an
 * AXIS_SCALE_OFFSET encoding along axis 0 (one scale per output channel, offsets 0), made in the
 * weight's slot so every later use finds it. */
static int w8a8_axis_weight(lower *L, const xpu_ir_node *n) {
  const xpu_ir_graph *ir = L->cfg->ir;
  uint32_t bi = n->inputs[1], si = n->inputs[2];
  if (L->ts[bi]) return (int)bi;
  const xpu_ir_tensor *tb = &ir->tensors[bi], *ts = &ir->tensors[si];
  char msg[256];
  const void *w = L->cfg->const_bytes(L->cfg->const_user, tb->const_buffer, tb->const_offset, xpu_ir_nbytes(tb), msg,
                                      sizeof msg);
  if (!w) return fail(L, "constant tensor %u: %s", bi, msg);
  const float *sc = L->cfg->const_bytes(L->cfg->const_user, ts->const_buffer, ts->const_offset, xpu_ir_nbytes(ts), msg,
                                        sizeof msg);
  if (!sc) return fail(L, "constant tensor %u: %s", si, msg);
  uint32_t N = (uint32_t)tb->shape[0], dims[2] = {N, (uint32_t)tb->shape[1]};
  Qnn_ScaleOffset_t *so = own(L, (size_t)N * sizeof *so);
  if (!so) return fail(L, "out of memory");
  for (uint32_t j = 0; j < N; j++) {
    float s;
    memcpy(&s, (const uint8_t *)sc + 4 * (size_t)j, 4);
    if (!(s > 0) || isinf(s)) return fail(L, "per-channel scale %u is %g, must be positive and finite", j, (double)s);
    so[j] = (Qnn_ScaleOffset_t){s, 0};
  }
  return mk_enc(L, (int)bi, QNN_TENSOR_TYPE_STATIC, QNN_DATATYPE_SFIXED_POINT_8, 1.0f, so, 2, dims, w);
}

/* W8A8 MATMUL (op set 3): a [rows, K] SFIXED_POINT_8 (scale fattr[1]) x b [N, K] SFIXED_POINT_8
 * (scale fattr[0], or per axis) -> MatMul(transpose_in1) -> SFIXED_POINT_16 [rows, N] with scale
 * fattr[2] (OPS.md's output grid; int32 sums inside the op) -> Dequantize to the float output. */
static int lower_w8a8(lower *L, const xpu_ir_node *n, int a, int b, int out) {
  const xpu_ir_graph *ir = L->cfg->ir;
  const xpu_ir_tensor *ta = &ir->tensors[n->inputs[0]], *to = &ir->tensors[n->output];
  uint32_t K = dims_of(L, b)[1], N = dims_of(L, b)[0];
  uint32_t rows = (uint32_t)(xpu_ir_numel(ta) / K);
  uint32_t da[2] = {rows, K}, dout[2] = {rows, N};
  int a2 = a;
  if (ta->rank != 2) { /* the same bytes as [rows, K], keeping the encoding (a Reshape cannot requantize) */
    a2 = mk(L, -1, QNN_TENSOR_TYPE_NATIVE, QNN_DATATYPE_SFIXED_POINT_8, n->fattr[1], 2, da, NULL);
    if (a2 < 0 || reshape(L, a, a2, 0, NULL) < 0) return -1;
  }
  int acc = mk(L, -1, QNN_TENSOR_TYPE_NATIVE, QNN_DATATYPE_SFIXED_POINT_16, n->fattr[2], 2, dout, NULL);
  if (acc < 0 || matmul(L, a2, b, acc, 1) < 0) return -1;
  if (to->rank == 2) return op1(L, "Dequantize", acc, out, dt_of(L, out), 0, NULL);
  int f = op1(L, "Dequantize", acc, -1, dt_of(L, out), 2, dout);
  return reshape(L, f, out, 0, NULL);
}

static int lower_node(lower *L, uint32_t idx) {
  const xpu_ir_node *n = &L->cfg->ir->nodes[idx];
  L->cur_node = idx;
  int in[XPU_MAX_INPUTS];
  int w8a8 = n->op == XPU_OP_MATMUL && (n->n_inputs == 3 || L->cfg->ir->tensors[n->inputs[0]].dtype == XPU_DT_I8);
  if (w8a8 && n->n_inputs == 3 && w8a8_axis_weight(L, n) < 0) return -1;
  for (uint32_t i = 0; i < n->n_inputs; i++) {
    if (w8a8 && i == 2) { /* per-channel scales live in the weight's encoding: no QNN tensor */
      in[i] = -1;
      continue;
    }
    if ((in[i] = irt(L, n->inputs[i])) < 0) return -1;
  }
  int out = irt(L, n->output);
  if (out < 0) return -1;
  int x = in[0];
  Qnn_DataType_t dt = dt_of(L, x);
  int r = 0;
  switch (n->op) {
  case XPU_OP_ADD: r = bin(L, "ElementWiseAdd", x, in[1], out); break;
  case XPU_OP_SUB: r = bin(L, "ElementWiseSubtract", x, in[1], out); break;
  case XPU_OP_MUL: r = bin(L, "ElementWiseMultiply", x, in[1], out); break;
  case XPU_OP_DIV: r = bin(L, "ElementWiseDivide", x, in[1], out); break;
  case XPU_OP_RELU: r = op1(L, "Relu", x, out, dt, 0, NULL); break;
  case XPU_OP_EXP: r = op1(L, "ElementWiseExp", x, out, dt, 0, NULL); break;
  case XPU_OP_NEG: r = op1(L, "ElementWiseNeg", x, out, dt, 0, NULL); break;
  case XPU_OP_TANH: r = op1(L, "Tanh", x, out, dt, 0, NULL); break;
  case XPU_OP_SILU:
    r = bin(L, "ElementWiseMultiply", x, op1(L, "Sigmoid", x, -1, dt, rank_of(L, x), dims_of(L, x)), out);
    break;
  case XPU_OP_GELU: r = lower_gelu(L, x, out); break;
  case XPU_OP_SCALE:
    if (n->fattr[1] == 0) {
      r = bin(L, "ElementWiseMultiply", x, cst_scalar(L, dt, n->fattr[0]), out);
    } else {
      int t = bin(L, "ElementWiseMultiply", x, cst_scalar(L, dt, n->fattr[0]), -1);
      r = bin(L, "ElementWiseAdd", t, cst_scalar(L, dt, n->fattr[1]), out);
    }
    break;
  case XPU_OP_RMS_NORM: case XPU_OP_LAYER_NORM: {
    uint32_t k = dims_of(L, x)[rank_of(L, x) - 1], axis = rank_of(L, x) - 1, one = 1;
    /* gamma and beta given explicitly: the HTP's RmsNorm/LayerNorm take in[0..2] */
    int ins[3] = {x, cst_fill(L, dt, k, 1.0f), cst_fill(L, dt, k, 0.0f)};
    if (ins[1] < 0 || ins[2] < 0) return -1;
    Qnn_Param_t p[2];
    p[0] = p_f32("epsilon", n->fattr[0]);
    if (p_tensor(L, &p[1], "axes", QNN_DATATYPE_UINT_32, 1, &one, &axis) < 0) return -1;
    r = emit(L, n->op == XPU_OP_RMS_NORM ? "RmsNorm" : "LayerNorm", ins, 3, out, p, 2);
    break;
  }
  case XPU_OP_SOFTMAX: r = lower_softmax(L, n, x, out); break;
  case XPU_OP_MATMUL: {
    if (w8a8) {
      r = lower_w8a8(L, n, x, in[1], out);
      break;
    }
    int b = in[1];
    if (dt_of(L, b) == QNN_DATATYPE_SFIXED_POINT_8) {
      /* the HTP's Dequantize writes FLOAT_16 from SDK 2.39 on; before, FLOAT_32, then a Cast */
      Qnn_DataType_t to = dt == QNN_DATATYPE_FLOAT_16 && L->cfg->target == QNN_BACKEND_ID_HTP &&
                                  qnn_api_minor() < QNN_API_MINOR_SDK_2_39
                              ? QNN_DATATYPE_FLOAT_32
                              : dt;
      b = op1(L, "Dequantize", b, -1, to, rank_of(L, b), dims_of(L, b));
      if (b >= 0 && to != dt) b = cast(L, b, dt);
    } else {
      b = cast(L, b, dt);
    }
    if (b < 0) return -1; /* a node QNN refused: err says which */
    if (rank_of(L, b) == 2) {
      /* b [N, K] is FullyConnected's weight [m, n]: x read as [batch, K] -> [batch, N], reshaped
       * back. FullyConnected wants in[0] of rank >= 2, so [K] goes in as [1, K]. */
      uint32_t K = dims_of(L, x)[rank_of(L, x) - 1], N = dims_of(L, b)[0];
      uint32_t batch = (uint32_t)(xpu_ir_numel(&L->cfg->ir->tensors[n->inputs[0]]) / K);
      int a2 = x;
      if (rank_of(L, x) < 2) {
        uint32_t d1k[2] = {1, K};
        a2 = reshape(L, x, -1, 2, d1k);
      }
      uint32_t fd[2] = {batch, N};
      int same = rank_of(L, out) == 2 && dims_of(L, out)[0] == batch && dims_of(L, out)[1] == N;
      int fo = same ? out : tmp(L, dt, 2, fd);
      int fin[2] = {a2, b};
      if (a2 < 0 || b < 0 || fo < 0 || emit(L, "FullyConnected", fin, 2, fo, NULL, 0) < 0) return -1;
      r = same ? fo : reshape(L, fo, out, 0, NULL);
    } else {
      r = matmul(L, x, b, out, 1); /* equal ranks and batch dims (qnn_node_check) */
    }
    break;
  }
  case XPU_OP_ROPE:
    if (check_ids(L, n, QNN_ROPE_MAX_POS) < 0) return -1;
    r = lower_rope(L, n, x, in[1], out);
    break;
  case XPU_OP_ATTENTION:
    r = lower_attention(L, n, x, in[1], in[2], n->n_inputs > 3 ? in[3] : -1, n->n_inputs > 4 ? in[4] : -1, out);
    break;
  case XPU_OP_GET_ROWS: {
    if (check_ids(L, n, L->cfg->ir->tensors[n->inputs[0]].shape[0]) < 0) return -1;
    uint32_t d[QMAX_RANK], rk = 0;
    for (uint32_t i = 0; i < rank_of(L, in[1]); i++) d[rk++] = dims_of(L, in[1])[i];
    d[rk++] = dims_of(L, x)[1];
    /* an I8 gather keeps the table's encoding: Gather moves bytes, it does not requantize (the
     * HTP supplement: input quantization must equal output quantization) */
    int g = dt == QNN_DATATYPE_FLOAT_32
                ? out
                : mk(L, -1, QNN_TENSOR_TYPE_NATIVE, dt, L->ts[x]->t.v1.quantizeParams.scaleOffsetEncoding.scale, rk, d, NULL);
    if (g < 0 || gather(L, x, in[1], 0, g) < 0) return -1;
    if (g != out)
      r = op1(L, dt == QNN_DATATYPE_SFIXED_POINT_8 ? "Dequantize" : "Cast", g, out, QNN_DATATYPE_FLOAT_32, 0, NULL);
    break;
  }
  case XPU_OP_CAST:
    r = dt == dt_of(L, out) ? reshape(L, x, out, 0, NULL) : op1(L, "Cast", x, out, dt, 0, NULL);
    break;
  case XPU_OP_QUANTIZE: {
    /* xpu's I8 is symmetric [-127, 127]; QNN saturates at -128, so clamp first */
    int lo = cst_scalar(L, dt, -127.0f * n->fattr[0]);
    /* the HTP's Quantize reads FLOAT_16 up to SDK 2.38 and FLOAT_32 from 2.39 (the CPU's,
     * FLOAT_32); in the HTP's FP16 graph every float is half already, so casting to half first
     * changes nothing there */
    Qnn_DataType_t from = L->cfg->target == QNN_BACKEND_ID_HTP && qnn_api_minor() < QNN_API_MINOR_SDK_2_39
                              ? QNN_DATATYPE_FLOAT_16
                              : QNN_DATATYPE_FLOAT_32;
    r = op1(L, "Quantize", cast(L, bin(L, "ElementWiseMaximum", x, lo, -1), from), out, dt, 0, NULL);
    break;
  }
  case XPU_OP_DEQUANTIZE: r = op1(L, "Dequantize", x, out, dt, 0, NULL); break;
  case XPU_OP_RESHAPE: r = reshape(L, x, out, 0, NULL); break;
  case XPU_OP_PERMUTE: {
    uint32_t perm[QMAX_RANK];
    for (uint32_t d = 0; d < rank_of(L, x); d++) perm[d] = (uint32_t)n->iattr[d];
    if (L->cfg->ir->tensors[n->inputs[0]].rank == 0) perm[0] = 0;
    r = transpose(L, x, out, perm);
    break;
  }
  case XPU_OP_SLICE: {
    uint32_t axis = (uint32_t)n->iattr[0], b = (uint32_t)n->iattr[1];
    r = slice(L, x, out, axis, b, b + dims_of(L, out)[axis]);
    break;
  }
  case XPU_OP_CONCAT: r = concat(L, in, n->n_inputs, (uint32_t)n->iattr[0], out); break;
  default: return fail(L, "no QNN mapping");
  }
  return r < 0 ? -1 : 0;
}

void qnn_io_describe(const xpu_ir_graph *ir, qnn_io *io) {
  uint32_t n_in = ir->header->n_inputs, n_io = n_in + ir->header->n_outputs;
  for (uint32_t i = 0; i < n_io; i++) {
    uint32_t t = i < n_in ? ir->inputs[i] : ir->outputs[i - n_in];
    const xpu_ir_tensor *x = &ir->tensors[t];
    uint32_t id = io[i].qnn_id;
    memset(&io[i], 0, sizeof io[i]);
    io[i].qnn_id = id;
    io[i].xpu_tensor = t;
    io[i].dtype = qnn_dtype_of(x->dtype);
    io[i].scale = 1.0f;
    if (x->dtype == XPU_DT_I8) qnn_i8_scale(ir, t, &io[i].scale);
    io[i].rank = x->rank ? x->rank : 1; /* QNN has no rank 0: a scalar is [1] */
    io[i].dims[0] = 1;
    for (uint32_t d = 0; d < x->rank; d++) io[i].dims[d] = (uint32_t)x->shape[d];
    io[i].nbytes = xpu_ir_nbytes(x);
    /* ids of a GET_ROWS bound at execution: checked against the smallest table before execute */
    for (uint32_t n = 0; i < n_in && n < ir->header->n_nodes; n++) {
      const xpu_ir_node *nd = &ir->nodes[n];
      int64_t rows = ir->tensors[nd->inputs[0]].shape[0];
      if (nd->op == XPU_OP_GET_ROWS && nd->inputs[1] == t && (io[i].ids_rows == 0 || rows < io[i].ids_rows))
        io[i].ids_rows = rows;
      /* ROPE positions index the cos/sin tables */
      if (nd->op == XPU_OP_ROPE && nd->inputs[1] == t && (io[i].ids_rows == 0 || QNN_ROPE_MAX_POS < io[i].ids_rows))
        io[i].ids_rows = QNN_ROPE_MAX_POS;
    }
  }
}

xpu_status qnn_lower_graph(const qnn_lower_cfg *cfg, qnn_io *io, char *err, size_t cap) {
  const xpu_ir_graph *ir = cfg->ir;
  lower L;
  memset(&L, 0, sizeof L);
  L.cfg = cfg;
  L.fn = cfg->lib->fn;
  L.err = err;
  L.errcap = cap;
  L.cap = ir->header->n_tensors + 64;
  L.n = ir->header->n_tensors;
  L.ts = calloc(L.cap, sizeof *L.ts);
  xpu_status st = XPU_OK;
  if (!L.ts) {
    snprintf(err, cap, "out of memory");
    return XPU_E_OUT_OF_MEMORY;
  }
  uint32_t n_io = ir->header->n_inputs + ir->header->n_outputs;
  memset(io, 0, n_io * sizeof *io);
  /* inputs and outputs first, so their QNN tensors exist even if no node touches an input */
  for (uint32_t i = 0; i < n_io && st == XPU_OK; i++) {
    uint32_t t = i < ir->header->n_inputs ? ir->inputs[i] : ir->outputs[i - ir->header->n_inputs];
    L.cur_node = 0;
    if (irt(&L, t) < 0) st = XPU_E_INTERNAL;
  }
  for (uint32_t i = 0; i < ir->header->n_nodes && st == XPU_OK; i++)
    if (lower_node(&L, i) < 0) st = XPU_E_INTERNAL;
  qnn_io_describe(ir, io);
  for (uint32_t i = 0; i < n_io && st == XPU_OK; i++) io[i].qnn_id = L.ts[io[i].xpu_tensor]->t.v1.id;
  if (st == XPU_OK) {
    Qnn_ErrorHandle_t e = cfg->lib->fn->graphFinalize(cfg->graph, NULL, NULL);
    if (e != QNN_SUCCESS) {
      snprintf(err, cap, "graphFinalize: error %llu: %s", (unsigned long long)e, qnn_lib_errmsg(cfg->lib, e));
      st = XPU_E_INTERNAL;
    }
  }
  for (uint32_t i = 0; i < L.n_owned; i++) free(L.owned[i]);
  free(L.owned);
  free(L.ts);
  return st;
}
