/*
 * xpu_backend.h: the xpu backend ABI, version 1.0.
 *
 * A backend is a shared library that exports exactly two symbols, xpu_plugin_probe and
 * xpu_plugin_open. Everything else is reached through the function table that open returns.
 *
 * Fixed rules (see ../README.md, "Writing a plugin"):
 *  - Plain C11, fixed-width types. No struct is passed or returned by value.
 *  - Every struct that crosses the boundary starts with uint32_t struct_size. The caller sets it
 *    to the size it knows; the callee never reads or writes past min(its size, struct_size).
 *  - The function table only grows at its end. The host never calls an entry that lies past the
 *    struct_size the plugin reported.
 *  - Objects are uint64_t handles, never pointers. 0 is never a valid handle. A plugin must
 *    answer a stale or foreign handle with XPU_E_INVALID_HANDLE, never with undefined behaviour.
 *  - Every call returns xpu_status. last_error(handle) returns the message of the last failure
 *    on that handle (0 = the plugin as a whole); it is thread-safe.
 *  - probe is cheap: it may dlopen a vendor library to check it exists, but initialises no SDK.
 *    A plugin whose vendor library is missing still loads, and probes 0 with the reason.
 *  - No callbacks on hot paths; the only callback is the optional log sink given at open.
 *  - shutdown joins every plugin thread. The host never dlcloses a plugin.
 *
 * The graph that crosses the boundary is the binary IR described in xpu_ir.h; op semantics are
 * in OPS.md.
 */
#ifndef XPU_BACKEND_H
#define XPU_BACKEND_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define XPU_ABI_MAJOR 1u /* a mismatch makes the loader refuse the plugin */
#define XPU_ABI_MINOR 1u /* additive changes only; 1: xpu_device_info's declared peaks */
#define XPU_OPSET_VERSION 5u /* v2: K-quant dtypes, ATTENTION mask; v3: int8 MATMUL, SHADOW_MATMUL, SPARSE_FFN; v4: ATTENTION on a KV head range; v5: TANH, ATTENTION soft-cap, sliding window, Q8_0/Q4_0 K/V (abi/OPS.md) */

#if defined(_WIN32)
#define XPU_EXPORT __declspec(dllexport)
#else
#define XPU_EXPORT __attribute__((visibility("default")))
#endif

/* ---------------------------------------------------------------- status codes */
typedef int32_t xpu_status;
enum {
  XPU_OK = 0,
  XPU_E_UNSUPPORTED = -1,    /* capability absent: not a failure (conformance: "unsupported") */
  XPU_E_INVALID_ARG = -2,    /* a bad argument: null pointer, wrong size, out-of-range index */
  XPU_E_INVALID_HANDLE = -3, /* unknown, released or foreign handle */
  XPU_E_BAD_STATE = -4,      /* lifecycle misuse: run before prepare, release while in flight */
  XPU_E_OUT_OF_MEMORY = -5,
  XPU_E_INCOMPATIBLE = -6,   /* ABI, op-set, IR, SDK or cached-artifact version mismatch */
  XPU_E_MISSING_DEP = -7,    /* vendor library or driver not found */
  XPU_E_DEVICE_LOST = -8,
  XPU_E_TIMEOUT = -9,
  XPU_E_INTERNAL = -10,
};

/* ---------------------------------------------------------------- handles */
typedef uint64_t xpu_handle;
typedef uint64_t xpu_context;
typedef uint64_t xpu_buffer;
typedef uint64_t xpu_executable;
typedef uint64_t xpu_execution;
typedef uint64_t xpu_fence;

