/*
 * graph.c: what the kernels accept (the OPS.md rules through the shared abi/xpu_validate.h, which
 * a plugin runs because it must not trust its input to stay in bounds, then the kernels' own
 * limits) and the memory plan of an executable.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "neon.h"
#include "xpu_validate.h"

static int is_float(uint32_t dt) { return dt == XPU_DT_F32 || dt == XPU_DT_F16; }
static int is_movable(uint32_t dt) {
  return dt == XPU_DT_F32 || dt == XPU_DT_F16 || dt == XPU_DT_BF16 || dt == XPU_DT_I32 || dt == XPU_DT_I8;
}

#define NO(...)                                                                                  \
  do {                                                                                           \
    snprintf(reason, cap, __VA_ARGS__);                                                          \
    return 0;                                                                                    \
  } while (0)

int nv_node_supported(const xpu_ir_graph *g, const xpu_ir_node *n, uint32_t *precision, char *reason,
                      size_t cap) {
  *precision = XPU_PREC_F32;
  reason[0] = 0;
  /* arity, shapes and attributes (abi/OPS.md): after this every input the op takes exists */
  const char *why = xpu_validate_node(g, n);
  if (why) NO("%s", why);
  const xpu_ir_tensor *o = &g->tensors[n->output];
  const xpu_ir_tensor *a = xpu_ir_input(g, n, 0), *b = xpu_ir_input(g, n, 1);
  /* what the kernels add to the rules: the capability checks */
  switch (n->op) {
  case XPU_OP_SOFTMAX:
    if (n->iattr[0] != 0 && n->iattr[0] != 1) NO("causal flag must be 0 or 1");
    return 1;
  case XPU_OP_MATMUL:
    if (nv_is_w8a8(g, n)) {
      if (a->dtype == XPU_DT_I8) *precision = XPU_PREC_INT8;
      return 1;
    }
    if (b->dtype == XPU_DT_Q8_0 || b->dtype == XPU_DT_Q4_0) *precision = XPU_PREC_INT8;
    /* constant Q4_K/Q5_K/Q6_K weights are repacked for the int8 kernels; other K-quant b are
     * dequantized to f32 */
    if (nv_kq_repackable(b->dtype) && b->kind == XPU_TENSOR_CONST) *precision = XPU_PREC_INT8;
    return 1;
  case XPU_OP_SPARSE_FFN:
    if (b->dtype == XPU_DT_Q8_0 || b->dtype == XPU_DT_Q4_0) *precision = XPU_PREC_INT8;
    return 1;
  case XPU_OP_ATTENTION:
    if (n->iattr[0] != 0 && n->iattr[0] != 1) NO("causal flag must be 0 or 1");
    return 1;
  case XPU_OP_QUANTIZE:
    if (o->dtype != XPU_DT_Q8_0 && o->dtype != XPU_DT_Q4_0 && o->dtype != XPU_DT_I8) NO("output must be q8_0, q4_0 or i8");
    *precision = XPU_PREC_DEFAULT;
    return 1;
  case XPU_OP_GET_ROWS: case XPU_OP_CAST: case XPU_OP_DEQUANTIZE: case XPU_OP_RESHAPE: case XPU_OP_PERMUTE:
  case XPU_OP_SLICE: case XPU_OP_CONCAT:
    *precision = XPU_PREC_DEFAULT;
    return 1;
  }
  return 1;
}

int nv_check_tensors(const xpu_ir_graph *g, char *err, size_t cap) {
  for (uint32_t t = 0; t < g->header->n_tensors; t++) {
    const xpu_ir_tensor *x = &g->tensors[t];
    uint64_t n = 1;
    for (uint32_t d = 0; d < x->rank; d++)
      if (__builtin_mul_overflow(n, (uint64_t)x->shape[d], &n) || n > NV_MAX_ELEMS) {
        snprintf(err, cap, "tensor %u has more than 2^44 elements", t);
        return 0;
      }
  }
  return 1;
}

