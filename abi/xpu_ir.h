/*
 * xpu_ir.h: the binary graph IR that crosses the ABI, and the one reader every plugin uses.
 *
 * Header-only: define XPU_IR_IMPLEMENTATION in exactly one .c file of a plugin before including
 * it, or include it everywhere as static functions (the default; the reader is small).
 *
 * Layout (IR version 1, little-endian, every record naturally aligned):
 *   xpu_ir_header                      32 bytes
 *   xpu_ir_tensor[n_tensors]           64 bytes each
 *   xpu_ir_node[n_nodes]              128 bytes each, in topological order
 *   uint32_t inputs[n_inputs]          tensor indices of the graph inputs
 *   uint32_t outputs[n_outputs]        tensor indices of the graph outputs
 *
 * Tensors are dense row-major: the IR carries no strides; a layout change is an explicit
 * PERMUTE. A constant tensor's bytes live in a buffer of the same context
 * (const_buffer, const_offset), never in the IR. Op semantics: OPS.md.
 */
#ifndef XPU_IR_H
#define XPU_IR_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xpu_backend.h"

#define XPU_IR_MAGIC 0x47555058u /* "XPUG" */
#define XPU_IR_VERSION 1u
#define XPU_MAX_RANK 4
#define XPU_MAX_INPUTS 8
#define XPU_MAX_IATTR 8
#define XPU_MAX_FATTR 4
#define XPU_NO_TENSOR 0xFFFFFFFFu
/* Bounds xpu_ir_parse enforces on every tensor, so that a plugin may compute element counts,
 * byte sizes and offsets (numel * 8, nbytes + offset) in int64/uint64 without overflow. The Go
 * side (core.MaxDim, core.MaxElements) refuses the same shapes when a graph is built. */
#define XPU_IR_MAX_DIM ((int64_t)1 << 40)      /* one dimension */
#define XPU_IR_MAX_NUMEL ((int64_t)1 << 40)    /* the product of a tensor's dimensions */
#define XPU_IR_MAX_BYTES ((uint64_t)1 << 42)   /* a tensor's dense byte size */

/* op set v1 */
enum {
  XPU_OP_INVALID = 0,
  XPU_OP_ADD = 1,
  XPU_OP_SUB = 2,
  XPU_OP_MUL = 3,
  XPU_OP_DIV = 4,
  XPU_OP_SILU = 5,
  XPU_OP_GELU = 6,
  XPU_OP_RELU = 7,
  XPU_OP_EXP = 8,
  XPU_OP_NEG = 9,
  XPU_OP_SCALE = 10,
  XPU_OP_RMS_NORM = 11,
  XPU_OP_LAYER_NORM = 12,
  XPU_OP_SOFTMAX = 13,
  XPU_OP_MATMUL = 14,
  XPU_OP_ROPE = 15,
  XPU_OP_ATTENTION = 16,
  XPU_OP_GET_ROWS = 17,
  XPU_OP_CAST = 18,
  XPU_OP_QUANTIZE = 19,
  XPU_OP_DEQUANTIZE = 20,
  XPU_OP_RESHAPE = 21,
  XPU_OP_PERMUTE = 22,
  XPU_OP_SLICE = 23,
  XPU_OP_CONCAT = 24,
  /* op set v3 */
  XPU_OP_SHADOW_MATMUL = 25,
  XPU_OP_SPARSE_FFN = 26,
  /* op set v5 */
  XPU_OP_TANH = 27,
  XPU_OP_COUNT = 28,
};

enum {
  XPU_TENSOR_VALUE = 0, /* produced by a node */
  XPU_TENSOR_INPUT = 1, /* bound at execution */
  XPU_TENSOR_CONST = 2, /* bytes in (const_buffer, const_offset) */
};

typedef struct xpu_ir_header {
  uint32_t magic;
  uint32_t version;
  uint32_t opset;
  uint32_t n_tensors;
  uint32_t n_nodes;
  uint32_t n_inputs;
  uint32_t n_outputs;
  uint32_t reserved;
} xpu_ir_header;

