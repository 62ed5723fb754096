/*
 * testplugin.c: a small but honest xpu plugin for the loader's and the adapter's tests. It
 * runs F32 graphs of ADD, SUB, MUL, RELU, NEG and SCALE (same-shape operands), keeps buffers in
 * host memory, and answers every misuse with a status. The loader tests build it with macros
 * that break it in one way each:
 *
 *   -DTP_ABI_MAJOR=n     probe and table report ABI major n
 *   -DTP_SCORE_ZERO      probe scores 0 with a reason
 *   -DTP_NO_OPEN         the xpu_plugin_open export is missing
 *   -DTP_OPEN_FAILS      open fails with MISSING_DEP and a last_error message
 *   -DTP_SHORT_TABLE     the table's struct_size stops after device_info
 *   -DTP_NAME="x"        the backend name (default "testplugin"), TP_SCORE the score (default 10)
 *   -DTP_FAULT=k         execution_run faults: 1 segfault, 2 abort, 3 exit(3), 4 hangs, 5 exit(0)
 *   -DTP_PROBE_FAULT=k   xpu_plugin_probe faults: 1 segfault, 2 abort, 3 hangs, 4 exit(0)
 *   -DTP_ZERO_DEVICES    open succeeds with 0 devices
 *   -DTP_NO_IMPORT       the device imports no host memory (buffers must be staged)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* clock_gettime, usleep with -std=c11 */
#endif
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "xpu_backend.h"
#include "xpu_ir.h"
#include "xpu_plugin.h"

#ifndef TP_ABI_MAJOR
#define TP_ABI_MAJOR XPU_ABI_MAJOR
#endif
#ifndef TP_NAME
#define TP_NAME "testplugin"
#endif
#ifndef TP_SCORE
#define TP_SCORE 10
#endif
#ifndef TP_FAULT
#define TP_FAULT 0
#endif

enum { T_CTX = 1, T_BUF, T_EXE, T_EX, T_FENCE };

static xpu_registry reg = XPU_REGISTRY_INIT;

typedef struct tp_ctx {
  pthread_mutex_t mu;
  uint32_t children;
} tp_ctx;

typedef struct tp_buf {
  xpu_context ctx;
  uint8_t *data;
  uint64_t size;
  int owned;    /* allocated here (freed on release) rather than imported */
  uint32_t uses; /* executions that bind it */
} tp_buf;

typedef struct tp_exe {
  xpu_context ctx;
  uint64_t *blob; /* 8-byte aligned copy of the IR */
  xpu_ir_graph g;
  uint32_t n_io;
  uint32_t children;
} tp_exe;

typedef struct tp_bind {
  xpu_buffer buf;
  uint64_t offset;
} tp_bind;

typedef struct tp_ex {
  xpu_executable exe;
  tp_bind *io;
} tp_ex;

typedef struct tp_fence {
  xpu_context ctx;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t value;
  xpu_status failed;
} tp_fence;

static tp_ctx *ctx_get(xpu_context h) { return (tp_ctx *)xpu_reg_get(&reg, h, T_CTX); }

