// `mlagate run` and `mlagate replay`, in four steps: plan (the cases, ops,
// policy, references and backends, everything checked before anything runs),
// execute (journaled, in worker processes or in this one), follow up (sanitizer
// reruns, saved failures) and finish (reports, console summary, exit code).
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <optional>
#include <system_error>
#include <thread>

#include "backends/registry.h"
#include "cases/case.h"
#include "cases/errors.h"
#include "cases/generator.h"
#include "cases/input_store.h"
#include "cases/process_slot.h"
#include "harness/cli/cli.h"
#include "backends/exec/subprocess.h"
#include "harness/cli/commands.h"
#include "harness/cli/run_plan.h"
#include "harness/reliability/isolate.h"
#include "harness/reliability/journal.h"
#include "harness/reliability/memory_estimate.h"
#include "harness/reliability/repeat.h"
#include "harness/run/serving.h"
#include "harness/reliability/sanitize.h"
#include "harness/run/golden_run.h"
#include "harness/run/run_config.h"
#include "harness/run/runner.h"
#include "harness/verdicts/expectations.h"
#include "harness/verdicts/facts.h"
#include "mlagate/config.h"
#include "mlagate/version.h"
#include "reports/profile.h"
#include "reports/report.h"
#include "reports/shard.h"
#if MLAGATE_HAS_CUDA
#include "harness/cli/gpu_glue.h"
#endif

namespace mlagate {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// SIGINT/SIGTERM during a run: the run stops between records, writes the
// reports of what finished and exits 128 + signal. A second signal acts as usual.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

struct StopSignals {
  struct sigaction old_int {}, old_term {};
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;  // no SA_RESTART: waits wake up at once
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
};

// One run from its plan to its exit code; the steps share this state.
class RunCommand {
 public:
  RunCommand(const Selection& sel, const RunArgs& ra, const std::string& command_line,
             const std::vector<std::string>& args)
      : sel_(sel), ra_(ra), command_line_(command_line), args_(args) {}

  int main() {
    plan();
#if MLAGATE_HAS_CUDA
    const GpuGlue gpu_glue(cfg_.reference.name);  // harness/cli/gpu_glue.h
#endif
    if (ra_.worker) return worker_main(cfg_, backends_, device_check_.valid() ? [this] { device_check_.get(); }
                                                                               : std::function<void()>());
    plan_parent();
    // In this process, the device is checked before anything runs; workers
    // check their own, before their first record.
    if (device_check_.valid()) device_check_.get();
    execute();
    const auto post0 = Clock::now();
    collect_records();
    if (stop_signal_ == 0) {
      sanitize();
      save_failures();
    }
    const std::string results_file = golden_ ? golden_->finish() : std::string();
    run_profile().post_ms += ms_since(post0);
    return finish(results_file);
  }

