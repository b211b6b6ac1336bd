// Default behaviour shared by every backend: capability checks, decode
// argument checks, the reference cache writer, and NOT_SUPPORTED for kernel
// ops a backend lacks.
#include "backends/backend.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cases/errors.h"

namespace mlagate {

std::string_view op_name(Op op) {
  switch (op) {
    case Op::kDecode: return "decode";
    case Op::kPrefill: return "prefill";
    case Op::kLayer: return "layer";
    case Op::kCacheWrite: return "cache_write";
  }
  return "?";
}

Op parse_op(std::string_view s) {
  for (Op op : {Op::kDecode, Op::kPrefill, Op::kLayer, Op::kCacheWrite})
    if (s == op_name(op)) return op;
  throw InputError("unknown op '" + std::string(s) + "' (expected layer, decode, prefill or cache_write)");
}

std::string_view query_len_support_name(QueryLenSupport q) {
  switch (q) {
    case QueryLenSupport::kSingleOnly: return "SINGLE_ONLY";
    case QueryLenSupport::kUniform: return "UNIFORM";
    case QueryLenSupport::kVarlen: return "VARLEN";
  }
  return "?";
}

namespace {

template <class T, class F>
std::string join(const std::vector<T>& v, F f) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + std::string(f(x));
  return "{" + s + "}";
}

bool has_op(const Capabilities& caps, Op op) { return std::find(caps.ops.begin(), caps.ops.end(), op) != caps.ops.end(); }

}  // namespace

int resolve_block_size(const Capabilities& caps, const CaseSpec& spec) {
  if (spec.block_size != 0) return spec.block_size;
  return caps.block_sizes.empty() ? 16 : caps.block_sizes.front();
}

Support check_capabilities(const Capabilities& caps, const CaseSpec& spec, Op op) {
  if (std::find(caps.dtypes.begin(), caps.dtypes.end(), spec.dtype) == caps.dtypes.end())
    return Support::no("model dtype " + std::string(dtype_short(spec.dtype)) + " not in " +
                       join(caps.dtypes, [](DType t) { return dtype_short(t); }));
  if (std::find(caps.kv_dtypes.begin(), caps.kv_dtypes.end(), spec.kv_cache_dtype) == caps.kv_dtypes.end())
    return Support::no("kv cache dtype " + kv_cache_format_name(spec.kv_format()) + " not in " +
                       join(caps.kv_dtypes, [](KvCacheDtype t) { return kv_cache_dtype_name(t); }));
  const int bs = resolve_block_size(caps, spec);
  if (std::find(caps.block_sizes.begin(), caps.block_sizes.end(), bs) == caps.block_sizes.end())
    return Support::no("block size " + std::to_string(bs) + " not in " +
                       join(caps.block_sizes, [](int b) { return std::to_string(b); }));
  switch (op) {
    case Op::kLayer:
      return Support::yes();  // the layer's own routing checks come from the harness
    case Op::kCacheWrite:
      // Only a backend's own writer is worth a conformance check; without one
      // the layer op uses the reference writer.
      return has_op(caps, Op::kCacheWrite) ? Support::yes() : Support::no("no cache_write kernel");
    case Op::kDecode: {
      if (!has_op(caps, Op::kDecode)) return Support::no("no decode kernel");
      // The kernel-level decode op sends every request to the decode kernel.
      const auto& q = spec.batch.query_lens;
      if (caps.query_len_support == QueryLenSupport::kSingleOnly &&
          std::any_of(q.begin(), q.end(), [](int x) { return x != 1; }))
        return Support::no("decode kernel is SINGLE_ONLY and the batch has query_len > 1");
      if (caps.query_len_support == QueryLenSupport::kUniform &&
          std::any_of(q.begin(), q.end(), [&](int x) { return x != q.front(); }))
        return Support::no("decode kernel is UNIFORM and query lengths differ");
      return Support::yes();
    }
    case Op::kPrefill:
      return has_op(caps, Op::kPrefill) ? Support::yes() : Support::no("no prefill kernel");
  }
  return Support::yes();
}

Support Backend::supports(const CaseSpec& spec, Op op) const { return check_capabilities(capabilities(), spec, op); }

void Backend::decode(const DecodeArgs&) { throw NotSupportedError(std::string(name()) + " has no decode kernel"); }

void Backend::prefill(const PrefillArgs&) { throw NotSupportedError(std::string(name()) + " has no prefill kernel"); }

