// Mappings between mlagate's C++ types and plugin.h's C ABI, DLTensor
// construction, and the problem descriptions handed to plugins and bundles.
#include "backends/plugin/abi.h"

#include <algorithm>
#include <stdexcept>

#include "cases/errors.h"

namespace mlagate::plugin {

std::uint32_t op_bit(Op op) {
  switch (op) {
    case Op::kDecode: return MLAGATE_OP_DECODE;
    case Op::kPrefill: return MLAGATE_OP_PREFILL;
    case Op::kCacheWrite: return MLAGATE_OP_CACHE_WRITE;
    case Op::kLayer: return MLAGATE_OP_LAYER;
    case Op::kSparseDecode: return MLAGATE_OP_SPARSE_DECODE;
    case Op::kSparsePrefill: return MLAGATE_OP_SPARSE_PREFILL;
    // Not in the ABI: out of tree, merge kernels come through Python
    // (mlagate.Backend(merge_states=...)); a plugin never lists it.
    case Op::kMergeStates: return 0;
  }
  return 0;
}

std::uint32_t dtype_bit(DType t) {
  switch (t) {
    case DType::kBF16: return MLAGATE_DTYPE_BF16;
    case DType::kF16: return MLAGATE_DTYPE_F16;
    default: throw std::invalid_argument("dtype " + std::string(dtype_name(t)) + " is not a model dtype");
  }
}

std::uint32_t kv_bit(KvCacheDtype t) {
  switch (t) {
    case KvCacheDtype::kAuto: return MLAGATE_KV_AUTO;
    case KvCacheDtype::kFp8: return MLAGATE_KV_FP8;
    case KvCacheDtype::kFp8E4m3: return MLAGATE_KV_FP8_E4M3;
    case KvCacheDtype::kFp8DsMla: return MLAGATE_KV_FP8_DS_MLA;
    case KvCacheDtype::kFp8V4: return MLAGATE_KV_FP8_V4;
  }
  return 0;
}

std::uint32_t query_len_code(QueryLenSupport q) {
  switch (q) {
    case QueryLenSupport::kSingleOnly: return MLAGATE_QUERY_LEN_SINGLE_ONLY;
    case QueryLenSupport::kUniform: return MLAGATE_QUERY_LEN_UNIFORM;
    case QueryLenSupport::kVarlen: return MLAGATE_QUERY_LEN_VARLEN;
  }
  return MLAGATE_QUERY_LEN_VARLEN;
}

DLDataType dl_dtype(DType t) {
  switch (t) {
    case DType::kF64: return {kDLFloat, 64, 1};
    case DType::kF32: return {kDLFloat, 32, 1};
    case DType::kBF16: return {kDLBfloat, 16, 1};
    case DType::kF16: return {kDLFloat, 16, 1};
    case DType::kI32: return {kDLInt, 32, 1};
    case DType::kI64: return {kDLInt, 64, 1};
    case DType::kU8: return {kDLUInt, 8, 1};
  }
  return {kDLUInt, 8, 1};
}

std::string dl_dtype_str(const DLDataType& t) {
  for (DType d : {DType::kF64, DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64, DType::kU8}) {
    const DLDataType x = dl_dtype(d);
    if (x.code == t.code && x.bits == t.bits && x.lanes == t.lanes) return std::string(dtype_name(d));
  }
  return "code " + std::to_string(t.code) + " bits " + std::to_string(t.bits) + " lanes " + std::to_string(t.lanes);
}

std::string dl_device_str(const DLDevice& d) {
  if (d.device_type == kDLCPU) return "cpu";
  if (d.device_type == kDLCUDA) return "cuda:" + std::to_string(d.device_id);
  return "device type " + std::to_string(static_cast<int>(d.device_type)) + " id " + std::to_string(d.device_id);
}

Capabilities capabilities_of(const mlagate_backend& b) {
  Capabilities caps;
  for (Op op : all_ops())
    if (op != Op::kLayer && (b.ops & op_bit(op))) caps.ops.push_back(op);
  caps.block_sizes.assign(b.block_sizes, b.block_sizes + b.num_block_sizes);
  caps.query_len_support = b.query_len_support == MLAGATE_QUERY_LEN_SINGLE_ONLY ? QueryLenSupport::kSingleOnly
                           : b.query_len_support == MLAGATE_QUERY_LEN_UNIFORM   ? QueryLenSupport::kUniform
                                                                                : QueryLenSupport::kVarlen;
  caps.reorder_threshold = b.reorder_threshold;
  for (DType t : model_dtypes())
    if (b.dtypes & dtype_bit(t)) caps.dtypes.push_back(t);
  for (KvCacheDtype t : kv_cache_dtypes())
    if (b.kv_cache_dtypes & kv_bit(t)) caps.kv_dtypes.push_back(t);
  // 1.3 (zero in older tables: the defaults).
  caps.strided_views = b.strided_views != 0;
  if (b.max_pool_bytes > 0) caps.max_pool_bytes = b.max_pool_bytes;
  return caps;
}

DLTensor DlTensors::make(void* data, DType dtype, const Shape& shape, const std::vector<std::int64_t>& strides) {
  std::vector<std::int64_t>& s = dims_.emplace_back(shape.begin(), shape.end());
  std::vector<std::int64_t>& st = dims_.emplace_back(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;) st[i - 1] = st[i] * shape[i];
  if (!strides.empty()) st.assign(strides.begin(), strides.end());  // a strided view (ABI 1.3)
  DLTensor t{};
  t.data = data;
  t.device = device_;
  t.ndim = static_cast<std::int32_t>(shape.size());
  t.dtype = dl_dtype(dtype);
  t.shape = s.data();
  t.strides = st.data();
  t.byte_offset = 0;
  return t;
}

QueryLenSupport Problem::needs() const {
  if (std::all_of(query_lens.begin(), query_lens.end(), [](int q) { return q == 1; })) return QueryLenSupport::kSingleOnly;
  if (std::all_of(query_lens.begin(), query_lens.end(), [&](int q) { return q == query_lens.front(); }))
    return QueryLenSupport::kUniform;
  return QueryLenSupport::kVarlen;
}

mlagate_problem Problem::to_c(DLDevice device) const {
  mlagate_problem p{};
  p.struct_size = sizeof(mlagate_problem);
  p.op = op_bit(op);
  p.case_id = case_id.c_str();
  p.kv_lora_rank = kv_lora_rank;
  p.rope_dim = rope_dim;
  p.nope_dim = nope_dim;
  p.v_head_dim = v_head_dim;
  p.num_heads = num_heads;
  p.num_requests = static_cast<std::int32_t>(seq_lens.size());
  std::int64_t t = 0, s = 0;
  for (auto q : query_lens) t += q;
  for (auto k : seq_lens) s += k;
  p.num_tokens = static_cast<std::int32_t>(t);
  p.num_kv_tokens = s;
  p.seq_lens = seq_lens.data();
  p.query_lens = query_lens.data();
  p.max_seq_len = seq_lens.empty() ? 0 : *std::max_element(seq_lens.begin(), seq_lens.end());
  p.max_query_len = query_lens.empty() ? 0 : *std::max_element(query_lens.begin(), query_lens.end());
  p.query_len_support = query_len_code(needs());
  p.reorder_threshold = reorder_threshold;
  p.spec_decode = spec_decode ? 1 : 0;
  p.dtype = dtype_bit(dtype);
  p.dl_dtype = dl_dtype(dtype);
  p.kv_cache_dtype = kv_bit(kv.dtype);
  p.scale_rule = kv.scale_rule == ScaleRule::kRaw ? MLAGATE_SCALE_RULE_RAW : MLAGATE_SCALE_RULE_POW2;
  p.entry.bytes = entry.bytes;
  p.entry.kv_c_offset = entry.kv_c_offset;
  p.entry.kv_c_elem_bytes = entry.kv_c_elem;
  p.entry.k_pe_offset = entry.k_pe_offset;
  p.entry.k_pe_elem_bytes = entry.k_pe_elem;
  p.entry.scale_offset = entry.scale_offset;
  p.entry.scale_count = entry.scale_count;
  p.block_size = block_size;
  p.scale = scale;
  p.k_scale = k_scale;
  p.causal = causal ? 1 : 0;
  p.device = device;
  p.scale_elem_bytes = entry.scale_count ? entry.scale_elem : 0;
  p.scale_tile = entry.scale_count ? entry.tile : 0;
  p.data_bytes = entry.bytes ? entry.data_bytes : 0;
  p.block_bytes = block_bytes;
  p.topk = topk;
  p.window = window;
  p.compress_ratio = compress_ratio;
  p.extra_topk = extra_topk;
  p.extra_block_size = extra_block_size;
  p.has_sink = has_sink ? 1 : 0;
  p.value_dim = value_dim;
  p.num_kv_rows = num_kv_rows;
  return p;
}

namespace {

// Case id, P and V from the spec the runner last asked about, when the call's
// shapes say it is the same problem.
void describe_from_spec(Problem& p, const CaseSpec* spec) {
  if (!spec || spec->dims.kv_lora_rank != p.kv_lora_rank || spec->dims.rope_dim != p.rope_dim ||
      spec->num_heads() != p.num_heads)
    return;
  p.case_id = spec->id();
  p.nope_dim = spec->dims.nope_dim;
  p.v_head_dim = spec->dims.v_head_dim;
  p.spec_decode = spec->batch.spec_decode;
}

void take_cache(Problem& p, const PagedCache& cache) {
  p.kv = {cache.kv_dtype, cache.scale_rule};
  p.entry = cache.format();
  p.block_size = cache.block_size;
  p.block_bytes = cache.block_bytes;
}

// The requests and tokens of a call from its metadata.
void take_batch(Problem& p, std::span<const std::int32_t> seq_lens, std::span<const std::int32_t> query_start_loc,
                const char* op) {
  if (query_start_loc.size() != seq_lens.size() + 1)
    throw std::invalid_argument(std::string(op) + ": query_start_loc must have B + 1 entries");
  p.seq_lens.assign(seq_lens.begin(), seq_lens.end());
  for (std::size_t i = 0; i < seq_lens.size(); ++i) p.query_lens.push_back(query_start_loc[i + 1] - query_start_loc[i]);
}

}  // namespace

Problem case_problem(const CaseSpec& spec, Op op, const Capabilities& caps) {
  Problem p;
  p.op = op;
  p.case_id = spec.id();
  p.kv_lora_rank = spec.dims.kv_lora_rank;
  p.rope_dim = spec.dims.rope_dim;
  p.nope_dim = spec.dims.nope_dim;
  p.v_head_dim = spec.dims.v_head_dim;
  p.num_heads = spec.num_heads();
  p.seq_lens.assign(spec.batch.seq_lens.begin(), spec.batch.seq_lens.end());
  p.query_lens.assign(spec.batch.query_lens.begin(), spec.batch.query_lens.end());
  p.spec_decode = spec.batch.spec_decode;
  p.reorder_threshold = caps.reorder_threshold;
  if (spec.batch.spec_decode && !p.query_lens.empty())
    p.reorder_threshold = std::max(p.reorder_threshold, *std::max_element(p.query_lens.begin(), p.query_lens.end()));
  p.dtype = spec.dtype;
  p.kv = spec.kv_format();
  p.k_scale = spec.k_scale;
  p.entry = make_entry_format(p.kv, spec.dtype, p.kv_lora_rank, p.rope_dim, spec.k_scale);
  p.block_size = resolve_block_size(caps, spec);
  p.block_bytes = mlagate::block_bytes(p.entry, p.block_size);
  p.scale = spec.softmax_scale();
  if (is_sparse_op(op) && spec.sparse.active()) {
    const SparseSpec& sp = spec.sparse;
    p.window = sp.window;
    p.compress_ratio = sp.compress;
    p.extra_topk = sp.compress ? sp.extra_topk : 0;
    p.extra_block_size = sp.compress ? p.block_size : 0;  // the compressed cache shares the block size
    p.has_sink = sp.sink;
    p.value_dim = spec.sparse_dv();
    // sparse_prefill's rows: V3.2's top-k, or V4's window then compressed slots.
    p.topk = op == Op::kSparseDecode ? sp.topk : (sp.v4() ? sp.window + p.extra_topk : sp.topk);
  }
  return p;
}

Problem decode_problem(const DecodeArgs& a, const CaseSpec* spec) {
  if (a.cache == nullptr) throw std::invalid_argument("decode: no cache");
  if (a.q_lat.shape.size() != 3 || a.q_pe.shape.size() != 3) throw std::invalid_argument("decode: q_lat and q_pe must be 3-d");
  Problem p;
  p.op = Op::kDecode;
  p.num_heads = static_cast<int>(a.q_lat.shape[1]);
  p.kv_lora_rank = static_cast<int>(a.q_lat.shape[2]);
  p.rope_dim = static_cast<int>(a.q_pe.shape[2]);
  take_batch(p, a.seq_lens, a.query_start_loc, "decode");
  p.dtype = a.q_lat.dtype;
  take_cache(p, *a.cache);
  p.scale = a.scale;
  p.k_scale = a.k_scale;
  describe_from_spec(p, spec);
  return p;
}

Problem sparse_decode_problem(const SparseDecodeArgs& a, const CaseSpec* spec) {
  if (a.cache == nullptr) throw std::invalid_argument("sparse_decode: no cache");
  if (a.q.shape.size() != 3 || a.o.shape.size() != 3) throw std::invalid_argument("sparse_decode: q and o must be 3-d");
  Problem p;
  p.op = Op::kSparseDecode;
  p.num_heads = static_cast<int>(a.q.shape[1]);
  p.kv_lora_rank = a.cache->kv_lora_rank;
  p.rope_dim = a.cache->rope_dim;
  take_batch(p, a.seq_lens, a.query_start_loc, "sparse_decode");
  p.dtype = a.q.dtype;
  take_cache(p, *a.cache);
  p.k_scale = a.cache->k_scale;
  p.scale = a.scale;
  p.topk = a.indices.data && a.indices.shape.size() == 2 ? static_cast<int>(a.indices.shape[1]) : 0;
  p.window = a.window;
  if (a.extra_cache) {
    p.extra_block_size = a.extra_cache->block_size;
    p.extra_topk = a.extra_indices.data && a.extra_indices.shape.size() == 2 ? static_cast<int>(a.extra_indices.shape[1]) : 0;
  }
  p.has_sink = !a.sink.empty();
  p.value_dim = static_cast<int>(a.o.shape[2]);
  describe_from_spec(p, spec);
  if (spec && p.case_id == spec->id()) p.compress_ratio = spec->sparse.compress;
  return p;
}

Problem sparse_prefill_problem(const SparsePrefillArgs& a, const CaseSpec* spec) {
  if (a.q.shape.size() != 3 || a.kv.shape.size() != 2 || a.o.shape.size() != 3 || a.indices.shape.size() != 2)
    throw std::invalid_argument("sparse_prefill: q, o must be 3-d, kv and indices 2-d");
  Problem p;
  p.op = Op::kSparsePrefill;
  p.num_heads = static_cast<int>(a.q.shape[1]);
  p.dtype = a.q.dtype;
  p.scale = a.scale;
  p.topk = static_cast<int>(a.indices.shape[1]);
  p.has_sink = !a.sink.empty();
  p.value_dim = static_cast<int>(a.o.shape[2]);
  p.num_kv_rows = a.kv.shape[0];
  // No requests in the call itself: the case's, when it is the one asked
  // about, else one request of every token over every row.
  const std::int64_t T = a.q.shape[0];
  if (spec && spec->num_tokens() == T && spec->num_heads() == p.num_heads &&
      spec->dims.kv_lora_rank + spec->dims.rope_dim == a.q.shape[2]) {
    p.case_id = spec->id();
    p.kv_lora_rank = spec->dims.kv_lora_rank;
    p.rope_dim = spec->dims.rope_dim;
    p.nope_dim = spec->dims.nope_dim;
    p.v_head_dim = spec->dims.v_head_dim;
    p.seq_lens.assign(spec->batch.seq_lens.begin(), spec->batch.seq_lens.end());
    p.query_lens.assign(spec->batch.query_lens.begin(), spec->batch.query_lens.end());
    p.spec_decode = spec->batch.spec_decode;
    p.kv = spec->kv_format();
    p.k_scale = spec->k_scale;
    p.window = spec->sparse.window;
    p.compress_ratio = spec->sparse.compress;
    p.extra_topk = spec->sparse.compress ? spec->sparse.extra_topk : 0;
  } else {
    p.seq_lens = {static_cast<std::int32_t>(a.kv.shape[0])};
    p.query_lens = {static_cast<std::int32_t>(T)};
  }
  return p;
}

Problem prefill_problem(const PrefillArgs& a, const CaseSpec* spec) {
  if (a.q.shape.size() != 3 || a.v.shape.size() != 3) throw std::invalid_argument("prefill: q and v must be 3-d");
  if (a.cu_seqlens_q.size() != a.cu_seqlens_k.size() || a.cu_seqlens_q.empty())
    throw std::invalid_argument("prefill: cu_seqlens_q and cu_seqlens_k must both have B + 1 entries");
  Problem p;
  p.op = Op::kPrefill;
  p.num_heads = static_cast<int>(a.q.shape[1]);
  p.v_head_dim = static_cast<int>(a.v.shape[2]);
  for (std::size_t i = 0; i + 1 < a.cu_seqlens_q.size(); ++i) {
    p.query_lens.push_back(a.cu_seqlens_q[i + 1] - a.cu_seqlens_q[i]);
    p.seq_lens.push_back(a.cu_seqlens_k[i + 1] - a.cu_seqlens_k[i]);
  }
  p.dtype = a.q.dtype;
  p.scale = a.scale;
  p.causal = a.causal;
  if (spec && spec->dims.nope_dim + spec->dims.rope_dim == a.q.shape[2] && spec->dims.v_head_dim == p.v_head_dim &&
      spec->num_heads() == p.num_heads) {
    p.case_id = spec->id();
    p.kv_lora_rank = spec->dims.kv_lora_rank;
    p.rope_dim = spec->dims.rope_dim;
    p.nope_dim = spec->dims.nope_dim;
    p.spec_decode = spec->batch.spec_decode;
    p.kv = spec->kv_format();
    p.k_scale = spec->k_scale;
  }
  return p;
}

Problem cache_write_problem(const PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                            std::size_t num_slots, const CaseSpec* spec) {
  if (kv_c.shape.size() != 2 || k_pe.shape.size() != 2) throw std::invalid_argument("cache_write: kv_c and k_pe must be 2-d");
  Problem p;
  p.op = Op::kCacheWrite;
  p.kv_lora_rank = static_cast<int>(kv_c.shape[1]);
  p.rope_dim = static_cast<int>(k_pe.shape[1]);
  p.num_heads = spec ? spec->num_heads() : 0;
  p.dtype = kv_c.dtype;
  take_cache(p, cache);
  p.k_scale = cache.k_scale;
  // One "request" of n new tokens: the writer sees slots, not requests.
  p.seq_lens = {static_cast<std::int32_t>(num_slots)};
  p.query_lens = {static_cast<std::int32_t>(num_slots)};
  describe_from_spec(p, spec);
  return p;
}

std::vector<std::int32_t> call_block_table(const PagedCache& c, std::span<const std::int32_t> table_rows) {
  const std::int64_t rows = c.block_table.dim(0), width = c.block_table.dim(1);
  std::vector<std::int32_t> table(table_rows.size() * static_cast<std::size_t>(width));
  const std::int32_t* src = c.block_table.data<std::int32_t>();
  for (std::size_t i = 0; i < table_rows.size(); ++i) {
    const std::int32_t r = table_rows[i];
    if (r < 0 || r >= rows) throw std::out_of_range("decode: block table row " + std::to_string(r) + " out of range");
    std::copy_n(src + r * width, width, table.data() + i * static_cast<std::size_t>(width));
  }
  return table;
}

}  // namespace mlagate::plugin
