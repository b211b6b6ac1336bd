// "flashinfer.mla.sparse": DeepSeek V3.2 / GLM-5.x sparse decode on
// FlashInfer's Hopper MLA kernel, as vLLM's FLASHINFER_MLA_SPARSE_SM90 backend
// calls it (vllm/v1/attention/backends/mla/flashinfer_mla_sparse_sm90.py):
// BatchMLAPagedAttentionWrapper(backend="fa3") planned on the host for every
// step with page size 1 (the top-k global slots are the page table), causal
// false, one query row per token, and per-row kv lengths from the tokens'
// positions, not from the rows (_kv_lens_host: min(position + 1, index_topk));
// the rows are packed into a CSR over those lengths with negative slots
// clamped to 0 (_pack_topk_indices). The conversions are
// backends/sparse_convert.h's, tested on the CPU. The kernel reads the first
// planned-length slots of each row: the backend declares
// Capabilities::sparse_valid_prefix, so the harness hands rows with their
// valid slots first, as vLLM's indexer emits them; a row with fewer valid
// slots than its position predicts (invalid_rows' empty rows) attends slot 0,
// which is what vLLM does with it (backends/flashinfer/expect.yaml).
// Caches: bf16 (auto), and fp8 / fp8_e4m3 with vLLM's scales: ckv_scale =
// k_scale, kpe_scale = 1.0 (the per-token ckv_scale_arr is not wired in vLLM;
// nor here). Head sizes 576 (kpe 64) and 512 (kpe 0: NoPE MLA).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

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
#include "backends/flashinfer/flashinfer_backend.h"
#include "backends/flashinfer/mla_plan.h"
#include "backends/kernel_libs/adapter_common.h"
#include "backends/sparse_convert.h"
#include "cases/errors.h"

#include <flashinfer/attention/mla_hopper.cuh>

namespace mlagate {
namespace {

using gpu::DeviceBuffer;

constexpr int kHeadDimCkv = 512;  // supports_combination: "requires kv_lora_rank=512"

// One sparse decode, sized at construction for the call's shapes and filled
// by refresh() (the plan included), so that a captured graph replays over the
// same addresses (`own_cache`: the cache in a buffer of its own).
class SparseCallBase {
 public:
  virtual ~SparseCallBase() = default;
  virtual void refresh(const SparseDecodeArgs& a) = 0;
  virtual void launch() = 0;
  // Waits, checks the guard bands and brings the outputs back.
  void finish(const SparseDecodeArgs& a) {
    MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s_));  // the kernel's execution errors surface here
    gpu::check_guards_or_throw({o_.get(), lse_.get()}, s_);
    o_->download_to(a.o, s_);
    lse_->download_to(a.lse, s_);
  }

 protected:
  SparseCallBase(const SparseDecodeArgs& a, cudaStream_t s)
      : s_(s),
        o_(std::make_unique<gpu::GuardedDeviceOutput>(a.o, "o", s)),
        lse_(std::make_unique<gpu::GuardedDeviceOutput>(a.lse, "lse", s)) {}
  cudaStream_t s_;
  std::unique_ptr<gpu::GuardedDeviceOutput> o_, lse_;
};

template <int KPE, class DTypeKV>
class SparseCall final : public SparseCallBase {
  using Q = __nv_bfloat16;
  using Params = flashinfer::MLAParams<Q, DTypeKV, Q, std::int32_t>;

