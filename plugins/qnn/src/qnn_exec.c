/*
 * qnn_exec.c: graph_prepare (IR -> one QNN context and graph, or a cached context binary),
 * executable_serialize (the context binary in an envelope keyed by plugin build, SDK build,
 * device, IR and constant bytes), and executions (binding, fd registration with memRegister,
 * graphExecute).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qnn_plugin.h"

#define QNN_GRAPH_NAME "xpu"
#define QNN_CACHE_MAGIC 0x584E5158u /* "XQNX" */
#define QNN_CACHE_VERSION 1u

/* ---------------------------------------------------------------- prepare and cache */

static uint64_t hash_bytes(uint64_t h, const void *p, uint64_t n) {
  const uint8_t *b = p;
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) { /* 8 bytes a step: weights can be large */
    uint64_t w;
    memcpy(&w, b + i, 8);
    h = (h ^ w) * 0x100000001B3ull;
    h ^= h >> 29;
  }
  for (; i < n; i++) h = (h ^ b[i]) * 0x100000001B3ull;
  return h;
}

/* the cache key of a graph: its IR without buffer handles (they change per run), plus the
 * bytes of its constants (they are baked into the context binary) */
static xpu_status ir_hash(xpu_context ctx, const xpu_ir_graph *g, uint64_t *out, char *err, size_t cap) {
  uint64_t h = 1469598103934665603ull;
  h = hash_bytes(h, g->header, sizeof *g->header);
  const_user u = {ctx};
  for (uint32_t i = 0; i < g->header->n_tensors; i++) {
    xpu_ir_tensor t = g->tensors[i];
    const void *data = NULL;
    if (t.kind == XPU_TENSOR_CONST &&
        !(data = const_bytes(&u, t.const_buffer, t.const_offset, xpu_ir_nbytes(&t), err, cap)))
      return XPU_E_INVALID_ARG;
    t.const_buffer = t.const_offset = 0;
    h = hash_bytes(h, &t, sizeof t);
    if (data) h = hash_bytes(h, data, xpu_ir_nbytes(&t));
  }
  h = hash_bytes(h, g->nodes, (uint64_t)g->header->n_nodes * sizeof *g->nodes);
  h = hash_bytes(h, g->inputs, ((uint64_t)g->header->n_inputs + g->header->n_outputs) * 4);
  *out = h;
  return XPU_OK;
}

typedef struct {
  uint32_t magic, version;
  char plugin_build[64];
  char sdk_build[128];
  char device[128];
  uint64_t ir_hash;
  uint32_t n_in, n_out, n_nodes, reserved;
  uint64_t qnn_size;
} cache_header;

static void exe_free(qexe *e) {
  if (e->qctx) qnn_state.lib.fn->contextFree(e->qctx, NULL);
  pthread_mutex_destroy(&e->run_mu);
  free(e->io);
  free(e->precision);
  free(e);
}

