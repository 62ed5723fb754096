/* fence.c: timeline fences and execution_submit's queue (one thread per context, started by
 * the first submit, joined by context release and shutdown). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api.h"
#include "neon.h"

/* ---------------------------------------------------------------- fences */

/* release_user: the caller is a queued job that is done with f (see nv_fence.users) */
static void fence_set(nv_fence *f, uint64_t value, xpu_status failed, int release_user) {
  pthread_mutex_lock(&f->mu);
  if (release_user) f->users--;
  if (failed != XPU_OK) {
    if (f->failed == XPU_OK || value < f->failed_value) {
      f->failed = failed;
      f->failed_value = value;
    }
  } else if (value > f->value) {
    f->value = value;
  }
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
}

/* waits until value is reached; stop (may be NULL) aborts the wait with BAD_STATE */
static xpu_status fence_wait_on(nv_fence *f, uint64_t value, int64_t timeout_ns, const int *stop) {
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  pthread_mutex_lock(&f->mu);
  xpu_status s = XPU_OK;
  int64_t left = timeout_ns;
  for (;;) {
    if (f->value >= value) break;
    if (f->failed != XPU_OK && value >= f->failed_value) {
      s = f->failed;
      break;
    }
    if (stop && __atomic_load_n(stop, __ATOMIC_ACQUIRE)) {
      s = XPU_E_BAD_STATE;
      break;
    }
    if (timeout_ns >= 0 && left <= 0) {
      s = XPU_E_TIMEOUT;
      break;
    }
    /* wake up at least every 50 ms so that a stopping queue is noticed */
    int64_t step = 50000000;
    if (timeout_ns >= 0 && left < step) step = left;
    struct timespec now, t;
    clock_gettime(CLOCK_REALTIME, &now);
    t.tv_sec = now.tv_sec + (now.tv_nsec + step) / 1000000000;
    t.tv_nsec = (now.tv_nsec + step) % 1000000000;
    pthread_cond_timedwait(&f->cv, &f->mu, &t);
    if (timeout_ns >= 0) {
      struct timespec after;
      clock_gettime(CLOCK_REALTIME, &after);
      left = timeout_ns - ((int64_t)(after.tv_sec - dl.tv_sec) * 1000000000 + (after.tv_nsec - dl.tv_nsec));
    }
  }
  pthread_mutex_unlock(&f->mu);
  return s;
}

xpu_status nv_api_fence_create(xpu_context ch, uint64_t initial, xpu_fence *out) {
  if (!out) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "fence_create: null out");
  *out = 0;
  nv_context *c = (nv_context *)xpu_reg_get(&nv_reg, ch, OBJ_CONTEXT);
  if (!c) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_HANDLE, "fence_create: unknown or released context handle");
  nv_fence *f = (nv_fence *)calloc(1, sizeof *f);
  if (!f) return xpu_fail(&nv_reg, ch, XPU_E_OUT_OF_MEMORY, "fence_create: out of memory");
  f->ctx = c;
  f->value = initial;
  pthread_mutex_init(&f->mu, NULL);
  pthread_cond_init(&f->cv, NULL);
  atomic_fetch_add(&c->children, 1);
  xpu_handle h = xpu_reg_add(&nv_reg, OBJ_FENCE, f);
  if (!h) {
    atomic_fetch_sub(&c->children, 1);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
    return xpu_fail(&nv_reg, ch, XPU_E_OUT_OF_MEMORY, "fence_create: out of handles");
  }
  *out = h;
  return XPU_OK;
}

xpu_status nv_api_fence_wait(xpu_fence h, uint64_t value, int64_t timeout_ns) {
  nv_fence *f = (nv_fence *)xpu_reg_get(&nv_reg, h, OBJ_FENCE);
  if (!f) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "fence_wait: unknown or released fence handle");
  xpu_status s = fence_wait_on(f, value, timeout_ns, NULL);
  if (s == XPU_E_TIMEOUT) return xpu_fail(&nv_reg, h, s, "fence_wait: value %llu not reached in time",
                                          (unsigned long long)value);
  if (s != XPU_OK)
    return xpu_fail(&nv_reg, h, s, "fence_wait: the submission that signals value %llu failed (%s)",
                    (unsigned long long)value, xpu_status_name(s));
  return XPU_OK;
}