 public:
  SparseCall(const SparseDecodeArgs& a, bool kpe_scaled, cudaStream_t s, bool own_cache) : SparseCallBase(a, s) {
    const PagedCache& cache = *a.cache;
    T_ = static_cast<int>(a.q.shape[0]);
    N_ = static_cast<int>(a.q.shape[1]);
    K_ = static_cast<int>(a.indices.shape[1]);
    const int L = cache.kv_lora_rank, R = cache.rope_dim, D = L + R;
    if (L != kHeadDimCkv || R != KPE) throw std::logic_error("flashinfer.mla.sparse: dispatched to the wrong head dims");
    if (!a.q.strides.empty()) throw NotSupportedError("flashinfer.mla.sparse takes a contiguous q");
    q_ = DeviceBuffer(a.q.nbytes());
    // The wrapper's kv_indices buffer: max_tokens * topk_width slots, the packed rows at its front.
    kv_indices_ = DeviceBuffer(std::max<std::size_t>(static_cast<std::size_t>(T_) * K_, 1) * sizeof(std::int32_t));
    float_ws_ = DeviceBuffer(fi::float_workspace_bytes(cuda_device_info().multiprocessors, kHeadDimCkv));
    float_ws_.fill(0xFF, s);  // partial outputs start as NaN: one never written shows
    int_ws_ = DeviceBuffer(fi::kIntWorkspaceBytes);
    if (own_cache) own_cache_ = DeviceBuffer(cache.data.nbytes());

    Params& p = params_;
    p = Params{};
    // q_nope and q_pe: the two column ranges of the call's q [T, N, L + R] (a zero-width q_pe for NoPE).
    Q* q = q_.as<Q>();
    p.q_nope = q;
    p.q_pe = q + L;
    p.final_o = o_->as<Q>();
    p.final_lse = lse_->as<float>();
    p.kv_indices = kv_indices_.as<std::int32_t>();
    p.block_size = flashinfer::uint_fastdiv(1u);
    p.num_heads = flashinfer::uint_fastdiv(static_cast<std::uint32_t>(N_));
    p.q_nope_stride_n = static_cast<std::uint32_t>(N_) * D;
    p.q_nope_stride_h = D;
    p.q_pe_stride_n = p.q_nope_stride_n;
    p.q_pe_stride_h = p.q_nope_stride_h;
    // The cache as [slots, 1, L + R]: a page per slot; ckv = its first L columns, kpe the rest (refresh()).
    p.ckv_stride_page = D;
    p.ckv_stride_n = D;
    p.kpe_stride_page = D;
    p.kpe_stride_n = D;
    p.o_stride_n = static_cast<std::uint32_t>(N_) * L;
    p.o_stride_h = L;
    p.sm_scale = static_cast<float>(a.scale);
    // vLLM's scale_kwargs: {"ckv_scale": k_scale, "kpe_scale": 1.0} for fp8; none for bf16.
    p.ckv_scale = std::is_same_v<DTypeKV, __nv_fp8_e4m3> ? cache.k_scale : 1.f;
    p.kpe_scale = kpe_scaled ? p.ckv_scale : 1.f;
    p.ckv_scale_arr = nullptr;
    p.return_lse_base_on_e = true;  // vLLM drops the lse; mlagate checks it in natural log
  }

  // vLLM's step: lengths from positions, a packed CSR of the rows (negatives
  // clamped to 0), one query per row, planned on the host into the same
  // workspaces. A later plan must lay the work out as the first did (a
  // captured kernel keeps its grid and offsets): NotSupportedError otherwise.
  void refresh(const SparseDecodeArgs& a) override {
    if (a.q.shape[0] != T_ || a.q.shape[1] != N_ || a.indices.shape[1] != K_)
      throw std::invalid_argument("flashinfer.mla.sparse: a call of other shapes than the prepared one");
    const std::vector<std::int32_t> positions = token_positions(a.seq_lens, a.query_start_loc);
    if (static_cast<int>(positions.size()) != T_) throw std::invalid_argument("sparse_decode: query_start_loc does not end at T");
    std::vector<std::int32_t> lens = vllm_sm90_kv_lens(positions, K_);
    PackedRows packed =
        vllm_sm90_pack(std::span(a.indices.as<std::int32_t>(), static_cast<std::size_t>(T_) * K_), T_, K_, lens);
    std::vector<std::int32_t> qo_indptr(static_cast<std::size_t>(T_) + 1);
    for (int t = 0; t <= T_; ++t) qo_indptr[static_cast<std::size_t>(t)] = t;
    q_.upload(a.q.data, a.q.nbytes(), s_);
    if (!packed.indices.empty()) kv_indices_.upload(packed.indices.data(), packed.indices.size() * sizeof(std::int32_t), s_);
    const flashinfer::MLAPlanInfo plan = fi::plan_mla(float_ws_, int_ws_, qo_indptr.data(), packed.indptr.data(),
                                                      lens.data(), T_, N_, kHeadDimCkv, /*causal=*/false, s_);
    if (!planned_) {
      plan_ = plan;
      fi::point_params_at_plan(params_, plan_, float_ws_, int_ws_);
      planned_ = true;
    }
    if (!fi::same_layout(plan, plan_))
      throw NotSupportedError("flashinfer.mla.sparse graph: MLAPlan laid this batch out differently from the captured "
                              "one (another grid or other workspace offsets): the graph cannot replay it");
    DTypeKV* entries = nullptr;
    if (own_cache_.data()) {
      if (a.cache->data.nbytes() > own_cache_.size())
        throw std::invalid_argument("flashinfer.mla.sparse: a cache larger than the prepared one");
      upload_pool(own_cache_, *a.cache, s_);
      entries = own_cache_.as<DTypeKV>();
    } else {
      cache_ = gpu::DeviceCacheStore::instance().get(*a.cache, s_);
      entries = const_cast<DTypeKV*>(cache_->layer_as<DTypeKV>());
    }
    params_.ckv = entries;
    params_.kpe = entries + kHeadDimCkv;
  }

