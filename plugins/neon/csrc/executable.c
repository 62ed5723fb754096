/* executable.c: graph_analyze, graph_prepare and the executable and execution entry points
 * (create, bind, synchronous run, release); execution_submit is in fence.c with the queue. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "neon.h"

/* ---------------------------------------------------------------- graphs */

xpu_status nv_api_graph_analyze(xpu_context ch, const void *ir, uint64_t ir_size, xpu_node_verdict *out,
                                    uint32_t cap) {
  nv_context *c = (nv_context *)xpu_reg_get(&nv_reg, ch, OBJ_CONTEXT);
  if (!c) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_HANDLE, "graph_analyze: unknown or released context handle");
  xpu_ir_graph g;
  char err[256];
  xpu_status s = xpu_ir_parse(ir, ir_size, &g, err, sizeof err);
  if (s != XPU_OK) return xpu_fail(&nv_reg, ch, s, "graph_analyze: %s", err);
  if (!nv_check_tensors(&g, err, sizeof err)) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "graph_analyze: %s", err);
  if (!out && g.header->n_nodes) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "graph_analyze: null out");
  if (cap < g.header->n_nodes)
    return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "graph_analyze: room for %u verdicts, the graph has %u nodes", cap,
                    g.header->n_nodes);
  for (uint32_t i = 0; i < g.header->n_nodes; i++) {
    if (out[i].struct_size < offsetof(xpu_node_verdict, precision) + sizeof(uint32_t))
      return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "graph_analyze: verdict %u struct_size %u too small", i,
                      out[i].struct_size);
    xpu_node_verdict v;
    memset(&v, 0, sizeof v);
    uint32_t prec = XPU_PREC_DEFAULT;
    v.verdict = nv_node_supported(&g, &g.nodes[i], &prec, v.reason, sizeof v.reason) ? XPU_VERDICT_YES
                                                                                     : XPU_VERDICT_NO;
    v.precision = prec;
    XPU_COPY_OUT(&out[i], v);
  }
  return XPU_OK;
}

/* Repacks (or finds in the context's cache) every constant Q4_0/Q8_0 matmul weight and the
 * small float ones of GEMM-path nodes (nv_fpack_wanted), unless the context says repack=0, and
 * every constant Q4_K/Q5_K/Q6_K one (always: their int8 kernels read only the repacked layout). */
static xpu_status prepare_weights(nv_executable *e, char *err, size_t cap) {
  const xpu_ir_graph *g = &e->g;
  for (uint32_t i = 0; i < g->header->n_nodes; i++) {
    const xpu_ir_node *n = &g->nodes[i];
    if (n->op != XPU_OP_MATMUL) continue;
    const xpu_ir_tensor *b = &g->tensors[n->inputs[1]];
    int q0 = (b->dtype == XPU_DT_Q4_0 || b->dtype == XPU_DT_Q8_0) && e->ctx->repack;
    int f = e->ctx->repack && nv_fpack_wanted(g, n);
    if (b->kind != XPU_TENSOR_CONST || !(q0 || f || nv_kq_repackable(b->dtype))) continue;
    int batched = 0;
    for (uint32_t d = 0; d + 2 < b->rank; d++) batched |= b->shape[d] != 1;
    int64_t N = b->shape[b->rank - 2], K = b->shape[b->rank - 1];
    if (batched || N <= 0 || K <= 0) continue;
    if (!e->packed) {
      e->packed = (nv_qpacked **)calloc(g->header->n_nodes, sizeof *e->packed);
      if (!e->packed) break;
    }
    nv_buffer *buf = (nv_buffer *)xpu_reg_get(&nv_reg, b->const_buffer, OBJ_BUFFER);
    if (!buf) continue; /* nv_plan checked it: only a concurrent release gets here */
    e->packed[i] = nv_qpack_get(e->ctx, buf, b->const_offset, b->dtype, N, K);
    if (!e->packed[i]) {
      snprintf(err, cap, "node %u: out of memory repacking a %lldx%lld weight", i, (long long)N, (long long)K);
      return XPU_E_OUT_OF_MEMORY;
    }
    /* the same weight twice in one graph counts once */
    int seen = 0;
    for (uint32_t j = 0; j < i && !seen; j++) seen = e->packed[j] == e->packed[i];
    if (!seen) e->packed_bytes += e->packed[i]->bytes;
  }
  if (e->packed_bytes)
    xpu_log(&nv_reg, XPU_LOG_DEBUG, "neon: executable uses %llu bytes of repacked weights",
            (unsigned long long)e->packed_bytes);
  return XPU_OK;
}

