// "flashmla": the adapter from mlagate's decode call to FlashMLA's dense decode
// (csrc/params.h's DenseAttnDecodeParams, GetDecodeSchedMetaParams and
// CombineParams, filled as FlashMLA's own dense_decode.h fills them from its
// tensors). The cache is passed as is; the only copies are of the inputs the
// library takes in another form: q_lat and q_pe packed into one [T, N, L + R]
// query (FlashMLA reads q as one tensor) and the requests' block-table rows
// gathered into a plain [B, width] table.
#include <limits>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/cache_store.h"
#include "backends/cuda/cuda_backends.h"
#include "backends/flashmla/flashmla_backend.h"
#include "backends/kernel_libs/adapter_common.h"
#include "cases/errors.h"

// FlashMLA's own headers (from MLAGATE_FLASHMLA_SOURCE_DIR/csrc).
#include <cutlass/half.h>

#include "params.h"
#include "sm90/decode/dense/splitkv_mla.h"
#include "smxx/decode/combine/combine.h"
#include "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.h"

namespace mlagate {
namespace {

// q_lat [T, N, L] and q_pe [T, N, R] -> one [T, N, L + R] row per (token,
// head), as vLLM's FlashMLA backend cats them (torch.cat(q, dim=-1)) before
// the call: from their strides (the slices of layout strided) or packed.
std::vector<std::uint16_t> packed_query(const DecodeArgs& a) {
  const std::int64_t rows = a.q_lat.shape[0] * a.q_lat.shape[1], L = a.q_lat.shape[2], R = a.q_pe.shape[2], D = L + R;
  std::vector<std::uint16_t> q(static_cast<std::size_t>(rows * D));
  const auto* ql = static_cast<const std::uint16_t*>(a.q_lat.data);
  const auto* qp = static_cast<const std::uint16_t*>(a.q_pe.data);
  for (std::int64_t row = 0; row < rows; ++row) {
    const std::uint16_t* l = ql + a.q_lat.offset_of(row * L);
    const std::uint16_t* r = qp + a.q_pe.offset_of(row * R);
    std::copy(l, l + L, q.begin() + row * D);
    std::copy(r, r + R, q.begin() + row * D + L);
  }
  return q;
}

using gpu::DeviceBuffer;
using gpu::upload_array;

// The library's stated limits (FlashMLA csrc/api/dense_decode.h).
constexpr int kPageBlockSize = 64;     // "Currently page_block_size must be 64"
constexpr int kHeadDimV = 512;         // "Only head_size_v == 512"
constexpr int kBlockM = 64;            // q rows per tile: num_sm_parts divides the SMs by the tiles
constexpr int kFixedOverheadBlocks = 5;  // what dense_decode.h passes to the scheduler
constexpr int kMaxSmParts = 160;       // the combine kernel's largest MAX_SPLITS (FLASH_ASSERT beyond)

constexpr double kLog2e = 1.4426950408889634;

// The sm90 dense kernel's one head size: FLASH_ASSERT(params.d == Config::HEAD_DIM_K), 576
// (csrc/sm90/decode/dense/config.h); NoPE MLA's 512 would abort the process.
bool head_dim_ok(int d) { return d == 576; }

int ceil_div(int a, int b) { return (a + b - 1) / b; }

int num_sm_parts_for(int s_q, int heads) {
  return std::max(cuda_device_info().multiprocessors / ceil_div(s_q * heads, kBlockM), 1);
}

class FlashMlaCall final : public libs::PreparedDecode {
 public:
  FlashMlaCall(const DecodeArgs& a, const libs::DeviceOutputs& out, cudaStream_t s) {
    const PagedCache& cache = *a.cache;
    const int B = static_cast<int>(a.seq_lens.size());
    const int T = static_cast<int>(a.q_lat.shape[0]), N = static_cast<int>(a.q_lat.shape[1]);
    const int L = static_cast<int>(a.q_lat.shape[2]), R = static_cast<int>(a.q_pe.shape[2]), D = L + R;
    const int s_q = T / B;
    for (int i = 0; i < B; ++i)
      if (a.query_start_loc[i + 1] - a.query_start_loc[i] != s_q)
        throw NotSupportedError("FlashMLA takes one query length for the whole batch (q of shape [b, s_q, h, d])");
    if (cache.kv_dtype != KvCacheDtype::kAuto || cache.block_size != kPageBlockSize || L != kHeadDimV || !head_dim_ok(D))
      throw NotSupportedError("FlashMLA dense decode: kv=auto, block size 64, d_v 512, d 576");
    bf16_ = a.q_lat.dtype == DType::kBF16;

    cache_ = gpu::DeviceCacheStore::instance().get(cache, s);
    const std::vector<std::uint16_t> q = packed_query(a);
    q_ = upload_array(q.data(), q.size(), s);
    const std::vector<std::int32_t> table = libs::gather_table_rows(a);
    table_ = upload_array(table.data(), table.size(), s);
    seqlens_ = upload_array(a.seq_lens.data(), a.seq_lens.size(), s);

    const int parts = num_sm_parts_for(s_q, N);
    if (parts > kMaxSmParts) throw NotSupportedError("FlashMLA's combine takes at most 160 SM parts");
    sched_ = DeviceBuffer(static_cast<std::size_t>(parts) * sizeof(DecodingSchedMeta));
    splits_ = DeviceBuffer(static_cast<std::size_t>(B + 1) * sizeof(int));
    const int total_splits = B + parts;
    const std::size_t rows = static_cast<std::size_t>(s_q) * N;  // q_seq_per_hk (one kv head)
    lse_acc_ = DeviceBuffer(total_splits * rows * sizeof(float));
    o_acc_ = DeviceBuffer(total_splits * rows * kHeadDimV * sizeof(float));
    // Partials start as NaN: one the kernel never writes shows in the result.
    lse_acc_.fill(0xFF, s);
    o_acc_.fill(0xFF, s);

    // The scheduler metadata, as vLLM computes it once per batch (get_mla_metadata).
    GetDecodeSchedMetaParams sp{};
    sp.b = B;
    sp.s_q = s_q;
    sp.block_size_n = kPageBlockSize;
    sp.fixed_overhead_num_blocks = kFixedOverheadBlocks;
    sp.topk = -1;  // dense
    sp.extra_topk = -1;
    sp.topk_length = nullptr;
    sp.extra_topk_length = nullptr;
    sp.seqlens_k_ptr = seqlens_.as<int>();
    sp.tile_scheduler_metadata_ptr = sched_.as<DecodingSchedMeta>();
    sp.num_splits_ptr = splits_.as<int>();
    sp.num_sm_parts = parts;
    sp.stream = s;
    smxx::decode::run_get_decoding_sched_meta_kernel(sp);
    sched_params_ = sp;
    B_ = B;
    T_ = T;
    N_ = N;
    L_ = L;
    R_ = R;

    DenseAttnDecodeParams& p = params_;
    p = DenseAttnDecodeParams{};
    p.b = B;
    p.s_q = s_q;
    p.q_seq_per_hk = static_cast<int>(rows);
    p.d = D;
    p.d_v = kHeadDimV;
    p.h_q = N;
    p.h_k = 1;
    p.num_blocks = cache.num_blocks;
    p.q_head_per_hk = N;
    p.is_causal = s_q > 1;  // bottom-right: token u of s_q sees keys 0 .. s_k - s_q + u (DecodeArgs' rule)
    p.scale_softmax = static_cast<float>(a.scale);
    p.scale_softmax_log2 = static_cast<float>(a.scale * kLog2e);
    p.q_ptr = q_.data();
    p.k_ptr = cache_->layer();  // one layer of a stacked cache under layout strided
    p.o_ptr = out.o;
    p.softmax_lse_ptr = out.lse;
    // Strides in elements of q [b, q_seq_per_hk, 1, d], k [blocks, 64, 1, d], o [b, 1, q_seq_per_hk, d_v].
    p.q_batch_stride = static_cast<std::int64_t>(rows) * D;
    p.q_row_stride = D;
    p.q_head_stride = D;
    p.k_batch_stride = static_cast<std::int64_t>(kPageBlockSize) * D;
    p.k_row_stride = D;
    p.k_head_stride = D;
    p.o_batch_stride = static_cast<std::int64_t>(rows) * kHeadDimV;
    p.o_row_stride = kHeadDimV;
    p.o_head_stride = static_cast<std::int64_t>(rows) * kHeadDimV;
    p.block_table = table_.as<int>();
    p.block_table_batch_stride = cache.table_width;
    p.page_block_size = kPageBlockSize;
    p.seqlens_k_ptr = seqlens_.as<int>();
    p.tile_scheduler_metadata_ptr = sched_.as<DecodingSchedMeta>();
    p.num_sm_parts = parts;
    p.num_splits_ptr = splits_.as<int>();
    p.total_num_splits = total_splits;
    p.softmax_lseaccum_ptr = lse_acc_.as<float>();
    p.oaccum_ptr = o_acc_.as<float>();

    CombineParams& c = combine_;
    c = CombineParams{};
    c.b = B;
    c.s_q = s_q;
    c.h_q = N;
    c.d_v = kHeadDimV;
    c.lse = out.lse;
    c.out = out.o;
    c.stride_lse_b = static_cast<int>(rows);
    c.stride_lse_s_q = N;
    c.stride_o_b = static_cast<int>(rows) * kHeadDimV;
    c.stride_o_s_q = N * kHeadDimV;
    c.stride_o_h_q = kHeadDimV;
    c.lse_accum = lse_acc_.as<float>();
    c.o_accum = o_acc_.as<float>();
    c.stride_lse_accum_split = static_cast<int>(rows);
    c.stride_lse_accum_s_q = N;
    c.stride_o_accum_split = static_cast<int>(rows) * kHeadDimV;
    c.stride_o_accum_s_q = N * kHeadDimV;
    c.stride_o_accum_h_q = kHeadDimV;
    c.tile_scheduler_metadata_ptr = sched_.as<DecodingSchedMeta>();
    c.num_splits_ptr = splits_.as<int>();
    c.num_sm_parts = parts;
    c.attn_sink = nullptr;
  }

