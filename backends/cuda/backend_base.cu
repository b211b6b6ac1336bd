// The CUDA backends' shared host flow (validation, uploads, guarded outputs,
// timing, copy back) and the device cache writer.
#include "backends/cuda/backend_base.cuh"

#include <cuda_fp8.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "backends/cuda/cache_store.h"
#include "backends/cuda/cuda_backends.h"
#include "cases/errors.h"
#include "cases/fp8.h"

namespace mlagate::gpu {
namespace {

// e4m3fn by the hardware's conversion (cvt.rn.satfinite: round to nearest
// even, +-448 for anything larger), not the reference writer's bit code: the
// cache_write op compares two implementations of one contract.
__device__ __forceinline__ unsigned char to_e4m3(float x) {
  return static_cast<unsigned char>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// fp8_ds_mla tile scale from the tile's amax (cases/fp8.h's two rules), in fp32.
__device__ __forceinline__ float ds_mla_scale(float amax, bool pow2) {
  const float s = __fdiv_rn(amax, 448.f);
  if (!pow2) return fmaxf(s, 1.17549435e-38f);  // FLT_MIN
  const float t = fmaxf(s, 1e-4f);
  int e = 0;
  const float m = frexpf(t, &e);  // t = m * 2^e, m in [0.5, 1): a power of two stays, else the next one up
  return m == 0.5f ? t : ldexpf(1.f, e);
}

// New tokens into their slots, one block of kWriteThreads per token, in the
// entry layout of the cache's kv dtype (cases/fp8.h): auto copies the model
// dtype bits; fp8 stores e4m3(x / k_scale); fp8_ds_mla stores e4m3(x / tile
// scale) per 128-element tile, the fp32 scales, and k_pe as bf16 verbatim.
constexpr int kWriteThreads = 128;  // one thread per element of an fp8_ds_mla tile
__global__ void __launch_bounds__(kWriteThreads)
    write_entries_kernel(unsigned char* cache, KvFormat f, bool pow2, int R, const std::uint16_t* kv_c,
                         const std::uint16_t* k_pe, const long long* slots) {
  const long long t = blockIdx.x;
  const long long slot = slots[t];
  if (slot < 0) return;  // the whole block leaves together
  const int L = f.L, tid = threadIdx.x;
  unsigned char* e = cache + slot * f.entry_bytes;
  switch (f.kind) {
    case KvKind::kModel16: {
      std::uint16_t* d = reinterpret_cast<std::uint16_t*>(e);
      for (int i = tid; i < L + R; i += kWriteThreads) d[i] = i < L ? kv_c[t * L + i] : k_pe[t * R + (i - L)];
      return;
    }
    case KvKind::kFp8E4M3: {
      for (int i = tid; i < L + R; i += kWriteThreads) {
        const float x = model_to_float(i < L ? kv_c[t * L + i] : k_pe[t * R + (i - L)], f.bf16);
        e[i] = to_e4m3(__fdiv_rn(x, f.k_scale));
      }
      return;
    }
    case KvKind::kFp8DsMla: {
      __shared__ float warp_max[kWriteThreads / 32];
      for (int tile = 0; tile < L / 128; ++tile) {
        const float x = model_to_float(kv_c[t * L + tile * 128 + tid], true);
        float a = fabsf(x);
        for (int o = 16; o > 0; o /= 2) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
        if (tid % 32 == 0) warp_max[tid / 32] = a;
        __syncthreads();
        float amax = warp_max[0];
        for (int w = 1; w < kWriteThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
        __syncthreads();  // warp_max is rewritten by the next tile
        const float scale = ds_mla_scale(amax, pow2);
        e[tile * 128 + tid] = to_e4m3(__fdiv_rn(x, scale));
        if (tid == 0) reinterpret_cast<float*>(e + f.scale_offset)[tile] = scale;
      }
      std::uint16_t* pe = reinterpret_cast<std::uint16_t*>(e + f.k_pe_offset);
      for (int i = tid; i < R; i += kWriteThreads) pe[i] = k_pe[t * R + i];
      return;
    }
  }
}

}  // namespace

KvFormat kv_format_of(const PagedCache& cache, float k_scale) {
  const EntryFormat ef = cache.format();  // throws InvalidCase for impossible layouts
  if (ef.bytes != cache.entry_bytes)
    throw std::invalid_argument("cache entry of " + std::to_string(cache.entry_bytes) + " bytes, its format has " +
                                std::to_string(ef.bytes));
  KvFormat f;
  f.entry_bytes = cache.entry_bytes;
  f.L = cache.kv_lora_rank;
  f.bf16 = cache.elem_dtype == DType::kBF16;
  f.k_scale = k_scale;
  f.scale_offset = ef.scale_offset;
  f.k_pe_offset = ef.k_pe_offset;
  switch (cache.kv_dtype) {
    case KvCacheDtype::kAuto: f.kind = KvKind::kModel16; return f;
    case KvCacheDtype::kFp8:
    case KvCacheDtype::kFp8E4m3: f.kind = KvKind::kFp8E4M3; return f;
    case KvCacheDtype::kFp8DsMla: f.kind = KvKind::kFp8DsMla; return f;
    case KvCacheDtype::kFp8V4: break;  // DeepSeek V4's sparse cache: the sparse kernels' own reader
  }
  throw NotSupportedError("kv cache dtype " + std::string(kv_cache_dtype_name(cache.kv_dtype)) +
                          " is not read by the CUDA kernels");
}

RowStrides row_strides(const TensorView& v) {
  if (v.strides.empty()) return {};
  return {v.stride(0), v.stride(1), static_cast<int>(v.shape.at(1))};
}

cudaStream_t CudaBackend::stream() {
  if (!stream_) stream_ = std::make_unique<Stream>();
  return stream_->get();
}

// Everything a decode's kernels read and write on the device, uploaded on the
// backend's stream; `call` points into the members (the struct never moves:
// it lives behind a unique_ptr).
struct CudaBackend::DecodeInputs {
  std::shared_ptr<const DeviceCache> cache;
  DeviceBuffer q_lat, q_pe, meta, groups;
  std::unique_ptr<GuardedDeviceOutput> o, lse;
  DecodeCall call;
};

namespace {

// A decode's problem over device buffers: q_lat, q_pe, the cache's bytes and
// block table (rows of `table_width`), and the metadata [seq_lens | query_start
// | table rows] of a's B requests.
PagedDecodeProblem decode_problem(const DecodeArgs& a, const KvFormat& kv, const DeviceBuffer& q_lat,
                                  const DeviceBuffer& q_pe, const void* cache, const DeviceBuffer& table,
                                  const DeviceBuffer& meta, int table_width) {
  const std::size_t B = a.seq_lens.size();
  const int L = static_cast<int>(a.q_lat.shape[2]), R = static_cast<int>(a.q_pe.shape[2]);
  PagedDecodeProblem pb{};
  pb.q_lat = q_lat.as<std::uint16_t>();
  pb.q_pe = q_pe.as<std::uint16_t>();
  pb.cache = static_cast<const unsigned char*>(cache);
  pb.block_table = table.as<std::int32_t>();
  pb.seq_lens = meta.as<std::int32_t>();
  pb.query_start = pb.seq_lens + B;
  pb.table_rows = pb.query_start + B + 1;
  pb.table_width = table_width;
  pb.block_size = a.cache->block_size;
  pb.kv = kv;
  pb.heads = static_cast<int>(a.q_lat.shape[1]);
  pb.L = L;
  pb.R = R;
  pb.dk = L + R;
  pb.dv = L;
  pb.scale = a.scale;
  pb.bf16 = a.q_lat.dtype == DType::kBF16;
  pb.q_lat_rows = row_strides(a.q_lat);
  pb.q_pe_rows = row_strides(a.q_pe);
  return pb;
}

}  // namespace

std::unique_ptr<CudaBackend::DecodeInputs> CudaBackend::upload_decode(const DecodeArgs& a) {
  require_device();
  // On the host before any launch: a bad block id must throw here, not fault
  // inside a kernel (a fault leaves the CUDA context unusable for every later record).
  check_decode_args(a);
  const PagedCache& cache = *a.cache;
  const KvFormat kv = kv_format_of(cache, a.k_scale);
  const int T = static_cast<int>(a.q_lat.shape[0]), N = static_cast<int>(a.q_lat.shape[1]);
  const cudaStream_t s = stream();

  auto in = std::make_unique<DecodeInputs>();
  in->cache = DeviceCacheStore::instance().get(cache, s);
  // Strided views (a backend that declares them) go up as they are: the
  // kernels read them with their strides.
  in->q_lat = upload_view(a.q_lat, s);
  in->q_pe = upload_view(a.q_pe, s);
  const std::size_t B = a.seq_lens.size();
  std::vector<std::int32_t> meta;  // seq_lens [B] | query_start [B + 1] | table rows [B]
  meta.insert(meta.end(), a.seq_lens.begin(), a.seq_lens.end());
  meta.insert(meta.end(), a.query_start_loc.begin(), a.query_start_loc.end());
  meta.insert(meta.end(), a.block_table_rows.begin(), a.block_table_rows.end());
  in->meta = upload_array(meta.data(), meta.size(), s);
  const std::vector<RowGroup> groups = decode_row_groups(a.query_start_loc, N);
  in->groups = upload_array(groups.data(), groups.size(), s);
  in->o = std::make_unique<GuardedDeviceOutput>(a.o_lat, "o_lat", s);
  in->lse = std::make_unique<GuardedDeviceOutput>(a.lse, "lse", s);

  DecodeCall& call = in->call;
  call.pb = decode_problem(a, kv, in->q_lat, in->q_pe, in->cache->layer(), in->cache->block_table, in->meta,
                           cache.table_width);
  call.groups = in->groups.as<RowGroup>();
  call.num_groups = static_cast<int>(groups.size());
  call.rows = static_cast<long long>(T) * N;
  call.max_seq_len = B ? *std::max_element(a.seq_lens.begin(), a.seq_lens.end()) : 0;
  call.o_lat = in->o.get();
  call.lse = in->lse.get();
  call.o_rows = row_strides(a.o_lat);
  call.lse_rows = row_strides(a.lse);
  call.stream = s;
  return in;
}

void CudaBackend::decode(const DecodeArgs& a) {
  const std::unique_ptr<DecodeInputs> in = upload_decode(a);
  const cudaStream_t s = in->call.stream;
  const std::unique_ptr<PlannedDecode> plan = plan_decode(in->call);
  Event start, stop;
  start.record(s);
  plan->enqueue(s);
  last_kernel_ms_ = finish_timed_call(start, stop, s, *in->o, a.o_lat, *in->lse, a.lse);
}

std::unique_ptr<DecodeBench> CudaBackend::prepare_decode_bench(const DecodeArgs& a) {
  // The handle owns the inputs and the plan; the plan goes first (members are
  // destroyed in reverse order): it may use the inputs' buffers.
  class Handle final : public DecodeBench {
   public:
    Handle(std::unique_ptr<DecodeInputs> in, std::unique_ptr<PlannedDecode> plan)
        : in_(std::move(in)), plan_(std::move(plan)) {}
    void launch(void* cuda_stream) override { plan_->enqueue(static_cast<cudaStream_t>(cuda_stream)); }
    std::string note() const override { return plan_->note(); }

   private:
    std::unique_ptr<DecodeInputs> in_;
    std::unique_ptr<PlannedDecode> plan_;
  };
  std::unique_ptr<DecodeInputs> in = upload_decode(a);
  std::unique_ptr<PlannedDecode> plan = plan_decode(in->call);
  // Uploads and the plan's poisoning are done before any launch on another stream.
  MLAGATE_CUDA_CHECK(cudaStreamSynchronize(in->call.stream));
  return std::make_unique<Handle>(std::move(in), std::move(plan));
}

std::unique_ptr<DecodeGraph> CudaBackend::capture_decode(const DecodeArgs& a) {
  class Graph final : public DecodeGraph {
   public:
    Graph(CudaBackend& b, const DecodeArgs& a) : s_(b.stream()) {
      require_device();
      check_decode_args(a);
      // The serving modes run the contiguous layout only (cases/LAYOUTS.md).
      for (const TensorView* v : {&a.q_lat, &a.q_pe, &a.o_lat, &a.lse})
        if (!v->strides.empty()) throw NotSupportedError("decode graph: strided views are not captured (contiguous layout only)");
      const PagedCache& c = *a.cache;
      const int T = static_cast<int>(a.q_lat.shape[0]), N = static_cast<int>(a.q_lat.shape[1]);
      B_ = a.seq_lens.size();
      q_shape_ = a.q_lat.shape;
      qsl_.assign(a.query_start_loc.begin(), a.query_start_loc.end());
      scale_ = a.scale;
      k_scale_ = a.k_scale;
      kv_dtype_ = c.kv_dtype;
      scale_rule_ = c.scale_rule;
      block_size_ = c.block_size;
      entry_bytes_ = c.entry_bytes;
      block_bytes_ = c.block_bytes;
      blocks_ = c.num_blocks;
      width_ = c.table_width;
      cache_ = DeviceBuffer(c.data.nbytes());
      table_ = DeviceBuffer(B_ * static_cast<std::size_t>(width_) * sizeof(std::int32_t));
      q_lat_ = DeviceBuffer(a.q_lat.nbytes());
      q_pe_ = DeviceBuffer(a.q_pe.nbytes());
      meta_ = DeviceBuffer((3 * B_ + 1) * sizeof(std::int32_t));
      const std::vector<RowGroup> groups = decode_row_groups(a.query_start_loc, N);
      groups_ = upload_array(groups.data(), groups.size(), s_);
      // The outputs hold the harness's poison from here on; replays do not reset them.
      o_ = std::make_unique<GuardedDeviceOutput>(a.o_lat, "o_lat", s_);
      lse_ = std::make_unique<GuardedDeviceOutput>(a.lse, "lse", s_);
      refresh(a);
      call_.pb = decode_problem(a, kv_format_of(c, a.k_scale), q_lat_, q_pe_, cache_.data(), table_, meta_, width_);
      call_.groups = groups_.as<RowGroup>();
      call_.num_groups = static_cast<int>(groups.size());
      call_.rows = static_cast<long long>(T) * N;
      // Planned for the longest sequence the captured table holds: a replay
      // may bring longer ones than the capture's batch had.
      call_.max_seq_len = width_ * block_size_;
      call_.o_lat = o_.get();
      call_.lse = lse_.get();
      call_.stream = s_;
      plan_ = b.plan_decode(call_);
      // A warm-up run (kernel attributes set, modules loaded), then the capture.
      plan_->enqueue(s_);
      MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s_));
      MLAGATE_CUDA_CHECK(cudaStreamBeginCapture(s_, cudaStreamCaptureModeRelaxed));
      plan_->enqueue(s_);
      const cudaError_t end = cudaStreamEndCapture(s_, &graph_);
      MLAGATE_CUDA_CHECK(end);
      MLAGATE_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
    }
    ~Graph() override {
      if (exec_) cudaGraphExecDestroy(exec_);
      if (graph_) cudaGraphDestroy(graph_);
    }
    void replay(const DecodeArgs& a) override {
      refresh(a);
      MLAGATE_CUDA_CHECK(cudaGraphLaunch(exec_, s_));
      MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s_));
      check_guards_or_throw({o_.get(), lse_.get()}, s_);
      o_->download_to(a.o_lat, s_);
      lse_->download_to(a.lse, s_);
    }
    std::string note() const override { return "CUDA graph"; }

