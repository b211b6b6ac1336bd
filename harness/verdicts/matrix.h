// `mlagate matrix` (VERDICTS.md, "The matrix"): what each backend supports,
// measured: from the JSON reports of one or more runs, one row per backend and
// a column per value of each dimension (op, model dtype, kv cache format,
// block size, query kind, serving mode), each cell the verdict of that
// backend's records with that value: FAILED (a failure no expectation names),
// XPASS, XFAIL, PASSED or NOT_SUPPORTED, with the counts and, for XFAIL and
// NOT_SUPPORTED, the reasons. vLLM's attention-backend table states what each
// backend supports; this one is what the runs showed.
#pragma once

#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "reports/record.h"

namespace mlagate {

struct MatrixCell {
  // "FAILED", "XPASS" (strict), "XFAIL", "PASSED" (every record that ran passed,
  // or passed where a non-strict entry expects some failures), "NOT_SUPPORTED",
  // "" (no record).
  std::string verdict;
  long long records = 0, ran = 0, passed = 0, xfail = 0, xpass = 0, xpass_strict = 0, not_supported = 0;
  long long failed = 0;  // failures no expectation names
  // Distinct XFAIL / XPASS entries, and the NOT_SUPPORTED reasons (shown for
  // cells where nothing ran), at most a few each.
  std::vector<std::string> expected, reasons;
  std::string text() const;          // "PASSED 12", "XFAIL 3/12", "FAILED 2/12", "NOT_SUPPORTED"
};

struct MatrixColumn {
  std::string dimension, value;  // ("kv", "fp8")
};

struct Matrix {
  std::vector<std::string> backends;
  std::vector<MatrixColumn> columns;
  std::vector<std::vector<MatrixCell>> cells;  // [backend][column]
  std::vector<std::string> sources;            // the reports it was made from
};

// Records without facts (reports that predate them) count under op only.
Matrix build_matrix(std::span<const Record> records, std::vector<std::string> sources);
void write_matrix_markdown(std::ostream& os, const Matrix& m);
void write_matrix_html(std::ostream& os, const Matrix& m);

}  // namespace mlagate
