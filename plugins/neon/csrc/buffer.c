/* buffer.c: plugin memory and the buffer entry points (allocate, import host memory or an fd,
 * map, read, write, release). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "api.h"
#include "neon.h"

/* ---------------------------------------------------------------- memory */

/*
 * Zeroed memory, 64-byte aligned. Large blocks are 2 MiB aligned and their whole 2 MiB pages
 * asked for transparent huge pages: kernels stream weight matrices row block by row block, and
 * with 4 KiB pages each 1 KiB row segment of a 16 KiB-stride matrix is a TLB miss. Only the
 * pages that hold size bytes are touched, and the part past the last whole huge page keeps
 * small pages: a 9 MiB weight must not make 10 MiB resident (an FFN matrix of a 1B model is
 * 9 MiB, and a model has dozens of them).
 */
void *nv_alloc(uint64_t size) {
  const uint64_t huge = (uint64_t)2 << 20;
  uint64_t align = size >= 2 * huge ? huge : NV_ALIGN;
  uint64_t rounded = (size + align - 1) / align * align;
  if (rounded == 0) rounded = NV_ALIGN;
  void *mem = NULL;
  if (posix_memalign(&mem, (size_t)align, (size_t)rounded) != 0) return NULL;
#ifdef MADV_HUGEPAGE
  if (align == huge) (void)madvise(mem, (size_t)(size / huge * huge), MADV_HUGEPAGE); /* a hint: failure is fine */
#endif
  /* zero through the page that holds the end: a SIMD read just past size reads zeros */
  uint64_t touched = (size + 4095) / 4096 * 4096;
  memset(mem, 0, (size_t)(touched < rounded ? touched : rounded));
  return mem;
}

/* ---------------------------------------------------------------- buffers */

void nv_buffer_unref(nv_buffer *b) {
  if (atomic_fetch_sub(&b->refs, 1) != 1) return;
  if (b->owned == 1) free(b->data);
  if (b->owned == 2) munmap(b->map_base, b->map_len);
  atomic_fetch_sub(&b->ctx->children, 1);
  free(b);
}

static xpu_status add_buffer(xpu_context ch, nv_context *c, nv_buffer *b, xpu_buffer *out) {
  atomic_init(&b->refs, 1);
  b->ctx = c;
  atomic_fetch_add(&c->children, 1);
  xpu_handle h = xpu_reg_add(&nv_reg, OBJ_BUFFER, b);
  if (!h) {
    nv_buffer_unref(b);
    return xpu_fail(&nv_reg, ch, XPU_E_OUT_OF_MEMORY, "buffer: out of handles");
  }
  *out = h;
  return XPU_OK;
}

xpu_status nv_api_buffer_alloc(xpu_context ch, uint64_t size, uint32_t kind, xpu_buffer *out) {
  if (!out) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "buffer_alloc: null out");
  *out = 0;
  nv_context *c = (nv_context *)xpu_reg_get(&nv_reg, ch, OBJ_CONTEXT);
  if (!c) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_HANDLE, "buffer_alloc: unknown or released context handle");
  if (kind != XPU_BUFFER_DEVICE && kind != XPU_BUFFER_HOST_VISIBLE)
    return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "buffer_alloc: unknown buffer kind %u", kind);
  if (size > ((uint64_t)1 << 46))
    return xpu_fail(&nv_reg, ch, XPU_E_OUT_OF_MEMORY, "buffer_alloc: %llu bytes is more than this device can hold",
                    (unsigned long long)size);
  nv_buffer *b = (nv_buffer *)calloc(1, sizeof *b);
  void *mem = b ? nv_alloc(size) : NULL;
  if (!mem) {
    free(b);
    return xpu_fail(&nv_reg, ch, XPU_E_OUT_OF_MEMORY, "buffer_alloc: cannot allocate %llu bytes",
                    (unsigned long long)size);
  }
  b->data = (uint8_t *)mem;
  b->size = size;
  b->owned = 1;
  return add_buffer(ch, c, b, out);
}

