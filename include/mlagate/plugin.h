/* mlagate/plugin.h: the whole contract between mlagate and an out-of-tree
 * backend built as a shared library (`mlagate run --plugin lib.so`). Plain C
 * (C99 and C++ both compile it); no C++ type crosses the boundary; tensors are
 * DLPack DLTensors. A plugin includes this header alone, links nothing of
 * mlagate, and exports one function:
 *
 *     MLAGATE_PLUGIN_EXPORT const mlagate_plugin* mlagate_plugin_entry(void);
 *
 * which returns a static table of one or more backends. mlagate checks the ABI
 * version first, then every field (names, capabilities, function pointers),
 * and refuses the library with a message if anything is off.
 *
 * Calls: for each case mlagate asks supports() (when given), then runs the
 * kernel ops through run(): the layer op is composed by mlagate from the
 * backend's decode, prefill and cache_write kernels exactly as for in-tree
 * backends (reference/POLICIES.md, "Ops"); the sparse ops (1.2: DeepSeek
 * V3.2 top-k and V4 window + compressed cache, reference/SPARSE.md) are
 * kernels of their own. One backend instance gets one call at a time.
 *
 * Rules of the boundary:
 *  - No exception may leave supports(), run() or destroy(): catch everything
 *    and return MLAGATE_STATUS_ERROR with a message. A C++ exception that
 *    escapes anyway is caught by mlagate where the unwinder allows (same C++
 *    runtime on Linux) and recorded as CRASHED with a "contract violation"
 *    message; elsewhere it terminates the process. A fault (segfault, illegal
 *    memory access) ends the process: run untrusted kernels through isolation
 *    (worker processes) or the exec backend.
 *  - Outputs are preallocated, poisoned (NaN) and surrounded by guard bands;
 *    write every element of them and nothing else.
 *  - Inputs are read only. The sparse ops' inputs (1.2) are handed over as
 *    private copies that mlagate compares after run(): a write into one (an
 *    index buffer, say) is an INCORRECT record naming the input.
 *  - Strings returned through pointers in the tables must stay valid until
 *    destroy() (static storage is simplest).
 *
 * ABI version 1.3. A change of any struct layout or meaning bumps
 * MLAGATE_PLUGIN_ABI_VERSION; abi_version is the first member of
 * mlagate_plugin in every version, so mlagate can always read it. A minor
 * version only appends fields at the ends of mlagate_plugin and
 * mlagate_backend: a plugin built against an older minor keeps loading (its
 * tables end before the new fields, which read as zero: "not offered"); one
 * built against a newer minor than the host's is refused with a message.
 *   1.0  decode, prefill, cache_write
 *   1.1  graph_ops and prepare() in mlagate_backend (CUDA-graph mode,
 *        `--cuda-graph`); abi_minor and backend_struct_size in mlagate_plugin
 * Zero every table before filling it: static storage (zeroed by the
 * language) or `= {0}` for one built at run time. Fields of a newer minor
 * that a plugin never sets must read as zero ("not offered"); a local
 * mlagate_plugin filled field by field holds garbage there, and mlagate then
 * refuses it ("abi_minor 1802464627 is no minor of ABI 1 ... looks
 * uninitialized"). For example:
 *
 *     static mlagate_backend backends[1];   (static: zeroed)
 *     static mlagate_plugin plugin;         (static: zeroed)
 *     const mlagate_plugin* mlagate_plugin_entry(void) {
 *       backends[0].name = "mykernel.decode";  ... every field the plugin offers
 *       plugin.abi_version = MLAGATE_PLUGIN_ABI_VERSION;
 *       plugin.struct_size = sizeof plugin;
 *       plugin.abi_minor = MLAGATE_PLUGIN_ABI_MINOR;
 *       plugin.backend_struct_size = sizeof(mlagate_backend);
 *       plugin.library = "mykernel"; plugin.num_backends = 1; plugin.backends = backends;
 *       return &plugin;
 *     }
 *
 *   1.2  the sparse ops (MLAGATE_OP_SPARSE_DECODE, MLAGATE_OP_SPARSE_PREFILL:
 *        mlagate_sparse_decode_args, mlagate_sparse_prefill_args appended to
 *        mlagate_args), the fp8_v4 cache (MLAGATE_KV_FP8_V4), and the fields
 *        appended to mlagate_problem that describe them. mlagate_backend and
 *        mlagate_plugin are unchanged (their 1.1 sizes); a plugin of an older
 *        minor that sets a 1.2 bit is refused. The appended structs are read
 *        through struct_size: a 1.1 plugin never looks past its own fields.
 *   1.3  memory layouts (cases/LAYOUTS.md): strided_views and max_pool_bytes
 *        appended to mlagate_backend. A table of an older minor reads both as
 *        0: contiguous tensors and pools of at most 2^31 bytes, as before.
 */
