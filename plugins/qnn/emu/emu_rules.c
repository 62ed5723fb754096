/*
 * emu_rules.c: the op-support rules a real QNN backend applies at graphAddNode, written from the
 * QNN documentation of SDK 2.25 (the SDK xpu pins), plus the HTP configurations later SDKs added,
 * each from the API version that carries it (see `added`): "HTP Backend Op Definition Supplement"
 * (docs/QNN/OpDef/HtpOpDefSupplement.html) and "CPU Backend Op Definition Supplement"
 * (CpuOpDefSupplement.html), with the op definitions of MasterOpDef.html. Our own table, not a
 * copy: only the ops the xpu plugin may emit, and of each op only the data types the emulator
 * knows (FLOAT_32, FLOAT_16, INT_32, UINT_32, SFIXED_POINT_8, SFIXED_POINT_32, BOOL_8).
 *
 * A rule lists signatures "R:abcd": R the maximum rank of that configuration's inputs and output,
 * then the data types of in[0], in[1], in[2] and out[0], one letter each:
 *   h FLOAT_16, f FLOAT_32, i INT_32, u UINT_32, q SFIXED_POINT_8, Q SFIXED_POINT_32, b BOOL_8,
 *   '-' no such input (an optional input, when given, must match a signature's letter; '*' any).
 * A node passes when one signature matches all of its tensors.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/qnn_half.h"
#include "emu.h"

static emu_profile profile_v;
static pthread_once_t profile_once = PTHREAD_ONCE_INIT;

static void profile_init(void) {
  const char *v = getenv("XPU_QNN_EMU_PROFILE");
  profile_v = v && strcmp(v, "cpu") == 0 ? EMU_PROFILE_CPU : EMU_PROFILE_HTP;
}

emu_profile emu_profile_get(void) {
  pthread_once(&profile_once, profile_init);
  return profile_v;
}

const char *emu_profile_name(emu_profile p) { return p == EMU_PROFILE_CPU ? "CPU" : "HTP"; }

float emu_round_half(float v) { return qnn_half_to_float(qnn_float_to_half(v)); }

typedef struct {
  emu_op op;
  const char *htp; /* NULL: the backend has no such op */
  const char *cpu;
} emu_rule;

/* From the HTP supplement (configurations FP16 / INT8 / OTHERS) and the CPU supplement (fp32 /
 * int8 configurations; the CPU's int8 ops take UFIXED_POINT_8, which xpu never emits). */
