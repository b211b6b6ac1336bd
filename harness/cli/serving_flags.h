// The serving-mode flags of run, replay and shrink (harness/run/SERVING.md) as
// the command line gives them, and the one ServingMode they name: the CLI
// builds the mode here, once, and writes the flags back (repro commands,
// shrink's candidates) from here.
#pragma once

#include <string>
#include <vector>

namespace mlagate {

struct ServingMode;  // harness/run/serving.h: options.h, which holds these flags, stays light
}  // namespace mlagate
namespace CLI {
class App;
}  // namespace CLI
namespace mlagate {

struct ServingFlags {
  bool cuda_graph = false;          // --cuda-graph
  std::vector<int> capture_sizes;   // --capture-sizes (empty: vLLM's)
  std::vector<std::string> checks;  // --check batch-invariance
  int dcp = 0, dcp_interleave = 1;  // --dcp N, --dcp-interleave K
  int steps = 0;                    // --steps N

  // The flags as options of `app`: run's and replay's (`of_failing_record`
  // false: what each mode does), or shrink's and triage's (true: the failing
  // record's mode, which they run the case in). One list for every command.
  void add_options(CLI::App* app, bool of_failing_record);
  // Any mode flag given (then --op defaults to decode and a suite's repeat is not applied).
  bool given() const;
  // The mode the flags name (Plain when none). InputError for two modes at
  // once and for values out of range, checked in that order and with the same
  // words whatever the mode (--capture-sizes too without --cuda-graph).
  ServingMode mode() const;
  // The flags as given (defaults left out), in the order repro commands print them.
  std::vector<std::string> argv() const;
};

}  // namespace mlagate