#ifndef MLAGATE_PLUGIN_H_
#define MLAGATE_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#define MLAGATE_PLUGIN_ABI_VERSION 1u
#define MLAGATE_PLUGIN_ABI_MINOR 3u
#define MLAGATE_PLUGIN_ENTRY_SYMBOL "mlagate_plugin_entry"

#if defined(_WIN32)
#define MLAGATE_PLUGIN_EXPORT __declspec(dllexport)
#else
#define MLAGATE_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- DLPack
 * DLDevice, DLDataType and DLTensor as the DLPack specification defines them
 * (dlpack.h v0.8; the layout is unchanged in v1.x). When dlpack.h has been
 * included before this header its definitions are used; otherwise these
 * layout-identical ones are. Include dlpack.h first if you need both. */
#if !defined(DLPACK_VERSION) && !defined(DLPACK_DLPACK_H_) && !defined(DLPACK_MAJOR_VERSION)
#define MLAGATE_DEFINES_DLPACK 1
typedef enum {
  kDLCPU = 1,  /* host memory */
  kDLCUDA = 2, /* CUDA device memory */
  kDLCUDAHost = 3,
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,
  kDLOneAPI = 14,
  kDLWebGPU = 15,
  kDLHexagon = 16
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U
} DLDataTypeCode;

typedef struct {
  uint8_t code;   /* DLDataTypeCode */
  uint8_t bits;   /* bits per lane */
  uint16_t lanes; /* 1 for every tensor mlagate passes */
} DLDataType;

typedef struct {
  void* data;           /* host or device pointer (see device) */
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;       /* [ndim] */
  int64_t* strides;     /* [ndim] in elements; never NULL from mlagate (row-major contiguous) */
  uint64_t byte_offset; /* 0 from mlagate */
} DLTensor;
#endif

/* fp8 elements: DLPack 1.1's code for e4m3fn (OCP FP8 E4M3, finite, NaN 0x7F).
 * No ABI v1 tensor is made of fp8 elements alone: a KV cache entry mixes
 * fields of several types (fp8_ds_mla holds e4m3, fp32 and bf16), so the cache
 * is raw bytes (uint8) and mlagate_problem says how an entry is laid out. */
#define MLAGATE_DL_FLOAT8_E4M3FN 10u

/* dtypes mlagate passes, as DLDataType {code, bits, lanes}:
 *   bfloat16 {kDLBfloat, 16, 1}   float16 {kDLFloat, 16, 1}   float32 {kDLFloat, 32, 1}
 *   int32 {kDLInt, 32, 1}         int64 {kDLInt, 64, 1}       bytes {kDLUInt, 8, 1} */

/* ---------------------------------------------------------------- constants
 * Plain macros, stored in uint32_t/int32_t fields (a C enum's size is the
 * compiler's choice, and bit masks of enum types warn in C++). */

/* Ops; also bits of mlagate_backend.ops. MLAGATE_OP_LAYER only appears in
 * supports() problems: "may the harness compose this case from your kernels?" */
#define MLAGATE_OP_DECODE 1u      /* absorbed MQA over the paged cache: mlagate_decode_args */
#define MLAGATE_OP_PREFILL 2u     /* varlen attention over contiguous k, v: mlagate_prefill_args */
#define MLAGATE_OP_CACHE_WRITE 4u /* new tokens into the paged cache: mlagate_cache_write_args */
#define MLAGATE_OP_LAYER 8u
#define MLAGATE_OP_SPARSE_DECODE 16u  /* 1.2: sparse attention over the paged cache: mlagate_sparse_decode_args */
#define MLAGATE_OP_SPARSE_PREFILL 32u /* 1.2: sparse attention over flat rows: mlagate_sparse_prefill_args */