static const emu_rule rules[] = {
    {EMU_OP_ADD, "5:hh-h 5:ff-f 5:qq-q 5:ii-i", "5:ff-f 5:ii-i"},
    {EMU_OP_SUB, "5:hh-h 5:ff-f 5:qq-q 5:ii-i", "5:ff-f 5:ii-i"},
    {EMU_OP_MUL, "5:hh-h 5:ff-f 5:qq-q 5:ii-i 5:uu-u", "5:ff-f 5:ii-i 5:uu-u"},
    {EMU_OP_DIV, "5:hh-h 5:ff-f 5:ii-i", "5:ff-f 5:ii-i"},
    {EMU_OP_MAX, "4:hh-h 4:ff-f 5:qq-q", "5:ff-f 5:ii-i"},
    {EMU_OP_GREATER_EQUAL, "4:hh-b 4:ff-b 5:qq-q 5:qq-b 5:ii-b", "5:ff-b 5:ii-b"},
    {EMU_OP_SELECT, "4:bhhh 4:bfff 5:bqqq 5:biii", "5:bfff 5:biii"},
    {EMU_OP_EXP, "4:h--h 4:f--f 5:q--q", "5:f--f"},
    {EMU_OP_NEG, "4:h--h 4:f--f", "5:f--f 5:i--i"},
    {EMU_OP_SIN, "4:h--h 4:f--f 4:q--q", "5:f--f"},
    {EMU_OP_COS, "4:h--h 4:f--f 4:q--q", "5:f--f"},
    {EMU_OP_RELU, "5:h--h 5:f--f 5:q--q", "5:f--f"},
    {EMU_OP_SIGMOID, "4:h--h 4:f--f 5:q--q", "5:f--f"},
    {EMU_OP_TANH, "4:h--h 4:f--f 5:q--q", "5:f--f"},
    {EMU_OP_SOFTMAX, "5:h--h 5:f--f 5:q--q 5:q--f", "5:f--f"},
    {EMU_OP_RMSNORM, "4:hhhh 4:ffff", "5:ffff 5:ff-f"},
    {EMU_OP_LAYERNORM, "4:hhhh 4:ffff", "5:ffff 5:ff-f"},
    {EMU_OP_MATMUL, "4:hh-h 4:hhhh 4:ff-f 4:ffff 4:qq-q 4:qqQq", "5:ff-f 5:ffff"},
    {EMU_OP_FC, "4:hh-h 4:hhhh 4:ff-f 4:ffff 4:qq-q 4:qqQq", "5:ff-f 5:ffff"},
    {EMU_OP_GATHER, "5:hi-h 5:hu-h 5:fi-f 5:fu-f 5:qi-q 5:qu-q 5:ii-i 5:iu-i 5:uu-u 5:ui-u",
     "5:fi-f 5:fu-f 5:ii-i 5:iu-i 5:bi-b 5:bu-b"},
    {EMU_OP_RESHAPE, "5:h--h 5:f--f 5:q--q 5:i--i 5:u--u 5:b--b", "5:f--f 5:i--i 5:u--u 5:b--b"},
    {EMU_OP_TRANSPOSE, "5:h--h 5:f--f 5:q--q 5:i--i 5:u--u 5:b--b", "5:f--f 5:i--i 5:u--u 5:b--b"},
    {EMU_OP_STRIDEDSLICE, "5:h--h 5:f--f 5:q--q 5:i--i", "5:f--f 5:i--i 5:u--u"},
    {EMU_OP_CONCAT, "5:h--h 5:f--f 5:q--q 5:i--i 5:u--u", "5:f--f 5:i--i 5:u--u"},
    {EMU_OP_CAST,
     "4:h--i 4:h--h 4:h--f 4:f--h 4:q--i 4:q--f 4:q--b 4:q--q 4:b--q 4:b--b 4:b--i 4:b--f 4:b--h "
     "4:i--q 4:i--b 4:i--u 4:i--i 4:i--f 4:i--h 4:u--u 4:u--i 4:u--f 4:f--q 4:f--b 4:f--i 4:f--f",
     "5:f--f 5:f--i 5:f--u 5:f--b 5:f--h 5:i--f 5:i--i 5:i--u 5:i--b 5:i--h 5:u--f 5:u--i 5:b--f 5:b--i "
     "5:b--b 5:h--f 5:q--f 5:q--i 5:f--q"},
    {EMU_OP_QUANTIZE, "5:h--q", "5:f--q"},
    {EMU_OP_DEQUANTIZE, "5:q--f", "5:q--f 5:Q--f"},
};

/* HTP configurations added after SDK 2.25, by the core API version that carries them
 * (../src/qnn_api.h): a node may use one only when the emulator reports that version or later
 * (XPU_QNN_EMU_API_VERSION; by default the newest modelled here). */
typedef struct {
  emu_op op;
  uint32_t api_minor;
  const char *htp;
} emu_rule_added;

static const emu_rule_added added[] = {
    /* Quantize from FLOAT_32, Dequantize to FLOAT_16 (HTP op revision history, SDK 2.39) */
    {EMU_OP_QUANTIZE, QNN_API_MINOR_SDK_2_39, "5:f--q"},
    {EMU_OP_DEQUANTIZE, QNN_API_MINOR_SDK_2_39, "5:q--h"},
    /* 16-bit signed outputs (SDK 2.39): qq-s, 8-bit operands and a 16-bit output (the "INT8"
     * configuration with a 16-bit activation output, as mllm-NPU's W8A8 runs; our reading, not
     * checked on hardware), and Dequantize reading them */
    {EMU_OP_MATMUL, QNN_API_MINOR_SDK_2_39, "4:qq-s"},
    {EMU_OP_DEQUANTIZE, QNN_API_MINOR_SDK_2_39, "5:s--h 5:s--f"},
    /* ElementWiseDivide on SFIXED_POINT_8 (SDK 2.44) */
    {EMU_OP_DIV, QNN_API_MINOR_SDK_2_44, "5:qq-q"},
};

static int sig_matches(const char *sig, const char *have);

/* scans one signature list; sets *ok and raises *max_rank for each signature that matches */
static void scan_sigs(const char *sigs, const char *have, int *ok, uint32_t *max_rank) {
  for (const char *s = sigs; *s;) {
    uint32_t rk = (uint32_t)(s[0] - '0');
    if (sig_matches(s + 2, have)) {
      *ok = 1;
      if (rk > *max_rank) *max_rank = rk;
    }
    s += 6;
    while (*s == ' ') s++;
  }
}

static char dt_letter(Qnn_DataType_t dt) {
  switch (dt) {
  case QNN_DATATYPE_FLOAT_16: return 'h';
  case QNN_DATATYPE_FLOAT_32: return 'f';
  case QNN_DATATYPE_INT_32: return 'i';
  case QNN_DATATYPE_UINT_32: return 'u';
  case QNN_DATATYPE_SFIXED_POINT_8: return 'q';
  case QNN_DATATYPE_SFIXED_POINT_32: return 'Q';
  case QNN_DATATYPE_SFIXED_POINT_16: return 's';
  case QNN_DATATYPE_BOOL_8: return 'b';
  default: return '?';
  }
}