typedef struct xpu_ir_tensor {
  uint32_t dtype; /* XPU_DT_* */
  uint32_t rank;  /* 0..XPU_MAX_RANK; rank 0 is a scalar of one element */
  int64_t shape[XPU_MAX_RANK]; /* shape[rank..] are 1 */
  uint32_t kind;  /* XPU_TENSOR_* */
  uint32_t flags; /* reserved, 0 */
  uint64_t const_buffer;
  uint64_t const_offset;
} xpu_ir_tensor;

typedef struct xpu_ir_node {
  uint32_t op;
  uint32_t n_inputs;
  uint32_t inputs[XPU_MAX_INPUTS]; /* XPU_NO_TENSOR past n_inputs */
  uint32_t output;
  uint32_t reserved;
  int64_t iattr[XPU_MAX_IATTR];
  float fattr[XPU_MAX_FATTR];
} xpu_ir_node;

_Static_assert(sizeof(xpu_ir_header) == 32, "IR header is 32 bytes");
_Static_assert(sizeof(xpu_ir_tensor) == 64, "IR tensor record is 64 bytes");
_Static_assert(sizeof(xpu_ir_node) == 128, "IR node record is 128 bytes");

/* A parsed view into the caller's blob: no copies, valid while the blob lives. */
typedef struct xpu_ir_graph {
  const xpu_ir_header *header;
  const xpu_ir_tensor *tensors;
  const xpu_ir_node *nodes;
  const uint32_t *inputs;
  const uint32_t *outputs;
} xpu_ir_graph;

static inline const char *xpu_op_name(uint32_t op) {
  static const char *const names[XPU_OP_COUNT] = {
      "INVALID", "ADD",      "SUB",        "MUL",        "DIV",     "SILU",    "GELU",
      "RELU",    "EXP",      "NEG",        "SCALE",      "RMS_NORM", "LAYER_NORM", "SOFTMAX",
      "MATMUL",  "ROPE",     "ATTENTION",  "GET_ROWS",   "CAST",    "QUANTIZE", "DEQUANTIZE",
      "RESHAPE", "PERMUTE",  "SLICE",      "CONCAT",  "SHADOW_MATMUL", "SPARSE_FFN",
      "TANH"};
  return op < XPU_OP_COUNT ? names[op] : "UNKNOWN";
}

/* bytes per block and values per block of a dtype (block = 1 value for plain types) */
static inline uint32_t xpu_dtype_block_bytes(uint32_t dt) {
  switch (dt) {
  case XPU_DT_F32: case XPU_DT_I32: return 4;
  case XPU_DT_F16: case XPU_DT_BF16: return 2;
  case XPU_DT_I8: return 1;
  case XPU_DT_Q8_0: return 34;
  case XPU_DT_Q4_0: return 18;
  case XPU_DT_Q4_K: return 144;
  case XPU_DT_Q5_K: return 176;
  case XPU_DT_Q6_K: return 210;
  case XPU_DT_Q2_K: return 84;
  case XPU_DT_Q3_K: return 110;
  default: return 0;
  }
}

static inline uint32_t xpu_dtype_block_len(uint32_t dt) {
  if (dt == XPU_DT_Q8_0 || dt == XPU_DT_Q4_0) return 32u;
  if (dt >= XPU_DT_Q4_K && dt <= XPU_DT_Q3_K) return 256u;
  return 1u;
}

/* Element count. Exact for any tensor xpu_ir_parse accepted (at most XPU_IR_MAX_NUMEL); on an
 * unchecked record it computes modulo 2^64 instead of overflowing a signed integer. */
static inline int64_t xpu_ir_numel(const xpu_ir_tensor *t) {
  uint64_t n = 1;
  for (uint32_t i = 0; i < t->rank && i < XPU_MAX_RANK; i++) n *= (uint64_t)t->shape[i];
  return (int64_t)n;
}

