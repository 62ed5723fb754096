/*
 * fence.c: timeline fences over cl_events.
 *
 * A fence keeps the points still in flight: (value, submission) for values a submission will
 * reach, (value, user event) for values only a host signal will reach. A submission that waits
 * on a value takes the event of the first point that reaches it into its wait list, so the
 * device orders the work without a host round-trip. Completed points fold into two numbers:
 * ok_value (reached by work that succeeded or by the host) and reached (anything, failures too).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ocl.h"

static void drop_point(ocl_fence *f, uint32_t i) {
  f->pts[i] = f->pts[--f->npts];
}

/* Folds completed submissions into ok_value / reached; f->mu held. */
static void update_locked(ocl_fence *f) {
  for (uint32_t i = 0; i < f->npts;) {
    ocl_point *p = &f->pts[i];
    xpu_status st;
    char msg[256];
    if (!p->sub || !ocl_sub_done(p->sub, &st, msg, sizeof msg)) {
      i++;
      continue;
    }
    if (p->value > f->reached) f->reached = p->value;
    if (st == XPU_OK) {
      if (p->value > f->ok_value) f->ok_value = p->value;
    } else {
      f->fail = st;
      snprintf(f->fail_msg, sizeof f->fail_msg, "%s", msg);
    }
    ocl_sub_unref(p->sub);
    drop_point(f, i);
  }
}

static xpu_status push_point(ocl_fence *f, ocl_point p) {
  if (f->npts == f->cap) {
    uint32_t nc = f->cap ? f->cap * 2 : 8;
    ocl_point *np = realloc(f->pts, nc * sizeof *np);
    if (!np) return XPU_E_OUT_OF_MEMORY;
    f->pts = np;
    f->cap = nc;
  }
  f->pts[f->npts++] = p;
  return XPU_OK;
}

xpu_status ocl_fence_create(xpu_context ctx_h, uint64_t initial, xpu_fence *out) {
  ocl_ctx *c = xpu_reg_get(&P.reg, ctx_h, T_CTX);
  if (!c) return xpu_fail(&P.reg, ctx_h, XPU_E_INVALID_HANDLE, "fence_create: invalid context");
  if (!out) return xpu_fail(&P.reg, ctx_h, XPU_E_INVALID_ARG, "fence_create: null out");
  ocl_fence *f = calloc(1, sizeof *f);
  if (!f) return xpu_fail(&P.reg, ctx_h, XPU_E_OUT_OF_MEMORY, "fence_create: out of memory");
  f->ctx = c;
  f->ok_value = f->reached = initial;
  pthread_mutex_init(&f->mu, NULL);
  xpu_handle h = xpu_reg_add(&P.reg, T_FENCE, f);
  if (!h) {
    pthread_mutex_destroy(&f->mu);
    free(f);
    return xpu_fail(&P.reg, ctx_h, XPU_E_OUT_OF_MEMORY, "fence_create: registry full");
  }
  atomic_fetch_add(&c->children, 1);
  *out = h;
  return XPU_OK;
}

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

xpu_status ocl_fence_wait(xpu_fence h, uint64_t value, int64_t timeout_ns) {
  ocl_fence *f = xpu_reg_get(&P.reg, h, T_FENCE);
  if (!f) return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "fence_wait: invalid fence");
  double deadline = now_ns() + (double)timeout_ns;
  long sleep_ns = 20000;
  for (;;) {
    pthread_mutex_lock(&f->mu);
    update_locked(f);
    if (value <= f->ok_value) {
      pthread_mutex_unlock(&f->mu);
      return XPU_OK;
    }
    if (value <= f->reached) {
      xpu_status st = f->fail;
      char msg[256];
      snprintf(msg, sizeof msg, "%s", f->fail_msg);
      pthread_mutex_unlock(&f->mu);
      return xpu_fail(&P.reg, h, st, "fence_wait: the submission that reaches %llu failed: %s",
                      (unsigned long long)value, msg);
    }
    uint64_t cur = f->reached;
    pthread_mutex_unlock(&f->mu);
    if (timeout_ns >= 0 && now_ns() >= deadline)
      return xpu_fail(&P.reg, h, XPU_E_TIMEOUT, "fence_wait: value %llu not reached (at %llu)",
                      (unsigned long long)value, (unsigned long long)cur);
    /* polling: cl_events have no timed wait, and clWaitForEvents cannot be interrupted */
    struct timespec ts = {0, sleep_ns};
    if (timeout_ns >= 0 && deadline - now_ns() < sleep_ns)
      ts.tv_nsec = (long)(deadline - now_ns()) > 0 ? (long)(deadline - now_ns()) : 0;
    nanosleep(&ts, NULL);
    if (sleep_ns < 1000000) sleep_ns *= 2;
  }
}

xpu_status ocl_fence_value(xpu_fence h, uint64_t *out) {
  ocl_fence *f = xpu_reg_get(&P.reg, h, T_FENCE);
  if (!f) return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "fence_value: invalid fence");
  if (!out) return xpu_fail(&P.reg, h, XPU_E_INVALID_ARG, "fence_value: null out");
  pthread_mutex_lock(&f->mu);
  update_locked(f);
  *out = f->reached;
  pthread_mutex_unlock(&f->mu);
  return XPU_OK;
}

