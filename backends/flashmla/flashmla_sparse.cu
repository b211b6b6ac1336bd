// "flashmla.sparse": the adapter from mlagate's sparse ops to FlashMLA's sm90
// sparse kernels, through csrc/params.h's SparseAttnDecodeParams,
// GetDecodeSchedMetaParams, CombineParams and SparseAttnFwdParams, filled as
// FlashMLA's csrc/api/sparse_decode.h and sparse_fwd.h fill them from tensors
// (no libtorch). What the adapter does to the inputs is what vLLM does before
// calling the library:
// - heads padded with zero queries to the kernels' h_q (decode 64 or 128,
//   prefill a multiple of 64); the padded heads' outputs are dropped;
// - index rows padded with -1 to the kernels' widths (decode: a multiple of 64
//   for the main and the extra rows; prefill: a multiple of 128);
// - V4's window rows built on the host (sparse_window_slots) and passed as the
//   main indices with topk_length = the window lengths, as vLLM passes them;
// - decode runs every token as its own batch entry (b = T, s_q = 1), so
//   topk_length [b] is per token.
// The caches are passed as they are: fp8_ds_mla is FlashMLA's V3.2 656-byte
// layout and fp8_v4 its MODEL1 per-page layout.
#include <limits>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/backend_base.cuh"
#include "backends/cuda/cache_store.h"
#include "backends/cuda/cuda_backends.h"
#include "backends/flashmla/flashmla_backend.h"
#include "backends/kernel_libs/adapter_common.h"
#include "cases/errors.h"
#include "gpu/device.h"

// FlashMLA's own headers (from MLAGATE_FLASHMLA_SOURCE_DIR/csrc).
#include "params.h"
#include "sm90/decode/sparse_fp8/splitkv_mla.h"
#include "sm90/prefill/sparse/fwd.h"
#include "smxx/decode/combine/combine.h"
#include "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.h"

namespace mlagate {
namespace {

using gpu::DeviceBuffer;
using gpu::upload_array;

// The library's stated limits (csrc/api/sparse_decode.h, sparse_fwd.h and the sm90 kernels' asserts).
constexpr int kDv = 512;              // "Only head_size_v == 512"
constexpr int kTopkBlock = 64;        // decode: params.topk % TOPK_BLOCK_SIZE == 0
constexpr int kPrefillTopkBlock = 128;  // prefill: params.topk % (2*B_TOPK) == 0
constexpr int kHeadBlock = 64;        // B_H / BLOCK_M
constexpr int kFixedOverheadBlocks = 5;  // Decode_Sm90_Impl::get_meta
constexpr int kMaxSmParts = 160;      // the combine kernel's largest MAX_SPLITS
constexpr int kV32Entry = 656, kModel1Entry = 584;
constexpr double kLog2e = 1.4426950408889634;

int round_up(int x, int m) { return (x + m - 1) / m * m; }

// Rows [T, K] padded to [T, Kp] with -1 (Kp >= 1 block).
std::vector<std::int32_t> pad_rows(const std::int32_t* src, std::int64_t T, int K, int Kp) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(T) * Kp, -1);
  for (std::int64_t t = 0; t < T; ++t) std::copy(src + t * K, src + t * K + K, out.begin() + t * Kp);
  return out;
}

// q [T, N, D] bf16 -> [T, Hp, D] with zero rows for the padded heads.
std::vector<std::uint16_t> pad_heads(const TensorView& q, int Hp) {
  const std::int64_t T = q.shape[0], N = q.shape[1], D = q.shape[2];
  std::vector<std::uint16_t> out(static_cast<std::size_t>(T * Hp * D), 0);
  const auto* p = static_cast<const std::uint16_t*>(q.data);
  for (std::int64_t t = 0; t < T; ++t) std::copy(p + t * N * D, p + (t + 1) * N * D, out.begin() + t * Hp * D);
  return out;
}

