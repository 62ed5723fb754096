/*
 * qnn_ctest: checks of the QNN plugin and its emulated provider that need no Go side.
 *   1. the emulator's HTP-like rules, through its function table directly: execute before
 *      finalize fails, a different bound shape fails, unknown ops/dtypes are refused, no node
 *      after finalize, context binaries round-trip, fd memory registers;
 *   2. the plugin end to end on hand-built IR (MATMUL+SILU, RMS_NORM, causal SOFTMAX, ROPE,
 *      GQA ATTENTION, GET_ROWS, QUANTIZE/DEQUANTIZE) against plain C references;
 *   3. the context-binary cache: the second prepare does no graphFinalize (counted by the
 *      emulator through XPU_QNN_EMU_STATS) and gives the same results;
 *   4. memfd import, lifecycle errors.
 * usage: qnn_ctest <libxpu-qnn.so> <libQnnXpuEmu.so>
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "qnn_api.h"
#include "xpu_backend.h"
#include "xpu_ir.h"
#include "xpu_ir_build.h"

static int failures;
#define CHECK(cond, ...)                                                                         \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      failures++;                                                                                \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                       \
      fprintf(stderr, __VA_ARGS__);                                                              \
      fprintf(stderr, "\n");                                                                     \
    }                                                                                            \
  } while (0)

/* ------------------------------------------------------------------ 1. emulator rules */

static Qnn_Tensor_t tensor(Qnn_TensorType_t type, uint32_t rank, uint32_t *dims, void *data, uint32_t size) {
  Qnn_Tensor_t t;
  memset(&t, 0, sizeof t);
  t.version = QNN_TENSOR_VERSION_1;
  t.v1.name = "t";
  t.v1.type = type;
  t.v1.dataType = QNN_DATATYPE_FLOAT_32;
  t.v1.quantizeParams.encodingDefinition = QNN_DEFINITION_UNDEFINED;
  t.v1.rank = rank;
  t.v1.dimensions = dims;
  t.v1.memType = QNN_TENSORMEMTYPE_RAW;
  t.v1.clientBuf.data = data;
  t.v1.clientBuf.dataSize = size;
  return t;
}

static Qnn_OpConfig_t op(const char *type, Qnn_Tensor_t *in, uint32_t n_in, Qnn_Tensor_t *out) {
  Qnn_OpConfig_t o;
  memset(&o, 0, sizeof o);
  o.version = QNN_OPCONFIG_VERSION_1;
  o.v1.name = type;
  o.v1.packageName = QNN_OP_PACKAGE_NAME_QTI_AISW;
  o.v1.typeName = type;
  o.v1.numOfInputs = n_in;
  o.v1.inputTensors = in;
  o.v1.numOfOutputs = 1;
  o.v1.outputTensors = out;
  return o;
}

