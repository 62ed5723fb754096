/*
 * plugin.c: the two exports (probe, open), the plugin-wide entry points (info, last_error,
 * devices, op_support), contexts, shutdown and the function table. Buffers are in buffer.c,
 * executables and executions in executable.c, fences and the submit queue in fence.c; graph
 * checks and memory planning in graph.c, the node loop in exec.c, kernels in k_*.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "neon.h"

xpu_registry nv_reg = XPU_REGISTRY_INIT;

#ifndef NV_VARIANT
#define NV_VARIANT "portable"
#endif

/* ---------------------------------------------------------------- plugin */

xpu_status nv_api_get_info(xpu_plugin_info *out) {
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

xpu_status nv_api_last_error(xpu_handle h, char *buf, uint32_t cap, uint32_t *len) {
  return xpu_reg_last_error(&nv_reg, h, buf, cap, len);
}

xpu_status nv_api_device_count(uint32_t *out) {
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

xpu_status nv_api_device_info(uint32_t device, xpu_device_info *out) {
  if (!out) return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "device_info: null out");
  if (device != 0) return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "device_info: no device %u (1 device)", device);
  xpu_device_info d;
  memset(&d, 0, sizeof d);
  d.kind = XPU_DEVICE_CPU;
  d.caps = device_caps();
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  d.memory_bytes = (pages > 0 && psz > 0) ? (uint64_t)pages * (uint64_t)psz : 0;
  d.compute_units = (uint32_t)nv_cpu_count();
  nv_describe(d.name, sizeof d.name);
  XPU_STRCPY(d.vendor, "xpu");
  XPU_STRCPY(d.driver_version, NV_VARIANT);
  XPU_COPY_OUT(out, d);
  return XPU_OK;
}

xpu_status nv_api_op_support(uint32_t device, const xpu_op_query *q, uint32_t *verdict) {
  if (!q || !verdict) return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "op_support: null argument");
  if (device != 0) return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "op_support: no device %u", device);
  if (q->struct_size < offsetof(xpu_op_query, rank) + sizeof(uint32_t))
    return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "op_support: query struct_size %u too small", q->struct_size);
  *verdict = nv_op_support(q);
  return XPU_OK;
}

/* ---------------------------------------------------------------- contexts */

static void context_free(nv_context *c) {
  xpu_queue_stop(&c->q);
  nv_pool_destroy(c->pool);
  xpu_queue_destroy(&c->q);
  pthread_mutex_destroy(&c->pkmu);
  nv_work_free(c);
  pthread_mutex_destroy(&c->wkmu);
  free(c);
}

