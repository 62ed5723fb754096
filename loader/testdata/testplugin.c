/*
 * testplugin.c: the project's smallest honest xpu plugin, shared by the loader's, the adapter's
 * and the conformance suite's tests. Built intact it runs f32 graphs of ADD, SUB and MUL (numpy
 * broadcasting), RELU, NEG, EXP, SILU, SCALE, SOFTMAX, rank-2 MATMUL and PERMUTE, keeps buffers
 * in host memory, executes synchronously, answers every misuse with a status, and passes
 * `xpu conform`. Each define below breaks it in one way.
 *
 * Loader and adapter switches (discovery, open, faults):
 *   -DTP_ABI_MAJOR=n     probe and table report ABI major n
 *   -DTP_SCORE_ZERO      probe scores 0 with a reason
 *   -DTP_NO_OPEN         the xpu_plugin_open export is missing
 *   -DTP_OPEN_FAILS      open fails with MISSING_DEP and a last_error message
 *   -DTP_SHORT_TABLE     the table's struct_size stops after device_info
 *   -DTP_NAME="x"        the backend name (default "testplugin"), TP_SCORE the score (default 10)
 *   -DTP_FAULT=k         execution_run faults: 1 segfault, 2 abort, 3 exit(3), 4 hangs, 5 exit(0),
 *                        6 takes 300 ms (then runs: a slow call its caller may give up on)
 *   -DTP_PROBE_FAULT=k   xpu_plugin_probe faults: 1 segfault, 2 abort, 3 hangs, 4 exit(0)
 *   -DTP_ZERO_DEVICES    open succeeds with 0 devices
 *   -DTP_NO_IMPORT       the device imports no host memory (buffers must be staged)
 *   -DTP_DEVICE_INFO_1_0 device_info fills only the ABI 1.0 part (no declared peaks)
 *   -DTP_STRICT_RELEASE  buffer_release refuses (BAD_STATE) a buffer that any live execution
 *                        binds: stricter than the ABI, it catches a host that releases buffers
 *                        before the executions bound to them
 *
 * Conformance mutations: one realistic bug each, which the suite must catch in its category:
 *   -DMUT_TRANSPOSE      PERMUTE [1,0] copies instead of transposing        -> mismatch
 *   -DMUT_OFF_BY_ONE_ROW MATMUL row m reads row m+1 of a                    -> mismatch
 *   -DMUT_WRITE_PAST     ADD writes one element past its output             -> out-of-bounds
 *   -DMUT_NAN            RELU writes NaN into its middle element            -> nan
 *   -DMUT_REFUSE         EXP is claimed (graph_analyze), then graph_prepare
 *                        refuses it                                         -> capability-lie
 *   -DMUT_SOFTMAX        SOFTMAX's sum is 0.1 % too large                   -> mismatch
 *   -DMUT_NONDET         ADD's first element drifts with every run          -> nondeterministic
 *   -DMUT_CRASH          SCALE aborts the process (run isolated)            -> crash
 *   -DMUT_STALE_OK       releasing a released buffer answers OK             -> error (level 1)
 *   -DMUT_SILENT         execution_bind refuses an io without a message     -> error (level 1)
 *   -DMUT_CTX_LEAK       executable_release forgets its context's child
 *                        count, so the suite's context never closes          -> ABI(context-close-at-end)
 *   -DMUT_UNDERSCORE_EXIT SCALE calls _exit(0), which no exit guard catches  -> a run without its summary
 *   -DMUT_HANG           SCALE never returns                                -> timeout (isolated), SIGINT
 *
 * Validation-layer mutations (abi/validate_test.go): answers the validation layer must catch:
 *   -DMUT_HALF_PRECISION ADD rounds its results to 11 significant bits (f16) while
 *                        graph_analyze reports F32                          -> rule precision
 *   -DMUT_FENCE_BACK     fence_value answers one less than the fence's value -> rule fence-monotonic
 *
 * A mutation never writes outside the buffer it was given (the suite's guard bytes live
 * inside it), so the test process survives every variant.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* clock_gettime, usleep with -std=c11 */
#endif
#include <math.h>
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
#include "xpu_validate.h"
#include "xpu_plugin.h"
#include "xpu_sync.h"

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
  uint32_t children; /* buffers, executables and fences */
} tp_ctx;

typedef struct tp_buf {
  xpu_context ctx;
  uint8_t *data;
  uint64_t size;
  int owned; /* allocated here, not imported */
} tp_buf;

typedef struct tp_exe {
  xpu_context ctx;
  uint64_t *blob; /* 8-byte aligned copy of the IR */
  xpu_ir_graph g;
  uint32_t n_io;
  pthread_mutex_t mu;
  uint32_t children; /* executions */
  uint64_t runs;     /* MUT_NONDET's drift */
} tp_exe;

typedef struct tp_bind {
  xpu_buffer buf;
  uint64_t offset;
} tp_bind;

