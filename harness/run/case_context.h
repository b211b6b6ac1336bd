// What a case's records share whatever their op: the case, its absorbed fp64
// reference, its paged caches, the shared work's timings, and a slot per op
// module for that op's own state (ops/<op>/), made on first use. The stream
// of cases that hands a context on is in case_stream.cpp. Internal to
// harness/run: runner.h only declares it.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <typeindex>
#include <utility>
#include <vector>

#include "cases/case.h"
#include "cases/paged_cache.h"
#include "harness/run/run_config.h"
#include "reference/fp64_reference.h"

namespace mlagate {

namespace run_detail {
using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
}  // namespace run_detail

// An op module's state in a context (CaseContext::slot).
struct OpState {
  virtual ~OpState() = default;
  // The context moves on whole to a case of equal cache values (another
  // dtype tag or k_scale): caches the state holds take the new tags.
  virtual void retag(const CaseSpec&) {}
  // The next case has this one's inputs but other cache values: the state
  // it starts with (the references over the unquantized inputs it can keep),
  // or null. `was_fp8`: this case's cache was fp8 (its references are not
  // the unquantized ones).
  virtual std::unique_ptr<OpState> keep_for_inputs(bool /*was_fp8*/) { return nullptr; }
};

struct CaseContext {
  using Clock = run_detail::Clock;
  static double ms_since(Clock::time_point t0) { return run_detail::ms_since(t0); }

  CaseContext() = default;
  CaseContext(const CaseContext&) = delete;  // slots may point into it
  CaseContext& operator=(const CaseContext&) = delete;

  Case c;
  std::optional<ReferenceOutputs> ref_outputs;  // absorbed path: out, lse, o_lat
  const ReferenceImpl* reference = nullptr;     // null or empty members: the Eigen reference

  // Shared work's milliseconds, accumulated as it happens and handed to the
  // next record run on this context (take_shared): each counted once.
  // CaseStream::enter: generating or retargeting the case (also in generate_ms);
  // for a case made ahead (CaseAhead), all the work done there.
  double enter_ms = 0;
  double generate_ms = 0;   // inputs: the case, the prefill op's up-projected keys and values
  double reference_ms = 0;  // fp64 references
  double baseline_ms = 0;   // err_baseline
  double cache_ms = 0;      // paged caches made ahead (CaseAhead); a job's own are in its record
  Timings taken;            // what earlier records already took
  // Moves the shared work not yet reported into `t`; returns the enter time among it.
  double take_shared(Timings& t);
  // A job's record closes: the shared work it triggered (or that earlier
  // records left unreported) taken into `t`, its whole time (`wall_ms` plus the
  // case's generation in enter(), outside it), the glue as the rest, and the
  // run's profile told.
  void close_timings(Timings& t, double wall_ms);

  // The absorbed fp64 reference (layer and prefill ops), made on first use.
  const ReferenceOutputs& get_reference();

  // Paged caches by (block size, new tokens written), made on first use.
  std::map<std::pair<int, bool>, PagedCache> caches;
  // From a PreparedCase: caches without the new tokens, by block size.
  std::map<int, PagedCache> given_caches;
  bool build_missing_caches = true;
  // Empty when a cache of this block size can be had, else why not.
  std::string missing_cache(int bs) const;
  const PagedCache& cache(int bs, bool write_new, const ExecOptions& opt, double& ms);

  // fp8 caches: the absorbed reference over the unquantized inputs, for the
  // quantization error each record reports for information.
  std::optional<ReferenceOutputs> unquantized;
  const std::vector<double>& unquantized_absorbed();
  // Runs `work` with the case's cache values taken away, so that the
  // references read the unquantized inputs; its time counts as reference.
  void without_cache_values(const std::function<void()>& work);
  // The quant_error metrics by op and output. A context handed on to a case
  // of equal cache values keeps them: the same references.
  std::map<std::string, Metrics> quant_metrics;

  // A golden file's case and the parts every op shares (the ops' parts go to
  // their slots first: OpDriver::adopt, in case_stream.cpp).
  void adopt(PreparedCase&& p);

  // The op module state of type S, made on first use (S(CaseContext&) or S()).
  template <class S>
  S& slot() {
    std::unique_ptr<OpState>& s = slots_[std::type_index(typeid(S))];
    if (!s) {
      if constexpr (std::is_constructible_v<S, CaseContext&>)
        s = std::make_unique<S>(*this);
      else
        s = std::make_unique<S>();
    }
    return static_cast<S&>(*s);
  }
  // The state of type S, or null when none was made.
  template <class S>
  S* find_slot() {
    const auto it = slots_.find(std::type_index(typeid(S)));
    return it == slots_.end() ? nullptr : static_cast<S*>(it->second.get());
  }
  // CaseStream: the slots move on with the context or are kept for a case of the same inputs.
  void retag_slots(const CaseSpec& spec);
  void keep_slots_from(CaseContext& prev, bool was_fp8);

 private:
  std::map<std::type_index, std::unique_ptr<OpState>> slots_;
  void write_new_tokens(PagedCache& pc) const;
};

}  // namespace mlagate
