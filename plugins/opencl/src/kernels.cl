/*
 * kernels.cl: the op set in OpenCL C 1.2, embedded in libxpu-opencl.so at build time.
 *
 * Every tensor arrives as (base pointer, byte offset, dtype): bindings may sit at any offset of
 * a buffer, and passing the offset avoids sub-buffers and their CL_DEVICE_MEM_BASE_ADDR_ALIGN
 * rule. ld()/st() read and write one element of any dtype by flat index, quantized blocks
 * included, so one kernel serves every dtype; only the f32 GEMM is specialised for speed.
 * Half values go through vload_half/vstore_half, which OpenCL 1.2 has without cl_khr_fp16.
 */
#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#define ACC double
#else
#define ACC float
#endif

/* dtype codes: XPU_DT_* */
#define DT_F32 1
#define DT_F16 2
#define DT_BF16 3
#define DT_I32 4
#define DT_I8 5
#define DT_Q8_0 6
#define DT_Q4_0 7
#define DT_Q4_K 8
#define DT_Q5_K 9
#define DT_Q6_K 10
#define DT_Q2_K 11
#define DT_Q3_K 12

/* elementwise op codes: XPU_OP_*, plus COPY (convert dtype) */
#define OP_COPY 0
#define OP_ADD 1
#define OP_SUB 2
#define OP_MUL 3
#define OP_DIV 4
#define OP_SILU 5
#define OP_GELU 6
#define OP_RELU 7
#define OP_EXP 8
#define OP_NEG 9
#define OP_SCALE 10
#define OP_TANH 27 /* op set v5 */

typedef __global const uchar gcbytes;
typedef __global uchar gbytes;

inline float h2f(ushort h) { return vload_half(0, (const __private half *)&h); }

inline ushort f2h(float f) {
  ushort h;
  vstore_half_rte(f, 0, (__private half *)&h);
  return h;
}

inline ushort f2bf(float f) {
  uint u = as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u); /* NaN stays NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (ushort)(u >> 16);
}

/* f16 at an arbitrary byte address (quantized blocks are 34 or 18 bytes long) */
inline float h2f_at(gcbytes *p) { return h2f((ushort)(p[0] | (p[1] << 8))); }

/* One value of a K-quant super-block of 256 (abi/OPS.md, "K-quants"), computed as core/ref does:
 * (d*sc)*q - dmin*m, two roundings, so the result is bit-exact with the reference and ggml;
 * FP_CONTRACT OFF keeps the compiler from fusing them into one FMA. */