static void ctx_adjust(xpu_context h, int delta) {
  tp_ctx *c = ctx_get(h);
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  c->children = (uint32_t)((int)c->children + delta);
  pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------ plugin and devices */
static xpu_status tp_get_info(xpu_plugin_info *out) {
  if (!out || out->struct_size < sizeof(uint32_t))
    return xpu_fail(&reg, 0, XPU_E_INVALID_ARG, "get_info: null or short out");
  xpu_plugin_info l;
  memset(&l, 0, sizeof l);
  l.abi_major = TP_ABI_MAJOR;
  l.abi_minor = XPU_ABI_MINOR;
  l.opset_min = l.opset_max = XPU_OPSET_VERSION;
  l.ir_version = XPU_IR_VERSION;
  XPU_STRCPY(l.name, TP_NAME);
  XPU_STRCPY(l.vendor, "xpu tests");
  XPU_STRCPY(l.version, "0.1.0");
  XPU_STRCPY(l.build_id, "testplugin-" __DATE__ "-" __TIME__);
  XPU_COPY_OUT(out, l);
  return XPU_OK;
}

static xpu_status tp_shutdown(void) {
  if (xpu_reg_count(&reg, 0) != 0)
    return xpu_fail(&reg, 0, XPU_E_BAD_STATE, "shutdown: %u objects still alive",
                    xpu_reg_count(&reg, 0));
  xpu_reg_destroy(&reg);
  return XPU_OK;
}

static xpu_status tp_last_error(xpu_handle h, char *buf, uint32_t cap, uint32_t *len) {
  return xpu_reg_last_error(&reg, h, buf, cap, len);
}

static xpu_status tp_device_count(uint32_t *out) {
  if (!out) return xpu_fail(&reg, 0, XPU_E_INVALID_ARG, "device_count: out is NULL");
#ifdef TP_ZERO_DEVICES
  *out = 0;
#else
  *out = 1;
#endif
  return XPU_OK;
}

static xpu_status tp_device_info(uint32_t device, xpu_device_info *out) {
  if (!out || out->struct_size < sizeof(uint32_t))
    return xpu_fail(&reg, 0, XPU_E_INVALID_ARG, "device_info: null or short out");
  if (device != 0) return xpu_fail(&reg, 0, XPU_E_INVALID_ARG, "device_info: no device %u", device);
  xpu_device_info l;
  memset(&l, 0, sizeof l);
  l.kind = XPU_DEVICE_CPU;
#ifdef TP_NO_IMPORT
  l.caps = XPU_CAP_HOST_VISIBLE;
#else
  l.caps = XPU_CAP_IMPORT_HOST | XPU_CAP_HOST_VISIBLE | XPU_CAP_UNIFIED_MEMORY;
#endif
  l.compute_units = 1;
  XPU_STRCPY(l.name, "test cpu");
  XPU_STRCPY(l.vendor, "xpu tests");
  XPU_COPY_OUT(out, l);
  return XPU_OK;
}

static int tp_op_ok(uint32_t op) {
  switch (op) {
  case XPU_OP_ADD: case XPU_OP_SUB: case XPU_OP_MUL: case XPU_OP_RELU: case XPU_OP_NEG:
  case XPU_OP_SCALE: return 1;
  default: return 0;
  }
}

static xpu_status tp_op_support(uint32_t device, const xpu_op_query *q, uint32_t *verdict) {
  if (!q || !verdict) return xpu_fail(&reg, 0, XPU_E_INVALID_ARG, "op_support: null argument");
  if (device != 0) return xpu_fail(&reg, 0, XPU_E_INVALID_ARG, "op_support: no device %u", device);
  *verdict = tp_op_ok(q->op) && q->dtype_in == XPU_DT_F32 && q->dtype_out == XPU_DT_F32
                 ? XPU_VERDICT_MAYBE
                 : XPU_VERDICT_NO;
  return XPU_OK;
}

/* ------------------------------------------------------------ contexts */
static xpu_status tp_context_create(uint32_t device, const char *options, xpu_context *out) {
  (void)options;
  if (!out) return xpu_fail(&reg, 0, XPU_E_INVALID_ARG, "context_create: out is NULL");
  if (device != 0) return xpu_fail(&reg, 0, XPU_E_INVALID_ARG, "context_create: no device %u", device);
  tp_ctx *c = (tp_ctx *)calloc(1, sizeof *c);
  if (!c) return xpu_fail(&reg, 0, XPU_E_OUT_OF_MEMORY, "context_create: out of memory");
  pthread_mutex_init(&c->mu, NULL);
  *out = xpu_reg_add(&reg, T_CTX, c);
  if (!*out) {
    free(c);
    return xpu_fail(&reg, 0, XPU_E_OUT_OF_MEMORY, "context_create: registry full");
  }
  return XPU_OK;
}

static xpu_status tp_context_release(xpu_context h) {
  tp_ctx *c = ctx_get(h);
  if (!c) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "context_release: bad handle");
  pthread_mutex_lock(&c->mu);
  uint32_t n = c->children;
  pthread_mutex_unlock(&c->mu);
  if (n) return xpu_fail(&reg, h, XPU_E_BAD_STATE, "context_release: %u objects still alive", n);
  xpu_reg_remove(&reg, h, T_CTX);
  pthread_mutex_destroy(&c->mu);
  free(c);
  return XPU_OK;
}

/* ------------------------------------------------------------ buffers */
static xpu_status buf_add(xpu_context ctx, tp_buf *b, xpu_buffer *out) {
  *out = xpu_reg_add(&reg, T_BUF, b);
  if (!*out) {
    if (b->owned) free(b->data);
    free(b);
    return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "buffer: registry full");
  }
  ctx_adjust(ctx, +1);
  return XPU_OK;
}

