/*
 * plugin.c: the xpu ABI entry points of the NEON CPU plugin: probe, open, devices, contexts,
 * buffers, executables, executions and fences. Kernels live in k_*.c, graph checks and memory
 * planning in graph.c, the node loop in exec.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#if defined(__aarch64__)
#include <sys/auxv.h>
#endif

#include "neon.h"

xpu_registry nv_reg = XPU_REGISTRY_INIT;

#ifndef NV_VARIANT
#define NV_VARIANT "portable"
#endif

/* ---------------------------------------------------------------- what this CPU can do */

static int cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : (int)n;
}

/* 0 when this build cannot run here (an AVX2 variant on a CPU without AVX2). */
static int variant_runs(const char **why) {
#if defined(__x86_64__) && defined(__AVX512F__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
      !__builtin_cpu_supports("f16c")) {
    *why = "this build needs AVX-512 (F, BW, VL), AVX2, FMA and F16C, which the CPU lacks";
    return 0;
  }
#elif defined(__x86_64__) && defined(__AVX2__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
      !__builtin_cpu_supports("f16c")) {
    *why = "this build needs AVX2, FMA and F16C, which the CPU lacks";
    return 0;
  }
#endif
  *why = "";
  return 1;
}

static int variant_score(void) {
#if defined(__aarch64__)
  return nv_have_dotprod() ? 60 : 50;
#elif defined(__AVX512F__)
  return 40;
#elif defined(__AVX2__)
  return 30;
#else
  return 20;
#endif
}

static void describe(char *out, size_t cap) {
#if defined(__aarch64__)
  snprintf(out, cap, "native NEON on aarch64%s, %d cores", nv_have_dotprod() ? " with dotprod" : "",
           cpu_count());
#elif defined(__AVX512F__)
  snprintf(out, cap, "NEON via SIMDe on x86-64 (AVX-512 build), %d cores", cpu_count());
#elif defined(__AVX2__)
  snprintf(out, cap, "NEON via SIMDe on x86-64 (AVX2/FMA build), %d cores", cpu_count());
#else
  snprintf(out, cap, "NEON via SIMDe on x86-64 (portable SSE2 build), %d cores", cpu_count());
#endif
}

/* ---------------------------------------------------------------- memory */

/*
 * Zeroed memory, 64-byte aligned. Large blocks are 2 MiB aligned and asked for transparent
 * huge pages: kernels stream weight matrices row block by row block, and with 4 KiB pages each
 * 1 KiB row segment of a 16 KiB-stride matrix is a TLB miss.
 */
void *nv_alloc(uint64_t size) {
  const uint64_t huge = (uint64_t)2 << 20;
  uint64_t align = size >= 2 * huge ? huge : NV_ALIGN;
  uint64_t rounded = (size + align - 1) / align * align;
  if (rounded == 0) rounded = NV_ALIGN;
  void *mem = NULL;
  if (posix_memalign(&mem, (size_t)align, (size_t)rounded) != 0) return NULL;
#ifdef MADV_HUGEPAGE
  if (align == huge) (void)madvise(mem, (size_t)rounded, MADV_HUGEPAGE); /* a hint: failure is fine */
#endif
  memset(mem, 0, (size_t)rounded);
  return mem;
}

/* ---------------------------------------------------------------- plugin */

XPU_EXPORT xpu_status xpu_plugin_probe(xpu_probe_result *out) {
  if (!out || out->struct_size < offsetof(xpu_probe_result, score)) return XPU_E_INVALID_ARG;
  xpu_probe_result r;
  memset(&r, 0, sizeof r);
  r.abi_major = XPU_ABI_MAJOR;
  r.abi_minor = XPU_ABI_MINOR;
  XPU_STRCPY(r.name, "neon");
  const char *why;
  if (!variant_runs(&why)) {
    r.score = 0;
    XPU_STRCPY(r.reason, why);
  } else {
    r.score = variant_score();
    describe(r.reason, sizeof r.reason);
  }
  XPU_COPY_OUT(out, r);
  return XPU_OK;
}

static xpu_status api_get_info(xpu_plugin_info *out) {
  if (!out) return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "get_info: null out");
  xpu_plugin_info in;
  memset(&in, 0, sizeof in);
  in.abi_major = XPU_ABI_MAJOR;
  in.abi_minor = XPU_ABI_MINOR;
  in.opset_min = 1;
  in.opset_max = XPU_OPSET_VERSION;
  in.ir_version = XPU_IR_VERSION;
  XPU_STRCPY(in.name, "neon");
  XPU_STRCPY(in.vendor, "xpu");
  XPU_STRCPY(in.version, "0.1.0");
  XPU_STRCPY(in.build_id, "neon-0.1.0-" NV_VARIANT "-" __DATE__ "-" __TIME__);
  XPU_STRCPY(in.sdk_version, "");
  XPU_COPY_OUT(out, in);
  return XPU_OK;
}

static xpu_status api_last_error(xpu_handle h, char *buf, uint32_t cap, uint32_t *len) {
  return xpu_reg_last_error(&nv_reg, h, buf, cap, len);
}

static xpu_status api_device_count(uint32_t *out) {
  if (!out) return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "device_count: null out");
  *out = 1;
  return XPU_OK;
}

static uint64_t device_caps(void) {
  uint64_t caps = XPU_CAP_ASYNC | XPU_CAP_IMPORT_HOST | XPU_CAP_IMPORT_FD |
                  XPU_CAP_UNIFIED_MEMORY | XPU_CAP_CONCURRENT | XPU_CAP_HOST_VISIBLE;
  if (nv_have_dotprod()) caps |= XPU_CAP_INT8;
  return caps;
}

static xpu_status api_device_info(uint32_t device, xpu_device_info *out) {
  if (!out) return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "device_info: null out");
  if (device != 0) return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "device_info: no device %u (1 device)", device);
  xpu_device_info d;
  memset(&d, 0, sizeof d);
  d.kind = XPU_DEVICE_CPU;
  d.caps = device_caps();
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  d.memory_bytes = (pages > 0 && psz > 0) ? (uint64_t)pages * (uint64_t)psz : 0;
  d.compute_units = (uint32_t)cpu_count();
  describe(d.name, sizeof d.name);
  XPU_STRCPY(d.vendor, "xpu");
  XPU_STRCPY(d.driver_version, NV_VARIANT);
  XPU_COPY_OUT(out, d);
  return XPU_OK;
}

