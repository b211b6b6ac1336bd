// Throughput of the fp64 reference reference against Eigen's own fp64 GEMM on
// this machine: the reference is GEMM-bound, so its GFLOP/s (useful math only)
// should be a large fraction of the plain GEMM's at the same thread count.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "cases/case.h"
#include "cases/suite.h"
#include "reference/fp64_reference.h"

namespace mlagate {
namespace {

using RowMat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Keys query token u of request i sees (fp64_reference.h): 0 .. c_i + u within the request.
std::int64_t visible(const Case& c, int i, int u) {
  return std::clamp<std::int64_t>(std::int64_t{c.context_lens[i]} + u + 1, 0, c.seq_lens[i]);
}

// 2*m*n*k of every GEMM the absorbed path needs; attention counts visible keys only.
double absorbed_flops(const Case& c) {
  const Dims& d = c.spec.dims;
  const double N = c.spec.num_heads(), T = c.num_tokens, L = d.kv_lora_rank, R = d.rope_dim;
  double f = 2 * T * N * d.nope_dim * L + 2 * T * N * L * d.v_head_dim;  // W_UK absorption, W_UV
  for (int i = 0; i < c.num_requests; ++i) {
    for (int u = 0; u < c.query_lens[i]; ++u) f += N * 2 * visible(c, i, u) * ((L + R) + L);  // QK^T, PV
  }
  return f;
}

double mha_flops(const Case& c) {
  const Dims& d = c.spec.dims;
  const double N = c.spec.num_heads(), L = d.kv_lora_rank, P = d.nope_dim, R = d.rope_dim, V = d.v_head_dim;
  double f = 0;
  for (int i = 0; i < c.num_requests; ++i) {
    f += N * 2.0 * c.seq_lens[i] * L * (P + V);  // up-projection of every key, per head
    for (int u = 0; u < c.query_lens[i]; ++u) f += N * 2 * visible(c, i, u) * ((P + R) + V);
  }
  return f;
}

void set_gflops(benchmark::State& state, double flops) {
  state.counters["GFLOP"] = flops * 1e-9;  // per iteration
  // Printed with an SI prefix: "FLOPS=40.1G/s".
  state.counters["FLOPS"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = omp_get_max_threads();
}

// Eigen's GEMM on row-major operands as the reference uses them: C = A B^T
// (the Q K^T shape: B stored [n, k]), threads = 0 means Eigen's default.
void bm_eigen_gemm(benchmark::State& state, int m, int n, int k, int threads) {
  RowMat a = RowMat::Random(m, k), b = RowMat::Random(n, k), c(m, n);
  const int saved = Eigen::nbThreads();
  if (threads > 0) Eigen::setNbThreads(threads);
  for (auto _ : state) {
    c.noalias() = a * b.transpose();
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  Eigen::setNbThreads(saved);
  set_gflops(state, 2.0 * m * n * k);
  state.counters["threads"] = threads > 0 ? threads : Eigen::nbThreads();
}

// Cases are generated once per (spec, tp), outside the timed loop.
const Case& bench_case(const std::string& spec, int tp) {
  static std::map<std::pair<std::string, int>, std::unique_ptr<Case>> cache;
  auto& slot = cache[{spec, tp}];
  if (!slot) {
    CaseSpec s;
    s.suite = "bench";
    s.batch = find_batch_spec(spec);
    s.tp = tp;
    slot = std::make_unique<Case>(generate_case(s));
  }
  return *slot;
}

void bm_reference(benchmark::State& state, const std::string& spec, int tp, bool mha) {
  const Case& c = bench_case(spec, tp);
  for (auto _ : state) {
    ReferenceOutputs g = mha ? reference_mha(c) : reference_absorbed(c);
    benchmark::DoNotOptimize(g.out.data());
  }
  set_gflops(state, mha ? mha_flops(c) : absorbed_flops(c));
}

void register_all() {
  struct GemmShape {
    int m, n, k;
    const char* what;
  };
  const GemmShape shapes[] = {
      {4096, 2048, 576, "prefill_QK^T"},  // a large_prefill row chunk's logits, whole request
      {128, 2048, 576, "decode_QK^T"},    // large_decode: one request's 128 heads
      {4096, 256, 512, "mha_up_proj"},    // reference_mha: [s, L] x [L, P+V]
      {1024, 1024, 1024, "square"},
  };
  for (const GemmShape& s : shapes) {
    for (int threads : {0, 1}) {
      const std::string name = "eigen_gemm/" + std::string(s.what) + "/" + std::to_string(s.m) + "x" +
                               std::to_string(s.n) + "x" + std::to_string(s.k) +
                               (threads == 1 ? "/threads:1" : "/threads:all");
      benchmark::RegisterBenchmark(name.c_str(), bm_eigen_gemm, s.m, s.n, s.k, threads)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  struct GoldenRun {
    const char* spec;
    int tp;
    bool mha;
  };
  const GoldenRun runs[] = {
      {"large_decode", 1, false},
      {"large_prefill", 1, false},
      {"large_prefill", 8, false},
      {"large_prefill", 8, true},
  };
  for (const GoldenRun& r : runs) {
    const std::string name =
        std::string(r.mha ? "reference_mha/" : "reference_absorbed/") + r.spec + "/tp" + std::to_string(r.tp);
    benchmark::RegisterBenchmark(name.c_str(), bm_reference, std::string(r.spec), r.tp, r.mha)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond)
        ->MinTime(2.0);
  }
}

}  // namespace
}  // namespace mlagate

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  mlagate::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
