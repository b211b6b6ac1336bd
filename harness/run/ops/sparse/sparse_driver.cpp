// The sparse ops' per-case state and their drivers (sparse_decode and
// sparse_prefill share the state: one query, one reference, one baseline).
#include <chrono>

#include "cases/sparse.h"
#include "harness/run/ops/sparse/sparse_op.h"
#include "reference/glue.h"

namespace mlagate {

using run_detail::Clock;
using run_detail::ms_since;

void SparseState::retag(const CaseSpec& spec) {
  for (auto& [bs, pc] : extra_caches) {
    pc.kv_dtype = spec.kv_cache_dtype;
    pc.k_scale = spec.k_scale;
  }
}

SparseState& sparse_state(CaseContext& ctx) {
  SparseState& s = ctx.slot<SparseState>();
  if (s.sparse_q) return s;
  const Case& c = ctx.c;
  const auto t0 = Clock::now();
  std::vector<int> tokens(static_cast<std::size_t>(c.num_tokens));
  for (int t = 0; t < c.num_tokens; ++t) tokens[static_cast<std::size_t>(t)] = t;
  Tensor ql, qp;
  absorb_queries(c, tokens, ql, qp);
  s.sparse_q = sparse_query(c, ql.view());
  s.sparse_ref = sparse_golden(c, s.sparse_q->view());
  ctx.reference_ms += ms_since(t0);
  return s;
}

const PagedCache* sparse_extra_cache(CaseContext& ctx, int bs, const ExecOptions& opt, double& ms) {
  const Case& c = ctx.c;
  if (!c.sparse || c.sparse->extra.empty()) return nullptr;
  SparseState& s = ctx.slot<SparseState>();
  auto it = s.extra_caches.find(bs);
  if (it == s.extra_caches.end()) {
    const auto t0 = Clock::now();
    CacheOptions co;
    co.poison = opt.poison;
    co.poison_block_table = opt.poison_block_table;
    it = s.extra_caches.emplace(bs, build_paged_cache(c.sparse->compressed, bs, co)).first;
    ms += ms_since(t0);
  }
  return &it->second;
}

BaselineErrors sparse_baseline(CaseContext& ctx) {
  SparseState& s = sparse_state(ctx);
  if (!s.base) {
    const auto t0 = Clock::now();
    const SparseReference e = sparse_emulation(ctx.c, s.sparse_q->view());
    s.base = BaselineErrors{baseline_error(e.o, s.sparse_ref.o, 0, e.o.size()),
                            baseline_error(e.lse, s.sparse_ref.lse, 0, e.lse.size())};
    ctx.baseline_ms += ms_since(t0);
  }
  return *s.base;
}

namespace {

template <Op kOp>
class SparseDriver final : public OpDriver {
 public:
  Op op() const override { return kOp; }
  OpRun run(CaseContext& ctx, Backend& b, const RunConfig& cfg, Record& r) const override {
    const PagedCache& full = ctx.cache(r.block_size, true, cfg.exec, r.timings.cache_ms);
    const PagedCache* extra = sparse_extra_cache(ctx, r.block_size, cfg.exec, r.timings.cache_ms);
    const SparseState& s = sparse_state(ctx);
    return kOp == Op::kSparseDecode ? run_sparse_decode_op(b, ctx.c, full, extra, *s.sparse_q, cfg.exec)
                                    : run_sparse_prefill_op(b, ctx.c, full, extra, *s.sparse_q, cfg.exec);
  }
  JudgedAgainst reference(CaseContext& ctx) const override {
    const SparseState& s = sparse_state(ctx);
    return {&s.sparse_ref.o, &s.sparse_ref.lse};
  }
  BaselineErrors baseline(CaseContext& ctx, const OpRun&, const RunConfig&) const override {
    return sparse_baseline(ctx);
  }
  // (No quantization error: the sparse references over the unquantized
  // inputs are not computed.)
  void adopt(PreparedCase& p, CaseContext& ctx) const override {
    if (kOp != Op::kSparseDecode) return;  // one state for both: adopted once
    if (!p.sparse && !(p.baselines && p.baselines->sparse)) return;
    SparseState& s = ctx.slot<SparseState>();
    if (p.sparse) {
      s.sparse_q = std::move(p.sparse->q);
      s.sparse_ref.o = std::move(p.sparse->o);
      s.sparse_ref.lse = std::move(p.sparse->lse);
    }
    if (p.baselines && p.baselines->sparse)
      s.base = BaselineErrors{(*p.baselines->sparse)[0], (*p.baselines->sparse)[1]};
  }
};

}  // namespace

const OpDriver& sparse_decode_driver() {
  static const SparseDriver<Op::kSparseDecode> d;
  return d;
}
const OpDriver& sparse_prefill_driver() {
  static const SparseDriver<Op::kSparsePrefill> d;
  return d;
}

}  // namespace mlagate
