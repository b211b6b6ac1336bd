// Runs one shell command with a time limit: its own process group (killed
// whole on timeout), stdin from /dev/null, stdout and stderr to files.
#pragma once

#include <string>

namespace mlagate::exec {

struct CommandResult {
  bool timed_out = false;
  int exit_code = -1;  // when it exited
  int signal = 0;      // when a signal ended it
  double seconds = 0;
};

// `/bin/sh -c command`. Throws std::runtime_error when it cannot be started.
CommandResult run_command(const std::string& command, double timeout_s, const std::string& stdout_path,
                          const std::string& stderr_path);

// The last lines of a text file (at most max_bytes), joined with " | ": a
// record message is one line. Empty when the file is empty or missing.
std::string tail_of_file(const std::string& path, std::size_t max_bytes = 1500);

// `s` quoted for /bin/sh.
std::string shell_quote(const std::string& s);

// `s` as one /bin/sh word for a printed command: as is when every character
// is plainly safe (ids, paths, numbers), else shell_quote(s).
std::string shell_word(const std::string& s);

}  // namespace mlagate::exec
