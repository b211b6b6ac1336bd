// The up-projection's two paths (reference/detail/rowwise_gemm.h) on this
// machine's core, at the glue's TP 1 shape: 960 latent rows of depth 512
// times [W_UK | W_UV] (32768 columns), one thread. Which one a process takes
// is measured on first use (pair_path_preferred); this shows both rates, and
// the choice, for PERFORMANCE.md. Builds without AVX512_BF16 have the fma
// path only.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "cases/encoding.h"
#include "reference/detail/rowwise_gemm.h"

namespace mlagate {
namespace {

using detail::GemmIndex;
constexpr GemmIndex kRows = 960, kDepth = 512, kCols = 32768;

float to_bf16_value(float x) { return bf16_to_f32(f32_to_bf16(x)); }  // a value both paths take

struct Operands {
  std::vector<float> a, a_fma;
  std::unique_ptr<detail::PackedPanels> b;
  Operands() : a(static_cast<std::size_t>(kRows * kDepth)) {
    std::mt19937 g(1);
    std::normal_distribution<float> n;
    for (float& x : a) x = to_bf16_value(n(g));
    std::vector<float> w(static_cast<std::size_t>(kDepth * kCols));
    for (float& x : w) x = to_bf16_value(n(g) * 0.04f);
    b = std::make_unique<detail::PackedPanels>(
        kDepth, kCols, [&](GemmIndex k, float* dst) { std::copy_n(w.data() + k * kCols, kCols, dst); }, true);
    // One value a row that is not bf16: every block takes the fma path.
    a_fma = a;
    for (GemmIndex r = 0; r < kRows; ++r) a_fma[static_cast<std::size_t>(r * kDepth)] = 1.f + 1.f / 1024;
  }
};

const Operands& operands() {
  static const Operands o;
  return o;
}

void run(benchmark::State& state, bool pairs) {
  const Operands& o = operands();
  if (pairs && !o.b->has_pairs()) {
    state.SkipWithError("this build has no VDPBF16PS path (AVX512_BF16 not targeted)");
    return;
  }
  float keep = 0;
  for (auto _ : state) {
    detail::rowwise_gemm((pairs ? o.a : o.a_fma).data(), kRows, kDepth, *o.b,
                         [&](GemmIndex, GemmIndex nr, GemmIndex, GemmIndex nc, const float* t) {
                           keep += t[0] + t[(nr - 1) * detail::kPanelCols + nc - 1];
                         });
    benchmark::DoNotOptimize(keep);
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * kRows * kDepth * kCols, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
  state.SetLabel(detail::pair_path_preferred() ? "this process chose pairs" : "this process chose fma");
}

void BM_RowwiseFma(benchmark::State& state) { run(state, false); }
void BM_RowwisePairs(benchmark::State& state) { run(state, true); }
BENCHMARK(BM_RowwiseFma)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RowwisePairs)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace mlagate

BENCHMARK_MAIN();
