/*
 * smoke.c: C-level check of libxpu-neon.so, run under valgrind by `make test` (and under qemu
 * for the arm64 build): probe, device, every lifecycle error the ABI names, and small graphs
 * built by hand in the IR (attention over a KV cache whose unused rows hold NaN, a quantized
 * matmul, causal softmax) compared with a double-precision computation here.
 *
 * usage: neon-smoke path/to/libxpu-neon.so
 */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xpu_backend.h"
#include "xpu_ir.h"
#include "xpu_ir_build.h"

static const xpu_api *api;
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

#define EXPECT(call, want)                                                                       \
  do {                                                                                           \
    xpu_status s_ = (call);                                                                      \
    CHECK(s_ == (want), "%s returned %d, want %d", #call, s_, (want));                           \
  } while (0)

/* a status other than OK must come with a message on that handle */
static void expect_err(xpu_status s, xpu_status want, xpu_handle h, const char *what) {
  CHECK(s == want, "%s: status %d, want %d", what, s, want);
  char buf[512];
  uint32_t len = 0;
  api->last_error(h, buf, sizeof buf, &len);
  CHECK(len > 0, "%s: empty last_error", what);
}

/* ---------------------------------------------------------------- helpers */

static xpu_executable prepare(xpu_context ctx, const xpu_irb *g, const char *opts) {
  uint64_t size;
  void *blob = xpu_irb_encode(g, &size);
  CHECK(blob != NULL, "xpu_irb_encode: graph over the builder's capacity");
  xpu_prepare_desc d = {sizeof d, 0, blob, size, opts, NULL, 0};
  xpu_executable exe = 0;
  xpu_status s = api->graph_prepare(ctx, &d, &exe);
  if (s != XPU_OK) {
    char buf[512];
    api->last_error(ctx, buf, sizeof buf, NULL);
    CHECK(0, "graph_prepare: %d %s", s, buf);
  }
  free(blob);
  return exe;
}

static xpu_buffer upload(xpu_context ctx, const void *data, uint64_t size) {
  xpu_buffer b = 0;
  EXPECT(api->buffer_alloc(ctx, size, XPU_BUFFER_HOST_VISIBLE, &b), XPU_OK);
  if (data && size) EXPECT(api->buffer_write(b, 0, data, size), XPU_OK);
  return b;
}

static float frand(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return (float)((*s >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}

static double max_err(const float *got, const double *want, int n) {
  double m = 0;
  for (int i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]);
    if (!(e <= m)) m = e; /* NaN counts as the worst */
  }
  return m;
}

/* ---------------------------------------------------------------- cases */

/* causal GQA attention reading a KV cache of capacity 8 of which only 5 rows are valid: the
 * rest is NaN and must never be read. q_offset comes from an input. */
static void test_attention(xpu_context ctx) {
  enum { TQ = 2, HQ = 4, HKV = 2, D = 8, CAP = 8, VALID = 5 };
  xpu_irb g = {0};
  int64_t qs[3] = {TQ, HQ, D}, ks[3] = {VALID, HKV, D}, one[1] = {1};
  uint32_t q = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_INPUT, 3, qs);
  uint32_t k = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_INPUT, 3, ks);
  uint32_t v = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_INPUT, 3, ks);
  uint32_t off = xpu_irb_tensor(&g, XPU_DT_I32, XPU_TENSOR_INPUT, 1, one);
  uint32_t o = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 3, qs);
  uint32_t ins[4] = {q, k, v, off};
  xpu_ir_node *n = xpu_irb_node(&g, XPU_OP_ATTENTION, o, 4, ins);
  n->iattr[0] = 1;
  xpu_irb_output(&g, o);
  xpu_executable exe = prepare(ctx, &g, "threads=2");

  unsigned seed = 1;
  float qd[TQ * HQ * D], kd[CAP * HKV * D], vd[CAP * HKV * D], out[TQ * HQ * D];
  for (int i = 0; i < TQ * HQ * D; i++) qd[i] = frand(&seed);
  for (int i = 0; i < CAP * HKV * D; i++) {
    kd[i] = i < VALID * HKV * D ? frand(&seed) : NAN;
    vd[i] = i < VALID * HKV * D ? frand(&seed) : NAN;
  }
  int32_t qoff = VALID - TQ; /* the 2 queries are the last 2 positions */
  xpu_buffer bq = upload(ctx, qd, sizeof qd), bk = upload(ctx, kd, sizeof kd), bv = upload(ctx, vd, sizeof vd);
  xpu_buffer bo = upload(ctx, NULL, sizeof out), boff = upload(ctx, &qoff, 4);
  xpu_execution ex = 0;
  EXPECT(api->execution_create(exe, &ex), XPU_OK);
  expect_err(api->execution_run(ex), XPU_E_BAD_STATE, ex, "run before bind");
  EXPECT(api->execution_bind(ex, 0, bq, 0), XPU_OK);
  EXPECT(api->execution_bind(ex, 1, bk, 0), XPU_OK);
  EXPECT(api->execution_bind(ex, 2, bv, 0), XPU_OK);
  EXPECT(api->execution_bind(ex, 3, boff, 0), XPU_OK);
  expect_err(api->execution_bind(ex, 4, bo, 8), XPU_E_INVALID_ARG, ex, "bind past the end");
  expect_err(api->execution_bind(ex, 5, bo, 0), XPU_E_INVALID_ARG, ex, "bind io out of range");
  EXPECT(api->execution_bind(ex, 4, bo, 0), XPU_OK);
  EXPECT(api->execution_run(ex), XPU_OK);
  EXPECT(api->buffer_read(bo, 0, out, sizeof out), XPU_OK);

  double want[TQ * HQ * D];
  for (int i = 0; i < TQ; i++)
    for (int h = 0; h < HQ; h++) {
      int hk = h / (HQ / HKV), vis = i + qoff + 1;
      double sc[VALID], mx = -INFINITY, sum = 0;
      for (int j = 0; j < vis; j++) {
        double s = 0;
        for (int d = 0; d < D; d++) s += (double)qd[(i * HQ + h) * D + d] * kd[(j * HKV + hk) * D + d];
        sc[j] = s / sqrt((double)D);
        if (sc[j] > mx) mx = sc[j];
      }
      for (int j = 0; j < vis; j++) sum += (sc[j] = exp(sc[j] - mx));
      for (int d = 0; d < D; d++) {
        double acc = 0;
        for (int j = 0; j < vis; j++) acc += sc[j] / sum * vd[(j * HKV + hk) * D + d];
        want[(i * HQ + h) * D + d] = acc;
      }
    }
  double e = max_err(out, want, TQ * HQ * D);
  CHECK(e < 1e-5, "attention: max error %g", e);

  /* submit: waits on a host fence, so it stays in flight until the host signals */
  xpu_fence fa = 0, fb = 0;
  EXPECT(api->fence_create(ctx, 0, &fa), XPU_OK);
  EXPECT(api->fence_create(ctx, 0, &fb), XPU_OK);
  xpu_fence_point w = {fa, 1}, sig = {fb, 1};
  EXPECT(api->execution_submit(ex, &w, 1, &sig), XPU_OK);
  expect_err(api->execution_release(ex), XPU_E_BAD_STATE, ex, "release while in flight");
  expect_err(api->execution_run(ex), XPU_E_BAD_STATE, ex, "run while in flight");
  expect_err(api->buffer_release(bq), XPU_E_BAD_STATE, bq, "buffer release while in flight");
  expect_err(api->fence_wait(fb, 1, 20 * 1000 * 1000), XPU_E_TIMEOUT, fb, "fence wait timeout");
  EXPECT(api->fence_signal(fa, 1), XPU_OK);
  EXPECT(api->fence_wait(fb, 1, -1), XPU_OK);
  uint64_t val = 0;
  EXPECT(api->fence_value(fb, &val), XPU_OK);
  CHECK(val == 1, "fence value %llu", (unsigned long long)val);
  memset(out, 0, sizeof out);
  EXPECT(api->buffer_read(bo, 0, out, sizeof out), XPU_OK);
  CHECK(max_err(out, want, TQ * HQ * D) < 1e-5, "attention via submit differs");

  /* releasing a bound buffer's handle is fine: the execution keeps the bytes alive */
  EXPECT(api->buffer_release(bq), XPU_OK);
  EXPECT(api->execution_run(ex), XPU_OK);
  expect_err(api->buffer_size(bq, &val), XPU_E_INVALID_HANDLE, 0, "stale buffer handle");
  expect_err(api->context_release(ctx), XPU_E_BAD_STATE, ctx, "context release with children");
  expect_err(api->executable_release(exe), XPU_E_BAD_STATE, exe, "executable release with executions");

  EXPECT(api->execution_release(ex), XPU_OK);
  EXPECT(api->executable_release(exe), XPU_OK);
  expect_err(api->executable_release(exe), XPU_E_INVALID_HANDLE, 0, "double release");
  EXPECT(api->fence_release(fa), XPU_OK);
  EXPECT(api->fence_release(fb), XPU_OK);
  api->buffer_release(bk), api->buffer_release(bv), api->buffer_release(bo), api->buffer_release(boff);
}

