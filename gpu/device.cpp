// The GPU's device plumbing (gpu/device.h): checked calls, the device query,
// RAII buffers, streams and events, and guarded device outputs.
#include "gpu/device.h"

#include <cstdio>
#include <cstring>
#include <vector>

#include "cases/errors.h"
#include "cases/process_slot.h"
#include "gpu/sync_policy.h"

namespace mlagate {

std::string CudaDeviceInfo::str() const {
  if (!available) return error;
  char buf[256];
  std::snprintf(buf, sizeof buf, "device %d: %s, sm_%d%d, %d SMs, %.1f GiB (%.1f GiB free)", device, name.c_str(),
                sm_major, sm_minor, multiprocessors, total_bytes / 1073741824.0, free_bytes / 1073741824.0);
  return sync_policy.empty() ? std::string(buf) : std::string(buf) + "; " + sync_policy;
}

const CudaDeviceInfo& cuda_device_info() {
  static const CudaDeviceInfo info = [] {
    CudaDeviceInfo d;
    // Workers side by side start their CUDA a few at a time (cases/process_slot.h):
    // the driver serializes the start-ups (cuInit, the context) of a host's
    // processes, and all of them starting together had every worker wait for
    // the last (PERFORMANCE.md, "The workers' CUDA start-up"). Held to the
    // end of this initialisation; a stuck holder is waited for 10 s at most.
    const ProcessSlot slot = ProcessSlot::from_environment(std::chrono::seconds(10));
    // Before the first call that makes the context (cudaMemGetInfo below).
    d.sync_policy = apply_cuda_sync_policy();
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    d.count = e == cudaSuccess ? count : 0;
    if (e != cudaSuccess || count == 0) {
      cudaGetLastError();  // clear the runtime's last-error state so later checks start clean
      d.error = std::string("no CUDA device: ") + (e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
      return d;
    }
    cudaDeviceProp p{};
    if (cudaGetDevice(&d.device) != cudaSuccess || cudaGetDeviceProperties(&p, d.device) != cudaSuccess) {
      d.error = "no CUDA device: cannot query device properties";
      return d;
    }
    d.name = p.name;
    d.sm_major = p.major;
    d.sm_minor = p.minor;
    d.multiprocessors = p.multiProcessorCount;
    d.total_bytes = p.totalGlobalMem;
    if (cudaMemGetInfo(&d.free_bytes, &d.total_bytes) != cudaSuccess) {
      d.error = "no CUDA device: cudaMemGetInfo failed (no usable context)";
      return d;
    }
    // The kernels are built for sm_90a (CMAKE_CUDA_ARCHITECTURES); another device
    // would fail every launch with "no kernel image", so say so once, up front.
    if (p.major != 9 || p.minor != 0) {
      d.error = "no usable CUDA device: " + d.name + " is sm_" + std::to_string(p.major) + std::to_string(p.minor) +
                ", the kernels are built for sm_90a";
      return d;
    }
    d.available = true;
    return d;
  }();
  return info;
}

int cuda_visible_device_count(std::string& why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();  // leave no error behind for the next checked call
    why = std::string("no CUDA device: ") + (e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
    return 0;
  }
  return count;
}

std::uint64_t cuda_device_total_bytes(int ordinal) {
  int count = 0;
  cudaDeviceProp p{};
  if (cudaGetDeviceCount(&count) != cudaSuccess || ordinal < 0 || ordinal >= count ||
      cudaGetDeviceProperties(&p, ordinal) != cudaSuccess) {
    cudaGetLastError();  // leave no error behind for the next checked call
    return 0;
  }
  return p.totalGlobalMem;
}

namespace gpu {

void throw_cuda_error(cudaError_t e, const char* expr, const char* file, int line) {
  throw CudaError(std::string("CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ") in " + expr +
                  " at " + file + ":" + std::to_string(line));
}

void require_device() {
  const CudaDeviceInfo& d = cuda_device_info();
  if (!d.available) throw DeviceUnavailableError(d.error);
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  // cudaMalloc(0) may return null; keep a real (tiny) allocation so data() is valid.
  MLAGATE_CUDA_CHECK(cudaMalloc(&ptr_, bytes ? bytes : 16));
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);  // destructors do not throw; a failed free is reported by the next checked call
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const void* src, std::size_t bytes, cudaStream_t s, std::size_t offset) {
  if (offset + bytes > bytes_) throw std::out_of_range("DeviceBuffer::upload past the end");
  if (bytes) MLAGATE_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(ptr_) + offset, src, bytes, cudaMemcpyHostToDevice, s));
}

