// Streams of isolation workers (isolate.h): one stream, one per device
// (--devices), or several side by side (--workers) taking groups of jobs from
// one queue; the cores each worker gets.
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <map>
#include <string>
#include <mutex>
#include <thread>
#include <utility>

#include "cases/block_pool.h"
#include "harness/reliability/isolate.h"
#include "harness/reliability/memory_estimate.h"
#include "harness/reliability/stream.h"
#include "harness/run/core_share.h"
#include "reports/profile.h"

namespace mlagate {

using isolation_detail::IgnoreSigpipe;
using isolation_detail::JobSource;
using isolation_detail::profile_mutex;
using isolation_detail::run_stream;
using Clock = std::chrono::steady_clock;

namespace {

// Streams on threads of their own, stream d's workers on device[d] and fed
// by source(d, stop); records reach on_record one at a time; done(d) runs when
// stream d ends. One stream's error (a worker's INPUT_ERROR: the input is bad)
// stops the others at their next job, as a signal would, and is rethrown.
std::vector<Record> run_streams(const RunConfig& cfg, const std::vector<std::string>& backend_names,
                                const std::vector<std::string>& device, const IsolationOptions& opt,
                                const std::function<void(const Record&)>& on_record,
                                const std::function<JobSource(std::size_t, const std::function<bool()>&)>& source,
                                const std::function<void(std::size_t)>& done = {}) {
  const std::size_t n = device.size();
  std::mutex record_mutex;
  auto locked = [&](const Record& r) {
    const std::lock_guard lock(record_mutex);
    if (on_record) on_record(r);
  };
  std::vector<std::vector<Record>> got(n);
  std::vector<std::exception_ptr> errors(n);
  std::atomic<bool> failed{false};
  RunConfig stoppable = cfg;
  stoppable.stop = [&failed, &cfg] { return failed.load() || (cfg.stop && cfg.stop()); };
  {
    std::vector<std::jthread> threads;
    for (std::size_t d = 0; d < n; ++d)
      threads.emplace_back([&, d] {
        try {
          IsolationOptions mine = opt;
          mine.device = device[d];
          got[d] = run_stream(stoppable, backend_names, source(d, stoppable.stop), mine, locked);
        } catch (...) {
          errors[d] = std::current_exception();
          failed = true;
        }
        if (done) done(d);
      });
  }
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  std::vector<Record> records;
  for (auto& g : got)
    for (Record& r : g) records.push_back(std::move(r));
  return records;
}

// What each worker's block pool keeps at most: the limit share_cores passed in
// its environment, else what this process reads (the user's
// MLAGATE_BLOCK_POOL_MB, or the default), as the worker does.
std::uint64_t worker_pool_bytes(const IsolationOptions& opt) {
  const std::string key = std::string(kBlockPoolVariable) + "=";
  for (const std::string& e : opt.env)
    if (e.rfind(key, 0) == 0)
      if (const auto set = block_pool_bytes_of(e.c_str() + key.size())) return *set;
  return block_pool_limit();
}

// Whether a worker may hold cases a and b at once (one made ahead): their host
// estimates within the memory available now, and with a device plan their
// device estimates and the worker's own within device d's memory.
std::function<bool(std::size_t, std::size_t)> two_cases_fit(const RunConfig& cfg, const IsolationOptions& opt,
                                                             std::size_t d) {
  return [&cfg, &opt, d](std::size_t a, std::size_t b) {
    const std::uint64_t host = available_memory_bytes();
    const CaseSpec &ca = cfg.cases.at(a), &cb = cfg.cases.at(b);
    if (host > 0 &&
        estimate_case_bytes(ca, runs_prefill_op(ca, cfg.ops)) + estimate_case_bytes(cb, runs_prefill_op(cb, cfg.ops)) > host)
      return false;
    const DeviceMemoryPlan& plan = opt.device_memory;
    if (!plan.active()) return true;
    const std::uint64_t memory = plan.device_bytes.at(d % plan.device_bytes.size());
    return memory == 0 || plan.case_bytes.at(a) + plan.case_bytes.at(b) + plan.worker_bytes <= memory;
  };
}

// One worker per device (--devices, --workers 1): case i on device i mod N.
std::vector<Record> run_per_device(const RunConfig& cfg, const std::vector<std::string>& backend_names,
                                   const std::vector<Job>& jobs, const IsolationOptions& opt,
                                   const std::function<void(const Record&)>& on_record) {
  const std::size_t n = opt.devices.size();
  std::vector<std::vector<Job>> dealt(n);
  for (const Job& j : jobs) dealt[j.case_index % n].push_back(j);
  std::vector<std::size_t> next(n, 0);
  return run_streams(cfg, backend_names, opt.devices, opt, on_record,
                     [&](std::size_t d, const std::function<bool()>&) -> JobSource {
                       return [&, d](const std::function<void()>&, std::optional<std::size_t>& ahead) -> const Job* {
                         if (next[d] >= dealt[d].size()) return nullptr;
                         ahead = isolation_detail::ahead_in_list(cfg, dealt[d], next[d], two_cases_fit(cfg, opt, d));
                         return &dealt[d][next[d]++];
                       };
                     });
}

}  // namespace

void order_groups(std::vector<std::vector<Job>>& groups, std::vector<std::uint64_t>& bytes, std::size_t streams) {
  if (bytes.size() != groups.size()) throw std::logic_error("order_groups: one size per group");
  // Largest first (the memory estimate stands in for the work: both grow with
  // the context, the heads and the tokens), so that no large group is left to
  // run alone at the end while the other workers idle.
  std::vector<std::size_t> order(groups.size());
  for (std::size_t g = 0; g < order.size(); ++g) order[g] = g;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return bytes[a] * groups[a].size() > bytes[b] * groups[b].size();
  });
  std::vector<std::vector<Job>> sorted_groups;
  std::vector<std::uint64_t> sorted_bytes;
  for (std::size_t g : order) sorted_groups.push_back(std::move(groups[g])), sorted_bytes.push_back(bytes[g]);
  groups = std::move(sorted_groups);
  bytes = std::move(sorted_bytes);
  // But the smallest group first: the stream that takes it calls a backend as
  // soon as its device is up, while the others prepare the largest ones (else
  // no kernel ran until the first of those was prepared: a fifth of a second
  // of the vllm suite on the H100), and then takes the next largest.
  if (groups.size() > streams) {
    std::rotate(groups.begin(), groups.end() - 1, groups.end());
    std::rotate(bytes.begin(), bytes.end() - 1, bytes.end());
  }
}

