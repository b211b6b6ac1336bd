// The case inputs' normals drawn on the GPU (cuda_draw_normals, a
// NormalDrawer of cases/case.h), with the CPU generator's bits.
//
// Why the bits are the CPU's: cases/generator.cpp's normal_at is integer
// hashing (splitmix64, the same uint64 arithmetic here) and IEEE double
// +, -, *, / and sqrt, which the host code performs one at a time as written
// (built with -ffp-contract=off). Here each of those steps is the explicit
// round-to-nearest intrinsic (__dadd_rn, __dmul_rn, __ddiv_rn, __dsqrt_rn),
// so nvcc can neither fuse nor reorder them; the rounding to 16 bits is
// cases/encoding.h's integer code compiled for the device. The first call of
// a process draws a sample on both and compares every bit: a GPU that
// disagrees is never used (the CPU draws instead, with a warning).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <vector>

#include "cases/encoding.h"
#include "cases/generator.h"
#include "gpu/device.h"
#include "reference/cuda/cuda_reference.h"

namespace mlagate {
namespace {

__device__ __forceinline__ std::uint64_t dev_mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ double dev_to_unit(std::uint64_t b) {
  return __dmul_rn(__dadd_rn(__ull2double_rn(b >> 11), 0.5), 0x1.0p-53);  // b >> 11 < 2^53: exact
}

// gen::det_log, step for step.
__device__ double dev_det_log(double x) {
  std::uint64_t u = static_cast<std::uint64_t>(__double_as_longlong(x));
  int e = static_cast<int>((u >> 52) & 0x7FF);
  if (e == 0) {
    u = static_cast<std::uint64_t>(__double_as_longlong(__dmul_rn(x, 0x1.0p54)));
    e = static_cast<int>((u >> 52) & 0x7FF) - 54;
  }
  e -= 1023;
  double m = __longlong_as_double(static_cast<long long>((u & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull));
  if (m > 1.4142135623730951) {
    m = __dmul_rn(m, 0.5);
    ++e;
  }
  const double z = __ddiv_rn(__dsub_rn(m, 1.0), __dadd_rn(m, 1.0));
  const double z2 = __dmul_rn(z, z);
  double s = __ddiv_rn(1.0, 23.0);
  for (int k = 21; k >= 1; k -= 2) s = __dadd_rn(__dmul_rn(s, z2), __ddiv_rn(1.0, static_cast<double>(k)));
  const double log_m = __dmul_rn(__dmul_rn(2.0, z), s);
  constexpr double kLn2Hi = 0x1.62e42fefa3800p-1;
  constexpr double kLn2Lo = 0x1.ef35793c76730p-45;
  const double ed = static_cast<double>(e);  // exact
  return __dadd_rn(__dmul_rn(ed, kLn2Hi), __dadd_rn(log_m, __dmul_rn(ed, kLn2Lo)));
}

// gen::normal_at, step for step.
__device__ double dev_normal_at(std::uint64_t st, std::uint64_t index) {
  const std::uint64_t h = dev_mix64(st ^ index);
  for (std::uint64_t k = 0; k < 64; ++k) {
    const double a = __dsub_rn(__dmul_rn(2.0, dev_to_unit(dev_mix64(h ^ ((2 * k) * 0xD6E8FEB86659FD93ull)))), 1.0);
    const double b = __dsub_rn(__dmul_rn(2.0, dev_to_unit(dev_mix64(h ^ ((2 * k + 1) * 0xD6E8FEB86659FD93ull)))), 1.0);
    const double s = __dadd_rn(__dmul_rn(a, a), __dmul_rn(b, b));
    if (s > 0.0 && s < 1.0) return __dmul_rn(a, __dsqrt_rn(__ddiv_rn(__dmul_rn(-2.0, dev_det_log(s)), s)));
  }
  return 0.0;
}

// out[i] for element first + i, i < n.
__global__ void draw_normals_kernel(std::uint64_t st, long long first, long long n, double factor, bool bf16,
                                    std::uint16_t* out) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    // fill_normal's static_cast<float>(v * factor): a double product, then fp32 round to nearest.
    const float f =
        __double2float_rn(__dmul_rn(dev_normal_at(st, static_cast<std::uint64_t>(first + i)), factor));
    const std::uint32_t u = __float_as_uint(f);
    out[i] = bf16 ? f32_bits_to_bf16(u) : f32_bits_to_f16(u);
  }
}

// What stays between calls: the stream and a chunk's output buffer (a tensor
// goes in chunks of at most kChunk elements, so the device memory it takes
// stays within 32 MiB beside the cases' own estimates, however large the
// tensor). One tensor at a time: callers on several threads (a worker's
// jobs and the cases it makes ahead) take turns.
constexpr std::int64_t kChunk = std::int64_t{1} << 24;

struct Drawer {
  std::mutex mutex;
  enum class State { kUnchecked, kAgrees, kOff } state = State::kUnchecked;
  std::optional<gpu::Stream> stream;
  gpu::DeviceBuffer out;

