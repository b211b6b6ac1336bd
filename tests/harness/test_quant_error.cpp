// The quant_error metrics of an fp8 case (the reference over the dequantized
// cache against the reference over the unquantized inputs) depend on the
// case and op alone: runner.cpp computes them once per (case, op) and hands
// them to every backend's record. Each op's records must carry that op's
// values, the same as a run of that op alone computes.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backends.h"
#include "cases/suite.h"
#include "harness/run/runner.h"

namespace mlagate {
namespace {

RunConfig config(std::vector<Op> ops) {
  RunConfig cfg;
  CaseSpec s;
  s.batch = find_batch_spec("small_prefill");  // uniform query lengths: cpu.paged takes the decode op too
  s.tp = 16;
  s.kv_cache_dtype = KvCacheDtype::kFp8;
  cfg.cases = {s};
  cfg.ops = std::move(ops);
  cfg.policy = make_policy("baseline", 0, 0);
  return cfg;
}

const Metrics* quant_error(const Record& r) {
  for (const Metrics& m : r.metrics)
    if (m.output == "quant_error") return &m;
  return nullptr;
}

TEST(QuantError, EveryBackendsRecordCarriesItsOpsValues) {
  const std::vector<Op> ops{Op::kLayer, Op::kDecode, Op::kPrefill};
  // Each op alone, on one backend: the values computed afresh.
  std::map<std::string, Metrics> alone;
  for (Op op : ops) {
    std::vector<std::unique_ptr<Backend>> one;
    one.push_back(make_cpu_paged());
    const std::vector<Record> rs = run_cases(config({op}), one);
    ASSERT_EQ(rs.size(), 1u);
    ASSERT_EQ(rs[0].status, Status::kPassed) << rs[0].op << ": " << rs[0].message;
    const Metrics* m = quant_error(rs[0]);
    ASSERT_NE(m, nullptr) << rs[0].op;
    alone[rs[0].op] = *m;
  }
  // The layer op's o and the decode op's o_lat: different values, so records
  // handed another op's metrics would show.
  EXPECT_NE(alone["layer"].nmse, alone["decode"].nmse);

  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(make_cpu_paged());
  bs.push_back(make_cpu_splitkv());
  bs.push_back(make_cpu_paged());
  const std::vector<Record> all = run_cases(config(ops), bs);
  int checked = 0;
  for (const Record& r : all) {
    SCOPED_TRACE(r.backend + " " + r.op);
    const Metrics* m = quant_error(r);
    if (r.status == Status::kNotSupported) continue;
    ASSERT_NE(m, nullptr);
    const Metrics& want = alone.at(r.op);
    EXPECT_EQ(m->numel, want.numel);
    EXPECT_EQ(m->max_abs, want.max_abs);
    EXPECT_EQ(m->nmse, want.nmse);
    EXPECT_EQ(m->cos_diff, want.cos_diff);
    EXPECT_EQ(m->message, want.message);
    ++checked;
  }
  EXPECT_GE(checked, 7);  // cpu.splitkv declines the prefill op
}

}  // namespace
}  // namespace mlagate