xpu_status nv_api_context_create(uint32_t device, const char *options, xpu_context *out) {
  if (!out) return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "context_create: null out");
  *out = 0;
  if (device != 0) return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "context_create: no device %u", device);
  static const char *const known[] = {"cpus", "int8dot", "repack", NULL};
  char v[1024];
  if (xpu_opt_check(options, known, v, sizeof v) != 0)
    return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "context_create: %s", v);
  nv_cpuset cpus = {0};
  int rc = xpu_opt_get(options, "cpus", v, sizeof v);
  if (rc < 0 || (rc > 0 && nv_parse_cpus(v, &cpus) != 0))
    return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "context_create: bad cpus option (want e.g. cpus=0,1 or cpus=0-3)");
  if (rc > 0) {
    int off = nv_cpus_offline(&cpus);
    if (off >= 0)
      return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "context_create: cpus option names CPU %d, which is not online (%ld online)",
                      off, sysconf(_SC_NPROCESSORS_ONLN));
  }
  int threads = cpus.n > 0 ? cpus.n : nv_cpu_count();
  rc = xpu_opt_get(options, "threads", v, sizeof v);
  if (rc != 0) {
    char *end;
    long t = rc > 0 ? strtol(v, &end, 10) : -1;
    if (rc < 0 || end == v || *end || t < 1 || t > 1024)
      return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "context_create: bad threads option (want 1..1024)");
    threads = (int)t;
  }
  int int8dot = 1;
  rc = xpu_opt_get(options, "int8dot", v, sizeof v);
  if (rc != 0) {
    if (rc < 0 || (strcmp(v, "0") != 0 && strcmp(v, "1") != 0))
      return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "context_create: bad int8dot option (want 0 or 1)");
    int8dot = v[0] == '1';
  }
  int repack = 1;
  rc = xpu_opt_get(options, "repack", v, sizeof v);
  if (rc != 0) {
    if (rc < 0 || (strcmp(v, "0") != 0 && strcmp(v, "1") != 0))
      return xpu_fail(&nv_reg, 0, XPU_E_INVALID_ARG, "context_create: bad repack option (want 0 or 1)");
    repack = v[0] == '1';
  }
  nv_context *c = (nv_context *)calloc(1, sizeof *c);
  if (!c) return xpu_fail(&nv_reg, 0, XPU_E_OUT_OF_MEMORY, "context_create: out of memory");
  c->int8dot = int8dot;
  c->repack = repack;
  c->device = device;
  c->cpus = cpus;
  c->threads = threads;
  xpu_queue_init(&c->q, nv_run_job);
  pthread_mutex_init(&c->pkmu, NULL);
  pthread_mutex_init(&c->wkmu, NULL);
  char err[256];
  c->pool = nv_pool_create(threads, &cpus, err, sizeof err);
  if (!c->pool) {
    xpu_queue_destroy(&c->q);
    pthread_mutex_destroy(&c->pkmu);
    pthread_mutex_destroy(&c->wkmu);
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

xpu_status nv_api_context_release(xpu_context h) {
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

xpu_status nv_api_shutdown(void) {
  /* stop every queue first, so that no job still runs while objects are freed */
  for (;;) {
    nv_context *c = NULL;
    pthread_mutex_lock(&nv_reg.mu);
    for (uint32_t i = 1; i < nv_reg.cap && !c; i++) {
      xpu_slot *s = &nv_reg.slots[i];
      if (s->obj && s->type == OBJ_CONTEXT && !xpu_queue_stopping(&((nv_context *)s->obj)->q))
        c = (nv_context *)s->obj;
    }
    pthread_mutex_unlock(&nv_reg.mu);
    if (!c) break;
    xpu_queue_stop(&c->q);
  }
  void *o;
  while ((o = take_one(OBJ_EXECUTION))) nv_execution_free((nv_execution *)o);
  while ((o = take_one(OBJ_EXECUTABLE))) nv_executable_free((nv_executable *)o);
  while ((o = take_one(OBJ_BUFFER))) nv_buffer_unref((nv_buffer *)o);
  while ((o = take_one(OBJ_FENCE))) nv_fence_free((nv_fence *)o);
  while ((o = take_one(OBJ_CONTEXT))) context_free((nv_context *)o);
  xpu_reg_destroy(&nv_reg);
  return XPU_OK;
}

static const xpu_api nv_api = {
    .struct_size = sizeof(xpu_api),
    .abi_major = XPU_ABI_MAJOR,
    .abi_minor = XPU_ABI_MINOR,
    .get_info = nv_api_get_info,
    .shutdown = nv_api_shutdown,
    .last_error = nv_api_last_error,
    .device_count = nv_api_device_count,
    .device_info = nv_api_device_info,
    .op_support = nv_api_op_support,
    .context_create = nv_api_context_create,
    .context_release = nv_api_context_release,
    .buffer_alloc = nv_api_buffer_alloc,
    .buffer_import = nv_api_buffer_import,
    .buffer_map = nv_api_buffer_map,
    .buffer_unmap = nv_api_buffer_unmap,
    .buffer_write = nv_api_buffer_write,
    .buffer_read = nv_api_buffer_read,
    .buffer_size = nv_api_buffer_size,
    .buffer_release = nv_api_buffer_release,
    .graph_analyze = nv_api_graph_analyze,
    .graph_prepare = nv_api_graph_prepare,
    .executable_serialize = nv_api_executable_serialize,
    .executable_release = nv_api_executable_release,
    .execution_create = nv_api_execution_create,
    .execution_bind = nv_api_execution_bind,
    .execution_submit = nv_api_execution_submit,
    .execution_run = nv_api_execution_run,
    .execution_release = nv_api_execution_release,
    .fence_create = nv_api_fence_create,
    .fence_wait = nv_api_fence_wait,
    .fence_value = nv_api_fence_value,
    .fence_signal = nv_api_fence_signal,
    .fence_release = nv_api_fence_release,
};

xpu_status nv_open(const xpu_host_info *host, const xpu_api **out) {
  if (!out) return XPU_E_INVALID_ARG;
  if (host && host->struct_size >= offsetof(xpu_host_info, abi_minor) && host->abi_major != XPU_ABI_MAJOR)
    return xpu_fail(&nv_reg, 0, XPU_E_INCOMPATIBLE, "open: host ABI major %u, plugin %u", host->abi_major,
                    XPU_ABI_MAJOR);
  xpu_reg_set_log(&nv_reg, host);
  *out = &nv_api;
  xpu_log(&nv_reg, XPU_LOG_INFO, "neon plugin open (%s build)", NV_VARIANT);
  return XPU_OK;
}
