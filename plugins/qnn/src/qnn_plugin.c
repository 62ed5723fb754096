/*
 * qnn_plugin.c: libxpu-qnn.so, the xpu backend ABI (abi/xpu_backend.h) over the QNN C API.
 *
 * One device: the NPU of the QNN backend library found at run time (qnn_lib.c). Each executable
 * owns one QNN context holding one graph, so its context binary is exactly that graph: that is
 * what executable_serialize saves and graph_prepare reloads without a finalize. Buffers are
 * host memory (malloc, host pointers or mmap'ed fds); fd buffers are registered with memRegister
 * so QNN reads the shared bytes where they are. Executions run synchronously in the caller's
 * thread (no XPU_CAP_ASYNC): submit waits, runs, then signals.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "qnn_internal.h"

#ifndef XPU_QNN_BUILD_ID
#define XPU_QNN_BUILD_ID "qnn-dev"
#endif
#define QNN_PLUGIN_VERSION "0.1.0"
#define QNN_GRAPH_NAME "xpu"
#define QNN_CACHE_MAGIC 0x584E5158u /* "XQNX" */
#define QNN_CACHE_VERSION 1u

enum { T_CTX = 1, T_BUF, T_EXE, T_EXEC, T_FENCE };

/* the registry and the one backend library: the plugin's only process-wide state */
static xpu_registry reg = XPU_REGISTRY_INIT;
static struct {
  pthread_mutex_t mu;
  int loaded;     /* lib is usable */
  int started;    /* backend and device created */
  xpu_status load_status;
  char load_err[512];
  qnn_lib lib;
} P = {.mu = PTHREAD_MUTEX_INITIALIZER};

typedef struct qctx {
  atomic_uint children;
} qctx;

typedef struct qbuf {
  xpu_context ctx;
  qctx *owner;
  uint8_t *ptr;
  uint64_t size;
  int owned;         /* malloc'ed by us */
  void *map_base;    /* fd import: our mapping */
  size_t map_len;
  int fd;            /* fd import: our dup, registered with QNN when a tensor starts at it */
  uint64_t fd_offset;
  atomic_uint busy;  /* executions running on it right now */
} qbuf;

typedef struct qexe {
  xpu_context ctx;
  qctx *owner;
  Qnn_ContextHandle_t qctx;
  Qnn_GraphHandle_t graph;
  uint32_t n_in, n_out, n_nodes;
  qnn_io *io;
  uint32_t *precision; /* per node */
  uint64_t ir_hash;
  atomic_uint children;
  pthread_mutex_t run_mu; /* QNN executes one graph instance at a time */
} qexe;

typedef struct qexec {
  xpu_executable exe_h;
  qexe *exe;
  xpu_buffer *buf;
  uint64_t *off;
  Qnn_MemHandle_t *mem;  /* registration per io, for the buffer in mem_buf */
  xpu_buffer *mem_buf;
  atomic_int in_flight;
} qexec;

typedef struct qfence {
  xpu_context ctx;
  qctx *owner;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t value;
  uint64_t fail_value; /* 0: none */
  xpu_status fail_status;
} qfence;

/* ---------------------------------------------------------------- library discovery */

static void plugin_dir(char *out, size_t cap) {
  Dl_info info;
  out[0] = 0;
  if (dladdr((void *)&xpu_plugin_probe, &info) && info.dli_fname) {
    snprintf(out, cap, "%s", info.dli_fname);
    char *slash = strrchr(out, '/');
    if (slash) *slash = 0;
    else snprintf(out, cap, ".");
  }
}

static xpu_status ensure_loaded(const char *dir_hint) {
  pthread_mutex_lock(&P.mu);
  if (!P.loaded && P.load_status == XPU_OK) {
    char dir[512], path[512], reason[512];
    if (dir_hint && dir_hint[0]) snprintf(dir, sizeof dir, "%s", dir_hint);
    else plugin_dir(dir, sizeof dir);
    if (!qnn_lib_find(dir, path, sizeof path, reason, sizeof reason)) {
      P.load_status = XPU_E_MISSING_DEP;
      snprintf(P.load_err, sizeof P.load_err, "%s", reason);
    } else if ((P.load_status = qnn_lib_load(&P.lib, path, P.load_err, sizeof P.load_err)) == XPU_OK) {
      P.loaded = 1;
    }
  }
  xpu_status st = P.loaded ? XPU_OK : P.load_status;
  pthread_mutex_unlock(&P.mu);
  return st;
}

XPU_EXPORT xpu_status xpu_plugin_probe(xpu_probe_result *out) {
  if (!out || out->struct_size < offsetof(xpu_probe_result, name)) return XPU_E_INVALID_ARG;
  xpu_probe_result r;
  memset(&r, 0, sizeof r);
  r.abi_major = XPU_ABI_MAJOR;
  r.abi_minor = XPU_ABI_MINOR;
  XPU_STRCPY(r.name, "qnn");
  /* probe only reads the provider table: no backend is created */
  if (ensure_loaded(NULL) != XPU_OK) {
    r.score = 0;
    snprintf(r.reason, sizeof r.reason, "%.255s", P.load_err);
  } else if (P.lib.emulated) {
    r.score = 5;
    snprintf(r.reason, sizeof r.reason, "qnn (emulated provider): %.160s, no NPU; results are not hardware results",
             P.lib.path);
  } else {
    r.score = P.lib.backend_id == QNN_BACKEND_ID_HTP ? 100 : 20;
    snprintf(r.reason, sizeof r.reason, "QNN provider %.80s (API %u.%u) at %.120s", P.lib.provider,
             P.lib.iface->apiVersion.coreApiVersion.major, P.lib.iface->apiVersion.coreApiVersion.minor, P.lib.path);
  }
  XPU_COPY_OUT(out, r);
  return XPU_OK;
}

/* ---------------------------------------------------------------- plugin, devices */

static xpu_status get_info(xpu_plugin_info *out) {
  if (!out) return xpu_fail(&reg, 0, XPU_E_INVALID_ARG, "get_info: null output");
  xpu_plugin_info i;
  memset(&i, 0, sizeof i);
  i.abi_major = XPU_ABI_MAJOR;
  i.abi_minor = XPU_ABI_MINOR;
  i.opset_min = 1;
  i.opset_max = XPU_OPSET_VERSION;
  i.ir_version = XPU_IR_VERSION;
  XPU_STRCPY(i.name, "qnn");
  XPU_STRCPY(i.vendor, P.loaded && P.lib.emulated ? "xpu (QNN C API, emulated provider)" : "xpu (QNN C API)");
  XPU_STRCPY(i.version, QNN_PLUGIN_VERSION);
  XPU_STRCPY(i.build_id, XPU_QNN_BUILD_ID);
  if (P.loaded)
    snprintf(i.sdk_version, sizeof i.sdk_version, "API %u.%u %.40s", P.lib.iface->apiVersion.coreApiVersion.major,
             P.lib.iface->apiVersion.coreApiVersion.minor, P.lib.build_id);
  XPU_COPY_OUT(out, i);
  return XPU_OK;
}