std::vector<float> pad_sink(std::span<const float> sink, int Hp) {
  std::vector<float> s(static_cast<std::size_t>(Hp), 0.f);
  std::copy(sink.begin(), sink.end(), s.begin());
  return s;
}

// The first N heads of padded device results into the guarded outputs: o
// [T, Hp, 512] bf16 -> [T, N, 512], lse [T, Hp] -> [T, N].
void copy_heads(const DeviceBuffer& o, const DeviceBuffer& lse, gpu::GuardedDeviceOutput& go,
                gpu::GuardedDeviceOutput& glse, std::int64_t T, int N, int Hp, cudaStream_t s) {
  if (T == 0) return;
  MLAGATE_CUDA_CHECK(cudaMemcpy2DAsync(go.data(), static_cast<std::size_t>(N) * kDv * 2, o.data(),
                                       static_cast<std::size_t>(Hp) * kDv * 2, static_cast<std::size_t>(N) * kDv * 2,
                                       static_cast<std::size_t>(T), cudaMemcpyDeviceToDevice, s));
  MLAGATE_CUDA_CHECK(cudaMemcpy2DAsync(glse.data(), static_cast<std::size_t>(N) * 4, lse.data(),
                                       static_cast<std::size_t>(Hp) * 4, static_cast<std::size_t>(N) * 4,
                                       static_cast<std::size_t>(T), cudaMemcpyDeviceToDevice, s));
}

// One sparse decode call of FlashMLA with its device buffers: sized at
// construction for the call's shapes, filled by refresh() (which also runs
// the scheduler-metadata kernel), launched by launch(). A graph keeps one and
// refreshes it in place for every replay (`own_caches`: the caches in buffers
// of its own, not the shared content-keyed copies, so their addresses stay).
struct SparseCall {
  cudaStream_t s = nullptr;
  bool v4 = false, own_caches = false, has_extra = false;
  std::int64_t T = 0;
  int N = 0, D = 0, Hp = 0, K = 0, Kp = 0, K2 = 0, K2p = 0, B = 0, parts = 0;
  DeviceBuffer d_q, d_idx, d_lens, d_eidx, d_elens, d_sink, sched, splits, lse_acc, o_acc, out, lse, main_data, extra_data;
  std::shared_ptr<const gpu::DeviceCache> main_dev, extra_dev;  // eager: the shared copies
  std::unique_ptr<gpu::GuardedDeviceOutput> go, glse;
  GetDecodeSchedMetaParams sp{};
  SparseAttnDecodeParams p{};
  CombineParams c{};

