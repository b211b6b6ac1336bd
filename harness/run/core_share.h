// Spare cores for the workers still at work. Workers side by side on the host
// each start with a share of the cores (share_cores: on 2 cores, 2 workers of
// a thread each); when one has no group left its cores would idle while the
// others keep their share. `mlagate run --suite vllm --spec large_prefill
// --backend 'cpu.*'` on the 2-core VM: its TP 1 group ran alone for the last
// 20 s of 36.5 on one thread. The parent keeps the number of workers still at
// work in a page its workers map (CoreShare); a worker reads it as each job
// and each of the harness's heavy phases begins (take_spare_cores) and sizes
// its OpenMP team to cores / workers at work, never below the team it
// started with. Nothing a run computes depends on the team's size (the
// harness's results and the CPU backends' are the same bits on any number of
// threads: the thread-count tests of tests/reference and tests/cases, and
// the records of runs with and without it, PERFORMANCE.md), only how long
// a phase takes.
#pragma once

#include <cstddef>
#include <string>

namespace mlagate {

// Names the page in a worker's environment: the number of an inherited file
// descriptor. Set to "off" in the run's own environment, no page is made
// and every worker keeps its share: a measurement aid.
inline constexpr const char* kCoreShareVariable = "MLAGATE_CORE_SHARE";

// The parent's side: the page, for `workers` workers on `cores` cores. The
// page is an anonymous memory file (memfd) its workers inherit: nothing is
// left behind when the run ends, however it ends. Throws std::runtime_error
// where none can be made (the caller runs without it).
class CoreShare {
 public:
  CoreShare(std::size_t workers, std::size_t cores);
  ~CoreShare();
  CoreShare(const CoreShare&) = delete;
  CoreShare& operator=(const CoreShare&) = delete;
  // NAME=VALUE for the workers' environment.
  std::string env() const;
  // The page's descriptor: close-on-exec, so a worker's spawn must pass it on
  // (posix_spawn_file_actions_adddup2(fd, fd)); no other child gets it.
  int fd() const { return fd_; }
  // One worker fewer at work (its stream has no group left); never below one.
  void worker_done();
  std::size_t working() const;

 private:
  int fd_ = -1;
  void* page_ = nullptr;
};

// A worker's side: this thread's OpenMP team set to max(the team it had at the
// first call, cores / workers at work). Does nothing in a process without a
// page (no variable, or one that names no valid page). After the first call,
// one read of the shared page.
void take_spare_cores();

namespace core_share_detail {
// The page a variable's value names, mapped read-only, its descriptor then
// closed; null (the descriptor, if any, left open) where the value names no
// descriptor, or one that is not a page. For tests.
const void* map_page(const char* value);
}  // namespace core_share_detail

}  // namespace mlagate