static void test_emulator(const char *path) {
  void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  CHECK(dl, "dlopen %s: %s", path, dlerror());
  if (!dl) return;
  QnnInterfaceGetProvidersFn_t get = (QnnInterfaceGetProvidersFn_t)dlsym(dl, QNN_GET_PROVIDERS_SYMBOL);
  const QnnInterface_t **list = NULL;
  uint32_t n = 0;
  CHECK(get && get(&list, &n) == QNN_SUCCESS && n == 1, "getProviders");
  const QnnInterface_t *p = list[0];
  CHECK(strstr(p->providerName, "EMULATOR") && strstr(p->providerName, "not Qualcomm"), "provider name says emulator: %s",
        p->providerName);
  /* the newest API whose HTP rules it models, unless XPU_QNN_EMU_API_VERSION says otherwise; the
   * table is 2.18's, which later versions keep */
  CHECK(p->apiVersion.coreApiVersion.major == 2 && p->apiVersion.coreApiVersion.minor >= QNN_API_MINOR_PINNED,
        "API 2.%u, not below 2.18", p->apiVersion.coreApiVersion.minor);
  const QnnInterfaceTable_t *f = &p->v2_18;
  Qnn_BackendHandle_t be;
  Qnn_ContextHandle_t ctx;
  Qnn_GraphHandle_t g;
  CHECK(f->backendCreate(NULL, NULL, &be) == QNN_SUCCESS, "backendCreate");
  CHECK(f->contextCreate(be, NULL, NULL, &ctx) == QNN_SUCCESS, "contextCreate");
  CHECK(f->graphCreate(ctx, "g", NULL, &g) == QNN_SUCCESS, "graphCreate");
  uint32_t d23[2] = {2, 3}, d32[2] = {3, 2};
  Qnn_Tensor_t in = tensor(QNN_TENSOR_TYPE_APP_WRITE, 2, d23, NULL, 0);
  Qnn_Tensor_t out = tensor(QNN_TENSOR_TYPE_APP_READ, 2, d23, NULL, 0);
  CHECK(f->tensorCreateGraphTensor(g, &in) == QNN_SUCCESS && in.v1.id, "create in");
  CHECK(f->tensorCreateGraphTensor(g, &out) == QNN_SUCCESS && out.v1.id, "create out");
  Qnn_Tensor_t bad = tensor(QNN_TENSOR_TYPE_NATIVE, 2, d23, NULL, 0);
  bad.v1.dataType = QNN_DATATYPE_FLOAT_64;
  CHECK(f->tensorCreateGraphTensor(g, &bad) != QNN_SUCCESS, "FLOAT_64 is not in the emulator's list");
  Qnn_Tensor_t ins[2] = {in, in};
  CHECK(f->graphAddNode(g, op("Conv2d", ins, 1, &out)) == QNN_GRAPH_ERROR_INVALID_OP_CONFIG, "unlisted op refused");
  Qnn_Tensor_t wrong = tensor(QNN_TENSOR_TYPE_APP_READ, 2, d32, NULL, 0);
  wrong.v1.id = out.v1.id;
  CHECK(f->graphAddNode(g, op("ElementWiseAdd", ins, 2, &wrong)) != QNN_SUCCESS, "node with a mis-described output");
  CHECK(f->graphAddNode(g, op("ElementWiseAdd", ins, 2, &out)) == QNN_SUCCESS, "add node");
  float x[6] = {1, 2, 3, 4, 5, 6}, y[6] = {0};
  Qnn_Tensor_t xin = in, yout = out;
  xin.v1.clientBuf = (Qnn_ClientBuffer_t){x, sizeof x};
  yout.v1.clientBuf = (Qnn_ClientBuffer_t){y, sizeof y};
  CHECK(f->graphExecute(g, &xin, 1, &yout, 1, NULL, NULL) == QNN_GRAPH_ERROR_GRAPH_NOT_FINALIZED,
        "execute before finalize must fail");
  const char *msg = NULL;
  CHECK(f->errorGetMessage(QNN_GRAPH_ERROR_GRAPH_NOT_FINALIZED, &msg) == QNN_SUCCESS && strstr(msg, "Finalize"),
        "message names finalize: %s", msg ? msg : "");
  CHECK(f->graphFinalize(g, NULL, NULL) == QNN_SUCCESS, "finalize");
  CHECK(f->graphAddNode(g, op("ElementWiseAdd", ins, 2, &out)) == QNN_GRAPH_ERROR_GRAPH_FINALIZED, "no node after finalize");
  Qnn_Tensor_t xwrong = xin;
  xwrong.v1.dimensions = d32;
  CHECK(f->graphExecute(g, &xwrong, 1, &yout, 1, NULL, NULL) == QNN_GRAPH_ERROR_INVALID_TENSOR,
        "binding a different shape must fail (static shapes)");
  Qnn_Tensor_t xshort = xin;
  xshort.v1.clientBuf.dataSize = 8;
  CHECK(f->graphExecute(g, &xshort, 1, &yout, 1, NULL, NULL) != QNN_SUCCESS, "short buffer must fail");
  CHECK(f->graphExecute(g, &xin, 1, &yout, 1, NULL, NULL) == QNN_SUCCESS, "execute");
  CHECK(y[0] == 2 && y[5] == 12, "x+x: %g %g", y[0], y[5]);

  /* fd memory: the emulator maps the fd itself */
  int fd = memfd_create("qnn-ctest", 0);
  CHECK(fd >= 0 && ftruncate(fd, sizeof x) == 0, "memfd");
  float *shared = mmap(NULL, sizeof x, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  memcpy(shared, x, sizeof x);
  Qnn_MemDescriptor_t md;
  memset(&md, 0, sizeof md);
  md.memShape.numDim = 2;
  md.memShape.dimSize = d23;
  md.dataType = QNN_DATATYPE_FLOAT_32;
  md.memType = QNN_MEM_TYPE_ION;
  md.ionInfo.fd = fd;
  Qnn_MemHandle_t mh = NULL;
  CHECK(f->memRegister(ctx, &md, 1, &mh) == QNN_SUCCESS && mh, "memRegister");
  Qnn_Tensor_t xm = xin;
  xm.v1.memType = QNN_TENSORMEMTYPE_MEMHANDLE;
  xm.v1.memHandle = mh;
  shared[0] = 10;
  memset(y, 0, sizeof y);
  CHECK(f->graphExecute(g, &xm, 1, &yout, 1, NULL, NULL) == QNN_SUCCESS && y[0] == 20, "execute from fd memory: %g", y[0]);
  CHECK(f->contextFree(ctx, NULL) != QNN_SUCCESS, "contextFree with registered memory must fail");
  CHECK(f->memDeRegister(&mh, 1) == QNN_SUCCESS, "memDeRegister");
  munmap(shared, sizeof x);
  close(fd);

  /* context binary round trip; a damaged binary is refused */
  Qnn_ContextBinarySize_t sz = 0, wr = 0;
  CHECK(f->contextGetBinarySize(ctx, &sz) == QNN_SUCCESS && sz > 0, "binary size");
  uint8_t *bin = malloc(sz);
  CHECK(bin && f->contextGetBinary(ctx, bin, sz, &wr) == QNN_SUCCESS && wr == sz, "get binary");
  Qnn_ContextHandle_t ctx2 = NULL;
  Qnn_GraphHandle_t g2 = NULL;
  CHECK(f->contextCreateFromBinary(be, NULL, NULL, bin, wr, &ctx2, NULL) == QNN_SUCCESS, "from binary");
  CHECK(ctx2 && f->graphRetrieve(ctx2, "g", &g2) == QNN_SUCCESS, "retrieve");
  memset(y, 0, sizeof y);
  CHECK(g2 && f->graphExecute(g2, &xin, 1, &yout, 1, NULL, NULL) == QNN_SUCCESS && y[5] == 12, "execute retrieved");
  bin[wr / 2] ^= 0x55;
  Qnn_ContextHandle_t ctx3 = NULL;
  CHECK(f->contextCreateFromBinary(be, NULL, NULL, bin, wr, &ctx3, NULL) != QNN_SUCCESS, "damaged binary refused");
  for (uint64_t cut = 0; cut < wr; cut += 7) /* every truncation is refused, none crashes */
    CHECK(f->contextCreateFromBinary(be, NULL, NULL, bin, cut, &ctx3, NULL) != QNN_SUCCESS, "truncated binary %llu",
          (unsigned long long)cut);
  free(bin);
  CHECK(f->contextFree(ctx2, NULL) == QNN_SUCCESS, "free ctx2");
  CHECK(f->contextFree(ctx, NULL) == QNN_SUCCESS, "free ctx");
  CHECK(f->graphExecute(g, &xin, 1, &yout, 1, NULL, NULL) == QNN_GRAPH_ERROR_INVALID_HANDLE, "stale graph handle");
  CHECK(f->backendFree(be) == QNN_SUCCESS, "backendFree");
  /* the host never dlcloses plugins; the test keeps the same rule for the provider */
}

/* ------------------------------------------------------------------ 2.-4. the plugin */

static const xpu_api *api;
static xpu_context ctx;

static float frand(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return (float)((*s >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}

static xpu_buffer buf_with(const void *data, uint64_t size) {
  xpu_buffer b = 0;
  CHECK(api->buffer_alloc(ctx, size, XPU_BUFFER_HOST_VISIBLE, &b) == XPU_OK, "buffer_alloc");
  if (data) CHECK(api->buffer_write(b, 0, data, size) == XPU_OK, "buffer_write");
  return b;
}

static const char *lasterr(xpu_handle h) {
  static char buf[512];
  api->last_error(h, buf, sizeof buf, NULL);
  return buf;
}

static char run_err[512]; /* the last execution_run failure, for CHECK messages */

/* prepares, binds inputs/outputs and runs; outputs are read back into outs */
static xpu_status run_graph(xpu_irb *b, const void *cache, uint64_t cache_size, xpu_buffer *ins, xpu_buffer *outs,
                            xpu_executable *exe_out) {
  uint64_t size;
  void *blob = xpu_irb_encode(b, &size);
  xpu_prepare_desc d = {sizeof d, 0, blob, size, NULL, cache, cache_size};
  xpu_executable exe = 0;
  xpu_status st = api->graph_prepare(ctx, &d, &exe);
  free(blob);
  if (st != XPU_OK) return st;
  xpu_execution ex = 0;
  CHECK(api->execution_create(exe, &ex) == XPU_OK, "execution_create");
  for (uint32_t i = 0; i < b->n_inputs; i++)
    CHECK(api->execution_bind(ex, i, ins[i], 0) == XPU_OK, "bind in %u: %s", i, lasterr(ex));
  for (uint32_t i = 0; i < b->n_outputs; i++)
    CHECK(api->execution_bind(ex, b->n_inputs + i, outs[i], 0) == XPU_OK, "bind out %u: %s", i, lasterr(ex));
  st = api->execution_run(ex);
  if (st != XPU_OK) snprintf(run_err, sizeof run_err, "%s", lasterr(ex));
  CHECK(api->execution_release(ex) == XPU_OK, "execution_release");
  if (exe_out) *exe_out = exe;
  else CHECK(api->executable_release(exe) == XPU_OK, "executable_release");
  return st;
}

static double max_err(const float *a, const float *b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (!(d <= m)) m = d; /* NaN propagates */
  }
  return m;
}

/* lines of the emulator's stats file that start with what */
static int count_stats(const char *stats, const char *what) {
  FILE *f = fopen(stats, "r");
  if (!f) return 0;
  int n = 0;
  char line[256];
  while (fgets(line, sizeof line, f)) n += strncmp(line, what, strlen(what)) == 0;
  fclose(f);
  return n;
}

static int count_finalizes(const char *stats) { return count_stats(stats, "finalize "); }

/* MATMUL + SILU with a constant weight; the cache test reuses it */
static void test_matmul_silu_and_cache(const char *stats) {
  enum { M = 3, K = 40, N = 5 };
  unsigned seed = 1;
  float x[M * K], w[N * K], want[M * N], got[M * N];
  for (int i = 0; i < M * K; i++) x[i] = frand(&seed);
  for (int i = 0; i < N * K; i++) w[i] = frand(&seed);
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double acc = 0;
      for (int k = 0; k < K; k++) acc += (double)x[m * K + k] * w[n * K + k];
      want[m * N + n] = (float)(acc / (1 + exp(-acc)));
    }
  xpu_irb b = {0};
  int64_t sx[2] = {M, K}, sw[2] = {N, K}, sy[2] = {M, N};
  uint32_t tx = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_INPUT, 2, sx);
  uint32_t tw = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_CONST, 2, sw);
  uint32_t th = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_VALUE, 2, sy);
  uint32_t ty = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_VALUE, 2, sy);
  xpu_buffer wb = buf_with(w, sizeof w);
  b.tensors[tw].const_buffer = wb;
  xpu_irb_node(&b, XPU_OP_MATMUL, th, 2, (const uint32_t[]){tx, tw});
  xpu_irb_node(&b, XPU_OP_SILU, ty, 1, (const uint32_t[]){th});
  xpu_irb_output(&b, ty);
  xpu_buffer xb = buf_with(x, sizeof x), yb = buf_with(NULL, sizeof got);

  int before = count_finalizes(stats);
  xpu_executable exe = 0;
  CHECK(run_graph(&b, NULL, 0, &xb, &yb, &exe) == XPU_OK, "matmul+silu: %s %s", lasterr(ctx), run_err);
  api->buffer_read(yb, 0, got, sizeof got);
  CHECK(max_err(got, want, M * N) < 1e-5, "matmul+silu max err %g", max_err(got, want, M * N));
  CHECK(count_finalizes(stats) == before + 1, "first prepare finalizes once (%d -> %d)", before, count_finalizes(stats));

  uint64_t need = 0, size = 0;
  CHECK(api->executable_serialize(exe, NULL, 0, &need) == XPU_OK && need > 0, "serialize size");
  uint8_t *blob = malloc(need);
  CHECK(api->executable_serialize(exe, blob, need, &size) == XPU_OK && size <= need, "serialize: %s", lasterr(exe));
  CHECK(api->executable_release(exe) == XPU_OK, "release");
  memset(got, 0, sizeof got);
  api->buffer_write(yb, 0, got, sizeof got);
  CHECK(run_graph(&b, blob, size, &xb, &yb, NULL) == XPU_OK, "prepare from cache: %s", lasterr(ctx));
  api->buffer_read(yb, 0, got, sizeof got);
  CHECK(max_err(got, want, M * N) < 1e-5, "cached executable max err %g", max_err(got, want, M * N));
  CHECK(count_finalizes(stats) == before + 1, "the cached prepare must not finalize (%d finalizes)",
        count_finalizes(stats) - before);

  /* other weights: the cache key (IR + constant bytes) no longer matches */
  w[0] += 1;
  api->buffer_write(wb, 0, w, sizeof w);
  CHECK(run_graph(&b, blob, size, &xb, &yb, NULL) == XPU_E_INCOMPATIBLE, "cache for other weights refused");
  blob[size / 2] ^= 1;
  CHECK(run_graph(&b, blob, size, &xb, &yb, NULL) != XPU_OK, "damaged cache refused");
  free(blob);
  api->buffer_release(xb);
  api->buffer_release(yb);
  api->buffer_release(wb);
}