xpu_status nv_api_buffer_import(xpu_context ch, const xpu_import_desc *d, xpu_buffer *out) {
  if (!out || !d) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "buffer_import: null argument");
  *out = 0;
  nv_context *c = (nv_context *)xpu_reg_get(&nv_reg, ch, OBJ_CONTEXT);
  if (!c) return xpu_fail(&nv_reg, ch, XPU_E_INVALID_HANDLE, "buffer_import: unknown or released context handle");
  if (d->struct_size < offsetof(xpu_import_desc, size) + sizeof(uint64_t))
    return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "buffer_import: desc struct_size %u too small", d->struct_size);
  nv_buffer *b = (nv_buffer *)calloc(1, sizeof *b);
  if (!b) return xpu_fail(&nv_reg, ch, XPU_E_OUT_OF_MEMORY, "buffer_import: out of memory");
  if (d->kind == XPU_IMPORT_HOST) {
    if (!d->host_ptr) {
      free(b);
      return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "buffer_import: null host_ptr");
    }
    b->data = (uint8_t *)d->host_ptr + d->offset;
    b->size = d->size;
    b->owned = 0;
  } else if (d->kind == XPU_IMPORT_FD) {
    if (d->fd < 0 || d->size == 0) {
      free(b);
      return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "buffer_import: fd %lld or size 0 invalid", (long long)d->fd);
    }
    long psz = sysconf(_SC_PAGESIZE);
    uint64_t base = d->offset / (uint64_t)psz * (uint64_t)psz, skip = d->offset - base;
    /* the in-page skip plus a huge size must not wrap into a short mapping that later
     * reads and writes would run past */
    if (d->size > SIZE_MAX - skip || base > (uint64_t)INT64_MAX || d->fd > INT32_MAX) {
      free(b);
      return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "buffer_import: fd range [%llu, +%llu) is too large to map",
                      (unsigned long long)d->offset, (unsigned long long)d->size);
    }
    void *m = mmap(NULL, d->size + skip, PROT_READ | PROT_WRITE, MAP_SHARED, (int)d->fd, (off_t)base);
    if (m == MAP_FAILED) {
      int e = errno;
      free(b);
      return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "buffer_import: mmap of fd %lld: %s", (long long)d->fd,
                      strerror(e));
    }
    b->map_base = m;
    b->map_len = d->size + skip;
    b->data = (uint8_t *)m + skip;
    b->size = d->size;
    b->owned = 2;
  } else {
    free(b);
    return xpu_fail(&nv_reg, ch, XPU_E_INVALID_ARG, "buffer_import: unknown import kind %u", d->kind);
  }
  return add_buffer(ch, c, b, out);
}

xpu_status nv_api_buffer_map(xpu_buffer h, void **out) {
  if (!out) return xpu_fail(&nv_reg, h, XPU_E_INVALID_ARG, "buffer_map: null out");
  nv_buffer *b = (nv_buffer *)xpu_reg_get(&nv_reg, h, OBJ_BUFFER);
  if (!b) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "buffer_map: unknown or released buffer handle");
  atomic_fetch_add(&b->mapped, 1);
  atomic_fetch_add(&b->gen, 1);
  *out = b->data;
  return XPU_OK;
}

xpu_status nv_api_buffer_unmap(xpu_buffer h) {
  nv_buffer *b = (nv_buffer *)xpu_reg_get(&nv_reg, h, OBJ_BUFFER);
  if (!b) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "buffer_unmap: unknown or released buffer handle");
  int m = atomic_load(&b->mapped);
  while (m > 0 && !atomic_compare_exchange_weak(&b->mapped, &m, m - 1)) {
  }
  if (m <= 0) return xpu_fail(&nv_reg, h, XPU_E_BAD_STATE, "buffer_unmap: buffer is not mapped");
  atomic_fetch_add(&b->gen, 1); /* written through the map, maybe: a new prepare repacks */
  return XPU_OK;
}

static xpu_status buffer_range(const char *what, xpu_buffer h, uint64_t off, uint64_t size, const void *p,
                               nv_buffer **out) {
  nv_buffer *b = (nv_buffer *)xpu_reg_get(&nv_reg, h, OBJ_BUFFER);
  if (!b) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "%s: unknown or released buffer handle", what);
  if (!p && size) return xpu_fail(&nv_reg, h, XPU_E_INVALID_ARG, "%s: null pointer", what);
  if (off > b->size || size > b->size - off)
    return xpu_fail(&nv_reg, h, XPU_E_INVALID_ARG, "%s: range [%llu, +%llu) outside the %llu-byte buffer", what,
                    (unsigned long long)off, (unsigned long long)size, (unsigned long long)b->size);
  *out = b;
  return XPU_OK;
}

xpu_status nv_api_buffer_write(xpu_buffer h, uint64_t off, const void *src, uint64_t size) {
  nv_buffer *b = NULL;
  xpu_status s = buffer_range("buffer_write", h, off, size, src, &b);
  if (s == XPU_OK && size) {
    memcpy(b->data + off, src, size);
    atomic_fetch_add(&b->gen, 1);
  }
  return s;
}

xpu_status nv_api_buffer_read(xpu_buffer h, uint64_t off, void *dst, uint64_t size) {
  nv_buffer *b = NULL;
  xpu_status s = buffer_range("buffer_read", h, off, size, dst, &b);
  if (s == XPU_OK && size) memcpy(dst, b->data + off, size);
  return s;
}

xpu_status nv_api_buffer_size(xpu_buffer h, uint64_t *out) {
  if (!out) return xpu_fail(&nv_reg, h, XPU_E_INVALID_ARG, "buffer_size: null out");
  nv_buffer *b = (nv_buffer *)xpu_reg_get(&nv_reg, h, OBJ_BUFFER);
  if (!b) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "buffer_size: unknown or released buffer handle");
  *out = b->size;
  return XPU_OK;
}

xpu_status nv_api_buffer_release(xpu_buffer h) {
  nv_buffer *b = (nv_buffer *)xpu_reg_get(&nv_reg, h, OBJ_BUFFER);
  if (!b) return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "buffer_release: unknown or released buffer handle");
  if (atomic_load(&b->inflight) > 0)
    return xpu_fail(&nv_reg, h, XPU_E_BAD_STATE, "buffer_release: an execution in flight uses this buffer");
  if (!xpu_reg_remove(&nv_reg, h, OBJ_BUFFER))
    return xpu_fail(&nv_reg, h, XPU_E_INVALID_HANDLE, "buffer_release: buffer released concurrently");
  nv_buffer_unref(b);
  return XPU_OK;
}

