/*
 * graph.c: executables (a checked copy of the IR with every tensor placed) and executions (one
 * binding set, a scratch buffer for intermediate values, asynchronous submission).
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "graph.h"

#define SCRATCH_ALIGN 256 /* >= CL_DEVICE_MEM_BASE_ADDR_ALIGN in bytes on every device we know */
#define MAX_WAITS 64

xpu_status ocl_graph_analyze(xpu_context ctx_h, const void *ir, uint64_t ir_size,
                             xpu_node_verdict *out, uint32_t cap) {
  ocl_ctx *c = xpu_reg_get(&P.reg, ctx_h, T_CTX);
  if (!c) return xpu_fail(&P.reg, ctx_h, XPU_E_INVALID_HANDLE, "graph_analyze: invalid context");
  xpu_ir_graph g;
  char err[256];
  xpu_status st = xpu_ir_parse(ir, ir_size, &g, err, sizeof err);
  if (st != XPU_OK) return xpu_fail(&P.reg, ctx_h, st, "graph_analyze: %s", err);
  if (!out || cap < g.header->n_nodes)
    return xpu_fail(&P.reg, ctx_h, XPU_E_INVALID_ARG,
                    "graph_analyze: %u verdicts needed, room for %u", g.header->n_nodes, cap);
  for (uint32_t i = 0; i < g.header->n_nodes; i++) {
    xpu_node_verdict v;
    memset(&v, 0, sizeof v);
    v.verdict = ocl_node_check(c, &g, i, v.reason, sizeof v.reason) ? XPU_VERDICT_YES
                                                                     : XPU_VERDICT_NO;
    v.precision = XPU_PREC_DEFAULT; /* every kernel accumulates in f32 or better */
    if (v.verdict == XPU_VERDICT_YES) v.reason[0] = 0;
    uint32_t n = out[i].struct_size ? out[i].struct_size : sizeof v;
    v.struct_size = n < sizeof v ? n : sizeof v;
    memcpy(&out[i], &v, v.struct_size);
  }
  return XPU_OK;
}

typedef struct span {
  uint64_t off, size;
} span;

/*
 * Places every intermediate value in the scratch buffer. A value's bytes are reused once its
 * last reader has been enqueued: the queue is in order, so a later kernel cannot overtake it.
 * Best-fit over the freed spans; returns the scratch size, or UINT64_MAX when out of memory.
 */
static uint64_t plan_scratch(ocl_exe *e) {
  const xpu_ir_graph *g = &e->g;
  uint32_t nt = g->header->n_tensors, nn = g->header->n_nodes;
  int64_t *last = malloc((nt ? nt : 1) * sizeof *last);
  uint8_t *done = calloc(nt ? nt : 1, 1);
  span *fr = malloc((nt + 1) * sizeof *fr);
  if (!last || !done || !fr) {
    free(last);
    free(done);
    free(fr);
    return UINT64_MAX;
  }
  uint32_t nfr = 0;
  uint64_t top = 0;
  for (uint32_t t = 0; t < nt; t++) last[t] = -1;
  for (uint32_t i = 0; i < nn; i++) {
    for (uint32_t j = 0; j < g->nodes[i].n_inputs; j++) last[g->nodes[i].inputs[j]] = i;
    if (last[g->nodes[i].output] < (int64_t)i) last[g->nodes[i].output] = i; /* never read */
  }
#define IN_SCRATCH(t) (g->tensors[t].kind == XPU_TENSOR_VALUE && e->out_io[t] < 0)
#define SIZE_OF(t) ((xpu_ir_nbytes(&g->tensors[t]) + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN)
  for (uint32_t i = 0; i < nn; i++) {
    uint32_t t = g->nodes[i].output;
    if (IN_SCRATCH(t)) {
      uint64_t need = SIZE_OF(t);
      uint32_t best = nfr;
      for (uint32_t k = 0; k < nfr; k++)
        if (fr[k].size >= need && (best == nfr || fr[k].size < fr[best].size)) best = k;
      if (need == 0) {
        e->voff[t] = 0;
      } else if (best < nfr) {
        e->voff[t] = fr[best].off;
        fr[best].off += need;
        fr[best].size -= need;
        if (fr[best].size == 0) fr[best] = fr[--nfr];
      } else {
        e->voff[t] = top;
        top += need;
      }
    }
    for (uint32_t j = 0; j <= g->nodes[i].n_inputs; j++) {
      uint32_t u = j < g->nodes[i].n_inputs ? g->nodes[i].inputs[j] : t;
      if (IN_SCRATCH(u) && last[u] == (int64_t)i && !done[u] && SIZE_OF(u) > 0) {
        done[u] = 1;
        fr[nfr++] = (span){e->voff[u], SIZE_OF(u)};
      }
    }
  }
#undef IN_SCRATCH
#undef SIZE_OF
  free(last);
  free(done);
  free(fr);
  return top;
}

