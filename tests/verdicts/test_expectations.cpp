// Expectations files (harness/verdicts/expectations.h) without the binary:
// every malformed field is an input error naming the file, the line and the
// field; entries select records by backend, op, case and facts; a failure an
// entry expects is XFAIL, a pass it selects XPASS (strict or not), anything
// else stays as it was; an entry that selected none of its backends' records is
// stale; what expect --from writes reads back, selects every failure it was
// made from and none of the passes.
#include <gtest/gtest.h>

#include "cases/errors.h"
#include "cases/suite.h"
#include "harness/verdicts/expect_from.h"
#include "harness/verdicts/expectations.h"
#include "harness/verdicts/facts.h"
#include "reports/report.h"

namespace mlagate {
namespace {

const char* kGood = R"(# a team's known failures
schema: mlagate.expect/1
description: FA3's known failures
expect:
  - id: fa3-tail-nan
    backend: [flash_attn.mla, "flash_attn.mla.*"]
    op: [decode, layer]
    where:
      block_size: 64
      kv: auto
      query_len_max: {min: 1, max: 512}
    status: NONFINITE
    reason: the paged TMA tail reads past the last page
    link: https://example.org/issue/1
  - id: fi-scale
    backend: "flashinfer.*"
    where: {kv: [fp8, fp8_e4m3], kscale_exact: false, seq_len_max: {min: 4096}}
    reason: k_scale rounded to bf16
    strict: false
)";

Record rec(const std::string& backend, const std::string& op, Status st, std::map<std::string, std::string> facts,
           const std::string& id = "s/x/tp1/bf16/kv=auto/bs=64/seed=0") {
  Record r;
  r.backend = backend;
  r.op = op;
  r.status = st;
  r.case_id = id;
  r.facts = std::move(facts);
  return r;
}

TEST(Expectations, AWellFormedFileAndWhatItSelects) {
  const ExpectationSet set = ExpectationSet::parse(kGood, "k.yaml");
  ASSERT_EQ(set.entries().size(), 2u);
  const ExpectEntry& e = set.entries()[0];
  EXPECT_EQ(e.id, "fa3-tail-nan");
  EXPECT_EQ(e.source, "k.yaml:5");
  EXPECT_EQ(e.statuses, std::vector<Status>{Status::kNonfinite});
  EXPECT_TRUE(set.entries()[1].statuses.empty());  // any failure
  EXPECT_FALSE(set.entries()[1].strict);
  const std::map<std::string, std::string> f64 = {{"block_size", "64"}, {"kv", "auto"}, {"query_len_max", "8"}};
  Record r = rec("flash_attn.mla.cudagraph", "decode", Status::kNonfinite, f64);
  set.apply(r);
  EXPECT_EQ(r.expected.outcome, Expected::kXfail);
  EXPECT_EQ(r.expected.entry, "fa3-tail-nan");
  EXPECT_EQ(r.expected.link, "https://example.org/issue/1");
  EXPECT_FALSE(record_fails_run(r, false));
  // Another status than the entry's: a failure as before.
  r = rec("flash_attn.mla", "decode", Status::kIncorrect, f64);
  set.apply(r);
  EXPECT_EQ(r.expected.outcome, Expected::kNone);
  EXPECT_TRUE(record_fails_run(r, false));
  // Outside the selector: block size 16, a query of 600, another op, another backend.
  for (Record x : {rec("flash_attn.mla", "decode", Status::kNonfinite, {{"block_size", "16"}, {"kv", "auto"}, {"query_len_max", "8"}}),
                   rec("flash_attn.mla", "decode", Status::kNonfinite, {{"block_size", "64"}, {"kv", "auto"}, {"query_len_max", "600"}}),
                   rec("flash_attn.mla", "prefill", Status::kNonfinite, f64), rec("flashmla", "decode", Status::kNonfinite, f64)}) {
    set.apply(x);
    EXPECT_EQ(x.expected.outcome, Expected::kNone) << x.backend << " " << x.op;
  }
  // A pass it selects: XPASS, a failure under strict; not under strict: false.
  r = rec("flash_attn.mla", "layer", Status::kPassed, f64);
  set.apply(r);
  EXPECT_EQ(r.expected.outcome, Expected::kXpass);
  EXPECT_TRUE(record_fails_run(r, false));
  r = rec("flashinfer.mla.fa3", "decode", Status::kPassed, {{"kv", "fp8"}, {"kscale_exact", "false"}, {"seq_len_max", "8192"}});
  set.apply(r);
  EXPECT_EQ(r.expected.outcome, Expected::kXpass);
  EXPECT_FALSE(record_fails_run(r, false));
  // outputs: an entry for the lse alone does not take a record whose o_lat fails too.
  {
    const ExpectationSet lse = ExpectationSet::parse(
        "schema: mlagate.expect/1\nexpect:\n  - {id: l, backend: b, outputs: lse, reason: rounded row sums}\n", "l.yaml");
    Record x = rec("b", "decode", Status::kIncorrect, f64);
    Metrics m;
    m.output = "lse";
    x.metrics.push_back(m);
    lse.apply(x);
    EXPECT_EQ(x.expected.outcome, Expected::kXfail);
    m.output = "o_lat";
    x.metrics.push_back(m);
    lse.apply(x);
    EXPECT_EQ(x.expected.outcome, Expected::kNone);
  }
  // Records that did not run are left alone; a record without facts matches no where:.
  r = rec("flash_attn.mla", "decode", Status::kNotSupported, f64);
  set.apply(r);
  EXPECT_EQ(r.expected.outcome, Expected::kNone);
  r = rec("flash_attn.mla", "decode", Status::kNonfinite, {});
  set.apply(r);
  EXPECT_EQ(r.expected.outcome, Expected::kNone);
}

TEST(Expectations, CountsPartitionTheRecordsAndStaleEntriesAreNamed) {
  const ExpectationSet set = ExpectationSet::parse(kGood, "k.yaml");
  const std::map<std::string, std::string> f64 = {{"block_size", "64"}, {"kv", "auto"}, {"query_len_max", "8"}};
  std::vector<Record> rs = {rec("flash_attn.mla", "decode", Status::kNonfinite, f64),
                            rec("flash_attn.mla", "decode", Status::kPassed, {{"block_size", "16"}, {"kv", "auto"}, {"query_len_max", "8"}}),
                            rec("flash_attn.mla", "decode", Status::kIncorrect, {{"block_size", "16"}}),
                            // fi-scale's configuration (an fp8 cache, an inexact scale) without its trigger (long sequences)
                            rec("flashinfer.mla.fa2", "decode", Status::kPassed, {{"kv", "fp8"}, {"kscale_exact", "false"}, {"seq_len_max", "100"}})};
  for (Record& r : rs) set.apply(r);
  const StatusCounts c = count_statuses(rs);
  EXPECT_EQ(c.xfail, 1);
  EXPECT_EQ(c.xpass, 0);
  EXPECT_EQ(c[Status::kNonfinite], 0);  // the XFAIL record is not under its status
  EXPECT_EQ(c[Status::kPassed], 2);
  EXPECT_EQ(c[Status::kIncorrect], 1);
  EXPECT_EQ(c.failures, 1);
  EXPECT_EQ(c.total, 4);
  const auto uses = set.uses(rs);
  EXPECT_EQ(uses[0].xfail, 1);
  EXPECT_FALSE(uses[0].stale());
  EXPECT_TRUE(uses[1].stale());  // flashinfer ran in its configuration, nothing selected
  EXPECT_EQ(uses[1].in_scope, 1);
  const std::string text = expectations_summary(set, rs);
  EXPECT_NE(text.find("stale expectation: fi-scale (k.yaml:"), std::string::npos) << text;
  EXPECT_NE(text.find("1 XFAIL, 0 XPASS, 1 stale"), std::string::npos) << text;
  // Without flashinfer records in the run, or only outside its configuration (kv auto), it is not stale.
  rs.back().facts = {{"kv", "auto"}, {"kscale_exact", "true"}};
  EXPECT_FALSE(set.uses(rs)[1].stale());
  EXPECT_EQ(set.uses(rs)[1].in_scope, 0);
  rs.pop_back();
  EXPECT_FALSE(set.uses(rs)[1].stale());
}

TEST(Expectations, MalformedFilesNameTheFileLineAndField) {
  const std::string head = "schema: mlagate.expect/1\nexpect:\n";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "a YAML map"},
      {"[1, 2]", "a YAML map"},
      {"expect: []\n", "schema: required"},
      {"schema: mlagate.expect/2\nexpect: []\n", "schema: expected mlagate.expect/1"},
      {"schema: mlagate.expect/1\nexpects: []\n", "expects: unknown key"},
      {head + "  - {backend: x, reason: r}\n", "k.yaml:3: expect[0].id: required"},
      {head + "  - {id: 'a b', backend: x, reason: r}\n", "expect[0].id: 'a b'"},
      {head + "  - {id: a, reason: r}\n", "expect[0].backend: required"},
      {head + "  - {id: a, backend: x}\n", "expect[0].reason: required"},
      {head + "  - {id: a, backend: x, reason: r, colour: red}\n", "expect[0].colour: unknown key"},
      {head + "  - {id: a, backend: x, reason: r, op: decod}\n", "expect[0].op: unknown op"},
      {head + "  - {id: a, backend: x, reason: r, status: PASSED}\n", "PASSED is not a failure"},
      {head + "  - {id: a, backend: x, reason: r, status: BROKEN}\n", "unknown status 'BROKEN'"},
      {head + "  - {id: a, backend: x, reason: r, case: '(['}\n", "expect[0].case: not a regex"},
      {head + "  - {id: a, backend: x, reason: r, where: {colour: red}}\n", "where.colour: no such fact"},
      {head + "  - {id: a, backend: x, reason: r, where: {block_size: big}}\n", "'block_size' is a number, got 'big'"},
      {head + "  - {id: a, backend: x, reason: r, where: {kscale_exact: maybe}}\n", "'kscale_exact' is true or false"},
      {head + "  - {id: a, backend: x, reason: r, where: {kv: {min: 1}}}\n", "'kv' is not a number"},
      {head + "  - {id: a, backend: x, reason: r, where: {heads: {min: 9, max: 3}}}\n", "min is above max"},
      {head + "  - {id: a, backend: x, reason: r, where: {heads: {min: 1e999}}}\n", "expected a finite number"},
      {head + "  - {id: a, backend: x, reason: r, strict: sometimes}\n", "expect[0].strict: expected true or false"},
      {head + "  - {id: a, backend: [], reason: r}\n", "expect[0].backend: expected at least one value"},
      {head + "  - {id: a, backend: x, reason: r}\n  - {id: a, backend: y, reason: r}\n", "'a' is given twice"},
      {head + "  - {id: a, backend: x, reason: [r]}\n", "expect[0].reason: expected a text value"},
      {head + "  - {id: a, backend: x, reason: r\n", "YAML syntax error"},
  };
  for (const auto& [text, want] : bad) {
    SCOPED_TRACE(text);
    try {
      (void)ExpectationSet::parse(text, "k.yaml");
      ADD_FAILURE() << "accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind("k.yaml", 0), 0u) << e.what();
    }
  }
  // A missing file, and the same id in two files.
  EXPECT_THROW(ExpectationSet::load(std::vector<std::string>{"/nonexistent/e.yaml"}), InputError);
}

