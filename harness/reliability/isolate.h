// Isolation (ARCHITECTURE.md, "Isolation"): backends run in a worker process,
// the mlagate binary itself started by posix_spawn in its hidden worker mode
// (`mlagate run <same flags> --worker`; never fork after CUDA init). The
// parent feeds it jobs over a pipe; a worker that dies (segfault, abort,
// uncaught exception, CUDA error) gives a CRASHED record with the tail of its
// stderr, one that outlives --timeout is killed and gives TIMEOUT; a new worker
// starts and the run goes on. A wrong answer that disappears when its case
// runs alone is reported as order-dependent, with the case it fails after and
// a repro command running exactly that sequence.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "harness/reliability/memory_estimate.h"
#include "reports/record.h"
#include "harness/run/runner.h"

namespace mlagate {

// One (case, backend, op) of a run, by index into RunConfig::cases and the
// selected backends (the worker resolves the same lists from the same flags).
struct Job {
  std::size_t case_index = 0;
  std::size_t backend_index = 0;
  Op op = Op::kLayer;
  bool fresh_worker = false;  // start this job in a new worker (--order pairs, repro sequences)
};

// The executable workers are started from; empty (the default, e.g. tests that
// call cli_main in-process) means process isolation is unavailable.
// worker_executable() is the mlagate binary itself (shrink and --sanitize rerun
// it); empty where workers are started by another command.
void set_worker_executable(std::string path);
const std::string& worker_executable();
// The words that start a worker, before the run's own flags: {mlagate binary}
// for the executable; an embedding host sets its own (the Python module:
// {python, -m, mlagate._worker, <its backends>}), whose workers then load the
// same backends. Empty: process isolation is unavailable.
void set_worker_command(std::vector<std::string> words);
const std::vector<std::string>& worker_command();

struct IsolationOptions {
  std::vector<std::string> argv;     // the worker's command line: argv[0] = worker_executable(), ..., "--worker"
  double timeout_s = 0;              // per job; 0: none
  std::size_t stderr_tail_bytes = 3000;
  // Wrong answers from a backend that ran other cases before in the same
  // worker are rerun alone and after their predecessor (new workers) to tell
  // order-dependent failures apart; at most this many per backend and run
  // (per backend, so one backend's ordinary failures cannot use up another's
  // checks). A failure past the cap says so in its details. --order-checks.
  std::size_t max_order_checks = 10;
  // --order pairs: every job alone in a new worker, then after every other
  // case of the run (ordered pairs, new worker each); a case that passes alone
  // and fails after another gets the first such pair. O(cases^2) workers.
  bool pairs = false;
  // --devices: streams of workers per device, each worker started with
  // CUDA_VISIBLE_DEVICES set to its device. Empty: the environment as it is.
  std::vector<std::string> devices;
  // --workers: streams per device (in all without --devices). With more than
  // one stream in all, the streams take groups of jobs (job_groups) from one
  // queue (GroupQueue) as each finishes its last: every job of a case on the
  // same worker, records as from one stream.
  std::size_t workers = 1;
  // With several streams: the groups handed out largest first (by their
  // memory estimate times their jobs) rather than in the run's order (--order
  // given: the order is the harness's to choose; reverse and shuffle keep theirs).
  bool largest_first = false;
  // Each worker makes its next input set's first case (inputs, reference,
  // caches, err_baseline) on a thread of its own while the case before it
  // runs its backends (CaseAhead, harness/run/runner.h): the same records,
  // fewer waits between a worker's backend calls. The CLI's choice: with a
  // GPU reference or one worker in all (cmd_run.cpp, PERFORMANCE.md).
  bool prepare_ahead = true;
  // NAME=VALUE for every worker's environment, replacing inherited ones.
  std::vector<std::string> env;
  // Called after each worker has started, before it is given a job: what the
  // caller must know first; an exception ends the run before any job, as a
  // worker that cannot start does.
  std::function<void()> after_start;
  // A stream's last worker is killed but not waited for when it has no job
  // left: the caller reaps it (reap_retired_workers) after its own end work.
  bool reap_later = false;
  // Set per stream by run_isolated: the device of this stream's workers.
  std::string device;
  // Workers started before the run (prestart_workers), which the streams'
  // first starts take, a worker of their device each, before starting any.
  std::shared_ptr<class PrestartedWorkers> prestarted;
  // Workers side by side on the host (share_cores): the page of how many are
  // still at work, whose cores the rest take as they go (harness/run/core_share.h).
  std::shared_ptr<class CoreShare> core_share;
  // --reference cuda: each case's device estimate, each device's memory (in
  // `devices`' order; one entry without) and each worker's own, so that the
  // groups side by side on a device fit in it (GroupQueue). Empty: no budget.
  DeviceMemoryPlan device_memory;
};

// The CPUs this process may run on (its affinity mask: a cgroup's or
// taskset's limit), at least 1.
std::size_t host_cpus();

// `--workers auto` of a GPU run (--reference cuda): workers a device for
// `cpus` host cores and `devices` GPUs: one per 2 cores in all up to 16 in
// all, and never fewer than one per 4 cores in all; at most 8 a device (the
// measurements behind it: PERFORMANCE.md, harness/cli/SCALE.md).
std::size_t auto_workers_per_device(std::size_t cpus, std::size_t devices);

// `--workers auto` where every backend runs on the host alone
// (Capabilities::host_only): a worker a core, at most 8.
std::size_t host_only_workers(std::size_t cpus);

// `mlagate explore`'s workers for each round's run where --workers is not
// given: on the CPU (gpu_reference false) a worker a core, at most 8; on the
// GPU, half of auto_workers_per_device (at least 1): explore's draws make
// more of their harness work on the device, and each worker more is one more
// CUDA context taking turns on it (harness/explore/EXPLORE.md, Workers).
std::size_t explore_workers_per_device(bool gpu_reference, std::size_t cpus, std::size_t devices);

// Several workers in all (io.devices x io.workers): unless the run gives
// --threads (> 0), each worker gets its share of the cores as --threads in
// io.argv (a --threads 0 there is replaced), and OMP_WAIT_POLICY=passive in
// io.env unless the environment sets it. The share: cores / (workers - 1)
// where about one worker at a time waits in a backend call (on its GPU);
// cores / workers where every backend runs on the host (host_only: a worker
// in a backend call computes too). Every worker, one included, also gets
// MLAGATE_BLOCK_POOL_MB = its block_pool_share (cases/block_pool.h) unless
// the environment sets it.
void share_cores(IsolationOptions& io, int threads, bool host_only = false);

// The jobs in groups that one worker runs in order: every job of the cases
// with equal inputs (inputs_key: another kv cache dtype, block size or
// k_scale), wherever they are in the list (a suite of several seeds
// interleaves them), in the list's order within a group, the groups in the
// order of their first jobs: a worker hands the inputs on from case to case
// instead of generating them again (and the whole context, references
// included, between cases of equal cache values).
std::vector<std::vector<Job>> job_groups(const RunConfig& cfg, const std::vector<Job>& jobs);

// --order given with several streams: the groups (and their memory
// estimates, bytes) in the order they are handed out: the smallest first, then
// the rest largest first by estimate times jobs (no large group left to run
// alone at the end); with no more groups than streams, largest first only.
void order_groups(std::vector<std::vector<Job>>& groups, std::vector<std::uint64_t>& bytes, std::size_t streams);

// Device memory for GroupQueue: the device of each stream, each device's
// memory, each group's device bytes (its largest case's estimate) and what
// each worker holds besides (its CUDA context). Empty: no device budget.
struct DeviceBudget {
  std::vector<std::size_t> stream_device;  // per stream: an index into memory
  std::vector<std::uint64_t> memory;       // per device: its bytes (0: no budget on it)
  std::vector<std::uint64_t> group_bytes;  // per group
  std::uint64_t per_worker = 0;            // per stream holding a group (so with a worker)
  bool active() const { return !memory.empty(); }
};

// The groups of a run with several streams, handed out in order. A stream
// holds the memory of the last group it took (its worker keeps that case
// until it makes the next); a group is handed out beside others only while
// every stream's holding and its own fit in `budget_bytes` (0: no budget),
// and alone always. With a device budget, also only while the device bytes
// held by the streams of the same device, this group's and a worker's own for
// each of them fit in that device's memory (other devices' streams do not
// count, and are not held up by it); on the device a stream holds the largest
// group its worker took (what a worker keeps between cases, caches and
// libtorch's reserve, is bounded by its largest case), until the worker ends.
// Alone on its device a group always runs.
//
// What a worker keeps between cases for its next ones (its block pool, at
// most `kept_bytes`: cases/block_pool.h) counts too: a stream holds at least
// the smaller of kept_bytes and the largest group its worker took, until the
// worker ends (a worker that ran a TP 1 prefill keeps its 2.7 GB of K and V
// while it runs small cases).
//
// Families (optional: one id per group, e.g. the groups' shape_key): what a
// worker process sets up once per shape (cuDNN compiles its SDPA kernels for
// each shape it meets, about 0.1 s each on an H200) is paid again by every
// worker that meets the shape. So the groups of a small family (its work,
// bytes times jobs summed, at most a 2 x streams-th of all) go to one stream
// in turn: a stream takes the next group of the family of the last group it
// took while one is left; else the first group in order whose small family
// no other working stream is on; else the first in order (no stream idles
// for a family). Large families are spread as before, so that none runs
// alone at the end. Thread-safe.
class GroupQueue {
 public:
  GroupQueue(std::vector<std::vector<Job>> groups, std::vector<std::uint64_t> bytes, std::uint64_t budget_bytes,
             std::size_t streams, DeviceBudget device = {}, std::vector<std::size_t> families = {},
             std::uint64_t kept_bytes = 0);
  // The next group's index for `stream`, waiting for room; nullopt when none
  // is left (the stream then holds nothing) or stop() turned true. Before it
  // waits, a stream that holds memory calls before_wait (which must free it:
  // the stream's worker ends) and holds nothing from then on, so streams
  // never wait for each other in a circle.
  std::optional<std::size_t> take(std::size_t stream, const std::function<bool()>& stop,
                                  const std::function<void()>& before_wait = {});
  // Without waiting: nullopt when none is left or it does not fit now.
  std::optional<std::size_t> try_take(std::size_t stream);
  // The stream's next group taken while it still runs its current one (its
  // worker makes the next group's first case meanwhile: CaseAhead), without
  // waiting: nullopt when none is left, the stream has one ahead already, or
  // the group does not fit now beside everything held, the stream's current
  // group included (host memory: the sum of both; on the device: both, as
  // the case made ahead computes there while the current one's backends run).
  std::optional<std::size_t> try_take_ahead(std::size_t stream);
  // The stream has finished its current group and runs the one it took ahead:
  // it holds that one's host memory alone from now on, and on the device the
  // larger of what its worker held and that group's.
  void advance(std::size_t stream);
  // The stream is done (its worker is gone): it holds nothing.
  void release(std::size_t stream);
  const std::vector<Job>& group(std::size_t g) const { return groups_.at(g); }

