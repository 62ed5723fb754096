// Generates core/testdata/kquant_*.bin from llama.cpp's libggml-base (ggml's reference K-quant
// quantizers and dequantizers). Run once, outside the build:
//   gcc -O2 -o gen kquant_gen.c -L$LLAMA/build/bin -lggml-base -lm -Wl,-rpath,$LLAMA/build/bin && ./gen
// then split: kquant_inputs.bin = u32 n + n*256 f32 inputs; kquant_<type>.bin = quantized blocks,
// u32 nr, nr random blocks, their nr*256 f32 dequantized values (see core/kquant_test.go).
// (-I$LLAMA/ggml/include for ggml.h)
// Golden generator for xpu core K-quant tests (run once, outside the repo; only bytes are kept).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "ggml.h"
typedef void (*qfn)(const float*, void*, int64_t);
typedef void (*dfn)(const void*, float*, int64_t);
void quantize_row_q2_K_ref(const float*, void*, int64_t);
void quantize_row_q3_K_ref(const float*, void*, int64_t);
void quantize_row_q4_K_ref(const float*, void*, int64_t);
void quantize_row_q5_K_ref(const float*, void*, int64_t);
void quantize_row_q6_K_ref(const float*, void*, int64_t);
void dequantize_row_q2_K(const void*, float*, int64_t);
void dequantize_row_q3_K(const void*, float*, int64_t);
void dequantize_row_q4_K(const void*, float*, int64_t);
void dequantize_row_q5_K(const void*, float*, int64_t);
void dequantize_row_q6_K(const void*, float*, int64_t);
static uint64_t s = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void){ s ^= s<<13; s ^= s>>7; s ^= s<<17; return s; }
static float uni(void){ return (rnd()>>40) / (float)(1<<24); }
static float gauss(void){ float u=uni()+1e-7f, v=uni(); return sqrtf(-2*logf(u))*cosf(6.2831853f*v); }
#define NB 40
#define NR 16
static void fill(float *x, int b) {
  int kind = b % 10; float sc = powf(10.f, (float)((int)(rnd()%7)) - 4.f);
  for (int i = 0; i < 256; i++) {
    float g = gauss();
    switch (kind) {
    case 0: x[i] = g*sc; break;
    case 1: x[i] = uni()*sc; break;                      // all positive
    case 2: x[i] = -uni()*sc; break;                     // all negative
    case 3: x[i] = g*sc*((rnd()%17)==0 ? 20.f : 1.f); break; // outliers
    case 4: x[i] = (i/16)%3==0 ? 0.f : g*sc; break;      // zero sub-blocks
    case 5: x[i] = b==5 ? 0.f : 0.25f*sc; break;         // all zero / constant
    case 6: x[i] = (rnd()%5)==0 ? g*sc : 0.f; break;     // sparse
    case 7: x[i] = g*sc*powf(2.f, (float)(i/32)); break; // growing sub-block scales
    case 8: x[i] = (float)((int)(rnd()%9)-4)*sc; break;  // few levels
    default: x[i] = g*sc + sc; break;                    // offset
    }
  }
}
int main(void) {
  // ggml_init fills the f16->f32 table that the reference (de)quantizers read.
  struct ggml_init_params ip = {1024, NULL, false}; ggml_free(ggml_init(ip));
  const char *names[5] = {"q4_k","q5_k","q6_k","q2_k","q3_k"};
  qfn q[5] = {(qfn)quantize_row_q4_K_ref,(qfn)quantize_row_q5_K_ref,(qfn)quantize_row_q6_K_ref,(qfn)quantize_row_q2_K_ref,(qfn)quantize_row_q3_K_ref};
  dfn d[5] = {(dfn)dequantize_row_q4_K,(dfn)dequantize_row_q5_K,(dfn)dequantize_row_q6_K,(dfn)dequantize_row_q2_K,(dfn)dequantize_row_q3_K};
  int bs[5] = {144,176,210,84,110};
  int dpos[5][2] = {{0,2},{0,2},{208,-1},{80,82},{108,-1}}; // f16 fields kept finite
  static float x[NB*256]; for (int b = 0; b < NB; b++) fill(x+256*b, b);
  for (int t = 0; t < 5; t++) {
    char fn[64]; snprintf(fn, sizeof fn, "%s.bin", names[t]);
    FILE *f = fopen(fn, "wb");
    uint32_t nb = NB, nr = NR; fwrite(&nb,4,1,f); fwrite(x,4,NB*256,f);
    uint8_t *o = calloc(NB, bs[t]); q[t](x, o, NB*256); fwrite(o,1,NB*bs[t],f);
    uint8_t *r = malloc(NR*bs[t]);
    for (int i = 0; i < NR*bs[t]; i++) r[i] = rnd();
    for (int b = 0; b < NR; b++) for (int k = 0; k < 2; k++) if (dpos[t][k] >= 0) {
      uint16_t h = (uint16_t)(rnd() & 0x3fff) ^ (uint16_t)((rnd()&1) << 15); // |exp| small, finite
      memcpy(r + b*bs[t] + dpos[t][k], &h, 2);
    }
    float *y = malloc(NR*256*4); d[t](r, y, NR*256);
    fwrite(&nr,4,1,f); fwrite(r,1,NR*bs[t],f); fwrite(y,4,NR*256,f);
    fclose(f); free(o); free(r); free(y);
  }
  return 0;
}
