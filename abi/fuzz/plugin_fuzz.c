/*
 * plugin_fuzz.c: libFuzzer target for a whole plugin: random IR through graph_analyze ->
 * graph_prepare -> execution (bind, run) -> release, under ASan + UBSan. The Makefile links it
 * with one plugin's sources (make fuzz-plugins: neon, opencl, qnn), so an out-of-bounds access,
 * UB, a crash or a hang anywhere on that path is a finding. The plugin must refuse what it
 * cannot run with a status, never crash: every status is acceptable here.
 *
 * The first input byte picks a mode:
 *   even: the bytes are an IR blob, with magic, version and op set forced valid and the counts
 *         cut to what the input holds (as ir_fuzz.c), so the parse and the per-node checks of
 *         the plugin run on arbitrary records (constant handles included);
 *   odd:  the bytes drive a small generator: 1 to 3 nodes of any op, 0 to 5 inputs each (new
 *         graph inputs or constants of any dtype and a small shape, or an earlier node's value),
 *         an output of a shape taken from an input or made up, small attributes. Graphs that
 *         pass the checks are executed on fuzzed input bytes, so kernels see in-range and
 *         out-of-range ids, NaNs and odd shapes.
 * A prepared executable is also serialized and prepared again from its cache blob, intact and
 * with bits flipped (the plugin's cache reader).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "xpu_backend.h"
#include "xpu_ir_build.h"

static const xpu_api *api;
static xpu_context ctx;

static void fail(const char *what) {
  fprintf(stderr, "plugin_fuzz: %s\n", what);
  abort();
}

/* the plugin is opened once per process, as a host does; libFuzzer never returns from main */
static void setup(void) {
  if (api) return;
  xpu_host_info host = {sizeof host, XPU_ABI_MAJOR, XPU_ABI_MINOR, 0, NULL, NULL, getenv("XPU_FUZZ_PLUGIN_DIR")};
  xpu_probe_result pr;
  memset(&pr, 0, sizeof pr);
  pr.struct_size = sizeof pr;
  if (xpu_plugin_probe(&pr) != XPU_OK || pr.score == 0) fail("the plugin probes 0 here: nothing to fuzz");
  if (xpu_plugin_open(&host, &api) != XPU_OK || !api) fail("xpu_plugin_open failed");
  if (api->context_create(0, NULL, &ctx) != XPU_OK) fail("context_create failed");
}

typedef struct {
  const uint8_t *p;
  size_t n;
} cursor;

static uint32_t take(cursor *c) {
  if (!c->n) return 0;
  c->n--;
  return *c->p++;
}

/* a dtype's byte size for a shape (0 for an invalid combination: the parser refuses it) */
static uint64_t nbytes_of(const xpu_ir_tensor *t) { return xpu_ir_nbytes(t); }

#define MAX_BUFS 96
typedef struct {
  xpu_buffer b[MAX_BUFS];
  uint32_t n;
} buflist;

static xpu_buffer alloc_filled(buflist *bl, uint64_t size, cursor *c) {
  xpu_buffer b = 0;
  if (bl->n >= MAX_BUFS) return 0;
  if (api->buffer_alloc(ctx, size ? size : 1, XPU_BUFFER_HOST_VISIBLE, &b) != XPU_OK) return 0;
  bl->b[bl->n++] = b;
  uint8_t chunk[256];
  for (uint64_t off = 0; off < size; off += sizeof chunk) {
    uint64_t m = size - off < sizeof chunk ? size - off : sizeof chunk;
    for (uint64_t i = 0; i < m; i++) chunk[i] = (uint8_t)(take(c) ^ (off + i) * 37u);
    /* small I32 ids and positions are in range more often than random words */
    if (api->buffer_write(b, off, chunk, m) != XPU_OK) break;
  }
  return b;
}

static const float fvals[8] = {0.0f, 0.5f, 1.0f, -1.0f, 0.125f, 1e30f, 127.0f, 0.0f};

static uint32_t gen_tensor(xpu_irb *b, cursor *c, uint32_t kind) {
  uint32_t dt = 1 + take(c) % (XPU_DT_COUNT - 1);
  int rank = (int)(take(c) % 5);
  int64_t shape[XPU_MAX_RANK];
  for (int d = 0; d < rank; d++) shape[d] = take(c) % 5;
  uint32_t bl = xpu_dtype_block_len(dt);
  if (rank > 0 && bl > 1) shape[rank - 1] = (int64_t)(take(c) % 3) * bl;
  return xpu_irb_tensor(b, dt, kind, rank, shape);
}