 private:
  std::optional<std::size_t> take_locked(std::size_t stream);
  // The group `stream` would take now (the families' rule above); nullopt
  // when none is left.
  std::optional<std::size_t> candidate_locked(std::size_t stream) const;
  void mark_taken_locked(std::size_t stream, std::size_t g);
  void drop_locked(std::size_t stream);  // the stream's worker is gone: it holds nothing
  // The device bytes held beside `stream` on its device: the other working
  // streams' groups (and those taken ahead) with their workers' own.
  std::uint64_t device_beside_locked(std::size_t stream) const;
  // The host bytes stream s holds: its group's and the one taken ahead, or
  // what its worker keeps, whichever is more.
  std::uint64_t host_held_locked(std::size_t s) const { return std::max(held_[s] + ahead_[s], kept_[s]); }
  // Stream s's worker took a group of `bytes`: what it keeps may grow to it,
  // up to keep_.
  void note_kept_locked(std::size_t s, std::uint64_t bytes) { kept_[s] = std::min(keep_, std::max(kept_[s], bytes)); }
  std::vector<std::vector<Job>> groups_;
  std::vector<std::uint64_t> bytes_;
  std::uint64_t budget_;
  std::vector<std::uint64_t> held_;
  DeviceBudget device_;
  std::vector<std::uint64_t> held_device_;  // per stream: the largest group's device bytes since its worker started
  std::vector<char> working_;               // per stream: holds a group (its worker has a case)
  std::uint64_t keep_ = 0;                  // what a worker keeps between cases at most (its block pool)
  std::vector<std::uint64_t> kept_;         // per stream: min(keep_, its worker's largest group)
  std::vector<std::uint64_t> ahead_, ahead_device_;  // per stream: the bytes of the group taken ahead (0: none)
  std::vector<char> has_ahead_;
  std::vector<char> taken_;          // per group
  std::size_t first_ = 0;            // the first group not taken (every one before it is)
  std::vector<std::size_t> family_;  // per group (each its own without families)
  std::vector<char> small_;          // per family: its groups go to one stream in turn
  std::vector<std::optional<std::size_t>> stream_family_;  // per stream: the family of its last group
  std::mutex mutex_;
  std::condition_variable cv_;
};

// Runs `jobs` in order in worker processes; each record goes to on_record as it
// arrives. Stops early (returning what finished) when cfg.stop() turns true.
// Throws std::runtime_error when a worker cannot start at all.
std::vector<Record> run_isolated(const RunConfig& cfg, const std::vector<std::string>& backend_names,
                                 const std::vector<Job>& jobs, const IsolationOptions& opt,
                                 const std::function<void(const Record&)>& on_record);

// Starts now the workers run_isolated(cfg, ..., jobs, opt) would start first
// (one a stream that has a group to take: at most streams, at most groups),
// for opt.prestarted: they load (libtorch, their CUDA) while the caller still
// plans. The caller's own CUDA start-up (the devices' memory, --reference
// cuda) held their start back by 0.1-0.2 s on one GPU and by about 1 s where
// several GPUs are visible (PERFORMANCE.md). Those not taken are ended, and
// reaped with reap_retired_workers, when the last reference goes. Null where
// the run starts none (--order pairs starts one a job).
std::shared_ptr<PrestartedWorkers> prestart_workers(const RunConfig& cfg, const std::vector<Job>& jobs,
                                                    const IsolationOptions& opt);

// Waits for the workers ended with IsolationOptions::reap_later (a no-op
// when there are none).
void reap_retired_workers();

// The worker's side (`--worker`): announces itself, then runs each job read from
// stdin and answers its record; returns the process exit code at end of input.
// `device_ready`, when given, is waited for before the first record is sent:
// the worker's device, checked (and its context made) on a thread of its own
// while the first case is made; an InputError from it is the run's (exit 2),
// and that record is not sent.
int worker_main(const RunConfig& cfg, std::vector<std::unique_ptr<Backend>>& backends,
                const std::function<void()>& device_ready = {});

}  // namespace mlagate
