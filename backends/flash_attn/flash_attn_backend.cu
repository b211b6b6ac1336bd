// "flash_attn.mla" and "flash_attn.mla.cudagraph": the adapter from mlagate's
// decode and prefill calls to FlashAttention-3's Hopper forward (hopper/flash.h's
// Flash_fwd_params), filled the way flash_api.cpp's mha_fwd and
// mha_fwd_get_scheduler_metadata fill it from the tensors vLLM's
// FlashAttnMLAImpl.forward_mqa passes: q = q_pe [T, N, 64], k = the cache's k_pe
// columns and v = its kv_c columns (one kv head, paged through the block
// table), q_v = q_lat [T, N, 512], cu_seqlens_q, seqused_k, causal. The cache
// is passed as is (k and v are two column ranges of each [L + R] entry); the
// only copies are the requests' block-table rows gathered into a plain [B,
// width] table, as the library takes a plain table, and the lse, which FA3
// writes as [N, T] and mlagate's ops define as [T, N].
//
// The scheduler metadata is computed ahead of the call, as vLLM's metadata
// builder does once per batch (get_scheduler_metadata with max_seqlen_k = the
// longest sequence), and handed to the forward, which then sizes its own
// split heuristic from the block table's width (mha_fwd: seqlen_k =
// max_num_pages_per_seq * page_size): the two are computed as the library
// computes them, not made to agree. After a call that does not split, the
// tile-count semaphore is reset as mha_fwd resets it; the combine kernel does
// it otherwise.
#include <limits>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cuda/cache_store.h"
#include "backends/cuda/cuda_backends.h"
#include "backends/flash_attn/flash_attn_backend.h"
#include "backends/kernel_libs/adapter_common.h"
#include "cases/errors.h"

// flash-attention's own headers (MLAGATE_FLASH_ATTN_SOURCE_DIR/hopper), and its host side as flash_api.cpp has it.
#include "backends/flash_attn/fa3_host.h"