void Backend::cache_write(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                          std::span<const std::int64_t> slots) {
  reference_cache_write(cache, kv_c, k_pe, slots);
}

namespace {

[[noreturn]] void bad_decode_arg(const std::string& what) { throw std::invalid_argument("decode: " + what); }

void expect_decode_shape(const TensorView& t, const Shape& want, const char* name) {
  if (t.shape != want)
    bad_decode_arg(std::string(name) + " has shape " + shape_str(t.shape) + ", expected " + shape_str(want));
  if (t.data == nullptr && t.numel() > 0) bad_decode_arg(std::string(name) + " has no data");
}

}  // namespace

void check_decode_args(const DecodeArgs& a) {
  if (a.cache == nullptr) bad_decode_arg("no cache");
  const PagedCache& cache = *a.cache;
  if (a.q_lat.shape.size() != 3) bad_decode_arg("q_lat must be [T, N, L], got " + shape_str(a.q_lat.shape));
  if (a.q_pe.shape.size() != 3) bad_decode_arg("q_pe must be [T, N, R], got " + shape_str(a.q_pe.shape));
  const std::int64_t t = a.q_lat.shape[0], n = a.q_lat.shape[1], l = a.q_lat.shape[2], r = a.q_pe.shape[2];
  const DType dt = a.q_lat.dtype;
  if (dt != DType::kBF16 && dt != DType::kF16)
    throw std::invalid_argument("decode q_lat: dtype " + std::string(dtype_name(dt)) + " is not a 16-bit model dtype");
  if (a.q_pe.dtype != dt || a.o_lat.dtype != dt || cache.elem_dtype != dt)
    bad_decode_arg("q_lat, q_pe, o_lat and the cache entries must share one model dtype");
  if (a.lse.dtype != DType::kF32) bad_decode_arg("lse must be float32");
  expect_decode_shape(a.q_lat, {t, n, l}, "q_lat");
  expect_decode_shape(a.q_pe, {t, n, r}, "q_pe");
  expect_decode_shape(a.o_lat, {t, n, l}, "o_lat");
  expect_decode_shape(a.lse, {t, n}, "lse");
  if (cache.kv_lora_rank != l || cache.rope_dim != r)
    bad_decode_arg("the cache holds L = " + std::to_string(cache.kv_lora_rank) + ", R = " +
                   std::to_string(cache.rope_dim) + ", the queries L = " + std::to_string(l) + ", R = " +
                   std::to_string(r));
  const std::size_t b = a.seq_lens.size();
  if (a.query_start_loc.size() != b + 1) bad_decode_arg("query_start_loc must have B + 1 entries");
  if (a.block_table_rows.size() != b) bad_decode_arg("block_table_rows must have B entries");
  if (a.query_start_loc[0] != 0 || a.query_start_loc[b] != t) bad_decode_arg("query_start_loc must run from 0 to T");
  const int bs = cache.block_size;
  if (bs < 1) bad_decode_arg("cache block size " + std::to_string(bs));
  for (std::size_t i = 0; i < b; ++i) {
    if (a.query_start_loc[i + 1] < a.query_start_loc[i]) bad_decode_arg("query_start_loc must not decrease");
    if (a.seq_lens[i] < 0) bad_decode_arg("negative seq_len");
  }
  const std::int64_t table_rows = cache.block_table.dim(0), width = cache.block_table.dim(1);
  const std::int32_t* table = cache.block_table.data<std::int32_t>();
  for (std::size_t i = 0; i < b; ++i) {
    const int row = a.block_table_rows[i];
    if (row < 0 || row >= table_rows) bad_decode_arg("block table row " + std::to_string(row) + " out of range");
    const int s = a.seq_lens[i];
    if (s > 0 && (s - 1) / bs >= width)
      bad_decode_arg("seq_len " + std::to_string(s) + " exceeds the block table width");
    for (int blk = 0; blk * bs < s; ++blk) {
      const std::int64_t id = table[row * width + blk];
      if (id < 0 || id >= cache.num_blocks)
        throw std::out_of_range("decode: request " + std::to_string(i) + " key " + std::to_string(blk * bs) +
                                " maps to block " + std::to_string(id) + " of " + std::to_string(cache.num_blocks));
    }
  }
}

std::unique_ptr<DecodeBench> Backend::prepare_decode_bench(const DecodeArgs&) { return nullptr; }

}  // namespace mlagate
