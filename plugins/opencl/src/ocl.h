/*
 * ocl.h: the OpenCL plugin's objects, shared by its C files.
 *
 * Object model: one ocl_device per OpenCL device (all platforms). The first xpu context on a
 * device creates its cl_context and builds (or loads from the disk cache) its one program; every
 * xpu context on that device shares both, so cl_events from one context can gate another's
 * work. Each xpu context has its own in-order queue and its own cl_kernel objects, because
 * clSetKernelArg on a shared kernel would race.
 */
#ifndef XPU_OPENCL_OCL_H
#define XPU_OPENCL_OCL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "clapi.h"
#include "xpu_backend.h"
#include "xpu_ir.h"
#include "xpu_plugin.h"

#define OCL_PLUGIN_VERSION "0.1.0"

enum { T_CTX = 1, T_BUF, T_EXE, T_EXEC, T_FENCE };

/* kernels of kernels.cl, in the order of ocl_kernel_names */
enum { K_ELTWISE, K_COPY, K_NORM, K_SOFTMAX, K_ROPE, K_ATTENTION, K_GET_ROWS, K_QUANTIZE,
       K_GEMM_F32, K_GEMM_ANY, K_GEMM_BLK_F32_4, K_GEMM_BLK_F32_1, K_GEMM_BLK_ANY_4,
       K_GEMM_BLK_ANY_1, K_GEMM_Q_4, K_GEMM_Q_1, K_ATTENTION_ROW, K_ELTWISE_F32, K_NORM_ROW,
       K_SOFTMAX_ROW, K_COUNT };
extern const char *const ocl_kernel_names[K_COUNT];

typedef struct ocl_device {
  cl_platform_id platform;
  cl_device_id id;
  xpu_device_info info;
  char platform_version[128];
  uint64_t max_wg;        /* CL_DEVICE_MAX_WORK_GROUP_SIZE */
  uint64_t max_item[3];   /* CL_DEVICE_MAX_WORK_ITEM_SIZES */
  uint64_t local_mem;     /* CL_DEVICE_LOCAL_MEM_SIZE */
  uint64_t max_alloc;     /* CL_DEVICE_MAX_MEM_ALLOC_SIZE */
  int correct_div;        /* -cl-fp32-correctly-rounded-divide-sqrt is allowed */
  uint32_t vec_width;     /* float vector width of the MATMUL kernels: 4, 8 or 16 */
  /* created by the first context, under plugin.mu; freed at shutdown */
  cl_context clctx;
  cl_program prog;
  double build_ms;        /* how long the program took to build or load */
  int from_cache;         /* 1: loaded from the disk cache */
} ocl_device;

typedef struct ocl_plugin {
  xpu_registry reg;
  pthread_mutex_t mu;
  int loaded;     /* 1: cl resolved and devices listed; -1: failed (load_err says why) */
  char load_err[256];
  clapi cl;
  ocl_device *devs;
  uint32_t ndev;
} ocl_plugin;

/* The plugin's state: the registry plus what the registry's objects point into. */
extern ocl_plugin P;

typedef struct ocl_ctx {
  ocl_device *dev;
  cl_command_queue q; /* host transfers and maps; kernels go to each execution's queue */
  cl_kernel k[K_COUNT];
  size_t kwg[K_COUNT]; /* CL_KERNEL_WORK_GROUP_SIZE */
  size_t kpref[K_COUNT]; /* CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE: SIMD width or warp */
  size_t wg1d;         /* local size of 1-d kernels */
  size_t gemm_side;    /* GEMM work-group is gemm_side x gemm_side */
  int gpu_kernels;     /* 1: work-groups sharing local memory (tiled MATMUL, attention per
                        * group); 0: independent items (register-blocked MATMUL, attention
                        * per item), which is what CPU devices run fast */
  pthread_mutex_t mu;  /* serialises kernel arguments and enqueues */
  atomic_uint children;
} ocl_ctx;

/* One submission: its final event and the status its kernels reported. Shared by the
 * execution, the buffers it used and the fence points it signals, so refcounted. */
typedef struct ocl_sub {
  atomic_int refs;
  cl_event ev;
  int32_t errflag; /* read back from the device: 0, or the failing GET_ROWS node + 1 */
} ocl_sub;

typedef struct ocl_buf {
  ocl_ctx *ctx;
  cl_mem mem;
  uint64_t size;
  uint32_t kind;
  int imported;
  void *fd_map;   /* XPU_IMPORT_FD: our mapping of the fd, unmapped at release */
  size_t fd_len;
  void *mapped;
  pthread_mutex_t mu;
  ocl_sub *last; /* the latest submission that used it */
} ocl_buf;

