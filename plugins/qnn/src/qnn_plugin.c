/*
 * qnn_plugin.c: libxpu-qnn.so, the xpu backend ABI (abi/xpu_backend.h) over the QNN C API:
 * probe and open, the device, contexts and graph_analyze. Buffers, prepare/executions, fences
 * and the submission queue are in qnn_buffer.c, qnn_exec.c, qnn_fence.c and qnn_queue.c.
 *
 * One device: the NPU of the QNN backend library found at run time (qnn_lib.c). Each executable
 * owns one QNN context holding one graph, so its context binary is exactly that graph: that is
 * what executable_serialize saves and graph_prepare reloads without a finalize. Buffers are
 * host memory (malloc, host pointers or mmap'ed fds); fd buffers are registered with memRegister
 * so QNN reads the shared bytes where they are. execution_run executes in the caller's thread;
 * execution_submit queues to one worker thread (XPU_CAP_ASYNC, qnn_queue.c).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qnn_plugin.h"

#define QNN_PLUGIN_VERSION "0.1.0"

xpu_registry qnn_reg = XPU_REGISTRY_INIT;
qnn_plugin_state qnn_state = {.mu = PTHREAD_MUTEX_INITIALIZER,
                               .refs_mu = PTHREAD_MUTEX_INITIALIZER,
                               .queue = XPU_QUEUE_INIT(queue_run)};

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
  pthread_mutex_lock(&qnn_state.mu);
  if (!qnn_state.loaded && qnn_state.load_status == XPU_OK) {
    char dir[512], path[512], reason[512];
    if (dir_hint && dir_hint[0]) snprintf(dir, sizeof dir, "%s", dir_hint);
    else plugin_dir(dir, sizeof dir);
    if (!qnn_lib_find(dir, path, sizeof path, reason, sizeof reason)) {
      qnn_state.load_status = XPU_E_MISSING_DEP;
      snprintf(qnn_state.load_err, sizeof qnn_state.load_err, "%s", reason);
    } else if ((qnn_state.load_status = qnn_lib_load(&qnn_state.lib, path, qnn_state.load_err, sizeof qnn_state.load_err)) == XPU_OK) {
      qnn_state.loaded = 1;
    }
  }
  xpu_status st = qnn_state.loaded ? XPU_OK : qnn_state.load_status;
  pthread_mutex_unlock(&qnn_state.mu);
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
    snprintf(r.reason, sizeof r.reason, "%.255s", qnn_state.load_err);
  } else if (qnn_state.lib.emulated) {
    r.score = 5;
    snprintf(r.reason, sizeof r.reason, "qnn (emulated provider): %.160s, no NPU; results are not hardware results",
             qnn_state.lib.path);
  } else {
    r.score = qnn_state.lib.backend_id == QNN_BACKEND_ID_HTP ? 100 : 20;
    snprintf(r.reason, sizeof r.reason, "QNN provider %.80s (API %u.%u) at %.120s", qnn_state.lib.provider,
             qnn_state.lib.iface->apiVersion.coreApiVersion.major, qnn_state.lib.iface->apiVersion.coreApiVersion.minor, qnn_state.lib.path);
  }
  XPU_COPY_OUT(out, r);
  return XPU_OK;
}

/* ---------------------------------------------------------------- plugin, devices */

