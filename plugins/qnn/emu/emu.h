/*
 * emu.h: internals of libQnnXpuEmu.so, the clean-room QNN provider xpu tests against. The object
 * model mirrors QNN: backend -> device -> context -> graphs -> tensors and nodes; memory
 * registrations belong to a context. Handles given to the caller are pointers to these objects,
 * as in QNN, but every entry point checks them against the emulator's live-object list first,
 * so a stale or foreign handle is an error, never a crash.
 */
#ifndef XPU_QNN_EMU_H
#define XPU_QNN_EMU_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "../src/qnn_api.h"

#define EMU_MAX_RANK 6
#define EMU_MAX_IO 16
#define EMU_MAX_PARAMS 8

enum {
  EMU_OBJ_BACKEND = 0x45424B31, /* magic per object kind */
  EMU_OBJ_DEVICE = 0x45444531,
  EMU_OBJ_CONTEXT = 0x45435831,
  EMU_OBJ_GRAPH = 0x45475231,
  EMU_OBJ_MEM = 0x454D4531,
  EMU_OBJ_LOG = 0x454C4731,
};

/* the op list of README.md */
typedef enum {
  EMU_OP_ADD = 1, EMU_OP_SUB, EMU_OP_MUL, EMU_OP_DIV, EMU_OP_MAX,
  EMU_OP_EXP, EMU_OP_NEG, EMU_OP_SIN, EMU_OP_COS, EMU_OP_RELU, EMU_OP_SIGMOID,
  EMU_OP_SOFTMAX, EMU_OP_RMSNORM, EMU_OP_LAYERNORM, EMU_OP_MATMUL, EMU_OP_GATHER,
  EMU_OP_RESHAPE, EMU_OP_TRANSPOSE, EMU_OP_STRIDEDSLICE, EMU_OP_CONCAT,
  EMU_OP_CAST, EMU_OP_QUANTIZE, EMU_OP_DEQUANTIZE, EMU_OP_GREATER_EQUAL, EMU_OP_SELECT, EMU_OP_FC,
  EMU_OP_TANH, /* appended: context binaries store the op by number */
} emu_op;

/* which real backend the emulator imitates (XPU_QNN_EMU_PROFILE=htp|cpu, read once; htp by default):
 * the op/dtype/rank table of emu_rules.c, the graph configs accepted, and the arithmetic */
typedef enum { EMU_PROFILE_HTP = 1, EMU_PROFILE_CPU = 2 } emu_profile;
emu_profile emu_profile_get(void);
/* the core API minor version the emulator reports (XPU_QNN_EMU_API_VERSION, else the newest
 * whose HTP rules it models): the HTP rules depend on it */
uint32_t emu_api_minor(void);
const char *emu_profile_name(emu_profile p);

typedef struct emu_tensor {
  uint32_t id;
  char name[64];
  Qnn_TensorType_t type;
  Qnn_DataType_t dtype;
  float scale; /* SFIXED_POINT_8/16/32: real = scale * (q + offset) */
  int32_t offset;
  /* AXIS_SCALE_OFFSET (static SFIXED_POINT_8 only, offsets 0): one scale per index of axis */
  int32_t axis;
  uint32_t n_axis_scales;
  float *axis_scales;
  uint32_t rank;
  uint32_t dims[EMU_MAX_RANK];
  uint64_t numel;
  uint64_t nbytes;
  uint8_t *data;   /* STATIC: a copy of the client's bytes; NATIVE: storage made at finalize */
  int produced;    /* some node writes it */
  int consumed;
} emu_tensor;

typedef struct emu_node {
  char name[64];
  emu_op op;
  uint32_t n_in, n_out;
  uint32_t in[EMU_MAX_IO];  /* tensor indices in the graph */
  uint32_t out[EMU_MAX_IO];
  /* the parameters this emulator understands, decoded at addNode */
  int32_t axis;
  float beta, epsilon;
  uint8_t transpose_in0, transpose_in1;
  uint32_t perm[EMU_MAX_RANK];
  int32_t ranges[EMU_MAX_RANK][3];
} emu_node;