static xpu_status api_op_support(uint32_t device, const xpu_op_query *q, uint32_t *verdict) {
  if (!q || !verdict) return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "op_support: null argument");
  if (device != 0) return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "op_support: no device %u", device);
  if (q->struct_size < offsetof(xpu_op_query, rank) + sizeof(uint32_t))
    return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "op_support: query struct_size %u too small", q->struct_size);
  *verdict = nv_op_support(q);
  return XPU_OK;
}

/* ---------------------------------------------------------------- contexts */

static void queue_stop(nv_context *c);

static void context_free(nv_context *c) {
  queue_stop(c);
  nv_pool_destroy(c->pool);
  pthread_mutex_destroy(&c->qmu);
  pthread_cond_destroy(&c->qcv);
  free(c);
}

static xpu_status api_context_create(uint32_t device, const char *options, xpu_context *out) {
  if (!out) return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "context_create: null out");
  *out = 0;
  if (device != 0) return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "context_create: no device %u", device);
  nv_cpuset cpus = {0};
  char v[1024];
  int rc = xpu_opt_get(options, "cpus", v, sizeof v);
  if (rc < 0 || (rc > 0 && nv_parse_cpus(v, &cpus) != 0))
    return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "context_create: bad cpus option (want e.g. cpus=0,1 or cpus=0-3)");
  int threads = cpus.n > 0 ? cpus.n : cpu_count();
  rc = xpu_opt_get(options, "threads", v, sizeof v);
  if (rc != 0) {
    char *end;
    long t = rc > 0 ? strtol(v, &end, 10) : -1;
    if (rc < 0 || end == v || *end || t < 1 || t > 1024)
      return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "context_create: bad threads option (want 1..1024)");
    threads = (int)t;
  }
  nv_context *c = (nv_context *)calloc(1, sizeof *c);
  if (!c) return xpu_fail(&nv_reg, 0, XPU_E_OUT_OF_MEMORY, "context_create: out of memory");
  c->device = device;
  c->cpus = cpus;
  c->threads = threads;
  pthread_mutex_init(&c->qmu, NULL);
  pthread_cond_init(&c->qcv, NULL);
  char err[256];
  c->pool = nv_pool_create(threads, &cpus, err, sizeof err);
  if (!c->pool) {
    pthread_mutex_destroy(&c->qmu);
    pthread_cond_destroy(&c->qcv);
    free(c);
    return xpu_fail(&nv_reg, 0, XPU_E_OUT_OF_MEMORY, "context_create: %s", err);
  }
  xpu_handle h = xpu_reg_add(&nv_reg, OBJ_CONTEXT, c);
  if (!h) {
    context_free(c);
    return xpu_fail(&nv_reg, 0, XPU_E_OUT_OF_MEMORY, "context_create: out of handles");
  }
  *out = h;
  return XPU_OK;
}

static xpu_status api_context_release(xpu_context h) {
  nv_context *c = (nv_context *)xpu_reg_get(&nv_reg, h, OBJ_CONTEXT);
  if (!c) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "context_release: unknown or released context handle");
  int kids = atomic_load(&c->children);
  if (kids > 0)
    return xpu_fail(&nv_reg, h, XPU_E_BAD_STATE,
                    "context_release: %d buffers, executables, executions or fences still live", kids);
  if (!xpu_reg_remove(&nv_reg, h, OBJ_CONTEXT))
    return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "context_release: context released concurrently");
  context_free(c);
  return XPU_OK;
}

/* ---------------------------------------------------------------- buffers */

void nv_buffer_unref(nv_buffer *b) {
  if (atomic_fetch_sub(&b->refs, 1) != 1) return;
  if (b->owned == 1) free(b->data);
  if (b->owned == 2) munmap(b->map_base, b->map_len);
  atomic_fetch_sub(&b->ctx->children, 1);
  free(b);
}

static xpu_status add_buffer(xpu_context ch, nv_context *c, nv_buffer *b, xpu_buffer *out) {
  atomic_init(&b->refs, 1);
  b->ctx = c;
  atomic_fetch_add(&c->children, 1);
  xpu_handle h = xpu_reg_add(&nv_reg, OBJ_BUFFER, b);
  if (!h) {
    nv_buffer_unref(b);
    return xpu_fail(&nv_reg, ch, XPU_E_OUT_OF_MEMORY, "buffer: out of handles");
  }
  *out = h;
  return XPU_OK;
}

static xpu_status api_buffer_alloc(xpu_context ch, uint64_t size, uint32_t kind, xpu_buffer *out) {
  if (!out) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "buffer_alloc: null out");
  *out = 0;
  nv_context *c = (nv_context *)xpu_reg_get(&nv_reg, ch, OBJ_CONTEXT);
  if (!c) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_HANDLE, "buffer_alloc: unknown or released context handle");
  if (kind != XPU_BUFFER_DEVICE && kind != XPU_BUFFER_HOST_VISIBLE)
    return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "buffer_alloc: unknown buffer kind %u", kind);
  if (size > ((uint64_t)1 << 46))
    return xpu_fail(&nv_reg, ch, XPU_E_OUT_OF_MEMORY, "buffer_alloc: %llu bytes is more than this device can hold",
                    (unsigned long long)size);
  nv_buffer *b = (nv_buffer *)calloc(1, sizeof *b);
  void *mem = b ? nv_alloc(size) : NULL;
  if (!mem) {
    free(b);
    return xpu_fail(&nv_reg, ch, XPU_E_OUT_OF_MEMORY, "buffer_alloc: cannot allocate %llu bytes",
                    (unsigned long long)size);
  }
  b->data = (uint8_t *)mem;
  b->size = size;
  b->owned = 1;
  return add_buffer(ch, c, b, out);
}