static xpu_status device_count(uint32_t *out) {
  if (!out) return xpu_fail(&reg, 0, XPU_E_INVALID_ARG, "device_count: null output");
  *out = P.loaded ? 1 : 0;
  return XPU_OK;
}

static void device_name(char *buf, size_t cap) {
  if (P.lib.emulated) snprintf(buf, cap, "qnn (emulated provider)");
  else if (P.lib.backend_id == QNN_BACKEND_ID_HTP) snprintf(buf, cap, "qnn HTP (%.80s)", P.lib.provider);
  else snprintf(buf, cap, "qnn backend %u (%.80s)", P.lib.backend_id, P.lib.provider);
}

static int float_as_f16(void) { return P.lib.backend_id == QNN_BACKEND_ID_HTP; }

/* a client buffer is read in place by a backend on the host CPU (the emulator, libQnnCpu); the
 * HTP copies it over FastRPC, so there only fd (rpcmem) memory is shared without a copy */
static int host_import_zero_copy(void) { return P.lib.backend_id != QNN_BACKEND_ID_HTP; }

static xpu_status device_info(uint32_t dev, xpu_device_info *out) {
  if (!out) return xpu_fail(&reg, 0, XPU_E_INVALID_ARG, "device_info: null output");
  if (!P.loaded || dev != 0) return xpu_fail(&reg, 0, XPU_E_INVALID_ARG, "device_info: no device %u", dev);
  const QnnInterfaceTable_t *f = P.lib.fn;
  xpu_device_info d;
  memset(&d, 0, sizeof d);
  d.kind = P.lib.backend_id == QNN_BACKEND_ID_CPU ? XPU_DEVICE_CPU : XPU_DEVICE_NPU;
  d.caps = XPU_CAP_STATIC_SHAPES | XPU_CAP_HOST_VISIBLE | XPU_CAP_FP16;
  if (host_import_zero_copy()) d.caps |= XPU_CAP_IMPORT_HOST;
  if (P.lib.backend_id != QNN_BACKEND_ID_CPU) d.caps |= XPU_CAP_INT8;
  if (f->contextGetBinarySize && f->contextGetBinary && f->contextCreateFromBinary && f->graphRetrieve)
    d.caps |= XPU_CAP_SERIALIZE;
  if (f->memRegister && f->memDeRegister) d.caps |= XPU_CAP_IMPORT_FD;
  if (P.lib.emulated) d.caps |= XPU_CAP_EMULATED;
  device_name(d.name, sizeof d.name);
  XPU_STRCPY(d.vendor, P.lib.emulated ? "xpu QNN emulator" : "Qualcomm (QNN)");
  snprintf(d.driver_version, sizeof d.driver_version, "%.60s", P.lib.build_id);
  XPU_COPY_OUT(out, d);
  return XPU_OK;
}

static xpu_status op_support(uint32_t dev, const xpu_op_query *q, uint32_t *verdict) {
  if (!q || !verdict) return xpu_fail(&reg, 0, XPU_E_INVALID_ARG, "op_support: null argument");
  if (!P.loaded || dev != 0) return xpu_fail(&reg, 0, XPU_E_INVALID_ARG, "op_support: no device %u", dev);
  xpu_op_query local;
  memset(&local, 0, sizeof local);
  memcpy(&local, q, q->struct_size < sizeof local ? q->struct_size : sizeof local);
  *verdict = qnn_op_query(&local);
  return XPU_OK;
}

/* ---------------------------------------------------------------- contexts */

static xpu_status context_create(uint32_t dev, const char *options, xpu_context *out) {
  (void)options; /* no options yet: QNN backend/device configs are left at their defaults */
  if (!out) return xpu_fail(&reg, 0, XPU_E_INVALID_ARG, "context_create: null output");
  if (!P.loaded || dev != 0) return xpu_fail(&reg, 0, XPU_E_INVALID_ARG, "context_create: no device %u", dev);
  char err[512];
  pthread_mutex_lock(&P.mu);
  xpu_status st = P.started ? XPU_OK : qnn_lib_start(&P.lib, err, sizeof err);
  if (st == XPU_OK) P.started = 1;
  pthread_mutex_unlock(&P.mu);
  if (st != XPU_OK) return xpu_fail(&reg, 0, st, "context_create: %s", err);
  qctx *c = calloc(1, sizeof *c);
  if (!c) return xpu_fail(&reg, 0, XPU_E_OUT_OF_MEMORY, "context_create: out of memory");
  atomic_init(&c->children, 0);
  *out = xpu_reg_add(&reg, T_CTX, c);
  if (!*out) {
    free(c);
    return xpu_fail(&reg, 0, XPU_E_OUT_OF_MEMORY, "context_create: out of memory");
  }
  return XPU_OK;
}

static xpu_status context_release(xpu_context h) {
  qctx *c = xpu_reg_get(&reg, h, T_CTX);
  if (!c) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "context_release: invalid context handle");
  if (atomic_load(&c->children))
    return xpu_fail(&reg, h, XPU_E_BAD_STATE, "context_release: %u buffers/executables/fences still live",
                    atomic_load(&c->children));
  if (!xpu_reg_remove(&reg, h, T_CTX)) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "context_release: raced");
  free(c);
  return XPU_OK;
}

/* ---------------------------------------------------------------- buffers */

static xpu_status buffer_add(xpu_context ctx, qctx *c, qbuf *b, xpu_buffer *out) {
  b->ctx = ctx;
  b->owner = c;
  atomic_init(&b->busy, 0);
  *out = xpu_reg_add(&reg, T_BUF, b);
  if (!*out) return XPU_E_OUT_OF_MEMORY;
  atomic_fetch_add(&c->children, 1);
  return XPU_OK;
}

static xpu_status buffer_alloc(xpu_context ctx, uint64_t size, uint32_t kind, xpu_buffer *out) {
  qctx *c = xpu_reg_get(&reg, ctx, T_CTX);
  if (!c) return xpu_fail(&reg, ctx, XPU_E_INVALID_HANDLE, "buffer_alloc: invalid context handle");
  if (!out || kind > XPU_BUFFER_HOST_VISIBLE)
    return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "buffer_alloc: null output or unknown kind %u", kind);
  if (size > ((uint64_t)1 << 40)) return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "buffer_alloc: %llu bytes", (unsigned long long)size);
  qbuf *b = calloc(1, sizeof *b);
  void *p = NULL;
  /* 64-byte aligned: what HTP DMA and the HVX vector width want from client buffers */
  if (!b || posix_memalign(&p, 64, size ? size : 1) != 0) {
    free(b);
    return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "buffer_alloc: out of memory (%llu bytes)", (unsigned long long)size);
  }
  memset(p, 0, size ? size : 1);
  b->ptr = p;
  b->size = size;
  b->owned = 1;
  b->fd = -1;
  if (buffer_add(ctx, c, b, out) != XPU_OK) {
    free(p);
    free(b);
    return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "buffer_alloc: out of memory");
  }
  return XPU_OK;
}