/* How the decode kernel takes query lengths (vLLM's QueryLenSupport). */
#define MLAGATE_QUERY_LEN_SINGLE_ONLY 0u /* every decode request has q_len 1 */
#define MLAGATE_QUERY_LEN_UNIFORM 1u     /* decode requests share one q_len */
#define MLAGATE_QUERY_LEN_VARLEN 2u      /* any q_len */

/* Model dtypes (bits of mlagate_backend.dtypes; one of them in a problem). */
#define MLAGATE_DTYPE_BF16 1u
#define MLAGATE_DTYPE_F16 2u

/* KV cache dtypes (bits of mlagate_backend.kv_cache_dtypes; one in a problem).
 * Entry layouts are given in mlagate_entry_layout. */
#define MLAGATE_KV_AUTO 1u       /* L + R elements of the model dtype */
#define MLAGATE_KV_FP8 2u        /* L + R bytes of e4m3fn, x = e4m3 * k_scale */
#define MLAGATE_KV_FP8_E4M3 4u   /* the same as FP8 on NVIDIA */
#define MLAGATE_KV_FP8_DS_MLA 8u /* DeepSeek V3.2: e4m3 kv_c in 128-element tiles, fp32 tile scales, bf16 k_pe */
#define MLAGATE_KV_FP8_V4 16u    /* 1.2: DeepSeek V4, 584-byte entries split per page (reference/SPARSE.md, fp8_v4):
                                    the cache tensor is [num_blocks, block_bytes] (see mlagate_problem) */

/* fp8_ds_mla tile-scale rule the cache was written with. */
#define MLAGATE_SCALE_RULE_POW2 0u
#define MLAGATE_SCALE_RULE_RAW 1u

/* What run() returns. Anything else is recorded as CRASHED. */
#define MLAGATE_STATUS_OK 0
#define MLAGATE_STATUS_NOT_SUPPORTED 1 /* this call cannot be served: a NOT_SUPPORTED record */
#define MLAGATE_STATUS_ERROR 2         /* the kernel failed: a CRASHED record with the message */
#define MLAGATE_STATUS_UNAVAILABLE 3   /* the device is absent (no GPU): a SKIPPED record */

/* ---------------------------------------------------------------- problem */

/* One token's cache entry, byte offsets within the entry (every multi-byte
 * field little endian):
 *   auto        kv_c [L] then k_pe [R], model dtype (elem bytes 2, 2)
 *   fp8, e4m3   e4m3(kv_c / k_scale) [L] then e4m3(k_pe / k_scale) [R] (1, 1)
 *   fp8_ds_mla  e4m3 kv_c [L] / tile scale, the L/128 tile scales as fp32 at
 *               scale_offset, then k_pe [R] as bf16 (1, 2); 656 bytes for L 512, R 64
 *   fp8_v4      (1.2) e4m3 kv_c [L] / tile scale in tiles of 64, k_pe [R] as bf16
 *               at L, then the L/64 tile scales as UE8M0 bytes (2^(b - 127)) at
 *               scale_offset and one pad byte: 584 bytes for L 448, R 64. NOT
 *               contiguous in the cache: a block holds every token's first
 *               data_bytes (576) bytes, then every token's remaining bytes (8),
 *               then padding up to block_bytes (mlagate_problem); byte i of the
 *               entry of row r in block b sits at
 *                 b * block_bytes + r * data_bytes + i                         (i < data_bytes)
 *                 b * block_bytes + block_size * data_bytes
 *                   + r * (bytes - data_bytes) + (i - data_bytes)              (otherwise) */
typedef struct {
  int32_t bytes;           /* entry size = the cache tensor's last extent */
  int32_t kv_c_offset;     /* first kv_c element */
  int32_t kv_c_elem_bytes; /* 2: model dtype; 1: e4m3fn */
  int32_t k_pe_offset;
  int32_t k_pe_elem_bytes; /* 2: model dtype (auto) or bf16 (fp8_ds_mla); 1: e4m3fn */
  int32_t scale_offset;    /* fp8_ds_mla: fp32 tile scales; 0 otherwise */
  int32_t scale_count;     /* fp8_ds_mla: L / 128; 0 otherwise */
} mlagate_entry_layout;