static void exe_free(ocl_exe *e) {
  if (e->cmem)
    for (uint32_t i = 0; i < e->g.header->n_tensors; i++)
      if (e->cmem[i]) P.cl.clReleaseMemObject(e->cmem[i]);
  free(e->cmem);
  free(e->voff);
  free(e->out_io);
  free(e->blob);
  free(e);
}

xpu_status ocl_graph_prepare(xpu_context ctx_h, const xpu_prepare_desc *desc, xpu_executable *out) {
  ocl_ctx *c = xpu_reg_get(&P.reg, ctx_h, T_CTX);
  if (!c) return xpu_fail(&P.reg, ctx_h, XPU_E_INVALID_HANDLE, "graph_prepare: invalid context");
  if (!desc || !out || desc->struct_size < offsetof(xpu_prepare_desc, options))
    return xpu_fail(&P.reg, ctx_h, XPU_E_INVALID_ARG, "graph_prepare: null or short desc/out");
  if (!desc->ir || desc->ir_size == 0 || desc->ir_size > ((uint64_t)1 << 32))
    return xpu_fail(&P.reg, ctx_h, XPU_E_INVALID_ARG, "graph_prepare: no IR");
  ocl_exe *e = calloc(1, sizeof *e);
  /* a private copy: the caller's blob need not outlive prepare; malloc aligns to 16 */
  if (e) e->blob = malloc(desc->ir_size);
  if (!e || !e->blob) {
    free(e);
    return xpu_fail(&P.reg, ctx_h, XPU_E_OUT_OF_MEMORY, "graph_prepare: out of memory");
  }
  memcpy(e->blob, desc->ir, desc->ir_size);
  e->ctx = c;
  atomic_init(&e->children, 0);
  char err[256];
  xpu_status st = xpu_ir_parse(e->blob, desc->ir_size, &e->g, err, sizeof err);
  if (st != XPU_OK) {
    free(e->blob);
    free(e);
    return xpu_fail(&P.reg, ctx_h, st, "graph_prepare: %s", err);
  }
  const xpu_ir_graph *g = &e->g;
  uint32_t nt = g->header->n_tensors;
  for (uint32_t i = 0; i < g->header->n_nodes; i++) {
    if (!ocl_node_check(c, g, i, err, sizeof err)) {
      const char *op = xpu_op_name(g->nodes[i].op); /* a static name: g dies with e */
      exe_free(e);
      return xpu_fail(&P.reg, ctx_h, XPU_E_UNSUPPORTED, "graph_prepare: node %u (%s): %s", i, op, err);
    }
    if (g->nodes[i].op == XPU_OP_GET_ROWS) e->uses_flag = 1;
  }
  e->cmem = calloc(nt ? nt : 1, sizeof *e->cmem);
  e->voff = calloc(nt ? nt : 1, sizeof *e->voff);
  e->out_io = malloc((nt ? nt : 1) * sizeof *e->out_io);
  if (!e->cmem || !e->voff || !e->out_io) {
    exe_free(e);
    return xpu_fail(&P.reg, ctx_h, XPU_E_OUT_OF_MEMORY, "graph_prepare: out of memory");
  }
  for (uint32_t t = 0; t < nt; t++) e->out_io[t] = -1;
  for (uint32_t i = 0; i < g->header->n_outputs; i++)
    if (e->out_io[g->outputs[i]] < 0) e->out_io[g->outputs[i]] = (int32_t)(g->header->n_inputs + i);
  for (uint32_t t = 0; t < nt; t++) {
    const xpu_ir_tensor *tt = &g->tensors[t];
    if (tt->kind == XPU_TENSOR_CONST) {
      /* keep the constant's memory alive even if its buffer handle is released */
      ocl_buf *b = xpu_reg_get(&P.reg, tt->const_buffer, T_BUF);
      if (!b || b->ctx != c) {
        exe_free(e);
        return xpu_fail(&P.reg, ctx_h, XPU_E_INVALID_ARG,
                        "graph_prepare: tensor %u: constant buffer is not of this context", t);
      }
      P.cl.clRetainMemObject(b->mem);
      e->cmem[t] = b->mem;
    }
  }
  e->scratch = plan_scratch(e);
  if (e->scratch == UINT64_MAX) {
    exe_free(e);
    return xpu_fail(&P.reg, ctx_h, XPU_E_OUT_OF_MEMORY, "graph_prepare: out of memory");
  }
  xpu_handle h = xpu_reg_add(&P.reg, T_EXE, e);
  if (!h) {
    exe_free(e);
    return xpu_fail(&P.reg, ctx_h, XPU_E_OUT_OF_MEMORY, "graph_prepare: registry full");
  }
  xpu_log(&P.reg, XPU_LOG_DEBUG, "opencl: prepared %u nodes, %llu bytes of scratch per execution",
          g->header->n_nodes, (unsigned long long)e->scratch);
  atomic_fetch_add(&c->children, 1);
  *out = h;
  return XPU_OK;
}

