// Worker processes for isolation (isolate.h): spawning the mlagate binary in
// worker mode, the line protocol between parent and worker (the worker's side
// is worker.cpp), deadlines, and the records made for workers that die or hang.
//
// Protocol (one line each way per job; the worker's stdout is the channel, so
// the worker points its own fd 1 at stderr before anything can print):
//   worker -> parent  READY <cases> <backends> <ms>  once, after flags and backends are loaded;
//                                                   <ms>: its initialisation (process start to here)
//   parent -> worker  NEXT <case>                   (before a JOB, no answer) the case this worker
//                                                   takes after the coming job's case: made ahead,
//                                                   on a thread beside the jobs before it (CaseAhead)
//   parent -> worker  JOB <case> <backend> <op>     indices into both sides' identical lists
//   worker -> parent  CALLS <n> <start> <end> ...      the job's backend calls, steady-clock ns (the
//                                                   profile's wall with a backend call in flight)
//   worker -> parent  AHEAD <ms> <begun>            before the first RECORD of a case made ahead: the
//                                                   part of its work (in that record's phases) that ran
//                                                   beside the worker's jobs, not in the job's wall; and
//                                                   the cases begun ahead since the last AHEAD line
//   worker -> parent  RECORD <record_json_line>
//   worker -> parent  INPUT_ERROR <json string>     bad input met making a case (run --golden's
//                                                   hash checks); the worker exits, the run ends (exit 2)
#include "harness/reliability/isolate.h"
#include "harness/run/core_share.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>
#include <stdexcept>
#include <thread>

#include "cases/errors.h"
#include "harness/reliability/stream.h"
#include "reports/profile.h"
#include "reports/record_json.h"

extern char** environ;

namespace mlagate {

namespace {

// A message on one protocol line (the worker's INPUT_ERROR, worker.cpp): a
// JSON string, as records travel as JSON.
std::string message_from_line(const std::string& line) {
  try {
    return nlohmann::json::parse(line).get<std::string>();
  } catch (const nlohmann::json::exception&) {
    return line;  // not from a worker of this build: shown as it came
  }
}

std::vector<std::string>& worker_cmd() {
  static std::vector<std::string> words;
  return words;
}

using Clock = std::chrono::steady_clock;

std::string describe_wait_status(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = strsignal(sig);
    return "killed by signal " + std::to_string(sig) + " (" + (name ? name : "?") + ")";
  }
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  return "ended with wait status " + std::to_string(status);
}

// The last non-empty line of a text, for one-line messages.
std::string last_line(const std::string& text) {
  std::size_t end = text.find_last_not_of("\r\n \t");
  if (end == std::string::npos) return {};
  const std::size_t start = text.rfind('\n', end);
  return text.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
}

// One worker process and its three pipes. The destructor kills and reaps it.
class WorkerProcess {
 public:
  enum class Wait { kLine, kDied, kTimeout, kStopped };
  int pid() const { return pid_; }