static xpu_status load_cache(xpu_handle h, qexe *e, const xpu_ir_graph *ir, const void *blob, uint64_t size) {
  const uint8_t *p = blob;
  cache_header hd;
  uint64_t n_io = (uint64_t)e->n_in + e->n_out;
  if (size < sizeof hd + 8) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "graph_prepare: cache blob too short");
  memcpy(&hd, p, sizeof hd);
  uint64_t sum;
  memcpy(&sum, p + size - 8, 8);
  if (hd.magic != QNN_CACHE_MAGIC || sum != hash_bytes(1469598103934665603ull, p, size - 8))
    return xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "graph_prepare: cache blob is not a QNN plugin executable or is damaged");
  char dev[128];
  device_name(dev, sizeof dev);
  if (hd.version != QNN_CACHE_VERSION || strncmp(hd.plugin_build, XPU_QNN_BUILD_ID, sizeof hd.plugin_build) != 0)
    return xpu_fail(&qnn_reg, h, XPU_E_INCOMPATIBLE, "graph_prepare: cache made by another plugin build (%.64s)", hd.plugin_build);
  if (strncmp(hd.sdk_build, qnn_state.lib.build_id, sizeof hd.sdk_build) != 0 || strncmp(hd.device, dev, sizeof hd.device) != 0)
    return xpu_fail(&qnn_reg, h, XPU_E_INCOMPATIBLE, "graph_prepare: cache made for SDK %.100s on %.100s, this is %.100s on %.100s",
                    hd.sdk_build, hd.device, qnn_state.lib.build_id, dev);
  if (hd.ir_hash != e->ir_hash || hd.n_in != e->n_in || hd.n_out != e->n_out || hd.n_nodes != e->n_nodes)
    return xpu_fail(&qnn_reg, h, XPU_E_INCOMPATIBLE, "graph_prepare: cache made for another graph or other weights");
  uint64_t need = sizeof hd + n_io * sizeof(qnn_io) + (uint64_t)hd.n_nodes * 4;
  if (need > size - 8 || hd.qnn_size != size - 8 - need)
    return xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "graph_prepare: cache blob sizes are inconsistent");
  /* only the tensor ids come from the blob; the rest is derived from this IR again and must
   * agree, so a blob can never make an execution bind other sizes than the graph's */
  qnn_io *cached = malloc(n_io * sizeof(qnn_io));
  if (!cached) return xpu_fail(&qnn_reg, h, XPU_E_OUT_OF_MEMORY, "graph_prepare: out of memory");
  memcpy(cached, p + sizeof hd, n_io * sizeof(qnn_io));
  for (uint64_t i = 0; i < n_io; i++) e->io[i].qnn_id = cached[i].qnn_id;
  qnn_io_describe(ir, e->io);
  int same = memcmp(cached, e->io, n_io * sizeof(qnn_io)) == 0;
  free(cached);
  if (!same) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "graph_prepare: cache blob io table does not match the graph");
  memcpy(e->precision, p + sizeof hd + n_io * sizeof(qnn_io), (uint64_t)hd.n_nodes * 4);
  const QnnInterfaceTable_t *f = qnn_state.lib.fn;
  if (!f->contextCreateFromBinary || !f->graphRetrieve)
    return xpu_fail(&qnn_reg, h, XPU_E_UNSUPPORTED, "graph_prepare: the QNN backend cannot load context binaries");
  Qnn_ErrorHandle_t qe = f->contextCreateFromBinary(qnn_state.lib.backend, qnn_state.lib.device, NULL, p + need, hd.qnn_size, &e->qctx, NULL);
  if (qe != QNN_SUCCESS) {
    e->qctx = NULL;
    return xpu_fail(&qnn_reg, h, XPU_E_INCOMPATIBLE, "graph_prepare: contextCreateFromBinary: error %llu: %s",
                    (unsigned long long)qe, qnn_lib_errmsg(&qnn_state.lib, qe));
  }
  if ((qe = f->graphRetrieve(e->qctx, QNN_GRAPH_NAME, &e->graph)) != QNN_SUCCESS)
    return xpu_fail(&qnn_reg, h, XPU_E_INCOMPATIBLE, "graph_prepare: graphRetrieve: error %llu: %s", (unsigned long long)qe,
                    qnn_lib_errmsg(&qnn_state.lib, qe));
  return XPU_OK;
}