static void test_softmax_rmsnorm(void) {
  enum { R = 4, C = 6 };
  unsigned seed = 7;
  float x[R * C], sm[R * C], rn[R * C], got[R * C];
  for (int i = 0; i < R * C; i++) x[i] = 3 * frand(&seed);
  const float scale = 0.5f, eps = 1e-5f;
  const int off = -1; /* row 0 sees no key: all zero */
  for (int r = 0; r < R; r++) {
    double mx = -INFINITY, sum = 0, ss = 0;
    for (int j = 0; j < C; j++) {
      ss += (double)x[r * C + j] * x[r * C + j];
      if (j <= r + off && x[r * C + j] * scale > mx) mx = x[r * C + j] * scale;
    }
    for (int j = 0; j < C; j++) sum += j <= r + off ? exp(x[r * C + j] * scale - mx) : 0;
    for (int j = 0; j < C; j++) {
      sm[r * C + j] = j <= r + off ? (float)(exp(x[r * C + j] * scale - mx) / sum) : 0.0f;
      rn[r * C + j] = (float)(x[r * C + j] / sqrt(ss / C + eps));
    }
  }
  xpu_irb b = {0};
  int64_t s[2] = {R, C};
  uint32_t tx = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_INPUT, 2, s);
  uint32_t ts = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_VALUE, 2, s);
  uint32_t tr = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_VALUE, 2, s);
  xpu_ir_node *n = xpu_irb_node(&b, XPU_OP_SOFTMAX, ts, 1, (const uint32_t[]){tx});
  n->fattr[0] = scale;
  n->iattr[0] = 1;
  n->iattr[1] = off;
  xpu_irb_node(&b, XPU_OP_RMS_NORM, tr, 1, (const uint32_t[]){tx})->fattr[0] = eps;
  xpu_irb_output(&b, ts);
  xpu_irb_output(&b, tr);
  xpu_buffer xb = buf_with(x, sizeof x), outs[2] = {buf_with(NULL, sizeof got), buf_with(NULL, sizeof got)};
  CHECK(run_graph(&b, NULL, 0, &xb, outs, NULL) == XPU_OK, "softmax/rmsnorm: %s %s", lasterr(ctx), run_err);
  api->buffer_read(outs[0], 0, got, sizeof got);
  CHECK(max_err(got, sm, R * C) < 1e-6, "causal softmax max err %g", max_err(got, sm, R * C));
  api->buffer_read(outs[1], 0, got, sizeof got);
  CHECK(max_err(got, rn, R * C) < 1e-5, "rms_norm max err %g", max_err(got, rn, R * C));
  api->buffer_release(xb);
  api->buffer_release(outs[0]);
  api->buffer_release(outs[1]);
}

static void rope_ref(const float *x, const int32_t *pos, float *y, int T, int H, int D, int nr, int neox, float base) {
  for (int t = 0; t < T; t++)
    for (int h = 0; h < H; h++) {
      const float *xv = x + (t * H + h) * D;
      float *yv = y + (t * H + h) * D;
      memcpy(yv, xv, D * sizeof(float));
      for (int i = 0; i < nr / 2; i++) {
        double th = pos[t] * pow(base, -2.0 * i / nr), c = cos(th), s = sin(th);
        int a = neox ? i : 2 * i, bb = neox ? i + nr / 2 : 2 * i + 1;
        yv[a] = (float)(xv[a] * c - xv[bb] * s);
        yv[bb] = (float)(xv[a] * s + xv[bb] * c);
      }
    }
}