  explicit WorkerProcess(const IsolationOptions& opt) : tail_limit_(opt.stderr_tail_bytes) {
    int in[2], out[2], err[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
      throw std::runtime_error(std::string("isolation: pipe: ") + std::strerror(errno));
    posix_spawn_file_actions_t files;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&files);
    posix_spawnattr_init(&attr);
    // dup2 onto 0, 1, 2 clears close-on-exec there; every other pipe end closes at exec.
    posix_spawn_file_actions_adddup2(&files, in[0], 0);
    posix_spawn_file_actions_adddup2(&files, out[1], 1);
    posix_spawn_file_actions_adddup2(&files, err[1], 2);
    // The spare cores' page (close-on-exec in the parent): dup2 onto itself
    // clears the flag in the child alone.
    if (opt.core_share) posix_spawn_file_actions_adddup2(&files, opt.core_share->fd(), opt.core_share->fd());
    // Its own process group: a terminal's Ctrl-C reaches the parent only, which
    // then ends the worker itself and writes the reports.
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    posix_spawnattr_setpgroup(&attr, 0);
    sigset_t def, none;
    sigemptyset(&def);
    for (int s : {SIGPIPE, SIGINT, SIGTERM, SIGSEGV, SIGABRT, SIGBUS, SIGFPE}) sigaddset(&def, s);
    sigemptyset(&none);
    posix_spawnattr_setsigdefault(&attr, &def);
    posix_spawnattr_setsigmask(&attr, &none);
    std::vector<char*> argv;
    for (const auto& a : opt.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    // --devices: the worker sees its device only (and as device 0); then the
    // run's own variables (IsolationOptions::env), each replacing an inherited one.
    std::vector<std::string> env_store = opt.env;
    if (!opt.device.empty()) env_store.push_back("CUDA_VISIBLE_DEVICES=" + opt.device);
    auto replaced = [&](const char* e) {
      for (const std::string& v : env_store)
        if (const std::size_t eq = v.find('='); eq != std::string::npos && std::strncmp(e, v.c_str(), eq + 1) == 0)
          return true;
      return false;
    };
    std::vector<char*> envp;
    for (char** e = environ; *e; ++e)
      if (!replaced(*e)) envp.push_back(*e);
    for (std::string& v : env_store) envp.push_back(v.data());
    envp.push_back(nullptr);
    const int rc = posix_spawn(&pid_, argv[0], &files, &attr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&files);
    posix_spawnattr_destroy(&attr);
    ::close(in[0]);
    ::close(out[1]);
    ::close(err[1]);
    to_ = in[1];
    from_ = out[0];
    err_ = err[0];
    if (rc != 0) {
      pid_ = -1;
      throw std::runtime_error("isolation: cannot start worker " + opt.argv.at(0) + ": " + std::strerror(rc));
    }
  }
  ~WorkerProcess() {
    close_pipes();
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      reap_within(pid_, st, std::chrono::seconds(10));
    }
  }
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  // Ends it without waiting: killed now, reaped by reap_retired_workers. A
  // worker with a CUDA context takes about 0.3 s to die (the driver tears the
  // context down), which the run spends on its reports instead.
  void retire() {
    close_pipes();
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    const std::lock_guard lock(retired_mutex());
    retired().push_back(pid_);
    pid_ = -1;
  }
  // Reaps every retired worker (each within 10 s: one stuck in the driver is left to init).
  static void reap_retired() {
    std::vector<pid_t> pids;
    {
      const std::lock_guard lock(retired_mutex());
      pids.swap(retired());
    }
    for (const pid_t pid : pids) {
      int st = 0;
      reap_within(pid, st, std::chrono::seconds(10));
    }
  }

