/*
 * qnn_rpcmem.c: memory the HTP reads in place. On a Snapdragon phone that is rpcmem, allocated
 * through libcdsprpc.so (FastRPC's user library, on the device's vendor partition): rpcmem_alloc
 * gives memory mapped into the DSP's SMMU, rpcmem_to_fd its fd, which QNN registers as the HTP's
 * shared buffer (QNN_MEM_TYPE_CUSTOM + QNN_HTP_MEM_SHARED_BUFFER, a byte offset per tensor).
 * The library is opened at run time (XPU_QNN_RPCMEM_LIBRARY, else libcdsprpc.so); without it
 * buffers are plain host memory and FastRPC copies them at every execute.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

#include "qnn_plugin.h"

#define RPCMEM_HEAP_ID_SYSTEM 25 /* rpcmem.h: the system heap, mapped into the cDSP */
#define RPCMEM_DEFAULT_FLAGS 1   /* cached */

static struct {
  void *dl;
  void *(*alloc)(int heap, uint32_t flags, int size);
  void (*free)(void *p);
  int (*to_fd)(void *p);
} rpc;
static pthread_once_t rpc_once = PTHREAD_ONCE_INIT;

static void rpc_load(void) {
  const char *path = getenv("XPU_QNN_RPCMEM_LIBRARY");
  void *dl = dlopen(path && path[0] ? path : "libcdsprpc.so", RTLD_NOW | RTLD_LOCAL);
  if (!dl) return;
  *(void **)&rpc.alloc = dlsym(dl, "rpcmem_alloc");
  *(void **)&rpc.free = dlsym(dl, "rpcmem_free");
  *(void **)&rpc.to_fd = dlsym(dl, "rpcmem_to_fd");
  if (!rpc.alloc || !rpc.free || !rpc.to_fd) {
    dlclose(dl);
    rpc.alloc = NULL;
    return;
  }
  rpc.dl = dl; /* kept for the process: buffers may outlive any one context */
}

int qnn_rpcmem_available(void) {
  pthread_once(&rpc_once, rpc_load);
  return rpc.alloc != NULL;
}

void *qnn_rpcmem_alloc(uint64_t size, int *fd) {
  if (!qnn_rpcmem_available() || size == 0 || size > 0x7FFFFFFF) return NULL;
  void *p = rpc.alloc(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, (int)size);
  if (!p) return NULL;
  *fd = rpc.to_fd(p);
  if (*fd < 0) {
    rpc.free(p);
    return NULL;
  }
  return p;
}

void qnn_rpcmem_free(void *p) {
  if (p && rpc.free) rpc.free(p);
}