static float half_at(const uint8_t *p);

/* value i of a Q8_0/Q4_0 row (OPS.md: d * q, Q4_0's nibble less 8) */
static float q_value(uint32_t dt, const uint8_t *row, int i) {
  const uint8_t *b = row + (i / 32) * (dt == XPU_DT_Q8_0 ? 34 : 18);
  int l = i % 32, q = dt == XPU_DT_Q8_0 ? (int)(int8_t)b[2 + l] : (l < 16 ? (b[2 + l] & 15) : (b[2 + l - 16] >> 4)) - 8;
  return half_at(b) * (float)q;
}

/* Op set 5 attention over a Q8_0/Q4_0 KV cache of capacity CAP with VALID rows, a sliding
 * window and a soft-cap, for a decode row and a 3-row chunk: the rows before every query's
 * window and past the valid length have NaN scales and must never be read. */
static void test_attention_v5(xpu_context ctx, uint32_t kvt) {
  enum { HQ = 8, HKV = 2, D = 64, CAP = 80, VALID = 70, W = 20 };
  const size_t bb = kvt == XPU_DT_Q8_0 ? 34 : 18, row = (size_t)(D / 32) * bb;
  static uint8_t kq[CAP * HKV * (D / 32) * 34], vq[CAP * HKV * (D / 32) * 34];
  unsigned seed = 7;
  for (int t = 0; t < 2; t++) {
    uint8_t *c = t ? vq : kq;
    for (int r = 0; r < CAP * HKV; r++)
      for (int b = 0; b < D / 32; b++) {
        uint8_t *blk = c + (size_t)r * row + (size_t)b * bb;
        int pos = r / HKV, dead = pos >= VALID || pos < VALID - 3 - W + 1;
        unsigned h = dead ? 0x7E00u : 0x2000u + (unsigned)(frand(&seed) * 500.0f + 500.0f);
        blk[0] = (uint8_t)h, blk[1] = (uint8_t)(h >> 8);
        for (size_t i = 2; i < bb; i++) blk[i] = (uint8_t)(frand(&seed) * 127.0f + 128.0f);
      }
  }
  for (int tq = 1; tq <= 3; tq += 2) {
    xpu_irb g = {0};
    int64_t qs[3] = {tq, HQ, D}, ks[3] = {CAP, HKV, D};
    uint32_t q = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_INPUT, 3, qs);
    uint32_t k = xpu_irb_tensor(&g, kvt, XPU_TENSOR_INPUT, 3, ks);
    uint32_t v = xpu_irb_tensor(&g, kvt, XPU_TENSOR_INPUT, 3, ks);
    uint32_t o = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 3, qs);
    uint32_t ins[3] = {q, k, v};
    xpu_ir_node *n = xpu_irb_node(&g, XPU_OP_ATTENTION, o, 3, ins);
    n->iattr[0] = 1, n->iattr[1] = VALID - tq, n->iattr[4] = W, n->fattr[1] = 0.75f;
    xpu_irb_output(&g, o);
    xpu_executable exe = prepare(ctx, &g, "threads=2");
    float qd[3 * HQ * D], out[3 * HQ * D];
    for (int i = 0; i < tq * HQ * D; i++) qd[i] = 4.0f * frand(&seed);
    xpu_buffer bq = upload(ctx, qd, (uint64_t)tq * HQ * D * 4), bk = upload(ctx, kq, CAP * HKV * row);
    xpu_buffer bv = upload(ctx, vq, CAP * HKV * row), bo = upload(ctx, NULL, (uint64_t)tq * HQ * D * 4);
    xpu_execution ex = 0;
    EXPECT(api->execution_create(exe, &ex), XPU_OK);
    EXPECT(api->execution_bind(ex, 0, bq, 0), XPU_OK);
    EXPECT(api->execution_bind(ex, 1, bk, 0), XPU_OK);
    EXPECT(api->execution_bind(ex, 2, bv, 0), XPU_OK);
    EXPECT(api->execution_bind(ex, 3, bo, 0), XPU_OK);
    EXPECT(api->execution_run(ex), XPU_OK);
    EXPECT(api->buffer_read(bo, 0, out, (uint64_t)tq * HQ * D * 4), XPU_OK);
    double want[3 * HQ * D];
    for (int i = 0; i < tq; i++)
      for (int h = 0; h < HQ; h++) {
        int hk = h / (HQ / HKV), last = VALID - tq + i, first = last - W + 1;
        double sc[W], mx = -INFINITY, sum = 0;
        for (int j = first; j <= last; j++) {
          double s = 0;
          for (int d = 0; d < D; d++) s += (double)qd[(i * HQ + h) * D + d] * q_value(kvt, kq + (size_t)(j * HKV + hk) * row, d);
          s = 0.75 * tanh(s / sqrt((double)D) / 0.75);
          sc[j - first] = s;
          if (s > mx) mx = s;
        }
        for (int j = 0; j < W; j++) sum += (sc[j] = exp(sc[j] - mx));
        for (int d = 0; d < D; d++) {
          double acc = 0;
          for (int j = 0; j < W; j++) acc += sc[j] / sum * q_value(kvt, vq + (size_t)((first + j) * HKV + hk) * row, d);
          want[(i * HQ + h) * D + d] = acc;
        }
      }
    double e = max_err(out, want, tq * HQ * D);
    CHECK(e < 1e-5, "attention v5 (%s kv, %d rows): max error %g", kvt == XPU_DT_Q8_0 ? "q8_0" : "q4_0", tq, e);
    EXPECT(api->execution_release(ex), XPU_OK);
    EXPECT(api->executable_release(exe), XPU_OK);
    api->buffer_release(bq), api->buffer_release(bk), api->buffer_release(bv), api->buffer_release(bo);
  }
}

