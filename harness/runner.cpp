// Runs every (case, backend, op), times each phase, compares against the
// golden and turns every outcome (including exceptions) into a record.
#include "harness/runner.h"

#include <chrono>
#include <map>
#include <optional>

#include "cases/case.h"
#include "cases/errors.h"
#include "harness/glue.h"
#include "reference/golden.h"

namespace mlagate {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
}  // namespace

// Everything derived from one case, computed on first use and shared by backends.
struct CaseContext {
  Case c;
  double generate_ms = 0;
  std::optional<Golden> golden;  // absorbed path: out, lse, o_lat
  double golden_ms = 0;
  // Kernel-level decode: absorbed queries and the reference on exactly them.
  std::optional<Tensor> q_lat, q_pe;
  std::vector<double> mqa_o_lat, mqa_lse;
  // Kernel-level prefill: up-projected keys and values of every token.
  std::optional<Tensor> k_all, v_all;
  std::map<std::pair<int, bool>, PagedCache> caches;  // (block size, new tokens written)

  const Golden& get_golden() {
    if (!golden) {
      const auto t0 = Clock::now();
      golden = golden_absorbed(c);
      golden_ms += ms_since(t0);
    }
    return *golden;
  }
  const PagedCache& cache(int bs, bool write_new, const ExecOptions& opt, double& ms) {
    auto key = std::make_pair(bs, write_new);
    auto it = caches.find(key);
    if (it == caches.end()) {
      const auto t0 = Clock::now();
      CacheOptions co;
      co.poison = opt.poison;
      co.poison_block_table = opt.poison_block_table;
      co.write_new_tokens = write_new;
      it = caches.emplace(key, build_paged_cache(c, bs, co)).first;
      ms += ms_since(t0);
    }
    return it->second;
  }
  void prepare_decode() {
    if (q_lat) return;
    const auto t0 = Clock::now();
    std::vector<int> tokens(static_cast<std::size_t>(c.num_tokens));
    for (int t = 0; t < c.num_tokens; ++t) tokens[static_cast<std::size_t>(t)] = t;
    q_lat.emplace();
    q_pe.emplace();
    absorb_queries(c, tokens, *q_lat, *q_pe);
    reference_mqa(c, q_lat->view(), mqa_o_lat, mqa_lse);
    golden_ms += ms_since(t0);
  }
  void prepare_prefill() {
    if (k_all) return;
    k_all.emplace();
    v_all.emplace();
    up_project_kv(c, c.kv_c.view(), c.k_pe.view(), *k_all, *v_all);
  }
};

Record run_one(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg) {
  const Case& c = ctx.c;
  Record r;
  r.case_id = c.spec.id();
  r.backend = std::string(b.name());
  r.op = std::string(op_name(op));
  r.policy = cfg.policy.describe();
  if (cfg.repro) r.repro = cfg.repro(c.spec, r.backend, op);

  Support s = b.supports(c.spec, op);
  const Capabilities caps = b.capabilities();
  if (s.ok && op == Op::kLayer) s = route_requests(caps, c.spec).support;
  if (!s.ok) {
    r.status = Status::kNotSupported;
    r.message = s.reason;
    return r;
  }
  r.block_size = resolve_block_size(caps, c.spec);
  r.timings.generate_ms = ctx.generate_ms;

  OpRun run;
  const std::vector<double>* golden_main = nullptr;
  const std::vector<double>* golden_lse = nullptr;
  try {
    switch (op) {
      case Op::kLayer: {
        const PagedCache& base = ctx.cache(r.block_size, false, cfg.exec, r.timings.cache_ms);
        run = run_layer(b, c, base, cfg.exec);
        golden_main = &ctx.get_golden().out;
        golden_lse = &ctx.get_golden().lse;
        break;
      }
      case Op::kDecode: {
        const PagedCache& full = ctx.cache(r.block_size, true, cfg.exec, r.timings.cache_ms);
        ctx.prepare_decode();
        run = run_decode_op(b, c, full, *ctx.q_lat, *ctx.q_pe, cfg.exec);
        golden_main = &ctx.mqa_o_lat;
        golden_lse = &ctx.mqa_lse;
        break;
      }
      case Op::kPrefill: {
        ctx.prepare_prefill();
        run = run_prefill_op(b, c, *ctx.k_all, *ctx.v_all, cfg.exec);
        golden_main = &ctx.get_golden().out;
        golden_lse = &ctx.get_golden().lse;
        break;
      }
      case Op::kCacheWrite:
        throw NotSupportedError("cache_write conformance arrives with the fp8 cache work");
    }
  } catch (const NotSupportedError& e) {
    r.status = Status::kNotSupported;
    r.message = e.what();
    return r;
  } catch (const std::exception& e) {
    r.status = Status::kCrashed;
    r.message = std::string("backend threw: ") + e.what();
    return r;
  }
  r.timings.golden_ms = ctx.golden_ms;
  r.timings.run_ms = run.run_ms;
  r.paths = run.paths;

  const auto t0 = Clock::now();
  std::optional<Status> nonfinite, incorrect;
  std::string nonfinite_msg, incorrect_msg, info_msg;
  for (const ProducedOutput& po : run.outputs) {
    OutputCheck chk;
    chk.name = po.name;
    chk.got = po.buf.view();
    chk.expected_shape = po.buf.view().shape;
    chk.expected_dtype = po.buf.view().dtype;
    chk.golden = po.is_lse ? golden_lse : golden_main;
    chk.layout = Layout{c.query_start_loc, po.heads, po.dim};
    chk.is_lse = po.is_lse;
    Metrics m;
    const Status st = compare_output(chk, cfg.policy, m);
    if (st == Status::kNonfinite && !nonfinite) nonfinite = st, nonfinite_msg = m.message;
    if (st == Status::kIncorrect && !incorrect) incorrect = st, incorrect_msg = m.message;
    if (st == Status::kPassed && !m.message.empty() && info_msg.empty()) info_msg = m.message;
    r.metrics.push_back(std::move(m));
  }
  r.timings.compare_ms = ms_since(t0);
  // MLA_SPEC 8 order: guard bands, then non-finite values, then tolerance.
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
  return r;
}

std::vector<Record> run_cases(const RunConfig& cfg, std::vector<std::unique_ptr<Backend>>& backends) {
  std::vector<Record> records;
  const std::size_t total = cfg.cases.size() * backends.size() * cfg.ops.size();
  auto emit = [&](Record r) {
    records.push_back(std::move(r));
    if (cfg.on_record) cfg.on_record(records.back(), records.size(), total);
  };
  for (const CaseSpec& spec : cfg.cases) {
    CaseContext ctx;
    const auto t0 = Clock::now();
    try {
      ctx.c = generate_case(spec);
    } catch (const InvalidCase& e) {
      for (auto& b : backends)
        for (Op op : cfg.ops) {
          Record r;
          r.case_id = spec.id();
          r.backend = std::string(b->name());
          r.op = std::string(op_name(op));
          r.status = Status::kInvalidCase;
          r.message = e.what();
          r.policy = cfg.policy.describe();
          if (cfg.repro) r.repro = cfg.repro(spec, r.backend, op);
          emit(std::move(r));
        }
      continue;
    }
    ctx.generate_ms = ms_since(t0);
    for (auto& b : backends)
      for (Op op : cfg.ops) emit(run_one(ctx, *b, op, cfg));
  }
  return records;
}

}  // namespace mlagate
