/*
 * neon.h: the NEON plugin's internal objects and the interfaces between its files.
 *
 * Object graph: context -> buffers, executables, fences; executable -> executions. Every object
 * is reached through a registry handle (xpu_plugin.h). Buffers are reference counted because an
 * executable's constants and an execution's bindings keep the bytes alive after the host
 * released the handle; everything else is owned by its handle.
 */
#ifndef NEON_H
#define NEON_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "xpu_backend.h"
#include "xpu_ir.h"
#include "xpu_plugin.h"
#include "xpu_sync.h"

enum { OBJ_CONTEXT = 1, OBJ_BUFFER, OBJ_EXECUTABLE, OBJ_EXECUTION, OBJ_FENCE };

#define NV_MAX_CPUS 256
#define NV_ALIGN 64

extern xpu_registry nv_reg;

/* zeroed, 64-byte aligned memory (huge pages for large blocks); free() releases it */
void *nv_alloc(uint64_t size);

/* ---------------------------------------------------------------- thread pool (pool.c) */

/* Which cores a parallel region runs on; switching between two configs costs one
 * sched_setaffinity per worker and nothing else. */
typedef struct nv_cpuset {
  int n;       /* 0 = no pinning */
  int cpu[NV_MAX_CPUS];
} nv_cpuset;

typedef void (*nv_task_fn)(void *arg, int tid, int nth);

typedef struct nv_pool nv_pool;

/* Creates n worker threads (n >= 1) pinned round-robin to cpus. */
nv_pool *nv_pool_create(int n, const nv_cpuset *cpus, char *err, size_t errcap);
/* Joins every worker. */
void nv_pool_destroy(nv_pool *p);
int nv_pool_size(const nv_pool *p);
/* whether a worker sleeps (a region would have to wake it): a hint, read without a lock */
int nv_pool_sleeping(nv_pool *p);
/* Runs fn(arg, tid, nth) for tid in [0, nth) and returns when all are done. nth is clamped
 * to the pool size; nth == 1 without pinning runs on the calling thread. cpus (may be NULL:
 * the pool's own set) re-pins the workers first if it differs from the current pinning. */
void nv_pool_run(nv_pool *p, const nv_cpuset *cpus, int nth, nv_task_fn fn, void *arg);

/* Parses "0,1,4-7" into set; returns 0 on success, -1 on a malformed list. */
int nv_parse_cpus(const char *s, nv_cpuset *set);
/* The first CPU of set that is not online (/sys/devices/system/cpu/online; where that cannot be
 * read, not below the configured CPU count), or -1 when every one is: pinning a worker to an
 * absent CPU fails silently, so the option is refused instead. */
int nv_cpus_offline(const nv_cpuset *set);

/* [begin, end) of n items for thread tid of nth, in contiguous chunks of `align` items. */
static inline void nv_range(int64_t n, int tid, int nth, int64_t align, int64_t *b, int64_t *e) {
  int64_t blocks = (n + align - 1) / align;
  int64_t per = blocks / nth, rem = blocks % nth;
  int64_t bb = tid * per + (tid < rem ? tid : rem);
  int64_t be = bb + per + (tid < rem ? 1 : 0);
  *b = bb * align < n ? bb * align : n;
  *e = be * align < n ? be * align : n;
}

/* ---------------------------------------------------------------- objects */

typedef struct nv_context nv_context;

typedef struct nv_buffer {
  atomic_int refs;     /* the handle + every executable / execution that uses the bytes */
  atomic_int inflight; /* executions running right now with this buffer bound */
  atomic_int mapped;
  nv_context *ctx;
  uint8_t *data;
  uint64_t size;
  int owned;           /* 1: plugin memory (free), 2: mmap of an fd (munmap), 0: host memory */
  void *map_base;      /* for fd imports: the page-aligned mapping */
  uint64_t map_len;
  atomic_uint gen;     /* bumped by buffer_write and buffer_map: repacked copies key on it */
} nv_buffer;

void nv_buffer_unref(nv_buffer *b);

