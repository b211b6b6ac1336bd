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
#include "cases/sparse.h"
#include "harness/run/cache_write.h"
#include "reference/glue.h"
#include "reports/profile.h"
#include "harness/run/serving.h"
#include "harness/run/sparse_op.h"
#include "harness/run/merge_op.h"
#include "reference/sparse_reference.h"
#include "reference/fp64_reference.h"

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
Metrics quantization_metrics(CaseContext& ctx, Op op, const ProducedOutput& main, const std::vector<double>& ref_outputs) {
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
  const std::vector<double>& unquantized = ctx.unquantized_main(op);
  OutputCheck chk;
  chk.name = "quant_error";
  chk.got = TensorView{DType::kF64, main.buf.view().shape, const_cast<double*>(ref_outputs.data())};
  chk.expected_shape = chk.got.shape;
  chk.expected_dtype = DType::kF64;
  chk.reference = &unquantized;
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
Record run_one_untimed(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg);
}  // namespace

// run_one_untimed, with the shared work it triggered (or that earlier
// records on this context left unreported) and its whole time in the record.
Record run_one(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg) {
  const auto t0 = Clock::now();
  Record r = run_one_untimed(ctx, b, op, cfg);
  ctx.close_timings(r.timings, ms_since(t0));
  return r;
}

