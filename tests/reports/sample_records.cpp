// The fixed sample run behind the golden files in expected/: change it and regenerate them
// with MLAGATE_UPDATE_SNAPSHOTS=1. Fields are assigned one by one because Record and Metrics
// have many defaulted members that designated initializers would warn about.
#include "tests/reports/sample_records.h"

#include <limits>

namespace mlagate::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
const std::string kPolicy = "fixed(atol=0.001, rtol=0.01)";

Location location(std::int64_t flat, int request, int token, int head, int dim) {
  Location l;
  l.flat = flat;
  l.request = request;
  l.token = token;
  l.head = head;
  l.dim = dim;
  return l;
}

Timings timings(double generate, double golden, double cache, double run, double compare) {
  Timings t;
  t.generate_ms = generate;
  t.reference_ms = golden;
  t.cache_ms = cache;
  t.run_ms = run;
  t.compare_ms = compare;
  return t;
}

Record record(std::string case_id, std::string backend, std::string op, Status status,
              std::string message) {
  Record r;
  r.repro = "mlagate run --case '" + case_id + "' --backend " + backend;
  r.case_id = std::move(case_id);
  r.backend = std::move(backend);
  r.op = std::move(op);
  r.status = status;
  r.message = std::move(message);
  r.policy = kPolicy;
  return r;
}

}  // namespace

RunInfo sample_run() {
  RunInfo run;
  run.tool_version = "0.1.0";
  run.git_commit = "0123456789ab";
  run.command_line = "mlagate run --suite smoke --backend cpu,cuda_flashmla --json out/r.json";
  run.suite = "smoke";
  run.policy = kPolicy;
  run.started_at = "2025-01-02T03:04:05Z";
  run.wall_seconds = 12.5;
  run.generator_version = 3;
  return run;
}