/* What is asked: in supports(), a whole case (op = the op the harness will
 * run, MLAGATE_OP_LAYER included); in run(), exactly this call (its requests
 * and tokens). Every pointer here is host memory, valid during the call. */
typedef struct {
  uint32_t struct_size; /* sizeof(mlagate_problem) of the host */
  uint32_t op;          /* one MLAGATE_OP_* */
  const char* case_id;  /* "vllm/mixed_small/tp8/bf16/kv=auto/bs=auto/seed=0"; for messages, "" if unknown */

  int32_t kv_lora_rank;  /* L: latent width of the cache (512) */
  int32_t rope_dim;      /* R (64) */
  int32_t nope_dim;      /* P (128); 0 in run() when unknown */
  int32_t v_head_dim;    /* V (128); 0 in run() when unknown */
  int32_t num_heads;     /* N: query heads on this rank */

  int32_t num_requests;        /* B */
  int32_t num_tokens;          /* T = sum of query_lens */
  int64_t num_kv_tokens;       /* sum of seq_lens */
  const int32_t* seq_lens;     /* [B] decode, layer: keys of each request; prefill: k lengths */
  const int32_t* query_lens;   /* [B] new tokens (queries) of each request */
  int32_t max_seq_len;
  int32_t max_query_len;
  uint32_t query_len_support;  /* what this batch needs: SINGLE_ONLY (all q_len 1), UNIFORM (all equal), VARLEN */
  int32_t reorder_threshold;   /* layer: requests with q_len <= this take the decode path (the
                                  backend's threshold, raised to the longest query for spec decode) */
  int32_t spec_decode;         /* 1: a spec-decode batch (uniform multi-token decodes) */

  uint32_t dtype;              /* MLAGATE_DTYPE_*: model dtype of q, k, v, outputs and auto caches */
  DLDataType dl_dtype;         /* the same as a DLDataType */
  uint32_t kv_cache_dtype;     /* MLAGATE_KV_* */
  uint32_t scale_rule;         /* MLAGATE_SCALE_RULE_*: fp8_ds_mla tile scales */
  mlagate_entry_layout entry;  /* the cache entry's layout */
  int32_t block_size;          /* tokens per cache block (resolved: never "auto") */

  double scale;                /* softmax scale */
  float k_scale;               /* fp8, fp8_e4m3: x = e4m3 * k_scale (1 otherwise) */
  int32_t causal;              /* prefill: 1 bottom-right causal, 0 every query sees every key */
  DLDevice device;             /* where the args' tensors live (the backend's device) */

  /* ---- ABI 1.2 (a 1.1 host's problem ends here: check struct_size) ---- */
  /* The cache entry, beyond mlagate_entry_layout (0 where no cache is involved). */
  int32_t scale_elem_bytes;    /* 4: fp32 tile scales (fp8_ds_mla); 1: UE8M0 bytes (fp8_v4); 0: none */
  int32_t scale_tile;          /* kv_c elements per tile scale: 128 (fp8_ds_mla), 64 (fp8_v4); 0: none */
  int32_t data_bytes;          /* fp8_v4: entry bytes in a block's data region (576); entry.bytes otherwise */
  int64_t block_bytes;         /* bytes of one cache block: block_size * entry.bytes, fp8_v4 padded pages */
  /* The sparse ops (reference/SPARSE.md); all 0 for the dense ops. In
     supports() they describe the case, in run() exactly this call's tensors. */
  int32_t topk;                /* V3.2: index slots per token (indices' width K); sparse_prefill: the
                                  row width (V4: window + extra_topk); 0 for a V4 sparse_decode */
  int32_t window;              /* V4: sliding window over the main cache; 0 for V3.2 */
  int32_t compress_ratio;      /* V4: the compressed cache holds one entry per this many tokens (4, 128); 0: none */
  int32_t extra_topk;          /* V4: index slots per token into the compressed cache (K2); 0: none */
  int32_t extra_block_size;    /* V4: tokens per block of the compressed cache; 0: none */
  int32_t has_sink;            /* 1: a per-head attention sink is given (args' sink) */
  int32_t value_dim;           /* Dv, the output's last extent: L (V3.2) or L + R (V4: the value is the whole entry) */
  int64_t num_kv_rows;         /* sparse_prefill: S_kv, the rows of kv (an index >= S_kv names no key); 0 otherwise */
} mlagate_problem;

