// Default behaviour shared by every backend: capability checks, decode
// argument checks, the reference cache writer, and NOT_SUPPORTED for kernel
// ops a backend lacks.
#include "backends/backend.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "backends/decode_args.h"
#include "backends/host_graph.h"
#include "cases/errors.h"

namespace mlagate {

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

namespace {

// Layouts (cases/LAYOUTS.md): which ops they apply to, and what a backend declares.
Support check_layout(const Capabilities& caps, const CaseSpec& spec, Op op) {
  const LayoutSpec& l = spec.layout;
  if (l.contiguous()) return Support::yes();
  const std::string name = "layout " + layout_name(l);
  if (op == Op::kPrefill || op == Op::kSparsePrefill)
    return Support::no(name + ": the " + std::string(op_name(op)) +
                       " op reads no paged cache (layouts apply to decode, layer, cache_write and sparse_decode)");
  if (l.strided && op == Op::kDecode && !caps.strided_views)
    return Support::no(name + ": the decode kernel takes contiguous tensors only (it declares no strided views)");
  if (l.pool_floor_bytes() >= caps.max_pool_bytes)
    return Support::no(name + ": pages past " + std::to_string(l.pool_floor_bytes()) +
                       " bytes of the pool; the backend addresses pools of at most " + std::to_string(caps.max_pool_bytes) +
                       " bytes");
  return Support::yes();
}

}  // namespace

Support check_capabilities(const Capabilities& caps, const CaseSpec& spec, Op op) {
  // Merge cases have two partial results and no cache: the op, its dtype, nothing else.
  if (is_merge_op(op) != spec.merge.active())
    return Support::no(spec.merge.active() ? "a merge case: run it with --op merge_states"
                                           : "not a merge case: merge_states needs a merge case (head_dim)");
  if (is_merge_op(op)) {
    if (!has_op(caps, Op::kMergeStates)) return Support::no("no merge_states kernel");
    if (std::find(caps.dtypes.begin(), caps.dtypes.end(), spec.dtype) == caps.dtypes.end())
      return Support::no("output dtype " + std::string(dtype_short(spec.dtype)) + " not in " +
                         join(caps.dtypes, [](DType t) { return dtype_short(t); }));
    return Support::yes();
  }
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
  if (const Support s = check_layout(caps, spec, op); !s.ok) return s;
  // Sparse cases (top-k rows, windows) and dense ones have different ops.
  if (is_sparse_op(op) && !spec.sparse.active())
    return Support::no("a dense case: " + std::string(op_name(op)) + " needs a sparse case (topk or window)");
  if (!is_sparse_op(op) && op != Op::kCacheWrite && spec.sparse.active())
    return Support::no("a sparse case: run it with --op sparse_decode,sparse_prefill (or cache_write)");
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
    case Op::kSparseDecode:
      return has_op(caps, Op::kSparseDecode) ? Support::yes() : Support::no("no sparse decode kernel");
    case Op::kSparsePrefill:
      return has_op(caps, Op::kSparsePrefill) ? Support::yes() : Support::no("no sparse prefill kernel");
    case Op::kMergeStates: break;  // above
  }
  return Support::yes();
}

Support Backend::supports(const CaseSpec& spec, Op op) const { return check_capabilities(capabilities(), spec, op); }

void Backend::decode(const DecodeArgs&) { throw NotSupportedError(std::string(name()) + " has no decode kernel"); }

void Backend::prefill(const PrefillArgs&) { throw NotSupportedError(std::string(name()) + " has no prefill kernel"); }

void Backend::sparse_decode(const SparseDecodeArgs&) {
  throw NotSupportedError(std::string(name()) + " has no sparse decode kernel");
}

void Backend::sparse_prefill(const SparsePrefillArgs&) {
  throw NotSupportedError(std::string(name()) + " has no sparse prefill kernel");
}

void Backend::merge_states(const MergeStatesArgs&) {
  throw NotSupportedError(std::string(name()) + " has no merge_states kernel");
}

Capabilities merge_states_capabilities() {
  Capabilities c;
  c.ops = {Op::kMergeStates};
  c.block_sizes = {16};
  c.dtypes = {DType::kBF16, DType::kF16, DType::kF32};
  c.kv_dtypes = {KvCacheDtype::kAuto};
  return c;
}

