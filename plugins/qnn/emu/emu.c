/*
 * emu.c: libQnnXpuEmu.so, a clean-room QNN provider. It exports QnnInterface_getProviders with a
 * function table laid out like QNN core API 2.18 (../src/qnn_api.h) and implements, on the CPU, the
 * subset the xpu QNN plugin uses, with the HTP's rules where they matter to a client:
 * static shapes (execute with other dims fails), execute before finalize fails, no node after
 * finalize, only the ops and dtypes of README.md, and a finalize that can be made slow
 * (XPU_QNN_EMU_FINALIZE_MS) and counted (XPU_QNN_EMU_STATS: one line appended per finalize), so
 * a client's context-binary cache can be shown to skip it. See README.md.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "emu.h"

#define EMU_EXPORT __attribute__((visibility("default")))
#define EMU_BUILD_ID "xpu-qnn-emu 1.0 (API 2.18 clean-room emulator)"

/* ------------------------------------------------------------------ live objects and errors */

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static void **live;
static size_t n_live, cap_live;

void emu_live_add(void *obj) {
  pthread_mutex_lock(&live_mu);
  if (n_live == cap_live) {
    size_t nc = cap_live ? cap_live * 2 : 64;
    void **nl = realloc(live, nc * sizeof *nl);
    if (!nl) { /* cannot track: the object still works, only misuse detection is lost */
      pthread_mutex_unlock(&live_mu);
      return;
    }
    live = nl;
    cap_live = nc;
  }
  live[n_live++] = obj;
  pthread_mutex_unlock(&live_mu);
}

void emu_live_remove(void *obj) {
  pthread_mutex_lock(&live_mu);
  for (size_t i = 0; i < n_live; i++)
    if (live[i] == obj) {
      live[i] = live[--n_live];
      break;
    }
  if (n_live == 0) {
    free(live);
    live = NULL;
    cap_live = 0;
  }
  pthread_mutex_unlock(&live_mu);
}

int emu_live_has(const void *obj, uint32_t magic) {
  int ok = 0;
  if (!obj) return 0;
  pthread_mutex_lock(&live_mu);
  for (size_t i = 0; i < n_live && !ok; i++)
    if (live[i] == obj) ok = *(const uint32_t *)obj == magic;
  pthread_mutex_unlock(&live_mu);
  return ok;
}

static _Thread_local char last_msg[512];
static _Thread_local Qnn_ErrorHandle_t last_code;

Qnn_ErrorHandle_t emu_err(Qnn_ErrorHandle_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_msg, sizeof last_msg, fmt, ap);
  va_end(ap);
  last_code = code;
  return code;
}

static Qnn_ErrorHandle_t errorGetMessage(Qnn_ErrorHandle_t code, const char **msg) {
  if (!msg) return QNN_COMMON_ERROR_INVALID_ARGUMENT;
  *msg = code == last_code && last_msg[0] ? last_msg : "qnn emulator: error (no detail on this thread)";
  return QNN_SUCCESS;
}

/* ------------------------------------------------------------------ backend, device, log */

typedef struct {
  uint32_t magic;
} emu_simple;

static Qnn_ErrorHandle_t new_simple(uint32_t magic, void **out) {
  if (!out) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "null output handle");
  emu_simple *s = malloc(sizeof *s);
  if (!s) return emu_err(QNN_COMMON_ERROR_MEM_ALLOC, "out of memory");
  s->magic = magic;
  emu_live_add(s);
  *out = s;
  return QNN_SUCCESS;
}

static Qnn_ErrorHandle_t free_simple(void *h, uint32_t magic, const char *what) {
  if (!emu_live_has(h, magic)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "invalid %s handle", what);
  emu_live_remove(h);
  free(h);
  return QNN_SUCCESS;
}

static Qnn_ErrorHandle_t logCreate(void *cb, QnnLog_Level_t lvl, Qnn_LogHandle_t *out) {
  (void)cb; /* the emulator logs nothing: errors travel through errorGetMessage */
  (void)lvl;
  return new_simple(EMU_OBJ_LOG, out);
}
static Qnn_ErrorHandle_t logFree(Qnn_LogHandle_t h) { return free_simple(h, EMU_OBJ_LOG, "log"); }

static Qnn_ErrorHandle_t backendCreate(Qnn_LogHandle_t log, const QnnBackend_Config_t **cfg,
                                       Qnn_BackendHandle_t *out) {
  if (log && !emu_live_has(log, EMU_OBJ_LOG)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "invalid log handle");
  if (cfg && cfg[0]) return emu_err(QNN_COMMON_ERROR_NOT_SUPPORTED, "backend configs are not supported");
  return new_simple(EMU_OBJ_BACKEND, out);
}
static Qnn_ErrorHandle_t backendFree(Qnn_BackendHandle_t h) {
  return free_simple(h, EMU_OBJ_BACKEND, "backend");
}
static Qnn_ErrorHandle_t deviceCreate(Qnn_LogHandle_t log, const QnnDevice_Config_t **cfg,
                                      Qnn_DeviceHandle_t *out) {
  if (log && !emu_live_has(log, EMU_OBJ_LOG)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "invalid log handle");
  if (cfg && cfg[0]) return emu_err(QNN_COMMON_ERROR_NOT_SUPPORTED, "device configs are not supported");
  return new_simple(EMU_OBJ_DEVICE, out);
}
static Qnn_ErrorHandle_t deviceFree(Qnn_DeviceHandle_t h) { return free_simple(h, EMU_OBJ_DEVICE, "device"); }

static Qnn_ErrorHandle_t backendGetBuildId(const char **id) {
  if (!id) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "null id");
  *id = EMU_BUILD_ID;
  return QNN_SUCCESS;
}

static Qnn_ErrorHandle_t backendGetApiVersion(Qnn_ApiVersion_t *v) {
  if (!v) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "null version");
  *v = (Qnn_ApiVersion_t){{QNN_API_MAJOR_PINNED, emu_api_minor(), 0}, {1, 0, 0}};
  return QNN_SUCCESS;
}

/* ------------------------------------------------------------------ context and graphs */

static void graph_free(emu_graph *g) {
  for (uint32_t i = 0; i < g->n_tensors; i++) {
    free(g->tensors[i].data);
    free(g->tensors[i].axis_scales);
  }
  free(g->tensors);
  free(g->nodes);
  pthread_mutex_destroy(&g->run_mu);
  emu_live_remove(g);
  free(g);
}

