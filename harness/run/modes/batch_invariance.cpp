// --check batch-invariance (modes/batch_invariance.h, SERVING.md): after the
// plain call, the backend is called on sub-batches of the case's requests
// (each alone, the batch shuffled, the batch beside extra requests) through
// the same DecodeArgs a plain call gets (block-table rows chosen per request,
// so no cache is rebuilt), and every request's rows are compared byte for
// byte with its rows in the plain call.
#include "harness/run/modes/batch_invariance.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <sstream>

#include "harness/run/serving_calls.h"

namespace mlagate::modes {

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

// One batching of the case's requests, by index into the case.
struct Batching {
  std::string name;
  std::vector<int> requests;
  std::string label() const { return name == "alone" ? "alone (request " + std::to_string(requests.front()) + ")" : name; }
};

// Each request alone (every request up to 16, else 16 spread from the first to
// the last), the batch shuffled, the batch beside max(B, 16) extra requests.
std::vector<Batching> batchings(const Case& c) {
  const int B = c.num_requests;
  std::vector<Batching> out;
  const int alone = std::min(B, 16);
  for (int k = 0; k < alone; ++k) {
    const int i = alone == B ? k : static_cast<int>(static_cast<std::int64_t>(k) * (B - 1) / (alone - 1));
    if (!out.empty() && out.back().requests.front() == i) continue;
    out.push_back({"alone", {i}});
  }
  if (B > 1) {
    // Shuffled: Fisher-Yates from the case's seed (mt19937_64 is the same on every platform).
    std::vector<int> perm(static_cast<std::size_t>(B));
    for (int i = 0; i < B; ++i) perm[i] = i;
    std::mt19937_64 rng(c.spec.seed ^ 0x6d6c6167617465ull);
    for (int j = B - 1; j > 0; --j) std::swap(perm[j], perm[rng() % static_cast<std::uint64_t>(j + 1)]);
    out.push_back({"shuffled", perm});
  }
  // Beside extra requests (the batch again in reverse, repeated): split
  // heuristics and tile schedules see another batch size.
  Batching extra{"beside " + std::to_string(std::max(B, 16)) + " extra requests", {}};
  for (int i = 0; i < B; ++i) extra.requests.push_back(i);
  for (int k = 0; k < std::max(B, 16); ++k) extra.requests.push_back(B - 1 - k % B);
  out.push_back(extra);
  return out;
}

// What the calls found: the first failure (a call that is wrong, not merely
// different), else the requests whose rows vary and a line per variation.
struct Findings {
  Status fail = Status::kPassed;
  std::string fail_msg;
  std::vector<bool> varies;
  int variant_requests = 0, detail_lines = 0;
  std::string first, details;

  void variation(int request, const std::string& line) {
    if (!varies[static_cast<std::size_t>(request)]) varies[static_cast<std::size_t>(request)] = true, ++variant_requests;
    if (first.empty()) first = line;
    if (++detail_lines <= 40) details += line + "\n";
  }
};

// The op's calls over some of the case's requests, with what judges them.
struct Judge {
  CaseContext& ctx;
  Backend& b;
  const RunConfig& cfg;
  bool sparse;
  const char* o_name;
  std::int64_t N, L;
  std::optional<SparseFull> sf;
  const PagedCache* cache = nullptr;
  const std::vector<double>* all_ref_o = nullptr;
  const std::vector<double>* all_ref_lse = nullptr;
  BaselineErrors base{};
  std::vector<double> ref_o{}, ref_lse{};