typedef struct tp_ex {
  xpu_executable exe;
  tp_bind *io;
  uint32_t n_io;
  pthread_mutex_t mu;
  int running;
} tp_ex;

typedef struct tp_fence {
  xpu_context ctx;
  xpu_timeline tl;
} tp_fence;

static tp_ctx *ctx_get(xpu_context h) { return (tp_ctx *)xpu_reg_get(&reg, h, T_CTX); }
static tp_buf *buf_get(xpu_buffer h) { return (tp_buf *)xpu_reg_get(&reg, h, T_BUF); }
static tp_exe *exe_get(xpu_executable h) { return (tp_exe *)xpu_reg_get(&reg, h, T_EXE); }
static tp_ex *ex_get(xpu_execution h) { return (tp_ex *)xpu_reg_get(&reg, h, T_EX); }
static tp_fence *fence_get(xpu_fence h) { return (tp_fence *)xpu_reg_get(&reg, h, T_FENCE); }

static void count_adjust(pthread_mutex_t *mu, uint32_t *n, int delta) {
  pthread_mutex_lock(mu);
  *n = (uint32_t)((int64_t)*n + delta);
  pthread_mutex_unlock(mu);
}

static void ctx_adjust(xpu_context h, int delta) {
  tp_ctx *c = ctx_get(h);
  if (c) count_adjust(&c->mu, &c->children, delta);
}

/* ------------------------------------------------------------ plugin and device */
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
  XPU_STRCPY(l.version, "0.2.0");
  XPU_STRCPY(l.build_id, "testplugin-" __DATE__ "-" __TIME__);
  XPU_COPY_OUT(out, l);
  return XPU_OK;
}

static xpu_status tp_shutdown(void) {
  uint32_t n = xpu_reg_count(&reg, 0);
  if (n) return xpu_fail(&reg, 0, XPU_E_BAD_STATE, "shutdown: %u objects still alive", n);
  xpu_reg_destroy(&reg);
  return XPU_OK;
}

static xpu_status tp_last_error(xpu_handle h, char *buf, uint32_t cap, uint32_t *len) {
  if (!buf) return XPU_E_INVALID_ARG; /* nowhere to put the message, nothing to record */
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
  l.caps = XPU_CAP_HOST_VISIBLE | XPU_CAP_CONCURRENT;
#else
  l.caps = XPU_CAP_IMPORT_HOST | XPU_CAP_HOST_VISIBLE | XPU_CAP_UNIFIED_MEMORY | XPU_CAP_CONCURRENT;
#endif
  l.compute_units = 1;
  XPU_STRCPY(l.name, "test cpu");
  XPU_STRCPY(l.vendor, "xpu tests");
  /* a plugin built against ABI 1.0 knows no peaks: it writes up to driver_version, and whatever
   * it had declared lies past what it copies */
  l.peak_read_bytes_per_s = 12000000000ull;
  l.peak_flops_f32 = 34000000000ull;
#ifdef TP_DEVICE_INFO_1_0
  if (out->struct_size > offsetof(xpu_device_info, peak_read_bytes_per_s))
    out->struct_size = offsetof(xpu_device_info, peak_read_bytes_per_s);
#endif
  XPU_COPY_OUT(out, l);
  return XPU_OK;
}

static int op_known(uint32_t op) {
  switch (op) {
  case XPU_OP_ADD: case XPU_OP_SUB: case XPU_OP_MUL: case XPU_OP_NEG: case XPU_OP_RELU:
  case XPU_OP_EXP: case XPU_OP_SILU: case XPU_OP_SCALE: case XPU_OP_SOFTMAX: case XPU_OP_MATMUL: case XPU_OP_PERMUTE:
    return 1;
  default:
    return 0;
  }
}

static xpu_status tp_op_support(uint32_t device, const xpu_op_query *q, uint32_t *verdict) {
  if (!q || !verdict) return xpu_fail(&reg, 0, XPU_E_INVALID_ARG, "op_support: null argument");
  if (device != 0) return xpu_fail(&reg, 0, XPU_E_INVALID_ARG, "op_support: no device %u", device);
  int f32 = q->dtype_in == XPU_DT_F32 && q->dtype_out == XPU_DT_F32 &&
            (q->dtype_weight == 0 || q->dtype_weight == XPU_DT_F32);
  /* MAYBE: shapes (rank-2 MATMUL, causal SOFTMAX) are only known to graph_analyze */
  *verdict = op_known(q->op) && f32 ? XPU_VERDICT_MAYBE : XPU_VERDICT_NO;
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
    pthread_mutex_destroy(&c->mu);
    free(c);
    return xpu_fail(&reg, 0, XPU_E_OUT_OF_MEMORY, "context_create: registry full");
  }
  return XPU_OK;
}

