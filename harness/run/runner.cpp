// Runs every (case, backend, op), times each phase, compares against the
// golden and turns every outcome (including exceptions) into a record. What a
// case's records share (CaseContext, CaseStream) is in case_context.{h,cpp}.
#include "harness/run/runner.h"

#include "harness/run/case_context.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>

#include "cases/case.h"
#include "cases/encoding.h"
#include "cases/errors.h"
#include "harness/run/ops/driver.h"
#include "reference/compare.h"
#include "reports/profile.h"

namespace mlagate {

namespace {
using run_detail::Clock;
using run_detail::ms_since;
}  // namespace

namespace {

// Quantization error of an fp8 cache, for information (never gates): the
// reference over the dequantized cache (what a perfect kernel returns) against
// the reference over the unquantized inputs, as the metrics of "quant_error".
// Every backend's record of a (case, op) carries the same values (neither
// reference depends on the backend): computed once per context and op.
std::optional<Metrics> quantization_metrics(CaseContext& ctx, const OpDriver& driver, const ProducedOutput& main,
                                            const std::vector<double>& ref_outputs) {
  const Op op = driver.op();
  const std::string key = std::string(op_name(op)) + "/" + main.name + "/" + shape_str(main.buf.view().shape) + "/" +
                          std::to_string(main.heads) + "/" + std::to_string(main.dim);
  const std::string message = "for information: reference over the dequantized " +
                              kv_cache_format_name(ctx.c.spec.kv_format()) +
                              " cache against the reference over the unquantized inputs (" + main.name + ")";
  if (const auto it = ctx.quant_metrics.find(key); it != ctx.quant_metrics.end()) {
    Metrics m = it->second;
    m.message = message;
    return m;
  }
  const std::vector<double>* unquantized = driver.unquantized_main(ctx);
  if (!unquantized) return std::nullopt;  // the op reports none
  OutputCheck chk;
  chk.name = "quant_error";
  chk.got = TensorView{DType::kF64, main.buf.view().shape, const_cast<double*>(ref_outputs.data())};
  chk.expected_shape = chk.got.shape;
  chk.expected_dtype = DType::kF64;
  chk.reference = unquantized;
  chk.layout = Layout{ctx.c.query_start_loc, main.heads, main.dim};
  Metrics m;
  compare_output(chk, make_policy("fixed", INFINITY, 0), m);
  m.passed = true;
  m.message = message;
  ctx.quant_metrics.emplace(key, m);
  return m;
}

}  // namespace

namespace {

// A record's identity: case, backend, op, policy and repro line.
Record record_of(const RunConfig& cfg, const CaseSpec& spec, const std::string& backend, Op op) {
  Record r;
  r.case_id = spec.id();
  r.backend = backend;
  r.op = std::string(op_name(op));
  r.policy = cfg.policy.describe();
  if (cfg.repro) r.repro = cfg.repro(spec, r.backend, op);
  return r;
}

// Admit: whether (case, backend, op) runs at all; false with the record's
// status and message set when not. The block size the backend takes is set.
bool admit(CaseContext& ctx, Backend& b, const OpDriver& op, Record& r) {
  const CaseSpec& spec = ctx.c.spec;
  Support s;
  Capabilities caps;
  try {
    // Out-of-tree backends answer through foreign code: a throw is a record, not the end of the run.
    s = b.supports(spec, op.op());
    caps = b.capabilities();
  } catch (const std::exception& e) {
    r.status = Status::kCrashed;
    r.message = std::string("supports() threw: ") + e.what();
    return false;
  }
  if (s.ok) s = op.admit(caps, spec);
  // A supports() of a backend's own that says yes across case kinds: a merge
  // case has no attention inputs.
  if (s.ok && spec.merge.active() && !op.runs_merge_cases()) s = Support::no("a merge case: run it with --op merge_states");
  if (!s.ok) {
    r.status = Status::kNotSupported;
    r.message = s.reason;
    return false;
  }
  r.block_size = resolve_block_size(caps, spec);
  if (const std::string why = op.reads_cache() ? ctx.missing_cache(r.block_size) : std::string(); !why.empty()) {
    r.status = Status::kSkipped;
    r.message = why;
    return false;
  }
  return true;
}

// Run: the op's inputs, the backend's call and the reference its outputs are
// judged against; false with the record's status set when any of it failed
// (or the backend declined) in a way that is the verdict.
bool run_backend(CaseContext& ctx, Backend& b, const OpDriver& op, const RunConfig& cfg, Record& r, OpRun& run,
                 JudgedAgainst& ref) {
  try {
    run = op.run(ctx, b, cfg, r);
    if (!run.verdict) ref = op.reference(ctx);
    return true;
  } catch (const NotSupportedError& e) {
    r.status = Status::kNotSupported;
    r.message = e.what();
  } catch (const DeviceUnavailableError& e) {
    r.status = Status::kSkipped;
    r.message = e.what();
  } catch (const OutOfBoundsWriteError& e) {
    // Found by the backend's own device-side guard bands (SPEC: Pass rules, rule 2).
    r.status = Status::kIncorrect;
    r.message = e.what();
  } catch (const WrongOutputError& e) {
    // Found by the backend's own output checks (SPEC: Pass rules, rule 1: shape and dtype).
    r.status = Status::kIncorrect;
    r.message = e.what();
  } catch (const BackendTimeoutError& e) {
    r.status = Status::kTimeout;
    r.message = e.what();
  } catch (const std::exception& e) {
    r.status = Status::kCrashed;
    r.message = std::string("backend threw: ") + e.what();
  }
  return false;
}

// The verdicts of the outputs, in SPEC: Pass rules order: guard bands, then
// non-finite values, then tolerance.
struct OutputVerdicts {
  std::optional<Status> nonfinite, incorrect;
  std::string nonfinite_msg, incorrect_msg, info_msg;
};

// Judge: every output against the op's reference with the run's policy.
void judge(CaseContext& ctx, const OpDriver& op, const RunConfig& cfg, const OpRun& run, const JudgedAgainst& ref,
           const BaselineErrors& base, Record& r) {
  const Case& c = ctx.c;
  const auto t0 = Clock::now();
  const double reference_before = ctx.reference_ms;  // the fp8 quantization error's reference is golden, not compare
  OutputVerdicts v;
  for (const ProducedOutput& po : run.outputs) {
    OutputCheck chk;
    chk.name = po.name;
    chk.got = po.buf.view();
    chk.expected_shape = po.buf.view().shape;
    chk.expected_dtype = po.buf.view().dtype;
    chk.reference = po.is_lse ? ref.lse : ref.main;
    chk.layout = Layout{c.query_start_loc, po.heads, po.dim};
    chk.is_lse = po.is_lse;
    chk.err_baseline = po.is_lse ? base.lse : base.out;
    chk.dqk = op.lse_roundings(c.spec);
    // A case of padding requests alone: no token sees a key, zero is the answer.
    chk.zero_reference_ok =
        ref.zero_ok || (!op.runs_merge_cases() && std::all_of(c.spec.batch.seq_lens.begin(), c.spec.batch.seq_lens.end(),
                                                             [](int s) { return s == 0; }));
    Metrics m;
    const Status st = compare_output(chk, cfg.policy, m);
    // An lse that fails because it is log2 says so (vLLM #47079's class).
    if (po.is_lse && st == Status::kIncorrect && ref.lse)
      if (const std::string hint = lse_base_hint(chk.got, *ref.lse); !hint.empty()) m.message += "; " + hint;
    if (st == Status::kNonfinite && !v.nonfinite) v.nonfinite = st, v.nonfinite_msg = m.message;
    if (st == Status::kIncorrect && !v.incorrect) v.incorrect = st, v.incorrect_msg = m.message;
    if (st == Status::kPassed && !m.message.empty() && v.info_msg.empty()) v.info_msg = m.message;
    r.metrics.push_back(std::move(m));
  }
  if (is_fp8(c.spec.kv_cache_dtype) && !run.outputs.empty() && ref.main)
    if (std::optional<Metrics> q = quantization_metrics(ctx, op, run.outputs.front(), *ref.main)) r.metrics.push_back(std::move(*q));
  r.timings.compare_ms = ms_since(t0) - (ctx.reference_ms - reference_before);
  if (!run.guard_violation.empty()) {
    r.status = Status::kIncorrect;
    r.message = run.guard_violation;
  } else if (v.nonfinite) {
    r.status = Status::kNonfinite;
    r.message = v.nonfinite_msg;
  } else if (v.incorrect) {
    r.status = Status::kIncorrect;
    r.message = v.incorrect_msg;
  } else {
    r.status = Status::kPassed;
    r.message = v.info_msg;
  }
}

// admit -> run -> judge, every outcome a record.
Record run_one_untimed(CaseContext& ctx, Backend& b, Op op_id, const RunConfig& cfg) {
  const OpDriver& op = op_driver(op_id);
  Record r = record_of(cfg, ctx.c.spec, std::string(b.name()), op_id);
  OpRun run;
  JudgedAgainst ref;
  if (!admit(ctx, b, op, r) || !run_backend(ctx, b, op, cfg, r, run, ref)) return r;
  r.timings.run_ms = run.run_ms;
  if (run.verdict) {  // an op that judges itself (cache_write)
    r.status = *run.verdict;
    r.message = run.verdict_message;
    return r;
  }
  r.paths = run.paths;
  BaselineErrors base;  // err_baseline for the outputs of this op, on the paths the backend took
  if (cfg.baseline.always || cfg.policy.kind == Policy::Kind::kBaseline) try {
      base = op.baseline(ctx, run, cfg);
    } catch (const BaselineUnavailableError& e) {  // nothing to judge the backend's output against
      r.status = Status::kSkipped;
      r.message = e.what();
      return r;
    }
  judge(ctx, op, cfg, run, ref, base, r);
  if (cfg.on_outputs) cfg.on_outputs(ctx.c, r, run.outputs);
  return r;
}

}  // namespace

// run_one_untimed, with the shared work it triggered (or that earlier
// records on this context left unreported) and its whole time in the record.
Record run_one(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg) {
  const auto t0 = Clock::now();
  Record r = run_one_untimed(ctx, b, op, cfg);
  ctx.close_timings(r.timings, ms_since(t0));
  return r;
}

Record invalid_case_record(const RunConfig& cfg, const CaseSpec& spec, const std::string& backend, Op op,
                           const std::string& why) {
  Record r = record_of(cfg, spec, backend, op);
  r.status = Status::kInvalidCase;
  r.message = why;
  return r;
}

std::size_t job_count(const RunConfig& cfg, std::size_t backends) {
  std::size_t n = 0;
  for (const CaseSpec& c : cfg.cases)
    for (Op op : cfg.ops) n += c.takes(op) ? backends : 0;
  return n;
}

std::vector<Record> run_cases(const RunConfig& cfg, std::vector<std::unique_ptr<Backend>>& backends) {
  std::vector<Record> records;
  const std::size_t total = job_count(cfg, backends.size());
  auto emit = [&](Record r) {
    records.push_back(std::move(r));
    if (cfg.on_record) cfg.on_record(records.back(), records.size(), total);
  };
  CaseStream stream(cfg);
  for (const CaseSpec& spec : cfg.cases) {
    if (cfg.stop && cfg.stop()) break;
    CaseContext* ctx = nullptr;
    try {
      ctx = &stream.enter(spec);
    } catch (const InvalidCase& e) {
      for (auto& b : backends)
        for (Op op : cfg.ops)
          if (spec.takes(op)) emit(invalid_case_record(cfg, spec, std::string(b->name()), op, e.what()));
      continue;
    }
    for (auto& b : backends)
      for (Op op : cfg.ops) {
        if (!spec.takes(op)) continue;
        if (cfg.stop && cfg.stop()) return records;
        emit(cfg.run_job ? cfg.run_job(*ctx, *b, op) : run_one(*ctx, *b, op, cfg));
      }
  }
  return records;
}

}  // namespace mlagate