static xpu_status tp_buffer_alloc(xpu_context ctx, uint64_t size, uint32_t kind, xpu_buffer *out) {
  if (!out) return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "buffer_alloc: out is NULL");
  if (!ctx_get(ctx)) return xpu_fail(&reg, ctx, XPU_E_INVALID_HANDLE, "buffer_alloc: bad context");
  if (kind > XPU_BUFFER_HOST_VISIBLE)
    return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "buffer_alloc: unknown kind %u", kind);
  if (size == 0 || size > ((uint64_t)1 << 40))
    return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "buffer_alloc: size %llu out of range",
                    (unsigned long long)size);
  tp_buf *b = (tp_buf *)calloc(1, sizeof *b);
  uint8_t *d = (uint8_t *)calloc(1, size);
  if (!b || !d) {
    free(b);
    free(d);
    return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "buffer_alloc: %llu bytes",
                    (unsigned long long)size);
  }
  b->ctx = ctx;
  b->data = d;
  b->size = size;
  b->owned = 1;
  return buf_add(ctx, b, out);
}

static xpu_status tp_buffer_import(xpu_context ctx, const xpu_import_desc *desc, xpu_buffer *out) {
  if (!desc || !out) return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "buffer_import: null argument");
  if (!ctx_get(ctx)) return xpu_fail(&reg, ctx, XPU_E_INVALID_HANDLE, "buffer_import: bad context");
  if (desc->struct_size < offsetof(xpu_import_desc, size) + sizeof(uint64_t))
    return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "buffer_import: short descriptor");
  if (desc->kind == XPU_IMPORT_FD)
    return xpu_fail(&reg, ctx, XPU_E_UNSUPPORTED, "buffer_import: fd import not supported");
#ifdef TP_NO_IMPORT
  return xpu_fail(&reg, ctx, XPU_E_UNSUPPORTED, "buffer_import: host import not supported");
#endif
  if (desc->kind != XPU_IMPORT_HOST || !desc->host_ptr || desc->size == 0)
    return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "buffer_import: bad descriptor");
  tp_buf *b = (tp_buf *)calloc(1, sizeof *b);
  if (!b) return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "buffer_import: out of memory");
  b->ctx = ctx;
  b->data = (uint8_t *)desc->host_ptr;
  b->size = desc->size;
  return buf_add(ctx, b, out);
}

static tp_buf *buf_get(xpu_buffer h) { return (tp_buf *)xpu_reg_get(&reg, h, T_BUF); }

static xpu_status tp_buffer_map(xpu_buffer h, void **out) {
  if (!out) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "buffer_map: out is NULL");
  tp_buf *b = buf_get(h);
  if (!b) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "buffer_map: bad handle");
  *out = b->data;
  return XPU_OK;
}

static xpu_status tp_buffer_unmap(xpu_buffer h) {
  if (!buf_get(h)) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "buffer_unmap: bad handle");
  return XPU_OK;
}

static xpu_status buf_range(xpu_buffer h, uint64_t off, const void *p, uint64_t size, tp_buf **out,
                            const char *what) {
  tp_buf *b = buf_get(h);
  if (!b) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "%s: bad handle", what);
  if (!p && size) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "%s: NULL pointer", what);
  if (off > b->size || size > b->size - off)
    return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "%s: [%llu, +%llu) outside %llu bytes", what,
                    (unsigned long long)off, (unsigned long long)size, (unsigned long long)b->size);
  *out = b;
  return XPU_OK;
}

static xpu_status tp_buffer_write(xpu_buffer h, uint64_t off, const void *src, uint64_t size) {
  tp_buf *b;
  xpu_status st = buf_range(h, off, src, size, &b, "buffer_write");
  if (st == XPU_OK && size) memcpy(b->data + off, src, size);
  return st;
}

static xpu_status tp_buffer_read(xpu_buffer h, uint64_t off, void *dst, uint64_t size) {
  tp_buf *b;
  xpu_status st = buf_range(h, off, dst, size, &b, "buffer_read");
  if (st == XPU_OK && size) memcpy(dst, b->data + off, size);
  return st;
}

static xpu_status tp_buffer_size(xpu_buffer h, uint64_t *out) {
  if (!out) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "buffer_size: out is NULL");
  tp_buf *b = buf_get(h);
  if (!b) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "buffer_size: bad handle");
  *out = b->size;
  return XPU_OK;
}

