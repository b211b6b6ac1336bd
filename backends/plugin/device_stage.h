// Where a plugin's tensors live for one call. Host backends get the harness's
// own buffers (the harness guards them); CUDA backends get device copies of
// the inputs and guarded, poisoned device outputs that are checked and copied
// back when the call is finished.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "cases/tensor.h"
#include "mlagate/plugin.h"

namespace mlagate::plugin {

class DeviceStage {
 public:
  virtual ~DeviceStage() = default;
  // A read-only input of `bytes` bytes.
  virtual void* input(const void* host, std::size_t bytes) = 0;
  // A read-only input the plugin gets as a private copy (the sparse ops, ABI
  // 1.2): finish() compares it with `host` and throws WrongOutputError naming
  // `name` and the first changed element (of `elem_bytes` bytes) when the
  // plugin wrote into it. The harness's buffer is never exposed.
  virtual void* checked_input(const void* host, std::size_t bytes, std::size_t elem_bytes, const std::string& name) = 0;
  // An output (or an in/out tensor such as the cache of cache_write) that
  // finish() brings back into `host`.
  virtual void* output(const TensorView& host, const std::string& name) = 0;
  // The stream handed to the plugin (mlagate_args.stream).
  virtual void* stream() = 0;
  // After the plugin returned: synchronizes, checks device guard bands (throws
  // OutOfBoundsWriteError) and copies outputs back.
  virtual void finish() = 0;

  // Graph mode, persistent CUDA stages only (the defaults throw logic_error).
  // rewind(): the next call goes over the same buffers in the same order:
  // inputs uploaded into them in place (the same sizes), outputs left as the
  // last call left them (poisoned once, at their first use).
  virtual void rewind();
  // Records `launch` (the plugin's run()) into a CUDA graph by stream capture
  // on stream(); throws when the work cannot be captured.
  virtual void capture(const std::function<void()>& launch);
  // Launches the captured graph on stream() (finish() waits for it).
  virtual void replay();
};

// Throws DeviceUnavailableError (a SKIPPED record) when the device cannot be
// used: no GPU, or mlagate built without CUDA. `persistent`: a stage for graph
// mode (CUDA devices; host stages hand over the harness's buffers as they are).
std::unique_ptr<DeviceStage> make_device_stage(const DLDevice& device, bool persistent = false);

// What finish() says when a checked input changed ("" when `now` equals `was`).
std::string input_change(const std::string& name, const void* was, const void* now, std::size_t bytes,
                         std::size_t elem_bytes);

}  // namespace mlagate::plugin
