// "flashinfer.mla": the adapter from mlagate's decode call to FlashInfer's FA2
// MLA kernel, with MLAParams filled as FlashInfer's own batch_mla_run.cu fills
// them from its tensors. Nothing is copied: q_nope and q_pe are mlagate's
// q_lat and q_pe, ckv/kpe point into the cache's entries, kv_indices is the
// cache's block table. Planning (MLAPlan: host scheduling, an upload of the
// work lists) is outside the timed launch, as FlashInfer's plan()/run() split
// intends.
#include <limits>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cache_store.h"
#include "backends/cuda/cuda_backends.h"
#include "backends/flashinfer/flashinfer_backend.h"
#include "backends/flashinfer/mla_plan.h"
#include "backends/kernel_libs/adapter_common.h"
#include "cases/errors.h"

// FlashInfer's headers (from MLAGATE_FLASHINFER_INCLUDE_DIR).
#include <flashinfer/attention/mla.cuh>
#include <flashinfer/attention/scheduler.cuh>
#if MLAGATE_FLASHINFER_FA3
#include <flashinfer/attention/mla_hopper.cuh>  // the FA3 kernel: same plan and params, CUTLASS headers
#endif

namespace mlagate {
namespace {

using gpu::DeviceBuffer;

constexpr int kHeadDimCkv = 512;  // the instantiation mlagate builds (DeepSeek's L, R)
constexpr int kHeadDimKpe = 64;
// Page sizes offered to the harness: the kernel divides by any page size
// (uint_fastdiv), these are the ones worth sweeping; the first is bs=auto.
const std::vector<int> kPageSizes = {64, 1, 2, 4, 8, 16, 32, 128, 256};
// Which of FlashInfer's two MLA kernels runs the plan.
enum class Kernel { kFa2, kFa3 };

template <class DTypeQ, class DTypeKV, Kernel K>
class FlashInferCall final : public libs::PreparedDecode {
  using Params = flashinfer::MLAParams<DTypeQ, DTypeKV, DTypeQ, std::int32_t>;