namespace mlagate {
namespace {

using gpu::DeviceBuffer;
using gpu::upload_array;
using namespace fa3;  // flash_api.cpp's host side (fa3_host.h)

// What vLLM's FlashAttnMLABackend declares and what this build instantiates.
constexpr int kReorderThreshold = 512;  // "process small prefills with decode pathway"
constexpr int kBlockMultiple = 16;      // get_supported_kernel_block_sizes: MultipleOf(16)
constexpr int kMaxSplits = 256;         // mha_fwd: "num_splits > 256 not supported"
constexpr int kMaxGraphBatch = 1024;    // the persistent metadata buffer's batch (vLLM: max_num_seqs)
// vLLM's full-CUDA-graph mode: num_splits = flash_attn_max_num_splits_for_cuda_graph
// (default 32) for a batch of at most max_cudagraph_capture_size (default 512)
// decode tokens, so that the split buffers captured in the graph are large enough.
constexpr int kGraphMaxSplits = 32;
constexpr int kGraphMaxTokens = 512;

// Block sizes offered: multiples of 16 (64 preferred, as the other MLA libraries).
std::vector<int> block_sizes() {
  std::vector<int> v = {64};
  for (int b = kBlockMultiple; b <= 1024; b += kBlockMultiple)
    if (b != 64) v.push_back(b);
  return v;
}

// The prefill instantiations (hdim192_128): q/k head dim in (128, 192], V in (96, 128].
std::string prefill_dims_reason(int dqk, int dv) {
  if (dqk <= 128 || dqk > 192 || dqk % 8 != 0 || dv <= 96 || dv > 128 || dv % 8 != 0)
    return "MHA prefill on FA3: the build has hdim192_128 only (q/k head dim in (128, 192], V in (96, 128]); the case has " +
           std::to_string(dqk) + " / " + std::to_string(dv);
  return {};
}

#if MLAGATE_FLASH_ATTN_PREFILL
// Head dims 192 / 128, no page table, one q head per kv head (PackGQA only with split).
template <class T>
void run_prefill_fwd(Flash_fwd_params& p, cudaStream_t s) {
  if (p.num_splits > 1) return run_mha_fwd_<90, T, 192, 128, true, false, false, true>(p, s);
  if (p.pack_gqa) throw std::logic_error("flash_attn prefill: PackGQA without split is not built");
  return run_mha_fwd_<90, T, 192, 128, false, false, false, false>(p, s);
}
#endif

// How the decode's scheduler metadata is kept between calls.
enum class Metadata : std::uint8_t {
  kPerCall,         // a buffer per call (vLLM without full CUDA graphs)
  kPersistent,      // one buffer for the backend's life, the tail zeroed (vLLM's full-CUDA-graph mode)
  kStaleTail,       // tests: the persistent buffer, tail left as the last call left it
  // tests: two forwards on one metadata, as two layers of a step share it, with
  // the semaphore not reset between them; the first writes scratch outputs.
  kStaleSemaphore,
};

// The persistent metadata buffer of the cudagraph variants: 1 + round_up(1024, 4) * 4 ints.
// One backend's calls share it, which holds while a call is prepared and
// launched before the next is prepared (the runner and the bench do so).
struct PersistentMetadata {
  DeviceBuffer buf;
  int ints() const { return 1 + round_up(kMaxGraphBatch, 4) * 4; }
  // Zeroed on first use on the calls' stream (a non-blocking stream: a
  // default-stream memset would not be ordered before the call's copies).
  int* get(cudaStream_t s) {
    if (!buf.data()) {
      buf = DeviceBuffer(static_cast<std::size_t>(ints()) * sizeof(int));
      MLAGATE_CUDA_CHECK(cudaMemsetAsync(buf.data(), 0, buf.size(), s));
    }
    return buf.as<int>();
  }
};

class FaDecodeCall final : public libs::PreparedDecode {
 public:
  FaDecodeCall(const DecodeArgs& a, const libs::DeviceOutputs& out, cudaStream_t s, int forced_splits,
               Metadata mode, PersistentMetadata* persistent)
      : mode_(mode), out_lse_(out.lse) {
    const PagedCache& cache = *a.cache;
    const int B = static_cast<int>(a.seq_lens.size());
    T_ = static_cast<int>(a.q_lat.shape[0]);
    const int N = static_cast<int>(a.q_lat.shape[1]);
    const int L = static_cast<int>(a.q_lat.shape[2]), R = static_cast<int>(a.q_pe.shape[2]), D = L + R;
    if (cache.kv_dtype != KvCacheDtype::kAuto) throw NotSupportedError("FA3 MLA reads kv cache auto only");
    if (const std::string why = decode_dims_reason(L, R); !why.empty()) throw NotSupportedError(why);
    if (cache.block_size % kBlockMultiple != 0) throw NotSupportedError("block size not a multiple of 16");
    bf16_ = a.q_lat.dtype == DType::kBF16;
    N_ = N;

    cache_ = gpu::DeviceCacheStore::instance().get(cache, s);
    // q = q_pe and q_v = q_nope as vLLM hands them (slices of one fused q
    // under layout strided), their strides in the params below.
    q_pe_ = gpu::upload_view(a.q_pe, s);
    q_v_ = gpu::upload_view(a.q_lat, s);
    const std::vector<std::int32_t> table = libs::gather_table_rows(a);
    table_ = upload_array(table.data(), table.size(), s);
    seqused_ = upload_array(a.seq_lens.data(), a.seq_lens.size(), s);
    cu_q_ = upload_array(a.query_start_loc.data(), a.query_start_loc.size(), s);
    query_start_.assign(a.query_start_loc.begin(), a.query_start_loc.end());
    int max_q = 1, max_k = 0;
    for (int i = 0; i < B; ++i) {
      max_q = std::max(max_q, a.query_start_loc[i + 1] - a.query_start_loc[i]);
      max_k = std::max(max_k, a.seq_lens[i]);
    }
    const int sms = cuda_device_info().multiprocessors;

    // get_scheduler_metadata(batch_size=B, max_seqlen_q, max_seqlen_k=max
    // seq_len, num_heads_q=N, num_heads_kv=1, headdim=R, headdim_v=L,
    // page_size, cu_seqlens_q, causal=True, num_splits), as vLLM's
    // FlashAttnMLAMetadataBuilder._schedule_decode calls it.
    Flash_fwd_params m{};
    m.is_bf16 = bf16_;
    m.b = B;
    m.seqlen_q = max_q;
    m.seqlen_k = max_k;
    m.h = N;
    m.h_k = 1;
    m.d = R;
    m.dv = L;
    m.d_rounded = round_up_headdim(R);
    m.dv_rounded = round_up_headdimv(L);
    m.cu_seqlens_q = cu_q_.as<int>();
    m.seqused_k = seqused_.as<int>();
    m.arch = 90;
    m.num_sm = sms;
    m.page_size = cache.block_size;
    m.page_table = reinterpret_cast<int*>(1);  // only "there is one" matters for the heuristics
    set_mask(m, true);
    m.prepare_varlen_pdl = B <= kPrepareMaxBatches1Cta;
    m.num_splits_dynamic_ptr = reinterpret_cast<int*>(1);
    m.pagedkv_tma = get_pagedkv_tma(m);
    m.num_splits = forced_splits > 0 ? forced_splits : get_num_splits(m);
    m.pack_gqa = get_pack_gqa(m);
    m.varlen_sort_batches = true;  // !is_local
    m.head_swizzle = m.is_causal;
    const MetadataLayout ml = metadata_layout(m);
    meta_ = DeviceBuffer(static_cast<std::size_t>(ml.size()) * sizeof(int));
    point_into_metadata(m, meta_.as<int>());
    m.page_table = nullptr;
    {
      const auto [kBlockM, kBlockN, rs, overlap] = tile_sm90(m, !m.pagedkv_tma);
      prepare_varlen_num_blocks(m, s, m.pack_gqa, kBlockM, kBlockN, false);
      MLAGATE_CUDA_CHECK_LAUNCH();
    }
    sched_ = m;
    meta_ints_ = ml.size();
    persistent_ = persistent;
    B_ = B;
    L_ = L;
    R_ = R;
    int* meta = meta_.as<int>();
    if (mode == Metadata::kPersistent || mode == Metadata::kStaleTail) {
      if (B > kMaxGraphBatch)
        throw NotSupportedError("batch of " + std::to_string(B) + " requests: the persistent metadata buffer holds " +
                                std::to_string(kMaxGraphBatch));
      int* held = persistent->get(s);
      MLAGATE_CUDA_CHECK(cudaMemcpyAsync(held, meta, static_cast<std::size_t>(ml.size()) * sizeof(int),
                                         cudaMemcpyDeviceToDevice, s));
      if (mode == Metadata::kPersistent)
        MLAGATE_CUDA_CHECK(cudaMemsetAsync(held + ml.size(), 0,
                                           static_cast<std::size_t>(persistent->ints() - ml.size()) * sizeof(int), s));
      meta = held;
    }

    // mha_fwd(q=q_pe, k=k_pe cache, v=kv_c cache, q_v=q_nope, cu_seqlens_q,
    // max_seqlen_q, seqused_k, page_table, causal, scheduler_metadata, num_splits).
    Flash_fwd_params& p = params_;
    p = Flash_fwd_params{};
    p.is_bf16 = bf16_;
    auto* base = cache_->layer_as<std::uint16_t>();  // one layer of a stacked cache under layout strided
    const std::int64_t page_stride = static_cast<std::int64_t>(cache.block_size) * D;
    p.q_ptr = q_pe_.data();
    p.k_ptr = base + L;  // the k_pe columns of each entry
    p.v_ptr = base;      // the kv_c columns
    p.q_row_stride = a.q_pe.stride(0);
    p.q_head_stride = a.q_pe.stride(1);
    p.k_row_stride = D;
    p.k_head_stride = R;  // one kv head
    p.k_batch_stride = page_stride;
    p.v_row_stride = D;
    p.v_head_stride = L;
    p.v_batch_stride = page_stride;
    p.v_dim_stride = 1;
    p.o_ptr = out.o;  // mha_fwd's out=, with the view's strides; lse is transposed into a packed [T, N]
    p.o_row_stride = a.o_lat.stride(0);
    p.o_head_stride = a.o_lat.stride(1);
    p.cu_seqlens_q = cu_q_.as<int>();
    p.seqused_k = seqused_.as<int>();
    lse_hb_ = DeviceBuffer(static_cast<std::size_t>(N) * T_ * sizeof(float));
    lse_hb_.fill(0xFF, s);
    p.softmax_lse_ptr = lse_hb_.data();
    p.b = B;
    p.h = N;
    p.h_k = 1;
    p.seqlen_q = max_q;
    p.seqlen_k = cache.table_width * cache.block_size;  // max_num_pages_per_seq * page_size
    p.seqlen_q_rounded = round_up(max_q, 128);
    p.seqlen_k_rounded = round_up(p.seqlen_k, 128);
    p.d = R;
    p.d_rounded = round_up_headdim(R);
    p.dv = L;
    p.dv_rounded = round_up_headdimv(L);
    p.scale_softmax = static_cast<float>(a.scale);
    p.softcap = 0.f;
    p.p_dropout = 1.f;
    p.p_dropout_in_uint8_t = 255;
    p.rp_dropout = 1.f;
    p.arch = 90;
    p.num_sm = sms;
    p.total_q = T_;
    p.total_k = B * cache.block_size;
    p.b_k = B;
    p.page_table = table_.as<int>();
    set_mask(p, true);
    p.page_table_batch_stride = cache.table_width;
    p.page_size = cache.block_size;
    p.num_pages = cache.num_blocks;
    p.prepare_varlen_pdl = B <= kPrepareMaxBatches1Cta;
    p.num_splits_dynamic_ptr = reinterpret_cast<int*>(1);
    p.pagedkv_tma = get_pagedkv_tma(p);
    p.num_splits = forced_splits > 0 ? forced_splits : get_num_splits(p);
    p.pack_gqa = get_pack_gqa(p);
    p.varlen_sort_batches = true;
    p.head_swizzle = p.is_causal;
    if (metadata_layout(p).size() != ml.size())
      // mha_fwd: CHECK_SHAPE(scheduler_metadata, metadata_size).
      throw std::runtime_error("FA3: scheduler_metadata must have shape (" + std::to_string(metadata_layout(p).size()) +
                               "), it has " + std::to_string(ml.size()));
    p.skip_scheduler_metadata_computation = true;
    point_into_metadata(p, meta);
    p.qv_ptr = q_v_.data();
    p.qv_row_stride = a.q_lat.stride(0);
    p.qv_head_stride = a.q_lat.stride(1);
    if (p.num_splits > kMaxSplits) throw NotSupportedError("num_splits > 256 not supported");
    if (p.num_splits > 1) partials_.allocate(p, T_, s);
  }

