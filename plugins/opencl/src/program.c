/*
 * program.c: the device program, built once per device and kept on disk.
 *
 * Cache file: <dir>/opencl-<device hash>-<key hash>.bin. The key names the device, driver,
 * platform, build options and a hash of the kernel source, so any change among them misses the
 * cache; writing a device's new file removes its older ones, so plugin upgrades leave no litter.
 * Layout: "XPUCLBN1", u32 key length, key, u64 binary length, u64 fnv64(binary), binary.
 * A file that does not match (truncated, corrupt, other key, rejected by the driver) is rebuilt
 * from source and overwritten: the cache can only save time, never fail a start.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ocl.h"
#include "ocl_kernels_cl.h" /* generated from kernels.cl: ocl_kernels_src */

#define CACHE_MAGIC "XPUCLBN1"

static uint64_t fnv64(const void *p, size_t n, uint64_t h) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}
#define FNV0 0xcbf29ce484222325ull

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* mkdir -p; 0 on success */
static int mkdirs(const char *path) {
  char tmp[1024];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  return (mkdir(tmp, 0755) != 0 && errno != EEXIST) ? -1 : 0;
}

static int cache_dir(char *out, size_t cap) {
  const char *x = getenv("XPU_CACHE_DIR");
  if (x && *x) return snprintf(out, cap, "%s", x) < (int)cap ? 0 : -1;
  x = getenv("XDG_CACHE_HOME");
  if (x && *x) return snprintf(out, cap, "%s/xpu", x) < (int)cap ? 0 : -1;
  x = getenv("HOME");
  if (x && *x) return snprintf(out, cap, "%s/.cache/xpu", x) < (int)cap ? 0 : -1;
  return -1;
}

/* Opens a cache file for reading, or returns NULL: non-blocking, so that a FIFO (or a device)
 * put where a cache file belongs is refused at once instead of blocking the open or the reads
 * forever, then checked with fstat to be a regular file. The miss rebuilds from source and the
 * save's rename replaces whatever was there. */
static FILE *open_regular(const char *path) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return NULL;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return NULL;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    close(fd);
    return NULL;
  }
  FILE *f = fdopen(fd, "rb");
  if (!f) close(fd);
  return f;
}

/* Reads a cache file; returns the binary (caller frees) or NULL when absent or not matching. */
static uint8_t *cache_load(const char *path, const char *key, size_t *len) {
  FILE *f = open_regular(path);
  if (!f) return NULL;
  uint8_t *bin = NULL;
  char magic[8];
  uint32_t kl = 0;
  uint64_t bl = 0, sum = 0;
  size_t keylen = strlen(key);
  char *k = NULL;
  if (fread(magic, 1, 8, f) != 8 || memcmp(magic, CACHE_MAGIC, 8) != 0) goto out;
  if (fread(&kl, sizeof kl, 1, f) != 1 || kl != keylen) goto out;
  k = malloc(kl + 1);
  if (!k || fread(k, 1, kl, f) != kl || memcmp(k, key, kl) != 0) goto out;
  if (fread(&bl, sizeof bl, 1, f) != 1 || fread(&sum, sizeof sum, 1, f) != 1) goto out;
  if (bl == 0 || bl > ((uint64_t)1 << 30)) goto out;
  bin = malloc(bl);
  if (!bin || fread(bin, 1, bl, f) != bl || fnv64(bin, bl, FNV0) != sum) {
    free(bin);
    bin = NULL;
    goto out;
  }
  *len = bl;
out:
  free(k);
  fclose(f);
  return bin;
}

/* Writes atomically (temp file + rename), so a crash mid-write leaves no half file behind. */
static int cache_save(const char *dir, const char *path, const char *key, const uint8_t *bin,
                      size_t len) {
  if (mkdirs(dir) != 0) return -1;
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
  /* whatever sits at the temporary name (a FIFO would block an open for writing) goes first;
   * O_EXCL then creates a fresh regular file or fails */
  unlink(tmp);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  FILE *f = fdopen(fd, "wb");
  if (!f) {
    close(fd);
    unlink(tmp);
    return -1;
  }
  uint32_t kl = (uint32_t)strlen(key);
  uint64_t bl = len, sum = fnv64(bin, len, FNV0);
  int ok = fwrite(CACHE_MAGIC, 1, 8, f) == 8 && fwrite(&kl, sizeof kl, 1, f) == 1 &&
           fwrite(key, 1, kl, f) == kl && fwrite(&bl, sizeof bl, 1, f) == 1 &&
           fwrite(&sum, sizeof sum, 1, f) == 1 && fwrite(bin, 1, len, f) == len;
  ok = (fclose(f) == 0) && ok;
  if (!ok || rename(tmp, path) != 0) {
    unlink(tmp);
    return -1;
  }
  return 0;
}