xpu_status graph_prepare(xpu_context ctx, const xpu_prepare_desc *d, xpu_executable *out) {
  qctx *c = xpu_reg_get(&qnn_reg, ctx, T_CTX);
  if (!c) return xpu_fail(&qnn_reg, ctx, XPU_E_INVALID_HANDLE, "graph_prepare: invalid context handle");
  if (!d || !out || d->struct_size < offsetof(xpu_prepare_desc, options))
    return xpu_fail(&qnn_reg, ctx, XPU_E_INVALID_ARG, "graph_prepare: null or short descriptor");
  const void *cache = d->struct_size >= offsetof(xpu_prepare_desc, cache_size) + 8 ? d->cache : NULL;
  uint64_t cache_size = cache ? d->cache_size : 0;
  xpu_ir_graph g;
  xpu_status st = parse_ir(ctx, d->ir, d->ir_size, &g, "graph_prepare");
  if (st != XPU_OK) return st;
  if (g.header->n_outputs == 0 || g.header->n_nodes == 0)
    return xpu_fail(&qnn_reg, ctx, XPU_E_INVALID_ARG, "graph_prepare: graph without nodes or outputs");
  for (uint32_t i = 0; i < g.header->n_outputs; i++)
    for (uint32_t j = 0; j < i; j++)
      if (g.outputs[i] == g.outputs[j])
        return xpu_fail(&qnn_reg, ctx, XPU_E_UNSUPPORTED, "graph_prepare: tensor %u is listed twice as an output", g.outputs[i]);
  qexe *e = calloc(1, sizeof *e);
  if (!e) return xpu_fail(&qnn_reg, ctx, XPU_E_OUT_OF_MEMORY, "graph_prepare: out of memory");
  pthread_mutex_init(&e->run_mu, NULL);
  atomic_init(&e->children, 0);
  e->ctx = ctx;
  e->owner = c;
  e->n_in = g.header->n_inputs;
  e->n_out = g.header->n_outputs;
  e->n_nodes = g.header->n_nodes;
  e->io = calloc((size_t)e->n_in + e->n_out, sizeof *e->io);
  e->precision = calloc(e->n_nodes, sizeof *e->precision);
  if (!e->io || !e->precision) {
    exe_free(e);
    return xpu_fail(&qnn_reg, ctx, XPU_E_OUT_OF_MEMORY, "graph_prepare: out of memory");
  }
  for (uint32_t i = 0; i < e->n_nodes; i++) {
    char reason[128];
    if (!qnn_node_check(&g, i, qnn_state.lib.target, &e->precision[i], reason, sizeof reason)) {
      exe_free(e);
      return xpu_fail(&qnn_reg, ctx, XPU_E_UNSUPPORTED, "graph_prepare: node %u (%s) is not supported: %s", i,
                      xpu_op_name(g.nodes[i].op), reason);
    }
  }
  char err[512];
  if ((st = ir_hash(ctx, &g, &e->ir_hash, err, sizeof err)) != XPU_OK) {
    exe_free(e);
    return xpu_fail(&qnn_reg, ctx, st, "graph_prepare: %s", err);
  }
  if (cache && cache_size) {
    if ((st = load_cache(ctx, e, &g, cache, cache_size)) != XPU_OK) {
      exe_free(e);
      return st;
    }
  } else {
    const QnnInterfaceTable_t *f = qnn_state.lib.fn;
    Qnn_ErrorHandle_t qe = f->contextCreate(qnn_state.lib.backend, qnn_state.lib.device, NULL, &e->qctx);
    if (qe != QNN_SUCCESS) {
      e->qctx = NULL;
      exe_free(e);
      return xpu_fail(&qnn_reg, ctx, XPU_E_INTERNAL, "graph_prepare: contextCreate: error %llu: %s", (unsigned long long)qe,
                      qnn_lib_errmsg(&qnn_state.lib, qe));
    }
    /* the HTP's graph configs: FP16 precision (below SDK 2.35 a graph without it is quantized and
     * FLOAT32 precision does not exist), all the VTCM there is, and optionally the HVX threads */
    QnnHtpGraph_CustomConfig_t hc[3];
    QnnGraph_Config_t gc[3];
    const QnnGraph_Config_t *gcl[4] = {NULL, NULL, NULL, NULL};
    memset(hc, 0, sizeof hc);
    memset(gc, 0, sizeof gc);
    uint32_t ncfg = 0;
    if (qnn_state.lib.target == QNN_BACKEND_ID_HTP) {
      hc[ncfg].option = QNN_HTP_GRAPH_CONFIG_OPTION_PRECISION;
      hc[ncfg++].precision = QNN_PRECISION_FLOAT16;
      hc[ncfg].option = QNN_HTP_GRAPH_CONFIG_OPTION_VTCM_SIZE_IN_MB;
      hc[ncfg++].vtcmSizeInMB = 0;
      if (c->hvx_threads > 0) {
        hc[ncfg].option = QNN_HTP_GRAPH_CONFIG_OPTION_NUM_HVX_THREADS;
        hc[ncfg++].numHvxThreads = c->hvx_threads;
      }
      for (uint32_t i = 0; i < ncfg; i++) {
        gc[i].option = QNN_GRAPH_CONFIG_OPTION_CUSTOM;
        gc[i].customConfig = &hc[i];
        gcl[i] = &gc[i];
      }
    }
    if ((qe = f->graphCreate(e->qctx, QNN_GRAPH_NAME, ncfg ? gcl : NULL, &e->graph)) != QNN_SUCCESS) {
      exe_free(e);
      return xpu_fail(&qnn_reg, ctx, XPU_E_INTERNAL, "graph_prepare: graphCreate: error %llu: %s", (unsigned long long)qe,
                      qnn_lib_errmsg(&qnn_state.lib, qe));
    }
    const_user u = {ctx};
    qnn_lower_cfg cfg = {&qnn_state.lib, e->graph, &g, const_bytes, &u, qnn_state.lib.target};
    if ((st = qnn_lower_graph(&cfg, e->io, err, sizeof err)) != XPU_OK) {
      exe_free(e);
      return xpu_fail(&qnn_reg, ctx, st, "graph_prepare: %s", err);
    }
  }
  *out = xpu_reg_add(&qnn_reg, T_EXE, e);
  if (!*out) {
    exe_free(e);
    return xpu_fail(&qnn_reg, ctx, XPU_E_OUT_OF_MEMORY, "graph_prepare: out of memory");
  }
  atomic_fetch_add(&c->children, 1);
  return XPU_OK;
}