  // false when the worker is gone (its stdin is closed).
  bool send(const std::string& line) {
    std::size_t done = 0;
    while (done < line.size()) {
      const ssize_t n = ::write(to_, line.data() + done, line.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<std::size_t>(n);
    }
    return true;
  }

  // The next protocol line, or why there is none. timeout_s <= 0: no deadline.
  Wait read_line(std::string& line, double timeout_s, const std::function<bool()>& stop) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    for (;;) {
      if (const std::size_t nl = buf_.find('\n'); nl != std::string::npos) {
        line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return Wait::kLine;
      }
      if (stop && stop()) return Wait::kStopped;
      int wait_ms = 200;  // short slices: a SIGINT between two polls is seen within 0.2 s
      if (timeout_s > 0) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) return Wait::kTimeout;
        wait_ms = static_cast<int>(std::min<long long>(wait_ms, left));
      }
      pollfd fds[2] = {{from_, POLLIN, 0}, {err_, POLLIN, 0}};
      const int n = ::poll(fds, err_ >= 0 ? 2 : 1, wait_ms);
      if (n < 0 && errno != EINTR) throw std::runtime_error(std::string("isolation: poll: ") + std::strerror(errno));
      if (n <= 0) continue;
      if (err_ >= 0 && (fds[1].revents & (POLLIN | POLLHUP))) drain_stderr_once();
      if (fds[0].revents & (POLLIN | POLLHUP)) {
        char chunk[65536];
        const ssize_t got = ::read(from_, chunk, sizeof chunk);
        if (got > 0) {
          buf_.append(chunk, static_cast<std::size_t>(got));
        } else if (got == 0 || errno != EINTR) {
          return Wait::kDied;
        }
      }
    }
  }

  // After kDied: the rest of its stderr, then how it ended.
  std::string reap() {
    const auto until = Clock::now() + std::chrono::seconds(2);
    while (err_ >= 0 && Clock::now() < until) {
      pollfd p{err_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      if (!drain_stderr_once()) break;
    }
    return end(false);
  }
  // Kills it (timeout, restart after a CRASHED record) and says how it ended.
  std::string kill() { return end(true); }

  const std::string& stderr_tail() const { return tail_; }

 private:
  // Reads what is there; false at end of file.
  bool drain_stderr_once() {
    char chunk[16384];
    const ssize_t got = ::read(err_, chunk, sizeof chunk);
    if (got <= 0) {
      if (got < 0 && errno == EINTR) return true;
      ::close(err_);
      err_ = -1;
      return false;
    }
    tail_.append(chunk, static_cast<std::size_t>(got));
    if (tail_.size() > 2 * tail_limit_) tail_.erase(0, tail_.size() - tail_limit_);
    return true;
  }
  // waitpid with a deadline: a process stuck in the driver (uninterruptible
  // sleep) must not stall the run; it is left to the init process then.
  static bool reap_within(pid_t pid, int& st, Clock::duration limit) {
    const auto until = Clock::now() + limit;
    for (;;) {
      const pid_t r = ::waitpid(pid, &st, WNOHANG);
      if (r == pid || (r < 0 && errno != EINTR)) return r == pid;
      if (Clock::now() >= until) return false;
      ::usleep(10000);
    }
  }
  std::string end(bool kill_first) {
    if (pid_ <= 0) return "not running";
    if (kill_first) ::kill(pid_, SIGKILL);
    int st = 0;
    // A worker that closed its stdout but lingers is killed after a grace period.
    bool reaped = reap_within(pid_, st, std::chrono::seconds(5));
    if (!reaped) {
      ::kill(pid_, SIGKILL);
      reaped = reap_within(pid_, st, std::chrono::seconds(10));
    }
    const pid_t pid = pid_;
    pid_ = -1;
    return reaped ? describe_wait_status(st) : "pid " + std::to_string(pid) + " did not exit 15 s after SIGKILL";
  }

  void close_pipes() {
    for (int* fd : {&to_, &from_, &err_})
      if (*fd >= 0) ::close(*fd), *fd = -1;
  }
  static std::mutex& retired_mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<pid_t>& retired() {
    static std::vector<pid_t> pids;
    return pids;
  }

  pid_t pid_ = -1;
  int to_ = -1, from_ = -1, err_ = -1;
  std::string buf_, tail_;
  std::size_t tail_limit_;
};

std::string trimmed_tail(const std::string& tail, std::size_t limit) {
  if (tail.size() <= limit) return tail;
  std::string t = tail.substr(tail.size() - limit);
  if (const std::size_t nl = t.find('\n'); nl != std::string::npos && nl + 1 < t.size()) t.erase(0, nl + 1);
  return "...\n" + t;
}

}  // namespace

void reap_retired_workers() { WorkerProcess::reap_retired(); }

