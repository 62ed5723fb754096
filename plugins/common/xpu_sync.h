/*
 * xpu_sync.h: the timeline fence and the in-order worker queue that host-driven plugins share
 * (neon, qnn and the test plugin), header-only like xpu_plugin.h. OpenCL keeps its own fences:
 * they are lists of cl_events the device orders by itself, not a value a host thread moves.
 *
 *  - xpu_timeline: a fence's state. A value that only grows, and a poison: a submission that
 *    was to signal value v and failed marks v (the lowest such v wins), so a waiter for v or
 *    later sees that status instead of waiting forever. A value already reached is never
 *    poisoned retroactively. `users` counts queued jobs that hold a pointer to it, so that
 *    fence_release can refuse (BAD_STATE) instead of freeing it under them. Waits run on
 *    CLOCK_MONOTONIC (a wall-clock step neither ends nor extends them).
 *  - xpu_queue: one worker thread that runs jobs in submission order, started by the first
 *    push and joined by xpu_queue_stop. A job is a struct that begins with an xpu_queue_item;
 *    the queue calls run(item, &q->stop) once for each, and run owns (frees) the job. After
 *    stop, pushes are refused and the jobs still queued run with *stop set, so their fence
 *    waits end at once (xpu_timeline_wait returns BAD_STATE).
 */
#ifndef XPU_SYNC_H
#define XPU_SYNC_H

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "xpu_backend.h"

/* ---------------------------------------------------------------- timeline fences */

typedef struct xpu_timeline {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t value;          /* the highest value reached by a signal or a successful submission */
  xpu_status fail_status;  /* XPU_OK, or the status of the failed submission that poisons... */
  uint64_t fail_value;     /* ...this value and every later one */
  uint32_t users;          /* queued jobs that wait on or signal it */
} xpu_timeline;

static inline void xpu_timeline_init(xpu_timeline *t, uint64_t initial) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&t->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&t->mu, NULL);
  t->value = initial;
  t->fail_status = XPU_OK;
  t->fail_value = 0;
  t->users = 0;
}

static inline void xpu_timeline_destroy(xpu_timeline *t) {
  pthread_cond_destroy(&t->cv);
  pthread_mutex_destroy(&t->mu);
}

static inline uint64_t xpu_timeline_value(xpu_timeline *t) {
  pthread_mutex_lock(&t->mu);
  uint64_t v = t->value;
  pthread_mutex_unlock(&t->mu);
  return v;
}

/*
 * Moves the timeline: status XPU_OK raises the value to `value` (a lower value leaves it as it
 * is); any other status poisons `value`. Wakes every waiter. use_delta adjusts `users` under
 * the same lock, so a job can signal and let go of the fence in one step (-1) before the host,
 * woken by the signal, releases it.
 */
static inline void xpu_timeline_set(xpu_timeline *t, uint64_t value, xpu_status status, int use_delta) {
  pthread_mutex_lock(&t->mu);
  t->users = (uint32_t)((int64_t)t->users + use_delta);
  if (status != XPU_OK) {
    if (t->fail_status == XPU_OK || value < t->fail_value) {
      t->fail_status = status;
      t->fail_value = value;
    }
  } else if (value > t->value) {
    t->value = value;
  }
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
}

/* Adds delta to `users` and returns the new count (delta 0 reads it). */
static inline uint32_t xpu_timeline_use(xpu_timeline *t, int delta) {
  pthread_mutex_lock(&t->mu);
  t->users = (uint32_t)((int64_t)t->users + delta);
  uint32_t n = t->users;
  pthread_mutex_unlock(&t->mu);
  return n;
}

/*
 * Waits until the timeline reaches value: XPU_OK; the poison status when value is poisoned;
 * XPU_E_TIMEOUT after timeout_ns (< 0: no limit; 0: just a test); XPU_E_BAD_STATE when *stop
 * (may be NULL) becomes non-zero, which is looked at at least every 50 ms.
 */