/* removes dir/<prefix>*.bin other than keep */
static void prune(const char *dir, const char *prefix, const char *keep) {
  DIR *dp = opendir(dir);
  if (!dp) return;
  struct dirent *de;
  size_t pl = strlen(prefix);
  while ((de = readdir(dp)) != NULL) {
    size_t n = strlen(de->d_name);
    if (strncmp(de->d_name, prefix, pl) != 0 || n < 4 || strcmp(de->d_name + n - 4, ".bin") != 0 ||
        strcmp(de->d_name, keep) == 0)
      continue;
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    unlink(path);
  }
  closedir(dp);
}

static cl_int build(ocl_device *d, cl_program p, const char *opts, char *err, size_t cap) {
  cl_int ce = P.cl.clBuildProgram(p, 1, &d->id, opts, NULL, NULL);
  if (ce != CL_SUCCESS) {
    char log[2048] = "";
    P.cl.clGetProgramBuildInfo(p, d->id, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
    log[sizeof log - 1] = 0;
    snprintf(err, cap, "opencl: clBuildProgram failed on %s: %s (%d): %s", d->info.name,
             cl_err_name(ce), (int)ce, log);
  }
  return ce;
}

xpu_status ocl_program_ensure(ocl_device *d, char *err, size_t cap) {
  if (d->prog) return XPU_OK;
  double t0 = now_ms();
  char opts[160];
  snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DVW=%u%s", d->vec_width,
           d->correct_div ? " -cl-fp32-correctly-rounded-divide-sqrt" : "");
  size_t srclen = sizeof ocl_kernels_src - 1;
  char key[768];
  snprintf(key, sizeof key, "xpu-opencl|%s|%s|%s|%s|%016llx", d->info.name,
           d->info.driver_version, d->platform_version, opts,
           (unsigned long long)fnv64(ocl_kernels_src, srclen, FNV0));
  char dir[800], path[1000], prefix[40], file[80];
  int have_dir = cache_dir(dir, sizeof dir) == 0;
  uint64_t dh = fnv64(d->info.name, strlen(d->info.name), FNV0);
  dh = fnv64(d->info.driver_version, strlen(d->info.driver_version), dh);
  dh = fnv64(d->platform_version, strlen(d->platform_version), dh);
  snprintf(prefix, sizeof prefix, "opencl-%016llx-", (unsigned long long)dh);
  snprintf(file, sizeof file, "%s%016llx.bin", prefix,
           (unsigned long long)fnv64(key, strlen(key), FNV0));
  if (have_dir) snprintf(path, sizeof path, "%s/%s", dir, file);

  cl_int ce = CL_SUCCESS;
  if (have_dir) {
    size_t len = 0;
    uint8_t *bin = cache_load(path, key, &len);
    if (bin) {
      const unsigned char *bins[1] = {bin};
      cl_int bst = CL_SUCCESS;
      cl_program p =
          P.cl.clCreateProgramWithBinary(d->clctx, 1, &d->id, &len, bins, &bst, &ce);
      free(bin);
      if (p && bst == CL_SUCCESS && build(d, p, opts, err, cap) == CL_SUCCESS) {
        d->prog = p;
        d->from_cache = 1;
        d->build_ms = now_ms() - t0;
        return XPU_OK;
      }
      if (p) P.cl.clReleaseProgram(p);
      xpu_log(&P.reg, XPU_LOG_WARN, "opencl: cache file %s rejected by the driver; rebuilding",
              path);
    }
  }
  const char *srcs[1] = {ocl_kernels_src};
  cl_program p = P.cl.clCreateProgramWithSource(d->clctx, 1, srcs, &srclen, &ce);
  if (!p) {
    snprintf(err, cap, "opencl: clCreateProgramWithSource failed: %s (%d)", cl_err_name(ce),
             (int)ce);
    return ocl_status_of(ce);
  }
  if (build(d, p, opts, err, cap) != CL_SUCCESS) {
    P.cl.clReleaseProgram(p);
    return XPU_E_INTERNAL;
  }
  d->prog = p;
  d->from_cache = 0;
  d->build_ms = now_ms() - t0;
  if (!have_dir) return XPU_OK;
  size_t blen = 0;
  if (P.cl.clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof blen, &blen, NULL) == CL_SUCCESS &&
      blen > 0) {
    unsigned char *bin = malloc(blen);
    unsigned char *bins[1] = {bin};
    if (bin && P.cl.clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof bins, bins, NULL) ==
                   CL_SUCCESS)
      if (cache_save(dir, path, key, bin, blen) == 0) prune(dir, prefix, file);
    free(bin);
  }
  return XPU_OK;
}