static xpu_status api_buffer_import(xpu_context ch, const xpu_import_desc *d, xpu_buffer *out) {
  if (!out || !d) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "buffer_import: null argument");
  *out = 0;
  nv_context *c = (nv_context *)xpu_reg_get(&nv_reg, ch, OBJ_CONTEXT);
  if (!c) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_HANDLE, "buffer_import: unknown or released context handle");
  if (d->struct_size < offsetof(xpu_import_desc, size) + sizeof(uint64_t))
    return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "buffer_import: desc struct_size %u too small", d->struct_size);
  nv_buffer *b = (nv_buffer *)calloc(1, sizeof *b);
  if (!b) return xpu_fail(&nv_reg, ch, XPU_E_OUT_OF_MEMORY, "buffer_import: out of memory");
  if (d->kind == XPU_IMPORT_HOST) {
    if (!d->host_ptr) {
      free(b);
      return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "buffer_import: null host_ptr");
    }
    b->data = (uint8_t *)d->host_ptr + d->offset;
    b->size = d->size;
    b->owned = 0;
  } else if (d->kind == XPU_IMPORT_FD) {
    if (d->fd < 0 || d->size == 0) {
      free(b);
      return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "buffer_import: fd %lld or size 0 invalid", (long long)d->fd);
    }
    long psz = sysconf(_SC_PAGESIZE);
    uint64_t base = d->offset / (uint64_t)psz * (uint64_t)psz, skip = d->offset - base;
    void *m = mmap(NULL, d->size + skip, PROT_READ | PROT_WRITE, MAP_SHARED, (int)d->fd, (off_t)base);
    if (m == MAP_FAILED) {
      int e = errno;
      free(b);
      return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "buffer_import: mmap of fd %lld: %s", (long long)d->fd,
                      strerror(e));
    }
    b->map_base = m;
    b->map_len = d->size + skip;
    b->data = (uint8_t *)m + skip;
    b->size = d->size;
    b->owned = 2;
  } else {
    free(b);
    return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "buffer_import: unknown import kind %u", d->kind);
  }
  return add_buffer(ch, c, b, out);
}

static xpu_status api_buffer_map(xpu_buffer h, void **out) {
  if (!out) return xpu_fail(&nv_reg, h, XPU_E_INVALID_ARG, "buffer_map: null out");
  nv_buffer *b = (nv_buffer *)xpu_reg_get(&nv_reg, h, OBJ_BUFFER);
  if (!b) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "buffer_map: unknown or released buffer handle");
  atomic_fetch_add(&b->mapped, 1);
  *out = b->data;
  return XPU_OK;
}

static xpu_status api_buffer_unmap(xpu_buffer h) {
  nv_buffer *b = (nv_buffer *)xpu_reg_get(&nv_reg, h, OBJ_BUFFER);
  if (!b) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "buffer_unmap: unknown or released buffer handle");
  int m = atomic_load(&b->mapped);
  while (m > 0 && !atomic_compare_exchange_weak(&b->mapped, &m, m - 1)) {
  }
  if (m <= 0) return xpu_fail(&nv_reg, h, XPU_E_BAD_STATE, "buffer_unmap: buffer is not mapped");
  return XPU_OK;
}

static xpu_status buffer_range(const char *what, xpu_buffer h, uint64_t off, uint64_t size, const void *p,
                               nv_buffer **out) {
  nv_buffer *b = (nv_buffer *)xpu_reg_get(&nv_reg, h, OBJ_BUFFER);
  if (!b) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "%s: unknown or released buffer handle", what);
  if (!p && size) return xpu_fail(&nv_reg, h, XPU_E_INVALID_ARG, "%s: null pointer", what);
  if (off > b->size || size > b->size - off)
    return xpu_fail(&nv_reg, h, XPU_E_INVALID_ARG, "%s: range [%llu, +%llu) outside the %llu-byte buffer", what,
                    (unsigned long long)off, (unsigned long long)size, (unsigned long long)b->size);
  *out = b;
  return XPU_OK;
}

static xpu_status api_buffer_write(xpu_buffer h, uint64_t off, const void *src, uint64_t size) {
  nv_buffer *b = NULL;
  xpu_status s = buffer_range("buffer_write", h, off, size, src, &b);
  if (s == XPU_OK && size) memcpy(b->data + off, src, size);
  return s;
}

static xpu_status api_buffer_read(xpu_buffer h, uint64_t off, void *dst, uint64_t size) {
  nv_buffer *b = NULL;
  xpu_status s = buffer_range("buffer_read", h, off, size, dst, &b);
  if (s == XPU_OK && size) memcpy(dst, b->data + off, size);
  return s;
}

static xpu_status api_buffer_size(xpu_buffer h, uint64_t *out) {
  if (!out) return xpu_fail(&nv_reg, h, XPU_E_INVALID_ARG, "buffer_size: null out");
  nv_buffer *b = (nv_buffer *)xpu_reg_get(&nv_reg, h, OBJ_BUFFER);
  if (!b) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "buffer_size: unknown or released buffer handle");
  *out = b->size;
  return XPU_OK;
}

static xpu_status api_buffer_release(xpu_buffer h) {
  nv_buffer *b = (nv_buffer *)xpu_reg_get(&nv_reg, h, OBJ_BUFFER);
  if (!b) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "buffer_release: unknown or released buffer handle");
  if (atomic_load(&b->inflight) > 0)
    return xpu_fail(&nv_reg, h, XPU_E_BAD_STATE, "buffer_release: an execution in flight uses this buffer");
  if (!xpu_reg_remove(&nv_reg, h, OBJ_BUFFER))
    return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "buffer_release: buffer released concurrently");
  nv_buffer_unref(b);
  return XPU_OK;
}

/* ---------------------------------------------------------------- graphs */

