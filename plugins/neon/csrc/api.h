/*
 * api.h: the entry points of the function table (each defined in the file of its object kind)
 * and the few helpers those files share. Internal to the plugin: nothing here is exported.
 */
#ifndef NEON_API_H
#define NEON_API_H

#include "neon.h"

xpu_status nv_api_get_info(xpu_plugin_info *out);
xpu_status nv_api_last_error(xpu_handle h, char *buf, uint32_t cap, uint32_t *len);
xpu_status nv_api_device_count(uint32_t *out);
xpu_status nv_api_device_info(uint32_t device, xpu_device_info *out);
xpu_status nv_api_op_support(uint32_t device, const xpu_op_query *q, uint32_t *verdict);
xpu_status nv_api_context_create(uint32_t device, const char *options, xpu_context *out);
xpu_status nv_api_context_release(xpu_context h);
xpu_status nv_api_shutdown(void);
xpu_status nv_api_buffer_alloc(xpu_context ch, uint64_t size, uint32_t kind, xpu_buffer *out);
xpu_status nv_api_buffer_import(xpu_context ch, const xpu_import_desc *d, xpu_buffer *out);
xpu_status nv_api_buffer_map(xpu_buffer h, void **out);
xpu_status nv_api_buffer_unmap(xpu_buffer h);
xpu_status nv_api_buffer_write(xpu_buffer h, uint64_t off, const void *src, uint64_t size);
xpu_status nv_api_buffer_read(xpu_buffer h, uint64_t off, void *dst, uint64_t size);
xpu_status nv_api_buffer_size(xpu_buffer h, uint64_t *out);
xpu_status nv_api_buffer_release(xpu_buffer h);
xpu_status nv_api_graph_analyze(xpu_context ch, const void *ir, uint64_t ir_size, xpu_node_verdict *out,
                                    uint32_t cap);
xpu_status nv_api_graph_prepare(xpu_context ch, const xpu_prepare_desc *d, xpu_executable *out);
xpu_status nv_api_executable_serialize(xpu_executable h, void *dst, uint64_t cap, uint64_t *size);
xpu_status nv_api_executable_release(xpu_executable h);
xpu_status nv_api_execution_create(xpu_executable eh, xpu_execution *out);
xpu_status nv_api_execution_bind(xpu_execution h, uint32_t io, xpu_buffer bh, uint64_t offset);
xpu_status nv_api_execution_run(xpu_execution h);
xpu_status nv_api_execution_release(xpu_execution h);
xpu_status nv_api_fence_create(xpu_context ch, uint64_t initial, xpu_fence *out);
xpu_status nv_api_fence_wait(xpu_fence h, uint64_t value, int64_t timeout_ns);
xpu_status nv_api_fence_value(xpu_fence h, uint64_t *out);
xpu_status nv_api_fence_signal(xpu_fence h, uint64_t value);
xpu_status nv_api_fence_release(xpu_fence h);
xpu_status nv_api_execution_submit(xpu_execution h, const xpu_fence_point *waits, uint32_t n_waits,
                                       const xpu_fence_point *signal);

/* probe.c (built for the baseline ISA) */
int nv_cpu_count(void);
void nv_describe(char *out, size_t cap);
/* plugin.c: open once probe.c made sure this build runs here */
xpu_status nv_open(const xpu_host_info *host, const xpu_api **out);
/* executable.c */
void nv_executable_free(nv_executable *e);
void nv_execution_free(nv_execution *x);
/* Moves an idle, fully bound execution to state (EX_QUEUED, EX_RUNNING); BAD_STATE otherwise. */
xpu_status nv_exec_begin(nv_execution *x, int state, const char *what);
/* Back to idle: the bound buffers are no longer in flight; wakes waiters. */
void nv_exec_finish(nv_execution *x);
/* fence.c */
void nv_run_job(xpu_queue_item *item, const int *stop); /* the context queue's job runner */
void nv_fence_free(nv_fence *f);

#endif /* NEON_API_H */