emu_context *context_new(void) {
  emu_context *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->magic = EMU_OBJ_CONTEXT;
  emu_live_add(c);
  return c;
}

void context_free(emu_context *c) {
  for (uint32_t i = 0; i < c->n_graphs; i++) graph_free(c->graphs[i]);
  free(c->graphs);
  emu_live_remove(c);
  free(c);
}

static Qnn_ErrorHandle_t contextCreate(Qnn_BackendHandle_t be, Qnn_DeviceHandle_t dev,
                                       const QnnContext_Config_t **cfg, Qnn_ContextHandle_t *out) {
  if (!emu_live_has(be, EMU_OBJ_BACKEND)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "invalid backend handle");
  if (dev && !emu_live_has(dev, EMU_OBJ_DEVICE)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "invalid device handle");
  if (cfg && cfg[0]) return emu_err(QNN_COMMON_ERROR_NOT_SUPPORTED, "context configs are not supported");
  if (!out) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "null output handle");
  emu_context *c = context_new();
  if (!c) return emu_err(QNN_COMMON_ERROR_MEM_ALLOC, "out of memory");
  *out = c;
  return QNN_SUCCESS;
}

static Qnn_ErrorHandle_t contextFree(Qnn_ContextHandle_t h, Qnn_ProfileHandle_t prof) {
  (void)prof;
  if (!emu_live_has(h, EMU_OBJ_CONTEXT)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "invalid context handle");
  emu_context *c = h;
  if (c->n_mems) return emu_err(QNN_COMMON_ERROR_GENERAL, "context has %u registered memories", c->n_mems);
  context_free(c);
  return QNN_SUCCESS;
}

emu_graph *graph_new(emu_context *c, const char *name) {
  emu_graph **ng = realloc(c->graphs, (c->n_graphs + 1) * sizeof *ng);
  if (!ng) return NULL;
  c->graphs = ng;
  emu_graph *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->magic = EMU_OBJ_GRAPH;
  g->ctx = c;
  snprintf(g->name, sizeof g->name, "%s", name);
  pthread_mutex_init(&g->run_mu, NULL);
  c->graphs[c->n_graphs++] = g;
  emu_live_add(g);
  return g;
}

static Qnn_ErrorHandle_t graphCreate(Qnn_ContextHandle_t ctx, const char *name,
                                     const QnnGraph_Config_t **cfg, Qnn_GraphHandle_t *out) {
  if (!emu_live_has(ctx, EMU_OBJ_CONTEXT)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "invalid context handle");
  if (!name || !name[0] || strlen(name) >= 64 || !out)
    return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "graph name must be 1..63 bytes");
  int precision = -1;
  uint32_t vtcm = 0, hvx = 0;
  for (uint32_t i = 0; cfg && cfg[i]; i++) {
    const QnnGraph_Config_t *gc = cfg[i];
    if (gc->option != QNN_GRAPH_CONFIG_OPTION_CUSTOM || !gc->customConfig)
      return emu_err(QNN_GRAPH_ERROR_UNSUPPORTED_FEATURE, "graph config option %d is not supported", (int)gc->option);
    if (emu_profile_get() != EMU_PROFILE_HTP)
      return emu_err(QNN_GRAPH_ERROR_UNSUPPORTED_FEATURE, "the CPU backend takes no custom graph configs");
    const QnnHtpGraph_CustomConfig_t *hc = gc->customConfig;
    switch (hc->option) {
    case QNN_HTP_GRAPH_CONFIG_OPTION_PRECISION:
      if (hc->precision == QNN_PRECISION_FLOAT32)
        return emu_err(QNN_GRAPH_ERROR_UNSUPPORTED_FEATURE, "HTP precision FLOAT32 is not supported (FLOAT16 only)");
      if (hc->precision != QNN_PRECISION_FLOAT16)
        return emu_err(QNN_GRAPH_ERROR_INVALID_ARGUMENT, "HTP precision %d is unknown", (int)hc->precision);
      precision = 1;
      break;
    case QNN_HTP_GRAPH_CONFIG_OPTION_VTCM_SIZE_IN_MB:
      if (hc->vtcmSizeInMB > 64)
        return emu_err(QNN_GRAPH_ERROR_INVALID_ARGUMENT, "VTCM size %u MB is more than any HTP has", hc->vtcmSizeInMB);
      vtcm = hc->vtcmSizeInMB;
      break;
    case QNN_HTP_GRAPH_CONFIG_OPTION_NUM_HVX_THREADS:
      if (hc->numHvxThreads == 0 || hc->numHvxThreads > 8)
        return emu_err(QNN_GRAPH_ERROR_INVALID_ARGUMENT, "HVX threads %llu outside 1..8",
                       (unsigned long long)hc->numHvxThreads);
      hvx = (uint32_t)hc->numHvxThreads;
      break;
    case QNN_HTP_GRAPH_CONFIG_OPTION_OPTIMIZATION:
      if (hc->optimizationOption.type != QNN_HTP_GRAPH_OPTIMIZATION_TYPE_FINALIZE_OPTIMIZATION_FLAG ||
          hc->optimizationOption.floatValue < 1 || hc->optimizationOption.floatValue > 3)
        return emu_err(QNN_GRAPH_ERROR_INVALID_ARGUMENT, "HTP optimization option not understood");
      break;
    default:
      return emu_err(QNN_GRAPH_ERROR_UNSUPPORTED_FEATURE, "HTP custom graph option %d is not supported", (int)hc->option);
    }
  }
  emu_context *c = ctx;
  for (uint32_t i = 0; i < c->n_graphs; i++)
    if (strcmp(c->graphs[i]->name, name) == 0)
      return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "graph %s exists in this context", name);
  emu_graph *g = graph_new(c, name);
  if (!g) return emu_err(QNN_COMMON_ERROR_MEM_ALLOC, "out of memory");
  g->precision_set = precision >= 0;
  g->fp16 = precision == 1;
  g->vtcm_mb = vtcm;
  g->hvx_threads = hvx;
  *out = g;
  return QNN_SUCCESS;
}

