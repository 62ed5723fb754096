/*
 * emu_binary.c: the emulator's context binaries. The format is its own (like a real backend's,
 * opaque to the client): the finalized graphs with their tensors (static data included) and
 * decoded nodes, then an FNV-1a checksum. Loading checks the checksum, every count and index,
 * and re-runs the graphAddNode rules on every node, so a damaged binary is refused before a
 * kernel could index outside a tensor.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu.h"

#define EMU_BINARY_MAGIC 0x42455158u /* "XQEB" */
#define EMU_BINARY_VERSION 3u /* 2: the graph's FP16 precision flag; 3: per-axis scales */

typedef struct {
  uint8_t *p;
  uint64_t n, cap; /* p NULL: only count */
} wbuf;

/* FNV-1a over the payload, stored after it: a damaged binary is refused before it is parsed */
static uint64_t fnv1a(const uint8_t *p, uint64_t n) {
  uint64_t h = 1469598103934665603ull;
  for (uint64_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

static void put(wbuf *w, const void *src, uint64_t n) {
  if (w->p && w->n + n <= w->cap) memcpy(w->p + w->n, src, n);
  w->n += n;
}
static void put32(wbuf *w, uint32_t v) { put(w, &v, 4); }

/* the binary is this emulator's own format: the finalized graphs, their tensors (static data
 * included) and decoded nodes; a real backend's binary is opaque in the same way */
static uint64_t context_write(const emu_context *c, uint8_t *dst, uint64_t cap) {
  wbuf w = {dst, 0, cap};
  put32(&w, EMU_BINARY_MAGIC);
  put32(&w, EMU_BINARY_VERSION);
  put32(&w, c->n_graphs);
  for (uint32_t gi = 0; gi < c->n_graphs; gi++) {
    const emu_graph *g = c->graphs[gi];
    put(&w, g->name, sizeof g->name);
    put32(&w, g->n_tensors);
    put32(&w, g->n_nodes);
    put32(&w, (uint32_t)g->fp16);
    for (uint32_t i = 0; i < g->n_tensors; i++) {
      emu_tensor t = g->tensors[i];
      uint8_t *data = t.type == QNN_TENSOR_TYPE_STATIC ? t.data : NULL;
      float *axs = t.axis_scales;
      t.data = NULL;
      t.axis_scales = NULL;
      put(&w, &t, sizeof t);
      if (data) put(&w, data, t.nbytes);
      if (axs) put(&w, axs, (uint64_t)t.n_axis_scales * sizeof(float));
    }
    put(&w, g->nodes, (uint64_t)g->n_nodes * sizeof(emu_node));
  }
  uint64_t h = w.p && w.n <= w.cap ? fnv1a(w.p, w.n) : 0;
  put(&w, &h, sizeof h);
  return w.n;
}

Qnn_ErrorHandle_t contextGetBinarySize(Qnn_ContextHandle_t ctx, Qnn_ContextBinarySize_t *size) {
  if (!emu_live_has(ctx, EMU_OBJ_CONTEXT)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "invalid context handle");
  if (!size) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "null size");
  *size = context_write(ctx, NULL, 0);
  return QNN_SUCCESS;
}

Qnn_ErrorHandle_t contextGetBinary(Qnn_ContextHandle_t ctx, void *buf, Qnn_ContextBinarySize_t cap,
                                          Qnn_ContextBinarySize_t *written) {
  if (!emu_live_has(ctx, EMU_OBJ_CONTEXT)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "invalid context handle");
  if (!buf || !written) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "null buffer or size");
  emu_context *c = ctx;
  for (uint32_t i = 0; i < c->n_graphs; i++)
    if (!c->graphs[i]->finalized)
      return emu_err(QNN_GRAPH_ERROR_GRAPH_NOT_FINALIZED, "graph %s is not finalized", c->graphs[i]->name);
  uint64_t need = context_write(c, NULL, 0);
  if (cap < need) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "binary needs %llu bytes", (unsigned long long)need);
  *written = context_write(c, buf, cap);
  return QNN_SUCCESS;
}

