/*
 * smoke.c: drives libxpu-opencl.so through the raw C ABI with hand-built IR blobs, so the
 * plugin is checked without the Go loader. Usage: opencl-smoke [--probe-only-zero] <plugin.so>
 * --probe-only-zero: expects score 0 with a reason (run with XPU_OPENCL_LIBRARY=/nonexistent).
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xpu_backend.h"
#include "xpu_ir.h"
#include "xpu_ir_build.h"

static const xpu_api *A;
static int failures;

#define CHECK(cond, ...)                                                                         \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                      \
      fprintf(stderr, __VA_ARGS__);                                                              \
      fprintf(stderr, "\n");                                                                     \
      failures++;                                                                                \
    }                                                                                            \
  } while (0)

static const char *lasterr(xpu_handle h) {
  static char buf[512];
  A->last_error(h, buf, sizeof buf, NULL);
  return buf;
}

#define OK(call, h)                                                                              \
  do {                                                                                           \
    xpu_status s_ = (call);                                                                      \
    if (s_ != XPU_OK) {                                                                          \
      fprintf(stderr, "FAIL %s:%d: %s = %d: %s\n", __FILE__, __LINE__, #call, s_, lasterr(h));   \
      exit(1);                                                                                   \
    }                                                                                            \
  } while (0)

static float frand(unsigned *s) {
  *s = *s * 1664525u + 1013904223u;
  return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static uint16_t f2h(float f) { /* round to nearest even, normal range only (test values) */
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000, e = (u >> 23) & 0xff, m = u & 0x7fffff;
  if (e == 0 && m == 0) return (uint16_t)sign;
  int ne = (int)e - 127 + 15;
  if (ne <= 0) return (uint16_t)sign; /* flush tiny values: never produced below */
  uint32_t hm = m >> 13, rest = m & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (hm & 1))) hm++;
  uint32_t v = ((uint32_t)ne << 10) + hm;
  return (uint16_t)(sign | v);
}

static float h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31, m = h & 0x3ff, u;
  if (e == 0) {
    float f = ldexpf((float)m, -24);
    return sign ? -f : f;
  }
  u = sign | ((e - 15 + 127) << 23) | (m << 13);
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static xpu_buffer upload(xpu_context ctx, const void *p, uint64_t n) {
  xpu_buffer b;
  OK(A->buffer_alloc(ctx, n, XPU_BUFFER_DEVICE, &b), ctx);
  OK(A->buffer_write(b, 0, p, n), b);
  return b;
}

/* matmul f32 [M,K] x [N,K]^T and Q8_0 b, against a host reference */
static void test_matmul(xpu_context ctx, int64_t M, int64_t N, int64_t K, int q8) {
  unsigned s = 42;
  float *a = malloc(M * K * 4), *b = malloc(N * K * 4), *ref = malloc(M * N * 4);
  for (int64_t i = 0; i < M * K; i++) a[i] = frand(&s);
  for (int64_t i = 0; i < N * K; i++) b[i] = frand(&s);
  uint8_t *bq = NULL;
  uint64_t bbytes = N * K * 4;
  if (q8) { /* quantize b on the host; the reference uses the dequantized values */
    bbytes = N * K / 32 * 34;
    bq = malloc(bbytes);
    for (int64_t blk = 0; blk < N * K / 32; blk++) {
      float amax = 0;
      for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(b[blk * 32 + j]));
      float d = amax / 127, id = d ? 1 / d : 0;
      uint16_t hd = f2h(d);
      memcpy(bq + blk * 34, &hd, 2);
      for (int j = 0; j < 32; j++) {
        int8_t q = (int8_t)roundf(b[blk * 32 + j] * id);
        bq[blk * 34 + 2 + j] = (uint8_t)q;
        b[blk * 32 + j] = h2f(hd) * q;
      }
    }
  }
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      double acc = 0;
      for (int64_t k = 0; k < K; k++) acc += (double)a[m * K + k] * b[n * K + k];
      ref[m * N + n] = (float)acc;
    }
  xpu_buffer wb = upload(ctx, q8 ? (void *)bq : (void *)b, bbytes);
  xpu_irb g = {0};
  int64_t sa[2] = {M, K}, sb[2] = {N, K}, so[2] = {M, N};
  uint32_t ta = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_INPUT, 2, sa);
  uint32_t tb = xpu_irb_tensor(&g, q8 ? XPU_DT_Q8_0 : XPU_DT_F32, XPU_TENSOR_CONST, 2, sb);
  g.tensors[tb].const_buffer = wb;
  uint32_t to = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 2, so);
  uint32_t ins[2] = {ta, tb};
  xpu_irb_node(&g, XPU_OP_MATMUL, to, 2, ins);
  xpu_irb_output(&g, to);
  uint64_t sz;
  void *bl = xpu_irb_encode(&g, &sz);
  xpu_prepare_desc pd = {sizeof pd, 0, bl, sz, NULL, NULL, 0};
  xpu_executable exe;
  xpu_execution ex;
  OK(A->graph_prepare(ctx, &pd, &exe), ctx);
  free(bl);
  OK(A->execution_create(exe, &ex), exe);
  /* the input sits at an offset that is not a sub-buffer alignment: passed as a kernel arg */
  xpu_buffer ab, ob;
  OK(A->buffer_alloc(ctx, M * K * 4 + 12, XPU_BUFFER_HOST_VISIBLE, &ab), ctx);
  OK(A->buffer_write(ab, 12, a, M * K * 4), ab);
  OK(A->buffer_alloc(ctx, M * N * 4, XPU_BUFFER_DEVICE, &ob), ctx);
  OK(A->execution_bind(ex, 0, ab, 12), ex);
  OK(A->execution_bind(ex, 1, ob, 0), ex);
  OK(A->execution_run(ex), ex);
  float *got = malloc(M * N * 4);
  OK(A->buffer_read(ob, 0, got, M * N * 4), ob);
  double maxerr = 0;
  for (int64_t i = 0; i < M * N; i++) maxerr = fmax(maxerr, fabs(got[i] - ref[i]));
  CHECK(maxerr < 1e-3 * sqrt((double)K), "matmul %lldx%lldx%lld q8=%d: max error %g", (long long)M,
        (long long)N, (long long)K, q8, maxerr);
  OK(A->execution_release(ex), ex);
  OK(A->executable_release(exe), exe);
  OK(A->buffer_release(ab), ab);
  OK(A->buffer_release(ob), ob);
  OK(A->buffer_release(wb), wb);
  free(a); free(b); free(ref); free(bq); free(got);
}