   private:
    // The replay's inputs into the captured addresses.
    void refresh(const DecodeArgs& a) {
      check_decode_args(a);
      const PagedCache& c = *a.cache;
      if (a.q_lat.shape != q_shape_ || a.seq_lens.size() != B_ || a.block_table_rows.size() != B_ ||
          !std::equal(qsl_.begin(), qsl_.end(), a.query_start_loc.begin(), a.query_start_loc.end()))
        throw std::invalid_argument("decode graph: replayed with other shapes than captured");
      if (a.scale != scale_ || a.k_scale != k_scale_ || c.kv_dtype != kv_dtype_ || c.scale_rule != scale_rule_ ||
          c.block_size != block_size_ || c.entry_bytes != entry_bytes_ || c.block_bytes != block_bytes_)
        throw std::invalid_argument("decode graph: replayed with another scale or cache format than captured");
      if (c.num_blocks > blocks_ || c.table_width > width_ || static_cast<std::size_t>(c.block_table.dim(0)) > B_)
        throw std::invalid_argument("decode graph: the cache is larger than the captured one");
      q_lat_.upload(a.q_lat.data, a.q_lat.nbytes(), s_);
      q_pe_.upload(a.q_pe.data, a.q_pe.nbytes(), s_);
      std::vector<std::int32_t> meta(a.seq_lens.begin(), a.seq_lens.end());
      meta.insert(meta.end(), a.query_start_loc.begin(), a.query_start_loc.end());
      meta.insert(meta.end(), a.block_table_rows.begin(), a.block_table_rows.end());
      meta_.upload(meta.data(), meta.size() * sizeof(std::int32_t), s_);
      upload_pool(cache_, c, s_);
      std::vector<std::int32_t> table(B_ * static_cast<std::size_t>(width_), 0);  // narrower rows padded with block 0
      const std::int32_t* src = c.block_table.data<std::int32_t>();
      for (std::int64_t r = 0; r < c.block_table.dim(0); ++r)
        std::copy_n(src + r * c.table_width, c.table_width, table.begin() + r * width_);
      table_.upload(table.data(), table.size() * sizeof(std::int32_t), s_);
    }