typedef struct nv_fence {
  nv_context *ctx;
  xpu_timeline tl; /* its users (queued jobs) keep it from being released */
} nv_fence;

struct nv_qpacked;

struct nv_context {
  uint32_t device;
  atomic_int children;
  nv_pool *pool;
  nv_cpuset cpus;
  int threads;
  int int8dot; /* use the CPU's int8 dot-product instruction when it has one */
  int repack; /* repack constant Q4_0/Q8_0 matmul weights at prepare (k_qpack.c) */
  xpu_queue q; /* execution_submit's queue: one thread per context, started by the first submit */
  /* repacked matmul weights shared by this context's executables (k_qpack.c) */
  pthread_mutex_t pkmu;
  struct nv_qpacked *pk;
  uint64_t pk_bytes;
  /* intermediates (arena and per-thread scratch) lent to this context's executions for the
   * length of one run (exec.c) */
  pthread_mutex_t wkmu;
  struct nv_work *work;
};

/* where one graph tensor lives during an execution */
enum { LOC_CONST = 0, LOC_IO = 1, LOC_ARENA = 2 };

typedef struct nv_tensor_plan {
  int loc;
  uint32_t io;      /* LOC_IO: binding index */
  uint64_t offset;  /* LOC_ARENA: offset in the arena */
  uint8_t *cdata;   /* LOC_CONST */
  uint64_t nbytes;
} nv_tensor_plan;

typedef struct nv_executable {
  nv_context *ctx;
  void *blob; /* our copy of the IR: the parsed view points into it */
  xpu_ir_graph g;
  nv_tensor_plan *plan;
  nv_buffer **consts; /* referenced constant buffers */
  uint32_t n_consts;
  uint64_t arena_bytes;
  uint64_t scratch_bytes; /* per thread */
  uint64_t shared_bytes;  /* node-wide work area */
  struct nv_qpacked **packed; /* per node: its repacked weight, or NULL */
  uint64_t packed_bytes;      /* bytes of the repacked weights this executable uses */
  nv_cpuset cpus;         /* prepare option, else the context's */
  int threads;
  atomic_int executions;
} nv_executable;

enum { EX_IDLE = 0, EX_QUEUED = 1, EX_RUNNING = 2 };

typedef struct nv_execution {
  nv_executable *exe;
  xpu_handle handle;
  uint32_t n_io;
  nv_buffer **bind;
  uint64_t *bind_off;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int state;
} nv_execution;

/* Frees the intermediates a context lent to its executions (none may be running). */
void nv_work_free(nv_context *c);

/* ---------------------------------------------------------------- graph (graph.c) */

/* Checks node n against OPS.md and what the kernels assume. On NO, reason says why. precision
 * receives the XPU_PREC_* the kernel runs at. */
int nv_node_supported(const xpu_ir_graph *g, const xpu_ir_node *n, uint32_t *precision,
                      char *reason, size_t cap);
/* Every tensor's size fits the plugin's 64-bit arithmetic (at most NV_MAX_ELEMS elements, so
 * that element counts times 8 bytes cannot overflow); 0 with a message otherwise. */
#define NV_MAX_ELEMS ((uint64_t)1 << 44)
int nv_check_tensors(const xpu_ir_graph *g, char *err, size_t cap);
/* Static answer for op_support. */
uint32_t nv_op_support(const xpu_op_query *q);
/* Builds the memory plan of exe (after parse and per-node checks). */
xpu_status nv_plan(nv_executable *exe, char *err, size_t cap);

/* ---------------------------------------------------------------- execution (exec.c) */

/* What a kernel sees: the tensors' addresses and the pool. */
typedef struct nv_run {
  const xpu_ir_graph *g;
  uint8_t **ptr; /* per tensor */
  nv_pool *pool;
  const nv_cpuset *cpus;
  int nth;
  int int8dot;
  uint8_t *scratch;
  uint64_t scratch_bytes; /* per thread */
  uint8_t *shared;        /* one area for all threads of a node */
  struct nv_qpacked *const *packed; /* per node, may be NULL */
  char err[256];
} nv_run;

