// The real-library adapters' shared flows: argument checks before any launch,
// decode with guarded outputs, and the bench handle.
#include "backends/kernel_libs/adapter_common.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "cases/errors.h"

namespace mlagate::libs {
namespace {

[[noreturn]] void bad_arg(const std::string& what) { throw std::invalid_argument("decode: " + what); }

void expect_shape(const TensorView& t, const Shape& want, const char* name) {
  if (t.shape != want) bad_arg(std::string(name) + " has shape " + shape_str(t.shape) + ", expected " + shape_str(want));
  if (t.data == nullptr && t.numel() > 0) bad_arg(std::string(name) + " has no data");
}

class Bench final : public DecodeBench {
 public:
  Bench(gpu::DeviceBuffer o, gpu::DeviceBuffer lse, std::unique_ptr<PreparedDecode> p, std::string note)
      : o_(std::move(o)), lse_(std::move(lse)), p_(std::move(p)), note_(std::move(note)) {}
  void launch(void* cuda_stream) override { p_->launch(static_cast<cudaStream_t>(cuda_stream)); }
  std::string note() const override { return note_; }

 private:
  gpu::DeviceBuffer o_, lse_;  // declared before p_: the prepared call points into them
  std::unique_ptr<PreparedDecode> p_;
  std::string note_;
};

}  // namespace

void validate_decode_args(const DecodeArgs& a) {
  if (a.cache == nullptr) bad_arg("no cache");
  const PagedCache& cache = *a.cache;
  if (a.q_lat.shape.size() != 3) bad_arg("q_lat must be [T, N, L], got " + shape_str(a.q_lat.shape));
  if (a.q_pe.shape.size() != 3) bad_arg("q_pe must be [T, N, R], got " + shape_str(a.q_pe.shape));
  const std::int64_t t = a.q_lat.shape[0], n = a.q_lat.shape[1], l = a.q_lat.shape[2], r = a.q_pe.shape[2];
  const DType dt = a.q_lat.dtype;
  if (dt != DType::kBF16 && dt != DType::kF16)
    bad_arg("q_lat dtype " + std::string(dtype_name(dt)) + " is not a 16-bit model dtype");
  if (a.q_pe.dtype != dt || a.o_lat.dtype != dt || cache.elem_dtype != dt)
    bad_arg("q_lat, q_pe, o_lat and the cache entries must share one model dtype");
  if (a.lse.dtype != DType::kF32) bad_arg("lse must be float32");
  expect_shape(a.q_lat, {t, n, l}, "q_lat");
  expect_shape(a.q_pe, {t, n, r}, "q_pe");
  expect_shape(a.o_lat, {t, n, l}, "o_lat");
  expect_shape(a.lse, {t, n}, "lse");
  if (cache.kv_lora_rank != l || cache.rope_dim != r)
    bad_arg("the cache holds L = " + std::to_string(cache.kv_lora_rank) + ", R = " + std::to_string(cache.rope_dim) +
            ", the queries L = " + std::to_string(l) + ", R = " + std::to_string(r));
  const std::size_t b = a.seq_lens.size();
  if (b == 0) bad_arg("no requests");
  if (a.query_start_loc.size() != b + 1) bad_arg("query_start_loc must have B + 1 entries");
  if (a.block_table_rows.size() != b) bad_arg("block_table_rows must have B entries");
  if (a.query_start_loc[0] != 0 || a.query_start_loc[b] != t) bad_arg("query_start_loc must run from 0 to T");
  const int bs = cache.block_size;
  if (bs < 1) bad_arg("cache block size " + std::to_string(bs));
  const std::int64_t table_rows = cache.block_table.dim(0), width = cache.block_table.dim(1);
  const std::int32_t* table = cache.block_table.data<std::int32_t>();
  for (std::size_t i = 0; i < b; ++i) {
    if (a.query_start_loc[i + 1] < a.query_start_loc[i]) bad_arg("query_start_loc must not decrease");
    if (a.seq_lens[i] < 0) bad_arg("negative seq_len");
    const int row = a.block_table_rows[i];
    if (row < 0 || row >= table_rows) bad_arg("block table row " + std::to_string(row) + " out of range");
    const int s = a.seq_lens[i];
    if (s > 0 && (s - 1) / bs >= width) bad_arg("seq_len " + std::to_string(s) + " exceeds the block table width");
    for (int blk = 0; blk * bs < s; ++blk) {
      const std::int64_t id = table[row * width + blk];
      if (id < 0 || id >= cache.num_blocks)
        throw std::out_of_range("decode: request " + std::to_string(i) + " key " + std::to_string(blk * bs) +
                                " maps to block " + std::to_string(id) + " of " + std::to_string(cache.num_blocks));
    }
  }
}

std::vector<std::int32_t> gather_table_rows(const DecodeArgs& a) {
  const PagedCache& cache = *a.cache;
  const std::int64_t width = cache.block_table.dim(1);
  const std::int32_t* table = cache.block_table.data<std::int32_t>();
  std::vector<std::int32_t> out;
  out.reserve(a.block_table_rows.size() * static_cast<std::size_t>(width));
  for (const std::int32_t row : a.block_table_rows) out.insert(out.end(), table + row * width, table + (row + 1) * width);
  return out;
}

double run_decode(const DecodeArgs& a, cudaStream_t s, const PrepareFn& prepare) {
  gpu::require_device();
  validate_decode_args(a);
  gpu::GuardedDeviceOutput o(a.o_lat, "o_lat", s), lse(a.lse, "lse", s);
  std::unique_ptr<PreparedDecode> p = prepare(a, {o.data(), lse.as<float>()}, s);
  gpu::Event start, stop;
  start.record(s);
  p->launch(s);
  stop.record(s);
  MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));  // the kernels' execution errors surface here
  const double ms = stop.elapsed_since(start);
  gpu::check_guards_or_throw({&o, &lse}, s);
  o.download_to(a.o_lat, s);
  lse.download_to(a.lse, s);
  return ms;
}

std::unique_ptr<DecodeBench> make_decode_bench(const DecodeArgs& a, cudaStream_t s, const PrepareFn& prepare,
                                               std::string note) {
  gpu::require_device();
  validate_decode_args(a);
  gpu::DeviceBuffer o(a.o_lat.nbytes()), lse(a.lse.nbytes());
  std::unique_ptr<PreparedDecode> p = prepare(a, {o.data(), lse.as<float>()}, s);
  MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));  // preparation done before the first timed launch
  return std::make_unique<Bench>(std::move(o), std::move(lse), std::move(p), std::move(note));
}

}  // namespace mlagate::libs