  SparseCall(cudaStream_t stream, const SparseDecodeArgs& a, bool own) : s(stream), own_caches(own) {
    check_sparse_decode_args(a);  // every slot on the host: the library would read any index it is given
    const PagedCache& cache = *a.cache;
    T = a.q.shape[0];
    N = static_cast<int>(a.q.shape[1]);
    D = static_cast<int>(a.q.shape[2]);
    v4 = a.window > 0;
    has_extra = a.extra_cache != nullptr;
    const KvCacheDtype want = v4 ? KvCacheDtype::kFp8V4 : KvCacheDtype::kFp8DsMla;
    if (a.q.dtype != DType::kBF16) throw NotSupportedError("FlashMLA sparse decode takes bf16 queries");
    if (cache.kv_dtype != want || (a.extra_cache && a.extra_cache->kv_dtype != want))
      throw NotSupportedError("FlashMLA sparse decode reads kv " + std::string(kv_cache_dtype_name(want)) + " here");
    if (!v4 && !a.topk_length.empty()) throw NotSupportedError("V3.2 sparse decode takes no topk_length");
    if (!v4 && a.extra_cache) throw NotSupportedError("V3.2 sparse decode takes no extra cache");
    if ((v4 ? D != 512 : D != 576) || a.o.shape[2] != kDv) throw NotSupportedError("FlashMLA: d_qk 576 (V3.2) or 512 (V4), d_v 512");
    if (N > 128) throw NotSupportedError("FlashMLA sparse decode: at most 128 heads");
    const int entry = v4 ? kModel1Entry : kV32Entry;
    if (cache.entry_bytes != entry) throw std::invalid_argument("flashmla.sparse: unexpected entry size");
    if (T == 0) return;  // nothing to launch, nothing to allocate
    Hp = N <= 64 ? 64 : 128;
    K = v4 ? a.window : static_cast<int>(a.indices.shape[1]);
    Kp = std::max(round_up(K, kTopkBlock), kTopkBlock);
    if (has_extra) {
      K2 = static_cast<int>(a.extra_indices.shape[1]);
      K2p = std::max(round_up(K2, kTopkBlock), kTopkBlock);
    }
    parts = std::max(cuda_device_info().multiprocessors / 1 / (Hp / 64), 1);  // get_meta(h_q, s_q = 1)
    if (parts > kMaxSmParts) throw NotSupportedError("FlashMLA's combine takes at most 160 SM parts");
    B = static_cast<int>(T);
    // The scheduler keeps 5 b + 1 ints in shared memory.
    if (4LL * (5LL * B + 1) > gpu::max_dynamic_smem())
      throw NotSupportedError("FlashMLA's scheduler: " + std::to_string(B) + " tokens do not fit its shared memory");
    const std::size_t b = static_cast<std::size_t>(std::max<std::int64_t>(T, 1));
    d_q = DeviceBuffer(b * Hp * D * 2);
    d_idx = DeviceBuffer(b * Kp * 4);
    d_lens = DeviceBuffer(b * 4);
    d_eidx = DeviceBuffer(std::max(b * K2p * 4, std::size_t{4}));
    d_elens = DeviceBuffer(b * 4);
    d_sink = DeviceBuffer(static_cast<std::size_t>(Hp) * 4);
    const int total_splits = B + parts;
    sched = DeviceBuffer(static_cast<std::size_t>(parts) * sizeof(DecodingSchedMeta));
    splits = DeviceBuffer(static_cast<std::size_t>(B + 1) * sizeof(int));
    lse_acc = DeviceBuffer(static_cast<std::size_t>(total_splits) * Hp * sizeof(float));
    o_acc = DeviceBuffer(static_cast<std::size_t>(total_splits) * Hp * kDv * sizeof(float));
    out = DeviceBuffer(b * Hp * kDv * 2);
    lse = DeviceBuffer(b * Hp * 4);
    // Poison (NaN) everything the kernels should write: a value they skip shows.
    for (DeviceBuffer* x : {&lse_acc, &o_acc, &out, &lse}) x->fill(0xFF, s);
    go = std::make_unique<gpu::GuardedDeviceOutput>(a.o, "o", s);
    glse = std::make_unique<gpu::GuardedDeviceOutput>(a.lse, "lse", s);
    if (own_caches) {
      main_data = DeviceBuffer(cache.data.nbytes());
      if (has_extra) extra_data = DeviceBuffer(a.extra_cache->data.nbytes());
    }

    sp.b = B;
    sp.s_q = 1;
    sp.block_size_n = kTopkBlock;
    sp.fixed_overhead_num_blocks = kFixedOverheadBlocks;
    sp.topk = Kp;
    sp.extra_topk = K2p;  // 0 without an extra cache (what the api passes)
    sp.topk_length = v4 ? d_lens.as<int>() : nullptr;
    sp.extra_topk_length = a.extra_topk_length.empty() ? nullptr : d_elens.as<int>();
    sp.seqlens_k_ptr = nullptr;
    sp.tile_scheduler_metadata_ptr = sched.as<DecodingSchedMeta>();
    sp.num_splits_ptr = splits.as<int>();
    sp.num_sm_parts = parts;
    sp.stream = s;

    p.b = B;
    p.s_q = 1;
    p.h_q = Hp;
    p.h_kv = 1;
    p.d_qk = D;
    p.d_v = kDv;
    p.sm_scale = static_cast<float>(a.scale);
    p.sm_scale_div_log2 = static_cast<float>(a.scale * kLog2e);
    p.num_blocks = cache.num_blocks;
    p.page_block_size = cache.block_size;
    p.topk = Kp;
    p.model_type = v4 ? ModelType::MODEL1 : ModelType::V32;
    p.q = d_q.as<cutlass::bfloat16_t>();
    p.indices = d_idx.as<int>();
    p.topk_length = v4 ? d_lens.as<int>() : nullptr;
    p.attn_sink = a.sink.empty() ? nullptr : d_sink.as<float>();
    p.lse = lse.as<float>();
    p.out = out.as<cutlass::bfloat16_t>();
    if (has_extra) {
      p.extra_num_blocks = a.extra_cache->num_blocks;
      p.extra_page_block_size = a.extra_cache->block_size;
      p.extra_topk = K2p;
      p.extra_indices = d_eidx.as<int>();
      p.extra_topk_length = a.extra_topk_length.empty() ? nullptr : d_elens.as<int>();
      p.stride_extra_kv_block = static_cast<int>(a.extra_cache->block_bytes);
      p.stride_extra_kv_row = entry;
      p.stride_extra_indices_b = K2p;
      p.stride_extra_indices_s_q = K2p;
    }
    // Strides in elements: q [b, 1, Hp, D]; kv in bytes [blocks, bs, entry] (the
    // block stride is the padded page for MODEL1); indices [b, 1, Kp]; lse [b, 1, Hp]; o [b, 1, Hp, 512].
    p.stride_q_b = Hp * D;
    p.stride_q_s_q = Hp * D;
    p.stride_q_h_q = D;
    p.stride_kv_block = static_cast<int>(cache.block_bytes);
    p.stride_kv_row = entry;
    p.stride_indices_b = Kp;
    p.stride_indices_s_q = Kp;
    p.stride_lse_b = Hp;
    p.stride_lse_s_q = Hp;
    p.stride_o_b = Hp * kDv;
    p.stride_o_s_q = Hp * kDv;
    p.stride_o_h_q = kDv;
    p.stream = s;
    p.lse_accum = lse_acc.as<float>();
    p.o_accum = o_acc.as<float>();
    p.stride_lse_accum_split = Hp;
    p.stride_lse_accum_s_q = Hp;
    p.stride_o_accum_split = Hp * kDv;
    p.stride_o_accum_s_q = Hp * kDv;
    p.stride_o_accum_h_q = kDv;
    p.tile_scheduler_metadata_ptr = sched.as<DecodingSchedMeta>();
    p.num_splits_ptr = splits.as<int>();
    p.num_sm_parts = parts;

    c.b = B;
    c.s_q = 1;
    c.h_q = Hp;
    c.d_v = kDv;
    c.lse = p.lse;
    c.out = p.out;
    c.stride_lse_b = p.stride_lse_b;
    c.stride_lse_s_q = p.stride_lse_s_q;
    c.stride_o_b = p.stride_o_b;
    c.stride_o_s_q = p.stride_o_s_q;
    c.stride_o_h_q = p.stride_o_h_q;
    c.lse_accum = p.lse_accum;
    c.o_accum = p.o_accum;
    c.stride_lse_accum_split = p.stride_lse_accum_split;
    c.stride_lse_accum_s_q = p.stride_lse_accum_s_q;
    c.stride_o_accum_split = p.stride_o_accum_split;
    c.stride_o_accum_s_q = p.stride_o_accum_s_q;
    c.stride_o_accum_h_q = p.stride_o_accum_h_q;
    c.tile_scheduler_metadata_ptr = p.tile_scheduler_metadata_ptr;
    c.num_splits_ptr = p.num_splits_ptr;
    c.num_sm_parts = parts;
    c.attn_sink = p.attn_sink;
    c.stream = s;
  }