xpu_status nv_execute(nv_execution *ex);

/* ---------------------------------------------------------------- kernels (k_*.c) */

/* per-thread scratch a node needs, in bytes */
uint64_t nv_node_scratch(const xpu_ir_graph *g, const xpu_ir_node *n);

uint64_t nv_node_shared(const xpu_ir_graph *g, const xpu_ir_node *n);
uint64_t nv_matmul_shared(const xpu_ir_graph *g, const xpu_ir_node *n);
uint64_t nv_matmul_scratch(const xpu_ir_graph *g, const xpu_ir_node *n);
uint64_t nv_attention_scratch(const xpu_ir_graph *g, const xpu_ir_node *n);
void nv_softmax_row(const float *x, float *o, int64_t n, int64_t valid, float scale);

xpu_status nv_k_binary(nv_run *r, const xpu_ir_node *n);
xpu_status nv_k_unary(nv_run *r, const xpu_ir_node *n);
xpu_status nv_k_norm(nv_run *r, const xpu_ir_node *n);
xpu_status nv_k_softmax(nv_run *r, const xpu_ir_node *n);
xpu_status nv_k_matmul(nv_run *r, const xpu_ir_node *n);
xpu_status nv_k_rope(nv_run *r, const xpu_ir_node *n);
xpu_status nv_k_attention(nv_run *r, const xpu_ir_node *n);
xpu_status nv_k_get_rows(nv_run *r, const xpu_ir_node *n);
xpu_status nv_k_cast(nv_run *r, const xpu_ir_node *n);
xpu_status nv_k_quantize(nv_run *r, const xpu_ir_node *n);
xpu_status nv_k_dequantize(nv_run *r, const xpu_ir_node *n);
xpu_status nv_k_reshape(nv_run *r, const xpu_ir_node *n);
xpu_status nv_k_permute(nv_run *r, const xpu_ir_node *n);
xpu_status nv_k_slice(nv_run *r, const xpu_ir_node *n);
xpu_status nv_k_concat(nv_run *r, const xpu_ir_node *n);
/* op set 3 (k_w8a8.c): MATMUL with an I8 a or per-channel I8 weight scales, SHADOW_MATMUL */
int nv_is_w8a8(const xpu_ir_graph *g, const xpu_ir_node *n);
xpu_status nv_k_w8a8(nv_run *r, const xpu_ir_node *n);
xpu_status nv_k_shadow(nv_run *r, const xpu_ir_node *n);
uint64_t nv_w8a8_scratch(const xpu_ir_graph *g, const xpu_ir_node *n);
uint64_t nv_w8a8_shared(const xpu_ir_graph *g, const xpu_ir_node *n);
uint64_t nv_shadow_shared(const xpu_ir_graph *g, const xpu_ir_node *n);
/* op set 3 (k_sparse.c): SPARSE_FFN, PowerInfer-2's neuron-bundle FFN */
xpu_status nv_k_sparse_ffn(nv_run *r, const xpu_ir_node *n);
uint64_t nv_sparse_scratch(const xpu_ir_graph *g, const xpu_ir_node *n);
uint64_t nv_sparse_shared(const xpu_ir_graph *g, const xpu_ir_node *n);
/* float dot products of an f32 row with an f32 / f16 row (k_matmul.c) */
float nv_dot_f32(const float *a, const float *b, int64_t k);
float nv_dot_f16(const float *a, const uint16_t *b, int64_t k);

/* Runs fn on the execution's threads (1 thread when work is below the threshold). */
static inline void nv_parallel(nv_run *r, int64_t work, nv_task_fn fn, void *arg) {
  int nth = r->nth;
  /* A region costs a few microseconds while the workers spin, and far more once they sleep
   * (~70 us to wake an idle vCPU on a 2-vCPU VM): then work below ~5 us (2^18 multiply-adds)
   * is done sooner by this thread alone. Without that, stories260K's decode with 2 threads
   * woke the workers for each layer's attention and ran at half the speed of 1 thread. */
  if (work < 32768 || (work < (1 << 18) && nv_pool_sleeping(r->pool))) nth = 1;
  nv_pool_run(r->pool, r->cpus, nth, fn, arg);
}