/* softmax with a causal mask chained after an ADD through a fence: no host round trip */
static void test_async_chain(xpu_context ctx) {
  enum { M = 3, N = 5 };
  float x[M * N], y[N], got[M * N];
  unsigned s = 7;
  for (int i = 0; i < M * N; i++) x[i] = frand(&s) * 3;
  for (int i = 0; i < N; i++) y[i] = frand(&s);
  /* graph 1: z = x + y (broadcast) */
  xpu_irb g1 = {0};
  int64_t sx[2] = {M, N}, sy[1] = {N};
  uint32_t tx = xpu_irb_tensor(&g1, XPU_DT_F32, XPU_TENSOR_INPUT, 2, sx);
  uint32_t ty = xpu_irb_tensor(&g1, XPU_DT_F32, XPU_TENSOR_INPUT, 1, sy);
  uint32_t tz = xpu_irb_tensor(&g1, XPU_DT_F32, XPU_TENSOR_VALUE, 2, sx);
  uint32_t i1[2] = {tx, ty};
  xpu_irb_node(&g1, XPU_OP_ADD, tz, 2, i1);
  xpu_irb_output(&g1, tz);
  /* graph 2: softmax(z, causal, offset N - M) */
  xpu_irb g2 = {0};
  uint32_t tz2 = xpu_irb_tensor(&g2, XPU_DT_F32, XPU_TENSOR_INPUT, 2, sx);
  uint32_t ts = xpu_irb_tensor(&g2, XPU_DT_F32, XPU_TENSOR_VALUE, 2, sx);
  xpu_ir_node *sm = xpu_irb_node(&g2, XPU_OP_SOFTMAX, ts, 1, &tz2);
  sm->iattr[0] = 1;
  sm->iattr[1] = N - M;
  xpu_irb_output(&g2, ts);
  xpu_executable e1, e2;
  xpu_execution x1, x2;
  uint64_t sz;
  void *b1 = xpu_irb_encode(&g1, &sz);
  xpu_prepare_desc pd = {sizeof pd, 0, b1, sz, NULL, NULL, 0};
  OK(A->graph_prepare(ctx, &pd, &e1), ctx);
  void *b2 = xpu_irb_encode(&g2, &sz);
  pd.ir = b2;
  pd.ir_size = sz;
  OK(A->graph_prepare(ctx, &pd, &e2), ctx);
  free(b1);
  free(b2);
  OK(A->execution_create(e1, &x1), e1);
  OK(A->execution_create(e2, &x2), e2);
  xpu_buffer bx = upload(ctx, x, sizeof x), by = upload(ctx, y, sizeof y), bz, bs;
  OK(A->buffer_alloc(ctx, sizeof x, XPU_BUFFER_DEVICE, &bz), ctx);
  OK(A->buffer_alloc(ctx, sizeof x, XPU_BUFFER_HOST_VISIBLE, &bs), ctx);
  OK(A->execution_bind(x1, 0, bx, 0), x1);
  OK(A->execution_bind(x1, 1, by, 0), x1);
  OK(A->execution_bind(x1, 2, bz, 0), x1);
  OK(A->execution_bind(x2, 0, bz, 0), x2);
  OK(A->execution_bind(x2, 1, bs, 0), x2);
  xpu_fence f, gate;
  OK(A->fence_create(ctx, 0, &f), ctx);
  OK(A->fence_create(ctx, 0, &gate), ctx);
  /* x1 waits for a host signal on gate; x2 waits for x1 on f */
  xpu_fence_point wg = {gate, 1}, s1 = {f, 1}, s2 = {f, 2};
  OK(A->execution_submit(x1, &wg, 1, &s1), x1);
  OK(A->execution_submit(x2, &s1, 1, &s2), x2);
  CHECK(A->fence_wait(f, 2, 1000000) == XPU_E_TIMEOUT, "work ran before the host signal");
  CHECK(A->execution_release(x1) == XPU_E_BAD_STATE, "released an execution in flight");
  float peek[N]; /* host transfers do not queue behind gated work (that would hang here) */
  OK(A->buffer_read(by, 0, peek, sizeof peek), by);
  CHECK(memcmp(peek, y, sizeof y) == 0, "buffer_read while work is gated");
  OK(A->fence_signal(gate, 1), gate);
  OK(A->fence_wait(f, 2, -1), f);
  uint64_t v = 0;
  OK(A->fence_value(f, &v), f);
  CHECK(v == 2, "fence value %llu, want 2", (unsigned long long)v);
  void *mp;
  OK(A->buffer_map(bs, &mp), bs);
  memcpy(got, mp, sizeof got);
  OK(A->buffer_unmap(bs), bs);
  for (int i = 0; i < M; i++) {
    double mx = -INFINITY, sum = 0;
    int vis = i + (N - M) + 1;
    for (int j = 0; j < vis; j++) mx = fmax(mx, x[i * N + j] + y[j]);
    for (int j = 0; j < vis; j++) sum += exp(x[i * N + j] + y[j] - mx);
    for (int j = 0; j < N; j++) {
      double want = j < vis ? exp(x[i * N + j] + y[j] - mx) / sum : 0;
      CHECK(fabs(got[i * N + j] - want) < 1e-5, "softmax[%d,%d] = %g, want %g", i, j,
            got[i * N + j], want);
    }
  }
  OK(A->execution_release(x1), x1);
  OK(A->execution_release(x2), x2);
  OK(A->executable_release(e1), e1);
  OK(A->executable_release(e2), e2);
  OK(A->fence_release(f), f);
  OK(A->fence_release(gate), gate);
  xpu_buffer bufs[4] = {bx, by, bz, bs};
  for (int i = 0; i < 4; i++) OK(A->buffer_release(bufs[i]), bufs[i]);
}