void check_merge_states_args(const MergeStatesArgs& a) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("merge_states: " + what); };
  const DType dt = a.prefix_output.dtype;
  if (dt != DType::kBF16 && dt != DType::kF16 && dt != DType::kF32) bad("outputs must be bf16, fp16 or fp32");
  if (a.prefix_output.shape.size() != 3) bad("prefix_output must be [T, N, D], got " + shape_str(a.prefix_output.shape));
  const Shape od = a.prefix_output.shape, ol{od[0], od[1]};
  auto need = [&](const TensorView& t, const Shape& shape, DType d, const char* name) {
    if (t.shape != shape) bad(std::string(name) + " has shape " + shape_str(t.shape) + ", expected " + shape_str(shape));
    if (t.dtype != d)
      bad(std::string(name) + " has dtype " + std::string(dtype_name(t.dtype)) + ", expected " + std::string(dtype_name(d)));
    if (t.data == nullptr && t.numel() > 0) bad(std::string(name) + " has no data");
  };
  need(a.prefix_output, od, dt, "prefix_output");
  need(a.suffix_output, od, dt, "suffix_output");
  need(a.output, od, dt, "output");
  need(a.prefix_lse, ol, DType::kF32, "prefix_lse");
  need(a.suffix_lse, ol, DType::kF32, "suffix_lse");
  need(a.output_lse, ol, DType::kF32, "output_lse");
}

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
  // Strided views (cases/LAYOUTS.md): a stride per dim, the last dim contiguous.
  if (!t.strides.empty()) {
    if (t.strides.size() != t.shape.size()) bad_decode_arg(std::string(name) + " has strides of another rank than its shape");
    if (t.strides.back() != 1) bad_decode_arg(std::string(name) + "'s last dim must be contiguous (stride 1)");
    for (std::int64_t st : t.strides)
      if (st < 1) bad_decode_arg(std::string(name) + " has a stride below 1");
  }
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

namespace {

[[noreturn]] void bad_sparse(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string(op) + ": " + what);
}

void expect_shape(const char* op, const TensorView& t, const Shape& want, const char* name, DType dt) {
  if (t.shape != want) bad_sparse(op, std::string(name) + " has shape " + shape_str(t.shape) + ", expected " + shape_str(want));
  if (t.dtype != dt)
    bad_sparse(op, std::string(name) + " has dtype " + std::string(dtype_name(t.dtype)) + ", expected " +
                       std::string(dtype_name(dt)));
  if (t.data == nullptr && t.numel() > 0) bad_sparse(op, std::string(name) + " has no data");
}

// Rows of slots: every one -1 or in [0, capacity); lengths within [0, K].
void check_rows(const char* op, const TensorView& idx, std::int64_t T, std::span<const std::int32_t> lens,
                std::int64_t capacity, const char* name, bool beyond_is_invalid) {
  if (idx.shape.size() != 2 || idx.shape[0] != T)
    bad_sparse(op, std::string(name) + " must be [T, K] with T = " + std::to_string(T) + ", got " + shape_str(idx.shape));
  if (idx.dtype != DType::kI32) bad_sparse(op, std::string(name) + " must be int32");
  const std::int64_t K = idx.shape[1];
  if (!lens.empty() && static_cast<std::int64_t>(lens.size()) != T)
    bad_sparse(op, std::string(name) + " lengths must have T entries");
  const auto* p = idx.as<std::int32_t>();
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t n = lens.empty() ? K : lens[static_cast<std::size_t>(t)];
    if (n < 0 || n > K)
      bad_sparse(op, std::string(name) + " length " + std::to_string(n) + " of token " + std::to_string(t) +
                         " outside [0, " + std::to_string(K) + "]");
    for (std::int64_t k = 0; k < n; ++k) {
      const std::int32_t v = p[t * K + k];
      if (v == -1 || (beyond_is_invalid && v < 0)) continue;
      if (v < 0 || (!beyond_is_invalid && v >= capacity))
        throw std::out_of_range(std::string(op) + ": " + name + "[" + std::to_string(t) + ", " + std::to_string(k) +
                                "] = " + std::to_string(v) + " is neither -1 nor a slot in [0, " +
                                std::to_string(capacity) + ")");
    }
  }
}

}  // namespace