static xpu_status tp_buffer_release(xpu_buffer h) {
  tp_buf *b = buf_get(h);
  if (!b) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "buffer_release: bad handle");
  if (b->uses) return xpu_fail(&reg, h, XPU_E_BAD_STATE, "buffer_release: bound to %u executions", b->uses);
  xpu_reg_remove(&reg, h, T_BUF);
  ctx_adjust(b->ctx, -1);
  if (b->owned) free(b->data);
  free(b);
  return XPU_OK;
}

/* ------------------------------------------------------------ graphs */
static const char *node_refusal(const xpu_ir_graph *g, const xpu_ir_node *n) {
  if (!tp_op_ok(n->op)) return "op not implemented by the test plugin";
  if (g->tensors[n->output].dtype != XPU_DT_F32) return "only f32 is implemented";
  for (uint32_t i = 0; i < n->n_inputs; i++) {
    const xpu_ir_tensor *t = xpu_ir_input(g, n, i);
    if (t->dtype != XPU_DT_F32) return "only f32 is implemented";
    if (xpu_ir_numel(t) != xpu_ir_numel(&g->tensors[n->output])) return "broadcasting is not implemented";
  }
  return NULL;
}

static xpu_status parse(xpu_context ctx, const void *ir, uint64_t size, xpu_ir_graph *g) {
  char err[128];
  xpu_status st = xpu_ir_parse(ir, size, g, err, sizeof err);
  if (st != XPU_OK) return xpu_fail(&reg, ctx, st, "%s", err);
  for (uint32_t i = 0; i < g->header->n_tensors; i++) {
    const xpu_ir_tensor *t = &g->tensors[i];
    if (t->kind != XPU_TENSOR_CONST) continue;
    tp_buf *b = buf_get(t->const_buffer);
    if (!b || b->ctx != ctx)
      return xpu_fail(&reg, ctx, XPU_E_INVALID_HANDLE, "ir: tensor %u: constant buffer is not of this context", i);
    if (t->const_offset > b->size || xpu_ir_nbytes(t) > b->size - t->const_offset)
      return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "ir: tensor %u: constant outside its buffer", i);
  }
  return XPU_OK;
}

static xpu_status tp_graph_analyze(xpu_context ctx, const void *ir, uint64_t ir_size,
                                   xpu_node_verdict *out, uint32_t cap) {
  if (!ctx_get(ctx)) return xpu_fail(&reg, ctx, XPU_E_INVALID_HANDLE, "graph_analyze: bad context");
  if (!out) return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "graph_analyze: out is NULL");
  xpu_ir_graph g;
  xpu_status st = parse(ctx, ir, ir_size, &g);
  if (st != XPU_OK) return st;
  if (cap < g.header->n_nodes)
    return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "graph_analyze: cap %u < %u nodes", cap, g.header->n_nodes);
  for (uint32_t i = 0; i < g.header->n_nodes; i++) {
    xpu_node_verdict l;
    memset(&l, 0, sizeof l);
    const char *why = node_refusal(&g, &g.nodes[i]);
    l.verdict = why ? XPU_VERDICT_NO : XPU_VERDICT_YES;
    l.precision = XPU_PREC_F32;
    if (why) XPU_STRCPY(l.reason, why);
    XPU_COPY_OUT(&out[i], l);
  }
  return XPU_OK;
}

static xpu_status tp_graph_prepare(xpu_context ctx, const xpu_prepare_desc *d, xpu_executable *out) {
  if (!d || !out) return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "graph_prepare: null argument");
  if (!ctx_get(ctx)) return xpu_fail(&reg, ctx, XPU_E_INVALID_HANDLE, "graph_prepare: bad context");
  if (d->struct_size < offsetof(xpu_prepare_desc, options))
    return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "graph_prepare: short descriptor");
  xpu_ir_graph g;
  xpu_status st = parse(ctx, d->ir, d->ir_size, &g);
  if (st != XPU_OK) return st;
  for (uint32_t i = 0; i < g.header->n_nodes; i++) {
    const char *why = node_refusal(&g, &g.nodes[i]);
    if (why) return xpu_fail(&reg, ctx, XPU_E_UNSUPPORTED, "node %u (%s): %s", i, xpu_op_name(g.nodes[i].op), why);
  }
  tp_exe *e = (tp_exe *)calloc(1, sizeof *e);
  uint64_t *blob = (uint64_t *)malloc((d->ir_size + 7) / 8 * 8);
  if (!e || !blob) {
    free(e);
    free(blob);
    return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "graph_prepare: out of memory");
  }
  memcpy(blob, d->ir, d->ir_size);
  e->ctx = ctx;
  e->blob = blob;
  xpu_ir_parse(blob, d->ir_size, &e->g, NULL, 0);
  e->n_io = g.header->n_inputs + g.header->n_outputs;
  *out = xpu_reg_add(&reg, T_EXE, e);
  if (!*out) {
    free(blob);
    free(e);
    return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "graph_prepare: registry full");
  }
  ctx_adjust(ctx, +1);
  return XPU_OK;
}

