// What the real-library adapters (backends/flashmla, backends/flashinfer,
// backends/flash_attn) share: the argument checks made before anything is launched (a library's
// host code may call exit() and its kernels may trap on a bad block id, either
// of which would take every later record down with it), and the two flows
// around a prepared library call: decode() with poisoned, guarded outputs,
// and prepare_decode_bench() with outputs in buffers the handle owns.
// Internal: includes the CUDA runtime; compiled only when an adapter is enabled.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "gpu/device.h"

namespace mlagate::libs {

// check_decode_args (backends/backend.h), and at least one request: the
// libraries' planners take no empty batch. Throws std::invalid_argument or
// std::out_of_range (ERROR records), never launches anything.
void validate_decode_args(const DecodeArgs& a);

// A library decode made ready to run: inputs on the device, workspaces
// allocated, the library's plan or scheduler metadata computed. launch()
// enqueues only the library's kernels on the stream, without synchronizing.
class PreparedDecode {
 public:
  virtual ~PreparedDecode() = default;
  virtual void launch(cudaStream_t s) = 0;
  // (optional, --cuda-graph) Takes another batch of the prepared shapes in
  // place: its inputs copied into the buffers launch() reads (the cache into
  // one of the capacity first refreshed with) and the library's metadata
  // recomputed there, outside the graph, as vLLM's metadata builders do.
  // Throws std::invalid_argument for a batch of other shapes; false: the
  // adapter cannot refresh in place (it is not captured).
  virtual bool refresh(const DecodeArgs&, cudaStream_t) { return false; }
};

// Where the prepared call writes: o [T, N, L] model dtype, lse [T, N] fp32.
struct DeviceOutputs {
  void* o = nullptr;
  float* lse = nullptr;
};

// How an adapter's kernels write o and lse when the harness hands strided
// views (layout strided, Capabilities::strided_views): with the views' token
// and head strides (kAsViewed: the adapter passes a.o_lat's strides to the
// kernel), or row-major into a buffer of their own that is copied into the
// views (kPacked: what vLLM does for a kernel that allocates its output).
// Contiguous views are the same either way.
struct OutputWrites {
  gpu::GuardedDeviceOutput::Writes o = gpu::GuardedDeviceOutput::Writes::kAsViewed;
  gpu::GuardedDeviceOutput::Writes lse = gpu::GuardedDeviceOutput::Writes::kAsViewed;
};

using PrepareFn = std::function<std::unique_ptr<PreparedDecode>(const DecodeArgs&, const DeviceOutputs&, cudaStream_t)>;

// The whole decode(): device check, validation, outputs poisoned from the
// host views inside guard bands, prepare, launch timed with events, sync,
// guard check, copy back. Returns the launch's kernel milliseconds.
double run_decode(const DecodeArgs& a, cudaStream_t s, const PrepareFn& prepare, OutputWrites w = {});

// prepare_decode_bench(): the same preparation, outputs in device buffers the
// returned handle owns; note() is the handle's note.
std::unique_ptr<DecodeBench> make_decode_bench(const DecodeArgs& a, cudaStream_t s, const PrepareFn& prepare,
                                               std::string note);  // outputs of the views' span: either writes fit

// capture_decode(): the prepared call refreshed in place (PreparedDecode::
// refresh), a warm-up launch, then launch() captured in a CUDA graph; replays
// refresh and cudaGraphLaunch into persistent guarded outputs. Throws
// NotSupportedError when the prepared call cannot refresh in place, or for
// strided views (the serving modes run the contiguous layout only).
std::unique_ptr<DecodeGraph> make_decode_graph(const DecodeArgs& a, cudaStream_t s, const PrepareFn& prepare,
                                               std::string note);

// `mlagate bench` for a prepared call that owns its device buffers (`call`,
// kept alive by the handle): `enqueue` (the call's kernels on its stream `s`)
// is run once as a warm-up, then captured as a CUDA graph; the handle's
// launch() replays the graph on the timer's stream, so the timed region holds
// exactly the kernels one call enqueues. The sparse adapters use it: their
// calls launch on their own stream, with the stream in their kernels' params.
std::unique_ptr<DecodeBench> graph_bench(std::shared_ptr<void> call, cudaStream_t s, const std::function<void()>& enqueue,
                                         std::string note);

// The rows of the cache's block table the requests use, in request order, as
// a contiguous [B, width] int32 table (a library that takes a plain
// [B, max_blocks] table cannot be given mlagate's row indirection).
std::vector<std::int32_t> gather_table_rows(const DecodeArgs& a);
// The same rows, each padded with block 0 to `width` (>= the cache's table
// width): a captured graph's table keeps the width it was captured with.
std::vector<std::int32_t> gather_table_rows(const DecodeArgs& a, int width);

}  // namespace mlagate::libs
