/* exec.c: runs an executable's nodes in order on the execution's memory. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "neon.h"

static xpu_status run_node(nv_run *r, const xpu_ir_node *n) {
  switch (n->op) {
  case XPU_OP_ADD: case XPU_OP_SUB: case XPU_OP_MUL: case XPU_OP_DIV: return nv_k_binary(r, n);
  case XPU_OP_SILU: case XPU_OP_GELU: case XPU_OP_RELU: case XPU_OP_EXP: case XPU_OP_NEG:
  case XPU_OP_SCALE: case XPU_OP_TANH: return nv_k_unary(r, n);
  case XPU_OP_RMS_NORM: case XPU_OP_LAYER_NORM: return nv_k_norm(r, n);
  case XPU_OP_SOFTMAX: return nv_k_softmax(r, n);
  case XPU_OP_MATMUL: return nv_is_w8a8(r->g, n) ? nv_k_w8a8(r, n) : nv_k_matmul(r, n);
  case XPU_OP_SHADOW_MATMUL: return nv_k_shadow(r, n);
  case XPU_OP_SPARSE_FFN: return nv_k_sparse_ffn(r, n);
  case XPU_OP_ROPE: return nv_k_rope(r, n);
  case XPU_OP_ATTENTION: return nv_k_attention(r, n);
  case XPU_OP_GET_ROWS: return nv_k_get_rows(r, n);
  case XPU_OP_CAST: return nv_k_cast(r, n);
  case XPU_OP_QUANTIZE: return nv_k_quantize(r, n);
  case XPU_OP_DEQUANTIZE: return nv_k_dequantize(r, n);
  case XPU_OP_RESHAPE: return nv_k_reshape(r, n);
  case XPU_OP_PERMUTE: return nv_k_permute(r, n);
  case XPU_OP_SLICE: return nv_k_slice(r, n);
  case XPU_OP_CONCAT: return nv_k_concat(r, n);
  }
  snprintf(r->err, sizeof r->err, "unknown op %u", n->op);
  return XPU_E_INTERNAL;
}

/* An empty CPU set: nv_pool_run runs a one-thread region asked for no particular CPUs on the
 * calling thread. */
static const nv_cpuset nv_caller_cpus;

/* Whether the calling thread may run the executable's one-thread regions itself: it is pinned
 * to exactly the one CPU the executable's thread would be pinned to (a host that pins its own
 * worker per unit, as xpu's runtime does). A decode step runs a few hundred small regions; a
 * handoff to the pool's pinned thread and back costs each of them a wake-up, more than many
 * such nodes compute. */
static int nv_caller_is_pinned(const nv_executable *e) {
  if (e->threads != 1 || e->cpus.n != 1) return 0;
  cpu_set_t cs;
  CPU_ZERO(&cs);
  if (sched_getaffinity(0, sizeof cs, &cs) != 0) return 0;
  return CPU_COUNT(&cs) == 1 && CPU_ISSET(e->cpus.cpu[0], &cs);
}

/* One block of intermediates: an execution's arena, its threads' scratch and the nodes' shared
 * work area (every byte of them dead between runs). A context
 * keeps the blocks no run holds in a list: runs that follow each other (a model's stages) share
 * one block, as large as the largest of them needs, and only runs at the same time have a block
 * each. */
typedef struct nv_work {
  struct nv_work *next;
  uint8_t *mem;
  uint64_t bytes;
} nv_work;

/* A block of at least need bytes: the smallest free one that is large enough, else the largest
 * free one grown (its contents are dead between runs), else a new one. NULL when out of memory. */