static void test_rope(int neox, int nr) {
  enum { T = 3, H = 2, D = 8 };
  unsigned seed = 11;
  float x[T * H * D], want[T * H * D], got[T * H * D];
  int32_t pos[T] = {0, 5, 17};
  for (int i = 0; i < T * H * D; i++) x[i] = frand(&seed);
  rope_ref(x, pos, want, T, H, D, nr, neox, 10000.0f);
  xpu_irb b = {0};
  int64_t sx[3] = {T, H, D}, sp[1] = {T};
  uint32_t tx = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_INPUT, 3, sx);
  uint32_t tp = xpu_irb_tensor(&b, XPU_DT_I32, XPU_TENSOR_INPUT, 1, sp);
  uint32_t ty = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_VALUE, 3, sx);
  xpu_ir_node *n = xpu_irb_node(&b, XPU_OP_ROPE, ty, 2, (const uint32_t[]){tx, tp});
  n->iattr[0] = neox ? 2 : 0;
  n->iattr[1] = nr;
  xpu_irb_output(&b, ty);
  xpu_buffer ins[2] = {buf_with(x, sizeof x), buf_with(pos, sizeof pos)}, yb = buf_with(NULL, sizeof got);
  CHECK(run_graph(&b, NULL, 0, ins, &yb, NULL) == XPU_OK, "rope: %s %s", lasterr(ctx), run_err);
  api->buffer_read(yb, 0, got, sizeof got);
  CHECK(max_err(got, want, T * H * D) < 1e-5, "rope neox=%d n_rot=%d max err %g", neox, nr, max_err(got, want, T * H * D));
  api->buffer_release(ins[0]);
  api->buffer_release(ins[1]);
  api->buffer_release(yb);
}

/* off_input: the offset is a run-time I32 input (chunked prefill reuses one graph); a negative
 * offset leaves query 0 without a visible key (its output is 0) */
static void test_attention(int off_input, int OFF) {
  enum { TQ = 2, HQ = 4, HKV = 2, D = 4, TK = 6 };
  unsigned seed = 21;
  float q[TQ * HQ * D], k[TK * HKV * D], v[TK * HKV * D], want[TQ * HQ * D], got[TQ * HQ * D];
  for (int i = 0; i < TQ * HQ * D; i++) q[i] = frand(&seed);
  for (int i = 0; i < TK * HKV * D; i++) k[i] = frand(&seed), v[i] = frand(&seed);
  for (int i = TQ + OFF < 0 ? 0 : TQ + OFF; i < TK; i++) /* past the last visible key: must never be read */
    for (int j = 0; j < HKV * D; j++) k[i * HKV * D + j] = v[i * HKV * D + j] = NAN;
  double scale = 1 / sqrt((double)D);
  for (int i = 0; i < TQ; i++)
    for (int h = 0; h < HQ; h++) {
      int kh = h / (HQ / HKV);
      double s[TK], mx = -INFINITY, sum = 0;
      for (int j = 0; j <= i + OFF; j++) {
        s[j] = 0;
        for (int d = 0; d < D; d++) s[j] += (double)q[(i * HQ + h) * D + d] * k[(j * HKV + kh) * D + d];
        s[j] *= scale;
        if (s[j] > mx) mx = s[j];
      }
      for (int j = 0; j <= i + OFF; j++) sum += exp(s[j] - mx);
      for (int d = 0; d < D; d++) {
        double o = 0; /* stays 0 for a query that sees no key */
        for (int j = 0; j <= i + OFF; j++) o += exp(s[j] - mx) / sum * v[(j * HKV + kh) * D + d];
        want[(i * HQ + h) * D + d] = (float)o;
      }
    }
  xpu_irb b = {0};
  int64_t sq[3] = {TQ, HQ, D}, sk[3] = {TK, HKV, D};
  uint32_t tq = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_INPUT, 3, sq);
  uint32_t tk = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_INPUT, 3, sk);
  uint32_t tv = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_INPUT, 3, sk);
  int64_t s1[1] = {1};
  uint32_t toff = off_input ? xpu_irb_tensor(&b, XPU_DT_I32, XPU_TENSOR_INPUT, 1, s1) : 0;
  uint32_t to = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_VALUE, 3, sq);
  xpu_ir_node *n = off_input ? xpu_irb_node(&b, XPU_OP_ATTENTION, to, 4, (const uint32_t[]){tq, tk, tv, toff})
                             : xpu_irb_node(&b, XPU_OP_ATTENTION, to, 3, (const uint32_t[]){tq, tk, tv});
  n->iattr[0] = 1;
  n->iattr[1] = off_input ? 0 : OFF;
  xpu_irb_output(&b, to);
  int32_t off32 = OFF;
  xpu_buffer ins[4] = {buf_with(q, sizeof q), buf_with(k, sizeof k), buf_with(v, sizeof v), buf_with(&off32, 4)};
  xpu_buffer ob = buf_with(NULL, sizeof got);
  CHECK(run_graph(&b, NULL, 0, ins, &ob, NULL) == XPU_OK, "attention: %s %s", lasterr(ctx), run_err);
  api->buffer_read(ob, 0, got, sizeof got);
  CHECK(max_err(got, want, TQ * HQ * D) < 1e-5, "GQA causal attention (offset %d, run-time %d) max err %g", OFF,
        off_input, max_err(got, want, TQ * HQ * D));
  for (int i = 0; i < 4; i++) api->buffer_release(ins[i]);
  api->buffer_release(ob);
}

/* GET_ROWS from an fd-imported table, the QUANTIZE/DEQUANTIZE round trip through SFIXED_POINT_8,
 * and the id check. The table is F32: the CPU backend's Gather takes no SFIXED_POINT_8. */
