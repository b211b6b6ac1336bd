// The bridge between mlagate's C++ types and the C ABI of mlagate/plugin.h:
// enum and dtype mappings, DLTensors over host or device memory, and the
// problem description built from a case (supports) or from one kernel call
// (run). The exec backend writes the same problem fields into its bundles.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "cases/case_spec.h"
#include "cases/fp8.h"
#include "cases/paged_cache.h"
#include "mlagate/plugin.h"

namespace mlagate::plugin {

std::uint32_t op_bit(Op op);                    // MLAGATE_OP_*
std::uint32_t dtype_bit(DType t);               // MLAGATE_DTYPE_*; throws std::invalid_argument for non-model dtypes
std::uint32_t kv_bit(KvCacheDtype t);           // MLAGATE_KV_*
std::uint32_t query_len_code(QueryLenSupport q);  // MLAGATE_QUERY_LEN_*
DLDataType dl_dtype(DType t);
std::string dl_dtype_str(const DLDataType& t);  // "bfloat16", "uint8", "code 7 bits 8 lanes 1"
std::string dl_device_str(const DLDevice& d);   // "cpu", "cuda:0", "device type 9 id 0"

// Capabilities of a plugin's backend table as mlagate's (validated at load).
Capabilities capabilities_of(const mlagate_backend& b);

// DLTensors whose shapes and strides live as long as this object (one call).
class DlTensors {
 public:
  explicit DlTensors(DLDevice device) : device_(device) {}
  // Row-major contiguous; data may be null only for an empty tensor.
  // Row-major strides, or the given ones (a strided view: ABI 1.3's strided_views).
  DLTensor make(void* data, DType dtype, const Shape& shape, const std::vector<std::int64_t>& strides = {});
  DLTensor make(const void* data, DType dtype, const Shape& shape, const std::vector<std::int64_t>& strides = {}) {
    return make(const_cast<void*>(data), dtype, shape, strides);
  }

 private:
  DLDevice device_;
  std::deque<std::vector<std::int64_t>> dims_;  // deque: stable addresses as it grows
};

// plugin.h's mlagate_problem with the arrays it points into.
struct Problem {
  Op op = Op::kDecode;
  std::string case_id;
  int kv_lora_rank = 0, rope_dim = 0, nope_dim = 0, v_head_dim = 0;  // P, V: 0 when unknown
  int num_heads = 0;
  std::vector<std::int32_t> seq_lens, query_lens;  // [B]
  int reorder_threshold = 1;
  bool spec_decode = false;
  DType dtype = DType::kBF16;
  KvCacheFormat kv;
  EntryFormat entry;  // bytes 0 when no cache is involved (prefill)
  int block_size = 0;
  double scale = 0;
  float k_scale = 1.f;
  bool causal = true;
  std::int64_t block_bytes = 0;  // bytes of one cache block (0: no cache)
  // The sparse ops (plugin.h 1.2); zero for the dense ones.
  int topk = 0, window = 0, compress_ratio = 0, extra_topk = 0, extra_block_size = 0;
  bool has_sink = false;
  int value_dim = 0;
  std::int64_t num_kv_rows = 0;

  // What the batch needs of a decode kernel: SINGLE_ONLY when every q_len is 1,
  // UNIFORM when all are equal, VARLEN otherwise.
  QueryLenSupport needs() const;
  // The C view; valid while this Problem lives and is not modified.
  mlagate_problem to_c(DLDevice device) const;
};

// A whole case as supports() sees it (the backend's block size resolved, the
// layer's reorder threshold raised for spec decode as the harness routes it).
// Throws InvalidCase when the case cannot form a cache entry (fp8_ds_mla dims).
Problem case_problem(const CaseSpec& spec, Op op, const Capabilities& caps);
// One kernel call. `spec`, when given and matching the call's shapes, supplies
// the case id and P, V (informational).
Problem decode_problem(const DecodeArgs& a, const CaseSpec* spec);
Problem prefill_problem(const PrefillArgs& a, const CaseSpec* spec);
Problem sparse_decode_problem(const SparseDecodeArgs& a, const CaseSpec* spec);
Problem sparse_prefill_problem(const SparsePrefillArgs& a, const CaseSpec* spec);
Problem cache_write_problem(const PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                            std::size_t num_slots, const CaseSpec* spec);

// The block-table rows of a call as one [B, W] table of `cache`.
std::vector<std::int32_t> call_block_table(const PagedCache& cache, std::span<const std::int32_t> rows);
inline std::vector<std::int32_t> call_block_table(const DecodeArgs& a) {
  return call_block_table(*a.cache, a.block_table_rows);
}

}  // namespace mlagate::plugin