/* bytes of a dense tensor; quantized types need numel divisible by the block length */
static inline uint64_t xpu_ir_nbytes(const xpu_ir_tensor *t) {
  uint32_t bl = xpu_dtype_block_len(t->dtype);
  return ((uint64_t)xpu_ir_numel(t) / bl) * xpu_dtype_block_bytes(t->dtype);
}

/* xpu_ir_parse's failure path: formats the message into err (errcap bytes, may be NULL) */
static inline xpu_status xpu__ir_fail(char *err, size_t errcap, xpu_status code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline xpu_status xpu__ir_fail(char *err, size_t errcap, xpu_status code, const char *fmt, ...) {
  if (err && errcap) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errcap, fmt, ap);
    va_end(ap);
  }
  return code;
}

/* Checks one tensor record: dtype, rank, each dimension, their product and the byte size. */
static inline xpu_status xpu__ir_check_tensor(const xpu_ir_tensor *t, uint32_t i, char *err, size_t errcap) {
  if (t->dtype == XPU_DT_INVALID || t->dtype >= XPU_DT_COUNT)
    return xpu__ir_fail(err, errcap, XPU_E_INVALID_ARG, "ir: tensor %u: invalid dtype %u", i, t->dtype);
  if (t->rank > XPU_MAX_RANK)
    return xpu__ir_fail(err, errcap, XPU_E_INVALID_ARG, "ir: tensor %u: rank %u > %d", i, t->rank, XPU_MAX_RANK);
  int64_t numel = 1;
  for (uint32_t d = 0; d < XPU_MAX_RANK; d++) {
    int64_t v = t->shape[d];
    if (v < 0 || v > XPU_IR_MAX_DIM)
      return xpu__ir_fail(err, errcap, XPU_E_INVALID_ARG, "ir: tensor %u: dimension %u is %lld, outside [0, 2^40]",
                          i, d, (long long)v);
    if (d >= t->rank && v != 1)
      return xpu__ir_fail(err, errcap, XPU_E_INVALID_ARG, "ir: tensor %u: dimension %u past rank %u is not 1", i,
                          d, t->rank);
    /* numel <= 2^40 and v <= 2^40 before the test, so the division guards the product */
    if (v != 0 && numel > XPU_IR_MAX_NUMEL / v)
      return xpu__ir_fail(err, errcap, XPU_E_INVALID_ARG,
                          "ir: tensor %u: shape [%lld,%lld,%lld,%lld] has more than 2^40 elements", i,
                          (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2],
                          (long long)t->shape[3]);
    numel *= v;
  }
  if (t->kind > XPU_TENSOR_CONST)
    return xpu__ir_fail(err, errcap, XPU_E_INVALID_ARG, "ir: tensor %u: invalid kind %u", i, t->kind);
  uint32_t bl = xpu_dtype_block_len(t->dtype);
  if (bl > 1 && (t->rank == 0 || t->shape[t->rank - 1] % bl != 0))
    return xpu__ir_fail(err, errcap, XPU_E_INVALID_ARG, "ir: tensor %u: quantized rows are not whole blocks of %u",
                        i, bl);
  if (xpu_ir_nbytes(t) > XPU_IR_MAX_BYTES)
    return xpu__ir_fail(err, errcap, XPU_E_INVALID_ARG, "ir: tensor %u: %llu bytes, more than 2^42", i,
                        (unsigned long long)xpu_ir_nbytes(t));
  return XPU_OK;
}

/*
 * Parses and validates blob. Returns XPU_OK and fills g, or an error with a message in err
 * (errcap bytes, may be NULL) naming the tensor or node at fault. Checks: sizes, magic,
 * version, every index in range, nodes in topological order, single producer per value, ranks
 * and dtypes valid, each dimension, element count and byte size within XPU_IR_MAX_*, quantized
 * shapes whole blocks. Time and extra memory are linear in the graph (one bit per tensor).
 * It does not check op-specific shape rules: the Go builder did, and each plugin checks what
 * its kernels assume.
 */