std::vector<Record> sample_records() {
  std::vector<Record> records;

  Record pass = record("decode b=2 kv=[37,512] h=16 bs=64 seed=1", "cpu", "decode",
                       Status::kPassed, "");
  pass.block_size = 64;
  pass.paths = {"decode", "decode"};
  pass.timings = timings(1.25, 3.5, 0.25, 2.125, 0.5);
  Metrics& pass_out = pass.metrics.emplace_back();
  pass_out.output = "out";
  pass_out.numel = 16384;
  pass_out.max_abs = 1.52587890625e-05;
  pass_out.max_rel = 0.000244140625;
  pass_out.rel_floor = 1e-05;
  pass_out.mean_abs = 2.1e-06;
  pass_out.nmse = 3.4e-11;
  pass_out.cos_diff = 1.7e-11;
  pass_out.max_ulp = 1;
  pass_out.ref_norm = 12.75;
  pass_out.out_norm = 12.75;
  pass_out.worst = location(1000, 0, 0, 1, 488);
  pass_out.min_atol = 1.3e-05;
  pass_out.min_fudge = 0.5;
  pass_out.passed = true;
  records.push_back(pass);

  Record incorrect = record(
      "layer b=3 kv=[1,64,1000] h=128 bs=64 seed=7", "cpu", "layer", Status::kIncorrect,
      "out: |x-y| = 0.0123 > atol + rtol*|y| at request 1, token 0, head 3, dim 7");
  incorrect.block_size = 64;
  incorrect.paths = {"decode", "prefill", "decode"};
  incorrect.timings = timings(2, 8, 1, 4.5, 1);
  Metrics& out = incorrect.metrics.emplace_back();
  out.output = "out";
  out.numel = 196608;
  out.max_abs = 0.0123;
  out.max_rel = 0.61;
  out.rel_floor = 1e-05;
  out.mean_abs = 0.0004;
  out.nmse = 2.5e-05;
  out.cos_diff = 1.25e-05;
  out.max_ulp = 130;
  out.ref_norm = 40.5;
  out.out_norm = 40.25;
  out.worst = location(54151, 1, 0, 3, 7);
  out.min_atol = 0.0123;
  // min_fudge stays NaN: the baseline policy does not exist for this case.
  out.message = "max_abs 0.0123 beyond tolerance";
  // The HTML report's error summary (the other reports leave it out): 3 tokens, one per
  // request, x 128 heads, small errors everywhere and the worst at token 1, head 3.
  out.map_tokens = 3;
  out.map_heads = 128;
  for (int i = 0; i < 3 * 128; ++i) out.err_token_head.push_back(static_cast<float>((i % 7 + 1) * 1e-4));
  out.err_token_head[1 * 128 + 3] = 0.0123f;
  out.query_lens = {1, 1, 1};
  out.worst_elements = {{location(54151, 1, 0, 3, 7), 0.5123, 0.5, 0.0123},
                        {location(54150, 1, 0, 3, 6), -0.25, -0.2507, 0.0007}};
  Metrics& lse = incorrect.metrics.emplace_back();
  lse.output = "lse";
  lse.numel = 384;
  lse.max_abs = 2e-06;
  lse.max_rel = 1e-07;
  lse.rel_floor = 1e-05;
  lse.mean_abs = 1e-07;
  lse.nmse = 1e-14;
  lse.cos_diff = 0;
  lse.max_ulp = kInf;
  lse.ref_norm = 150;
  lse.out_norm = 150;
  lse.worst = location(5, 0, 5, -1, -1);  // lse has no dim; the head is not recorded here
  lse.min_atol = 0;
  lse.min_fudge = 0.25;
  lse.passed = true;
  records.push_back(incorrect);

  Record nonfinite = record("decode b=1 kv=[4096] h=16 bs=64 seed=2 enc=fp8", "cuda_flashmla",
                            "decode", Status::kNonfinite,
                            "out: 3 NaN/Inf where the reference is finite, first at request 0, "
                            "token 0, head 2, dim 17");
  nonfinite.block_size = 64;
  nonfinite.paths = {"decode"};
  nonfinite.timings = timings(0.5, 2, 0.125, 0.0625, 0.25);
  Metrics& bad = nonfinite.metrics.emplace_back();
  bad.output = "out";
  bad.numel = 8192;
  bad.rel_floor = 1e-05;
  bad.ref_norm = 9.5;
  bad.out_norm = kInf;
  bad.nonfinite_mismatches = 3;
  bad.first_nonfinite = location(1041, 0, 0, 2, 17);
  bad.message = "3 nonfinite mismatches";
  bad.map_tokens = 1;
  bad.map_heads = 16;
  bad.err_token_head.assign(16, 2e-05f);
  bad.err_token_head[2] = std::numeric_limits<float>::quiet_NaN();
  bad.query_lens = {1};
  records.push_back(nonfinite);

  Record crashed = record("prefill b=2 q=[7,9] kv=[7,9] h=16 bs=64 seed=4", "cuda_flashmla",
                          "prefill", Status::kCrashed, kHostileMessage);
  crashed.block_size = 64;
  crashed.paths = {"prefill", "prefill"};
  crashed.timings = timings(0.75, 1.5, 0, 0, 0);
  records.push_back(crashed);

  records.push_back(record("decode b=2 kv=[37,512] h=16 bs=16 seed=1", "cuda_flashmla",
                           "decode", Status::kNotSupported,
                           "block_size 16 not supported (needs 64)"));

  // --expect outcomes (records 5 to 8), all on cuda_flashmla so that the cpu suite and the
  // indices above stay as they were. Two XFAIL records of one entry (statuses NONFINITE and
  // INCORRECT, a reason with markup characters and an http link), a strict XPASS and a
  // non-strict XPASS whose link is not a URL.
  Expectation fp8;
  fp8.outcome = Expected::kXfail;
  fp8.entry = "flashmla-fp8-long-context";
  fp8.reason = kXfailReason;
  fp8.link = kXfailLink;

  Record xfail_nan = record("decode b=1 kv=[8192] h=16 bs=64 seed=5 enc=fp8", "cuda_flashmla", "decode",
                            Status::kNonfinite,
                            "out: 12 NaN/Inf where the reference is finite, first at request 0, token 0, "
                            "head 5, dim 300");
  xfail_nan.block_size = 64;
  xfail_nan.paths = {"decode"};
  xfail_nan.timings = timings(0.5, 4, 0.25, 0.125, 0.25);
  Metrics& nan_out = xfail_nan.metrics.emplace_back();
  nan_out.output = "out";
  nan_out.numel = 8192;
  nan_out.rel_floor = 1e-05;
  nan_out.ref_norm = 9.25;
  nan_out.out_norm = kInf;
  nan_out.nonfinite_mismatches = 12;
  nan_out.first_nonfinite = location(2860, 0, 0, 5, 300);
  nan_out.message = "12 nonfinite mismatches";
  xfail_nan.facts = {{"kv", "fp8"}, {"query_kind", "decode"}, {"requests", "1"}, {"seq_len_max", "8192"}, {"suite", "smoke"}};
  xfail_nan.expected = fp8;
  records.push_back(xfail_nan);

  Record xfail_bad = record("decode b=2 kv=[4096,6000] h=16 bs=64 seed=6 enc=fp8", "cuda_flashmla", "decode",
                            Status::kIncorrect,
                            "out: |x-y| = 0.75 > atol + rtol*|y| at request 1, token 0, head 9, dim 2");
  xfail_bad.block_size = 64;
  xfail_bad.paths = {"decode", "decode"};
  xfail_bad.timings = timings(0.5, 3, 0.25, 0.125, 0.25);
  Metrics& bad_out = xfail_bad.metrics.emplace_back();
  bad_out.output = "out";
  bad_out.numel = 16384;
  bad_out.max_abs = 0.75;
  bad_out.max_rel = 3.5;
  bad_out.rel_floor = 1e-05;
  bad_out.mean_abs = 0.002;
  bad_out.ref_norm = 20.5;
  bad_out.out_norm = 21.25;
  bad_out.worst = location(9218, 1, 0, 9, 2);
  bad_out.min_atol = 0.75;
  bad_out.message = "max_abs 0.75 beyond tolerance";
  xfail_bad.facts = {{"kv", "fp8"}, {"query_kind", "decode"}, {"requests", "2"}, {"seq_len_max", "6000"}, {"suite", "smoke"}};
  xfail_bad.expected = fp8;
  records.push_back(xfail_bad);

  Record xpass_strict = record("decode b=1 kv=[300] h=128 bs=64 seed=9", "cuda_flashmla", "decode",
                               Status::kPassed, "");
  xpass_strict.block_size = 64;
  xpass_strict.paths = {"decode"};
  xpass_strict.timings = timings(0.25, 1, 0.125, 0.0625, 0.125);
  Metrics& strict_out = xpass_strict.metrics.emplace_back();
  strict_out.output = "out";
  strict_out.numel = 65536;
  strict_out.max_abs = 0.000244140625;
  strict_out.max_rel = 0.0078125;
  strict_out.rel_floor = 1e-05;
  strict_out.mean_abs = 1.5e-05;
  strict_out.ref_norm = 64.5;
  strict_out.out_norm = 64.5;
  strict_out.min_atol = 0.0002;
  strict_out.passed = true;
  xpass_strict.facts = {{"heads", "128"}, {"kv", "auto"}, {"query_kind", "decode"}};
  xpass_strict.expected.outcome = Expected::kXpass;
  xpass_strict.expected.entry = "flashmla-h128-splitkv";
  xpass_strict.expected.reason = "split-KV merge drops the last partial block with 128 heads";
  xpass_strict.expected.strict = true;
  records.push_back(xpass_strict);

  Record xpass_notice = record("prefill b=1 q=[33] kv=[33] h=16 bs=64 seed=3", "cuda_flashmla", "prefill",
                               Status::kPassed, "");
  xpass_notice.block_size = 64;
  xpass_notice.paths = {"prefill"};
  xpass_notice.timings = timings(0.25, 1, 0, 0.0625, 0.125);
  xpass_notice.facts = {{"kv", "auto"}, {"query_kind", "prefill"}};
  xpass_notice.expected.outcome = Expected::kXpass;
  xpass_notice.expected.entry = "flashmla-prefill-streams";
  xpass_notice.expected.reason = "mismatches now and then under concurrent streams";
  xpass_notice.expected.link = "FLASHMLA-17";
  xpass_notice.expected.strict = false;
  records.push_back(xpass_notice);
  return records;
}

}  // namespace mlagate::test