static xpu_status get_info(xpu_plugin_info *out) {
  if (!out) return xpu_fail(&qnn_reg, 0, XPU_E_INVALID_ARG, "get_info: null output");
  xpu_plugin_info i;
  memset(&i, 0, sizeof i);
  i.abi_major = XPU_ABI_MAJOR;
  i.abi_minor = XPU_ABI_MINOR;
  i.opset_min = 1;
  i.opset_max = XPU_OPSET_VERSION;
  i.ir_version = XPU_IR_VERSION;
  XPU_STRCPY(i.name, "qnn");
  XPU_STRCPY(i.vendor, qnn_state.loaded && qnn_state.lib.emulated ? "xpu (QNN C API, emulated provider)" : "xpu (QNN C API)");
  XPU_STRCPY(i.version, QNN_PLUGIN_VERSION);
  XPU_STRCPY(i.build_id, XPU_QNN_BUILD_ID);
  if (qnn_state.loaded)
    snprintf(i.sdk_version, sizeof i.sdk_version, "API %u.%u %.40s", qnn_state.lib.iface->apiVersion.coreApiVersion.major,
             qnn_state.lib.iface->apiVersion.coreApiVersion.minor, qnn_state.lib.build_id);
  XPU_COPY_OUT(out, i);
  return XPU_OK;
}

static xpu_status device_count(uint32_t *out) {
  if (!out) return xpu_fail(&qnn_reg, 0, XPU_E_INVALID_ARG, "device_count: null output");
  *out = qnn_state.loaded ? 1 : 0;
  return XPU_OK;
}

void device_name(char *buf, size_t cap) {
  if (qnn_state.lib.emulated) snprintf(buf, cap, "qnn (emulated provider)");
  else if (qnn_state.lib.backend_id == QNN_BACKEND_ID_HTP) snprintf(buf, cap, "qnn HTP (%.80s)", qnn_state.lib.provider);
  else snprintf(buf, cap, "qnn backend %u (%.80s)", qnn_state.lib.backend_id, qnn_state.lib.provider);
}

uint32_t qnn_api_minor(void) {
  return qnn_state.lib.iface ? qnn_state.lib.iface->apiVersion.coreApiVersion.minor : QNN_API_MINOR_PINNED;
}

int float_as_f16(void) { return qnn_state.lib.target == QNN_BACKEND_ID_HTP; }

/* a client buffer is read in place by a backend on the host CPU (the emulator, libQnnCpu); the
 * HTP copies it over FastRPC, so there only fd (rpcmem) memory is shared without a copy */
int host_import_zero_copy(void) { return qnn_state.lib.target != QNN_BACKEND_ID_HTP; }

static xpu_status device_info(uint32_t dev, xpu_device_info *out) {
  if (!out) return xpu_fail(&qnn_reg, 0, XPU_E_INVALID_ARG, "device_info: null output");
  if (!qnn_state.loaded || dev != 0) return xpu_fail(&qnn_reg, 0, XPU_E_INVALID_ARG, "device_info: no device %u", dev);
  const QnnInterfaceTable_t *f = qnn_state.lib.fn;
  xpu_device_info d;
  memset(&d, 0, sizeof d);
  d.kind = qnn_state.lib.target == QNN_BACKEND_ID_CPU ? XPU_DEVICE_CPU : XPU_DEVICE_NPU;
  d.caps = XPU_CAP_ASYNC | XPU_CAP_STATIC_SHAPES | XPU_CAP_HOST_VISIBLE;
  /* half precision where floats are computed in f16: the HTP (and the emulator's HTP profile,
   * which rounds every float to half); libQnnCpu and the CPU profile are FLOAT_32 only */
  if (float_as_f16()) d.caps |= XPU_CAP_FP16;
  if (host_import_zero_copy()) d.caps |= XPU_CAP_IMPORT_HOST;
  if (qnn_state.lib.target != QNN_BACKEND_ID_CPU) d.caps |= XPU_CAP_INT8;
  if (f->contextGetBinarySize && f->contextGetBinary && f->contextCreateFromBinary && f->graphRetrieve)
    d.caps |= XPU_CAP_SERIALIZE;
  if (f->memRegister && f->memDeRegister) d.caps |= XPU_CAP_IMPORT_FD;
  if (qnn_state.lib.emulated) d.caps |= XPU_CAP_EMULATED;
  device_name(d.name, sizeof d.name);
  XPU_STRCPY(d.vendor, qnn_state.lib.emulated ? "xpu QNN emulator" : "Qualcomm (QNN)");
  snprintf(d.driver_version, sizeof d.driver_version, "%.60s", qnn_state.lib.build_id);
  XPU_COPY_OUT(out, d);
  return XPU_OK;
}