  // --cuda-graph: the first refresh moves the cache into a buffer of this
  // call's own (the captured address); each refresh copies q_pe, q_v, the
  // block table (rows padded to the captured width), seqused_k and the cache
  // there and recomputes the scheduler metadata for the new batch into the
  // buffer the kernel reads (the persistent one, tail zeroed, for the
  // cudagraph variant), with the captured split count, as vLLM's metadata
  // builder does before a replay.
  bool refresh(const DecodeArgs& a, cudaStream_t s) override {
    if (mode_ == Metadata::kStaleSemaphore || mode_ == Metadata::kStaleTail) return false;  // test variants
    const PagedCache& cache = *a.cache;
    if (static_cast<int>(a.seq_lens.size()) != B_ || a.q_lat.shape[0] != T_ || a.q_lat.shape[1] != N_ ||
        a.q_lat.shape[2] != L_ || a.q_pe.shape[2] != R_ || (a.q_lat.dtype == DType::kBF16) != bf16_ ||
        cache.kv_dtype != KvCacheDtype::kAuto || cache.block_size != params_.page_size)
      throw std::invalid_argument("flash_attn graph: a batch of other shapes than captured");
    for (int i = 0; i <= B_; ++i)
      if (a.query_start_loc[i] != query_start_[i]) throw std::invalid_argument("flash_attn graph: other query lengths");
    if (!own_cache_.data()) {
      own_cache_ = DeviceBuffer(cache.data.nbytes());
      width_ = cache.table_width;
      auto* base = static_cast<std::uint16_t*>(own_cache_.data());
      params_.k_ptr = base + L_;
      params_.v_ptr = base;
      cache_.reset();
    }
    if (static_cast<std::size_t>(cache.data.nbytes()) > own_cache_.size() || cache.table_width > width_)
      throw std::invalid_argument("flash_attn graph: the cache is larger than the captured one");
    q_pe_.upload(a.q_pe.data, a.q_pe.nbytes(), s);
    q_v_.upload(a.q_lat.data, a.q_lat.nbytes(), s);
    const std::vector<std::int32_t> table = libs::gather_table_rows(a, width_);
    table_.upload(table.data(), table.size() * sizeof(std::int32_t), s);
    seqused_.upload(a.seq_lens.data(), a.seq_lens.size() * sizeof(std::int32_t), s);
    upload_pool(own_cache_, cache, s);
    Flash_fwd_params m = sched_;
    m.seqlen_k = 0;
    for (int i = 0; i < B_; ++i) m.seqlen_k = std::max(m.seqlen_k, a.seq_lens[i]);
    m.num_splits = params_.num_splits;  // the captured kernel's
    point_into_metadata(m, meta_.as<int>());
    {
      const auto [kBlockM, kBlockN, rs, overlap] = tile_sm90(m, !m.pagedkv_tma);
      prepare_varlen_num_blocks(m, s, m.pack_gqa, kBlockM, kBlockN, false);
      MLAGATE_CUDA_CHECK_LAUNCH();
    }
    if (mode_ == Metadata::kPersistent) {
      int* held = persistent_->get(s);
      MLAGATE_CUDA_CHECK(cudaMemcpyAsync(held, meta_.as<int>(), static_cast<std::size_t>(meta_ints_) * sizeof(int),
                                         cudaMemcpyDeviceToDevice, s));
      MLAGATE_CUDA_CHECK(cudaMemsetAsync(held + meta_ints_, 0,
                                         static_cast<std::size_t>(persistent_->ints() - meta_ints_) * sizeof(int), s));
    }
    return true;
  }