// Workers started ahead of the run, by device (isolate.h, prestart_workers).
class PrestartedWorkers {
 public:
  void add(const std::string& device, std::unique_ptr<WorkerProcess> w) {
    const std::lock_guard lock(mutex_);
    by_device_[device].push_back(std::move(w));
  }
  std::unique_ptr<WorkerProcess> take(const std::string& device) {
    const std::lock_guard lock(mutex_);
    auto it = by_device_.find(device);
    if (it == by_device_.end() || it->second.empty()) return nullptr;
    std::unique_ptr<WorkerProcess> w = std::move(it->second.back());
    it->second.pop_back();
    return w;
  }
  // One never taken (a stream found no group left) is ended, not waited for.
  ~PrestartedWorkers() {
    for (auto& [device, ws] : by_device_)
      for (auto& w : ws) w->retire();
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::vector<std::unique_ptr<WorkerProcess>>> by_device_;
};

std::shared_ptr<PrestartedWorkers> prestart_workers(const RunConfig& cfg, const std::vector<Job>& jobs,
                                                    const IsolationOptions& opt) {
  if (opt.pairs || jobs.empty()) return nullptr;
  const std::vector<std::string> devices = opt.devices.empty() ? std::vector<std::string>{""} : opt.devices;
  const std::size_t streams = devices.size() * std::max<std::size_t>(1, opt.workers);
  const std::size_t count = streams == 1 ? 1 : std::min(streams, job_groups(cfg, jobs).size());
  auto pool = std::make_shared<PrestartedWorkers>();
  for (std::size_t s = 0; s < count; ++s) {
    IsolationOptions mine = opt;
    mine.device = devices[s % devices.size()];  // stream s's device, as run_isolated deals them
    pool->add(mine.device, std::make_unique<WorkerProcess>(mine));
  }
  return pool;
}

void set_worker_executable(std::string path) {
  worker_cmd().clear();
  if (!path.empty()) worker_cmd().push_back(std::move(path));
}
const std::string& worker_executable() {
  static const std::string none;
  return worker_cmd().size() == 1 ? worker_cmd().front() : none;
}
void set_worker_command(std::vector<std::string> words) { worker_cmd() = std::move(words); }
const std::vector<std::string>& worker_command() { return worker_cmd(); }

namespace isolation_detail {
std::mutex& profile_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace isolation_detail

namespace {

using isolation_detail::profile_mutex;

// Jobs on workers: one job on a given worker, and whole sequences on new ones.
class IsolatedRun {
 public:
  IsolatedRun(const RunConfig& cfg, const std::vector<std::string>& names, const IsolationOptions& opt)
      : cfg_(cfg), names_(names), opt_(opt) {}

  // A started worker, or null when the run was stopped while it started.
  std::unique_ptr<WorkerProcess> start() {
    const auto t0 = Clock::now();
    // A spare spawned earlier has been loading while the stream ran its jobs:
    // only what is left of its start is waited for (and counted) here.
    std::unique_ptr<WorkerProcess> worker = std::move(spare_);
    if (!worker && opt_.prestarted) worker = opt_.prestarted->take(opt_.device);
    if (!worker) worker = std::make_unique<WorkerProcess>(opt_);
    std::string line;
    const auto w = worker->read_line(line, 600, cfg_.stop);
    if (w == WorkerProcess::Wait::kStopped) return nullptr;
    const std::string expect = "READY " + std::to_string(cfg_.cases.size()) + " " + std::to_string(names_.size());
    // The worker's own initialisation time follows (the profile's "worker init").
    double init_ms = 0;
    const bool ready = w == WorkerProcess::Wait::kLine && line.rfind(expect + " ", 0) == 0 &&
                       std::istringstream(line.substr(expect.size() + 1)) >> init_ms;
    if (!ready) {
      const std::string how = w == WorkerProcess::Wait::kLine ? "said '" + line + "', expected '" + expect + "'"
                              : w == WorkerProcess::Wait::kTimeout ? worker->kill()
                                                                   : worker->reap();
      throw std::runtime_error("isolation: the worker did not start (" + how + ")\n" +
                               trimmed_tail(worker->stderr_tail(), opt_.stderr_tail_bytes));
    }
    if (opt_.after_start) opt_.after_start();
    const std::lock_guard lock(profile_mutex());  // streams of several devices add to one profile
    RunProfile& prof = run_profile();
    const double start_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    prof.worker_init_ms += std::min(init_ms, start_ms);
    prof.worker_spawn_ms += std::max(0.0, start_ms - init_ms);
    ++prof.workers_started;
    return worker;
  }