 private:
  // The cases, ops, policy, references, backends and repro commands; every
  // input checked before anything runs (workers run this too).
  void plan() {
    if (ra_.threads > 0) omp_set_num_threads(ra_.threads);
    shard_ = resolve_shard(ra_.shard);
    // Golden files: replay takes the file's cases, so does run --golden when no
    // selection flag is given; stored references replace the recomputed ones.
    if (!ra_.golden.empty() || !ra_.replay.empty() || !ra_.save_results.empty())
      golden_.emplace(GoldenRunOptions{ra_.golden, ra_.replay, ra_.case_ids, ra_.save_results, ra_.max_bytes,
                                       command_line_, shard_ ? shard_->str() : std::string(), ra_.worker});
    from_file_ = !ra_.replay.empty() || (!ra_.golden.empty() && sel_.argv().empty());
    if (from_file_) cfg_.cases = golden_->file_cases(sel_.filter);
    else if (!ra_.case_ids.empty()) cfg_.cases = sel_.resolve_ids(ra_.case_ids);  // the order-dependent repro's order
    else cfg_.cases = sel_.resolve();
    serving_ = serving_mode(ra_);
    // A decode loop's case: each request decodes its tokens one step at a
    // time (a golden file's cases were stored already rewritten).
    if (const auto* loop = serving_.get<modes::DecodeLoop>(); loop && !from_file_)
      for (CaseSpec& c : cfg_.cases) c = decode_loop_spec(c, loop->steps);
    if (shard_)
      std::erase_if(cfg_.cases, [this](const CaseSpec& c) { return shard_of(c.id(), shard_->count) != shard_->index; });
    apply_order(cfg_.cases, ra_.order);
    // Drawn tensors are kept for a later case of their seed, and shared
    // between workers, only where one can come (cases/case.h); explore's
    // rounds draw a seed per case.
    seeds_repeat_ = seeds_repeat(cfg_.cases);
    set_keep_drawn_inputs(seeds_repeat_);
    if (ra_.repeat < 1) throw InputError("--repeat must be >= 1");
    give_cases_their_ops(cfg_.cases, ra_.ops);
    cfg_.ops = resolve_ops(ra_.ops, cfg_.cases);
    if (serving_.active()) cfg_.ops = serving_.ops(ra_.ops == std::vector<std::string>{"auto"}, cfg_.ops, cfg_.cases);
    // A case beyond this machine's memory is refused before anything is
    // allocated, by the run's own process. Not again in its workers: one that
    // starts while its siblings hold memory sees less available and refused
    // the whole run (explore --workers 2 on the 2-core VM: a 22.2 GiB case
    // against 22.2 GiB, the round a harness error); the parent already plans
    // the groups side by side within the host's memory (streams.cpp).
    if (!from_file_ && !ra_.worker) refuse_cases_beyond_host(cfg_.cases, cfg_.ops, available_memory_bytes());
    // --reference cuda's device: a worker checks its own while it makes its
    // first case (worker_main's device_ready), the run in this process before
    // anything runs (plan_parent); a parent of workers makes no CUDA context.
    if (reference_on_gpu() && ra_.worker) device_check_ = start_device_check();
    configure_computation(ra_, cfg_, !reference_on_gpu());
    extra_entries_ = ra_.extra.entries();
    backends_ = select_backends(ra_.backends, BackendOptions{ra_.splits}, extra_entries_);
    ra_.reports.check_paths();
    // Expectations files are inputs: a malformed one ends the run before anything runs.
    if (!ra_.worker) expect_ = ExpectationSet::load(ra_.expect);
    // A golden file is validated whole here, in the parent, before any worker
    // starts: a bad file is exit 2 with one message, never a backend's record.
    if (golden_ && !ra_.worker) golden_->validate(cfg_.cases, cfg_.exec);
    make_repro_commands();
    install_console();
    if (golden_) golden_->attach(cfg_);
    if (ra_.repeat > 1)
      cfg_.run_job = [this, n = ra_.repeat](CaseContext& ctx, Backend& b, Op op) { return run_repeated(ctx, b, op, cfg_, n); };
    if (serving_.active())
      cfg_.run_job = [this](CaseContext& ctx, Backend& b, Op op) { return run_serving(ctx, b, op, cfg_, serving_); };
    // A plain run draws a case that takes only cache_write without what that
    // op never reads (RunConfig::keys_only_cases).
    cfg_.keys_only_cases = ra_.repeat <= 1 && !serving_.active() && ra_.save_results.empty();
  }

  static ServingMode serving_mode(const RunArgs& ra) {
    ServingMode m = ra.serving.mode();
    if (ra.require_batch_invariance() && !m.get<modes::BatchInvariance>())
      throw InputError("--require batch-invariance needs --check batch-invariance");
    if (m.active() && ra.repeat > 1) throw InputError(m.name() + " and --repeat are separate checks: give one of them");
    if (auto* graph = m.get<modes::CudaGraph>()) graph->graphs = make_graph_store();
    return m;
  }

  // Repro commands: the selection (or the file), the case, the backend and
  // op, then the flags that change what a record computes.
  void make_repro_commands() {
    const RunArgs& ra = ra_;
    const std::vector<std::string> sel = sel_.argv();
    const std::vector<std::string> computation = ra.computation_argv();
    run_prefix_ = "mlagate run" + (sel.empty() ? "" : " " + join_shell_words(sel)) +
                  (ra.golden.empty() ? "" : " --golden " + exec::shell_word(ra.golden));
    const std::vector<std::string> extra = ra.extra.argv();
    extra_args_ = extra.empty() ? "" : " " + join_shell_words(extra);
    computation_args_ = " " + join_shell_words(computation);
    // An embedding host's backends are rerun by its own command (embedded_command()).
    const std::string program = embedded_command();
    const std::string prefix = program + run_prefix_.substr(std::string("mlagate").size());
    cfg_.repro = [this, program, prefix](const CaseSpec& c, const std::string& backend, Op op) {
      const std::string tail = extra_args_ + " --backend " + backend + " --op " + std::string(op_name(op)) + computation_args_;
      if (!ra_.replay.empty())
        return program + " replay " + exec::shell_word(ra_.replay) + " --case " + exec::shell_word(c.id()) + tail;
      return prefix + " --filter " + exec::shell_word("^" + regex_escape(c.id()) + "$") + tail;
    };
    if (!from_file_)
      cfg_.repro_sequence = [this, prefix](const std::vector<const CaseSpec*>& seq, const std::string& backend, Op op) {
        std::string cases;
        for (const CaseSpec* c : seq) cases += " --case " + exec::shell_word(c->id());
        return prefix + cases + extra_args_ + " --backend " + backend + " --op " + std::string(op_name(op)) +
               computation_args_;
      };
  }