static inline xpu_status xpu_timeline_wait(xpu_timeline *t, uint64_t value, int64_t timeout_ns, const int *stop) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  const int64_t start = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
  xpu_status st = XPU_OK;
  pthread_mutex_lock(&t->mu);
  for (;;) {
    if (t->value >= value) break;
    if (t->fail_status != XPU_OK && value >= t->fail_value) {
      st = t->fail_status;
      break;
    }
    if (stop && __atomic_load_n(stop, __ATOMIC_ACQUIRE)) {
      st = XPU_E_BAD_STATE;
      break;
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t at = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
    if (timeout_ns >= 0 && at - start >= timeout_ns) {
      st = XPU_E_TIMEOUT;
      break;
    }
    int64_t step = stop ? 50000000 : INT64_MAX / 2; /* a stop flag is polled, nothing else is */
    if (timeout_ns >= 0 && start + timeout_ns - at < step) step = start + timeout_ns - at;
    if (step > (int64_t)3600 * 1000000000) {
      pthread_cond_wait(&t->cv, &t->mu);
      continue;
    }
    int64_t until = at + step;
    struct timespec dl = {(time_t)(until / 1000000000), (long)(until % 1000000000)};
    int rc = pthread_cond_timedwait(&t->cv, &t->mu, &dl);
    (void)rc; /* ETIMEDOUT or a wake-up: the loop re-checks everything */
  }
  pthread_mutex_unlock(&t->mu);
  return st;
}

/* ---------------------------------------------------------------- in-order worker queue */

typedef struct xpu_queue_item {
  struct xpu_queue_item *next;
} xpu_queue_item;

typedef struct xpu_queue {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  xpu_queue_item *head, *tail;
  pthread_t thread;
  int started;
  int stop; /* read by fence waits without mu: atomic */
  void (*run)(xpu_queue_item *item, const int *stop);
} xpu_queue;

/* A static queue: static xpu_queue q = XPU_QUEUE_INIT(run); */
#define XPU_QUEUE_INIT(run_fn) {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .run = (run_fn)}

static inline void xpu_queue_init(xpu_queue *q, void (*run)(xpu_queue_item *, const int *)) {
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->cv, NULL);
  q->head = q->tail = NULL;
  q->started = 0;
  q->stop = 0;
  q->run = run;
}

/* Frees the queue's lock and condition (after xpu_queue_stop, or when it never started). */
static inline void xpu_queue_destroy(xpu_queue *q) {
  pthread_cond_destroy(&q->cv);
  pthread_mutex_destroy(&q->mu);
}

static inline void *xpu__queue_main(void *arg) {
  xpu_queue *q = (xpu_queue *)arg;
  pthread_mutex_lock(&q->mu);
  for (;;) {
    while (!q->head && !q->stop) pthread_cond_wait(&q->cv, &q->mu);
    xpu_queue_item *it = q->head;
    if (!it) break; /* stopping and drained */
    q->head = it->next;
    if (!q->head) q->tail = NULL;
    pthread_mutex_unlock(&q->mu);
    q->run(it, &q->stop);
    pthread_mutex_lock(&q->mu);
  }
  pthread_mutex_unlock(&q->mu);
  return NULL;
}

/*
 * Appends item; starts the worker on the first push. XPU_E_BAD_STATE after xpu_queue_stop,
 * XPU_E_OUT_OF_MEMORY when no thread can be started. On an error the caller still owns item.
 */
static inline xpu_status xpu_queue_push(xpu_queue *q, xpu_queue_item *item) {
  item->next = NULL;
  pthread_mutex_lock(&q->mu);
  if (q->stop) {
    pthread_mutex_unlock(&q->mu);
    return XPU_E_BAD_STATE;
  }
  if (!q->started) {
    if (pthread_create(&q->thread, NULL, xpu__queue_main, q) != 0) {
      pthread_mutex_unlock(&q->mu);
      return XPU_E_OUT_OF_MEMORY;
    }
    q->started = 1;
  }
  if (q->tail) q->tail->next = item;
  else q->head = item;
  q->tail = item;
  pthread_cond_signal(&q->cv);
  pthread_mutex_unlock(&q->mu);
  return XPU_OK;
}

/* Whether xpu_queue_stop was called. */
static inline int xpu_queue_stopping(xpu_queue *q) { return __atomic_load_n(&q->stop, __ATOMIC_ACQUIRE); }

/* Refuses new pushes, lets the worker run out what is queued (with *stop set), joins it. */
static inline void xpu_queue_stop(xpu_queue *q) {
  pthread_mutex_lock(&q->mu);
  int started = q->started;
  __atomic_store_n(&q->stop, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
  if (started) pthread_join(q->thread, NULL);
  pthread_mutex_lock(&q->mu);
  q->started = 0;
  pthread_mutex_unlock(&q->mu);
}

/* After xpu_queue_stop: accept pushes again (a plugin opened again after its shutdown). */
static inline void xpu_queue_reset(xpu_queue *q) { __atomic_store_n(&q->stop, 0, __ATOMIC_RELEASE); }

#endif /* XPU_SYNC_H */