  // The call's inputs into the buffers (the same addresses every time), then
  // the scheduler metadata for them.
  void refresh(const SparseDecodeArgs& a) {
    check_sparse_decode_args(a);
    if (a.q.shape[0] != T || a.q.shape[1] != N || (a.window > 0) != v4 || (a.extra_cache != nullptr) != has_extra)
      throw std::invalid_argument("flashmla.sparse: a call of other shapes than the prepared one");
    if (T == 0) return;
    // Main rows: V3.2's indices, or V4's window slots with their lengths.
    std::vector<std::int32_t> main_rows, main_lens;
    if (v4) {
      sparse_window_slots(a, main_rows, main_lens);
    } else {
      if (a.indices.shape[1] != K) throw std::invalid_argument("flashmla.sparse: index rows of another width");
      main_rows.assign(a.indices.as<std::int32_t>(), a.indices.as<std::int32_t>() + T * K);
    }
    if (T == 0) return;
    const std::vector<std::int32_t> idx = pad_rows(main_rows.data(), T, K, Kp);
    d_idx.upload(idx.data(), idx.size() * 4, s);
    if (!main_lens.empty()) d_lens.upload(main_lens.data(), main_lens.size() * 4, s);
    const std::vector<std::uint16_t> q = pad_heads(a.q, Hp);
    d_q.upload(q.data(), q.size() * 2, s);
    const std::vector<float> sink = pad_sink(a.sink, Hp);
    d_sink.upload(sink.data(), sink.size() * 4, s);
    if (has_extra) {
      const std::vector<std::int32_t> eidx = pad_rows(a.extra_indices.as<std::int32_t>(), T, K2, K2p);
      d_eidx.upload(eidx.data(), eidx.size() * 4, s);
      if (!a.extra_topk_length.empty()) d_elens.upload(a.extra_topk_length.data(), a.extra_topk_length.size_bytes(), s);
    }
    if (own_caches) {
      if (a.cache->data.nbytes() > main_data.size() || (has_extra && a.extra_cache->data.nbytes() > extra_data.size()))
        throw std::invalid_argument("flashmla.sparse: a cache larger than the prepared one");
      upload_pool(main_data, *a.cache, s);
      if (has_extra) upload_pool(extra_data, *a.extra_cache, s);
      p.kv = main_data.as<cutlass::bfloat16_t>();
      if (has_extra) p.extra_kv = extra_data.as<cutlass::bfloat16_t>();
    } else {
      main_dev = gpu::DeviceCacheStore::instance().get(*a.cache, s);
      p.kv = const_cast<cutlass::bfloat16_t*>(main_dev->layer_as<cutlass::bfloat16_t>());
      if (has_extra) {
        extra_dev = gpu::DeviceCacheStore::instance().get(*a.extra_cache, s);
        p.extra_kv = const_cast<cutlass::bfloat16_t*>(extra_dev->layer_as<cutlass::bfloat16_t>());
      }
    }
    smxx::decode::run_get_decoding_sched_meta_kernel(sp);
    MLAGATE_CUDA_CHECK_LAUNCH();
  }