static xpu_status buffer_import(xpu_context ctx, const xpu_import_desc *d, xpu_buffer *out) {
  qctx *c = xpu_reg_get(&reg, ctx, T_CTX);
  if (!c) return xpu_fail(&reg, ctx, XPU_E_INVALID_HANDLE, "buffer_import: invalid context handle");
  if (!d || !out || d->struct_size < offsetof(xpu_import_desc, size) + sizeof(uint64_t))
    return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "buffer_import: null or short descriptor");
  qbuf *b = calloc(1, sizeof *b);
  if (!b) return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "buffer_import: out of memory");
  b->size = d->size;
  b->fd = -1;
  if (d->kind == XPU_IMPORT_HOST) {
    if (!host_import_zero_copy()) {
      free(b);
      return xpu_fail(&reg, ctx, XPU_E_UNSUPPORTED, "buffer_import: the HTP cannot read host memory in place; import an rpcmem fd");
    }
    if (!d->host_ptr) {
      free(b);
      return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "buffer_import: null host pointer");
    }
    b->ptr = d->host_ptr;
  } else if (d->kind == XPU_IMPORT_FD) {
    if (d->fd < 0 || d->fd > 0x7FFFFFFF || d->size == 0) {
      free(b);
      return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "buffer_import: bad fd %lld or size 0", (long long)d->fd);
    }
    long page = sysconf(_SC_PAGESIZE);
    uint64_t base = d->offset - d->offset % (uint64_t)page;
    b->map_len = (size_t)(d->size + (d->offset - base));
    b->map_base = mmap(NULL, b->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, (int)d->fd, (off_t)base);
    if (b->map_base == MAP_FAILED) {
      int e = errno;
      free(b);
      return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "buffer_import: mmap fd %lld: %s", (long long)d->fd, strerror(e));
    }
    b->ptr = (uint8_t *)b->map_base + (d->offset - base);
    b->fd = dup((int)d->fd);
    b->fd_offset = d->offset;
    if (b->fd < 0) {
      munmap(b->map_base, b->map_len);
      free(b);
      return xpu_fail(&reg, ctx, XPU_E_INTERNAL, "buffer_import: dup: %s", strerror(errno));
    }
  } else {
    free(b);
    return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "buffer_import: unknown kind %u", d->kind);
  }
  if (buffer_add(ctx, c, b, out) != XPU_OK) {
    if (b->map_base) munmap(b->map_base, b->map_len);
    if (b->fd >= 0) close(b->fd);
    free(b);
    return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "buffer_import: out of memory");
  }
  return XPU_OK;
}

static xpu_status buffer_map(xpu_buffer h, void **out) {
  qbuf *b = xpu_reg_get(&reg, h, T_BUF);
  if (!b) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "buffer_map: invalid buffer handle");
  if (!out) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "buffer_map: null output");
  *out = b->ptr;
  return XPU_OK;
}

static xpu_status buffer_unmap(xpu_buffer h) {
  if (!xpu_reg_get(&reg, h, T_BUF)) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "buffer_unmap: invalid buffer handle");
  return XPU_OK; /* host memory: nothing to flush */
}

static xpu_status buffer_rw(xpu_buffer h, uint64_t off, void *dst, const void *src, uint64_t size, const char *what) {
  qbuf *b = xpu_reg_get(&reg, h, T_BUF);
  if (!b) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "%s: invalid buffer handle", what);
  if ((!dst && !src) || off > b->size || size > b->size - off)
    return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "%s: [%llu, +%llu) outside a %llu-byte buffer or null pointer", what,
                    (unsigned long long)off, (unsigned long long)size, (unsigned long long)b->size);
  if (size) {
    if (dst) memcpy(dst, b->ptr + off, size);
    else memcpy(b->ptr + off, src, size);
  }
  return XPU_OK;
}

static xpu_status buffer_write(xpu_buffer h, uint64_t off, const void *src, uint64_t size) {
  if (!src && size) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "buffer_write: null source");
  return buffer_rw(h, off, NULL, src ? src : "", size, "buffer_write");
}

static xpu_status buffer_read(xpu_buffer h, uint64_t off, void *dst, uint64_t size) {
  char dummy;
  if (!dst && size) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "buffer_read: null destination");
  return buffer_rw(h, off, dst ? dst : &dummy, NULL, size, "buffer_read");
}

static xpu_status buffer_size(xpu_buffer h, uint64_t *out) {
  qbuf *b = xpu_reg_get(&reg, h, T_BUF);
  if (!b) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "buffer_size: invalid buffer handle");
  if (!out) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "buffer_size: null output");
  *out = b->size;
  return XPU_OK;
}

static xpu_status buffer_release(xpu_buffer h) {
  qbuf *b = xpu_reg_get(&reg, h, T_BUF);
  if (!b) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "buffer_release: invalid buffer handle");
  if (atomic_load(&b->busy)) return xpu_fail(&reg, h, XPU_E_BAD_STATE, "buffer_release: an execution is running on it");
  if (!xpu_reg_remove(&reg, h, T_BUF)) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "buffer_release: raced");
  if (b->owned) free(b->ptr);
  if (b->map_base) munmap(b->map_base, b->map_len);
  if (b->fd >= 0) close(b->fd);
  atomic_fetch_sub(&b->owner->children, 1);
  free(b);
  return XPU_OK;
}

/* ---------------------------------------------------------------- analyze */

static xpu_status parse_ir(xpu_handle h, const void *ir, uint64_t size, xpu_ir_graph *g, const char *what) {
  char err[256];
  xpu_status st = xpu_ir_parse(ir, size, g, err, sizeof err);
  if (st != XPU_OK) return xpu_fail(&reg, h, st, "%s: %s", what, err);
  return XPU_OK;
}

static xpu_status graph_analyze(xpu_context ctx, const void *ir, uint64_t ir_size, xpu_node_verdict *out, uint32_t cap) {
  if (!xpu_reg_get(&reg, ctx, T_CTX)) return xpu_fail(&reg, ctx, XPU_E_INVALID_HANDLE, "graph_analyze: invalid context handle");
  xpu_ir_graph g;
  xpu_status st = parse_ir(ctx, ir, ir_size, &g, "graph_analyze");
  if (st != XPU_OK) return st;
  if (!out || cap < g.header->n_nodes)
    return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "graph_analyze: room for %u verdicts, graph has %u nodes", cap,
                    g.header->n_nodes);
  for (uint32_t i = 0; i < g.header->n_nodes; i++) {
    xpu_node_verdict v;
    memset(&v, 0, sizeof v);
    v.verdict = qnn_node_check(&g, i, float_as_f16(), &v.precision, v.reason, sizeof v.reason) ? XPU_VERDICT_YES
                                                                                                 : XPU_VERDICT_NO;
    if (out[i].struct_size == 0) out[i].struct_size = sizeof v;
    XPU_COPY_OUT(&out[i], v);
  }
  return XPU_OK;
}

