/* graph.h: node checks (check.c) and kernel launches (launch.c) behind graph.c. */
#ifndef XPU_OPENCL_GRAPH_H
#define XPU_OPENCL_GRAPH_H

#include "ocl.h"

/* Static verdict from dtypes alone (op_support). */
uint32_t ocl_op_static(const xpu_op_query *q);

/* 1 when the kernels run node ni of g; else 0 with the reason. c may be NULL (no constant or
 * device-limit checks). */
int ocl_node_check(ocl_ctx *c, const xpu_ir_graph *g, uint32_t ni, char *why, size_t cap);

/* where a tensor's bytes are at execution time */
typedef struct ocl_ref {
  cl_mem mem;
  uint64_t off;
} ocl_ref;

/* Enqueues node ni on q with c's kernels (c->mu held); refs[t] locates every tensor; flag is
 * the execution's error flag buffer. Fails with a message in why. */
cl_int ocl_launch_node(ocl_ctx *c, cl_command_queue q, const xpu_ir_graph *g, uint32_t ni, const ocl_ref *refs,
                       cl_mem flag, char *why, size_t cap);

#endif