namespace isolation_detail {

std::optional<std::size_t> ahead_in_list(const RunConfig& cfg, const std::vector<Job>& jobs, std::size_t i,
                                         const std::function<bool(std::size_t, std::size_t)>& fits) {
  if (i >= jobs.size() || (i > 0 && jobs[i - 1].case_index == jobs[i].case_index)) return std::nullopt;
  std::size_t j = i + 1;
  while (j < jobs.size() && jobs[j].case_index == jobs[i].case_index) ++j;
  // A job that starts a new worker finds no case made in the old one.
  if (j >= jobs.size() || jobs[j].fresh_worker) return std::nullopt;
  // The same inputs: the worker hands the case on instead (CaseStream).
  if (inputs_key(cfg.cases.at(jobs[j].case_index)) == inputs_key(cfg.cases.at(jobs[i].case_index))) return std::nullopt;
  if (fits && !fits(jobs[i].case_index, jobs[j].case_index)) return std::nullopt;
  return jobs[j].case_index;
}

}  // namespace isolation_detail

std::vector<std::vector<Job>> job_groups(const RunConfig& cfg, const std::vector<Job>& jobs) {
  // MLAGATE_GROUP_ADJACENT=1 (a measurement aid): only runs of consecutive
  // jobs, as before 2026-11-29, when a suite of several seeds, whose cases
  // interleave the seeds, had one case a group and handed nothing on.
  const bool adjacent_only = std::getenv("MLAGATE_GROUP_ADJACENT") != nullptr;
  std::vector<std::vector<Job>> groups;
  std::map<std::string, std::size_t> group_of;  // inputs_key -> its group
  std::string key;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const bool new_case = i == 0 || jobs[i].case_index != jobs[i - 1].case_index;
    const std::string previous = key;
    if (new_case) key = inputs_key(cfg.cases.at(jobs[i].case_index));
    if (adjacent_only) {
      if (i == 0 || key != previous) groups.emplace_back();
      groups.back().push_back(jobs[i]);
      continue;
    }
    const auto [it, added] = group_of.emplace(key, groups.size());
    if (added) groups.emplace_back();
    groups[it->second].push_back(jobs[i]);
  }
  return groups;
}

