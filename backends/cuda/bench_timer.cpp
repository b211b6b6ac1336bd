// GPU timing for `mlagate bench`: events, the L2 flush, the HBM peak.
#include "backends/cuda/bench_timer.h"

#include <algorithm>
#include <cstdio>

#include "cases/errors.h"
#include "gpu/device.h"

namespace mlagate {

struct GpuLaunchTimer::Impl {
  GpuBenchInfo info;
  gpu::Stream stream;
  gpu::Event start, stop;
  gpu::DeviceBuffer flush;
  unsigned char flush_byte = 0;
};

GpuLaunchTimer::GpuLaunchTimer() {
  const CudaDeviceInfo& dev = cuda_device_info();
  if (!dev.available) throw DeviceUnavailableError(dev.error);
  impl_ = std::make_unique<Impl>();
  GpuBenchInfo& in = impl_->info;
  in.device = dev.name;
  int clock_khz = 0, bus_bits = 0, l2 = 0;
  MLAGATE_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev.device));
  MLAGATE_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev.device));
  MLAGATE_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev.device));
  // HBM transfers twice per memory clock.
  in.hbm_peak_gbs = 2.0 * clock_khz * 1e3 * bus_bits / 8 / 1e9;
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "HBM peak %.0f GB/s = 2 x %d MHz x %d bit / 8 (cudaDevAttrMemoryClockRate, cudaDevAttrGlobalMemoryBusWidth)",
                in.hbm_peak_gbs, clock_khz / 1000, bus_bits);
  in.peak_source = buf;
  in.l2_bytes = static_cast<std::size_t>(l2);
  // Four times L2, at least 256 MiB: every line a launch could find in L2 is
  // evicted by writes of other addresses (what Triton's do_bench does too).
  in.flush_bytes = std::max<std::size_t>(4 * in.l2_bytes, std::size_t{256} << 20);
  impl_->flush = gpu::DeviceBuffer(in.flush_bytes);
}

GpuLaunchTimer::~GpuLaunchTimer() = default;

const GpuBenchInfo& GpuLaunchTimer::info() const { return impl_->info; }
void* GpuLaunchTimer::stream() const { return impl_->stream.get(); }

double GpuLaunchTimer::time_ms(const std::function<void(void*)>& launch) {
  Impl& m = *impl_;
  const cudaStream_t s = m.stream.get();
  m.flush_byte ^= 0x5A;  // a different value each time: no write can be elided
  MLAGATE_CUDA_CHECK(cudaMemsetAsync(m.flush.data(), m.flush_byte, m.flush.size(), s));
  m.start.record(s);
  launch(s);
  m.stop.record(s);
  m.stream.sync();
  return m.stop.elapsed_since(m.start);
}

void GpuLaunchTimer::synchronize() { impl_->stream.sync(); }

}  // namespace mlagate
