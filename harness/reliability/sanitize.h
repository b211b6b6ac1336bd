// --sanitize memcheck|initcheck|racecheck: a record's case rerun alone, in
// process, under NVIDIA compute-sanitizer (its repro command, with
// --error-exitcode and a bounded launch count), and the findings folded into
// the record: a count and the first finding in the message, the sanitizer's
// report in details. A finding on a record that passed makes it INCORRECT.
#pragma once

#include <string>

#include "reports/record.h"

namespace mlagate {

struct SanitizeOptions {
  std::string tool;        // memcheck | initcheck | racecheck
  std::string sanitizer;   // the compute-sanitizer executable
  std::string mlagate;     // this binary, by its real path (the sanitizer execs it)
  int launch_count = 50;   // kernel launches checked
  double timeout_s = 900;
};

// Throws InputError for an unknown tool.
void check_sanitize_tool(const std::string& tool);
// The default sanitizer: $CUDA_HOME/bin, /usr/local/cuda/bin, else PATH.
std::string default_sanitizer();

void sanitize_record(Record& r, const SanitizeOptions& opt);

}  // namespace mlagate
