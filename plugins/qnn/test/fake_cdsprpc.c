/*
 * fake_cdsprpc.c: a stand-in for the device's libcdsprpc.so in tests (not Qualcomm code): rpcmem
 * is memfd-backed shared memory here, so the plugin's rpcmem path (allocation, the HTP shared-
 * buffer registration with offsets, release) runs against the emulator, which maps the fd as the
 * DSP would map an rpcmem fd.
 */

#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_ALLOCS 256

static struct {
  void *p;
  int fd;
  size_t size;
} allocs[MAX_ALLOCS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

__attribute__((visibility("default"))) void *rpcmem_alloc(int heap, uint32_t flags, int size) {
  (void)heap;
  (void)flags;
  if (size <= 0) return NULL;
  int fd = memfd_create("fake-rpcmem", MFD_CLOEXEC);
  if (fd < 0) return NULL;
  void *p = MAP_FAILED;
  if (ftruncate(fd, size) == 0) p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return NULL;
  }
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (!allocs[i].p) {
      allocs[i].p = p, allocs[i].fd = fd, allocs[i].size = (size_t)size;
      pthread_mutex_unlock(&mu);
      return p;
    }
  pthread_mutex_unlock(&mu);
  munmap(p, (size_t)size);
  close(fd);
  return NULL;
}

__attribute__((visibility("default"))) int rpcmem_to_fd(void *p) {
  int fd = -1;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (allocs[i].p == p) fd = allocs[i].fd;
  pthread_mutex_unlock(&mu);
  return fd;
}

__attribute__((visibility("default"))) void rpcmem_free(void *p) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (allocs[i].p == p) {
      munmap(p, allocs[i].size);
      close(allocs[i].fd);
      allocs[i].p = NULL;
    }
  pthread_mutex_unlock(&mu);
}