void nv_executable_free(nv_executable *e) {
  if (e->packed)
    for (uint32_t i = 0; i < e->g.header->n_nodes; i++)
      if (e->packed[i]) nv_qpack_put(e->ctx, e->packed[i]);
  free(e->packed);
  for (uint32_t i = 0; i < e->n_consts; i++) nv_buffer_unref(e->consts[i]);
  free(e->consts);
  free(e->plan);
  free(e->blob);
  atomic_fetch_sub(&e->ctx->children, 1);
  free(e);
}

xpu_status nv_api_graph_prepare(xpu_context ch, const xpu_prepare_desc *d, xpu_executable *out) {
  if (!out || !d) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "graph_prepare: null argument");
  *out = 0;
  nv_context *c = (nv_context *)xpu_reg_get(&nv_reg, ch, OBJ_CONTEXT);
  if (!c) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_HANDLE, "graph_prepare: unknown or released context handle");
  if (d->struct_size < offsetof(xpu_prepare_desc, options) + sizeof(void *))
    return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "graph_prepare: desc struct_size %u too small", d->struct_size);
  if (d->struct_size >= offsetof(xpu_prepare_desc, cache) + sizeof(void *) && d->cache)
    return xpu_fail(&nv_reg, ch, XPU_E_UNSUPPORTED, "graph_prepare: this plugin has no executable cache");
  if (!d->ir || d->ir_size < sizeof(xpu_ir_header) || d->ir_size > ((uint64_t)1 << 40))
    return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "graph_prepare: missing or malformed IR");
  const char *opts = d->options;
  nv_cpuset cpus = c->cpus;
  int threads = c->threads;
  char v[1024];
  int rc = xpu_opt_get(opts, "cpus", v, sizeof v);
  if (rc < 0 || (rc > 0 && nv_parse_cpus(v, &cpus) != 0))
    return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "graph_prepare: bad cpus option (want e.g. cpus=0,1)");
  if (rc > 0) {
    int off = nv_cpus_offline(&cpus);
    if (off >= 0)
      return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "graph_prepare: cpus option names CPU %d, which is not online (%ld online)",
                      off, sysconf(_SC_NPROCESSORS_ONLN));
    threads = cpus.n;
  }
  rc = xpu_opt_get(opts, "threads", v, sizeof v);
  if (rc != 0) {
    char *end;
    long t = rc > 0 ? strtol(v, &end, 10) : -1;
    if (rc < 0 || end == v || *end || t < 1 || t > 1024)
      return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "graph_prepare: bad threads option (want 1..1024)");
    threads = (int)t;
  }
  if (threads > nv_pool_size(c->pool)) threads = nv_pool_size(c->pool);

  nv_executable *e = (nv_executable *)calloc(1, sizeof *e);
  void *blob = NULL;
  if (!e || posix_memalign(&blob, 8, d->ir_size) != 0) {
    free(e);
    return xpu_fail(&nv_reg, ch, XPU_E_OUT_OF_MEMORY, "graph_prepare: out of memory");
  }
  memcpy(blob, d->ir, d->ir_size);
  e->blob = blob;
  e->ctx = c;
  e->cpus = cpus;
  e->threads = threads;
  atomic_fetch_add(&c->children, 1);
  char err[256];
  xpu_status s = xpu_ir_parse(blob, d->ir_size, &e->g, err, sizeof err);
  if (s == XPU_OK && !nv_check_tensors(&e->g, err, sizeof err)) s = XPU_E_INVALID_ARG;
  if (s != XPU_OK) {
    nv_executable_free(e);
    return xpu_fail(&nv_reg, ch, s, "graph_prepare: %s", err);
  }
  for (uint32_t i = 0; i < e->g.header->n_nodes; i++) {
    uint32_t prec;
    char reason[128];
    if (!nv_node_supported(&e->g, &e->g.nodes[i], &prec, reason, sizeof reason)) {
      const char *op = xpu_op_name(e->g.nodes[i].op);
      nv_executable_free(e);
      return xpu_fail(&nv_reg, ch, XPU_E_UNSUPPORTED, "graph_prepare: node %u (%s): %s", i, op, reason);
    }
  }
  s = nv_plan(e, err, sizeof err);
  if (s == XPU_OK) s = prepare_weights(e, err, sizeof err);
  if (s != XPU_OK) {
    nv_executable_free(e);
    return xpu_fail(&nv_reg, ch, s, "graph_prepare: %s", err);
  }
  xpu_handle h = xpu_reg_add(&nv_reg, OBJ_EXECUTABLE, e);
  if (!h) {
    nv_executable_free(e);
    return xpu_fail(&nv_reg, ch, XPU_E_OUT_OF_MEMORY, "graph_prepare: out of handles");
  }
  *out = h;
  return XPU_OK;
}