 public:
  FlashInferCall(const DecodeArgs& a, const libs::DeviceOutputs& out, cudaStream_t s) {
    const PagedCache& cache = *a.cache;
    const int B = static_cast<int>(a.seq_lens.size());
    const int N = static_cast<int>(a.q_lat.shape[1]);
    const int L = static_cast<int>(a.q_lat.shape[2]), R = static_cast<int>(a.q_pe.shape[2]);
    if (L != kHeadDimCkv || R != kHeadDimKpe)
      throw NotSupportedError("built for head_dim_ckv 512, head_dim_kpe 64");
    cache_ = gpu::DeviceCacheStore::instance().get(cache, s);
    // As vLLM hands them: q_nope and q_pe as they are (slices of one fused q
    // under layout strided), their token and head strides in the params below.
    q_nope_ = gpu::upload_view(a.q_lat, s);
    q_pe_ = gpu::upload_view(a.q_pe, s);

    // The plan, from host copies of the batch: qo_indptr = query_start_loc,
    // kv_indptr = each request's first entry of the block table, kv_len = seq_lens.
    std::vector<std::int32_t> qo_indptr(a.query_start_loc.begin(), a.query_start_loc.end());
    std::vector<std::int32_t> kv_indptr(B + 1), kv_len(a.seq_lens.begin(), a.seq_lens.end());
    for (int i = 0; i < B; ++i) kv_indptr[i] = a.block_table_rows[i] * cache.table_width;
    kv_indptr[B] = static_cast<std::int32_t>(cache.block_table.dim(0) * cache.table_width);

    float_ws_ = DeviceBuffer(fi::float_workspace_bytes(cuda_device_info().multiprocessors, kHeadDimCkv));
    float_ws_.fill(0xFF, s);  // partial outputs start as NaN: one never written shows
    int_ws_ = DeviceBuffer(fi::kIntWorkspaceBytes);
    plan_ = fi::plan_mla(float_ws_, int_ws_, qo_indptr.data(), kv_indptr.data(), kv_len.data(), B, N, kHeadDimCkv,
                         /*causal=*/true, s);

    Params& p = params_;
    p = Params{};
    p.q_nope = q_nope_.as<DTypeQ>();
    p.q_pe = q_pe_.as<DTypeQ>();
    // Entry = [kv_c (L) | k_pe (R)] in the cache's element type, one kv head.
    DTypeKV* entries = cache_->layer_as<DTypeKV>();  // one layer of a stacked cache under layout strided
    p.ckv = entries;
    p.kpe = entries + L;
    p.final_o = static_cast<DTypeQ*>(out.o);
    p.final_lse = out.lse;
    fi::point_params_at_plan(p, plan_, float_ws_, int_ws_);
    p.kv_indices = cache_->block_table.as<std::int32_t>();
    p.block_size = flashinfer::uint_fastdiv(static_cast<std::uint32_t>(cache.block_size));
    p.num_heads = flashinfer::uint_fastdiv(static_cast<std::uint32_t>(N));
    // Strides in elements: q [T, N, L] / [T, N, R] and o [T, N, L] the views'
    // (packed, or layout strided's), entries [blocks, bs, L + R]. lse is
    // written packed (final_lse has no stride): OutputWrites in decode().
    p.q_nope_stride_n = static_cast<std::uint32_t>(a.q_lat.stride(0));
    p.q_nope_stride_h = static_cast<std::uint32_t>(a.q_lat.stride(1));
    p.q_pe_stride_n = static_cast<std::uint32_t>(a.q_pe.stride(0));
    p.q_pe_stride_h = static_cast<std::uint32_t>(a.q_pe.stride(1));
    p.ckv_stride_page = cache.block_size * (L + R);
    p.ckv_stride_n = L + R;
    p.kpe_stride_page = cache.block_size * (L + R);
    p.kpe_stride_n = L + R;
    p.o_stride_n = static_cast<std::uint32_t>(a.o_lat.stride(0));
    p.o_stride_h = static_cast<std::uint32_t>(a.o_lat.stride(1));
    p.sm_scale = static_cast<float>(a.scale);
    // fp8: x = e4m3 * k_scale for both fields (mlagate's per-tensor scale).
    p.ckv_scale = std::is_same_v<DTypeKV, __nv_fp8_e4m3> ? a.k_scale : 1.f;
    p.kpe_scale = p.ckv_scale;
    p.ckv_scale_arr = nullptr;
    p.return_lse_base_on_e = true;  // the library's default is log2
    B_ = B;
    N_ = N;
    T_ = a.q_lat.shape[0];
  }

  // --cuda-graph: the first refresh moves the cache and the block table into
  // buffers of this call's own (the captured addresses; the table one row per
  // request at the captured width); each refresh copies the queries, the cache
  // and the rows there and plans the new batch into the same workspaces with
  // MLAPlan, as vLLM re-plans its FlashInfer MLA wrapper before a replay. The
  // captured kernels keep the capture's grid and offsets: a plan that differs
  // in them is refused (NotSupportedError).
  bool refresh(const DecodeArgs& a, cudaStream_t s) override {
    const PagedCache& cache = *a.cache;
    if (static_cast<int>(a.seq_lens.size()) != B_ || a.q_lat.shape[0] != T_ || a.q_lat.shape[1] != N_)
      throw std::invalid_argument("flashinfer graph: a batch of other shapes than captured");
    if (!own_cache_.data()) {
      own_cache_ = DeviceBuffer(cache.data.nbytes());
      width_ = cache.table_width;
      own_table_ = DeviceBuffer(static_cast<std::size_t>(B_) * width_ * sizeof(std::int32_t));
      DTypeKV* entries = own_cache_.as<DTypeKV>();
      params_.ckv = entries;
      params_.kpe = entries + kHeadDimCkv;
      params_.kv_indices = own_table_.as<std::int32_t>();
      cache_.reset();
    }
    if (cache.data.nbytes() > own_cache_.size() || cache.table_width > width_)
      throw std::invalid_argument("flashinfer graph: the cache is larger than the captured one");
    q_nope_.upload(a.q_lat.data, a.q_lat.nbytes(), s);
    q_pe_.upload(a.q_pe.data, a.q_pe.nbytes(), s);
    upload_pool(own_cache_, cache, s);
    const std::vector<std::int32_t> table = libs::gather_table_rows(a, width_);
    own_table_.upload(table.data(), table.size() * sizeof(std::int32_t), s);
    // The plan over the own table: request b's pages start at row b.
    std::vector<std::int32_t> qo_indptr(a.query_start_loc.begin(), a.query_start_loc.end());
    std::vector<std::int32_t> kv_indptr(B_ + 1), kv_len(a.seq_lens.begin(), a.seq_lens.end());
    for (int i = 0; i <= B_; ++i) kv_indptr[i] = i * width_;
    const flashinfer::MLAPlanInfo plan = fi::plan_mla(float_ws_, int_ws_, qo_indptr.data(), kv_indptr.data(),
                                                      kv_len.data(), B_, N_, kHeadDimCkv, /*causal=*/true, s);
    if (!fi::same_layout(plan, plan_))
      throw NotSupportedError("flashinfer graph: MLAPlan laid this batch out differently from the captured one "
                              "(another grid or other workspace offsets): the graph cannot replay it");
    return true;
  }