  // The decode and combine kernels (what a graph captures), then the first N
  // heads into the guarded outputs.
  void launch_kernels() {
    if (T == 0) return;
    if (v4) {
      if (Hp == 64) sm90::decode::sparse_fp8::run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::MODEL1, 64>(p);
      else sm90::decode::sparse_fp8::run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::MODEL1, 128>(p);
    } else {
      if (Hp == 64) sm90::decode::sparse_fp8::run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32, 64>(p);
      else sm90::decode::sparse_fp8::run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32, 128>(p);
    }
    smxx::decode::run_flash_mla_combine_kernel<cutlass::bfloat16_t>(c);
    copy_heads(out, lse, *go, *glse, T, N, Hp, s);
  }
  void launch() {
    launch_kernels();
    MLAGATE_CUDA_CHECK_LAUNCH();
  }

  // Waits, checks the guard bands and brings the outputs back.
  void finish(const SparseDecodeArgs& a) {
    if (T == 0) return;
    MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));
    gpu::check_guards_or_throw({go.get(), glse.get()}, s);
    go->download_to(a.o, s);
    glse->download_to(a.lse, s);
  }
};

struct Graph {
  std::unique_ptr<SparseCall> call;
  gpu::CapturedGraph graph;  // last: destroyed before the call's buffers
};