void DeviceBuffer::download(void* dst, std::size_t bytes, cudaStream_t s, std::size_t offset) const {
  if (offset + bytes > bytes_) throw std::out_of_range("DeviceBuffer::download past the end");
  if (bytes) {
    MLAGATE_CUDA_CHECK(cudaMemcpyAsync(dst, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost, s));
    MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));
  }
}

void DeviceBuffer::fill(unsigned char byte, cudaStream_t s) {
  if (bytes_) MLAGATE_CUDA_CHECK(cudaMemsetAsync(ptr_, byte, bytes_, s));
}

Stream::Stream() { MLAGATE_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
Stream::~Stream() {
  if (s_) cudaStreamDestroy(s_);
}
void Stream::sync() const { MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s_)); }

Event::Event() { MLAGATE_CUDA_CHECK(cudaEventCreate(&e_)); }
Event::~Event() {
  if (e_) cudaEventDestroy(e_);
}
void Event::record(cudaStream_t s) { MLAGATE_CUDA_CHECK(cudaEventRecord(e_, s)); }
void Event::synchronize() const { MLAGATE_CUDA_CHECK(cudaEventSynchronize(e_)); }
float Event::elapsed_since(const Event& start) const {
  MLAGATE_CUDA_CHECK(cudaEventSynchronize(e_));
  float ms = 0;
  MLAGATE_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
  return ms;
}

CapturedGraph::CapturedGraph(cudaStream_t s, const std::function<void()>& enqueue) {
  MLAGATE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  try {
    enqueue();
  } catch (...) {
    cudaGraph_t partial = nullptr;
    if (cudaStreamEndCapture(s, &partial) == cudaSuccess && partial) cudaGraphDestroy(partial);
    cudaGetLastError();  // an invalidated capture's error is this throw's, not a later launch's
    throw;
  }
  const cudaError_t end = cudaStreamEndCapture(s, &graph_);
  if (end != cudaSuccess) {
    cudaGetLastError();
    if (graph_) cudaGraphDestroy(graph_);
    graph_ = nullptr;
    throw CudaError(std::string("cudaStreamEndCapture: ") + cudaGetErrorString(end) +
                    " (the work captured must launch on the capturing stream only and never synchronize)");
  }
  try {
    MLAGATE_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  } catch (...) {
    reset();
    throw;
  }
}
CapturedGraph::~CapturedGraph() { reset(); }
CapturedGraph::CapturedGraph(CapturedGraph&& o) noexcept
    : graph_(std::exchange(o.graph_, nullptr)), exec_(std::exchange(o.exec_, nullptr)) {}
CapturedGraph& CapturedGraph::operator=(CapturedGraph&& o) noexcept {
  if (this != &o) {
    reset();
    graph_ = std::exchange(o.graph_, nullptr);
    exec_ = std::exchange(o.exec_, nullptr);
  }
  return *this;
}
void CapturedGraph::reset() noexcept {
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
  exec_ = nullptr;
  graph_ = nullptr;
}
void CapturedGraph::launch(cudaStream_t s) const {
  if (!exec_) throw std::logic_error("CapturedGraph::launch: nothing was captured");
  MLAGATE_CUDA_CHECK(cudaGraphLaunch(exec_, s));
}

