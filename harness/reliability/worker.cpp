// The worker's side of isolation (isolate.h, worker_main): the jobs read from
// the parent's pipe run one at a time, each answered with its record; a case
// named by NEXT made ahead on a thread of its own (CaseAhead). The protocol is
// described at the top of isolate.cpp.
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cases/errors.h"
#include "harness/reliability/isolate.h"
#include "harness/run/core_share.h"
#include "reports/profile.h"
#include "reports/record_json.h"

namespace mlagate {

namespace {

using Clock = std::chrono::steady_clock;

// A message on one protocol line: a JSON string, as records travel as JSON.
std::string message_to_line(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // bytes that are not UTF-8: U+FFFD
}

}  // namespace

int worker_main(const RunConfig& cfg, std::vector<std::unique_ptr<Backend>>& backends,
                const std::function<void()>& device_ready) {
  // A worker never outlives its parent (kill -9 of the run, say).
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The protocol owns the original stdout; anything else printed goes to stderr.
  const int proto_fd = ::dup(1);
  if (proto_fd < 0 || ::dup2(2, 1) < 0) throw std::runtime_error("worker: cannot set up its channel");
  FILE* proto = ::fdopen(proto_fd, "w");
  if (!proto) throw std::runtime_error("worker: fdopen failed");
  const double init_ms = std::chrono::duration<double, std::milli>(Clock::now() - process_start_time()).count();
  std::fprintf(proto, "READY %zu %zu %.3f\n", cfg.cases.size(), backends.size(), init_ms);
  std::fflush(proto);

  auto stream = std::make_unique<CaseStream>(cfg);
  std::optional<std::size_t> current;
  CaseContext* ctx = nullptr;
  std::string invalid;
  std::string line;
  // The case named by NEXT, made on a thread of its own while this one runs
  // the jobs before it. Not where a case is read from a golden file or its
  // outputs are written to one (one thread at a time in the HDF5 library).
  std::unique_ptr<CaseAhead> ahead;
  // A NEXT that came while the case made ahead was still to come (one-case
  // groups: the parent names the next group's case with the first job of
  // the current one): made once that one is taken.
  std::optional<std::size_t> pending_next;
  const bool may_prepare_ahead = !cfg.prepare && !cfg.on_outputs;
  long long begun_ahead = 0;  // since the last AHEAD line
  auto make_ahead = [&](std::size_t ci) {
    ahead.reset();  // an earlier one never taken: its thread ends first
    try {
      ahead = std::make_unique<CaseAhead>(cfg, backends, ci);
      ++begun_ahead;
    } catch (const std::system_error&) {
      // No thread to be had: the case is made when its job comes, as before.
    }
  };
  bool device_checked = !device_ready;
  // Bad input met in the worker is the run's error, which the parent reports
  // with exit 2, never a backend's record.
  auto input_error = [proto](const InputError& e) {
    std::fprintf(proto, "INPUT_ERROR %s\n", message_to_line(e.what()).c_str());
    std::fflush(proto);
    return 2;
  };
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string word, op_s;
    std::size_t ci = 0, bi = 0;
    if (line.rfind("NEXT ", 0) == 0) {
      if (!(in >> word >> ci) || ci >= cfg.cases.size()) throw std::runtime_error("worker: bad line '" + line + "'");
      if (!may_prepare_ahead || current == ci || (ahead && ahead->case_index() == ci)) continue;
      if (ahead)
        pending_next = ci;
      else
        make_ahead(ci);
      continue;
    }
    if (!(in >> word >> ci >> bi >> op_s) || word != "JOB" || ci >= cfg.cases.size() || bi >= backends.size())
      throw std::runtime_error("worker: bad job line '" + line + "'");
    const Op op = parse_op(op_s);
    take_spare_cores();  // a worker that ended since the last job left its cores
    double beside_ms = 0;  // of the case made ahead, reported with its first record
    bool used_ahead = false;
    if (current != ci) {
      current = ci;
      invalid.clear();
      ctx = nullptr;
      try {
        std::unique_ptr<CaseAhead> made;
        if (ahead && ahead->case_index() == ci) made = std::move(ahead), used_ahead = true;
        // The next one begins once this one is in (the previous case's
        // memory freed: a worker holds two cases at a time, as planned).
        const std::optional<std::size_t> next = std::exchange(pending_next, std::nullopt);
        const auto begin_next = [&] {
          if (next && *next != ci) make_ahead(*next);
        };
        try {
          ctx = made ? &made->take(stream, beside_ms) : &stream->enter(cfg.cases[ci]);
        } catch (...) {
          begin_next();
          throw;
        }
        begin_next();
      } catch (const InvalidCase& e) {
        invalid = e.what();
      } catch (const InputError& e) {
        return input_error(e);  // a golden file whose regenerated inputs differ from its hashes
      }
    }
    Backend& b = *backends[bi];
    const Record r = ctx ? (cfg.run_job ? cfg.run_job(*ctx, b, op) : run_one(*ctx, b, op, cfg))
                         : invalid_case_record(cfg, cfg.cases[ci], std::string(b.name()), op, invalid);
    if (!device_checked) {
      // The record above may be the failure of a device that could not be
      // had: the device's own message is the run's, not a backend's record.
      try {
        device_ready();
      } catch (const InputError& e) {
        return input_error(e);
      }
      device_checked = true;
    }
    if (const std::vector<CallSpan> calls = take_backend_calls(); !calls.empty()) {
      std::fprintf(proto, "CALLS %zu", calls.size());
      for (const auto& [a, e] : calls) std::fprintf(proto, " %lld %lld", static_cast<long long>(a), static_cast<long long>(e));
      std::fputc('\n', proto);
    }
    if (used_ahead) std::fprintf(proto, "AHEAD %.3f %lld\n", beside_ms, std::exchange(begun_ahead, 0));
    std::fprintf(proto, "RECORD %s\n", record_to_json_line(r).c_str());
    std::fflush(proto);
  }
  return 0;
}

}  // namespace mlagate