static int sig_matches(const char *sig, const char *have) {
  for (int i = 0; i < 4; i++)
    if (sig[i] != '*' && sig[i] != have[i]) return 0;
  return 1;
}

Qnn_ErrorHandle_t emu_rule_check(const emu_graph *g, const emu_node *n, char *msg, size_t cap) {
  emu_profile prof = emu_profile_get();
  const emu_rule *r = NULL;
  for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
    if (rules[i].op == n->op) r = &rules[i];
  const char *sigs = r ? (prof == EMU_PROFILE_CPU ? r->cpu : r->htp) : NULL;
  if (!sigs) {
    snprintf(msg, cap, "node %s: %s is not supported by the %s backend", n->name, emu_op_name(n->op),
             emu_profile_name(prof));
    return QNN_GRAPH_ERROR_INVALID_OP_CONFIG;
  }
  /* in[0], in[1], in[2], out[0]; an op with more inputs (Concat) is checked on in[0]: the
   * shape rules make the others agree with it */
  char have[5] = "----";
  uint32_t rank = g->tensors[n->out[0]].rank;
  for (uint32_t i = 0; i < n->n_in && i < 3; i++) {
    const emu_tensor *t = &g->tensors[n->in[i]];
    have[i] = dt_letter(t->dtype);
    if (t->rank > rank) rank = t->rank;
  }
  if (n->op == EMU_OP_CONCAT) have[1] = have[2] = '-';
  have[3] = dt_letter(g->tensors[n->out[0]].dtype);
  int dtype_ok = 0;
  uint32_t max_rank = 0;
  scan_sigs(sigs, have, &dtype_ok, &max_rank);
  if (prof == EMU_PROFILE_HTP)
    for (size_t i = 0; i < sizeof added / sizeof added[0]; i++)
      if (added[i].op == n->op && emu_api_minor() >= added[i].api_minor) scan_sigs(added[i].htp, have, &dtype_ok, &max_rank);
  if (!dtype_ok) {
    snprintf(msg, cap,
             "node %s: %s with data types in/out \"%s\" (h F16, f F32, i I32, u U32, q SFIXED_8, s SFIXED_16, "
             "Q SFIXED_32, "
             "b BOOL_8) is not in the %s op support table (%s)",
             n->name, emu_op_name(n->op), have, emu_profile_name(prof), sigs);
    return QNN_GRAPH_ERROR_INVALID_OP_CONFIG;
  }
  if (rank > max_rank) {
    snprintf(msg, cap, "node %s: %s of rank %u: the %s supports rank <= %u for these data types", n->name,
             emu_op_name(n->op), rank, emu_profile_name(prof), max_rank);
    return QNN_GRAPH_ERROR_INVALID_OP_CONFIG;
  }
  if (prof == EMU_PROFILE_HTP) {
    int has_float = 0;
    for (int i = 0; i < 4; i++) has_float |= have[i] == 'h' || have[i] == 'f';
    if (has_float && !g->fp16) {
      snprintf(msg, cap,
               "node %s: %s has float tensors in a graph without the HTP graph config PRECISION = FLOAT16 "
               "(below SDK 2.35 such a graph is quantized)",
               n->name, emu_op_name(n->op));
      return QNN_GRAPH_ERROR_INVALID_OP_CONFIG;
    }
    if ((n->op == EMU_OP_RMSNORM || n->op == EMU_OP_LAYERNORM) && n->n_in != 3) {
      snprintf(msg, cap, "node %s: %s on the HTP takes in[0], gamma in[1] and beta in[2]", n->name,
               emu_op_name(n->op));
      return QNN_GRAPH_ERROR_INVALID_OP_CONFIG;
    }
  }
  if (n->op == EMU_OP_MATMUL) { /* both supplements: equal ranks and batch dims, no broadcasting */
    const emu_tensor *a = &g->tensors[n->in[0]], *b = &g->tensors[n->in[1]];
    int same = a->rank == b->rank;
    for (uint32_t d = 0; same && d + 2 < a->rank; d++) same = a->dims[d] == b->dims[d];
    if (!same) {
      snprintf(msg, cap, "node %s: MatMul in[1] must have in[0]'s rank and batch dimensions (no broadcasting on the %s)",
               n->name, emu_profile_name(prof));
      return QNN_GRAPH_ERROR_INVALID_OP_CONFIG;
    }
  }
  return QNN_SUCCESS;
}
