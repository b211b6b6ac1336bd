// `mlagate compare A B`: two results files compared case by case, backend x op
// by backend x op, output by output (bit-identical, within atol/rtol, or how
// far apart, with the worst element located).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "golden/golden_file.h"

namespace mlagate {

struct FileCompareOptions {
  double atol = 0, rtol = 0;   // |a - b| <= atol + rtol * |a| counts as within tolerance
  bool ignore_missing = false; // cases / records / outputs in one file only do not fail
  bool verbose = false;        // list identical records too
  std::uint64_t max_bytes = kDefaultMaxBytes;
};

struct FileCompareSummary {
  std::size_t identical = 0;         // every output bit-identical
  std::size_t within_tolerance = 0;  // values differ, none beyond atol/rtol
  std::size_t different = 0;         // an output differs beyond atol/rtol (or in shape/dtype)
  std::size_t only_a = 0, only_b = 0;  // cases, records or outputs present in one file only
  std::size_t inputs_differ = 0;     // cases whose input hashes differ
  bool failed(const FileCompareOptions& o) const {
    return different > 0 || inputs_differ > 0 || (!o.ignore_missing && only_a + only_b > 0);
  }
};

// Compares two results files case by case, backend by backend, output by
// output, writing a line per difference (and a summary) to `out`.
FileCompareSummary compare_results_files(const std::string& a, const std::string& b, const FileCompareOptions& opt,
                                         std::FILE* out);

}  // namespace mlagate