  CallResult call(const Call& call) {
    return sparse ? call_sparse_decode(b, ctx.c, *sf, *sparse_state(ctx).sparse_q, call, cfg.exec)
                  : call_decode(b, ctx.c, *cache, *decode_state(ctx).q_lat, *decode_state(ctx).q_pe, call, cfg.exec);
  }
  RowCheck check(const Call& call, const CallResult& res) {
    gather_reference(ctx, call, ref_o, ref_lse, all_ref_o, all_ref_lse, L);
    return check_rows(ctx, cfg, base, res.o.view(), res.l.view(), call.qsl, ref_o, ref_lse, o_name, L, true);
  }
};

Judge make_judge(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg, Record& r) {
  const bool sparse = op == Op::kSparseDecode;
  const Case& c = ctx.c;
  Judge j{ctx, b, cfg, sparse, sparse ? "o" : "o_lat", c.spec.num_heads(),
          sparse ? c.spec.sparse_dv() : c.spec.dims.kv_lora_rank, std::nullopt};
  if (sparse) j.sf = sparse_full(ctx, cfg, r.block_size, r.timings.cache_ms);
  j.cache = sparse ? j.sf->cache : &ctx.cache(r.block_size, true, cfg.exec, r.timings.cache_ms);
  j.all_ref_o = sparse ? &sparse_state(ctx).sparse_ref.o : &decode_state(ctx).mqa_o_lat;
  j.all_ref_lse = sparse ? &sparse_state(ctx).sparse_ref.lse : &decode_state(ctx).mqa_lse;
  j.base = baseline_of(ctx, cfg, sparse);
  return j;
}

// One batching's call: each request's rows against its plain-call rows; rows
// that differ are judged too, once per call, so that a wrong call fails as a
// plain call would. Returns false when the call failed (in `f`).
bool compare_batching(Judge& j, const Batching& bt, const Captured& po, const Captured& pl, Record& r, Findings& f) {
  const Case& c = j.ctx.c;
  Call call;
  for (int i : bt.requests) call.add(c.query_start_loc[i], c.query_lens[i], c.seq_lens[i], i);
  const CallResult res = j.call(call);
  r.timings.run_ms += res.run_ms;
  if (!res.guard.empty()) {
    f.fail = Status::kIncorrect, f.fail_msg = bt.label() + ": " + res.guard;
    return false;
  }
  const std::byte* go = static_cast<const std::byte*>(res.o.view().data);
  const std::byte* gl = static_cast<const std::byte*>(res.l.view().data);
  const std::size_t osz = dtype_size(c.spec.dtype);
  const std::int64_t N = j.N, L = j.L;
  bool checked = false;
  for (std::size_t k = 0; k < bt.requests.size(); ++k) {
    const int i = bt.requests[k];
    const std::int64_t q = c.query_lens[i], at = call.qsl[k], t = c.query_start_loc[i];
    RowDiff dout, dlse;
    diff_rows(po.bytes.data() + t * N * L * osz, go + at * N * L * osz, q * N * L, c.spec.dtype, dout);
    diff_rows(pl.bytes.data() + t * N * 4, gl + at * N * 4, q * N, DType::kF32, dlse);
    if (dout.differ == 0 && dlse.differ == 0) continue;  // the plain call's rows: already judged
    if (!checked) {
      checked = true;
      const RowCheck rc = j.check(call, res);
      if (rc.status != Status::kPassed) {
        f.fail = rc.status, f.fail_msg = bt.label() + ": " + rc.message;
        return false;
      }
    }
    std::ostringstream m;
    m << "request " << i << " (seq_len " << c.seq_lens[i] << ", query_len " << q << ") " << bt.label()
      << " vs in its batch: " << j.o_name << " " << dout.differ << " of " << dout.elements << " elements differ"
      << (dout.differ ? " (" + diff_text(dout, c.spec.dtype) + ")" : "") << ", lse " << dlse.differ << " of "
      << dlse.elements << (dlse.differ ? " (" + diff_text(dlse, DType::kF32) + ")" : "");
    f.variation(i, m.str());
  }
  return true;
}

// The record from what the calls found; the plain call's failure stands.
Record& verdict(Record& r, const Findings& f, int requests, std::size_t calls) {
  if (r.status != Status::kPassed) return r;
  if (f.fail != Status::kPassed) {
    r.status = f.fail;
    r.message = f.fail_msg;
    return r;
  }
  if (f.variant_requests == 0) {
    r.message = "batch invariant: every request's rows bitwise equal alone, shuffled and beside extra requests (" +
                std::to_string(calls) + " calls)";
    return r;
  }
  r.status = Status::kBatchVariant;
  r.message = std::to_string(f.variant_requests) + " of " + std::to_string(requests) +
              " requests vary with their batchmates; " + f.first;
  r.details = f.details;
  if (f.detail_lines > 40) r.details += "... " + std::to_string(f.detail_lines - 40) + " more\n";
  return r;
}

}  // namespace

Record BatchInvariance::run(CaseContext& ctx, Backend& b, Op op, const RunConfig& cfg) const {
  const bool sparse = op == Op::kSparseDecode;
  std::vector<Captured> plain;
  Record r = plain_run(ctx, b, op, cfg, plain);
  const Captured* po = find_output(plain, sparse ? "o" : "o_lat");
  const Captured* pl = find_output(plain, "lse");
  if (!po || !pl) return r;  // nothing ran (not supported, skipped, crashed)
  const auto t0 = Clock::now();
  const double run_before = r.timings.run_ms;
  Judge j = make_judge(ctx, b, op, cfg, r);
  const std::vector<Batching> calls = batchings(ctx.c);
  Findings f;
  f.varies.assign(static_cast<std::size_t>(ctx.c.num_requests), false);
  try {
    for (const Batching& bt : calls)
      if (!compare_batching(j, bt, *po, *pl, r, f)) break;
  } catch (...) {
    std::string why;
    f.fail = current_exception_status(why);
    f.fail_msg = "batch-invariance call: " + why;
  }
  r.timings.total_ms += ms_since(t0);
  r.timings.glue_ms += ms_since(t0) - (r.timings.run_ms - run_before);
  return verdict(r, f, ctx.c.num_requests, calls.size());
}

}  // namespace mlagate::modes