    cudaStream_t s_;
    std::size_t B_ = 0;
    Shape q_shape_;
    std::vector<std::int32_t> qsl_;
    double scale_ = 0;
    float k_scale_ = 1;
    KvCacheDtype kv_dtype_{};
    ScaleRule scale_rule_{};
    int block_size_ = 0, entry_bytes_ = 0, blocks_ = 0, width_ = 0;
    std::int64_t block_bytes_ = 0;
    DeviceBuffer cache_, table_, q_lat_, q_pe_, meta_, groups_;
    std::unique_ptr<GuardedDeviceOutput> o_, lse_;
    DecodeCall call_;
    std::unique_ptr<PlannedDecode> plan_;
    cudaGraph_t graph_ = nullptr;
    cudaGraphExec_t exec_ = nullptr;
  };
  return std::make_unique<Graph>(*this, a);
}

void CudaBackend::cache_write(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                              std::span<const std::int64_t> slots) {
  require_device();
  // The reference writer's checks, in its words.
  if (kv_c.dtype != cache.elem_dtype || k_pe.dtype != cache.elem_dtype)
    throw std::invalid_argument("cache_write: kv_c/k_pe dtype differs from the cache's");
  if (kv_c.shape.size() != 2 || k_pe.shape.size() != 2)
    throw std::invalid_argument("cache_write: kv_c must be [n, L] and k_pe [n, R]");
  const std::int64_t L = kv_c.shape[1], R = k_pe.shape[1];
  if (L != cache.kv_lora_rank || R != cache.rope_dim)
    throw std::invalid_argument("cache_write: kv_c/k_pe widths differ from the cache's L, R");
  const KvFormat f = kv_format_of(cache, cache.k_scale);
  if (f.kind == KvKind::kFp8DsMla && L % 128 != 0)
    throw std::invalid_argument("cache_write: fp8_ds_mla needs L % 128 == 0");
  const std::int64_t n = static_cast<std::int64_t>(slots.size());
  if (kv_c.shape[0] < n || k_pe.shape[0] < n) throw std::invalid_argument("cache_write: fewer rows than slots");
  const std::int64_t capacity = static_cast<std::int64_t>(cache.num_blocks) * cache.block_size;
  for (std::int64_t slot : slots)
    if (slot >= capacity) throw std::out_of_range("cache_write: slot " + std::to_string(slot) + " out of range");
  const cudaStream_t s = stream();

  std::shared_ptr<DeviceCache> dc = DeviceCacheStore::instance().copy_for_write(cache, s);
  if (n > 0) {
    const DeviceBuffer d_kv = upload_array(static_cast<const std::uint16_t*>(kv_c.data), static_cast<std::size_t>(n * L), s);
    const DeviceBuffer d_pe = upload_array(static_cast<const std::uint16_t*>(k_pe.data), static_cast<std::size_t>(n * R), s);
    const DeviceBuffer d_slots = upload_array(reinterpret_cast<const long long*>(slots.data()), slots.size(), s);
    Event start, stop;
    start.record(s);
    write_entries_kernel<<<static_cast<unsigned>(n), kWriteThreads, 0, s>>>(
        dc->layer_as<unsigned char>(), f, cache.scale_rule == ScaleRule::kPow2, static_cast<int>(R),
        d_kv.as<std::uint16_t>(), d_pe.as<std::uint16_t>(), d_slots.as<long long>());
    MLAGATE_CUDA_CHECK_LAUNCH();
    stop.record(s);
    MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));
    last_kernel_ms_ = stop.elapsed_since(start);
  }
  // The host cache becomes exactly the device's (every byte, so a write to a
  // wrong slot shows on the host too); the device copy is kept under its new
  // content for the decode that follows.
  cache.data.for_each_live_range([&](std::int64_t b, std::int64_t e) {
    dc->data.download(cache.data.bytes() + b, static_cast<std::size_t>(e - b), s, dc->before + static_cast<std::size_t>(b));
  });
  // The stacked cache's other layers on the device (layout strided): a write
  // there is as wrong as one into the host's (PageStore::check_other_layers).
  if (const std::string w = dc->other_layers_change(s); !w.empty()) throw OutOfBoundsWriteError("cache_write: " + w);
  dc->key = cache_key(cache);
  DeviceCacheStore::instance().adopt(std::move(dc));
}

}  // namespace mlagate::gpu

namespace mlagate {

std::uint64_t cuda_cache_uploads() { return gpu::DeviceCacheStore::instance().uploads(); }

double detail::cuda_last_kernel_ms(const Backend& b) {
  const auto* c = dynamic_cast<const gpu::CudaBackend*>(&b);
  return c ? c->last_kernel_ms() : -1.0;
}

}  // namespace mlagate