  void launch(cudaStream_t s) override {
    constexpr auto kCausal = flashinfer::MaskMode::kCausal;
    const auto x = static_cast<std::uint32_t>(plan_.num_blks_x), y = static_cast<std::uint32_t>(plan_.num_blks_y);
    cudaError_t e = cudaErrorNotSupported;
    try {
      if constexpr (K == Kernel::kFa2) {
        e = flashinfer::mla::BatchMLAPagedAttention<kCausal, kHeadDimCkv, kHeadDimKpe>(params_, x, y, s);
      } else {
#if MLAGATE_FLASHINFER_FA3
        e = flashinfer::mla::BatchMLAPageAttentionHopper<kCausal, kHeadDimCkv, kHeadDimKpe>(params_, x, y, s);
#endif
      }
    } catch (const flashinfer::Error& x) {
      throw std::runtime_error(std::string("BatchMLAPagedAttention: ") + x.what());
    }
    if (e != cudaSuccess) throw std::runtime_error(std::string("BatchMLAPagedAttention: ") + cudaGetErrorString(e));
  }

 private:
  std::shared_ptr<const gpu::DeviceCache> cache_;
  DeviceBuffer q_nope_, q_pe_, float_ws_, int_ws_;
  flashinfer::MLAPlanInfo plan_{};
  Params params_{};
  // --cuda-graph (refresh): the captured cache and table, the batch's shapes.
  DeviceBuffer own_cache_, own_table_;
  int width_ = 0, B_ = 0, N_ = 0;
  std::int64_t T_ = 0;
};

template <Kernel K>
class FlashInferMlaBackend final : public Backend {
 public:
  std::string_view name() const override { return K == Kernel::kFa2 ? "flashinfer.mla.fa2" : "flashinfer.mla.fa3"; }
  std::string_view description() const override {
    return K == Kernel::kFa2 ? "FlashInfer FA2 MLA (MLAPlan + BatchMLAPagedAttention), header-only from "
                               "MLAGATE_FLASHINFER_INCLUDE_DIR; mlagate's paged cache and block table as is"
                             : "FlashInfer FA3 (Hopper) MLA (MLAPlan + BatchMLAPageAttentionHopper), header-only, "
                               "with CUTLASS headers; mlagate's paged cache and block table as is";
  }
  Capabilities capabilities() const override {
    Capabilities c;
    c.ops = {Op::kDecode};
    c.block_sizes = kPageSizes;
    c.query_len_support = QueryLenSupport::kVarlen;
    c.reorder_threshold = 1;
    c.dtypes = {DType::kBF16, DType::kF16};
    c.kv_dtypes = {KvCacheDtype::kAuto, KvCacheDtype::kFp8, KvCacheDtype::kFp8E4m3};
    c.max_pool_bytes = std::numeric_limits<std::int64_t>::max();  // tried past 4 GiB by the layout suite (cases/LAYOUTS.md)
    c.strided_views = true;  // q_nope, q_pe and o with their strides (MLAParams), lse packed
    return c;
  }
  Support supports(const CaseSpec& spec, Op op) const override {
    Support s = check_capabilities(capabilities(), spec, op);
    if (!s.ok) return s;
    if (op != Op::kDecode && op != Op::kLayer) return s;
    if (spec.dims.kv_lora_rank != kHeadDimCkv || spec.dims.rope_dim != kHeadDimKpe)
      return Support::no("built for head_dim_ckv 512, head_dim_kpe 64; the case has L = " +
                         std::to_string(spec.dims.kv_lora_rank) + ", R = " + std::to_string(spec.dims.rope_dim));
    const CudaDeviceInfo& dev = cuda_device_info();
    if (K == Kernel::kFa3 && dev.available && dev.sm_major != 9)
      return Support::no("the FA3 kernel needs an SM90 device; the device is sm_" + std::to_string(dev.sm_major) +
                         std::to_string(dev.sm_minor));
    if (spec.kv_cache_dtype != KvCacheDtype::kAuto) {
      // FlashInfer's plan(): "FP8 kv_data_type for MLA currently only supports q_data_type=torch.bfloat16"
      // and "requires an SM90 (Hopper) device".
      if (spec.dtype != DType::kBF16) return Support::no("fp8 kv cache needs bf16 queries");
      if (dev.available && dev.sm_major != 9)
        return Support::no("fp8 kv cache needs an SM90 device; the device is sm_" + std::to_string(dev.sm_major) +
                           std::to_string(dev.sm_minor));
    }
    return s;
  }
  void decode(const DecodeArgs& a) override {
    libs::run_decode(a, stream(), prepare, {.lse = gpu::GuardedDeviceOutput::Writes::kPacked});
  }
  std::unique_ptr<DecodeGraph> capture_decode(const DecodeArgs& a) override {
    return libs::make_decode_graph(a, stream(), prepare, "FlashInfer in a CUDA graph (re-planned in place)");
  }
  std::unique_ptr<DecodeBench> prepare_decode_bench(const DecodeArgs& a) override {
    return libs::make_decode_bench(a, stream(), prepare, "");
  }