static xpu_status api_graph_analyze(xpu_context ch, const void *ir, uint64_t ir_size, xpu_node_verdict *out,
                                    uint32_t cap) {
  nv_context *c = (nv_context *)xpu_reg_get(&nv_reg, ch, OBJ_CONTEXT);
  if (!c) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_HANDLE, "graph_analyze: unknown or released context handle");
  xpu_ir_graph g;
  char err[256];
  xpu_status s = xpu_ir_parse(ir, ir_size, &g, err, sizeof err);
  if (s != XPU_OK) return xpu_fail(&nv_reg, ch, s, "graph_analyze: %s", err);
  if (!nv_check_tensors(&g, err, sizeof err)) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "graph_analyze: %s", err);
  if (!out && g.header->n_nodes) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "graph_analyze: null out");
  if (cap < g.header->n_nodes)
    return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "graph_analyze: room for %u verdicts, the graph has %u nodes", cap,
                    g.header->n_nodes);
  for (uint32_t i = 0; i < g.header->n_nodes; i++) {
    if (out[i].struct_size < offsetof(xpu_node_verdict, precision) + sizeof(uint32_t))
      return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "graph_analyze: verdict %u struct_size %u too small", i,
                      out[i].struct_size);
    xpu_node_verdict v;
    memset(&v, 0, sizeof v);
    uint32_t prec = XPU_PREC_DEFAULT;
    v.verdict = nv_node_supported(&g, &g.nodes[i], &prec, v.reason, sizeof v.reason) ? XPU_VERDICT_YES
                                                                                     : XPU_VERDICT_NO;
    v.precision = prec;
    XPU_COPY_OUT(&out[i], v);
  }
  return XPU_OK;
}

static void executable_free(nv_executable *e) {
  for (uint32_t i = 0; i < e->n_consts; i++) nv_buffer_unref(e->consts[i]);
  free(e->consts);
  free(e->plan);
  free(e->blob);
  atomic_fetch_sub(&e->ctx->children, 1);
  free(e);
}

static xpu_status api_graph_prepare(xpu_context ch, const xpu_prepare_desc *d, xpu_executable *out) {
  if (!out || !d) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "graph_prepare: null argument");
  *out = 0;
  nv_context *c = (nv_context *)xpu_reg_get(&nv_reg, ch, OBJ_CONTEXT);
  if (!c) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_HANDLE, "graph_prepare: unknown or released context handle");
  if (d->struct_size < offsetof(xpu_prepare_desc, options) + sizeof(void *))
    return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "graph_prepare: desc struct_size %u too small", d->struct_size);
  if (d->struct_size >= offsetof(xpu_prepare_desc, cache) + sizeof(void *) && d->cache)
    return xpu_fail(&nv_reg, ch, XPU_E_UNSUPPORTED, "graph_prepare: this plugin has no executable cache");
  if (!d->ir || d->ir_size < sizeof(xpu_ir_header) || d->ir_size > ((uint64_t)1 << 40))
    return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "graph_prepare: missing or malformed IR");
  const char *opts = d->options;
  nv_cpuset cpus = c->cpus;
  int threads = c->threads;
  char v[1024];
  int rc = xpu_opt_get(opts, "cpus", v, sizeof v);
  if (rc < 0 || (rc > 0 && nv_parse_cpus(v, &cpus) != 0))
    return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "graph_prepare: bad cpus option (want e.g. cpus=0,1)");
  if (rc > 0) threads = cpus.n;
  rc = xpu_opt_get(opts, "threads", v, sizeof v);
  if (rc != 0) {
    char *end;
    long t = rc > 0 ? strtol(v, &end, 10) : -1;
    if (rc < 0 || end == v || *end || t < 1 || t > 1024)
      return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "graph_prepare: bad threads option (want 1..1024)");
    threads = (int)t;
  }
  if (threads > nv_pool_size(c->pool)) threads = nv_pool_size(c->pool);

  nv_executable *e = (nv_executable *)calloc(1, sizeof *e);
  void *blob = NULL;
  if (!e || posix_memalign(&blob, 8, d->ir_size) != 0) {
    free(e);
    return xpu_fail(&nv_reg, ch, XPU_E_OUT_OF_MEMORY, "graph_prepare: out of memory");
  }
  memcpy(blob, d->ir, d->ir_size);
  e->blob = blob;
  e->ctx = c;
  e->cpus = cpus;
  e->threads = threads;
  atomic_fetch_add(&c->children, 1);
  char err[256];
  xpu_status s = xpu_ir_parse(blob, d->ir_size, &e->g, err, sizeof err);
  if (s == XPU_OK && !nv_check_tensors(&e->g, err, sizeof err)) s = XPU_E_INVALID_ARG;
  if (s != XPU_OK) {
    executable_free(e);
    return xpu_fail(&nv_reg, ch, s, "graph_prepare: %s", err);
  }
  for (uint32_t i = 0; i < e->g.header->n_nodes; i++) {
    uint32_t prec;
    char reason[128];
    if (!nv_node_supported(&e->g, &e->g.nodes[i], &prec, reason, sizeof reason)) {
      const char *op = xpu_op_name(e->g.nodes[i].op);
      executable_free(e);
      return xpu_fail(&nv_reg, ch, XPU_E_UNSUPPORTED, "graph_prepare: node %u (%s): %s", i, op, reason);
    }
  }
  s = nv_plan(e, err, sizeof err);
  if (s != XPU_OK) {
    executable_free(e);
    return xpu_fail(&nv_reg, ch, s, "graph_prepare: %s", err);
  }
  xpu_handle h = xpu_reg_add(&nv_reg, OBJ_EXECUTABLE, e);
  if (!h) {
    executable_free(e);
    return xpu_fail(&nv_reg, ch, XPU_E_OUT_OF_MEMORY, "graph_prepare: out of handles");
  }
  *out = h;
  return XPU_OK;
}

static xpu_status api_executable_serialize(xpu_executable h, void *dst, uint64_t cap, uint64_t *size) {
  (void)dst;
  (void)cap;
  (void)size;
  if (!xpu_reg_get(&nv_reg, h, OBJ_EXECUTABLE))
    return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "executable_serialize: unknown or released executable handle");
  return xpu_fail(&nv_reg, h, XPU_E_UNSUPPORTED,
                  "executable_serialize: the NEON plugin prepares in microseconds and keeps no cache");
}