static xpu_status tp_executable_serialize(xpu_executable exe, void *dst, uint64_t cap, uint64_t *size) {
  (void)dst;
  (void)cap;
  (void)size;
  if (!xpu_reg_get(&reg, exe, T_EXE))
    return xpu_fail(&reg, exe, XPU_E_INVALID_HANDLE, "executable_serialize: bad handle");
  return xpu_fail(&reg, exe, XPU_E_UNSUPPORTED, "executable_serialize: not supported");
}

static xpu_status tp_executable_release(xpu_executable h) {
  tp_exe *e = (tp_exe *)xpu_reg_get(&reg, h, T_EXE);
  if (!e) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "executable_release: bad handle");
  if (e->children) return xpu_fail(&reg, h, XPU_E_BAD_STATE, "executable_release: %u executions alive", e->children);
  xpu_reg_remove(&reg, h, T_EXE);
  ctx_adjust(e->ctx, -1);
  free(e->blob);
  free(e);
  return XPU_OK;
}

/* ------------------------------------------------------------ executions */
static xpu_status tp_execution_create(xpu_executable exe, xpu_execution *out) {
  if (!out) return xpu_fail(&reg, exe, XPU_E_INVALID_ARG, "execution_create: out is NULL");
  tp_exe *e = (tp_exe *)xpu_reg_get(&reg, exe, T_EXE);
  if (!e) return xpu_fail(&reg, exe, XPU_E_INVALID_HANDLE, "execution_create: bad executable");
  tp_ex *x = (tp_ex *)calloc(1, sizeof *x);
  tp_bind *io = (tp_bind *)calloc(e->n_io ? e->n_io : 1, sizeof *io);
  if (!x || !io) {
    free(x);
    free(io);
    return xpu_fail(&reg, exe, XPU_E_OUT_OF_MEMORY, "execution_create: out of memory");
  }
  x->exe = exe;
  x->io = io;
  *out = xpu_reg_add(&reg, T_EX, x);
  if (!*out) {
    free(io);
    free(x);
    return xpu_fail(&reg, exe, XPU_E_OUT_OF_MEMORY, "execution_create: registry full");
  }
  e->children++;
  return XPU_OK;
}

static const xpu_ir_tensor *io_tensor(const tp_exe *e, uint32_t io) {
  uint32_t ni = e->g.header->n_inputs;
  return &e->g.tensors[io < ni ? e->g.inputs[io] : e->g.outputs[io - ni]];
}

static xpu_status tp_execution_bind(xpu_execution h, uint32_t io, xpu_buffer buf, uint64_t off) {
  tp_ex *x = (tp_ex *)xpu_reg_get(&reg, h, T_EX);
  if (!x) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_bind: bad execution");
  tp_exe *e = (tp_exe *)xpu_reg_get(&reg, x->exe, T_EXE);
  if (io >= e->n_io) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "execution_bind: io %u >= %u", io, e->n_io);
  tp_buf *b = buf_get(buf);
  if (!b || b->ctx != e->ctx) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_bind: bad buffer");
  uint64_t need = xpu_ir_nbytes(io_tensor(e, io));
  if (off > b->size || need > b->size - off)
    return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "execution_bind: io %u needs %llu bytes at %llu, buffer has %llu",
                    io, (unsigned long long)need, (unsigned long long)off, (unsigned long long)b->size);
  if (x->io[io].buf) {
    tp_buf *old = buf_get(x->io[io].buf);
    if (old) old->uses--;
  }
  x->io[io].buf = buf;
  x->io[io].offset = off;
  b->uses++;
  return XPU_OK;
}

static void fault(void) {
#if TP_FAULT == 1
  /* an address the compiler cannot prove invalid, so the store is really emitted */
  volatile uintptr_t bad = 16;
  *(volatile int *)bad = 1;
#elif TP_FAULT == 2
  abort();
#elif TP_FAULT == 3
  exit(3);
#elif TP_FAULT == 4
  for (;;) sleep(1);
#elif TP_FAULT == 5
  exit(0);
#endif
}