xpu_status nv_api_fence_value(xpu_fence h, uint64_t *out) {
  if (!out) return xpu_fail(&nv_reg, h, XPU_E_INVALID_ARG, "fence_value: null out");
  nv_fence *f = (nv_fence *)xpu_reg_get(&nv_reg, h, OBJ_FENCE);
  if (!f) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "fence_value: unknown or released fence handle");
  pthread_mutex_lock(&f->mu);
  *out = f->value;
  pthread_mutex_unlock(&f->mu);
  return XPU_OK;
}

xpu_status nv_api_fence_signal(xpu_fence h, uint64_t value) {
  nv_fence *f = (nv_fence *)xpu_reg_get(&nv_reg, h, OBJ_FENCE);
  if (!f) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "fence_signal: unknown or released fence handle");
  fence_set(f, value, XPU_OK, 0);
  return XPU_OK;
}

/* Fences are released only when no queued job refers to them: jobs keep raw pointers. */
typedef struct nv_job {
  struct nv_job *next;
  nv_execution *x;
  uint32_t n_waits;
  nv_fence **waits;
  uint64_t *wait_values;
  nv_fence *signal;
  uint64_t signal_value;
} nv_job;

static int nv_fence_users(nv_fence *f) {
  pthread_mutex_lock(&f->mu);
  int n = f->users;
  pthread_mutex_unlock(&f->mu);
  return n;
}

static void fence_use(nv_fence *f, int delta) {
  pthread_mutex_lock(&f->mu);
  f->users += delta;
  pthread_mutex_unlock(&f->mu);
}

xpu_status nv_api_fence_release(xpu_fence h) {
  nv_fence *f = (nv_fence *)xpu_reg_get(&nv_reg, h, OBJ_FENCE);
  if (!f) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "fence_release: unknown or released fence handle");
  if (nv_fence_users(f) > 0)
    return xpu_fail(&nv_reg, h, XPU_E_BAD_STATE, "fence_release: a submitted execution still waits on or signals it");
  if (!xpu_reg_remove(&nv_reg, h, OBJ_FENCE))
    return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "fence_release: released concurrently");
  atomic_fetch_sub(&f->ctx->children, 1);
  pthread_mutex_destroy(&f->mu);
  pthread_cond_destroy(&f->cv);
  free(f);
  return XPU_OK;
}

/* ---------------------------------------------------------------- async queue */

static void job_free(nv_job *j) {
  free(j->waits);
  free(j->wait_values);
  free(j);
}

static void job_unuse(nv_job *j) {
  for (uint32_t i = 0; i < j->n_waits; i++) fence_use(j->waits[i], -1);
  if (j->signal) fence_use(j->signal, -1);
}

static void *queue_main(void *arg) {
  nv_context *c = (nv_context *)arg;
  pthread_mutex_lock(&c->qmu);
  for (;;) {
    while (!c->qhead && !c->qstop) pthread_cond_wait(&c->qcv, &c->qmu);
    if (!c->qhead) break;
    nv_job *j = c->qhead;
    int stopping = c->qstop;
    pthread_mutex_unlock(&c->qmu);
    xpu_status s = stopping ? XPU_E_BAD_STATE : XPU_OK;
    for (uint32_t i = 0; i < j->n_waits && s == XPU_OK; i++)
      s = fence_wait_on(j->waits[i], j->wait_values[i], -1, &c->qstop);
    if (s == XPU_OK) {
      pthread_mutex_lock(&j->x->mu);
      j->x->state = EX_RUNNING;
      pthread_mutex_unlock(&j->x->mu);
      s = nv_execute(j->x);
    } else {
      xpu_fail(&nv_reg, j->x->handle, s, "execution_submit: a wait fence failed or the context stopped (%s)",
               xpu_status_name(s));
    }
    for (uint32_t i = 0; i < j->n_waits; i++) fence_use(j->waits[i], -1);
    pthread_mutex_lock(&c->qmu);
    c->qhead = j->next;
    if (!c->qhead) c->qtail = NULL;
    pthread_mutex_unlock(&c->qmu);
    /* idle before the fence moves: a host that saw the fence may reuse the execution at once */
    nv_exec_finish(j->x);
    if (j->signal) fence_set(j->signal, j->signal_value, s, 1);
    job_free(j);
    pthread_mutex_lock(&c->qmu);
  }
  pthread_mutex_unlock(&c->qmu);
  return NULL;
}