/* odd mode: returns a blob (free it) or NULL; consts are bound to buffers allocated here */
static void *generate(cursor *c, uint64_t *size, buflist *bl) {
  xpu_irb b;
  memset(&b, 0, sizeof b);
  uint32_t values[8];
  uint32_t nvalues = 0;
  uint32_t nnodes = 1 + take(c) % 3;
  for (uint32_t k = 0; k < nnodes; k++) {
    uint32_t op = 1 + take(c) % (XPU_OP_COUNT - 1);
    int nin = (int)(take(c) % 6);
    uint32_t in[XPU_MAX_INPUTS];
    for (int i = 0; i < nin; i++) {
      uint32_t how = take(c) % 4;
      if (how == 0 && nvalues) in[i] = values[take(c) % nvalues];
      else if (how == 1 && i > 0) in[i] = in[i - 1];
      else in[i] = gen_tensor(&b, c, (take(c) & 1) ? XPU_TENSOR_CONST : XPU_TENSOR_INPUT);
    }
    if (b.overflow) return NULL;
    uint32_t out;
    uint32_t oh = take(c) % 4;
    if (nin > 0 && oh < 3) { /* an input's shape, in a dtype of its own or the input's */
      const xpu_ir_tensor *src = &b.tensors[in[oh < (uint32_t)nin ? oh : 0]];
      uint32_t dt = (take(c) & 1) ? src->dtype : 1 + take(c) % (XPU_DT_COUNT - 1);
      int64_t shape[XPU_MAX_RANK];
      for (uint32_t d = 0; d < src->rank; d++) shape[d] = src->shape[d];
      if (take(c) & 1 && src->rank > 0) shape[src->rank - 1] = take(c) % 5; /* MATMUL's N */
      out = xpu_irb_tensor(&b, dt, XPU_TENSOR_VALUE, (int)src->rank, shape);
    } else {
      out = gen_tensor(&b, c, XPU_TENSOR_VALUE);
    }
    xpu_ir_node *nd = xpu_irb_node(&b, op, out, nin, in);
    for (int a = 0; a < 4; a++) nd->iattr[a] = (int64_t)(take(c) % 6) - 1;
    for (int a = 0; a < 3; a++) nd->fattr[a] = fvals[take(c) % 8];
    if (take(c) % 16 == 0) nd->fattr[0] = NAN;
    if (nvalues < 8) values[nvalues++] = out;
  }
  xpu_irb_output(&b, values[nvalues - 1]);
  if (nvalues > 1 && (take(c) & 1)) xpu_irb_output(&b, values[0]);
  if (b.overflow) return NULL;
  /* constants live in buffers of this context, filled from the input */
  for (uint32_t t = 0; t < b.n_tensors; t++) {
    xpu_ir_tensor *x = &b.tensors[t];
    if (x->kind != XPU_TENSOR_CONST) continue;
    uint64_t nb = nbytes_of(x);
    if (nb > (1u << 20)) return NULL;
    x->const_buffer = alloc_filled(bl, nb, c);
    x->const_offset = 0;
  }
  return xpu_irb_encode(&b, size);
}

/* even mode: the input as a blob, header patched as ir_fuzz.c does */
static void *raw_blob(const uint8_t *data, size_t size, uint64_t *out) {
  uint8_t *blob = (uint8_t *)malloc(size ? size : 1);
  if (!blob) return NULL;
  memcpy(blob, data, size);
  if (size >= sizeof(xpu_ir_header)) {
    xpu_ir_header h;
    memcpy(&h, blob, sizeof h);
    h.magic = XPU_IR_MAGIC;
    h.version = XPU_IR_VERSION;
    h.opset = XPU_OPSET_VERSION;
    uint64_t room = size - sizeof h;
    h.n_tensors %= (uint32_t)(room / sizeof(xpu_ir_tensor) + 1);
    room -= (uint64_t)h.n_tensors * sizeof(xpu_ir_tensor);
    h.n_nodes %= (uint32_t)(room / sizeof(xpu_ir_node) + 1);
    h.n_inputs %= h.n_tensors + 1;
    h.n_outputs %= h.n_tensors + 1;
    memcpy(blob, &h, sizeof h);
  }
  *out = size;
  return blob;
}

