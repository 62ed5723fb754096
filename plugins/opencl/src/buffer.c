/*
 * buffer.c: buffers. Allocated ones are cl_mem objects (CL_MEM_ALLOC_HOST_PTR when
 * host-visible); imported ones wrap host memory or an fd mapping with CL_MEM_USE_HOST_PTR.
 * Transfers and maps go through the context's own queue, never behind submitted work.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ocl.h"

static xpu_status buf_register(ocl_ctx *c, ocl_buf *b, xpu_buffer *out, xpu_handle ctx_h) {
  xpu_handle h = xpu_reg_add(&P.reg, T_BUF, b);
  if (!h) {
    P.cl.clReleaseMemObject(b->mem);
    if (b->fd_map) munmap(b->fd_map, b->fd_len);
    pthread_mutex_destroy(&b->mu);
    free(b);
    return xpu_fail(&P.reg, ctx_h, XPU_E_OUT_OF_MEMORY, "buffer: registry full");
  }
  atomic_fetch_add(&c->children, 1);
  *out = h;
  return XPU_OK;
}

xpu_status ocl_buffer_alloc(xpu_context ctx_h, uint64_t size, uint32_t kind, xpu_buffer *out) {
  ocl_ctx *c = xpu_reg_get(&P.reg, ctx_h, T_CTX);
  if (!c) return xpu_fail(&P.reg, ctx_h, XPU_E_INVALID_HANDLE, "buffer_alloc: invalid context");
  if (!out) return xpu_fail(&P.reg, ctx_h, XPU_E_INVALID_ARG, "buffer_alloc: null out");
  if (kind > XPU_BUFFER_HOST_VISIBLE)
    return xpu_fail(&P.reg, ctx_h, XPU_E_INVALID_ARG, "buffer_alloc: unknown kind %u", kind);
  if (size > c->dev->max_alloc)
    return xpu_fail(&P.reg, ctx_h, XPU_E_OUT_OF_MEMORY,
                    "buffer_alloc: %llu bytes exceed CL_DEVICE_MAX_MEM_ALLOC_SIZE (%llu)",
                    (unsigned long long)size, (unsigned long long)c->dev->max_alloc);
  cl_mem_flags fl = CL_MEM_READ_WRITE;
  if (kind == XPU_BUFFER_HOST_VISIBLE) fl |= CL_MEM_ALLOC_HOST_PTR;
  cl_int ce = CL_SUCCESS;
  /* an empty tensor still gets a buffer: OpenCL has no 0-byte buffers, so it holds 1 */
  cl_mem m = P.cl.clCreateBuffer(c->dev->clctx, fl, size ? size : 1, NULL, &ce);
  if (!m) return ocl_clfail(ctx_h, ce, "clCreateBuffer");
  ocl_buf *b = calloc(1, sizeof *b);
  if (!b) {
    P.cl.clReleaseMemObject(m);
    return xpu_fail(&P.reg, ctx_h, XPU_E_OUT_OF_MEMORY, "buffer_alloc: out of memory");
  }
  b->ctx = c;
  b->mem = m;
  b->size = size;
  b->kind = kind;
  pthread_mutex_init(&b->mu, NULL);
  return buf_register(c, b, out, ctx_h);
}

/*
 * Host memory is wrapped with CL_MEM_USE_HOST_PTR, zero-copy where the device reads host memory
 * itself (the only devices that claim the import caps). An fd (memfd, dma-buf) is mapped
 * MAP_SHARED and wrapped the same way; the mapping, not the fd, is kept.
 */
