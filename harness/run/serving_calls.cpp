// What the serving modes share (serving_calls.h): decode calls over some of a
// case's tokens, their rows judged, the plain call with its outputs kept.
#include "harness/run/serving_calls.h"

#include "backends/decode_args.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <stdexcept>

#include "backends/sparse_convert.h"
#include "cases/errors.h"
#include "cases/encoding.h"
#include "cases/sparse.h"
#include "reference/compare.h"
#include "reference/glue.h"
#include "reports/profile.h"

namespace mlagate::serving_detail {

// ---------------------------------------------------------------- one call

namespace {

// The backend call, timed, then its outputs' guard bands (`out`: the value output's name).
template <class F>
void timed_and_guarded(CallResult& res, const char* out, F&& call) {
  const auto t0 = Clock::now();
  call();
  res.run_ms = backend_call_done(t0);
  res.guard = res.o.check_guards(out);
  if (res.guard.empty()) res.guard = res.l.check_guards("lse");
}

}  // namespace

Tensor gather_tokens(const Tensor& t, std::span<const std::int32_t> tokens) {
  Shape shape = t.shape();
  const std::size_t row = t.nbytes() / static_cast<std::size_t>(shape.at(0));
  shape[0] = static_cast<std::int64_t>(tokens.size());
  Tensor out = Tensor::for_overwrite(t.dtype(), shape);
  for (std::size_t k = 0; k < tokens.size(); ++k)
    std::memcpy(out.bytes() + k * row, t.bytes() + static_cast<std::size_t>(tokens[k]) * row, row);
  return out;
}


CallResult call_decode(Backend& b, const Case& c, const PagedCache& cache, const Tensor& q_lat, const Tensor& q_pe,
                       const Call& call, const ExecOptions& opt) {
  const std::int64_t n = call.num_tokens(), N = c.spec.num_heads(), L = c.spec.dims.kv_lora_rank;
  CallResult res{GuardedBuffer(c.spec.dtype, {n, N, L}, opt.poison, opt.reuse_buffers),
                 GuardedBuffer(DType::kF32, {n, N}, opt.poison, opt.reuse_buffers), 0, {}};
  const Tensor ql = gather_tokens(q_lat, call.tokens), qp = gather_tokens(q_pe, call.tokens);
  const DecodeArgs a = decode_args(ql.view(), qp.view(), cache, {call.seq_lens, call.qsl, call.rows},
                                   c.spec.softmax_scale(), c.spec.k_scale, res.o.view(), res.l.view());
  timed_and_guarded(res, "o_lat", [&] { b.decode(a); });
  return res;
}

// ---------------------------------------------------------------- sparse calls

SparseFull sparse_full(CaseContext& ctx, const RunConfig& cfg, int bs, double& cache_ms, const PagedCache* main) {
  const Case& c = ctx.c;
  SparseFull f;
  f.cache = main ? main : &ctx.cache(bs, true, cfg.exec, cache_ms);
  f.extra = sparse_extra_cache(ctx, bs, cfg.exec, cache_ms);
  const SparseInputs& sp = *c.sparse;
  if (c.spec.sparse.window > 0) {
    f.window = c.spec.sparse.window;
  } else {
    f.main_slots = global_slots(c, sp.main, *f.cache);
    f.main_len = sp.main.length;
  }
  if (f.extra) {
    f.extra_slots = global_slots(c, sp.extra, *f.extra);
    f.extra_len = sp.extra.length;
  }
  f.sink = sp.sink;
  return f;
}

CallResult call_sparse_decode(Backend& b, const Case& c, const SparseFull& f, const Tensor& q, const Call& call,
                              const ExecOptions& opt) {
  const std::int64_t n = call.num_tokens(), N = c.spec.num_heads(), Dv = c.spec.sparse_dv();
  CallResult res{GuardedBuffer(c.spec.dtype, {n, N, Dv}, opt.poison, opt.reuse_buffers),
                 GuardedBuffer(DType::kF32, {n, N}, opt.poison, opt.reuse_buffers), 0, {}};
  const Tensor qs = gather_tokens(q, call.tokens);
  Tensor main_rows, extra_rows;
  std::vector<std::int32_t> main_len, extra_len;
  const auto lens = [&](const std::vector<std::int32_t>& all, std::vector<std::int32_t>& out) {
    if (all.empty()) return;
    for (std::int32_t t : call.tokens) out.push_back(all[static_cast<std::size_t>(t)]);
  };
  SparseDecodeArgs a;
  a.q = qs.view();
  a.cache = f.cache;
  if (!f.main_slots.empty()) {
    main_rows = gather_tokens(f.main_slots, call.tokens);
    order_rows_for(b, main_rows, !f.main_len.empty());  // as the sparse op hands them
    a.indices = main_rows.view();
    lens(f.main_len, main_len);
    a.topk_length = main_len;
  }
  a.window = f.window;
  a.seq_lens = call.seq_lens;
  a.query_start_loc = call.qsl;
  a.block_table_rows = call.rows;
  if (f.extra) {
    extra_rows = gather_tokens(f.extra_slots, call.tokens);
    a.extra_cache = f.extra;
    a.extra_indices = extra_rows.view();
    lens(f.extra_len, extra_len);
    a.extra_topk_length = extra_len;
  }
  a.sink = f.sink;
  a.scale = c.spec.softmax_scale();
  a.o = res.o.view();
  a.lse = res.l.view();
  timed_and_guarded(res, "o", [&] { b.sparse_decode(a); });
  return res;
}

void fill_dcp_shard(const Case& c, const PagedCache& full, PagedCache& shard, int rank, int ranks, int interleave,
                    Poison poison) {
  std::vector<std::byte> entry(static_cast<std::size_t>(full.entry_bytes)), bad(entry.size());
  poison_entry(full.format(), poison, bad.data());
  for (int i = 0; i < c.num_requests; ++i) {
    const int s = c.seq_lens[i];
    for (int p = 0; p < s; ++p)
      if (dcp_rank_of(p, ranks, interleave) == rank) {
        full.load_entry(full.slot_of(i, p), entry.data());
        shard.store_entry(shard.slot_of(i, dcp_local_pos(p, ranks, interleave)), entry.data());
      }
    for (int p = dcp_local_count(s, rank, ranks, interleave); p < s; ++p) shard.store_entry(shard.slot_of(i, p), bad.data());
  }
}

// The status and message of the exception being handled, as run_one maps them.
Status current_exception_status(std::string& message) {
  try {
    throw;
  } catch (const NotSupportedError& e) {
    message = e.what();
    return Status::kNotSupported;
  } catch (const DeviceUnavailableError& e) {
    message = e.what();
    return Status::kSkipped;
  } catch (const OutOfBoundsWriteError& e) {
    message = e.what();
    return Status::kIncorrect;
  } catch (const WrongOutputError& e) {
    message = e.what();
    return Status::kIncorrect;
  } catch (const BackendTimeoutError& e) {
    message = e.what();
    return Status::kTimeout;
  } catch (const std::exception& e) {
    message = std::string("backend threw: ") + e.what();
    return Status::kCrashed;
  }
}

// ---------------------------------------------------------------- judging rows


// The reference rows of the call's tokens ([n, N, dv] and [n, N]) out of
// whole-case references (default: the decode op's).
void gather_reference(CaseContext& ctx, const Call& call, std::vector<double>& o, std::vector<double>& lse,
                      const std::vector<double>* all_o, const std::vector<double>* all_lse, std::int64_t dv) {
  const std::int64_t N = ctx.c.spec.num_heads(), L = dv > 0 ? dv : ctx.c.spec.dims.kv_lora_rank;
  const std::vector<double>& ro = all_o ? *all_o : decode_state(ctx).mqa_o_lat;
  const std::vector<double>& rl = all_lse ? *all_lse : decode_state(ctx).mqa_lse;
  o.resize(static_cast<std::size_t>(call.num_tokens() * N * L));
  lse.resize(static_cast<std::size_t>(call.num_tokens() * N));
  for (std::int64_t k = 0; k < call.num_tokens(); ++k) {
    const std::int64_t t = call.tokens[static_cast<std::size_t>(k)];
    std::copy_n(ro.begin() + t * N * L, N * L, o.begin() + k * N * L);
    std::copy_n(rl.begin() + t * N, N, lse.begin() + k * N);
  }
}

BaselineErrors baseline_of(CaseContext& ctx, const RunConfig& cfg, bool sparse) {
  if (cfg.baseline.always || cfg.policy.kind == Policy::Kind::kBaseline)
    return sparse ? sparse_baseline(ctx) : decode_baseline(ctx);
  return {};
}

ShardMerge::ShardMerge(std::int64_t tokens, std::int64_t heads, std::int64_t width)
    : T(tokens),
      N(heads),
      dim(width),
      acc_o(static_cast<std::size_t>(tokens * heads * width), 0.f),
      acc_lse(static_cast<std::size_t>(tokens * heads), -std::numeric_limits<float>::infinity()) {}

void ShardMerge::take_exception() {
  std::string why;
  fail = current_exception_status(why);
  fail_msg = "shard call: " + why;
}

bool ShardMerge::take(const Call& call, const CallResult& res, int rank, double& run_ms) {
  ++calls;
  run_ms += res.run_ms;
  if (!res.guard.empty()) {
    fail = Status::kIncorrect, fail_msg = "rank " + std::to_string(rank) + ": " + res.guard;
    return false;
  }
  // The rank's partials at their tokens' rows (absent rows: lse -inf, weight 0), merged.
  Tensor part_o(DType::kF32, {T, N, dim}), part_l(DType::kF32, {T, N});
  std::fill_n(part_l.data<float>(), T * N, -std::numeric_limits<float>::infinity());
  const TensorView ov = res.o.view(), lv = res.l.view();
  for (std::int64_t k = 0; k < call.num_tokens(); ++k) {
    const std::int64_t t = call.tokens[static_cast<std::size_t>(k)];
    for (std::int64_t x = 0; x < N * dim; ++x) part_o.data<float>()[t * N * dim + x] = static_cast<float>(ov.get(k * N * dim + x));
    for (std::int64_t h = 0; h < N; ++h) part_l.data<float>()[t * N + h] = static_cast<float>(lv.get(k * N + h));
  }
  merge_states(acc_o, acc_lse, part_o.view(), part_l.view(), T, N, dim);
  return true;
}

double judge_merged(CaseContext& ctx, const RunConfig& cfg, Record& r, const ShardMerge& m, bool sparse,
                    const std::string& label, const std::string& hint) {
  const std::vector<float>&acc_o = m.acc_o, &acc_lse = m.acc_lse;
  const int calls = m.calls;
  const Case& c = ctx.c;
  const std::int64_t T = c.num_tokens, N = c.spec.num_heads(), dim = sparse ? c.spec.sparse_dv() : c.spec.dims.kv_lora_rank;
  // The merged output in the model dtype, as vLLM's merge writes it; lse fp32.
  GuardedBuffer o(c.spec.dtype, {T, N, dim}, Poison::kZero), l(DType::kF32, {T, N}, Poison::kZero);
  f32_run_to_16bit(acc_o.data(), T * N * dim, c.spec.dtype == DType::kBF16, static_cast<std::uint16_t*>(o.view().data));
  std::copy(acc_lse.begin(), acc_lse.end(), static_cast<float*>(l.view().data));
  const auto tc = Clock::now();
  const RowCheck rc = check_rows(ctx, cfg, baseline_of(ctx, cfg, sparse), o.view(), l.view(), c.query_start_loc,
                                 sparse ? sparse_state(ctx).sparse_ref.o : decode_state(ctx).mqa_o_lat, sparse ? sparse_state(ctx).sparse_ref.lse : decode_state(ctx).mqa_lse,
                                 sparse ? "o" : "o_lat", dim);
  // The merged outputs replace the whole call's (an fp8 case's quant_error stays).
  std::erase_if(r.metrics, [](const Metrics& m) { return m.output != "quant_error"; });
  r.metrics.insert(r.metrics.begin(), {rc.o, rc.lse});
  r.status = rc.status;
  r.message = rc.status == Status::kPassed
                  ? label + ": " + std::to_string(calls) + " shard calls merged through their LSEs match the reference"
                  : label + ", merged: " + rc.message + (hint.empty() ? "" : "; " + hint);
  // The LSE base, checked whatever the policy gates: a merge of log2 LSEs
  // weighs the shards wrong even where the output tolerance hides it.
  if (r.status == Status::kPassed && !hint.empty()) {
    r.status = Status::kIncorrect;
    r.message = label + ": the merge needs natural-log LSEs, and " + hint;
  }
  const double ms = ms_since(tc);
  r.timings.compare_ms += ms;
  return ms;
}

void merge_shards(CaseContext& ctx, const RunConfig& cfg, Record& r, ShardMerge& m, const ShardRun& how,
                  const std::function<void()>& shard_calls) {
  try {
    shard_calls();
  } catch (...) {
    m.take_exception();
  }
  if (m.failed()) {
    r.status = m.fail;
    r.message = how.label + ", " + m.fail_msg;
    r.timings.total_ms += ms_since(how.t0);
    return;
  }
  if (!how.sink.empty()) {
    const std::int64_t T = m.T, N = m.N, D = m.dim;
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < N; ++h) {
        const float l = m.acc_lse[static_cast<std::size_t>(t * N + h)];
        if (!std::isfinite(l)) continue;
        const float scale = 1.f / (1.f + std::exp(how.sink[static_cast<std::size_t>(h)] - l));
        for (std::int64_t x = 0; x < D; ++x) m.acc_o[static_cast<std::size_t>((t * N + h) * D + x)] *= scale;
      }
  }
  const double compare_ms = judge_merged(ctx, cfg, r, m, how.sparse, how.label, how.hint);
  r.timings.total_ms += ms_since(how.t0);
  r.timings.glue_ms += ms_since(how.t0) - (r.timings.run_ms - how.run_before) - compare_ms;
}