  // --cuda-graph: the first refresh moves the cache into a buffer of this
  // call's own (the captured address; capacity: this cache's blocks); each
  // refresh copies q, the block table (rows padded to the captured width),
  // seq_lens and the cache there and recomputes the scheduler metadata into
  // the same buffers, as vLLM's FlashMLA metadata builder does before a replay.
  bool refresh(const DecodeArgs& a, cudaStream_t s) override {
    const PagedCache& cache = *a.cache;
    if (static_cast<int>(a.seq_lens.size()) != B_ || a.q_lat.shape[0] != T_ || a.q_lat.shape[1] != N_ ||
        a.q_lat.shape[2] != L_ || a.q_pe.shape[2] != R_ || (a.q_lat.dtype == DType::kBF16) != bf16_ ||
        cache.kv_dtype != KvCacheDtype::kAuto || cache.block_size != kPageBlockSize)
      throw std::invalid_argument("flashmla graph: a batch of other shapes than captured");
    if (!own_cache_.data()) {
      own_cache_ = DeviceBuffer(cache.data.nbytes());
      capacity_blocks_ = cache.num_blocks;
      width_ = cache.table_width;
      params_.k_ptr = own_cache_.data();
      params_.num_blocks = capacity_blocks_;
      params_.block_table_batch_stride = width_;
      cache_.reset();  // the shared device copy is not read any more
    }
    if (cache.num_blocks > capacity_blocks_ || cache.table_width > width_)
      throw std::invalid_argument("flashmla graph: the cache is larger than the captured one");
    const std::vector<std::uint16_t> q = packed_query(a);
    q_.upload(q.data(), q.size() * sizeof(std::uint16_t), s);
    const std::vector<std::int32_t> table = libs::gather_table_rows(a, width_);
    table_.upload(table.data(), table.size() * sizeof(std::int32_t), s);
    params_.block_table = table_.as<int>();
    seqlens_.upload(a.seq_lens.data(), a.seq_lens.size() * sizeof(std::int32_t), s);
    upload_pool(own_cache_, cache, s);
    sched_params_.stream = s;
    smxx::decode::run_get_decoding_sched_meta_kernel(sched_params_);
    return true;
  }

