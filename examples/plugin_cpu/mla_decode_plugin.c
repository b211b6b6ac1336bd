/* An mlagate plugin in plain C: MLA decode (absorbed MQA over the paged KV
 * cache) with fp32 logits, softmax and accumulation. It includes
 * mlagate/plugin.h and nothing else of mlagate; CMakeLists.txt builds it
 * anywhere. Try it (backends/plugin/README.md, "Test your kernel in ten minutes"):
 *
 *   mlagate run --plugin build/libmla_decode_example.so --backend example.cpu_decode --suite smoke
 *
 * The decode kernel takes any query length (VARLEN, causal within a request),
 * and the reorder threshold is large, so the layer op sends every request
 * through it. Replace decode() with a call into your own kernel. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlagate/plugin.h"

/* ---- element formats (bit exact) */

static float bf16_to_f32(uint16_t b) {
  const uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  uint32_t u;
  float f;
  if (e == 0) { /* zero or subnormal: m * 2^-24 */
    f = (float)m * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  u = e == 31 ? (sign | 0x7F800000u | (m << 13)) : (sign | ((e + 112u) << 23) | (m << 13));
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Round to nearest even; NaN stays NaN. */
static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static uint16_t f32_to_f16(float f) {
  uint32_t u, a, sign, r;
  memcpy(&u, &f, sizeof u);
  sign = (u >> 16) & 0x8000u;
  a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u); /* NaN */
  if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* >= 65520 rounds to infinity */
  if (a < 0x38800000u) {                                    /* below 2^-14: a multiple of 2^-24 */
    float x;
    memcpy(&x, &a, sizeof x);
    return (uint16_t)(sign | (uint32_t)nearbyintf(x * 16777216.0f));
  }
  r = a - 0x38000000u; /* exponent bias 127 -> 15 */
  r += 0x0FFFu + ((r >> 13) & 1u);
  return (uint16_t)(sign | (r >> 13));
}

/* e4m3fn: bias 7, no infinities, S.1111.111 is NaN. */
static float e4m3_to_f32(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 0x7;
  const float s = (b & 0x80) ? -1.f : 1.f;
  if (e == 15 && m == 7) return NAN;
  return e == 0 ? s * (float)m * 0x1p-9f : s * (1.f + (float)m / 8.f) * ldexpf(1.f, e - 7);
}

static float widen(uint16_t bits, int bf16) { return bf16 ? bf16_to_f32(bits) : f16_to_f32(bits); }

/* One cache entry as fp32 [L + R] (the layouts of mlagate_entry_layout). */
static void load_key(const mlagate_problem* p, const uint8_t* e, float* dst) {
  const int L = p->kv_lora_rank, R = p->rope_dim, bf16 = p->dtype == MLAGATE_DTYPE_BF16;
  int i;
  if (p->kv_cache_dtype == MLAGATE_KV_AUTO) {
    for (i = 0; i < L + R; ++i) {
      const uint8_t* x = e + (i < L ? p->entry.kv_c_offset + 2 * i : p->entry.k_pe_offset + 2 * (i - L));
      dst[i] = widen((uint16_t)(x[0] | (x[1] << 8)), bf16);
    }
  } else { /* fp8, fp8_e4m3: x = e4m3 * k_scale */
    for (i = 0; i < L + R; ++i)
      dst[i] = e4m3_to_f32(e[i < L ? p->entry.kv_c_offset + i : p->entry.k_pe_offset + (i - L)]) * p->k_scale;
  }
}

/* Eight partial sums: vectorizes without reassociating flags. */
static float dot(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, s = 0;
  int i, j;
  for (i = 0; i + 8 <= n; i += 8)
    for (j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  for (; i < n; ++i) s += a[i] * b[i];
  for (j = 0; j < 8; ++j) s += acc[j];
  return s;
}

/* ndim and the given extents (-1: any). */
static int shape_is(const DLTensor* t, int ndim, int64_t d0, int64_t d1, int64_t d2) {
  const int64_t d[3] = {d0, d1, d2};
  int i;
  if (t->ndim != ndim) return 0;
  for (i = 0; i < ndim; ++i)
    if (d[i] >= 0 && t->shape[i] != d[i]) return 0;
  return 1;
}

/* ---- the kernel: each request's keys gathered once to fp32, then per token
 * one pass for the logits of every head and one for the outputs. */
static int32_t decode(const mlagate_problem* p, const mlagate_decode_args* a, char* msg, size_t msg_size) {
  const int L = p->kv_lora_rank, R = p->rope_dim, D = L + R, N = p->num_heads;
  const int B = p->num_requests, T = p->num_tokens, S = p->max_seq_len, bf16 = p->dtype == MLAGATE_DTYPE_BF16;
  const int64_t nb = a->kv_cache.shape[0], bs = a->kv_cache.shape[1], eb = a->kv_cache.shape[2];
  const int64_t W = a->block_table.shape[1];
  const uint16_t *q_lat = a->q_lat.data, *q_pe = a->q_pe.data;
  const uint8_t* cache = a->kv_cache.data;
  const int32_t *table = a->block_table.data, *seq_lens = a->seq_lens.data, *qsl = a->query_start_loc.data;
  uint16_t* o_lat = a->o_lat.data;
  float* lse = a->lse.data;
  float *keys, *q, *logits, *o, *sum;
  int32_t status = MLAGATE_STATUS_OK;
  int b;

  if (!shape_is(&a->q_lat, 3, T, N, L) || !shape_is(&a->q_pe, 3, T, N, R) || !shape_is(&a->o_lat, 3, T, N, L) ||
      !shape_is(&a->lse, 2, T, N, -1) || a->kv_cache.ndim != 3 || eb != p->entry.bytes || bs != p->block_size ||
      !shape_is(&a->block_table, 2, B, -1, -1)) {
    snprintf(msg, msg_size, "decode: unexpected tensor shapes");
    return MLAGATE_STATUS_ERROR;
  }
  keys = malloc(sizeof(float) * ((size_t)S * D + 1));
  q = malloc(sizeof(float) * (size_t)N * D);
  logits = malloc(sizeof(float) * ((size_t)N * S + 1));
  o = malloc(sizeof(float) * (size_t)N * L);
  sum = malloc(sizeof(float) * (size_t)N);
  if (!keys || !q || !logits || !o || !sum) {
    snprintf(msg, msg_size, "decode: out of memory");
    status = MLAGATE_STATUS_ERROR;
    goto done;
  }
  for (b = 0; b < B && status == MLAGATE_STATUS_OK; ++b) {
    const int s = seq_lens[b], q0 = qsl[b], ql = qsl[b + 1] - qsl[b];
    int j, u, n, i;
    for (j = 0; j < s; ++j) {
      const int64_t block = table[(int64_t)b * W + j / bs];
      if (j / bs >= W || block < 0 || block >= nb) {
        snprintf(msg, msg_size, "decode: request %d key %d maps to block %lld of %lld", b, j, (long long)block,
                 (long long)nb);
        status = MLAGATE_STATUS_ERROR;
        break;
      }
      load_key(p, cache + (block * bs + j % bs) * eb, keys + (size_t)j * D);
    }
    for (u = 0; u < ql && status == MLAGATE_STATUS_OK; ++u) {
      const int64_t t = q0 + u;
      int visible = s - ql + u + 1; /* causal: keys 0 .. s - ql + u */
      if (visible < 0) visible = 0;
      if (visible > s) visible = s;
      for (n = 0; n < N; ++n)
        for (i = 0; i < D; ++i)
          q[n * D + i] = widen(i < L ? q_lat[(t * N + n) * L + i] : q_pe[(t * N + n) * R + (i - L)], bf16);
      for (j = 0; j < visible; ++j)
        for (n = 0; n < N; ++n) logits[(size_t)n * S + j] = (float)p->scale * dot(q + n * D, keys + (size_t)j * D, D);
      for (n = 0; n < N; ++n) {
        float m = -INFINITY, l = 0;
        for (j = 0; j < visible; ++j) m = fmaxf(m, logits[(size_t)n * S + j]);
        for (j = 0; j < visible; ++j) {
          float* x = &logits[(size_t)n * S + j];
          *x = expf(*x - m);
          l += *x;
        }
        sum[n] = l;
        lse[t * N + n] = visible > 0 ? m + logf(l) : -INFINITY; /* a row with no key: -inf, o = 0 */
      }
      memset(o, 0, sizeof(float) * (size_t)N * L);
      for (j = 0; j < visible; ++j) {
        const float* k = keys + (size_t)j * D;
        for (n = 0; n < N; ++n) {
          const float w = logits[(size_t)n * S + j];
          float* on = o + (size_t)n * L;
          for (i = 0; i < L; ++i) on[i] += w * k[i];
        }
      }
      for (n = 0; n < N; ++n) {
        const float inv = visible > 0 ? 1.f / sum[n] : 0.f;
        for (i = 0; i < L; ++i) {
          const float x = o[(size_t)n * L + i] * inv;
          o_lat[(t * N + n) * L + i] = bf16 ? f32_to_bf16(x) : f32_to_f16(x);
        }
      }
    }
  }
done:
  free(keys);
  free(q);
  free(logits);
  free(o);
  free(sum);
  return status;
}

static int32_t run(void* self, const mlagate_problem* p, const mlagate_args* a, char* msg, size_t msg_size) {
  (void)self;
  if (p->op != MLAGATE_OP_DECODE) {
    snprintf(msg, msg_size, "example.cpu_decode implements decode only");
    return MLAGATE_STATUS_NOT_SUPPORTED;
  }
  return decode(p, &a->decode, msg, msg_size);
}

/* ---- what mlagate loads */

static const int32_t kBlockSizes[] = {16, 1, 32, 64, 128}; /* the first is the preferred one */

static const mlagate_backend kBackends[] = {{
    .name = "example.cpu_decode",
    .description = "example plugin: MLA decode in plain C, fp32 accumulation",
    .ops = MLAGATE_OP_DECODE,
    .block_sizes = kBlockSizes,
    .num_block_sizes = sizeof kBlockSizes / sizeof kBlockSizes[0],
    .query_len_support = MLAGATE_QUERY_LEN_VARLEN,
    .reorder_threshold = 1 << 20, /* every request is a decode */
    .dtypes = MLAGATE_DTYPE_BF16 | MLAGATE_DTYPE_F16,
    .kv_cache_dtypes = MLAGATE_KV_AUTO | MLAGATE_KV_FP8 | MLAGATE_KV_FP8_E4M3,
    .device = {kDLCPU, 0},
    .self = NULL,
    .supports = NULL, /* the capabilities say it all */
    .run = run,
    .destroy = NULL,
}};

static const mlagate_plugin kPlugin = {
    .abi_version = MLAGATE_PLUGIN_ABI_VERSION,
    .struct_size = sizeof(mlagate_plugin),
    .library = "mla_decode_example",
    .num_backends = 1,
    .backends = kBackends,
};

MLAGATE_PLUGIN_EXPORT const mlagate_plugin* mlagate_plugin_entry(void) { return &kPlugin; }
