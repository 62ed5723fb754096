/*
 * sync_test.c: the rules of xpu_sync.h that every plugin relies on, checked directly (the
 * plugins' own tests reach them only through their ABI entries). make test-common-sync.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "xpu_sync.h"

static int failures;
#define CHECK(cond)                                                                              \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);                   \
      failures++;                                                                                \
    }                                                                                            \
  } while (0)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct job {
  xpu_queue_item item;
  int id;
  int *order;
  int *n;
  xpu_timeline *gate; /* waited on at value 1 when not NULL */
  xpu_status got;
} job;

static job *done[8];

static void run(xpu_queue_item *it, const int *stop) {
  job *j = (job *)it;
  j->got = j->gate ? xpu_timeline_wait(j->gate, 1, -1, stop) : XPU_OK;
  j->order[(*j->n)++] = j->id; /* one worker: no lock needed */
  done[j->id] = j;
}

static void *signal_later(void *arg) {
  usleep(20000);
  xpu_timeline_set((xpu_timeline *)arg, 7, XPU_OK, 0);
  return NULL;
}

int main(void) {
  xpu_timeline t;
  xpu_timeline_init(&t, 3);
  CHECK(xpu_timeline_value(&t) == 3);
  CHECK(xpu_timeline_wait(&t, 3, 0, NULL) == XPU_OK);
  CHECK(xpu_timeline_wait(&t, 4, 0, NULL) == XPU_E_TIMEOUT);
  double t0 = now_s();
  CHECK(xpu_timeline_wait(&t, 4, 30000000, NULL) == XPU_E_TIMEOUT);
  CHECK(now_s() - t0 >= 0.029);
  xpu_timeline_set(&t, 2, XPU_OK, 0); /* a timeline only grows */
  CHECK(xpu_timeline_value(&t) == 3);
  pthread_t th;
  pthread_create(&th, NULL, signal_later, &t);
  CHECK(xpu_timeline_wait(&t, 7, -1, NULL) == XPU_OK); /* woken by another thread */
  pthread_join(th, NULL);
  /* a failed submission poisons its value and every later one, never one already reached */
  xpu_timeline_set(&t, 10, XPU_E_DEVICE_LOST, 0);
  xpu_timeline_set(&t, 12, XPU_E_INTERNAL, 0);
  CHECK(xpu_timeline_wait(&t, 7, 0, NULL) == XPU_OK);
  CHECK(xpu_timeline_wait(&t, 9, 0, NULL) == XPU_E_TIMEOUT);
  CHECK(xpu_timeline_wait(&t, 11, -1, NULL) == XPU_E_DEVICE_LOST);
  xpu_timeline_set(&t, 8, XPU_E_TIMEOUT, 0); /* the lowest failed value wins */
  CHECK(xpu_timeline_wait(&t, 9, -1, NULL) == XPU_E_TIMEOUT);
  CHECK(xpu_timeline_use(&t, 2) == 2);
  xpu_timeline_set(&t, 20, XPU_OK, -1);
  CHECK(xpu_timeline_use(&t, 0) == 1 && xpu_timeline_value(&t) == 20);
  int stop = 1;
  xpu_timeline u;
  xpu_timeline_init(&u, 0);
  CHECK(xpu_timeline_wait(&u, 1, -1, &stop) == XPU_E_BAD_STATE); /* a stop flag ends a wait with no limit */
  xpu_timeline_destroy(&u);

  /* the queue runs jobs in order on one thread; stop runs the rest with the stop flag set */
  xpu_queue q;
  xpu_queue_init(&q, run);
  xpu_timeline gate;
  xpu_timeline_init(&gate, 0);
  int order[8], n = 0;
  job jobs[4];
  for (int i = 0; i < 4; i++) {
    jobs[i] = (job){{NULL}, i, order, &n, i == 1 ? &gate : NULL, -99};
    CHECK(xpu_queue_push(&q, &jobs[i].item) == XPU_OK);
  }
  for (int i = 0; i < 400 && n < 1; i++) usleep(5000);
  usleep(20000);
  CHECK(n == 1); /* job 1 waits on the gate, job 2 and 3 behind it */
  xpu_timeline_set(&gate, 1, XPU_OK, 0);
  for (int i = 0; i < 200 && n < 4; i++) usleep(5000);
  CHECK(n == 4);
  for (int i = 0; i < 4 && i < n; i++) CHECK(order[i] == i);
  xpu_timeline never;
  xpu_timeline_init(&never, 0);
  job blocked = {{NULL}, 4, order, &n, &never, -99};
  CHECK(xpu_queue_push(&q, &blocked.item) == XPU_OK);
  t0 = now_s();
  xpu_queue_stop(&q); /* must not hang on a fence no one signals */
  CHECK(now_s() - t0 < 2.0);
  CHECK(done[4] == &blocked && blocked.got == XPU_E_BAD_STATE);
  job late = {{NULL}, 5, order, &n, NULL, -99};
  CHECK(xpu_queue_push(&q, &late.item) == XPU_E_BAD_STATE);
  xpu_queue_reset(&q);
  CHECK(xpu_queue_push(&q, &late.item) == XPU_OK);
  xpu_queue_stop(&q);
  CHECK(done[5] == &late && late.got == XPU_OK);
  xpu_queue_destroy(&q);
  xpu_timeline_destroy(&never);
  xpu_timeline_destroy(&gate);
  xpu_timeline_destroy(&t);
  if (failures) {
    fprintf(stderr, "sync_test: %d failures\n", failures);
    return 1;
  }
  printf("sync_test: ok\n");
  return 0;
}