  void launch(cudaStream_t s) override {
    params_.stream = s;
    combine_.stream = s;
    if (bf16_) {
      sm90::run_flash_splitkv_mla_kernel<cutlass::bfloat16_t>(params_);
      smxx::decode::run_flash_mla_combine_kernel<cutlass::bfloat16_t>(combine_);
    } else {
      sm90::run_flash_splitkv_mla_kernel<cutlass::half_t>(params_);
      smxx::decode::run_flash_mla_combine_kernel<cutlass::half_t>(combine_);
    }
    MLAGATE_CUDA_CHECK_LAUNCH();
  }

 private:
  bool bf16_ = true;
  std::shared_ptr<const gpu::DeviceCache> cache_;
  DeviceBuffer q_, table_, seqlens_, sched_, splits_, lse_acc_, o_acc_;
  DeviceBuffer own_cache_;  // --cuda-graph: the captured cache address
  int capacity_blocks_ = 0, width_ = 0;
  int B_ = 0, T_ = 0, N_ = 0, L_ = 0, R_ = 0;
  GetDecodeSchedMetaParams sched_params_{};
  DenseAttnDecodeParams params_{};
  CombineParams combine_{};
};

class FlashMlaBackend final : public Backend {
 public:
  std::string_view name() const override { return "flashmla"; }
  std::string_view description() const override {
    return "FlashMLA sm90a dense decode (scheduler metadata, split-KV kernel, combine), built from "
           "MLAGATE_FLASHMLA_SOURCE_DIR; mlagate's paged cache as is";
  }
  Capabilities capabilities() const override {
    Capabilities c;
    c.ops = {Op::kDecode};
    c.block_sizes = {kPageBlockSize};
    c.query_len_support = QueryLenSupport::kUniform;
    c.reorder_threshold = 1;
    c.dtypes = {DType::kBF16, DType::kF16};
    c.kv_dtypes = {KvCacheDtype::kAuto};
    c.max_pool_bytes = std::numeric_limits<std::int64_t>::max();  // tried past 4 GiB by the layout suite (cases/LAYOUTS.md)
    c.strided_views = true;  // q gathered from the views (packed_query), o and lse copied into them
    return c;
  }
  Support supports(const CaseSpec& spec, Op op) const override {
    Support s = check_capabilities(capabilities(), spec, op);
    if (!s.ok) return s;
    if (op != Op::kDecode && op != Op::kLayer) return s;
    const int L = spec.dims.kv_lora_rank, D = spec.dims.head_size();
    if (L != kHeadDimV) return Support::no("head_size_v (L) " + std::to_string(L) + " is not 512");
    if (!head_dim_ok(D)) return Support::no("head_size_k (L + R) " + std::to_string(D) + " is not 576 (the sm90 dense kernel's HEAD_DIM_K)");
    const CudaDeviceInfo& dev = cuda_device_info();
    if (dev.available && !(dev.sm_major == 9 && dev.sm_minor == 0))
      return Support::no("dense decode needs sm90a; the device is sm_" + std::to_string(dev.sm_major) +
                         std::to_string(dev.sm_minor));
    if (dev.available) {
      // The scheduler kernel keeps 5 B + 1 ints in shared memory (exit(1) in the library when it does not fit).
      const long long need = 4LL * (5LL * spec.num_requests() + 1);
      if (need > gpu::max_dynamic_smem())
        return Support::no("batch of " + std::to_string(spec.num_requests()) + " requests: the scheduler needs " +
                           std::to_string(need) + " bytes of shared memory");
    }
    return s;
  }
  // FlashMLA allocates its o and lse; vLLM copies o into the layer's output:
  // both written packed and copied into the views (OutputWrites).
  void decode(const DecodeArgs& a) override {
    using W = gpu::GuardedDeviceOutput::Writes;
    libs::run_decode(a, stream(), prepare, {.o = W::kPacked, .lse = W::kPacked});
  }
  std::unique_ptr<DecodeBench> prepare_decode_bench(const DecodeArgs& a) override {
    return libs::make_decode_bench(a, stream(), prepare, "");
  }
  std::unique_ptr<DecodeGraph> capture_decode(const DecodeArgs& a) override {
    return libs::make_decode_graph(a, stream(), prepare, "FlashMLA in a CUDA graph (scheduler metadata refreshed in place)");
  }

 private:
  static std::unique_ptr<libs::PreparedDecode> prepare(const DecodeArgs& a, const libs::DeviceOutputs& o,
                                                       cudaStream_t s) {
    return std::make_unique<FlashMlaCall>(a, o, s);
  }
  cudaStream_t stream() {
    if (!stream_) stream_ = std::make_unique<gpu::Stream>();
    return stream_->get();
  }
  std::unique_ptr<gpu::Stream> stream_;
};

}  // namespace

std::unique_ptr<Backend> make_flashmla() { return std::make_unique<FlashMlaBackend>(); }

}  // namespace mlagate