  void draw(std::uint64_t st, std::int64_t n, double factor, bool bf16, std::uint16_t* host) {
    if (!stream) stream.emplace();
    const std::size_t most = static_cast<std::size_t>(std::min(n, kChunk)) * 2;
    if (out.size() < most) out = gpu::DeviceBuffer(most);
    for (std::int64_t first = 0; first < n; first += kChunk) {
      const std::int64_t m = std::min(kChunk, n - first);
      const int threads = 256;
      const long long blocks = std::min<long long>((m + threads - 1) / threads, 65536);
      draw_normals_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream->get()>>>(st, first, m, factor, bf16,
                                                                                        out.as<std::uint16_t>());
      MLAGATE_CUDA_CHECK_LAUNCH();
      out.download(host + first, static_cast<std::size_t>(m) * 2, stream->get());  // pageable: synchronous
    }
    stream->sync();
  }

  // A sample of each kind against gen::normal_at on the host, every bit.
  bool agrees() {
    const std::int64_t n = 5003;  // several blocks, a partial one
    std::vector<std::uint16_t> got(static_cast<std::size_t>(n));
    for (const std::uint64_t st : {gen::stream(0, gen::tensor_key("kv_c")), gen::stream(2082650989, gen::tensor_key("q"))})
      for (const double factor : {1.0, 0.044194173824159216, 8.0})
        for (const bool bf16 : {true, false}) {
          draw(st, n, factor, bf16, got.data());
          for (std::int64_t i = 0; i < n; ++i) {
            const float f = static_cast<float>(gen::normal_at(st, static_cast<std::uint64_t>(i)) * factor);
            const std::uint16_t want = bf16 ? f32_to_bf16(f) : f32_to_f16(f);
            if (got[static_cast<std::size_t>(i)] != want) {
              std::fprintf(stderr,
                           "mlagate: warning: the GPU's normals differ from the CPU generator's (element %lld: %04x, "
                           "want %04x); the case inputs are drawn on the CPU\n",
                           static_cast<long long>(i), got[static_cast<std::size_t>(i)], want);
              return false;
            }
          }
        }
    return true;
  }
};

Drawer& drawer() {
  static Drawer d;  // its buffers are freed by cuda_release_normal_drawer, before CUDA's teardown
  return d;
}

}  // namespace

bool cuda_draw_normals(std::uint64_t stream, std::int64_t n, double factor, bool bf16, std::uint16_t* out) {
  Drawer& d = drawer();
  const std::lock_guard lock(d.mutex);
  if (d.state == Drawer::State::kOff || n <= 0) return false;
  try {
    if (d.state == Drawer::State::kUnchecked) {
      d.state = d.agrees() ? Drawer::State::kAgrees : Drawer::State::kOff;
      if (d.state == Drawer::State::kOff) return false;
    }
    d.draw(stream, n, factor, bf16, out);
    return true;
  } catch (const std::exception& e) {
    // No device, or a CUDA error: the CPU draws, now and from here on.
    if (d.state == Drawer::State::kAgrees)
      std::fprintf(stderr, "mlagate: warning: drawing case inputs on the GPU failed (%s); the CPU draws them\n",
                   e.what());
    d.state = Drawer::State::kOff;
    return false;
  }
}

bool cuda_normal_drawer_agrees() {
  Drawer& d = drawer();
  const std::lock_guard lock(d.mutex);
  return d.agrees();
}

void cuda_release_normal_drawer() {
  Drawer& d = drawer();
  const std::lock_guard lock(d.mutex);
  d.out = gpu::DeviceBuffer();
  d.stream.reset();
}

}  // namespace mlagate