  // Failures as they come (with their repro) and a progress bar on a terminal.
  void install_console() {
    tty_ = isatty(STDERR_FILENO) && !ra_.no_progress && !ra_.quiet;
    cfg_.on_record = [this](const Record& r, std::size_t done, std::size_t total) {
      if (r.expected.outcome != Expected::kNone) {
        // Known failures in one line each; a strict XPASS is a failure and says so. A
        // non-strict XPASS is counted in the summary only (its entry expects some passes).
        const bool fails = record_fails_run(r, ra_.require_batch_invariance());
        failed_so_far_ += fails ? 1 : 0;
        const bool quiet_xpass = r.expected.outcome == Expected::kXpass && !r.expected.strict;
        if ((!ra_.quiet && !quiet_xpass) || fails) {
          if (tty_) std::fprintf(stderr, "\r\033[K");
          std::printf("%-10s %-12s %-7s %s  (%s, %s%s)\n", std::string(expected_name(r.expected.outcome)).c_str(),
                      r.backend.c_str(), r.op.c_str(), r.case_id.c_str(), std::string(status_name(r.status)).c_str(),
                      r.expected.entry.c_str(),
                      r.expected.outcome == Expected::kXpass ? (r.expected.strict ? ": passed, strict" : ": passed") : "");
          std::fflush(stdout);
        }
      } else if (status_is_failure(r.status)) {
        ++failed_so_far_;
        if (tty_) std::fprintf(stderr, "\r\033[K");
        std::printf("%-10s %-12s %-7s %s\n  %s\n  repro: %s\n", std::string(status_name(r.status)).c_str(),
                    r.backend.c_str(), r.op.c_str(), r.case_id.c_str(), r.message.c_str(), r.repro.c_str());
        std::fflush(stdout);
      }
      if (tty_) {
        const int width = 30;
        const int filled = static_cast<int>(width * done / std::max<std::size_t>(total, 1));
        std::fprintf(stderr, "\r\033[K[%.*s%*s] %zu/%zu  failed %zu  %s", filled, "##############################",
                     width - filled, "", done, total, failed_so_far_, r.case_id.c_str());
        if (done == total) std::fprintf(stderr, "\r\033[K");
        std::fflush(stderr);
      }
    };
  }

  // --reference cuda in a CUDA build: its device is checked apart from the rest of the plan.
  bool reference_on_gpu() const { return ra_.reference == "cuda" && MLAGATE_HAS_CUDA; }
  // Every backend of the run runs on the host alone (Capabilities::host_only).
  bool host_only() const {
    return !backends_.empty() && !reference_on_gpu() &&
           std::all_of(backends_.begin(), backends_.end(), [](const auto& b) { return b->capabilities().host_only; });
  }

  // A case beyond its device's memory is refused before anything runs; workers get the devices' budgets.
  void plan_devices_memory() {
    device_memory_ = plan_device_memory(cfg_, backends_, devices_, ra_.splits, !from_file_, ra_.device_memory_gib);
  }