xpu_status executable_serialize(xpu_executable h, void *dst, uint64_t cap, uint64_t *size) {
  qexe *e = xpu_reg_get(&qnn_reg, h, T_EXE);
  if (!e) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "executable_serialize: invalid executable handle");
  if (!size) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "executable_serialize: null size");
  const QnnInterfaceTable_t *f = qnn_state.lib.fn;
  if (!f->contextGetBinarySize || !f->contextGetBinary)
    return xpu_fail(&qnn_reg, h, XPU_E_UNSUPPORTED, "executable_serialize: the QNN backend has no context binaries");
  Qnn_ContextBinarySize_t qsize = 0;
  Qnn_ErrorHandle_t qe = f->contextGetBinarySize(e->qctx, &qsize);
  if (qe != QNN_SUCCESS)
    return xpu_fail(&qnn_reg, h, XPU_E_INTERNAL, "executable_serialize: contextGetBinarySize: error %llu: %s",
                    (unsigned long long)qe, qnn_lib_errmsg(&qnn_state.lib, qe));
  uint64_t n_io = (uint64_t)e->n_in + e->n_out;
  uint64_t head = sizeof(cache_header) + n_io * sizeof(qnn_io) + (uint64_t)e->n_nodes * 4;
  uint64_t total = head + qsize + 8; /* qsize is an upper bound: trimmed below */
  if (!dst) {
    *size = total;
    return XPU_OK;
  }
  if (cap < total) {
    *size = total;
    return xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "executable_serialize: needs %llu bytes, got %llu",
                    (unsigned long long)total, (unsigned long long)cap);
  }
  uint8_t *p = dst;
  Qnn_ContextBinarySize_t written = 0;
  if ((qe = f->contextGetBinary(e->qctx, p + head, qsize, &written)) != QNN_SUCCESS || written > qsize)
    return xpu_fail(&qnn_reg, h, XPU_E_INTERNAL, "executable_serialize: contextGetBinary: error %llu: %s",
                    (unsigned long long)qe, qnn_lib_errmsg(&qnn_state.lib, qe));
  cache_header hd;
  memset(&hd, 0, sizeof hd);
  hd.magic = QNN_CACHE_MAGIC;
  hd.version = QNN_CACHE_VERSION;
  XPU_STRCPY(hd.plugin_build, XPU_QNN_BUILD_ID);
  snprintf(hd.sdk_build, sizeof hd.sdk_build, "%s", qnn_state.lib.build_id);
  device_name(hd.device, sizeof hd.device);
  hd.ir_hash = e->ir_hash;
  hd.n_in = e->n_in;
  hd.n_out = e->n_out;
  hd.n_nodes = e->n_nodes;
  hd.qnn_size = written;
  memcpy(p, &hd, sizeof hd);
  memcpy(p + sizeof hd, e->io, n_io * sizeof(qnn_io));
  memcpy(p + sizeof hd + n_io * sizeof(qnn_io), e->precision, (uint64_t)e->n_nodes * 4);
  uint64_t sum = hash_bytes(1469598103934665603ull, p, head + written);
  memcpy(p + head + written, &sum, 8);
  *size = head + written + 8;
  return XPU_OK;
}