/* ---------------------------------------------------------------- arguments
 * Shapes below; every tensor row-major contiguous on problem->device. */

/* Absorbed decode: query row (t, n) of request b (t in its query_start_loc
 * range, u = t - query_start_loc[b]) sees keys 0 .. seq_lens[b] - q_len_b + u of
 * its request; key p sits in block block_table[b][p / block_size], row
 * p % block_size. lse is the natural log of the sum of exp(scale * logit);
 * a row with no key writes o_lat = 0 and lse = -inf (or +inf). */
typedef struct {
  DLTensor q_lat;           /* [T, N, L] model dtype: q_nope absorbed through W_UK */
  DLTensor q_pe;            /* [T, N, R] model dtype */
  DLTensor kv_cache;        /* [num_blocks, block_size, entry_bytes] uint8, read only */
  DLTensor block_table;     /* [B, W] int32: this call's requests' rows */
  DLTensor seq_lens;        /* [B] int32 */
  DLTensor query_start_loc; /* [B + 1] int32 */
  DLTensor o_lat;           /* out [T, N, L] model dtype */
  DLTensor lse;             /* out [T, N] float32 */
} mlagate_decode_args;

/* Prefill: ordinary attention; query u of request b (q_len q, k_len k) sees
 * keys 0 .. k - q + u when problem->causal, all k keys otherwise. */
typedef struct {
  DLTensor q;            /* [T, N, P + R] model dtype */
  DLTensor k;            /* [Sk, N, P + R] model dtype */
  DLTensor v;            /* [Sk, N, V] model dtype */
  DLTensor cu_seqlens_q; /* [B + 1] int32 */
  DLTensor cu_seqlens_k; /* [B + 1] int32 */
  DLTensor o;            /* out [T, N, V] model dtype */
  DLTensor lse;          /* out [T, N] float32 */
} mlagate_prefill_args;

/* cache_write: row i of kv_c and k_pe goes to slot slot_mapping[i] (block
 * slot / block_size, row slot % block_size), encoded as problem->entry says;
 * negative slots are skipped. Nothing else of the cache may change: the
 * cache_write op compares every byte with mlagate's reference writer. */
typedef struct {
  DLTensor kv_c;         /* [n, L] model dtype */
  DLTensor k_pe;         /* [n, R] model dtype */
  DLTensor slot_mapping; /* [n] int64 */
  DLTensor kv_cache;     /* in/out [num_blocks, block_size, entry_bytes] uint8 */
} mlagate_cache_write_args;

/* Sparse decode (1.2; FlashMLA's sparse flash_mla_with_kvcache): MQA in the
 * latent space, every head of token t reads the same keys; a key is a whole
 * cache entry [kv_c | k_pe] (dequantized as problem->entry says), its value
 * the first value_dim elements of it. The keys of token t are:
 *   V3.2 (problem->window 0): the slots of indices[t, 0 .. topk_length[t])
 *        (all topk slots without topk_length); -1 names none; a slot names
 *        block slot / block_size, row slot % block_size of kv_cache (global
 *        slots: no block table). Duplicates count twice. Slots past
 *        topk_length may name poisoned entries: never read them.
 *   V4 (window > 0): the keys max(0, p - window + 1) .. p of its request, p =
 *        seq_lens[b] - q_len_b + (t - query_start_loc[b]), read through
 *        block_table; plus the compressed cache's slots of
 *        extra_indices[t, 0 .. extra_topk_length[t]) when extra_kv_cache is given.
 * Then logit_j = scale * <q[t,h,:], key_j>, lse = log sum_j exp(logit_j) (the
 * sink left out), o[t,h] = sum_j exp(logit_j - lse) value_j / (1 + exp(sink[h] - lse)).
 * A row with no key: o = 0 and lse = -inf or +inf (FlashMLA), never NaN.
 * An absent tensor has data NULL and ndim 0. */
