/*
 * qnn_fence.c: timeline fences of the QNN plugin over the plugins' shared xpu_timeline
 * (xpu_sync.h); a failed submission poisons its signal value so later waits see its status.
 */
#include <stdlib.h>

#include "qnn_plugin.h"

xpu_status fence_create(xpu_context ctx, uint64_t initial, xpu_fence *out) {
  qctx *c = xpu_reg_get(&qnn_reg, ctx, T_CTX);
  if (!c) return xpu_fail(&qnn_reg, ctx, XPU_E_INVALID_HANDLE, "fence_create: invalid context handle");
  if (!out) return xpu_fail(&qnn_reg, ctx, XPU_E_INVALID_ARG, "fence_create: null output");
  qfence *f = calloc(1, sizeof *f);
  if (!f) return xpu_fail(&qnn_reg, ctx, XPU_E_OUT_OF_MEMORY, "fence_create: out of memory");
  xpu_timeline_init(&f->tl, initial);
  f->ctx = ctx;
  f->owner = c;
  *out = xpu_reg_add(&qnn_reg, T_FENCE, f);
  if (!*out) {
    xpu_timeline_destroy(&f->tl);
    free(f);
    return xpu_fail(&qnn_reg, ctx, XPU_E_OUT_OF_MEMORY, "fence_create: out of memory");
  }
  atomic_fetch_add(&c->children, 1);
  return XPU_OK;
}

/* Fences are reference-counted (the timeline's users) while someone waits on them or a queued
 * submission names them, so fence_release cannot free one under a waiter (it answers BAD_STATE
 * instead). Taking a reference and releasing hold refs_mu, so a handle cannot be released
 * between lookup and ref. */
qfence *fence_ref(xpu_fence h) {
  pthread_mutex_lock(&qnn_state.refs_mu);
  qfence *f = xpu_reg_get(&qnn_reg, h, T_FENCE);
  if (f) xpu_timeline_use(&f->tl, 1);
  pthread_mutex_unlock(&qnn_state.refs_mu);
  return f;
}

void fence_unref(qfence *f) {
  pthread_mutex_lock(&qnn_state.refs_mu);
  xpu_timeline_use(&f->tl, -1);
  pthread_mutex_unlock(&qnn_state.refs_mu);
}

void fence_set_unref(qfence *f, uint64_t value, xpu_status fail) {
  pthread_mutex_lock(&qnn_state.refs_mu);
  xpu_timeline_set(&f->tl, value, fail, -1);
  pthread_mutex_unlock(&qnn_state.refs_mu);
}

xpu_status fence_wait(xpu_fence h, uint64_t value, int64_t timeout_ns) {
  qfence *f = fence_ref(h);
  if (!f) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "fence_wait: invalid fence handle");
  xpu_status st = xpu_timeline_wait(&f->tl, value, timeout_ns, NULL);
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
  *out = xpu_timeline_value(&f->tl);
  fence_unref(f);
  return XPU_OK;
}

xpu_status fence_signal(xpu_fence h, uint64_t value) {
  qfence *f = fence_ref(h);
  if (!f) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "fence_signal: invalid fence handle");
  /* a timeline only grows: a lower value is the host's mistake, reported (the value stays) */
  int lower = value < xpu_timeline_value(&f->tl);
  if (!lower) xpu_timeline_set(&f->tl, value, XPU_OK, 0);
  fence_unref(f);
  if (lower)
    return xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "fence_signal: %llu is below the current value", (unsigned long long)value);
  return XPU_OK;
}

xpu_status fence_release(xpu_fence h) {
  pthread_mutex_lock(&qnn_state.refs_mu);
  qfence *f = xpu_reg_get(&qnn_reg, h, T_FENCE);
  if (f && xpu_timeline_use(&f->tl, 0)) {
    pthread_mutex_unlock(&qnn_state.refs_mu);
    return xpu_fail(&qnn_reg, h, XPU_E_BAD_STATE, "fence_release: a wait or a queued submission uses it");
  }
  if (f) xpu_reg_remove(&qnn_reg, h, T_FENCE);
  pthread_mutex_unlock(&qnn_state.refs_mu);
  if (!f) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "fence_release: invalid fence handle");
  atomic_fetch_sub(&f->owner->children, 1);
  xpu_timeline_destroy(&f->tl);
  free(f);
  return XPU_OK;
}