/* y = x · dequant(quantize_q4_0(w))ᵀ with w a constant, M large enough for the blocked path */
static void test_quant_matmul(xpu_context ctx, uint32_t qdt) {
  enum { M = 9, N = 21, K = 96 };
  xpu_irb g = {0};
  int64_t xs[2] = {M, K}, ws[2] = {N, K}, os[2] = {M, N};
  uint32_t x = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_INPUT, 2, xs);
  uint32_t w = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_CONST, 2, ws);
  uint32_t wq = xpu_irb_tensor(&g, qdt, XPU_TENSOR_VALUE, 2, ws);
  uint32_t wd = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 2, ws);
  uint32_t y = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 2, os);
  uint32_t yf = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 2, os);
  xpu_irb_node(&g, XPU_OP_QUANTIZE, wq, 1, &w);
  xpu_irb_node(&g, XPU_OP_DEQUANTIZE, wd, 1, &wq);
  uint32_t mm[2] = {x, wq}, mf[2] = {x, wd};
  xpu_irb_node(&g, XPU_OP_MATMUL, y, 2, mm);
  xpu_irb_node(&g, XPU_OP_MATMUL, yf, 2, mf);
  xpu_irb_output(&g, y);
  xpu_irb_output(&g, yf);
  unsigned seed = 7;
  float xd[M * K], wdat[N * K], yo[M * N], yfo[M * N];
  for (int i = 0; i < M * K; i++) xd[i] = frand(&seed);
  for (int i = 0; i < N * K; i++) wdat[i] = frand(&seed);
  xpu_buffer bw = upload(ctx, wdat, sizeof wdat);
  g.tensors[w].const_buffer = bw;
  xpu_executable exe = prepare(ctx, &g, NULL);
  xpu_buffer bx = upload(ctx, xd, sizeof xd), by = upload(ctx, NULL, sizeof yo), byf = upload(ctx, NULL, sizeof yfo);
  xpu_execution ex = 0;
  EXPECT(api->execution_create(exe, &ex), XPU_OK);
  EXPECT(api->execution_bind(ex, 0, bx, 0), XPU_OK);
  EXPECT(api->execution_bind(ex, 1, by, 0), XPU_OK);
  EXPECT(api->execution_bind(ex, 2, byf, 0), XPU_OK);
  EXPECT(api->execution_run(ex), XPU_OK);
  api->buffer_read(by, 0, yo, sizeof yo);
  api->buffer_read(byf, 0, yfo, sizeof yfo);
  /* the f32 matmul of the dequantized weights against double; the int8 path within 2% */
  double want[M * N], peak = 0;
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double s = 0;
      for (int k = 0; k < K; k++) s += (double)xd[m * K + k] * wdat[n * K + k];
      want[m * N + n] = s;
      if (fabs(s) > peak) peak = fabs(s);
    }
  double e = max_err(yo, want, M * N), ef = max_err(yfo, want, M * N);
  double lim = qdt == XPU_DT_Q4_0 ? 0.25 : 0.03;
  CHECK(e < lim * peak, "quantized matmul (dtype %u): max error %g of peak %g", qdt, e, peak);
  CHECK(ef < lim * peak, "dequantized f32 matmul (dtype %u): max error %g of peak %g", qdt, ef, peak);
  double d = 0;
  for (int i = 0; i < M * N; i++) d = fmax(d, fabs((double)yo[i] - yfo[i]));
  CHECK(d < 0.02 * peak, "int8 path vs f32 path: %g of peak %g", d, peak);
  EXPECT(api->execution_release(ex), XPU_OK);
  EXPECT(api->executable_release(exe), XPU_OK);
  api->buffer_release(bw), api->buffer_release(bx), api->buffer_release(by), api->buffer_release(byf);
}

/* y = x · wᵀ with w a constant F32 weight packed once at prepare into the GEMM layout: N not a
 * multiple of a panel, K past one 256-value block; two executables share the packed copy */
static void test_fpack_matmul(xpu_context ctx) {
  enum { M = 9, N = 37, K = 300 };
  static float xd[M * K], wdat[N * K], yo[M * N];
  unsigned seed = 11;
  for (int i = 0; i < M * K; i++) xd[i] = frand(&seed);
  for (int i = 0; i < N * K; i++) wdat[i] = frand(&seed);
  xpu_buffer bw = upload(ctx, wdat, sizeof wdat);
  xpu_executable exe[2];
  for (int e = 0; e < 2; e++) {
    xpu_irb g = {0};
    int64_t xs[2] = {M, K}, ws[2] = {N, K}, os[2] = {M, N};
    uint32_t x = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_INPUT, 2, xs);
    uint32_t w = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_CONST, 2, ws);
    uint32_t y = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 2, os);
    uint32_t mm[2] = {x, w};
    xpu_irb_node(&g, XPU_OP_MATMUL, y, 2, mm);
    xpu_irb_output(&g, y);
    g.tensors[w].const_buffer = bw;
    exe[e] = prepare(ctx, &g, NULL);
  }
  double want[M * N], peak = 0;
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double s = 0;
      for (int k = 0; k < K; k++) s += (double)xd[m * K + k] * wdat[n * K + k];
      want[m * N + n] = s;
      if (fabs(s) > peak) peak = fabs(s);
    }
  xpu_buffer bx = upload(ctx, xd, sizeof xd), by = upload(ctx, NULL, sizeof yo);
  for (int e = 0; e < 2; e++) {
    xpu_execution ex = 0;
    EXPECT(api->execution_create(exe[e], &ex), XPU_OK);
    EXPECT(api->execution_bind(ex, 0, bx, 0), XPU_OK);
    EXPECT(api->execution_bind(ex, 1, by, 0), XPU_OK);
    EXPECT(api->execution_run(ex), XPU_OK);
    api->buffer_read(by, 0, yo, sizeof yo);
    double err = max_err(yo, want, M * N);
    CHECK(err < 1e-5 * peak, "prepacked f32 matmul (executable %d): max error %g of peak %g", e, err, peak);
    EXPECT(api->execution_release(ex), XPU_OK);
  }
  /* the first executable goes first: the second still holds the packed copy */
  EXPECT(api->executable_release(exe[0]), XPU_OK);
  EXPECT(api->executable_release(exe[1]), XPU_OK);
  api->buffer_release(bw), api->buffer_release(bx), api->buffer_release(by);
}

/* ---------------------------------------------------------------- op set 3 */

/* W8A8 MATMUL (I8 a, per-channel I8 weights, the 16-bit output grid) and SHADOW_MATMUL (ids
 * with a duplicate) against double; K = 77 leaves a tail after every vector width, and the
 * codes include -128, which breaks sign tricks of int8 dot instructions */
