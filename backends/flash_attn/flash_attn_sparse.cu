// "flash_attn.mla.sparse": DeepSeek V3.2's sparse decode on FlashAttention-3's
// Hopper forward, as vLLM's FLASH_ATTN_MLA_SPARSE backend calls it
// (vllm/v1/attention/backends/mla/flashattn_mla_sparse.py, forward_mqa):
// flash_attn_varlen_func(q = q_pe, k = the cache's k_pe columns viewed as
// [slots, 1, 1, R], v = its kv_c columns as [slots, 1, 1, L], q_v = q_nope,
// max_seqlen_q = 1, cu_seqlens_q = arange(T + 1), max_seqlen_k = K,
// seqused_k = valid counts, block_table = the top-k global slots [T, K],
// causal = True, fa_version = 3): every query token is its own batch row, the
// page size is 1, so a slot is a page, and the kernel reads the first
// seqused_k pages of its row. The valid counts are vLLM's conversion's
// (backends/sparse_convert.h: slots >= 0 per row); the kernel needs them to be
// a prefix, which the backend declares (Capabilities::sparse_valid_prefix) and
// checks before launching: a -1 inside the count would be page -1, an address
// before the cache. No scheduler metadata is passed: mha_fwd's own path (the
// split heuristic, the varlen prepare kernel inside the launch) runs, as with
// num_splits = 0 and no scheduler_metadata in vLLM's call. --cuda-graph
// captures that launch over persistent buffers (vLLM's UNIFORM_BATCH graphs).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cuda/cache_store.h"
#include "backends/cuda/cuda_backends.h"
#include "backends/flash_attn/fa3_host.h"
#include "backends/flash_attn/flash_attn_backend.h"
#include "backends/kernel_libs/adapter_common.h"
#include "backends/sparse_convert.h"
#include "cases/errors.h"

