// The layer glue's up-projection on the GPU (cuda_project_rows, a RowProjector
// of reference/glue.h): the host side. The kernels are row_projection.cu.
//
// Per call: the weights widened to float on the host exactly as the CPU path
// widens them (detail::widen_any) and uploaded, unless the last call's were
// the same bytes (compared in full, so a new case at the old address is never
// mistaken for it); then the rows of every run in chunks of at most
// kChunkBytes of K and V, so device and pinned memory stay bounded however
// many rows come (a TP 1 case's 32,512 context rows are 2.7 GB of K and V):
// the host widens a chunk's latent rows (widen_any again) and prepares its
// rope bits (verbatim, or widened and rounded by f32_run_to_16bit, as the CPU
// does) into pinned memory, the GPU projects them, and while it projects the
// next chunk the host copies this one's K and V rows out to the runs.
// cuda_project_rows_on_device runs the same kernels into device memory and
// brings nothing back.
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "cases/encoding.h"
#include "gpu/device.h"
#include "reference/cuda/cuda_reference.h"
#include "reference/cuda/row_projection_kernels.h"
#include "reference/detail/widen.h"

namespace mlagate {
namespace gpu {
namespace {

// K and V bytes of one chunk of rows (pinned twice on the host, once on the device).
constexpr std::size_t kChunkBytes = std::size_t{64} << 20;

// A device buffer of at least `bytes` (grown, never shrunk).
void reserve(DeviceBuffer& b, std::size_t bytes) {
  if (b.size() < bytes) b = DeviceBuffer(bytes);
}
void reserve(PinnedBuffer& b, std::size_t bytes) {
  if (b.size() < bytes) b = PinnedBuffer(bytes);
}

// A weight [L, N, W] widened to float [L, N*W] as pack_weight (glue.cpp) widens it.
std::vector<float> widen_weight(const Tensor& w) {
  const TensorView v = w.view();
  const std::int64_t rows = w.dim(0), cols = w.dim(1) * w.dim(2);
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
#pragma omp parallel for schedule(static)
  for (std::int64_t l = 0; l < rows; ++l) detail::widen_any(v, l * cols, cols, out.data() + l * cols);
  return out;
}

bool same_bytes(const std::vector<std::byte>& held, const Tensor& t) {
  return held.size() == t.nbytes() && std::memcmp(held.data(), t.bytes(), held.size()) == 0;
}

// What stays between calls: the stream, the last weights on the device, and
// the chunk buffers (grown to the largest chunk seen).
struct Projector {
  Stream stream;
  DType w_dtype = DType::kF32;
  Shape uk_shape, uv_shape;
  std::vector<std::byte> uk_bytes, uv_bytes;  // the host bytes the device weights were made from
  DeviceBuffer w_uk, w_uv;                    // float [L, N*P], [L, N*V]
  DeviceBuffer kv, pe, k, v;                  // a chunk: float [rows, L], bits [rows, R], [rows, N, P+R], [rows, N, V]
  PinnedBuffer in_kv[2], in_pe[2], out_k[2], out_v[2];
  Event done[2];