static xpu_status tp_context_release(xpu_context h) {
  tp_ctx *c = ctx_get(h);
  if (!c) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "context_release: not a live context");
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
  if (!ctx_get(ctx)) return xpu_fail(&reg, ctx, XPU_E_INVALID_HANDLE, "buffer_alloc: not a live context");
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
    return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "buffer_alloc: %llu bytes", (unsigned long long)size);
  }
  b->ctx = ctx;
  b->data = d;
  b->size = size;
  b->owned = 1;
  return buf_add(ctx, b, out);
}

static xpu_status tp_buffer_import(xpu_context ctx, const xpu_import_desc *desc, xpu_buffer *out) {
  if (!desc || !out) return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "buffer_import: null argument");
  if (!ctx_get(ctx)) return xpu_fail(&reg, ctx, XPU_E_INVALID_HANDLE, "buffer_import: not a live context");
  if (desc->struct_size < offsetof(xpu_import_desc, size) + sizeof(uint64_t))
    return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "buffer_import: descriptor too short");
  if (desc->kind == XPU_IMPORT_FD)
    return xpu_fail(&reg, ctx, XPU_E_UNSUPPORTED, "buffer_import: fd import is not implemented");
#ifdef TP_NO_IMPORT
  return xpu_fail(&reg, ctx, XPU_E_UNSUPPORTED, "buffer_import: host import is not implemented");
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

static xpu_status tp_buffer_map(xpu_buffer h, void **out) {
  if (!out) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "buffer_map: out is NULL");
  tp_buf *b = buf_get(h);
  if (!b) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "buffer_map: not a live buffer");
  *out = b->data;
  return XPU_OK;
}

static xpu_status tp_buffer_unmap(xpu_buffer h) {
  if (!buf_get(h)) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "buffer_unmap: not a live buffer");
  return XPU_OK;
}

static xpu_status buf_range(xpu_buffer h, uint64_t off, const void *p, uint64_t size, tp_buf **out,
                            const char *what) {
  tp_buf *b = buf_get(h);
  if (!b) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "%s: not a live buffer", what);
  if (!p) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "%s: NULL pointer", what);
  if (off > b->size || size > b->size - off)
    return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "%s: [%llu, +%llu) is outside %llu bytes", what,
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
  if (!b) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "buffer_size: not a live buffer");
  *out = b->size;
  return XPU_OK;
}

#ifdef TP_STRICT_RELEASE
/* whether a live execution binds h (the registry's lock, then each execution's) */
static int buf_bound(xpu_buffer h) {
  int bound = 0;
  pthread_mutex_lock(&reg.mu);
  for (uint32_t i = 1; i < reg.cap && !bound; i++) {
    if (!reg.slots[i].obj || reg.slots[i].type != T_EX) continue;
    tp_ex *x = (tp_ex *)reg.slots[i].obj;
    pthread_mutex_lock(&x->mu);
    for (uint32_t io = 0; io < x->n_io && !bound; io++) bound = x->io[io].buf == h;
    pthread_mutex_unlock(&x->mu);
  }
  pthread_mutex_unlock(&reg.mu);
  return bound;
}
#endif

static xpu_status tp_buffer_release(xpu_buffer h) {
#ifdef TP_STRICT_RELEASE
  if (buf_bound(h)) return xpu_fail(&reg, h, XPU_E_BAD_STATE, "buffer_release: a live execution binds it");
#endif
  tp_buf *b = (tp_buf *)xpu_reg_remove(&reg, h, T_BUF);
#ifdef MUT_STALE_OK
  if (!b) return XPU_OK;
#endif
  if (!b) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "buffer_release: not a live buffer");
  ctx_adjust(b->ctx, -1);
  if (b->owned) free(b->data);
  free(b);
  return XPU_OK;
}