static Qnn_ErrorHandle_t graphRetrieve(Qnn_ContextHandle_t ctx, const char *name, Qnn_GraphHandle_t *out) {
  if (!emu_live_has(ctx, EMU_OBJ_CONTEXT)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "invalid context handle");
  if (!name || !out) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "null name or output");
  emu_context *c = ctx;
  for (uint32_t i = 0; i < c->n_graphs; i++)
    if (strcmp(c->graphs[i]->name, name) == 0) {
      *out = c->graphs[i];
      return QNN_SUCCESS;
    }
  return emu_err(QNN_GRAPH_ERROR_INVALID_HANDLE, "no graph %s in the context", name);
}

static emu_tensor *tensor_by_id(emu_graph *g, uint32_t id, uint32_t *index) {
  /* ids are index + 1, assigned at creation */
  if (id == 0 || id > g->n_tensors) return NULL;
  if (index) *index = id - 1;
  return &g->tensors[id - 1];
}

static const Qnn_TensorV1_t *tv1(const Qnn_Tensor_t *t) {
  /* V1 and V2 share every field the emulator reads */
  return (t->version == QNN_TENSOR_VERSION_1 || t->version == QNN_TENSOR_VERSION_2) ? &t->v1 : NULL;
}

static Qnn_ErrorHandle_t tensorCreateGraphTensor(Qnn_GraphHandle_t gh, Qnn_Tensor_t *t) {
  if (!emu_live_has(gh, EMU_OBJ_GRAPH)) return emu_err(QNN_GRAPH_ERROR_INVALID_HANDLE, "invalid graph handle");
  emu_graph *g = gh;
  if (g->finalized) return emu_err(QNN_GRAPH_ERROR_GRAPH_FINALIZED, "graph %s is finalized", g->name);
  const Qnn_TensorV1_t *v = t ? tv1(t) : NULL;
  if (!v) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "null tensor or unknown tensor version");
  const char *nm = v->name ? v->name : "(unnamed)";
  if (t->version == QNN_TENSOR_VERSION_2 && t->v2.isDynamicDimensions)
    for (uint32_t i = 0; i < v->rank; i++)
      if (t->v2.isDynamicDimensions[i])
        return emu_err(QNN_COMMON_ERROR_NOT_SUPPORTED, "tensor %s: dynamic dimensions (shapes are static)", nm);
  if (v->dataFormat != QNN_TENSOR_DATA_FORMAT_DENSE)
    return emu_err(QNN_COMMON_ERROR_NOT_SUPPORTED, "tensor %s: only dense tensors", nm);
  if (!emu_dtype_ok(v->dataType))
    return emu_err(QNN_COMMON_ERROR_NOT_SUPPORTED, "tensor %s: data type 0x%04x is not in the emulator's list",
                   nm, (unsigned)v->dataType);
  if (v->type > QNN_TENSOR_TYPE_STATIC)
    return emu_err(QNN_COMMON_ERROR_NOT_SUPPORTED, "tensor %s: tensor type %d not supported", nm, (int)v->type);
  if (v->dataType == QNN_DATATYPE_BOOL_8 && v->type != QNN_TENSOR_TYPE_NATIVE)
    return emu_err(QNN_COMMON_ERROR_NOT_SUPPORTED, "tensor %s: BOOL_8 only between nodes (NATIVE)", nm);
  if (v->dataType == QNN_DATATYPE_UINT_32 && v->type != QNN_TENSOR_TYPE_STATIC)
    return emu_err(QNN_COMMON_ERROR_NOT_SUPPORTED, "tensor %s: UINT_32 only for static parameter tensors", nm);
  int quant = v->dataType == QNN_DATATYPE_SFIXED_POINT_8 || v->dataType == QNN_DATATYPE_SFIXED_POINT_16 ||
              v->dataType == QNN_DATATYPE_SFIXED_POINT_32;
  /* a per-axis encoding (per-channel weight scales): static 8-bit data, symmetric, one positive
   * scale per index of the axis */
  int per_axis = quant && v->quantizeParams.encodingDefinition == QNN_DEFINITION_DEFINED &&
                 v->quantizeParams.quantizationEncoding == QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET;
  if (per_axis) {
    const Qnn_AxisScaleOffset_t *ax = &v->quantizeParams.axisScaleOffsetEncoding;
    if (v->dataType != QNN_DATATYPE_SFIXED_POINT_8 || v->type != QNN_TENSOR_TYPE_STATIC || ax->axis < 0 ||
        (uint32_t)ax->axis >= v->rank || !v->dimensions || ax->numScaleOffsets != v->dimensions[ax->axis] ||
        !ax->scaleOffset)
      return emu_err(QNN_COMMON_ERROR_NOT_SUPPORTED,
                     "tensor %s: AXIS_SCALE_OFFSET only for static SFIXED_POINT_8 data, one scale per index of "
                     "an axis", nm);
    for (uint32_t i = 0; i < ax->numScaleOffsets; i++)
      if (!(ax->scaleOffset[i].scale > 0) || ax->scaleOffset[i].offset != 0)
        return emu_err(QNN_COMMON_ERROR_NOT_SUPPORTED, "tensor %s: per-axis scale %u must be > 0 with offset 0", nm, i);
  } else if (quant && (v->quantizeParams.encodingDefinition != QNN_DEFINITION_DEFINED ||
                       v->quantizeParams.quantizationEncoding != QNN_QUANTIZATION_ENCODING_SCALE_OFFSET ||
                       !(v->quantizeParams.scaleOffsetEncoding.scale > 0)))
    return emu_err(QNN_COMMON_ERROR_NOT_SUPPORTED,
                   "tensor %s: SFIXED_POINT_8/16/32 need a SCALE_OFFSET encoding with scale > 0 (or a per-axis "
                   "one for static 8-bit data)", nm);
  if (v->rank > EMU_MAX_RANK || (v->rank && !v->dimensions))
    return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "tensor %s: rank %u (max %d) or null dimensions", nm,
                   v->rank, EMU_MAX_RANK);
  if (v->rank == 0) return emu_err(QNN_COMMON_ERROR_NOT_SUPPORTED, "tensor %s: rank 0 (use [1])", nm);
  uint64_t numel = 1;
  for (uint32_t i = 0; i < v->rank; i++) {
    if (v->dimensions[i] == 0)
      return emu_err(QNN_COMMON_ERROR_NOT_SUPPORTED, "tensor %s: zero-size dimension", nm);
    numel *= v->dimensions[i];
    if (numel > (1ull << 32)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "tensor %s: too large", nm);
  }
  uint64_t nbytes = numel * qnn_dtype_bytes(v->dataType);
  if (v->type == QNN_TENSOR_TYPE_STATIC &&
      (v->memType != QNN_TENSORMEMTYPE_RAW || !v->clientBuf.data || v->clientBuf.dataSize != nbytes))
    return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "tensor %s: static data must be %llu bytes in clientBuf",
                   nm, (unsigned long long)nbytes);
  if (g->n_tensors == g->cap_tensors) {
    uint32_t nc = g->cap_tensors ? g->cap_tensors * 2 : 32;
    emu_tensor *nt = realloc(g->tensors, nc * sizeof *nt);
    if (!nt) return emu_err(QNN_COMMON_ERROR_MEM_ALLOC, "out of memory");
    g->tensors = nt;
    g->cap_tensors = nc;
  }
  emu_tensor *e = &g->tensors[g->n_tensors];
  memset(e, 0, sizeof *e);
  snprintf(e->name, sizeof e->name, "%s", nm);
  e->type = v->type;
  e->dtype = v->dataType;
  e->scale = quant && !per_axis ? v->quantizeParams.scaleOffsetEncoding.scale : 0;
  e->offset = quant && !per_axis ? v->quantizeParams.scaleOffsetEncoding.offset : 0;
  if (per_axis) {
    const Qnn_AxisScaleOffset_t *ax = &v->quantizeParams.axisScaleOffsetEncoding;
    e->axis = ax->axis;
    e->n_axis_scales = ax->numScaleOffsets;
    e->axis_scales = malloc((size_t)ax->numScaleOffsets * sizeof(float));
    if (!e->axis_scales) return emu_err(QNN_COMMON_ERROR_MEM_ALLOC, "out of memory");
    for (uint32_t i = 0; i < ax->numScaleOffsets; i++) e->axis_scales[i] = ax->scaleOffset[i].scale;
  }
  e->rank = v->rank;
  memcpy(e->dims, v->dimensions, v->rank * sizeof(uint32_t));
  e->numel = numel;
  e->nbytes = nbytes;
  if (v->type == QNN_TENSOR_TYPE_STATIC) {
    e->data = malloc(nbytes);
    if (!e->data) {
      free(e->axis_scales);
      return emu_err(QNN_COMMON_ERROR_MEM_ALLOC, "out of memory");
    }
    memcpy(e->data, v->clientBuf.data, nbytes);
    if (g->fp16 && e->dtype == QNN_DATATYPE_FLOAT_32) /* the HTP stores FP16 graphs' weights as half */
      for (uint64_t k = 0; k < numel; k++) ((float *)e->data)[k] = emu_round_half(((float *)e->data)[k]);
  }
  e->id = ++g->n_tensors;
  t->v1.id = e->id;
  return QNN_SUCCESS;
}

