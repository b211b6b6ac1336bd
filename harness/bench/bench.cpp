// `mlagate bench`: the case sets, the ideal-work accounting, the Google
// Benchmark loop around CUDA-event timings, and the table and JSON output.
#include "harness/bench/bench.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>

#include "backends/registry.h"
#include "cases/case.h"
#include "cases/errors.h"
#include "cases/fp8.h"
#include "cases/paged_cache.h"
#include "cases/sparse.h"
#include "harness/run/ops/sparse/sparse_op.h"
#include "cases/suite.h"
#include "reference/glue.h"
#include "reference/sparse_reference.h"
#include "mlagate/config.h"
#include "mlagate/version.h"
#if MLAGATE_HAS_CUDA
#include "backends/cuda/bench_timer.h"
#endif
#if MLAGATE_HAS_BENCHMARK
#include <benchmark/benchmark.h>
#endif

namespace mlagate {

namespace {

BatchSpec uniform_batch(const std::string& name, int batch, int seq_len, int query_len, bool spec_decode) {
  BatchSpec b;
  b.name = name;
  b.seq_lens.assign(static_cast<std::size_t>(batch), seq_len);
  b.query_lens.assign(static_cast<std::size_t>(batch), query_len);
  b.spec_decode = spec_decode;
  return b;
}

struct SetDef {
  std::string description;
  std::vector<std::pair<BatchSpec, std::vector<int>>> batches;  // batch, TP degrees (heads = 128 / tp)
  SparseSpec sparse{};                                 // active: the sets of the sparse decode op
  std::vector<KvCacheDtype> kv{KvCacheDtype::kAuto};   // each batch x TP once per cache dtype
};

// DeepSeek V3.2's decode (index_topk 2048): every token's row names 2048 keys.
SparseSpec v32_topk(int topk) {
  SparseSpec s;
  s.topk = topk;
  return s;
}

// The case sets, defined here once. "full": issue 9's side-by-side shapes
// (DeepSeek dims, bf16, auto cache, each backend's preferred block size),
// 128 heads (TP 1) and 16 heads (TP 8) each.
const std::map<std::string, SetDef>& set_defs() {
  static const std::map<std::string, SetDef> defs = [] {
    std::map<std::string, SetDef> m;
    m["full"] = {"large_decode (32 x 2048), b=128 with s_k 8192 and 32768, spec decode s_q=2 (b=128, s_k 8192); "
                 "TP 1 and 8 (128 and 16 heads)",
                 {{find_batch_spec("large_decode"), {1, 8}},
                  {uniform_batch("b128_s8192", 128, 8192, 1, false), {1, 8}},
                  {uniform_batch("b128_s32768", 128, 32768, 1, false), {1, 8}},
                  {uniform_batch("spec2_b128_s8192", 128, 8192, 2, true), {1, 8}}}};
    m["tiny"] = {"two small cases for tests (b=2, s_k 256; decode and spec decode s_q=2; 8 heads)",
                 {{uniform_batch("b2_s256", 2, 256, 1, false), {16}},
                  {uniform_batch("spec2_b2_s256", 2, 256, 2, true), {16}}}};
    // The sparse decode op side by side: each cache dtype one of the sparse
    // backends reads (auto: FA3's and FlashInfer's; fp8_ds_mla: FlashMLA's;
    // per-tensor fp8: FlashInfer's; cuda.sparse reads all three).
    const std::vector<KvCacheDtype> sparse_kv{KvCacheDtype::kAuto, KvCacheDtype::kFp8DsMla, KvCacheDtype::kFp8};
    m["sparse-full"] = {"DeepSeek V3.2 sparse decode, top-k 2048: b=64 and b=128 at s_k 8192, spec decode s_q=2 "
                        "(b=64); TP 1 and 8 (128 and 16 heads); caches auto, fp8_ds_mla and fp8",
                        {{uniform_batch("sparse_b64_s8192", 64, 8192, 1, false), {1, 8}},
                         {uniform_batch("sparse_b128_s8192", 128, 8192, 1, false), {1, 8}},
                         {uniform_batch("sparse_spec2_b64_s8192", 64, 8192, 2, true), {1, 8}}},
                        v32_topk(2048),
                        sparse_kv};
    m["sparse-tiny"] = {"two small sparse decode cases for tests (b=2, s_k 256, top-k 128; s_q 1 and 2; 8 heads; "
                        "caches auto, fp8_ds_mla and fp8)",
                        {{uniform_batch("sparse_b2_s256", 2, 256, 1, false), {16}},
                         {uniform_batch("sparse_spec2_b2_s256", 2, 256, 2, true), {16}}},
                        v32_topk(128),
                        sparse_kv};
    return m;
  }();
  return defs;
}

}  // namespace

std::vector<std::string> bench_case_set_names() {
  std::vector<std::string> names;
  for (const auto& [name, def] : set_defs()) names.push_back(name);
  return names;
}

BenchCaseSet bench_case_set(const std::string& name) {
  BenchCaseSet set;
  set.name = name;
  if (auto it = set_defs().find(name); it != set_defs().end()) {
    set.description = it->second.description;
    for (const auto& [batch, tps] : it->second.batches) {
      for (int tp : tps) {
        for (KvCacheDtype kv : it->second.kv) {
          CaseSpec s;
          s.suite = "bench-" + name;
          s.batch = batch;
          s.tp = tp;
          s.sparse = it->second.sparse;
          s.kv_cache_dtype = kv;
          s.validate();
          set.cases.push_back(std::move(s));
        }
      }
    }
    return set;
  }
  // Any suite: its cases as they are (InputError names the set if it is none).
  Suite suite;
  try {
    suite = load_suite(name);
  } catch (const InputError& e) {
    std::string known;
    for (const std::string& n : bench_case_set_names()) known += (known.empty() ? "" : ", ") + n;
    throw InputError("--case-set '" + name + "': not a bench case set (" + known + ") nor a suite: " + e.what());
  }
  set.description = "suite " + suite.name + ": " + suite.description;
  set.cases = std::move(suite.cases);
  return set;
}

DecodeWork ideal_decode_work(const CaseSpec& spec, int block_size) {
  if (block_size < 1) throw InputError("ideal_decode_work: block size " + std::to_string(block_size));
  const Dims& d = spec.dims;
  const double N = spec.num_heads(), L = d.kv_lora_rank, R = d.rope_dim;
  const double model = static_cast<double>(dtype_size(spec.dtype));
  const EntryFormat f = make_entry_format(spec.kv_format(), spec.dtype, d.kv_lora_rank, d.rope_dim, spec.k_scale);
  DecodeWork w;
  for (int i = 0; i < spec.num_requests(); ++i) {
    const std::int64_t s = spec.batch.seq_lens[static_cast<std::size_t>(i)];
    const std::int64_t q = spec.batch.query_lens[static_cast<std::size_t>(i)];
    const std::int64_t c = s - q;  // cached context; token u sees keys 0 .. c + u
    // The last token sees every key the request has: each entry is read once.
    const std::int64_t keys = std::clamp<std::int64_t>(c + q, 0, s);
    w.bytes_read += static_cast<double>(keys) * f.bytes;
    w.bytes_read += static_cast<double>((keys + block_size - 1) / block_size) * sizeof(std::int32_t);
    for (std::int64_t u = 0; u < q; ++u) {
      const std::int64_t vis = std::clamp<std::int64_t>(c + u + 1, 0, s);
      w.flops += 2.0 * N * static_cast<double>(vis) * ((L + R) + L);
    }
  }
  const double T = spec.num_tokens();
  w.bytes_read += T * N * (L + R) * model;               // q_lat, q_pe
  w.bytes_written += T * N * L * model + T * N * 4.0;    // o_lat, lse (fp32)
  return w;
}

DecodeWork ideal_sparse_decode_work(const Case& c) {
  const CaseSpec& spec = c.spec;
  if (!c.sparse) throw InputError("ideal_sparse_decode_work: not a sparse case");
  const Dims& d = spec.dims;
  const double N = spec.num_heads(), L = d.kv_lora_rank, R = d.rope_dim, Dv = spec.sparse_dv();
  const double model = static_cast<double>(dtype_size(spec.dtype));
  const double entry =
      make_entry_format(spec.kv_format(), spec.dtype, d.kv_lora_rank, d.rope_dim, spec.k_scale).bytes;
  DecodeWork w;
  std::vector<int> keys, extra;
  for (int t = 0; t < c.num_tokens; ++t) {
    main_positions(c, t, keys);
    extra_positions(c, t, extra);  // the compressed cache has the main cache's format
    const double n = static_cast<double>(keys.size() + extra.size());
    w.bytes_read += n * entry;
    w.flops += 2.0 * N * n * ((L + R) + Dv);
  }
  const double T = c.num_tokens;
  w.bytes_read += T * (c.sparse->main.width + c.sparse->extra.width) * sizeof(std::int32_t);  // index rows
  w.bytes_read += T * N * (L + R) * model;         // q
  w.bytes_written += T * N * Dv * model + T * N * 4.0;  // o, lse (fp32)
  return w;
}

namespace {

struct Row {
  std::string case_id, label, backend;
  int batch = 0, max_seq = 0, max_q = 0, heads = 0, block_size = 0;
  std::string status = "ok";  // ok | NOT_SUPPORTED | NO_BENCH | ERROR
  std::string reason, note;
  DecodeWork work;
  std::vector<double> samples_ms;  // Google Benchmark's final run, one per iteration
  double median_ms = 0, min_ms = 0, x_fastest = 0;
  bool ok() const { return status == "ok"; }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

std::string time_str(double ms) {
  return ms >= 1 ? fmt("%.3f ms", ms) : fmt("%.1f us", ms * 1e3);
}

void print_table(std::FILE* out, const std::vector<Row>& rows, double peak_gbs) {
  std::fprintf(out, "%-24s %4s %6s %3s %4s  %-22s %3s %11s %5s %8s %6s %7s %7s  %s\n", "case", "B", "s_k", "s_q", "N",
               "backend", "bs", "time", "n", "GB/s", "%HBM", "TFLOPS", "x fast", "note");
  std::string last, no_bench;
  for (const Row& r : rows) {
    if (r.status == "NO_BENCH") {  // listed once below, not on every case
      if (no_bench.find(r.backend) == std::string::npos) no_bench += (no_bench.empty() ? "" : ", ") + r.backend;
      continue;
    }
    if (!last.empty() && r.case_id != last) std::fprintf(out, "\n");
    last = r.case_id;
    std::fprintf(out, "%-24s %4d %6d %3d %4d  %-22s %3d ", r.label.c_str(), r.batch, r.max_seq, r.max_q, r.heads,
                 r.backend.c_str(), r.block_size);
    if (!r.ok()) {
      std::fprintf(out, "%s: %s\n", r.status.c_str(), r.reason.c_str());
      continue;
    }
    const double gbs = r.work.bytes() / (r.median_ms * 1e-3) / 1e9;
    std::fprintf(out, "%11s %5zu %8.1f %5.1f%% %7.2f %7.2f  %s\n", time_str(r.median_ms).c_str(), r.samples_ms.size(), gbs,
                 100.0 * gbs / peak_gbs, r.work.flops / (r.median_ms * 1e-3) / 1e12, r.x_fastest, r.note.c_str());
  }
  if (!no_bench.empty()) std::fprintf(out, "\nnot benchmarkable (no prepare_decode_bench, or prepare_sparse_decode_bench for cases with index sets): %s\n", no_bench.c_str());
}

void write_json(const std::string& path, const std::vector<Row>& rows, const nlohmann::json& head) {
  nlohmann::json j = head;
  j["rows"] = nlohmann::json::array();
  const double peak = head.value("hbm_peak_gbs", 0.0);
  for (const Row& r : rows) {
    nlohmann::json x = {{"case", r.case_id},          {"label", r.label},       {"backend", r.backend},
                        {"batch", r.batch},           {"max_seq_len", r.max_seq}, {"max_query_len", r.max_q},
                        {"heads", r.heads},           {"block_size", r.block_size}, {"status", r.status},
                        {"bytes_read", r.work.bytes_read}, {"bytes_written", r.work.bytes_written},
                        {"flops", r.work.flops}};
    if (!r.reason.empty()) x["reason"] = r.reason;
    if (!r.note.empty()) x["note"] = r.note;
    if (r.ok()) {
      const double gbs = r.work.bytes() / (r.median_ms * 1e-3) / 1e9;
      x["iterations"] = r.samples_ms.size();
      x["time_ms_median"] = r.median_ms;
      x["time_ms_min"] = r.min_ms;
      x["gbs"] = gbs;
      x["pct_hbm_peak"] = peak > 0 ? 100.0 * gbs / peak : 0.0;
      x["tflops"] = r.work.flops / (r.median_ms * 1e-3) / 1e12;
      x["x_fastest"] = r.x_fastest;
    }
    j["rows"].push_back(std::move(x));
  }
  std::ofstream f(path);
  if (!f) throw InputError("--json: cannot write " + path);
  f << j.dump(2) << "\n";
  if (!f) throw InputError("--json: cannot write " + path);
}

#if MLAGATE_HAS_CUDA && MLAGATE_HAS_BENCHMARK

// Google Benchmark reports through us: its own console output is not wanted
// (the samples are collected by the benchmark function itself).
class SilentReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

void init_benchmark_once() {
  static const bool done = [] {
    int argc = 1;
    char name[] = "mlagate-bench";
    char* argv[] = {name, nullptr};
    benchmark::Initialize(&argc, argv);
    return true;
  }();
  (void)done;
}

// Fewest timed iterations behind a median.
constexpr int kMinSamples = 3;

// Times one prepared decode: a warm-up launch, then Google Benchmark's loop
// (manual time = the CUDA-event time of each launch).
void time_row(Row& row, DecodeBench& handle, GpuLaunchTimer& timer, double min_time_s) {
  const std::function<void(void*)> launch = [&handle](void* s) { handle.launch(s); };
  const double warm_ms = timer.time_ms(launch);  // warm-up: first-launch costs, caching allocators
  auto* bm = benchmark::RegisterBenchmark((row.backend + "/" + row.case_id).c_str(),
                               [&row, &timer, &launch](benchmark::State& state) {
                                 row.samples_ms.clear();
                                 try {
                                   for (auto _ : state) {
                                     const double ms = timer.time_ms(launch);
                                     state.SetIterationTime(ms * 1e-3);
                                     row.samples_ms.push_back(ms);
                                   }
                                 } catch (const std::exception& e) {
                                   row.status = "ERROR";
                                   row.reason = e.what();
                                   state.SkipWithError(row.reason.c_str());
                                 }
                               });
  bm->UseManualTime()->Unit(benchmark::kMicrosecond);
  // Google Benchmark stops at its first run that reaches the min time: a launch
  // that takes a third of it alone would leave a median of one or two samples,
  // so such rows run a fixed kMinSamples iterations instead.
  if (warm_ms * 1e-3 * kMinSamples >= min_time_s) {
    bm->Iterations(kMinSamples);
  } else {
    bm->MinTime(min_time_s);
  }
  SilentReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::ClearRegisteredBenchmarks();
  if (row.ok() && row.samples_ms.empty()) {
    row.status = "ERROR";
    row.reason = "no timed iteration";
  }
  if (row.ok()) {
    row.median_ms = median(row.samples_ms);
    row.min_ms = *std::min_element(row.samples_ms.begin(), row.samples_ms.end());
  }
}

int bench_on_gpu(const BenchOptions& opt, const BenchCaseSet& set,
                 const std::vector<std::unique_ptr<Backend>>& backends, std::FILE* out) {
  GpuLaunchTimer timer;  // DeviceUnavailableError without a usable GPU
  init_benchmark_once();
  const GpuBenchInfo& info = timer.info();
  std::fprintf(out, "mlagate bench: case set %s (%zu cases: %s), %zu backends, on %s\n", set.name.c_str(),
               set.cases.size(), set.description.c_str(), backends.size(), info.device.c_str());
  std::fprintf(out, "timing: Google Benchmark, CUDA events around launch(), median of the final run's iterations "
                    "(min time %.2f s); L2 flushed before each launch (%.0f MiB memset, L2 %.0f MiB)\n",
               opt.min_time_s, info.flush_bytes / 1048576.0, info.l2_bytes / 1048576.0);
  std::fflush(out);

  std::vector<Row> rows;
  for (const CaseSpec& spec : set.cases) {
    // Cases with index sets time the sparse decode op, the others the decode op.
    const bool sparse = spec.sparse.active();
    const Op op = sparse ? Op::kSparseDecode : Op::kDecode;
    std::vector<Row> case_rows;
    for (const auto& b : backends) {
      Row r;
      r.case_id = spec.id();
      r.label = spec.batch.name + " tp" + std::to_string(spec.tp);
      if (spec.kv_cache_dtype != KvCacheDtype::kAuto) r.label += " " + std::string(kv_cache_dtype_name(spec.kv_cache_dtype));
      r.backend = std::string(b->name());
      r.batch = spec.num_requests();
      r.max_seq = *std::max_element(spec.batch.seq_lens.begin(), spec.batch.seq_lens.end());
      r.max_q = *std::max_element(spec.batch.query_lens.begin(), spec.batch.query_lens.end());
      r.heads = spec.num_heads();
      const Support s = b->supports(spec, op);
      if (s.ok) {
        r.block_size = resolve_block_size(b->capabilities(), spec);
        if (!sparse) r.work = ideal_decode_work(spec, r.block_size);
      } else {
        r.status = "NOT_SUPPORTED";
        r.reason = s.reason;
      }
      case_rows.push_back(std::move(r));
    }
    const bool any = std::any_of(case_rows.begin(), case_rows.end(), [](const Row& r) { return r.ok(); });
    if (any) {
      const Case c = generate_case(spec);
      Tensor q_lat, q_pe, q_sparse;
      std::vector<int> tokens(static_cast<std::size_t>(c.num_tokens));
      std::iota(tokens.begin(), tokens.end(), 0);
      absorb_queries(c, tokens, q_lat, q_pe);
      if (sparse) q_sparse = sparse_query(c, q_lat.view());
      const DecodeWork sparse_work = sparse ? ideal_sparse_decode_work(c) : DecodeWork{};
      std::vector<std::int32_t> table_rows(static_cast<std::size_t>(c.num_requests));
      std::iota(table_rows.begin(), table_rows.end(), 0);
      std::map<int, PagedCache> caches, extra_caches;  // block size -> cache (new tokens written); V4's compressed one
      for (std::size_t k = 0; k < backends.size(); ++k) {
        Row& r = case_rows[k];
        if (!r.ok()) continue;
        auto it = caches.find(r.block_size);
        if (it == caches.end()) it = caches.emplace(r.block_size, build_paged_cache(c, r.block_size)).first;
        const std::int64_t T = c.num_tokens, N = spec.num_heads(), L = spec.dims.kv_lora_rank;
        Tensor o_lat(spec.dtype, {T, N, sparse ? spec.sparse_dv() : L}), lse(DType::kF32, {T, N});
        DecodeArgs a;
        std::optional<SparseDecodeCall> sa;  // the sparse op's arguments, alive while they are timed
        if (sparse) {
          r.work = sparse_work;
          const PagedCache* extra = nullptr;
          if (!c.sparse->extra.empty()) {
            auto e = extra_caches.find(r.block_size);
            if (e == extra_caches.end())
              e = extra_caches.emplace(r.block_size, build_paged_cache(c.sparse->compressed, r.block_size)).first;
            extra = &e->second;
          }
          sa.emplace(*backends[k], c, it->second, extra, q_sparse);
          sa->args.o = o_lat.view();
          sa->args.lse = lse.view();
        } else {
          a.q_lat = q_lat.view();
          a.q_pe = q_pe.view();
          a.cache = &it->second;
          a.seq_lens = c.seq_lens;
          a.query_start_loc = c.query_start_loc;
          a.block_table_rows = table_rows;
          a.scale = spec.softmax_scale();
          a.k_scale = spec.k_scale;
          a.o_lat = o_lat.view();
          a.lse = lse.view();
        }
        try {
          std::unique_ptr<DecodeBench> handle =
              sparse ? backends[k]->prepare_sparse_decode_bench(sa->args) : backends[k]->prepare_decode_bench(a);
          if (!handle) {
            r.status = "NO_BENCH";
            r.reason = sparse ? "the backend implements no prepare_sparse_decode_bench"
                              : "the backend implements no prepare_decode_bench";
            continue;
          }
          r.note = handle->note();
          time_row(r, *handle, timer, opt.min_time_s);
        } catch (const NotSupportedError& e) {
          r.status = "NOT_SUPPORTED";
          r.reason = e.what();
        } catch (const std::exception& e) {
          r.status = "ERROR";
          r.reason = e.what();
        }
      }
      double fastest = 0;
      for (const Row& r : case_rows)
        if (r.ok() && (fastest == 0 || r.median_ms < fastest)) fastest = r.median_ms;
      for (Row& r : case_rows)
        if (r.ok()) r.x_fastest = r.median_ms / fastest;
    }
    for (const Row& r : case_rows) {  // progress, as each case finishes
      if (r.status != "NO_BENCH")
        std::fprintf(stderr, "  %s %s: %s\n", r.label.c_str(), r.backend.c_str(),
                     r.ok() ? time_str(r.median_ms).c_str() : (r.status + ": " + r.reason).c_str());
    }
    rows.insert(rows.end(), case_rows.begin(), case_rows.end());
  }

  std::fprintf(out, "\n");
  print_table(out, rows, info.hbm_peak_gbs);
  std::fprintf(out,
               "\nGB/s: bytes an ideal kernel moves (visible keys' cache entries once, q, block table; o, lse; sparse rows: each "
               "key a token's row names, once per token, and the index rows instead of the table) / "
               "median time (n: timed iterations). TFLOPS: 2 N (Dqk + Dv) per (token, visible key). x fast: time / "
               "fastest of the case.\n"
               "%s on %s\n",
               info.peak_source.c_str(), info.device.c_str());
  if (!opt.json.empty()) {
    nlohmann::json head = {{"device", info.device},
                           {"hbm_peak_gbs", info.hbm_peak_gbs},
                           {"hbm_peak_source", info.peak_source},
                           {"l2_bytes", info.l2_bytes},
                           {"flush_bytes", info.flush_bytes},
                           {"case_set", set.name},
                           {"min_time_s", opt.min_time_s},
                           {"timer", "Google Benchmark manual time: CUDA events around launch(), median"},
                           {"mlagate", std::string(MLAGATE_VERSION) + " (" + MLAGATE_GIT_COMMIT + ")"}};
    write_json(opt.json, rows, head);
  }
  const bool failed = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.status == "ERROR"; });
  return failed ? 1 : 0;
}

#endif

}  // namespace