static xpu_status run(xpu_execution h, tp_ex *x) {
  fault();
  tp_exe *e = (tp_exe *)xpu_reg_get(&reg, x->exe, T_EXE);
  const xpu_ir_graph *g = &e->g;
  uint32_t nt = g->header->n_tensors;
  float **val = (float **)calloc(nt, sizeof *val);
  uint8_t *owned = (uint8_t *)calloc(nt, 1);
  if (!val || !owned) {
    free(val);
    free(owned);
    return xpu_fail(&reg, h, XPU_E_OUT_OF_MEMORY, "execution_run: out of memory");
  }
  for (uint32_t io = 0; io < e->n_io; io++) {
    tp_buf *b = buf_get(x->io[io].buf);
    uint32_t ti = io < g->header->n_inputs ? g->inputs[io] : g->outputs[io - g->header->n_inputs];
    val[ti] = (float *)(b->data + x->io[io].offset);
  }
  for (uint32_t i = 0; i < nt; i++) {
    const xpu_ir_tensor *t = &g->tensors[i];
    if (t->kind == XPU_TENSOR_CONST) val[i] = (float *)(buf_get(t->const_buffer)->data + t->const_offset);
  }
  xpu_status st = XPU_OK;
  for (uint32_t k = 0; k < g->header->n_nodes && st == XPU_OK; k++) {
    const xpu_ir_node *n = &g->nodes[k];
    int64_t cnt = xpu_ir_numel(&g->tensors[n->output]);
    if (!val[n->output]) {
      val[n->output] = (float *)malloc((size_t)(cnt ? cnt : 1) * sizeof(float));
      owned[n->output] = 1;
      if (!val[n->output]) {
        st = xpu_fail(&reg, h, XPU_E_OUT_OF_MEMORY, "execution_run: out of memory");
        break;
      }
    }
    float *o = val[n->output];
    const float *a = val[n->inputs[0]];
    const float *b = n->n_inputs > 1 ? val[n->inputs[1]] : NULL;
    for (int64_t i = 0; i < cnt; i++) {
      switch (n->op) {
      case XPU_OP_ADD: o[i] = a[i] + b[i]; break;
      case XPU_OP_SUB: o[i] = a[i] - b[i]; break;
      case XPU_OP_MUL: o[i] = a[i] * b[i]; break;
      case XPU_OP_RELU: o[i] = a[i] > 0 ? a[i] : 0; break;
      case XPU_OP_NEG: o[i] = -a[i]; break;
      case XPU_OP_SCALE: o[i] = a[i] * n->fattr[0] + n->fattr[1]; break;
      default: break;
      }
    }
  }
  for (uint32_t i = 0; i < nt; i++)
    if (owned[i]) free(val[i]);
  free(val);
  free(owned);
  return st;
}

static xpu_status check_bound(xpu_execution h, tp_ex **out) {
  tp_ex *x = (tp_ex *)xpu_reg_get(&reg, h, T_EX);
  if (!x) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution: bad handle");
  tp_exe *e = (tp_exe *)xpu_reg_get(&reg, x->exe, T_EXE);
  for (uint32_t io = 0; io < e->n_io; io++)
    if (!buf_get(x->io[io].buf)) return xpu_fail(&reg, h, XPU_E_BAD_STATE, "execution: io %u is not bound", io);
  *out = x;
  return XPU_OK;
}

static xpu_status tp_execution_run(xpu_execution h) {
  tp_ex *x;
  xpu_status st = check_bound(h, &x);
  return st == XPU_OK ? run(h, x) : st;
}

static tp_fence *fence_get(xpu_fence h) { return (tp_fence *)xpu_reg_get(&reg, h, T_FENCE); }

static xpu_status tp_fence_wait(xpu_fence h, uint64_t value, int64_t timeout_ns);
static xpu_status fence_set(tp_fence *f, uint64_t value, xpu_status failed);