namespace {
Record run_one_untimed(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg) {
  const Case& c = ctx.c;
  Record r;
  r.case_id = c.spec.id();
  r.backend = std::string(b.name());
  r.op = std::string(op_name(op));
  r.policy = cfg.policy.describe();
  if (cfg.repro) r.repro = cfg.repro(c.spec, r.backend, op);

  Support s;
  Capabilities caps;
  try {
    // Out-of-tree backends answer through foreign code: a throw is a record, not the end of the run.
    s = b.supports(c.spec, op);
    caps = b.capabilities();
  } catch (const std::exception& e) {
    r.status = Status::kCrashed;
    r.message = std::string("supports() threw: ") + e.what();
    return r;
  }
  if (s.ok && op == Op::kLayer) s = route_requests(caps, c.spec).support;
  // A supports() of a backend's own that says yes across case kinds: a merge
  // case has no attention inputs, a dense one no partial results.
  if (s.ok && is_merge_op(op) != c.spec.merge.active())
    s = Support::no(c.spec.merge.active() ? "a merge case: run it with --op merge_states" : "merge_states needs a merge case");
  if (!s.ok) {
    r.status = Status::kNotSupported;
    r.message = s.reason;
    return r;
  }
  r.block_size = resolve_block_size(caps, c.spec);
  // (The prefill op reads no cache, nor does a merge.)
  if (const std::string why = op == Op::kPrefill || is_merge_op(op) ? std::string() : ctx.missing_cache(r.block_size);
      !why.empty()) {
    r.status = Status::kSkipped;
    r.message = why;
    return r;
  }

  OpRun run;
  const std::vector<double>* reference_main = nullptr;
  const std::vector<double>* reference_lse = nullptr;
  try {
    switch (op) {
      case Op::kLayer: {
        const PagedCache& base = ctx.cache(r.block_size, false, cfg.exec, r.timings.cache_ms);
        run = run_layer(b, c, base, cfg.exec, &ctx.layer_memo);
        if (cfg.baseline.always || cfg.policy.kind == Policy::Kind::kBaseline)
          ctx.overlap_reference_and_baseline(run.paths, cfg.baseline);
        reference_main = &ctx.get_reference().out;
        reference_lse = &ctx.get_reference().lse;
        break;
      }
      case Op::kDecode: {
        const PagedCache& full = ctx.cache(r.block_size, true, cfg.exec, r.timings.cache_ms);
        ctx.prepare_decode();
        run = run_decode_op(b, c, full, *ctx.q_lat, *ctx.q_pe, cfg.exec);
        reference_main = &ctx.mqa_o_lat;
        reference_lse = &ctx.mqa_lse;
        break;
      }
      case Op::kPrefill: {
        const auto [k, v] = ctx.projection_of_all();
        const std::uint64_t k_print = fingerprint(*k), v_print = fingerprint(*v);
        // Lent, not copied: a backend that wrote into them must not change the
        // next backend's inputs nor the baseline's keys, whether it returned or threw.
        const auto check = [&] {
          if (fingerprint(*k) != k_print || fingerprint(*v) != v_print) ctx.kv_projection->withdraw(k);
        };
        try {
          run = run_prefill_op(b, c, *k, *v, cfg.exec);
        } catch (...) {
          check();
          throw;
        }
        check();
        reference_main = &ctx.get_reference().out;
        reference_lse = &ctx.get_reference().lse;
        break;
      }
      case Op::kSparseDecode:
      case Op::kSparsePrefill: {
        const PagedCache& full = ctx.cache(r.block_size, true, cfg.exec, r.timings.cache_ms);
        const PagedCache* extra = ctx.extra_cache(r.block_size, cfg.exec, r.timings.cache_ms);
        ctx.prepare_sparse();
        run = op == Op::kSparseDecode ? run_sparse_decode_op(b, c, full, extra, *ctx.sparse_q, cfg.exec)
                                      : run_sparse_prefill_op(b, c, full, extra, *ctx.sparse_q, cfg.exec);
        reference_main = &ctx.sparse_ref.o;
        reference_lse = &ctx.sparse_ref.lse;
        break;
      }
      case Op::kMergeStates: {
        ctx.prepare_merge();
        run = run_merge_op(b, c, cfg.exec);
        reference_main = &ctx.merge_ref->out;
        reference_lse = &ctx.merge_ref->lse;
        break;
      }
      case Op::kCacheWrite: {
        // Conformance, bit-exact: the backend's writer against the reference writer.
        const PagedCache& base = ctx.cache(r.block_size, false, cfg.exec, r.timings.cache_ms);
        const CacheWriteCheck w = check_cache_write(b, c, base);
        r.timings.run_ms = w.run_ms;
        r.status = w.identical ? Status::kPassed : Status::kIncorrect;
        r.message = w.message;
        return r;
      }
    }
  } catch (const NotSupportedError& e) {
    r.status = Status::kNotSupported;
    r.message = e.what();
    return r;
  } catch (const DeviceUnavailableError& e) {
    r.status = Status::kSkipped;
    r.message = e.what();
    return r;
  } catch (const OutOfBoundsWriteError& e) {
    // Found by the backend's own device-side guard bands (SPEC: Pass rules, rule 2).
    r.status = Status::kIncorrect;
    r.message = e.what();
    return r;
  } catch (const WrongOutputError& e) {
    // Found by the backend's own output checks (SPEC: Pass rules, rule 1: shape and dtype).
    r.status = Status::kIncorrect;
    r.message = e.what();
    return r;
  } catch (const BackendTimeoutError& e) {
    r.status = Status::kTimeout;
    r.message = e.what();
    return r;
  } catch (const std::exception& e) {
    r.status = Status::kCrashed;
    r.message = std::string("backend threw: ") + e.what();
    return r;
  }
  // err_baseline for the outputs of this op, on the paths the backend took.
  BaselineErrors base;
  if (cfg.baseline.always || cfg.policy.kind == Policy::Kind::kBaseline) {
    try {
      switch (op) {
        case Op::kLayer: base = ctx.layer_baseline(run.paths, cfg.baseline); break;
        case Op::kDecode: base = ctx.decode_op_baseline(); break;
        case Op::kPrefill: base = ctx.prefill_op_baseline(); break;
        case Op::kCacheWrite: break;
        case Op::kSparseDecode:
        case Op::kSparsePrefill: base = ctx.sparse_baseline(); break;
        case Op::kMergeStates: base = ctx.merge_baseline(); break;
      }
    } catch (const BaselineUnavailableError& e) {  // nothing to judge the backend's output against
      r.timings.run_ms = run.run_ms;
      r.paths = run.paths;
      r.status = Status::kSkipped;
      r.message = e.what();
      return r;
    }
  }
  const Dims& dims = c.spec.dims;
  // The lse floor's count of fp32 roundings: a logit's dot product, or a
  // merge's handful of operations (max, two exp, a sum, a log, an add).
  const int dqk = is_merge_op(op)        ? kMergeLseRoundings
                  : op == Op::kPrefill ? dims.nope_dim + dims.rope_dim
                                         : dims.kv_lora_rank + dims.rope_dim;
  r.timings.run_ms = run.run_ms;
  r.paths = run.paths;

  const auto t0 = Clock::now();
  const double reference_before = ctx.reference_ms;  // the fp8 quantization error's reference is golden, not compare
  std::optional<Status> nonfinite, incorrect;
  std::string nonfinite_msg, incorrect_msg, info_msg;
  for (const ProducedOutput& po : run.outputs) {
    OutputCheck chk;
    chk.name = po.name;
    chk.got = po.buf.view();
    chk.expected_shape = po.buf.view().shape;
    chk.expected_dtype = po.buf.view().dtype;
    chk.reference = po.is_lse ? reference_lse : reference_main;
    chk.layout = Layout{c.query_start_loc, po.heads, po.dim};
    chk.is_lse = po.is_lse;
    chk.err_baseline = po.is_lse ? base.lse : base.out;
    chk.dqk = dqk;
    // A case of padding requests alone: no token sees a key, zero is the answer.
    chk.zero_reference_ok = std::all_of(c.spec.batch.seq_lens.begin(), c.spec.batch.seq_lens.end(), [](int s) { return s == 0; });
    // So may a merge case whose every row is empty on both sides.
    if (is_merge_op(op))
      chk.zero_reference_ok = std::all_of(ctx.merge_ref->lse.begin(), ctx.merge_ref->lse.end(), [](double l) { return std::isinf(l); });
    Metrics m;
    const Status st = compare_output(chk, cfg.policy, m);
    // An lse that fails because it is log2 says so (vLLM #47079's class).
    if (po.is_lse && st == Status::kIncorrect && reference_lse)
      if (const std::string hint = lse_base_hint(chk.got, *reference_lse); !hint.empty()) m.message += "; " + hint;
    if (st == Status::kNonfinite && !nonfinite) nonfinite = st, nonfinite_msg = m.message;
    if (st == Status::kIncorrect && !incorrect) incorrect = st, incorrect_msg = m.message;
    if (st == Status::kPassed && !m.message.empty() && info_msg.empty()) info_msg = m.message;
    r.metrics.push_back(std::move(m));
  }
  // (The sparse ops report no quantization error: their references over the
  // unquantized inputs are not computed.)
  if (is_fp8(c.spec.kv_cache_dtype) && !is_sparse_op(op) && !run.outputs.empty() && reference_main)
    r.metrics.push_back(quantization_metrics(ctx, op, run.outputs.front(), *reference_main));
  r.timings.compare_ms = ms_since(t0) - (ctx.reference_ms - reference_before);
  // SPEC: Pass rules order: guard bands, then non-finite values, then tolerance.
  if (!run.guard_violation.empty()) {
    r.status = Status::kIncorrect;
    r.message = run.guard_violation;
  } else if (nonfinite) {
    r.status = Status::kNonfinite;
    r.message = nonfinite_msg;
  } else if (incorrect) {
    r.status = Status::kIncorrect;
    r.message = incorrect_msg;
  } else {
    r.status = Status::kPassed;
    r.message = info_msg;
  }
  if (cfg.on_outputs) cfg.on_outputs(c, r, run.outputs);
  return r;
}
}  // namespace


Record invalid_case_record(const RunConfig& cfg, const CaseSpec& spec, const std::string& backend, Op op,
                           const std::string& why) {
  Record r;
  r.case_id = spec.id();
  r.backend = backend;
  r.op = std::string(op_name(op));
  r.status = Status::kInvalidCase;
  r.message = why;
  r.policy = cfg.policy.describe();
  if (cfg.repro) r.repro = cfg.repro(spec, r.backend, op);
  return r;
}

std::vector<Record> run_cases(const RunConfig& cfg, std::vector<std::unique_ptr<Backend>>& backends) {
  std::vector<Record> records;
  const std::size_t total = cfg.cases.size() * backends.size() * cfg.ops.size();
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
        for (Op op : cfg.ops) emit(invalid_case_record(cfg, spec, std::string(b->name()), op, e.what()));
      continue;
    }
    for (auto& b : backends)
      for (Op op : cfg.ops) {
        if (cfg.stop && cfg.stop()) return records;
        emit(cfg.run_job ? cfg.run_job(*ctx, *b, op) : run_one(*ctx, *b, op, cfg));
      }
  }
  return records;
}

}  // namespace mlagate