/* GET_ROWS with an id out of range fails with INVALID_ARG at execution */
static void test_get_rows_error(xpu_context ctx) {
  float table[4 * 32];
  for (int i = 0; i < 4 * 32; i++) table[i] = (float)i;
  int32_t ids[3] = {2, 0, 9};
  xpu_buffer bt = upload(ctx, table, sizeof table), bi = upload(ctx, ids, sizeof ids), bo;
  OK(A->buffer_alloc(ctx, 3 * 32 * 4, XPU_BUFFER_DEVICE, &bo), ctx);
  xpu_irb g = {0};
  int64_t st[2] = {4, 32}, si[1] = {3}, so[2] = {3, 32};
  uint32_t tt = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_CONST, 2, st);
  g.tensors[tt].const_buffer = bt;
  uint32_t ti = xpu_irb_tensor(&g, XPU_DT_I32, XPU_TENSOR_INPUT, 1, si);
  uint32_t to = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 2, so);
  uint32_t ins[2] = {tt, ti};
  xpu_irb_node(&g, XPU_OP_GET_ROWS, to, 2, ins);
  xpu_irb_output(&g, to);
  uint64_t sz;
  void *bl = xpu_irb_encode(&g, &sz);
  xpu_prepare_desc pd = {sizeof pd, 0, bl, sz, NULL, NULL, 0};
  xpu_executable exe;
  xpu_execution ex;
  OK(A->graph_prepare(ctx, &pd, &exe), ctx);
  free(bl);
  OK(A->execution_create(exe, &ex), exe);
  OK(A->execution_bind(ex, 0, bi, 0), ex);
  OK(A->execution_bind(ex, 1, bo, 0), ex);
  xpu_status s = A->execution_run(ex);
  CHECK(s == XPU_E_INVALID_ARG, "id 9 of 4 rows: status %d, want INVALID_ARG", s);
  CHECK(strstr(lasterr(ex), "GET_ROWS") != NULL, "message: %s", lasterr(ex));
  ids[2] = 3;
  OK(A->buffer_write(bi, 0, ids, sizeof ids), bi);
  OK(A->execution_run(ex), ex);
  float got[3 * 32];
  OK(A->buffer_read(bo, 0, got, sizeof got), bo);
  CHECK(got[0] == 64 && got[32] == 0 && got[64 + 5] == 101, "get_rows values wrong");
  OK(A->execution_release(ex), ex);
  OK(A->executable_release(exe), exe);
  OK(A->buffer_release(bt), bt);
  OK(A->buffer_release(bi), bi);
  OK(A->buffer_release(bo), bo);
}