GroupQueue::GroupQueue(std::vector<std::vector<Job>> groups, std::vector<std::uint64_t> bytes, std::uint64_t budget,
                       std::size_t streams, DeviceBudget device, std::vector<std::size_t> families,
                       std::uint64_t kept_bytes)
    : groups_(std::move(groups)), bytes_(std::move(bytes)), budget_(budget), held_(streams, 0),
      device_(std::move(device)), held_device_(streams, 0), working_(streams, 0), keep_(kept_bytes),
      kept_(streams, 0), ahead_(streams, 0),
      ahead_device_(streams, 0), has_ahead_(streams, 0), taken_(groups_.size(), 0), family_(std::move(families)),
      stream_family_(streams) {
  if (bytes_.size() != groups_.size()) throw std::logic_error("GroupQueue: one size per group");
  if (family_.empty())
    for (std::size_t g = 0; g < groups_.size(); ++g) family_.push_back(g);
  if (family_.size() != groups_.size()) throw std::logic_error("GroupQueue: one family per group");
  // A family is small when its work (bytes times jobs, the order's measure)
  // is at most a 2 x streams-th of the whole: one stream running all of its
  // groups in turn then holds at most half a stream's share of the run.
  const std::size_t families_n = family_.empty() ? 0 : *std::max_element(family_.begin(), family_.end()) + 1;
  std::vector<long double> work(families_n, 0);
  std::vector<std::size_t> members(families_n, 0);
  long double total = 0;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const long double w = static_cast<long double>(bytes_[g]) * static_cast<long double>(groups_[g].size());
    work[family_[g]] += w;
    total += w;
    ++members[family_[g]];
  }
  small_.assign(families_n, 0);
  for (std::size_t f = 0; f < families_n; ++f)
    small_[f] = members[f] > 1 && work[f] * 2 * static_cast<long double>(std::max<std::size_t>(1, streams)) <= total;
  if (device_.active()) {
    if (device_.group_bytes.size() != groups_.size() || device_.stream_device.size() != streams)
      throw std::logic_error("GroupQueue: one device size per group and one device per stream");
    for (std::size_t d : device_.stream_device)
      if (d >= device_.memory.size()) throw std::logic_error("GroupQueue: a stream's device out of range");
  }
}

std::optional<std::size_t> GroupQueue::try_take(std::size_t stream) {
  const std::lock_guard lock(mutex_);
  return take_locked(stream);
}

std::optional<std::size_t> GroupQueue::candidate_locked(std::size_t stream) const {
  if (first_ >= groups_.size()) return std::nullopt;  // every group taken
  const std::optional<std::size_t> mine = stream_family_[stream];
  if (mine && small_[*mine])
    for (std::size_t g = first_; g < groups_.size(); ++g)
      if (!taken_[g] && family_[g] == *mine) return g;
  const auto others_on = [&](std::size_t f) {
    for (std::size_t s = 0; s < stream_family_.size(); ++s)
      if (s != stream && working_[s] && stream_family_[s] == f) return true;
    return false;
  };
  for (std::size_t g = first_; g < groups_.size(); ++g)
    if (!taken_[g] && (!small_[family_[g]] || !others_on(family_[g]))) return g;
  return first_;  // every group left is on another stream's family: take one rather than idle
}

void GroupQueue::mark_taken_locked(std::size_t stream, std::size_t g) {
  taken_[g] = 1;
  stream_family_[stream] = family_[g];
  while (first_ < groups_.size() && taken_[first_]) ++first_;
}