xpu_status ocl_executable_serialize(xpu_executable h, void *dst, uint64_t cap, uint64_t *size) {
  (void)dst;
  (void)cap;
  (void)size;
  if (!xpu_reg_get(&P.reg, h, T_EXE))
    return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "executable_serialize: invalid executable");
  /* the compiled program is cached per device on disk already; an executable is only the IR */
  return xpu_fail(&P.reg, h, XPU_E_UNSUPPORTED,
                  "executable_serialize: not supported (no XPU_CAP_SERIALIZE); the kernel "
                  "program is cached on disk instead");
}

xpu_status ocl_executable_release(xpu_executable h) {
  ocl_exe *e = xpu_reg_get(&P.reg, h, T_EXE);
  if (!e) return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "executable_release: invalid executable");
  if (atomic_load(&e->children))
    return xpu_fail(&P.reg, h, XPU_E_BAD_STATE, "executable_release: %u executions still alive",
                    atomic_load(&e->children));
  if (!xpu_reg_remove(&P.reg, h, T_EXE))
    return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "executable_release: invalid executable");
  atomic_fetch_sub(&e->ctx->children, 1);
  exe_free(e);
  return XPU_OK;
}

/* ---------------------------------------------------------------- executions */
static void exec_free(ocl_exec *x) {
  if (x->q) P.cl.clReleaseCommandQueue(x->q);
  if (x->scratch) P.cl.clReleaseMemObject(x->scratch);
  if (x->flag) P.cl.clReleaseMemObject(x->flag);
  ocl_sub_unref(x->last);
  free(x->bind);
  free(x->bind_off);
  pthread_mutex_destroy(&x->mu);
  free(x);
}

xpu_status ocl_execution_create(xpu_executable eh, xpu_execution *out) {
  ocl_exe *e = xpu_reg_get(&P.reg, eh, T_EXE);
  if (!e) return xpu_fail(&P.reg, eh, XPU_E_INVALID_HANDLE, "execution_create: invalid executable");
  if (!out) return xpu_fail(&P.reg, eh, XPU_E_INVALID_ARG, "execution_create: null out");
  ocl_exec *x = calloc(1, sizeof *x);
  if (!x) return xpu_fail(&P.reg, eh, XPU_E_OUT_OF_MEMORY, "execution_create: out of memory");
  pthread_mutex_init(&x->mu, NULL);
  x->exe = e;
  x->nio = e->g.header->n_inputs + e->g.header->n_outputs;
  x->bind = calloc(x->nio ? x->nio : 1, sizeof *x->bind);
  x->bind_off = calloc(x->nio ? x->nio : 1, sizeof *x->bind_off);
  cl_int ce = CL_SUCCESS;
  if (x->bind && x->bind_off && e->scratch)
    x->scratch = P.cl.clCreateBuffer(e->ctx->dev->clctx, CL_MEM_READ_WRITE, e->scratch, NULL, &ce);
  /* a queue per execution: executions run concurrently and one waiting on a fence holds up
   * no other; its own nodes stay in order */
  if (ce == CL_SUCCESS && x->bind && x->bind_off)
    x->q = P.cl.clCreateCommandQueue(e->ctx->dev->clctx, e->ctx->dev->id, 0, &ce);
  if (ce == CL_SUCCESS && e->uses_flag)
    x->flag = P.cl.clCreateBuffer(e->ctx->dev->clctx, CL_MEM_READ_WRITE, sizeof(cl_int), NULL, &ce);
  if (!x->bind || !x->bind_off || ce != CL_SUCCESS) {
    exec_free(x);
    return ce != CL_SUCCESS ? ocl_clfail(eh, ce, "clCreateBuffer(scratch)")
                            : xpu_fail(&P.reg, eh, XPU_E_OUT_OF_MEMORY, "execution_create: out of memory");
  }
  xpu_handle h = xpu_reg_add(&P.reg, T_EXEC, x);
  if (!h) {
    exec_free(x);
    return xpu_fail(&P.reg, eh, XPU_E_OUT_OF_MEMORY, "execution_create: registry full");
  }
  atomic_fetch_add(&e->children, 1);
  *out = h;
  return XPU_OK;
}

