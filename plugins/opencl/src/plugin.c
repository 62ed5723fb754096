/*
 * plugin.c: the two exports, plugin and device info, contexts and buffers of the OpenCL plugin.
 * Graphs and executions are in graph.c, fences in fence.c, the program cache in program.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ocl.h"

ocl_plugin P = {XPU_REGISTRY_INIT, PTHREAD_MUTEX_INITIALIZER, 0, "", {0}, NULL, 0};

const char *const ocl_kernel_names[K_COUNT] = {"eltwise",  "copy_strided", "norm",
                                               "softmax",  "rope",         "attention",
                                               "get_rows", "quantize_block", "gemm_f32",
                                               "gemm_any", "gemm_blk_f32_4", "gemm_blk_f32_1",
                                               "gemm_blk_any_4", "gemm_blk_any_1", "gemm_q_4",
                                               "gemm_q_1", "attention_row", "eltwise_f32",
                                               "norm_row", "softmax_row"};

xpu_status ocl_status_of(cl_int err) {
  switch (err) {
  case CL_OUT_OF_HOST_MEMORY:
  case CL_MEM_OBJECT_ALLOCATION_FAILURE:
  case CL_OUT_OF_RESOURCES: return XPU_E_OUT_OF_MEMORY;
  case CL_DEVICE_NOT_AVAILABLE:
  case CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST: return XPU_E_DEVICE_LOST;
  case CL_INVALID_BUFFER_SIZE:
  case CL_INVALID_HOST_PTR: return XPU_E_INVALID_ARG;
  default: return XPU_E_INTERNAL;
  }
}

xpu_status ocl_clfail(xpu_handle h, cl_int err, const char *what) {
  return xpu_fail(&P.reg, h, ocl_status_of(err), "opencl: %s failed: %s (%d)", what,
                  cl_err_name(err), (int)err);
}

/* ---------------------------------------------------------------- submissions */
ocl_sub *ocl_sub_new(void) {
  ocl_sub *s = calloc(1, sizeof *s);
  if (s) atomic_init(&s->refs, 1);
  return s;
}

void ocl_sub_ref(ocl_sub *s) {
  if (s) atomic_fetch_add(&s->refs, 1);
}

void ocl_sub_unref(ocl_sub *s) {
  if (!s || atomic_fetch_sub(&s->refs, 1) != 1) return;
  if (s->ev) P.cl.clReleaseEvent(s->ev);
  free(s);
}

int ocl_sub_done(ocl_sub *s, xpu_status *st, char *msg, size_t cap) {
  cl_int es = CL_COMPLETE;
  if (s->ev) {
    cl_int err = P.cl.clGetEventInfo(s->ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof es, &es,
                                     NULL);
    if (err != CL_SUCCESS) es = err;
  }
  if (es > 0) return 0; /* queued, submitted or running */
  if (es < 0) {
    *st = ocl_status_of(es) == XPU_E_OUT_OF_MEMORY ? XPU_E_OUT_OF_MEMORY : XPU_E_DEVICE_LOST;
    snprintf(msg, cap, "opencl: submission failed on the device: %s (%d)", cl_err_name(es),
             (int)es);
  } else if (s->errflag) {
    *st = XPU_E_INVALID_ARG;
    snprintf(msg, cap, "GET_ROWS (node %d): an id is outside [0, rows of the table)",
             (int)s->errflag - 1);
  } else {
    *st = XPU_OK;
    if (cap) msg[0] = 0;
  }
  return 1;
}

/* ---------------------------------------------------------------- discovery */
static void dev_str(cl_device_id d, cl_device_info what, char *out, size_t cap) {
  out[0] = 0;
  if (P.cl.clGetDeviceInfo(d, what, cap, out, NULL) != CL_SUCCESS) out[0] = 0;
  out[cap - 1] = 0;
}

