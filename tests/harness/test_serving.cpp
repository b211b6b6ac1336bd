// The serving-engine modes (harness/run/SERVING.md): each planted bug of the
// calls across a serving engine passes every plain run and is caught by exactly
// the mode built for it; the correct CPU backends pass every mode; the DCP
// sharding and the decode-loop schedule are what they claim; the records'
// mode and steps survive the JSON report and the journal.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "../backends/planted.h"
#include "../cli_call.h"
#include "backends/cpu/cpu_backends.h"
#include "backends/cpu/sparse_faults.h"
#include "cases/errors.h"
#include "cases/suite.h"
#include "harness/run/runner.h"
#include "harness/run/serving.h"
#include "reports/record_json.h"
#include "reports/report.h"

namespace mlagate {
namespace {

// The smoke suite, edges' padding, block-boundary, seq_len 1 and decode-after-prefill cases at TP 16, and fp8 cases with k_scale 3
// (fp8 and fp8_e4m3 read it).
std::vector<CaseSpec> serving_cases() {
  std::vector<CaseSpec> cases = load_suite("smoke").cases;
  for (const CaseSpec& c : load_suite("edges").cases)
    if (c.tp == 16 && (c.batch.name == "edge_padding" || c.batch.name == "edge_block_boundary" ||
                       c.batch.name == "edge_seq_len_1" || c.batch.name == "edge_decode_after_prefill"))
      cases.push_back(c);
  for (const CaseSpec& c : load_suite("fp8").cases)
    if ((c.kv_cache_dtype == KvCacheDtype::kFp8 || c.kv_cache_dtype == KvCacheDtype::kFp8E4m3) && c.k_scale == 3.f &&
        c.tp == 16)
      cases.push_back(c);
  return cases;
}

struct ModeRun {
  std::map<Status, int> counts;
  std::vector<Record> records;
  int passed() const { return counts.count(Status::kPassed) ? counts.at(Status::kPassed) : 0; }
  int failures() const {
    int n = 0;
    for (const auto& [s, k] : counts) n += status_fails_run(s, true) ? k : 0;
    return n;
  }
  std::string first_failure() const {
    for (const Record& r : records)
      if (status_fails_run(r.status, true)) return r.case_id + " [" + r.op + "]: " + std::string(status_name(r.status)) + ": " + r.message;
    return {};
  }
};

// Several backends in one run: each case is prepared (inputs, caches, the
// reference, the baseline) once for all of them, as `mlagate run` does; each
// backend's records are its own (graphs are kept per backend), so the split
// by backend is what a run of each alone gives.
std::map<std::string, ModeRun> run_each(std::vector<std::unique_ptr<Backend>> bs, ServingMode mode, std::vector<Op> ops,
                                        const Policy& policy, std::vector<CaseSpec> cases = serving_cases()) {
  if (auto* graph = mode.get<modes::CudaGraph>()) graph->graphs = make_graph_store();  // graphs live as long as the run
  if (const auto* loop = mode.get<modes::DecodeLoop>())
    for (CaseSpec& c : cases) c = decode_loop_spec(c, loop->steps);
  std::map<std::string, ModeRun> out;
  for (const auto& b : bs) out[std::string(b->name())];  // a backend without records still has its entry
  RunConfig cfg;
  cfg.cases = std::move(cases);
  cfg.ops = std::move(ops);
  cfg.policy = policy;
  if (mode.active())
    cfg.run_job = [&cfg, mode](CaseContext& ctx, Backend& b, Op op) { return run_serving(ctx, b, op, cfg, mode); };
  for (Record& rec : run_cases(cfg, bs)) {
    ModeRun& r = out[rec.backend];
    ++r.counts[rec.status];
    r.records.push_back(std::move(rec));
  }
  return out;
}

ModeRun run_with(std::unique_ptr<Backend> backend, ServingMode mode, std::vector<Op> ops, const Policy& policy,
                 std::vector<CaseSpec> cases = serving_cases()) {
  const std::string name(backend->name());
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(std::move(backend));
  return run_each(std::move(bs), std::move(mode), std::move(ops), policy, std::move(cases)).at(name);
}

// The two correct CPU backends (dense, or sparse).
std::vector<std::unique_ptr<Backend>> correct_dense() {
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(make_cpu_paged());
  bs.push_back(make_cpu_splitkv());
  return bs;
}
std::vector<std::unique_ptr<Backend>> correct_sparse() {
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(make_cpu_sparse());
  bs.push_back(make_cpu_sparse_splitkv());
  return bs;
}
// The correct sparse backends and a planted bug, for one run of a mode.
std::vector<std::unique_ptr<Backend>> correct_sparse_with(const PlantedServingBug& sb) {
  std::vector<std::unique_ptr<Backend>> bs = correct_sparse();
  bs.push_back(sb.bug.make());
  return bs;
}

// Coarse capture sizes: every batch of the suites is padded (B < 8).
ServingMode graph(std::vector<int> sizes = {8, 64, 512}) { return modes::CudaGraph{std::move(sizes), nullptr}; }
ServingMode bi() { return modes::BatchInvariance{}; }
ServingMode dcp(int n, int k = 1) { return modes::Dcp{n, k}; }
ServingMode steps(int n) { return modes::DecodeLoop{n}; }

Policy baseline() { return make_policy("baseline", 0, 0); }
Policy vllm() { return make_policy("vllm", 0, 0); }

TEST(Serving, DcpShardingIsABijectionPerRank) {
  for (int ranks : {2, 3, 4, 8})
    for (int k : {1, 2, 16, 64})
      for (int visible : {0, 1, 5, 63, 64, 65, 200, 1025}) {
        int total = 0;
        for (int r = 0; r < ranks; ++r) {
          std::set<int> local;
          for (int p = 0; p < visible; ++p)
            if (dcp_rank_of(p, ranks, k) == r) local.insert(dcp_local_pos(p, ranks, k));
          const int n = dcp_local_count(visible, r, ranks, k);
          ASSERT_EQ(static_cast<int>(local.size()), n) << ranks << " ranks, interleave " << k << ", visible " << visible;
          if (n > 0) {
            EXPECT_EQ(*local.begin(), 0);
            EXPECT_EQ(*local.rbegin(), n - 1);  // dense: 0 .. n-1
          }
          total += n;
        }
        EXPECT_EQ(total, visible);
      }
}

TEST(Serving, DecodeLoopScheduleJoinsAndFinishes) {
  const CaseSpec spec = load_suite("smoke").cases.front();
  for (int n : {1, 3, 8, 64}) {
    CaseSpec s = spec;
    s.batch.seq_lens = {100, 50, 7, 0, 9};
    s.batch.query_lens = {1, 2, 1, 1, 3};
    const CaseSpec loop = decode_loop_spec(s, n);
    ASSERT_NO_THROW(loop.validate());
    for (int i = 0; i < 5; ++i) {
      const int q = loop.batch.query_lens[i];
      const auto [join, count] = loop_join_and_count(i, n);
      EXPECT_EQ(q, count);
      EXPECT_EQ(loop_join(i, q, n), join);
      EXPECT_LE(join + count, n);
      // The context is kept; a padding request stays padding.
      if (s.batch.seq_lens[i] == 0) {
        EXPECT_EQ(loop.batch.seq_lens[i], 0);
      } else {
        EXPECT_EQ(loop.batch.seq_lens[i] - q, s.batch.seq_lens[i] - s.batch.query_lens[i]);
      }
    }
    if (n >= 4) {
      EXPECT_EQ(loop_join_and_count(1, n).first, n / 4);       // joins late
      EXPECT_EQ(loop_join_and_count(2, n).second, n - n / 4);  // finishes early
    }
  }
  EXPECT_THROW(loop_join(0, 9, 8), InvalidCase);
}

TEST(Serving, LseBaseHintNamesLog2) {
  std::vector<double> ref = {1.5, 3.0, -2.0, 7.25, INFINITY};
  std::vector<float> natural = {1.5f, 3.0f, -2.0f, 7.25f, INFINITY}, log2(natural);
  for (float& x : log2) x = static_cast<float>(x / std::log(2.0));
  EXPECT_EQ(lse_base_hint(TensorView{DType::kF32, {5}, natural.data()}, ref), "");
  EXPECT_NE(lse_base_hint(TensorView{DType::kF32, {5}, log2.data()}, ref).find("base 2"), std::string::npos);
}

// The correct CPU backends pass every mode (no BATCH_VARIANT either: their
// bits do not depend on the batch).
TEST(Serving, CorrectBackendsPassEveryMode) {
  for (const ServingMode& m : {graph(), graph(default_capture_sizes()), bi(), dcp(2), dcp(4, 16), dcp(8, 3), steps(8)}) {
    const auto runs = run_each(correct_dense(), m, {Op::kDecode}, baseline());
    ASSERT_EQ(runs.size(), 2u);
    for (const auto& [name, r] : runs) {
      EXPECT_EQ(r.failures(), 0) << name << " " << m.name() << ": " << r.first_failure();
      EXPECT_EQ(r.counts.count(Status::kBatchVariant), 0u) << name;
      EXPECT_GT(r.passed(), 10) << name << " " << m.name();
      for (const Record& rec : r.records) EXPECT_EQ(rec.mode, m.name());
    }
  }
}

// Each planted serving bug: every plain run passes (decode, layer and
// cache_write ops; the lse bug under the vllm policy, which does not gate lse,
// as vLLM's own tests do not), its own mode catches it, the other modes do not.
TEST(Serving, EachPlantedBugIsCaughtByExactlyItsMode) {
  const std::vector<std::pair<std::string, ServingMode>> modes = {
      {"--cuda-graph", graph()}, {"--check batch-invariance", bi()}, {"--dcp 2", dcp(2)}, {"--steps 8", steps(8)}};
  ASSERT_EQ(planted_serving_bugs().size(), 6u);
  // The bugs judged by one policy run side by side, in one run per mode (the
  // cases prepared once for all of them; each bug's records are its own).
  std::map<std::string, ModeRun> plain_runs;
  std::vector<std::map<std::string, ModeRun>> mode_runs(modes.size());
  for (const bool log2 : {false, true}) {
    const auto bugs = [log2] {
      std::vector<std::unique_ptr<Backend>> bs;
      for (const PlantedServingBug& sb : planted_serving_bugs())
        if ((sb.bug.name == "bug.lse_log2") == log2) bs.push_back(sb.bug.make());
      return bs;
    };
    const Policy policy = log2 ? vllm() : baseline();
    plain_runs.merge(run_each(bugs(), ServingMode{}, {Op::kDecode, Op::kLayer, Op::kCacheWrite}, policy));
    for (std::size_t i = 0; i < modes.size(); ++i) mode_runs[i].merge(run_each(bugs(), modes[i].second, {Op::kDecode}, policy));
  }
  for (const PlantedServingBug& sb : planted_serving_bugs()) {
    const PlantedBug& bug = sb.bug;
    const ModeRun& plain = plain_runs.at(bug.name);
    EXPECT_EQ(plain.failures(), 0) << bug.name << " fails a plain run: " << plain.first_failure();
    EXPECT_EQ(plain.counts.count(Status::kBatchVariant), 0u);
    for (std::size_t i = 0; i < modes.size(); ++i) {
      const std::string& flags = modes[i].first;
      const ModeRun& r = mode_runs[i].at(bug.name);
      if (flags != sb.mode) {
        EXPECT_EQ(r.failures(), 0) << bug.name << " caught by " << flags << ", not its mode: " << r.first_failure();
        continue;
      }
      int caught = 0, stale_nan = 0;
      for (const Record& rec : r.records) {
        if (rec.status == Status::kPassed || rec.status == Status::kNotSupported) {
          // Where the bug is exposed (its fp8 cases), it must not pass.
          if (bug.exposed_by && rec.status == Status::kPassed) {
            for (const CaseSpec& c : serving_cases())
              if (c.id() == rec.case_id && bug.exposed_by(c)) {
                ADD_FAILURE() << bug.name << " passed " << rec.case_id;
              }
          }
          continue;
        }
        // A stale seq_len may also point a row at poisoned (NaN) keys; a stale
        // row of a real empty request (edge_padding's) holds an earlier
        // replay's values, not NaN.
        if (bug.name == "bug.graph_metadata_fixed_at_capture" || bug.name == "bug.graph_stale_padding")
          EXPECT_TRUE(rec.status == Status::kIncorrect || rec.status == Status::kNonfinite) << rec.message;
        else
          EXPECT_EQ(rec.status, bug.expected) << bug.name << " " << rec.case_id << ": " << rec.message;
        ++caught;
        if (rec.message.find("padding rows hold NaN") != std::string::npos) ++stale_nan;
        if (bug.name == "bug.graph_metadata_fixed_at_capture") {
          EXPECT_NE(rec.message.find("replayed, captured at"), std::string::npos) << rec.message;
        }
        if (bug.name == "bug.graph_padding_writes_slot_0") {
          EXPECT_NE(rec.message.find("padded cache write (slot_mapping -1"), std::string::npos) << rec.message;
        }
        if (bug.name == "bug.batch_size_splits") {
          EXPECT_NE(rec.message.find("vary with their batchmates"), std::string::npos) << rec.message;
          EXPECT_NE(rec.message.find("ULP"), std::string::npos) << rec.message;
        }
        if (bug.name == "bug.lse_log2") {
          EXPECT_NE(rec.message.find("base 2"), std::string::npos) << rec.message;
        }
        if (bug.name == "bug.fp8_scale_lost_after_step") {
          EXPECT_NE(rec.message.find("step 1 of 8 is the first to fail"), std::string::npos) << rec.message;
          ASSERT_EQ(rec.steps.size(), 8u);
          EXPECT_EQ(rec.steps[0].status, Status::kPassed);
          EXPECT_NE(rec.steps[1].status, Status::kPassed);
        }
      }
      EXPECT_GT(caught, 0) << bug.name << " not caught by " << flags;
      if (bug.name == "bug.graph_stale_padding") {
        EXPECT_GT(stale_nan, 0) << "no padding NaN reported";
      }
    }
  }
}

// Batch invariance on the sparse decode op: the correct sparse backends are
// invariant on the sparse and v4 suites; a batch-size heuristic passes every
// plain run of both sparse ops and is BATCH_VARIANT.
TEST(Serving, SparseDecodeBatchInvariance) {
  std::vector<CaseSpec> cases = load_suite("sparse").cases;
  for (const CaseSpec& c : load_suite("v4").cases) cases.push_back(c);
  // The correct backends and the bug in one run of the mode.
  const PlantedServingBug sb = planted_sparse_batch_bug();
  auto runs = run_each(correct_sparse_with(sb), bi(), {Op::kSparseDecode}, baseline(), cases);
  ASSERT_EQ(runs.size(), 3u);
  for (const auto& [name, r] : runs) {
    if (name == sb.bug.name) continue;
    EXPECT_EQ(r.failures(), 0) << name << ": " << r.first_failure();
    EXPECT_EQ(r.counts.count(Status::kBatchVariant), 0u) << name;
    EXPECT_GT(r.passed(), 20) << name;
  }
  const ModeRun plain = run_with(sb.bug.make(), ServingMode{}, {Op::kSparseDecode, Op::kSparsePrefill}, baseline(), cases);
  EXPECT_EQ(plain.failures(), 0) << plain.first_failure();
  const ModeRun& r = runs.at(sb.bug.name);
  for (const Record& rec : r.records) EXPECT_FALSE(status_is_failure(rec.status)) << rec.case_id << ": " << rec.message;
  ASSERT_GT(r.counts.count(Status::kBatchVariant), 0u);
  for (const Record& rec : r.records)
    if (rec.status == Status::kBatchVariant) {
      EXPECT_EQ(rec.op, "sparse_decode");
      EXPECT_NE(rec.message.find("vs in its batch: o "), std::string::npos) << rec.message;
    }
  std::printf("bug.sparse_batch_size_splits: %d of %zu records BATCH_VARIANT\n", r.counts.at(Status::kBatchVariant),
              r.records.size());
}

// DCP and decode loops on the sparse decode op (V3.2 top-k rows and V4 window
// plus compressed cache, sinks, fp8_ds_mla): the correct sparse backends pass
// every mode, with the shard calls and steps really made; a log2 lse passes
// plain sparse runs under the vllm policy and fails the DCP merge, named.
TEST(Serving, SparseDcpAndDecodeLoops) {
  std::vector<CaseSpec> cases = load_suite("sparse").cases;
  for (const CaseSpec& c : load_suite("v4").cases) cases.push_back(c);
  for (const ServingMode& m : {dcp(2), dcp(4, 16), dcp(8, 3), steps(8)}) {
    const auto runs = run_each(correct_sparse(), m, {Op::kSparseDecode}, baseline(), cases);
    ASSERT_EQ(runs.size(), 2u);
    for (const auto& [name, r] : runs) {
      EXPECT_EQ(r.failures(), 0) << name << " " << m.name() << ": " << r.first_failure();
      EXPECT_GT(r.passed(), 40) << name << " " << m.name();
      for (const Record& rec : r.records) {
        if (rec.status != Status::kPassed) continue;
        if (m.get<modes::DecodeLoop>()) {
          EXPECT_EQ(rec.message, "8 decode steps, each checked");
          EXPECT_GT(rec.steps.size(), 1u);
        } else {
          EXPECT_NE(rec.message.find("shard calls merged through their LSEs"), std::string::npos) << rec.message;
        }
      }
    }
  }
  const PlantedServingBug sb = planted_sparse_lse_bug();
  const ModeRun plain = run_with(sb.bug.make(), ServingMode{}, {Op::kSparseDecode}, vllm(), cases);
  EXPECT_EQ(plain.failures(), 0) << plain.first_failure();
  const ModeRun r = run_with(sb.bug.make(), dcp(2), {Op::kSparseDecode}, vllm(), cases);
  ASSERT_GT(r.counts.count(Status::kIncorrect), 0u);
  for (const Record& rec : r.records)
    if (rec.status == Status::kIncorrect) {
      EXPECT_NE(rec.message.find("base 2"), std::string::npos) << rec.message;
    }
  std::printf("bug.sparse_lse_log2 under --dcp 2: %d of %zu records INCORRECT\n", r.counts.at(Status::kIncorrect),
              r.records.size());
}

// A backend that declares Capabilities::no_dcp (vLLM's FLASH_ATTN_MLA_SPARSE:
// "does not support DCP for now") is NOT_SUPPORTED under --dcp with its
// reason, on exactly the cases it takes in a plain run, which still pass.
TEST(Serving, ABackendThatRefusesDcpIsNotSupportedUnderDcpWithItsReason) {
  SparseFaults f;
  f.declare_no_dcp = true;
  const std::vector<CaseSpec> cases = load_suite("sparse").cases;
  const ModeRun plain = run_with(detail::make_cpu_sparse_with_faults(f, "no_dcp.sparse"), ServingMode{},
                                 {Op::kSparseDecode}, baseline(), cases);
  EXPECT_EQ(plain.failures(), 0) << plain.first_failure();
  ASSERT_GT(plain.passed(), 0);
  const ModeRun r = run_with(detail::make_cpu_sparse_with_faults(f, "no_dcp.sparse"), dcp(2), {Op::kSparseDecode},
                             baseline(), cases);
  ASSERT_EQ(r.records.size(), plain.records.size());
  int refused = 0;
  for (const Record& rec : r.records) {
    EXPECT_EQ(rec.status, Status::kNotSupported) << rec.case_id;
    refused += rec.message == "this test double refuses DCP";
  }
  EXPECT_EQ(refused, plain.passed());
  // The same backend without the declaration runs the mode (and passes).
  const ModeRun with_dcp = run_with(make_cpu_sparse(), dcp(2), {Op::kSparseDecode}, baseline(), cases);
  EXPECT_EQ(with_dcp.failures(), 0) << with_dcp.first_failure();
  EXPECT_EQ(with_dcp.passed(), plain.passed());
}

// Graph mode on the sparse decode op: the sparse and v4 suites and the same
// cases at seeds 1 and 2 (other index rows and values, the same shapes, so a
// later case replays the graph an earlier one captured): the correct sparse
// backends pass every uniform case; a graph that keeps the captured index rows
// and seq_lens passes every plain run and fails the replays.
TEST(Serving, SparseGraphMode) {
  std::vector<CaseSpec> cases;
  for (const char* suite : {"sparse", "v4"})
    for (const CaseSpec& c : load_suite(suite).cases)
      for (int seed : {0, 1, 2}) {
        CaseSpec x = c;
        x.seed = c.seed + static_cast<std::uint64_t>(seed);
        cases.push_back(x);
      }
  // The correct backends and the bug in one run of the mode (graphs are kept per backend).
  const PlantedServingBug sb = planted_sparse_graph_bug();
  auto runs = run_each(correct_sparse_with(sb), graph(), {Op::kSparseDecode}, baseline(), cases);
  ASSERT_EQ(runs.size(), 3u);
  for (const auto& [name, r] : runs) {
    if (name == sb.bug.name) continue;
    EXPECT_EQ(r.failures(), 0) << name << ": " << r.first_failure();
    EXPECT_GT(r.passed(), 30) << name;
    int replayed = 0;
    for (const Record& rec : r.records) replayed += rec.message.find("replayed, captured at") != std::string::npos;
    EXPECT_GT(replayed, 10) << name;
  }
  const ModeRun plain = run_with(sb.bug.make(), ServingMode{}, {Op::kSparseDecode}, baseline(), cases);
  EXPECT_EQ(plain.failures(), 0) << plain.first_failure();
  const ModeRun& r = runs.at(sb.bug.name);
  ASSERT_GT(r.counts.count(Status::kIncorrect), 0u);
  for (const Record& rec : r.records)
    if (rec.status == Status::kIncorrect) {
      EXPECT_NE(rec.message.find("replayed, captured at"), std::string::npos) << rec.message;
    }
  std::printf("bug.sparse_graph_metadata_fixed_at_capture: %d of %zu records INCORRECT\n",
              r.counts.at(Status::kIncorrect), r.records.size());
}

// Under the default (baseline) policy the log2 lse fails a plain run too, and
// the message says which base it is in.
TEST(Serving, PlainRunNamesALog2Lse) {
  for (const PlantedServingBug& sb : planted_serving_bugs()) {
    if (sb.bug.name != "bug.lse_log2") continue;
    const ModeRun r = run_with(sb.bug.make(), ServingMode{}, {Op::kDecode}, baseline());
    ASSERT_GT(r.counts.count(Status::kIncorrect), 0u);
    for (const Record& rec : r.records) {
      if (rec.status == Status::kIncorrect) {
        EXPECT_NE(rec.message.find("base 2"), std::string::npos) << rec.message;
      }
    }
  }
}

// The decode loop's per-step results and the mode reach the JSON report, its
// reader (mlagate merge) and the journal's record lines unchanged.
TEST(Serving, ModeAndStepsRoundTripThroughReportsAndJournal) {
  std::vector<CaseSpec> cases = {load_suite("smoke").cases.front()};
  const ModeRun r = run_with(make_cpu_paged(), steps(4), {Op::kDecode}, baseline(), cases);
  ASSERT_EQ(r.records.size(), 1u);
  const Record& rec = r.records[0];
  ASSERT_EQ(rec.status, Status::kPassed) << rec.message;
  ASSERT_EQ(rec.steps.size(), 4u);
  EXPECT_EQ(rec.mode, "steps=4");
  const Record back = record_from_json_line(record_to_json_line(rec));
  EXPECT_EQ(back.mode, rec.mode);
  ASSERT_EQ(back.steps.size(), 4u);
  for (std::size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(back.steps[k].step, rec.steps[k].step);
    EXPECT_EQ(back.steps[k].requests, rec.steps[k].requests);
    EXPECT_EQ(back.steps[k].max_abs_o, rec.steps[k].max_abs_o);
  }
  const std::filesystem::path dir = test::scratch_dir("serving_json");
  const std::string path = (dir / "r.json").string();
  {
    std::ofstream os(path);
    write_json(os, RunInfo{}, r.records);
  }
  const JsonReport jr = read_json_report(path);
  ASSERT_EQ(jr.records.size(), 1u);
  EXPECT_EQ(jr.records[0].mode, "steps=4");
  ASSERT_EQ(jr.records[0].steps.size(), 4u);
  EXPECT_EQ(jr.records[0].steps[3].max_abs_lse, rec.steps[3].max_abs_lse);
  std::ostringstream html;
  write_html(html, RunInfo{}, r.records);
  EXPECT_NE(html.str().find("decode loop: 4 steps"), std::string::npos);
  EXPECT_NE(html.str().find("mode steps=4"), std::string::npos);
}

// The CLI: the modes judge the decode op; bad combinations are exit 2 before
// anything runs; a mode's repro command carries its flags.
TEST(Serving, CliRefusesBadModesAndCarriesTheFlags) {
  EXPECT_EQ(test::cli({"run", "--suite", "smoke", "--backend", "cpu.paged", "--dcp", "2", "--op", "layer", "-q"}), 2);
  EXPECT_EQ(test::cli({"run", "--suite", "smoke", "--backend", "cpu.paged", "--dcp", "1", "-q"}), 2);
  EXPECT_EQ(test::cli({"run", "--suite", "smoke", "--backend", "cpu.paged", "--dcp", "2", "--steps", "4", "-q"}), 2);
  EXPECT_EQ(test::cli({"run", "--suite", "smoke", "--backend", "cpu.paged", "--dcp-interleave", "4", "-q"}), 2);
  EXPECT_EQ(test::cli({"run", "--suite", "smoke", "--backend", "cpu.paged", "--require", "batch-invariance", "-q"}), 2);
  EXPECT_EQ(test::cli({"run", "--suite", "smoke", "--backend", "cpu.paged", "--check", "batch-invariance",
                       "--repeat", "2", "-q"}), 2);
  const std::filesystem::path dir = test::scratch_dir("serving_cli");
  const std::string json = (dir / "r.json").string();
  ASSERT_EQ(test::cli({"run", "--suite", "gate", "--filter", "single_decode", "--backend", "cpu.splitkv", "--dcp", "4",
                       "--dcp-interleave", "8", "--no-progress", "-q", "--json", json}),
            0);
  const JsonReport jr = read_json_report(json);
  ASSERT_FALSE(jr.records.empty());
  for (const Record& r : jr.records) {
    EXPECT_EQ(r.op, "decode");
    EXPECT_EQ(r.mode, "dcp=4,interleave=8");
    EXPECT_NE(r.repro.find("--dcp 4 --dcp-interleave 8"), std::string::npos) << r.repro;
  }
}

}  // namespace
}  // namespace mlagate