#pragma OPENCL FP_CONTRACT OFF
inline float ldk(gcbytes *p, ulong i, int dt) {
  uint j = (uint)(i & 255), l = j & 31, h = j >> 7, jj = (j >> 5) & 3;
  switch (dt) {
  case DT_Q4_K: case DT_Q5_K: {
    gcbytes *b = p + (i >> 8) * (dt == DT_Q4_K ? 144 : 176);
    gcbytes *sc = b + 4;
    uint s = j >> 5, c = j >> 6, sh = 4 * (s & 1), d6, m6;
    if (s < 4) {
      d6 = sc[s] & 63;
      m6 = sc[s + 4] & 63;
    } else {
      d6 = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
      m6 = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
    uint q;
    if (dt == DT_Q4_K) {
      q = (b[16 + 32 * c + l] >> sh) & 15;
    } else {
      q = ((b[48 + 32 * c + l] >> sh) & 15) | (((b[16 + l] >> s) & 1) << 4);
    }
    float dl = h2f_at(b) * (float)d6, ml = h2f_at(b + 2) * (float)m6;
    return dl * (float)q - ml;
  }
  case DT_Q6_K: {
    gcbytes *b = p + (i >> 8) * 210;
    int q = (int)(((b[64 * h + 32 * (jj & 1) + l] >> (4 * (jj >> 1))) & 15) |
                  (((b[128 + 32 * h + l] >> (2 * jj)) & 3) << 4));
    float dl = h2f_at(b + 208) * (float)(char)b[192 + (j >> 4)];
    return dl * (float)(q - 32);
  }
  case DT_Q2_K: {
    gcbytes *b = p + (i >> 8) * 84;
    uint q = (b[16 + 32 * h + l] >> (2 * jj)) & 3, sb = b[j >> 4];
    float dl = h2f_at(b + 80) * (float)(sb & 15), ml = h2f_at(b + 82) * (float)(sb >> 4);
    return dl * (float)q - ml;
  }
  case DT_Q3_K: {
    gcbytes *b = p + (i >> 8) * 110;
    int q = (int)((b[32 + 32 * h + l] >> (2 * jj)) & 3) - (((b[l] >> (4 * h + jj)) & 1) ? 0 : 4);
    uint t = j >> 4;
    uint lo = t < 8 ? (b[96 + t] & 15) : (b[96 + t - 8] >> 4);
    uint hi = (b[104 + (t & 3)] >> (2 * (t >> 2))) & 3;
    float dl = h2f_at(b + 108) * (float)((int)(lo | (hi << 4)) - 32);
    return dl * (float)q;
  }
  }
  return 0.0f;
}
#pragma OPENCL FP_CONTRACT ON

inline float ld(gcbytes *p, ulong i, int dt, float scale) {
  switch (dt) {
  case DT_F32: return ((__global const float *)p)[i];
  case DT_F16: return vload_half(i, (__global const half *)p);
  case DT_BF16: return as_float((uint)((__global const ushort *)p)[i] << 16);
  case DT_I32: return (float)((__global const int *)p)[i];
  case DT_I8: return scale * (float)((__global const char *)p)[i];
  case DT_Q8_0: {
    gcbytes *b = p + (i >> 5) * 34;
    return h2f_at(b) * (float)(char)b[2 + (i & 31)];
  }
  case DT_Q4_0: {
    gcbytes *b = p + (i >> 5) * 18;
    uint j = (uint)(i & 31);
    uchar q = b[2 + (j & 15)];
    int n = j < 16 ? (q & 15) : (q >> 4);
    return h2f_at(b) * (float)(n - 8);
  }
  case DT_Q4_K: case DT_Q5_K: case DT_Q6_K: case DT_Q2_K: case DT_Q3_K: return ldk(p, i, dt);
  }
  return 0.0f;
}

inline void st(gbytes *p, ulong i, int dt, float v, float scale) {
  switch (dt) {
  case DT_F32: ((__global float *)p)[i] = v; break;
  case DT_F16: vstore_half_rte(v, i, (__global half *)p); break;
  case DT_BF16: ((__global ushort *)p)[i] = f2bf(v); break;
  case DT_I32: ((__global int *)p)[i] = convert_int_sat_rte(v); break;
  case DT_I8: ((__global char *)p)[i] = (char)clamp(round(v / scale), -127.0f, 127.0f); break;
  }
}

/* 4-d index of flat element gid of a [s.x, s.y, s.z, s.w] tensor, dotted with strides */
inline long at4(ulong gid, long4 s, long4 str) {
  long i3 = (long)(gid % (ulong)s.w);
  ulong r = gid / (ulong)s.w;
  long i2 = (long)(r % (ulong)s.z);
  r /= (ulong)s.z;
  long i1 = (long)(r % (ulong)s.y);
  long i0 = (long)(r / (ulong)s.y);
  return i0 * str.x + i1 * str.y + i2 * str.z + i3 * str.w;
}

__kernel void eltwise(int op, gcbytes *a, ulong aoff, int adt, gcbytes *b, ulong boff, int bdt,
                      gbytes *o, ulong ooff, int odt, long4 shape, long4 sa, long4 sb,
                      float p0, float p1, ulong n) {
  ulong gid = get_global_id(0);
  if (gid >= n) return;
  float x = ld(a + aoff, (ulong)at4(gid, shape, sa), adt, p0);
  float y = 0.0f, r;
  if (op >= OP_ADD && op <= OP_DIV) y = ld(b + boff, (ulong)at4(gid, shape, sb), bdt, 1.0f);
  switch (op) {
  case OP_ADD: r = x + y; break;
  case OP_SUB: r = x - y; break;
  case OP_MUL: r = x * y; break;
  case OP_DIV: r = x / y; break;
  case OP_SILU: r = x / (1.0f + exp(-x)); break;
  case OP_GELU: r = 0.5f * x * (1.0f + tanh(0.7978845608028654f * (x + 0.044715f * x * x * x))); break;
  case OP_RELU: r = x > 0.0f ? x : 0.0f; break;
  case OP_EXP: r = exp(x); break;
  case OP_NEG: r = -x; break;
  case OP_SCALE: r = x * p0 + p1; break;
  case OP_TANH: r = tanh(x); break;
  default: r = x; /* OP_COPY: p0 is the input's I8 scale, p1 the output's */
  }
  st(o + ooff, gid, odt, r, p1);
}

/* bit-exact strided copy (PERMUTE, SLICE, CONCAT): elements of esize bytes */
__kernel void copy_strided(gcbytes *s, ulong soff, gbytes *d, ulong doff, int esize, long4 shape,
                           long4 ss, long4 ds, ulong n) {
  ulong gid = get_global_id(0);
  if (gid >= n) return;
  long si = at4(gid, shape, ss), di = at4(gid, shape, ds);
  gcbytes *sp = s + soff;
  gbytes *dp = d + doff;
  switch (esize) {
  case 1: dp[di] = sp[si]; break;
  case 2: ((__global ushort *)dp)[di] = ((__global const ushort *)sp)[si]; break;
  case 4: ((__global uint *)dp)[di] = ((__global const uint *)sp)[si]; break;
  }
}

/* work-group reductions; the local size is a power of two */
inline float wg_sum(float v, __local float *red) {
  int l = get_local_id(0);
  red[l] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = get_local_size(0) / 2; s > 0; s >>= 1) {
    if (l < s) red[l] += red[l + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  float r = red[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return r;
}

inline float wg_max(float v, __local float *red) {
  int l = get_local_id(0);
  red[l] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = get_local_size(0) / 2; s > 0; s >>= 1) {
    if (l < s) red[l] = fmax(red[l], red[l + s]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  float r = red[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return r;
}

/* RMS_NORM (layer = 0) and LAYER_NORM (layer = 1): one work-group per row of K */
__kernel void norm(gcbytes *a, ulong aoff, int adt, gbytes *o, ulong ooff, int odt, long K,
                   float eps, int layer, __local float *red) {
  long row = get_group_id(0);
  int l = get_local_id(0), L = get_local_size(0);
  gcbytes *x = a + aoff;
  float mean = 0.0f;
  if (layer) {
    float s = 0.0f;
    for (long k = l; k < K; k += L) s += ld(x, row * K + k, adt, 1.0f);
    mean = wg_sum(s, red) / (float)K;
  }
  float s2 = 0.0f;
  for (long k = l; k < K; k += L) {
    float v = ld(x, row * K + k, adt, 1.0f) - mean;
    s2 += v * v;
  }
  float inv = 1.0f / sqrt(wg_sum(s2, red) / (float)K + eps);
  for (long k = l; k < K; k += L)
    st(o + ooff, row * K + k, odt, (ld(x, row * K + k, adt, 1.0f) - mean) * inv, 1.0f);
}

/* SOFTMAX over rows of N; row r is row r % M of its [M, N] matrix for the causal mask */
__kernel void softmax(gcbytes *a, ulong aoff, int adt, gbytes *o, ulong ooff, int odt, long N,
                      long M, float scale, int causal, long coff, __local float *red) {
  long row = get_group_id(0);
  int l = get_local_id(0), L = get_local_size(0);
  gcbytes *x = a + aoff;
  long vis = N; /* elements [0, vis) take part */
  if (causal) vis = clamp((row % M) + coff + 1, (long)0, N);
  float m = -INFINITY;
  for (long j = l; j < vis; j += L) m = fmax(m, ld(x, row * N + j, adt, 1.0f) * scale);
  m = wg_max(m, red);
  float s = 0.0f;
  for (long j = l; j < vis; j += L) s += exp(ld(x, row * N + j, adt, 1.0f) * scale - m);
  s = wg_sum(s, red);
  for (long j = l; j < N; j += L) {
    float v = j < vis ? exp(ld(x, row * N + j, adt, 1.0f) * scale - m) / s : 0.0f;
    st(o + ooff, row * N + j, odt, v, 1.0f);
  }
}

/* ROPE: one work item per output element of rows [.., T, H] x D */
__kernel void rope(gcbytes *a, ulong aoff, int adt, __global const int *pos, ulong poff,
                   gbytes *o, ulong ooff, int odt, long T, long H, long D, long nrot, int neox,
                   float base, float fscale, ulong n) {
  ulong gid = get_global_id(0);
  if (gid >= n) return;
  long d = (long)(gid % (ulong)D), row = (long)(gid / (ulong)D);
  gcbytes *x = a + aoff;
  long rb = row * D;
  float r;
  if (d >= nrot) {
    r = ld(x, rb + d, adt, 1.0f);
  } else {
    long t = (row / H) % T;
    long i, iu, iv;
    int second;
    if (neox) {
      long half_ = nrot / 2;
      i = d < half_ ? d : d - half_;
      iu = i;
      iv = i + half_;
      second = d >= half_;
    } else {
      i = d / 2;
      iu = 2 * i;
      iv = 2 * i + 1;
      second = d & 1;
    }
    int p = ((__global const int *)((__global const uchar *)pos + poff))[t];
    ACC theta = (ACC)p * (ACC)fscale * pow((ACC)base, -(ACC)(2 * i) / (ACC)nrot);
    float c = (float)cos(theta), sn = (float)sin(theta);
    float u = ld(x, rb + iu, adt, 1.0f), v = ld(x, rb + iv, adt, 1.0f);
    r = second ? u * sn + v * c : u * c - v * sn;
  }
  st(o + ooff, gid, odt, r, 1.0f);
}

/*
 * Tree mask (op set v2): with a mask, query i sees every key before q_offset and key
 * q_offset+j iff mask[i, j] != 0; the caller has already limited keys to [0, q_offset+Tq).
 */
inline int att_visible(gcbytes *mask, long i, long Tq, long off, long j) {
  return mask == 0 || j < off || ((__global const char *)mask)[i * Tq + (j - off)] != 0;
}

/*
 * Sliding window (op set v5): query i at absolute position i + off sees the keys
 * (i + off - window, i + off]; the keys before the window are never loaded.
 */
inline long att_first(int causal, long window, long i, long off) {
  return causal && window > 0 ? max(0L, i + off - window + 1) : 0;
}

/* Soft-cap (op set v5, Gemma 2): a scaled score s becomes c * tanh(s / c) when c > 0. */
inline float att_cap(float s, float c) { return c > 0.0f ? c * tanh(s / c) : s; }

/*
 * ATTENTION: one work-group per (query i, head h), keys in chunks of the local size with an
 * online softmax. Keys past the last visible one are never loaded: a KV cache bound with its
 * full capacity may hold garbage there. Masked keys inside a chunk score -inf and their V rows
 * are skipped.
 */
__kernel void attention(gcbytes *q, ulong qoff, int qdt, gcbytes *k, ulong koff, int kdt,
                        gcbytes *v, ulong voff, int vdt, gbytes *o, ulong ooff, int odt, long Hq,
                        long Tk, long Hkv, long D, long Dv, float scale, int causal,
                        gcbytes *qo, ulong qooff, int has_qo, long qo_attr, __local float *lq,
                        __local float *lacc, __local float *ls, gcbytes *mk, ulong mkoff,
                        int has_mask, long Tq, long Hks, float softcap, long window) {
  gcbytes *mask = has_mask ? mk + mkoff : 0;
  long g = get_group_id(0);
  long i = g / Hq, h = g % Hq, hk = h / (Hq / Hkv);
  int l = get_local_id(0), L = get_local_size(0);
  long last = Tk - 1, off = 0, first = 0;
  if (causal) {
    off = has_qo ? (long)((__global const int *)(qo + qooff))[0] : qo_attr;
    last = min(last, mask ? off + Tq - 1 : i + off);
    first = att_first(causal, window, i, off);
  }
  for (long d = l; d < D; d += L) lq[d] = ld(q + qoff, g * D + d, qdt, 1.0f);
  for (long d = l; d < Dv; d += L) lacc[d] = 0.0f;
  barrier(CLK_LOCAL_MEM_FENCE);
  float m = -INFINITY, ssum = 0.0f;
  for (long j0 = first; j0 <= last; j0 += L) {
    long j = j0 + l;
    int cnt = (int)min((long)L, last - j0 + 1);
    float s = -INFINITY;
    if (l < cnt && att_visible(mask, i, Tq, off, j)) {
      float dot = 0.0f;
      for (long d = 0; d < D; d++) dot += lq[d] * ld(k + koff, (j * Hks + hk) * D + d, kdt, 1.0f);
      s = att_cap(dot * scale, softcap);
    }
    ls[l] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    float cm = m;
    for (int t = 0; t < cnt; t++) cm = fmax(cm, ls[t]);
    barrier(CLK_LOCAL_MEM_FENCE);
    /* a chunk of masked keys leaves cm at -inf: no weight, no rescaling */
    ls[l] = l < cnt && s > -INFINITY ? exp(s - cm) : 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    float corr = m == cm ? 1.0f : exp(m - cm), ps = 0.0f;
    for (int t = 0; t < cnt; t++) ps += ls[t];
    for (long d = l; d < Dv; d += L) {
      float acc = lacc[d] * corr;
      for (int t = 0; t < cnt; t++)
        if (att_visible(mask, i, Tq, off, j0 + t))
          acc += ls[t] * ld(v + voff, ((j0 + t) * Hks + hk) * Dv + d, vdt, 1.0f);
      lacc[d] = acc;
    }
    ssum = ssum * corr + ps;
    m = cm;
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (long d = l; d < Dv; d += L)
    st(o + ooff, g * Dv + d, odt, last >= 0 && ssum > 0.0f ? lacc[d] / ssum : 0.0f, 1.0f);
}

/* GET_ROWS: an id outside [0, R) sets *err instead of reading */
__kernel void get_rows(gcbytes *t, ulong toff, int tdt, float tscale, __global const uchar *ids,
                       ulong idoff, gbytes *o, ulong ooff, long R, long K, __global int *err,
                       int tag, ulong n) {
  ulong gid = get_global_id(0);
  if (gid >= n) return;
  long r = (long)(gid / (ulong)K), c = (long)(gid % (ulong)K);
  int id = ((__global const int *)(ids + idoff))[r];
  float val = 0.0f;
  if (id < 0 || id >= R)
    atomic_xchg(err, tag);
  else
    val = ld(t + toff, (ulong)id * (ulong)K + (ulong)c, tdt, tscale);
  ((__global float *)(o + ooff))[gid] = val;
}

/* QUANTIZE to Q8_0 / Q4_0: one work item per block of 32, bit-exact with ggml */
__kernel void quantize_block(gcbytes *a, ulong aoff, gbytes *o, ulong ooff, int odt, ulong nblk) {
  ulong b = get_global_id(0);
  if (b >= nblk) return;
  __global const float *x = (__global const float *)(a + aoff) + b * 32;
  float amax = 0.0f, mx = 0.0f;
  for (int j = 0; j < 32; j++) {
    float av = fabs(x[j]);
    if (amax < av) {
      amax = av;
      mx = x[j];
    }
  }
  if (odt == DT_Q8_0) {
    gbytes *blk = o + ooff + b * 34;
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    ushort hd = f2h(d);
    blk[0] = (uchar)(hd & 0xff);
    blk[1] = (uchar)(hd >> 8);
    for (int j = 0; j < 32; j++) blk[2 + j] = (uchar)(char)round(x[j] * id);
  } else {
    gbytes *blk = o + ooff + b * 18;
    float d = mx / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    ushort hd = f2h(d);
    blk[0] = (uchar)(hd & 0xff);
    blk[1] = (uchar)(hd >> 8);
    for (int j = 0; j < 16; j++) {
      int q0 = min(15, (int)(x[j] * id + 8.5f));
      int q1 = min(15, (int)(x[j + 16] * id + 8.5f));
      blk[2 + j] = (uchar)(q0 | (q1 << 4));
    }
  }
}

/*
 * MATMUL: out[bt, m, n] = sum_k a[bt, m, k] * b[bt', n, k]. Work-group (LX, LY) computes a
 * (4 LY) x (4 LX) tile, each item 4x4 outputs, with TK-deep slices of a and b staged in local
 * memory (sizes set by the host from the device's limits). Batch dims: out is [B0, B1, M, N];
 * a and b step by their own batch strides (0 where they broadcast).
 */
#define TK 16
#define GEMM_BODY(LDA, LDB)                                                                      \
  int lx = get_local_id(0), ly = get_local_id(1);                                                \
  int LX = get_local_size(0), LY = get_local_size(1);                                            \
  int TM = LY * 4, TN = LX * 4, tid = ly * LX + lx, nth = LX * LY;                               \
  long bt = get_global_id(2), b0 = bt / B1, b1 = bt % B1;                                        \
  ulong abase = (ulong)(b0 * sa0 + b1 * sa1), bbase = (ulong)(b0 * sb0 + b1 * sb1);              \
  long m0 = (long)get_group_id(1) * TM, n0 = (long)get_group_id(0) * TN;                         \
  float acc[4][4];                                                                               \
  for (int r = 0; r < 4; r++)                                                                    \
    for (int c = 0; c < 4; c++) acc[r][c] = 0.0f;                                                \
  for (long k0 = 0; k0 < K; k0 += TK) {                                                          \
    for (int e = tid; e < TM * TK; e += nth) {                                                   \
      long gm = m0 + e / TK, gk = k0 + e % TK;                                                   \
      As[e] = (gm < M && gk < K) ? LDA(abase + (ulong)(gm * K + gk)) : 0.0f;                     \
    }                                                                                            \
    for (int e = tid; e < TN * TK; e += nth) {                                                   \
      long gn = n0 + e / TK, gk = k0 + e % TK;                                                   \
      Bs[e] = (gn < N && gk < K) ? LDB(bbase + (ulong)(gn * K + gk)) : 0.0f;                     \
    }                                                                                            \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                \
    for (int kk = 0; kk < TK; kk++) {                                                            \
      float ar[4], br[4];                                                                        \
      for (int r = 0; r < 4; r++) ar[r] = As[(ly * 4 + r) * TK + kk];                            \
      for (int c = 0; c < 4; c++) br[c] = Bs[(lx * 4 + c) * TK + kk];                            \
      for (int r = 0; r < 4; r++)                                                                \
        for (int c = 0; c < 4; c++) acc[r][c] = mad(ar[r], br[c], acc[r][c]);                    \
    }                                                                                            \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                \
  }                                                                                              \
  for (int r = 0; r < 4; r++) {                                                                  \
    long gm = m0 + ly * 4 + r;                                                                   \
    if (gm >= M) break;                                                                          \
    for (int c = 0; c < 4; c++) {                                                                \
      long gn = n0 + lx * 4 + c;                                                                 \
      if (gn < N) STO((ulong)((bt * M + gm) * N + gn), acc[r][c]);                               \
    }                                                                                            \
  }

#define LDA_F32(i) ((__global const float *)(a + aoff))[i]
#define LDB_F32(i) ((__global const float *)(b + boff))[i]
#define STO_F32(i, v) ((__global float *)(o + ooff))[i] = (v)
#define LDA_ANY(i) ld(a + aoff, (i), adt, 1.0f)
#define LDB_ANY(i) ld(b + boff, (i), bdt, bscale)
#define STO_ANY(i, v) st(o + ooff, (i), odt, (v), 1.0f)

__kernel void gemm_f32(gcbytes *a, ulong aoff, gcbytes *b, ulong boff, gbytes *o, ulong ooff,
                       long M, long N, long K, long B1, long sa0, long sa1, long sb0, long sb1,
                       __local float *As, __local float *Bs) {
#define STO STO_F32
  GEMM_BODY(LDA_F32, LDB_F32)
#undef STO
}

__kernel void gemm_any(gcbytes *a, ulong aoff, int adt, gcbytes *b, ulong boff, int bdt,
                       float bscale, gbytes *o, ulong ooff, int odt, long M, long N, long K,
                       long B1, long sa0, long sa1, long sb0, long sb1, __local float *As,
                       __local float *Bs) {
#define STO STO_ANY
  GEMM_BODY(LDA_ANY, LDB_ANY)
#undef STO
}

/*
 * MATMUL without local memory or barriers, for CPU devices (PoCL runs a work-group as loops,
 * where barriers and local staging cost more than they save) and for M < 4 (decode). Each item
 * computes RM rows x 4 columns as dot products along K, which both a and b store contiguously.
 * Rows past M or N are clamped for loading and never stored. mfast: consecutive items step
 * along M (they then share the rows of b, which the host picks when b is the larger operand).
 */
#define GEMM_BLK_BODY(RM, DOT)                                                                   \
  long g0 = (long)get_global_id(0), g1 = (long)get_global_id(1);                                 \
  long n0 = (mfast ? g1 : g0) * 4, m0 = (mfast ? g0 : g1) * RM;                                  \
  long bt = get_global_id(2), b0 = bt / B1, b1 = bt % B1;                                        \
  if (n0 >= N || m0 >= M) return;                                                                \
  ulong abase = (ulong)(b0 * sa0 + b1 * sa1), bbase = (ulong)(b0 * sb0 + b1 * sb1);              \
  ulong ar[RM], br[4];                                                                           \
  for (int r = 0; r < RM; r++) ar[r] = abase + (ulong)(min(m0 + r, M - 1) * K);                  \
  for (int c = 0; c < 4; c++) br[c] = bbase + (ulong)(min(n0 + c, N - 1) * K);                   \
  float res[RM][4];                                                                              \
  DOT                                                                                            \
  for (int r = 0; r < RM && m0 + r < M; r++)                                                     \
    for (int c = 0; c < 4 && n0 + c < N; c++) STO((ulong)((bt * M + m0 + r) * N + n0 + c), res[r][c]);

/* VW-wide vectors along K; the compiler keeps the RM x 4 accumulators in registers */
#ifndef VW
#define VW 4
#endif
#define VEC_(n) float##n
#define VEC(n) VEC_(n)
#define VLOAD_(n) vload##n
#define VLOAD(n) VLOAD_(n)
#define DOT_F32(RM)                                                                              \
  __global const float *pa = (__global const float *)(a + aoff);                                 \
  __global const float *pb = (__global const float *)(b + boff);                                 \
  VEC(VW) acc[RM][4];                                                                            \
  for (int r = 0; r < RM; r++)                                                                   \
    for (int c = 0; c < 4; c++) acc[r][c] = (VEC(VW))(0.0f);                                     \
  long KV = K / VW;                                                                              \
  for (long k = 0; k < KV; k++) {                                                                \
    VEC(VW) av[RM], bv[4];                                                                       \
    for (int r = 0; r < RM; r++) av[r] = VLOAD(VW)(0, pa + ar[r] + VW * k);                      \
    for (int c = 0; c < 4; c++) bv[c] = VLOAD(VW)(0, pb + br[c] + VW * k);                       \
    for (int r = 0; r < RM; r++)                                                                 \
      for (int c = 0; c < 4; c++) acc[r][c] = mad(av[r], bv[c], acc[r][c]);                      \
  }                                                                                              \
  for (int r = 0; r < RM; r++)                                                                   \
    for (int c = 0; c < 4; c++) {                                                                \
      float s = 0.0f;                                                                            \
      for (int e = 0; e < VW; e++) s += ((float *)&acc[r][c])[e];                                \
      for (long k = KV * VW; k < K; k++) s = mad(pa[ar[r] + k], pb[br[c] + k], s);               \
      res[r][c] = s;                                                                             \
    }

#define DOT_ANY(RM)                                                                              \
  for (int r = 0; r < RM; r++)                                                                   \
    for (int c = 0; c < 4; c++) res[r][c] = 0.0f;                                                \
  for (long k = 0; k < K; k++) {                                                                 \
    float av[RM], bv[4];                                                                         \
    for (int r = 0; r < RM; r++) av[r] = LDA_ANY(ar[r] + (ulong)k);                              \
    for (int c = 0; c < 4; c++) bv[c] = LDB_ANY(br[c] + (ulong)k);                               \
    for (int r = 0; r < RM; r++)                                                                 \
      for (int c = 0; c < 4; c++) res[r][c] = mad(av[r], bv[c], res[r][c]);                      \
  }

#define GEMM_BLK_F32(name, RM)                                                                   \
  __kernel void name(gcbytes *a, ulong aoff, gcbytes *b, ulong boff, gbytes *o, ulong ooff,      \
                     long M, long N, long K, long B1, long sa0, long sa1, long sb0, long sb1,    \
                     int mfast) {                                                                \
    GEMM_BLK_BODY(RM, DOT_F32(RM))                                                               \
  }
#define GEMM_BLK_ANY(name, RM)                                                                   \
  __kernel void name(gcbytes *a, ulong aoff, int adt, gcbytes *b, ulong boff, int bdt,           \
                     float bscale, gbytes *o, ulong ooff, int odt, long M, long N, long K,       \
                     long B1, long sa0, long sa1, long sb0, long sb1, int mfast) {               \
    GEMM_BLK_BODY(RM, DOT_ANY(RM))                                                               \
  }

#define STO STO_F32
GEMM_BLK_F32(gemm_blk_f32_4, 4)
GEMM_BLK_F32(gemm_blk_f32_1, 1)
#undef STO
#define STO STO_ANY
GEMM_BLK_ANY(gemm_blk_any_4, 4)
GEMM_BLK_ANY(gemm_blk_any_1, 1)
#undef STO

/*
 * MATMUL against a Q8_0 / Q4_0 weight with an F32 or F16 a, a block at a time: 32 codes are
 * decoded with two 16-wide vector loads and their f16 scale once per block and column. A K-quant
 * weight goes 32 values (one chunk of its 256-value super-block) at a time through kq32().
 */
inline float hsum16(float16 v) {
  float8 x = v.lo + v.hi;
  float4 y = x.lo + x.hi;
  float2 z = y.lo + y.hi;
  return z.x + z.y;
}

/* The 32 values of chunk s (0..7) of a K-quant super-block, scales applied: values 0..15 in
 * *lo, 16..31 in *hi (OPS.md layouts; the GEMV needs no bit-exactness, so this may fuse). */
inline void kq32(gcbytes *sb, int dt, uint s, float16 *lo, float16 *hi) {
  uint h = s >> 2, jj = s & 3;
  if (dt == DT_Q4_K || dt == DT_Q5_K) {
    gcbytes *sc = sb + 4;
    uint d6, m6;
    if (s < 4) {
      d6 = sc[s] & 63;
      m6 = sc[s + 4] & 63;
    } else {
      d6 = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
      m6 = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
    uchar sh = (uchar)(4 * (s & 1));
    gcbytes *qs = sb + (dt == DT_Q4_K ? 16 : 48) + 32 * (s >> 1);
    uchar16 x0 = (vload16(0, qs) >> (uchar16)(sh)) & (uchar16)(15);
    uchar16 x1 = (vload16(1, qs) >> (uchar16)(sh)) & (uchar16)(15);
    if (dt == DT_Q5_K) {
      x0 |= ((vload16(0, sb + 16) >> (uchar16)((uchar)s)) & (uchar16)(1)) << (uchar16)(4);
      x1 |= ((vload16(1, sb + 16) >> (uchar16)((uchar)s)) & (uchar16)(1)) << (uchar16)(4);
    }
    float dl = h2f_at(sb) * (float)d6, ml = h2f_at(sb + 2) * (float)m6;
    *lo = convert_float16(x0) * dl - ml;
    *hi = convert_float16(x1) * dl - ml;
  } else if (dt == DT_Q6_K) {
    gcbytes *ql = sb + 64 * h + 32 * (jj & 1), *qh = sb + 128 + 32 * h;
    uchar sl = (uchar)(4 * (jj >> 1)), shh = (uchar)(2 * jj);
    uchar16 x0 = ((vload16(0, ql) >> (uchar16)(sl)) & (uchar16)(15)) |
                 (((vload16(0, qh) >> (uchar16)(shh)) & (uchar16)(3)) << (uchar16)(4));
    uchar16 x1 = ((vload16(1, ql) >> (uchar16)(sl)) & (uchar16)(15)) |
                 (((vload16(1, qh) >> (uchar16)(shh)) & (uchar16)(3)) << (uchar16)(4));
    float d = h2f_at(sb + 208);
    *lo = (convert_float16(x0) - 32.0f) * (d * (float)(char)sb[192 + 2 * s]);
    *hi = (convert_float16(x1) - 32.0f) * (d * (float)(char)sb[193 + 2 * s]);
  } else if (dt == DT_Q2_K) {
    gcbytes *qs = sb + 16 + 32 * h;
    uchar sh = (uchar)(2 * jj);
    uchar16 x0 = (vload16(0, qs) >> (uchar16)(sh)) & (uchar16)(3);
    uchar16 x1 = (vload16(1, qs) >> (uchar16)(sh)) & (uchar16)(3);
    float d = h2f_at(sb + 80), dm = h2f_at(sb + 82);
    uchar b0 = sb[2 * s], b1 = sb[2 * s + 1];
    *lo = convert_float16(x0) * (d * (float)(b0 & 15)) - dm * (float)(b0 >> 4);
    *hi = convert_float16(x1) * (d * (float)(b1 & 15)) - dm * (float)(b1 >> 4);
  } else { /* DT_Q3_K */
    gcbytes *qs = sb + 32 + 32 * h;
    uchar sh = (uchar)(2 * jj);
    /* the high bit set means +0, clear means -4: (bit - 1) * 4 */
    float16 q0 = convert_float16((vload16(0, qs) >> (uchar16)(sh)) & (uchar16)(3)) +
                 (convert_float16((vload16(0, sb) >> (uchar16)((uchar)s)) & (uchar16)(1)) - 1.0f) * 4.0f;
    float16 q1 = convert_float16((vload16(1, qs) >> (uchar16)(sh)) & (uchar16)(3)) +
                 (convert_float16((vload16(1, sb) >> (uchar16)((uchar)s)) & (uchar16)(1)) - 1.0f) * 4.0f;
    float d = h2f_at(sb + 108);
    float sc[2];
    for (int k = 0; k < 2; k++) {
      uint t = 2 * s + k;
      uint l4 = t < 8 ? (sb[96 + t] & 15) : (sb[96 + t - 8] >> 4);
      uint h2 = (sb[104 + (t & 3)] >> (2 * (t >> 2))) & 3;
      sc[k] = d * (float)((int)(l4 | (h2 << 4)) - 32);
    }
    *lo = q0 * sc[0];
    *hi = q1 * sc[1];
  }
}

#define DOT_Q(RM)                                                                                \
  gcbytes *pb = b + boff;                                                                        \
  int kq = bdt >= DT_Q4_K && bdt <= DT_Q3_K;                                                     \
  ulong bpb = bdt == DT_Q8_0 ? 34 : bdt == DT_Q4_0 ? 18 : bdt == DT_Q4_K ? 144                   \
            : bdt == DT_Q5_K ? 176 : bdt == DT_Q6_K ? 210 : bdt == DT_Q2_K ? 84 : 110;           \
  float16 acc[RM][4];                                                                            \
  for (int r = 0; r < RM; r++)                                                                   \
    for (int c = 0; c < 4; c++) acc[r][c] = (float16)(0.0f);                                     \
  for (long kb = 0; kb < K / 32; kb++) {                                                         \
    float16 alo[RM], ahi[RM];                                                                    \
    for (int r = 0; r < RM; r++) {                                                               \
      ulong at = ar[r] + (ulong)kb * 32;                                                         \
      if (adt == DT_F32) {                                                                       \
        alo[r] = vload16(0, (__global const float *)(a + aoff) + at);                            \
        ahi[r] = vload16(1, (__global const float *)(a + aoff) + at);                            \
      } else {                                                                                   \
        alo[r] = vload_half16(0, (__global const half *)(a + aoff) + at);                        \
        ahi[r] = vload_half16(1, (__global const half *)(a + aoff) + at);                        \
      }                                                                                          \
    }                                                                                            \
    for (int c = 0; c < 4; c++) {                                                                \
      if (kq) {                                                                                  \
        ulong e = br[c] + (ulong)kb * 32;                                                        \
        float16 vlo, vhi;                                                                        \
        kq32(pb + (e >> 8) * bpb, bdt, (uint)((e >> 5) & 7), &vlo, &vhi);                        \
        for (int r = 0; r < RM; r++) acc[r][c] = mad(alo[r], vlo, mad(ahi[r], vhi, acc[r][c]));  \
        continue;                                                                                \
      }                                                                                          \
      gcbytes *blk = pb + (br[c] / 32 + (ulong)kb) * bpb;                                        \
      float16 d = (float16)(h2f_at(blk)), qlo, qhi;                                              \
      if (bdt == DT_Q8_0) {                                                                      \
        qlo = convert_float16(vload16(0, (__global const char *)(blk + 2)));                     \
        qhi = convert_float16(vload16(1, (__global const char *)(blk + 2)));                     \
      } else {                                                                                   \
        uchar16 x = vload16(0, blk + 2);                                                         \
        qlo = convert_float16(x & (uchar16)(15)) - 8.0f;                                         \
        qhi = convert_float16(x >> (uchar16)(4)) - 8.0f;                                         \
      }                                                                                          \
      for (int r = 0; r < RM; r++) acc[r][c] = mad(d, mad(alo[r], qlo, ahi[r] * qhi), acc[r][c]); \
    }                                                                                            \
  }                                                                                              \
  for (int r = 0; r < RM; r++)                                                                   \
    for (int c = 0; c < 4; c++) res[r][c] = hsum16(acc[r][c]);

#define STO STO_ANY
#define GEMM_Q(name, RM)                                                                         \
  __kernel void name(gcbytes *a, ulong aoff, int adt, gcbytes *b, ulong boff, int bdt,           \
                     float bscale, gbytes *o, ulong ooff, int odt, long M, long N, long K,       \
                     long B1, long sa0, long sa1, long sb0, long sb1, int mfast) {               \
    GEMM_BLK_BODY(RM, DOT_Q(RM))                                                                 \
  }
GEMM_Q(gemm_q_4, 4)
GEMM_Q(gemm_q_1, 1)
#undef STO

/*
 * ATTENTION for CPU devices: one work item per (query, head), no barriers (PoCL turns each
 * barrier of the work-group kernel into a loop split, which made it 13x slower than NEON).
 * The query (pre-scaled) and the output row live in private arrays of ATT_MAX; the host uses
 * this kernel only when D and Dv fit. Keys past the last visible one are never loaded, nor
 * keys a tree mask hides.
 */
#define ATT_MAX 256

/* A quantized K row (op set v5: a Q8_0/Q4_0 KV cache) dotted with q, a block of 32 at a time:
 * the block's scale multiplies the block's partial sum once. The row starts on a block (the head
 * dim is a multiple of 32). */
inline float att_dot_q(const float *qv, gcbytes *k, ulong kb, long D, int kdt) {
  float dot = 0.0f;
  for (long b = 0; b < D / 32; b++) {
    ulong blk = (kb >> 5) + (ulong)b;
    const float *x = qv + b * 32;
    float part = 0.0f;
    if (kdt == DT_Q8_0) {
      gcbytes *p = k + blk * 34;
      for (int t = 0; t < 32; t++) part = mad(x[t], (float)(char)p[2 + t], part);
      dot = mad(h2f_at(p), part, dot);
    } else {
      gcbytes *p = k + blk * 18;
      for (int t = 0; t < 16; t++) {
        uchar c = p[2 + t];
        part = mad(x[t], (float)((int)(c & 15) - 8), part);
        part = mad(x[t + 16], (float)((int)(c >> 4) - 8), part);
      }
      dot = mad(h2f_at(p), part, dot);
    }
  }
  return dot;
}

/* acc += w * (a quantized V row), a block of 32 at a time */
inline void att_acc_q(float *acc, float w, gcbytes *v, ulong vb, long Dv, int vdt) {
  for (long b = 0; b < Dv / 32; b++) {
    ulong blk = (vb >> 5) + (ulong)b;
    float *y = acc + b * 32;
    if (vdt == DT_Q8_0) {
      gcbytes *p = v + blk * 34;
      float wd = w * h2f_at(p);
      for (int t = 0; t < 32; t++) y[t] = mad(wd, (float)(char)p[2 + t], y[t]);
    } else {
      gcbytes *p = v + blk * 18;
      float wd = w * h2f_at(p);
      for (int t = 0; t < 16; t++) {
        uchar c = p[2 + t];
        y[t] = mad(wd, (float)((int)(c & 15) - 8), y[t]);
        y[t + 16] = mad(wd, (float)((int)(c >> 4) - 8), y[t + 16]);
      }
    }
  }
}

__kernel void attention_row(gcbytes *q, ulong qoff, int qdt, gcbytes *k, ulong koff, int kdt,
                            gcbytes *v, ulong voff, int vdt, gbytes *o, ulong ooff, int odt,
                            long Hq, long Tk, long Hkv, long D, long Dv, float scale, int causal,
                            gcbytes *qo, ulong qooff, int has_qo, long qo_attr, ulong n,
                            gcbytes *mk, ulong mkoff, int has_mask, long Tq, long Hks,
                            float softcap, long window) {
  ulong g = get_global_id(0);
  if (g >= n) return;
  gcbytes *mask = has_mask ? mk + mkoff : 0;
  long i = (long)g / Hq, h = (long)g % Hq, hk = h / (Hq / Hkv);
  long last = Tk - 1, off = 0, first = 0;
  if (causal) {
    off = has_qo ? (long)((__global const int *)(qo + qooff))[0] : qo_attr;
    last = min(last, mask ? off + Tq - 1 : i + off);
    first = att_first(causal, window, i, off);
  }
  float qv[ATT_MAX], acc[ATT_MAX];
  for (long d = 0; d < D; d++) qv[d] = ld(q + qoff, g * D + d, qdt, 1.0f) * scale;
  for (long d = 0; d < Dv; d++) acc[d] = 0.0f;
  float m = -INFINITY, s = 0.0f;
  __global const float *kf = (__global const float *)(k + koff);
  __global const float *vf = (__global const float *)(v + voff);
  for (long j = first; j <= last; j++) {
    if (!att_visible(mask, i, Tq, off, j)) continue;
    ulong kb = (ulong)((j * Hks + hk) * D), vb = (ulong)((j * Hks + hk) * Dv);
    float dot = 0.0f;
    if (kdt == DT_F32)
      for (long d = 0; d < D; d++) dot = mad(qv[d], kf[kb + d], dot);
    else if (kdt == DT_Q8_0 || kdt == DT_Q4_0)
      dot = att_dot_q(qv, k + koff, kb, D, kdt);
    else
      for (long d = 0; d < D; d++) dot = mad(qv[d], ld(k + koff, kb + d, kdt, 1.0f), dot);
    dot = att_cap(dot, softcap);
    if (dot > m) { /* a new maximum rescales what was summed so far */
      float c = exp(m - dot);
      s *= c;
      for (long d = 0; d < Dv; d++) acc[d] *= c;
      m = dot;
    }
    float p = exp(dot - m);
    s += p;
    if (vdt == DT_F32)
      for (long d = 0; d < Dv; d++) acc[d] = mad(p, vf[vb + d], acc[d]);
    else if (vdt == DT_Q8_0 || vdt == DT_Q4_0)
      att_acc_q(acc, p, v + voff, vb, Dv, vdt);
    else
      for (long d = 0; d < Dv; d++) acc[d] = mad(p, ld(v + voff, vb + d, vdt, 1.0f), acc[d]);
  }
  for (long d = 0; d < Dv; d++)
    st(o + ooff, g * Dv + d, odt, last >= 0 && s > 0.0f ? acc[d] / s : 0.0f, 1.0f);
}

/*
 * Fast paths for CPU devices and common cases. eltwise_f32: F32 operands of the output's shape
 * (no broadcast, b may be a per-row vector when bn > 0), flat index only: no 64-bit index
 * arithmetic and no dtype switch per element, so PoCL can vectorise across items.
 */
inline float elt_op(int op, float x, float y, float p0, float p1) {
  switch (op) {
  case OP_ADD: return x + y;
  case OP_SUB: return x - y;
  case OP_MUL: return x * y;
  case OP_DIV: return x / y;
  case OP_SILU: return x / (1.0f + exp(-x));
  case OP_GELU: return 0.5f * x * (1.0f + tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  case OP_RELU: return x > 0.0f ? x : 0.0f;
  case OP_EXP: return exp(x);
  case OP_NEG: return -x;
  case OP_SCALE: return x * p0 + p1;
  case OP_TANH: return tanh(x);
  }
  return x;
}

inline float16 elt_op16(int op, float16 x, float16 y, float p0, float p1) {
  switch (op) {
  case OP_ADD: return x + y;
  case OP_SUB: return x - y;
  case OP_MUL: return x * y;
  case OP_DIV: return x / y;
  case OP_SILU: return x / (1.0f + exp(-x));
  case OP_GELU: return 0.5f * x * (1.0f + tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  case OP_RELU: return select((float16)(0.0f), x, x > 0.0f);
  case OP_EXP: return exp(x);
  case OP_NEG: return -x;
  case OP_SCALE: return x * p0 + p1;
  case OP_TANH: return tanh(x);
  }
  return x;
}

/* each item: 16 consecutive elements as one vector (a scalar tail at the end) */
__kernel void eltwise_f32(int op, gcbytes *a, ulong aoff, gcbytes *b, ulong boff, ulong bn,
                          gbytes *o, ulong ooff, float p0, float p1, ulong n) {
  ulong i0 = get_global_id(0) * 16;
  if (i0 >= n) return;
  __global const float *pa = (__global const float *)(a + aoff);
  __global const float *pb = (__global const float *)(b + boff);
  __global float *po = (__global float *)(o + ooff);
  int binary = op >= OP_ADD && op <= OP_DIV;
  if (i0 + 16 <= n && (!binary || bn == 0 || (bn % 16 == 0))) {
    float16 x = vload16(0, pa + i0), y = (float16)(0.0f);
    if (binary) y = vload16(0, pb + (bn ? i0 % bn : i0));
    vstore16(elt_op16(op, x, y, p0, p1), 0, po + i0);
    return;
  }
  for (ulong i = i0; i < n && i < i0 + 16; i++)
    po[i] = elt_op(op, pa[i], binary ? pb[bn ? i % bn : i] : 0.0f, p0, p1);
}

/* RMS_NORM / LAYER_NORM and SOFTMAX with one work item per row: no barriers (CPU devices) */
__kernel void norm_row(gcbytes *a, ulong aoff, int adt, gbytes *o, ulong ooff, int odt, long K,
                       float eps, int layer, ulong rows) {
  ulong row = get_global_id(0);
  if (row >= rows) return;
  gcbytes *x = a + aoff;
  ulong base = row * (ulong)K;
  if (adt == DT_F32 && odt == DT_F32) { /* 16-wide along the row */
    __global const float *px = (__global const float *)x + base;
    __global float *po = (__global float *)(o + ooff) + base;
    long K16 = K / 16;
    float16 acc = (float16)(0.0f);
    float mean = 0.0f, s2 = 0.0f;
    if (layer) {
      for (long k = 0; k < K16; k++) acc += vload16(k, px);
      float s = hsum16(acc);
      for (long k = K16 * 16; k < K; k++) s += px[k];
      mean = s / (float)K;
      acc = (float16)(0.0f);
    }
    for (long k = 0; k < K16; k++) {
      float16 v = vload16(k, px) - mean;
      acc = mad(v, v, acc);
    }
    s2 = hsum16(acc);
    for (long k = K16 * 16; k < K; k++) s2 = mad(px[k] - mean, px[k] - mean, s2);
    float inv = 1.0f / sqrt(s2 / (float)K + eps);
    for (long k = 0; k < K16; k++) vstore16((vload16(k, px) - mean) * inv, k, po);
    for (long k = K16 * 16; k < K; k++) po[k] = (px[k] - mean) * inv;
    return;
  }
  float mean = 0.0f;
  if (layer) {
    float s = 0.0f;
    for (long k = 0; k < K; k++) s += ld(x, base + k, adt, 1.0f);
    mean = s / (float)K;
  }
  float s2 = 0.0f;
  for (long k = 0; k < K; k++) {
    float v = ld(x, base + k, adt, 1.0f) - mean;
    s2 = mad(v, v, s2);
  }
  float inv = 1.0f / sqrt(s2 / (float)K + eps);
  for (long k = 0; k < K; k++)
    st(o + ooff, base + k, odt, (ld(x, base + k, adt, 1.0f) - mean) * inv, 1.0f);
}

__kernel void softmax_row(gcbytes *a, ulong aoff, int adt, gbytes *o, ulong ooff, int odt, long N,
                          long M, float scale, int causal, long coff, ulong rows) {
  ulong row = get_global_id(0);
  if (row >= rows) return;
  gcbytes *x = a + aoff;
  ulong base = row * (ulong)N;
  long vis = N;
  if (causal) vis = clamp(((long)row % M) + coff + 1, (long)0, N);
  if (adt == DT_F32 && odt == DT_F32) { /* 16-wide along the visible part of the row */
    __global const float *px = (__global const float *)x + base;
    __global float *po = (__global float *)(o + ooff) + base;
    long V16 = vis / 16;
    float16 mv = (float16)(-INFINITY);
    for (long j = 0; j < V16; j++) mv = fmax(mv, vload16(j, px) * scale);
    float8 m8 = fmax(mv.lo, mv.hi);
    float4 m4 = fmax(m8.lo, m8.hi);
    float2 m2 = fmax(m4.lo, m4.hi);
    float m = fmax(m2.x, m2.y);
    for (long j = V16 * 16; j < vis; j++) m = fmax(m, px[j] * scale);
    float16 sv = (float16)(0.0f);
    for (long j = 0; j < V16; j++) {
      float16 e = exp(vload16(j, px) * scale - m);
      vstore16(e, j, po);
      sv += e;
    }
    float s = hsum16(sv);
    for (long j = V16 * 16; j < vis; j++) {
      po[j] = exp(px[j] * scale - m);
      s += po[j];
    }
    float inv = 1.0f / s;
    for (long j = 0; j < V16; j++) vstore16(vload16(j, po) * inv, j, po);
    for (long j = V16 * 16; j < vis; j++) po[j] *= inv;
    for (long j = vis; j < N; j++) po[j] = 0.0f;
    return;
  }
  float m = -INFINITY;
  for (long j = 0; j < vis; j++) m = fmax(m, ld(x, base + j, adt, 1.0f) * scale);
  float s = 0.0f;
  for (long j = 0; j < vis; j++) s += exp(ld(x, base + j, adt, 1.0f) * scale - m);
  float inv = 1.0f / s;
  for (long j = 0; j < N; j++)
    st(o + ooff, base + j, odt, j < vis ? exp(ld(x, base + j, adt, 1.0f) * scale - m) * inv : 0.0f,
       1.0f);
}