/* ------------------------------------------------------------ graphs */
static const char *node_refusal(const xpu_ir_graph *g, const xpu_ir_node *n) {
  if (!op_known(n->op)) return "op not implemented by the test plugin";
  /* the op's rules (abi/OPS.md), shared by every plugin: arity first, so the reads below exist */
  const char *why = xpu_validate_node(g, n);
  if (why) return why;
  if (g->tensors[n->output].dtype != XPU_DT_F32) return "only f32 is implemented";
  for (uint32_t i = 0; i < n->n_inputs; i++)
    if (xpu_ir_input(g, n, i)->dtype != XPU_DT_F32) return "only f32 is implemented";
  if (n->op == XPU_OP_MATMUL && (xpu_ir_input(g, n, 0)->rank != 2 || xpu_ir_input(g, n, 1)->rank != 2))
    return "MATMUL: only rank-2 a and b are implemented";
  if (n->op == XPU_OP_SOFTMAX && n->iattr[0] && g->tensors[n->output].rank < 2)
    return "causal SOFTMAX needs rank >= 2";
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

static xpu_status tp_graph_analyze(xpu_context ctx, const void *ir, uint64_t ir_size, xpu_node_verdict *out,
                                  uint32_t cap) {
  if (!ir || !out) return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "graph_analyze: null argument");
  if (!ctx_get(ctx)) return xpu_fail(&reg, ctx, XPU_E_INVALID_HANDLE, "graph_analyze: not a live context");
  xpu_ir_graph g;
  xpu_status st = parse(ctx, ir, ir_size, &g);
  if (st != XPU_OK) return st;
  if (cap < g.header->n_nodes)
    return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "graph_analyze: room for %u verdicts, %u nodes", cap,
                    g.header->n_nodes);
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
  if (!d || !out || !d->ir) return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "graph_prepare: null argument");
  if (!ctx_get(ctx)) return xpu_fail(&reg, ctx, XPU_E_INVALID_HANDLE, "graph_prepare: not a live context");
  if (d->ir_size > ((uint64_t)1 << 32))
    return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "graph_prepare: IR of %llu bytes", (unsigned long long)d->ir_size);
  tp_exe *e = (tp_exe *)calloc(1, sizeof *e);
  uint64_t *blob = (uint64_t *)malloc(d->ir_size + 8);
  if (!e || !blob) {
    free(e);
    free(blob);
    return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "graph_prepare: out of memory");
  }
  memcpy(blob, d->ir, d->ir_size);
  xpu_status st = parse(ctx, blob, d->ir_size, &e->g);
  for (uint32_t i = 0; st == XPU_OK && i < e->g.header->n_nodes; i++) {
    const char *why = node_refusal(&e->g, &e->g.nodes[i]);
    if (why)
      st = xpu_fail(&reg, ctx, XPU_E_UNSUPPORTED, "graph_prepare: node %u (%s): %s", i,
                    xpu_op_name(e->g.nodes[i].op), why);
#ifdef MUT_REFUSE
    else if (e->g.nodes[i].op == XPU_OP_EXP)
      st = xpu_fail(&reg, ctx, XPU_E_UNSUPPORTED, "graph_prepare: node %u: EXP after all", i);
#endif
  }
  if (st != XPU_OK) {
    free(blob);
    free(e);
    return st;
  }
  e->ctx = ctx;
  e->blob = blob;
  e->n_io = e->g.header->n_inputs + e->g.header->n_outputs;
  pthread_mutex_init(&e->mu, NULL);
  *out = xpu_reg_add(&reg, T_EXE, e);
  if (!*out) {
    pthread_mutex_destroy(&e->mu);
    free(blob);
    free(e);
    return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "graph_prepare: registry full");
  }
  ctx_adjust(ctx, +1);
  return XPU_OK;
}

static xpu_status tp_executable_serialize(xpu_executable h, void *dst, uint64_t cap, uint64_t *size) {
  (void)dst;
  (void)cap;
  (void)size; /* nothing is ever serialized: UNSUPPORTED whatever the arguments */
  if (!exe_get(h)) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "executable_serialize: not a live executable");
  return xpu_fail(&reg, h, XPU_E_UNSUPPORTED, "executable_serialize: not implemented");
}

static xpu_status tp_executable_release(xpu_executable h) {
  tp_exe *e = exe_get(h);
  if (!e) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "executable_release: not a live executable");
  pthread_mutex_lock(&e->mu);
  uint32_t n = e->children;
  pthread_mutex_unlock(&e->mu);
  if (n) return xpu_fail(&reg, h, XPU_E_BAD_STATE, "executable_release: %u executions still alive", n);
  if (!xpu_reg_remove(&reg, h, T_EXE))
    return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "executable_release: released concurrently");
#ifndef MUT_CTX_LEAK
  ctx_adjust(e->ctx, -1);
#endif
  pthread_mutex_destroy(&e->mu);
  free(e->blob);
  free(e);
  return XPU_OK;
}

/* ------------------------------------------------------------ executions */
static xpu_status tp_execution_create(xpu_executable h, xpu_execution *out) {
  if (!out) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "execution_create: out is NULL");
  tp_exe *e = exe_get(h);
  if (!e) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_create: not a live executable");
  tp_ex *x = (tp_ex *)calloc(1, sizeof *x);
  tp_bind *io = (tp_bind *)calloc(e->n_io ? e->n_io : 1, sizeof *io);
  if (!x || !io) {
    free(x);
    free(io);
    return xpu_fail(&reg, h, XPU_E_OUT_OF_MEMORY, "execution_create: out of memory");
  }
  x->exe = h;
  x->io = io;
  x->n_io = e->n_io;
  pthread_mutex_init(&x->mu, NULL);
  *out = xpu_reg_add(&reg, T_EX, x);
  if (!*out) {
    pthread_mutex_destroy(&x->mu);
    free(io);
    free(x);
    return xpu_fail(&reg, h, XPU_E_OUT_OF_MEMORY, "execution_create: registry full");
  }
  count_adjust(&e->mu, &e->children, +1);
  return XPU_OK;
}