std::optional<std::size_t> GroupQueue::take_locked(std::size_t stream) {
  const std::optional<std::size_t> next = candidate_locked(stream);
  if (!next) return std::nullopt;
  const std::size_t g = *next;
  std::uint64_t others = 0;
  for (std::size_t s = 0; s < held_.size(); ++s)
    if (s != stream) others += host_held_locked(s);
  // Alone, a group always runs (the run checked every case against the memory
  // there is); beside others, only within the budget. The stream's choice is
  // kept: a large group waits for room rather than being overtaken by a
  // smaller one of this stream's (another stream may take its own family's).
  // Its worker's kept blocks serve the group's case first: it holds the
  // larger of the two.
  if (budget_ > 0 && others > 0 && others + std::max(bytes_[g], kept_[stream]) > budget_) return std::nullopt;
  std::uint64_t mine_device = 0;
  if (device_.active()) {
    // The same on the stream's device, among the streams of that device
    // only: each with a worker holds its largest group's bytes and the
    // worker's own (its context). This stream's worker keeps what its
    // earlier groups left there (cached device caches, scratch, libtorch's
    // blocks), so it holds the larger of those and this group's.
    const std::size_t d = device_.stream_device[stream];
    mine_device = std::max(held_device_[stream], device_.group_bytes[g]);
    const std::uint64_t beside = device_beside_locked(stream);
    const std::uint64_t memory = device_.memory[d];
    if (memory > 0 && beside > 0 && beside + mine_device + device_.per_worker > memory) return std::nullopt;
  }
  held_[stream] = bytes_[g];
  note_kept_locked(stream, bytes_[g]);
  held_device_[stream] = mine_device;
  working_[stream] = 1;
  mark_taken_locked(stream, g);
  return g;
}

std::uint64_t GroupQueue::device_beside_locked(std::size_t stream) const {
  std::uint64_t beside = 0;
  for (std::size_t s = 0; s < held_.size(); ++s)
    if (s != stream && working_[s] && device_.stream_device[s] == device_.stream_device[stream])
      beside += held_device_[s] + ahead_device_[s] + device_.per_worker;
  return beside;
}

std::optional<std::size_t> GroupQueue::try_take_ahead(std::size_t stream) {
  const std::lock_guard lock(mutex_);
  if (has_ahead_[stream] || !working_[stream]) return std::nullopt;
  const std::optional<std::size_t> next = candidate_locked(stream);
  if (!next) return std::nullopt;
  const std::size_t g = *next;
  // Everything held, this stream's current group and this one included.
  std::uint64_t held = 0;
  for (std::size_t s = 0; s < held_.size(); ++s)
    held += s == stream ? std::max(held_[s] + bytes_[g], kept_[s]) : host_held_locked(s);
  if (budget_ > 0 && held > budget_) return std::nullopt;
  std::uint64_t device_bytes = 0;
  if (device_.active()) {
    device_bytes = device_.group_bytes[g];
    const std::uint64_t memory = device_.memory[device_.stream_device[stream]];
    if (memory > 0 && device_beside_locked(stream) + held_device_[stream] + device_bytes + device_.per_worker > memory)
      return std::nullopt;
  }
  ahead_[stream] = bytes_[g];
  note_kept_locked(stream, bytes_[g]);
  ahead_device_[stream] = device_bytes;
  has_ahead_[stream] = 1;
  mark_taken_locked(stream, g);
  return g;
}

void GroupQueue::advance(std::size_t stream) {
  {
    const std::lock_guard lock(mutex_);
    if (!has_ahead_[stream]) throw std::logic_error("GroupQueue::advance: no group taken ahead");
    held_[stream] = ahead_[stream];
    held_device_[stream] = std::max(held_device_[stream], ahead_device_[stream]);
    ahead_[stream] = ahead_device_[stream] = 0;
    has_ahead_[stream] = 0;
  }
  cv_.notify_all();
}

void GroupQueue::drop_locked(std::size_t stream) {
  held_[stream] = 0;
  kept_[stream] = 0;  // its worker is gone, and with it what it kept
  held_device_[stream] = 0;
  working_[stream] = 0;
  ahead_[stream] = ahead_device_[stream] = 0;
  has_ahead_[stream] = 0;
  stream_family_[stream].reset();  // a new worker has set nothing up
}

std::optional<std::size_t> GroupQueue::take(std::size_t stream, const std::function<bool()>& stop,
                                             const std::function<void()>& before_wait) {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (stop && stop()) return std::nullopt;
    if (first_ >= groups_.size()) {  // every group taken
      drop_locked(stream);
      cv_.notify_all();
      return std::nullopt;
    }
    if (auto g = take_locked(stream)) return g;
    if (held_[stream] > 0 || (device_.active() && working_[stream])) {
      // A stream that waits holding memory could wait for one that waits for
      // it: it gives its memory up first (its worker ends, and with it its
      // device memory), so that waiting streams hold nothing and the head
      // group always fits beside the running ones once they finish.
      lock.unlock();
      if (before_wait) before_wait();
      lock.lock();
      drop_locked(stream);
      cv_.notify_all();
      continue;
    }
    // Polled as well: a stop request has no notification of its own.
    cv_.wait_for(lock, std::chrono::milliseconds(200));
  }
}