void check_sparse_decode_args(const SparseDecodeArgs& a) {
  const char* op = "sparse_decode";
  if (a.cache == nullptr) bad_sparse(op, "no cache");
  const PagedCache& c = *a.cache;
  if (a.q.shape.size() != 3) bad_sparse(op, "q must be [T, N, L+R], got " + shape_str(a.q.shape));
  const std::int64_t T = a.q.shape[0], N = a.q.shape[1], D = a.q.shape[2];
  const DType dt = a.q.dtype;
  if (dt != DType::kBF16 && dt != DType::kF16) bad_sparse(op, "q must be a 16-bit model dtype");
  if (c.elem_dtype != dt) bad_sparse(op, "the cache's model dtype differs from q's");
  if (D != c.kv_lora_rank + c.rope_dim)
    bad_sparse(op, "q has D = " + std::to_string(D) + ", the cache entries L + R = " +
                       std::to_string(c.kv_lora_rank + c.rope_dim));
  if (a.o.shape.size() != 3) bad_sparse(op, "o must be [T, N, Dv], got " + shape_str(a.o.shape));
  const std::int64_t dv = a.o.shape[2];
  if (dv != c.kv_lora_rank && dv != D) bad_sparse(op, "o's Dv must be L or L + R, got " + std::to_string(dv));
  expect_shape(op, a.o, {T, N, dv}, "o", dt);
  expect_shape(op, a.lse, {T, N}, "lse", DType::kF32);
  if (!a.sink.empty() && static_cast<std::int64_t>(a.sink.size()) != N) bad_sparse(op, "sink must have N entries");
  const std::int64_t capacity = static_cast<std::int64_t>(c.num_blocks) * c.block_size;
  if (a.window > 0) {
    if (a.indices.data != nullptr) bad_sparse(op, "give either indices (V3.2) or a window (V4), not both");
    const std::size_t b = a.seq_lens.size();
    if (a.query_start_loc.size() != b + 1 || a.block_table_rows.size() != b)
      bad_sparse(op, "a window needs seq_lens [B], query_start_loc [B+1] and block_table_rows [B]");
    if (a.query_start_loc[0] != 0 || a.query_start_loc[b] != T) bad_sparse(op, "query_start_loc must run from 0 to T");
    const std::int64_t rows = c.block_table.dim(0), width = c.block_table.dim(1);
    const std::int32_t* table = c.block_table.data<std::int32_t>();
    for (std::size_t i = 0; i < b; ++i) {
      const int row = a.block_table_rows[i], s = a.seq_lens[i];
      if (a.query_start_loc[i + 1] < a.query_start_loc[i]) bad_sparse(op, "query_start_loc must not decrease");
      if (row < 0 || row >= rows) bad_sparse(op, "block table row " + std::to_string(row) + " out of range");
      if (s < 0 || (s > 0 && (s - 1) / c.block_size >= width)) bad_sparse(op, "seq_len outside the block table");
      for (int blk = 0; blk * c.block_size < s; ++blk) {
        const std::int64_t id = table[row * width + blk];
        if (id < 0 || id >= c.num_blocks)
          throw std::out_of_range("sparse_decode: request " + std::to_string(i) + " maps to block " + std::to_string(id) +
                                  " of " + std::to_string(c.num_blocks));
      }
    }
  } else {
    check_rows(op, a.indices, T, a.topk_length, capacity, "indices", false);
  }
  if (a.extra_cache) {
    const PagedCache& e = *a.extra_cache;
    if (e.elem_dtype != dt || e.kv_lora_rank != c.kv_lora_rank || e.rope_dim != c.rope_dim)
      bad_sparse(op, "the extra cache's entries differ from the main cache's");
    check_rows(op, a.extra_indices, T, a.extra_topk_length, static_cast<std::int64_t>(e.num_blocks) * e.block_size,
               "extra_indices", false);
  } else if (a.extra_indices.data != nullptr) {
    bad_sparse(op, "extra_indices without an extra cache");
  }
}