static const xpu_ir_tensor *io_tensor(const tp_exe *e, uint32_t io) {
  uint32_t ni = e->g.header->n_inputs;
  return &e->g.tensors[io < ni ? e->g.inputs[io] : e->g.outputs[io - ni]];
}

static xpu_status tp_execution_bind(xpu_execution h, uint32_t io, xpu_buffer buf, uint64_t off) {
  tp_ex *x = ex_get(h);
  if (!x) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_bind: not a live execution");
  tp_exe *e = exe_get(x->exe);
  if (!e) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_bind: executable released");
#ifdef MUT_SILENT
  if (io >= e->n_io) return XPU_E_INVALID_ARG;
#endif
  if (io >= e->n_io) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "execution_bind: io %u of %u", io, e->n_io);
  tp_buf *b = buf_get(buf);
  if (!b) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_bind: not a live buffer");
  if (b->ctx != e->ctx) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "execution_bind: buffer of another context");
  uint64_t n = xpu_ir_nbytes(io_tensor(e, io));
  if (off > b->size || n > b->size - off)
    return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "execution_bind: io %u needs %llu bytes at %llu of %llu", io,
                    (unsigned long long)n, (unsigned long long)off, (unsigned long long)b->size);
  pthread_mutex_lock(&x->mu);
  int running = x->running;
  if (!running) {
    x->io[io].buf = buf;
    x->io[io].offset = off;
  }
  pthread_mutex_unlock(&x->mu);
  if (running) return xpu_fail(&reg, h, XPU_E_BAD_STATE, "execution_bind: execution in flight");
  return XPU_OK;
}

/* f32 kernels: numpy broadcasting over at most 4 right-aligned axes */
static void dims4(const xpu_ir_tensor *t, int64_t d[4]) {
  for (int i = 0; i < 4; i++) d[i] = 1;
  for (uint32_t i = 0; i < t->rank; i++) d[4 - t->rank + i] = t->shape[i];
}

static void k_binary(uint32_t op, const xpu_ir_tensor *ta, const float *a, const xpu_ir_tensor *tb, const float *b,
                  const xpu_ir_tensor *to, float *o) {
  int64_t da[4], db[4], dout[4];
  dims4(ta, da);
  dims4(tb, db);
  dims4(to, dout);
  int64_t sa[4], sb[4];
  int64_t accA = 1, accB = 1;
  for (int i = 3; i >= 0; i--) {
    sa[i] = da[i] == 1 ? 0 : accA;
    sb[i] = db[i] == 1 ? 0 : accB;
    accA *= da[i];
    accB *= db[i];
  }
  int64_t k = 0;
  for (int64_t i0 = 0; i0 < dout[0]; i0++)
    for (int64_t i1 = 0; i1 < dout[1]; i1++)
      for (int64_t i2 = 0; i2 < dout[2]; i2++)
        for (int64_t i3 = 0; i3 < dout[3]; i3++, k++)
        {
          float va = a[i0 * sa[0] + i1 * sa[1] + i2 * sa[2] + i3 * sa[3]];
          float vb = b[i0 * sb[0] + i1 * sb[1] + i2 * sb[2] + i3 * sb[3]];
          o[k] = op == XPU_OP_SUB ? va - vb : op == XPU_OP_MUL ? va * vb : va + vb;
        }
}

static void k_softmax(const xpu_ir_node *n, const xpu_ir_tensor *t, const float *x, float *o) {
  int64_t N = t->shape[t->rank - 1], rows = N ? xpu_ir_numel(t) / N : 0;
  int64_t M = t->rank >= 2 ? t->shape[t->rank - 2] : 1;
  float scale = n->fattr[0] == 0 ? 1.0f : n->fattr[0];
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * N;
    float *orow = o + r * N;
    int64_t last = N - 1; /* last visible column */
    if (n->iattr[0]) last = (r % M) + n->iattr[1];
    if (last > N - 1) last = N - 1;
    float mx = -INFINITY;
    for (int64_t j = 0; j <= last; j++) mx = fmaxf(mx, xr[j] * scale);
    double sum = 0;
    for (int64_t j = 0; j <= last; j++) sum += exp((double)(xr[j] * scale) - mx);
#ifdef MUT_SOFTMAX
    sum *= 1.001;
#endif
    for (int64_t j = 0; j < N; j++)
      orow[j] = j <= last ? (float)(exp((double)(xr[j] * scale) - mx) / sum) : 0.0f;
  }
}

static void k_matmul(const xpu_ir_tensor *ta, const float *a, const xpu_ir_tensor *tb, const float *b, float *o) {
  int64_t M = ta->shape[0], K = ta->shape[1], N = tb->shape[0];
  for (int64_t m = 0; m < M; m++) {
    int64_t am = m;
#ifdef MUT_OFF_BY_ONE_ROW
    if (m + 1 < M) am = m + 1;
#endif
    for (int64_t j = 0; j < N; j++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++) s += (double)a[am * K + k] * b[j * K + k];
      o[m * N + j] = (float)s;
    }
  }
}