  // The parent's choices: isolation, reliability options, the journal.
  void plan_parent() {
    devices_ = resolve_devices(ra_.devices);
    isolate_ = ra_.isolate;
    if (isolate_.empty()) isolate_ = !worker_command().empty() && ra_.save_results.empty() ? "process" : "none";
    if (isolate_ != "process" && isolate_ != "none") throw InputError("--isolate '" + isolate_ + "' (expected process or none)");
    if (isolate_ == "process" && worker_command().empty())
      throw InputError("--isolate process: no worker executable (mlagate is embedded); use --isolate none");
    if (isolate_ == "process" && !ra_.save_results.empty())
      throw InputError("--save-results keeps every output in this process: use it with --isolate none");
    if (!(ra_.timeout >= 0)) throw InputError("--timeout must be >= 0");
    if (ra_.order == "pairs" && isolate_ != "process") throw InputError("--order pairs needs --isolate process");
    workers_ = 1;
    if (ra_.workers != "auto") {
      char* end = nullptr;
      const long n = std::strtol(ra_.workers.c_str(), &end, 10);
      if (ra_.workers.empty() || *end != '\0' || n < 1 || n > 64)
        throw InputError("--workers '" + ra_.workers + "' (expected auto or a number from 1 to 64)");
      workers_ = static_cast<std::size_t>(n);
      if (workers_ > 1 && isolate_ != "process") throw InputError("--workers needs --isolate process");
      // Which cases a worker runs, and after which, depends on timing with
      // several: an order asked for could not be kept.
      if (workers_ > 1 && ra_.order != "given")
        throw InputError("--order " + ra_.order + " needs --workers 1 (workers side by side run the cases in an order "
                         "that depends on timing)");
    } else if (isolate_ == "process" && cfg_.reference.name == "cuda" && ra_.order == "given") {
      // The GPU run: each worker's case preparation (inputs, caches, the CPU
      // baseline emulation, the glue) runs beside another's backend calls,
      // on every device. One worker per device left a device idle while its
      // worker prepared (2 H200s, vllm x 4 seeds: 48.4 s with 1 per device,
      // 29.7 s with 4, against 35.3 s on one GPU with 4); up to 8 a device
      // where the cores allow (auto_workers_per_device says how many).
      workers_ = auto_workers_per_device(host_cpus(), std::max<std::size_t>(1, devices_.size()));
    } else if (isolate_ == "process" && ra_.order == "given" && devices_.empty() && host_only()) {
      // The CPU run: one worker's harness work (inputs, the fp64 reference,
      // the baseline emulation, the glue) runs beside another's backend
      // calls. vllm x cpu.* on the 2-core VM: 94.3 and 88.3 s with one worker
      // (the harness alone 67.0% and 66.6% of the wall), 90.1 and 80.0 s with
      // two (54.8%, 54.9%), the records identical (PERFORMANCE.md).
      workers_ = host_only_workers(host_cpus());
    }
    if (reference_on_gpu() && isolate_ != "process") device_check_ = start_device_check();
    if (ra_.threads < 0) throw InputError("--threads must be >= 0 (0: every core)");
    if (!devices_.empty() && isolate_ != "process")
      throw InputError("--devices needs --isolate process (a worker per device)");
    if (!ra_.save_failures.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(ra_.save_failures, ec);
      if (!std::filesystem::is_directory(ra_.save_failures))
        throw InputError("--save-failures " + ra_.save_failures + ": not a directory" + (ec ? " (" + ec.message() + ")" : ""));
    }
    if (!ra_.sanitize.empty()) {
      check_sanitize_tool(ra_.sanitize);
      if (worker_executable().empty()) throw InputError("--sanitize: no mlagate executable to rerun (mlagate is embedded)");
      if (ra_.sanitize_launch_count < 1) throw InputError("--sanitize-launch-count must be >= 1");
    }
    // The journal: every record on disk as it completes; --resume reads it back.
    std::string journal_path = ra_.journal;
    for (const std::string* p : ra_.reports.paths())
      if (journal_path.empty() && !p->empty()) journal_path = *p + ".journal.jsonl";
    if (ra_.resume && journal_path.empty())
      throw InputError("--resume: no journal to resume (give --journal FILE, or the interrupted run's report path)");
    if (!journal_path.empty()) journal_.emplace(journal_path, fingerprint(), ra_.resume);
    if (journal_)
      for (const Record& r : journal_->previous()) finished_[Journal::key(r)] = r;
    all_cases_ = cfg_.cases;  // in-process resume narrows cfg_.cases
    total_ = job_count(cfg_, backends_.size());
    for (std::size_t ci = 0; ci < cfg_.cases.size(); ++ci)
      for (std::size_t bi = 0; bi < backends_.size(); ++bi)
        for (Op op : cfg_.ops)
          if (cfg_.cases[ci].takes(op)) done_count_ += finished_.count(job_key(ci, bi, op));
    if (ra_.resume && !ra_.quiet)
      std::printf("resuming from %s: %zu of %zu records already finished\n", journal_path.c_str(), done_count_, total_);
  }

  // What a journal must have been written by to be resumed: the same command
  // up to its report paths and reliability flags.
  std::string fingerprint() const {
    std::string ops;
    for (Op o : cfg_.ops) ops += (ops.empty() ? "" : ",") + std::string(op_name(o));
    std::string ids;
    for (const auto& id : ra_.case_ids) ids += " --case " + exec::shell_word(id);
    return (ra_.replay.empty() ? run_prefix_.substr(std::string("mlagate ").size())
                               : "replay " + exec::shell_word(ra_.replay)) +
           (sel_.filter.empty() ? "" : " --filter " + exec::shell_word(sel_.filter)) + ids + extra_args_ +
           " --backend " + exec::shell_word(ra_.backends) + " --op " + ops + computation_args_ +
           (ra_.order == "given" ? "" : " --order " + ra_.order) + (shard_ ? " --shard " + shard_->str() : "");
  }

