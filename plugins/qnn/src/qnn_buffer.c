/*
 * qnn_buffer.c: buffers of the QNN plugin: host memory it allocates (64-byte aligned), host
 * memory it is given, and fds (memfd, rpcmem, dma-buf) it maps; constants of a graph are read
 * from these by (buffer, offset).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "qnn_plugin.h"

/* ---------------------------------------------------------------- buffers */

static xpu_status buffer_add(xpu_context ctx, qctx *c, qbuf *b, xpu_buffer *out) {
  b->ctx = ctx;
  b->owner = c;
  atomic_init(&b->busy, 0);
  *out = xpu_reg_add(&qnn_reg, T_BUF, b);
  if (!*out) return XPU_E_OUT_OF_MEMORY;
  atomic_fetch_add(&c->children, 1);
  return XPU_OK;
}

xpu_status buffer_alloc(xpu_context ctx, uint64_t size, uint32_t kind, xpu_buffer *out) {
  qctx *c = xpu_reg_get(&qnn_reg, ctx, T_CTX);
  if (!c) return xpu_fail(&qnn_reg, ctx, XPU_E_INVALID_HANDLE, "buffer_alloc: invalid context handle");
  if (!out || kind > XPU_BUFFER_HOST_VISIBLE)
    return xpu_fail(&qnn_reg, ctx, XPU_E_INVALID_ARG, "buffer_alloc: null output or unknown kind %u", kind);
  if (size > ((uint64_t)1 << 40)) return xpu_fail(&qnn_reg, ctx, XPU_E_OUT_OF_MEMORY, "buffer_alloc: %llu bytes", (unsigned long long)size);
  qbuf *b = calloc(1, sizeof *b);
  void *p = NULL;
  int rfd = -1;
  /* on the HTP, rpcmem when libcdsprpc.so is there: the NPU reads it in place */
  if (b && float_as_f16() && (p = qnn_rpcmem_alloc(size, &rfd))) {
    memset(p, 0, size);
    b->ptr = p;
    b->size = size;
    b->rpcmem = 1;
    b->fd = rfd;
    if (buffer_add(ctx, c, b, out) != XPU_OK) {
      qnn_rpcmem_free(p);
      free(b);
      return xpu_fail(&qnn_reg, ctx, XPU_E_OUT_OF_MEMORY, "buffer_alloc: out of memory");
    }
    return XPU_OK;
  }
  /* 64-byte aligned: what HTP DMA and the HVX vector width want from client buffers */
  if (!b || posix_memalign(&p, 64, size ? size : 1) != 0) {
    free(b);
    return xpu_fail(&qnn_reg, ctx, XPU_E_OUT_OF_MEMORY, "buffer_alloc: out of memory (%llu bytes)", (unsigned long long)size);
  }
  memset(p, 0, size ? size : 1);
  b->ptr = p;
  b->size = size;
  b->owned = 1;
  b->fd = -1;
  if (buffer_add(ctx, c, b, out) != XPU_OK) {
    free(p);
    free(b);
    return xpu_fail(&qnn_reg, ctx, XPU_E_OUT_OF_MEMORY, "buffer_alloc: out of memory");
  }
  return XPU_OK;
}

xpu_status buffer_import(xpu_context ctx, const xpu_import_desc *d, xpu_buffer *out) {
  qctx *c = xpu_reg_get(&qnn_reg, ctx, T_CTX);
  if (!c) return xpu_fail(&qnn_reg, ctx, XPU_E_INVALID_HANDLE, "buffer_import: invalid context handle");
  if (!d || !out || d->struct_size < offsetof(xpu_import_desc, size) + sizeof(uint64_t))
    return xpu_fail(&qnn_reg, ctx, XPU_E_INVALID_ARG, "buffer_import: null or short descriptor");
  qbuf *b = calloc(1, sizeof *b);
  if (!b) return xpu_fail(&qnn_reg, ctx, XPU_E_OUT_OF_MEMORY, "buffer_import: out of memory");
  b->size = d->size;
  b->fd = -1;
  if (d->kind == XPU_IMPORT_HOST) {
    if (!host_import_zero_copy()) {
      free(b);
      return xpu_fail(&qnn_reg, ctx, XPU_E_UNSUPPORTED, "buffer_import: the HTP cannot read host memory in place; import an rpcmem fd");
    }
    if (!d->host_ptr) {
      free(b);
      return xpu_fail(&qnn_reg, ctx, XPU_E_INVALID_ARG, "buffer_import: null host pointer");
    }
    b->ptr = (uint8_t *)d->host_ptr + d->offset; /* the ABI: offset applies to both kinds */
  } else if (d->kind == XPU_IMPORT_FD) {
    if (d->fd < 0 || d->fd > 0x7FFFFFFF || d->size == 0) {
      free(b);
      return xpu_fail(&qnn_reg, ctx, XPU_E_INVALID_ARG, "buffer_import: bad fd %lld or size 0", (long long)d->fd);
    }
    /* bounded so that size + the in-page offset cannot wrap: a short mapping under a huge
     * size would let buffer_read/write run past it; the offset must fit off_t */
    if (d->size > ((uint64_t)1 << 40) || d->offset > ((uint64_t)1 << 62)) {
      free(b);
      return xpu_fail(&qnn_reg, ctx, XPU_E_INVALID_ARG, "buffer_import: fd range [%llu, +%llu) out of range",
                      (unsigned long long)d->offset, (unsigned long long)d->size);
    }
    long page = sysconf(_SC_PAGESIZE);
    uint64_t base = d->offset - d->offset % (uint64_t)page;
    b->map_len = (size_t)(d->size + (d->offset - base));
    b->map_base = mmap(NULL, b->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, (int)d->fd, (off_t)base);
    if (b->map_base == MAP_FAILED) {
      int e = errno;
      free(b);
      return xpu_fail(&qnn_reg, ctx, XPU_E_INVALID_ARG, "buffer_import: mmap fd %lld: %s", (long long)d->fd, strerror(e));
    }
    b->ptr = (uint8_t *)b->map_base + (d->offset - base);
    b->fd = dup((int)d->fd);
    b->fd_offset = d->offset;
    if (b->fd < 0) {
      munmap(b->map_base, b->map_len);
      free(b);
      return xpu_fail(&qnn_reg, ctx, XPU_E_INTERNAL, "buffer_import: dup: %s", strerror(errno));
    }
  } else {
    free(b);
    return xpu_fail(&qnn_reg, ctx, XPU_E_INVALID_ARG, "buffer_import: unknown kind %u", d->kind);
  }
  if (buffer_add(ctx, c, b, out) != XPU_OK) {
    if (b->map_base) munmap(b->map_base, b->map_len);
    if (b->fd >= 0) close(b->fd);
    free(b);
    return xpu_fail(&qnn_reg, ctx, XPU_E_OUT_OF_MEMORY, "buffer_import: out of memory");
  }
  return XPU_OK;
}