namespace mlagate {
namespace {

using gpu::DeviceBuffer;
using gpu::upload_array;
using namespace fa3;  // flash_api.cpp's host side

// What vLLM's FlashAttnMLASparseBackend declares.
constexpr int kBlockSize = 64;            // get_supported_kernel_block_sizes: [64]
constexpr int kReorderThreshold = 1024;   // _init_reorder_batch_threshold(1024, supports_spec_as_decode=True)
constexpr int kMaxSplits = 256;           // mha_fwd: "num_splits > 256 not supported"

// One sparse decode on FA3: device inputs, the params mha_fwd would fill, and
// the buffers it would allocate (lse [N, T], the scheduler metadata, the split
// partials), sized at construction for the call's shapes and filled by
// refresh(), so that a captured graph replays over the same addresses
// (`own_cache`: the cache in a buffer of its own, not the shared copy).
class SparseCall {
 public:
  SparseCall(const SparseDecodeArgs& a, cudaStream_t s, bool own_cache) : s_(s) {
    const PagedCache& cache = *a.cache;
    T_ = static_cast<int>(a.q.shape[0]);
    N_ = static_cast<int>(a.q.shape[1]);
    L_ = cache.kv_lora_rank;
    const int R = cache.rope_dim, D = L_ + R;
    K_ = static_cast<int>(a.indices.shape[1]);
    if (cache.kv_dtype != KvCacheDtype::kAuto)
      throw NotSupportedError("FlashAttention MLA Sparse currently supports only FP16/BF16 KV cache");
    if (const std::string why = decode_dims_reason(L_, R); !why.empty()) throw NotSupportedError(why);
    if (a.o.shape[2] != L_) throw NotSupportedError("the output is the latent (Dv = L): V3.2, not V4");
    if (!a.q.strides.empty()) throw NotSupportedError("flash_attn.mla.sparse takes a contiguous q");
    bf16_ = a.q.dtype == DType::kBF16;
    std::vector<std::int32_t> cu_q(static_cast<std::size_t>(T_) + 1);
    for (int t = 0; t <= T_; ++t) cu_q[static_cast<std::size_t>(t)] = t;

    q_ = DeviceBuffer(a.q.nbytes());
    table_ = DeviceBuffer(static_cast<std::size_t>(T_) * K_ * sizeof(std::int32_t));
    seqused_ = DeviceBuffer(static_cast<std::size_t>(T_) * sizeof(std::int32_t));
    cu_q_ = upload_array(cu_q.data(), cu_q.size(), s);
    lse_hb_ = DeviceBuffer(static_cast<std::size_t>(N_) * T_ * sizeof(float));
    lse_hb_.fill(0xFF, s);
    o_ = std::make_unique<gpu::GuardedDeviceOutput>(a.o, "o", s);
    lse_ = std::make_unique<gpu::GuardedDeviceOutput>(a.lse, "lse", s);
    if (own_cache) own_cache_ = DeviceBuffer(cache.data.nbytes());

    Flash_fwd_params& p = params_;
    p = Flash_fwd_params{};
    p.is_bf16 = bf16_;
    // q = q_rope and q_v = q_nope: the two column ranges of the call's q [T, N, L + R].
    auto* q = q_.as<std::uint16_t>();
    p.q_ptr = q + L_;
    p.q_row_stride = static_cast<std::int64_t>(N_) * D;
    p.q_head_stride = D;
    p.qv_ptr = q;
    p.qv_row_stride = p.q_row_stride;
    p.qv_head_stride = D;
    // k = kv_cache[:, :, L:].view(-1, 1, 1, R), v = kv_cache[:, :, :L].view(-1, 1, 1, L): a page per slot
    // (k_ptr / v_ptr: refresh(), the cache's address).
    p.k_row_stride = D;
    p.k_head_stride = D;
    p.k_batch_stride = D;
    p.v_row_stride = D;
    p.v_head_stride = D;
    p.v_batch_stride = D;
    p.v_dim_stride = 1;
    p.o_ptr = o_->data();
    p.o_row_stride = static_cast<std::int64_t>(N_) * L_;
    p.o_head_stride = L_;
    p.softmax_lse_ptr = lse_hb_.data();
    p.cu_seqlens_q = cu_q_.as<int>();
    p.seqused_k = seqused_.as<int>();
    p.b = T_;
    p.b_k = T_;  // page_table.size(0)
    p.h = N_;
    p.h_k = 1;
    p.seqlen_q = 1;   // max_seqlen_q
    p.seqlen_k = K_;  // max_num_pages_per_seq * page_size
    p.seqlen_q_rounded = round_up(1, 128);
    p.seqlen_k_rounded = round_up(K_, 128);
    p.d = R;
    p.d_rounded = round_up_headdim(R);
    p.dv = L_;
    p.dv_rounded = round_up_headdimv(L_);
    p.scale_softmax = static_cast<float>(a.scale);
    p.softcap = 0.f;
    p.p_dropout = 1.f;
    p.p_dropout_in_uint8_t = 255;
    p.rp_dropout = 1.f;
    p.arch = 90;
    p.num_sm = cuda_device_info().multiprocessors;
    p.total_q = T_;
    p.total_k = T_;  // batch_size * k.size(1)
    p.page_table = table_.as<int>();
    p.page_table_batch_stride = K_;
    p.page_size = 1;
    p.num_pages = static_cast<int>(static_cast<std::int64_t>(cache.num_blocks) * cache.block_size);
    set_mask(p, true);  // causal=True: with one query row and d <= 64, mha_fwd makes it plain attention
    // mha_fwd with num_splits = 0 and no scheduler_metadata: varlen, so the
    // prepare kernel runs inside the launch, into metadata it allocates.
    p.prepare_varlen_pdl = T_ <= kPrepareMaxBatches1Cta;
    p.num_splits_dynamic_ptr = reinterpret_cast<int*>(1);
    p.pagedkv_tma = get_pagedkv_tma(p);
    p.num_splits = get_num_splits(p);
    p.pack_gqa = get_pack_gqa(p);
    p.varlen_sort_batches = true;  // !is_local
    p.head_swizzle = p.is_causal;
    meta_ = DeviceBuffer(static_cast<std::size_t>(metadata_layout(p).size()) * sizeof(int));
    point_into_metadata(p, meta_.as<int>());
    p.skip_scheduler_metadata_computation = false;
    if (p.num_splits > kMaxSplits) throw NotSupportedError("num_splits > 256 not supported");
    if (p.num_splits > 1) partials_.allocate(p, T_, s);
  }