  void weights(const Case& c, cudaStream_t s) {
    if (w_uk.size() && c.w_uk.dtype() == w_dtype && c.w_uk.shape() == uk_shape && c.w_uv.shape() == uv_shape &&
        same_bytes(uk_bytes, c.w_uk) && same_bytes(uv_bytes, c.w_uv))
      return;
    uk_bytes.clear();  // no stale key if an upload below throws
    const std::vector<float> uk = widen_weight(c.w_uk), uv = widen_weight(c.w_uv);
    w_uk = upload_array(uk.data(), uk.size(), s);
    w_uv = upload_array(uv.data(), uv.size(), s);
    MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));  // the host vectors go out of scope
    w_dtype = c.w_uk.dtype();
    uk_shape = c.w_uk.shape();
    uv_shape = c.w_uv.shape();
    uk_bytes.assign(c.w_uk.bytes(), c.w_uk.bytes() + c.w_uk.nbytes());
    uv_bytes.assign(c.w_uv.bytes(), c.w_uv.bytes() + c.w_uv.nbytes());
  }
};

std::mutex g_mutex;
std::unique_ptr<Projector> g_projector;  // made on first use; cuda_release_row_projector frees it

// A piece of a run inside a chunk: `count` rows from the run's row `offset`,
// at row `at` of the chunk.
struct Segment {
  const RowRun* run;
  std::int64_t offset, count, at;
};

// The model dtype and the weights' shapes a projection needs.
void check_case(const Case& c) {
  const Dims& d = c.spec.dims;
  const std::int64_t N = c.spec.num_heads(), L = d.kv_lora_rank, P = d.nope_dim, V = d.v_head_dim;
  if (c.spec.dtype != DType::kBF16 && c.spec.dtype != DType::kF16)
    throw std::invalid_argument("cuda_project_rows: the model dtype is not bf16 or fp16");
  if (c.w_uk.shape() != Shape{L, N, P} || c.w_uv.shape() != Shape{L, N, V})
    throw std::invalid_argument("cuda_project_rows: W_UK " + shape_str(c.w_uk.shape()) + " / W_UV " +
                                shape_str(c.w_uv.shape()) + " do not match the case's dimensions");
}

// Latent rows [j0, j0 + n) widened to float into kv and rope rows prepared
// into pe (verbatim model-dtype bits, else widened and rounded as the CPU
// does): the host's part of a chunk, the same for both outputs.
void prepare_rows(const Case& c, const TensorView& kv_c, const TensorView& k_pe, std::int64_t j0, std::int64_t n,
                  float* kv, std::uint16_t* pe) {
  const std::int64_t L = c.spec.dims.kv_lora_rank, R = c.spec.dims.rope_dim;
  const bool bf16 = c.spec.dtype == DType::kBF16, pe16 = k_pe.dtype == c.spec.dtype;
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    detail::widen_any(kv_c, (j0 + i) * L, L, kv + i * L);
    std::uint16_t* dst = pe + i * R;
    if (R == 0) {
      continue;
    } else if (pe16) {
      std::memcpy(dst, static_cast<const std::uint16_t*>(k_pe.data) + (j0 + i) * R, static_cast<std::size_t>(R) * 2);
    } else {
      std::vector<float> f(static_cast<std::size_t>(R));
      detail::widen_any(k_pe, (j0 + i) * R, R, f.data());
      f32_run_to_16bit(f.data(), R, bf16, dst);
    }
  }
}

// Queues the upload of a chunk's prepared rows (pinned buffers b) into the
// one device chunk buffer, which is reused in stream order: the upload
// follows the last chunk's kernels.
void upload_chunk(Projector& st, int b, std::int64_t rows, std::int64_t L, std::int64_t R, cudaStream_t s) {
  MLAGATE_CUDA_CHECK(cudaMemcpyAsync(st.kv.data(), st.in_kv[b].as<float>(),
                                     static_cast<std::size_t>(rows * L) * sizeof(float), cudaMemcpyHostToDevice, s));
  if (R > 0)
    MLAGATE_CUDA_CHECK(cudaMemcpyAsync(st.pe.data(), st.in_pe[b].as<std::uint16_t>(),
                                       static_cast<std::size_t>(rows * R) * 2, cudaMemcpyHostToDevice, s));
}

// Queues the projections of the uploaded chunk: K rows (W_UK's nope part,
// then the rope part broadcast to every head) into k, V rows (W_UV) into v,
// both on the device.
void project_chunk(Projector& st, const Case& c, std::int64_t rows, std::uint16_t* k, std::uint16_t* v,
                   cudaStream_t s) {
  const Dims& d = c.spec.dims;
  const int N = static_cast<int>(c.spec.num_heads()), L = static_cast<int>(d.kv_lora_rank);
  const int P = static_cast<int>(d.nope_dim), R = static_cast<int>(d.rope_dim), V = static_cast<int>(d.v_head_dim);
  const bool bf16 = c.spec.dtype == DType::kBF16;
  const int m = static_cast<int>(rows);
  launch_projection_gemm(st.kv.as<float>(), m, L, st.w_uk.as<float>(), N * P, P, P + R,
                         static_cast<long long>(N) * (P + R), bf16, k, s);
  launch_pe_broadcast(st.pe.as<std::uint16_t>(), m, N, R, P + R, P, k, s);
  launch_projection_gemm(st.kv.as<float>(), m, L, st.w_uv.as<float>(), N * V, V, V, static_cast<long long>(N) * V,
                         bf16, v, s);
}

// Every row of kv_c / k_pe projected into device memory: K rows at k, V rows
// at v, the same kernels and so the same bits as project() below, with no
// trip back to the host. Chunks of kDeviceChunkRows latent rows go up through
// two pinned buffers in turn: the host widens chunk i + 1 while the GPU
// uploads and projects chunk i.
constexpr std::int64_t kDeviceChunkRows = 8192;