/* ---------------------------------------------------------------- data types (also in IR) */
enum {
  XPU_DT_INVALID = 0,
  XPU_DT_F32 = 1,
  XPU_DT_F16 = 2,  /* IEEE binary16 */
  XPU_DT_BF16 = 3,
  XPU_DT_I32 = 4,
  XPU_DT_I8 = 5,   /* per-tensor symmetric int8; the scale is an op attribute */
  XPU_DT_Q8_0 = 6, /* GGUF block: f16 d; int8 q[32]          (34 bytes per 32 values) */
  XPU_DT_Q4_0 = 7, /* GGUF block: f16 d; uint8 qs[16] nibbles (18 bytes per 32 values) */
  /* op set v2: GGUF K-quant super-blocks of 256 values (abi/OPS.md "K-quants") */
  XPU_DT_Q4_K = 8,  /* f16 d, f16 dmin, u8 scales[12], u8 qs[128]          (144 bytes) */
  XPU_DT_Q5_K = 9,  /* f16 d, f16 dmin, u8 scales[12], u8 qh[32], qs[128]  (176 bytes) */
  XPU_DT_Q6_K = 10, /* u8 ql[128], u8 qh[64], i8 scales[16], f16 d         (210 bytes) */
  XPU_DT_Q2_K = 11, /* u8 scales[16], u8 qs[64], f16 d, f16 dmin           (84 bytes)  */
  XPU_DT_Q3_K = 12, /* u8 hmask[32], u8 qs[64], u8 scales[12], f16 d       (110 bytes) */
  XPU_DT_COUNT = 13,
};

/* ---------------------------------------------------------------- probe and open */
typedef struct xpu_probe_result {
  uint32_t struct_size;
  uint32_t abi_major; /* the plugin's XPU_ABI_MAJOR */
  uint32_t abi_minor;
  int32_t score;      /* 0 = cannot run here (reason says why); higher = preferred */
  char name[32];      /* backend name, e.g. "neon": the loader keeps the best score per name */
  char reason[256];   /* why the score is what it is; required when score == 0 */
} xpu_probe_result;

typedef enum {
  XPU_LOG_DEBUG = 0,
  XPU_LOG_INFO = 1,
  XPU_LOG_WARN = 2,
  XPU_LOG_ERROR = 3,
} xpu_log_level;

typedef void (*xpu_log_fn)(void *user, int32_t level, const char *msg);

typedef struct xpu_host_info {
  uint32_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  uint32_t reserved;
  xpu_log_fn log;         /* optional: may be NULL. Called from any plugin thread. */
  void *log_user;
  const char *plugin_dir; /* folder of the plugin file, so the plugin finds its SDK beside it */
} xpu_host_info;

typedef struct xpu_plugin_info {
  uint32_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  uint32_t opset_min; /* op-set versions the plugin understands */
  uint32_t opset_max;
  uint32_t ir_version; /* highest graph IR version it reads */
  char name[32];
  char vendor[64];
  char version[32];     /* semver of the plugin */
  char build_id[64];    /* changes with every build that can change results: a cache key */
  char sdk_version[64]; /* vendor SDK or driver version, "" if none */
} xpu_plugin_info;

/* ---------------------------------------------------------------- devices */
enum {
  XPU_DEVICE_CPU = 0,
  XPU_DEVICE_GPU = 1,
  XPU_DEVICE_NPU = 2,
  XPU_DEVICE_ACCEL = 3,
};

/* capability bits: honest, the conformance suite checks what they claim */
#define XPU_CAP_ASYNC (1ull << 0)             /* execution_submit does not block */
#define XPU_CAP_IMPORT_HOST (1ull << 1)       /* buffer_import of host memory, zero-copy */
#define XPU_CAP_IMPORT_FD (1ull << 2)         /* buffer_import of an fd (memfd, dma-buf) */
#define XPU_CAP_UNIFIED_MEMORY (1ull << 3)    /* device and host share physical memory */
#define XPU_CAP_STATIC_SHAPES (1ull << 4)     /* shapes are fixed at prepare (NPU-like) */
#define XPU_CAP_SERIALIZE (1ull << 5)         /* executable_serialize + prepare from cache */
#define XPU_CAP_FP16 (1ull << 6)              /* native half-precision arithmetic */
#define XPU_CAP_INT8 (1ull << 7)              /* native int8 arithmetic (dot products, W8A8) */
#define XPU_CAP_CONCURRENT (1ull << 8)        /* two executions may run at the same time */
#define XPU_CAP_HOST_VISIBLE (1ull << 9)      /* buffer_map works on allocated buffers */
#define XPU_CAP_EMULATED (1ull << 10)         /* results come from an emulator, not the hardware */