// A CudaBackend for its stream and kernel timing (detail::cuda_last_kernel_ms);
// it has no dense decode.
class FlashMlaSparse final : public gpu::CudaBackend {
 public:
  // raw_scales: run V3.2 decode on fp8_ds_mla:raw caches anyway (tests only:
  // it measures what the bf16 rounding of the tile scales costs).
  explicit FlashMlaSparse(bool raw_scales = false) : raw_scales_(raw_scales) {}
  std::string_view name() const override { return raw_scales_ ? "flashmla.sparse+raw" : "flashmla.sparse"; }
  std::string_view description() const override {
    return "FlashMLA sm90 sparse kernels: V3.2 fp8 sparse decode (fp8_ds_mla), V4 MODEL1 decode (fp8_v4, window + "
           "compressed cache, sinks) and sparse prefill (bf16 rows, d_qk 576 or 512); heads padded to 64/128";
  }
  Capabilities capabilities() const override {
    Capabilities c;
    c.ops = {Op::kSparseDecode, Op::kSparsePrefill};
    c.block_sizes = {64, 1, 2, 4, 8, 16, 32, 128, 256};  // any page block size: the kernels divide the slot by it
    c.query_len_support = QueryLenSupport::kVarlen;       // every token is its own batch entry
    c.dtypes = {DType::kBF16};
    // Decode reads fp8_ds_mla / fp8_v4; prefill reads bf16 rows, whatever the cache the harness dequantized them from.
    c.kv_dtypes = {KvCacheDtype::kFp8DsMla, KvCacheDtype::kFp8V4, KvCacheDtype::kAuto, KvCacheDtype::kFp8,
                   KvCacheDtype::kFp8E4m3};
    c.max_pool_bytes = std::numeric_limits<std::int64_t>::max();  // tried past 4 GiB by the layout suite (cases/LAYOUTS.md)
    return c;
  }

  Support supports(const CaseSpec& spec, Op op) const override {
    Support s = check_capabilities(capabilities(), spec, op);
    if (!s.ok || !is_sparse_op(op)) return s;
    const CudaDeviceInfo& dev = cuda_device_info();
    if (dev.available && !(dev.sm_major == 9 && dev.sm_minor == 0))
      return Support::no("the sm90 sparse kernels need sm90a; the device is sm_" + std::to_string(dev.sm_major) +
                         std::to_string(dev.sm_minor));
    const int D = spec.dims.head_size(), dv = spec.sparse_dv(), N = spec.num_heads();
    const bool v4 = spec.sparse.v4();
    if (D != 576 && D != 512) return Support::no("d_qk " + std::to_string(D) + " not in {576, 512}");
    if (dv != kDv) return Support::no("head_size_v " + std::to_string(dv) + " is not 512");
    if (op == Op::kSparseDecode) {
      if (N > 128) return Support::no(std::to_string(N) + " heads: sparse decode takes h_q 64 or 128 (padded up to)");
      if (!v4) {
        if (D != 576) return Support::no("V3.2 sparse decode needs d_qk 576");
        if (spec.kv_cache_dtype != KvCacheDtype::kFp8DsMla)
          return Support::no("sparse decode reads only FlashMLA's fp8 cache: V3.2 needs kv fp8_ds_mla, not " +
                             std::string(kv_cache_dtype_name(spec.kv_cache_dtype)));
        if (spec.scale_rule != ScaleRule::kPow2 && !raw_scales_)
          return Support::no("fp8_ds_mla:raw: the V3.2 kernel converts each fp32 tile scale to bf16 "
                             "(scales[i] = (bf16)scales_float[i]), exact only for power-of-two scales (pow2)");
        if (has_topk_length(spec.sparse.pattern))
          return Support::no("V3.2 sparse decode takes no topk_length (KU_ASSERT(params.topk_length == nullptr))");
      } else {
        if (D != 512) return Support::no("V4 (MODEL1) sparse decode needs d_qk 512");
        if (spec.kv_cache_dtype != KvCacheDtype::kFp8V4)
          return Support::no("sparse decode reads only FlashMLA's fp8 cache: V4 needs kv fp8_v4 (MODEL1), not " +
                             std::string(kv_cache_dtype_name(spec.kv_cache_dtype)));
      }
    } else {
      if (N > 128) return Support::no(std::to_string(N) + " heads: sparse prefill takes h_q 64 or 128 (padded up to)");
    }
    return s;
  }