int main(int argc, char **argv) {
  int zero = argc > 2 && strcmp(argv[1], "--probe-only-zero") == 0;
  const char *path = argv[argc - 1];
  if (argc < 2) {
    fprintf(stderr, "usage: %s [--probe-only-zero] libxpu-opencl.so\n", argv[0]);
    return 2;
  }
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
    return 1;
  }
  xpu_plugin_probe_fn probe = (xpu_plugin_probe_fn)dlsym(lib, "xpu_plugin_probe");
  xpu_plugin_open_fn open = (xpu_plugin_open_fn)dlsym(lib, "xpu_plugin_open");
  if (!probe || !open) {
    fprintf(stderr, "missing exports\n");
    return 1;
  }
  xpu_probe_result pr = {.struct_size = sizeof pr};
  if (probe(&pr) != XPU_OK) return 1;
  printf("probe: score %d: %s\n", pr.score, pr.reason);
  if (zero) {
    CHECK(pr.score == 0 && pr.reason[0], "expected score 0 with a reason");
    const xpu_api *api = NULL;
    CHECK(open(NULL, &api) == XPU_E_MISSING_DEP, "open without libOpenCL must be MISSING_DEP");
    return failures ? 1 : 0;
  }
  if (pr.score <= 0) {
    printf("SKIP: no OpenCL device: %s\n", pr.reason);
    return 0;
  }
  OK(open(NULL, &A), 0);
  uint32_t nd;
  OK(A->device_count(&nd), 0);
  xpu_device_info di = {.struct_size = sizeof di};
  OK(A->device_info(0, &di), 0);
  printf("device 0: %s (%s), caps 0x%llx\n", di.name, di.driver_version,
         (unsigned long long)di.caps);
  xpu_context ctx;
  OK(A->context_create(0, NULL, &ctx), 0);
  test_matmul(ctx, 37, 45, 70, 0);
  test_matmul(ctx, 5, 33, 64, 1);
  test_async_chain(ctx);
  test_get_rows_error(ctx);
  CHECK(A->buffer_release(12345) == XPU_E_INVALID_HANDLE, "foreign handle accepted");
  { /* an empty tensor's buffer: size 0, still maps */
    xpu_buffer zb;
    uint64_t zs = 1;
    void *zp = NULL;
    OK(A->buffer_alloc(ctx, 0, XPU_BUFFER_HOST_VISIBLE, &zb), ctx);
    OK(A->buffer_size(zb, &zs), zb);
    CHECK(zs == 0, "size %llu", (unsigned long long)zs);
    OK(A->buffer_map(zb, &zp), zb);
    CHECK(zp != NULL, "null map");
    OK(A->buffer_unmap(zb), zb);
    OK(A->buffer_release(zb), zb);
  }
  if (di.caps & XPU_CAP_IMPORT_HOST) { /* the driver refuses the size: its error is named */
    static char small[64];
    xpu_import_desc id = {sizeof id, XPU_IMPORT_HOST, small, -1, 0, 1ull << 62};
    xpu_buffer hb;
    CHECK(A->buffer_import(ctx, &id, &hb) != XPU_OK, "imported 2^62 bytes");
    CHECK(strstr(lasterr(ctx), "CL_INVALID_BUFFER_SIZE") != NULL, "error without CL name: %s",
          lasterr(ctx));
  }
  OK(A->context_release(ctx), ctx);
  OK(A->shutdown(), 0);
  printf("%s\n", failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