  // Runs `job` on `worker`; resets `worker` when it died, hung or crashed (a
  // new one must take the next job). nullopt: stopped by a signal. `ahead`:
  // the case the worker takes after this job's, which it may make meanwhile.
  std::optional<Record> run(std::unique_ptr<WorkerProcess>& worker, const Job& job,
                            std::optional<std::size_t> ahead = std::nullopt) {
    const CaseSpec& spec = cfg_.cases.at(job.case_index);
    const std::string& backend = names_.at(job.backend_index);
    const std::size_t tail_before = worker->stderr_tail().size();
    const auto t0 = Clock::now();
    auto wall_ms = [&] { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); };
    std::string line;
    WorkerProcess::Wait w = WorkerProcess::Wait::kDied;
    const std::string next = ahead ? "NEXT " + std::to_string(*ahead) + "\n" : std::string();
    if (worker->send(next + "JOB " + std::to_string(job.case_index) + " " + std::to_string(job.backend_index) + " " +
                     std::string(op_name(job.op)) + "\n"))
      w = worker->read_line(line, opt_.timeout_s, cfg_.stop);
    double beside_ms = 0;
    long long begun = 0;
    bool used = false;
    while (w == WorkerProcess::Wait::kLine && (line.rfind("CALLS ", 0) == 0 || line.rfind("AHEAD ", 0) == 0)) {
      if (line[0] == 'C') {
        add_calls(line);
      } else if (std::istringstream in(line.substr(6)); (in >> beside_ms >> begun) && beside_ms >= 0 && begun >= 0) {
        used = true;
      } else {
        beside_ms = 0, begun = 0;  // a malformed one only feeds the profile
      }
      const double left = opt_.timeout_s > 0 ? std::max(1e-3, opt_.timeout_s - wall_ms() / 1e3) : 0;
      w = worker->read_line(line, left, cfg_.stop);
    }
    if (w == WorkerProcess::Wait::kStopped) return std::nullopt;  // unfinished: not recorded, rerun on --resume
    Record r;
    if (w == WorkerProcess::Wait::kLine && line.rfind("INPUT_ERROR ", 0) == 0) {
      worker->kill();  // it has said all it will; do not wait on it
      worker.reset();
      throw InputError(message_from_line(line.substr(12)));
    }
    if (w == WorkerProcess::Wait::kLine && line.rfind("RECORD ", 0) == 0) {
      r = record_from_json_line(line.substr(7));
      trace_job(worker->pid(), t0, r);
      {
        // The work made ahead ran beside this job's wall: the record's phases
        // hold it, the parent's wall for the job does not.
        const std::lock_guard lock(profile_mutex());
        run_profile().add_job(r.timings, wall_ms() + beside_ms);
        run_profile().ahead_ms += beside_ms;
        run_profile().cases_ahead_begun += begun;
        run_profile().cases_ahead_used += used;
      }
      // An exception inside the worker (a CUDA error among them) may leave its
      // device context unusable: the next job gets a new worker.
      if (r.status == Status::kCrashed) worker->kill(), worker.reset();
      return r;
    }
    {
      const std::lock_guard lock(profile_mutex());
      run_profile().lost_job_ms += wall_ms();
    }
    r.case_id = spec.id();
    r.backend = backend;
    r.op = std::string(op_name(job.op));
    r.policy = cfg_.policy.describe();
    if (cfg_.repro) r.repro = cfg_.repro(spec, backend, job.op);
    if (w == WorkerProcess::Wait::kTimeout) {
      const std::string how = worker->kill();
      r.status = Status::kTimeout;
      std::ostringstream m;
      m << "no result within --timeout " << opt_.timeout_s << " s; worker " << how;
      r.message = m.str();
    } else {
      const std::string how = w == WorkerProcess::Wait::kLine ? worker->kill() : worker->reap();
      r.status = Status::kCrashed;
      r.message = "worker " + how + " while running this case";
      if (w == WorkerProcess::Wait::kLine) r.message += " (protocol error: '" + line.substr(0, 80) + "')";
    }
    // The stderr of this job only (earlier jobs' warnings are not its last words).
    const std::string& all = worker->stderr_tail();
    const std::string mine = all.substr(std::min(tail_before, all.size()));
    if (const std::string last = last_line(mine); !last.empty()) r.message += "; last stderr line: " + last;
    if (!mine.empty()) r.details = "worker stderr (tail):\n" + trimmed_tail(mine, opt_.stderr_tail_bytes);
    worker.reset();
    return r;
  }