static void k_permute(const xpu_ir_node *n, const xpu_ir_tensor *tx, const float *x, const xpu_ir_tensor *to,
                      float *o) {
  uint32_t r = tx->rank;
  int64_t total = xpu_ir_numel(to);
#ifdef MUT_TRANSPOSE
  if (r == 2 && n->iattr[0] == 1 && n->iattr[1] == 0) {
    memcpy(o, x, (size_t)total * sizeof(float));
    return;
  }
#endif
  int64_t xs[XPU_MAX_RANK], idx[XPU_MAX_RANK] = {0};
  int64_t acc = 1;
  for (int i = (int)r - 1; i >= 0; i--) {
    xs[i] = acc;
    acc *= tx->shape[i];
  }
  for (int64_t k = 0; k < total; k++) {
    int64_t src = 0;
    for (uint32_t d = 0; d < r; d++) src += idx[d] * xs[n->iattr[d]];
    o[k] = x[src];
    for (int d = (int)r - 1; d >= 0; d--) { /* next output index, last axis fastest */
      if (++idx[d] < to->shape[d]) break;
      idx[d] = 0;
    }
  }
}

/* room: bytes of the output's buffer past the tensor's start (MUT_WRITE_PAST stays inside it) */
static void run_node(tp_exe *e, const xpu_ir_node *n, float **ptr, uint64_t room) {
  const xpu_ir_graph *g = &e->g;
  const xpu_ir_tensor *to = &g->tensors[n->output];
  float *o = ptr[n->output];
  const float *x = ptr[n->inputs[0]];
  int64_t cnt = xpu_ir_numel(to);
  (void)room;
  switch (n->op) {
  case XPU_OP_SUB:
  case XPU_OP_MUL:
    k_binary(n->op, xpu_ir_input(g, n, 0), x, xpu_ir_input(g, n, 1), ptr[n->inputs[1]], to, o);
    break;
  case XPU_OP_ADD:
    k_binary(n->op, xpu_ir_input(g, n, 0), x, xpu_ir_input(g, n, 1), ptr[n->inputs[1]], to, o);
#ifdef MUT_WRITE_PAST
    if (cnt > 0 && room >= (uint64_t)(cnt + 1) * sizeof(float)) o[cnt] = o[cnt - 1] + 1.0f;
#endif
#ifdef MUT_HALF_PRECISION
    for (int64_t i = 0; i < cnt; i++) {
      uint32_t u;
      memcpy(&u, &o[i], sizeof u);
      u = (u + 0x1000u) & ~0x1FFFu; /* round to 10 stored mantissa bits, as binary16 keeps */
      memcpy(&o[i], &u, sizeof u);
    }
#endif
#ifdef MUT_NONDET
    if (cnt > 0) {
      pthread_mutex_lock(&e->mu);
      o[0] += 1e-3f * (float)e->runs++;
      pthread_mutex_unlock(&e->mu);
    }
#endif
    break;
  case XPU_OP_RELU:
    for (int64_t i = 0; i < cnt; i++) o[i] = x[i] > 0 ? x[i] : 0.0f;
#ifdef MUT_NAN
    if (cnt > 0) o[cnt / 2] = NAN;
#endif
    break;
  case XPU_OP_NEG:
    for (int64_t i = 0; i < cnt; i++) o[i] = -x[i];
    break;
  case XPU_OP_EXP:
    for (int64_t i = 0; i < cnt; i++) o[i] = expf(x[i]);
    break;
  case XPU_OP_SILU:
    for (int64_t i = 0; i < cnt; i++) o[i] = (float)(x[i] / (1.0 + exp(-(double)x[i])));
    break;
  case XPU_OP_SCALE:
#ifdef MUT_CRASH
    abort();
#endif
#ifdef MUT_UNDERSCORE_EXIT
    _exit(0);
#endif
#ifdef MUT_HANG
    for (;;) sleep(1);
#endif
    for (int64_t i = 0; i < cnt; i++) o[i] = x[i] * n->fattr[0] + n->fattr[1];
    break;
  case XPU_OP_SOFTMAX:
    k_softmax(n, to, x, o);
    break;
  case XPU_OP_MATMUL:
    k_matmul(xpu_ir_input(g, n, 0), x, xpu_ir_input(g, n, 1), ptr[n->inputs[1]], o);
    break;
  case XPU_OP_PERMUTE:
    k_permute(n, xpu_ir_input(g, n, 0), x, to, o);
    break;
  }
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
#elif TP_FAULT == 6
  struct timespec ts = {0, 300 * 1000 * 1000};
  nanosleep(&ts, NULL);
#endif
}