struct emu_context;

typedef struct emu_graph {
  uint32_t magic;
  struct emu_context *ctx;
  char name[64];
  emu_tensor *tensors;
  uint32_t n_tensors, cap_tensors;
  emu_node *nodes;
  uint32_t n_nodes, cap_nodes;
  int finalized;
  int fp16;              /* HTP profile with PRECISION = FLOAT16: float values are rounded to half */
  int precision_set;     /* a PRECISION graph config was given */
  uint32_t vtcm_mb, hvx_threads;
  pthread_mutex_t run_mu; /* NATIVE storage is per graph: one execute at a time */
} emu_graph;

typedef struct emu_mem {
  uint32_t magic;
  struct emu_context *ctx;
  void *ptr;         /* the tensor's bytes: map + offset */
  uint64_t size;     /* the tensor's bytes */
  void *map;         /* what was mmap'ed: the whole fd */
  uint64_t map_size;
  Qnn_DataType_t dtype;
  uint32_t rank;
  uint32_t dims[EMU_MAX_RANK];
} emu_mem;

typedef struct emu_context {
  uint32_t magic;
  emu_graph **graphs;
  uint32_t n_graphs;
  uint32_t n_mems; /* live registrations: contextFree refuses while any is live */
} emu_context;

/* live-object list (the emulator's only global state) */
void emu_live_add(void *obj);
void emu_live_remove(void *obj);
int emu_live_has(const void *obj, uint32_t magic);

/* ops: parsing of node configs, shape rules and kernels (emu_ops.c) */
int emu_op_from_name(const char *type);
const char *emu_op_name(emu_op op);
/* decodes params, checks dtypes and output shapes; returns 0 or an error code with msg */
Qnn_ErrorHandle_t emu_node_check(const emu_graph *g, emu_node *n, const Qnn_OpConfigV1_t *cfg,
                                 char *msg, size_t cap);
/* runs one node; ptr[i] is tensor i's bytes for this execution */
Qnn_ErrorHandle_t emu_node_run(const emu_graph *g, const emu_node *n, uint8_t *const *ptr,
                               char *msg, size_t cap);
int emu_dtype_ok(Qnn_DataType_t dt);
/* the profile's published op-support rule for a node: dtypes of in[0..2]/out[0] and max rank;
 * 0 or QNN_GRAPH_ERROR_INVALID_OP_CONFIG with the rule that refuses it in msg */
Qnn_ErrorHandle_t emu_rule_check(const emu_graph *g, const emu_node *n, char *msg, size_t cap);
/* rounds a float to the nearest half (what an FP16 graph on the HTP stores) */
float emu_round_half(float v);

/* objects shared by emu.c and emu_binary.c */
emu_context *context_new(void);
void context_free(emu_context *c);
emu_graph *graph_new(emu_context *c, const char *name);
Qnn_ErrorHandle_t graph_alloc_native(emu_graph *g);

/* context binaries (emu_binary.c) */
Qnn_ErrorHandle_t contextGetBinarySize(Qnn_ContextHandle_t ctx, Qnn_ContextBinarySize_t *size);
Qnn_ErrorHandle_t contextGetBinary(Qnn_ContextHandle_t ctx, void *buf, Qnn_ContextBinarySize_t cap,
                                   Qnn_ContextBinarySize_t *written);
Qnn_ErrorHandle_t contextCreateFromBinary(Qnn_BackendHandle_t be, Qnn_DeviceHandle_t dev,
                                          const QnnContext_Config_t **cfg, const void *buf,
                                          Qnn_ContextBinarySize_t size, Qnn_ContextHandle_t *out,
                                          Qnn_ProfileHandle_t prof);

/* records the message of the last failure, returned by errorGetMessage */
Qnn_ErrorHandle_t emu_err(Qnn_ErrorHandle_t code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif /* XPU_QNN_EMU_H */
