// A materialized case: the inputs of one CaseSpec, drawn from the generator in
// fp64 and rounded to the model dtype. The rounded values ARE the inputs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "cases/case_spec.h"
#include "cases/tensor.h"

namespace mlagate {

struct SparseInputs;  // cases/sparse.h
struct MergeInputs;   // cases/merge.h

struct Case {
  CaseSpec spec;
  int num_requests = 0;  // B
  int num_tokens = 0;    // T = sum q_i
  int num_kv_tokens = 0; // S = sum s_i
  std::vector<std::int32_t> seq_lens;         // [B]
  std::vector<std::int32_t> query_lens;       // [B]
  std::vector<std::int32_t> context_lens;     // [B] c_i = s_i - q_i
  std::vector<std::int32_t> query_start_loc;  // [B+1] token offsets into q
  std::vector<std::int32_t> kv_start_loc;     // [B+1] token offsets into kv_c / k_pe

  Tensor q;     // [T, N, P+R]  model dtype (q_nope then q_pe)
  Tensor kv_c;  // [S, L]       every request's tokens, context then new, request-major
  Tensor k_pe;  // [S, R]
  Tensor w_uk;  // [L, N, P]    N(0,1)/sqrt(L)
  Tensor w_uv;  // [L, N, V]    N(0,1)/sqrt(L)

  // fp8 caches only (empty for auto): kv_c and k_pe as a correct reader sees
  // them in the cache, decode(encode(x)) with the reference writer's encoding
  // (cases/fp8.h), in fp32. The reference attends over these (SPEC: KV cache dtypes).
  Tensor kv_c_cache;  // [S, L] float32
  Tensor k_pe_cache;  // [S, R] float32
  // Whether every value of kv_c_cache and k_pe_cache is exact in the model
  // dtype, found by fill_cache_values in the same pass (a read of the whole
  // cache where cache_values_exact asks it again: 4% of a GPU run's host CPU).
  std::optional<bool> cache_values_exact_memo;
  // Drawn for the cache_write op alone (generate_case's keys_only): the
  // latent rows kv_c and k_pe only; q, the weights and the cache values stay
  // empty. No reference reads such a case; CaseStream never hands it on to a
  // case that takes another op.
  bool keys_only = false;

  // Sparse cases (spec.sparse.active()): index sets, sink, V4's compressed
  // cache (cases/sparse.h); shared and never modified once drawn.
  std::shared_ptr<const SparseInputs> sparse;
  // Merge cases (spec.merge.active()): the two partial results, and nothing
  // else (q, the caches' rows and the weights stay empty).
  std::shared_ptr<const MergeInputs> merge;
};

// Fills kv_c_cache / k_pe_cache from kv_c / k_pe for the spec's kv cache dtype
// (every token through the reference encoding and back; empty for auto).
void fill_cache_values(Case& c);

// Layout shared (prefix caching): the number P of leading context tokens the
// requests with at least P tokens of context have in common, 0 for other
// layouts. P is the request context that shares the most tokens ((requests
// with context >= P) - 1) x P, the longer on a tie: a batch of similar
// contexts shares its shortest. generate_case makes those requests' first P
// kv_c and k_pe rows the first such request's; the cache maps their full
// blocks to the same pages.
int shared_prefix_tokens(const CaseSpec& spec);

// t (bf16 or fp16) = factor x the normals of (seed, name), element i the
// generator's normal i, rounded to t's dtype (RNE).
void fill_normal(Tensor& t, std::uint64_t seed, const char* name, double factor = 1.0);

// Validates the spec (InvalidCase) and draws the inputs. keys_only: the
// latent rows alone (Case::keys_only), for a case that takes only the
// cache_write op: its values are the full case's, the rest is not drawn (a
// 240,000-token fp8 case: 554 MB of fp32 cache values and 12 million
// normals of weights that no check reads).
Case generate_case(const CaseSpec& spec, bool keys_only = false);
// Whether generate_case keeps its large drawn tensors (the latent rows and
// weights) for a later case of the same seed; on unless turned off. A run
// whose cases all have distinct seeds (explore's rounds) turns it off: no
// later case could use them, and copying them in cost a memcpy and the
// fresh pages of each copy. The values drawn are the same either way.
void set_keep_drawn_inputs(bool keep);
// Whether two of these cases share a seed. A drawn tensor's values (and its
// key in the keep list and the run's input store) hold its seed, so where
// every seed is distinct no case can use a tensor another one drew: nothing
// is worth keeping or sharing between workers.
bool seeds_repeat(std::span<const CaseSpec> cases);
// The case fields the spec alone gives (counts, per-request lengths and
// offsets), tensors empty and the spec not validated: generate_case starts
// from it, and readers of stored inputs (golden files) fill the tensors.
Case case_layout(const CaseSpec& spec);

// The inputs depend on neither the kv cache dtype, its scale rule, k_scale nor
// the block size: cases with equal keys draw identical tensors.
std::string inputs_key(const CaseSpec& spec);
// Cases with equal keys have equal inputs and equal cache values (kv_c_cache,
// k_pe_cache), hence equal references: fp8 and fp8_e4m3 are the same format,
// and k_scale only matters to fp8 and fp8_e4m3.
std::string cache_values_key(const CaseSpec& spec);
// Cases with equal keys differ at most in their seed and what inputs_key
// leaves out: every backend call gets tensors of the same shapes and dtypes,
// so what a backend sets up once per shape in a process (cuDNN's compiled
// SDPA kernels, plans, workspaces) serves all of them (GroupQueue's families).
std::string shape_key(const CaseSpec& spec);
// Turns a generated case into the case of `spec`, whose inputs_key must be the
// same: the spec and the cache values change (none for a keys_only case), the
// drawn inputs are kept.
void retarget_case(Case& c, const CaseSpec& spec);

}  // namespace mlagate