/* synchronous: a plugin without XPU_CAP_ASYNC may run the submission before returning */
static xpu_status tp_execution_submit(xpu_execution h, const xpu_fence_point *waits, uint32_t n_waits,
                                      const xpu_fence_point *signal) {
  if (n_waits && !waits) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "execution_submit: waits is NULL");
  tp_ex *x;
  xpu_status st = check_bound(h, &x);
  if (st != XPU_OK) return st;
  tp_fence *sig = NULL;
  if (signal && !(sig = fence_get(signal->fence)))
    return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_submit: bad signal fence");
  for (uint32_t i = 0; i < n_waits; i++) {
    if (!fence_get(waits[i].fence))
      return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_submit: bad wait fence %u", i);
    st = tp_fence_wait(waits[i].fence, waits[i].value, -1);
    if (st != XPU_OK) break;
  }
  if (st == XPU_OK) st = run(h, x);
  if (sig) fence_set(sig, signal->value, st);
  return XPU_OK;
}

static xpu_status tp_execution_release(xpu_execution h) {
  tp_ex *x = (tp_ex *)xpu_reg_remove(&reg, h, T_EX);
  if (!x) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_release: bad handle");
  tp_exe *e = (tp_exe *)xpu_reg_get(&reg, x->exe, T_EXE);
  for (uint32_t io = 0; io < e->n_io; io++) {
    tp_buf *b = buf_get(x->io[io].buf);
    if (b) b->uses--;
  }
  e->children--;
  free(x->io);
  free(x);
  return XPU_OK;
}

/* ------------------------------------------------------------ fences */
static xpu_status tp_fence_create(xpu_context ctx, uint64_t initial, xpu_fence *out) {
  if (!out) return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "fence_create: out is NULL");
  if (!ctx_get(ctx)) return xpu_fail(&reg, ctx, XPU_E_INVALID_HANDLE, "fence_create: bad context");
  tp_fence *f = (tp_fence *)calloc(1, sizeof *f);
  if (!f) return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "fence_create: out of memory");
  pthread_mutex_init(&f->mu, NULL);
  pthread_cond_init(&f->cv, NULL);
  f->ctx = ctx;
  f->value = initial;
  *out = xpu_reg_add(&reg, T_FENCE, f);
  if (!*out) {
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
    free(f);
    return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "fence_create: registry full");
  }
  ctx_adjust(ctx, +1);
  return XPU_OK;
}

static xpu_status fence_set(tp_fence *f, uint64_t value, xpu_status failed) {
  pthread_mutex_lock(&f->mu);
  if (value > f->value) f->value = value;
  if (failed != XPU_OK) f->failed = failed;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  return XPU_OK;
}

static xpu_status tp_fence_wait(xpu_fence h, uint64_t value, int64_t timeout_ns) {
  tp_fence *f = fence_get(h);
  if (!f) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "fence_wait: bad handle");
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  if (timeout_ns >= 0) {
    dl.tv_sec += timeout_ns / 1000000000;
    dl.tv_nsec += timeout_ns % 1000000000;
    if (dl.tv_nsec >= 1000000000) {
      dl.tv_sec++;
      dl.tv_nsec -= 1000000000;
    }
  }
  xpu_status st = XPU_OK;
  pthread_mutex_lock(&f->mu);
  while (f->value < value && f->failed == XPU_OK) {
    if (timeout_ns < 0) {
      pthread_cond_wait(&f->cv, &f->mu);
    } else if (pthread_cond_timedwait(&f->cv, &f->mu, &dl) != 0) {
      st = XPU_E_TIMEOUT;
      break;
    }
  }
  if (st == XPU_OK && f->failed != XPU_OK) st = f->failed;
  pthread_mutex_unlock(&f->mu);
  if (st == XPU_E_TIMEOUT) return xpu_fail(&reg, h, st, "fence_wait: timed out before value %llu", (unsigned long long)value);
  if (st != XPU_OK) return xpu_fail(&reg, h, st, "fence_wait: the submission failed");
  return XPU_OK;
}

static xpu_status tp_fence_value(xpu_fence h, uint64_t *out) {
  if (!out) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "fence_value: out is NULL");
  tp_fence *f = fence_get(h);
  if (!f) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "fence_value: bad handle");
  pthread_mutex_lock(&f->mu);
  *out = f->value;
  pthread_mutex_unlock(&f->mu);
  return XPU_OK;
}

static xpu_status tp_fence_signal(xpu_fence h, uint64_t value) {
  tp_fence *f = fence_get(h);
  if (!f) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "fence_signal: bad handle");
  return fence_set(f, value, XPU_OK);
}

static xpu_status tp_fence_release(xpu_fence h) {
  tp_fence *f = (tp_fence *)xpu_reg_remove(&reg, h, T_FENCE);
  if (!f) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "fence_release: bad handle");
  ctx_adjust(f->ctx, -1);
  pthread_cond_destroy(&f->cv);
  pthread_mutex_destroy(&f->mu);
  free(f);
  return XPU_OK;
}

