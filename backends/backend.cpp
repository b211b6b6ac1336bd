// Default behaviour shared by every backend: capability checks, the reference
// cache writer, and NOT_SUPPORTED for kernel ops a backend lacks.
#include "backends/backend.h"

#include <algorithm>

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

std::unique_ptr<DecodeBench> Backend::prepare_decode_bench(const DecodeArgs&) { return nullptr; }

}  // namespace mlagate