  void launch(cudaStream_t s) override {
    if (mode_ == Metadata::kStaleSemaphore && params_.num_splits == 1) {
      // A "previous layer" on the same metadata, into scratch outputs, and no reset after it.
      Flash_fwd_params first = params_;
      scratch_o_ = DeviceBuffer(static_cast<std::size_t>(T_) * N_ * params_.dv * 2);
      scratch_lse_ = DeviceBuffer(static_cast<std::size_t>(T_) * N_ * sizeof(float));
      first.o_ptr = scratch_o_.data();
      first.softmax_lse_ptr = scratch_lse_.data();
      forward(first, s);
    }
    forward(params_, s);
    if (params_.num_splits > 1) {
      run_combine(params_, bf16_, s);
      MLAGATE_CUDA_CHECK_LAUNCH();
    } else {
      // mha_fwd: "need to zero out the semaphore in this case".
      MLAGATE_CUDA_CHECK(cudaMemsetAsync(params_.tile_count_semaphore, 0, sizeof(int), s));
    }
    transpose_lse(lse_hb_.as<float>(), out_lse_, N_, T_, s);
  }

 private:
  void forward(Flash_fwd_params& p, cudaStream_t s) {
    if (bf16_)
      run_decode_fwd<cutlass::bfloat16_t>(p, s);
    else
      run_decode_fwd<cutlass::half_t>(p, s);
    MLAGATE_CUDA_CHECK_LAUNCH();
  }