/* a node's tensor reference must match the registered tensor: id, dtype and dims */
static Qnn_ErrorHandle_t node_tensor(emu_graph *g, const Qnn_Tensor_t *t, uint32_t *index) {
  const Qnn_TensorV1_t *v = tv1(t);
  emu_tensor *e = v ? tensor_by_id(g, v->id, index) : NULL;
  if (!e) return emu_err(QNN_GRAPH_ERROR_INVALID_TENSOR, "node refers to an unknown tensor id");
  if (v->dataType != e->dtype || v->rank != e->rank ||
      (v->rank && memcmp(v->dimensions, e->dims, v->rank * sizeof(uint32_t)) != 0))
    return emu_err(QNN_GRAPH_ERROR_INVALID_TENSOR, "tensor %s: node's description differs from the created one",
                   e->name);
  return QNN_SUCCESS;
}

static Qnn_ErrorHandle_t graphAddNode(Qnn_GraphHandle_t gh, Qnn_OpConfig_t op) {
  if (!emu_live_has(gh, EMU_OBJ_GRAPH)) return emu_err(QNN_GRAPH_ERROR_INVALID_HANDLE, "invalid graph handle");
  emu_graph *g = gh;
  if (g->finalized) return emu_err(QNN_GRAPH_ERROR_GRAPH_FINALIZED, "graph %s is finalized: no new nodes", g->name);
  if (op.version != QNN_OPCONFIG_VERSION_1) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "unknown op config version");
  const Qnn_OpConfigV1_t *c = &op.v1;
  const char *nm = c->name ? c->name : "(unnamed)";
  if (!c->packageName || strcmp(c->packageName, QNN_OP_PACKAGE_NAME_QTI_AISW) != 0)
    return emu_err(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "node %s: op package %s is not available", nm,
                   c->packageName ? c->packageName : "(null)");
  int opk = emu_op_from_name(c->typeName);
  if (!opk)
    return emu_err(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "node %s: op %s is not in the emulator's list", nm,
                   c->typeName ? c->typeName : "(null)");
  if (c->numOfInputs > EMU_MAX_IO || c->numOfOutputs > EMU_MAX_IO || c->numOfParams > EMU_MAX_PARAMS ||
      (c->numOfInputs && !c->inputTensors) || (c->numOfOutputs && !c->outputTensors) ||
      (c->numOfParams && !c->params))
    return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "node %s: bad input/output/param arrays", nm);
  emu_node n;
  memset(&n, 0, sizeof n);
  snprintf(n.name, sizeof n.name, "%s", nm);
  n.op = (emu_op)opk;
  n.n_in = c->numOfInputs;
  n.n_out = c->numOfOutputs;
  Qnn_ErrorHandle_t e;
  for (uint32_t i = 0; i < n.n_in; i++)
    if ((e = node_tensor(g, &c->inputTensors[i], &n.in[i])) != QNN_SUCCESS) return e;
  for (uint32_t i = 0; i < n.n_out; i++) {
    if ((e = node_tensor(g, &c->outputTensors[i], &n.out[i])) != QNN_SUCCESS) return e;
    emu_tensor *t = &g->tensors[n.out[i]];
    if (t->type == QNN_TENSOR_TYPE_STATIC || t->type == QNN_TENSOR_TYPE_APP_WRITE || t->produced)
      return emu_err(QNN_GRAPH_ERROR_INVALID_TENSOR, "node %s: output %s is an input, static or already produced",
                     nm, t->name);
  }
  for (uint32_t i = 0; i < n.n_in; i++) {
    emu_tensor *t = &g->tensors[n.in[i]];
    if ((t->type == QNN_TENSOR_TYPE_NATIVE || t->type == QNN_TENSOR_TYPE_APP_READ) && !t->produced)
      return emu_err(QNN_GRAPH_ERROR_UNCONNECTED_NODE, "node %s: input %s is not produced by an earlier node", nm,
                     t->name);
  }
  char msg[400];
  if ((e = emu_node_check(g, &n, c, msg, sizeof msg)) != QNN_SUCCESS) return emu_err(e, "%s", msg);
  if (g->n_nodes == g->cap_nodes) {
    uint32_t nc = g->cap_nodes ? g->cap_nodes * 2 : 32;
    emu_node *nn = realloc(g->nodes, nc * sizeof *nn);
    if (!nn) return emu_err(QNN_COMMON_ERROR_MEM_ALLOC, "out of memory");
    g->nodes = nn;
    g->cap_nodes = nc;
  }
  for (uint32_t i = 0; i < n.n_in; i++) g->tensors[n.in[i]].consumed = 1;
  for (uint32_t i = 0; i < n.n_out; i++) g->tensors[n.out[i]].produced = 1;
  g->nodes[g->n_nodes++] = n;
  return QNN_SUCCESS;
}