xpu_status ocl_buffer_import(xpu_context ctx_h, const xpu_import_desc *desc, xpu_buffer *out) {
  ocl_ctx *c = xpu_reg_get(&P.reg, ctx_h, T_CTX);
  if (!c) return xpu_fail(&P.reg, ctx_h, XPU_E_INVALID_HANDLE, "buffer_import: invalid context");
  if (!desc || !out || desc->struct_size < offsetof(xpu_import_desc, size) + sizeof(uint64_t))
    return xpu_fail(&P.reg, ctx_h, XPU_E_INVALID_ARG, "buffer_import: null or short desc/out");
  if (desc->kind != XPU_IMPORT_HOST && desc->kind != XPU_IMPORT_FD)
    return xpu_fail(&P.reg, ctx_h, XPU_E_INVALID_ARG, "buffer_import: unknown kind %u", desc->kind);
  uint64_t cap = desc->kind == XPU_IMPORT_HOST ? XPU_CAP_IMPORT_HOST : XPU_CAP_IMPORT_FD;
  if (!(c->dev->info.caps & cap))
    return xpu_fail(&P.reg, ctx_h, XPU_E_UNSUPPORTED,
                    "buffer_import: %s does not share host memory, an import would copy",
                    c->dev->info.name);
  if (desc->size == 0 || desc->size > SIZE_MAX)
    return xpu_fail(&P.reg, ctx_h, XPU_E_INVALID_ARG, "buffer_import: size 0 or too large");
  void *host = NULL, *fd_map = NULL;
  size_t fd_len = 0;
  if (desc->kind == XPU_IMPORT_HOST) {
    if (!desc->host_ptr)
      return xpu_fail(&P.reg, ctx_h, XPU_E_INVALID_ARG, "buffer_import: null host pointer");
    host = (uint8_t *)desc->host_ptr + desc->offset;
  } else {
    long page = sysconf(_SC_PAGESIZE);
    uint64_t start = desc->offset / (uint64_t)page * (uint64_t)page;
    if (desc->fd < 0 || desc->fd > INT32_MAX)
      return xpu_fail(&P.reg, ctx_h, XPU_E_INVALID_ARG, "buffer_import: bad fd %lld",
                      (long long)desc->fd);
    /* the in-page skip plus a huge size must not wrap into a short mapping that later
     * reads and writes would run past */
    if (desc->size > SIZE_MAX - (desc->offset - start) || start > (uint64_t)INT64_MAX)
      return xpu_fail(&P.reg, ctx_h, XPU_E_INVALID_ARG,
                      "buffer_import: fd range [%llu, +%llu) is too large to map",
                      (unsigned long long)desc->offset, (unsigned long long)desc->size);
    fd_len = (size_t)(desc->offset - start + desc->size);
    fd_map = mmap(NULL, fd_len, PROT_READ | PROT_WRITE, MAP_SHARED, (int)desc->fd, (off_t)start);
    if (fd_map == MAP_FAILED)
      return xpu_fail(&P.reg, ctx_h, XPU_E_INVALID_ARG,
                      "buffer_import: mmap of fd %lld [%llu, +%llu) failed: %s", (long long)desc->fd,
                      (unsigned long long)desc->offset, (unsigned long long)desc->size,
                      strerror(errno));
    host = (uint8_t *)fd_map + (desc->offset - start);
  }
  cl_int ce = CL_SUCCESS;
  cl_mem m = P.cl.clCreateBuffer(c->dev->clctx, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR,
                                 desc->size, host, &ce);
  ocl_buf *b = m ? calloc(1, sizeof *b) : NULL;
  if (!b) {
    if (m) P.cl.clReleaseMemObject(m);
    if (fd_map) munmap(fd_map, fd_len);
    return m ? xpu_fail(&P.reg, ctx_h, XPU_E_OUT_OF_MEMORY, "buffer_import: out of memory")
             : ocl_clfail(ctx_h, ce, "clCreateBuffer(CL_MEM_USE_HOST_PTR)");
  }
  b->ctx = c;
  b->mem = m;
  b->size = desc->size;
  b->kind = XPU_BUFFER_HOST_VISIBLE;
  b->imported = 1;
  b->fd_map = fd_map;
  b->fd_len = fd_len;
  pthread_mutex_init(&b->mu, NULL);
  return buf_register(c, b, out, ctx_h);
}

xpu_status ocl_buffer_map(xpu_buffer h, void **out) {
  ocl_buf *b = xpu_reg_get(&P.reg, h, T_BUF);
  if (!b) return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "buffer_map: invalid buffer");
  if (!out) return xpu_fail(&P.reg, h, XPU_E_INVALID_ARG, "buffer_map: null out");
  pthread_mutex_lock(&b->mu);
  if (b->mapped) {
    *out = b->mapped;
    pthread_mutex_unlock(&b->mu);
    return XPU_OK;
  }
  cl_int ce = CL_SUCCESS;
  void *p = P.cl.clEnqueueMapBuffer(b->ctx->q, b->mem, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0,
                                    b->size ? b->size : 1, 0, NULL, NULL, &ce);
  if (!p) {
    pthread_mutex_unlock(&b->mu);
    return ocl_clfail(h, ce, "clEnqueueMapBuffer");
  }
  b->mapped = p;
  *out = p;
  pthread_mutex_unlock(&b->mu);
  return XPU_OK;
}