static xpu_status run(xpu_execution h, tp_ex *x) {
  fault();
  tp_exe *e = exe_get(x->exe);
  if (!e) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_run: executable released");
  const xpu_ir_graph *g = &e->g;
  uint32_t nt = g->header->n_tensors, ni = g->header->n_inputs;
  float **ptr = (float **)calloc(nt ? nt : 1, sizeof *ptr);
  uint64_t *room = (uint64_t *)calloc(nt ? nt : 1, sizeof *room);
  uint8_t *scratch = (uint8_t *)calloc(nt ? nt : 1, 1); /* 1: ptr[i] is ours to free */
  xpu_status st = XPU_OK;
  if (!ptr || !room || !scratch) {
    st = xpu_fail(&reg, h, XPU_E_OUT_OF_MEMORY, "execution_run: out of memory");
    goto done;
  }
  for (uint32_t io = 0; io < e->n_io; io++) {
    tp_buf *b = buf_get(x->io[io].buf);
    if (!b) {
      st = xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_run: the buffer bound to io %u was released", io);
      goto done;
    }
    uint32_t t = io < ni ? g->inputs[io] : g->outputs[io - ni];
    ptr[t] = (float *)(void *)(b->data + x->io[io].offset);
    room[t] = b->size - x->io[io].offset;
  }
  for (uint32_t i = 0; i < nt; i++) {
    const xpu_ir_tensor *t = &g->tensors[i];
    if (t->kind == XPU_TENSOR_CONST) {
      tp_buf *b = buf_get(t->const_buffer);
      if (!b) {
        st = xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_run: constant %u's buffer was released", i);
        goto done;
      }
      ptr[i] = (float *)(void *)(b->data + t->const_offset);
    } else if (t->kind == XPU_TENSOR_VALUE && !ptr[i]) {
      ptr[i] = (float *)malloc(xpu_ir_nbytes(t) ? xpu_ir_nbytes(t) : 1);
      scratch[i] = 1;
      if (!ptr[i]) {
        st = xpu_fail(&reg, h, XPU_E_OUT_OF_MEMORY, "execution_run: out of memory");
        goto done;
      }
    }
  }
  for (uint32_t i = 0; i < g->header->n_nodes; i++) run_node(e, &g->nodes[i], ptr, room[g->nodes[i].output]);
done:
  for (uint32_t i = 0; ptr && scratch && i < nt; i++)
    if (scratch[i]) free(ptr[i]);
  free(ptr);
  free(room);
  free(scratch);
  return st;
}

/* begin marks x running when every io is bound and it is not running yet; end clears it */
static xpu_status begin(xpu_execution h, tp_ex **out) {
  tp_ex *x = ex_get(h);
  if (!x) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution: not a live execution");
  tp_exe *e = exe_get(x->exe);
  if (!e) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution: executable released");
  pthread_mutex_lock(&x->mu);
  xpu_status st = XPU_OK;
  if (x->running) st = XPU_E_BAD_STATE;
  for (uint32_t io = 0; st == XPU_OK && io < e->n_io; io++)
    if (!x->io[io].buf) st = XPU_E_INVALID_ARG;
  if (st == XPU_OK) x->running = 1;
  pthread_mutex_unlock(&x->mu);
  if (st == XPU_E_INVALID_ARG) return xpu_fail(&reg, h, XPU_E_BAD_STATE, "execution: not every io is bound");
  if (st != XPU_OK) return xpu_fail(&reg, h, st, "execution: already in flight");
  *out = x;
  return XPU_OK;
}

static void end(tp_ex *x) {
  pthread_mutex_lock(&x->mu);
  x->running = 0;
  pthread_mutex_unlock(&x->mu);
}

static xpu_status tp_execution_run(xpu_execution h) {
  tp_ex *x;
  xpu_status st = begin(h, &x);
  if (st != XPU_OK) return st;
  st = run(h, x);
  end(x);
  return st;
}

static xpu_status tp_fence_wait(xpu_fence h, uint64_t value, int64_t timeout_ns);

static xpu_status fence_set(xpu_fence h, uint64_t value, xpu_status st) {
  tp_fence *f = fence_get(h);
  if (!f) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "fence: not a live fence");
  xpu_timeline_set(&f->tl, value, st, 0);
  return XPU_OK;
}

/* synchronous: waits for every wait point, runs, signals */
static xpu_status tp_execution_submit(xpu_execution h, const xpu_fence_point *waits, uint32_t n_waits,
                                     const xpu_fence_point *signal) {
  if (n_waits && !waits) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "execution_submit: waits is NULL");
  for (uint32_t i = 0; i < n_waits; i++)
    if (!fence_get(waits[i].fence)) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_submit: wait %u: not a live fence", i);
  if (signal && !fence_get(signal->fence))
    return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_submit: signal: not a live fence");
  tp_ex *x;
  xpu_status st = begin(h, &x);
  if (st != XPU_OK) return st;
  for (uint32_t i = 0; st == XPU_OK && i < n_waits; i++) st = tp_fence_wait(waits[i].fence, waits[i].value, -1);
  if (st == XPU_OK) st = run(h, x);
  end(x);
  /* a failed run poisons the signal value too, so a waiter on it does not wait forever */
  if (signal) {
    xpu_status fs = fence_set(signal->fence, signal->value, st);
    if (st == XPU_OK) st = fs;
  }
  return st;
}