/* storage for NATIVE tensors: what a finalized graph (or one loaded from a binary) needs */
Qnn_ErrorHandle_t graph_alloc_native(emu_graph *g) {
  for (uint32_t i = 0; i < g->n_tensors; i++) {
    emu_tensor *t = &g->tensors[i];
    if (t->type == QNN_TENSOR_TYPE_NATIVE && !t->data && !(t->data = malloc(t->nbytes)))
      return emu_err(QNN_COMMON_ERROR_MEM_ALLOC, "out of memory");
  }
  return QNN_SUCCESS;
}

/* one line per event in $XPU_QNN_EMU_STATS, so tests can count what a client made us do */
static void note_stat(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note_stat(const char *fmt, ...) {
  const char *stats = getenv("XPU_QNN_EMU_STATS");
  if (!stats || !stats[0]) return;
  FILE *f = fopen(stats, "a");
  if (!f) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fputc('\n', f);
  fclose(f);
}

static void note_finalize(const emu_graph *g) {
  const char *ms = getenv("XPU_QNN_EMU_FINALIZE_MS");
  long v = ms ? strtol(ms, NULL, 10) : 0;
  if (v > 0) {
    struct timespec ts = {v / 1000, (v % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
  }
  note_stat("finalize %s nodes=%u", g->name, g->n_nodes);
}

static Qnn_ErrorHandle_t graphFinalize(Qnn_GraphHandle_t gh, Qnn_ProfileHandle_t prof, Qnn_SignalHandle_t sig) {
  (void)prof;
  if (!emu_live_has(gh, EMU_OBJ_GRAPH)) return emu_err(QNN_GRAPH_ERROR_INVALID_HANDLE, "invalid graph handle");
  if (sig) return emu_err(QNN_COMMON_ERROR_NOT_SUPPORTED, "signals are not supported");
  emu_graph *g = gh;
  if (g->finalized) return emu_err(QNN_GRAPH_ERROR_GRAPH_FINALIZED, "graph %s is already finalized", g->name);
  if (g->n_nodes == 0) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "graph %s has no nodes", g->name);
  for (uint32_t i = 0; i < g->n_tensors; i++) {
    emu_tensor *t = &g->tensors[i];
    if (t->type == QNN_TENSOR_TYPE_APP_READ && !t->produced)
      return emu_err(QNN_GRAPH_ERROR_INVALID_TENSOR, "graph %s: output %s is never produced", g->name, t->name);
  }
  Qnn_ErrorHandle_t e = graph_alloc_native(g);
  if (e != QNN_SUCCESS) return e;
  note_finalize(g);
  g->finalized = 1;
  return QNN_SUCCESS;
}

/* ------------------------------------------------------------------ memory registration */

static Qnn_ErrorHandle_t memRegister(Qnn_ContextHandle_t ctx, const Qnn_MemDescriptor_t *d, uint32_t n,
                                     Qnn_MemHandle_t *out) {
  if (!emu_live_has(ctx, EMU_OBJ_CONTEXT)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "invalid context handle");
  if (!d || !out || n == 0) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "null descriptors or handles");
  for (uint32_t i = 0; i < n; i++) out[i] = NULL;
  for (uint32_t i = 0; i < n; i++) {
    Qnn_ErrorHandle_t e = QNN_SUCCESS;
    uint64_t numel = 1, offset = 0, total = 0;
    int fd = -1;
    const QnnMemHtp_Descriptor_t *hd = d[i].memType == QNN_MEM_TYPE_CUSTOM ? d[i].customInfo : NULL;
    if (d[i].memType == QNN_MEM_TYPE_ION) {
      fd = d[i].ionInfo.fd;
    } else if (hd && emu_profile_get() == EMU_PROFILE_HTP && hd->type == QNN_HTP_MEM_SHARED_BUFFER) {
      /* the HTP's shared buffer: one rpcmem fd, this tensor at an offset in it */
      fd = hd->sharedBufferConfig.fd;
      offset = hd->sharedBufferConfig.offset;
      total = hd->size;
    } else {
      e = emu_err(QNN_MEM_ERROR_UNSUPPORTED_MEMTYPE,
                  "memRegister: memory type %d is not supported (ION, or on the HTP CUSTOM with a "
                  "QNN_HTP_MEM_SHARED_BUFFER descriptor)", (int)d[i].memType);
    }
    if (e == QNN_SUCCESS && (!emu_dtype_ok(d[i].dataType) || d[i].memShape.numDim == 0 ||
                             d[i].memShape.numDim > EMU_MAX_RANK || !d[i].memShape.dimSize || fd < 0))
      e = emu_err(QNN_MEM_ERROR_INVALID_ARGUMENT, "memRegister: bad shape, dtype or fd");
    for (uint32_t k = 0; e == QNN_SUCCESS && k < d[i].memShape.numDim; k++) numel *= d[i].memShape.dimSize[k];
    uint64_t bytes = numel * qnn_dtype_bytes(d[i].dataType);
    if (e == QNN_SUCCESS && hd && (offset > total || bytes > total - offset))
      e = emu_err(QNN_MEM_ERROR_INVALID_ARGUMENT, "memRegister: tensor of %llu bytes at offset %llu outside the "
                  "%llu-byte shared buffer", (unsigned long long)bytes, (unsigned long long)offset,
                  (unsigned long long)total);
    emu_mem *m = NULL;
    if (e == QNN_SUCCESS && !(m = calloc(1, sizeof *m))) e = emu_err(QNN_COMMON_ERROR_MEM_ALLOC, "out of memory");
    if (e == QNN_SUCCESS) {
      m->size = bytes;
      m->map_size = hd ? total : bytes;
      /* map the client's fd ourselves, as the DSP maps an rpcmem fd: bytes are shared, not copied */
      m->map = mmap(NULL, m->map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (m->map == MAP_FAILED) {
        free(m);
        e = emu_err(QNN_MEM_ERROR_MAPPING, "memRegister: mmap of fd %d failed: %s", fd, strerror(errno));
      } else {
        m->ptr = (uint8_t *)m->map + offset;
      }
    }
    if (e != QNN_SUCCESS) {
      for (uint32_t k = 0; k < i; k++) {
        emu_mem *o = out[k];
        munmap(o->map, o->map_size);
        emu_live_remove(o);
        ((emu_context *)ctx)->n_mems--;
        free(o);
        out[k] = NULL;
      }
      return e;
    }
    m->magic = EMU_OBJ_MEM;
    m->ctx = ctx;
    m->dtype = d[i].dataType;
    m->rank = d[i].memShape.numDim;
    memcpy(m->dims, d[i].memShape.dimSize, m->rank * sizeof(uint32_t));
    emu_live_add(m);
    ((emu_context *)ctx)->n_mems++;
    out[i] = m;
    note_stat("memRegister %s bytes=%llu offset=%llu", hd ? "htp-shared-buffer" : "fd", (unsigned long long)m->size,
              (unsigned long long)offset);
  }
  return QNN_SUCCESS;
}

static Qnn_ErrorHandle_t memDeRegister(const Qnn_MemHandle_t *h, uint32_t n) {
  if (!h) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "null handles");
  for (uint32_t i = 0; i < n; i++)
    if (!emu_live_has(h[i], EMU_OBJ_MEM)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "invalid mem handle");
  for (uint32_t i = 0; i < n; i++) {
    emu_mem *m = h[i];
    munmap(m->map, m->map_size);
    m->ctx->n_mems--;
    emu_live_remove(m);
    free(m);
  }
  return QNN_SUCCESS;
}

/* ------------------------------------------------------------------ execute */

/* the bytes behind one client tensor of an execute call, after the static-shape checks */
static Qnn_ErrorHandle_t bind_io(emu_graph *g, const Qnn_Tensor_t *t, Qnn_TensorType_t want, uint8_t **ptr,
                                 uint8_t *seen) {
  const Qnn_TensorV1_t *v = tv1(t);
  uint32_t idx;
  emu_tensor *e = v ? tensor_by_id(g, v->id, &idx) : NULL;
  if (!e) return emu_err(QNN_GRAPH_ERROR_INVALID_TENSOR, "execute: unknown tensor id");
  if (e->type != want)
    return emu_err(QNN_GRAPH_ERROR_INVALID_TENSOR, "execute: tensor %s is not an %s tensor", e->name,
                   want == QNN_TENSOR_TYPE_APP_WRITE ? "input (APP_WRITE)" : "output (APP_READ)");
  if (seen[idx]) return emu_err(QNN_GRAPH_ERROR_INVALID_TENSOR, "execute: tensor %s given twice", e->name);
  if (v->dataType != e->dtype || v->rank != e->rank || !v->dimensions ||
      memcmp(v->dimensions, e->dims, e->rank * sizeof(uint32_t)) != 0)
    return emu_err(QNN_GRAPH_ERROR_INVALID_TENSOR,
                   "execute: tensor %s bound with a different shape or dtype than finalized (shapes are static)",
                   e->name);
  if (v->memType == QNN_TENSORMEMTYPE_RAW) {
    if (!v->clientBuf.data || v->clientBuf.dataSize < e->nbytes)
      return emu_err(QNN_GRAPH_ERROR_INVALID_TENSOR, "execute: tensor %s buffer holds %u bytes, needs %llu", e->name,
                     v->clientBuf.dataSize, (unsigned long long)e->nbytes);
    ptr[idx] = v->clientBuf.data;
  } else if (v->memType == QNN_TENSORMEMTYPE_MEMHANDLE) {
    emu_mem *m = v->memHandle;
    if (!emu_live_has(m, EMU_OBJ_MEM) || m->ctx != g->ctx)
      return emu_err(QNN_GRAPH_ERROR_INVALID_TENSOR, "execute: tensor %s: mem handle not registered with this context",
                     e->name);
    if (m->dtype != e->dtype || m->rank != e->rank || memcmp(m->dims, e->dims, e->rank * sizeof(uint32_t)) != 0)
      return emu_err(QNN_GRAPH_ERROR_INVALID_TENSOR, "execute: tensor %s: registered memory has another shape",
                     e->name);
    ptr[idx] = m->ptr;
  } else {
    return emu_err(QNN_GRAPH_ERROR_INVALID_TENSOR, "execute: tensor %s: unknown memType", e->name);
  }
  seen[idx] = 1;
  return QNN_SUCCESS;
}

static Qnn_ErrorHandle_t graphExecute(Qnn_GraphHandle_t gh, const Qnn_Tensor_t *in, uint32_t n_in, Qnn_Tensor_t *out,
                                      uint32_t n_out, Qnn_ProfileHandle_t prof, Qnn_SignalHandle_t sig) {
  (void)prof;
  if (!emu_live_has(gh, EMU_OBJ_GRAPH)) return emu_err(QNN_GRAPH_ERROR_INVALID_HANDLE, "invalid graph handle");
  emu_graph *g = gh;
  if (!g->finalized)
    return emu_err(QNN_GRAPH_ERROR_GRAPH_NOT_FINALIZED, "graph %s: execute before graphFinalize", g->name);
  if (sig) return emu_err(QNN_COMMON_ERROR_NOT_SUPPORTED, "signals are not supported");
  if ((n_in && !in) || (n_out && !out)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "null tensor arrays");
  uint8_t **ptr = calloc(g->n_tensors, sizeof *ptr);
  uint8_t *seen = calloc(g->n_tensors, 1);
  Qnn_ErrorHandle_t e = (ptr && seen) ? QNN_SUCCESS : emu_err(QNN_COMMON_ERROR_MEM_ALLOC, "out of memory");
  for (uint32_t i = 0; e == QNN_SUCCESS && i < n_in; i++) e = bind_io(g, &in[i], QNN_TENSOR_TYPE_APP_WRITE, ptr, seen);
  for (uint32_t i = 0; e == QNN_SUCCESS && i < n_out; i++) e = bind_io(g, &out[i], QNN_TENSOR_TYPE_APP_READ, ptr, seen);
  for (uint32_t i = 0; e == QNN_SUCCESS && i < g->n_tensors; i++) {
    emu_tensor *t = &g->tensors[i];
    if ((t->type == QNN_TENSOR_TYPE_APP_WRITE || t->type == QNN_TENSOR_TYPE_APP_READ) && !seen[i] &&
        (t->consumed || t->produced))
      e = emu_err(QNN_GRAPH_ERROR_INVALID_TENSOR, "execute: tensor %s is not given", t->name);
    else if (t->type == QNN_TENSOR_TYPE_STATIC || t->type == QNN_TENSOR_TYPE_NATIVE)
      ptr[i] = t->data;
  }
  /* an FP16 graph reads its float inputs at half precision: run on rounded copies */
  uint8_t **rounded = g->fp16 ? calloc(g->n_tensors, sizeof *rounded) : NULL;
  if (g->fp16 && !rounded && e == QNN_SUCCESS) e = emu_err(QNN_COMMON_ERROR_MEM_ALLOC, "out of memory");
  for (uint32_t i = 0; rounded && e == QNN_SUCCESS && i < g->n_tensors; i++) {
    emu_tensor *t = &g->tensors[i];
    if (t->type != QNN_TENSOR_TYPE_APP_WRITE || t->dtype != QNN_DATATYPE_FLOAT_32 || !ptr[i]) continue;
    if (!(rounded[i] = malloc(t->nbytes))) {
      e = emu_err(QNN_COMMON_ERROR_MEM_ALLOC, "out of memory");
      break;
    }
    for (uint64_t k = 0; k < t->numel; k++) {
      float f;
      memcpy(&f, ptr[i] + 4 * k, 4);
      f = emu_round_half(f);
      memcpy(rounded[i] + 4 * k, &f, 4);
    }
    ptr[i] = rounded[i];
  }
  if (e == QNN_SUCCESS) {
    pthread_mutex_lock(&g->run_mu);
    char msg[400];
    for (uint32_t i = 0; e == QNN_SUCCESS && i < g->n_nodes; i++)
      if ((e = emu_node_run(g, &g->nodes[i], ptr, msg, sizeof msg)) != QNN_SUCCESS) e = emu_err(e, "%s", msg);
    pthread_mutex_unlock(&g->run_mu);
  }
  for (uint32_t i = 0; rounded && i < g->n_tensors; i++) free(rounded[i]);
  free(rounded);
  free(ptr);
  free(seen);
  return e;
}

/* ------------------------------------------------------------------ the provider */

/* ------------------------------------------------------------------ HTP power votes */

/* The HTP profile's perf infrastructure: power-config ids and their votes are checked as the HTP
 * documents them (QnnHtpPerfInfrastructure.h) and counted in the stats file; they change nothing
 * here, there is no clock to vote for. */
static atomic_uint power_ids; /* ids handed out; ids are 1..power_ids */

static Qnn_ErrorHandle_t createPowerConfigId(uint32_t dev, uint32_t core, uint32_t *id) {
  if (!id) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "createPowerConfigId: null id");
  if (dev != 0 || core != 0) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "createPowerConfigId: one device, one core");
  *id = atomic_fetch_add(&power_ids, 1) + 1;
  return QNN_SUCCESS;
}