  void launch() override {
    const auto x = static_cast<std::uint32_t>(plan_.num_blks_x), y = static_cast<std::uint32_t>(plan_.num_blks_y);
    cudaError_t e = cudaErrorNotSupported;
    try {
      e = flashinfer::mla::BatchMLAPageAttentionHopper<flashinfer::MaskMode::kNone, kHeadDimCkv, KPE>(params_, x, y, s_);
    } catch (const flashinfer::Error& err) {
      throw std::runtime_error(std::string("BatchMLAPageAttentionHopper: ") + err.what());
    }
    if (e != cudaSuccess) throw std::runtime_error(std::string("BatchMLAPageAttentionHopper: ") + cudaGetErrorString(e));
  }

 private:
  int T_ = 0, N_ = 0, K_ = 0;
  bool planned_ = false;
  std::shared_ptr<const gpu::DeviceCache> cache_;
  DeviceBuffer q_, kv_indices_, float_ws_, int_ws_, own_cache_;
  flashinfer::MLAPlanInfo plan_{};
  Params params_{};
};

template <int KPE>
std::unique_ptr<SparseCallBase> make_call_kpe(const SparseDecodeArgs& a, bool kpe_scaled, cudaStream_t s, bool own) {
  switch (a.cache->kv_dtype) {
    case KvCacheDtype::kAuto: return std::make_unique<SparseCall<KPE, __nv_bfloat16>>(a, false, s, own);
    case KvCacheDtype::kFp8:
    case KvCacheDtype::kFp8E4m3: return std::make_unique<SparseCall<KPE, __nv_fp8_e4m3>>(a, kpe_scaled, s, own);
    default:
      throw NotSupportedError("kv cache dtype " + std::string(kv_cache_dtype_name(a.cache->kv_dtype)) +
                              " is not read by FlashInfer's MLA kernel");
  }
}

std::unique_ptr<SparseCallBase> make_call(const SparseDecodeArgs& a, bool kpe_scaled, cudaStream_t s, bool own) {
  if (a.cache->kv_lora_rank != kHeadDimCkv) throw NotSupportedError("kv_lora_rank 512 only");
  if (a.cache->rope_dim == 64) return make_call_kpe<64>(a, kpe_scaled, s, own);
  if (a.cache->rope_dim == 0) return make_call_kpe<0>(a, kpe_scaled, s, own);
  throw NotSupportedError("qk_rope_head_dim in (0, 64) only");
}

struct Graph {
  std::unique_ptr<SparseCallBase> call;
  gpu::CapturedGraph graph;  // last: destroyed before the call's buffers
};