static void test_w8a8(xpu_context ctx) {
  enum { M = 3, N = 13, K = 77, C = 5 };
  const float sa = 0.01f, so = 0.002f, t = 0.5f;
  xpu_irb g = {0};
  int64_t as[2] = {M, K}, bs[2] = {N, K}, ss[1] = {N}, os[2] = {M, N}, ws[2] = {C, N}, is[1] = {C};
  uint32_t a = xpu_irb_tensor(&g, XPU_DT_I8, XPU_TENSOR_INPUT, 2, as);
  uint32_t x = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_INPUT, 2, as);
  uint32_t b = xpu_irb_tensor(&g, XPU_DT_I8, XPU_TENSOR_CONST, 2, bs);
  uint32_t sc = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_CONST, 1, ss);
  uint32_t wt = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_CONST, 2, ws);
  uint32_t ids = xpu_irb_tensor(&g, XPU_DT_I32, XPU_TENSOR_CONST, 1, is);
  uint32_t y = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 2, os);
  uint32_t z = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 2, os);
  uint32_t mi[3] = {a, b, sc}, si[3] = {x, wt, ids};
  xpu_ir_node *mm = xpu_irb_node(&g, XPU_OP_MATMUL, y, 3, mi);
  mm->fattr[1] = sa;
  mm->fattr[2] = so;
  xpu_irb_node(&g, XPU_OP_SHADOW_MATMUL, z, 3, si)->fattr[0] = t;
  xpu_irb_output(&g, y);
  xpu_irb_output(&g, z);
  unsigned seed = 11;
  int8_t qa[M * K], qb[N * K];
  float sb[N], xd[M * K], wd[C * N], yo[M * N], zo[M * N];
  int32_t idv[C] = {4, 76, 4, 0, 40};
  for (int i = 0; i < M * K; i++) qa[i] = (int8_t)(i % 7 == 0 ? -128 : (int)(frand(&seed) * 127));
  for (int i = 0; i < N * K; i++) qb[i] = (int8_t)(i % 5 == 0 ? -128 : (int)(frand(&seed) * 127));
  for (int j = 0; j < N; j++) sb[j] = 0.001f * (1 + j % 4);
  for (int i = 0; i < M * K; i++) xd[i] = 2 * frand(&seed);
  for (int i = 0; i < C * N; i++) wd[i] = frand(&seed);
  xpu_buffer bb = upload(ctx, qb, sizeof qb), bs_ = upload(ctx, sb, sizeof sb), bw = upload(ctx, wd, sizeof wd),
             bi = upload(ctx, idv, sizeof idv);
  g.tensors[b].const_buffer = bb;
  g.tensors[sc].const_buffer = bs_;
  g.tensors[wt].const_buffer = bw;
  g.tensors[ids].const_buffer = bi;
  xpu_executable exe = prepare(ctx, &g, NULL);
  xpu_buffer ba = upload(ctx, qa, sizeof qa), bx = upload(ctx, xd, sizeof xd), by = upload(ctx, NULL, sizeof yo),
             bz = upload(ctx, NULL, sizeof zo);
  xpu_execution ex = 0;
  EXPECT(api->execution_create(exe, &ex), XPU_OK);
  EXPECT(api->execution_bind(ex, 0, ba, 0), XPU_OK);
  EXPECT(api->execution_bind(ex, 1, bx, 0), XPU_OK);
  EXPECT(api->execution_bind(ex, 2, by, 0), XPU_OK);
  EXPECT(api->execution_bind(ex, 3, bz, 0), XPU_OK);
  EXPECT(api->execution_run(ex), XPU_OK);
  api->buffer_read(by, 0, yo, sizeof yo);
  api->buffer_read(bz, 0, zo, sizeof zo);
  double wy[M * N], wz[M * N];
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      long acc = 0;
      for (int k = 0; k < K; k++) acc += (long)qa[m * K + k] * qb[n * K + k];
      double v = round((double)acc * sa * sb[n] / so);
      wy[m * N + n] = so * (v > 32767 ? 32767 : v < -32767 ? -32767 : v);
      double zz = 0;
      for (int c = 0; c < C; c++) {
        double xv = xd[m * K + idv[c]], e = xv > t ? xv - t : xv < -t ? xv + t : 0;
        zz += e * wd[c * N + n];
      }
      wz[m * N + n] = zz;
    }
  /* the grid values are exact up to the f32 store; the shadow sum is a few f32 roundings */
  CHECK(max_err(yo, wy, M * N) <= 1e-6, "W8A8 matmul: max error %g", max_err(yo, wy, M * N));
  CHECK(max_err(zo, wz, M * N) <= 1e-5, "shadow matmul: max error %g", max_err(zo, wz, M * N));
  /* an id outside [0, K) fails the run with INVALID_ARG (buffer_write bumps the bytes the run reads) */
  int32_t bad = K;
  EXPECT(api->buffer_write(bi, 4, &bad, 4), XPU_OK);
  xpu_executable exe2 = prepare(ctx, &g, NULL);
  xpu_execution ex2 = 0;
  EXPECT(api->execution_create(exe2, &ex2), XPU_OK);
  for (uint32_t io = 0; io < 4; io++)
    EXPECT(api->execution_bind(ex2, io, (xpu_buffer[]){ba, bx, by, bz}[io], 0), XPU_OK);
  expect_err(api->execution_run(ex2), XPU_E_INVALID_ARG, ex2, "shadow matmul with an id out of range");
  EXPECT(api->execution_release(ex2), XPU_OK);
  EXPECT(api->executable_release(exe2), XPU_OK);
  EXPECT(api->execution_release(ex), XPU_OK);
  EXPECT(api->executable_release(exe), XPU_OK);
  api->buffer_release(bb), api->buffer_release(bs_), api->buffer_release(bw), api->buffer_release(bi);
  api->buffer_release(ba), api->buffer_release(bx), api->buffer_release(by), api->buffer_release(bz);
}

/* ---------------------------------------------------------------- K-quants */

static uint32_t kq_block_bytes(uint32_t dt) {
  switch (dt) {
  case XPU_DT_Q4_K: return 144;
  case XPU_DT_Q5_K: return 176;
  case XPU_DT_Q6_K: return 210;
  case XPU_DT_Q2_K: return 84;
  default: return 110;
  }
}

/* normal f16 only (the test writes no others) */
static float half_at(const uint8_t *p) {
  unsigned h = (unsigned)p[0] | (unsigned)p[1] << 8;
  float m = 1.0f + (float)(h & 0x3FF) / 1024.0f;
  return ((h & 0x8000) ? -1.0f : 1.0f) * ldexpf(m, (int)((h >> 10) & 0x1F) - 15);
}

/* OPS.md's value formulas, value by value (the plugin decodes whole super-blocks) */
static float kq_value(uint32_t dt, const uint8_t *b, int i) {
  int h = i / 128, r = i % 128, j = r / 32, l = r % 32, s = i / 32, c = i / 64, hi = s % 2;
  if (dt == XPU_DT_Q4_K || dt == XPU_DT_Q5_K) {
    const uint8_t *sc12 = b + 4;
    int sc = s < 4 ? sc12[s] & 63 : (sc12[s + 4] & 0xF) | (sc12[s - 4] >> 6) << 4;
    int m = s < 4 ? sc12[s + 4] & 63 : (sc12[s + 4] >> 4) | (sc12[s] >> 6) << 4;
    const uint8_t *qs = b + (dt == XPU_DT_Q5_K ? 48 : 16);
    int q = (qs[32 * c + l] >> (4 * hi)) & 0xF;
    if (dt == XPU_DT_Q5_K) q |= ((b[16 + l] >> s) & 1) << 4;
    float x = half_at(b) * (float)sc;
    float y = half_at(b + 2) * (float)m;
    return x * (float)q - y;
  }
  if (dt == XPU_DT_Q6_K) {
    int q = ((b[64 * h + 32 * (j % 2) + l] >> (4 * (j / 2))) & 0xF) | ((b[128 + 32 * h + l] >> (2 * j)) & 3) << 4;
    float x = half_at(b + 208) * (float)(int8_t)b[192 + i / 16];
    return x * (float)(q - 32);
  }
  if (dt == XPU_DT_Q2_K) {
    int q = (b[16 + 32 * h + l] >> (2 * j)) & 3, sb = b[i / 16];
    float x = half_at(b + 80) * (float)(sb & 0xF);
    return x * (float)q - half_at(b + 82) * (float)(sb >> 4);
  }
  int t = i / 16;
  int lo = t < 8 ? b[96 + t] & 0xF : b[96 + t - 8] >> 4, hb = (b[96 + 8 + t % 4] >> (2 * (t / 4))) & 3;
  int q = ((b[32 + 32 * h + l] >> (2 * j)) & 3) - (((b[l] >> (4 * h + j)) & 1) ? 0 : 4);
  float x = half_at(b + 108) * (float)((lo | hb << 4) - 32);
  return x * (float)q;
}

