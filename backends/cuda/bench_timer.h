// GPU timing for `mlagate bench` (harness/bench/bench.cpp): one stream, CUDA events
// around one launch, an L2 flush before each launch outside the timed region,
// and the device's HBM peak. Free of CUDA headers (streams travel as void*);
// built only when MLAGATE_HAS_CUDA.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace mlagate {

struct GpuBenchInfo {
  std::string device;         // "NVIDIA H100 80GB HBM3"
  double hbm_peak_gbs = 0;    // 1e9 bytes/s: 2 (DDR) x memory clock x bus width / 8
  std::string peak_source;    // how the peak was obtained, for the table's footer
  std::size_t l2_bytes = 0;
  std::size_t flush_bytes = 0;  // what each flush overwrites
};

class GpuLaunchTimer {
 public:
  // Throws DeviceUnavailableError (cuda_device_info()'s reason) without a usable GPU.
  GpuLaunchTimer();
  ~GpuLaunchTimer();
  GpuLaunchTimer(const GpuLaunchTimer&) = delete;
  GpuLaunchTimer& operator=(const GpuLaunchTimer&) = delete;

  const GpuBenchInfo& info() const;
  void* stream() const;  // a cudaStream_t
  // Overwrites a buffer larger than L2 (cudaMemsetAsync), then records an event,
  // calls launch(stream), records another and waits: the milliseconds between
  // the two events. Errors of the launched kernels surface here as exceptions.
  double time_ms(const std::function<void(void*)>& launch);
  void synchronize();  // waits for the stream; throws on an execution error

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mlagate