xpu_status nv_api_executable_serialize(xpu_executable h, void *dst, uint64_t cap, uint64_t *size) {
  (void)dst;
  (void)cap;
  (void)size;
  if (!xpu_reg_get(&nv_reg, h, OBJ_EXECUTABLE))
    return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "executable_serialize: unknown or released executable handle");
  return xpu_fail(&nv_reg, h, XPU_E_UNSUPPORTED,
                  "executable_serialize: the NEON plugin prepares in microseconds and keeps no cache");
}

xpu_status nv_api_executable_release(xpu_executable h) {
  nv_executable *e = (nv_executable *)xpu_reg_get(&nv_reg, h, OBJ_EXECUTABLE);
  if (!e) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "executable_release: unknown or released executable handle");
  int n = atomic_load(&e->executions);
  if (n > 0)
    return xpu_fail(&nv_reg, h, XPU_E_BAD_STATE, "executable_release: %d executions still live", n);
  if (!xpu_reg_remove(&nv_reg, h, OBJ_EXECUTABLE))
    return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "executable_release: released concurrently");
  nv_executable_free(e);
  return XPU_OK;
}

/* ---------------------------------------------------------------- executions */

void nv_execution_free(nv_execution *x) {
  for (uint32_t i = 0; x->bind && i < x->n_io; i++)
    if (x->bind[i]) nv_buffer_unref(x->bind[i]);
  free(x->bind);
  free(x->bind_off);
  pthread_mutex_destroy(&x->mu);
  pthread_cond_destroy(&x->cv);
  atomic_fetch_sub(&x->exe->executions, 1);
  atomic_fetch_sub(&x->exe->ctx->children, 1);
  free(x);
}

xpu_status nv_api_execution_create(xpu_executable eh, xpu_execution *out) {
  if (!out) return xpu_fail(&nv_reg, eh, XPU_E_INVALID_ARG, "execution_create: null out");
  *out = 0;
  nv_executable *e = (nv_executable *)xpu_reg_get(&nv_reg, eh, OBJ_EXECUTABLE);
  if (!e) return xpu_fail(&nv_reg, eh, XPU_E_INVALID_HANDLE, "execution_create: unknown or released executable handle");
  nv_execution *x = (nv_execution *)calloc(1, sizeof *x);
  if (!x) return xpu_fail(&nv_reg, eh, XPU_E_OUT_OF_MEMORY, "execution_create: out of memory");
  x->exe = e;
  x->n_io = e->g.header->n_inputs + e->g.header->n_outputs;
  pthread_mutex_init(&x->mu, NULL);
  pthread_cond_init(&x->cv, NULL);
  atomic_fetch_add(&e->executions, 1);
  atomic_fetch_add(&e->ctx->children, 1);
  x->bind = (nv_buffer **)calloc(x->n_io ? x->n_io : 1, sizeof(nv_buffer *));
  x->bind_off = (uint64_t *)calloc(x->n_io ? x->n_io : 1, sizeof(uint64_t));
  /* the intermediates (arena, scratch, shared work area) are lent by the context for each run
   * (exec.c): a model's stages run one after another, and each holding its own would keep
   * every stage's intermediates resident (for a prefill chunk, megabytes per layer) */
  if (!x->bind || !x->bind_off) {
    nv_execution_free(x);
    return xpu_fail(&nv_reg, eh, XPU_E_OUT_OF_MEMORY, "execution_create: out of memory");
  }
  xpu_handle h = xpu_reg_add(&nv_reg, OBJ_EXECUTION, x);
  if (!h) {
    nv_execution_free(x);
    return xpu_fail(&nv_reg, eh, XPU_E_OUT_OF_MEMORY, "execution_create: out of handles");
  }
  x->handle = h;
  *out = h;
  return XPU_OK;
}