void GroupQueue::release(std::size_t stream) {
  {
    const std::lock_guard lock(mutex_);
    drop_locked(stream);
  }
  cv_.notify_all();
}

namespace {

// The streams: one, one per device, or several taking groups from one queue.
std::vector<Record> run_some_streams(const RunConfig& cfg, const std::vector<std::string>& backend_names,
                                     const std::vector<Job>& jobs, const IsolationOptions& opt,
                                     const std::function<void(const Record&)>& on_record) {
  // The streams: --workers of them per device (the devices first, so that
  // every device has one before any has two), or --workers in all without --devices.
  const std::size_t per = std::max<std::size_t>(1, opt.workers);
  std::vector<std::string> stream_device;
  for (std::size_t k = 0; k < per; ++k) {
    if (opt.devices.empty()) stream_device.emplace_back();
    for (const std::string& d : opt.devices) stream_device.push_back(d);
  }
  if (per == 1 && opt.devices.size() > 1) return run_per_device(cfg, backend_names, jobs, opt, on_record);
  if (stream_device.size() == 1) {
    IsolationOptions one = opt;
    one.device = stream_device.front();
    std::size_t i = 0;
    return run_stream(
        cfg, backend_names,
        [&](const std::function<void()>&, std::optional<std::size_t>& ahead) -> const Job* {
          if (i >= jobs.size()) return nullptr;
          ahead = isolation_detail::ahead_in_list(cfg, jobs, i, two_cases_fit(cfg, opt, 0));
          return &jobs[i++];
        },
        one, on_record);
  }
  // Several streams take groups of jobs from one queue as they finish the
  // last: a group is every job of the cases with the same inputs (another kv
  // cache dtype), which one worker hands on from case to case instead of
  // generating them again. Which stream runs a group depends on timing; its
  // records do not (each case is made from its seed).
  const std::size_t n = stream_device.size();
  std::vector<std::vector<Job>> groups = job_groups(cfg, jobs);
  // Host memory: each worker holds one case at a time (its context is freed
  // before the next is made), so groups run side by side only while their
  // estimates fit in the memory available now.
  std::vector<std::uint64_t> bytes;
  for (const auto& g : groups) {
    std::uint64_t most = 0;
    for (const Job& j : g) {
      const CaseSpec& c = cfg.cases.at(j.case_index);
      most = std::max(most, estimate_case_bytes(c, runs_prefill_op(c, cfg.ops)));
    }
    bytes.push_back(most);
  }
  if (opt.largest_first) order_groups(groups, bytes, n);
  // Device memory (--reference cuda): per device, the groups side by side
  // there fit in it with their workers' own.
  DeviceBudget device;
  if (opt.device_memory.active()) {
    device.memory = opt.device_memory.device_bytes;
    device.per_worker = opt.device_memory.worker_bytes;
    for (std::size_t s = 0; s < n; ++s) device.stream_device.push_back(s % device.memory.size());
    for (const auto& g : groups) {
      std::uint64_t most = 0;
      for (const Job& j : g) most = std::max(most, opt.device_memory.case_bytes.at(j.case_index));
      device.group_bytes.push_back(most);
    }
  }
  // Where the order is the harness's, the groups of one shape (other seeds)
  // go to one worker in turn where they are small (GroupQueue: families), so
  // that each worker meets fewer shapes. MLAGATE_GROUP_FAMILIES=0 (a
  // measurement aid) hands them out in order only.
  std::vector<std::size_t> families;
  const char* families_env = std::getenv("MLAGATE_GROUP_FAMILIES");
  if (opt.largest_first && !(families_env && std::string(families_env) == "0")) {
    std::map<std::string, std::size_t> family_of;
    for (const auto& g : groups)
      families.push_back(
          family_of.emplace(shape_key(cfg.cases.at(g.front().case_index)), family_of.size()).first->second);
  }
  GroupQueue queue(std::move(groups), std::move(bytes), available_memory_bytes(), n, std::move(device),
                   std::move(families), worker_pool_bytes(opt));
  // Each stream's source: the jobs of the group it took, then the next group,
  // taken ahead (when it fits) as the current group's last case begins, for
  // its worker to make that group's first case meanwhile.
  std::vector<const std::vector<Job>*> group(n, nullptr);
  std::vector<std::optional<std::size_t>> taken_ahead(n);
  std::vector<std::size_t> next(n, 0);
  return run_streams(
      cfg, backend_names, stream_device, opt, on_record,
      [&](std::size_t d, const std::function<bool()>& stop) -> JobSource {
        return [&, d, stop](const std::function<void()>& end_worker, std::optional<std::size_t>& ahead) -> const Job* {
          while (!group[d] || next[d] >= group[d]->size()) {
            std::optional<std::size_t> g = std::exchange(taken_ahead[d], std::nullopt);
            if (g)
              queue.advance(d);
            else if (!(g = queue.take(d, stop, end_worker)))
              return nullptr;
            group[d] = &queue.group(*g);
            next[d] = 0;
          }
          const std::vector<Job>& jobs = *group[d];
          const std::size_t k = next[d]++;
          const bool last_case_begins = (k == 0 || jobs[k - 1].case_index != jobs[k].case_index) &&
                                        jobs.back().case_index == jobs[k].case_index;
          if (last_case_begins && opt.prepare_ahead && !taken_ahead[d])
            if ((taken_ahead[d] = queue.try_take_ahead(d))) ahead = queue.group(*taken_ahead[d]).front().case_index;
          return &jobs[k];
        };
      },
      [&](std::size_t d) {
        queue.release(d);
        // Its worker is gone: the cores it had go to those still at work.
        if (opt.core_share) opt.core_share->worker_done();
      });
}

}  // namespace

