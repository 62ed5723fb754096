/*
 * probe.c: the two exports and what this CPU can do. plugin.mk builds this file for the
 * architecture's baseline even in the AVX2 and AVX-512 builds, because the loader probes every
 * build it finds: on a CPU without the build's instructions, probe must answer 0 with the reason
 * (and open must refuse) instead of dying of SIGILL in code the compiler vectorized. It therefore
 * tests NV_REQUIRE, set by plugin.mk, not __AVX2__ or __AVX512F__.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "neon.h"

#ifndef NV_REQUIRE
#define NV_REQUIRE 0 /* 0: the baseline; 1: AVX2, FMA, F16C; 2: that and AVX-512 F, BW, VL */
#endif

int nv_cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : (int)n;
}

/* 0 with the reason when this build's instructions are missing */
static int variant_runs(const char **why) {
  *why = "";
#if defined(__x86_64__) && NV_REQUIRE >= 1
  __builtin_cpu_init();
  int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#if NV_REQUIRE >= 2
  if (!avx2 || !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl")) {
    *why = "this build needs AVX-512 (F, BW, VL), AVX2, FMA and F16C, which the CPU lacks";
    return 0;
  }
#else
  if (!avx2) {
    *why = "this build needs AVX2, FMA and F16C, which the CPU lacks";
    return 0;
  }
#endif
#endif
  return 1;
}

static int variant_score(void) {
#if defined(__aarch64__)
  return nv_have_dotprod() ? 60 : 50;
#else
  return 20 + 10 * NV_REQUIRE;
#endif
}

void nv_describe(char *out, size_t cap) {
#if defined(__aarch64__)
  snprintf(out, cap, "native NEON on aarch64 (int8: %s), %d cores", nv_int8_path(), nv_cpu_count());
#else
  static const char *const builds[] = {"portable SSE2 build", "AVX2/FMA build", "AVX-512 build"};
  snprintf(out, cap, "NEON via SIMDe on x86-64 (%s, int8: %s), %d cores", builds[NV_REQUIRE], nv_int8_path(),
           nv_cpu_count());
#endif
}

XPU_EXPORT xpu_status xpu_plugin_probe(xpu_probe_result *out) {
  if (!out || out->struct_size < offsetof(xpu_probe_result, score)) return XPU_E_INVALID_ARG;
  xpu_probe_result r;
  memset(&r, 0, sizeof r);
  r.abi_major = XPU_ABI_MAJOR;
  r.abi_minor = XPU_ABI_MINOR;
  XPU_STRCPY(r.name, "neon");
  const char *why;
  if (!variant_runs(&why)) {
    r.score = 0;
    XPU_STRCPY(r.reason, why);
  } else {
    r.score = variant_score();
    nv_describe(r.reason, sizeof r.reason);
  }
  XPU_COPY_OUT(out, r);
  return XPU_OK;
}

XPU_EXPORT xpu_status xpu_plugin_open(const xpu_host_info *host, const xpu_api **out) {
  const char *why;
  if (!variant_runs(&why)) return xpu_fail(&nv_reg, 0, XPU_E_INCOMPATIBLE, "open: %s", why);
  return nv_open(host, out);
}