static Qnn_ErrorHandle_t destroyPowerConfigId(uint32_t id) {
  if (id == 0 || id > atomic_load(&power_ids)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "unknown power config id %u", id);
  return QNN_SUCCESS;
}

static int corner_ok(uint32_t c) { return c == DCVS_VOLTAGE_CORNER_DISABLE || (c >= 0x20 && c <= 0xA0); }

static Qnn_ErrorHandle_t setPowerConfig(uint32_t id, const QnnHtpPerfInfrastructure_PowerConfig_t **cfg) {
  if (id == 0 || id > atomic_load(&power_ids)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "unknown power config id %u", id);
  if (!cfg || !cfg[0]) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "setPowerConfig: no configs");
  for (uint32_t i = 0; cfg[i]; i++) {
    const QnnHtpPerfInfrastructure_PowerConfig_t *c = cfg[i];
    switch (c->option) {
    case QNN_HTP_PERF_INFRASTRUCTURE_POWER_CONFIGOPTION_DCVS_V3: {
      const QnnHtpPerfInfrastructure_DcvsV3_t *d = &c->dcvsV3Config;
      if (d->contextId != id) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "DCVS v3: contextId %u is not the power config id %u", d->contextId, id);
      if (d->powerMode != QNN_HTP_PERF_INFRASTRUCTURE_POWERMODE_ADJUST_UP_DOWN && d->powerMode != 0x2 && d->powerMode != 0x4 &&
          d->powerMode != 0x8 && d->powerMode != QNN_HTP_PERF_INFRASTRUCTURE_POWERMODE_PERFORMANCE_MODE && d->powerMode != 0x20)
        return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "DCVS v3: power mode 0x%x", (unsigned)d->powerMode);
      if ((d->setBusParams && !(corner_ok(d->busVoltageCornerMin) && corner_ok(d->busVoltageCornerTarget) &&
                                corner_ok(d->busVoltageCornerMax) && d->busVoltageCornerMin <= d->busVoltageCornerTarget &&
                                d->busVoltageCornerTarget <= d->busVoltageCornerMax)) ||
          (d->setCoreParams && !(corner_ok(d->coreVoltageCornerMin) && corner_ok(d->coreVoltageCornerTarget) &&
                                 corner_ok(d->coreVoltageCornerMax) && d->coreVoltageCornerMin <= d->coreVoltageCornerTarget &&
                                 d->coreVoltageCornerTarget <= d->coreVoltageCornerMax)))
        return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "DCVS v3: voltage corners must be known and min <= target <= max");
      note_stat("powerConfig dcvs_v3 dcvs=%u mode=0x%x sleep_disable=%u bus=0x%x core=0x%x", d->dcvsEnable,
                (unsigned)d->powerMode, d->sleepDisable, (unsigned)d->busVoltageCornerTarget,
                (unsigned)d->coreVoltageCornerTarget);
      break;
    }
    case QNN_HTP_PERF_INFRASTRUCTURE_POWER_CONFIGOPTION_RPC_CONTROL_LATENCY:
      note_stat("powerConfig rpc_control_latency=%u", c->rpcControlLatencyConfig);
      break;
    case QNN_HTP_PERF_INFRASTRUCTURE_POWER_CONFIGOPTION_RPC_POLLING_TIME:
      if (c->rpcPollingTimeConfig > 9999)
        return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "RPC polling time %u us above 9999", c->rpcPollingTimeConfig);
      note_stat("powerConfig rpc_polling_time=%u", c->rpcPollingTimeConfig);
      break;
    default:
      return emu_err(QNN_COMMON_ERROR_NOT_SUPPORTED, "power config option %d is not supported", (int)c->option);
    }
  }
  return QNN_SUCCESS;
}

