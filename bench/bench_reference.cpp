// Throughput of the fp64 reference against Eigen's own fp64 GEMM on this
// machine: the reference is GEMM-bound, so its GFLOP/s (useful math only)
// should be a large fraction of the plain GEMM's at the same thread count.
// The chain GEMM it computes in, beside Eigen's on the same shapes. And the
// baseline emulation's forms (sdpa_emulation.h) on the same cases.
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
#include "reference/detail/chain_gemm.h"
#include "reference/fp64_reference.h"
#include "reference/kv_projection.h"
#include "reference/sdpa_emulation.h"

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

// Eigen's GEMM on row-major operands as the reference used them: C = A B^T
// (the Q K^T shape: B stored [n, k]) or C = A B (P V: B stored [k, n]),
// threads = 0 means Eigen's default.
void bm_eigen_gemm(benchmark::State& state, int m, int n, int k, bool bt, int threads) {
  RowMat a = RowMat::Random(m, k), b = bt ? RowMat::Random(n, k) : RowMat::Random(k, n), c(m, n);
  const int saved = Eigen::nbThreads();
  if (threads > 0) Eigen::setNbThreads(threads);
  for (auto _ : state) {
    if (bt)
      c.noalias() = a * b.transpose();
    else
      c.noalias() = a * b;
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  Eigen::setNbThreads(saved);
  set_gflops(state, 2.0 * m * n * k);
  state.counters["threads"] = threads > 0 ? threads : Eigen::nbThreads();
}

// The chain GEMM the reference computes in (reference/detail/chain_gemm.h),
// one thread, the same operands: its rate against Eigen's threads:1 row.
void bm_chain_gemm(benchmark::State& state, int m, int n, int k, bool bt) {
  RowMat a = RowMat::Random(m, k), b = bt ? RowMat::Random(n, k) : RowMat::Random(k, n), c(m, n);
  for (auto _ : state) {
    detail::chain_gemm(m, n, k, a.data(), k, b.data(), bt ? k : n,
                       bt ? detail::ChainB::kTransposed : detail::ChainB::kRowMajor, c.data(), n);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_gflops(state, 2.0 * m * n * k);
  state.counters["threads"] = 1;
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

// The emulation's attention flops: Q K^T and P V over visible keys, with the
// decode form's [L+R | L] widths or the prefill form's [P+R | V].
double emulation_flops(const Case& c, bool prefill) {
  const Dims& d = c.spec.dims;
  const double N = c.spec.num_heads();
  const double w = prefill ? (d.nope_dim + d.rope_dim) + d.v_head_dim : (d.kv_lora_rank + d.rope_dim) + d.kv_lora_rank;
  double f = 0;
  for (int i = 0; i < c.num_requests; ++i)
    for (int u = 0; u < c.query_lens[i]; ++u) f += N * 2 * visible(c, i, u) * w;
  return f;
}

// One form of the emulation over every request (the prefill form's K and V
// projected once, outside the timed loop, as the layer memo holds them).
void bm_emulation(benchmark::State& state, const std::string& spec, int tp, bool prefill) {
  const Case& c = bench_case(spec, tp);
  std::vector<int> requests(static_cast<std::size_t>(c.num_requests));
  for (int i = 0; i < c.num_requests; ++i) requests[static_cast<std::size_t>(i)] = i;
  KvProjection projection(c);
  if (prefill) projection.ensure(requests);
  for (auto _ : state) {
    SdpaResult e = emulate_sdpa_layer(c, prefill ? SdpaForm::kPrefill : SdpaForm::kDecode, requests, &projection);
    benchmark::DoNotOptimize(e.out.data());
  }
  set_gflops(state, emulation_flops(c, prefill));
}

void register_all() {
  struct GemmShape {
    int m, n, k;
    bool bt;  // B stored [n, k] (A B^T)
    const char* what;
  };
  const GemmShape shapes[] = {
      {4096, 2048, 576, true, "prefill_QK^T"},  // a large_prefill row chunk's logits, whole request
      {128, 2048, 576, true, "decode_QK^T"},    // large_decode: one request's 128 heads
      {64, 32768, 576, true, "long_QK^T"},      // a 64-row chunk of a 32768-key request
      {64, 512, 32768, false, "long_PV"},       // its P kv_c
      {4096, 256, 512, false, "mha_up_proj"},   // reference_mha: [s, L] x [L, P+V]
      {1024, 1024, 1024, true, "square"},
  };
  for (const GemmShape& s : shapes) {
    const std::string shape = std::string(s.what) + "/" + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
                              std::to_string(s.k);
    for (int threads : {0, 1}) {
      const std::string name = "eigen_gemm/" + shape + (threads == 1 ? "/threads:1" : "/threads:all");
      benchmark::RegisterBenchmark(name.c_str(), bm_eigen_gemm, s.m, s.n, s.k, s.bt, threads)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
    benchmark::RegisterBenchmark(("chain_gemm/" + shape + "/threads:1").c_str(), bm_chain_gemm, s.m, s.n, s.k, s.bt)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
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
  struct EmulationRun {
    const char* spec;
    int tp;
    bool prefill;
  };
  const EmulationRun emulations[] = {
      {"large_decode", 1, false}, {"large_prefill", 1, true}, {"large_prefill", 8, true}, {"large_prefill", 1, false},
  };
  for (const EmulationRun& r : emulations) {
    const std::string name = std::string("emulation/") + (r.prefill ? "prefill_form/" : "decode_form/") + r.spec +
                             "/tp" + std::to_string(r.tp);
    benchmark::RegisterBenchmark(name.c_str(), bm_emulation, std::string(r.spec), r.tp, r.prefill)
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