  // The call's inputs into the buffers: q, the rows as vLLM's conversion hands
  // them and its valid counts (the kernel reads pages [0, count) of each row,
  // so they must all be slots), and the cache.
  void refresh(const SparseDecodeArgs& a) {
    if (a.q.shape[0] != T_ || a.q.shape[1] != N_ || a.indices.shape[1] != K_ || (a.q.dtype == DType::kBF16) != bf16_)
      throw std::invalid_argument("flash_attn.mla.sparse: a call of other shapes than the prepared one");
    const std::span<const std::int32_t> rows(a.indices.as<std::int32_t>(), static_cast<std::size_t>(T_) * K_);
    const std::vector<std::int32_t> counts = vllm_valid_counts(rows, T_, K_);
    for (int t = 0; t < T_; ++t)
      for (int k = 0; k < counts[static_cast<std::size_t>(t)]; ++k)
        if (rows[static_cast<std::size_t>(t) * K_ + k] < 0)
          throw std::invalid_argument("flash_attn.mla.sparse: row " + std::to_string(t) + " has -1 at " +
                                      std::to_string(k) + ", inside its valid count " +
                                      std::to_string(counts[static_cast<std::size_t>(t)]) +
                                      " (FA3 reads a row's first seqused_k pages: the valid slots must come first)");
    q_.upload(a.q.data, a.q.nbytes(), s_);
    table_.upload(rows.data(), rows.size_bytes(), s_);
    seqused_.upload(counts.data(), counts.size() * sizeof(std::int32_t), s_);
    std::uint16_t* base = nullptr;
    if (own_cache_.data()) {
      if (a.cache->data.nbytes() > own_cache_.size())
        throw std::invalid_argument("flash_attn.mla.sparse: a cache larger than the prepared one");
      upload_pool(own_cache_, *a.cache, s_);
      base = own_cache_.as<std::uint16_t>();
    } else {
      cache_ = gpu::DeviceCacheStore::instance().get(*a.cache, s_);
      base = const_cast<std::uint16_t*>(cache_->layer_as<std::uint16_t>());
    }
    params_.k_ptr = base + L_;  // the k_pe columns of each entry
    params_.v_ptr = base;       // the kv_c columns
  }

  // The forward (the prepare kernel inside it), the combine after a split,
  // the lse into [T, N]: what a graph captures.
  void launch() {
    if (bf16_)
      run_decode_fwd<cutlass::bfloat16_t>(params_, s_);
    else
      run_decode_fwd<cutlass::half_t>(params_, s_);
    MLAGATE_CUDA_CHECK_LAUNCH();
    if (params_.num_splits > 1) {
      run_combine(params_, bf16_, s_);
      MLAGATE_CUDA_CHECK_LAUNCH();
    }
    transpose_lse(lse_hb_.as<float>(), lse_->as<float>(), N_, T_, s_);
  }

  // Waits, checks the guard bands and brings the outputs back.
  void finish(const SparseDecodeArgs& a) {
    MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s_));  // the kernels' execution errors surface here
    gpu::check_guards_or_throw({o_.get(), lse_.get()}, s_);
    o_->download_to(a.o, s_);
    lse_->download_to(a.lse, s_);
  }

 private:
  cudaStream_t s_;
  bool bf16_ = true;
  int T_ = 0, N_ = 0, L_ = 0, K_ = 0;
  std::shared_ptr<const gpu::DeviceCache> cache_;
  DeviceBuffer q_, table_, seqused_, cu_q_, lse_hb_, meta_, own_cache_;
  std::unique_ptr<gpu::GuardedDeviceOutput> o_, lse_;
  SplitPartials partials_;
  Flash_fwd_params params_{};
};

struct Graph {
  std::unique_ptr<SparseCall> call;
  gpu::CapturedGraph graph;  // last: destroyed before the call's buffers
};