void project_to_device(Projector& st, const Case& c, const TensorView& kv_c, const TensorView& k_pe, std::uint16_t* k,
                       std::uint16_t* v) {
  check_case(c);
  const Dims& d = c.spec.dims;
  const std::int64_t N = c.spec.num_heads(), L = d.kv_lora_rank, P = d.nope_dim, R = d.rope_dim, V = d.v_head_dim;
  const std::int64_t rows = kv_c.shape.empty() ? 0 : kv_c.shape[0];
  if (kv_c.shape != Shape{rows, L} || k_pe.shape != Shape{rows, R})
    throw std::invalid_argument("cuda_project_rows_on_device: latent " + shape_str(kv_c.shape) + " / rope " +
                                shape_str(k_pe.shape) + " rows do not match the case's dimensions");
  if (rows == 0) return;
  const cudaStream_t s = st.stream.get();
  st.weights(c, s);
  const std::int64_t chunk = std::min(rows, kDeviceChunkRows);
  const std::int64_t k_row = N * (P + R), v_row = N * V;
  reserve(st.kv, static_cast<std::size_t>(chunk * L) * sizeof(float));
  reserve(st.pe, static_cast<std::size_t>(std::max<std::int64_t>(chunk * R, 1)) * 2);
  for (int b = 0; b < 2; ++b) {
    reserve(st.in_kv[b], static_cast<std::size_t>(chunk * L) * sizeof(float));
    reserve(st.in_pe[b], static_cast<std::size_t>(std::max<std::int64_t>(chunk * R, 1)) * 2);
  }
  bool in_flight[2] = {false, false};
  for (std::int64_t j0 = 0, i = 0; j0 < rows; j0 += chunk, ++i) {
    const int b = static_cast<int>(i % 2);
    const std::int64_t n = std::min(chunk, rows - j0);
    if (in_flight[b]) st.done[b].synchronize();  // its last chunk has been uploaded
    prepare_rows(c, kv_c, k_pe, j0, n, st.in_kv[b].as<float>(), st.in_pe[b].as<std::uint16_t>());
    upload_chunk(st, b, n, L, R, s);
    st.done[b].record(s);
    in_flight[b] = true;
    project_chunk(st, c, n, k + j0 * k_row, v + j0 * v_row, s);
  }
  MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));
}

