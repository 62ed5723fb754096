/*
 * harness.c: the benchmark's C side, loaded by bench_test.go through purego. It is built only
 * by `make bench-neon` and links OpenBLAS, which is never a dependency of the product.
 *
 *  - xb_sgemm: OpenBLAS's sgemm with a fixed thread count, in MATMUL's layout (b is [N, K]).
 *  - xb_read: STREAM-style read bandwidth: n threads sum disjoint slices of a buffer.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include <cblas.h>

extern void openblas_set_num_threads(int);

void xb_sgemm(int64_t m, int64_t n, int64_t k, const float *a, const float *b, float *c, int32_t threads) {
  openblas_set_num_threads(threads);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, 1.0f, a, (int)k, b, (int)k, 0.0f, c,
              (int)n);
}

typedef struct {
  const uint64_t *p;
  uint64_t n;
  uint64_t sum;
} slice;

static void *sum_slice(void *arg) {
  slice *s = (slice *)arg;
  /* four independent sums so the loop is bound by loads, not by the add latency */
  uint64_t a = 0, b = 0, c = 0, d = 0;
  uint64_t i = 0;
  for (; i + 4 <= s->n; i += 4) {
    a += s->p[i];
    b += s->p[i + 1];
    c += s->p[i + 2];
    d += s->p[i + 3];
  }
  for (; i < s->n; i++) a += s->p[i];
  s->sum = a + b + c + d;
  return NULL;
}

/* returns the sum so the compiler cannot drop the reads */
uint64_t xb_read(const uint64_t *p, uint64_t words, int32_t threads) {
  if (threads < 1 || threads > 64) return 0;
  pthread_t th[64];
  slice sl[64];
  uint64_t per = words / (uint64_t)threads;
  for (int i = 0; i < threads; i++) {
    sl[i].p = p + per * (uint64_t)i;
    sl[i].n = i == threads - 1 ? words - per * (uint64_t)i : per;
    pthread_create(&th[i], NULL, sum_slice, &sl[i]);
  }
  uint64_t s = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(th[i], NULL);
    s += sl[i].sum;
  }
  return s;
}
