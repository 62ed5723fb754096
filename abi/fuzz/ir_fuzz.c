/*
 * ir_fuzz.c: libFuzzer target for xpu_ir_parse, the one IR reader every plugin runs on bytes
 * that cross the ABI. Built with clang -fsanitize=fuzzer,address,undefined (make fuzz-ir), so
 * any out-of-bounds read, signed overflow or other UB in the reader is a finding.
 *
 * The first input byte picks a mode: even = the bytes are the blob as is (the header checks
 * are fuzzed too); odd = magic, version and op-set are forced valid and the four counts are
 * cut down to what the input can hold, so most inputs reach the tensor and node checks.
 * After an accepted parse the target checks the reader's promises and aborts when one fails:
 * every element count and byte size within XPU_IR_MAX_*, every index in range, every value
 * produced by an earlier node.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "xpu_ir.h"

static void check(int ok) {
  if (!ok) abort();
}

static void check_graph(const xpu_ir_graph *g) {
  const xpu_ir_header *h = g->header;
  for (uint32_t i = 0; i < h->n_tensors; i++) {
    const xpu_ir_tensor *t = &g->tensors[i];
    int64_t n = xpu_ir_numel(t);
    check(n >= 0 && n <= XPU_IR_MAX_NUMEL);
    check(xpu_ir_nbytes(t) <= XPU_IR_MAX_BYTES);
    check(t->rank <= XPU_MAX_RANK);
  }
  for (uint32_t k = 0; k < h->n_nodes; k++) {
    const xpu_ir_node *nd = &g->nodes[k];
    check(nd->op > XPU_OP_INVALID && nd->op < XPU_OP_COUNT && nd->output < h->n_tensors);
    check(g->tensors[nd->output].kind == XPU_TENSOR_VALUE);
    for (uint32_t i = 0; i < nd->n_inputs; i++) {
      const xpu_ir_tensor *in = xpu_ir_input(g, nd, i);
      check(in != NULL);
      if (in->kind != XPU_TENSOR_VALUE) continue;
      uint32_t m;
      for (m = 0; m < k; m++) /* quadratic, but inputs are small */
        if (g->nodes[m].output == nd->inputs[i]) break;
      check(m < k);
    }
    check(xpu_ir_input(g, nd, nd->n_inputs) == NULL);
  }
  for (uint32_t i = 0; i < h->n_inputs; i++) check(g->tensors[g->inputs[i]].kind == XPU_TENSOR_INPUT);
  for (uint32_t i = 0; i < h->n_outputs; i++) check(g->tensors[g->outputs[i]].kind == XPU_TENSOR_VALUE);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int patch = data[0] & 1;
  data++;
  size--;
  /* an exact-size heap copy, 8-byte aligned (malloc is), so ASan sees every read past its end */
  uint8_t *blob = (uint8_t *)malloc(size ? size : 1);
  if (!blob) return 0;
  memcpy(blob, data, size);
  if (patch && size >= sizeof(xpu_ir_header)) {
    xpu_ir_header h;
    memcpy(&h, blob, sizeof h);
    h.magic = XPU_IR_MAGIC;
    h.version = XPU_IR_VERSION;
    h.opset = XPU_OPSET_VERSION;
    uint64_t room = size - sizeof h;
    h.n_tensors %= (uint32_t)(room / sizeof(xpu_ir_tensor) + 1);
    room -= (uint64_t)h.n_tensors * sizeof(xpu_ir_tensor);
    h.n_nodes %= (uint32_t)(room / sizeof(xpu_ir_node) + 1);
    room -= (uint64_t)h.n_nodes * sizeof(xpu_ir_node);
    h.n_inputs %= h.n_tensors + 1;
    h.n_outputs %= h.n_tensors + 1;
    memcpy(blob, &h, sizeof h);
  }
  xpu_ir_graph g;
  char err[256];
  /* a NULL or tiny error buffer must be safe too */
  xpu_status st = xpu_ir_parse(blob, size, &g, size & 1 ? err : NULL, size & 2 ? 3 : sizeof err);
  if (st == XPU_OK) check_graph(&g);
  else check(st == XPU_E_INVALID_ARG || st == XPU_E_INCOMPATIBLE || st == XPU_E_OUT_OF_MEMORY);
  free(blob);
  return 0;
}