static inline void *nv_scratch(nv_run *r, int tid) { return r->scratch + (uint64_t)tid * r->scratch_bytes; }

/* elements per dtype for the plain types */
/* (int8_t)v for a quantized code the caller knows is in int8's range when finite. A NaN or
 * infinite input makes the code NaN (OPS.md: its codes are unspecified), where the conversion
 * would be undefined behaviour: 0 then. */
static inline int8_t nv_i8_code(float v) { return v == v ? (int8_t)v : 0; }

static inline uint32_t nv_elem_size(uint32_t dt) { return xpu_dtype_block_bytes(dt); }

/* quantized dot products (k_quant.c): one activation row quantized by nv_quantize_row_q8 */
typedef struct nv_qact {
  const float *d;  /* K/32 block scales */
  const int8_t *q; /* K values */
  const float *s;  /* K/32 block sums times their scale, d * sum(q) */
} nv_qact;

#define NV_QROWS 4 /* activation rows a weight block is unpacked for at once */

/* out[r] = dot(weight row w of nb Q8_0/Q4_0 blocks, activation row a[r]) for r < nr (any nr) */
typedef void (*nv_qdot_fn)(const uint8_t *w, int64_t nb, const nv_qact *a, int nr, float *out);
void nv_quantize_row_q8(const float *x, int64_t k, float *d, int8_t *q, float *s);
/* one 32-value block of that rule: stores its scale and values, returns sum(q) */
int nv_quantize_block_q8(const float *xb, float *d, int8_t *q);
/* int8dot 0 keeps to the baseline path even where the CPU has a dot-product instruction
 * (vdotq_s32, vpdpbusd): the context option int8dot=0, so tests reach both paths */
nv_qdot_fn nv_qdot_select(uint32_t dtype, int int8dot);
int nv_have_dotprod(void);
/* the int8 dot-product path the quantized kernels take on this CPU, for the device's name */
const char *nv_int8_path(void);

/* ---------------------------------------------------------------- repacked weights (k_qpack.c) */

#define NV_PG 16 /* weight rows interleaved per group of the repacked layout */

/* one activation row for the repacked kernels: per 32-value block its scale, its int8 values
 * and the integer sum of those values */
typedef struct nv_pact {
  const float *d;
  const int8_t *q;
  const int32_t *s;
} nv_pact;

/* out[m * ldo + j] = dot(row j of the group at w, a[m]) for m < mr, j < nvalid (<= NV_PG) */
typedef void (*nv_qpk_fn)(const uint8_t *w, int64_t nb, const nv_pact *a, int mr, float *out, int64_t ldo,
                          int nvalid);
nv_qpk_fn nv_qpk_select(uint32_t dtype, int int8dot);
void nv_quantize_row_q8s(const float *x, int64_t k, float *d, int8_t *q, int32_t *s);
uint64_t nv_qpack_bytes(uint32_t dtype, int64_t N, int64_t K);
void nv_qpack_groups(uint32_t dtype, const uint8_t *src, int64_t N, int64_t K, int64_t g0, int64_t g1, uint8_t *dst);

/* ---------------------------------------------------------------- K-quants (k_kquant.c) */

#define NV_KBS 24 /* activation sums per super-block: 16 per 16 values, then 8 per 32 */

/* one activation row for the K-quant kernels: per 256 values an f32 scale, the int8 values
 * and the integer sums nv_quantize_row_q8k keeps (NV_KBS per super-block) */
typedef struct nv_kact {
  const float *d;
  const int8_t *q;
  const int16_t *bs;
} nv_kact;

/* out[m * ldo + j] = dot(row j of the repacked group at w, a[m]) for m < mr, j < nvalid */
typedef void (*nv_kpk_fn)(const uint8_t *w, int64_t nsb, const nv_kact *a, int mr, float *out, int64_t ldo,
                          int nvalid);