xpu_status executable_release(xpu_executable h) {
  qexe *e = xpu_reg_get(&qnn_reg, h, T_EXE);
  if (!e) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "executable_release: invalid executable handle");
  if (atomic_load(&e->children))
    return xpu_fail(&qnn_reg, h, XPU_E_BAD_STATE, "executable_release: %u executions still live", atomic_load(&e->children));
  if (!xpu_reg_remove(&qnn_reg, h, T_EXE)) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "executable_release: raced");
  atomic_fetch_sub(&e->owner->children, 1);
  exe_free(e);
  return XPU_OK;
}

/* ---------------------------------------------------------------- executions */

/* NULL-safe, so a partly allocated execution can be freed too */
static void exec_free(qexec *x) {
  if (!x) return;
  free(x->buf);
  free(x->off);
  free(x->mem);
  free(x->mem_buf);
  free(x);
}

xpu_status execution_create(xpu_executable h, xpu_execution *out) {
  qexe *e = xpu_reg_get(&qnn_reg, h, T_EXE);
  if (!e) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "execution_create: invalid executable handle");
  if (!out) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "execution_create: null output");
  size_t n = (size_t)e->n_in + e->n_out;
  qexec *x = calloc(1, sizeof *x);
  if (x) {
    x->buf = calloc(n, sizeof *x->buf);
    x->off = calloc(n, sizeof *x->off);
    x->mem = calloc(n, sizeof *x->mem);
    x->mem_buf = calloc(n, sizeof *x->mem_buf);
  }
  if (!x || !x->buf || !x->off || !x->mem || !x->mem_buf) {
    exec_free(x);
    return xpu_fail(&qnn_reg, h, XPU_E_OUT_OF_MEMORY, "execution_create: out of memory");
  }
  x->exe_h = h;
  x->exe = e;
  atomic_init(&x->in_flight, 0);
  *out = xpu_reg_add(&qnn_reg, T_EXEC, x);
  if (!*out) {
    exec_free(x);
    return xpu_fail(&qnn_reg, h, XPU_E_OUT_OF_MEMORY, "execution_create: out of memory");
  }
  atomic_fetch_add(&e->children, 1);
  return XPU_OK;
}

static void drop_mem(qexec *x, uint32_t io) {
  if (x->mem[io]) qnn_state.lib.fn->memDeRegister(&x->mem[io], 1);
  x->mem[io] = NULL;
  x->mem_buf[io] = 0;
}

xpu_status execution_bind(xpu_execution h, uint32_t io, xpu_buffer bh, uint64_t offset) {
  qexec *x = xpu_reg_get(&qnn_reg, h, T_EXEC);
  if (!x) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "execution_bind: invalid execution handle");
  if (atomic_load(&x->in_flight)) return xpu_fail(&qnn_reg, h, XPU_E_BAD_STATE, "execution_bind: execution in flight");
  qexe *e = x->exe;
  if (io >= e->n_in + e->n_out)
    return xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "execution_bind: io %u, the graph has %u", io, e->n_in + e->n_out);
  qbuf *b = xpu_reg_get(&qnn_reg, bh, T_BUF);
  if (!b) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "execution_bind: invalid buffer handle");
  if (b->ctx != e->ctx) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "execution_bind: buffer of another context");
  if (offset > b->size || e->io[io].nbytes > b->size - offset)
    return xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "execution_bind: io %u needs %llu bytes at offset %llu of a %llu-byte buffer",
                    io, (unsigned long long)e->io[io].nbytes, (unsigned long long)offset, (unsigned long long)b->size);
  if (x->mem_buf[io] != bh || x->off[io] != offset) drop_mem(x, io);
  x->buf[io] = bh;
  x->off[io] = offset;
  return XPU_OK;
}