static void test_int8_and_fd(const char *stats) {
  enum { R = 5, K = 4, NI = 3 };
  float table[R * K];
  for (int i = 0; i < R * K; i++) table[i] = (float)(i * 13 - 120) * 0.05f;
  const float scale = 0.05f;
  int fd = memfd_create("qnn-table", 0);
  CHECK(fd >= 0 && ftruncate(fd, sizeof table) == 0 && write(fd, table, sizeof table) == (ssize_t)sizeof table, "memfd");
  xpu_import_desc d = {sizeof d, XPU_IMPORT_FD, NULL, fd, 0, sizeof table};
  xpu_buffer tb = 0;
  xpu_import_desc wrap = {sizeof wrap, XPU_IMPORT_FD, NULL, fd, 4000, UINT64_MAX - 100};
  xpu_buffer wb = 0;
  CHECK(api->buffer_import(ctx, &wrap, &wb) == XPU_E_INVALID_ARG && !wb,
        "an fd range whose mapping length wraps must be refused, not mapped short");
  CHECK(api->buffer_import(ctx, &d, &tb) == XPU_OK, "import fd: %s", lasterr(ctx));
  close(fd); /* the plugin dup'ed it */
  int32_t ids[NI] = {4, 0, 2};
  float x[NI * K], want_rows[NI * K], want_q[NI * K], got[NI * K];
  for (int i = 0; i < NI; i++)
    for (int k = 0; k < K; k++) want_rows[i * K + k] = table[ids[i] * K + k];
  for (int i = 0; i < NI * K; i++) {
    x[i] = (float)i * 0.37f - 3.0f;
    float qv = roundf(x[i] / scale);
    qv = qv < -127 ? -127 : qv > 127 ? 127 : qv;
    want_q[i] = qv * scale;
  }
  xpu_irb b = {0};
  int64_t st[2] = {R, K}, si[1] = {NI}, so[2] = {NI, K};
  uint32_t tt = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_INPUT, 2, st);
  uint32_t ti = xpu_irb_tensor(&b, XPU_DT_I32, XPU_TENSOR_INPUT, 1, si);
  uint32_t tx = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_INPUT, 2, so);
  uint32_t tr = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_VALUE, 2, so);
  uint32_t tq = xpu_irb_tensor(&b, XPU_DT_I8, XPU_TENSOR_VALUE, 2, so);
  uint32_t td = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_VALUE, 2, so);
  xpu_irb_node(&b, XPU_OP_GET_ROWS, tr, 2, (const uint32_t[]){tt, ti});
  xpu_irb_node(&b, XPU_OP_QUANTIZE, tq, 1, (const uint32_t[]){tx})->fattr[0] = scale;
  xpu_irb_node(&b, XPU_OP_DEQUANTIZE, td, 1, (const uint32_t[]){tq})->fattr[0] = scale;
  xpu_irb_output(&b, tr);
  xpu_irb_output(&b, td);
  xpu_buffer ins[3] = {tb, buf_with(ids, sizeof ids), buf_with(x, sizeof x)};
  int regs = count_stats(stats, "memRegister ");
  xpu_buffer outs[2] = {buf_with(NULL, sizeof got), buf_with(NULL, sizeof got)};
  CHECK(run_graph(&b, NULL, 0, ins, outs, NULL) == XPU_OK, "int8 graph: %s %s", lasterr(ctx), run_err);
  api->buffer_read(outs[0], 0, got, sizeof got);
  CHECK(max_err(got, want_rows, NI * K) == 0, "GET_ROWS of an fd-imported table max err %g",
        max_err(got, want_rows, NI * K));
  CHECK(count_stats(stats, "memRegister ") == regs + 1, "the fd table was registered with memRegister (%d)",
        count_stats(stats, "memRegister ") - regs);
  api->buffer_read(outs[1], 0, got, sizeof got);
  CHECK(max_err(got, want_q, NI * K) < 1e-6, "QUANTIZE/DEQUANTIZE max err %g", max_err(got, want_q, NI * K));
  ids[1] = R; /* out of range: INVALID_ARG, not an out-of-bounds read */
  api->buffer_write(ins[1], 0, ids, sizeof ids);
  CHECK(run_graph(&b, NULL, 0, ins, outs, NULL) == XPU_E_INVALID_ARG && strstr(run_err, "outside [0, 5)"),
        "GET_ROWS id out of range: %s", run_err);
  for (int i = 0; i < 3; i++) api->buffer_release(ins[i]);
  api->buffer_release(outs[0]);
  api->buffer_release(outs[1]);
}

/* asynchronous submission: queued behind a host-signalled fence, in flight until then, and a
 * failed submission poisons its signal fence */
static void test_async(void) {
  enum { R = 4, K = 8, N = 3 };
  xpu_irb b = {0};
  int64_t st[2] = {R, K}, si[1] = {N}, so[2] = {N, K};
  uint32_t tt = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_INPUT, 2, st);
  uint32_t ti = xpu_irb_tensor(&b, XPU_DT_I32, XPU_TENSOR_INPUT, 1, si);
  uint32_t tr = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_VALUE, 2, so);
  xpu_irb_node(&b, XPU_OP_GET_ROWS, tr, 2, (const uint32_t[]){tt, ti});
  xpu_irb_output(&b, tr);
  uint64_t size;
  void *blob = xpu_irb_encode(&b, &size);
  xpu_prepare_desc d = {sizeof d, 0, blob, size, NULL, NULL, 0};
  xpu_executable exe = 0;
  xpu_execution ex = 0;
  CHECK(api->graph_prepare(ctx, &d, &exe) == XPU_OK && api->execution_create(exe, &ex) == XPU_OK, "prepare");
  float table[R * K], got[N * K];
  for (int i = 0; i < R * K; i++) table[i] = (float)i;
  int32_t ids[N] = {3, 1, 0};
  xpu_buffer bt = buf_with(table, sizeof table), bi = buf_with(ids, sizeof ids), bo = buf_with(NULL, sizeof got);
  api->execution_bind(ex, 0, bt, 0);
  api->execution_bind(ex, 1, bi, 0);
  api->execution_bind(ex, 2, bo, 0);
  xpu_fence gate = 0, done = 0;
  CHECK(api->fence_create(ctx, 0, &gate) == XPU_OK && api->fence_create(ctx, 0, &done) == XPU_OK, "fences");
  xpu_fence_point w = {gate, 1}, sig = {done, 1};
  CHECK(api->execution_submit(ex, &w, 1, &sig) == XPU_OK, "submit: %s", lasterr(ex));
  CHECK(api->execution_release(ex) == XPU_E_BAD_STATE, "release while queued");
  CHECK(api->buffer_release(bo) == XPU_E_BAD_STATE, "buffer release while queued");
  CHECK(api->fence_release(gate) == XPU_E_BAD_STATE, "release of a fence a queued submission waits on");
  CHECK(api->execution_submit(ex, NULL, 0, NULL) == XPU_E_BAD_STATE, "submit while in flight");
  CHECK(api->fence_wait(done, 1, 1000000) == XPU_E_TIMEOUT, "not before the gate");
  CHECK(api->fence_signal(gate, 1) == XPU_OK, "open the gate");
  CHECK(api->fence_wait(done, 1, -1) == XPU_OK, "done: %s", lasterr(done));
  api->buffer_read(bo, 0, got, sizeof got);
  CHECK(got[0] == 24 && got[K] == 8 && got[2 * K + 7] == 7, "rows %g %g %g", got[0], got[K], got[2 * K + 7]);
  /* a failing submission: its signal value fails with the execution's status */
  ids[0] = R;
  api->buffer_write(bi, 0, ids, sizeof ids);
  xpu_fence_point sig2 = {done, 2};
  CHECK(api->execution_submit(ex, NULL, 0, &sig2) == XPU_OK, "submit 2");
  CHECK(api->fence_wait(done, 2, -1) == XPU_E_INVALID_ARG, "the failed run poisons value 2");
  CHECK(strstr(lasterr(ex), "GET_ROWS id 4") != NULL, "the execution says why: %s", lasterr(ex));
  CHECK(api->fence_wait(done, 1, 0) == XPU_OK, "value 1 stays reached");
  /* the queue lets go of everything before it signals: all of it is releasable now */
  CHECK(api->execution_release(ex) == XPU_OK, "release execution right after the signal");
  CHECK(api->executable_release(exe) == XPU_OK, "release executable");
  CHECK(api->fence_release(gate) == XPU_OK && api->fence_release(done) == XPU_OK, "release fences");
  api->buffer_release(bt);
  api->buffer_release(bi);
  api->buffer_release(bo);
  free(blob);
}