/* the kernel for this CPU, or (int8dot 0) the baseline one */
nv_kpk_fn nv_kpk_select(uint32_t dtype, int int8dot);
void nv_quantize_row_q8k(const float *x, int64_t k, float *d, int8_t *q, int16_t *bs);
/* Q4_K, Q5_K, Q6_K: the K-quants with a repacked int8 kernel (Q2_K/Q3_K go through f32) */
int nv_kq_repackable(uint32_t dtype);
uint64_t nv_kq_pack_bytes(uint32_t dtype, int64_t N, int64_t K);
void nv_kq_pack_groups(uint32_t dtype, const uint8_t *src, int64_t N, int64_t K, int64_t g0, int64_t g1, uint8_t *dst);
/* bytes of a row of k values (a multiple of 256) */
uint64_t nv_kq_row_bytes(uint32_t dtype, int64_t k);
/* k values (a multiple of 256) of one K-quant row as f32, bit-exact with OPS.md */
void nv_kq_deq_row(uint32_t dtype, const uint8_t *src, float *dst, int64_t k);
static inline int nv_is_kquant(uint32_t dt) { return dt >= XPU_DT_Q4_K && dt <= XPU_DT_Q3_K; }
/* bytes of one row of k values of dtype dt (k a multiple of its block length) */
static inline uint64_t nv_row_bytes(uint32_t dt, int64_t k) {
  return (uint64_t)(k / xpu_dtype_block_len(dt)) * xpu_dtype_block_bytes(dt);
}

/* Float weights (F32/F16/BF16) packed once at prepare into the GEMM's layout (k_matmul.c): the
 * panels of NR rows, k-major, of every (NC x KC) block in the order the GEMM walks them. Only
 * for a node whose M takes the GEMM path and a weight of at most NV_FPACK_MAX packed bytes (an
 * L2-sized one): there, packing on every call costs as much as the multiply (a verify pass of
 * a small model); a bigger weight is multiplied by more rows (prefill), which amortizes the
 * packing, and a copy of it would cost real memory. */
#define NV_FPACK_MAX ((uint64_t)1 << 20)
int nv_fpack_wanted(const xpu_ir_graph *g, const xpu_ir_node *n);
static inline int nv_is_float_weight(uint32_t dt) {
  return dt == XPU_DT_F32 || dt == XPU_DT_F16 || dt == XPU_DT_BF16;
}
uint64_t nv_fpack_bytes(int64_t N, int64_t K);
/* packs the NR-row panels [p0, p1) of the [N, K] weight src into dst (nv_fpack_bytes) */
void nv_fpack_panels(uint32_t dtype, const uint8_t *src, int64_t N, int64_t K, int64_t p0, int64_t p1, float *dst);
int64_t nv_fpack_panel_count(int64_t N);

/* A constant Q4_0/Q8_0/Q4_K/Q5_K/Q6_K [N, K] weight in the repacked layout (or a float one in
 * the GEMM's packed layout), shared through the context's cache by every executable that uses the same bytes (buffer, offset, generation, shape, dtype). */
typedef struct nv_qpacked {
  struct nv_qpacked *next;
  const nv_buffer *buf;
  uint64_t off;
  unsigned gen;
  uint32_t dtype;
  int64_t N, K;
  int refs; /* executables using it; under the context's pkmu */
  uint8_t *data;
  uint64_t bytes; /* owned: 0 for a view */
  /* A view: rows of parent's, starting at a whole group, that data points into (a split
   * whose cut moves between prepared cut points runs every range out of one copy). It holds
   * a reference on parent. */
  struct nv_qpacked *parent;
} nv_qpacked;

/* The cached copy (a new reference), packing it on first use, or a view into a cached copy
 * that holds the same rows from a whole group on; NULL when out of memory. */
nv_qpacked *nv_qpack_get(nv_context *c, nv_buffer *buf, uint64_t off, uint32_t dtype, int64_t N, int64_t K);
void nv_qpack_put(nv_context *c, nv_qpacked *p);

#endif /* NEON_H */