xpu_status ocl_buffer_unmap(xpu_buffer h) {
  ocl_buf *b = xpu_reg_get(&P.reg, h, T_BUF);
  if (!b) return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "buffer_unmap: invalid buffer");
  pthread_mutex_lock(&b->mu);
  if (!b->mapped) {
    pthread_mutex_unlock(&b->mu);
    return xpu_fail(&P.reg, h, XPU_E_BAD_STATE, "buffer_unmap: buffer is not mapped");
  }
  cl_int ce = P.cl.clEnqueueUnmapMemObject(b->ctx->q, b->mem, b->mapped, 0, NULL, NULL);
  if (ce == CL_SUCCESS) ce = P.cl.clFinish(b->ctx->q);
  b->mapped = NULL;
  pthread_mutex_unlock(&b->mu);
  return ce == CL_SUCCESS ? XPU_OK : ocl_clfail(h, ce, "clEnqueueUnmapMemObject");
}

static xpu_status buffer_rw(xpu_buffer h, uint64_t off, void *p, uint64_t size, int write) {
  const char *what = write ? "buffer_write" : "buffer_read";
  ocl_buf *b = xpu_reg_get(&P.reg, h, T_BUF);
  if (!b) return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "%s: invalid buffer", what);
  if (size == 0) return XPU_OK;
  if (!p) return xpu_fail(&P.reg, h, XPU_E_INVALID_ARG, "%s: null pointer", what);
  if (off > b->size || size > b->size - off)
    return xpu_fail(&P.reg, h, XPU_E_INVALID_ARG, "%s: [%llu, +%llu) outside a %llu-byte buffer",
                    what, (unsigned long long)off, (unsigned long long)size,
                    (unsigned long long)b->size);
  /* blocking, on the context's transfer queue: not behind submissions, which may wait on a
   * fence the caller has yet to signal. The host orders transfers against work by fences. */
  cl_int ce = write ? P.cl.clEnqueueWriteBuffer(b->ctx->q, b->mem, CL_TRUE, off, size, p, 0,
                                                NULL, NULL)
                    : P.cl.clEnqueueReadBuffer(b->ctx->q, b->mem, CL_TRUE, off, size, p, 0, NULL,
                                               NULL);
  if (ce != CL_SUCCESS)
    return ocl_clfail(h, ce, write ? "clEnqueueWriteBuffer" : "clEnqueueReadBuffer");
  return XPU_OK;
}

xpu_status ocl_buffer_write(xpu_buffer h, uint64_t off, const void *src, uint64_t size) {
  return buffer_rw(h, off, (void *)src, size, 1);
}

xpu_status ocl_buffer_read(xpu_buffer h, uint64_t off, void *dst, uint64_t size) {
  return buffer_rw(h, off, dst, size, 0);
}

xpu_status ocl_buffer_size(xpu_buffer h, uint64_t *out) {
  ocl_buf *b = xpu_reg_get(&P.reg, h, T_BUF);
  if (!b) return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "buffer_size: invalid buffer");
  if (!out) return xpu_fail(&P.reg, h, XPU_E_INVALID_ARG, "buffer_size: null out");
  *out = b->size;
  return XPU_OK;
}

xpu_status ocl_buffer_release(xpu_buffer h) {
  ocl_buf *b = xpu_reg_get(&P.reg, h, T_BUF);
  if (!b) return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "buffer_release: invalid buffer");
  pthread_mutex_lock(&b->mu);
  xpu_status st = XPU_OK;
  char msg[8];
  if (b->last && !ocl_sub_done(b->last, &st, msg, sizeof msg)) {
    pthread_mutex_unlock(&b->mu);
    return xpu_fail(&P.reg, h, XPU_E_BAD_STATE, "buffer_release: an execution still uses it");
  }
  pthread_mutex_unlock(&b->mu);
  if (!xpu_reg_remove(&P.reg, h, T_BUF))
    return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "buffer_release: invalid buffer");
  if (b->mapped) {
    P.cl.clEnqueueUnmapMemObject(b->ctx->q, b->mem, b->mapped, 0, NULL, NULL);
    P.cl.clFinish(b->ctx->q);
  }
  ocl_sub_unref(b->last);
  P.cl.clReleaseMemObject(b->mem);
  if (b->fd_map) munmap(b->fd_map, b->fd_len);
  atomic_fetch_sub(&b->ctx->children, 1);
  pthread_mutex_destroy(&b->mu);
  free(b);
  return XPU_OK;
}