static nv_work *work_take(nv_context *c, uint64_t need) {
  pthread_mutex_lock(&c->wkmu);
  nv_work **best = NULL;
  for (nv_work **pp = &c->work; *pp; pp = &(*pp)->next) {
    if (!best) {
      best = pp;
      continue;
    }
    uint64_t b = (*best)->bytes, w = (*pp)->bytes;
    int fits = w >= need, best_fits = b >= need;
    if ((fits && (!best_fits || w < b)) || (!fits && !best_fits && w > b)) best = pp;
  }
  nv_work *w = NULL;
  if (best) {
    w = *best;
    *best = w->next;
  }
  pthread_mutex_unlock(&c->wkmu);
  if (w && w->bytes >= need) return w;
  if (w) {
    free(w->mem);
  } else if (!(w = (nv_work *)calloc(1, sizeof *w))) {
    return NULL;
  }
  w->mem = (uint8_t *)nv_alloc(need);
  if (!w->mem) {
    free(w);
    return NULL;
  }
  w->bytes = need;
  return w;
}

static void work_give(nv_context *c, nv_work *w) {
  pthread_mutex_lock(&c->wkmu);
  w->next = c->work;
  c->work = w;
  pthread_mutex_unlock(&c->wkmu);
}

void nv_work_free(nv_context *c) {
  while (c->work) {
    nv_work *w = c->work;
    c->work = w->next;
    free(w->mem);
    free(w);
  }
}

xpu_status nv_execute(nv_execution *x) {
  nv_executable *e = x->exe;
  const xpu_ir_graph *g = &e->g;
  uint32_t nt = g->header->n_tensors;
  uint64_t arena_bytes = (e->arena_bytes + NV_ALIGN - 1) / NV_ALIGN * NV_ALIGN;
  uint64_t scratch_bytes = e->scratch_bytes * (uint64_t)e->threads;
  uint64_t need = arena_bytes + scratch_bytes + e->shared_bytes;
  nv_work *w = work_take(e->ctx, need ? need : NV_ALIGN);
  if (!w)
    return xpu_fail(&nv_reg, x->handle, XPU_E_OUT_OF_MEMORY, "execution: cannot allocate %llu bytes of intermediates",
                    (unsigned long long)need);
  uint8_t *arena = w->mem, *scratch = arena + arena_bytes, *shared = scratch + scratch_bytes;
  uint8_t *stack_ptrs[64];
  uint8_t **ptr = nt <= 64 ? stack_ptrs : (uint8_t **)malloc(nt * sizeof(uint8_t *));
  if (!ptr) {
    work_give(e->ctx, w);
    return xpu_fail(&nv_reg, x->handle, XPU_E_OUT_OF_MEMORY, "execution: out of memory");
  }
  for (uint32_t t = 0; t < nt; t++) {
    const nv_tensor_plan *p = &e->plan[t];
    switch (p->loc) {
    case LOC_CONST: ptr[t] = p->cdata; break;
    case LOC_IO: ptr[t] = x->bind[p->io]->data + x->bind_off[p->io]; break;
    default: ptr[t] = arena + p->offset; break;
    }
  }
  nv_run r;
  memset(&r, 0, sizeof r);
  r.g = g;
  r.ptr = ptr;
  r.pool = e->ctx->pool;
  r.cpus = nv_caller_is_pinned(e) ? &nv_caller_cpus : &e->cpus;
  r.nth = e->threads;
  r.int8dot = e->ctx->int8dot;
  r.scratch = scratch;
  r.scratch_bytes = e->scratch_bytes;
  r.shared = shared;
  r.packed = e->packed;
  xpu_status s = XPU_OK;
  for (uint32_t i = 0; i < g->header->n_nodes && s == XPU_OK; i++) {
    s = run_node(&r, &g->nodes[i]);
    if (s != XPU_OK)
      xpu_fail(&nv_reg, x->handle, s, "execution: node %u (%s): %s", i, xpu_op_name(g->nodes[i].op), r.err);
  }
  /* a tensor listed as several outputs was computed into its first binding */
  for (uint32_t i = 0; i < g->header->n_outputs && s == XPU_OK; i++) {
    uint32_t t = g->outputs[i], io = g->header->n_inputs + i;
    uint8_t *dst = x->bind[io]->data + x->bind_off[io];
    if (dst != ptr[t] && e->plan[t].nbytes) memmove(dst, ptr[t], e->plan[t].nbytes);
  }
  if (ptr != stack_ptrs) free(ptr);
  work_give(e->ctx, w);
  return s;
}