// o_lat and lse of `qsl`'s tokens against reference rows, in the runner's
// order: non-finite values, then the tolerance.
RowCheck check_rows(const CaseContext& ctx, const RunConfig& cfg, const BaselineErrors& base, const TensorView& o,
                    const TensorView& l, std::span<const std::int32_t> qsl, const std::vector<double>& ref_o,
                    const std::vector<double>& ref_lse, const char* o_name, std::int64_t dv, bool some_rows) {
  const Dims& d = ctx.c.spec.dims;
  const std::int64_t N = ctx.c.spec.num_heads();
  RowCheck rc;
  const auto one = [&](const char* name, const TensorView& got, const std::vector<double>& ref, bool is_lse,
                       std::int64_t dim, Metrics& m) {
    OutputCheck chk;
    chk.name = name;
    chk.got = got;
    chk.expected_shape = got.shape;
    chk.expected_dtype = got.dtype;
    chk.reference = &ref;
    chk.layout = Layout{qsl, N, dim};
    chk.is_lse = is_lse;
    chk.err_baseline = is_lse ? base.lse : base.out;
    chk.dqk = d.kv_lora_rank + d.rope_dim;
    chk.zero_reference_ok = some_rows;
    return compare_output(chk, cfg.policy, m);
  };
  const Status so = one(o_name, o, ref_o, false, dv > 0 ? dv : d.kv_lora_rank, rc.o);
  const Status sl = one("lse", l, ref_lse, true, 1, rc.lse);
  for (const auto& [s, m] : {std::pair{so, &rc.o}, std::pair{sl, &rc.lse}})
    if (s == Status::kNonfinite && rc.status != Status::kNonfinite) rc.status = s, rc.message = m->message;
  if (rc.status == Status::kPassed)
    for (const auto& [s, m] : {std::pair{so, &rc.o}, std::pair{sl, &rc.lse}})
      if (s == Status::kIncorrect && rc.status == Status::kPassed) rc.status = s, rc.message = m->message;
  // An lse that fails because it is log2 says so, as in a plain run.
  if (sl == Status::kIncorrect)
    if (const std::string hint = lse_base_hint(l, ref_lse); !hint.empty()) {
      rc.lse.message += "; " + hint;
      if (rc.message == rc.lse.message.substr(0, rc.message.size())) rc.message = rc.lse.message;
    }
  return rc;
}

// ---------------------------------------------------------------- the plain call


// run_one with its outputs kept (results files still get them).
Record plain_run(CaseContext& ctx, Backend& b, Op op, const RunConfig& base, std::vector<Captured>& out) {
  RunConfig cfg = base;
  cfg.on_outputs = [&](const Case& c, const Record& r, std::span<const ProducedOutput> outs) {
    if (base.on_outputs) base.on_outputs(c, r, outs);
    for (const ProducedOutput& po : outs) {
      const TensorView v = po.buf.view();
      out.push_back({po.name, v.dtype, {}});
      out.back().bytes.assign(static_cast<const std::byte*>(v.data), static_cast<const std::byte*>(v.data) + v.nbytes());
    }
  };
  return run_one(ctx, b, op, cfg);
}

const Captured* find_output(const std::vector<Captured>& outs, const char* name) {
  for (const Captured& c : outs)
    if (c.name == name) return &c;
  return nullptr;
}

}  // namespace mlagate::serving_detail
