// Starting the mlagate binary (or any program) as a child whose stdout and
// stderr go to one file, and waiting for it: shrink's candidate runs and
// explore's rounds. Isolation workers have their own protocol (isolate.h).
#pragma once

#include <string>
#include <vector>

namespace mlagate {

// Runs argv[0] with argv, stdout and stderr into `log` (truncated), this
// process's environment; returns the exit code, or 128 + the signal that
// killed it. Throws std::runtime_error when it cannot start.
int spawn_and_wait(const std::vector<std::string>& argv, const std::string& log);

}  // namespace mlagate