/* random codes and scales with small positive f16 d/dmin (2^-8 .. 2^-7) */
static void kq_random(uint32_t dt, uint8_t *w, int64_t nblocks, unsigned *seed) {
  uint32_t bb = kq_block_bytes(dt);
  for (int64_t n = 0; n < nblocks; n++) {
    uint8_t *b = w + n * bb;
    for (uint32_t i = 0; i < bb; i++) {
      *seed = *seed * 1103515245u + 12345u;
      b[i] = (uint8_t)(*seed >> 16);
    }
    int at[2] = {0, 2}, nd = 2;
    if (dt == XPU_DT_Q6_K) at[0] = 208, nd = 1;
    if (dt == XPU_DT_Q2_K) at[0] = 80, at[1] = 82;
    if (dt == XPU_DT_Q3_K) at[0] = 108, nd = 1;
    for (int k = 0; k < nd; k++) {
      *seed = *seed * 1103515245u + 12345u;
      unsigned hbits = 0x1C00u + ((*seed >> 16) & 0x3FFu);
      b[at[k]] = (uint8_t)hbits;
      b[at[k] + 1] = (uint8_t)(hbits >> 8);
    }
  }
}

/* A K-quant weight as a constant (the repacked int8 kernels for Q4_K/Q5_K/Q6_K, decode and
 * prefill shapes, 21 rows: a partial group) and as an input (the f32 paths), DEQUANTIZE and
 * GET_ROWS, all against the value formulas above. */
static void test_kquant(xpu_context ctx, uint32_t dt) {
  enum { N = 21, K = 512, M = 9, R = 3 };
  const uint32_t bb = kq_block_bytes(dt);
  const uint64_t wbytes = (uint64_t)N * (K / 256) * bb;
  xpu_irb g = {0};
  int64_t x1s[2] = {1, K}, x9s[2] = {M, K}, ws[2] = {N, K}, y1s[2] = {1, N}, y9s[2] = {M, N}, ids_s[1] = {R},
          grs[2] = {R, K};
  uint32_t x1 = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_INPUT, 2, x1s);
  uint32_t x9 = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_INPUT, 2, x9s);
  uint32_t wi = xpu_irb_tensor(&g, dt, XPU_TENSOR_INPUT, 2, ws);
  uint32_t ids = xpu_irb_tensor(&g, XPU_DT_I32, XPU_TENSOR_INPUT, 1, ids_s);
  uint32_t w = xpu_irb_tensor(&g, dt, XPU_TENSOR_CONST, 2, ws);
  uint32_t out[6];
  out[0] = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 2, y1s);
  out[1] = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 2, y9s);
  out[2] = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 2, y1s);
  out[3] = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 2, y9s);
  out[4] = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 2, ws);
  out[5] = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 2, grs);
  uint32_t m1[2] = {x1, w}, m9[2] = {x9, w}, mi1[2] = {x1, wi}, mi9[2] = {x9, wi}, gr[2] = {w, ids};
  xpu_irb_node(&g, XPU_OP_MATMUL, out[0], 2, m1);
  xpu_irb_node(&g, XPU_OP_MATMUL, out[1], 2, m9);
  xpu_irb_node(&g, XPU_OP_MATMUL, out[2], 2, mi1);
  xpu_irb_node(&g, XPU_OP_MATMUL, out[3], 2, mi9);
  xpu_irb_node(&g, XPU_OP_DEQUANTIZE, out[4], 1, &w);
  xpu_irb_node(&g, XPU_OP_GET_ROWS, out[5], 2, gr);
  for (int i = 0; i < 6; i++) xpu_irb_output(&g, out[i]);

  unsigned seed = 11 + dt;
  uint8_t *wq = malloc(wbytes);
  float *xd = malloc(sizeof(float) * M * K), *deq = malloc(sizeof(float) * N * K);
  float *got[6];
  const int64_t outn[6] = {N, M * N, N, M * N, N * K, R * K};
  for (int i = 0; i < 6; i++) got[i] = calloc((size_t)outn[i], sizeof(float));
  kq_random(dt, wq, N * (K / 256), &seed);
  for (int i = 0; i < M * K; i++) xd[i] = frand(&seed);
  for (int n = 0; n < N; n++)
    for (int i = 0; i < K; i++) deq[n * K + i] = kq_value(dt, wq + ((uint64_t)n * (K / 256) + i / 256) * bb, i % 256);
  int32_t idv[R] = {20, 0, 7};

  xpu_buffer bw = upload(ctx, wq, wbytes);
  g.tensors[w].const_buffer = bw;
  xpu_executable exe = prepare(ctx, &g, NULL);
  xpu_buffer in[4] = {upload(ctx, xd, sizeof(float) * K), upload(ctx, xd, sizeof(float) * M * K), upload(ctx, wq, wbytes),
                      upload(ctx, idv, sizeof idv)};
  xpu_buffer ob[6];
  xpu_execution ex = 0;
  EXPECT(api->execution_create(exe, &ex), XPU_OK);
  for (int i = 0; i < 4; i++) EXPECT(api->execution_bind(ex, (uint32_t)i, in[i], 0), XPU_OK);
  for (int i = 0; i < 6; i++) {
    ob[i] = upload(ctx, NULL, sizeof(float) * (uint64_t)outn[i]);
    EXPECT(api->execution_bind(ex, (uint32_t)(4 + i), ob[i], 0), XPU_OK);
  }
  EXPECT(api->execution_run(ex), XPU_OK);
  for (int i = 0; i < 6; i++) api->buffer_read(ob[i], 0, got[i], sizeof(float) * (uint64_t)outn[i]);

  /* DEQUANTIZE and GET_ROWS: bit-exact with the formulas */
  int bad = 0;
  for (int i = 0; i < N * K; i++) bad += memcmp(&got[4][i], &deq[i], 4) != 0;
  CHECK(bad == 0, "dequantize dtype %u: %d of %d values differ (first: %g vs %g)", dt, bad, N * K, got[4][0], deq[0]);
  bad = 0;
  for (int r = 0; r < R; r++)
    for (int i = 0; i < K; i++) bad += memcmp(&got[5][r * K + i], &deq[idv[r] * K + i], 4) != 0;
  CHECK(bad == 0, "get_rows dtype %u: %d values differ", dt, bad);

  /* MATMUL against double: the int8 kernels (constant weight) within 2% of the largest output
   * (int8 activations), the f32 paths (input weight) to f32 rounding */
  double *want = malloc(sizeof(double) * M * N), peak = 0;
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double acc = 0;
      for (int k = 0; k < K; k++) acc += (double)xd[m * K + k] * deq[n * K + k];
      want[m * N + n] = acc;
      if (fabs(acc) > peak) peak = fabs(acc);
    }
  double e1 = max_err(got[0], want, N), e9 = max_err(got[1], want, M * N);
  double ei1 = max_err(got[2], want, N), ei9 = max_err(got[3], want, M * N);
  CHECK(peak > 0, "dtype %u: zero reference", dt);
  CHECK(e1 < 0.02 * peak && e9 < 0.02 * peak, "k-quant matmul dtype %u: max error %g (M=1), %g (M=%d) of peak %g", dt,
        e1, e9, M, peak);
  CHECK(ei1 < 1e-4 * peak && ei9 < 1e-4 * peak, "k-quant f32 matmul dtype %u: max error %g (M=1), %g (M=%d) of peak %g",
        dt, ei1, ei9, M, peak);
  /* the M=1 and M=9 kernels see the same first activation row */
  for (int n = 0; n < N; n++)
    CHECK(fabs(got[0][n] - got[1][n]) <= 1e-5 * peak, "dtype %u: row 0 differs between decode and prefill: %g vs %g", dt,
          got[0][n], got[1][n]);

  EXPECT(api->execution_release(ex), XPU_OK);
  EXPECT(api->executable_release(exe), XPU_OK);
  api->buffer_release(bw);
  for (int i = 0; i < 4; i++) api->buffer_release(in[i]);
  for (int i = 0; i < 6; i++) {
    api->buffer_release(ob[i]);
    free(got[i]);
  }
  free(wq), free(xd), free(deq), free(want);
}