  std::string job_key(std::size_t ci, std::size_t bi, Op op) const {
    return Journal::key(all_cases_[ci].id(), std::string(backends_[bi]->name()), std::string(op_name(op)));
  }

  // Every record not already in the journal, in worker processes or here.
  void execute() {
    const auto progress = cfg_.on_record;
    auto record_done = [this, progress](const Record& done) {
      const auto t0 = Clock::now();
      Record r = done;
      annotate(r);
      if (journal_) journal_->append(r);
      fresh_[Journal::key(r)] = r;
      ++done_count_;
      if (progress) progress(r, done_count_, total_);
      run_profile().record_ms += ms_since(t0);
    };
    StopSignals stop_signals;
    cfg_.stop = [] { return g_stop_signal != 0; };
    if (isolate_ == "none") {
      std::erase_if(cfg_.cases, [&](const CaseSpec& c) {
        for (const auto& b : backends_)
          for (Op op : cfg_.ops)
            if (c.takes(op) && !finished_.count(Journal::key(c.id(), std::string(b->name()), std::string(op_name(op))))) return false;
        return true;
      });
      auto inner = cfg_.run_job;
      cfg_.run_job = [this, inner](CaseContext& ctx, Backend& b, Op op) -> Record {
        const auto it = finished_.find(Journal::key(context_spec(ctx).id(), std::string(b.name()), std::string(op_name(op))));
        if (it != finished_.end()) return it->second;
        return inner ? inner(ctx, b, op) : run_one(ctx, b, op, cfg_);
      };
      cfg_.on_record = [this, record_done](const Record& r, std::size_t, std::size_t) {
        if (!finished_.count(Journal::key(r))) record_done(r);
      };
      plan_devices_memory();
      run_profile().setup_ms = ms_since(process_start_time());
      run_cases(cfg_, backends_);
    } else {
      std::vector<std::string> names;
      for (const auto& b : backends_) names.emplace_back(b->name());
      std::vector<Job> jobs;
      for (std::size_t ci = 0; ci < cfg_.cases.size(); ++ci)
        for (std::size_t bi = 0; bi < backends_.size(); ++bi)
          for (Op op : cfg_.ops)
            if (cfg_.cases[ci].takes(op) && !finished_.count(job_key(ci, bi, op))) jobs.push_back(Job{ci, bi, op});
      IsolationOptions io;
      io.argv = worker_command();
      io.argv.insert(io.argv.end(), args_.begin() + 1, args_.end());
      io.argv.push_back("--worker");
      io.timeout_s = ra_.timeout;
      io.pairs = ra_.order == "pairs";
      io.max_order_checks = static_cast<std::size_t>(ra_.order_checks);
      io.devices = devices_;
      io.workers = workers_;
      io.largest_first = ra_.order == "given";
      const std::size_t workers_in_all = std::max<std::size_t>(1, devices_.size()) * std::max<std::size_t>(1, workers_);
      // Cases made ahead where a worker's thread leaves cores to them: a GPU
      // reference (the jobs wait on the device; one H200 of 16 cores: 2
      // workers 56.8 -> 45.8 s, 4 workers 33.0 -> 31.9 s) or one worker in all
      // (2 cores: 72-73 -> 64-68 s). Not CPU workers side by side, which
      // already keep every core busy (2 cores, 2 workers: 43 -> 62-65 s).
      // PERFORMANCE.md, "Cases made ahead". MLAGATE_PREPARE_AHEAD=0 or 1 decides.
      io.prepare_ahead = cfg_.reference.on_device || workers_in_all == 1;
      if (const char* a = std::getenv("MLAGATE_PREPARE_AHEAD"); a && (std::string(a) == "0" || std::string(a) == "1"))
        io.prepare_ahead = std::string(a) == "1";
      // Where the worker would not (a golden file read, outputs written: one
      // thread at a time in the HDF5 library), no group is taken ahead for it.
      if (cfg_.prepare || cfg_.on_outputs) io.prepare_ahead = false;
      share_cores(io, ra_.threads, devices_.empty() && host_only());
      // Workers side by side draw each large input once between them
      // (cases/input_store.h); without a folder each draws its own. Only
      // where two cases share a seed: otherwise no worker reads what another
      // publishes, and writing each case's inputs into the store was a copy
      // into new memory per tensor (explore cpu.* on the 2-core VM: 5.73-6.73
      // cases/s without against 5.02-5.47 with, 2026-12-03). A CUDA build
      // makes the folder anyway for its start-up slots.
      if (workers_in_all > 1 && (seeds_repeat_ || MLAGATE_HAS_CUDA)) {
        try {
          input_store_ = InputStoreFolder::create();
          if (seeds_repeat_) io.env.push_back(input_store_.env());
#if MLAGATE_HAS_CUDA
          // And start their CUDA a few at a time, in slots kept in that folder
          // (cases/process_slot.h, gpu/device.cpp).
          io.env.push_back(std::string(kProcessSlotFolderVariable) + "=" + input_store_.path());
#endif
        } catch (const std::exception& e) {
          if (!ra_.quiet) std::fprintf(stderr, "mlagate: %s; each worker draws its own inputs\n", e.what());
        }
      }
      io.reap_later = true;  // finish() waits for the last workers' ends after the reports
      // The first workers load while this process starts its CUDA to plan the
      // devices' memory (isolate.h); a case refused there ends the run first.
      io.prestarted = prestart_workers(cfg_, jobs, io);
      plan_devices_memory();
      io.device_memory = device_memory_;
      run_profile().setup_ms = ms_since(process_start_time());
      run_isolated(cfg_, names, jobs, io, record_done);
    }
    stop_signal_ = g_stop_signal;
  }