uint32_t nv_op_support(const xpu_op_query *q) {
  uint32_t op = q->op, in = q->dtype_in, w = q->dtype_weight, out = q->dtype_out;
  if (op == XPU_OP_INVALID || op >= XPU_OP_COUNT) return XPU_VERDICT_NO;
  if (q->rank > XPU_MAX_RANK) return XPU_VERDICT_NO;
  switch (op) {
  case XPU_OP_MATMUL:
    if (in == XPU_DT_I8) /* W8A8 (op set 3) */
      return (!w || w == XPU_DT_I8) && (!out || out == XPU_DT_F32 || out == XPU_DT_F16) ? XPU_VERDICT_YES
                                                                                     : XPU_VERDICT_NO;
    if (!is_float(in) || (out && out != in)) return XPU_VERDICT_NO;
    if (w && w != XPU_DT_F32 && w != XPU_DT_F16 && w != XPU_DT_BF16 && w != XPU_DT_Q8_0 && w != XPU_DT_Q4_0 &&
        w != XPU_DT_I8 && !nv_is_kquant(w))
      return XPU_VERDICT_NO;
    return XPU_VERDICT_YES;
  case XPU_OP_GET_ROWS:
    if (in != XPU_DT_F32 && in != XPU_DT_F16 && in != XPU_DT_BF16 && in != XPU_DT_Q8_0 && in != XPU_DT_Q4_0 &&
        in != XPU_DT_I8 && !nv_is_kquant(in))
      return XPU_VERDICT_NO;
    return (out == 0 || out == XPU_DT_F32) ? XPU_VERDICT_YES : XPU_VERDICT_NO;
  case XPU_OP_CAST:
    if (!(in == XPU_DT_F32 || in == XPU_DT_F16 || in == XPU_DT_BF16 || in == XPU_DT_I32)) return XPU_VERDICT_NO;
    return (out == XPU_DT_F32 || out == XPU_DT_F16 || out == XPU_DT_BF16) ? XPU_VERDICT_YES : XPU_VERDICT_NO;
  case XPU_OP_QUANTIZE:
    return in == XPU_DT_F32 && (out == XPU_DT_Q8_0 || out == XPU_DT_Q4_0 || out == XPU_DT_I8) ? XPU_VERDICT_YES
                                                                                              : XPU_VERDICT_NO;
  case XPU_OP_DEQUANTIZE:
    return (in == XPU_DT_Q8_0 || in == XPU_DT_Q4_0 || in == XPU_DT_I8 || nv_is_kquant(in)) && (out == 0 || out == XPU_DT_F32)
               ? XPU_VERDICT_YES
               : XPU_VERDICT_NO;
  case XPU_OP_RESHAPE:
    return in > XPU_DT_INVALID && in < XPU_DT_COUNT ? XPU_VERDICT_YES : XPU_VERDICT_NO;
  case XPU_OP_PERMUTE:
  case XPU_OP_SLICE:
  case XPU_OP_CONCAT:
    return is_movable(in) ? XPU_VERDICT_YES : XPU_VERDICT_NO;
  case XPU_OP_ATTENTION: /* the weight is k's and v's dtype: float or (op set 5) a quantized KV cache */
    if (!is_float(in) || (w && !is_float(w) && w != XPU_DT_Q8_0 && w != XPU_DT_Q4_0)) return XPU_VERDICT_NO;
    return XPU_VERDICT_YES;
  case XPU_OP_SHADOW_MATMUL:
    return is_float(in) && (out == 0 || out == in) ? XPU_VERDICT_YES : XPU_VERDICT_NO;
  case XPU_OP_SPARSE_FFN: /* the weight is the bundles' dtype */
    if (!is_float(in) || (out && out != in)) return XPU_VERDICT_NO;
    return !w || w == XPU_DT_F32 || w == XPU_DT_F16 || w == XPU_DT_Q8_0 || w == XPU_DT_Q4_0 ? XPU_VERDICT_YES
                                                                                          : XPU_VERDICT_NO;
  default:
    /* elementwise, norms, softmax, rope: f32/f16 in and out */
    return is_float(in) && (out == 0 || out == in) ? XPU_VERDICT_YES : XPU_VERDICT_NO;
  }
}

/*
 * Memory plan: inputs and outputs live in the bound buffers, constants in their buffers, every
 * other value in the execution's arena. Arena regions are reused once a value's last reader ran
 * (greedy first fit over a list of free regions).
 */
typedef struct region {
  uint64_t off, size;
} region;

