/*
 * clapi.h: the OpenCL 1.2 entry points the plugin uses, resolved with dlsym from a libOpenCL
 * loaded at run time. The Khronos headers give only types and constants: the plugin never links
 * libOpenCL, so it loads (and probes 0) on machines without an ICD loader.
 */
#ifndef XPU_OPENCL_CLAPI_H
#define XPU_OPENCL_CLAPI_H

#define CL_TARGET_OPENCL_VERSION 120
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>

/* X(name): every function the plugin calls. __typeof__ of the Khronos prototype keeps each
 * pointer's signature exact without declaring a symbol the linker would have to resolve. */
#define CLAPI_FUNCS(X)                                                                           \
  X(clGetPlatformIDs) X(clGetPlatformInfo) X(clGetDeviceIDs) X(clGetDeviceInfo)                  \
  X(clCreateContext) X(clReleaseContext) X(clCreateCommandQueue) X(clReleaseCommandQueue)        \
  X(clFlush) X(clFinish) X(clCreateProgramWithSource) X(clCreateProgramWithBinary)               \
  X(clBuildProgram) X(clGetProgramInfo) X(clGetProgramBuildInfo) X(clReleaseProgram)             \
  X(clCreateKernel) X(clReleaseKernel) X(clSetKernelArg) X(clGetKernelWorkGroupInfo)             \
  X(clCreateBuffer) X(clRetainMemObject) X(clReleaseMemObject) X(clEnqueueReadBuffer) X(clEnqueueWriteBuffer)         \
  X(clEnqueueCopyBuffer) X(clEnqueueFillBuffer) X(clEnqueueMapBuffer)                            \
  X(clEnqueueUnmapMemObject) X(clEnqueueNDRangeKernel) X(clEnqueueMarkerWithWaitList)            \
  X(clCreateUserEvent) X(clSetUserEventStatus) X(clGetEventInfo) X(clWaitForEvents)              \
  X(clRetainEvent) X(clReleaseEvent) X(clSetEventCallback)

typedef struct clapi {
  void *lib;
  char path[256];
#define CLAPI_FIELD(name) __typeof__(name) *name;
  CLAPI_FUNCS(CLAPI_FIELD)
#undef CLAPI_FIELD
} clapi;

/* Loads libOpenCL (XPU_OPENCL_LIBRARY, else libOpenCL.so.1, else libOpenCL.so) and resolves
 * every entry. Returns 0, or -1 with the reason in err. */
int clapi_load(clapi *api, char *err, size_t errcap);

/* "CL_OUT_OF_RESOURCES" for -5; "CL_UNKNOWN_ERROR(<code>)" is never returned: unknown codes
 * give "CL_UNKNOWN_ERROR". */
const char *cl_err_name(cl_int code);

#endif