// The files shipped beside the real libraries' adapters are well formed, and
// every entry says why and how to see it (a reason, a link and evidence).
TEST(Expectations, TheShippedFilesAreWellFormed) {
  const std::string src = MLAGATE_TEST_SOURCE_DIR;
  const std::vector<std::string> files = {src + "/backends/flash_attn/expect.yaml", src + "/backends/flashinfer/expect.yaml",
                                          src + "/backends/flashmla/expect.yaml", src + "/python/examples/vllm_triton_mla.expect.yaml",
                                          src + "/python/examples/vllm_triton_merge.expect.yaml"};
  const ExpectationSet set = ExpectationSet::load(files);
  EXPECT_GE(set.entries().size(), 7u);
  for (const ExpectEntry& e : set.entries()) {
    EXPECT_FALSE(e.link.empty()) << e.id;
    EXPECT_FALSE(e.evidence.empty()) << e.id;
    EXPECT_GT(e.reason.size(), 40u) << e.id;
  }
}

TEST(Expectations, WrittenEntriesReadBackTheSame) {
  const ExpectationSet set = ExpectationSet::parse(kGood, "k.yaml");
  std::vector<ExpectEntry> es = set.entries();
  es[0].reason = "quotes \" and \\ and\nnewlines\tand \x01";
  es[0].case_regex = "^edges/.*bs=64";
  es[0].case_re = std::regex(es[0].case_regex);
  es[1].outputs = {"lse"};
  const std::string text = expectations_yaml(es, "a header\nof two lines");
  const ExpectationSet back = ExpectationSet::parse(text, "w.yaml");
  ASSERT_EQ(back.entries().size(), es.size());
  for (std::size_t i = 0; i < es.size(); ++i) EXPECT_TRUE(back.entries()[i] == es[i]) << i << "\n" << text;
}