typedef struct {
  const uint8_t *p;
  uint64_t n, off;
} rbuf;

static int get(rbuf *r, void *dst, uint64_t n) {
  if (n > r->n - r->off) return 0;
  memcpy(dst, r->p + r->off, n);
  r->off += n;
  return 1;
}

/* every field of a loaded tensor/node is checked as if it came from an attacker */
static int tensor_sane(const emu_tensor *t, uint32_t id) {
  if (t->id != id || !emu_dtype_ok(t->dtype) || t->type > QNN_TENSOR_TYPE_STATIC || t->rank == 0 ||
      t->rank > EMU_MAX_RANK || t->name[sizeof t->name - 1] != 0)
    return 0;
  uint64_t numel = 1;
  for (uint32_t i = 0; i < t->rank; i++) {
    if (t->dims[i] == 0) return 0;
    numel *= t->dims[i];
    if (numel > (1ull << 32)) return 0;
  }
  if (t->n_axis_scales && (t->dtype != QNN_DATATYPE_SFIXED_POINT_8 || t->type != QNN_TENSOR_TYPE_STATIC ||
                           t->axis < 0 || (uint32_t)t->axis >= t->rank || t->n_axis_scales != t->dims[t->axis]))
    return 0;
  return numel == t->numel && t->nbytes == numel * qnn_dtype_bytes(t->dtype);
}

static int node_sane(const emu_graph *g, const emu_node *n) {
  if (!emu_op_from_name(emu_op_name(n->op)) || n->n_in == 0 || n->n_in > EMU_MAX_IO || n->n_out != 1 ||
      n->name[sizeof n->name - 1] != 0)
    return 0;
  for (uint32_t i = 0; i < n->n_in; i++)
    if (n->in[i] >= g->n_tensors) return 0;
  if (n->out[0] >= g->n_tensors) return 0;
  if (n->op == EMU_OP_TRANSPOSE || n->op == EMU_OP_STRIDEDSLICE || n->op == EMU_OP_CONCAT) {
    /* the kernels index with these: they must agree with the tensors they were checked against */
    const emu_tensor *x = &g->tensors[n->in[0]];
    for (uint32_t d = 0; n->op == EMU_OP_TRANSPOSE && d < x->rank; d++)
      if (n->perm[d] >= x->rank) return 0;
    if (n->op == EMU_OP_CONCAT && (n->axis < 0 || (uint32_t)n->axis >= x->rank)) return 0;
  }
  return 1;
}

/* rebuilds the op config of a decoded node (its parameters from the decoded fields) and runs
 * emu_node_check on it */