std::vector<Record> run_isolated(const RunConfig& cfg, const std::vector<std::string>& backend_names,
                                 const std::vector<Job>& jobs, const IsolationOptions& opt,
                                 const std::function<void(const Record&)>& on_record) {
  IgnoreSigpipe sigpipe;
  double domain_before = 0;
  {
    const std::lock_guard lock(profile_mutex());
    domain_before = run_profile().worker_domain_ms();
  }
  const auto t0 = Clock::now();
  std::vector<Record> records;
  std::exception_ptr error;  // thrown after the profile has the streams' time
  try {
    records = run_some_streams(cfg, backend_names, jobs, opt, on_record);
  } catch (...) {
    error = std::current_exception();
  }
  {
    // The job rows sum every worker's time (--workers, --devices: several
    // side by side); what ran beside another's comes off, so that the rows
    // still sum to the wall. One stream has nothing beside it.
    const std::lock_guard lock(profile_mutex());
    RunProfile& prof = run_profile();
    const std::size_t n = std::max<std::size_t>(1, opt.workers) * std::max<std::size_t>(1, opt.devices.size());
    prof.streams = std::max(prof.streams, static_cast<int>(n));
    if (n > 1)
      prof.side_by_side_ms += std::max(0.0, prof.worker_domain_ms() - domain_before -
                                                std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  if (error) std::rethrow_exception(error);
  return records;
}

std::size_t host_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return static_cast<std::size_t>(CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

std::size_t host_only_workers(std::size_t cpus) { return std::clamp<std::size_t>(cpus, 1, 8); }

std::size_t explore_workers_per_device(bool gpu_reference, std::size_t cpus, std::size_t devices) {
  if (!gpu_reference) return host_only_workers(cpus);
  return std::max<std::size_t>(1, auto_workers_per_device(cpus, devices) / 2);
}

std::size_t auto_workers_per_device(std::size_t cpus, std::size_t devices) {
  devices = std::max<std::size_t>(1, devices);
  // One per 2 cores in all up to 16 in all, never fewer than one per 4 cores
  // in all (the rule before, on hosts of more cores), at most 8 a device. With
  // several devices each device's workers are fewer contexts to time-slice,
  // and the host's work per job is what the wall waits for, so more of them
  // side by side pay (2 H200s, 32 cores: 8 a device 20.1 s against 22.4-23.3
  // s with 4); 16 in all is the most measured (4 H200s, 64 cores: 4 a device
  // 21.0 s, 3 21.2 s, 2 23.0 s). One GPU was one per 4 cores until its
  // workers made their next cases ahead and met fewer shapes (GroupQueue's
  // families): one H200 of 16 cores then took 20.6-21.5 s with 8 workers
  // against 24.7-25.0 s with 4 (12: 20.3 s; 2026-11-29, PERFORMANCE.md).
  const std::size_t total = std::max(cpus / 4, std::min<std::size_t>(cpus / 2, 16));
  return std::clamp<std::size_t>(total / devices, 1, 8);
}

void share_cores(IsolationOptions& io, int threads, bool host_only) {
  const std::size_t devices = std::max<std::size_t>(1, io.devices.size());
  const std::size_t workers = std::max<std::size_t>(1, io.workers);
  // Each worker's block pool keeps its share of half the memory
  // (cases/block_pool.h): the default assumes 16 processes, and on the 2-core
  // VM (2 workers, 23 GiB) its 753 MB left a TP 1 prefill's 2.7 GB of keys
  // and values to be faulted in and zeroed case after case (that group alone:
  // system time 2.0 s against 3.1-7.0 s, the same records; PERFORMANCE.md).
  if (!std::getenv(kBlockPoolVariable))
    io.env.push_back(std::string(kBlockPoolVariable) + "=" + std::to_string(block_pool_share(devices * workers) >> 20));
  if (devices * workers <= 1) return;
  // Idle OpenMP threads sleep whenever workers run side by side, a --threads
  // of the user's included: 8 workers of 10 spinning threads on 32 cores took
  // the 4-seed vllm run from 28.8 s to 100.8 s (3058 s of user time; PERFORMANCE.md).
  if (!std::getenv("OMP_WAIT_POLICY")) io.env.push_back("OMP_WAIT_POLICY=passive");
  // Workers side by side fault in and zero the pages of each case's large
  // host buffers again and again; glibc's malloc asking for transparent huge
  // pages (madvise) cut the system time of the 4-seed vllm run on 2 H200s
  // from 39-54 s to 28-30 s and its 20-21 s wall by 0.5-1 s, the same bits (PERFORMANCE.md,
  // "What a second GPU's workers wait for"). An older glibc ignores the tunable,
  // a host without THP too; the user's GLIBC_TUNABLES is left as it is.
  if (!std::getenv("GLIBC_TUNABLES")) io.env.push_back("GLIBC_TUNABLES=glibc.malloc.hugetlb=1");
  if (threads > 0) return;
  // About one worker per device is in a backend call at a time (waiting on
  // its GPU, one thread), so the others' parallel phases share the cores:
  // cores / (workers - 1) each, per device. OpenMP threads sleep when idle
  // instead of spinning (unless the environment says otherwise): a team of
  // one thread per core in each worker, spinning, took the vllm GPU suite
  // from 19 s to 58 s on 3 workers.
  // CPU backends compute in their calls: a worker a share, no more threads
  // than cores (vllm x cpu.* on the 2-core VM, 2 workers, alternating: 77.7-
  // 89.1 s, mean 83.2, with a thread each; 81.7-91.2 s, mean 86.0, with two
  // each; within the VM's noise, the records identical; PERFORMANCE.md).
  const std::size_t busy = host_only ? devices * workers : devices * (workers > 1 ? workers - 1 : 1);
  // A --threads 0 of the run's own is replaced, not given twice.
  for (std::size_t k = 1; k < io.argv.size();) {
    if (io.argv[k] == "--threads" && k + 1 < io.argv.size())
      io.argv.erase(io.argv.begin() + static_cast<std::ptrdiff_t>(k), io.argv.begin() + static_cast<std::ptrdiff_t>(k + 2));
    else if (io.argv[k].rfind("--threads=", 0) == 0)
      io.argv.erase(io.argv.begin() + static_cast<std::ptrdiff_t>(k));
    else
      ++k;
  }
  const auto at = std::find(io.argv.begin(), io.argv.end(), "--worker");  // before the mode flag, if there
  io.argv.insert(at, {"--threads", std::to_string(std::max<std::size_t>(1, host_cpus() / busy))});
  // Host-only workers' shares grow as others end (core_share.h): the last
  // group of a run no longer runs on one core of two. Not where workers wait
  // on a GPU (their shares are not the cores they compute on), nor where the
  // user chose --threads; nor with MLAGATE_CORE_SHARE=off in the run's
  // environment (a measurement aid: the workers inherit a name that names no
  // page, and keep their shares). Any other value there is replaced.
  const char* share_env = std::getenv(kCoreShareVariable);
  if (host_only && io.devices.empty() && !(share_env && std::string(share_env) == "off")) try {
      io.core_share = std::make_shared<CoreShare>(devices * workers, host_cpus());
      io.env.push_back(io.core_share->env());
    } catch (const std::runtime_error&) {
      // No page to be had: each keeps its share, as before.
    }
}

}  // namespace mlagate
