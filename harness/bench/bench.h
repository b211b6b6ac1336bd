// `mlagate bench`: decode speed of every benchmarkable backend on the same
// cases, side by side. Each (case, backend) is prepared once outside the timed
// region (Backend::prepare_decode_bench: uploads, planning), then timed by
// Google Benchmark with CUDA events around launch() and L2 flushed before each
// launch; the table gives the median time, GB/s and TFLOPS of the work an ideal
// kernel must do, the percentage of the HBM peak and the ratio to the fastest
// backend of the case. The case sets are defined once, in bench.cpp.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "cases/case.h"
#include "cases/case_spec.h"

namespace mlagate {

// A named set of bench cases (`--case-set`): "full" (issue 9's side-by-side
// shapes), "tiny" (seconds, for tests); any suite name or suite YAML also works.
struct BenchCaseSet {
  std::string name;
  std::string description;
  std::vector<CaseSpec> cases;
};
std::vector<std::string> bench_case_set_names();
BenchCaseSet bench_case_set(const std::string& name);  // throws InputError

// What an ideal decode kernel must move and compute for a case, whatever its
// schedule: it reads every visible key's cache entry once (in the cache's
// dtype), q_lat and q_pe, and the block-table entries of those keys; it
// writes o_lat and lse. FLOPs = 2 * N * (Dqk + Dv) per (token, visible key).
struct DecodeWork {
  double bytes_read = 0;
  double bytes_written = 0;
  double flops = 0;
  double bytes() const { return bytes_read + bytes_written; }
};
DecodeWork ideal_decode_work(const CaseSpec& spec, int block_size);
// The sparse decode op (cases with top-k rows or V4's window): a kernel reads
// each key a token's row names (duplicates and -1 as the row has them: -1
// none, a duplicate twice, as FlashMLA gathers every index; V4: the window's
// keys and the compressed rows'), the index rows and q; it writes o and lse.
// FLOPs = 2 * N * (Dqk + Dv) per (token, key read). V4's block-table reads
// are not counted. The case must be generated (its index sets drawn).
DecodeWork ideal_sparse_decode_work(const Case& c);

struct BenchOptions {
  std::string backends = "*";  // globs, comma-separated
  std::string case_set = "full";
  std::string json;            // write the rows here too
  double min_time_s = 0.2;     // Google Benchmark's minimum timed (manual) time per row
  BackendOptions backend_options;
};

// Exit codes as the CLI's: 0 every row ran or is NOT_SUPPORTED, 1 a row
// failed (the kernel threw or faulted), 2 no usable GPU, no CUDA or no Google
// Benchmark in this build, or bad input.
int run_bench(const BenchOptions& opt, std::FILE* out);

}  // namespace mlagate
