// What every op ends with: guard bands checked, outputs handed back, and the
// print that tells whether a backend wrote into inputs it was lent.
#include "harness/run/ops/op_run.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

namespace mlagate {

// Four independent multiply-xor lanes per block of words, blocks in parallel,
// each block's lanes mixed with its index so that moved data changes the
// print too.
std::uint64_t fingerprint(const Tensor& t) { return fingerprint(t.bytes(), t.nbytes()); }

std::uint64_t fingerprint(const void* data, std::size_t nbytes) {
  const auto* p = static_cast<const std::byte*>(data);
  const std::int64_t words = static_cast<std::int64_t>(nbytes / 8);
  constexpr std::int64_t kBlock = 1 << 16;
  const std::int64_t blocks = (words + kBlock - 1) / kBlock;
  const auto mix = [](std::uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
  };
  std::uint64_t print = mix(nbytes);
#pragma omp parallel for schedule(static) reduction(^ : print)
  for (std::int64_t b = 0; b < blocks; ++b) {
    std::uint64_t h[4] = {1, 2, 3, 4};
    const std::int64_t end = std::min(words, (b + 1) * kBlock);
    std::int64_t i = b * kBlock;
    for (; i + 4 <= end; i += 4)
      for (int l = 0; l < 4; ++l) {
        std::uint64_t w;
        std::memcpy(&w, p + (i + l) * 8, 8);
        h[l] = (h[l] ^ w) * 0x100000001b3ull;
      }
    for (; i < end; ++i) {
      std::uint64_t w;
      std::memcpy(&w, p + i * 8, 8);
      h[0] = (h[0] ^ w) * 0x100000001b3ull;
    }
    print ^= mix(mix(h[0]) ^ mix(h[1] + 1) ^ mix(h[2] + 2) ^ mix(h[3] + 3) ^ mix(static_cast<std::uint64_t>(b) + 0x9e3779b97f4a7c15ull));
  }
  for (std::size_t i = static_cast<std::size_t>(words) * 8; i < nbytes; ++i)  // the tail bytes
    print = mix(print ^ static_cast<std::uint64_t>(p[i]));
  return print;
}

void note_guard(OpRun& run, const GuardedBuffer& buf, const std::string& name) {
  if (run.guard_violation.empty()) run.guard_violation = buf.check_guards(name);
}

void finish_kernel_op(OpRun& run, ProducedOutput& out, ProducedOutput& lse, int num_requests, const char* path) {
  note_guard(run, out.buf, out.name);
  note_guard(run, lse.buf, lse.name);
  for (int i = 0; i < num_requests; ++i) run.paths.push_back(path);
  run.outputs.push_back(std::move(out));
  run.outputs.push_back(std::move(lse));
}

std::string lse_base_hint(const TensorView& got, const std::vector<double>& reference) {
  // The mean abs deviation of got and of got * ln 2 from the reference, over rows where both are finite.
  double dev_e = 0, dev_2 = 0;
  std::int64_t n = 0;
  const std::int64_t total = std::min<std::int64_t>(got.numel(), static_cast<std::int64_t>(reference.size()));
  for (std::int64_t i = 0; i < total; ++i) {
    const double g = got.get(i), y = reference[static_cast<std::size_t>(i)];
    if (!std::isfinite(g) || !std::isfinite(y) || std::abs(y) < 0.5) continue;  // near 0 both bases agree
    dev_e += std::abs(g - y);
    dev_2 += std::abs(g * std::log(2.0) - y);
    ++n;
  }
  if (n == 0 || !(dev_2 * 10 < dev_e)) return {};
  std::ostringstream m;
  m.precision(3);
  m << "the lse is base 2 (log2): lse x ln 2 matches the natural-log reference (mean abs dev " << dev_2 / n
    << " against " << dev_e / n << " as given)";
  return m.str();
}

}  // namespace mlagate