static xpu_status api_executable_release(xpu_executable h) {
  nv_executable *e = (nv_executable *)xpu_reg_get(&nv_reg, h, OBJ_EXECUTABLE);
  if (!e) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "executable_release: unknown or released executable handle");
  int n = atomic_load(&e->executions);
  if (n > 0)
    return xpu_fail(&nv_reg, h, XPU_E_BAD_STATE, "executable_release: %d executions still live", n);
  if (!xpu_reg_remove(&nv_reg, h, OBJ_EXECUTABLE))
    return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "executable_release: released concurrently");
  executable_free(e);
  return XPU_OK;
}

/* ---------------------------------------------------------------- executions */

static void execution_free(nv_execution *x) {
  for (uint32_t i = 0; i < x->n_io; i++)
    if (x->bind[i]) nv_buffer_unref(x->bind[i]);
  free(x->bind);
  free(x->bind_off);
  free(x->arena);
  free(x->scratch);
  free(x->shared);
  pthread_mutex_destroy(&x->mu);
  pthread_cond_destroy(&x->cv);
  atomic_fetch_sub(&x->exe->executions, 1);
  atomic_fetch_sub(&x->exe->ctx->children, 1);
  free(x);
}

static xpu_status api_execution_create(xpu_executable eh, xpu_execution *out) {
  if (!out) return xpu_fail(&nv_reg, eh, XPU_E_INVALID_ARG, "execution_create: null out");
  *out = 0;
  nv_executable *e = (nv_executable *)xpu_reg_get(&nv_reg, eh, OBJ_EXECUTABLE);
  if (!e) return xpu_fail(&nv_reg, eh, XPU_E_INVALID_HANDLE, "execution_create: unknown or released executable handle");
  nv_execution *x = (nv_execution *)calloc(1, sizeof *x);
  if (!x) return xpu_fail(&nv_reg, eh, XPU_E_OUT_OF_MEMORY, "execution_create: out of memory");
  x->exe = e;
  x->n_io = e->g.header->n_inputs + e->g.header->n_outputs;
  pthread_mutex_init(&x->mu, NULL);
  pthread_cond_init(&x->cv, NULL);
  atomic_fetch_add(&e->executions, 1);
  atomic_fetch_add(&e->ctx->children, 1);
  x->bind = (nv_buffer **)calloc(x->n_io ? x->n_io : 1, sizeof(nv_buffer *));
  x->bind_off = (uint64_t *)calloc(x->n_io ? x->n_io : 1, sizeof(uint64_t));
  x->scratch_threads = e->threads;
  void *arena = NULL, *scratch = NULL, *shared = NULL;
  int ok = x->bind && x->bind_off;
  /* never NULL, so that a zero-size value still has an address */
  if (ok) ok = (arena = nv_alloc(e->arena_bytes)) != NULL;
  if (ok && e->scratch_bytes) ok = (scratch = nv_alloc(e->scratch_bytes * (uint64_t)e->threads)) != NULL;
  if (ok && e->shared_bytes) ok = (shared = nv_alloc(e->shared_bytes)) != NULL;
  x->arena = (uint8_t *)arena;
  x->shared = (uint8_t *)shared;
  x->scratch = (uint8_t *)scratch;
  if (!ok) {
    execution_free(x);
    return xpu_fail(&nv_reg, eh, XPU_E_OUT_OF_MEMORY, "execution_create: cannot allocate %llu bytes of intermediates",
                    (unsigned long long)e->arena_bytes);
  }
  xpu_handle h = xpu_reg_add(&nv_reg, OBJ_EXECUTION, x);
  if (!h) {
    execution_free(x);
    return xpu_fail(&nv_reg, eh, XPU_E_OUT_OF_MEMORY, "execution_create: out of handles");
  }
  x->handle = h;
  *out = h;
  return XPU_OK;
}

static xpu_status api_execution_bind(xpu_execution h, uint32_t io, xpu_buffer bh, uint64_t offset) {
  nv_execution *x = (nv_execution *)xpu_reg_get(&nv_reg, h, OBJ_EXECUTION);
  if (!x) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "execution_bind: unknown or released execution handle");
  nv_buffer *b = (nv_buffer *)xpu_reg_get(&nv_reg, bh, OBJ_BUFFER);
  if (!b) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "execution_bind: unknown or released buffer handle");
  const xpu_ir_graph *g = &x->exe->g;
  if (io >= x->n_io)
    return xpu_fail(&nv_reg, h, XPU_E_INVALID_ARG, "execution_bind: io %u out of range (%u inputs, %u outputs)", io,
                    g->header->n_inputs, g->header->n_outputs);
  if (b->ctx != x->exe->ctx)
    return xpu_fail(&nv_reg, h, XPU_E_INVALID_ARG, "execution_bind: buffer belongs to another context");
  uint32_t t = io < g->header->n_inputs ? g->inputs[io] : g->outputs[io - g->header->n_inputs];
  uint64_t need = xpu_ir_nbytes(&g->tensors[t]);
  if (offset > b->size || need > b->size - offset)
    return xpu_fail(&nv_reg, h, XPU_E_INVALID_ARG,
                    "execution_bind: io %u needs %llu bytes at offset %llu, the buffer has %llu", io,
                    (unsigned long long)need, (unsigned long long)offset, (unsigned long long)b->size);
  pthread_mutex_lock(&x->mu);
  if (x->state != EX_IDLE) {
    pthread_mutex_unlock(&x->mu);
    return xpu_fail(&nv_reg, h, XPU_E_BAD_STATE, "execution_bind: execution is in flight");
  }
  atomic_fetch_add(&b->refs, 1);
  nv_buffer *old = x->bind[io];
  x->bind[io] = b;
  x->bind_off[io] = offset;
  pthread_mutex_unlock(&x->mu);
  if (old) nv_buffer_unref(old);
  return XPU_OK;
}

/* Moves an idle, fully bound execution to `state`; BAD_STATE otherwise. */
static xpu_status begin(nv_execution *x, int state, const char *what) {
  pthread_mutex_lock(&x->mu);
  if (x->state != EX_IDLE) {
    pthread_mutex_unlock(&x->mu);
    return xpu_fail(&nv_reg, x->handle, XPU_E_BAD_STATE, "%s: execution is already in flight", what);
  }
  for (uint32_t i = 0; i < x->n_io; i++)
    if (!x->bind[i]) {
      pthread_mutex_unlock(&x->mu);
      return xpu_fail(&nv_reg, x->handle, XPU_E_BAD_STATE, "%s: io %u is not bound", what, i);
    }
  x->state = state;
  for (uint32_t i = 0; i < x->n_io; i++) atomic_fetch_add(&x->bind[i]->inflight, 1);
  pthread_mutex_unlock(&x->mu);
  return XPU_OK;
}