void check_sparse_prefill_args(const SparsePrefillArgs& a) {
  const char* op = "sparse_prefill";
  if (a.q.shape.size() != 3) bad_sparse(op, "q must be [T, N, D], got " + shape_str(a.q.shape));
  const std::int64_t T = a.q.shape[0], N = a.q.shape[1], D = a.q.shape[2];
  const DType dt = a.q.dtype;
  if (dt != DType::kBF16 && dt != DType::kF16) bad_sparse(op, "q must be a 16-bit model dtype");
  if (a.kv.shape.size() != 2 || a.kv.shape[1] != D) bad_sparse(op, "kv must be [S_kv, D], got " + shape_str(a.kv.shape));
  expect_shape(op, a.kv, a.kv.shape, "kv", dt);
  if (a.o.shape.size() != 3 || a.o.shape[2] > D) bad_sparse(op, "o must be [T, N, Dv] with Dv <= D");
  expect_shape(op, a.o, {T, N, a.o.shape[2]}, "o", dt);
  expect_shape(op, a.lse, {T, N}, "lse", DType::kF32);
  if (!a.sink.empty() && static_cast<std::int64_t>(a.sink.size()) != N) bad_sparse(op, "sink must have N entries");
  check_rows(op, a.indices, T, a.topk_length, a.kv.shape[0], "indices", true);
}

void sparse_window_slots(const SparseDecodeArgs& a, std::vector<std::int32_t>& slots, std::vector<std::int32_t>& lens) {
  const std::int64_t T = a.q.shape.at(0);
  const int W = a.window;
  const PagedCache& c = *a.cache;
  slots.assign(static_cast<std::size_t>(T * W), -1);
  lens.assign(static_cast<std::size_t>(T), 0);
  const std::int64_t width = c.block_table.dim(1);
  const std::int32_t* table = c.block_table.data<std::int32_t>();
  for (std::size_t i = 0; i < a.seq_lens.size(); ++i) {
    const int s = a.seq_lens[i];
    const int first = a.query_start_loc[i], q = a.query_start_loc[i + 1] - first;
    if (s == 0) continue;  // padding: no key
    const std::int32_t* row = table + static_cast<std::int64_t>(a.block_table_rows[i]) * width;
    for (int u = 0; u < q; ++u) {
      const int p = s - q + u;
      int k = 0;
      for (int pos = std::max(0, p - W + 1); pos <= p; ++pos)
        slots[static_cast<std::size_t>((first + u) * static_cast<std::int64_t>(W) + k++)] =
            row[pos / c.block_size] * c.block_size + pos % c.block_size;
      lens[static_cast<std::size_t>(first + u)] = k;
    }
  }
}

std::unique_ptr<DecodeBench> Backend::prepare_decode_bench(const DecodeArgs&) { return nullptr; }
std::unique_ptr<DecodeBench> Backend::prepare_sparse_decode_bench(const SparseDecodeArgs&) { return nullptr; }

}  // namespace mlagate

namespace mlagate {

std::unique_ptr<DecodeGraph> Backend::capture_decode(const DecodeArgs&) { return nullptr; }
std::unique_ptr<SparseDecodeGraph> Backend::capture_sparse_decode(const SparseDecodeArgs&) { return nullptr; }

namespace {

// emulate_decode_graph's handle. The persistent cache has the captured number
// of blocks and a block table of one row per captured request, the captured
// width: a replay copies the case's blocks and rows into it (narrower rows
// padded with block 0) and keeps the addresses.
class HostDecodeGraph final : public HostGraph<DecodeGraph, DecodeArgs, &DecodeArgs::o_lat> {
 public:
  HostDecodeGraph(const DecodeArgs& a, DecodeGraphStep step, std::string note)
      : HostGraph(a, std::move(step), std::move(note)),
        q_lat_(a.q_lat.dtype, a.q_lat.shape),
        q_pe_(a.q_pe.dtype, a.q_pe.shape),
        scale_(a.scale),
        k_scale_(a.k_scale) {
    check_decode_args(a);
    // The cache's format and layout without its data and table (filled per replay).
    cache_ = persistent_cache_like(*a.cache, static_cast<std::int64_t>(a.seq_lens.size()));
    run(a, true);  // the capture runs the work once, as stream capture's warm-up does
  }

