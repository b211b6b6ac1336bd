// In-process `mlagate ARGS...` for tests: cli_main with argv as a user's shell
// would give it, and a per-process scratch folder. Tests that use it link mlagate_cli.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "harness/cli/cli.h"

namespace mlagate::test {

inline int cli(std::vector<std::string> args) {
  args.insert(args.begin(), "mlagate");
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  return cli_main(static_cast<int>(argv.size()), argv.data());
}

// <tmp>/<prefix>_<pid>, created.
inline std::filesystem::path scratch_dir(const std::string& prefix) {
  const std::filesystem::path d = std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace mlagate::test
