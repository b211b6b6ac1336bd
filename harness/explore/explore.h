// `mlagate explore` (EXPLORE.md): a random search of the case space for the
// failures no suite names. Rounds of drawn cases (draw.h) run through the
// mlagate binary itself (`mlagate run`: workers, isolation, --devices, every
// backend kind), each failure is grouped by its signature (signature.h), the
// first case of each signature is shrunk (harness/reliability/shrink.h) and
// saved with its replay bundle and repro command, and the search's state is
// saved after every round so that --resume continues it after a kill.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "cases/explore_space.h"
#include "harness/explore/draw.h"

namespace mlagate {

struct ExploreOptions {
  std::string backends = "*";           // --backend globs
  std::vector<BackendEntry> extra;      // out-of-tree backends (--plugin, --exec)
  // Flags every `mlagate run` of the search gets (out-of-tree backends,
  // policy, reference, devices, workers, timeout), and the subset shrink's
  // candidates and the repro commands get (no devices or workers).
  std::vector<std::string> run_flags, shrink_flags;
  // The rounds' --workers where the user gave none (explore's CPU default):
  // outside run_flags, which the state's fingerprint holds, so that a search
  // resumes on a machine of another core count.
  std::string default_workers;
  ExploreSpace space;
  std::string space_source = "default";  // "default" or the suite file's path
  std::uint64_t seed = 0;
  std::uint64_t max_cases = 0;  // 0: until the budget ends
  double budget_s = 0;          // 0: until max_cases
  // Cases per `mlagate run`; 0: auto, min(256, max(16, cases drawn so far))
  // (16, 16, 32, 64, 128, 256, ...): a round's workers run side by side, so
  // larger rounds are faster (H200, four Hopper backends: 2.1 cases/s in
  // rounds of 16, 8.2 in rounds of 256), and a function of the cases drawn
  // alone keeps a search and its --resume the same.
  int round = 0;
  std::string out_dir = "explore";
  std::string json, html;       // report copies beside out_dir/report.json
  bool resume = false, shrink = true, quiet = false;
  bool profile = false;  // --profile: the summary ends with explore_profile_text()
  // Each new failure is triaged (harness/verdicts/triage.h) and grouped by
  // cause: a signature joins a cause whose class its own variants confirm,
  // or whose backend fails its case the same way and the reverse.
  bool triage = true;
  std::vector<std::string> environment;  // for the triage reports (run_environment())
  int shrink_runs = 60;         // candidate runs per shrink
  DrawLimits limits;
};

// Returns the exit code: 1 when a new failure was found (one no --expect entry
// expects) or a run of the search failed, 0 when records ran and every
// failure was expected, 4 when nothing ran (every record SKIPPED or NOT_SUPPORTED).
// Throws InputError for bad options or a state file of another search.
int explore_main(const ExploreOptions& opt);

}  // namespace mlagate