static void finish(nv_execution *x) {
  pthread_mutex_lock(&x->mu);
  for (uint32_t i = 0; i < x->n_io; i++) atomic_fetch_sub(&x->bind[i]->inflight, 1);
  x->state = EX_IDLE;
  pthread_cond_broadcast(&x->cv);
  pthread_mutex_unlock(&x->mu);
}

static xpu_status run_now(nv_execution *x) {
  xpu_status s = nv_execute(x);
  return s;
}

static xpu_status api_execution_run(xpu_execution h) {
  nv_execution *x = (nv_execution *)xpu_reg_get(&nv_reg, h, OBJ_EXECUTION);
  if (!x) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "execution_run: unknown or released execution handle");
  xpu_status s = begin(x, EX_RUNNING, "execution_run");
  if (s != XPU_OK) return s;
  s = run_now(x);
  finish(x);
  return s;
}

static xpu_status api_execution_release(xpu_execution h) {
  nv_execution *x = (nv_execution *)xpu_reg_get(&nv_reg, h, OBJ_EXECUTION);
  if (!x) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "execution_release: unknown or released execution handle");
  pthread_mutex_lock(&x->mu);
  int st = x->state;
  pthread_mutex_unlock(&x->mu);
  if (st != EX_IDLE) return xpu_fail(&nv_reg, h, XPU_E_BAD_STATE, "execution_release: execution is in flight");
  if (!xpu_reg_remove(&nv_reg, h, OBJ_EXECUTION))
    return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "execution_release: released concurrently");
  execution_free(x);
  return XPU_OK;
}

/* ---------------------------------------------------------------- fences */

/* release_user: the caller is a queued job that is done with f (see nv_fence.users) */
static void fence_set(nv_fence *f, uint64_t value, xpu_status failed, int release_user) {
  pthread_mutex_lock(&f->mu);
  if (release_user) f->users--;
  if (failed != XPU_OK) {
    if (f->failed == XPU_OK || value < f->failed_value) {
      f->failed = failed;
      f->failed_value = value;
    }
  } else if (value > f->value) {
    f->value = value;
  }
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
}

/* waits until value is reached; stop (may be NULL) aborts the wait with BAD_STATE */
static xpu_status fence_wait_on(nv_fence *f, uint64_t value, int64_t timeout_ns, const int *stop) {
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  pthread_mutex_lock(&f->mu);
  xpu_status s = XPU_OK;
  int64_t left = timeout_ns;
  for (;;) {
    if (f->value >= value) break;
    if (f->failed != XPU_OK && value >= f->failed_value) {
      s = f->failed;
      break;
    }
    if (stop && __atomic_load_n(stop, __ATOMIC_ACQUIRE)) {
      s = XPU_E_BAD_STATE;
      break;
    }
    if (timeout_ns >= 0 && left <= 0) {
      s = XPU_E_TIMEOUT;
      break;
    }
    /* wake up at least every 50 ms so that a stopping queue is noticed */
    int64_t step = 50000000;
    if (timeout_ns >= 0 && left < step) step = left;
    struct timespec now, t;
    clock_gettime(CLOCK_REALTIME, &now);
    t.tv_sec = now.tv_sec + (now.tv_nsec + step) / 1000000000;
    t.tv_nsec = (now.tv_nsec + step) % 1000000000;
    pthread_cond_timedwait(&f->cv, &f->mu, &t);
    if (timeout_ns >= 0) {
      struct timespec after;
      clock_gettime(CLOCK_REALTIME, &after);
      left = timeout_ns - ((int64_t)(after.tv_sec - dl.tv_sec) * 1000000000 + (after.tv_nsec - dl.tv_nsec));
    }
  }
  pthread_mutex_unlock(&f->mu);
  return s;
}

static xpu_status api_fence_create(xpu_context ch, uint64_t initial, xpu_fence *out) {
  if (!out) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "fence_create: null out");
  *out = 0;
  nv_context *c = (nv_context *)xpu_reg_get(&nv_reg, ch, OBJ_CONTEXT);
  if (!c) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_HANDLE, "fence_create: unknown or released context handle");
  nv_fence *f = (nv_fence *)calloc(1, sizeof *f);
  if (!f) return xpu_fail(&nv_reg, ch, XPU_E_OUT_OF_MEMORY, "fence_create: out of memory");
  f->ctx = c;
  f->value = initial;
  pthread_mutex_init(&f->mu, NULL);
  pthread_cond_init(&f->cv, NULL);
  atomic_fetch_add(&c->children, 1);
  xpu_handle h = xpu_reg_add(&nv_reg, OBJ_FENCE, f);
  if (!h) {
    atomic_fetch_sub(&c->children, 1);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
    return xpu_fail(&nv_reg, ch, XPU_E_OUT_OF_MEMORY, "fence_create: out of handles");
  }
  *out = h;
  return XPU_OK;
}

static xpu_status api_fence_wait(xpu_fence h, uint64_t value, int64_t timeout_ns) {
  nv_fence *f = (nv_fence *)xpu_reg_get(&nv_reg, h, OBJ_FENCE);
  if (!f) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "fence_wait: unknown or released fence handle");
  xpu_status s = fence_wait_on(f, value, timeout_ns, NULL);
  if (s == XPU_E_TIMEOUT) return xpu_fail(&nv_reg, h, s, "fence_wait: value %llu not reached in time",
                                          (unsigned long long)value);
  if (s != XPU_OK)
    return xpu_fail(&nv_reg, h, s, "fence_wait: the submission that signals value %llu failed (%s)",
                    (unsigned long long)value, xpu_status_name(s));
  return XPU_OK;
}

