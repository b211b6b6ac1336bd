// The case model: every parameter of one MLA problem (SPEC: Dimensions and Inputs)
// and its stable id string, the key for filters, reports and repro commands.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cases/dtype.h"
#include "cases/op.h"

namespace mlagate {

// MLA dimensions. DeepSeek V2/V3/R1 defaults; "glm" is the second set vLLM sweeps.
struct Dims {
  int kv_lora_rank = 512;  // L: latent width of the cache
  int rope_dim = 64;       // R: qk_rope_head_dim
  int nope_dim = 128;      // P: qk_nope_head_dim
  int v_head_dim = 128;    // V
  int head_size() const { return kv_lora_rank + rope_dim; }  // D = L + R
  bool operator==(const Dims&) const = default;
};
Dims dims_preset(const std::string& name);  // "deepseek" | "glm" | "v4" (L 448, R 64) | "nope" (L 512, R 0) | "L.R.P.V"; throws InputError
std::string dims_label(const Dims& d);      // "deepseek", "glm", "v4", "nope" or "L.R.P.V"

// A batch: per-request total lengths and new-token counts (SPEC: Batch specs).
struct BatchSpec {
  std::string name;
  std::vector<int> seq_lens;    // s_i = context + new tokens
  std::vector<int> query_lens;  // q_i = new tokens; c_i = s_i - q_i is cached context
  bool spec_decode = false;     // uniform multi-token decodes (threshold raised to q_len)
  std::string note;             // why the spec exists (edges)
};

// DeepSeek V3.2 sparse (DSA) and V4 attention: which keys each query token
// attends to in the sparse_decode and sparse_prefill ops. A dense case has
// topk 0 and window 0. Every index set is drawn from the case's generator as
// positions within the token's request, then converted to global slots of
// each paged cache (cases/sparse.h).
enum class IndexPattern : std::uint8_t {
  kRandom,       // distinct random visible positions, -1 for the unused slots, in random order
  kDuplicates,   // as random, with every fourth valid index a copy of another one
  kInvalidRows,  // as random, but every third token's indices are all -1 (no key: output 0)
  kLengths,      // topk_length given; the slots past it name poisoned (null-block) entries
  kOutOfRange,   // as random, but the unused slots name indices >= s_kv instead of -1 (FlashMLA's
                 // other invalid form; only sparse_prefill defines it: reference/SPARSE.md)
  kLengthsGarbage,  // as lens, but the slots past topk_length hold garbage, never -1: real keys of
                    // the request, poisoned slots and indices past the pool (flashinfer #5095)
};
// Every pattern, in the order names are listed (the one list: parsing, explore).
const std::vector<IndexPattern>& index_patterns();
std::string_view index_pattern_name(IndexPattern p);  // "random", "dup", "invalid_rows", "lens", "oob", "lens_garbage"
IndexPattern parse_index_pattern(std::string_view s);  // throws InputError
// Whether rows come with topk_length (the slots past it are never read).
constexpr bool has_topk_length(IndexPattern p) { return p == IndexPattern::kLengths || p == IndexPattern::kLengthsGarbage; }

struct SparseSpec {
  int topk = 0;        // V3.2: index slots per token into the case's cache (any width, not only multiples of 64)
  int window = 0;      // V4: sliding window (SWA) over the case's cache: positions p - window + 1 .. p
  int compress = 0;    // V4: ratio of the compressed cache (4: C4A, 128: C128A); 0: no compressed part
  int extra_topk = 0;  // V4: index slots per token into the compressed cache
  bool sink = false;   // an attention sink per head: a logit in the softmax denominator with no value
  IndexPattern pattern = IndexPattern::kRandom;
  bool active() const { return topk > 0 || window > 0; }
  bool v4() const { return window > 0; }  // V4: the value is the whole entry (L + R), not the latent alone
  bool operator==(const SparseSpec&) const = default;
};

// vLLM's merge_attn_states (the merge_states op, cases/merge.h): two partial
// attention results of the same rows, each an output [T, N, D] and an lse
// [T, N], merged through their LSEs. A merge case's tokens are its batch's
// query tokens (a suite's `tokens: [T]` makes one request with seq_len =
// query_len = T; the requests only locate rows in messages), its heads
// num_heads(), its output dtype the case's dtype (bf16, fp16 or fp32 here;
// lse is fp32).
// What fills each (token, head) row's two lse values:
enum class LsePattern : std::uint8_t {
  kOrdinary,     // both finite
  kPrefixEmpty,  // prefix lse -inf (no key on that side; its output rows 0)
  kSuffixEmpty,  // suffix lse -inf
  kPrefixPosInf, // prefix lse +inf: FlashAttention 2's empty row; means empty, as -inf
  kSuffixPosInf, // suffix lse +inf
  kBothEmpty,    // both -inf: no key at all (output 0, lse -inf)
  kBothPosInf,   // both +inf
  kMixed,        // every row one of the above, drawn per row (ordinary rows most often)
};
std::string_view lse_pattern_name(LsePattern p);  // "ordinary", "prefix_empty", ..., "mixed"
LsePattern parse_lse_pattern(std::string_view s);  // throws InputError

struct MergeSpec {
  int head_dim = 0;           // D; 0: not a merge case
  LsePattern lse = LsePattern::kOrdinary;
  double gap = 0;             // |prefix lse - suffix lse| of the finite rows (sign drawn per row); 0: both drawn freely
  bool active() const { return head_dim > 0; }
  bool operator==(const MergeSpec&) const = default;
};

// Where a case's tensors and pages live in memory (cases/LAYOUTS.md): what a
// serving engine hands a kernel rather than fresh contiguous tensors of one
// request each. Every layout is judged against the same fp64 reference as the
// contiguous one: only addresses change, never values.
enum class PoolSize : std::uint8_t {
  kFitted,  // the pool holds the case's blocks, the null block and the spares
  k2G,      // the case's pages at the top of a pool past 2^31 bytes (signed 32-bit offsets wrap)
  k4G,      // the same past 2^32 bytes (unsigned 32-bit offsets wrap)
};
struct LayoutSpec {
  // q_lat and q_pe slices of one fused [T, N, L+R] tensor; o_lat and lse
  // written into larger buffers (padded rows, the padding checked untouched);
  // the cache one layer's slice of a stacked three-layer cache (nonzero
  // offset, the other layers checked untouched).
  bool strided = false;
  // Prefix caching: every request with cached context maps its first full
  // blocks of the common prefix to the same physical blocks.
  bool shared = false;
  PoolSize pool = PoolSize::kFitted;
  bool contiguous() const { return !strided && !shared && pool == PoolSize::kFitted; }
  // Bytes the pool's offsets pass (0, 2^31 or 2^32).
  std::int64_t pool_floor_bytes() const;
  bool operator==(const LayoutSpec&) const = default;
};
// "contiguous", or the parts joined by '+' in this order: "strided", "shared", "pool2g" | "pool4g".
std::string layout_name(const LayoutSpec& l);
LayoutSpec parse_layout(std::string_view s);  // throws InputError
// contiguous and every single-part layout (explore's default draw).
const std::vector<LayoutSpec>& layout_values();

struct CaseSpec {
  std::string suite = "adhoc";  // label only; part of the id
  BatchSpec batch;
  Dims dims;
  int total_heads = 128;  // heads of the model; this rank has total_heads / tp
  int tp = 1;
  DType dtype = DType::kBF16;  // model dtype: bf16 | fp16
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
  ScaleRule scale_rule = ScaleRule::kPow2;  // fp8_ds_mla tile scales; must stay kPow2 for other dtypes
  int block_size = 0;  // 0: each backend uses its preferred block size ("bs=auto")
  std::uint64_t seed = 0;
  double q_magnitude = 1.0;      // q is drawn N(0, q_magnitude^2)
  std::optional<double> scale;   // softmax scale; default 1/sqrt(L+R)
  float k_scale = 1.0f;          // per-tensor cache scale: fp8 and fp8_e4m3 store x / k_scale
                                 // (auto ignores it; fp8_ds_mla must ignore it, its scales are per tile)
  // A what-if of `mlagate triage` (harness/verdicts/VERDICTS.md): the harness
  // reads the fp8 / fp8_e4m3 cache (reference, emulation, layer glue) with
  // k_scale rounded to the model dtype, as a kernel that converts the scale to
  // bf16 sees it; the cache's bytes and the k_scale backends get are unchanged.
  bool reference_k_scale_rounded = false;