typedef struct xpu_device_info {
  uint32_t struct_size;
  uint32_t kind; /* XPU_DEVICE_* */
  uint64_t caps; /* XPU_CAP_* */
  uint64_t memory_bytes; /* 0 = unknown */
  uint32_t compute_units; /* cores, CUs, ...; 0 = unknown */
  uint32_t reserved;
  char name[128];
  char vendor[64];
  char driver_version[64];
  /* ABI 1.1, optional: the device's declared peaks, 0 = unknown (a plugin built against 1.0
   * never writes them: struct_size stops before them). `xpu conform --perf` prints what each op
   * achieves beside them; for a CPU without a declared bandwidth it measures the machine's. */
  uint64_t peak_read_bytes_per_s; /* memory read bandwidth weights stream at */
  uint64_t peak_flops_f32;        /* floating-point operations per second, a multiply-add = 2 */
  uint64_t peak_flops_f16;
  uint64_t peak_ops_int8;         /* int8 operations per second, a multiply-add = 2 */
} xpu_device_info;

/* ---------------------------------------------------------------- capability */
typedef struct xpu_op_query {
  uint32_t struct_size;
  uint32_t op;             /* XPU_OP_* (xpu_ir.h) */
  uint32_t dtype_in;       /* the first input's dtype */
  uint32_t dtype_weight;   /* second input's dtype (MATMUL b, GET_ROWS table); 0 = n/a */
  uint32_t dtype_out;
  uint32_t rank;           /* of the output */
} xpu_op_query;

enum {
  XPU_VERDICT_NO = 0,
  XPU_VERDICT_YES = 1,
  XPU_VERDICT_MAYBE = 2, /* op_support only: graph_analyze decides */
};

/* precision a node actually runs at (graph_analyze; may be lower than its dtype) */
enum {
  XPU_PREC_DEFAULT = 0, /* as the dtypes say */
  XPU_PREC_F32 = 1,
  XPU_PREC_F16 = 2,
  XPU_PREC_BF16 = 3,
  XPU_PREC_INT8 = 4,
  XPU_PREC_INT4 = 5,
};

typedef struct xpu_node_verdict {
  uint32_t struct_size;
  uint32_t verdict;   /* XPU_VERDICT_YES or _NO: graph_analyze never answers MAYBE */
  uint32_t precision; /* XPU_PREC_* */
  uint32_t reserved;
  char reason[128];   /* required when verdict is NO */
} xpu_node_verdict;

/* ---------------------------------------------------------------- buffers */
enum {
  XPU_BUFFER_DEVICE = 0,       /* device-local: reach it with buffer_write/read */
  XPU_BUFFER_HOST_VISIBLE = 1, /* buffer_map gives a pointer to the bytes */
};

enum {
  XPU_IMPORT_HOST = 1, /* host_ptr: the host keeps ownership; it outlives the buffer */
  XPU_IMPORT_FD = 2,   /* fd: the plugin dups it if it keeps it; offset into the fd */
};

typedef struct xpu_import_desc {
  uint32_t struct_size;
  uint32_t kind; /* XPU_IMPORT_* */
  void *host_ptr;
  int64_t fd;
  uint64_t offset; /* the buffer starts offset bytes into host_ptr or into the fd */
  uint64_t size;
} xpu_import_desc;

/* ---------------------------------------------------------------- prepare */
typedef struct xpu_prepare_desc {
  uint32_t struct_size;
  uint32_t reserved;
  const void *ir; /* xpu_ir.h blob; constants reference buffers of the same context */
  uint64_t ir_size;
  const char *options; /* "key=value;key=value", may be NULL */
  const void *cache;   /* an executable_serialize blob from an earlier run, or NULL */
  uint64_t cache_size;
} xpu_prepare_desc;

/* ---------------------------------------------------------------- fences */
typedef struct xpu_fence_point {
  xpu_fence fence;
  uint64_t value; /* timeline value: wait until fence >= value / signal fence := value */
} xpu_fence_point;