void nv_queue_stop(nv_context *c) {
  pthread_mutex_lock(&c->qmu);
  int started = c->qstarted;
  __atomic_store_n(&c->qstop, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&c->qcv);
  pthread_mutex_unlock(&c->qmu);
  if (started) pthread_join(c->qthread, NULL);
  pthread_mutex_lock(&c->qmu);
  c->qstarted = 0;
  pthread_mutex_unlock(&c->qmu);
}

xpu_status nv_api_execution_submit(xpu_execution h, const xpu_fence_point *waits, uint32_t n_waits,
                                       const xpu_fence_point *signal) {
  nv_execution *x = (nv_execution *)xpu_reg_get(&nv_reg, h, OBJ_EXECUTION);
  if (!x) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "execution_submit: unknown or released execution handle");
  if (n_waits && !waits) return xpu_fail(&nv_reg, h, XPU_E_INVALID_ARG, "execution_submit: null waits");
  if (n_waits > 1024) return xpu_fail(&nv_reg, h, XPU_E_INVALID_ARG, "execution_submit: %u waits", n_waits);
  nv_context *c = x->exe->ctx;
  nv_job *j = (nv_job *)calloc(1, sizeof *j);
  if (j) {
    j->waits = (nv_fence **)calloc(n_waits + 1, sizeof(nv_fence *));
    j->wait_values = (uint64_t *)calloc(n_waits + 1, sizeof(uint64_t));
  }
  if (!j || !j->waits || !j->wait_values) {
    if (j) job_free(j);
    return xpu_fail(&nv_reg, h, XPU_E_OUT_OF_MEMORY, "execution_submit: out of memory");
  }
  j->x = x;
  j->n_waits = n_waits;
  for (uint32_t i = 0; i < n_waits; i++) {
    nv_fence *f = (nv_fence *)xpu_reg_get(&nv_reg, waits[i].fence, OBJ_FENCE);
    if (!f || f->ctx != c) {
      job_free(j);
      return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "execution_submit: wait %u: unknown fence or another context's", i);
    }
    j->waits[i] = f;
    j->wait_values[i] = waits[i].value;
  }
  if (signal) {
    nv_fence *f = (nv_fence *)xpu_reg_get(&nv_reg, signal->fence, OBJ_FENCE);
    if (!f || f->ctx != c) {
      job_free(j);
      return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "execution_submit: unknown signal fence or another context's");
    }
    j->signal = f;
    j->signal_value = signal->value;
  }
  xpu_status s = nv_exec_begin(x, EX_QUEUED, "execution_submit");
  if (s != XPU_OK) {
    job_free(j);
    return s;
  }
  /* the fences stay alive until the job is done with them (fence_release says BAD_STATE) */
  for (uint32_t i = 0; i < n_waits; i++) fence_use(j->waits[i], 1);
  if (j->signal) fence_use(j->signal, 1);
  pthread_mutex_lock(&c->qmu);
  if (c->qstop) {
    pthread_mutex_unlock(&c->qmu);
    job_unuse(j);
    nv_exec_finish(x);
    job_free(j);
    return xpu_fail(&nv_reg, h, XPU_E_BAD_STATE, "execution_submit: the plugin is shutting down");
  }
  if (!c->qstarted) {
    int rc = pthread_create(&c->qthread, NULL, queue_main, c);
    if (rc != 0) {
      pthread_mutex_unlock(&c->qmu);
      job_unuse(j);
      nv_exec_finish(x);
      job_free(j);
      return xpu_fail(&nv_reg, h, XPU_E_OUT_OF_MEMORY, "execution_submit: cannot start the queue thread: %s",
                      strerror(rc));
    }
    c->qstarted = 1;
  }
  if (c->qtail)
    c->qtail->next = j;
  else
    c->qhead = j;
  c->qtail = j;
  pthread_cond_signal(&c->qcv);
  pthread_mutex_unlock(&c->qmu);
  return XPU_OK;
}


void nv_fence_free(nv_fence *f) {
  atomic_fetch_sub(&f->ctx->children, 1);
  pthread_mutex_destroy(&f->mu);
  pthread_cond_destroy(&f->cv);
  free(f);
}