static const QnnHtpDevice_Infrastructure_t htp_infra = {
    .infraType = QNN_HTP_DEVICE_INFRASTRUCTURE_TYPE_PERF,
    .perfInfra = {createPowerConfigId, destroyPowerConfigId, setPowerConfig, NULL},
};

static Qnn_ErrorHandle_t deviceGetInfrastructure(const QnnHtpDevice_Infrastructure_t **out) {
  if (!out) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "null output");
  if (emu_profile_get() != EMU_PROFILE_HTP) return emu_err(QNN_COMMON_ERROR_NOT_SUPPORTED, "the CPU backend has no device infrastructure");
  *out = &htp_infra;
  return QNN_SUCCESS;
}

static Qnn_ErrorHandle_t backendValidateOpConfig(Qnn_BackendHandle_t be, Qnn_OpConfig_t op) {
  if (!emu_live_has(be, EMU_OBJ_BACKEND)) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "invalid backend handle");
  if (op.version != QNN_OPCONFIG_VERSION_1 || !op.v1.packageName ||
      strcmp(op.v1.packageName, QNN_OP_PACKAGE_NAME_QTI_AISW) != 0 || !emu_op_from_name(op.v1.typeName))
    return emu_err(QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "op %s is not in the emulator's list",
                   op.v1.typeName ? op.v1.typeName : "(null)");
  return QNN_SUCCESS;
}