  // Records in run order: journaled ones where this run did not redo them
  // (annotated again: the expectations may have changed since).
  void collect_records() {
    for (std::size_t ci = 0; ci < all_cases_.size(); ++ci)
      for (std::size_t bi = 0; bi < backends_.size(); ++bi)
        for (Op op : cfg_.ops) {
          const std::string k = job_key(ci, bi, op);
          if (auto it = fresh_.find(k); it != fresh_.end()) records_.push_back(it->second);
          else if (auto jt = finished_.find(k); jt != finished_.end()) {
            records_.push_back(jt->second);
            annotate(records_.back());
          }
        }
  }

  // A record's facts (its case and this run's settings) and its --expect outcome.
  void annotate(Record& r) {
    if (case_by_id_.empty())
      for (const CaseSpec& c : all_cases_) case_by_id_.emplace(c.id(), &c);
    const auto it = case_by_id_.find(r.case_id);
    if (it == case_by_id_.end()) return;
    RunFacts rf;
    rf.poison = ra_.poison.poison;
    rf.reference = from_file_ || !ra_.golden.empty() ? "golden" : ra_.reference;
    rf.splits = ra_.splits;
    rf.repeat = ra_.repeat;
    r.facts = record_facts(*it->second, r, rf);
    expect_.apply(r);
  }

  // --sanitize: failing records (or every selected one) rerun under compute-sanitizer.
  void sanitize() {
    if (ra_.sanitize.empty()) return;
    SanitizeOptions so;
    so.tool = ra_.sanitize;
    so.sanitizer = ra_.sanitizer.empty() ? default_sanitizer() : ra_.sanitizer;
    const std::filesystem::path self = worker_executable();
    so.mlagate = (std::filesystem::is_symlink(self) ? std::filesystem::read_symlink(self) : self).string();
    so.launch_count = ra_.sanitize_launch_count;
    int budget = 20;  // reruns per run: each is a whole process under the sanitizer
    for (Record& r : records_) {
      if (r.status == Status::kNotSupported || r.status == Status::kSkipped || r.status == Status::kInvalidCase) continue;
      if (!status_is_failure(r.status) && ra_.case_ids.empty()) continue;
      if (budget-- <= 0) break;
      if (!ra_.quiet) std::printf("sanitizing (%s): %s %s %s\n", so.tool.c_str(), r.backend.c_str(), r.op.c_str(), r.case_id.c_str());
      sanitize_record(r, so);
      if (journal_) journal_->append(r);
    }
  }