class FlashAttnMlaSparse final : public Backend {
 public:
  std::string_view name() const override { return "flash_attn.mla.sparse"; }
  std::string_view description() const override {
    return "FlashAttention-3 (hopper) as vLLM's FLASH_ATTN_MLA_SPARSE calls it: varlen q_v forward, page size 1 over "
           "the top-k slots, seqused_k = valid counts; bf16/fp16 caches, block size 64";
  }
  Capabilities capabilities() const override {
    Capabilities c;
    c.ops = {Op::kSparseDecode};
    c.block_sizes = {kBlockSize};
    c.query_len_support = QueryLenSupport::kVarlen;  // every token is its own batch row
    c.reorder_threshold = kReorderThreshold;
    c.dtypes = {DType::kBF16, DType::kF16};
    c.kv_dtypes = {KvCacheDtype::kAuto};
    c.max_pool_bytes = std::numeric_limits<std::int64_t>::max();  // a page (slot) index times a 64-bit page stride
    c.sparse_valid_prefix = true;  // seqused_k pages of each row are read
    c.no_dcp = "FlashAttention MLA Sparse does not support DCP for now";  // supports_combination
    return c;
  }
  Support supports(const CaseSpec& spec, Op op) const override {
    // vLLM's supports_combination, in its order (the DCP check is the dcp mode's).
    if (spec.kv_cache_dtype != KvCacheDtype::kAuto && op == Op::kSparseDecode)
      return Support::no("FlashAttention MLA Sparse currently supports only FP16/BF16 KV cache");
    Support s = check_capabilities(capabilities(), spec, op);
    if (!s.ok || op != Op::kSparseDecode) return s;
    const CudaDeviceInfo& dev = cuda_device_info();
    if (dev.available && !(dev.sm_major == 9 && dev.sm_minor == 0)) return Support::no("FlashAttention MLA not supported on this device");
    if (spec.sparse.v4()) return Support::no("FlashAttention MLA Sparse requires model with index_topk (V3.2 top-k rows; V4's window is FlashMLA's)");
    if (const std::string why = decode_dims_reason(spec.dims.kv_lora_rank, spec.dims.rope_dim); !why.empty())
      return Support::no(why + " (vLLM's FLASH_ATTN_MLA_SPARSE does not check; FA3 has no head dim 0)");
    if (has_topk_length(spec.sparse.pattern))
      return Support::no("no topk_length: vLLM's forward_mqa passes seqused_k = the rows' valid counts");
    if (spec.sparse.sink) return Support::no("no attention sink: vLLM's call passes no s_aux");
    return s;
  }
  void sparse_decode(const SparseDecodeArgs& a) override {
    check_call(a);
    if (a.q.shape[0] == 0) return;
    SparseCall call(a, stream(), false);
    call.refresh(a);
    call.launch();
    call.finish(a);
  }
  // --cuda-graph (vLLM's UNIFORM_BATCH graphs): the forward captured once over
  // the call's persistent buffers (the cache in one of its own); each replay
  // uploads the new batch's q, rows, valid counts and cache into them and
  // launches the graph, whose prepare kernel recomputes the scheduler's
  // metadata from the new counts, with the split count of the capture.
  std::unique_ptr<SparseDecodeGraph> capture_sparse_decode(const SparseDecodeArgs& a) override {
    check_call(a);
    if (a.q.shape[0] == 0) throw NotSupportedError("an empty batch is not captured");
    auto g = std::make_shared<Graph>();
    return persistent_sparse_decode_graph(
        a,
        [this, g](const SparseDecodeArgs& p, bool capture) {
          if (capture) {
            g->call = std::make_unique<SparseCall>(p, stream(), true);
            g->call->refresh(p);
            g->call->launch();  // the warm-up, whose outputs the capture's record reads
            MLAGATE_CUDA_CHECK(cudaStreamSynchronize(stream()));
            g->graph = gpu::CapturedGraph(stream(), [&] { g->call->launch(); });
          } else {
            g->call->refresh(p);
            g->graph.launch(stream());
          }
          g->call->finish(p);
        },
        "CUDA graph");
  }
  // `mlagate bench`: the call uploaded, then its forward (mha_fwd's prepare
  // kernel, the attention kernel, the combine when split, the lse transpose)
  // timed as a graph.
  std::unique_ptr<DecodeBench> prepare_sparse_decode_bench(const SparseDecodeArgs& a) override {
    check_call(a);
    if (a.q.shape[0] == 0) throw NotSupportedError("an empty batch is not timed");
    auto call = std::make_shared<SparseCall>(a, stream(), false);
    call->refresh(a);
    return libs::graph_bench(call, stream(), [c = call.get()] { c->launch(); },
                            "prepare + attention (+ combine) kernels, lse transposed");
  }

 private:
  void check_call(const SparseDecodeArgs& a) {
    gpu::require_device();
    check_sparse_decode_args(a);
    if (a.window > 0 || a.extra_cache) throw NotSupportedError("V3.2 top-k rows only");
    if (!a.topk_length.empty()) throw NotSupportedError("no topk_length (seqused_k is the rows' valid count)");
    if (!a.sink.empty()) throw NotSupportedError("no attention sink");
  }
  cudaStream_t stream() {
    if (!stream_) stream_ = std::make_unique<gpu::Stream>();
    return stream_->get();
  }
  std::unique_ptr<gpu::Stream> stream_;
};

}  // namespace

std::unique_ptr<Backend> make_flash_attn_mla_sparse() { return std::make_unique<FlashAttnMlaSparse>(); }

}  // namespace mlagate