/* ---------------------------------------------------------------- prepare and cache */

static uint64_t hash_bytes(uint64_t h, const void *p, uint64_t n) {
  const uint8_t *b = p;
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) { /* 8 bytes a step: weights can be large */
    uint64_t w;
    memcpy(&w, b + i, 8);
    h = (h ^ w) * 0x100000001B3ull;
    h ^= h >> 29;
  }
  for (; i < n; i++) h = (h ^ b[i]) * 0x100000001B3ull;
  return h;
}

typedef struct {
  xpu_context ctx;
} const_user;

static const void *const_bytes(void *user, uint64_t buffer, uint64_t offset, uint64_t size, char *err, size_t cap) {
  const_user *u = user;
  qbuf *b = xpu_reg_get(&reg, buffer, T_BUF);
  if (!b || b->ctx != u->ctx) {
    snprintf(err, cap, "constant buffer %llu is not a buffer of this context", (unsigned long long)buffer);
    return NULL;
  }
  if (offset > b->size || size > b->size - offset) {
    snprintf(err, cap, "constant [%llu, +%llu) outside its %llu-byte buffer", (unsigned long long)offset,
             (unsigned long long)size, (unsigned long long)b->size);
    return NULL;
  }
  return b->ptr + offset;
}

/* the cache key of a graph: its IR without buffer handles (they change per run), plus the
 * bytes of its constants (they are baked into the context binary) */
static xpu_status ir_hash(xpu_context ctx, const xpu_ir_graph *g, uint64_t *out, char *err, size_t cap) {
  uint64_t h = 1469598103934665603ull;
  h = hash_bytes(h, g->header, sizeof *g->header);
  const_user u = {ctx};
  for (uint32_t i = 0; i < g->header->n_tensors; i++) {
    xpu_ir_tensor t = g->tensors[i];
    const void *data = NULL;
    if (t.kind == XPU_TENSOR_CONST &&
        !(data = const_bytes(&u, t.const_buffer, t.const_offset, xpu_ir_nbytes(&t), err, cap)))
      return XPU_E_INVALID_ARG;
    t.const_buffer = t.const_offset = 0;
    h = hash_bytes(h, &t, sizeof t);
    if (data) h = hash_bytes(h, data, xpu_ir_nbytes(&t));
  }
  h = hash_bytes(h, g->nodes, (uint64_t)g->header->n_nodes * sizeof *g->nodes);
  h = hash_bytes(h, g->inputs, ((uint64_t)g->header->n_inputs + g->header->n_outputs) * 4);
  *out = h;
  return XPU_OK;
}

typedef struct {
  uint32_t magic, version;
  char plugin_build[64];
  char sdk_build[128];
  char device[128];
  uint64_t ir_hash;
  uint32_t n_in, n_out, n_nodes, reserved;
  uint64_t qnn_size;
} cache_header;

static void exe_free(qexe *e) {
  if (e->qctx) P.lib.fn->contextFree(e->qctx, NULL);
  pthread_mutex_destroy(&e->run_mu);
  free(e->io);
  free(e->precision);
  free(e);
}

static xpu_status load_cache(xpu_handle h, qexe *e, const xpu_ir_graph *ir, const void *blob, uint64_t size) {
  const uint8_t *p = blob;
  cache_header hd;
  uint64_t n_io = (uint64_t)e->n_in + e->n_out;
  if (size < sizeof hd + 8) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "graph_prepare: cache blob too short");
  memcpy(&hd, p, sizeof hd);
  uint64_t sum;
  memcpy(&sum, p + size - 8, 8);
  if (hd.magic != QNN_CACHE_MAGIC || sum != hash_bytes(1469598103934665603ull, p, size - 8))
    return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "graph_prepare: cache blob is not a QNN plugin executable or is damaged");
  char dev[128];
  device_name(dev, sizeof dev);
  if (hd.version != QNN_CACHE_VERSION || strncmp(hd.plugin_build, XPU_QNN_BUILD_ID, sizeof hd.plugin_build) != 0)
    return xpu_fail(&reg, h, XPU_E_INCOMPATIBLE, "graph_prepare: cache made by another plugin build (%.64s)", hd.plugin_build);
  if (strncmp(hd.sdk_build, P.lib.build_id, sizeof hd.sdk_build) != 0 || strncmp(hd.device, dev, sizeof hd.device) != 0)
    return xpu_fail(&reg, h, XPU_E_INCOMPATIBLE, "graph_prepare: cache made for SDK %.100s on %.100s, this is %.100s on %.100s",
                    hd.sdk_build, hd.device, P.lib.build_id, dev);
  if (hd.ir_hash != e->ir_hash || hd.n_in != e->n_in || hd.n_out != e->n_out || hd.n_nodes != e->n_nodes)
    return xpu_fail(&reg, h, XPU_E_INCOMPATIBLE, "graph_prepare: cache made for another graph or other weights");
  uint64_t need = sizeof hd + n_io * sizeof(qnn_io) + (uint64_t)hd.n_nodes * 4;
  if (need > size - 8 || hd.qnn_size != size - 8 - need)
    return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "graph_prepare: cache blob sizes are inconsistent");
  /* only the tensor ids come from the blob; the rest is derived from this IR again and must
   * agree, so a blob can never make an execution bind other sizes than the graph's */
  qnn_io *cached = malloc(n_io * sizeof(qnn_io));
  if (!cached) return xpu_fail(&reg, h, XPU_E_OUT_OF_MEMORY, "graph_prepare: out of memory");
  memcpy(cached, p + sizeof hd, n_io * sizeof(qnn_io));
  for (uint64_t i = 0; i < n_io; i++) e->io[i].qnn_id = cached[i].qnn_id;
  qnn_io_describe(ir, e->io);
  int same = memcmp(cached, e->io, n_io * sizeof(qnn_io)) == 0;
  free(cached);
  if (!same) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "graph_prepare: cache blob io table does not match the graph");
  memcpy(e->precision, p + sizeof hd + n_io * sizeof(qnn_io), (uint64_t)hd.n_nodes * 4);
  const QnnInterfaceTable_t *f = P.lib.fn;
  if (!f->contextCreateFromBinary || !f->graphRetrieve)
    return xpu_fail(&reg, h, XPU_E_UNSUPPORTED, "graph_prepare: the QNN backend cannot load context binaries");
  Qnn_ErrorHandle_t qe = f->contextCreateFromBinary(P.lib.backend, P.lib.device, NULL, p + need, hd.qnn_size, &e->qctx, NULL);
  if (qe != QNN_SUCCESS) {
    e->qctx = NULL;
    return xpu_fail(&reg, h, XPU_E_INCOMPATIBLE, "graph_prepare: contextCreateFromBinary: error %llu: %s",
                    (unsigned long long)qe, qnn_lib_errmsg(&P.lib, qe));
  }
  if ((qe = f->graphRetrieve(e->qctx, QNN_GRAPH_NAME, &e->graph)) != QNN_SUCCESS)
    return xpu_fail(&reg, h, XPU_E_INCOMPATIBLE, "graph_prepare: graphRetrieve: error %llu: %s", (unsigned long long)qe,
                    qnn_lib_errmsg(&P.lib, qe));
  return XPU_OK;
}

