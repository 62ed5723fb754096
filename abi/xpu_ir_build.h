/*
 * xpu_ir_build.h: the IR writer for C hosts and C tests, the mirror of abi/ir.go (which writes
 * the same blob from Go). Header-only, static inline; the layout it writes is the one xpu_ir.h
 * documents and xpu_ir_parse reads.
 *
 * The builder has fixed capacity so that a test can keep it on the stack and never check an
 * allocation per tensor. Going past a capacity (or handing a rank above XPU_MAX_RANK, or more
 * node inputs than XPU_MAX_INPUTS) writes nothing out of bounds: it sets `overflow`, and
 * xpu_irb_encode then refuses to produce a blob, so a truncated graph can never reach a plugin.
 * Whatever the caller sets on the returned node after an overflow lands in a scratch record.
 *
 *   xpu_irb b = {0};
 *   uint32_t x = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_INPUT, 2, shape);  // also a graph input
 *   uint32_t y = xpu_irb_tensor(&b, XPU_DT_F32, XPU_TENSOR_VALUE, 2, shape);
 *   xpu_irb_node(&b, XPU_OP_RELU, y, 1, &x);
 *   xpu_irb_output(&b, y);
 *   uint64_t size;
 *   void *blob = xpu_irb_encode(&b, &size);   // NULL on overflow or out of memory; free() it
 *
 * Records stay plain fields (tensors[i], nodes[i]) so a caller can set a constant's buffer or
 * an attribute, or corrupt a record on purpose to test a plugin's refusal.
 */
#ifndef XPU_IR_BUILD_H
#define XPU_IR_BUILD_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "xpu_ir.h"

#define XPU_IRB_MAX_TENSORS 64
#define XPU_IRB_MAX_NODES 32
#define XPU_IRB_MAX_IO 16 /* graph inputs, and separately graph outputs */

typedef struct xpu_irb {
  xpu_ir_tensor tensors[XPU_IRB_MAX_TENSORS];
  xpu_ir_node nodes[XPU_IRB_MAX_NODES];
  uint32_t inputs[XPU_IRB_MAX_IO];
  uint32_t outputs[XPU_IRB_MAX_IO];
  uint32_t n_tensors, n_nodes, n_inputs, n_outputs;
  int overflow;         /* nonzero once any add did not fit; encode then returns NULL */
  xpu_ir_node scratch;  /* what node() hands back after an overflow, never encoded */
} xpu_irb;

/*
 * Adds a dense tensor of rank dims (shape[rank..] are written as 1) and returns its index. An
 * XPU_TENSOR_INPUT tensor also becomes the next graph input, in the order of these calls.
 * Returns XPU_NO_TENSOR and sets overflow when it does not fit or rank is out of range.
 */
static inline uint32_t xpu_irb_tensor(xpu_irb *b, uint32_t dtype, uint32_t kind, int rank,
                                      const int64_t *shape) {
  if (b->n_tensors >= XPU_IRB_MAX_TENSORS || rank < 0 || rank > XPU_MAX_RANK ||
      (rank > 0 && !shape) || (kind == XPU_TENSOR_INPUT && b->n_inputs >= XPU_IRB_MAX_IO)) {
    b->overflow = 1;
    return XPU_NO_TENSOR;
  }
  xpu_ir_tensor *t = &b->tensors[b->n_tensors];
  memset(t, 0, sizeof *t);
  t->dtype = dtype;
  t->rank = (uint32_t)rank;
  t->kind = kind;
  for (int d = 0; d < XPU_MAX_RANK; d++) t->shape[d] = d < rank ? shape[d] : 1;
  if (kind == XPU_TENSOR_INPUT) b->inputs[b->n_inputs++] = b->n_tensors;
  return b->n_tensors++;
}

/*
 * Appends a node (nodes go in topological order, as the caller adds them) with n_in inputs
 * and returns it for the caller to set attributes; unused input slots are XPU_NO_TENSOR and
 * attributes start at zero. Never returns NULL: on overflow (too many nodes, or n_in outside
 * 0..XPU_MAX_INPUTS) it sets overflow and returns the scratch record.
 */
static inline xpu_ir_node *xpu_irb_node(xpu_irb *b, uint32_t op, uint32_t output, int n_in,
                                        const uint32_t *in) {
  xpu_ir_node *n;
  if (b->n_nodes >= XPU_IRB_MAX_NODES || n_in < 0 || n_in > XPU_MAX_INPUTS || (n_in > 0 && !in)) {
    b->overflow = 1;
    n = &b->scratch;
    n_in = 0;
  } else {
    n = &b->nodes[b->n_nodes++];
  }
  memset(n, 0, sizeof *n);
  n->op = op;
  n->n_inputs = (uint32_t)n_in;
  for (int i = 0; i < XPU_MAX_INPUTS; i++) n->inputs[i] = i < n_in ? in[i] : XPU_NO_TENSOR;
  n->output = output;
  return n;
}

/* Marks a tensor as the next graph output. Returns 0, or -1 and sets overflow when full. */
static inline int xpu_irb_output(xpu_irb *b, uint32_t tensor) {
  if (b->n_outputs >= XPU_IRB_MAX_IO) {
    b->overflow = 1;
    return -1;
  }
  b->outputs[b->n_outputs++] = tensor;
  return 0;
}

/*
 * Lays the graph out as one IR blob of *size bytes, in memory aligned to 8 (xpu_ir_parse
 * refuses anything less: the records hold int64 fields). The caller frees it with free().
 * Returns NULL (and *size 0) after an overflow or when memory runs out. It checks no more
 * than that: a graph that breaks an IR rule is encoded as given, for tests of refusals.
 */
static inline void *xpu_irb_encode(const xpu_irb *b, uint64_t *size) {
  *size = 0;
  if (b->overflow) return NULL;
  uint64_t n = sizeof(xpu_ir_header) + (uint64_t)b->n_tensors * sizeof(xpu_ir_tensor) +
               (uint64_t)b->n_nodes * sizeof(xpu_ir_node) +
               (uint64_t)(b->n_inputs + b->n_outputs) * sizeof(uint32_t);
  /* calloc of uint64_t words: aligned to 8 and the tail padding is zero */
  uint64_t *words = calloc((size_t)((n + 7) / 8), sizeof(uint64_t));
  if (!words) return NULL;
  xpu_ir_header h = {XPU_IR_MAGIC,  XPU_IR_VERSION, XPU_OPSET_VERSION, b->n_tensors,
                     b->n_nodes,    b->n_inputs,    b->n_outputs,      0};
  uint8_t *p = (uint8_t *)words;
  memcpy(p, &h, sizeof h);
  p += sizeof h;
  memcpy(p, b->tensors, b->n_tensors * sizeof(xpu_ir_tensor));
  p += b->n_tensors * sizeof(xpu_ir_tensor);
  memcpy(p, b->nodes, b->n_nodes * sizeof(xpu_ir_node));
  p += b->n_nodes * sizeof(xpu_ir_node);
  memcpy(p, b->inputs, b->n_inputs * sizeof(uint32_t));
  p += b->n_inputs * sizeof(uint32_t);
  memcpy(p, b->outputs, b->n_outputs * sizeof(uint32_t));
  *size = n;
  return words;
}

#endif /* XPU_IR_BUILD_H */