static void describe(ocl_device *d) {
  xpu_device_info *in = &d->info;
  memset(in, 0, sizeof *in);
  in->struct_size = sizeof *in;
  cl_device_type type = 0;
  P.cl.clGetDeviceInfo(d->id, CL_DEVICE_TYPE, sizeof type, &type, NULL);
  in->kind = (type & CL_DEVICE_TYPE_GPU) ? XPU_DEVICE_GPU
             : (type & CL_DEVICE_TYPE_CPU) ? XPU_DEVICE_CPU
                                            : XPU_DEVICE_ACCEL;
  dev_str(d->id, CL_DEVICE_NAME, in->name, sizeof in->name);
  dev_str(d->id, CL_DEVICE_VENDOR, in->vendor, sizeof in->vendor);
  dev_str(d->id, CL_DRIVER_VERSION, in->driver_version, sizeof in->driver_version);
  P.cl.clGetPlatformInfo(d->platform, CL_PLATFORM_VERSION, sizeof d->platform_version,
                         d->platform_version, NULL);
  d->platform_version[sizeof d->platform_version - 1] = 0;
  cl_ulong mem = 0, lmem = 0, maxalloc = 0;
  cl_uint cu = 0;
  size_t wg = 0, items[3] = {1, 1, 1};
  cl_bool unified = CL_FALSE;
  cl_device_fp_config fp = 0;
  P.cl.clGetDeviceInfo(d->id, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof mem, &mem, NULL);
  P.cl.clGetDeviceInfo(d->id, CL_DEVICE_LOCAL_MEM_SIZE, sizeof lmem, &lmem, NULL);
  P.cl.clGetDeviceInfo(d->id, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof maxalloc, &maxalloc, NULL);
  P.cl.clGetDeviceInfo(d->id, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL);
  P.cl.clGetDeviceInfo(d->id, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof wg, &wg, NULL);
  P.cl.clGetDeviceInfo(d->id, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof items, items, NULL);
  P.cl.clGetDeviceInfo(d->id, CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof unified, &unified, NULL);
  P.cl.clGetDeviceInfo(d->id, CL_DEVICE_SINGLE_FP_CONFIG, sizeof fp, &fp, NULL);
  in->memory_bytes = mem;
  in->compute_units = cu;
  d->local_mem = lmem;
  d->max_alloc = maxalloc;
  d->max_wg = wg ? wg : 1;
  for (int i = 0; i < 3; i++) d->max_item[i] = items[i] ? items[i] : 1;
  d->correct_div = (fp & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) != 0;
  /* GPUs report 1 (they vectorise across work-items); float4 loads still halve their load
   * count. CPUs report their SIMD width (16 with AVX-512): 3x faster MATMUL on PoCL than 4. */
  cl_uint vw = 0;
  P.cl.clGetDeviceInfo(d->id, CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT, sizeof vw, &vw, NULL);
  d->vec_width = vw >= 16 ? 16 : vw >= 8 ? 8 : 4;

  char ext[4096];
  dev_str(d->id, CL_DEVICE_EXTENSIONS, ext, sizeof ext);
  /* host-visible: every buffer maps; async: submit only enqueues. USE_HOST_PTR is zero-copy
   * only where the device reads host memory itself. */
  in->caps = XPU_CAP_ASYNC | XPU_CAP_HOST_VISIBLE | XPU_CAP_CONCURRENT; /* a queue per execution */
  if (unified || in->kind == XPU_DEVICE_CPU) /* an fd import is a mapping of it, then the same */
    in->caps |= XPU_CAP_UNIFIED_MEMORY | XPU_CAP_IMPORT_HOST | XPU_CAP_IMPORT_FD;
  if (strstr(ext, "cl_khr_fp16")) in->caps |= XPU_CAP_FP16;

  /* declared peaks (ABI 1.1): what OpenCL's device query implies, one multiply-add per SIMD
   * lane per cycle of every compute unit; the memory bandwidth is not in the query (0). */
  cl_uint mhz = 0, hw = 0;
  P.cl.clGetDeviceInfo(d->id, CL_DEVICE_MAX_CLOCK_FREQUENCY, sizeof mhz, &mhz, NULL);
  P.cl.clGetDeviceInfo(d->id, CL_DEVICE_NATIVE_VECTOR_WIDTH_HALF, sizeof hw, &hw, NULL);
  uint64_t lane_hz = (uint64_t)cu * mhz * 1000000ull;
  in->peak_flops_f32 = 2 * lane_hz * (vw ? vw : 1);
  if (in->caps & XPU_CAP_FP16) in->peak_flops_f16 = 2 * lane_hz * (hw ? hw : 1);
}