static xpu_status api_fence_value(xpu_fence h, uint64_t *out) {
  if (!out) return xpu_fail(&nv_reg, h, XPU_E_INVALID_ARG, "fence_value: null out");
  nv_fence *f = (nv_fence *)xpu_reg_get(&nv_reg, h, OBJ_FENCE);
  if (!f) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "fence_value: unknown or released fence handle");
  pthread_mutex_lock(&f->mu);
  *out = f->value;
  pthread_mutex_unlock(&f->mu);
  return XPU_OK;
}

static xpu_status api_fence_signal(xpu_fence h, uint64_t value) {
  nv_fence *f = (nv_fence *)xpu_reg_get(&nv_reg, h, OBJ_FENCE);
  if (!f) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "fence_signal: unknown or released fence handle");
  fence_set(f, value, XPU_OK, 0);
  return XPU_OK;
}

/* Fences are released only when no queued job refers to them: jobs keep raw pointers. */
typedef struct nv_job {
  struct nv_job *next;
  nv_execution *x;
  uint32_t n_waits;
  nv_fence **waits;
  uint64_t *wait_values;
  nv_fence *signal;
  uint64_t signal_value;
} nv_job;

static int fence_users(nv_fence *f) {
  pthread_mutex_lock(&f->mu);
  int n = f->users;
  pthread_mutex_unlock(&f->mu);
  return n;
}

static void fence_use(nv_fence *f, int delta) {
  pthread_mutex_lock(&f->mu);
  f->users += delta;
  pthread_mutex_unlock(&f->mu);
}

static xpu_status api_fence_release(xpu_fence h) {
  nv_fence *f = (nv_fence *)xpu_reg_get(&nv_reg, h, OBJ_FENCE);
  if (!f) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "fence_release: unknown or released fence handle");
  if (fence_users(f) > 0)
    return xpu_fail(&nv_reg, h, XPU_E_BAD_STATE, "fence_release: a submitted execution still waits on or signals it");
  if (!xpu_reg_remove(&nv_reg, h, OBJ_FENCE))
    return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "fence_release: released concurrently");
  atomic_fetch_sub(&f->ctx->children, 1);
  pthread_mutex_destroy(&f->mu);
  pthread_cond_destroy(&f->cv);
  free(f);
  return XPU_OK;
}

/* ---------------------------------------------------------------- async queue */

static void job_free(nv_job *j) {
  free(j->waits);
  free(j->wait_values);
  free(j);
}

static void job_unuse(nv_job *j) {
  for (uint32_t i = 0; i < j->n_waits; i++) fence_use(j->waits[i], -1);
  if (j->signal) fence_use(j->signal, -1);
}

static void *queue_main(void *arg) {
  nv_context *c = (nv_context *)arg;
  pthread_mutex_lock(&c->qmu);
  for (;;) {
    while (!c->qhead && !c->qstop) pthread_cond_wait(&c->qcv, &c->qmu);
    if (!c->qhead) break;
    nv_job *j = c->qhead;
    int stopping = c->qstop;
    pthread_mutex_unlock(&c->qmu);
    xpu_status s = stopping ? XPU_E_BAD_STATE : XPU_OK;
    for (uint32_t i = 0; i < j->n_waits && s == XPU_OK; i++)
      s = fence_wait_on(j->waits[i], j->wait_values[i], -1, &c->qstop);
    if (s == XPU_OK) {
      pthread_mutex_lock(&j->x->mu);
      j->x->state = EX_RUNNING;
      pthread_mutex_unlock(&j->x->mu);
      s = run_now(j->x);
    } else {
      xpu_fail(&nv_reg, j->x->handle, s, "execution_submit: a wait fence failed or the context stopped (%s)",
               xpu_status_name(s));
    }
    for (uint32_t i = 0; i < j->n_waits; i++) fence_use(j->waits[i], -1);
    pthread_mutex_lock(&c->qmu);
    c->qhead = j->next;
    if (!c->qhead) c->qtail = NULL;
    pthread_mutex_unlock(&c->qmu);
    /* idle before the fence moves: a host that saw the fence may reuse the execution at once */
    finish(j->x);
    if (j->signal) fence_set(j->signal, j->signal_value, s, 1);
    job_free(j);
    pthread_mutex_lock(&c->qmu);
  }
  pthread_mutex_unlock(&c->qmu);
  return NULL;
}

static void queue_stop(nv_context *c) {
  pthread_mutex_lock(&c->qmu);
  int started = c->qstarted;
  __atomic_store_n(&c->qstop, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&c->qcv);
  pthread_mutex_unlock(&c->qmu);
  if (started) pthread_join(c->qthread, NULL);
  pthread_mutex_lock(&c->qmu);
  c->qstarted = 0;
  pthread_mutex_unlock(&c->qmu);
}