/* Memory the backend reads in place is registered with memRegister, so no copy is made:
 * - on the HTP, rpcmem the plugin allocated, as the HTP's shared buffer (QNN_MEM_TYPE_CUSTOM with
 *   a QnnMemHtp_Descriptor_t: the whole rpcmem fd and this tensor's byte offset in it). An
 *   imported fd (a memfd from the host) is not in the DSP's SMMU: it is passed as a client
 *   buffer, which FastRPC copies (logged once). Our emulator maps any fd itself, so there fd
 *   imports are registered the same way, standing in for rpcmem.
 * - elsewhere (libQnnCpu), an fd whose first byte the tensor starts at, as ION memory. */
static void try_register(qexec *x, uint32_t io, qbuf *b) {
  const QnnInterfaceTable_t *f = qnn_state.lib.fn;
  if (x->mem[io] || b->fd < 0 || !f->memRegister || !f->memDeRegister) return;
  int htp = qnn_state.lib.target == QNN_BACKEND_ID_HTP;
  if (htp && !b->rpcmem && !qnn_state.lib.emulated) {
    static atomic_int told;
    if (!atomic_exchange(&told, 1))
      xpu_log(&qnn_reg, XPU_LOG_WARN, "qnn: fd %d is not rpcmem: the HTP reads it through a FastRPC copy "
              "(buffers the plugin allocates are rpcmem when libcdsprpc.so is present)", b->fd);
    return;
  }
  if (!htp && b->fd_offset + x->off[io] != 0) return;
  qnn_io *d = &x->exe->io[io];
  Qnn_MemDescriptor_t md;
  QnnMemHtp_Descriptor_t hd;
  memset(&md, 0, sizeof md);
  memset(&hd, 0, sizeof hd);
  md.memShape.numDim = d->rank;
  md.memShape.dimSize = d->dims;
  md.dataType = d->dtype;
  if (htp) {
    hd.type = QNN_HTP_MEM_SHARED_BUFFER;
    hd.size = b->fd_offset + b->size;
    hd.sharedBufferConfig.fd = b->fd;
    hd.sharedBufferConfig.offset = b->fd_offset + x->off[io];
    md.memType = QNN_MEM_TYPE_CUSTOM;
    md.customInfo = &hd;
  } else {
    md.memType = QNN_MEM_TYPE_ION;
    md.ionInfo.fd = b->fd;
  }
  Qnn_MemHandle_t mh = NULL;
  if (f->memRegister(x->exe->qctx, &md, 1, &mh) == QNN_SUCCESS && mh) {
    x->mem[io] = mh;
    x->mem_buf[io] = x->buf[io];
  } else {
    xpu_log(&qnn_reg, XPU_LOG_DEBUG, "qnn: memRegister refused fd %d; passing the mapped pointer", b->fd);
  }
}

xpu_status exec_pin(xpu_execution h, qexec *x, qbuf **bufs, const char *what) {
  uint32_t n = x->exe->n_in + x->exe->n_out;
  for (uint32_t i = 0; i < n; i++) {
    qbuf *b = x->buf[i] ? xpu_reg_get(&qnn_reg, x->buf[i], T_BUF) : NULL;
    if (!b) {
      exec_unpin(bufs, i);
      if (!x->buf[i]) return xpu_fail(&qnn_reg, h, XPU_E_BAD_STATE, "%s: io %u is not bound", what, i);
      return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "%s: io %u: its buffer was released", what, i);
    }
    atomic_fetch_add(&b->busy, 1);
    bufs[i] = b;
  }
  return XPU_OK;
}