/* SPARSE_FFN (op set 3) over Q4_0 bundles that are an input (the runner's cache), not a
 * constant: gated ReLU, padded rows (R = 3D + 32), idx with empty slots and a duplicate, M and
 * the listed count large enough that two threads share the neurons and their accumulators are
 * added. The idx and bundles are rewritten between runs of one execution; an index outside
 * [-1, S) fails the run with INVALID_ARG. Compared with a double-precision sum here (x is
 * quantized to Q8_0 by the kernel: within a few % of the peak). */
enum { SF_M = 4, SF_D = 128, SF_S = 40, SF_R = 3 * SF_D + 32, SF_K = 48, SF_RB = SF_R / 32 * 18 };

static float sf_value(const uint8_t *row, int j) {
  const uint8_t *b = row + (j / 32) * 18;
  float d = half_at(b);
  int i = j % 32, q = i < 16 ? (b[2 + i] & 15) : (b[2 + i - 16] >> 4);
  return d * (float)(q - 8);
}

static void sf_want(const float *x, const uint8_t *bund, const int32_t *idx, double *want, double *peak) {
  *peak = 1;
  for (int i = 0; i < SF_M * SF_D; i++) want[i] = 0;
  for (int m = 0; m < SF_M; m++)
    for (int k = 0; k < SF_K; k++) {
      if (idx[k] < 0) continue;
      const uint8_t *row = bund + (size_t)idx[k] * SF_RB;
      double gt = 0, up = 0;
      for (int j = 0; j < SF_D; j++) {
        gt += (double)sf_value(row, j) * x[m * SF_D + j];
        up += (double)sf_value(row, SF_D + j) * x[m * SF_D + j];
      }
      if (gt <= 0) continue;
      for (int j = 0; j < SF_D; j++) want[m * SF_D + j] += gt * up * sf_value(row, 2 * SF_D + j);
    }
  for (int i = 0; i < SF_M * SF_D; i++) *peak = fmax(*peak, fabs(want[i]));
}

static void sf_fill(uint8_t *bund, int32_t *idx, unsigned *seed) {
  static const uint16_t scales[3] = {0x2800, 0x2C00, 0x3000}; /* 1/32, 1/16, 1/8: exact in f16 */
  for (int b = 0; b < SF_S * SF_R / 32; b++) {
    uint8_t *blk = bund + (size_t)b * 18;
    uint16_t d = scales[(*seed >> 9) % 3];
    memcpy(blk, &d, 2);
    for (int i = 0; i < 16; i++) blk[2 + i] = (uint8_t)((frand(seed) + 1) * 128);
  }
  for (int k = 0; k < SF_K; k++) {
    idx[k] = frand(seed) < -0.4f ? -1 : (int32_t)((frand(seed) + 1) * 0.5f * SF_S) % SF_S;
    if (k % 7 == 6) idx[k] = idx[k - 1];
  }
}

static void test_sparse_ffn(xpu_context ctx) {
  xpu_irb g = {0};
  int64_t xs[2] = {SF_M, SF_D}, bs[2] = {SF_S, SF_R}, is[1] = {SF_K};
  uint32_t x = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_INPUT, 2, xs);
  uint32_t b = xpu_irb_tensor(&g, XPU_DT_Q4_0, XPU_TENSOR_INPUT, 2, bs);
  uint32_t ids = xpu_irb_tensor(&g, XPU_DT_I32, XPU_TENSOR_INPUT, 1, is);
  uint32_t y = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 2, xs);
  uint32_t in[3] = {x, b, ids};
  xpu_irb_node(&g, XPU_OP_SPARSE_FFN, y, 3, in);
  xpu_irb_output(&g, y);
  xpu_executable exe = prepare(ctx, &g, NULL);
  static float xd[SF_M * SF_D], yo[SF_M * SF_D];
  static uint8_t bund[SF_S * SF_RB];
  static int32_t idx[SF_K];
  static double want[SF_M * SF_D];
  unsigned seed = 18;
  for (int i = 0; i < SF_M * SF_D; i++) xd[i] = frand(&seed);
  sf_fill(bund, idx, &seed);
  xpu_buffer bx = upload(ctx, xd, sizeof xd), bb = upload(ctx, bund, sizeof bund), bi = upload(ctx, idx, sizeof idx),
             by = upload(ctx, NULL, sizeof yo);
  xpu_execution ex = 0;
  EXPECT(api->execution_create(exe, &ex), XPU_OK);
  EXPECT(api->execution_bind(ex, 0, bx, 0), XPU_OK);
  EXPECT(api->execution_bind(ex, 1, bb, 0), XPU_OK);
  EXPECT(api->execution_bind(ex, 2, bi, 0), XPU_OK);
  EXPECT(api->execution_bind(ex, 3, by, 0), XPU_OK);
  for (int run = 0; run < 2; run++) {
    if (run) { /* the host rewrites its cache and the list in place */
      sf_fill(bund, idx, &seed);
      EXPECT(api->buffer_write(bb, 0, bund, sizeof bund), XPU_OK);
      EXPECT(api->buffer_write(bi, 0, idx, sizeof idx), XPU_OK);
    }
    EXPECT(api->execution_run(ex), XPU_OK);
    api->buffer_read(by, 0, yo, sizeof yo);
    double peak;
    sf_want(xd, bund, idx, want, &peak);
    double e = max_err(yo, want, SF_M * SF_D);
    CHECK(e < 0.06 * peak, "sparse ffn (run %d): max error %g of peak %g", run, e, peak);
  }
  int32_t bad[2] = {SF_S, -2};
  for (int i = 0; i < 2; i++) {
    EXPECT(api->buffer_write(bi, 4 * 5, &bad[i], 4), XPU_OK);
    expect_err(api->execution_run(ex), XPU_E_INVALID_ARG, ex, "sparse ffn with an index out of range");
  }
  EXPECT(api->execution_release(ex), XPU_OK);
  EXPECT(api->executable_release(exe), XPU_OK);
  api->buffer_release(bx), api->buffer_release(bb), api->buffer_release(bi), api->buffer_release(by);
}