static void test_lifecycle(void) {
  xpu_irb b = {0};
  int64_t s[1] = {4}, z[1] = {0};
  uint32_t tx = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_INPUT, 1, s);
  uint32_t ty = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_VALUE, 1, s);
  xpu_irb_node(&b, XPU_OP_RELU, ty, 1, (const uint32_t[]){tx});
  xpu_irb_output(&b, ty);
  uint64_t size;
  void *blob = xpu_irb_encode(&b, &size);
  xpu_prepare_desc d = {sizeof d, 0, blob, size, NULL, NULL, 0};
  xpu_executable exe = 0;
  xpu_execution ex = 0;
  CHECK(api->graph_prepare(ctx, &d, &exe) == XPU_OK, "prepare relu");
  CHECK(api->execution_create(exe, &ex) == XPU_OK, "execution_create");
  CHECK(api->execution_run(ex) == XPU_E_BAD_STATE, "run with nothing bound");
  xpu_buffer small = buf_with(NULL, 8);
  CHECK(api->execution_bind(ex, 0, small, 0) == XPU_E_INVALID_ARG, "bind a too small buffer");
  CHECK(api->execution_bind(ex, 2, small, 0) == XPU_E_INVALID_ARG, "bind past the io count");
  CHECK(api->executable_release(exe) == XPU_E_BAD_STATE, "release executable with a live execution");
  CHECK(api->context_release(ctx) == XPU_E_BAD_STATE, "release context with live children");
  CHECK(api->execution_release(ex) == XPU_OK && api->executable_release(exe) == XPU_OK, "release");
  CHECK(api->execution_run(ex) == XPU_E_INVALID_HANDLE, "stale execution handle");
  api->buffer_release(small);
  free(blob);
  /* an op the plugin does not map is UNSUPPORTED with a reason, not a failure */
  b.tensors[tx].dtype = b.tensors[ty].dtype = XPU_DT_BF16;
  blob = xpu_irb_encode(&b, &size);
  xpu_node_verdict v = {sizeof v, 0, 0, 0, {0}};
  CHECK(api->graph_analyze(ctx, blob, size, &v, 1) == XPU_OK && v.verdict == XPU_VERDICT_NO && v.reason[0],
        "BF16 refused with a reason");
  d.ir = blob;
  CHECK(api->graph_prepare(ctx, &d, &exe) == XPU_E_UNSUPPORTED, "prepare of a refused node is UNSUPPORTED");
  free(blob);
  b.tensors[tx].dtype = b.tensors[ty].dtype = XPU_DT_F32;
  b.tensors[tx].shape[0] = b.tensors[ty].shape[0] = z[0];
  blob = xpu_irb_encode(&b, &size);
  CHECK(api->graph_analyze(ctx, blob, size, &v, 1) == XPU_OK && v.verdict == XPU_VERDICT_NO, "zero-size refused");
  free(blob);
}

/* the emulator's HTP profile: graph configs, the op-support table, FP16 storage, the real error
 * codes (QnnCommon.h / QnnGraph.h numbering) */
static void test_emulator_htp(const char *path) {
  void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  CHECK(dl, "dlopen %s: %s", path, dlerror());
  if (!dl) return;
  QnnInterfaceGetProvidersFn_t get = (QnnInterfaceGetProvidersFn_t)dlsym(dl, QNN_GET_PROVIDERS_SYMBOL);
  const QnnInterface_t **list = NULL;
  uint32_t n = 0;
  CHECK(get && get(&list, &n) == QNN_SUCCESS && n == 1, "getProviders");
  CHECK(strstr(list[0]->providerName, "XPU_QNN_EMULATOR/HTP") != NULL, "HTP profile named: %s", list[0]->providerName);
  const QnnInterfaceTable_t *f = &list[0]->v2_18;
  Qnn_BackendHandle_t be;
  Qnn_ContextHandle_t ctx;
  Qnn_GraphHandle_t g0, g32, g;
  CHECK(f->backendCreate(NULL, NULL, &be) == QNN_SUCCESS && f->contextCreate(be, NULL, NULL, &ctx) == QNN_SUCCESS, "create");
  QnnHtpGraph_CustomConfig_t hc = {.option = QNN_HTP_GRAPH_CONFIG_OPTION_PRECISION, .precision = QNN_PRECISION_FLOAT32};
  QnnGraph_Config_t gc = {.option = QNN_GRAPH_CONFIG_OPTION_CUSTOM, .customConfig = &hc};
  const QnnGraph_Config_t *cl[] = {&gc, NULL};
  CHECK(f->graphCreate(ctx, "f32", cl, &g32) == QNN_COMMON_ERROR_NOT_SUPPORTED, "FLOAT32 precision is refused (1000)");
  hc.precision = QNN_PRECISION_FLOAT16;
  QnnHtpGraph_CustomConfig_t vt = {.option = QNN_HTP_GRAPH_CONFIG_OPTION_VTCM_SIZE_IN_MB, .vtcmSizeInMB = 8};
  QnnHtpGraph_CustomConfig_t hv = {.option = QNN_HTP_GRAPH_CONFIG_OPTION_NUM_HVX_THREADS, .numHvxThreads = 4};
  QnnGraph_Config_t gv = {.option = QNN_GRAPH_CONFIG_OPTION_CUSTOM, .customConfig = &vt};
  QnnGraph_Config_t gh = {.option = QNN_GRAPH_CONFIG_OPTION_CUSTOM, .customConfig = &hv};
  const QnnGraph_Config_t *cl16[] = {&gc, &gv, &gh, NULL};
  CHECK(f->graphCreate(ctx, "g", cl16, &g) == QNN_SUCCESS, "FP16 precision, VTCM and HVX threads accepted");
  CHECK(f->graphCreate(ctx, "noprec", NULL, &g0) == QNN_SUCCESS, "graph without configs");
  uint32_t d23[2] = {2, 3}, d5[5] = {1, 1, 2, 1, 3};
  Qnn_Tensor_t in0 = tensor(QNN_TENSOR_TYPE_APP_WRITE, 2, d23, NULL, 0), out0 = tensor(QNN_TENSOR_TYPE_APP_READ, 2, d23, NULL, 0);
  CHECK(f->tensorCreateGraphTensor(g0, &in0) == QNN_SUCCESS && f->tensorCreateGraphTensor(g0, &out0) == QNN_SUCCESS, "t0");
  Qnn_Tensor_t i0[2] = {in0, in0};
  CHECK(f->graphAddNode(g0, op("ElementWiseAdd", i0, 2, &out0)) == QNN_GRAPH_ERROR_INVALID_OP_CONFIG &&
            f->errorGetMessage && 1,
        "a float node in a graph without PRECISION = FLOAT16 is refused (6005)");
  Qnn_Tensor_t in = tensor(QNN_TENSOR_TYPE_APP_WRITE, 2, d23, NULL, 0), out = tensor(QNN_TENSOR_TYPE_APP_READ, 2, d23, NULL, 0);
  Qnn_Tensor_t sin5 = tensor(QNN_TENSOR_TYPE_APP_WRITE, 5, d5, NULL, 0), r5 = tensor(QNN_TENSOR_TYPE_NATIVE, 5, d5, NULL, 0);
  CHECK(f->tensorCreateGraphTensor(g, &in) == QNN_SUCCESS && f->tensorCreateGraphTensor(g, &out) == QNN_SUCCESS &&
            f->tensorCreateGraphTensor(g, &sin5) == QNN_SUCCESS && f->tensorCreateGraphTensor(g, &r5) == QNN_SUCCESS,
        "tensors");
  CHECK(f->graphAddNode(g, op("ElementWiseSin", &sin5, 1, &r5)) == QNN_GRAPH_ERROR_INVALID_OP_CONFIG,
        "rank-5 ElementWiseSin refused (HTP: max rank 4)");
  Qnn_Tensor_t ins[2] = {in, in};
  CHECK(f->graphAddNode(g, op("ElementWiseAdd", ins, 2, &out)) == QNN_SUCCESS, "FP16-graph Add");
  CHECK(f->graphExecute(g, &in, 1, &out, 1, NULL, NULL) == QNN_GRAPH_ERROR_GRAPH_NOT_FINALIZED, "6023 before finalize");
  CHECK(f->graphFinalize(g, NULL, NULL) == QNN_SUCCESS, "finalize");
  CHECK(f->graphAddNode(g, op("ElementWiseAdd", ins, 2, &out)) == QNN_GRAPH_ERROR_GRAPH_FINALIZED, "6024 after finalize");
  float x[6] = {1.0001f, 2.0f, 3.14159265f, -0.1f, 65504.0f, 1e-3f}, y[6];
  in.v1.clientBuf = (Qnn_ClientBuffer_t){x, sizeof x};
  out.v1.clientBuf = (Qnn_ClientBuffer_t){y, sizeof y};
  CHECK(f->graphExecute(g, &in, 1, &out, 1, NULL, NULL) == QNN_SUCCESS, "execute");
  CHECK(y[0] == 2.0f && y[2] == 6.28125f && isinf(y[4]), "FP16 arithmetic: x+x of 1.0001 is %g, of pi %g, of 65504 %g",
        y[0], y[2], y[4]);
  Qnn_Tensor_t wrong = in;
  wrong.v1.rank = 1;
  CHECK(f->graphExecute(g, &wrong, 1, &out, 1, NULL, NULL) == QNN_GRAPH_ERROR_INVALID_TENSOR, "6004 for a reshaped input");
  CHECK(f->contextFree(ctx, NULL) == QNN_SUCCESS && f->backendFree(be) == QNN_SUCCESS, "free");
}