  Metadata mode_;
  float* out_lse_;
  bool bf16_ = true;
  int N_ = 0, T_ = 0;
  std::shared_ptr<const gpu::DeviceCache> cache_;
  DeviceBuffer q_pe_, q_v_, table_, seqused_, cu_q_, meta_, lse_hb_, scratch_o_, scratch_lse_;
  SplitPartials partials_;
  Flash_fwd_params params_{};
  // --cuda-graph (refresh): the scheduler's parameters, the captured cache address and shapes.
  Flash_fwd_params sched_{};
  int meta_ints_ = 0;
  PersistentMetadata* persistent_ = nullptr;
  DeviceBuffer own_cache_;
  int width_ = 0, B_ = 0, L_ = 0, R_ = 0;
  std::vector<std::int32_t> query_start_;
};

// A device copy of a prefill input, or the caller's device memory as is.
struct DeviceInput {
  DeviceBuffer owned;
  const void* ptr = nullptr;
  DeviceInput(const TensorView& v, cudaStream_t s) {
    if (v.on_device) {
      ptr = v.data;
    } else {
      owned = DeviceBuffer(v.nbytes());
      owned.upload(v.data, v.nbytes(), s);
      ptr = owned.data();
    }
  }
};

class FlashAttnMlaBackend final : public Backend {
 public:
  FlashAttnMlaBackend(std::string name, const BackendOptions& o, Metadata mode)
      : name_(std::move(name)), splits_(o.num_splits), mode_(mode) {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override {
    return "FlashAttention-3 (hopper) MLA decode with q_v, as vLLM's FLASH_ATTN_MLA calls it (AOT scheduler metadata, "
           "num_splits), and its MHA prefill; built from MLAGATE_FLASH_ATTN_SOURCE_DIR";
  }
  Capabilities capabilities() const override {
    Capabilities c;
    c.ops = {Op::kDecode};
    if (detail::flash_attn_has_prefill()) c.ops.push_back(Op::kPrefill);
    c.block_sizes = block_sizes();
    c.query_len_support = QueryLenSupport::kVarlen;
    c.reorder_threshold = kReorderThreshold;
    c.dtypes = {DType::kBF16, DType::kF16};
    c.kv_dtypes = {KvCacheDtype::kAuto};
    c.max_pool_bytes = std::numeric_limits<std::int64_t>::max();  // tried past 4 GiB by the layout suite (cases/LAYOUTS.md)
    c.strided_views = true;  // q (q_pe), q_v (q_lat) and o with their strides (Flash_fwd_params), lse packed
    c.device_inputs = true;
    return c;
  }
  Support supports(const CaseSpec& spec, Op op) const override {
    if (spec.kv_cache_dtype != KvCacheDtype::kAuto && (op == Op::kDecode || op == Op::kLayer))
      // vLLM's FlashAttnMLAImpl: NotImplementedError("FlashAttnMLA V1 with FP8 KV cache not yet supported").
      return Support::no("kv cache dtype " + std::string(kv_cache_dtype_name(spec.kv_cache_dtype)) +
                         " not in {auto} (vLLM: \"FlashAttnMLA V1 with FP8 KV cache not yet supported\")");
    Support s = check_capabilities(capabilities(), spec, op);
    if (!s.ok) return s;
    const CudaDeviceInfo& dev = cuda_device_info();
    if (dev.available && !(dev.sm_major == 9 && dev.sm_minor == 0))
      return Support::no("FA3 with q_v needs sm90 (\"q_v is only supported for Hopper GPUs\"); the device is sm_" +
                         std::to_string(dev.sm_major) + std::to_string(dev.sm_minor));
    if (splits_ > kMaxSplits) return Support::no("num_splits " + std::to_string(splits_) + " > 256 not supported");
    if (op == Op::kDecode || op == Op::kLayer) {
      if (const std::string why = decode_dims_reason(spec.dims.kv_lora_rank, spec.dims.rope_dim); !why.empty())
        return Support::no(why);
      if ((mode_ == Metadata::kPersistent || mode_ == Metadata::kStaleTail) && spec.num_requests() > kMaxGraphBatch)
        return Support::no("batch of " + std::to_string(spec.num_requests()) +
                           " requests: the persistent metadata buffer holds " + std::to_string(kMaxGraphBatch));
    }
    // Without the prefill instantiations, check_capabilities (the prefill op)
    // and the layer op's routing (prefill requests) give the reason.
    bool prefill = op == Op::kPrefill;
    if (op == Op::kLayer && !spec.batch.spec_decode)
      for (int q : spec.batch.query_lens) prefill = prefill || q > kReorderThreshold;
    if (prefill && detail::flash_attn_has_prefill())
      if (const std::string why = prefill_dims_reason(spec.dims.nope_dim + spec.dims.rope_dim, spec.dims.v_head_dim);
          !why.empty())
        return Support::no(why);
    return s;
  }
  void decode(const DecodeArgs& a) override {
    libs::run_decode(a, stream(), prepare_fn(), {.lse = gpu::GuardedDeviceOutput::Writes::kPacked});
  }
  std::unique_ptr<DecodeBench> prepare_decode_bench(const DecodeArgs& a) override {
    return libs::make_decode_bench(a, stream(), prepare_fn(), "includes the lse transpose [N, T] -> [T, N] (one small kernel)");
  }
  std::unique_ptr<DecodeGraph> capture_decode(const DecodeArgs& a) override {
    return libs::make_decode_graph(a, stream(), prepare_fn(),
                                   "FA3 in a CUDA graph (scheduler metadata refreshed in place, captured split count)");
  }
  void prefill(const PrefillArgs& a) override;

 private:
  libs::PrepareFn prepare_fn() {
    return [this](const DecodeArgs& a, const libs::DeviceOutputs& o, cudaStream_t s) {
      int splits = splits_;
      const bool graph = mode_ == Metadata::kPersistent || mode_ == Metadata::kStaleTail;
      if (graph && splits == 0 && a.q_lat.shape[0] <= kGraphMaxTokens) splits = kGraphMaxSplits;
      return std::make_unique<FaDecodeCall>(a, o, s, splits, mode_, &persistent_);
    };
  }
  cudaStream_t stream() {
    if (!stream_) stream_ = std::make_unique<gpu::Stream>();
    return stream_->get();
  }
  std::string name_;
  int splits_ = 0;
  Metadata mode_;
  PersistentMetadata persistent_;
  std::unique_ptr<gpu::Stream> stream_;
};

void FlashAttnMlaBackend::prefill(const PrefillArgs& a) {
#if MLAGATE_FLASH_ATTN_PREFILL
  gpu::require_device();
  cudaStream_t s = stream();
  const int T = static_cast<int>(a.q.shape[0]), N = static_cast<int>(a.q.shape[1]);
  const int dqk = static_cast<int>(a.q.shape[2]), dv = static_cast<int>(a.v.shape[2]);
  const int B = static_cast<int>(a.cu_seqlens_q.size()) - 1;
  if (B < 1 || a.cu_seqlens_k.size() != a.cu_seqlens_q.size())
    throw std::invalid_argument("prefill: cu_seqlens_q and cu_seqlens_k must have B + 1 entries, B >= 1");
  if (const std::string why = prefill_dims_reason(dqk, dv); !why.empty()) throw NotSupportedError(why);
  if (a.k.shape[0] != a.cu_seqlens_k.back() || a.q.shape[0] != a.cu_seqlens_q.back())
    throw std::invalid_argument("prefill: q / k rows differ from cu_seqlens");
  // mha_fwd's CHECK_SHAPE / dtype checks: k [Sk, N, dqk], v [Sk, N, dv] in q's dtype (one kv head per q head here).
  if (a.k.shape.size() != 3 || a.v.shape.size() != 3 || a.k.shape[1] != N || a.k.shape[2] != dqk ||
      a.v.shape[0] != a.k.shape[0] || a.v.shape[1] != N || a.k.dtype != a.q.dtype || a.v.dtype != a.q.dtype ||
      a.o.dtype != a.q.dtype)
    throw std::invalid_argument("prefill: k must be [Sk, N, " + std::to_string(dqk) + "] and v [Sk, N, " +
                                std::to_string(dv) + "] in q's dtype, o too");
  const bool bf16 = a.q.dtype == DType::kBF16;
  gpu::GuardedDeviceOutput o(a.o, "o", s), lse(a.lse, "lse", s);
  DeviceInput q(a.q, s), k(a.k, s), v(a.v, s);
  DeviceBuffer cu_q = upload_array(a.cu_seqlens_q.data(), a.cu_seqlens_q.size(), s);
  DeviceBuffer cu_k = upload_array(a.cu_seqlens_k.data(), a.cu_seqlens_k.size(), s);
  int max_q = 0, max_k = 0;
  for (int i = 0; i < B; ++i) {
    max_q = std::max(max_q, a.cu_seqlens_q[i + 1] - a.cu_seqlens_q[i]);
    max_k = std::max(max_k, a.cu_seqlens_k[i + 1] - a.cu_seqlens_k[i]);
  }
  DeviceBuffer lse_hb(static_cast<std::size_t>(N) * T * sizeof(float));
  lse_hb.fill(0xFF, s);
  if (T > 0 && a.k.shape[0] > 0) {
    // mha_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal), as
    // vLLM's MLACommonImpl prefill calls flash_attn_varlen_func (FA3; no scheduler metadata).
    Flash_fwd_params p{};
    p.is_bf16 = bf16;
    p.q_ptr = const_cast<void*>(q.ptr);
    p.k_ptr = const_cast<void*>(k.ptr);
    p.v_ptr = const_cast<void*>(v.ptr);
    p.q_row_stride = static_cast<std::int64_t>(N) * dqk;
    p.q_head_stride = dqk;
    p.k_row_stride = static_cast<std::int64_t>(N) * dqk;
    p.k_head_stride = dqk;
    p.v_row_stride = static_cast<std::int64_t>(N) * dv;
    p.v_head_stride = dv;
    p.v_dim_stride = 1;
    p.o_ptr = o.data();
    p.o_row_stride = static_cast<std::int64_t>(N) * dv;
    p.o_head_stride = dv;
    p.cu_seqlens_q = cu_q.as<int>();
    p.cu_seqlens_k = cu_k.as<int>();
    p.softmax_lse_ptr = lse_hb.data();
    p.b = B;
    p.h = N;
    p.h_k = N;
    p.seqlen_q = max_q;
    p.seqlen_k = max_k;
    p.seqlen_q_rounded = round_up(max_q, 128);
    p.seqlen_k_rounded = round_up(max_k, 128);
    p.d = dqk;
    p.d_rounded = round_up_headdim(dqk);
    p.dv = dv;
    p.dv_rounded = dv == dqk ? p.d_rounded : round_up_headdimv(dv);
    p.scale_softmax = static_cast<float>(a.scale);
    p.p_dropout = 1.f;
    p.p_dropout_in_uint8_t = 255;
    p.rp_dropout = 1.f;
    // mha_fwd's window rule: a left window reaching the first key is none.
    set_mask(p, a.causal);
    p.arch = 90;
    p.num_sm = cuda_device_info().multiprocessors;
    p.total_q = T;
    p.total_k = static_cast<int>(a.k.shape[0]);
    p.b_k = B;
    p.page_size = 1;
    p.prepare_varlen_pdl = B <= kPrepareMaxBatches1Cta;
    p.num_splits_dynamic_ptr = reinterpret_cast<int*>(1);
    p.pagedkv_tma = false;
    p.num_splits = get_num_splits(p);  // vLLM's prefill passes no num_splits: FA3's heuristic, whatever --splits says
    p.pack_gqa = get_pack_gqa(p);
    p.varlen_sort_batches = true;
    p.head_swizzle = p.is_causal;
    DeviceBuffer meta(static_cast<std::size_t>(metadata_layout(p).size()) * sizeof(int));
    point_into_metadata(p, meta.as<int>());  // computed by the forward itself (no AOT metadata here)
    SplitPartials partials;
    if (p.num_splits > kMaxSplits) throw NotSupportedError("num_splits > 256 not supported");
    if (p.num_splits > 1) partials.allocate(p, T, s);
    if (bf16)
      run_prefill_fwd<cutlass::bfloat16_t>(p, s);
    else
      run_prefill_fwd<cutlass::half_t>(p, s);
    MLAGATE_CUDA_CHECK_LAUNCH();
    if (p.num_splits > 1) {
      run_combine(p, bf16, s);
      MLAGATE_CUDA_CHECK_LAUNCH();
    }
    transpose_lse(lse_hb.as<float>(), lse.as<float>(), N, T, s);
  } else if (T > 0) {
    // mha_fwd with no keys: "out.zero_(); softmax_lse.fill_(inf)".
    MLAGATE_CUDA_CHECK(cudaMemsetAsync(o.data(), 0, o.bytes(), s));
    std::vector<float> inf(static_cast<std::size_t>(N) * T, INFINITY);
    MLAGATE_CUDA_CHECK(cudaMemcpyAsync(lse.data(), inf.data(), inf.size() * sizeof(float), cudaMemcpyHostToDevice, s));
  }
  MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));
  gpu::check_guards_or_throw({&o, &lse}, s);
  o.download_to(a.o, s);
  lse.download_to(a.lse, s);
#else
  (void)a;
  throw NotSupportedError(
      "FA3 prefill: this build has no hdim192_128 instantiations (configure with -DMLAGATE_FLASH_ATTN_PREFILL=ON)");
#endif
}

}  // namespace

std::unique_ptr<Backend> make_flash_attn_mla(const BackendOptions& o) {
  return std::make_unique<FlashAttnMlaBackend>("flash_attn.mla", o, Metadata::kPerCall);
}
std::unique_ptr<Backend> make_flash_attn_mla_cudagraph(const BackendOptions& o) {
  return std::make_unique<FlashAttnMlaBackend>("flash_attn.mla.cudagraph", o, Metadata::kPersistent);
}

namespace detail {
std::unique_ptr<Backend> make_flash_attn_mla_stale_tail() {
  return std::make_unique<FlashAttnMlaBackend>("flash_attn.mla+stale_tail", BackendOptions{}, Metadata::kStaleTail);
}
std::unique_ptr<Backend> make_flash_attn_mla_stale_semaphore() {
  // One split, as vLLM's batch-invariant mode asks (max_num_splits = 1): split
  // calls end in the combine, which resets the semaphore itself.
  return std::make_unique<FlashAttnMlaBackend>("flash_attn.mla+stale_semaphore", BackendOptions{1},
                                               Metadata::kStaleSemaphore);
}
bool flash_attn_has_prefill() { return MLAGATE_FLASH_ATTN_PREFILL != 0; }
}  // namespace detail

}  // namespace mlagate