TEST(Expectations, EntriesFromFailuresSelectTheFailuresAndNoPass) {
  // The smoke suite's cases as records of two backends: one fails every fp8
  // case with an inexact k_scale (a cause with facts), the other fails two
  // cases that no facts tell from its passes (named by id); a third backend
  // fails exactly as the first (its cudagraph twin: one entry).
  std::vector<Record> rs;
  RunFacts run;
  for (const char* suite : {"fp8", "smoke"})
    for (const CaseSpec& c : load_suite(suite).cases) {
      for (const char* b : {"a.kernel", "a.kernel.graph", "b.kernel"}) {
        Record r;
        r.case_id = c.id();
        r.backend = b;
        r.op = "decode";
        r.block_size = 64;
        const bool scale = (c.kv_cache_dtype == KvCacheDtype::kFp8 || c.kv_cache_dtype == KvCacheDtype::kFp8E4m3) &&
                           !k_scale_exact_in_model_dtype(c);
        const bool b_fails = std::string(b) == "b.kernel" && (r.case_id.find("small_decode") != std::string::npos) && c.seed == 0 &&
                             c.suite == "smoke" && c.tp == 16;
        r.status = std::string(b) == "b.kernel" ? (b_fails ? Status::kIncorrect : Status::kPassed)
                                                : (scale ? Status::kIncorrect : Status::kPassed);
        if (r.status != Status::kPassed) {
          Metrics m;
          m.output = "o_lat";
          m.passed = false;
          r.metrics.push_back(m);
        }
        r.facts = record_facts(c, r, run);
        rs.push_back(r);
      }
    }
  const std::vector<ExpectEntry> es = entries_from_failures(rs, "r.json");
  ASSERT_EQ(es.size(), 2u) << expectations_yaml(es, "");
  EXPECT_EQ(es[0].backends, (std::vector<std::string>{"a.kernel", "a.kernel.graph"}));
  EXPECT_TRUE(es[0].case_regex.empty()) << "a facts selector: " << expectations_yaml(es, "");
  EXPECT_EQ(es[1].backends, std::vector<std::string>{"b.kernel"});
  const ExpectationSet set = ExpectationSet::parse(expectations_yaml(es, ""), "w.yaml");
  int xfail = 0, failures = 0;
  for (Record r : rs) {
    set.apply(r);
    failures += status_is_failure(r.status);
    xfail += r.expected.outcome == Expected::kXfail;
    EXPECT_NE(r.expected.outcome, Expected::kXpass) << r.backend << " " << r.case_id;
    if (status_is_failure(r.status)) EXPECT_EQ(r.expected.outcome, Expected::kXfail) << r.backend << " " << r.case_id;
  }
  EXPECT_GT(failures, 3);
  EXPECT_EQ(xfail, failures);
}

}  // namespace
}  // namespace mlagate
