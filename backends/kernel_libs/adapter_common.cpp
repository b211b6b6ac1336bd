// The real-library adapters' shared flows: argument checks before any launch,
// decode with guarded outputs, and the bench handle.
#include "backends/kernel_libs/adapter_common.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "cases/errors.h"

namespace mlagate::libs {
namespace {

[[noreturn]] void bad_arg(const std::string& what) { throw std::invalid_argument("decode: " + what); }

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

class Graph final : public DecodeGraph {
 public:
  Graph(const DecodeArgs& a, cudaStream_t s, const PrepareFn& prepare, std::string note)
      : s_(s), o_(a.o_lat, "o_lat", s), lse_(a.lse, "lse", s), note_(std::move(note)) {
    p_ = prepare(a, {o_.data(), lse_.as<float>()}, s);
    if (!p_->refresh(a, s)) throw NotSupportedError("the adapter cannot refresh its inputs in place for a CUDA graph");
    p_->launch(s);  // warm-up: kernel attributes set, modules loaded
    MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));
    MLAGATE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    p_->launch(s);
    MLAGATE_CUDA_CHECK(cudaStreamEndCapture(s, &graph_));
    MLAGATE_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  ~Graph() override {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
  }
  void replay(const DecodeArgs& a) override {
    validate_decode_args(a);
    if (!p_->refresh(a, s_)) throw std::logic_error("decode graph: refresh failed after the capture");
    MLAGATE_CUDA_CHECK(cudaGraphLaunch(exec_, s_));
    MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s_));
    gpu::check_guards_or_throw({&o_, &lse_}, s_);
    o_.download_to(a.o_lat, s_);
    lse_.download_to(a.lse, s_);
  }
  std::string note() const override { return note_; }

 private:
  cudaStream_t s_;
  gpu::GuardedDeviceOutput o_, lse_;  // before p_: the prepared call points into them
  std::unique_ptr<PreparedDecode> p_;
  std::string note_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace

std::unique_ptr<DecodeGraph> make_decode_graph(const DecodeArgs& a, cudaStream_t s, const PrepareFn& prepare,
                                               std::string note) {
  gpu::require_device();
  validate_decode_args(a);
  for (const TensorView* v : {&a.q_lat, &a.q_pe, &a.o_lat, &a.lse})
    if (!v->strides.empty()) throw NotSupportedError("decode graph: strided views are not captured (contiguous layout only)");
  return std::make_unique<Graph>(a, s, prepare, std::move(note));
}

void validate_decode_args(const DecodeArgs& a) {
  check_decode_args(a);
  // The libraries' planners need at least one request.
  if (a.seq_lens.empty()) bad_arg("no requests");
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

std::vector<std::int32_t> gather_table_rows(const DecodeArgs& a, int width) {
  const PagedCache& cache = *a.cache;
  const std::int64_t w = cache.block_table.dim(1);
  if (width < w) throw std::invalid_argument("decode: a table narrower than the cache's");
  const std::int32_t* table = cache.block_table.data<std::int32_t>();
  std::vector<std::int32_t> out(a.block_table_rows.size() * static_cast<std::size_t>(width), 0);
  for (std::size_t b = 0; b < a.block_table_rows.size(); ++b)
    std::copy_n(table + a.block_table_rows[b] * w, w, out.begin() + static_cast<std::ptrdiff_t>(b) * width);
  return out;
}

double run_decode(const DecodeArgs& a, cudaStream_t s, const PrepareFn& prepare, OutputWrites w) {
  gpu::require_device();
  validate_decode_args(a);
  gpu::GuardedDeviceOutput o(a.o_lat, "o_lat", s, w.o), lse(a.lse, "lse", s, w.lse);
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

std::unique_ptr<DecodeBench> graph_bench(std::shared_ptr<void> call, cudaStream_t s, const std::function<void()>& enqueue,
                                         std::string note) {
  // The graph is declared after the call (destroyed before it): its kernels
  // point into the call's buffers.
  class Handle final : public DecodeBench {
   public:
    Handle(std::shared_ptr<void> call, gpu::CapturedGraph g, std::string note)
        : call_(std::move(call)), graph_(std::move(g)), note_(std::move(note)) {}
    void launch(void* cuda_stream) override { graph_.launch(static_cast<cudaStream_t>(cuda_stream)); }
    std::string note() const override { return note_; }

   private:
    std::shared_ptr<void> call_;
    gpu::CapturedGraph graph_;
    std::string note_;
  };
  enqueue();  // the warm-up: first-launch costs and any lazily made state outside the capture
  MLAGATE_CUDA_CHECK(cudaGetLastError());        // a launch the warm-up could not make (configuration)
  MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));  // its faults surface here, not in the bench's timing
  gpu::CapturedGraph g(s, enqueue);
  return std::make_unique<Handle>(std::move(call), std::move(g), std::move(note));
}

std::unique_ptr<DecodeBench> make_decode_bench(const DecodeArgs& a, cudaStream_t s, const PrepareFn& prepare,
                                               std::string note) {
  gpu::require_device();
  validate_decode_args(a);
  gpu::DeviceBuffer o(std::max(a.o_lat.nbytes(), a.o_lat.span_bytes())), lse(std::max(a.lse.nbytes(), a.lse.span_bytes()));
  std::unique_ptr<PreparedDecode> p = prepare(a, {o.data(), lse.as<float>()}, s);
  MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));  // preparation done before the first timed launch
  return std::make_unique<Bench>(std::move(o), std::move(lse), std::move(p), std::move(note));
}

}  // namespace mlagate::libs