static xpu_status graph_prepare(xpu_context ctx, const xpu_prepare_desc *d, xpu_executable *out) {
  qctx *c = xpu_reg_get(&reg, ctx, T_CTX);
  if (!c) return xpu_fail(&reg, ctx, XPU_E_INVALID_HANDLE, "graph_prepare: invalid context handle");
  if (!d || !out || d->struct_size < offsetof(xpu_prepare_desc, options))
    return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "graph_prepare: null or short descriptor");
  const void *cache = d->struct_size >= offsetof(xpu_prepare_desc, cache_size) + 8 ? d->cache : NULL;
  uint64_t cache_size = cache ? d->cache_size : 0;
  xpu_ir_graph g;
  xpu_status st = parse_ir(ctx, d->ir, d->ir_size, &g, "graph_prepare");
  if (st != XPU_OK) return st;
  if (g.header->n_outputs == 0 || g.header->n_nodes == 0)
    return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "graph_prepare: graph without nodes or outputs");
  for (uint32_t i = 0; i < g.header->n_outputs; i++)
    for (uint32_t j = 0; j < i; j++)
      if (g.outputs[i] == g.outputs[j])
        return xpu_fail(&reg, ctx, XPU_E_UNSUPPORTED, "graph_prepare: tensor %u is listed twice as an output", g.outputs[i]);
  qexe *e = calloc(1, sizeof *e);
  if (!e) return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "graph_prepare: out of memory");
  pthread_mutex_init(&e->run_mu, NULL);
  atomic_init(&e->children, 0);
  e->ctx = ctx;
  e->owner = c;
  e->n_in = g.header->n_inputs;
  e->n_out = g.header->n_outputs;
  e->n_nodes = g.header->n_nodes;
  e->io = calloc((size_t)e->n_in + e->n_out, sizeof *e->io);
  e->precision = calloc(e->n_nodes, sizeof *e->precision);
  if (!e->io || !e->precision) {
    exe_free(e);
    return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "graph_prepare: out of memory");
  }
  for (uint32_t i = 0; i < e->n_nodes; i++) {
    char reason[128];
    if (!qnn_node_check(&g, i, float_as_f16(), &e->precision[i], reason, sizeof reason)) {
      exe_free(e);
      return xpu_fail(&reg, ctx, XPU_E_UNSUPPORTED, "graph_prepare: node %u (%s) is not supported: %s", i,
                      xpu_op_name(g.nodes[i].op), reason);
    }
  }
  char err[512];
  if ((st = ir_hash(ctx, &g, &e->ir_hash, err, sizeof err)) != XPU_OK) {
    exe_free(e);
    return xpu_fail(&reg, ctx, st, "graph_prepare: %s", err);
  }
  if (cache && cache_size) {
    if ((st = load_cache(ctx, e, &g, cache, cache_size)) != XPU_OK) {
      exe_free(e);
      return st;
    }
  } else {
    const QnnInterfaceTable_t *f = P.lib.fn;
    Qnn_ErrorHandle_t qe = f->contextCreate(P.lib.backend, P.lib.device, NULL, &e->qctx);
    if (qe != QNN_SUCCESS) {
      e->qctx = NULL;
      exe_free(e);
      return xpu_fail(&reg, ctx, XPU_E_INTERNAL, "graph_prepare: contextCreate: error %llu: %s", (unsigned long long)qe,
                      qnn_lib_errmsg(&P.lib, qe));
    }
    if ((qe = f->graphCreate(e->qctx, QNN_GRAPH_NAME, NULL, &e->graph)) != QNN_SUCCESS) {
      exe_free(e);
      return xpu_fail(&reg, ctx, XPU_E_INTERNAL, "graph_prepare: graphCreate: error %llu: %s", (unsigned long long)qe,
                      qnn_lib_errmsg(&P.lib, qe));
    }
    const_user u = {ctx};
    qnn_lower_cfg cfg = {&P.lib, e->graph, &g, const_bytes, &u, float_as_f16()};
    if ((st = qnn_lower_graph(&cfg, e->io, err, sizeof err)) != XPU_OK) {
      exe_free(e);
      return xpu_fail(&reg, ctx, st, "graph_prepare: %s", err);
    }
  }
  *out = xpu_reg_add(&reg, T_EXE, e);
  if (!*out) {
    exe_free(e);
    return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "graph_prepare: out of memory");
  }
  atomic_fetch_add(&c->children, 1);
  return XPU_OK;
}

static xpu_status executable_serialize(xpu_executable h, void *dst, uint64_t cap, uint64_t *size) {
  qexe *e = xpu_reg_get(&reg, h, T_EXE);
  if (!e) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "executable_serialize: invalid executable handle");
  if (!size) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "executable_serialize: null size");
  const QnnInterfaceTable_t *f = P.lib.fn;
  if (!f->contextGetBinarySize || !f->contextGetBinary)
    return xpu_fail(&reg, h, XPU_E_UNSUPPORTED, "executable_serialize: the QNN backend has no context binaries");
  Qnn_ContextBinarySize_t qsize = 0;
  Qnn_ErrorHandle_t qe = f->contextGetBinarySize(e->qctx, &qsize);
  if (qe != QNN_SUCCESS)
    return xpu_fail(&reg, h, XPU_E_INTERNAL, "executable_serialize: contextGetBinarySize: error %llu: %s",
                    (unsigned long long)qe, qnn_lib_errmsg(&P.lib, qe));
  uint64_t n_io = (uint64_t)e->n_in + e->n_out;
  uint64_t head = sizeof(cache_header) + n_io * sizeof(qnn_io) + (uint64_t)e->n_nodes * 4;
  uint64_t total = head + qsize + 8; /* qsize is an upper bound: trimmed below */
  if (!dst) {
    *size = total;
    return XPU_OK;
  }
  if (cap < total) {
    *size = total;
    return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "executable_serialize: needs %llu bytes, got %llu",
                    (unsigned long long)total, (unsigned long long)cap);
  }
  uint8_t *p = dst;
  Qnn_ContextBinarySize_t written = 0;
  if ((qe = f->contextGetBinary(e->qctx, p + head, qsize, &written)) != QNN_SUCCESS || written > qsize)
    return xpu_fail(&reg, h, XPU_E_INTERNAL, "executable_serialize: contextGetBinary: error %llu: %s",
                    (unsigned long long)qe, qnn_lib_errmsg(&P.lib, qe));
  cache_header hd;
  memset(&hd, 0, sizeof hd);
  hd.magic = QNN_CACHE_MAGIC;
  hd.version = QNN_CACHE_VERSION;
  XPU_STRCPY(hd.plugin_build, XPU_QNN_BUILD_ID);
  snprintf(hd.sdk_build, sizeof hd.sdk_build, "%s", P.lib.build_id);
  device_name(hd.device, sizeof hd.device);
  hd.ir_hash = e->ir_hash;
  hd.n_in = e->n_in;
  hd.n_out = e->n_out;
  hd.n_nodes = e->n_nodes;
  hd.qnn_size = written;
  memcpy(p, &hd, sizeof hd);
  memcpy(p + sizeof hd, e->io, n_io * sizeof(qnn_io));
  memcpy(p + sizeof hd + n_io * sizeof(qnn_io), e->precision, (uint64_t)e->n_nodes * 4);
  uint64_t sum = hash_bytes(1469598103934665603ull, p, head + written);
  memcpy(p + head + written, &sum, 8);
  *size = head + written + 8;
  return XPU_OK;
}