void project(Projector& st, const Case& c, const TensorView& kv_c, const TensorView& k_pe,
             std::span<const RowRun> runs) {
  check_case(c);
  const Dims& d = c.spec.dims;
  const std::int64_t N = c.spec.num_heads(), L = d.kv_lora_rank, P = d.nope_dim, R = d.rope_dim, V = d.v_head_dim;
  const std::int64_t kv_rows = kv_c.shape.empty() ? 0 : kv_c.shape[0];
  for (const RowRun& r : runs)
    if (r.n < 0 || r.first < 0 || r.first + r.n > kv_rows)
      throw std::out_of_range("cuda_project_rows: rows [" + std::to_string(r.first) + ", " +
                              std::to_string(r.first + r.n) + ") of " + std::to_string(kv_rows));
  const cudaStream_t s = st.stream.get();
  st.weights(c, s);

  const std::int64_t k_row = N * (P + R), v_row = N * V;  // elements of a K row and a V row
  const std::int64_t row_bytes = (k_row + v_row) * 2;
  std::int64_t total = 0;
  for (const RowRun& r : runs) total += r.n;
  if (total == 0) return;
  // Rows per chunk: whole kProjRows tiles up to kChunkBytes (one tile at least).
  std::int64_t chunk = std::max<std::int64_t>(1, static_cast<std::int64_t>(kChunkBytes) / row_bytes / kProjRows) *
                       kProjRows;
  chunk = std::min(chunk, total);
  reserve(st.kv, static_cast<std::size_t>(chunk * L) * sizeof(float));
  reserve(st.pe, static_cast<std::size_t>(std::max<std::int64_t>(chunk * R, 1)) * 2);
  reserve(st.k, static_cast<std::size_t>(chunk * k_row) * 2);
  reserve(st.v, static_cast<std::size_t>(chunk * v_row) * 2);
  for (int b = 0; b < 2; ++b) {
    reserve(st.in_kv[b], static_cast<std::size_t>(chunk * L) * sizeof(float));
    reserve(st.in_pe[b], static_cast<std::size_t>(std::max<std::int64_t>(chunk * R, 1)) * 2);
    reserve(st.out_k[b], static_cast<std::size_t>(chunk * k_row) * 2);
    reserve(st.out_v[b], static_cast<std::size_t>(chunk * v_row) * 2);
  }

  // The chunks' segments, in run order.
  std::vector<std::vector<Segment>> chunks(1);
  std::int64_t filled = 0;
  for (const RowRun& r : runs)
    for (std::int64_t off = 0; off < r.n;) {
      if (filled == chunk) chunks.emplace_back(), filled = 0;
      const std::int64_t n = std::min(r.n - off, chunk - filled);
      chunks.back().push_back({&r, off, n, filled});
      off += n;
      filled += n;
    }
  auto rows_of = [](const std::vector<Segment>& segs) { return segs.back().at + segs.back().count; };

  // The host's part before the GPU's: latent rows widened, rope bits prepared.
  auto prepare = [&](const std::vector<Segment>& segs, int b) {
    for (const Segment& g : segs)
      prepare_rows(c, kv_c, k_pe, g.run->first + g.offset, g.count, st.in_kv[b].as<float>() + g.at * L,
                   st.in_pe[b].as<std::uint16_t>() + g.at * R);
  };
  // The GPU's part, queued on the stream: upload, project, download into out_*[b].
  auto enqueue = [&](const std::vector<Segment>& segs, int b) {
    const std::int64_t rows = rows_of(segs);
    upload_chunk(st, b, rows, L, R, s);
    project_chunk(st, c, rows, st.k.as<std::uint16_t>(), st.v.as<std::uint16_t>(), s);
    MLAGATE_CUDA_CHECK(cudaMemcpyAsync(st.out_k[b].as<std::uint16_t>(), st.k.data(),
                                       static_cast<std::size_t>(rows * k_row) * 2, cudaMemcpyDeviceToHost, s));
    MLAGATE_CUDA_CHECK(cudaMemcpyAsync(st.out_v[b].as<std::uint16_t>(), st.v.data(),
                                       static_cast<std::size_t>(rows * v_row) * 2, cudaMemcpyDeviceToHost, s));
    st.done[b].record(s);
  };
  // The host's part after: K and V rows copied out to their runs.
  auto scatter = [&](const std::vector<Segment>& segs, int b) {
    for (const Segment& g : segs) {
      const std::uint16_t* k = st.out_k[b].as<std::uint16_t>() + g.at * k_row;
      const std::uint16_t* v = st.out_v[b].as<std::uint16_t>() + g.at * v_row;
      std::uint16_t* kd = g.run->k + g.offset * k_row;
      std::uint16_t* vd = g.run->v + g.offset * v_row;
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < g.count; ++i) {
        std::memcpy(kd + i * k_row, k + i * k_row, static_cast<std::size_t>(k_row) * 2);
        std::memcpy(vd + i * v_row, v + i * v_row, static_cast<std::size_t>(v_row) * 2);
      }
    }
  };

  // Chunk i uses buffers i % 2. Chunk i + 1 is prepared and queued before the
  // host waits for chunk i, so the GPU works while the host copies; buffers
  // b are reused only after chunk i - 1's scatter, which waited for its event.
  prepare(chunks[0], 0);
  enqueue(chunks[0], 0);
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    const int b = static_cast<int>(i % 2);
    if (i + 1 < chunks.size()) {
      prepare(chunks[i + 1], 1 - b);
      enqueue(chunks[i + 1], 1 - b);
    }
    st.done[b].synchronize();
    scatter(chunks[i], b);
  }
}

}  // namespace
}  // namespace gpu

void cuda_project_rows(const Case& c, const TensorView& kv_c, const TensorView& k_pe, std::span<const RowRun> runs) {
  using namespace gpu;
  require_device();
  const std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_projector) g_projector = std::make_unique<Projector>();
  try {
    project(*g_projector, c, kv_c, k_pe, runs);
  } catch (...) {
    // Nothing queued may outlive the call (it reads the caller's memory and
    // writes pinned buffers): wait for it, then start afresh next time.
    cudaStreamSynchronize(g_projector->stream.get());
    g_projector.reset();
    throw;
  }
}

void cuda_project_rows_on_device(const Case& c, const TensorView& kv_c, const TensorView& k_pe, void* k, void* v) {
  using namespace gpu;
  require_device();
  const std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_projector) g_projector = std::make_unique<Projector>();
  try {
    project_to_device(*g_projector, c, kv_c, k_pe, static_cast<std::uint16_t*>(k), static_cast<std::uint16_t*>(v));
  } catch (...) {
    cudaStreamSynchronize(g_projector->stream.get());
    g_projector.reset();
    throw;
  }
}

void cuda_release_row_projector() {
  const std::lock_guard<std::mutex> lock(gpu::g_mutex);
  gpu::g_projector.reset();
}

}  // namespace mlagate