  // --save-failures: each failing record's case as a golden file, and the command that replays it.
  void save_failures() {
    if (ra_.save_failures.empty()) return;
    for (Record& r : records_) {
      if (!status_is_failure(r.status) || r.status == Status::kInvalidCase) continue;
      const Op op = parse_op(r.op);
      if (op == Op::kCacheWrite) continue;  // golden files hold no cache_write reference
      const auto spec =
          std::find_if(all_cases_.begin(), all_cases_.end(), [&](const CaseSpec& c) { return c.id() == r.case_id; });
      const auto b = std::find_if(backends_.begin(), backends_.end(), [&](const auto& x) { return x->name() == r.backend; });
      if (spec == all_cases_.end() || b == backends_.end()) continue;
      std::string file;
      for (char ch : r.case_id + "__" + r.backend + "__" + r.op)
        file += std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '-' || ch == '_' ? ch : '_';
      const std::string path = (std::filesystem::path(ra_.save_failures) / (file + ".h5")).string();
      ExportOptions eo;
      eo.ops = {op};
      eo.policy = cfg_.policy;
      eo.cache.poison = cfg_.exec.poison;
      eo.cache.poison_block_table = cfg_.exec.poison_block_table;
      eo.command_line = command_line_;
      const int bs = r.block_size > 0 ? r.block_size : resolve_block_size((*b)->capabilities(), *spec);
      eo.block_sizes = [bs](const CaseSpec&) { return std::vector<int>{bs}; };
      try {
        export_golden({*spec}, path, eo);
        const std::string cmd = embedded_command() + " replay " + exec::shell_word(path) + extra_args_ + " --backend " + r.backend +
                                " --op " + r.op + computation_args_;
        r.details += (r.details.empty() ? "" : "\n") + std::string("repro bundle: ") + cmd;
        if (!ra_.quiet) std::printf("saved %s\n  replay: %s\n", path.c_str(), cmd.c_str());
      } catch (const std::exception& e) {
        r.details += (r.details.empty() ? "" : "\n") + std::string("repro bundle not written: ") + e.what();
      }
    }
  }

  // Reports, the console summary and the exit code.
  int finish(const std::string& results_file) {
    RunInfo info;
    info.tool_version = MLAGATE_VERSION;
    info.git_commit = MLAGATE_GIT_COMMIT;
    info.command_line = command_line_;
    info.suite = sel_.suite.empty() ? (sel_.specs.empty() ? "smoke" : "sweep") : sel_.suite;
    if (from_file_) info.suite = ra_.replay.empty() ? ra_.golden : ra_.replay;
    info.policy = cfg_.policy.describe();
    info.started_at = iso_now();
    info.wall_seconds = std::chrono::duration<double>(Clock::now() - wall0_).count();
    info.generator_version = gen::kGeneratorVersion;
    if (shard_) info.shard = shard_->str();
    info.require_batch_invariance = ra_.require_batch_invariance();
    if (stop_signal_ != 0)
      info.interrupted = (stop_signal_ == SIGINT    ? std::string("SIGINT")
                          : stop_signal_ == SIGTERM ? std::string("SIGTERM")
                                                    : "signal " + std::to_string(stop_signal_)) +
                         ": " + std::to_string(records_.size()) + " of " + std::to_string(total_) + " records";
    const auto reports0 = Clock::now();
    // The JSON report's profile covers the run up to its own writing (the --profile table has the reports too).
    info.profile_wall_ms = ms_since(process_start_time());
    {
      // Backend calls made in this process (--isolate none); workers' came with their records.
      auto& calls = run_profile().calls;
      for (const CallSpan& c : take_backend_calls()) calls.push_back(c);
    }
    info.profile = run_profile().rows(info.profile_wall_ms);
    info.profile_backend_in_flight_ms = run_profile().backend_in_flight_ms();
    info.profile_streams = run_profile().streams;
    info.profile_cases_ahead_begun = run_profile().cases_ahead_begun;
    info.profile_cases_ahead_used = run_profile().cases_ahead_used;
    const ReportArgs& rep = ra_.reports;
    if (!rep.json.empty()) write_report_file(rep.json, [&](std::ostream& os) { write_json(os, info, records_); });
    if (!rep.junit.empty()) write_report_file(rep.junit, [&](std::ostream& os) { write_junit(os, info, records_); });
    if (!rep.markdown.empty()) write_report_file(rep.markdown, [&](std::ostream& os) { write_markdown(os, info, records_); });
    if (!rep.html.empty()) write_report_file(rep.html, [&](std::ostream& os) { write_html(os, info, records_); });
    // A whole run's reports hold every record: its journal has done its job.
    if (journal_ && stop_signal_ == 0) {
      const std::string jp = journal_->path();
      journal_.reset();
      std::error_code ec;
      std::filesystem::remove(jp, ec);
    }
    run_profile().reports_ms += ms_since(reports0);
    const auto exit0 = Clock::now();
    reap_retired_workers();
    run_profile().worker_exit_ms += ms_since(exit0);

    // --require batch-invariance: BATCH_VARIANT records count as failed (the
    // verdict, the exit code and every report's summary; RunInfo carries it).
    const StatusCounts counts = count_statuses(records_, info);
    const std::int64_t required_variant = info.require_batch_invariance ? counts[Status::kBatchVariant] : 0;
    if (!ra_.quiet) {
      std::printf("\n%s", summary_table(records_).c_str());
      std::printf("%s", expectations_summary(expect_, records_).c_str());
      const std::string expected_counts = expected_counts_text(counts);
      std::printf("%s: %lld records, %lld failed%s, policy %s, %.1f s\n",
                  stop_signal_ != 0 ? "INTERRUPTED" : std::string(overall_verdict(counts)).c_str(),
                  static_cast<long long>(counts.total), static_cast<long long>(counts.failures),
                  expected_counts.c_str(), info.policy.c_str(), info.wall_seconds);
      if (!results_file.empty()) std::printf("results: %s\n", results_file.c_str());
    }
    if (ra_.profile)
      std::printf("\nprofile (every process of the run; jobs' phases from their records):\n%s",
                  profile_table(run_profile(), ms_since(process_start_time())).c_str());
    if (stop_signal_ != 0) {
      std::printf("INTERRUPTED by %s: %zu of %zu records finished (reports hold them)\n", strsignal(stop_signal_),
                  records_.size(), total_);
      if (journal_) std::printf("continue with: %s%s\n", command_line_.c_str(), ra_.resume ? "" : " --resume");
      std::fflush(stdout);
      return kExitInterruptedBase + stop_signal_;
    }
    if (required_variant > 0 && !ra_.quiet)
      std::printf("%lld BATCH_VARIANT records fail the run (--require batch-invariance)\n",
                  static_cast<long long>(required_variant));
    if (counts.failures > 0) return kExitFailed;
    if (shard_ && counts.total == 0) {
      // More shards than cases: this one has none, which is not a failure of the gate.
      if (!ra_.quiet) std::printf("shard %s: no case of the selection falls in it\n", shard_->str().c_str());
      return kExitPassed;
    }
    if (counts[Status::kPassed] + counts[Status::kBatchVariant] + counts.xfail + counts.xpass == 0 &&
        !ra_.allow_nothing_ran) {
      std::fprintf(stderr,
                   "mlagate: nothing ran: %lld records, none executed (skipped or not supported); exit %d "
                   "(--allow-nothing-ran accepts this)\n",
                   static_cast<long long>(counts.total), kExitNothingRan);
      return kExitNothingRan;
    }
    return kExitPassed;
  }