xpu_status ocl_fence_signal(xpu_fence h, uint64_t value) {
  ocl_fence *f = xpu_reg_get(&P.reg, h, T_FENCE);
  if (!f) return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "fence_signal: invalid fence");
  pthread_mutex_lock(&f->mu);
  update_locked(f);
  if (value < f->reached) {
    uint64_t cur = f->reached;
    pthread_mutex_unlock(&f->mu);
    return xpu_fail(&P.reg, h, XPU_E_INVALID_ARG,
                    "fence_signal: %llu is below the current value %llu (timelines only grow)",
                    (unsigned long long)value, (unsigned long long)cur);
  }
  f->reached = f->ok_value = value;
  for (uint32_t i = 0; i < f->npts;) {
    ocl_point *p = &f->pts[i];
    if (p->sub || p->value > value) {
      i++;
      continue;
    }
    P.cl.clSetUserEventStatus(p->user, CL_COMPLETE);
    P.cl.clReleaseEvent(p->user);
    drop_point(f, i);
  }
  pthread_mutex_unlock(&f->mu);
  return XPU_OK;
}

xpu_status ocl_fence_release(xpu_fence h) {
  ocl_fence *f = xpu_reg_remove(&P.reg, h, T_FENCE);
  if (!f) return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "fence_release: invalid fence");
  for (uint32_t i = 0; i < f->npts; i++) {
    if (f->pts[i].sub) {
      ocl_sub_unref(f->pts[i].sub);
    } else {
      /* nobody can signal it any more: work still waiting on it is abandoned, not hung */
      P.cl.clSetUserEventStatus(f->pts[i].user, CL_INVALID_EVENT);
      P.cl.clReleaseEvent(f->pts[i].user);
    }
  }
  free(f->pts);
  atomic_fetch_sub(&f->ctx->children, 1);
  pthread_mutex_destroy(&f->mu);
  free(f);
  return XPU_OK;
}

xpu_status ocl_fence_wait_events(xpu_handle ex_h, const xpu_fence_point *w, cl_event *evs,
                                 uint32_t *n, uint32_t cap) {
  ocl_fence *f = xpu_reg_get(&P.reg, w->fence, T_FENCE);
  if (!f) return xpu_fail(&P.reg, ex_h, XPU_E_INVALID_HANDLE, "submit: invalid wait fence");
  pthread_mutex_lock(&f->mu);
  update_locked(f);
  xpu_status st = XPU_OK;
  if (w->value <= f->ok_value) goto out;
  if (w->value <= f->reached) {
    st = xpu_fail(&P.reg, ex_h, f->fail, "submit: waits on a failed submission: %s", f->fail_msg);
    goto out;
  }
  if (*n >= cap) {
    st = xpu_fail(&P.reg, ex_h, XPU_E_INVALID_ARG, "submit: too many wait points");
    goto out;
  }
  /* the earliest point that reaches the value: a submission, else a user event */
  ocl_point *best = NULL;
  for (uint32_t i = 0; i < f->npts; i++) {
    ocl_point *p = &f->pts[i];
    if (p->value < w->value) continue;
    if (!best || (p->sub && !best->sub) || (!!p->sub == !!best->sub && p->value < best->value))
      best = p;
  }
  if (!best) {
    cl_int ce = CL_SUCCESS;
    ocl_point p = {w->value, NULL, P.cl.clCreateUserEvent(f->ctx->dev->clctx, &ce)};
    if (!p.user) {
      st = ocl_clfail(ex_h, ce, "clCreateUserEvent");
      goto out;
    }
    if (push_point(f, p) != XPU_OK) {
      P.cl.clReleaseEvent(p.user);
      st = xpu_fail(&P.reg, ex_h, XPU_E_OUT_OF_MEMORY, "submit: out of memory");
      goto out;
    }
    best = &f->pts[f->npts - 1];
  }
  cl_event ev = best->sub ? best->sub->ev : best->user;
  P.cl.clRetainEvent(ev);
  evs[(*n)++] = ev;
out:
  pthread_mutex_unlock(&f->mu);
  return st;
}

/* A user event that a submission's completion must set, since no host signal may come. */
static void CL_CALLBACK complete_user(cl_event ev, cl_int status, void *user) {
  (void)ev;
  P.cl.clSetUserEventStatus((cl_event)user, status == CL_COMPLETE ? CL_COMPLETE : status);
  P.cl.clReleaseEvent((cl_event)user);
}

xpu_status ocl_fence_add_point(xpu_handle ex_h, const xpu_fence_point *sig, ocl_sub *sub) {
  ocl_fence *f = xpu_reg_get(&P.reg, sig->fence, T_FENCE);
  if (!f) return xpu_fail(&P.reg, ex_h, XPU_E_INVALID_HANDLE, "submit: invalid signal fence");
  pthread_mutex_lock(&f->mu);
  ocl_point p = {sig->value, sub, NULL};
  if (push_point(f, p) != XPU_OK) {
    pthread_mutex_unlock(&f->mu);
    return xpu_fail(&P.reg, ex_h, XPU_E_OUT_OF_MEMORY, "submit: out of memory");
  }
  ocl_sub_ref(sub);
  for (uint32_t i = 0; i < f->npts;) {
    ocl_point *u = &f->pts[i];
    if (u->sub || u->value > sig->value) {
      i++;
      continue;
    }
    cl_int ce = P.cl.clSetEventCallback(sub->ev, CL_COMPLETE, complete_user, u->user);
    if (ce != CL_SUCCESS) { /* keep the point: a host signal can still release it */
      i++;
      continue;
    }
    drop_point(f, i); /* the callback owns the reference now */
  }
  pthread_mutex_unlock(&f->mu);
  return XPU_OK;
}
