// The command-line interface (CLI11): subcommands list, run, and for golden
// files (golden/) export, replay and compare. Exceptions become exit codes
// here and nowhere else: 0 all passed, 1 a verdict failed (compare: the files
// differ), 2 usage or input error, 3 internal error, 4 nothing ran.
#pragma once

namespace mlagate {

inline constexpr int kExitPassed = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitInternal = 3;
// run / replay where no record ran (every one SKIPPED or NOT_SUPPORTED, e.g.
// --backend 'cuda.*' on a machine without a GPU): a CI gate must not go green
// on that. --allow-nothing-ran makes it exit 0.
inline constexpr int kExitNothingRan = 4;
// A run stopped by SIGINT/SIGTERM exits 128 + the signal (130, 143), after
// writing the reports of what finished.
inline constexpr int kExitInterruptedBase = 128;

int cli_main(int argc, char** argv);

}  // namespace mlagate