  void sparse_decode(const SparseDecodeArgs& a) override {
    gpu::require_device();
    check_scale_rule(a);
    SparseCall call(stream(), a, false);
    call.refresh(a);
    gpu::Event start, stop;
    start.record(call.s);
    call.launch();
    stop.record(call.s);
    call.finish(a);
    last_kernel_ms_ = stop.elapsed_since(start);
  }

  // --cuda-graph on the sparse op: the decode and combine kernels captured
  // once over the call's persistent buffers (the caches included, not the
  // shared content-keyed copies); each replay uploads the new call into them
  // and reruns the scheduler-metadata kernel outside the graph, in place, as
  // vLLM's metadata builder does, then launches the graph.
  std::unique_ptr<SparseDecodeGraph> capture_sparse_decode(const SparseDecodeArgs& a) override {
    gpu::require_device();
    check_scale_rule(a);
    auto g = std::make_shared<Graph>();
    return persistent_sparse_decode_graph(
        a,
        [this, g](const SparseDecodeArgs& p, bool capture) {
          if (capture) {
            g->call = std::make_unique<SparseCall>(stream(), p, true);
            g->call->refresh(p);
            g->call->launch();  // the warm-up
            MLAGATE_CUDA_CHECK(cudaStreamSynchronize(g->call->s));
            g->graph = gpu::CapturedGraph(g->call->s, [&] { g->call->launch_kernels(); });
          } else {
            g->call->refresh(p);
            g->graph.launch(g->call->s);
          }
          g->call->finish(p);
        },
        "CUDA graph");
  }

  // `mlagate bench`: the call prepared and its scheduler metadata made, then
  // the decode and combine kernels (what graph mode captures) timed as a graph.
  std::unique_ptr<DecodeBench> prepare_sparse_decode_bench(const SparseDecodeArgs& a) override {
    gpu::require_device();
    check_scale_rule(a);
    auto call = std::make_shared<SparseCall>(stream(), a, false);
    if (call->T == 0) throw NotSupportedError("an empty batch is not timed");
    call->refresh(a);
    return libs::graph_bench(call, call->s, [c = call.get()] { c->launch_kernels(); },
                            "decode + combine kernels, heads copied out (scheduler metadata made outside)");
  }