 private:
  static std::unique_ptr<libs::PreparedDecode> prepare(const DecodeArgs& a, const libs::DeviceOutputs& o,
                                                       cudaStream_t s) {
    const bool bf16 = a.q_lat.dtype == DType::kBF16;
    switch (a.cache->kv_dtype) {
      case KvCacheDtype::kAuto:
        if (bf16) return std::make_unique<FlashInferCall<__nv_bfloat16, __nv_bfloat16, K>>(a, o, s);
        return std::make_unique<FlashInferCall<half, half, K>>(a, o, s);
      case KvCacheDtype::kFp8:
      case KvCacheDtype::kFp8E4m3:
        if (bf16) return std::make_unique<FlashInferCall<__nv_bfloat16, __nv_fp8_e4m3, K>>(a, o, s);
        throw NotSupportedError("fp8 kv cache needs bf16 queries");
      case KvCacheDtype::kFp8DsMla: break;
    }
    throw NotSupportedError("kv cache dtype " + std::string(kv_cache_dtype_name(a.cache->kv_dtype)) +
                            " is not read by FlashInfer's MLA kernel");
  }
  cudaStream_t stream() {
    if (!stream_) stream_ = std::make_unique<gpu::Stream>();
    return stream_->get();
  }
  std::unique_ptr<gpu::Stream> stream_;
};

}  // namespace

std::unique_ptr<Backend> make_flashinfer_mla_fa2() { return std::make_unique<FlashInferMlaBackend<Kernel::kFa2>>(); }
#if MLAGATE_FLASHINFER_FA3
std::unique_ptr<Backend> make_flashinfer_mla_fa3() { return std::make_unique<FlashInferMlaBackend<Kernel::kFa3>>(); }
#endif

}  // namespace mlagate