class FlashInferMlaSparse final : public Backend {
 public:
  // kpe_scaled: kpe_scale = k_scale instead of vLLM's 1.0 (tests only: it
  // shows that the fp8 failures are the rope part read without the scale).
  explicit FlashInferMlaSparse(bool kpe_scaled = false) : kpe_scaled_(kpe_scaled) {}
  std::string_view name() const override { return kpe_scaled_ ? "flashinfer.mla.sparse+kpe_scaled" : "flashinfer.mla.sparse"; }
  std::string_view description() const override {
    return "FlashInfer's Hopper (FA3) MLA kernel as vLLM's FLASHINFER_MLA_SPARSE_SM90 calls it: page size 1 over the "
           "top-k slots, lengths planned from positions, -1 clamped to slot 0; bf16 and fp8 caches, kpe 64 or 0 (NoPE)";
  }
  Capabilities capabilities() const override {
    Capabilities c;
    c.ops = {Op::kSparseDecode};
    c.block_sizes = {64, 128, 256};  // get_supported_kernel_block_sizes: [MultipleOf(64)]
    c.query_len_support = QueryLenSupport::kVarlen;  // every token is its own row
    c.dtypes = {DType::kBF16};
    c.kv_dtypes = {KvCacheDtype::kAuto, KvCacheDtype::kFp8, KvCacheDtype::kFp8E4m3};
    c.max_pool_bytes = std::numeric_limits<std::int64_t>::max();  // a page (slot) index times a 64-bit page stride
    c.sparse_valid_prefix = true;  // the planned length's first slots of each row are read
    // vLLM's supports_combination has no DCP check, but forward_mqa converts
    // with the non-DCP function and plans lengths from global positions,
    // which a rank's shard does not hold.
    c.no_dcp = "FLASHINFER_MLA_SPARSE_SM90 plans each row's length from the token's global position "
               "(_kv_lens_host) and converts with the non-DCP index function: a DCP shard holds fewer keys";
    return c;
  }
  Support supports(const CaseSpec& spec, Op op) const override {
    Support s = check_capabilities(capabilities(), spec, op);
    if (!s.ok || op != Op::kSparseDecode) return s;
    const CudaDeviceInfo& dev = cuda_device_info();
    if (dev.available && dev.sm_major != 9)
      return Support::no("the backend declares compute capability 9.x only; the device is sm_" +
                         std::to_string(dev.sm_major) + std::to_string(dev.sm_minor));
    // vLLM's supports_combination, in its order (the FlashInfer version check is this build's).
    if (spec.sparse.v4()) return Support::no("FLASHINFER_MLA_SPARSE_SM90 requires sparse MLA with index_topk (V3.2 rows)");
    if (spec.dims.kv_lora_rank != kHeadDimCkv) return Support::no("FLASHINFER_MLA_SPARSE_SM90 requires kv_lora_rank=512");
    if (spec.dims.rope_dim != 0 && spec.dims.rope_dim != 64)
      return Support::no("FLASHINFER_MLA_SPARSE_SM90 requires qk_rope_head_dim in (0, 64)");
    if (has_topk_length(spec.sparse.pattern))
      return Support::no("no topk_length: vLLM plans each row's length from its position");
    if (spec.sparse.sink) return Support::no("no attention sink in FlashInfer's MLA kernel");
    return s;
  }
  void sparse_decode(const SparseDecodeArgs& a) override {
    check_call(a);
    if (a.q.shape[0] == 0) return;
    const std::unique_ptr<SparseCallBase> call = make_call(a, kpe_scaled_, stream(), false);
    call->refresh(a);
    call->launch();
    call->finish(a);
  }
  // --cuda-graph: the kernel captured once over the call's persistent buffers
  // (the cache in one of its own); each replay uploads the new batch and
  // plans it on the host into the same workspaces, outside the graph, as
  // vLLM's builder plans its wrapper every step, then launches the graph.
  std::unique_ptr<SparseDecodeGraph> capture_sparse_decode(const SparseDecodeArgs& a) override {
    check_call(a);
    if (a.q.shape[0] == 0) throw NotSupportedError("an empty batch is not captured");
    auto g = std::make_shared<Graph>();
    return persistent_sparse_decode_graph(
        a,
        [this, g](const SparseDecodeArgs& p, bool capture) {
          const cudaStream_t s = stream();
          if (capture) {
            g->call = make_call(p, kpe_scaled_, s, true);
            g->call->refresh(p);
            g->call->launch();  // the warm-up, whose outputs the capture's record reads
            MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));
            g->graph = gpu::CapturedGraph(s, [&] { g->call->launch(); });
          } else {
            g->call->refresh(p);
            g->graph.launch(s);
          }
          g->call->finish(p);
        },
        "CUDA graph (planned on the host before each replay)");
  }
  // `mlagate bench`: the call uploaded and planned on the host (outside, as
  // vLLM's builder plans before the forward), then the kernel timed as a graph.
  std::unique_ptr<DecodeBench> prepare_sparse_decode_bench(const SparseDecodeArgs& a) override {
    check_call(a);
    if (a.q.shape[0] == 0) throw NotSupportedError("an empty batch is not timed");
    std::shared_ptr<SparseCallBase> call = make_call(a, kpe_scaled_, stream(), false);
    call->refresh(a);
    return libs::graph_bench(call, stream(), [c = call.get()] { c->launch(); }, "the MLA kernel (planned outside)");
  }

 private:
  void check_call(const SparseDecodeArgs& a) {
    gpu::require_device();
    check_sparse_decode_args(a);
    if (a.window > 0 || a.extra_cache) throw NotSupportedError("V3.2 top-k rows only");
    if (!a.topk_length.empty()) throw NotSupportedError("no topk_length (lengths are planned from positions)");
    if (!a.sink.empty()) throw NotSupportedError("no attention sink");
    if (a.q.dtype != DType::kBF16) throw NotSupportedError("bf16 queries only");
  }
  cudaStream_t stream() {
    if (!stream_) stream_ = std::make_unique<gpu::Stream>();
    return stream_->get();
  }
  std::unique_ptr<gpu::Stream> stream_;
  bool kpe_scaled_ = false;
};

}  // namespace

std::unique_ptr<Backend> make_flashinfer_mla_sparse() { return std::make_unique<FlashInferMlaSparse>(); }
std::unique_ptr<Backend> detail::make_flashinfer_mla_sparse_kpe_scaled() { return std::make_unique<FlashInferMlaSparse>(true); }

}  // namespace mlagate
