// The space `mlagate explore` draws cases from (harness/explore/EXPLORE.md):
// one range or list per dimension, the defaults being the whole space the
// harness can make. A suite file's `explore:` block narrows it (suite.h), so a
// project keeps its own search space in its repository.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cases/case_spec.h"

namespace mlagate {

struct IntRange {
  int lo = 0, hi = 0;  // inclusive
  bool operator==(const IntRange&) const = default;
};

struct ExploreSpace {
  std::vector<std::string> ops;        // empty: every op the backend declares (layer, decode, prefill, sparse_*, cache_write)
  IntRange requests{1, 256};
  IntRange seq_len{0, 131072};         // per request; 0 only as padding requests (see padding)
  IntRange query_len{1, 128};
  IntRange heads{1, 128};              // heads on the rank, not only 128 / TP
  std::vector<std::string> dims{"deepseek", "glm", "v4", "nope"};
  std::vector<DType> dtypes{DType::kBF16, DType::kF16};
  std::vector<KvCacheFormat> kv_dtypes;  // empty: every format the backend declares (fp8_ds_mla with both rules)
  std::vector<int> block_sizes;          // empty: every block size the backend declares
  std::vector<double> q_magnitudes{1, 2, 4, 8, 16, 32, 64, 128};
  std::vector<double> k_scales{1, 0.5, 3, 0.01};
  // Sparse ops (cases/sparse.h): V3.2 top-k widths, V4 windows, compressed
  // ratios (0: none), sink, and index patterns (empty: every pattern).
  IntRange topk{1, 2048};
  IntRange window{1, 1024};
  std::vector<int> compress{0, 4, 128};
  std::vector<IndexPattern> patterns;
  // Memory layouts (cases/LAYOUTS.md); empty: contiguous half the time, else
  // one of strided, shared, pool2g and pool4g that the backend takes for the op.
  std::vector<LayoutSpec> layouts;
  int padding_percent = 12;        // batches that get seq_len-0 padding requests mixed in
  std::int64_t max_keys = 262144;  // sum of seq_lens of one case
  // Work of one case's fp64 reference in multiply-adds (tokens x keys x heads x
  // head size); 0: chosen by explore from where the reference runs.
  double max_work = 0;
  bool operator==(const ExploreSpace&) const = default;
};

// The space as the YAML block that parses back to it (state fingerprints, the report).
std::string explore_space_yaml(const ExploreSpace& s);

}  // namespace mlagate