 private:
  void run(const DecodeArgs& a, bool capture) override {
    const PagedCache& c = *a.cache;
    if (a.q_lat.shape != q_lat_.shape() || a.q_pe.shape != q_pe_.shape() || a.q_lat.dtype != q_lat_.dtype() ||
        a.o_lat.shape != out_.shape() || a.seq_lens.size() != seq_lens_.size() ||
        a.query_start_loc.size() != qsl_.size() || a.block_table_rows.size() != rows_.size())
      throw std::invalid_argument("decode graph: replayed with other shapes than captured");
    if (a.scale != scale_ || a.k_scale != k_scale_)
      throw std::invalid_argument("decode graph: replayed with another scale than captured");
    // In place: the same addresses every replay.
    std::memcpy(q_lat_.bytes(), a.q_lat.data, q_lat_.nbytes());
    std::memcpy(q_pe_.bytes(), a.q_pe.data, q_pe_.nbytes());
    std::copy(a.seq_lens.begin(), a.seq_lens.end(), seq_lens_.begin());
    std::copy(a.query_start_loc.begin(), a.query_start_loc.end(), qsl_.begin());
    std::copy(a.block_table_rows.begin(), a.block_table_rows.end(), rows_.begin());
    refresh_persistent_cache(c, cache_);
    step_(decode_args(q_lat_.view(), q_pe_.view(), cache_, {seq_lens_, qsl_, rows_}, scale_, k_scale_, out_.view(),
                      lse_.view()),
          capture);
  }

  Tensor q_lat_, q_pe_;
  PagedCache cache_;
  double scale_;
  float k_scale_;
};

}  // namespace

PagedCache persistent_cache_like(const PagedCache& c, std::int64_t rows) {
  PagedCache p;
  p.kv_dtype = c.kv_dtype;
  p.elem_dtype = c.elem_dtype;
  p.scale_rule = c.scale_rule;
  p.k_scale = c.k_scale;
  p.kv_lora_rank = c.kv_lora_rank;
  p.rope_dim = c.rope_dim;
  p.block_size = c.block_size;
  p.num_blocks = c.num_blocks;
  p.used_blocks = c.used_blocks;
  p.entry_bytes = c.entry_bytes;
  p.block_bytes = c.block_bytes;
  p.table_width = c.table_width;
  p.data = Tensor(c.data.dtype(), c.data.shape());
  p.block_table = Tensor(DType::kI32, {std::max<std::int64_t>(rows, c.block_table.dim(0)), c.table_width});
  p.options = c.options;
  return p;
}

void refresh_persistent_cache(const PagedCache& c, PagedCache& into) {
  if (c.kv_dtype != into.kv_dtype || c.scale_rule != into.scale_rule || c.k_scale != into.k_scale ||
      c.block_size != into.block_size || c.entry_bytes != into.entry_bytes || c.block_bytes != into.block_bytes)
    throw std::invalid_argument("graph: replayed with another cache format than captured");
  if (c.num_blocks > into.num_blocks || c.table_width > into.table_width ||
      c.block_table.dim(0) > into.block_table.dim(0) || c.data.nbytes() > into.data.nbytes())
    throw std::invalid_argument("graph: the cache is larger than the captured one");
  std::memcpy(into.data.bytes(), c.data.bytes(), c.data.nbytes());
  std::int32_t* table = into.block_table.data<std::int32_t>();
  std::fill_n(table, into.block_table.numel(), 0);
  const std::int32_t* src = c.block_table.data<std::int32_t>();
  for (std::int64_t r = 0; r < c.block_table.dim(0); ++r)
    std::copy_n(src + r * c.table_width, c.table_width, table + r * into.table_width);
}

std::unique_ptr<DecodeGraph> emulate_decode_graph(Backend& b, const DecodeArgs& args) {
  return persistent_decode_graph(args, [&b](const DecodeArgs& p, bool) { b.decode(p); },
                                 "host emulation of a captured graph (persistent buffers)");
}

std::unique_ptr<DecodeGraph> persistent_decode_graph(const DecodeArgs& args, DecodeGraphStep step, std::string note) {
  return std::make_unique<HostDecodeGraph>(args, std::move(step), std::move(note));
}

}  // namespace mlagate