typedef struct ocl_exe {
  ocl_ctx *ctx;
  void *blob; /* our copy of the IR */
  xpu_ir_graph g;
  cl_mem *cmem;     /* per tensor: retained const buffer, else NULL */
  uint64_t *voff;   /* per tensor: offset of an intermediate value in the scratch buffer */
  int32_t *out_io;  /* per tensor: io index when it is a graph output, else -1 */
  uint64_t scratch;
  int uses_flag;    /* has GET_ROWS: needs the device error flag */
  atomic_uint children;
} ocl_exe;

typedef struct ocl_exec {
  ocl_exe *exe;
  cl_command_queue q;
  cl_mem scratch;
  cl_mem flag;
  uint32_t nio;
  xpu_buffer *bind;
  uint64_t *bind_off;
  pthread_mutex_t mu;
  ocl_sub *last;
} ocl_exec;

typedef struct ocl_point {
  uint64_t value;
  ocl_sub *sub;     /* a submission's signal, or NULL for a user event */
  cl_event user;    /* completed by fence_signal */
} ocl_point;

typedef struct ocl_fence {
  ocl_ctx *ctx;
  pthread_mutex_t mu;
  uint64_t ok_value;   /* reached by a successful submission or a host signal */
  uint64_t reached;    /* reached by anything, failed submissions included */
  xpu_status fail;     /* status of the failed submission that raised reached past ok_value */
  char fail_msg[256];
  ocl_point *pts;
  uint32_t npts, cap;
} ocl_fence;

/* ---- helpers shared by the files */
xpu_status ocl_clfail(xpu_handle h, cl_int err, const char *what);
ocl_sub *ocl_sub_new(void);
void ocl_sub_ref(ocl_sub *s);
void ocl_sub_unref(ocl_sub *s);
/* 1 done (status in *st), 0 pending */
int ocl_sub_done(ocl_sub *s, xpu_status *st, char *msg, size_t cap);
xpu_status ocl_status_of(cl_int err);

/* buffer.c */
xpu_status ocl_buffer_alloc(xpu_context ctx, uint64_t size, uint32_t kind, xpu_buffer *out);
xpu_status ocl_buffer_import(xpu_context ctx, const xpu_import_desc *desc, xpu_buffer *out);
xpu_status ocl_buffer_map(xpu_buffer buf, void **out);
xpu_status ocl_buffer_unmap(xpu_buffer buf);
xpu_status ocl_buffer_write(xpu_buffer buf, uint64_t offset, const void *src, uint64_t size);
xpu_status ocl_buffer_read(xpu_buffer buf, uint64_t offset, void *dst, uint64_t size);
xpu_status ocl_buffer_size(xpu_buffer buf, uint64_t *out);
xpu_status ocl_buffer_release(xpu_buffer buf);

/* program.c: builds or loads the device program (plugin.mu held) */
xpu_status ocl_program_ensure(ocl_device *d, char *err, size_t cap);

/* graph.c */
xpu_status ocl_graph_analyze(xpu_context ctx, const void *ir, uint64_t ir_size,
                             xpu_node_verdict *out, uint32_t cap);
xpu_status ocl_graph_prepare(xpu_context ctx, const xpu_prepare_desc *desc, xpu_executable *out);
xpu_status ocl_executable_serialize(xpu_executable exe, void *dst, uint64_t cap, uint64_t *size);
xpu_status ocl_executable_release(xpu_executable exe);
xpu_status ocl_execution_create(xpu_executable exe, xpu_execution *out);
xpu_status ocl_execution_bind(xpu_execution ex, uint32_t io, xpu_buffer buf, uint64_t offset);
xpu_status ocl_execution_submit(xpu_execution ex, const xpu_fence_point *waits, uint32_t n_waits,
                                const xpu_fence_point *signal);
xpu_status ocl_execution_run(xpu_execution ex);
xpu_status ocl_execution_release(xpu_execution ex);

/* fence.c */
xpu_status ocl_fence_create(xpu_context ctx, uint64_t initial, xpu_fence *out);
xpu_status ocl_fence_wait(xpu_fence fence, uint64_t value, int64_t timeout_ns);
xpu_status ocl_fence_value(xpu_fence fence, uint64_t *out);
xpu_status ocl_fence_signal(xpu_fence fence, uint64_t value);
xpu_status ocl_fence_release(xpu_fence fence);
/* Adds to evs (cap entries, *n used) the events a submission must wait for to see fence >=
 * value. ctx_h names the execution for errors. */
xpu_status ocl_fence_wait_events(xpu_handle ex_h, const xpu_fence_point *w, cl_event *evs,
                                 uint32_t *n, uint32_t cap);
/* Records that sub reaches value on fence. */
xpu_status ocl_fence_add_point(xpu_handle ex_h, const xpu_fence_point *sig, ocl_sub *sub);

#endif