xpu_status buffer_map(xpu_buffer h, void **out) {
  qbuf *b = xpu_reg_get(&qnn_reg, h, T_BUF);
  if (!b) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "buffer_map: invalid buffer handle");
  if (!out) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "buffer_map: null output");
  *out = b->ptr;
  return XPU_OK;
}

xpu_status buffer_unmap(xpu_buffer h) {
  if (!xpu_reg_get(&qnn_reg, h, T_BUF)) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "buffer_unmap: invalid buffer handle");
  return XPU_OK; /* host memory: nothing to flush */
}

static xpu_status buffer_rw(xpu_buffer h, uint64_t off, void *dst, const void *src, uint64_t size, const char *what) {
  qbuf *b = xpu_reg_get(&qnn_reg, h, T_BUF);
  if (!b) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "%s: invalid buffer handle", what);
  if ((!dst && !src) || off > b->size || size > b->size - off)
    return xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "%s: [%llu, +%llu) outside a %llu-byte buffer or null pointer", what,
                    (unsigned long long)off, (unsigned long long)size, (unsigned long long)b->size);
  if (size) {
    if (dst) memcpy(dst, b->ptr + off, size);
    else memcpy(b->ptr + off, src, size);
  }
  return XPU_OK;
}

xpu_status buffer_write(xpu_buffer h, uint64_t off, const void *src, uint64_t size) {
  if (!src && size) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "buffer_write: null source");
  return buffer_rw(h, off, NULL, src ? src : "", size, "buffer_write");
}

xpu_status buffer_read(xpu_buffer h, uint64_t off, void *dst, uint64_t size) {
  char dummy;
  if (!dst && size) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "buffer_read: null destination");
  return buffer_rw(h, off, dst ? dst : &dummy, NULL, size, "buffer_read");
}

xpu_status buffer_size(xpu_buffer h, uint64_t *out) {
  qbuf *b = xpu_reg_get(&qnn_reg, h, T_BUF);
  if (!b) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "buffer_size: invalid buffer handle");
  if (!out) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "buffer_size: null output");
  *out = b->size;
  return XPU_OK;
}

xpu_status buffer_release(xpu_buffer h) {
  qbuf *b = xpu_reg_get(&qnn_reg, h, T_BUF);
  if (!b) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "buffer_release: invalid buffer handle");
  if (atomic_load(&b->busy)) return xpu_fail(&qnn_reg, h, XPU_E_BAD_STATE, "buffer_release: an execution is running on it");
  if (!xpu_reg_remove(&qnn_reg, h, T_BUF)) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "buffer_release: raced");
  if (b->owned) free(b->ptr);
  if (b->rpcmem) qnn_rpcmem_free(b->ptr); /* its fd belongs to rpcmem */
  if (b->map_base) munmap(b->map_base, b->map_len);
  if (b->fd >= 0 && !b->rpcmem) close(b->fd);
  atomic_fetch_sub(&b->owner->children, 1);
  free(b);
  return XPU_OK;
}

const void *const_bytes(void *user, uint64_t buffer, uint64_t offset, uint64_t size, char *err, size_t cap) {
  const_user *u = user;
  qbuf *b = xpu_reg_get(&qnn_reg, buffer, T_BUF);
  if (!b || b->ctx != u->ctx) {
    snprintf(err, cap, "constant buffer %llu is not a buffer of this context", (unsigned long long)buffer);
    return NULL;
  }
  if (offset > b->size || size > b->size - offset) {
    snprintf(err, cap, "constant [%llu, +%llu) outside its %llu-byte buffer", (unsigned long long)offset,
             (unsigned long long)size, (unsigned long long)b->size);
    return NULL;
  }
  return b->ptr + offset;
}