static xpu_status api_execution_submit(xpu_execution h, const xpu_fence_point *waits, uint32_t n_waits,
                                       const xpu_fence_point *signal) {
  nv_execution *x = (nv_execution *)xpu_reg_get(&nv_reg, h, OBJ_EXECUTION);
  if (!x) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "execution_submit: unknown or released execution handle");
  if (n_waits && !waits) return xpu_fail(&nv_reg, h, XPU_E_INVALID_ARG, "execution_submit: null waits");
  if (n_waits > 1024) return xpu_fail(&nv_reg, h, XPU_E_INVALID_ARG, "execution_submit: %u waits", n_waits);
  nv_context *c = x->exe->ctx;
  nv_job *j = (nv_job *)calloc(1, sizeof *j);
  if (j) {
    j->waits = (nv_fence **)calloc(n_waits + 1, sizeof(nv_fence *));
    j->wait_values = (uint64_t *)calloc(n_waits + 1, sizeof(uint64_t));
  }
  if (!j || !j->waits || !j->wait_values) {
    if (j) job_free(j);
    return xpu_fail(&nv_reg, h, XPU_E_OUT_OF_MEMORY, "execution_submit: out of memory");
  }
  j->x = x;
  j->n_waits = n_waits;
  for (uint32_t i = 0; i < n_waits; i++) {
    nv_fence *f = (nv_fence *)xpu_reg_get(&nv_reg, waits[i].fence, OBJ_FENCE);
    if (!f || f->ctx != c) {
      job_free(j);
      return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "execution_submit: wait %u: unknown fence or another context's", i);
    }
    j->waits[i] = f;
    j->wait_values[i] = waits[i].value;
  }
  if (signal) {
    nv_fence *f = (nv_fence *)xpu_reg_get(&nv_reg, signal->fence, OBJ_FENCE);
    if (!f || f->ctx != c) {
      job_free(j);
      return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "execution_submit: unknown signal fence or another context's");
    }
    j->signal = f;
    j->signal_value = signal->value;
  }
  xpu_status s = begin(x, EX_QUEUED, "execution_submit");
  if (s != XPU_OK) {
    job_free(j);
    return s;
  }
  /* the fences stay alive until the job is done with them (fence_release says BAD_STATE) */
  for (uint32_t i = 0; i < n_waits; i++) fence_use(j->waits[i], 1);
  if (j->signal) fence_use(j->signal, 1);
  pthread_mutex_lock(&c->qmu);
  if (c->qstop) {
    pthread_mutex_unlock(&c->qmu);
    job_unuse(j);
    finish(x);
    job_free(j);
    return xpu_fail(&nv_reg, h, XPU_E_BAD_STATE, "execution_submit: the plugin is shutting down");
  }
  if (!c->qstarted) {
    int rc = pthread_create(&c->qthread, NULL, queue_main, c);
    if (rc != 0) {
      pthread_mutex_unlock(&c->qmu);
      job_unuse(j);
      finish(x);
      job_free(j);
      return xpu_fail(&nv_reg, h, XPU_E_OUT_OF_MEMORY, "execution_submit: cannot start the queue thread: %s",
                      strerror(rc));
    }
    c->qstarted = 1;
  }
  if (c->qtail)
    c->qtail->next = j;
  else
    c->qhead = j;
  c->qtail = j;
  pthread_cond_signal(&c->qcv);
  pthread_mutex_unlock(&c->qmu);
  return XPU_OK;
}

/* ---------------------------------------------------------------- shutdown and the table */

/* the first live object of a type, removed from the registry (NULL when none is left) */
static void *take_one(uint32_t type) {
  xpu_handle h = 0;
  pthread_mutex_lock(&nv_reg.mu);
  for (uint32_t i = 1; i < nv_reg.cap && !h; i++)
    if (nv_reg.slots[i].obj && nv_reg.slots[i].type == type) h = ((uint64_t)nv_reg.slots[i].gen << 32) | i;
  pthread_mutex_unlock(&nv_reg.mu);
  return h ? xpu_reg_remove(&nv_reg, h, type) : NULL;
}

static xpu_status api_shutdown(void) {
  /* stop every queue first, so that no job still runs while objects are freed */
  for (;;) {
    nv_context *c = NULL;
    pthread_mutex_lock(&nv_reg.mu);
    for (uint32_t i = 1; i < nv_reg.cap && !c; i++) {
      xpu_slot *s = &nv_reg.slots[i];
      if (s->obj && s->type == OBJ_CONTEXT && !__atomic_load_n(&((nv_context *)s->obj)->qstop, __ATOMIC_ACQUIRE))
        c = (nv_context *)s->obj;
    }
    pthread_mutex_unlock(&nv_reg.mu);
    if (!c) break;
    queue_stop(c);
  }
  void *o;
  while ((o = take_one(OBJ_EXECUTION))) execution_free((nv_execution *)o);
  while ((o = take_one(OBJ_EXECUTABLE))) executable_free((nv_executable *)o);
  while ((o = take_one(OBJ_BUFFER))) nv_buffer_unref((nv_buffer *)o);
  while ((o = take_one(OBJ_FENCE))) {
    nv_fence *f = (nv_fence *)o;
    atomic_fetch_sub(&f->ctx->children, 1);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
  }
  while ((o = take_one(OBJ_CONTEXT))) context_free((nv_context *)o);
  xpu_reg_destroy(&nv_reg);
  return XPU_OK;
}

static const xpu_api nv_api = {
    .struct_size = sizeof(xpu_api),
    .abi_major = XPU_ABI_MAJOR,
    .abi_minor = XPU_ABI_MINOR,
    .get_info = api_get_info,
    .shutdown = api_shutdown,
    .last_error = api_last_error,
    .device_count = api_device_count,
    .device_info = api_device_info,
    .op_support = api_op_support,
    .context_create = api_context_create,
    .context_release = api_context_release,
    .buffer_alloc = api_buffer_alloc,
    .buffer_import = api_buffer_import,
    .buffer_map = api_buffer_map,
    .buffer_unmap = api_buffer_unmap,
    .buffer_write = api_buffer_write,
    .buffer_read = api_buffer_read,
    .buffer_size = api_buffer_size,
    .buffer_release = api_buffer_release,
    .graph_analyze = api_graph_analyze,
    .graph_prepare = api_graph_prepare,
    .executable_serialize = api_executable_serialize,
    .executable_release = api_executable_release,
    .execution_create = api_execution_create,
    .execution_bind = api_execution_bind,
    .execution_submit = api_execution_submit,
    .execution_run = api_execution_run,
    .execution_release = api_execution_release,
    .fence_create = api_fence_create,
    .fence_wait = api_fence_wait,
    .fence_value = api_fence_value,
    .fence_signal = api_fence_signal,
    .fence_release = api_fence_release,
};

XPU_EXPORT xpu_status xpu_plugin_open(const xpu_host_info *host, const xpu_api **out) {
  if (!out) return XPU_E_INVALID_ARG;
  if (host && host->struct_size >= offsetof(xpu_host_info, abi_minor) && host->abi_major != XPU_ABI_MAJOR)
    return xpu_fail(&nv_reg, 0, XPU_E_INCOMPATIBLE, "open: host ABI major %u, plugin %u", host->abi_major,
                    XPU_ABI_MAJOR);
  xpu_reg_set_log(&nv_reg, host);
  *out = &nv_api;
  xpu_log(&nv_reg, XPU_LOG_INFO, "neon plugin open (%s build)", NV_VARIANT);
  return XPU_OK;
}
