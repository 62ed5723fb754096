/*
 * qnn_internal.h: what the files of libxpu-qnn.so share. qnn_plugin.c holds the ABI entry
 * points and the object model; qnn_lib.c finds and opens the QNN backend library; qnn_lower.c
 * turns xpu IR nodes into QNN ops (and answers op_support / graph_analyze from the same rules).
 */
#ifndef XPU_QNN_INTERNAL_H
#define XPU_QNN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "qnn_api.h"
#include "xpu_ir.h"
#include "xpu_plugin.h"

/* the QNN backend library, opened once per process (the host never dlcloses a plugin) */
typedef struct qnn_lib {
  void *dl;
  const QnnInterface_t *iface;
  const QnnInterfaceTable_t *fn;
  char path[512];
  char provider[128];
  char build_id[128];
  uint32_t backend_id;
  /* the backend whose rules the plugin builds for: the backend id, or for our emulator the
   * profile its provider name announces ("XPU_QNN_EMULATOR/HTP" or "/CPU") */
  uint32_t target;
  int emulated; /* our clean-room provider, not Qualcomm's: results say so */
  Qnn_LogHandle_t log;
  Qnn_BackendHandle_t backend;
  Qnn_DeviceHandle_t device;
  uint32_t power_id; /* the HTP power-config id voted on (0: none) */
  int power_mode;    /* the vote cast: QNN_PERF_* */
} qnn_lib;

/* the HTP power votes (context option perf=burst|balanced|off) */
enum { QNN_PERF_BURST, QNN_PERF_BALANCED, QNN_PERF_OFF };
/* parses a perf option value; -1 if unknown */
int qnn_perf_mode(const char *s);
/* re-votes the HTP's power when mode differs from the vote cast (HTP targets only) */
void qnn_lib_power(qnn_lib *l, int mode);

/* finds the library (XPU_QNN_LIBRARY, $QNN_SDK_ROOT/lib/<arch>/, beside the plugin); fills
 * path or a reason. Does not open it. */
int qnn_lib_find(const char *plugin_dir, char *path, size_t cap, char *reason, size_t rcap);
/* dlopens path, reads the provider table and checks the API version; no QNN call */
xpu_status qnn_lib_load(qnn_lib *l, const char *path, char *err, size_t cap);
/* creates the log, backend and device (the first context_create does it) */
xpu_status qnn_lib_start(qnn_lib *l, char *err, size_t cap);
void qnn_lib_stop(qnn_lib *l);
/* the core API minor version the opened backend reports (QNN_API_MINOR_PINNED before one is
 * open): the HTP op profile depends on it (qnn_api.h, QNN_API_MINOR_SDK_*) */
uint32_t qnn_api_minor(void);
/* the message QNN has for an error code */
const char *qnn_lib_errmsg(const qnn_lib *l, Qnn_ErrorHandle_t e);

/* ---------------------------------------------------------------- lowering */

/* one graph input or output as QNN sees it: what execution_bind and execute need */
typedef struct qnn_io {
  uint32_t xpu_tensor; /* IR tensor index */
  uint32_t qnn_id;
  Qnn_DataType_t dtype;
  float scale;
  int32_t offset;
  uint32_t rank;
  uint32_t dims[XPU_MAX_RANK];
  uint64_t nbytes;
  int64_t ids_rows; /* > 0: an I32 GET_ROWS index input; every id must be in [0, ids_rows) */
} qnn_io;

/* resolves a constant's (buffer, offset) to bytes; NULL with a message if invalid */
typedef const void *(*qnn_const_fn)(void *user, uint64_t buffer, uint64_t offset, uint64_t size,
                                    char *err, size_t cap);

typedef struct qnn_lower_cfg {
  const qnn_lib *lib;     /* NULL: analysis only, nothing is emitted */
  Qnn_GraphHandle_t graph;
  const xpu_ir_graph *ir;
  qnn_const_fn const_bytes;
  void *const_user;
  uint32_t target;   /* QNN_BACKEND_ID_HTP or _CPU (another id: CPU rules) */
} qnn_lower_cfg;

/* positions a ROPE can rotate: its cos/sin come from two static tables gathered by
 * pos / QNN_ROPE_SPLIT and pos % QNN_ROPE_SPLIT (angle addition), so the HTP never evaluates a
 * large angle in FP16; positions outside [0, QNN_ROPE_MAX_POS) fail execution with INVALID_ARG */
#define QNN_ROPE_SPLIT 64
#define QNN_ROPE_MAX_POS (QNN_ROPE_SPLIT * 2048)

/* verdict for one node on a target backend (QNN_BACKEND_ID_HTP or _CPU): 1 supported
 * (precision set), 0 refused (reason set, naming the backend rule) */
int qnn_node_check(const xpu_ir_graph *ir, uint32_t node, uint32_t target, uint32_t *precision, char *reason,
                   size_t cap);
/* static op_support answer */
uint32_t qnn_op_query(const xpu_op_query *q, uint32_t target);
/* emits the whole graph; io has n_inputs + n_outputs entries. Returns XPU_OK or an error with
 * a message. */
xpu_status qnn_lower_graph(const qnn_lower_cfg *cfg, qnn_io *io, char *err, size_t cap);
/* fills io (n_inputs + n_outputs entries) from the IR alone, keeping each entry's qnn_id: what
 * execution needs besides the ids the backend assigned */
void qnn_io_describe(const xpu_ir_graph *ir, qnn_io *io);
/* the QNN description of an IR tensor's dtype and scale, for execution-time tensors */
Qnn_DataType_t qnn_dtype_of(uint32_t xpu_dtype);

#endif /* XPU_QNN_INTERNAL_H */