/* Loads libOpenCL and lists the devices once; plugin.mu held. */
static int load_locked(void) {
  if (P.loaded) return P.loaded;
  if (!P.cl.lib && clapi_load(&P.cl, P.load_err, sizeof P.load_err) != 0) {
    P.loaded = -1;
    return -1;
  }
  cl_uint np = 0;
  cl_int err = P.cl.clGetPlatformIDs(0, NULL, &np);
  if (err == -1001 || (err == CL_SUCCESS && np == 0)) {
    snprintf(P.load_err, sizeof P.load_err, "%.180s loaded but no OpenCL platform is installed",
             P.cl.path);
    P.loaded = -1;
    return -1;
  }
  if (err != CL_SUCCESS) {
    snprintf(P.load_err, sizeof P.load_err, "clGetPlatformIDs failed: %s", cl_err_name(err));
    P.loaded = -1;
    return -1;
  }
  cl_platform_id *plats = calloc(np, sizeof *plats);
  if (!plats || P.cl.clGetPlatformIDs(np, plats, NULL) != CL_SUCCESS) {
    free(plats);
    snprintf(P.load_err, sizeof P.load_err, "clGetPlatformIDs failed");
    P.loaded = -1;
    return -1;
  }
  for (cl_uint p = 0; p < np; p++) {
    cl_uint nd = 0;
    if (P.cl.clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) != CL_SUCCESS || !nd)
      continue;
    cl_device_id *ids = calloc(nd, sizeof *ids);
    ocl_device *grown = realloc(P.devs, (P.ndev + nd) * sizeof *grown);
    if (!ids || !grown) {
      free(ids);
      if (grown) P.devs = grown;
      break;
    }
    P.devs = grown;
    if (P.cl.clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, nd, ids, NULL) == CL_SUCCESS) {
      for (cl_uint i = 0; i < nd; i++) {
        ocl_device *d = &P.devs[P.ndev++];
        memset(d, 0, sizeof *d);
        d->platform = plats[p];
        d->id = ids[i];
        describe(d);
      }
    }
    free(ids);
  }
  free(plats);
  if (P.ndev == 0) {
    snprintf(P.load_err, sizeof P.load_err, "%.180s loaded but no OpenCL device is available",
             P.cl.path);
    P.loaded = -1;
    return -1;
  }
  P.loaded = 1;
  return 1;
}

XPU_EXPORT xpu_status xpu_plugin_probe(xpu_probe_result *out) {
  if (!out || out->struct_size < offsetof(xpu_probe_result, reason)) return XPU_E_INVALID_ARG;
  xpu_probe_result r;
  memset(&r, 0, sizeof r);
  r.abi_major = XPU_ABI_MAJOR;
  r.abi_minor = XPU_ABI_MINOR;
  XPU_STRCPY(r.name, "opencl");
  pthread_mutex_lock(&P.mu);
  if (load_locked() < 0) {
    r.score = 0;
    XPU_STRCPY(r.reason, P.load_err);
  } else {
    int gpus = 0;
    for (uint32_t i = 0; i < P.ndev; i++) gpus += P.devs[i].info.kind == XPU_DEVICE_GPU;
    /* a real GPU beats the CPU backends; an OpenCL CPU device (PoCL) works but is not preferred */
    r.score = gpus ? 70 : 10;
    snprintf(r.reason, sizeof r.reason, "%u OpenCL device(s) via %.40s, first: %.90s (%.80s)", P.ndev,
             P.cl.path, P.devs[0].info.name, P.devs[0].platform_version);
  }
  pthread_mutex_unlock(&P.mu);
  XPU_COPY_OUT(out, r);
  return XPU_OK;
}