static Qnn_ErrorHandle_t recheck_node(const emu_graph *g, emu_node *n, char *msg, size_t cap) {
  Qnn_Param_t p[2];
  uint32_t np = 0, rank = g->tensors[n->in[0]].rank, axes = rank ? rank - 1 : 0;
  memset(p, 0, sizeof p);
  Qnn_TensorV1_t *pt = &p[0].tensorParam.v1;
  p[0].tensorParam.version = QNN_TENSOR_VERSION_1;
  pt->memType = QNN_TENSORMEMTYPE_RAW;
  switch (n->op) {
  case EMU_OP_SOFTMAX:
    p[np++] = (Qnn_Param_t){.paramType = QNN_PARAMTYPE_SCALAR, .name = "beta",
                            .scalarParam = {.dataType = QNN_DATATYPE_FLOAT_32, .floatValue = n->beta}};
    break;
  case EMU_OP_RMSNORM: case EMU_OP_LAYERNORM:
    p[0].paramType = QNN_PARAMTYPE_TENSOR;
    p[0].name = "axes";
    pt->dataType = QNN_DATATYPE_UINT_32;
    pt->clientBuf = (Qnn_ClientBuffer_t){&axes, 4};
    p[1] = (Qnn_Param_t){.paramType = QNN_PARAMTYPE_SCALAR, .name = "epsilon",
                         .scalarParam = {.dataType = QNN_DATATYPE_FLOAT_32, .floatValue = n->epsilon}};
    np = 2;
    break;
  case EMU_OP_MATMUL:
    p[0] = (Qnn_Param_t){.paramType = QNN_PARAMTYPE_SCALAR, .name = "transpose_in0",
                         .scalarParam = {.dataType = QNN_DATATYPE_BOOL_8, .bool8Value = n->transpose_in0}};
    p[1] = (Qnn_Param_t){.paramType = QNN_PARAMTYPE_SCALAR, .name = "transpose_in1",
                         .scalarParam = {.dataType = QNN_DATATYPE_BOOL_8, .bool8Value = n->transpose_in1}};
    np = 2;
    break;
  case EMU_OP_GATHER:
    p[np++] = (Qnn_Param_t){.paramType = QNN_PARAMTYPE_SCALAR, .name = "axis",
                            .scalarParam = {.dataType = QNN_DATATYPE_INT_32, .int32Value = n->axis}};
    break;
  case EMU_OP_CONCAT:
    p[np++] = (Qnn_Param_t){.paramType = QNN_PARAMTYPE_SCALAR, .name = "axis",
                            .scalarParam = {.dataType = QNN_DATATYPE_INT_32, .int32Value = n->axis}};
    break;
  case EMU_OP_TRANSPOSE:
    p[0].paramType = QNN_PARAMTYPE_TENSOR;
    p[0].name = "perm";
    pt->dataType = QNN_DATATYPE_UINT_32;
    pt->clientBuf = (Qnn_ClientBuffer_t){n->perm, rank * 4};
    np = 1;
    break;
  case EMU_OP_STRIDEDSLICE: {
    p[0].paramType = QNN_PARAMTYPE_TENSOR;
    p[0].name = "ranges";
    pt->dataType = QNN_DATATYPE_INT_32;
    pt->clientBuf = (Qnn_ClientBuffer_t){n->ranges, rank * 12};
    np = 1;
    break;
  }
  default: break;
  }
  Qnn_OpConfigV1_t cfg = {n->name, QNN_OP_PACKAGE_NAME_QTI_AISW, emu_op_name(n->op), np, p, n->n_in, NULL, 1, NULL};
  emu_node copy = *n;
  Qnn_ErrorHandle_t e = emu_node_check(g, &copy, &cfg, msg, cap);
  if (e == QNN_SUCCESS && memcmp(&copy, n, sizeof copy) != 0) {
    snprintf(msg, cap, "node %s: decoded parameters differ", n->name);
    return QNN_COMMON_ERROR_INVALID_ARGUMENT;
  }
  return e;
}