static inline xpu_status xpu_ir_parse(const void *blob, uint64_t size, xpu_ir_graph *g, char *err,
                                      size_t errcap) {
#define XPU_IR_FAIL(code, ...) return xpu__ir_fail(err, errcap, (code), __VA_ARGS__)
  if (!blob || !g) XPU_IR_FAIL(XPU_E_INVALID_ARG, "ir: null blob or graph");
  if (((uintptr_t)blob & 7u) != 0) XPU_IR_FAIL(XPU_E_INVALID_ARG, "ir: blob not 8-byte aligned");
  if (size < sizeof(xpu_ir_header)) XPU_IR_FAIL(XPU_E_INVALID_ARG, "ir: blob shorter than header");
  const xpu_ir_header *h = (const xpu_ir_header *)blob;
  if (h->magic != XPU_IR_MAGIC) XPU_IR_FAIL(XPU_E_INVALID_ARG, "ir: bad magic");
  if (h->version != XPU_IR_VERSION) XPU_IR_FAIL(XPU_E_INCOMPATIBLE, "ir: unsupported IR version %u", h->version);
  if (h->opset < 1 || h->opset > XPU_OPSET_VERSION)
    XPU_IR_FAIL(XPU_E_INCOMPATIBLE, "ir: unsupported op-set version %u", h->opset);
  if (h->n_tensors > (1u << 24) || h->n_nodes > (1u << 24) || h->n_inputs > h->n_tensors ||
      h->n_outputs > h->n_tensors)
    XPU_IR_FAIL(XPU_E_INVALID_ARG, "ir: counts out of range");
  uint64_t need = sizeof(xpu_ir_header) + (uint64_t)h->n_tensors * sizeof(xpu_ir_tensor) +
                  (uint64_t)h->n_nodes * sizeof(xpu_ir_node) +
                  ((uint64_t)h->n_inputs + h->n_outputs) * sizeof(uint32_t);
  if (size < need) XPU_IR_FAIL(XPU_E_INVALID_ARG, "ir: blob shorter than its counts say");
  const uint8_t *p = (const uint8_t *)blob + sizeof(xpu_ir_header);
  const xpu_ir_tensor *tensors = (const xpu_ir_tensor *)p;
  p += (uint64_t)h->n_tensors * sizeof(xpu_ir_tensor);
  const xpu_ir_node *nodes = (const xpu_ir_node *)p;
  p += (uint64_t)h->n_nodes * sizeof(xpu_ir_node);
  const uint32_t *inputs = (const uint32_t *)p;
  const uint32_t *outputs = inputs + h->n_inputs;

  for (uint32_t i = 0; i < h->n_tensors; i++) {
    xpu_status st = xpu__ir_check_tensor(&tensors[i], i, err, errcap);
    if (st != XPU_OK) return st;
  }
  /* every VALUE tensor is produced exactly once, before it is used: one "produced" bit per
   * tensor, set as the nodes are walked in order (on the stack for graphs up to 4096 tensors) */
  uint8_t small[512];
  size_t nbits = ((size_t)h->n_tensors + 7) / 8;
  uint8_t *produced = nbits <= sizeof small ? small : (uint8_t *)calloc(nbits, 1);
  if (!produced) XPU_IR_FAIL(XPU_E_OUT_OF_MEMORY, "ir: no memory to check %u tensors", h->n_tensors);
  if (produced == small) memset(small, 0, nbits);
  xpu_status st = XPU_OK;
  for (uint32_t n = 0; n < h->n_nodes && st == XPU_OK; n++) {
    const xpu_ir_node *nd = &nodes[n];
    if (nd->op == XPU_OP_INVALID || nd->op >= XPU_OP_COUNT)
      st = xpu__ir_fail(err, errcap, XPU_E_INVALID_ARG, "ir: node %u: unknown op %u", n, nd->op);
    else if (nd->n_inputs > XPU_MAX_INPUTS)
      st = xpu__ir_fail(err, errcap, XPU_E_INVALID_ARG, "ir: node %u (%s): %u inputs > %d", n,
                        xpu_op_name(nd->op), nd->n_inputs, XPU_MAX_INPUTS);
    else if (nd->output >= h->n_tensors)
      st = xpu__ir_fail(err, errcap, XPU_E_INVALID_ARG, "ir: node %u (%s): output %u out of range", n,
                        xpu_op_name(nd->op), nd->output);
    else if (tensors[nd->output].kind != XPU_TENSOR_VALUE)
      st = xpu__ir_fail(err, errcap, XPU_E_INVALID_ARG, "ir: node %u (%s): writes tensor %u, an input or a constant",
                        n, xpu_op_name(nd->op), nd->output);
    for (uint32_t i = 0; st == XPU_OK && i < nd->n_inputs; i++) {
      uint32_t ti = nd->inputs[i];
      if (ti >= h->n_tensors)
        st = xpu__ir_fail(err, errcap, XPU_E_INVALID_ARG, "ir: node %u (%s): input %u is tensor %u, out of range",
                          n, xpu_op_name(nd->op), i, ti);
      else if (tensors[ti].kind == XPU_TENSOR_VALUE && !(produced[ti / 8] & (1u << (ti % 8))))
        st = xpu__ir_fail(err, errcap, XPU_E_INVALID_ARG, "ir: node %u (%s): input %u (tensor %u) is not produced before use",
                          n, xpu_op_name(nd->op), i, ti);
    }
    if (st != XPU_OK) break;
    if (produced[nd->output / 8] & (1u << (nd->output % 8)))
      st = xpu__ir_fail(err, errcap, XPU_E_INVALID_ARG, "ir: node %u (%s): tensor %u produced twice", n,
                        xpu_op_name(nd->op), nd->output);
    produced[nd->output / 8] |= (uint8_t)(1u << (nd->output % 8));
  }
  if (produced != small) free(produced);
  if (st != XPU_OK) return st;
  for (uint32_t i = 0; i < h->n_inputs; i++)
    if (inputs[i] >= h->n_tensors || tensors[inputs[i]].kind != XPU_TENSOR_INPUT)
      XPU_IR_FAIL(XPU_E_INVALID_ARG, "ir: graph input %u is not an INPUT tensor", i);
  for (uint32_t i = 0; i < h->n_outputs; i++)
    if (outputs[i] >= h->n_tensors || tensors[outputs[i]].kind != XPU_TENSOR_VALUE)
      XPU_IR_FAIL(XPU_E_INVALID_ARG, "ir: graph output %u is not a node's value", i);
  g->header = h;
  g->tensors = tensors;
  g->nodes = nodes;
  g->inputs = inputs;
  g->outputs = outputs;
  return XPU_OK;
#undef XPU_IR_FAIL
}

/* a node's input tensor (NULL past n_inputs) */
static inline const xpu_ir_tensor *xpu_ir_input(const xpu_ir_graph *g, const xpu_ir_node *n,
                                                uint32_t i) {
  return i < n->n_inputs ? &g->tensors[n->inputs[i]] : NULL;
}

/* ATTENTION's KV heads read, given k's head count hkv: all hkv, or (op set 4) the iattr[3]
 * heads from iattr[2] on; -1 when that range does not lie within k's heads */
static inline int64_t xpu_ir_attention_kv_heads(const xpu_ir_node *n, int64_t hkv) {
  if (n->iattr[2] == 0 && n->iattr[3] == 0) return hkv;
  if (n->iattr[3] <= 0 || n->iattr[2] < 0 || n->iattr[2] > hkv - n->iattr[3]) return -1;
  return n->iattr[3];
}


#endif /* XPU_IR_H */