static const QnnInterface_t provider = {
    .backendId = QNN_BACKEND_ID_XPU_EMU,
    .providerName = "XPU_QNN_EMULATOR (clean-room emulated provider, not Qualcomm hardware)",
    .apiVersion = {{QNN_API_MAJOR_PINNED, QNN_API_MINOR_SDK_2_44, 0}, {1, 0, 0}},
    .v2_18 =
        {
            .backendCreate = backendCreate,
            .backendGetApiVersion = backendGetApiVersion,
            .backendGetBuildId = backendGetBuildId,
            .backendValidateOpConfig = backendValidateOpConfig,
            .backendFree = backendFree,
            .contextCreate = contextCreate,
            .contextGetBinarySize = contextGetBinarySize,
            .contextGetBinary = contextGetBinary,
            .contextCreateFromBinary = contextCreateFromBinary,
            .contextFree = contextFree,
            .graphCreate = graphCreate,
            .graphAddNode = graphAddNode,
            .graphFinalize = graphFinalize,
            .graphRetrieve = graphRetrieve,
            .graphExecute = graphExecute,
            .tensorCreateGraphTensor = tensorCreateGraphTensor,
            .logCreate = logCreate,
            .logFree = logFree,
            .memRegister = memRegister,
            .memDeRegister = memDeRegister,
            .deviceCreate = deviceCreate,
            .deviceFree = deviceFree,
            .deviceGetInfrastructure = deviceGetInfrastructure,
            .errorGetMessage = errorGetMessage,
        },
};

/* The provider handed out: its name says which backend profile the emulator imitates
 * ("XPU_QNN_EMULATOR/HTP" or "/CPU", XPU_QNN_EMU_PROFILE), so a client can build what it would
 * build for that backend. It claims the newest core API whose HTP rules it models (its function
 * table stays 2.18's, which later versions keep); XPU_QNN_EMU_API_VERSION=<major>.<minor> makes
 * it claim another, so a client's version check can be tested, and the HTP rules follow the
 * version claimed (emu_rules.c). */
static QnnInterface_t active;
static const QnnInterface_t *active_list[] = {&active};
static pthread_once_t active_once = PTHREAD_ONCE_INIT;

static void make_active(void) {
  active = provider;
  active.providerName = emu_profile_get() == EMU_PROFILE_CPU
                            ? "XPU_QNN_EMULATOR/CPU (clean-room emulated provider with QNN CPU backend rules, not Qualcomm software)"
                            : "XPU_QNN_EMULATOR/HTP (clean-room emulated provider with QNN HTP rules, not Qualcomm hardware)";
  const char *v = getenv("XPU_QNN_EMU_API_VERSION");
  unsigned major, minor;
  if (!v || sscanf(v, "%u.%u", &major, &minor) != 2) return;
  active.apiVersion.coreApiVersion.major = major;
  active.apiVersion.coreApiVersion.minor = minor;
}

uint32_t emu_api_minor(void) {
  pthread_once(&active_once, make_active);
  return active.apiVersion.coreApiVersion.minor;
}

EMU_EXPORT Qnn_ErrorHandle_t QnnInterface_getProviders(const QnnInterface_t ***list, uint32_t *n) {
  if (!list || !n) return emu_err(QNN_COMMON_ERROR_INVALID_ARGUMENT, "null output");
  pthread_once(&active_once, make_active);
  *list = (const QnnInterface_t **)active_list;
  *n = 1;
  return QNN_SUCCESS;
}