/* ---------------------------------------------------------------- plugin-level entries */
static xpu_status get_info(xpu_plugin_info *out) {
  if (!out || out->struct_size < sizeof(uint32_t)) return XPU_E_INVALID_ARG;
  xpu_plugin_info in;
  memset(&in, 0, sizeof in);
  in.abi_major = XPU_ABI_MAJOR;
  in.abi_minor = XPU_ABI_MINOR;
  in.opset_min = 1;
  in.opset_max = XPU_OPSET_VERSION;
  in.ir_version = XPU_IR_VERSION;
  XPU_STRCPY(in.name, "opencl");
  XPU_STRCPY(in.vendor, "xpu");
  XPU_STRCPY(in.version, OCL_PLUGIN_VERSION);
  XPU_STRCPY(in.build_id, "opencl-" OCL_PLUGIN_VERSION "-" __DATE__ " " __TIME__);
  pthread_mutex_lock(&P.mu);
  if (P.loaded > 0) snprintf(in.sdk_version, sizeof in.sdk_version, "%.63s",
                              P.devs[0].platform_version);
  pthread_mutex_unlock(&P.mu);
  XPU_COPY_OUT(out, in);
  return XPU_OK;
}

static xpu_status shutdown_(void) {
  if (xpu_reg_count(&P.reg, 0) != 0)
    return xpu_fail(&P.reg, 0, XPU_E_BAD_STATE, "shutdown: %u objects are still alive",
                    xpu_reg_count(&P.reg, 0));
  pthread_mutex_lock(&P.mu);
  for (uint32_t i = 0; i < P.ndev; i++) {
    if (P.devs[i].prog) P.cl.clReleaseProgram(P.devs[i].prog);
    if (P.devs[i].clctx) P.cl.clReleaseContext(P.devs[i].clctx);
  }
  free(P.devs);
  P.devs = NULL;
  P.ndev = 0;
  P.loaded = 0; /* libOpenCL stays loaded: unloading an ICD is not safe, a reopen reuses it */
  pthread_mutex_unlock(&P.mu);
  xpu_reg_destroy(&P.reg);
  return XPU_OK;
}

static xpu_status last_error(xpu_handle h, char *buf, uint32_t cap, uint32_t *len) {
  return xpu_reg_last_error(&P.reg, h, buf, cap, len);
}

static xpu_status device_count(uint32_t *out) {
  if (!out) return xpu_fail(&P.reg, 0, XPU_E_INVALID_ARG, "device_count: null out");
  *out = P.ndev;
  return XPU_OK;
}

static xpu_status device_info(uint32_t device, xpu_device_info *out) {
  if (!out || out->struct_size < sizeof(uint32_t))
    return xpu_fail(&P.reg, 0, XPU_E_INVALID_ARG, "device_info: null or short out");
  if (device >= P.ndev)
    return xpu_fail(&P.reg, 0, XPU_E_INVALID_ARG, "device_info: device %u of %u", device, P.ndev);
  xpu_device_info in = P.devs[device].info;
  XPU_COPY_OUT(out, in);
  return XPU_OK;
}

uint32_t ocl_op_static(const xpu_op_query *q);

static xpu_status op_support(uint32_t device, const xpu_op_query *q, uint32_t *verdict) {
  if (!q || !verdict || q->struct_size < sizeof(uint32_t) * 2)
    return xpu_fail(&P.reg, 0, XPU_E_INVALID_ARG, "op_support: null query or verdict");
  if (device >= P.ndev)
    return xpu_fail(&P.reg, 0, XPU_E_INVALID_ARG, "op_support: device %u of %u", device, P.ndev);
  xpu_op_query qq;
  memset(&qq, 0, sizeof qq);
  memcpy(&qq, q, q->struct_size < sizeof qq ? q->struct_size : sizeof qq);
  *verdict = ocl_op_static(&qq);
  return XPU_OK;
}

/* ---------------------------------------------------------------- contexts */
static size_t pow2_floor(size_t v) {
  size_t p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}

