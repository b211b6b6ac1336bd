// Which path the row-wise GEMM gives bf16 operands in this process
// (rowwise_gemm.h, pair_path_preferred): the variable's choice, else the
// faster of the two on a small GEMM of the glue's depth, timed once.
#include "reference/detail/rowwise_gemm.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace mlagate::detail {

std::optional<bool> rowwise_pairs_of(const char* value) {
  if (value == nullptr) return std::nullopt;
  if (std::strcmp(value, "pairs") == 0) return true;
  if (std::strcmp(value, "fma") == 0) return false;
  return std::nullopt;
}

namespace {

// Seconds of one rowwise_gemm over a [rows, depth] x `b`, the sink reading
// every tile's corners so that nothing is optimized away.
double seconds_of(const std::vector<float>& a, GemmIndex rows, const PackedPanels& b, float& keep) {
  const auto t0 = std::chrono::steady_clock::now();
  rowwise_gemm(a.data(), rows, b.depth(), b, [&](GemmIndex, GemmIndex nr, GemmIndex, GemmIndex nc, const float* t) {
    keep += t[0] + t[(nr - 1) * kPanelCols + nc - 1];
  });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Both paths on one block of rows, alternately, 3 times each: whether the
// pairs' best time beats the fma path's. 32 panels, the fewest a projection
// has (8 heads of 256 columns): the pair path packs a block's rows once for
// all panels, and with 4 panels that packing alone made it the slower on a
// Zen 5 core where it runs the glue at twice the rate. Depth 128, a quarter
// of the latent rank: the kernels' rate per step is the same, and the panels
// (1.5 MB) cost less to make, which is most of the measurement's time on a
// machine slow to give a process new memory. 50 MFLOP a run.
bool pairs_measured_faster() {
  constexpr GemmIndex rows = kGemmBlockRows, depth = 128, cols = 32 * kPanelCols;
  // Integers over 64: exact bf16 values (7 significant bits), all pair-safe.
  const auto value = [](std::size_t i) { return static_cast<float>(static_cast<int>(i * 37 % 255) - 127) / 64.f; };
  std::vector<float> a(static_cast<std::size_t>(rows * depth)), b(static_cast<std::size_t>(depth * cols));
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = value(i);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = value(i * 7 + 3);
  const PackedPanels panels(depth, cols, [&](GemmIndex k, float* dst) { std::copy_n(b.data() + k * cols, cols, dst); },
                            true);
  if (!panels.has_pairs()) return false;
  // The same rows but the first value not a bf16 one: the block takes the fma path.
  std::vector<float> a_fma = a;
  a_fma[0] = 1.f + 1.f / 1024;
  float keep = 0;
  double best_pairs = std::numeric_limits<double>::infinity(), best_fma = best_pairs;
  for (int rep = 0; rep < 3; ++rep) {
    best_pairs = std::min(best_pairs, seconds_of(a, rows, panels, keep));
    best_fma = std::min(best_fma, seconds_of(a_fma, rows, panels, keep));
  }
  volatile float sink = keep;  // the results are used
  (void)sink;
  return best_pairs < best_fma;
}

}  // namespace

bool pair_path_preferred() {
  if constexpr (!kBf16PairPath) {
    return false;
  } else {
    static const bool chosen = [] {
      const char* v = std::getenv(kRowwisePathVariable);
      if (const std::optional<bool> set = rowwise_pairs_of(v)) return *set;
      if (v != nullptr && *v != '\0')
        std::fprintf(stderr, "mlagate: %s=%s is neither pairs nor fma; measuring which is faster\n",
                     kRowwisePathVariable, v);
      return pairs_measured_faster();
    }();
    return chosen;
  }
}

}  // namespace mlagate::detail