  // Removed after the workers below have ended (members go in reverse order).
  InputStoreFolder input_store_;
  // Workers retired at the end of their streams (IsolationOptions::reap_later)
  // are waited for on every way out of the run, finish() or an exception.
  struct ReapWorkers {
    ~ReapWorkers() { reap_retired_workers(); }
  } reap_workers_;
  const Selection& sel_;
  const RunArgs& ra_;
  const std::string& command_line_;
  const std::vector<std::string>& args_;
  const Clock::time_point wall0_ = Clock::now();

  RunConfig cfg_;
  std::shared_future<void> device_check_;  // --reference cuda: start_device_check
  std::optional<Shard> shard_;
  std::optional<GoldenRun> golden_;
  bool from_file_ = false;
  bool seeds_repeat_ = true;  // two cases share a seed: drawn inputs are kept and shared
  std::vector<BackendEntry> extra_entries_;
  std::vector<std::unique_ptr<Backend>> backends_;
  // After the backends: its captured graphs go before them.
  ServingMode serving_;
  std::string run_prefix_, extra_args_, computation_args_;
  bool tty_ = false;
  std::size_t failed_so_far_ = 0;

  std::string isolate_;
  std::size_t workers_ = 1;  // --workers, resolved
  std::vector<std::string> devices_;  // --devices, "all" resolved
  DeviceMemoryPlan device_memory_;    // --reference cuda: the cases' and devices' memory
  std::optional<Journal> journal_;
  std::map<std::string, Record> finished_, fresh_;
  std::vector<CaseSpec> all_cases_;
  std::map<std::string, const CaseSpec*> case_by_id_;  // annotate()'s index of all_cases_
  ExpectationSet expect_;                              // --expect
  std::size_t total_ = 0, done_count_ = 0;
  int stop_signal_ = 0;
  std::vector<Record> records_;
};

}  // namespace

int cmd_run(const Selection& sel, const RunArgs& ra, const std::string& command_line,
            const std::vector<std::string>& args) {
  if ((ra.worker && !ra.save_results.empty()) || ra.repeat == 0) {
    RunArgs r = ra;
    if (r.worker) r.save_results.clear();  // the results file is the parent's to write; the worker only runs
    // No --repeat: the suite's (a golden file's cases run once; a serving mode's once).
    if (r.repeat == 0) r.repeat = ra.replay.empty() && !ra.serving.given() ? sel.suite_repeat() : 1;
    return RunCommand(sel, r, command_line, args).main();
  }
  return RunCommand(sel, ra, command_line, args).main();
}

}  // namespace mlagate