  SparseSpec sparse;             // sparse ops only (cases/sparse.h)
  MergeSpec merge;               // the merge_states op only (cases/merge.h)
  LayoutSpec layout;             // memory layout (cases/LAYOUTS.md); contiguous by default
  // The ops this case runs in (a suite group's `ops`): a run gives it a record
  // in each op of its --op that is listed here; empty: every op of the run.
  // Not part of the id: a record names its op. explore's rounds give each
  // drawn case its op, so one run per round covers every op.
  std::vector<Op> ops;
  bool takes(Op op) const;

  KvCacheFormat kv_format() const { return {kv_cache_dtype, scale_rule}; }
  // Width of the sparse ops' output per head: V3.2 returns the latent (L),
  // V4 the whole entry (L + R: its value is the key).
  int sparse_dv() const { return sparse.v4() ? dims.kv_lora_rank + dims.rope_dim : dims.kv_lora_rank; }

  int num_heads() const { return total_heads / tp; }
  double softmax_scale() const;
  int num_requests() const { return static_cast<int>(batch.seq_lens.size()); }
  int num_tokens() const;     // T = sum q_i
  int num_kv_tokens() const;  // S = sum s_i
  // "vllm/mixed_small/tp1/bf16/kv=auto/bs=16/seed=0" [+ "/dims=glm" "/qmag=8" "/scale=0.1" "/layout=strided"];
  // the kv part is kv_cache_format_name(): "kv=fp8", "kv=fp8_ds_mla:raw".
  std::string id() const;
  // Throws InvalidCase with the reason if the parameters cannot form a problem.
  void validate() const;
};

}  // namespace mlagate
