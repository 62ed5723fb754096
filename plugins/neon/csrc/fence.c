/* fence.c: timeline fences and execution_submit's queue (xpu_sync.h: one worker thread per
 * context, started by the first submit, joined by context release and shutdown). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "neon.h"

/* ---------------------------------------------------------------- fences */

xpu_status nv_api_fence_create(xpu_context ch, uint64_t initial, xpu_fence *out) {
  if (!out) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "fence_create: null out");
  *out = 0;
  nv_context *c = (nv_context *)xpu_reg_get(&nv_reg, ch, OBJ_CONTEXT);
  if (!c) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_HANDLE, "fence_create: unknown or released context handle");
  nv_fence *f = (nv_fence *)calloc(1, sizeof *f);
  if (!f) return xpu_fail(&nv_reg, ch, XPU_E_OUT_OF_MEMORY, "fence_create: out of memory");
  f->ctx = c;
  xpu_timeline_init(&f->tl, initial);
  atomic_fetch_add(&c->children, 1);
  xpu_handle h = xpu_reg_add(&nv_reg, OBJ_FENCE, f);
  if (!h) {
    nv_fence_free(f);
    return xpu_fail(&nv_reg, ch, XPU_E_OUT_OF_MEMORY, "fence_create: out of handles");
  }
  *out = h;
  return XPU_OK;
}

xpu_status nv_api_fence_wait(xpu_fence h, uint64_t value, int64_t timeout_ns) {
  nv_fence *f = (nv_fence *)xpu_reg_get(&nv_reg, h, OBJ_FENCE);
  if (!f) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "fence_wait: unknown or released fence handle");
  xpu_status s = xpu_timeline_wait(&f->tl, value, timeout_ns, NULL);
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
  *out = xpu_timeline_value(&f->tl);
  return XPU_OK;
}

xpu_status nv_api_fence_signal(xpu_fence h, uint64_t value) {
  nv_fence *f = (nv_fence *)xpu_reg_get(&nv_reg, h, OBJ_FENCE);
  if (!f) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "fence_signal: unknown or released fence handle");
  xpu_timeline_set(&f->tl, value, XPU_OK, 0);
  return XPU_OK;
}

xpu_status nv_api_fence_release(xpu_fence h) {
  nv_fence *f = (nv_fence *)xpu_reg_get(&nv_reg, h, OBJ_FENCE);
  if (!f) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "fence_release: unknown or released fence handle");
  if (xpu_timeline_use(&f->tl, 0) > 0)
    return xpu_fail(&nv_reg, h, XPU_E_BAD_STATE, "fence_release: a submitted execution still waits on or signals it");
  if (!xpu_reg_remove(&nv_reg, h, OBJ_FENCE))
    return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "fence_release: released concurrently");
  nv_fence_free(f);
  return XPU_OK;
}

void nv_fence_free(nv_fence *f) {
  atomic_fetch_sub(&f->ctx->children, 1);
  xpu_timeline_destroy(&f->tl);
  free(f);
}

/* ---------------------------------------------------------------- async queue */

/* Jobs keep raw fence pointers: the fences' users counts keep them alive until the job ends. */
typedef struct nv_job {
  xpu_queue_item item; /* first: the queue hands it back */
  nv_execution *x;
  uint32_t n_waits;
  nv_fence **waits;
  uint64_t *wait_values;
  nv_fence *signal;
  uint64_t signal_value;
} nv_job;

static void job_free(nv_job *j) {
  free(j->waits);
  free(j->wait_values);
  free(j);
}

void nv_run_job(xpu_queue_item *item, const int *stop) {
  nv_job *j = (nv_job *)item;
  xpu_status s = XPU_OK;
  for (uint32_t i = 0; i < j->n_waits && s == XPU_OK; i++)
    s = xpu_timeline_wait(&j->waits[i]->tl, j->wait_values[i], -1, stop);
  if (s == XPU_OK) {
    pthread_mutex_lock(&j->x->mu);
    j->x->state = EX_RUNNING;
    pthread_mutex_unlock(&j->x->mu);
    s = nv_execute(j->x);
  } else {
    xpu_fail(&nv_reg, j->x->handle, s, "execution_submit: a wait fence failed or the context stopped (%s)",
             xpu_status_name(s));
  }
  for (uint32_t i = 0; i < j->n_waits; i++) xpu_timeline_use(&j->waits[i]->tl, -1);
  /* idle before the fence moves: a host that saw the fence may reuse the execution at once */
  nv_exec_finish(j->x);
  if (j->signal) xpu_timeline_set(&j->signal->tl, j->signal_value, s, -1);
  job_free(j);
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
  for (uint32_t i = 0; i < n_waits; i++) xpu_timeline_use(&j->waits[i]->tl, 1);
  if (j->signal) xpu_timeline_use(&j->signal->tl, 1);
  s = xpu_queue_push(&c->q, &j->item);
  if (s != XPU_OK) {
    for (uint32_t i = 0; i < n_waits; i++) xpu_timeline_use(&j->waits[i]->tl, -1);
    if (j->signal) xpu_timeline_use(&j->signal->tl, -1);
    nv_exec_finish(x);
    job_free(j);
    return xpu_fail(&nv_reg, h, s, s == XPU_E_BAD_STATE ? "execution_submit: the plugin is shutting down"
                                                        : "execution_submit: cannot start the queue thread");
  }
  return XPU_OK;
}
