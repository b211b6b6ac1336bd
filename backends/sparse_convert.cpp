// vLLM's index conversions for its Hopper sparse MLA backends (see the header).
#include "backends/sparse_convert.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "backends/backend.h"
#include "cases/tensor.h"

namespace mlagate {

namespace {
void check_size(std::span<const std::int32_t> slots, std::int64_t T, std::int64_t K, const char* what) {
  if (T < 0 || K < 0 || static_cast<std::int64_t>(slots.size()) != T * K)
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(slots.size()) + " slots are not [" +
                                std::to_string(T) + ", " + std::to_string(K) + "]");
}
}  // namespace

std::vector<std::int32_t> vllm_valid_counts(std::span<const std::int32_t> slots, std::int64_t T, std::int64_t K) {
  check_size(slots, T, K, "vllm_valid_counts");
  std::vector<std::int32_t> n(static_cast<std::size_t>(T), 0);
  for (std::int64_t t = 0; t < T; ++t)
    n[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(
        std::count_if(slots.begin() + t * K, slots.begin() + (t + 1) * K, [](std::int32_t v) { return v >= 0; }));
  return n;
}

std::vector<std::int32_t> token_positions(std::span<const std::int32_t> seq_lens,
                                          std::span<const std::int32_t> query_start_loc) {
  if (query_start_loc.size() != seq_lens.size() + 1)
    throw std::invalid_argument("token_positions: query_start_loc must have B + 1 entries");
  std::vector<std::int32_t> p(static_cast<std::size_t>(query_start_loc.back()), 0);
  for (std::size_t b = 0; b < seq_lens.size(); ++b) {
    const int first = query_start_loc[b], q = query_start_loc[b + 1] - first;
    for (int u = 0; u < q; ++u) p[static_cast<std::size_t>(first + u)] = seq_lens[b] - q + u;
  }
  return p;
}

std::vector<std::int32_t> vllm_sm90_kv_lens(std::span<const std::int32_t> positions, int index_topk, int kpool) {
  kpool = std::max(kpool, 1);
  std::vector<std::int32_t> lens(positions.size());
  for (std::size_t t = 0; t < positions.size(); ++t) {
    // A padding token of a captured batch (a request of seq_len 0: negative
    // positions) has no key: length 0, as vLLM gives its padded rows.
    const std::int32_t ctx = std::max(positions[t] + 1, 0);
    lens[t] = ctx <= index_topk ? ctx : index_topk + ctx % kpool;
  }
  return lens;
}

PackedRows vllm_sm90_pack(std::span<const std::int32_t> slots, std::int64_t T, std::int64_t K,
                          std::span<const std::int32_t> lens) {
  check_size(slots, T, K, "vllm_sm90_pack");
  if (static_cast<std::int64_t>(lens.size()) != T) throw std::invalid_argument("vllm_sm90_pack: lens must have T entries");
  PackedRows r;
  r.indptr.assign(static_cast<std::size_t>(T) + 1, 0);
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int32_t n = lens[static_cast<std::size_t>(t)];
    if (n < 0 || n > K)
      throw std::invalid_argument("vllm_sm90_pack: row " + std::to_string(t) + " has length " + std::to_string(n) +
                                  ", outside its " + std::to_string(K) + " slots");
    r.indptr[static_cast<std::size_t>(t) + 1] = r.indptr[static_cast<std::size_t>(t)] + n;
  }
  r.indices.reserve(static_cast<std::size_t>(r.indptr.back()));
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int32_t j = 0; j < lens[static_cast<std::size_t>(t)]; ++j)
      r.indices.push_back(std::max(slots[static_cast<std::size_t>(t * K + j)], std::int32_t{0}));
  return r;
}

void valid_first_rows(std::span<std::int32_t> slots, std::int64_t T, std::int64_t K) {
  check_size(slots, T, K, "valid_first_rows");
  for (std::int64_t t = 0; t < T; ++t)
    std::stable_partition(slots.begin() + t * K, slots.begin() + (t + 1) * K, [](std::int32_t v) { return v >= 0; });
}

void order_rows_for(const Backend& b, Tensor& slots, bool with_lengths) {
  if (with_lengths || slots.numel() == 0 || !b.capabilities().sparse_valid_prefix) return;
  valid_first_rows(std::span(slots.data<std::int32_t>(), static_cast<std::size_t>(slots.numel())), slots.dim(0),
                   slots.dim(1));
}

}  // namespace mlagate