static void ctx_free(ocl_ctx *c) {
  for (int i = 0; i < K_COUNT; i++)
    if (c->k[i]) P.cl.clReleaseKernel(c->k[i]);
  if (c->q) P.cl.clReleaseCommandQueue(c->q);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

/*
 * Context option "kernels": "gpu" or "cpu" picks the kernel family (see ocl_ctx.gpu_kernels)
 * instead of the device kind's, so both run on any device: the tests put the GPU family through
 * the suite on PoCL. context_create refuses unknown keys.
 */
static int kernel_choice(const char *options, const ocl_device *d, int *gpu) {
  char v[16];
  int r = xpu_opt_get(options, "kernels", v, sizeof v);
  *gpu = d->info.kind != XPU_DEVICE_CPU;
  if (r == 0) return 0;
  if (r > 0 && strcmp(v, "gpu") == 0) *gpu = 1;
  else if (r > 0 && strcmp(v, "cpu") == 0) *gpu = 0;
  else return -1;
  return 0;
}

static xpu_status context_create(uint32_t device, const char *options, xpu_context *out) {
  if (!out) return xpu_fail(&P.reg, 0, XPU_E_INVALID_ARG, "context_create: null out");
  if (device >= P.ndev)
    return xpu_fail(&P.reg, 0, XPU_E_INVALID_ARG, "context_create: device %u of %u", device,
                    P.ndev);
  static const char *const known[] = {"kernels", NULL};
  char oerr[256];
  if (xpu_opt_check(options, known, oerr, sizeof oerr) != 0)
    return xpu_fail(&P.reg, 0, XPU_E_INVALID_ARG, "context_create: %s", oerr);
  ocl_device *d = &P.devs[device];
  int gpu;
  if (kernel_choice(options, d, &gpu) != 0)
    return xpu_fail(&P.reg, 0, XPU_E_INVALID_ARG,
                    "context_create: kernels must be \"gpu\" or \"cpu\"");
  char err[XPU_ERR_LEN];
  cl_int ce = CL_SUCCESS;
  pthread_mutex_lock(&P.mu);
  if (!d->clctx) {
    d->clctx = P.cl.clCreateContext(NULL, 1, &d->id, NULL, NULL, &ce);
    if (!d->clctx) {
      pthread_mutex_unlock(&P.mu);
      return ocl_clfail(0, ce, "clCreateContext");
    }
  }
  xpu_status st = ocl_program_ensure(d, err, sizeof err);
  pthread_mutex_unlock(&P.mu);
  if (st != XPU_OK) return xpu_fail(&P.reg, 0, st, "%s", err);

  ocl_ctx *c = calloc(1, sizeof *c);
  if (!c) return xpu_fail(&P.reg, 0, XPU_E_OUT_OF_MEMORY, "context_create: out of memory");
  c->dev = d;
  c->gpu_kernels = gpu;
  pthread_mutex_init(&c->mu, NULL);
  atomic_init(&c->children, 0);
  c->q = P.cl.clCreateCommandQueue(d->clctx, d->id, 0, &ce);
  if (!c->q) {
    ctx_free(c);
    return ocl_clfail(0, ce, "clCreateCommandQueue");
  }
  for (int i = 0; i < K_COUNT; i++) {
    c->k[i] = P.cl.clCreateKernel(d->prog, ocl_kernel_names[i], &ce);
    if (!c->k[i]) {
      ctx_free(c);
      snprintf(err, sizeof err, "clCreateKernel(%s)", ocl_kernel_names[i]);
      return ocl_clfail(0, ce, err);
    }
    size_t wg = 1;
    P.cl.clGetKernelWorkGroupInfo(c->k[i], d->id, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg,
                                  NULL);
    c->kwg[i] = wg ? wg : 1;
    size_t pref = 1;
    P.cl.clGetKernelWorkGroupInfo(c->k[i], d->id, CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE,
                                  sizeof pref, &pref, NULL);
    c->kpref[i] = pref && pref <= c->kwg[i] ? pref : c->kwg[i];
  }
  /* 256 items are enough to fill a compute unit's lanes on every GPU we target; more only
   * lengthens the tail of small launches. */
  size_t lim = d->max_item[0] < 256 ? d->max_item[0] : 256;
  c->wg1d = pow2_floor(c->kwg[K_ELTWISE] < lim ? c->kwg[K_ELTWISE] : lim);
  /* GEMM: side x side items, each 4x4 outputs; its two TK=16 slices take 2*4*side*16 floats */
  size_t gl = c->kwg[K_GEMM_F32] < c->kwg[K_GEMM_ANY] ? c->kwg[K_GEMM_F32] : c->kwg[K_GEMM_ANY];
  if (gl > 256) gl = 256;
  size_t side = 1;
  while ((side * 2) * (side * 2) <= gl && side * 2 <= d->max_item[0] &&
         side * 2 <= d->max_item[1] && 2 * 4 * (side * 2) * 16 * sizeof(float) <= d->local_mem / 2)
    side *= 2;
  c->gemm_side = side;

  xpu_handle h = xpu_reg_add(&P.reg, T_CTX, c);
  if (!h) {
    ctx_free(c);
    return xpu_fail(&P.reg, 0, XPU_E_OUT_OF_MEMORY, "context_create: registry full");
  }
  xpu_log(&P.reg, XPU_LOG_DEBUG,
          "opencl: context on %s: program %s in %.1f ms, 1-d work-group %zu, %s kernels "
          "(matmul tiles of %zux%zu items)",
          d->info.name, d->from_cache ? "loaded from cache" : "built", d->build_ms, c->wg1d,
          gpu ? "gpu" : "cpu", side, side);
  *out = h;
  return XPU_OK;
}

static xpu_status context_release(xpu_context h) {
  ocl_ctx *c = xpu_reg_get(&P.reg, h, T_CTX);
  if (!c) return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "context_release: invalid context");
  if (atomic_load(&c->children))
    return xpu_fail(&P.reg, h, XPU_E_BAD_STATE,
                    "context_release: %u buffers, executables or fences are still alive",
                    atomic_load(&c->children));
  if (!xpu_reg_remove(&P.reg, h, T_CTX))
    return xpu_fail(&P.reg, h, XPU_E_INVALID_HANDLE, "context_release: invalid context");
  P.cl.clFinish(c->q);
  ctx_free(c);
  return XPU_OK;
}