/* the executable's cache blob (where the plugin serializes), then graph_prepare from it as
 * stored and with a few of its bytes changed by the input: a cache read back from disk is
 * untrusted too */
static void reprepare_from_cache(xpu_executable exe, const void *blob, uint64_t bsize, cursor *c) {
  uint64_t need = 0;
  if (api->executable_serialize(exe, NULL, 0, &need) != XPU_OK || need == 0 || need > (64u << 20)) return;
  uint8_t *cache = (uint8_t *)malloc(need);
  uint64_t got = 0;
  if (!cache) return;
  if (api->executable_serialize(exe, cache, need, &got) == XPU_OK && got <= need) {
    for (int round = 0; round < 2; round++) {
      if (round == 1) {
        uint32_t flips = 1 + take(c) % 4;
        for (uint32_t i = 0; i < flips && got; i++) {
          uint64_t at = ((uint64_t)take(c) << 16 | (uint64_t)take(c) << 8 | take(c)) % got;
          cache[at] ^= (uint8_t)(1u << (take(c) % 8));
        }
        if (take(c) & 1) got -= got / 2; /* and sometimes cut short */
      }
      xpu_prepare_desc d = {sizeof d, 0, blob, bsize, NULL, cache, got};
      xpu_executable again = 0;
      if (api->graph_prepare(ctx, &d, &again) == XPU_OK && api->executable_release(again) != XPU_OK)
        fail("executable_release of a cached executable failed");
    }
  }
  free(cache);
}

/* binds every graph input and output to a fresh buffer and runs the execution */
static void execute(xpu_executable exe, const void *blob, uint64_t size, buflist *bl, cursor *c) {
  xpu_ir_graph g;
  if (xpu_ir_parse(blob, size, &g, NULL, 0) != XPU_OK) fail("graph_prepare accepted IR that xpu_ir_parse refuses");
  uint64_t total = 0;
  uint32_t nio = g.header->n_inputs + g.header->n_outputs;
  for (uint32_t i = 0; i < nio; i++) {
    uint32_t t = i < g.header->n_inputs ? g.inputs[i] : g.outputs[i - g.header->n_inputs];
    total += nbytes_of(&g.tensors[t]);
  }
  if (total > (16u << 20)) return; /* a big graph: prepared is enough */
  xpu_execution ex = 0;
  if (api->execution_create(exe, &ex) != XPU_OK) return;
  int bound = 1;
  for (uint32_t i = 0; i < nio && bound; i++) {
    uint32_t t = i < g.header->n_inputs ? g.inputs[i] : g.outputs[i - g.header->n_inputs];
    xpu_buffer buf = alloc_filled(bl, nbytes_of(&g.tensors[t]), c);
    bound = buf && api->execution_bind(ex, i, buf, 0) == XPU_OK;
  }
  if (bound) (void)api->execution_run(ex);
  if (api->execution_release(ex) != XPU_OK) fail("execution_release after a synchronous run failed");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  setup();
  if (size < 1) return 0;
  cursor c = {data + 1, size - 1};
  buflist bl = {{0}, 0};
  uint64_t bsize = 0;
  void *blob = (data[0] & 1) ? generate(&c, &bsize, &bl) : raw_blob(data + 1, size - 1, &bsize);
  if (blob) {
    xpu_node_verdict v[4];
    for (int i = 0; i < 4; i++) {
      memset(&v[i], 0, sizeof v[i]);
      v[i].struct_size = sizeof v[i];
    }
    (void)api->graph_analyze(ctx, blob, bsize, v, 4);
    xpu_prepare_desc d = {sizeof d, 0, blob, bsize, NULL, NULL, 0};
    xpu_executable exe = 0;
    if (api->graph_prepare(ctx, &d, &exe) == XPU_OK) {
      execute(exe, blob, bsize, &bl, &c);
      reprepare_from_cache(exe, blob, bsize, &c);
      if (api->executable_release(exe) != XPU_OK) fail("executable_release failed");
    }
    free(blob);
  }
  for (uint32_t i = bl.n; i-- > 0;)
    if (api->buffer_release(bl.b[i]) != XPU_OK) fail("buffer_release of an unbound buffer failed");
  return 0;
}