typedef struct {
  DLTensor q;                 /* [T, N, L + R] model dtype: absorbed q_lat then q_pe */
  DLTensor kv_cache;          /* [num_blocks, block_size, entry_bytes] uint8 (fp8_v4: [num_blocks, block_bytes]) */
  DLTensor block_table;       /* [B, W] int32: this call's requests' rows (V4's window reads through it) */
  DLTensor seq_lens;          /* [B] int32 */
  DLTensor query_start_loc;   /* [B + 1] int32 */
  DLTensor indices;           /* V3.2: [T, topk] int32 global slots of kv_cache, -1 = none; V4: absent */
  DLTensor topk_length;       /* [T] int32, or absent: every slot counts */
  DLTensor extra_kv_cache;    /* V4's compressed cache (same kv dtype and layout, extra_block_size), or absent */
  DLTensor extra_indices;     /* [T, extra_topk] int32 global slots of extra_kv_cache, -1 = none; or absent */
  DLTensor extra_topk_length; /* [T] int32, or absent */
  DLTensor sink;              /* [N] float32 per-head sink logits, or absent (problem->has_sink 0) */
  DLTensor o;                 /* out [T, N, value_dim] model dtype */
  DLTensor lse;               /* out [T, N] float32 */
} mlagate_sparse_decode_args;

/* Sparse prefill (1.2; FlashMLA's flash_mla_sparse_fwd): the same math over a
 * flat array of dequantized model-dtype rows (a serving engine gathers its
 * caches into such a workspace); index k names row k; -1 and any k >=
 * problem->num_kv_rows name no key. Rows not named may hold NaN. */
typedef struct {
  DLTensor q;           /* [T, N, L + R] model dtype */
  DLTensor kv;          /* [num_kv_rows, L + R] model dtype */
  DLTensor indices;     /* [T, topk] int32 */
  DLTensor topk_length; /* [T] int32, or absent */
  DLTensor sink;        /* [N] float32, or absent */
  DLTensor o;           /* out [T, N, value_dim] model dtype */
  DLTensor lse;         /* out [T, N] float32 */
} mlagate_sparse_prefill_args;

typedef struct {
  uint32_t struct_size; /* sizeof(mlagate_args) of the host */
  /* kDLCUDA backends: the cudaStream_t to launch on (NULL: the default
     stream). mlagate synchronizes it after run() returns, then checks the
     guard bands and copies the outputs back. */
  void* stream;
  mlagate_decode_args decode;           /* problem->op == MLAGATE_OP_DECODE */
  mlagate_prefill_args prefill;         /* problem->op == MLAGATE_OP_PREFILL */
  mlagate_cache_write_args cache_write; /* problem->op == MLAGATE_OP_CACHE_WRITE */
  /* ---- ABI 1.2 ---- */
  mlagate_sparse_decode_args sparse_decode;   /* problem->op == MLAGATE_OP_SPARSE_DECODE */
  mlagate_sparse_prefill_args sparse_prefill; /* problem->op == MLAGATE_OP_SPARSE_PREFILL */
} mlagate_args;

/* ---------------------------------------------------------------- backends */

