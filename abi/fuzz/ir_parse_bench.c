/*
 * ir_parse_bench.c: times xpu_ir_parse on a chain of N RELU nodes (N+1 tensors), the shape of
 * graph that made the reader's producer search quadratic. `make bench-ir` builds and runs it;
 * prints one line per N with the median of 5 parses.
 *   usage: ir_parse_bench [N...]   (default 1000 10000 100000)
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xpu_ir.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* a chain t0 -RELU-> t1 -RELU-> ... tN, input t0, output tN */
static void *chain(uint32_t n, uint64_t *size) {
  uint32_t nt = n + 1;
  *size = sizeof(xpu_ir_header) + (uint64_t)nt * sizeof(xpu_ir_tensor) + (uint64_t)n * sizeof(xpu_ir_node) + 8;
  uint8_t *b = aligned_alloc(8, (*size + 7) / 8 * 8);
  if (!b) return NULL;
  memset(b, 0, *size);
  xpu_ir_header *h = (xpu_ir_header *)b;
  *h = (xpu_ir_header){XPU_IR_MAGIC, XPU_IR_VERSION, XPU_OPSET_VERSION, nt, n, 1, 1, 0};
  xpu_ir_tensor *t = (xpu_ir_tensor *)(h + 1);
  for (uint32_t i = 0; i < nt; i++) {
    t[i].dtype = XPU_DT_F32;
    t[i].rank = 1;
    t[i].shape[0] = 64;
    t[i].shape[1] = t[i].shape[2] = t[i].shape[3] = 1;
    t[i].kind = i == 0 ? XPU_TENSOR_INPUT : XPU_TENSOR_VALUE;
  }
  xpu_ir_node *nd = (xpu_ir_node *)(t + nt);
  for (uint32_t i = 0; i < n; i++) {
    nd[i].op = XPU_OP_RELU;
    nd[i].n_inputs = 1;
    for (int k = 0; k < XPU_MAX_INPUTS; k++) nd[i].inputs[k] = XPU_NO_TENSOR;
    nd[i].inputs[0] = i;
    nd[i].output = i + 1;
  }
  uint32_t *io = (uint32_t *)(nd + n);
  io[0] = 0;
  io[1] = n;
  return b;
}

int main(int argc, char **argv) {
  uint32_t def[] = {1000, 10000, 100000};
  int count = argc > 1 ? argc - 1 : 3;
  for (int a = 0; a < count; a++) {
    uint32_t n = argc > 1 ? (uint32_t)strtoul(argv[a + 1], NULL, 10) : def[a];
    uint64_t size;
    void *blob = chain(n, &size);
    if (!blob) return 1;
    double t[5];
    for (int r = 0; r < 5; r++) {
      xpu_ir_graph g;
      char err[160];
      double t0 = now_s();
      xpu_status st = xpu_ir_parse(blob, size, &g, err, sizeof err);
      t[r] = now_s() - t0;
      if (st != XPU_OK) {
        fprintf(stderr, "parse %u nodes: %s\n", n, err);
        return 1;
      }
    }
    qsort(t, 5, sizeof t[0], cmp_double);
    printf("xpu_ir_parse %7u nodes: %10.3f ms (median of 5)\n", n, t[2] * 1e3);
    free(blob);
  }
  return 0;
}
