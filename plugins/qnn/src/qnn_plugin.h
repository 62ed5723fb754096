/*
 * qnn_plugin.h: the object model of libxpu-qnn.so shared by its ABI files: qnn_plugin.c
 * (probe, open, devices, contexts, analyze), qnn_buffer.c, qnn_exec.c (prepare, executable
 * cache, executions), qnn_fence.c.
 */
#ifndef XPU_QNN_PLUGIN_H
#define XPU_QNN_PLUGIN_H

#include <stdatomic.h>

#include "qnn_internal.h"
#include "xpu_sync.h"

#ifndef XPU_QNN_BUILD_ID
#define XPU_QNN_BUILD_ID "qnn-dev"
#endif

enum { T_CTX = 1, T_BUF, T_EXE, T_EXEC, T_FENCE };

/* the registry and the one backend library: the plugin's only process-wide state (qnn_plugin.c) */
extern xpu_registry qnn_reg;
typedef struct qnn_plugin_state {
  pthread_mutex_t mu;
  int loaded;     /* lib is usable */
  int started;    /* backend and device created */
  xpu_status load_status;
  char load_err[512];
  qnn_lib lib;
  pthread_mutex_t refs_mu; /* fence references (qnn_fence.c) */
  xpu_queue queue;         /* submissions, run in order by one worker thread (qnn_queue.c) */
} qnn_plugin_state;
extern qnn_plugin_state qnn_state;

/* rpcmem from libcdsprpc.so, loaded at run time (qnn_rpcmem.c) */
int qnn_rpcmem_available(void);
void *qnn_rpcmem_alloc(uint64_t size, int *fd);
void qnn_rpcmem_free(void *p);

typedef struct qctx {
  atomic_uint children;
  uint32_t hvx_threads; /* context option hvx_threads: the HTP graphs' NUM_HVX_THREADS (0: QNN's) */
} qctx;

typedef struct qbuf {
  xpu_context ctx;
  qctx *owner;
  uint8_t *ptr;
  uint64_t size;
  int owned;         /* malloc'ed by us */
  int rpcmem;        /* rpcmem_alloc'ed by us: fd is rpcmem_to_fd's (not ours to close), the HTP maps it */
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
  xpu_timeline tl; /* users: waiters and queued submissions (taken and dropped under qnn_state.refs_mu) */
} qfence;

/* devices and IR parsing (qnn_plugin.c) */
xpu_status parse_ir(xpu_handle h, const void *ir, uint64_t size, xpu_ir_graph *g, const char *what);
void device_name(char *buf, size_t cap);
int float_as_f16(void);
int host_import_zero_copy(void);

/* buffers (qnn_buffer.c) */
typedef struct {
  xpu_context ctx;
} const_user;
const void *const_bytes(void *user, uint64_t buffer, uint64_t offset, uint64_t size, char *err, size_t cap);
xpu_status buffer_alloc(xpu_context ctx, uint64_t size, uint32_t kind, xpu_buffer *out);
xpu_status buffer_import(xpu_context ctx, const xpu_import_desc *d, xpu_buffer *out);
xpu_status buffer_map(xpu_buffer h, void **out);
xpu_status buffer_unmap(xpu_buffer h);
xpu_status buffer_write(xpu_buffer h, uint64_t off, const void *src, uint64_t size);
xpu_status buffer_read(xpu_buffer h, uint64_t off, void *dst, uint64_t size);
xpu_status buffer_size(xpu_buffer h, uint64_t *out);
xpu_status buffer_release(xpu_buffer h);

/* prepare, cache, executions (qnn_exec.c) */
xpu_status graph_prepare(xpu_context ctx, const xpu_prepare_desc *d, xpu_executable *out);
xpu_status executable_serialize(xpu_executable h, void *dst, uint64_t cap, uint64_t *size);
xpu_status executable_release(xpu_executable h);
xpu_status execution_create(xpu_executable h, xpu_execution *out);
xpu_status execution_bind(xpu_execution h, uint32_t io, xpu_buffer bh, uint64_t offset);
xpu_status execution_run(xpu_execution h);
xpu_status execution_release(xpu_execution h);
xpu_status execution_submit(xpu_execution h, const xpu_fence_point *waits, uint32_t n_waits,
                            const xpu_fence_point *signal);

/* fences (qnn_fence.c) */
xpu_status fence_create(xpu_context ctx, uint64_t initial, xpu_fence *out);
xpu_status fence_wait(xpu_fence h, uint64_t value, int64_t timeout_ns);
xpu_status fence_value(xpu_fence h, uint64_t *out);
xpu_status fence_signal(xpu_fence h, uint64_t value);
xpu_status fence_release(xpu_fence h);
/* a counted reference to a live fence (NULL if the handle is not one), and its release */
qfence *fence_ref(xpu_fence h);
void fence_unref(qfence *f);
/* sets value (or, with fail != XPU_OK, poisons it) and drops a reference, atomically with
 * respect to fence_release */
void fence_set_unref(qfence *f, uint64_t value, xpu_status fail);

/* executions, shared with the queue (qnn_exec.c) */
/* pins every bound buffer of x (bufs[i], busy++) or fails without pinning any */
xpu_status exec_pin(xpu_execution h, qexec *x, qbuf **bufs, const char *what);
void exec_unpin(qbuf **bufs, uint32_t n);
/* graphExecute with pinned buffers */
xpu_status exec_pinned(xpu_execution h, qexec *x, qbuf **bufs, const char *what);

/* the submission queue (qnn_queue.c): one worker thread runs submissions in order */
xpu_status queue_submit(xpu_execution h, qexec *x, qbuf **bufs, const xpu_fence_point *waits, uint32_t n_waits,
                        qfence **wait_fences, qfence *signal, uint64_t signal_value);
/* stops and joins the worker (shutdown; the queue is empty when every object is released) */
void queue_stop(void);
/* the worker's job runner (qnn_state.queue) */
void queue_run(xpu_queue_item *item, const int *stop);

#endif /* XPU_QNN_PLUGIN_H */