/* ---------------------------------------------------------------- function table */
typedef struct xpu_api {
  uint32_t struct_size; /* the host calls no entry past this */
  uint32_t abi_major;
  uint32_t abi_minor;
  uint32_t reserved;

  xpu_status (*get_info)(xpu_plugin_info *out);
  xpu_status (*shutdown)(void);
  /* copies the message (NUL-terminated, truncated to cap) of the last failure on handle;
   * *len (may be NULL) receives the full length without the NUL. */
  xpu_status (*last_error)(xpu_handle handle, char *buf, uint32_t cap, uint32_t *len);

  xpu_status (*device_count)(uint32_t *out);
  xpu_status (*device_info)(uint32_t device, xpu_device_info *out);
  /* static answer: YES, NO or MAYBE for the described op on that device */
  xpu_status (*op_support)(uint32_t device, const xpu_op_query *query, uint32_t *verdict);

  /* options: "key=value;..." (e.g. "threads=2;cpus=0,1"), may be NULL */
  xpu_status (*context_create)(uint32_t device, const char *options, xpu_context *out);
  xpu_status (*context_release)(xpu_context ctx); /* BAD_STATE while children live */

  xpu_status (*buffer_alloc)(xpu_context ctx, uint64_t size, uint32_t kind, xpu_buffer *out);
  xpu_status (*buffer_import)(xpu_context ctx, const xpu_import_desc *desc, xpu_buffer *out);
  xpu_status (*buffer_map)(xpu_buffer buf, void **out); /* host-visible and imported buffers */
  xpu_status (*buffer_unmap)(xpu_buffer buf);
  xpu_status (*buffer_write)(xpu_buffer buf, uint64_t offset, const void *src, uint64_t size);
  xpu_status (*buffer_read)(xpu_buffer buf, uint64_t offset, void *dst, uint64_t size);
  xpu_status (*buffer_size)(xpu_buffer buf, uint64_t *out);
  /* BAD_STATE while an execution that binds it is in flight (submitted, not yet complete);
   * a buffer bound to an idle execution may be released, and that execution then fails to
   * run until the io is bound again. Hosts release executions before their buffers. */
  xpu_status (*buffer_release)(xpu_buffer buf);

  /* authoritative: one verdict per node (out has cap entries, cap >= node count) */
  xpu_status (*graph_analyze)(xpu_context ctx, const void *ir, uint64_t ir_size,
                              xpu_node_verdict *out, uint32_t cap);
  /* UNSUPPORTED if a node is refused (graph_analyze says which) */
  xpu_status (*graph_prepare)(xpu_context ctx, const xpu_prepare_desc *desc, xpu_executable *out);
  /* dst NULL: *size receives the size needed. UNSUPPORTED without XPU_CAP_SERIALIZE. */
  xpu_status (*executable_serialize)(xpu_executable exe, void *dst, uint64_t cap, uint64_t *size);
  xpu_status (*executable_release)(xpu_executable exe);

  xpu_status (*execution_create)(xpu_executable exe, xpu_execution *out);
  /* io: graph inputs first (0..n_inputs-1), then outputs. The tensor occupies
   * [offset, offset + nbytes) of buf; INVALID_ARG if that does not fit. */
  xpu_status (*execution_bind)(xpu_execution ex, uint32_t io, xpu_buffer buf, uint64_t offset);
  /* asynchronous: waits on waits[], then runs, then signals *signal (may be NULL). BAD_STATE
   * if the execution is still in flight or not every io is bound. */
  xpu_status (*execution_submit)(xpu_execution ex, const xpu_fence_point *waits, uint32_t n_waits,
                                 const xpu_fence_point *signal);
  xpu_status (*execution_run)(xpu_execution ex); /* synchronous: submit + wait */
  xpu_status (*execution_release)(xpu_execution ex); /* BAD_STATE while in flight */

  xpu_status (*fence_create)(xpu_context ctx, uint64_t initial, xpu_fence *out);
  /* timeout_ns < 0: forever. TIMEOUT when it elapses. A failed submission makes every later
   * wait on its signal fail with that submission's status. */
  xpu_status (*fence_wait)(xpu_fence fence, uint64_t value, int64_t timeout_ns);
  xpu_status (*fence_value)(xpu_fence fence, uint64_t *out);
  xpu_status (*fence_signal)(xpu_fence fence, uint64_t value); /* host-side signal */
  xpu_status (*fence_release)(xpu_fence fence);

  /* new entries are appended here only */
} xpu_api;

/* ---------------------------------------------------------------- the two exports */
typedef xpu_status (*xpu_plugin_probe_fn)(xpu_probe_result *out);
typedef xpu_status (*xpu_plugin_open_fn)(const xpu_host_info *host, const xpu_api **out);

XPU_EXPORT xpu_status xpu_plugin_probe(xpu_probe_result *out);
XPU_EXPORT xpu_status xpu_plugin_open(const xpu_host_info *host, const xpu_api **out);

#ifdef __cplusplus
}
#endif
#endif /* XPU_BACKEND_H */