static xpu_status executable_release(xpu_executable h) {
  qexe *e = xpu_reg_get(&reg, h, T_EXE);
  if (!e) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "executable_release: invalid executable handle");
  if (atomic_load(&e->children))
    return xpu_fail(&reg, h, XPU_E_BAD_STATE, "executable_release: %u executions still live", atomic_load(&e->children));
  if (!xpu_reg_remove(&reg, h, T_EXE)) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "executable_release: raced");
  atomic_fetch_sub(&e->owner->children, 1);
  exe_free(e);
  return XPU_OK;
}

/* ---------------------------------------------------------------- executions */

static xpu_status execution_create(xpu_executable h, xpu_execution *out) {
  qexe *e = xpu_reg_get(&reg, h, T_EXE);
  if (!e) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_create: invalid executable handle");
  if (!out) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "execution_create: null output");
  size_t n = (size_t)e->n_in + e->n_out;
  qexec *x = calloc(1, sizeof *x);
  if (x) {
    x->buf = calloc(n, sizeof *x->buf);
    x->off = calloc(n, sizeof *x->off);
    x->mem = calloc(n, sizeof *x->mem);
    x->mem_buf = calloc(n, sizeof *x->mem_buf);
  }
  if (!x || !x->buf || !x->off || !x->mem || !x->mem_buf) {
    if (x) {
      free(x->buf);
      free(x->off);
      free(x->mem);
      free(x->mem_buf);
    }
    free(x);
    return xpu_fail(&reg, h, XPU_E_OUT_OF_MEMORY, "execution_create: out of memory");
  }
  x->exe_h = h;
  x->exe = e;
  atomic_init(&x->in_flight, 0);
  *out = xpu_reg_add(&reg, T_EXEC, x);
  if (!*out) {
    free(x->buf);
    free(x->off);
    free(x->mem);
    free(x->mem_buf);
    free(x);
    return xpu_fail(&reg, h, XPU_E_OUT_OF_MEMORY, "execution_create: out of memory");
  }
  atomic_fetch_add(&e->children, 1);
  return XPU_OK;
}

static void drop_mem(qexec *x, uint32_t io) {
  if (x->mem[io]) P.lib.fn->memDeRegister(&x->mem[io], 1);
  x->mem[io] = NULL;
  x->mem_buf[io] = 0;
}

static xpu_status execution_bind(xpu_execution h, uint32_t io, xpu_buffer bh, uint64_t offset) {
  qexec *x = xpu_reg_get(&reg, h, T_EXEC);
  if (!x) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_bind: invalid execution handle");
  if (atomic_load(&x->in_flight)) return xpu_fail(&reg, h, XPU_E_BAD_STATE, "execution_bind: execution in flight");
  qexe *e = x->exe;
  if (io >= e->n_in + e->n_out)
    return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "execution_bind: io %u, the graph has %u", io, e->n_in + e->n_out);
  qbuf *b = xpu_reg_get(&reg, bh, T_BUF);
  if (!b) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_bind: invalid buffer handle");
  if (b->ctx != e->ctx) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "execution_bind: buffer of another context");
  if (offset > b->size || e->io[io].nbytes > b->size - offset)
    return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "execution_bind: io %u needs %llu bytes at offset %llu of a %llu-byte buffer",
                    io, (unsigned long long)e->io[io].nbytes, (unsigned long long)offset, (unsigned long long)b->size);
  if (x->mem_buf[io] != bh || x->off[io] != offset) drop_mem(x, io);
  x->buf[io] = bh;
  x->off[io] = offset;
  return XPU_OK;
}

/* fd-backed memory where the tensor starts at the fd's first byte is registered with QNN
 * (ION/rpcmem style), so the backend maps the shared pages itself; other bindings pass the
 * host pointer */
static void try_register(qexec *x, uint32_t io, qbuf *b) {
  const QnnInterfaceTable_t *f = P.lib.fn;
  if (x->mem[io] || b->fd < 0 || b->fd_offset + x->off[io] != 0 || !f->memRegister || !f->memDeRegister) return;
  qnn_io *d = &x->exe->io[io];
  Qnn_MemDescriptor_t md;
  memset(&md, 0, sizeof md);
  md.memShape.numDim = d->rank;
  md.memShape.dimSize = d->dims;
  md.dataType = d->dtype;
  md.memType = QNN_MEM_TYPE_ION;
  md.ionInfo.fd = b->fd;
  Qnn_MemHandle_t mh = NULL;
  if (f->memRegister(x->exe->qctx, &md, 1, &mh) == QNN_SUCCESS && mh) {
    x->mem[io] = mh;
    x->mem_buf[io] = x->buf[io];
  } else {
    xpu_log(&reg, XPU_LOG_DEBUG, "qnn: memRegister refused fd %d; passing the mapped pointer", b->fd);
  }
}

