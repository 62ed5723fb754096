#include "clapi.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int clapi_load(clapi *api, char *err, size_t errcap) {
  const char *env = getenv("XPU_OPENCL_LIBRARY");
  const char *cands[3];
  int n = 0;
  if (env && *env) {
    cands[n++] = env; /* an explicit choice is not second-guessed with fallbacks */
  } else {
    cands[n++] = "libOpenCL.so.1";
    cands[n++] = "libOpenCL.so";
  }
  char why[256] = "";
  for (int i = 0; i < n && !api->lib; i++) {
    api->lib = dlopen(cands[i], RTLD_NOW | RTLD_LOCAL);
    if (api->lib) {
      snprintf(api->path, sizeof api->path, "%s", cands[i]);
    } else if (!why[0]) {
      const char *e = dlerror();
      snprintf(why, sizeof why, "%s", e ? e : cands[i]);
    }
  }
  if (!api->lib) {
    snprintf(err, errcap, "OpenCL library not found (%s)", why);
    return -1;
  }
#define CLAPI_RESOLVE(name)                                                                      \
  *(void **)(&api->name) = dlsym(api->lib, #name);                                               \
  if (!api->name) {                                                                              \
    snprintf(err, errcap, "%s lacks %s (needs OpenCL 1.2)", api->path, #name);                  \
    dlclose(api->lib);                                                                           \
    api->lib = NULL;                                                                             \
    return -1;                                                                                   \
  }
  CLAPI_FUNCS(CLAPI_RESOLVE)
#undef CLAPI_RESOLVE
  return 0;
}

const char *cl_err_name(cl_int code) {
  switch (code) {
#define E(c) case c: return #c;
    E(CL_SUCCESS) E(CL_DEVICE_NOT_FOUND) E(CL_DEVICE_NOT_AVAILABLE) E(CL_COMPILER_NOT_AVAILABLE)
    E(CL_MEM_OBJECT_ALLOCATION_FAILURE) E(CL_OUT_OF_RESOURCES) E(CL_OUT_OF_HOST_MEMORY)
    E(CL_PROFILING_INFO_NOT_AVAILABLE) E(CL_MEM_COPY_OVERLAP) E(CL_IMAGE_FORMAT_MISMATCH)
    E(CL_IMAGE_FORMAT_NOT_SUPPORTED) E(CL_BUILD_PROGRAM_FAILURE) E(CL_MAP_FAILURE)
    E(CL_MISALIGNED_SUB_BUFFER_OFFSET) E(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
    E(CL_COMPILE_PROGRAM_FAILURE) E(CL_LINKER_NOT_AVAILABLE) E(CL_LINK_PROGRAM_FAILURE)
    E(CL_DEVICE_PARTITION_FAILED) E(CL_KERNEL_ARG_INFO_NOT_AVAILABLE) E(CL_INVALID_VALUE)
    E(CL_INVALID_DEVICE_TYPE) E(CL_INVALID_PLATFORM) E(CL_INVALID_DEVICE) E(CL_INVALID_CONTEXT)
    E(CL_INVALID_QUEUE_PROPERTIES) E(CL_INVALID_COMMAND_QUEUE) E(CL_INVALID_HOST_PTR)
    E(CL_INVALID_MEM_OBJECT) E(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR) E(CL_INVALID_IMAGE_SIZE)
    E(CL_INVALID_SAMPLER) E(CL_INVALID_BINARY) E(CL_INVALID_BUILD_OPTIONS) E(CL_INVALID_PROGRAM)
    E(CL_INVALID_PROGRAM_EXECUTABLE) E(CL_INVALID_KERNEL_NAME) E(CL_INVALID_KERNEL_DEFINITION)
    E(CL_INVALID_KERNEL) E(CL_INVALID_ARG_INDEX) E(CL_INVALID_ARG_VALUE) E(CL_INVALID_ARG_SIZE)
    E(CL_INVALID_KERNEL_ARGS) E(CL_INVALID_WORK_DIMENSION) E(CL_INVALID_WORK_GROUP_SIZE)
    E(CL_INVALID_WORK_ITEM_SIZE) E(CL_INVALID_GLOBAL_OFFSET) E(CL_INVALID_EVENT_WAIT_LIST)
    E(CL_INVALID_EVENT) E(CL_INVALID_OPERATION) E(CL_INVALID_GL_OBJECT) E(CL_INVALID_BUFFER_SIZE)
    E(CL_INVALID_MIP_LEVEL) E(CL_INVALID_GLOBAL_WORK_SIZE) E(CL_INVALID_PROPERTY)
    E(CL_INVALID_IMAGE_DESCRIPTOR) E(CL_INVALID_COMPILER_OPTIONS) E(CL_INVALID_LINKER_OPTIONS)
    E(CL_INVALID_DEVICE_PARTITION_COUNT)
#undef E
  case -1001: return "CL_PLATFORM_NOT_FOUND_KHR";
  default: return "CL_UNKNOWN_ERROR";
  }
}