/* W8A8 on the HTP profile (op set 3): an 8-bit MatMul with a per-axis weight and a 16-bit
 * output, then Dequantize; the per-axis scales survive a context binary; Dequantize of 32-bit
 * data is not in the HTP table */
static void test_emulator_htp_w8a8(const char *path) {
  void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  CHECK(dl, "dlopen %s: %s", path, dlerror());
  if (!dl) return;
  QnnInterfaceGetProvidersFn_t get = (QnnInterfaceGetProvidersFn_t)dlsym(dl, QNN_GET_PROVIDERS_SYMBOL);
  const QnnInterface_t **list = NULL;
  uint32_t n = 0;
  CHECK(get && get(&list, &n) == QNN_SUCCESS && n == 1, "getProviders");
  const QnnInterfaceTable_t *f = &list[0]->v2_18;
  Qnn_BackendHandle_t be;
  Qnn_ContextHandle_t ctx;
  Qnn_GraphHandle_t g;
  CHECK(f->backendCreate(NULL, NULL, &be) == QNN_SUCCESS && f->contextCreate(be, NULL, NULL, &ctx) == QNN_SUCCESS, "create");
  QnnHtpGraph_CustomConfig_t hc = {.option = QNN_HTP_GRAPH_CONFIG_OPTION_PRECISION, .precision = QNN_PRECISION_FLOAT16};
  QnnGraph_Config_t gc = {.option = QNN_GRAPH_CONFIG_OPTION_CUSTOM, .customConfig = &hc};
  const QnnGraph_Config_t *cl[] = {&gc, NULL};
  CHECK(f->graphCreate(ctx, "w8", cl, &g) == QNN_SUCCESS, "graphCreate");
  uint32_t d23[2] = {2, 3}, d22[2] = {2, 2};
  int8_t qa[6] = {1, -2, 3, 127, -127, -128}, qb[6] = {4, 5, -6, -1, 0, 2};
  Qnn_ScaleOffset_t bso[2] = {{0.25f, 0}, {2.0f, 0}};
  Qnn_Tensor_t a = tensor(QNN_TENSOR_TYPE_APP_WRITE, 2, d23, NULL, 0), b = tensor(QNN_TENSOR_TYPE_STATIC, 2, d23, qb, 6);
  Qnn_Tensor_t acc = tensor(QNN_TENSOR_TYPE_NATIVE, 2, d22, NULL, 0), y = tensor(QNN_TENSOR_TYPE_APP_READ, 2, d22, NULL, 0);
  Qnn_Tensor_t acc32 = tensor(QNN_TENSOR_TYPE_NATIVE, 2, d22, NULL, 0);
  a.v1.dataType = b.v1.dataType = QNN_DATATYPE_SFIXED_POINT_8;
  acc.v1.dataType = QNN_DATATYPE_SFIXED_POINT_16;
  acc32.v1.dataType = QNN_DATATYPE_SFIXED_POINT_32;
  a.v1.quantizeParams = (Qnn_QuantizeParams_t){QNN_DEFINITION_DEFINED, QNN_QUANTIZATION_ENCODING_SCALE_OFFSET,
                                               .scaleOffsetEncoding = {0.5f, 0}};
  acc.v1.quantizeParams = (Qnn_QuantizeParams_t){QNN_DEFINITION_DEFINED, QNN_QUANTIZATION_ENCODING_SCALE_OFFSET,
                                                 .scaleOffsetEncoding = {0.125f, 0}};
  acc32.v1.quantizeParams = (Qnn_QuantizeParams_t){QNN_DEFINITION_DEFINED, QNN_QUANTIZATION_ENCODING_SCALE_OFFSET,
                                                   .scaleOffsetEncoding = {0.125f, 0}};
  b.v1.quantizeParams = (Qnn_QuantizeParams_t){QNN_DEFINITION_DEFINED, QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET,
                                               .axisScaleOffsetEncoding = {0, 2, bso}};
  Qnn_Tensor_t bad = tensor(QNN_TENSOR_TYPE_APP_WRITE, 2, d23, NULL, 0);
  bad.v1.dataType = QNN_DATATYPE_SFIXED_POINT_8;
  bad.v1.quantizeParams = b.v1.quantizeParams;
  CHECK(f->tensorCreateGraphTensor(g, &bad) != QNN_SUCCESS, "a per-axis encoding on a non-static tensor is refused");
  CHECK(f->tensorCreateGraphTensor(g, &a) == QNN_SUCCESS && f->tensorCreateGraphTensor(g, &b) == QNN_SUCCESS &&
            f->tensorCreateGraphTensor(g, &acc) == QNN_SUCCESS && f->tensorCreateGraphTensor(g, &y) == QNN_SUCCESS &&
            f->tensorCreateGraphTensor(g, &acc32) == QNN_SUCCESS,
        "W8A8 tensors");
  Qnn_Param_t tp[2] = {
      {.paramType = QNN_PARAMTYPE_SCALAR, .name = "transpose_in0", .scalarParam = {.dataType = QNN_DATATYPE_BOOL_8, .bool8Value = 0}},
      {.paramType = QNN_PARAMTYPE_SCALAR, .name = "transpose_in1", .scalarParam = {.dataType = QNN_DATATYPE_BOOL_8, .bool8Value = 1}}};
  Qnn_Tensor_t mi[2] = {a, b};
  Qnn_OpConfig_t mm = op("MatMul", mi, 2, &acc);
  mm.v1.numOfParams = 2;
  mm.v1.params = tp;
  CHECK(f->graphAddNode(g, mm) == QNN_SUCCESS, "8-bit MatMul with a per-axis weight and a 16-bit output");
  Qnn_OpConfig_t mm32 = op("MatMul", mi, 2, &acc32);
  mm32.v1.numOfParams = 2;
  mm32.v1.params = tp;
  CHECK(f->graphAddNode(g, mm32) == QNN_GRAPH_ERROR_INVALID_OP_CONFIG,
        "a per-axis weight into 32-bit accumulators is refused (their scale would be per column)");
  Qnn_Tensor_t y2 = tensor(QNN_TENSOR_TYPE_NATIVE, 2, d22, NULL, 0);
  CHECK(f->tensorCreateGraphTensor(g, &y2) == QNN_SUCCESS, "y2");
  Qnn_Tensor_t q32 = acc32; /* a graph input: produced, so only the op table can refuse the node */
  q32.v1.type = QNN_TENSOR_TYPE_APP_WRITE;
  CHECK(f->tensorCreateGraphTensor(g, &q32) == QNN_SUCCESS, "q32");
  Qnn_ErrorHandle_t e32 = f->graphAddNode(g, op("Dequantize", &q32, 1, &y2));
  const char *msg = "";
  if (e32 != QNN_SUCCESS) f->errorGetMessage(e32, &msg);
  CHECK(e32 != QNN_SUCCESS && msg && strstr(msg, "HTP op support table"),
        "Dequantize of SFIXED_POINT_32 is not in the HTP table: %llu %s", (unsigned long long)e32, msg ? msg : "");
  CHECK(f->graphAddNode(g, op("Dequantize", &acc, 1, &y)) == QNN_SUCCESS, "Dequantize of SFIXED_POINT_16");
  CHECK(f->graphFinalize(g, NULL, NULL) == QNN_SUCCESS, "finalize");
  /* acc = [[-24 5] [641 -383]]; out = acc·0.5·sb[n] on the 0.125 grid */
  float want[4] = {-3, 5, 80.125f, -383}, got[4];
  a.v1.clientBuf = (Qnn_ClientBuffer_t){qa, sizeof qa};
  y.v1.clientBuf = (Qnn_ClientBuffer_t){got, sizeof got};
  CHECK(f->graphExecute(g, &a, 1, &y, 1, NULL, NULL) == QNN_SUCCESS, "execute");
  CHECK(memcmp(got, want, sizeof got) == 0, "W8A8: %g %g %g %g", got[0], got[1], got[2], got[3]);
  Qnn_ContextBinarySize_t sz = 0, wr = 0;
  CHECK(f->contextGetBinarySize(ctx, &sz) == QNN_SUCCESS && sz > 0, "binary size");
  uint8_t *bin = malloc(sz);
  CHECK(bin && f->contextGetBinary(ctx, bin, sz, &wr) == QNN_SUCCESS && wr == sz, "get binary");
  Qnn_ContextHandle_t ctx2 = NULL;
  Qnn_GraphHandle_t g2 = NULL;
  CHECK(f->contextCreateFromBinary(be, NULL, NULL, bin, wr, &ctx2, NULL) == QNN_SUCCESS && f->graphRetrieve(ctx2, "w8", &g2) == QNN_SUCCESS,
        "from binary");
  memset(got, 0, sizeof got);
  CHECK(g2 && f->graphExecute(g2, &a, 1, &y, 1, NULL, NULL) == QNN_SUCCESS && memcmp(got, want, sizeof got) == 0,
        "W8A8 from the binary (per-axis scales kept): %g %g %g %g", got[0], got[1], got[2], got[3]);
  for (uint64_t cut = 0; cut < wr; cut += 5) { /* truncations, the per-axis scales' included, are refused */
    Qnn_ContextHandle_t c3 = NULL;
    CHECK(f->contextCreateFromBinary(be, NULL, NULL, bin, cut, &c3, NULL) != QNN_SUCCESS, "truncated binary %llu",
          (unsigned long long)cut);
  }
  free(bin);
  CHECK(f->contextFree(ctx2, NULL) == QNN_SUCCESS && f->contextFree(ctx, NULL) == QNN_SUCCESS && f->backendFree(be) == QNN_SUCCESS,
        "free");
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s <libxpu-qnn.so> <libQnnXpuEmu.so>\n", argv[0]);
    return 2;
  }
  /* XPU_QNN_EMU_PROFILE=htp: the emulator's HTP rules only (the plugin's HTP lowering is checked by
   * conformance and the Go tests); otherwise (cpu) everything below against f32 references */
  const char *prof = getenv("XPU_QNN_EMU_PROFILE");
  if (!prof || strcmp(prof, "cpu") != 0) {
    test_emulator_htp(argv[2]);
    test_emulator_htp_w8a8(argv[2]);
    if (failures) fprintf(stderr, "qnn_ctest (htp profile): %d failures\n", failures);
    return failures ? 1 : 0;
  }
  test_emulator(argv[2]);

  char stats[] = "/tmp/qnn-ctest-stats-XXXXXX";
  int sfd = mkstemp(stats);
  CHECK(sfd >= 0, "mkstemp");
  close(sfd);
  setenv("XPU_QNN_EMU_STATS", stats, 1);
  setenv("XPU_QNN_LIBRARY", argv[2], 1);
  void *dl = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  CHECK(dl, "dlopen plugin: %s", dlerror());
  if (!dl) return 1;
  xpu_plugin_probe_fn probe = (xpu_plugin_probe_fn)dlsym(dl, "xpu_plugin_probe");
  xpu_plugin_open_fn open_fn = (xpu_plugin_open_fn)dlsym(dl, "xpu_plugin_open");
  xpu_probe_result pr = {sizeof pr, 0, 0, 0, {0}, {0}};
  CHECK(probe && probe(&pr) == XPU_OK && pr.score > 0 && strstr(pr.reason, "emulated provider"), "probe: %d %s", pr.score,
        pr.reason);
  xpu_host_info host = {sizeof host, XPU_ABI_MAJOR, XPU_ABI_MINOR, 0, NULL, NULL, NULL};
  CHECK(open_fn && open_fn(&host, &api) == XPU_OK && api, "open");
  if (!api) return 1;
  uint32_t n = 0;
  xpu_device_info di = {.struct_size = sizeof di};
  CHECK(api->device_count(&n) == XPU_OK && n == 1, "one device");
  CHECK(api->device_info(0, &di) == XPU_OK && strcmp(di.name, "qnn (emulated provider)") == 0, "device name: %s", di.name);
  CHECK((di.caps & XPU_CAP_EMULATED) && (di.caps & XPU_CAP_STATIC_SHAPES) && (di.caps & XPU_CAP_SERIALIZE) &&
            (di.caps & XPU_CAP_IMPORT_FD) && di.kind == XPU_DEVICE_CPU,
        "caps 0x%llx", (unsigned long long)di.caps);
  CHECK(api->context_create(0, NULL, &ctx) == XPU_OK, "context_create: %s", lasterr(0));

  test_matmul_silu_and_cache(stats);
  test_softmax_rmsnorm();
  test_rope(0, 8);
  test_rope(0, 4);
  test_rope(1, 8);
  test_rope(1, 6);
  test_attention(0, 2);
  test_attention(1, 2);
  test_attention(1, -1);
  test_int8_and_fd(stats);
  test_async();
  test_lifecycle();

  CHECK(api->context_release(ctx) == XPU_OK, "context_release: %s", lasterr(ctx));
  CHECK(api->shutdown() == XPU_OK, "shutdown: %s", lasterr(0));
  unlink(stats);
  if (failures) {
    fprintf(stderr, "qnn_ctest: %d failures\n", failures);
    return 1;
  }
  printf("qnn_ctest: ok\n");
  return 0;
}