static Qnn_ErrorHandle_t context_read(emu_context *c, const void *buf, uint64_t size) {
  uint64_t h;
  if (size < 20) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "not a context binary of this emulator");
  memcpy(&h, (const uint8_t *)buf + size - 8, 8);
  if (h != fnv1a(buf, size - 8)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "context binary checksum mismatch");
  rbuf r = {buf, size - 8, 0};
  uint32_t magic, version, n_graphs;
  if (!get(&r, &magic, 4) || !get(&r, &version, 4) || !get(&r, &n_graphs, 4) || magic != EMU_BINARY_MAGIC)
    return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "not a context binary of this emulator");
  if (version != EMU_BINARY_VERSION)
    return emu_err(QNN_COMMON_ERROR_NOT_SUPPORTED, "context binary version %u, this emulator reads %u", version,
                   EMU_BINARY_VERSION);
  if (n_graphs > 1024) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "corrupt context binary");
  for (uint32_t gi = 0; gi < n_graphs; gi++) {
    char name[64];
    uint32_t nt, nn, fp16;
    if (!get(&r, name, sizeof name) || !get(&r, &nt, 4) || !get(&r, &nn, 4) || !get(&r, &fp16, 4) || fp16 > 1 ||
        name[63] ||
        nt > (r.n - r.off) / sizeof(emu_tensor) || nn > (r.n - r.off) / sizeof(emu_node))
      return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "corrupt context binary");
    emu_graph *g = graph_new(c, name);
    if (!g) return emu_err(QNN_COMMON_ERROR_MEM_ALLOC, "out of memory");
    g->fp16 = g->precision_set = (int)fp16;
    g->tensors = calloc(nt ? nt : 1, sizeof(emu_tensor));
    g->nodes = calloc(nn ? nn : 1, sizeof(emu_node));
    if (!g->tensors || !g->nodes) return emu_err(QNN_COMMON_ERROR_MEM_ALLOC, "out of memory");
    g->cap_tensors = nt ? nt : 1;
    g->cap_nodes = nn ? nn : 1;
    for (uint32_t i = 0; i < nt; i++) {
      emu_tensor *t = &g->tensors[i];
      if (!get(&r, t, sizeof *t)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "corrupt context binary");
      t->data = NULL;
      t->axis_scales = NULL;
      g->n_tensors = i + 1;
      if (!tensor_sane(t, i + 1)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "corrupt context binary");
      if (t->type == QNN_TENSOR_TYPE_STATIC) {
        if (t->nbytes > r.n - r.off) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "corrupt context binary");
        if (!(t->data = malloc(t->nbytes))) return emu_err(QNN_COMMON_ERROR_MEM_ALLOC, "out of memory");
        get(&r, t->data, t->nbytes);
      }
      if (t->n_axis_scales) {
        uint64_t nb = (uint64_t)t->n_axis_scales * sizeof(float);
        if (nb > r.n - r.off) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "corrupt context binary");
        if (!(t->axis_scales = malloc(nb))) return emu_err(QNN_COMMON_ERROR_MEM_ALLOC, "out of memory");
        get(&r, t->axis_scales, nb);
        for (uint32_t k = 0; k < t->n_axis_scales; k++)
          if (!(t->axis_scales[k] > 0)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "corrupt context binary");
      }
    }
    for (uint32_t i = 0; i < nn; i++) {
      if (!get(&r, &g->nodes[i], sizeof(emu_node)))
        return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "corrupt context binary");
      g->n_nodes = i + 1;
      if (!node_sane(g, &g->nodes[i])) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "corrupt context binary");
    }
    /* a loaded node passes the same checks as graphAddNode, so a binary that got past the
     * checksum still cannot make a kernel index outside its tensors */
    for (uint32_t i = 0; i < nn; i++) {
      emu_node *n = &g->nodes[i];
      const emu_tensor *o = &g->tensors[n->out[0]];
      if (o->type == QNN_TENSOR_TYPE_STATIC || o->type == QNN_TENSOR_TYPE_APP_WRITE || n->n_in > EMU_MAX_IO)
        return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "corrupt context binary");
      char msg[400];
      if (recheck_node(g, n, msg, sizeof msg) != QNN_SUCCESS)
        return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "corrupt context binary: %s", msg);
    }
    Qnn_ErrorHandle_t e = graph_alloc_native(g);
    if (e != QNN_SUCCESS) return e;
    g->finalized = 1;
  }
  if (r.off != r.n) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "trailing bytes in context binary");
  return QNN_SUCCESS;
}

Qnn_ErrorHandle_t contextCreateFromBinary(Qnn_BackendHandle_t be, Qnn_DeviceHandle_t dev,
                                                 const QnnContext_Config_t **cfg, const void *buf,
                                                 Qnn_ContextBinarySize_t size, Qnn_ContextHandle_t *out,
                                                 Qnn_ProfileHandle_t prof) {
  (void)prof;
  if (!emu_live_has(be, EMU_OBJ_BACKEND)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "invalid backend handle");
  if (dev && !emu_live_has(dev, EMU_OBJ_DEVICE)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "invalid device handle");
  if (cfg && cfg[0]) return emu_err(QNN_COMMON_ERROR_NOT_SUPPORTED, "context configs are not supported");
  if (!buf || !out) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "null binary or output");
  emu_context *c = context_new();
  if (!c) return emu_err(QNN_COMMON_ERROR_MEM_ALLOC, "out of memory");
  Qnn_ErrorHandle_t e = context_read(c, buf, size);
  if (e != QNN_SUCCESS) {
    context_free(c);
    return e;
  }
  *out = c;
  return QNN_SUCCESS;
}
