// Spare cores (harness/run/core_share.h): the parent's page of workers at
// work, and a worker left alone taking the cores of those that ended, proven
// by rel.team, which reports the OpenMP team of its call.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <string_view>

#include <gtest/gtest.h>

#include "cases/suite.h"
#include "harness/reliability/isolate.h"
#include "harness/run/core_share.h"
#include "tests/reliability/run_mlagate.h"

namespace mlagate::rel_test {
namespace {

// The variable as the test wants it (unset: the documented measurement aid
// "off" in a developer's shell would change what share_cores does), put back after.
class ShareVariable {
 public:
  explicit ShareVariable(const char* value) {
    if (const char* v = std::getenv(kCoreShareVariable)) saved_ = v;
    if (value) ::setenv(kCoreShareVariable, value, 1); else ::unsetenv(kCoreShareVariable);
  }
  ~ShareVariable() {
    if (saved_) ::setenv(kCoreShareVariable, saved_->c_str(), 1); else ::unsetenv(kCoreShareVariable);
  }
  ShareVariable(const ShareVariable&) = delete;
  ShareVariable& operator=(const ShareVariable&) = delete;

 private:
  std::optional<std::string> saved_;
};

// A regular file of `bytes` zero bytes, open (not close-on-exec); the descriptor.
int open_file_of(const fs::path& p, std::size_t bytes) {
  { std::ofstream(p, std::ios::binary) << std::string(bytes, '\0'); }
  return ::open(p.c_str(), O_RDONLY);
}

TEST(CoreShare, ThePageCountsTheWorkersAtWork) {
  CoreShare s(3, 12);
  EXPECT_EQ(s.working(), 3u);
  const std::string env = s.env();
  const std::string key = std::string(kCoreShareVariable) + "=";
  ASSERT_EQ(env.rfind(key, 0), 0u) << env;
  const int fd = std::stoi(env.substr(key.size()));
  const int flags = ::fcntl(fd, F_GETFD);
  ASSERT_GE(flags, 0) << "the page's descriptor is open";
  EXPECT_NE(flags & FD_CLOEXEC, 0) << "no child but a worker (its spawn passes it on) inherits it";
  s.worker_done();
  EXPECT_EQ(s.working(), 2u);
  s.worker_done();
  s.worker_done();
  EXPECT_EQ(s.working(), 1u) << "never below one";
}

// Host-only workers side by side get a page; with a GPU in the run, or the
// user's --threads, none (their shares are not the cores they compute on, or
// they are the user's).
// A worker maps the page its variable names and closes that descriptor; a
// name of anything else maps nothing and leaves the descriptor open (it is
// not the worker's to close: stdout, say, or a file of the user's).
TEST(CoreShare, AWorkerMapsOnlyThePageAndClosesNothingElse) {
  CoreShare s(2, 8);
  const int copy = ::dup(s.fd());
  ASSERT_GE(copy, 0);
  const void* page = core_share_detail::map_page(std::to_string(copy).c_str());
  EXPECT_NE(page, nullptr);
  EXPECT_LT(::fcntl(copy, F_GETFD), 0) << "the page's descriptor is closed once mapped";
  const fs::path d = temp_dir("core_share_files");
  for (const std::size_t bytes : {std::size_t{8192}, std::size_t{4096}, std::size_t{100}}) {
    const int fd = open_file_of(d / ("f" + std::to_string(bytes)), bytes);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(core_share_detail::map_page(std::to_string(fd).c_str()), nullptr) << bytes;
    EXPECT_GE(::fcntl(fd, F_GETFD), 0) << bytes << " bytes: left open";
    ::close(fd);
  }
  for (const char* bad : {"", "abc", "-1", "12x", "999999", "off"})
    EXPECT_EQ(core_share_detail::map_page(bad), nullptr) << "'" << bad << "'";
  EXPECT_EQ(core_share_detail::map_page(nullptr), nullptr);
}

TEST(CoreShare, OnlyHostOnlyWorkersOfTheHarnessesShareGetOne) {
  const ShareVariable unset(nullptr);
  auto has_page = [](std::size_t workers, bool host_only, int threads) {
    IsolationOptions io;
    io.workers = workers;
    io.argv = {"mlagate", "run", "--worker"};
    share_cores(io, threads, host_only);
    const std::string_view var = kCoreShareVariable;
    bool in_env = false;
    for (const std::string& e : io.env)
      in_env |= e.size() > var.size() && e.compare(0, var.size(), var) == 0 && e[var.size()] == '=';
    EXPECT_EQ(in_env, io.core_share != nullptr);
    return io.core_share != nullptr;
  };
  EXPECT_TRUE(has_page(2, true, 0));
  EXPECT_FALSE(has_page(2, false, 0));
  EXPECT_FALSE(has_page(2, true, 3));
  EXPECT_FALSE(has_page(1, true, 0));
  {
    const ShareVariable off("off");
    EXPECT_FALSE(has_page(2, true, 0)) << "the user's MLAGATE_CORE_SHARE=off (a measurement aid)";
  }
  for (const char* other : {"on", "1", "7"}) {
    const ShareVariable set(other);
    EXPECT_TRUE(has_page(2, true, 0)) << "'" << other << "' is replaced, not kept";
  }
  IsolationOptions with_devices;
  with_devices.workers = 2;
  with_devices.devices = {"0"};
  with_devices.argv = {"mlagate", "run", "--worker"};
  share_cores(with_devices, 0, true);
  EXPECT_EQ(with_devices.core_share, nullptr) << "workers a device: their shares are per device";
}

// Two workers side by side on the host (share_cores as for cpu.* backends;
// the CLI gives a plugin's backends none, as they may hold a device), two
// input sets: smoke's small_decode, whose rel.slow sleeps 3 s, and mixed_small
// at TP 8 in fp16 (prefill), whose rel.slow sleeps 1 s (so that each worker
// takes one) and whose worker ends first. small_decode's rel.team then runs on
// every core, mixed_small's ran on half. The user's --threads stays as given.
TEST(CoreShare, AWorkerLeftAloneTakesTheCoresTheOthersLeft) {
  const std::size_t cpus = host_cpus();
  if (cpus < 2) GTEST_SKIP() << "one core: no share to grow";
  const ShareVariable unset(nullptr);
  RunConfig cfg;
  cfg.cases = load_suite("smoke").cases;
  ASSERT_NE(cfg.cases.at(0).id().find("small_decode"), std::string::npos);
  ASSERT_NE(cfg.cases.at(5).id().find("mixed_small/tp8/fp16"), std::string::npos);  // other inputs: another group
  const std::vector<std::string> names = {"rel.slow", "rel.team"};
  const std::vector<Job> jobs = {Job{0, 0, Op::kDecode}, Job{0, 1, Op::kDecode}, Job{5, 0, Op::kPrefill},
                                 Job{5, 1, Op::kPrefill}};
  auto teams = [&](int threads) {
    IsolationOptions io;
    io.argv = {kBin, "run", "--plugin", kPlugin, "--suite", "smoke", "--backend", "rel.slow,rel.team"};
    if (threads > 0) io.argv.insert(io.argv.end(), {"--threads", std::to_string(threads)});
    io.argv.push_back("--worker");
    io.workers = 2;
    io.largest_first = true;
    io.prepare_ahead = false;  // as the CLI's CPU workers side by side (else one stream takes both groups)
    io.env.push_back("MLAGATE_TEST_FAULT_ON=small_decode");
    share_cores(io, threads, true);
    EXPECT_EQ(io.core_share != nullptr, threads == 0);
    std::map<int, std::string> t;  // case -> rel.team's message
    for (const Record& r : run_isolated(cfg, names, jobs, io, {})) {
      if (r.backend == "rel.team") t[r.case_id.find("small_decode") != std::string::npos ? 0 : 1] = r.message;
      else EXPECT_EQ(r.status, Status::kPassed) << r.case_id << ": " << r.message;
    }
    if (io.core_share) {
      EXPECT_EQ(io.core_share->working(), 1u) << "each stream's end counted";
    }
    return t;
  };
  const auto grown = teams(0);
  ASSERT_EQ(grown.size(), 2u);
  EXPECT_EQ(grown.at(0), "team " + std::to_string(cpus)) << "alone after the sleep: every core";
  EXPECT_EQ(grown.at(1), "team " + std::to_string(cpus / 2)) << "beside the other: its share";
  const auto fixed = teams(1);
  ASSERT_EQ(fixed.size(), 2u);
  for (const auto& [c, team] : fixed) EXPECT_EQ(team, "team 1") << c;
}

// A page name that names no page (not a number, no such descriptor, a
// descriptor of something else) is ignored: the run is as without one.
TEST(CoreShare, ABadPageNameIsIgnored) {
  const fs::path d = temp_dir("core_share_bad");
  for (const char* bad : {"", "abc", "-1", "12x", "999999", "1", "2"}) {
    const ShareVariable set(bad);
    const int rc = run_mlagate(with_plugin({"run", "--suite", "smoke", "--spec", "small_decode", "--tp", "16", "--dtype",
                                            "bf16", "--op", "decode", "--backend", "rel.team,cpu.paged", "--isolate",
                                            "none", "--threads", "1", "-q", "--json", (d / "bad.json").string()}),
                               d);
    EXPECT_EQ(rc, 0) << "'" << bad << "': " << slurp(d / "stderr.txt");
    std::size_t seen = 0;
    for (const auto& [key, r] : records_of(d / "bad.json"))
      if (key.first == "rel.team") {
        ++seen;
        EXPECT_EQ(r.at("message").get<std::string>(), "team 1") << "'" << bad << "'";
      }
    EXPECT_EQ(seen, 1u) << "'" << bad << "'";
  }
}

}  // namespace
}  // namespace mlagate::rel_test