static xpu_status tp_execution_release(xpu_execution h) {
  tp_ex *x = ex_get(h);
  if (!x) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_release: not a live execution");
  pthread_mutex_lock(&x->mu);
  int running = x->running;
  pthread_mutex_unlock(&x->mu);
  if (running) return xpu_fail(&reg, h, XPU_E_BAD_STATE, "execution_release: in flight");
  if (!xpu_reg_remove(&reg, h, T_EX))
    return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_release: released concurrently");
  tp_exe *e = exe_get(x->exe);
  if (e) count_adjust(&e->mu, &e->children, -1);
  pthread_mutex_destroy(&x->mu);
  free(x->io);
  free(x);
  return XPU_OK;
}

/* ------------------------------------------------------------ fences */
static xpu_status tp_fence_create(xpu_context ctx, uint64_t initial, xpu_fence *out) {
  if (!out) return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "fence_create: out is NULL");
  if (!ctx_get(ctx)) return xpu_fail(&reg, ctx, XPU_E_INVALID_HANDLE, "fence_create: not a live context");
  tp_fence *f = (tp_fence *)calloc(1, sizeof *f);
  if (!f) return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "fence_create: out of memory");
  f->ctx = ctx;
  xpu_timeline_init(&f->tl, initial);
  *out = xpu_reg_add(&reg, T_FENCE, f);
  if (!*out) {
    xpu_timeline_destroy(&f->tl);
    free(f);
    return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "fence_create: registry full");
  }
  ctx_adjust(ctx, +1);
  return XPU_OK;
}

static xpu_status tp_fence_wait(xpu_fence h, uint64_t value, int64_t timeout_ns) {
  tp_fence *f = fence_get(h);
  if (!f) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "fence_wait: not a live fence");
  xpu_status st = xpu_timeline_wait(&f->tl, value, timeout_ns, NULL);
  if (st == XPU_E_TIMEOUT) return xpu_fail(&reg, h, st, "fence_wait: value %llu not reached", (unsigned long long)value);
  if (st != XPU_OK) return xpu_fail(&reg, h, st, "fence_wait: the submission that signals %llu failed", (unsigned long long)value);
  return XPU_OK;
}

static xpu_status tp_fence_value(xpu_fence h, uint64_t *out) {
  if (!out) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "fence_value: out is NULL");
  tp_fence *f = fence_get(h);
  if (!f) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "fence_value: not a live fence");
  *out = xpu_timeline_value(&f->tl);
#ifdef MUT_FENCE_BACK
  if (*out > 0) *out -= 1;
#endif
  return XPU_OK;
}

static xpu_status tp_fence_signal(xpu_fence h, uint64_t value) { return fence_set(h, value, XPU_OK); }

static xpu_status tp_fence_release(xpu_fence h) {
  tp_fence *f = (tp_fence *)xpu_reg_remove(&reg, h, T_FENCE);
  if (!f) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "fence_release: not a live fence");
  ctx_adjust(f->ctx, -1);
  xpu_timeline_destroy(&f->tl);
  free(f);
  return XPU_OK;
}

/* ------------------------------------------------------------ exports */
#ifdef TP_NO_OPEN
__attribute__((unused))
#endif
static const xpu_api api = {
#ifdef TP_SHORT_TABLE
    offsetof(xpu_api, op_support),
#else
    sizeof(xpu_api),
#endif
    TP_ABI_MAJOR, XPU_ABI_MINOR, 0,
    tp_get_info, tp_shutdown, tp_last_error,
    tp_device_count, tp_device_info, tp_op_support,
    tp_context_create, tp_context_release,
    tp_buffer_alloc, tp_buffer_import, tp_buffer_map, tp_buffer_unmap, tp_buffer_write, tp_buffer_read,
    tp_buffer_size, tp_buffer_release,
    tp_graph_analyze, tp_graph_prepare, tp_executable_serialize, tp_executable_release,
    tp_execution_create, tp_execution_bind, tp_execution_submit, tp_execution_run, tp_execution_release,
    tp_fence_create, tp_fence_wait, tp_fence_value, tp_fence_signal, tp_fence_release,
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
#elif TP_PROBE_FAULT == 5
  /* slow only while the environment says so: a probe that timed out once on a loaded machine */
  while (getenv("TP_PROBE_SLOW")) sleep(1);
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
  if (host->struct_size >= offsetof(xpu_host_info, abi_minor) && host->abi_major != XPU_ABI_MAJOR)
    return xpu_fail(&reg, 0, XPU_E_INCOMPATIBLE, "open: host ABI major %u", host->abi_major);
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
