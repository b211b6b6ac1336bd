// Suites: YAML files that sweep batch specs over TP, dtypes, block sizes and
// seeds. Batch specs are defined once (specs.yaml); suites name them. Both are
// embedded in the binary at build time; a path to a .yaml file also works.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cases/case_spec.h"
#include "cases/explore_space.h"

namespace mlagate {

// The batch specs of specs.yaml (the 12 vLLM specs and the edge specs).
const std::vector<BatchSpec>& batch_specs();
const BatchSpec& find_batch_spec(const std::string& name);  // throws InputError

struct Suite {
  std::string name;
  std::string description;
  std::string source;  // the built-in name or the file path given
  // Runs of each (case, backend, op) compared bitwise when the user gives no
  // --repeat: the gate suite says 2, so a nondeterministic kernel fails it.
  int repeat = 1;
  std::vector<CaseSpec> cases;  // empty only in a file with an explore block and no groups
  // The file's `explore:` block: the space `mlagate explore --suite FILE` draws
  // from (defaults for what the block leaves out).
  std::optional<ExploreSpace> explore;
};

std::vector<std::string> builtin_suite_names();
// A built-in name ("vllm") or a path to a YAML file. Throws InputError with the
// file, line and reason on malformed input or an impossible case.
Suite load_suite(const std::string& name_or_path);
Suite parse_suite_yaml(const std::string& text, const std::string& source);

// Command-line sweep (--spec a,b --tp 1,8 --block-size 16,64 ...): every
// combination; unset axes take the default.
struct Sweep {
  std::vector<std::string> specs;
  std::vector<int> tps;
  std::vector<DType> dtypes;
  std::vector<KvCacheFormat> kv_dtypes;  // "fp8", "fp8_ds_mla:raw", ... (parse_kv_cache_format)
  std::vector<int> block_sizes;
  std::vector<std::uint64_t> seeds;
  bool empty() const;
};
// Sweep over a suite: axes given replace the suite's; without a suite, the
// sweep alone defines the cases ("sweep" suite label).
std::vector<CaseSpec> apply_sweep(const Sweep& sw, const std::optional<Suite>& base);

}  // namespace mlagate
