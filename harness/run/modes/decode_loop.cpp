// --steps N (modes/decode_loop.h, SERVING.md "Decode loops"): the loop's
// schedule (who joins and finishes when), the case it turns into, and the
// record: each step writes its new tokens with the backend's own cache_write
// into one context-only cache living through the loop, calls decode on the
// active requests and judges the step's rows; the record is the first failing
// step's, its metrics every step's rows together.
#include "harness/run/modes/decode_loop.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "cases/errors.h"
#include "harness/run/serving_calls.h"
#include "reports/profile.h"

namespace mlagate {

std::pair<int, int> loop_join_and_count(int request, int steps) {
  const int quarter = steps / 4;
  switch (request % 3) {
    case 1: return {quarter, steps - quarter};  // joins late, runs to the end
    case 2: return {0, steps - quarter};        // finishes early
    default: return {0, steps};
  }
}

int loop_join(int request, int tokens, int steps) {
  if (tokens > steps)
    throw InvalidCase("request " + std::to_string(request) + " has " + std::to_string(tokens) +
                      " new tokens, more than --steps " + std::to_string(steps));
  return request % 3 == 1 ? steps - tokens : 0;
}

CaseSpec decode_loop_spec(const CaseSpec& spec, int steps) {
  CaseSpec s = spec;
  BatchSpec& b = s.batch;
  for (std::size_t i = 0; i < b.seq_lens.size(); ++i) {
    const int context = b.seq_lens[i] - b.query_lens[i];
    const int n = loop_join_and_count(static_cast<int>(i), steps).second;
    b.query_lens[i] = n;
    if (b.seq_lens[i] > 0) b.seq_lens[i] = context + n;  // a padding request (seq_len 0) stays one
  }
  b.spec_decode = false;
  return s;
}

namespace modes {

using namespace serving_detail;  // the shared calls and checks (serving_calls.h)

namespace {

// The record's head and what must hold before the loop: every step is a
// batch of one-token decodes, which the backend must take, and the case's
// cache at its block size must exist. False when `r` is already final.
bool loop_can_run(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg, Record& r) {
  const Case& c = ctx.c;
  r.case_id = c.spec.id();
  r.backend = std::string(b.name());
  r.op = std::string(op_name(op));
  r.policy = cfg.policy.describe();
  if (cfg.repro) r.repro = cfg.repro(c.spec, r.backend, op);
  CaseSpec step_spec = c.spec;
  for (std::size_t i = 0; i < step_spec.batch.query_lens.size(); ++i) step_spec.batch.query_lens[i] = 1;
  step_spec.batch.spec_decode = false;
  Capabilities caps;
  try {
    const Support s = b.supports(step_spec, op);
    caps = b.capabilities();
    if (!s.ok) {
      r.status = Status::kNotSupported;
      r.message = s.reason;
      return false;
    }
  } catch (const std::exception& e) {
    r.status = Status::kCrashed;
    r.message = std::string("supports() threw: ") + e.what();
    return false;
  }
  r.block_size = resolve_block_size(caps, c.spec);
  if (const std::string why = ctx.missing_cache(r.block_size); !why.empty()) {
    r.status = Status::kSkipped;
    r.message = why;
    return false;
  }
  return true;
}

// One loop over a case whose record passed loop_can_run.
class Loop {
 public:
  Loop(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg, Record& r, int steps)
      : ctx_(ctx), c_(ctx.c), b_(b), op_(op), cfg_(cfg), r_(r), steps_(steps), sparse_(op == Op::kSparseDecode),
        o_name_(sparse_ ? "o" : "o_lat"), N_(c_.spec.num_heads()),
        L_(sparse_ ? c_.spec.sparse_dv() : c_.spec.dims.kv_lora_rank),
        cache_(ctx.cache(r.block_size, false, cfg.exec, r.timings.cache_ms)),  // context only: the loop writes the rest
        sf_(sparse_inputs()), base_(baseline_of(ctx, cfg, sparse_)),
        all_ref_o_(sparse_ ? sparse_state(ctx).sparse_ref.o : decode_state(ctx).mqa_o_lat), all_ref_lse_(sparse_ ? sparse_state(ctx).sparse_ref.lse : decode_state(ctx).mqa_lse),
        all_o_(c_.spec.dtype, {c_.num_tokens, N_, L_}), all_l_(DType::kF32, {c_.num_tokens, N_}) {
    // Every step's rows land in all_o_ / all_l_, in the case's token order, for the record's metrics.
    poison_fill(all_o_.view(), Poison::kNaN);
    poison_fill(all_l_.view(), Poison::kNaN);
  }

