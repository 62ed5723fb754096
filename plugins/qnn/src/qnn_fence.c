/*
 * qnn_fence.c: timeline fences of the QNN plugin (mutex + condition variable on the monotonic
 * clock); a failed submission poisons its signal value so later waits see its status.
 */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "qnn_plugin.h"

xpu_status fence_create(xpu_context ctx, uint64_t initial, xpu_fence *out) {
  qctx *c = xpu_reg_get(&qnn_reg, ctx, T_CTX);
  if (!c) return xpu_fail(&qnn_reg, ctx, XPU_E_INVALID_HANDLE, "fence_create: invalid context handle");
  if (!out) return xpu_fail(&qnn_reg, ctx, XPU_E_INVALID_ARG, "fence_create: null output");
  qfence *f = calloc(1, sizeof *f);
  if (!f) return xpu_fail(&qnn_reg, ctx, XPU_E_OUT_OF_MEMORY, "fence_create: out of memory");
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&f->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&f->mu, NULL);
  f->value = initial;
  f->ctx = ctx;
  f->owner = c;
  *out = xpu_reg_add(&qnn_reg, T_FENCE, f);
  if (!*out) {
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
    free(f);
    return xpu_fail(&qnn_reg, ctx, XPU_E_OUT_OF_MEMORY, "fence_create: out of memory");
  }
  atomic_fetch_add(&c->children, 1);
  return XPU_OK;
}

/* Fences are reference-counted while someone waits on them or a queued submission names them,
 * so fence_release cannot free one under a waiter (it answers BAD_STATE instead). Taking a
 * reference and releasing hold refs_mu, so a handle cannot be released between lookup and ref. */
qfence *fence_ref(xpu_fence h) {
  pthread_mutex_lock(&qnn_state.refs_mu);
  qfence *f = xpu_reg_get(&qnn_reg, h, T_FENCE);
  if (f) f->refs++;
  pthread_mutex_unlock(&qnn_state.refs_mu);
  return f;
}

void fence_unref(qfence *f) {
  pthread_mutex_lock(&qnn_state.refs_mu);
  f->refs--;
  pthread_mutex_unlock(&qnn_state.refs_mu);
}

xpu_status fence_wait_on(qfence *f, uint64_t value, int64_t timeout_ns) {
  struct timespec dl;
  clock_gettime(CLOCK_MONOTONIC, &dl);
  if (timeout_ns > 0) {
    dl.tv_sec += timeout_ns / 1000000000;
    dl.tv_nsec += timeout_ns % 1000000000;
    if (dl.tv_nsec >= 1000000000) {
      dl.tv_sec++;
      dl.tv_nsec -= 1000000000;
    }
  }
  xpu_status st = XPU_OK;
  pthread_mutex_lock(&f->mu);
  for (;;) {
    if (f->fail_value && value >= f->fail_value) {
      st = f->fail_status;
      break;
    }
    if (f->value >= value) break;
    if (timeout_ns == 0) {
      st = XPU_E_TIMEOUT;
      break;
    }
    int r = timeout_ns < 0 ? pthread_cond_wait(&f->cv, &f->mu) : pthread_cond_timedwait(&f->cv, &f->mu, &dl);
    if (r == ETIMEDOUT) {
      st = XPU_E_TIMEOUT;
      break;
    }
  }
  pthread_mutex_unlock(&f->mu);
  return st;
}

xpu_status fence_wait(xpu_fence h, uint64_t value, int64_t timeout_ns) {
  qfence *f = fence_ref(h);
  if (!f) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "fence_wait: invalid fence handle");
  xpu_status st = fence_wait_on(f, value, timeout_ns);
  fence_unref(f);
  if (st == XPU_E_TIMEOUT) return xpu_fail(&qnn_reg, h, st, "fence_wait: timed out waiting for %llu", (unsigned long long)value);
  if (st != XPU_OK) return xpu_fail(&qnn_reg, h, st, "fence_wait: the submission that signals %llu failed (%s)",
                                    (unsigned long long)value, xpu_status_name(st));
  return XPU_OK;
}

xpu_status fence_value(xpu_fence h, uint64_t *out) {
  if (!out) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "fence_value: null output");
  qfence *f = fence_ref(h);
  if (!f) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "fence_value: invalid fence handle");
  pthread_mutex_lock(&f->mu);
  *out = f->value;
  pthread_mutex_unlock(&f->mu);
  fence_unref(f);
  return XPU_OK;
}

xpu_status fence_set(qfence *f, uint64_t value, xpu_status fail) {
  pthread_mutex_lock(&f->mu);
  xpu_status st = XPU_OK;
  if (fail != XPU_OK) {
    if (!f->fail_value || value < f->fail_value) {
      f->fail_value = value;
      f->fail_status = fail;
    }
  } else if (value < f->value) {
    st = XPU_E_INVALID_ARG;
  } else {
    f->value = value;
  }
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  return st;
}

xpu_status fence_signal(xpu_fence h, uint64_t value) {
  qfence *f = fence_ref(h);
  if (!f) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "fence_signal: invalid fence handle");
  xpu_status st = fence_set(f, value, XPU_OK);
  fence_unref(f);
  if (st != XPU_OK)
    return xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "fence_signal: %llu is below the current value", (unsigned long long)value);
  return XPU_OK;
}

xpu_status fence_release(xpu_fence h) {
  pthread_mutex_lock(&qnn_state.refs_mu);
  qfence *f = xpu_reg_get(&qnn_reg, h, T_FENCE);
  if (f && f->refs) {
    pthread_mutex_unlock(&qnn_state.refs_mu);
    return xpu_fail(&qnn_reg, h, XPU_E_BAD_STATE, "fence_release: a wait or a queued submission uses it");
  }
  if (f) xpu_reg_remove(&qnn_reg, h, T_FENCE);
  pthread_mutex_unlock(&qnn_state.refs_mu);
  if (!f) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "fence_release: invalid fence handle");
  atomic_fetch_sub(&f->owner->children, 1);
  pthread_cond_destroy(&f->cv);
  pthread_mutex_destroy(&f->mu);
  free(f);
  return XPU_OK;
}