void exec_unpin(qbuf **bufs, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) atomic_fetch_sub(&bufs[i]->busy, 1);
}

xpu_status exec_pinned(xpu_execution h, qexec *x, qbuf **bufs, const char *what) {
  qexe *e = x->exe;
  uint32_t n = e->n_in + e->n_out;
  Qnn_Tensor_t *ts = calloc(n, sizeof *ts);
  char (*names)[16] = calloc(n, 16);
  xpu_status st = XPU_OK;
  if (!ts || !names) {
    st = xpu_fail(&qnn_reg, h, XPU_E_OUT_OF_MEMORY, "%s: out of memory", what);
    goto done;
  }
  for (uint32_t i = 0; i < n; i++) {
    qnn_io *d = &e->io[i];
    uint8_t *p = bufs[i]->ptr + x->off[i];
    if (d->ids_rows > 0) { /* the NPU would read out of bounds: the ABI wants INVALID_ARG */
      for (uint64_t k = 0; k < d->nbytes / 4; k++) {
        int32_t id;
        memcpy(&id, p + 4 * k, 4);
        if (id < 0 || id >= d->ids_rows) {
          st = xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "%s: GET_ROWS id %d outside [0, %lld)", what, id,
                        (long long)d->ids_rows);
          goto done;
        }
      }
    }
    try_register(x, i, bufs[i]);
    Qnn_TensorV1_t *v = &ts[i].v1;
    ts[i].version = QNN_TENSOR_VERSION_1;
    snprintf(names[i], 16, "t%u", d->xpu_tensor);
    v->id = d->qnn_id;
    v->name = names[i];
    v->type = i < e->n_in ? QNN_TENSOR_TYPE_APP_WRITE : QNN_TENSOR_TYPE_APP_READ;
    v->dataFormat = QNN_TENSOR_DATA_FORMAT_DENSE;
    v->dataType = d->dtype;
    v->quantizeParams.encodingDefinition = QNN_DEFINITION_UNDEFINED;
    v->quantizeParams.quantizationEncoding = QNN_QUANTIZATION_ENCODING_UNDEFINED;
    if (d->dtype == QNN_DATATYPE_SFIXED_POINT_8) {
      v->quantizeParams.encodingDefinition = QNN_DEFINITION_DEFINED;
      v->quantizeParams.quantizationEncoding = QNN_QUANTIZATION_ENCODING_SCALE_OFFSET;
      v->quantizeParams.scaleOffsetEncoding.scale = d->scale;
      v->quantizeParams.scaleOffsetEncoding.offset = d->offset;
    }
    v->rank = d->rank;
    v->dimensions = d->dims;
    if (x->mem[i]) {
      v->memType = QNN_TENSORMEMTYPE_MEMHANDLE;
      v->memHandle = x->mem[i];
    } else {
      v->memType = QNN_TENSORMEMTYPE_RAW;
      v->clientBuf.data = p;
      v->clientBuf.dataSize = (uint32_t)d->nbytes;
    }
  }
  pthread_mutex_lock(&e->run_mu);
  Qnn_ErrorHandle_t qe = qnn_state.lib.fn->graphExecute(e->graph, ts, e->n_in, ts + e->n_in, e->n_out, NULL, NULL);
  pthread_mutex_unlock(&e->run_mu);
  if (qe != QNN_SUCCESS) {
    xpu_status code = qe == QNN_GRAPH_ERROR_GRAPH_NOT_FINALIZED ? XPU_E_BAD_STATE
                      : qe == QNN_COMMON_ERROR_INVALID_ARGUMENT ? XPU_E_INVALID_ARG
                                                                 : XPU_E_INTERNAL;
    st = xpu_fail(&qnn_reg, h, code, "%s: graphExecute: error %llu: %s", what, (unsigned long long)qe,
                  qnn_lib_errmsg(&qnn_state.lib, qe));
  }
done:
  free(ts);
  free(names);
  return st;
}