/* ---------------------------------------------------------------- the table */
static const xpu_api API = {
    .struct_size = sizeof(xpu_api),
    .abi_major = XPU_ABI_MAJOR,
    .abi_minor = XPU_ABI_MINOR,
    .get_info = get_info,
    .shutdown = shutdown_,
    .last_error = last_error,
    .device_count = device_count,
    .device_info = device_info,
    .op_support = op_support,
    .context_create = context_create,
    .context_release = context_release,
    .buffer_alloc = ocl_buffer_alloc,
    .buffer_import = ocl_buffer_import,
    .buffer_map = ocl_buffer_map,
    .buffer_unmap = ocl_buffer_unmap,
    .buffer_write = ocl_buffer_write,
    .buffer_read = ocl_buffer_read,
    .buffer_size = ocl_buffer_size,
    .buffer_release = ocl_buffer_release,
    .graph_analyze = ocl_graph_analyze,
    .graph_prepare = ocl_graph_prepare,
    .executable_serialize = ocl_executable_serialize,
    .executable_release = ocl_executable_release,
    .execution_create = ocl_execution_create,
    .execution_bind = ocl_execution_bind,
    .execution_submit = ocl_execution_submit,
    .execution_run = ocl_execution_run,
    .execution_release = ocl_execution_release,
    .fence_create = ocl_fence_create,
    .fence_wait = ocl_fence_wait,
    .fence_value = ocl_fence_value,
    .fence_signal = ocl_fence_signal,
    .fence_release = ocl_fence_release,
};

XPU_EXPORT xpu_status xpu_plugin_open(const xpu_host_info *host, const xpu_api **out) {
  if (!out) return XPU_E_INVALID_ARG;
  if (host && host->struct_size >= sizeof(uint32_t) * 2 && host->abi_major != XPU_ABI_MAJOR)
    return xpu_fail(&P.reg, 0, XPU_E_INCOMPATIBLE, "open: host ABI %u, plugin ABI %u",
                    host->abi_major, XPU_ABI_MAJOR);
  xpu_reg_set_log(&P.reg, host);
  pthread_mutex_lock(&P.mu);
  int ok = load_locked();
  pthread_mutex_unlock(&P.mu);
  if (ok < 0) return xpu_fail(&P.reg, 0, XPU_E_MISSING_DEP, "opencl: %s", P.load_err);
  *out = &API;
  return XPU_OK;
}