  // Every step; false (with r final) when one threw.
  bool run() {
    try {
      for (int k = 0; k < steps_; ++k) step(k);
    } catch (...) {
      std::string why;
      r_.status = current_exception_status(why);
      r_.message = "step " + std::to_string(r_.steps.size()) + " of " + std::to_string(steps_) + ": " + why;
      return false;
    }
    return true;
  }

  // The record: the first failing step's status and message, else the whole's.
  void verdict() {
    const auto tc = Clock::now();
    const RowCheck rc = check_rows(ctx_, cfg_, base_, all_o_.view(), all_l_.view(), c_.query_start_loc, all_ref_o_,
                                   all_ref_lse_, o_name_, L_);
    r_.timings.compare_ms += ms_since(tc);
    r_.metrics = {rc.o, rc.lse};
    r_.paths.assign(static_cast<std::size_t>(c_.num_requests), std::string(op_name(op_)));
    if (first_bad_ >= 0) {
      const int first_step = r_.steps[static_cast<std::size_t>(first_bad_)].step;
      int failing = 0;
      for (const StepResult& s : r_.steps) failing += s.status != Status::kPassed ? 1 : 0;
      r_.status = r_.steps[static_cast<std::size_t>(first_bad_)].status;
      r_.message = "step " + std::to_string(first_step) + " of " + std::to_string(steps_) + " is the first to fail (" +
                   std::to_string(failing) + " steps fail): " + first_msg_;
    } else {
      r_.status = rc.status;  // passed step by step: the whole agrees
      r_.message = rc.status == Status::kPassed ? std::to_string(steps_) + " decode steps, each checked" : rc.message;
    }
    r_.message += writer_note_;
  }

 private:
  // The sparse op reads the loop's cache through the case's index rows (V3.2:
  // positions up to the token's own, written by its step or before), V4's
  // window and compressed cache (a compressor's output: not written by steps).
  std::optional<SparseFull> sparse_inputs() {
    if (!sparse_) {
      decode_state(ctx_);
      return std::nullopt;
    }
    sparse_state(ctx_);
    return sparse_full(ctx_, cfg_, r_.block_size, r_.timings.cache_ms, &cache_);
  }

  // Step k's call over its active requests, one token each, and the cache
  // rows and slots of the tokens it writes (padding stays padding).
  Call step_call(int k, std::vector<std::int32_t>& kv_rows, std::vector<std::int64_t>& slots) const {
    const std::int64_t* slot_map = cache_.slot_mapping.data<std::int64_t>();
    Call call;
    for (int i = 0; i < c_.num_requests; ++i) {
      const int join = loop_join(i, c_.query_lens[i], steps_);
      if (k < join || k >= join + c_.query_lens[i]) continue;
      const int u = k - join, context = c_.seq_lens[i] - c_.query_lens[i];
      const int t = c_.query_start_loc[i] + u;
      if (c_.seq_lens[i] == 0) {  // CUDA-graph padding stays padding: no key, nothing written
        call.add(t, 1, 0, i);
        continue;
      }
      call.add(t, 1, context + u + 1, i);
      kv_rows.push_back(c_.kv_start_loc[i] + context + u);
      slots.push_back(slot_map[t]);
    }
    return call;
  }

  // The step's new tokens through the backend's own writer (fp8 scales
  // included). A backend whose writer does not take the cache's format (the
  // CUDA writers and fp8_v4) has them written by the reference writer, as an
  // engine's separate cache kernel would, and the record says so.
  void write_tokens(const std::vector<std::int32_t>& kv_rows, const std::vector<std::int64_t>& slots) {
    const Tensor kv = gather_tokens(c_.kv_c, kv_rows), pe = gather_tokens(c_.k_pe, kv_rows);
    const auto tw = Clock::now();
    if (reference_writer_) {
      b_.Backend::cache_write(cache_, kv.view(), pe.view(), slots);
    } else {
      try {
        b_.cache_write(cache_, kv.view(), pe.view(), slots);
        wrote_ = true;
      } catch (const NotSupportedError& e) {
        if (wrote_) throw;  // a writer that stops mid-loop is the record's
        reference_writer_ = true;
        writer_note_ = std::string("; tokens written by the reference writer (the backend's cache_write: ") +
                       e.what() + ")";
        b_.Backend::cache_write(cache_, kv.view(), pe.view(), slots);
      }
    }
    r_.timings.run_ms += backend_call_done(tw);
  }

