// Batch invariance, DCP and decode loops (serving.h, SERVING.md). Every mode
// first runs the plain decode record (run_one) and keeps its outputs; the
// mode's calls then go through the same DecodeArgs a plain call gets, over
// sub-batches of the case's requests (block-table rows chosen per request, so
// no cache is rebuilt), shard caches or a cache the backend writes step by step.
#include "harness/run/serving.h"
#include "harness/run/serving_calls.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>

#include "cases/encoding.h"
#include "cases/errors.h"
#include "cases/sparse.h"
#include "harness/run/case_context.h"
#include "harness/run/guarded.h"
#include "reference/compare.h"
#include "reference/glue.h"
#include "reports/profile.h"

namespace mlagate {

namespace {
using namespace serving_detail;  // the shared calls and checks (serving_calls.h)

struct RowDiff {
  std::int64_t elements = 0, differ = 0;
  double max_diff = 0;  // inf when a NaN differs from a number
  double max_mag = 0;   // the largest |value| of the rows in the batch call
  // ULPs at the rows' own scale: a bit of difference in values near 0 (where
  // sums cancel) is not counted as thousands of ULPs of a tiny number.
  double ulps(DType d) const { return std::isinf(max_diff) ? INFINITY : max_diff / ulp_of(std::max(max_mag, 1e-30), d); }
};

void diff_rows(const std::byte* a, const std::byte* b, std::int64_t n, DType dtype, RowDiff& d) {
  const std::size_t esz = dtype_size(dtype);
  d.elements += n;
  const TensorView va{dtype, {n}, const_cast<std::byte*>(a)}, vb{dtype, {n}, const_cast<std::byte*>(b)};
  for (std::int64_t i = 0; i < n; ++i) {
    const double fa = va.get(i);
    if (std::isfinite(fa)) d.max_mag = std::max(d.max_mag, std::abs(fa));
    if (std::memcmp(a + i * esz, b + i * esz, esz) == 0) continue;
    ++d.differ;
    const double fb = vb.get(i);
    d.max_diff = std::max(d.max_diff, std::isnan(fa) != std::isnan(fb) ? INFINITY : std::abs(fa - fb));
  }
}

std::string diff_text(const RowDiff& d, DType dtype) {
  if (std::isinf(d.max_diff)) return "NaN against a number";
  std::ostringstream m;
  m.precision(3);
  m << "max diff " << d.max_diff << " = " << d.ulps(dtype) << " ULP at the rows' scale " << d.max_mag;
  return m.str();
}

// ---------------------------------------------------------------- batch invariance

Record run_batch_invariance(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg) {
  const bool sparse = op == Op::kSparseDecode;
  const char* o_name = sparse ? "o" : "o_lat";
  std::vector<Captured> plain;
  Record r = plain_run(ctx, b, op, cfg, plain);
  const Captured* po = find_output(plain, o_name);
  const Captured* pl = find_output(plain, "lse");
  if (!po || !pl) return r;  // nothing ran (not supported, skipped, crashed)
  const auto t0 = Clock::now();
  const double run_before = r.timings.run_ms;
  const Case& c = ctx.c;
  const int B = c.num_requests;
  const std::int64_t N = c.spec.num_heads(), L = sparse ? c.spec.sparse_dv() : c.spec.dims.kv_lora_rank;
  // The op's call over some of the case's tokens, its references and err_baseline.
  std::optional<SparseFull> sf;
  if (sparse) sf = sparse_full(ctx, cfg, r.block_size, r.timings.cache_ms);
  const PagedCache& cache = sparse ? *sf->cache : ctx.cache(r.block_size, true, cfg.exec, r.timings.cache_ms);
  const auto call_op = [&](const Call& call) {
    return sparse ? call_sparse_decode(b, c, *sf, *sparse_state(ctx).sparse_q, call, cfg.exec)
                  : call_decode(b, c, cache, *decode_state(ctx).q_lat, *decode_state(ctx).q_pe, call, cfg.exec);
  };
  const std::vector<double>& all_ref_o = sparse ? sparse_state(ctx).sparse_ref.o : decode_state(ctx).mqa_o_lat;
  const std::vector<double>& all_ref_lse = sparse ? sparse_state(ctx).sparse_ref.lse : decode_state(ctx).mqa_lse;

  struct Config {
    std::string name;
    std::vector<int> requests;
  };
  std::vector<Config> configs;
  // Alone: every request up to 16, else 16 spread from the first to the last.
  const int alone = std::min(B, 16);
  for (int k = 0; k < alone; ++k) {
    const int i = alone == B ? k : static_cast<int>(static_cast<std::int64_t>(k) * (B - 1) / (alone - 1));
    if (!configs.empty() && configs.back().requests.front() == i) continue;
    configs.push_back({"alone", {i}});
  }
  if (B > 1) {
    // Shuffled: Fisher-Yates from the case's seed (mt19937_64 is the same on every platform).
    std::vector<int> perm(static_cast<std::size_t>(B));
    for (int i = 0; i < B; ++i) perm[i] = i;
    std::mt19937_64 rng(c.spec.seed ^ 0x6d6c6167617465ull);
    for (int j = B - 1; j > 0; --j) std::swap(perm[j], perm[rng() % static_cast<std::uint64_t>(j + 1)]);
    configs.push_back({"shuffled", perm});
  }
  // Beside extra requests: the batch, then max(B, 16) more (the batch again in
  // reverse, repeated): split heuristics and tile schedules see another batch size.
  Config extra{"beside " + std::to_string(std::max(B, 16)) + " extra requests", {}};
  for (int i = 0; i < B; ++i) extra.requests.push_back(i);
  for (int k = 0; k < std::max(B, 16); ++k) extra.requests.push_back(B - 1 - k % B);
  configs.push_back(extra);

  const BaselineErrors base = baseline_of(ctx, cfg, sparse);
  std::vector<double> ref_o, ref_lse;
  int variant_requests = 0;
  std::vector<bool> varies(static_cast<std::size_t>(B), false);
  std::string first, details;
  int detail_lines = 0;
  Status fail = Status::kPassed;
  std::string fail_msg;
  try {
    for (const Config& cf : configs) {
      if (fail != Status::kPassed) break;
      Call call;
      for (int i : cf.requests) call.add(c.query_start_loc[i], c.query_lens[i], c.seq_lens[i], i);
      CallResult res = call_op(call);
      r.timings.run_ms += res.run_ms;
      const std::string label = cf.name == "alone" ? "alone (request " + std::to_string(cf.requests.front()) + ")" : cf.name;
      if (!res.guard.empty()) {
        fail = Status::kIncorrect, fail_msg = label + ": " + res.guard;
        break;
      }
      const std::byte* go = static_cast<const std::byte*>(res.o.view().data);
      const std::byte* gl = static_cast<const std::byte*>(res.l.view().data);
      const std::size_t osz = dtype_size(c.spec.dtype);
      bool checked = false;
      for (std::size_t j = 0; j < cf.requests.size() && fail == Status::kPassed; ++j) {
        const int i = cf.requests[j];
        const std::int64_t q = c.query_lens[i], at = call.qsl[j], t = c.query_start_loc[i];
        RowDiff dout, dlse;
        diff_rows(po->bytes.data() + t * N * L * osz, go + at * N * L * osz, q * N * L, c.spec.dtype, dout);
        diff_rows(pl->bytes.data() + t * N * 4, gl + at * N * 4, q * N, DType::kF32, dlse);
        if (dout.differ == 0 && dlse.differ == 0) continue;  // the plain call's rows: already judged
        if (!checked) {
          // Rows that differ are judged too: a call that is wrong, not merely
          // different, fails as a plain call would.
          checked = true;
          gather_reference(ctx, call, ref_o, ref_lse, &all_ref_o, &all_ref_lse, L);
          const RowCheck rc =
              check_rows(ctx, cfg, base, res.o.view(), res.l.view(), call.qsl, ref_o, ref_lse, o_name, L, true);
          if (rc.status != Status::kPassed) {
            fail = rc.status, fail_msg = label + ": " + rc.message;
            break;
          }
        }
        if (!varies[i]) varies[i] = true, ++variant_requests;
        std::ostringstream m;
        m << "request " << i << " (seq_len " << c.seq_lens[i] << ", query_len " << q << ") " << label
          << " vs in its batch: " << o_name << " " << dout.differ << " of " << dout.elements << " elements differ"
          << (dout.differ ? " (" + diff_text(dout, c.spec.dtype) + ")" : "") << ", lse " << dlse.differ << " of "
          << dlse.elements << (dlse.differ ? " (" + diff_text(dlse, DType::kF32) + ")" : "");
        if (first.empty()) first = m.str();
        if (++detail_lines <= 40) details += m.str() + "\n";
      }
    }
  } catch (...) {
    std::string why;
    fail = current_exception_status(why);
    fail_msg = "batch-invariance call: " + why;
  }
  r.timings.total_ms += ms_since(t0);
  r.timings.glue_ms += ms_since(t0) - (r.timings.run_ms - run_before);
  if (r.status != Status::kPassed) return r;  // the plain call's verdict stands
  if (fail != Status::kPassed) {
    r.status = fail;
    r.message = fail_msg;
    return r;
  }
  if (variant_requests == 0) {
    r.message = "batch invariant: every request's rows bitwise equal alone, shuffled and beside extra requests (" +
                std::to_string(configs.size()) + " calls)";
    return r;
  }
  r.status = Status::kBatchVariant;
  r.message = std::to_string(variant_requests) + " of " + std::to_string(B) + " requests vary with their batchmates; " +
              first;
  if (detail_lines > 40) details += "... " + std::to_string(detail_lines - 40) + " more\n";
  r.details = details;
  return r;
}

// ---------------------------------------------------------------- DCP

Record run_dcp(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg, int ranks, int interleave) {
  if (op == Op::kSparseDecode) return run_sparse_dcp(ctx, b, op, cfg, ranks, interleave);
  std::vector<Captured> plain;
  Record r = plain_run(ctx, b, op, cfg, plain);
  const Captured* pl = find_output(plain, "lse");
  if (!pl) return r;
  const Case& c = ctx.c;
  const std::int64_t T = c.num_tokens, N = c.spec.num_heads(), L = c.spec.dims.kv_lora_rank;
  const TensorView whole_lse{DType::kF32, {T, N}, const_cast<std::byte*>(pl->bytes.data())};
  const std::string hint = lse_base_hint(whole_lse, decode_state(ctx).mqa_lse);
  const std::string label =
      "dcp " + std::to_string(ranks) + " (interleave " + std::to_string(interleave) + ")";
  if (r.status != Status::kPassed) {
    r.message = "the whole call, before sharding: " + r.message + (hint.empty() ? "" : "; " + hint);
    return r;
  }
  const auto t0 = Clock::now();
  const double run_before = r.timings.run_ms;
  const PagedCache& full = ctx.cache(r.block_size, true, cfg.exec, r.timings.cache_ms);
  // Each query token as a request of its own: token u of a request with
  // context c sees keys 0 .. c + u, and a rank sees its share of those (the
  // causal rule holds per token whatever the sharding).
  std::vector<int> visible(static_cast<std::size_t>(T)), owner(static_cast<std::size_t>(T));
  for (int i = 0; i < c.num_requests; ++i)
    for (int u = 0; u < c.query_lens[i]; ++u) {
      const int t = c.query_start_loc[i] + u;
      visible[t] = c.seq_lens[i] - c.query_lens[i] + u + 1;
      owner[t] = i;
    }
  ShardMerge m(T, N, L);
  try {
    PagedCache shard = full;  // the same block table; each rank's keys rewritten in place
    for (int rank = 0; rank < ranks && !m.failed(); ++rank) {
      fill_dcp_shard(c, full, shard, rank, ranks, interleave, cfg.exec.poison);
      Call call;
      for (int t = 0; t < T; ++t)
        if (const int n = dcp_local_count(visible[t], rank, ranks, interleave); n > 0) call.add(t, 1, n, owner[t]);
      if (call.empty()) continue;  // no key on this rank: its partials weigh 0
      if (!m.take(call, call_decode(b, c, shard, *decode_state(ctx).q_lat, *decode_state(ctx).q_pe, call, cfg.exec), rank, r.timings.run_ms)) break;
    }
  } catch (...) {
    m.take_exception();
  }
  if (m.failed()) {
    r.status = m.fail;
    r.message = label + ", " + m.fail_msg;
    r.timings.total_ms += ms_since(t0);
    return r;
  }
  const double compare_ms = judge_merged(ctx, cfg, r, m, false, label, hint);
  r.timings.total_ms += ms_since(t0);
  r.timings.glue_ms += ms_since(t0) - (r.timings.run_ms - run_before) - compare_ms;
  return r;
}

// ---------------------------------------------------------------- decode loops

Record run_steps(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg, int steps) {
  const auto t0 = Clock::now();
  const Case& c = ctx.c;
  Record r;
  r.case_id = c.spec.id();
  r.backend = std::string(b.name());
  r.op = std::string(op_name(op));
  r.policy = cfg.policy.describe();
  if (cfg.repro) r.repro = cfg.repro(c.spec, r.backend, op);
  const auto finish = [&]() -> Record& {
    ctx.close_timings(r.timings, ms_since(t0));
    return r;
  };
  // Every step is a batch of one-token decodes: that is what the backend must take.
  CaseSpec step_spec = c.spec;
  for (std::size_t i = 0; i < step_spec.batch.query_lens.size(); ++i) step_spec.batch.query_lens[i] = 1;
  step_spec.batch.spec_decode = false;
  const bool sparse = op == Op::kSparseDecode;
  Capabilities caps;
  try {
    const Support s = b.supports(step_spec, op);
    caps = b.capabilities();
    if (!s.ok) {
      r.status = Status::kNotSupported;
      r.message = s.reason;
      return finish();
    }
  } catch (const std::exception& e) {
    r.status = Status::kCrashed;
    r.message = std::string("supports() threw: ") + e.what();
    return finish();
  }
  r.block_size = resolve_block_size(caps, c.spec);
  if (const std::string why = ctx.missing_cache(r.block_size); !why.empty()) {
    r.status = Status::kSkipped;
    r.message = why;
    return finish();
  }
  for (int i = 0; i < c.num_requests; ++i)
    if (c.query_lens[i] > steps)
      throw std::logic_error("decode loop: request " + std::to_string(i) + " has more tokens than steps");
  const std::int64_t T = c.num_tokens, N = c.spec.num_heads(), L = sparse ? c.spec.sparse_dv() : c.spec.dims.kv_lora_rank;
  PagedCache cache = ctx.cache(r.block_size, false, cfg.exec, r.timings.cache_ms);  // context only: the loop writes the rest
  // The sparse op reads the loop's cache through the case's index rows (V3.2:
  // positions up to the token's own, written by its step or before), V4's
  // window and compressed cache (a compressor's output: not written by steps).
  std::optional<SparseFull> sf;
  if (sparse) {
    sparse_state(ctx);
    sf = sparse_full(ctx, cfg, r.block_size, r.timings.cache_ms, &cache);
  } else {
    decode_state(ctx);
  }
  const BaselineErrors base = baseline_of(ctx, cfg, sparse);
  const std::vector<double>& all_ref_o = sparse ? sparse_state(ctx).sparse_ref.o : decode_state(ctx).mqa_o_lat;
  const std::vector<double>& all_ref_lse = sparse ? sparse_state(ctx).sparse_ref.lse : decode_state(ctx).mqa_lse;
  const char* o_name = sparse ? "o" : "o_lat";
  // Every step's rows land here, in the case's token order, for the record's metrics.
  Tensor all_o(c.spec.dtype, {T, N, L}), all_l(DType::kF32, {T, N});
  poison_fill(all_o.view(), Poison::kNaN);
  poison_fill(all_l.view(), Poison::kNaN);
  const std::size_t osz = dtype_size(c.spec.dtype);
  const std::int64_t* slot_map = cache.slot_mapping.data<std::int64_t>();
  std::vector<double> ref_o, ref_lse;
  int first_bad = -1;  // index into r.steps
  std::string first_msg;
  bool reference_writer = false, wrote = false;
  std::string writer_note;
  Status fail = Status::kPassed;
  std::string fail_msg;
  try {
    for (int k = 0; k < steps; ++k) {
      Call call;
      std::vector<std::int32_t> kv_rows;
      std::vector<std::int64_t> slots;
      for (int i = 0; i < c.num_requests; ++i) {
        const int join = loop_join(i, c.query_lens[i], steps);
        if (k < join || k >= join + c.query_lens[i]) continue;
        const int u = k - join, context = c.seq_lens[i] - c.query_lens[i];
        const int t = c.query_start_loc[i] + u;
        if (c.seq_lens[i] == 0) {  // CUDA-graph padding stays padding: no key, nothing written
          call.add(t, 1, 0, i);
          continue;
        }
        call.add(t, 1, context + u + 1, i);
        kv_rows.push_back(c.kv_start_loc[i] + context + u);
        slots.push_back(slot_map[t]);
      }
      if (call.empty()) continue;
      // The step's new tokens through the backend's own writer (fp8 scales
      // included). A backend whose writer does not take the cache's format
      // (the CUDA writers and fp8_v4) has them written by the reference writer,
      // as an engine's separate cache kernel would, and the record says so.
      if (!slots.empty()) {
        const Tensor kv = gather_tokens(c.kv_c, kv_rows), pe = gather_tokens(c.k_pe, kv_rows);
        const auto tw = Clock::now();
        if (reference_writer) {
          b.Backend::cache_write(cache, kv.view(), pe.view(), slots);
        } else {
          try {
            b.cache_write(cache, kv.view(), pe.view(), slots);
            wrote = true;
          } catch (const NotSupportedError& e) {
            if (wrote) throw;  // a writer that stops mid-loop is the record's
            reference_writer = true;
            writer_note = std::string("; tokens written by the reference writer (the backend's cache_write: ") +
                          e.what() + ")";
            b.Backend::cache_write(cache, kv.view(), pe.view(), slots);
          }
        }
        r.timings.run_ms += backend_call_done(tw);
      }
      CallResult res = sparse ? call_sparse_decode(b, c, *sf, *sparse_state(ctx).sparse_q, call, cfg.exec)
                              : call_decode(b, c, cache, *decode_state(ctx).q_lat, *decode_state(ctx).q_pe, call, cfg.exec);
      r.timings.run_ms += res.run_ms;
      const auto tc = Clock::now();
      StepResult sr;
      sr.step = k;
      sr.requests = static_cast<int>(call.seq_lens.size());
      if (!res.guard.empty()) {
        sr.status = Status::kIncorrect;
        if (first_bad < 0) first_msg = res.guard;
      } else {
        gather_reference(ctx, call, ref_o, ref_lse, &all_ref_o, &all_ref_lse, L);
        const RowCheck rc =
            check_rows(ctx, cfg, base, res.o.view(), res.l.view(), call.qsl, ref_o, ref_lse, o_name, L, true);
        sr.status = rc.status;
        sr.max_abs_o = rc.o.nonfinite_mismatches > 0 ? INFINITY : rc.o.max_abs;
        sr.max_abs_lse = rc.lse.nonfinite_mismatches > 0 ? INFINITY : rc.lse.max_abs;
        if (sr.status != Status::kPassed && first_bad < 0) first_msg = rc.message;
      }
      r.steps.push_back(sr);
      if (sr.status != Status::kPassed && first_bad < 0) first_bad = static_cast<int>(r.steps.size()) - 1;
      for (std::int64_t j = 0; j < call.num_tokens(); ++j) {
        const std::int64_t t = call.tokens[static_cast<std::size_t>(j)];
        std::memcpy(all_o.bytes() + t * N * L * osz, static_cast<const std::byte*>(res.o.view().data) + j * N * L * osz,
                    N * L * osz);
        std::memcpy(all_l.bytes() + t * N * 4, static_cast<const std::byte*>(res.l.view().data) + j * N * 4, N * 4);
      }
      r.timings.compare_ms += ms_since(tc);
    }
  } catch (...) {
    fail = current_exception_status(fail_msg);
    fail_msg = "step " + std::to_string(r.steps.size()) + " of " + std::to_string(steps) + ": " + fail_msg;
  }
  if (fail != Status::kPassed) {
    r.status = fail;
    r.message = fail_msg;
    return finish();
  }
  const auto tc = Clock::now();
  const RowCheck rc = check_rows(ctx, cfg, base, all_o.view(), all_l.view(), c.query_start_loc, all_ref_o,
                                 all_ref_lse, o_name, L);
  r.timings.compare_ms += ms_since(tc);
  r.metrics = {rc.o, rc.lse};
  r.paths.assign(static_cast<std::size_t>(c.num_requests), std::string(op_name(op)));
  if (first_bad >= 0) {
    const int first_step = r.steps[static_cast<std::size_t>(first_bad)].step;
    int failing = 0;
    for (const StepResult& s : r.steps) failing += s.status != Status::kPassed ? 1 : 0;
    r.status = r.steps[static_cast<std::size_t>(first_bad)].status;
    r.message = "step " + std::to_string(first_step) + " of " + std::to_string(steps) + " is the first to fail (" +
                std::to_string(failing) + " steps fail): " + first_msg;
  } else {
    r.status = rc.status;  // passed step by step: the whole agrees
    r.message = rc.status == Status::kPassed ? std::to_string(steps) + " decode steps, each checked" : rc.message;
  }
  r.message += writer_note;
  return finish();
}

}  // namespace

// ---------------------------------------------------------------- public

std::string ServingMode::name() const {
  if (cuda_graph) return "cuda-graph";
  if (batch_invariance) return "batch-invariance";
  if (dcp > 0) return "dcp=" + std::to_string(dcp) + ",interleave=" + std::to_string(dcp_interleave);
  if (steps > 0) return "steps=" + std::to_string(steps);
  return {};
}

void ServingMode::validate() const {
  if ((cuda_graph ? 1 : 0) + (batch_invariance ? 1 : 0) + (dcp > 0 ? 1 : 0) + (steps > 0 ? 1 : 0) > 1)
    throw InputError("--cuda-graph, --check batch-invariance, --dcp and --steps are separate modes: give one of them");
  if (capture_sizes.empty()) throw InputError("--capture-sizes: give at least one size");
  for (std::size_t i = 0; i < capture_sizes.size(); ++i)
    if (capture_sizes[i] < 1 || capture_sizes[i] > 65536 || (i > 0 && capture_sizes[i] <= capture_sizes[i - 1]))
      throw InputError("--capture-sizes: sizes must be increasing, within 1..65536");
  if (dcp < 0 || dcp == 1 || dcp > 64) throw InputError("--dcp " + std::to_string(dcp) + ": ranks must be in 2..64");
  if (dcp_interleave < 1) throw InputError("--dcp-interleave must be >= 1");
  if (dcp == 0 && dcp_interleave != 1) throw InputError("--dcp-interleave needs --dcp N");
  if (steps < 0 || steps > 4096) throw InputError("--steps " + std::to_string(steps) + ": must be in 1..4096");
}

bool ServingMode::takes(Op op) const { return op == Op::kDecode || op == Op::kSparseDecode; }

std::vector<Op> ServingMode::ops(bool auto_ops, const std::vector<Op>& asked, const std::vector<CaseSpec>& cases) const {
  if (auto_ops) {
    bool dense = false, sparse = false;
    for (const CaseSpec& c : cases) (c.sparse.active() ? sparse : dense) = true;
    std::vector<Op> out;
    if (dense || !sparse) out.push_back(Op::kDecode);
    if (sparse) out.push_back(Op::kSparseDecode);
    return out;
  }
  for (Op op : asked)
    if (!takes(op))
      throw InputError(name() + " runs the kernel-level decode or sparse_decode op: pass --op decode or sparse_decode "
                                "(or leave --op out)");
  return asked;
}

Record run_serving(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg, const ServingMode& mode) {
  if (!mode.takes(op)) throw std::logic_error(mode.name() + " does not run the " + std::string(op_name(op)) + " op");
  Record r = mode.cuda_graph         ? run_graph(ctx, b, op, cfg, mode)
             : mode.batch_invariance ? run_batch_invariance(ctx, b, op, cfg)
             : mode.dcp > 0        ? run_dcp(ctx, b, op, cfg, mode.dcp, mode.dcp_interleave)
             : mode.steps > 0      ? run_steps(ctx, b, op, cfg, mode.steps)
                                   : run_one(ctx, b, op, cfg);
  r.mode = mode.name();
  return r;
}

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

int dcp_rank_of(int pos, int ranks, int interleave) { return (pos / interleave) % ranks; }
int dcp_local_pos(int pos, int ranks, int interleave) {
  return (pos / (ranks * interleave)) * interleave + pos % interleave;
}
int dcp_local_count(int visible, int rank, int ranks, int interleave) {
  const int cycle = ranks * interleave;
  return (visible / cycle) * interleave + std::clamp(visible % cycle - rank * interleave, 0, interleave);
}

}  // namespace mlagate
