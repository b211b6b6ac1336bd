// The device plumbing of everything that runs on the GPU (the CUDA backends,
// the GPU reference, the plugin and kernel-library stages), internal: it
// includes the CUDA runtime.
// Every CUDA call is checked and throws CudaError with the call, file and line;
// device memory, streams and events are RAII; outputs live in guarded device
// buffers whose payload starts as the harness's poison and whose guard bands
// are checked after the kernels run.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

#include "cases/errors.h"  // DeviceUnavailableError, OutOfBoundsWriteError thrown here
#include "cases/tensor.h"
#include "gpu/device_info.h"

namespace mlagate::gpu {

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_cuda_error(cudaError_t e, const char* expr, const char* file, int line);

// Throws DeviceUnavailableError (a SKIPPED record) when the process has no GPU.
void require_device();

}  // namespace mlagate::gpu

#define MLAGATE_CUDA_CHECK(expr)                                                      \
  do {                                                                                \
    const cudaError_t mlagate_cuda_err_ = (expr);                                     \
    if (mlagate_cuda_err_ != cudaSuccess)                                             \
      ::mlagate::gpu::throw_cuda_error(mlagate_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a launch: configuration errors show now, execution errors at the next sync.
#define MLAGATE_CUDA_CHECK_LAUNCH() MLAGATE_CUDA_CHECK(cudaGetLastError())

namespace mlagate::gpu {

// Owns cudaMalloc'ed memory. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t size() const { return bytes_; }
  // Copies (ordered on the stream; pageable host memory makes them synchronous).
  void upload(const void* src, std::size_t bytes, cudaStream_t s, std::size_t offset = 0);
  void download(void* dst, std::size_t bytes, cudaStream_t s, std::size_t offset = 0) const;
  // Byte fill (0xFF gives NaN in every float type: the workspace poison).
  void fill(unsigned char byte, cudaStream_t s);

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// cudaMallocHost'ed (pinned) host memory: copies from and to it run at the
// link's full rate and asynchronously. Move-only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes) : bytes_(bytes) { MLAGATE_CUDA_CHECK(cudaMallocHost(&ptr_, bytes ? bytes : 16)); }
  ~PinnedBuffer() {
    if (ptr_) cudaFreeHost(ptr_);
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_) cudaFreeHost(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// A device buffer holding a copy of host data (uploaded on construction).
template <class T>
DeviceBuffer upload_array(const T* src, std::size_t n, cudaStream_t s) {
  DeviceBuffer b(n * sizeof(T));
  if (n) b.upload(src, n * sizeof(T), s);
  return b;
}

class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void sync() const;

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(cudaStream_t s);
  void synchronize() const;  // waits until the work recorded before it is done
  // Milliseconds from `start` to this event (both recorded, this one completed).
  float elapsed_since(const Event& start) const;

 private:
  cudaEvent_t e_ = nullptr;
};

// The work `enqueue` puts on stream `s`, captured as a CUDA graph (relaxed
// capture mode, as a serving engine captures its decode) and instantiated;
// launch() replays it on any stream. Owns both the graph and its executable.
// The buffers the captured kernels use belong to the caller and must outlive
// it. A throw from `enqueue` ends the capture before it propagates, so the
// stream is never left capturing.
class CapturedGraph {
 public:
  CapturedGraph() = default;
  CapturedGraph(cudaStream_t s, const std::function<void()>& enqueue);
  ~CapturedGraph();
  CapturedGraph(CapturedGraph&& o) noexcept;
  CapturedGraph& operator=(CapturedGraph&& o) noexcept;
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  void launch(cudaStream_t s) const;  // std::logic_error when nothing was captured
  explicit operator bool() const { return exec_ != nullptr; }

 private:
  void reset() noexcept;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// A kernel output on the device: [guard | payload | guard]. The payload starts
// as a copy of the host view (which the harness filled with its poison, so an
// element the kernel never writes comes back as poison); the guards hold a
// pattern that must survive the kernels.
class GuardedDeviceOutput {
 public:
  static constexpr std::size_t kGuardBytes = 256;
  static constexpr unsigned char kGuardByte = 0xA5;
  // How the kernel writes the output. kAsViewed: with the host view's strides,
  // into a device copy of the view's whole span (a strided view's padding
  // included, so a write into it comes back to the host, where the harness
  // checks it). kPacked: row-major into a buffer of its own, copied back into
  // the view's elements only (an adapter's output.copy_(o), as vLLM does for
  // kernels that allocate their output).
  enum class Writes { kAsViewed, kPacked };

  GuardedDeviceOutput(const TensorView& host, std::string name, cudaStream_t s, Writes w = Writes::kAsViewed);
  void* data() const { return static_cast<unsigned char*>(buf_.data()) + kGuardBytes; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data());
  }
  std::size_t bytes() const { return bytes_; }
  // Empty when both guards are intact, else "out-of-bounds write: ..." (synchronizes s).
  std::string check_guards(cudaStream_t s) const;
  void download_to(const TensorView& host, cudaStream_t s) const;

 private:
  DeviceBuffer buf_;
  std::size_t bytes_ = 0;
  Writes writes_ = Writes::kAsViewed;
  std::string name_;
};

// A device copy of a host input view. upload_view: the view's whole span, so
// the kernel reads it with the view's strides from the returned buffer's
// start; upload_packed: its elements row-major (an adapter's .contiguous()).
DeviceBuffer upload_view(const TensorView& host, cudaStream_t s);
DeviceBuffer upload_packed(const TensorView& host, cudaStream_t s);

// Throws OutOfBoundsWriteError with the first violated guard among the outputs.
void check_guards_or_throw(std::initializer_list<const GuardedDeviceOutput*> outputs, cudaStream_t s);

// The end of a timed call of kernels with an output and its lse: `stop`
// recorded, the stream synchronized (the kernels' execution errors surface
// here), the milliseconds since `start` returned; then both outputs' guards
// checked (OutOfBoundsWriteError) and their payloads downloaded.
double finish_timed_call(const Event& start, Event& stop, cudaStream_t s, const GuardedDeviceOutput& o,
                         const TensorView& o_host, const GuardedDeviceOutput& lse, const TensorView& lse_host);

// Largest dynamic shared memory one block may use on the device.
int max_dynamic_smem();
int multiprocessor_count();

}  // namespace mlagate::gpu