static xpu_status op_support(uint32_t dev, const xpu_op_query *q, uint32_t *verdict) {
  if (!q || !verdict) return xpu_fail(&qnn_reg, 0, XPU_E_INVALID_ARG, "op_support: null argument");
  if (!qnn_state.loaded || dev != 0) return xpu_fail(&qnn_reg, 0, XPU_E_INVALID_ARG, "op_support: no device %u", dev);
  xpu_op_query local;
  memset(&local, 0, sizeof local);
  memcpy(&local, q, q->struct_size < sizeof local ? q->struct_size : sizeof local);
  *verdict = qnn_op_query(&local, qnn_state.lib.target);
  return XPU_OK;
}

/* ---------------------------------------------------------------- contexts */

/* Context options: perf=burst|balanced|off, the HTP power vote (process-wide: the last context
 * that names one sets it); hvx_threads=N, the HVX threads of this context's HTP graphs. */
static const char *const ctx_options[] = {"perf", "hvx_threads", NULL};

static xpu_status context_create(uint32_t dev, const char *options, xpu_context *out) {
  if (!out) return xpu_fail(&qnn_reg, 0, XPU_E_INVALID_ARG, "context_create: null output");
  char oerr[256], v[32];
  if (xpu_opt_check(options, ctx_options, oerr, sizeof oerr) != 0)
    return xpu_fail(&qnn_reg, 0, XPU_E_INVALID_ARG, "context_create: %s", oerr);
  int perf = -1;
  if (xpu_opt_get(options, "perf", v, sizeof v) > 0 && (perf = qnn_perf_mode(v)) < 0)
    return xpu_fail(&qnn_reg, 0, XPU_E_INVALID_ARG, "context_create: perf=%s (want burst, balanced or off)", v);
  uint32_t hvx = 0;
  if (xpu_opt_get(options, "hvx_threads", v, sizeof v) > 0) {
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < 1 || n > 64)
      return xpu_fail(&qnn_reg, 0, XPU_E_INVALID_ARG, "context_create: hvx_threads=%s (want 1 to 64)", v);
    hvx = (uint32_t)n;
  }
  if (!qnn_state.loaded || dev != 0) return xpu_fail(&qnn_reg, 0, XPU_E_INVALID_ARG, "context_create: no device %u", dev);
  char err[512];
  pthread_mutex_lock(&qnn_state.mu);
  xpu_status st = qnn_state.started ? XPU_OK : qnn_lib_start(&qnn_state.lib, err, sizeof err);
  if (st == XPU_OK) qnn_state.started = 1;
  if (st == XPU_OK && perf >= 0) qnn_lib_power(&qnn_state.lib, perf);
  pthread_mutex_unlock(&qnn_state.mu);
  if (st != XPU_OK) return xpu_fail(&qnn_reg, 0, st, "context_create: %s", err);
  qctx *c = calloc(1, sizeof *c);
  if (!c) return xpu_fail(&qnn_reg, 0, XPU_E_OUT_OF_MEMORY, "context_create: out of memory");
  atomic_init(&c->children, 0);
  c->hvx_threads = hvx;
  *out = xpu_reg_add(&qnn_reg, T_CTX, c);
  if (!*out) {
    free(c);
    return xpu_fail(&qnn_reg, 0, XPU_E_OUT_OF_MEMORY, "context_create: out of memory");
  }
  return XPU_OK;
}