xpu_status nv_plan(nv_executable *e, char *err, size_t cap) {
  const xpu_ir_graph *g = &e->g;
  uint32_t nt = g->header->n_tensors, nn = g->header->n_nodes;
  e->plan = (nv_tensor_plan *)calloc(nt ? nt : 1, sizeof(nv_tensor_plan));
  int32_t *last_use = (int32_t *)malloc((nt ? nt : 1) * sizeof(int32_t));
  region *free_list = (region *)malloc((nt + 1) * sizeof(region));
  e->consts = (nv_buffer **)calloc(nt ? nt : 1, sizeof(nv_buffer *));
  if (!e->plan || !last_use || !free_list || !e->consts) {
    free(last_use);
    free(free_list);
    snprintf(err, cap, "out of memory");
    return XPU_E_OUT_OF_MEMORY;
  }
  xpu_status st = XPU_OK;
  for (uint32_t t = 0; t < nt; t++) {
    last_use[t] = -1;
    e->plan[t].nbytes = xpu_ir_nbytes(&g->tensors[t]);
    e->plan[t].loc = LOC_ARENA;
  }
  for (uint32_t i = 0; i < g->header->n_inputs; i++) {
    e->plan[g->inputs[i]].loc = LOC_IO;
    e->plan[g->inputs[i]].io = i;
  }
  /* a tensor listed twice as an output lives in its first binding; exec.c copies it to the rest */
  for (uint32_t i = g->header->n_outputs; i-- > 0;) {
    e->plan[g->outputs[i]].loc = LOC_IO;
    e->plan[g->outputs[i]].io = g->header->n_inputs + i;
  }
  for (uint32_t t = 0; t < nt && st == XPU_OK; t++) {
    const xpu_ir_tensor *x = &g->tensors[t];
    if (x->kind == XPU_TENSOR_CONST) {
      nv_buffer *b = (nv_buffer *)xpu_reg_get(&nv_reg, x->const_buffer, OBJ_BUFFER);
      if (!b || b->ctx != e->ctx) {
        snprintf(err, cap, "tensor %u: constant buffer handle unknown or of another context", t);
        st = XPU_E_INVALID_HANDLE;
        break;
      }
      if (x->const_offset > b->size || e->plan[t].nbytes > b->size - x->const_offset) {
        snprintf(err, cap, "tensor %u: constant [%llu, +%llu) lies outside its %llu-byte buffer", t,
                 (unsigned long long)x->const_offset, (unsigned long long)e->plan[t].nbytes,
                 (unsigned long long)b->size);
        st = XPU_E_INVALID_ARG;
        break;
      }
      atomic_fetch_add(&b->refs, 1);
      e->consts[e->n_consts++] = b;
      e->plan[t].loc = LOC_CONST;
      e->plan[t].cdata = b->data + x->const_offset;
    } else if (x->kind == XPU_TENSOR_INPUT && e->plan[t].loc != LOC_IO) {
      snprintf(err, cap, "tensor %u is an INPUT but not in the graph's input list", t);
      st = XPU_E_INVALID_ARG;
    }
  }
  if (st != XPU_OK) {
    free(last_use);
    free(free_list);
    return st;
  }
  for (uint32_t n = 0; n < nn; n++)
    for (uint32_t i = 0; i < g->nodes[n].n_inputs; i++) last_use[g->nodes[n].inputs[i]] = (int32_t)n;

  uint64_t top = 0, scratch = 0, shared = 0;
  uint32_t nfree = 0;
  for (uint32_t n = 0; n < nn; n++) {
    const xpu_ir_node *nd = &g->nodes[n];
    uint64_t s = nv_node_scratch(g, nd);
    if (s > scratch) scratch = s;
    s = nv_node_shared(g, nd);
    if (s > shared) shared = s;
    nv_tensor_plan *p = &e->plan[nd->output];
    if (p->loc == LOC_ARENA) {
      uint64_t need = (p->nbytes + NV_ALIGN - 1) / NV_ALIGN * NV_ALIGN;
      uint32_t best = nfree;
      for (uint32_t f = 0; f < nfree; f++)
        if (free_list[f].size >= need && (best == nfree || free_list[f].size < free_list[best].size)) best = f;
      if (best < nfree) {
        p->offset = free_list[best].off;
        free_list[best].off += need;
        free_list[best].size -= need;
      } else {
        p->offset = top;
        top += need;
        if (top > ((uint64_t)1 << 48)) {
          free(last_use);
          free(free_list);
          snprintf(err, cap, "intermediate values need more than 2^48 bytes");
          return XPU_E_OUT_OF_MEMORY;
        }
      }
    }
    /* free the arena values whose last reader is this node (not the output itself) */
    for (uint32_t i = 0; i < nd->n_inputs; i++) {
      uint32_t t = nd->inputs[i];
      int dup = 0;
      for (uint32_t k = 0; k < i; k++) dup |= nd->inputs[k] == t;
      if (dup || last_use[t] != (int32_t)n || e->plan[t].loc != LOC_ARENA || t == nd->output) continue;
      uint64_t sz = (e->plan[t].nbytes + NV_ALIGN - 1) / NV_ALIGN * NV_ALIGN;
      if (sz && nfree < nt + 1) free_list[nfree++] = (region){e->plan[t].offset, sz};
    }
    /* an output nobody reads is still written; it is free right after */
    if (p->loc == LOC_ARENA && last_use[nd->output] < 0) {
      uint64_t sz = (p->nbytes + NV_ALIGN - 1) / NV_ALIGN * NV_ALIGN;
      if (sz && nfree < nt + 1) free_list[nfree++] = (region){p->offset, sz};
    }
  }
  e->arena_bytes = top;
  e->scratch_bytes = (scratch + NV_ALIGN - 1) / NV_ALIGN * NV_ALIGN;
  e->shared_bytes = (shared + NV_ALIGN - 1) / NV_ALIGN * NV_ALIGN;
  free(last_use);
  free(free_list);
  return XPU_OK;
}