typedef struct {
  /* Unique among all backends of the run (in-tree ones included); letters,
     digits and . _ - only, as --backend globs match it ("mykernel.decode"). */
  const char* name;
  const char* description; /* one line */

  /* Capabilities: mlagate checks them before asking supports(). */
  uint32_t ops;                /* MLAGATE_OP_DECODE | PREFILL | CACHE_WRITE, 1.2: | SPARSE_DECODE | SPARSE_PREFILL
                                  (not LAYER); a backend of sparse ops alone is fine */
  const int32_t* block_sizes;  /* [num_block_sizes], the preferred one first (bs=auto) */
  int32_t num_block_sizes;     /* >= 1 */
  uint32_t query_len_support;  /* MLAGATE_QUERY_LEN_* of the decode kernel */
  int32_t reorder_threshold;   /* requests with q_len <= this are decodes (>= 1) */
  uint32_t dtypes;             /* MLAGATE_DTYPE_* mask, non-zero */
  uint32_t kv_cache_dtypes;    /* MLAGATE_KV_* mask, non-zero (FP8_V4: 1.2) */
  DLDevice device;             /* kDLCPU: host pointers; kDLCUDA: device pointers on device_id */

  void* self; /* passed back to every call */

  /* (optional, may be NULL: the capabilities decide) nonzero: supported; 0:
     not, with the reason written to reason[0 .. reason_size) NUL-terminated.
     Asked once per case and op (problem->op LAYER for the composed layer). */
  int32_t (*supports)(void* self, const mlagate_problem* problem, char* reason, size_t reason_size);
  /* Runs problem->op on the args. Returns MLAGATE_STATUS_*; on anything but
     OK writes a NUL-terminated message to message[0 .. message_size). */
  int32_t (*run)(void* self, const mlagate_problem* problem, const mlagate_args* args, char* message,
                 size_t message_size);
  /* (optional, may be NULL) called once when mlagate is done with the library's
     backends, before it releases the library. */
  void (*destroy)(void* self);

  /* ---- ABI 1.1 (a 1.0 table ends here: both read as 0 / NULL) ---- */

  /* Ops whose run() may be captured in a CUDA graph and replayed, as a serving
     engine captures its decode once per batch size (`--cuda-graph`,
     harness/run/SERVING.md): MLAGATE_OP_DECODE or 0. What mlagate does then:
       - it allocates the args' tensors once, of the captured shapes (a batch
         padded to a capture size with requests of seq_len 0 or 1), and keeps
         their addresses for every replay; outputs are poisoned once, never
         again (what a replay does not write keeps what the last one left);
       - kDLCUDA: calls prepare() and run() once eagerly (the warm-up), then
         captures run() alone with cudaStreamBeginCapture on args->stream;
         each replay copies the new batch into the same buffers, calls
         prepare() (outside the graph) and launches the graph;
       - kDLCPU: a host emulation, prepare() and run() on the same buffers.
     So a capturable run() launches on args->stream only, neither synchronizes
     nor allocates, and takes everything that changes between batches of the
     same shapes from the args' buffers or from workspaces that prepare()
     refreshes in place (same addresses): never from values captured with the
     graph (vLLM #35175: metadata allocated afresh while the graph replays the
     captured addresses). Backends without graph ops are NOT_SUPPORTED there. */
  uint32_t graph_ops;
  /* (optional, may be NULL) called before every run() with the same problem
     and args, eager calls included, and before every replay in graph mode:
     the part of a call a serving engine runs outside its graph (scheduling,
     split counts, tile metadata from problem->seq_lens, written into the
     plugin's own persistent buffers on args->stream). Returns and reports as
     run() does. */
  int32_t (*prepare)(void* self, const mlagate_problem* problem, const mlagate_args* args, char* message,
                     size_t message_size);

  /* ---- ABI 1.3 (an older table ends here: both read as 0) ---- */

  /* Nonzero: the decode op's q_lat, q_pe, o_lat and lse may come as strided
     views, as vLLM hands them (the `strided` layout): DLTensor.strides as
     given (the last dim's stride 1), q_lat and q_pe slices of one fused
     [T, N, L+R] tensor, o_lat and lse inside larger buffers whose other bytes
     must stay as they are (mlagate checks them). A kDLCUDA backend gets each
     view's whole span on the device (data points at its first element, the
     padding between rows included), the outputs' padding holding mlagate's
     bytes. 0: contiguous. */
  uint32_t strided_views;
  /* The largest page pool the kernels address, in bytes (the `pool2g` and
     `pool4g` layouts put a case's pages past 2^31 and 2^32 bytes of the
     pool: NOT_SUPPORTED past this). 0: 2^31, what signed 32-bit byte offsets
     reach. */
  int64_t max_pool_bytes;
} mlagate_backend;

typedef struct {
  uint32_t abi_version;  /* MLAGATE_PLUGIN_ABI_VERSION; always the first member */
  uint32_t struct_size;  /* sizeof(mlagate_plugin) */
  const char* library;   /* the library's name, for messages */
  int32_t num_backends;  /* >= 1 */
  const mlagate_backend* backends; /* [num_backends], backend_struct_size bytes apart */
  /* ---- ABI 1.1 (a 1.0 table's struct_size ends here: minor 0, the 1.0 stride) ---- */
  uint32_t abi_minor;           /* MLAGATE_PLUGIN_ABI_MINOR of the header the plugin was built against */
  uint32_t backend_struct_size; /* sizeof(mlagate_backend) of that header */
} mlagate_plugin;

/* The one exported symbol. Called once per load; the table it returns must
   stay valid until the library is unloaded. NULL refuses the load. */
typedef const mlagate_plugin* (*mlagate_plugin_entry_fn)(void);
MLAGATE_PLUGIN_EXPORT const mlagate_plugin* mlagate_plugin_entry(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MLAGATE_PLUGIN_H_ */