  // MLAGATE_JOB_TRACE=FILE (a measurement aid, PERFORMANCE.md): one line per
  // finished job, "<device> <worker pid> <start ms> <end ms> <case> <backend>",
  // the times from the run's start, for the timeline of workers side by side.
  void trace_job(int pid, Clock::time_point t0, const Record& r) const {
    static const char* path = std::getenv("MLAGATE_JOB_TRACE");
    if (!path || !*path) return;
    static std::mutex mutex;
    const std::lock_guard lock(mutex);
    static FILE* f = std::fopen(path, "w");
    if (!f) return;
    const auto ms = [](Clock::time_point t) { return std::chrono::duration<double, std::milli>(t - process_start_time()).count(); };
    std::fprintf(f, "%s %d %.1f %.1f %s %s\n", opt_.device.empty() ? "-" : opt_.device.c_str(), pid, ms(t0),
                 ms(Clock::now()), r.case_id.c_str(), r.backend.c_str());
    std::fflush(f);
  }

  // The last job's record when `seq` runs alone in a new worker; nullopt when
  // an earlier job did not finish normally or the run was stopped.
  std::optional<Record> run_sequence(const std::vector<Job>& seq) {
    auto worker = start();
    if (!worker) return std::nullopt;
    // Where one check was needed more tend to follow (a backend's known
    // failures, --order pairs): the next new worker starts loading now,
    // beside this sequence and the stream's jobs, instead of when it is
    // needed (libtorch and a CUDA context: 0.4 s to seconds a start, which
    // the stream would otherwise wait through: PERFORMANCE.md).
    if (!spare_) spare_ = std::make_unique<WorkerProcess>(opt_);
    std::optional<Record> r;
    for (const Job& j : seq) {
      if (!worker) return std::nullopt;
      r = run(worker, j);
      if (!r) return std::nullopt;
    }
    return r;
  }