int run_bench(const BenchOptions& opt, std::FILE* out) {
  if (!(opt.min_time_s > 0)) throw InputError("--min-time must be > 0 seconds");
  const BenchCaseSet set = bench_case_set(opt.case_set);
  if (set.cases.empty()) throw InputError("--case-set '" + opt.case_set + "' has no case");
  const auto backends = select_backends(opt.backends, opt.backend_options);  // InputError for a glob matching none
#if !MLAGATE_HAS_CUDA
  (void)out;
  (void)backends;
  std::fprintf(stderr, "mlagate bench: this build has no CUDA support (nvcc was not found at configure time)\n");
  return 2;
#elif !MLAGATE_HAS_BENCHMARK
  (void)out;
  (void)backends;
  std::fprintf(stderr,
               "mlagate bench: this build has no Google Benchmark (install libbenchmark-dev, or configure with "
               "-DMLAGATE_BENCHMARK_SOURCE_DIR=<a google/benchmark checkout>)\n");
  return 2;
#else
  try {
    return bench_on_gpu(opt, set, backends, out);
  } catch (const DeviceUnavailableError& e) {
    std::fprintf(stderr, "mlagate bench: no GPU to time on: %s\n", e.what());
    return 2;
  }
#endif
}

}  // namespace mlagate
