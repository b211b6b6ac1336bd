// Internal to harness/reliability: one stream of worker processes running
// jobs in order (isolate.cpp), which the schedulers of streams.cpp feed.
#pragma once

#include <signal.h>

#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "harness/reliability/isolate.h"

namespace mlagate::isolation_detail {

// The jobs of one stream, one at a time; null: none left (or the run stopped).
// Before it waits (for memory), the source calls end_worker, which ends the
// stream's worker and with it the memory of its last case. With the first job
// of the last case before another input set, the source may name in `ahead`
// the case the stream runs after that one's jobs (the first of its next
// group, already its own), which the worker then makes meanwhile; else it
// leaves `ahead` empty.
using JobSource =
    std::function<const Job*(const std::function<void()>& end_worker, std::optional<std::size_t>& ahead)>;

// A fixed list's `ahead` for its job `i` (JobSource): when job i is the first
// of its case and the case after it in the list has other inputs, that case,
// if fits(this case, that case) says both fit in memory at once (none given: they do).
std::optional<std::size_t> ahead_in_list(const RunConfig& cfg, const std::vector<Job>& jobs, std::size_t i,
                                         const std::function<bool(std::size_t, std::size_t)>& fits = {});

// One stream of workers: the jobs in order, a new worker after a crash, order
// checks (and --order pairs) on new workers of the stream's device.
std::vector<Record> run_stream(const RunConfig& cfg, const std::vector<std::string>& backend_names,
                               const JobSource& next_job, const IsolationOptions& opt,
                               const std::function<void(const Record&)>& on_record);

// Guards the run's profile, which several streams' threads add to.
std::mutex& profile_mutex();

// SIGPIPE ignored while workers run: a write to a worker that just died must
// return EPIPE, not end the parent.
struct IgnoreSigpipe {
  struct sigaction old {};
  IgnoreSigpipe() {
    struct sigaction sa {};
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, &old);
  }
  ~IgnoreSigpipe() { sigaction(SIGPIPE, &old, nullptr); }
  IgnoreSigpipe(const IgnoreSigpipe&) = delete;
  IgnoreSigpipe& operator=(const IgnoreSigpipe&) = delete;
};

}  // namespace mlagate::isolation_detail
