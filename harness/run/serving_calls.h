// What the serving modes share (harness/run/modes/; internal to harness/run):
// a decode call over some of a case's query tokens, its rows judged against
// the case's references, the plain call whose outputs a mode keeps, and DCP's
// shard merge (the dense and the sparse decode op's).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "harness/run/case_context.h"
#include "harness/run/dcp_layout.h"
#include "harness/run/runner.h"
#include "harness/run/ops/decode/decode.h"
#include "harness/run/ops/sparse/sparse_op.h"
#include "harness/run/guarded.h"

namespace mlagate::serving_detail {

using run_detail::Clock;
using run_detail::ms_since;

// A decode call over some of the case's query tokens: each call-request owns
// consecutive rows (the case's tokens `tokens[qsl[j] .. qsl[j+1])`), sees
// seq_lens[j] keys and reads block-table row rows[j].
struct Call {
  std::vector<std::int32_t> tokens, seq_lens, qsl{0}, rows;
  void add(int first_token, int ntok, int seq_len, int table_row) {
    for (int u = 0; u < ntok; ++u) tokens.push_back(first_token + u);
    seq_lens.push_back(seq_len);
    qsl.push_back(qsl.back() + ntok);
    rows.push_back(table_row);
  }
  std::int64_t num_tokens() const { return static_cast<std::int64_t>(tokens.size()); }
  bool empty() const { return tokens.empty(); }
};

Tensor gather_tokens(const Tensor& t, std::span<const std::int32_t> tokens);

struct CallResult {
  GuardedBuffer o, l;
  double run_ms = 0;
  std::string guard;  // the first out-of-bounds write, empty when none
};

CallResult call_decode(Backend& b, const Case& c, const PagedCache& cache, const Tensor& q_lat, const Tensor& q_pe,
                       const Call& call, const ExecOptions& opt);

// The sparse decode op's whole-case arguments (run_sparse_decode_op's), from
// which a call over some tokens gathers its rows.
struct SparseFull {
  const PagedCache* cache = nullptr;
  const PagedCache* extra = nullptr;
  Tensor main_slots, extra_slots;  // [T, K], [T, K2] global slots (empty: none)
  std::vector<std::int32_t> main_len, extra_len;  // [T] or empty
  int window = 0;
  std::span<const float> sink;
};

// The case's own (the main cache: `main`, else the case's cache at bs with
// every token written).
SparseFull sparse_full(CaseContext& ctx, const RunConfig& cfg, int bs, double& cache_ms,
                       const PagedCache* main = nullptr);

CallResult call_sparse_decode(Backend& b, const Case& c, const SparseFull& f, const Tensor& q, const Call& call,
                              const ExecOptions& opt);

// Rank `rank`'s shard of `full` in `shard` (a copy of full: the same block
// table): each request's keys of that rank at their local positions (vLLM's
// sharding, serving.h), the rest of each request's positions poisoned as a
// page's unused tail is.
void fill_dcp_shard(const Case& c, const PagedCache& full, PagedCache& shard, int rank, int ranks, int interleave,
                    Poison poison);

// The status and message of the exception being handled, as run_one maps them.
Status current_exception_status(std::string& message);

struct RowCheck {
  Status status = Status::kPassed;
  std::string message;
  Metrics o, lse;
};

// The reference rows of the call's tokens ([n, N, dv] and [n, N]) out of
// whole-case references (default: the decode op's).
void gather_reference(CaseContext& ctx, const Call& call, std::vector<double>& o, std::vector<double>& lse,
                      const std::vector<double>* all_o = nullptr, const std::vector<double>* all_lse = nullptr,
                      std::int64_t dv = 0);

// The decode op's (or the sparse decode op's) err_baseline where the policy needs it.
BaselineErrors baseline_of(CaseContext& ctx, const RunConfig& cfg, bool sparse = false);

// DCP: the running fp32 merge of the shard calls' partial outputs, acc_o
// [T, N, dim] / acc_lse [T, N] (rows no call gave: lse -inf, weight 0), and
// how the calls went. The dense and the sparse decode op share it.
struct ShardMerge {
  ShardMerge(std::int64_t tokens, std::int64_t heads, std::int64_t dim);
  std::int64_t T, N, dim;
  std::vector<float> acc_o, acc_lse;
  int calls = 0;
  Status fail = Status::kPassed;
  std::string fail_msg;
  bool failed() const { return fail != Status::kPassed; }
  // One shard call of rank `rank`: its time added to run_ms, then either its
  // touched guard band as the merge's failure (returns false: stop) or its
  // tokens' rows merged in.
  bool take(const Call& call, const CallResult& res, int rank, double& run_ms);
  // The exception a shard call threw (inside a catch block), as the merge's failure.
  void take_exception();
};
// DCP: the merged rows in the model dtype judged against the op's reference
// into `r` (metrics, status, message), with the LSE base checked whatever the
// policy gates; returns the milliseconds the comparison took.
double judge_merged(CaseContext& ctx, const RunConfig& cfg, Record& r, const ShardMerge& m, bool sparse,
                    const std::string& label, const std::string& hint);

// DCP's calls and record, for both ops. `shard_calls` makes every rank's calls
// into m (a throw is the merge's failure); then r gets the merge's failure, or
// the merged rows (with `sink`, when given, applied once: the shards are called
// without it, as an engine merging partials applies it) judged by
// judge_merged. The time since t0 goes to r's timings (glue: all but the
// backend calls after run_before and the comparison).
struct ShardRun {
  bool sparse = false;
  std::string label, hint;
  std::span<const float> sink;
  Clock::time_point t0;
  double run_before = 0;
};
void merge_shards(CaseContext& ctx, const RunConfig& cfg, Record& r, ShardMerge& m, const ShardRun& how,
                  const std::function<void()>& shard_calls);

// o_lat (or `o_name`, of width dv) and lse of `qsl`'s tokens against reference
// rows, in the runner's order: non-finite values, then the tolerance.
// some_rows: the rows are part of a case (OutputCheck::zero_reference_ok).
RowCheck check_rows(const CaseContext& ctx, const RunConfig& cfg, const BaselineErrors& base, const TensorView& o,
                    const TensorView& l, std::span<const std::int32_t> qsl, const std::vector<double>& ref_o,
                    const std::vector<double>& ref_lse, const char* o_name = "o_lat", std::int64_t dv = 0,
                    bool some_rows = false);

struct Captured {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<std::byte> bytes;
};

// run_one with its outputs kept (results files still get them).
Record plain_run(CaseContext& ctx, Backend& b, Op op, const RunConfig& base, std::vector<Captured>& out);
const Captured* find_output(const std::vector<Captured>& outs, const char* name);

}  // namespace mlagate::serving_detail
