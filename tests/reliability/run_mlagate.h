// The reliability tests' way of running the real mlagate binary (isolation
// needs it: workers are the binary itself, exec'd) with the planted backends
// of libmlagate_reliability_plugin.so, and of reading what it wrote.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace mlagate::rel_test {

namespace fs = std::filesystem;
using Json = nlohmann::json;

inline const std::string kBin = MLAGATE_TEST_BINARY;
inline const std::string kPlugin = MLAGATE_TEST_REL_PLUGIN;

inline fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("mlagate_rel_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// mlagate started in the background: stdout and stderr to files; `fault_on`
// sets MLAGATE_TEST_FAULT_ON for the planted backends (empty: unset).
struct Child {
  pid_t pid = -1;
  fs::path out, err;

  Child(const std::vector<std::string>& args, const fs::path& dir, const std::string& fault_on) {
    out = dir / "stdout.txt";
    err = dir / "stderr.txt";
    std::vector<std::string> env_store;
    for (char** e = environ; *e; ++e)
      if (std::string(*e).rfind("MLAGATE_TEST_FAULT_ON=", 0) != 0) env_store.emplace_back(*e);
    if (!fault_on.empty()) env_store.push_back("MLAGATE_TEST_FAULT_ON=" + fault_on);
    std::vector<char*> envp;
    for (auto& e : env_store) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_store{kBin};
    argv_store.insert(argv_store.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_store) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int rc = posix_spawn(&pid, kBin.c_str(), &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) throw std::runtime_error("cannot start " + kBin);
  }
  // Exit code, or 128 + signal; -1 (a test failure) when it ran past the
  // limit: a hang fails the test with a message instead of stalling ctest.
  int wait(double limit_s = 240) {
    int st = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
    while (::waitpid(pid, &st, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > until) {
        ADD_FAILURE() << "mlagate ran past " << limit_s << " s; stderr:\n" << slurp(err);
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &st, 0);
        pid = -1;
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

inline int run_mlagate(const std::vector<std::string>& args, const fs::path& dir, const std::string& fault_on = "") {
  Child c(args, dir, fault_on);
  return c.wait();
}

inline std::vector<std::string> with_plugin(std::vector<std::string> args) {
  args.insert(args.begin() + 1, {"--plugin", kPlugin, "--no-progress"});
  return args;
}

// Records of a JSON report by (backend, case id).
inline std::map<std::pair<std::string, std::string>, Json> records_of(const fs::path& json) {
  std::map<std::pair<std::string, std::string>, Json> m;
  const Json j = Json::parse(slurp(json));
  for (const Json& r : j.at("records")) m[{r.at("backend"), r.at("id")}] = r;
  return m;
}

inline std::size_t journal_records(const fs::path& p) {
  std::ifstream in(p);
  std::string line;
  std::size_t n = 0;
  while (std::getline(in, line)) n += line.rfind("{\"backend\"", 0) == 0;
  return n;
}

inline bool wait_for(const std::function<bool()>& ok, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (ok()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace mlagate::rel_test