static xpu_status run_now(xpu_execution h, qexec *x) {
  qexe *e = x->exe;
  uint32_t n = e->n_in + e->n_out;
  qbuf **bufs = calloc(n, sizeof *bufs);
  Qnn_Tensor_t *ts = calloc(n, sizeof *ts);
  char (*names)[16] = calloc(n, 16);
  xpu_status st = XPU_OK;
  uint32_t held = 0;
  if (!bufs || !ts || !names) {
    st = xpu_fail(&reg, h, XPU_E_OUT_OF_MEMORY, "execution_run: out of memory");
    goto done;
  }
  for (uint32_t i = 0; i < n; i++) {
    if (!x->buf[i]) {
      st = xpu_fail(&reg, h, XPU_E_BAD_STATE, "execution_run: io %u is not bound", i);
      goto done;
    }
    qbuf *b = xpu_reg_get(&reg, x->buf[i], T_BUF);
    if (!b) {
      st = xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_run: io %u: its buffer was released", i);
      goto done;
    }
    atomic_fetch_add(&b->busy, 1);
    bufs[i] = b;
    held = i + 1;
  }
  for (uint32_t i = 0; i < n; i++) {
    qnn_io *d = &e->io[i];
    uint8_t *p = bufs[i]->ptr + x->off[i];
    if (d->ids_rows > 0) { /* the NPU would read out of bounds: the ABI wants INVALID_ARG */
      for (uint64_t k = 0; k < d->nbytes / 4; k++) {
        int32_t id;
        memcpy(&id, p + 4 * k, 4);
        if (id < 0 || id >= d->ids_rows) {
          st = xpu_fail(&reg, h, XPU_E_INVALID_ARG, "execution_run: GET_ROWS id %d outside [0, %lld)", id,
                        (long long)d->ids_rows);
          goto done;
        }
      }
    }
    try_register(x, i, bufs[i]);
    Qnn_TensorV1_t *v = &ts[i].v1;
    ts[i].version = QNN_TENSOR_VERSION_1;
    snprintf(names[i], 16, "t%u", d->xpu_tensor);
    v->id = d->qnn_id;
    v->name = names[i];
    v->type = i < e->n_in ? QNN_TENSOR_TYPE_APP_WRITE : QNN_TENSOR_TYPE_APP_READ;
    v->dataFormat = QNN_TENSOR_DATA_FORMAT_DENSE;
    v->dataType = d->dtype;
    v->quantizeParams.encodingDefinition = QNN_DEFINITION_UNDEFINED;
    v->quantizeParams.quantizationEncoding = QNN_QUANTIZATION_ENCODING_UNDEFINED;
    if (d->dtype == QNN_DATATYPE_SFIXED_POINT_8) {
      v->quantizeParams.encodingDefinition = QNN_DEFINITION_DEFINED;
      v->quantizeParams.quantizationEncoding = QNN_QUANTIZATION_ENCODING_SCALE_OFFSET;
      v->quantizeParams.scaleOffsetEncoding.scale = d->scale;
      v->quantizeParams.scaleOffsetEncoding.offset = d->offset;
    }
    v->rank = d->rank;
    v->dimensions = d->dims;
    if (x->mem[i]) {
      v->memType = QNN_TENSORMEMTYPE_MEMHANDLE;
      v->memHandle = x->mem[i];
    } else {
      v->memType = QNN_TENSORMEMTYPE_RAW;
      v->clientBuf.data = p;
      v->clientBuf.dataSize = (uint32_t)d->nbytes;
    }
  }
  pthread_mutex_lock(&e->run_mu);
  Qnn_ErrorHandle_t qe = P.lib.fn->graphExecute(e->graph, ts, e->n_in, ts + e->n_in, e->n_out, NULL, NULL);
  pthread_mutex_unlock(&e->run_mu);
  if (qe != QNN_SUCCESS) {
    xpu_status code = qe == QNN_GRAPH_ERROR_GRAPH_NOT_FINALIZED ? XPU_E_BAD_STATE
                      : qe == QNN_COMMON_ERROR_INVALID_ARGUMENT ? XPU_E_INVALID_ARG
                                                                 : XPU_E_INTERNAL;
    st = xpu_fail(&reg, h, code, "execution_run: graphExecute: error %llu: %s", (unsigned long long)qe,
                  qnn_lib_errmsg(&P.lib, qe));
  }
done:
  for (uint32_t i = 0; i < held; i++) atomic_fetch_sub(&bufs[i]->busy, 1);
  free(bufs);
  free(ts);
  free(names);
  return st;
}

static xpu_status execution_run(xpu_execution h) {
  qexec *x = xpu_reg_get(&reg, h, T_EXEC);
  if (!x) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_run: invalid execution handle");
  int expect = 0;
  if (!atomic_compare_exchange_strong(&x->in_flight, &expect, 1))
    return xpu_fail(&reg, h, XPU_E_BAD_STATE, "execution_run: execution already in flight");
  xpu_status st = run_now(h, x);
  atomic_store(&x->in_flight, 0);
  return st;
}

static xpu_status execution_release(xpu_execution h) {
  qexec *x = xpu_reg_get(&reg, h, T_EXEC);
  if (!x) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_release: invalid execution handle");
  if (atomic_load(&x->in_flight)) return xpu_fail(&reg, h, XPU_E_BAD_STATE, "execution_release: execution in flight");
  if (!xpu_reg_remove(&reg, h, T_EXEC)) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_release: raced");
  for (uint32_t i = 0; i < x->exe->n_in + x->exe->n_out; i++) drop_mem(x, i);
  atomic_fetch_sub(&x->exe->children, 1);
  free(x->buf);
  free(x->off);
  free(x->mem);
  free(x->mem_buf);
  free(x);
  return XPU_OK;
}

/* ---------------------------------------------------------------- fences */

static xpu_status fence_create(xpu_context ctx, uint64_t initial, xpu_fence *out) {
  qctx *c = xpu_reg_get(&reg, ctx, T_CTX);
  if (!c) return xpu_fail(&reg, ctx, XPU_E_INVALID_HANDLE, "fence_create: invalid context handle");
  if (!out) return xpu_fail(&reg, ctx, XPU_E_INVALID_ARG, "fence_create: null output");
  qfence *f = calloc(1, sizeof *f);
  if (!f) return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "fence_create: out of memory");
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&f->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&f->mu, NULL);
  f->value = initial;
  f->ctx = ctx;
  f->owner = c;
  *out = xpu_reg_add(&reg, T_FENCE, f);
  if (!*out) {
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
    free(f);
    return xpu_fail(&reg, ctx, XPU_E_OUT_OF_MEMORY, "fence_create: out of memory");
  }
  atomic_fetch_add(&c->children, 1);
  return XPU_OK;
}

static xpu_status fence_wait(xpu_fence h, uint64_t value, int64_t timeout_ns) {
  qfence *f = xpu_reg_get(&reg, h, T_FENCE);
  if (!f) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "fence_wait: invalid fence handle");
  struct timespec dl;
  clock_gettime(CLOCK_MONOTONIC, &dl);
  if (timeout_ns > 0) {
    dl.tv_sec += timeout_ns / 1000000000;
    dl.tv_nsec += timeout_ns % 1000000000;
    if (dl.tv_nsec >= 1000000000) {
      dl.tv_sec++;
      dl.tv_nsec -= 1000000000;
    }
  }
  xpu_status st = XPU_OK;
  pthread_mutex_lock(&f->mu);
  for (;;) {
    if (f->fail_value && value >= f->fail_value) {
      st = f->fail_status;
      break;
    }
    if (f->value >= value) break;
    if (timeout_ns == 0) {
      st = XPU_E_TIMEOUT;
      break;
    }
    int r = timeout_ns < 0 ? pthread_cond_wait(&f->cv, &f->mu) : pthread_cond_timedwait(&f->cv, &f->mu, &dl);
    if (r == ETIMEDOUT) {
      st = XPU_E_TIMEOUT;
      break;
    }
  }
  pthread_mutex_unlock(&f->mu);
  if (st == XPU_E_TIMEOUT) return xpu_fail(&reg, h, st, "fence_wait: timed out waiting for %llu", (unsigned long long)value);
  if (st != XPU_OK) return xpu_fail(&reg, h, st, "fence_wait: the submission that signals %llu failed (%s)",
                                    (unsigned long long)value, xpu_status_name(st));
  return XPU_OK;
}