static const xpu_ir_tensor *io_tensor(const ocl_exe *e, uint32_t io) {
  const xpu_ir_graph *g = &e->g;
  uint32_t t = io < g->header->n_inputs ? g->inputs[io] : g->outputs[io - g->header->n_inputs];
  return &g->tensors[t];
}

/* the tensor of io fits [off, off + nbytes) of b, at an offset its element type can address */
static xpu_status check_fit(xpu_handle h, const ocl_exe *e, uint32_t io, const ocl_buf *b,
                            uint64_t off) {
  const xpu_ir_tensor *t = io_tensor(e, io);
  uint64_t nb = xpu_ir_nbytes(t);
  if (off > b->size || nb > b->size - off)
    return xpu_fail(&P.reg, h, XPU_E_INVALID_ARG,
                    "execution_bind: io %u needs [%llu, +%llu) of a %llu-byte buffer", io,
                    (unsigned long long)off, (unsigned long long)nb, (unsigned long long)b->size);
  uint32_t esz = xpu_dtype_block_len(t->dtype) > 1 ? 1 : xpu_dtype_block_bytes(t->dtype);
  if (off % esz)
    return xpu_fail(&P.reg, h, XPU_E_INVALID_ARG,
                    "execution_bind: io %u offset %llu is not a multiple of its %u-byte elements",
                    io, (unsigned long long)off, esz);
  return XPU_OK;
}

xpu_status ocl_execution_bind(xpu_execution h, uint32_t io, xpu_buffer bh, uint64_t offset) {
  ocl_exec *x = xpu_reg_get(&P.reg, h, T_EXEC);
  if (!x) return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "execution_bind: invalid execution");
  if (io >= x->nio)
    return xpu_fail(&P.reg, h, XPU_E_INVALID_ARG, "execution_bind: io %u of %u", io, x->nio);
  ocl_buf *b = xpu_reg_get(&P.reg, bh, T_BUF);
  if (!b) return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "execution_bind: invalid buffer");
  if (b->ctx != x->exe->ctx)
    return xpu_fail(&P.reg, h, XPU_E_INVALID_ARG, "execution_bind: buffer of another context");
  xpu_status st = check_fit(h, x->exe, io, b, offset);
  if (st != XPU_OK) return st;
  pthread_mutex_lock(&x->mu);
  x->bind[io] = bh;
  x->bind_off[io] = offset;
  pthread_mutex_unlock(&x->mu);
  return XPU_OK;
}

static int sub_pending(ocl_sub *s) {
  xpu_status st;
  char msg[8];
  return s && !ocl_sub_done(s, &st, msg, sizeof msg);
}