/* ------------------------------------------------------------ exports */
#ifdef TP_NO_OPEN
__attribute__((unused))
#endif
static const xpu_api api = {
#ifdef TP_SHORT_TABLE
    .struct_size = offsetof(xpu_api, op_support),
#else
    .struct_size = sizeof(xpu_api),
#endif
    .abi_major = TP_ABI_MAJOR,
    .abi_minor = XPU_ABI_MINOR,
    .get_info = tp_get_info,
    .shutdown = tp_shutdown,
    .last_error = tp_last_error,
    .device_count = tp_device_count,
    .device_info = tp_device_info,
    .op_support = tp_op_support,
    .context_create = tp_context_create,
    .context_release = tp_context_release,
    .buffer_alloc = tp_buffer_alloc,
    .buffer_import = tp_buffer_import,
    .buffer_map = tp_buffer_map,
    .buffer_unmap = tp_buffer_unmap,
    .buffer_write = tp_buffer_write,
    .buffer_read = tp_buffer_read,
    .buffer_size = tp_buffer_size,
    .buffer_release = tp_buffer_release,
    .graph_analyze = tp_graph_analyze,
    .graph_prepare = tp_graph_prepare,
    .executable_serialize = tp_executable_serialize,
    .executable_release = tp_executable_release,
    .execution_create = tp_execution_create,
    .execution_bind = tp_execution_bind,
    .execution_submit = tp_execution_submit,
    .execution_run = tp_execution_run,
    .execution_release = tp_execution_release,
    .fence_create = tp_fence_create,
    .fence_wait = tp_fence_wait,
    .fence_value = tp_fence_value,
    .fence_signal = tp_fence_signal,
    .fence_release = tp_fence_release,
};

#if defined(TP_PROBE_FAULT) && TP_PROBE_FAULT != 0
static void probe_fault(void) {
#if TP_PROBE_FAULT == 1
  volatile uintptr_t bad = 16;
  *(volatile int *)bad = 1;
#elif TP_PROBE_FAULT == 2
  abort();
#elif TP_PROBE_FAULT == 3
  for (;;) sleep(1);
#elif TP_PROBE_FAULT == 4
  exit(0);
#endif
}
#endif

XPU_EXPORT xpu_status xpu_plugin_probe(xpu_probe_result *out) {
#if defined(TP_PROBE_FAULT) && TP_PROBE_FAULT != 0
  probe_fault();
#endif
  if (!out || out->struct_size < sizeof(uint32_t)) return XPU_E_INVALID_ARG;
  xpu_probe_result l;
  memset(&l, 0, sizeof l);
  l.abi_major = TP_ABI_MAJOR;
  l.abi_minor = XPU_ABI_MINOR;
  XPU_STRCPY(l.name, TP_NAME);
#ifdef TP_SCORE_ZERO
  l.score = 0;
  XPU_STRCPY(l.reason, "libvendor-test.so.1 not found");
#else
  l.score = TP_SCORE;
  XPU_STRCPY(l.reason, "test plugin, always available");
#endif
  XPU_COPY_OUT(out, l);
  return XPU_OK;
}

#if !defined(TP_NO_OPEN) && !defined(TP_OPEN_FAILS)
/* the log sink is called from any plugin thread: log once from a thread the host never saw */
static void *log_from_thread(void *arg) {
  (void)arg;
  xpu_log(&reg, XPU_LOG_DEBUG, "hello from a plugin thread");
  return NULL;
}
#endif

#ifndef TP_NO_OPEN
XPU_EXPORT xpu_status xpu_plugin_open(const xpu_host_info *host, const xpu_api **out) {
  if (!host || !out) return XPU_E_INVALID_ARG;
  xpu_reg_set_log(&reg, host);
#ifdef TP_OPEN_FAILS
  *out = &api;
  return xpu_fail(&reg, 0, XPU_E_MISSING_DEP, "vendor runtime libfake.so.2 could not be initialised");
#else
  xpu_log(&reg, XPU_LOG_INFO, "test plugin opened from %s", host->plugin_dir ? host->plugin_dir : "?");
  pthread_t th;
  if (pthread_create(&th, NULL, log_from_thread, NULL) == 0) pthread_join(th, NULL);
  *out = &api;
  return XPU_OK;
#endif
}
#endif