/* f32 GEMM large enough for several blocks, plus causal softmax, checked against double */
static void test_gemm_softmax(xpu_context ctx) {
  enum { M = 37, N = 1100, K = 300 };
  xpu_irb g = {0};
  int64_t xs[2] = {M, K}, ws[2] = {N, K}, os[2] = {M, N};
  uint32_t x = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_INPUT, 2, xs);
  uint32_t w = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_INPUT, 2, ws);
  uint32_t y = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 2, os);
  uint32_t p = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 2, os);
  uint32_t mm[2] = {x, w};
  xpu_irb_node(&g, XPU_OP_MATMUL, y, 2, mm);
  xpu_ir_node *sm = xpu_irb_node(&g, XPU_OP_SOFTMAX, p, 1, &y);
  sm->fattr[0] = 0.05f;
  sm->iattr[0] = 1;
  sm->iattr[1] = 3;
  xpu_irb_output(&g, y);
  xpu_irb_output(&g, p);
  xpu_executable exe = prepare(ctx, &g, "threads=2");
  float *xd = malloc(sizeof(float) * M * K), *wd = malloc(sizeof(float) * N * K);
  float *yo = malloc(sizeof(float) * M * N), *po = malloc(sizeof(float) * M * N);
  double *want = malloc(sizeof(double) * M * N), *pw = malloc(sizeof(double) * M * N);
  unsigned seed = 3;
  for (int i = 0; i < M * K; i++) xd[i] = frand(&seed);
  for (int i = 0; i < N * K; i++) wd[i] = frand(&seed);
  xpu_buffer bx = upload(ctx, xd, sizeof(float) * M * K), bw = upload(ctx, wd, sizeof(float) * N * K);
  xpu_buffer bio = upload(ctx, NULL, 2 * sizeof(float) * M * N);
  xpu_execution ex = 0;
  EXPECT(api->execution_create(exe, &ex), XPU_OK);
  EXPECT(api->execution_bind(ex, 0, bx, 0), XPU_OK);
  EXPECT(api->execution_bind(ex, 1, bw, 0), XPU_OK);
  EXPECT(api->execution_bind(ex, 2, bio, 0), XPU_OK);
  EXPECT(api->execution_bind(ex, 3, bio, sizeof(float) * M * N), XPU_OK);
  EXPECT(api->execution_run(ex), XPU_OK);
  api->buffer_read(bio, 0, yo, sizeof(float) * M * N);
  api->buffer_read(bio, sizeof(float) * M * N, po, sizeof(float) * M * N);
  for (int m = 0; m < M; m++) {
    double mx = -INFINITY, sum = 0;
    int valid = m + 3 + 1;
    for (int n = 0; n < N; n++) {
      double s = 0;
      for (int k = 0; k < K; k++) s += (double)xd[m * K + k] * wd[n * K + k];
      want[m * N + n] = s;
      if (n < valid && s * 0.05 > mx) mx = s * 0.05;
    }
    for (int n = 0; n < N; n++) pw[m * N + n] = n < valid ? exp(want[m * N + n] * 0.05 - mx) : 0;
    for (int n = 0; n < valid; n++) sum += pw[m * N + n];
    for (int n = 0; n < N; n++) pw[m * N + n] /= sum;
  }
  double e = max_err(yo, want, M * N), ep = max_err(po, pw, M * N);
  CHECK(e < 1e-3, "gemm: max error %g", e);
  CHECK(ep < 1e-5, "causal softmax: max error %g", ep);
  EXPECT(api->execution_release(ex), XPU_OK);
  EXPECT(api->executable_release(exe), XPU_OK);
  api->buffer_release(bx), api->buffer_release(bw), api->buffer_release(bio);
  free(xd), free(wd), free(yo), free(po), free(want), free(pw);
}

/* several host threads run their own executions of two executables pinned to different CPU
 * sets (the prefill/decode switch), all through one context's pool: results must not change */
typedef struct {
  xpu_execution ex;
  xpu_buffer out;
  const float *want;
  int n, bad;
} worker_arg;

static void *hammer(void *p) {
  worker_arg *w = (worker_arg *)p;
  float got[256];
  for (int it = 0; it < 25; it++) {
    if (api->execution_run(w->ex) != XPU_OK) w->bad++;
    api->buffer_read(w->out, 0, got, sizeof(float) * (size_t)w->n);
    if (memcmp(got, w->want, sizeof(float) * (size_t)w->n) != 0) w->bad++;
  }
  return NULL;
}

static void test_concurrency(xpu_context ctx) {
  enum { M = 8, N = 32, K = 64, T = 4 };
  xpu_irb g = {0};
  int64_t xs[2] = {M, K}, ws[2] = {N, K}, os[2] = {M, N};
  uint32_t x = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_INPUT, 2, xs);
  uint32_t w = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_INPUT, 2, ws);
  uint32_t y = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 2, os);
  uint32_t mm[2] = {x, w};
  xpu_irb_node(&g, XPU_OP_MATMUL, y, 2, mm);
  xpu_irb_output(&g, y);
  xpu_executable e0 = prepare(ctx, &g, "cpus=0"), e1 = prepare(ctx, &g, "cpus=1;threads=2");
  float xd[M * K], wd[N * K], want[M * N];
  unsigned seed = 11;
  for (int i = 0; i < M * K; i++) xd[i] = frand(&seed);
  for (int i = 0; i < N * K; i++) wd[i] = frand(&seed);
  xpu_buffer bx = upload(ctx, xd, sizeof xd), bw = upload(ctx, wd, sizeof wd);
  xpu_execution ref = 0;
  xpu_buffer bref = upload(ctx, NULL, sizeof want);
  EXPECT(api->execution_create(e0, &ref), XPU_OK);
  api->execution_bind(ref, 0, bx, 0), api->execution_bind(ref, 1, bw, 0), api->execution_bind(ref, 2, bref, 0);
  EXPECT(api->execution_run(ref), XPU_OK);
  api->buffer_read(bref, 0, want, sizeof want);
  pthread_t th[T];
  worker_arg wa[T];
  for (int t = 0; t < T; t++) {
    wa[t] = (worker_arg){0, upload(ctx, NULL, sizeof want), want, M * N, 0};
    EXPECT(api->execution_create(t % 2 ? e1 : e0, &wa[t].ex), XPU_OK);
    api->execution_bind(wa[t].ex, 0, bx, 0), api->execution_bind(wa[t].ex, 1, bw, 0);
    api->execution_bind(wa[t].ex, 2, wa[t].out, 0);
    pthread_create(&th[t], NULL, hammer, &wa[t]);
  }
  for (int t = 0; t < T; t++) {
    pthread_join(th[t], NULL);
    CHECK(wa[t].bad == 0, "concurrent thread %d: %d bad runs", t, wa[t].bad);
    api->execution_release(wa[t].ex);
    api->buffer_release(wa[t].out);
  }
  api->execution_release(ref);
  api->executable_release(e0), api->executable_release(e1);
  api->buffer_release(bx), api->buffer_release(bw), api->buffer_release(bref);
}