  void sparse_prefill(const SparsePrefillArgs& a) override {
    gpu::require_device();
    check_sparse_prefill_args(a);
    const std::int64_t T = a.q.shape[0], S = a.kv.shape[0];
    const int N = static_cast<int>(a.q.shape[1]), D = static_cast<int>(a.q.shape[2]);
    if (a.q.dtype != DType::kBF16) throw NotSupportedError("FlashMLA sparse prefill takes bf16");
    if ((D != 576 && D != 512) || a.o.shape[2] != kDv) throw NotSupportedError("FlashMLA: d_qk 576 or 512, d_v 512");
    if (N > 128) throw NotSupportedError("FlashMLA sparse prefill: at most 128 heads");
    if (S * D > 0x7fffffffLL) throw NotSupportedError("FlashMLA sparse prefill: kv larger than its int strides");
    if (T == 0) return;
    const int Hp = round_up(N, kHeadBlock);
    const cudaStream_t s = stream();
    const int K = static_cast<int>(a.indices.shape[1]);
    const int Kp = std::max(round_up(K, kPrefillTopkBlock), kPrefillTopkBlock);
    const std::vector<std::int32_t> idx = pad_rows(a.indices.as<std::int32_t>(), T, K, Kp);
    const std::vector<std::uint16_t> q = pad_heads(a.q, Hp);
    const std::vector<float> sink = pad_sink(a.sink, Hp);
    DeviceBuffer d_q = upload_array(q.data(), q.size(), s);
    DeviceBuffer d_kv = upload_array(static_cast<const std::uint16_t*>(a.kv.data), a.kv.numel(), s);
    DeviceBuffer d_idx = upload_array(idx.data(), idx.size(), s);
    DeviceBuffer d_lens = upload_array(a.topk_length.data(), a.topk_length.size(), s);
    DeviceBuffer d_sink = upload_array(sink.data(), sink.size(), s);
    DeviceBuffer out(static_cast<std::size_t>(T) * Hp * kDv * 2), lse(static_cast<std::size_t>(T) * Hp * 4),
        max_logits(static_cast<std::size_t>(T) * Hp * 4);
    for (DeviceBuffer* b : {&out, &lse, &max_logits}) b->fill(0xFF, s);
    gpu::GuardedDeviceOutput go(a.o, "o", s), glse(a.lse, "lse", s);

    SparseAttnFwdParams p{};
    p.s_q = static_cast<int>(T);
    p.s_kv = static_cast<int>(S);
    p.h_q = Hp;
    p.h_kv = 1;
    p.d_qk = D;
    p.d_v = kDv;
    p.topk = Kp;
    p.sm_scale = static_cast<float>(a.scale);
    p.sm_scale_div_log2 = static_cast<float>(a.scale * kLog2e);
    p.q = d_q.as<cutlass::bfloat16_t>();
    p.kv = d_kv.as<cutlass::bfloat16_t>();
    p.indices = d_idx.as<int>();
    p.attn_sink = a.sink.empty() ? nullptr : d_sink.as<float>();
    p.topk_length = a.topk_length.empty() ? nullptr : d_lens.as<int>();
    p.stride_q_s_q = Hp * D;
    p.stride_q_h_q = D;
    p.stride_kv_s_kv = D;
    p.stride_kv_h_kv = D;
    p.stride_indices_s_q = Kp;
    p.stride_indices_h_kv = Kp;
    p.out = out.as<cutlass::bfloat16_t>();
    p.max_logits = max_logits.as<float>();
    p.lse = lse.as<float>();
    p.num_sm = cuda_device_info().multiprocessors;
    p.stream = s;

    gpu::Event start, stop;
    start.record(s);
    sm90::run_fwd_kernel(p);
    MLAGATE_CUDA_CHECK_LAUNCH();
    stop.record(s);
    copy_heads(out, lse, go, glse, T, N, Hp, s);
    MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));
    last_kernel_ms_ = stop.elapsed_since(start);
    gpu::check_guards_or_throw({&go, &glse}, s);
    go.download_to(a.o, s);
    glse.download_to(a.lse, s);
  }

 protected:
  std::unique_ptr<PlannedDecode> plan_decode(const DecodeCall&) override {
    throw NotSupportedError("flashmla.sparse has no dense decode (see flashmla)");
  }

 private:
  bool raw_scales_ = false;

  void check_scale_rule(const SparseDecodeArgs& a) const {
    if (a.window == 0 && a.cache && a.cache->kv_dtype == KvCacheDtype::kFp8DsMla &&
        a.cache->scale_rule != ScaleRule::kPow2 && !raw_scales_)
      throw NotSupportedError("the V3.2 kernel rounds tile scales to bf16: pow2 scales only");
  }
};

}  // namespace

std::unique_ptr<Backend> make_flashmla_sparse() { return std::make_unique<FlashMlaSparse>(); }

std::unique_ptr<Backend> detail::make_flashmla_sparse_raw_scales() { return std::make_unique<FlashMlaSparse>(true); }

}  // namespace mlagate