  void step(int k) {
    std::vector<std::int32_t> kv_rows;
    std::vector<std::int64_t> slots;
    const Call call = step_call(k, kv_rows, slots);
    if (call.empty()) return;
    if (!slots.empty()) write_tokens(kv_rows, slots);
    const CallResult res = sparse_ ? call_sparse_decode(b_, c_, *sf_, *sparse_state(ctx_).sparse_q, call, cfg_.exec)
                                   : call_decode(b_, c_, cache_, *decode_state(ctx_).q_lat, *decode_state(ctx_).q_pe, call, cfg_.exec);
    r_.timings.run_ms += res.run_ms;
    const auto tc = Clock::now();
    judge_step(k, call, res);
    keep_rows(call, res);
    r_.timings.compare_ms += ms_since(tc);
  }

  // The step's rows against the reference of exactly those tokens.
  void judge_step(int k, const Call& call, const CallResult& res) {
    StepResult sr;
    sr.step = k;
    sr.requests = static_cast<int>(call.seq_lens.size());
    if (!res.guard.empty()) {
      sr.status = Status::kIncorrect;
      if (first_bad_ < 0) first_msg_ = res.guard;
    } else {
      gather_reference(ctx_, call, ref_o_, ref_lse_, &all_ref_o_, &all_ref_lse_, L_);
      const RowCheck rc =
          check_rows(ctx_, cfg_, base_, res.o.view(), res.l.view(), call.qsl, ref_o_, ref_lse_, o_name_, L_, true);
      sr.status = rc.status;
      sr.max_abs_o = rc.o.nonfinite_mismatches > 0 ? INFINITY : rc.o.max_abs;
      sr.max_abs_lse = rc.lse.nonfinite_mismatches > 0 ? INFINITY : rc.lse.max_abs;
      if (sr.status != Status::kPassed && first_bad_ < 0) first_msg_ = rc.message;
    }
    r_.steps.push_back(sr);
    if (sr.status != Status::kPassed && first_bad_ < 0) first_bad_ = static_cast<int>(r_.steps.size()) - 1;
  }

  void keep_rows(const Call& call, const CallResult& res) {
    const std::size_t osz = dtype_size(c_.spec.dtype);
    const std::int64_t N = N_, L = L_;
    for (std::int64_t j = 0; j < call.num_tokens(); ++j) {
      const std::int64_t t = call.tokens[static_cast<std::size_t>(j)];
      std::memcpy(all_o_.bytes() + t * N * L * osz, static_cast<const std::byte*>(res.o.view().data) + j * N * L * osz,
                  N * L * osz);
      std::memcpy(all_l_.bytes() + t * N * 4, static_cast<const std::byte*>(res.l.view().data) + j * N * 4, N * 4);
    }
  }

  CaseContext& ctx_;
  const Case& c_;
  Backend& b_;
  Op op_;
  const RunConfig& cfg_;
  Record& r_;
  int steps_;
  bool sparse_;
  const char* o_name_;
  std::int64_t N_, L_;
  PagedCache cache_;
  std::optional<SparseFull> sf_;
  BaselineErrors base_;
  const std::vector<double>& all_ref_o_;
  const std::vector<double>& all_ref_lse_;
  Tensor all_o_, all_l_;
  std::vector<double> ref_o_, ref_lse_;
  int first_bad_ = -1;  // index into r.steps
  std::string first_msg_, writer_note_;
  bool reference_writer_ = false, wrote_ = false;
};

}  // namespace

void DecodeLoop::validate() const {
  if (steps < 1 || steps > 4096) throw InputError("--steps " + std::to_string(steps) + ": must be in 1..4096");
}

Record DecodeLoop::run(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg) const {
  const auto t0 = Clock::now();
  const Case& c = ctx.c;
  Record r;
  const auto finish = [&]() -> Record& {
    ctx.close_timings(r.timings, ms_since(t0));
    return r;
  };
  if (!loop_can_run(ctx, b, op, cfg, r)) return finish();
  for (int i = 0; i < c.num_requests; ++i)
    if (c.query_lens[i] > steps)
      throw std::logic_error("decode loop: request " + std::to_string(i) + " has more tokens than steps");
  Loop loop(ctx, b, op, cfg, r, steps);
  if (loop.run()) loop.verdict();
  return finish();
}

}  // namespace modes
}  // namespace mlagate