xpu_status nv_api_execution_bind(xpu_execution h, uint32_t io, xpu_buffer bh, uint64_t offset) {
  nv_execution *x = (nv_execution *)xpu_reg_get(&nv_reg, h, OBJ_EXECUTION);
  if (!x) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "execution_bind: unknown or released execution handle");
  nv_buffer *b = (nv_buffer *)xpu_reg_get(&nv_reg, bh, OBJ_BUFFER);
  if (!b) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "execution_bind: unknown or released buffer handle");
  const xpu_ir_graph *g = &x->exe->g;
  if (io >= x->n_io)
    return xpu_fail(&nv_reg, h, XPU_E_INVALID_ARG, "execution_bind: io %u out of range (%u inputs, %u outputs)", io,
                    g->header->n_inputs, g->header->n_outputs);
  if (b->ctx != x->exe->ctx)
    return xpu_fail(&nv_reg, h, XPU_E_INVALID_ARG, "execution_bind: buffer belongs to another context");
  uint32_t t = io < g->header->n_inputs ? g->inputs[io] : g->outputs[io - g->header->n_inputs];
  uint64_t need = xpu_ir_nbytes(&g->tensors[t]);
  if (offset > b->size || need > b->size - offset)
    return xpu_fail(&nv_reg, h, XPU_E_INVALID_ARG,
                    "execution_bind: io %u needs %llu bytes at offset %llu, the buffer has %llu", io,
                    (unsigned long long)need, (unsigned long long)offset, (unsigned long long)b->size);
  pthread_mutex_lock(&x->mu);
  if (x->state != EX_IDLE) {
    pthread_mutex_unlock(&x->mu);
    return xpu_fail(&nv_reg, h, XPU_E_BAD_STATE, "execution_bind: execution is in flight");
  }
  atomic_fetch_add(&b->refs, 1);
  nv_buffer *old = x->bind[io];
  x->bind[io] = b;
  x->bind_off[io] = offset;
  pthread_mutex_unlock(&x->mu);
  if (old) nv_buffer_unref(old);
  return XPU_OK;
}

/* Moves an idle, fully bound execution to `state`; BAD_STATE otherwise. */
xpu_status nv_exec_begin(nv_execution *x, int state, const char *what) {
  pthread_mutex_lock(&x->mu);
  if (x->state != EX_IDLE) {
    pthread_mutex_unlock(&x->mu);
    return xpu_fail(&nv_reg, x->handle, XPU_E_BAD_STATE, "%s: execution is already in flight", what);
  }
  for (uint32_t i = 0; i < x->n_io; i++)
    if (!x->bind[i]) {
      pthread_mutex_unlock(&x->mu);
      return xpu_fail(&nv_reg, x->handle, XPU_E_BAD_STATE, "%s: io %u is not bound", what, i);
    }
  x->state = state;
  for (uint32_t i = 0; i < x->n_io; i++) atomic_fetch_add(&x->bind[i]->inflight, 1);
  pthread_mutex_unlock(&x->mu);
  return XPU_OK;
}

void nv_exec_finish(nv_execution *x) {
  pthread_mutex_lock(&x->mu);
  for (uint32_t i = 0; i < x->n_io; i++) atomic_fetch_sub(&x->bind[i]->inflight, 1);
  x->state = EX_IDLE;
  pthread_cond_broadcast(&x->cv);
  pthread_mutex_unlock(&x->mu);
}

xpu_status nv_api_execution_run(xpu_execution h) {
  nv_execution *x = (nv_execution *)xpu_reg_get(&nv_reg, h, OBJ_EXECUTION);
  if (!x) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "execution_run: unknown or released execution handle");
  xpu_status s = nv_exec_begin(x, EX_RUNNING, "execution_run");
  if (s != XPU_OK) return s;
  s = nv_execute(x);
  nv_exec_finish(x);
  return s;
}

xpu_status nv_api_execution_release(xpu_execution h) {
  nv_execution *x = (nv_execution *)xpu_reg_get(&nv_reg, h, OBJ_EXECUTION);
  if (!x) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "execution_release: unknown or released execution handle");
  pthread_mutex_lock(&x->mu);
  int st = x->state;
  pthread_mutex_unlock(&x->mu);
  if (st != EX_IDLE) return xpu_fail(&nv_reg, h, XPU_E_BAD_STATE, "execution_release: execution is in flight");
  if (!xpu_reg_remove(&nv_reg, h, OBJ_EXECUTION))
    return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "execution_release: released concurrently");
  nv_execution_free(x);
  return XPU_OK;
}