static xpu_status run_now(xpu_execution h, qexec *x) {
  uint32_t n = x->exe->n_in + x->exe->n_out;
  qbuf **bufs = calloc(n, sizeof *bufs);
  if (!bufs) return xpu_fail(&qnn_reg, h, XPU_E_OUT_OF_MEMORY, "execution_run: out of memory");
  xpu_status st = exec_pin(h, x, bufs, "execution_run");
  if (st == XPU_OK) {
    st = exec_pinned(h, x, bufs, "execution_run");
    exec_unpin(bufs, n);
  }
  free(bufs);
  return st;
}

xpu_status execution_run(xpu_execution h) {
  qexec *x = xpu_reg_get(&qnn_reg, h, T_EXEC);
  if (!x) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "execution_run: invalid execution handle");
  int expect = 0;
  if (!atomic_compare_exchange_strong(&x->in_flight, &expect, 1))
    return xpu_fail(&qnn_reg, h, XPU_E_BAD_STATE, "execution_run: execution already in flight");
  xpu_status st = run_now(h, x);
  atomic_store(&x->in_flight, 0);
  return st;
}

xpu_status execution_release(xpu_execution h) {
  qexec *x = xpu_reg_get(&qnn_reg, h, T_EXEC);
  if (!x) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "execution_release: invalid execution handle");
  if (atomic_load(&x->in_flight)) return xpu_fail(&qnn_reg, h, XPU_E_BAD_STATE, "execution_release: execution in flight");
  if (!xpu_reg_remove(&qnn_reg, h, T_EXEC)) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "execution_release: raced");
  for (uint32_t i = 0; i < x->exe->n_in + x->exe->n_out; i++) drop_mem(x, i);
  atomic_fetch_sub(&x->exe->children, 1);
  exec_free(x);
  return XPU_OK;
}

/* asynchronous (XPU_CAP_ASYNC): checks and pins now, queues the rest for the worker thread; the
 * fences it names are referenced until the submission is done */
xpu_status execution_submit(xpu_execution h, const xpu_fence_point *waits, uint32_t n_waits,
                            const xpu_fence_point *signal) {
  qexec *x = xpu_reg_get(&qnn_reg, h, T_EXEC);
  if (!x) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "execution_submit: invalid execution handle");
  if (n_waits && !waits) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "execution_submit: null waits");
  if (n_waits > 1024) return xpu_fail(&qnn_reg, h, XPU_E_INVALID_ARG, "execution_submit: %u wait points", n_waits);
  int expect = 0;
  if (!atomic_compare_exchange_strong(&x->in_flight, &expect, 1))
    return xpu_fail(&qnn_reg, h, XPU_E_BAD_STATE, "execution_submit: execution already in flight");
  uint32_t n = x->exe->n_in + x->exe->n_out, held = 0;
  qbuf **bufs = calloc(n, sizeof *bufs);
  qfence **wf = calloc(n_waits ? n_waits : 1, sizeof *wf);
  qfence *sig = NULL;
  xpu_status st = XPU_OK;
  if (!bufs || !wf) st = xpu_fail(&qnn_reg, h, XPU_E_OUT_OF_MEMORY, "execution_submit: out of memory");
  if (st == XPU_OK && signal && !(sig = fence_ref(signal->fence)))
    st = xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "execution_submit: invalid signal fence");
  for (; st == XPU_OK && held < n_waits; held++)
    if (!(wf[held] = fence_ref(waits[held].fence)))
      st = xpu_fail(&qnn_reg, h, XPU_E_INVALID_HANDLE, "execution_submit: invalid wait fence %u", held);
  if (st == XPU_OK) st = exec_pin(h, x, bufs, "execution_submit");
  if (st == XPU_OK) {
    st = queue_submit(h, x, bufs, waits, n_waits, wf, sig, signal ? signal->value : 0);
    if (st == XPU_OK) return XPU_OK; /* the queue owns bufs, wf and the references now */
    exec_unpin(bufs, n);
  }
  for (uint32_t i = 0; i < held; i++)
    if (wf[i]) fence_unref(wf[i]);
  if (sig) fence_unref(sig);
  free(bufs);
  free(wf);
  atomic_store(&x->in_flight, 0);
  return st;
}