/* x->mu held */
static xpu_status submit_locked(xpu_execution h, ocl_exec *x, const xpu_fence_point *waits,
                                uint32_t n_waits, const xpu_fence_point *signal) {
  ocl_exe *e = x->exe;
  ocl_ctx *c = e->ctx;
  const xpu_ir_graph *g = &e->g;
  if (sub_pending(x->last))
    return xpu_fail(&P.reg, h, XPU_E_BAD_STATE, "execution_submit: still in flight");
  if (n_waits && !waits)
    return xpu_fail(&P.reg, h, XPU_E_INVALID_ARG, "execution_submit: null waits");
  if (n_waits > MAX_WAITS)
    return xpu_fail(&P.reg, h, XPU_E_INVALID_ARG, "execution_submit: more than %d waits", MAX_WAITS);
  uint32_t nt = g->header->n_tensors;
  ocl_ref *refs = calloc(nt ? nt : 1, sizeof *refs);
  ocl_buf **bufs = calloc(x->nio ? x->nio : 1, sizeof *bufs);
  cl_event evs[MAX_WAITS];
  uint32_t nev = 0;
  xpu_status st = XPU_OK;
  if (!refs || !bufs) {
    st = xpu_fail(&P.reg, h, XPU_E_OUT_OF_MEMORY, "execution_submit: out of memory");
    goto out;
  }
  for (uint32_t io = 0; io < x->nio; io++) {
    if (!x->bind[io]) {
      st = xpu_fail(&P.reg, h, XPU_E_BAD_STATE, "execution_submit: io %u is not bound", io);
      goto out;
    }
    bufs[io] = xpu_reg_get(&P.reg, x->bind[io], T_BUF);
    if (!bufs[io]) {
      st = xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE,
                    "execution_submit: the buffer bound to io %u was released", io);
      goto out;
    }
    uint32_t t = io < g->header->n_inputs ? g->inputs[io] : g->outputs[io - g->header->n_inputs];
    if (io < g->header->n_inputs || e->out_io[t] == (int32_t)io)
      refs[t] = (ocl_ref){bufs[io]->mem, x->bind_off[io]};
  }
  for (uint32_t t = 0; t < nt; t++) {
    if (e->cmem[t]) refs[t] = (ocl_ref){e->cmem[t], g->tensors[t].const_offset};
    else if (g->tensors[t].kind == XPU_TENSOR_VALUE && e->out_io[t] < 0)
      refs[t] = (ocl_ref){x->scratch, e->voff[t]};
  }
  if (signal) {
    ocl_fence *sf = xpu_reg_get(&P.reg, signal->fence, T_FENCE);
    if (!sf || sf->ctx->dev != c->dev) {
      st = xpu_fail(&P.reg, h, sf ? XPU_E_INVALID_ARG : XPU_E_INVALID_HANDLE,
                    "execution_submit: the signal fence is %s",
                    sf ? "of another device" : "invalid");
      goto out;
    }
  }
  for (uint32_t i = 0; i < n_waits; i++) {
    ocl_fence *wf = xpu_reg_get(&P.reg, waits[i].fence, T_FENCE);
    if (wf && wf->ctx->dev != c->dev) {
      st = xpu_fail(&P.reg, h, XPU_E_INVALID_ARG, "execution_submit: wait %u: fence of another device", i);
      goto out;
    }
    st = ocl_fence_wait_events(h, &waits[i], evs, &nev, MAX_WAITS);
    if (st != XPU_OK) goto out;
  }
  ocl_sub *sub = ocl_sub_new();
  if (!sub) {
    st = xpu_fail(&P.reg, h, XPU_E_OUT_OF_MEMORY, "execution_submit: out of memory");
    goto out;
  }
  char why[256] = "";
  cl_int ce = CL_SUCCESS;
  cl_int zero = 0;
  pthread_mutex_lock(&c->mu);
  /* the in-order queue runs everything after this marker only once the waits are reached */
  if (nev) ce = P.cl.clEnqueueMarkerWithWaitList(x->q, nev, evs, NULL);
  if (ce == CL_SUCCESS && e->uses_flag)
    ce = P.cl.clEnqueueFillBuffer(x->q, x->flag, &zero, sizeof zero, 0, sizeof zero, 0, NULL, NULL);
  if (ce != CL_SUCCESS) snprintf(why, sizeof why, "clEnqueueMarker/FillBuffer failed: %s", cl_err_name(ce));
  for (uint32_t i = 0; i < g->header->n_nodes && ce == CL_SUCCESS; i++)
    ce = ocl_launch_node(c, x->q, g, i, refs, x->flag, why, sizeof why);
  /* an output listed twice: the first binding got the value, copy it to the others */
  for (uint32_t i = 0; i < g->header->n_outputs && ce == CL_SUCCESS; i++) {
    uint32_t io = g->header->n_inputs + i, t = g->outputs[i];
    if (e->out_io[t] == (int32_t)io) continue;
    ce = P.cl.clEnqueueCopyBuffer(x->q, refs[t].mem, bufs[io]->mem, refs[t].off, x->bind_off[io],
                                  xpu_ir_nbytes(&g->tensors[t]), 0, NULL, NULL);
    if (ce != CL_SUCCESS) snprintf(why, sizeof why, "clEnqueueCopyBuffer failed: %s", cl_err_name(ce));
  }
  if (ce == CL_SUCCESS) {
    if (e->uses_flag)
      ce = P.cl.clEnqueueReadBuffer(x->q, x->flag, CL_FALSE, 0, sizeof sub->errflag,
                                    &sub->errflag, 0, NULL, &sub->ev);
    else
      ce = P.cl.clEnqueueMarkerWithWaitList(x->q, 0, NULL, &sub->ev);
    if (ce != CL_SUCCESS) snprintf(why, sizeof why, "completion event failed: %s", cl_err_name(ce));
  }
  /* also after a failure: what was enqueued may wait on a fence the host has yet to signal, so
   * it is left to drain (the queue is in order) rather than waited for here */
  P.cl.clFlush(x->q);
  pthread_mutex_unlock(&c->mu);
  if (ce != CL_SUCCESS) {
    ocl_sub_unref(sub);
    st = xpu_fail(&P.reg, h, ocl_status_of(ce), "execution_submit: %s", why);
    goto out;
  }
  ocl_sub_unref(x->last);
  x->last = sub;
  for (uint32_t io = 0; io < x->nio; io++) {
    pthread_mutex_lock(&bufs[io]->mu);
    ocl_sub_unref(bufs[io]->last);
    ocl_sub_ref(sub);
    bufs[io]->last = sub;
    pthread_mutex_unlock(&bufs[io]->mu);
  }
  if (signal) st = ocl_fence_add_point(h, signal, sub);