 private:
  // A CALLS line's intervals into the profile (a malformed one is ignored: it
  // only feeds the profile's in-flight figure).
  static void add_calls(const std::string& line) {
    std::istringstream in(line.substr(6));
    std::size_t n = 0;
    if (!(in >> n)) return;
    std::vector<CallSpan> calls;
    CallSpan c;
    while (calls.size() < n && in >> c.first >> c.second) calls.push_back(c);
    if (calls.size() != n) return;
    const std::lock_guard lock(profile_mutex());
    auto& all = run_profile().calls;
    all.insert(all.end(), calls.begin(), calls.end());
  }
  const RunConfig& cfg_;
  const std::vector<std::string>& names_;
  const IsolationOptions& opt_;
  std::unique_ptr<WorkerProcess> spare_;  // spawned ahead for the next start(); killed unused at the end
};

bool is_verdict_failure(Status s) {
  return s == Status::kIncorrect || s == Status::kNonfinite || s == Status::kNondeterministic;
}

}  // namespace

namespace isolation_detail {

std::vector<Record> run_stream(const RunConfig& cfg, const std::vector<std::string>& backend_names,
                               const JobSource& next_job, const IsolationOptions& opt,
                               const std::function<void(const Record&)>& on_record) {
  IsolatedRun iso(cfg, backend_names, opt);
  std::vector<Record> records;
  if (opt.pairs) {
    std::optional<std::size_t> unused;  // every job has a new worker here
    while (const Job* next = next_job([] {}, unused)) {
      const Job job = *next;
      std::optional<Record> r = iso.run_sequence({job});
      if (!r) break;
      // Only a case that passes alone can be order-dependent.
      for (std::size_t a = 0; r->status == Status::kPassed && a < cfg.cases.size(); ++a) {
        if (a == job.case_index) continue;
        const Job before{a, job.backend_index, job.op};
        const std::optional<Record> pair = iso.run_sequence({before, job});
        if (!pair) return records;  // stopped
        if (!is_verdict_failure(pair->status)) continue;
        const Record alone = *r;
        r = *pair;
        r->message = "order-dependent (passes alone, fails right after " + cfg.cases[a].id() + "): " + r->message;
        r->details = "--order pairs: passes alone; fails when run right after " + cfg.cases[a].id() +
                     (r->details.empty() ? "" : "\n" + r->details);
        if (cfg.repro_sequence) r->repro = cfg.repro_sequence({&cfg.cases[a], &cfg.cases[job.case_index]}, r->backend, job.op);
        break;
      }
      records.push_back(std::move(*r));
      if (on_record) on_record(records.back());
    }
    return records;
  }
  std::unique_ptr<WorkerProcess> worker;
  // The previous job of each backend on the current worker: state a backend
  // keeps between calls (workspaces) comes from there.
  std::map<std::size_t, Job> previous;
  std::map<std::size_t, std::size_t> confirmations;  // order checks made, per backend
  while (!(cfg.stop && cfg.stop())) {
    std::optional<std::size_t> ahead;
    const Job* next = next_job(
        [&] {
          worker.reset();
          previous.clear();
        },
        ahead);
    if (!next) break;
    const Job job = *next;
    if (job.fresh_worker) worker.reset();
    if (!worker) {
      previous.clear();
      if (!(worker = iso.start())) break;
    }
    if (!opt.prepare_ahead) ahead.reset();
    std::optional<Record> r = iso.run(worker, job, ahead);
    if (!r) break;
    // A wrong answer after other cases ran on the same backend instance: does
    // the case fail alone? If not, the failure depends on what ran before it;
    // find the case it fails after and say how to run exactly that sequence.
    const auto prev = previous.find(job.backend_index);
    const bool after_others = is_verdict_failure(r->status) && prev != previous.end();
    if (after_others && confirmations[job.backend_index] >= opt.max_order_checks) {
      r->details = "no order-dependence check: this backend's " + std::to_string(opt.max_order_checks) +
                   " checks of the run are used (--order-checks); rerun this case alone with --case to tell" +
                   (r->details.empty() ? "" : "\n" + r->details);
    } else if (after_others) {
      ++confirmations[job.backend_index];
      const std::optional<Record> alone = iso.run_sequence({job});
      if (alone && alone->status == Status::kPassed) {
        const CaseSpec& before = cfg.cases.at(prev->second.case_index);
        const std::optional<Record> pair = iso.run_sequence({prev->second, job});
        const bool confirmed = pair && pair->status == r->status;
        r->details = "passes when run alone; " +
                     std::string(confirmed ? "fails again when run right after " + before.id()
                                           : "does not fail right after " + before.id() + " alone (an earlier case matters)") +
                     (r->details.empty() ? "" : "\n" + r->details);
        r->message = (confirmed ? "order-dependent (passes alone, fails right after " + before.id() + "): "
                                : std::string("order-dependent (passes alone, fails after earlier cases on this worker): ")) +
                     r->message;
        if (confirmed && cfg.repro_sequence)
          r->repro = cfg.repro_sequence({&before, &cfg.cases.at(job.case_index)}, r->backend, job.op);
      }
    }
    if (worker) previous[job.backend_index] = job;
    records.push_back(std::move(*r));
    if (on_record) on_record(records.back());
  }
  if (worker && opt.reap_later) worker->retire();
  return records;
}

}  // namespace isolation_detail

}  // namespace mlagate