static xpu_status fence_value(xpu_fence h, uint64_t *out) {
  qfence *f = xpu_reg_get(&reg, h, T_FENCE);
  if (!f) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "fence_value: invalid fence handle");
  if (!out) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "fence_value: null output");
  pthread_mutex_lock(&f->mu);
  *out = f->value;
  pthread_mutex_unlock(&f->mu);
  return XPU_OK;
}

static xpu_status fence_set(qfence *f, uint64_t value, xpu_status fail) {
  pthread_mutex_lock(&f->mu);
  xpu_status st = XPU_OK;
  if (fail != XPU_OK) {
    if (!f->fail_value || value < f->fail_value) {
      f->fail_value = value;
      f->fail_status = fail;
    }
  } else if (value < f->value) {
    st = XPU_E_INVALID_ARG;
  } else {
    f->value = value;
  }
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  return st;
}

static xpu_status fence_signal(xpu_fence h, uint64_t value) {
  qfence *f = xpu_reg_get(&reg, h, T_FENCE);
  if (!f) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "fence_signal: invalid fence handle");
  if (fence_set(f, value, XPU_OK) != XPU_OK)
    return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "fence_signal: %llu is below the current value", (unsigned long long)value);
  return XPU_OK;
}

static xpu_status fence_release(xpu_fence h) {
  qfence *f = xpu_reg_remove(&reg, h, T_FENCE);
  if (!f) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "fence_release: invalid fence handle");
  atomic_fetch_sub(&f->owner->children, 1);
  pthread_cond_destroy(&f->cv);
  pthread_mutex_destroy(&f->mu);
  free(f);
  return XPU_OK;
}

static xpu_status execution_submit(xpu_execution h, const xpu_fence_point *waits, uint32_t n_waits,
                                   const xpu_fence_point *signal) {
  qexec *x = xpu_reg_get(&reg, h, T_EXEC);
  if (!x) return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_submit: invalid execution handle");
  if (n_waits && !waits) return xpu_fail(&reg, h, XPU_E_INVALID_ARG, "execution_submit: null waits");
  qfence *sig = NULL;
  if (signal && !(sig = xpu_reg_get(&reg, signal->fence, T_FENCE)))
    return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_submit: invalid signal fence");
  for (uint32_t i = 0; i < n_waits; i++)
    if (!xpu_reg_get(&reg, waits[i].fence, T_FENCE))
      return xpu_fail(&reg, h, XPU_E_INVALID_HANDLE, "execution_submit: invalid wait fence %u", i);
  int expect = 0;
  if (!atomic_compare_exchange_strong(&x->in_flight, &expect, 1))
    return xpu_fail(&reg, h, XPU_E_BAD_STATE, "execution_submit: execution already in flight");
  xpu_status st = XPU_OK;
  for (uint32_t i = 0; i < n_waits && st == XPU_OK; i++) st = fence_wait(waits[i].fence, waits[i].value, -1);
  if (st != XPU_OK) xpu_fail(&reg, h, st, "execution_submit: a wait fence failed");
  else st = run_now(h, x);
  if (sig) fence_set(sig, signal->value, st);
  atomic_store(&x->in_flight, 0);
  return st;
}

/* ---------------------------------------------------------------- open */

static xpu_status last_error(xpu_handle h, char *buf, uint32_t cap, uint32_t *len) {
  return xpu_reg_last_error(&reg, h, buf, cap, len);
}

static xpu_status shutdown_plugin(void) {
  if (xpu_reg_count(&reg, 0)) return xpu_fail(&reg, 0, XPU_E_BAD_STATE, "shutdown: objects are still live");
  pthread_mutex_lock(&P.mu);
  if (P.started) qnn_lib_stop(&P.lib);
  P.started = 0;
  pthread_mutex_unlock(&P.mu);
  xpu_reg_destroy(&reg);
  return XPU_OK;
}

static const xpu_api api = {
    .struct_size = sizeof(xpu_api),
    .abi_major = XPU_ABI_MAJOR,
    .abi_minor = XPU_ABI_MINOR,
    .get_info = get_info,
    .shutdown = shutdown_plugin,
    .last_error = last_error,
    .device_count = device_count,
    .device_info = device_info,
    .op_support = op_support,
    .context_create = context_create,
    .context_release = context_release,
    .buffer_alloc = buffer_alloc,
    .buffer_import = buffer_import,
    .buffer_map = buffer_map,
    .buffer_unmap = buffer_unmap,
    .buffer_write = buffer_write,
    .buffer_read = buffer_read,
    .buffer_size = buffer_size,
    .buffer_release = buffer_release,
    .graph_analyze = graph_analyze,
    .graph_prepare = graph_prepare,
    .executable_serialize = executable_serialize,
    .executable_release = executable_release,
    .execution_create = execution_create,
    .execution_bind = execution_bind,
    .execution_submit = execution_submit,
    .execution_run = execution_run,
    .execution_release = execution_release,
    .fence_create = fence_create,
    .fence_wait = fence_wait,
    .fence_value = fence_value,
    .fence_signal = fence_signal,
    .fence_release = fence_release,
};

XPU_EXPORT xpu_status xpu_plugin_open(const xpu_host_info *host, const xpu_api **out) {
  if (!out) return XPU_E_INVALID_ARG;
  if (host && host->struct_size >= offsetof(xpu_host_info, abi_minor) + 4 && host->abi_major != XPU_ABI_MAJOR)
    return xpu_fail(&reg, 0, XPU_E_INCOMPATIBLE, "open: host ABI %u, plugin ABI %u", host->abi_major, XPU_ABI_MAJOR);
  xpu_reg_set_log(&reg, host);
  const char *dir = host && host->struct_size >= offsetof(xpu_host_info, plugin_dir) + sizeof(char *) ? host->plugin_dir : NULL;
  if (ensure_loaded(dir) != XPU_OK) { /* opens with 0 devices; last_error(0) says why */
    xpu_fail(&reg, 0, P.load_status, "qnn: no device: %s", P.load_err);
    xpu_log(&reg, XPU_LOG_WARN, "qnn: no device: %s", P.load_err);
  }
  else if (P.lib.emulated)
    xpu_log(&reg, XPU_LOG_INFO, "qnn: using the emulated provider %s: results are not NPU results", P.lib.path);
  *out = &api;
  return XPU_OK;
}