static void test_errors(xpu_context ctx) {
  xpu_buffer b = 0;
  expect_err(api->buffer_alloc(ctx, 16, 0, NULL), XPU_E_INVALID_ARG, ctx, "alloc with null out");
  expect_err(api->buffer_alloc(ctx, 16, 7, &b), XPU_E_INVALID_ARG, ctx, "alloc of unknown kind");
  expect_err(api->buffer_alloc(0xdead00000001ull, 16, 0, &b), XPU_E_INVALID_HANDLE, 0, "alloc on a foreign ctx");
  EXPECT(api->buffer_alloc(ctx, 16, XPU_BUFFER_DEVICE, &b), XPU_OK);
  char tmp[32] = {0};
  expect_err(api->buffer_write(b, 8, tmp, 16), XPU_E_INVALID_ARG, b, "write past the end");
  expect_err(api->buffer_read(b, ~0ull, tmp, 1), XPU_E_INVALID_ARG, b, "read at a huge offset");
  expect_err(api->buffer_unmap(b), XPU_E_BAD_STATE, b, "unmap without map");
  void *p = NULL;
  EXPECT(api->buffer_map(b, &p), XPU_OK);
  CHECK(p != NULL, "map gave NULL");
  EXPECT(api->buffer_unmap(b), XPU_OK);
  EXPECT(api->buffer_release(b), XPU_OK);
  expect_err(api->buffer_release(b), XPU_E_INVALID_HANDLE, 0, "double buffer release");
  /* a graph that is not IR, and one whose constant points at a released buffer */
  uint64_t junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  xpu_prepare_desc d = {sizeof d, 0, junk, sizeof junk, NULL, NULL, 0};
  xpu_executable exe = 0;
  expect_err(api->graph_prepare(ctx, &d, &exe), XPU_E_INVALID_ARG, ctx, "prepare of junk");
  xpu_irb g = {0};
  int64_t s[1] = {4};
  uint32_t c = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_CONST, 1, s);
  uint32_t o = xpu_irb_tensor(&g, XPU_DT_F32, XPU_TENSOR_VALUE, 1, s);
  xpu_irb_node(&g, XPU_OP_NEG, o, 1, &c);
  xpu_irb_output(&g, o);
  g.tensors[c].const_buffer = b;
  uint64_t size;
  void *blob = xpu_irb_encode(&g, &size);
  d.ir = blob;
  d.ir_size = size;
  expect_err(api->graph_prepare(ctx, &d, &exe), XPU_E_INVALID_HANDLE, ctx, "prepare with a stale constant");
  /* an unsupported node: analyze says NO with a reason, prepare says UNSUPPORTED */
  g.tensors[c].const_buffer = 0;
  g.nodes[0].op = XPU_OP_MATMUL;
  free(blob);
  blob = xpu_irb_encode(&g, &size);
  xpu_node_verdict v = {sizeof v, 0, 0, 0, {0}};
  EXPECT(api->graph_analyze(ctx, blob, size, &v, 1), XPU_OK);
  CHECK(v.verdict == XPU_VERDICT_NO && v.reason[0], "analyze of a 1-input matmul: verdict %u", v.verdict);
  d.ir = blob;
  expect_err(api->graph_prepare(ctx, &d, &exe), XPU_E_UNSUPPORTED, ctx, "prepare of a bad node");
  free(blob);
  xpu_context c2 = 0;
  expect_err(api->context_create(0, "cpus=abc", &c2), XPU_E_INVALID_ARG, 0, "bad cpus option");
  expect_err(api->context_create(0, "threads=0", &c2), XPU_E_INVALID_ARG, 0, "bad threads option");
  expect_err(api->context_create(0, "int8dot=2", &c2), XPU_E_INVALID_ARG, 0, "bad int8dot option");
  expect_err(api->context_create(0, "foo=bar", &c2), XPU_E_INVALID_ARG, 0, "unknown option \"foo=bar\"");
  expect_err(api->context_create(0, "threads=2;thread=2", &c2), XPU_E_INVALID_ARG, 0, "unknown option");
  expect_err(api->context_create(0, "repack", &c2), XPU_E_INVALID_ARG, 0, "unknown option");
  expect_err(api->context_create(3, NULL, &c2), XPU_E_INVALID_ARG, 0, "no such device");
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s libxpu-neon.so\n", argv[0]);
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  xpu_plugin_probe_fn probe = (xpu_plugin_probe_fn)dlsym(lib, "xpu_plugin_probe");
  xpu_plugin_open_fn open = (xpu_plugin_open_fn)dlsym(lib, "xpu_plugin_open");
  if (!probe || !open) {
    fprintf(stderr, "missing exports\n");
    return 1;
  }
  xpu_probe_result pr = {sizeof pr, 0, 0, 0, {0}, {0}};
  EXPECT(probe(&pr), XPU_OK);
  if (pr.score <= 0) {
    printf("neon-smoke: %s probes 0 here (%s): skipped\n", argv[1], pr.reason);
    return 0;
  }
  CHECK(strcmp(pr.name, "neon") == 0 && pr.abi_major == XPU_ABI_MAJOR, "probe: %s abi %u", pr.name, pr.abi_major);
  xpu_host_info host = {sizeof host, XPU_ABI_MAJOR, XPU_ABI_MINOR, 0, NULL, NULL, NULL};
  EXPECT(open(&host, &api), XPU_OK);
  xpu_device_info di;
  memset(&di, 0, sizeof di);
  di.struct_size = sizeof di;
  EXPECT(api->device_info(0, &di), XPU_OK);
  CHECK(di.kind == XPU_DEVICE_CPU && di.compute_units > 0, "device kind %u units %u", di.kind, di.compute_units);
  xpu_context ctx = 0;
  EXPECT(api->context_create(0, "threads=2;cpus=0", &ctx), XPU_OK);
  test_errors(ctx);
  test_attention(ctx);
  test_attention_v5(ctx, XPU_DT_Q8_0);
  test_attention_v5(ctx, XPU_DT_Q4_0);
  test_quant_matmul(ctx, XPU_DT_Q8_0);
  test_quant_matmul(ctx, XPU_DT_Q4_0);
  test_fpack_matmul(ctx);
  for (uint32_t dt = XPU_DT_Q4_K; dt <= XPU_DT_Q3_K; dt++) test_kquant(ctx, dt);
  /* the baseline int8 path (AVX2 maddubs, NEON without dotprod) where the CPU has a better one */
  xpu_context c8 = 0;
  EXPECT(api->context_create(0, "threads=2;int8dot=0", &c8), XPU_OK);
  for (uint32_t dt = XPU_DT_Q4_K; dt <= XPU_DT_Q6_K; dt++) test_kquant(c8, dt);
  test_w8a8(ctx);
  test_w8a8(c8);
  test_sparse_ffn(ctx);
  test_sparse_ffn(c8);
  EXPECT(api->context_release(c8), XPU_OK);
  test_gemm_softmax(ctx);
  test_concurrency(ctx);
  EXPECT(api->context_release(ctx), XPU_OK);
  /* shutdown frees what the host forgot and joins every thread */
  xpu_context c3 = 0;
  xpu_buffer leak = 0;
  EXPECT(api->context_create(0, NULL, &c3), XPU_OK);
  EXPECT(api->buffer_alloc(c3, 64, 0, &leak), XPU_OK);
  EXPECT(api->shutdown(), XPU_OK);
  dlclose(lib);
  if (failures) {
    fprintf(stderr, "neon-smoke: %d failures (%s)\n", failures, pr.reason);
    return 1;
  }
  printf("neon-smoke: ok (%s)\n", pr.reason);
  return 0;
}