out:
  for (uint32_t i = 0; i < nev; i++) P.cl.clReleaseEvent(evs[i]);
  free(refs);
  free(bufs);
  return st;
}

xpu_status ocl_execution_submit(xpu_execution h, const xpu_fence_point *waits, uint32_t n_waits,
                                const xpu_fence_point *signal) {
  ocl_exec *x = xpu_reg_get(&P.reg, h, T_EXEC);
  if (!x) return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "execution_submit: invalid execution");
  pthread_mutex_lock(&x->mu);
  xpu_status st = submit_locked(h, x, waits, n_waits, signal);
  pthread_mutex_unlock(&x->mu);
  return st;
}

/* Polls a short while before blocking: small graphs finish in tens of microseconds, less than
 * a blocked thread takes to be woken (measured on PoCL: 71 us per run blocking at once). */
static cl_int wait_event(cl_event ev) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    cl_int es = CL_QUEUED;
    cl_int ce = P.cl.clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof es, &es, NULL);
    if (ce != CL_SUCCESS || es <= CL_COMPLETE) return ce;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) > 200000L) break;
    sched_yield();
  }
  return P.cl.clWaitForEvents(1, &ev);
}

xpu_status ocl_execution_run(xpu_execution h) {
  ocl_exec *x = xpu_reg_get(&P.reg, h, T_EXEC);
  if (!x) return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "execution_run: invalid execution");
  pthread_mutex_lock(&x->mu);
  xpu_status st = submit_locked(h, x, NULL, 0, NULL);
  ocl_sub *sub = x->last;
  ocl_sub_ref(sub);
  pthread_mutex_unlock(&x->mu);
  if (st == XPU_OK) {
    cl_int ce = wait_event(sub->ev);
    char msg[256];
    if (!ocl_sub_done(sub, &st, msg, sizeof msg)) {
      st = ocl_clfail(h, ce, "clWaitForEvents");
    } else if (st != XPU_OK) {
      st = xpu_fail(&P.reg, h, st, "execution_run: %s", msg);
    }
  }
  ocl_sub_unref(sub);
  return st;
}

xpu_status ocl_execution_release(xpu_execution h) {
  ocl_exec *x = xpu_reg_get(&P.reg, h, T_EXEC);
  if (!x) return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "execution_release: invalid execution");
  pthread_mutex_lock(&x->mu);
  int busy = sub_pending(x->last);
  pthread_mutex_unlock(&x->mu);
  if (busy) return xpu_fail(&P.reg, h, XPU_E_BAD_STATE, "execution_release: still in flight");
  if (!xpu_reg_remove(&P.reg, h, T_EXEC))
    return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "execution_release: invalid execution");
  atomic_fetch_sub(&x->exe->children, 1);
  exec_free(x);
  return XPU_OK;
}