static xpu_status context_release(xpu_context h) {
  qctx *c = xpu_reg_get(&qnn_reg, h, T_CTX);
  if (!c) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "context_release: invalid context handle");
  if (atomic_load(&c->children))
    return xpu_fail(&qnn_reg, h, XPU_E_BAD_STATE, "context_release: %u buffers/executables/fences still live",
                    atomic_load(&c->children));
  if (!xpu_reg_remove(&qnn_reg, h, T_CTX)) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "context_release: raced");
  free(c);
  return XPU_OK;
}

/* ---------------------------------------------------------------- analyze */

xpu_status parse_ir(xpu_handle h, const void *ir, uint64_t size, xpu_ir_graph *g, const char *what) {
  char err[256];
  xpu_status st = xpu_ir_parse(ir, size, g, err, sizeof err);
  if (st != XPU_OK) return xpu_fail(&qnn_reg, h, st, "%s: %s", what, err);
  return XPU_OK;
}

static xpu_status graph_analyze(xpu_context ctx, const void *ir, uint64_t ir_size, xpu_node_verdict *out, uint32_t cap) {
  if (!xpu_reg_get(&qnn_reg, ctx, T_CTX)) return xpu_fail(&qnn_reg, ctx, XPU_E_INVALID_HANDLE, "graph_analyze: invalid context handle");
  xpu_ir_graph g;
  xpu_status st = parse_ir(ctx, ir, ir_size, &g, "graph_analyze");
  if (st != XPU_OK) return st;
  if (!out || cap < g.header->n_nodes)
    return xpu_fail(&qnn_reg, ctx, XPU_E_INVALID_ARG, "graph_analyze: room for %u verdicts, graph has %u nodes", cap,
                    g.header->n_nodes);
  for (uint32_t i = 0; i < g.header->n_nodes; i++) {
    xpu_node_verdict v;
    memset(&v, 0, sizeof v);
    v.verdict = qnn_node_check(&g, i, qnn_state.lib.target, &v.precision, v.reason, sizeof v.reason) ? XPU_VERDICT_YES
                                                                                                 : XPU_VERDICT_NO;
    if (out[i].struct_size == 0) out[i].struct_size = sizeof v;
    XPU_COPY_OUT(&out[i], v);
  }
  return XPU_OK;
}

/* ---------------------------------------------------------------- open */

static xpu_status last_error(xpu_handle h, char *buf, uint32_t cap, uint32_t *len) {
  return xpu_reg_last_error(&qnn_reg, h, buf, cap, len);
}

static xpu_status shutdown_plugin(void) {
  if (xpu_reg_count(&qnn_reg, 0)) return xpu_fail(&qnn_reg, 0, XPU_E_BAD_STATE, "shutdown: objects are still live");
  queue_stop(); /* every execution is released, so no submission is queued */
  pthread_mutex_lock(&qnn_state.mu);
  if (qnn_state.started) qnn_lib_stop(&qnn_state.lib);
  qnn_state.started = 0;
  pthread_mutex_unlock(&qnn_state.mu);
  xpu_reg_destroy(&qnn_reg);
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
    return xpu_fail(&qnn_reg, 0, XPU_E_INCOMPATIBLE, "open: host ABI %u, plugin ABI %u", host->abi_major, XPU_ABI_MAJOR);
  xpu_reg_set_log(&qnn_reg, host);
  const char *dir = host && host->struct_size >= offsetof(xpu_host_info, plugin_dir) + sizeof(char *) ? host->plugin_dir : NULL;
  if (ensure_loaded(dir) != XPU_OK) { /* opens with 0 devices; last_error(0) says why */
    xpu_fail(&qnn_reg, 0, qnn_state.load_status, "qnn: no device: %s", qnn_state.load_err);
    xpu_log(&qnn_reg, XPU_LOG_WARN, "qnn: no device: %s", qnn_state.load_err);
  }
  else if (qnn_state.lib.emulated)
    xpu_log(&qnn_reg, XPU_LOG_INFO, "qnn: using the emulated provider %s: results are not NPU results", qnn_state.lib.path);
  *out = &api;
  return XPU_OK;
}