GuardedDeviceOutput::GuardedDeviceOutput(const TensorView& host, std::string name, cudaStream_t s, Writes w)
    : buf_((w == Writes::kPacked ? host.nbytes() : host.span_bytes()) + 2 * kGuardBytes),
      bytes_(w == Writes::kPacked ? host.nbytes() : host.span_bytes()),
      writes_(w),
      name_(std::move(name)) {
  buf_.fill(kGuardByte, s);
  if (w == Writes::kPacked && !host.strides.empty()) {
    std::vector<std::byte> packed(bytes_);
    host.pack_into(packed.data());
    buf_.upload(packed.data(), bytes_, s, kGuardBytes);
    MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));  // `packed` dies here
  } else {
    buf_.upload(host.data, bytes_, s, kGuardBytes);
  }
}

std::string GuardedDeviceOutput::check_guards(cudaStream_t s) const {
  std::vector<unsigned char> g(2 * kGuardBytes);
  buf_.download(g.data(), kGuardBytes, s, 0);
  buf_.download(g.data() + kGuardBytes, kGuardBytes, s, kGuardBytes + bytes_);
  for (std::size_t i = 0; i < kGuardBytes; ++i)
    if (g[i] != kGuardByte)
      return "out-of-bounds write: " + std::to_string(kGuardBytes - i) + " byte(s) before " + name_ +
             " (device) were modified";
  for (std::size_t i = 0; i < kGuardBytes; ++i)
    if (g[kGuardBytes + i] != kGuardByte)
      return "out-of-bounds write: byte " + std::to_string(i) + " past the end of " + name_ + " (device) was modified";
  return {};
}

void GuardedDeviceOutput::download_to(const TensorView& host, cudaStream_t s) const {
  const bool packed = writes_ == Writes::kPacked;
  if ((packed ? host.nbytes() : host.span_bytes()) != bytes_)
    throw std::logic_error("GuardedDeviceOutput::download_to: size mismatch");
  if (packed && !host.strides.empty()) {
    std::vector<std::byte> tmp(bytes_);
    buf_.download(tmp.data(), bytes_, s, kGuardBytes);
    host.unpack_from(tmp.data());
    return;
  }
  buf_.download(host.data, bytes_, s, kGuardBytes);
}

DeviceBuffer upload_view(const TensorView& host, cudaStream_t s) {
  DeviceBuffer b(host.span_bytes());
  if (b.size()) b.upload(host.data, b.size(), s);
  return b;
}

DeviceBuffer upload_packed(const TensorView& host, cudaStream_t s) {
  DeviceBuffer b(host.nbytes());
  if (!b.size()) return b;
  if (host.strides.empty()) {
    b.upload(host.data, b.size(), s);
    return b;
  }
  std::vector<std::byte> packed(b.size());
  host.pack_into(packed.data());
  b.upload(packed.data(), b.size(), s);
  MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));  // `packed` dies here
  return b;
}

void check_guards_or_throw(std::initializer_list<const GuardedDeviceOutput*> outputs, cudaStream_t s) {
  for (const GuardedDeviceOutput* o : outputs) {
    const std::string v = o->check_guards(s);
    if (!v.empty()) throw OutOfBoundsWriteError(v);
  }
}

double finish_timed_call(const Event& start, Event& stop, cudaStream_t s, const GuardedDeviceOutput& o,
                         const TensorView& o_host, const GuardedDeviceOutput& lse, const TensorView& lse_host) {
  stop.record(s);
  MLAGATE_CUDA_CHECK(cudaStreamSynchronize(s));
  const double ms = stop.elapsed_since(start);
  check_guards_or_throw({&o, &lse}, s);
  o.download_to(o_host, s);
  lse.download_to(lse_host, s);
  return ms;
}

int max_dynamic_smem() {
  static const int v = [] {
    int dev = 0, bytes = 0;
    MLAGATE_CUDA_CHECK(cudaGetDevice(&dev));
    MLAGATE_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return bytes;
  }();
  return v;
}

int multiprocessor_count() { return cuda_device_info().multiprocessors; }

}  // namespace gpu
}  // namespace mlagate
