// Golden and results files end to end: an exported file reads back
// bit-identical (without h5py); run --golden gives a recomputed run's verdicts;
// replay gives run's; compare finds a changed kernel and names it; a killed
// export leaves nothing behind; the CLI's exit codes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <cstdio>
#include <cstring>
#include <functional>
#include <set>
#include <stdexcept>
#include <string_view>

#include "backends/registry.h"
#include "cases/generator.h"
#include "cases/suite.h"
#include "golden/compare_files.h"
#include "harness/run/golden_run.h"
#include "reference/glue.h"
#include "reference/fp64_reference.h"
#include "tests/golden/golden_test_util.h"

namespace mlagate {
namespace {

using namespace mlagate::testing;

void expect_same(const Tensor& a, const Tensor& b, const std::string& what) {
  EXPECT_EQ(a.dtype(), b.dtype()) << what;
  EXPECT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.nbytes(), b.nbytes()) << what;
  EXPECT_EQ(std::memcmp(a.bytes(), b.bytes(), a.nbytes()), 0) << what << " differs";
}

void expect_same(const std::vector<double>& a, const std::vector<double>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)), 0) << what << " differs";
}

void expect_same_records(const std::vector<Record>& a, const std::vector<Record>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string at = a[i].case_id + " " + a[i].backend + " " + a[i].op;
    EXPECT_EQ(a[i].case_id, b[i].case_id);
    EXPECT_EQ(a[i].backend, b[i].backend);
    EXPECT_EQ(a[i].op, b[i].op);
    EXPECT_EQ(a[i].status, b[i].status) << at;
    EXPECT_EQ(a[i].message, b[i].message) << at;
    EXPECT_EQ(a[i].block_size, b[i].block_size) << at;
    EXPECT_EQ(a[i].paths, b[i].paths) << at;
    ASSERT_EQ(a[i].metrics.size(), b[i].metrics.size()) << at;
    for (std::size_t k = 0; k < a[i].metrics.size(); ++k) {
      const Metrics &x = a[i].metrics[k], &y = b[i].metrics[k];
      EXPECT_EQ(x.output, y.output) << at;
      // The stored reference is the computed one, bit for bit: metrics agree exactly.
      EXPECT_EQ(std::memcmp(&x.max_abs, &y.max_abs, sizeof(double)), 0) << at << " " << x.output;
      EXPECT_EQ(std::memcmp(&x.nmse, &y.nmse, sizeof(double)), 0) << at << " " << x.output;
      EXPECT_EQ(std::memcmp(&x.min_atol, &y.min_atol, sizeof(double)), 0) << at << " " << x.output;
      EXPECT_EQ(x.passed, y.passed) << at;
    }
  }
}

RunConfig small_run_config(std::vector<CaseSpec> specs) {
  RunConfig cfg;
  cfg.cases = std::move(specs);
  cfg.ops = {Op::kLayer, Op::kDecode, Op::kPrefill};
  cfg.policy = make_policy("fixed", 0.05, 0.01);
  return cfg;
}

std::string capture_compare(const fs::path& a, const fs::path& b, const FileCompareOptions& opt,
                            FileCompareSummary& sum) {
  char* buf = nullptr;
  std::size_t len = 0;
  std::FILE* out = open_memstream(&buf, &len);
  sum = compare_results_files(a.string(), b.string(), opt, out);
  std::fclose(out);
  std::string s(buf, len);
  std::free(buf);
  return s;
}

class H5Files : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir();
    golden_ = (*dir_ / "small.h5").string();
    export_small(golden_);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  ScratchDir scratch_;
  static ScratchDir* dir_;
  static std::string golden_;
};
ScratchDir* H5Files::dir_ = nullptr;
std::string H5Files::golden_;

TEST_F(H5Files, ExportedFileReadsBackBitIdentical) {
  GoldenReader r(golden_);
  EXPECT_EQ(r.info().kind, FileKind::kGolden);
  EXPECT_EQ(r.info().generator_version, gen::kGeneratorVersion);
  const std::vector<CaseSpec> specs = small_specs();
  ASSERT_EQ(r.case_ids().size(), specs.size());
  const ExportOptions opt = small_export_options();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const std::string id = specs[i].id();
    EXPECT_EQ(r.case_ids()[i], id);
    const CaseHeader h = r.header(id);
    EXPECT_EQ(h.spec.id(), id);
    EXPECT_EQ(h.spec.batch.seq_lens, specs[i].batch.seq_lens);
    EXPECT_EQ(h.spec.batch.query_lens, specs[i].batch.query_lens);
    EXPECT_EQ(h.spec.batch.spec_decode, specs[i].batch.spec_decode);
    EXPECT_EQ(h.spec.softmax_scale(), specs[i].softmax_scale());
    EXPECT_EQ(h.cache_block_sizes, (std::vector<int>{16, 64}));

    const PreparedCase want = prepare_export_case(specs[i], opt);
    const PreparedCase got = r.load_case(id);
    EXPECT_EQ(input_hashes(got.c), input_hashes(want.c));
    expect_same(got.c.q, want.c.q, id + " q");
    expect_same(got.c.kv_c, want.c.kv_c, id + " kv_c");
    expect_same(got.c.k_pe, want.c.k_pe, id + " k_pe");
    expect_same(got.c.w_uk, want.c.w_uk, id + " W_UK");
    expect_same(got.c.w_uv, want.c.w_uv, id + " W_UV");
    EXPECT_EQ(got.c.query_start_loc, want.c.query_start_loc);
    EXPECT_EQ(got.c.kv_start_loc, want.c.kv_start_loc);
    EXPECT_EQ(got.c.context_lens, want.c.context_lens);
    ASSERT_TRUE(got.reference && want.reference);
    expect_same(got.reference->out, want.reference->out, id + " golden out");
    expect_same(got.reference->lse, want.reference->lse, id + " golden lse");
    // The stored reference is reference_absorbed's, bit for bit.
    const ReferenceOutputs fresh = reference_absorbed(want.c);
    expect_same(got.reference->out, fresh.out, id + " golden out vs reference_absorbed");
    ASSERT_TRUE(got.decode && want.decode);
    expect_same(got.decode->q_lat, want.decode->q_lat, id + " decode q_lat");
    expect_same(got.decode->o_lat, want.decode->o_lat, id + " decode o_lat");
    expect_same(got.decode->lse, want.decode->lse, id + " decode lse");
    ASSERT_EQ(got.caches.size(), 2u);
    for (const auto& [bs, cache] : want.caches) {
      const PagedCache& c = got.caches.at(bs);
      const std::string what = id + " cache bs=" + std::to_string(bs);
      expect_same(c.data.tensor(), cache.data.tensor(), what + " data");
      expect_same(c.block_table, cache.block_table, what + " block_table");
      expect_same(c.slot_mapping, cache.slot_mapping, what + " slot_mapping");
      EXPECT_EQ(c.num_blocks, cache.num_blocks);
      EXPECT_EQ(c.used_blocks, cache.used_blocks);
      EXPECT_EQ(c.entry_bytes, cache.entry_bytes);
      EXPECT_EQ(c.table_width, cache.table_width);
      EXPECT_EQ(c.kv_dtype, cache.kv_dtype);
      EXPECT_EQ(c.elem_dtype, cache.elem_dtype);
      EXPECT_EQ(c.options.poison, cache.options.poison);
      EXPECT_FALSE(c.options.write_new_tokens);
    }
    EXPECT_FALSE(got.build_missing_caches);
  }
}

TEST_F(H5Files, RunGoldenGivesTheVerdictsOfARecomputedRun) {
  auto backends = select_backends("cpu.paged,cpu.splitkv");
  RunConfig plain = small_run_config(small_specs());
  const std::vector<Record> want = run_cases(plain, backends);

  RunConfig cfg = small_run_config(small_specs());
  GoldenRun golden(GoldenRunOptions{golden_, "", {}, "", kDefaultMaxBytes, "test", ""});
  golden.attach(cfg);
  const std::vector<Record> got = run_cases(cfg, backends);
  expect_same_records(got, want);
  std::size_t passed = 0;
  for (const Record& r : got) passed += r.status == Status::kPassed;
  EXPECT_GT(passed, got.size() / 2);  // a real run, not a pile of NOT_SUPPORTED
}

// Export stores err_baseline's parts (the layer op per form and request, the
// decode op's) and run --golden takes them instead of emulating again: equal
// to a recomputed run's, bit for bit, and, in a file whose stored values were
// doubled, doubled in the records (the prefill op's, not stored by this
// export, computed as before).
TEST_F(H5Files, RunGoldenTakesTheStoredErrBaseline) {
  auto backends = select_backends("cpu.paged,cpu.splitkv");
  RunConfig plain = small_run_config(small_specs());
  plain.baseline.always = true;
  const std::vector<Record> want = run_cases(plain, backends);

  RunConfig cfg = small_run_config(small_specs());
  cfg.baseline.always = true;
  GoldenRun golden(GoldenRunOptions{golden_, "", {}, "", kDefaultMaxBytes, "test", ""});
  golden.attach(cfg);
  const std::vector<Record> got = run_cases(cfg, backends);
  expect_same_records(got, want);
  std::size_t with_baseline = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    for (std::size_t k = 0; k < got[i].metrics.size(); ++k) {
      const double a = got[i].metrics[k].err_baseline, b = want[i].metrics[k].err_baseline;
      EXPECT_EQ(std::memcmp(&a, &b, sizeof(double)), 0) << got[i].case_id << " " << got[i].backend << " " << got[i].op;
      with_baseline += std::isfinite(a) && a > 0;
    }
  EXPECT_GT(with_baseline, got.size() / 2);

  const fs::path doubled = scratch_ / "doubled.h5";
  fs::copy_file(golden_, doubled);
  {
    GoldenReader r(golden_);
    for (const std::string& id : r.case_ids()) {
      const std::optional<StoredBaselines> b = r.load_baselines(id);
      ASSERT_TRUE(b) << id;
      ASSERT_TRUE(b->decode_op) << id;
      EXPECT_FALSE(b->prefill_op) << id;  // export_small: layer and decode only
      const std::int64_t B = static_cast<std::int64_t>(b->layer_out[0].size());
      std::vector<double> out, lse;
      for (int f = 0; f < 2; ++f) {
        ASSERT_EQ(static_cast<std::int64_t>(b->layer_out[f].size()), B);
        for (std::int64_t i = 0; i < B; ++i) {
          EXPECT_TRUE(std::isfinite(b->layer_out[f][i])) << id;  // every request, both forms
          out.push_back(2 * b->layer_out[f][i]);
          lse.push_back(2 * b->layer_lse[f][i]);
        }
      }
      const std::string g = case_path(id) + "/err_baseline";
      replace_dataset(doubled, g, "layer_out", doubles(out, {2, B}));
      replace_dataset(doubled, g, "layer_lse", doubles(lse, {2, B}));
      replace_dataset(doubled, g, "decode_op", doubles({2 * (*b->decode_op)[0], 2 * (*b->decode_op)[1]}, {2}));
    }
  }
  RunConfig cfg2 = small_run_config(small_specs());
  cfg2.baseline.always = true;
  GoldenRun golden2(GoldenRunOptions{doubled.string(), "", {}, "", kDefaultMaxBytes, "test", ""});
  golden2.attach(cfg2);
  const std::vector<Record> twice = run_cases(cfg2, backends);
  ASSERT_EQ(twice.size(), want.size());
  std::size_t changed = 0;
  for (std::size_t i = 0; i < twice.size(); ++i)
    for (std::size_t k = 0; k < twice[i].metrics.size(); ++k) {
      const double a = twice[i].metrics[k].err_baseline, b = want[i].metrics[k].err_baseline;
      if (!std::isfinite(b)) continue;
      const std::string at = twice[i].case_id + " " + twice[i].backend + " " + twice[i].op;
      if (twice[i].op == "prefill") {
        EXPECT_EQ(a, b) << at;
      } else {
        EXPECT_EQ(a, 2 * b) << at;
        changed += b > 0;
      }
    }
  EXPECT_GT(changed, 0u);
}

// fp8 and fp8_e4m3 cases of one input set share a context in run --golden
// only while the file's stored references are the same: with the fp8_e4m3
// case's stored err_baseline doubled, its records must carry the doubled
// values, not the fp8 case's.
TEST_F(H5Files, RunGoldenSharesACaseOnlyWhenItsStoredReferencesAreEqual) {
  std::vector<CaseSpec> specs;
  for (KvCacheDtype kv : {KvCacheDtype::kFp8, KvCacheDtype::kFp8E4m3}) {
    CaseSpec s = small_specs()[0];
    s.kv_cache_dtype = kv;
    specs.push_back(s);
  }
  const fs::path file = scratch_ / "fp8.h5", edited = scratch_ / "fp8_doubled.h5";
  export_small(file, specs);
  fs::copy_file(file, edited);
  {
    GoldenReader r(file.string());
    const std::string id = specs[1].id();
    const StoredBaselines b = *r.load_baselines(id);
    const std::int64_t B = static_cast<std::int64_t>(b.layer_out[0].size());
    std::vector<double> out;
    for (int f = 0; f < 2; ++f)
      for (double x : b.layer_out[f]) out.push_back(2 * x);
    replace_dataset(edited, case_path(id) + "/err_baseline", "layer_out", doubles(out, {2, B}));
  }
  auto run = [&](const fs::path& f) {
    auto backends = select_backends("cpu.paged");
    RunConfig cfg = small_run_config(specs);
    cfg.ops = {Op::kLayer};
    cfg.baseline.always = true;
    GoldenRun golden(GoldenRunOptions{f.string(), "", {}, "", kDefaultMaxBytes, "test", ""});
    golden.validate(cfg.cases, cfg.exec);
    golden.attach(cfg);
    return run_cases(cfg, backends);
  };
  const std::vector<Record> same = run(file), twice = run(edited);
  ASSERT_EQ(same.size(), 2u);
  ASSERT_EQ(twice.size(), 2u);
  const double fp8 = same[0].metrics.at(0).err_baseline;
  ASSERT_TRUE(std::isfinite(fp8) && fp8 > 0);
  EXPECT_EQ(same[1].metrics.at(0).err_baseline, fp8);     // shared (or equal anyway)
  EXPECT_EQ(twice[0].metrics.at(0).err_baseline, fp8);
  EXPECT_EQ(twice[1].metrics.at(0).err_baseline, 2 * fp8);  // its own stored values, not the fp8 case's
}

// Cases of one input set (kv=auto, then fp8 and fp8_e4m3 of the same inputs)
// hash the regenerated tensors once, but each case's own stored hashes are
// compared with them, and each case's own stored caches with what is rebuilt,
// including a case handed on a shared context: a doctored later case stops
// the run, naming it.
TEST_F(H5Files, EveryCaseOfAnInputSetHasItsOwnHashesChecked) {
  std::vector<CaseSpec> specs;
  for (KvCacheDtype kv : {KvCacheDtype::kAuto, KvCacheDtype::kFp8, KvCacheDtype::kFp8E4m3}) {
    CaseSpec s = small_specs()[0];
    s.kv_cache_dtype = kv;
    specs.push_back(s);
  }
  const fs::path file = scratch_ / "three.h5";
  export_small(file, specs);
  auto run = [&](const fs::path& f) {
    auto backends = select_backends("cpu.paged");
    RunConfig cfg = small_run_config(specs);
    cfg.ops = {Op::kLayer};
    GoldenRun golden(GoldenRunOptions{f.string(), "", {}, "", kDefaultMaxBytes, "test", ""});
    golden.validate(cfg.cases, cfg.exec);
    golden.attach(cfg);
    return run_cases(cfg, backends);
  };
  ASSERT_EQ(run(file).size(), 3u);
  for (std::size_t victim : {1u, 2u}) {
    SCOPED_TRACE(specs[victim].id());
    const fs::path edited = scratch_ / ("doctored" + std::to_string(victim) + ".h5");
    fs::copy_file(file, edited, fs::copy_options::overwrite_existing);
    set_string_attr(edited, case_path(specs[victim].id()), "xxh64_kv_c", "0123456789abcdef");
    try {
      run(edited);
      ADD_FAILURE() << "a later case of the input set with a doctored hash must stop the run";
    } catch (const GoldenFileError& e) {
      EXPECT_NE(std::string(e.what()).find("case " + specs[victim].id() + ": regenerated input kv_c"), std::string::npos)
          << e.what();
    }
  }
  // The fp8_e4m3 case shares the fp8 case's context (equal references): its
  // own stored cache must still equal what was rebuilt and checked.
  {
    const fs::path edited = scratch_ / "doctored_cache.h5";
    fs::copy_file(file, edited, fs::copy_options::overwrite_existing);
    GoldenReader r(file.string());
    const PreparedCase pc = r.load_case(specs[2].id());
    Tensor data = pc.caches.at(16).data.tensor();
    const PagedCache& c = pc.caches.at(16);
    data.data<std::uint8_t>()[(c.num_blocks - 1) * c.block_size * c.entry_bytes + 3] ^= 0x10;  // a spare block
    replace_dataset(edited, case_path(specs[2].id()) + "/cache/bs16", "data", data);
    EXPECT_THROW(run(edited), GoldenFileError);
  }
}

TEST_F(H5Files, ReplayEqualsRunAndTheirResultsCompareIdentical) {
  auto backends = select_backends("cpu.paged,cpu.splitkv");
  const fs::path run_results = scratch_ / "run.h5", replay_results = scratch_ / "replay.h5";
  std::vector<Record> want, got;
  {
    RunConfig cfg = small_run_config(small_specs());
    GoldenRun g(GoldenRunOptions{"", "", {}, run_results.string(), kDefaultMaxBytes, "test", ""});
    g.attach(cfg);
    want = run_cases(cfg, backends);
    EXPECT_EQ(g.finish(), run_results.string());
  }
  {
    GoldenRun g(GoldenRunOptions{"", golden_, {}, replay_results.string(), kDefaultMaxBytes, "test", ""});
    RunConfig cfg = small_run_config(g.file_cases(""));
    g.attach(cfg);
    got = run_cases(cfg, backends);
    g.finish();
  }
  expect_same_records(got, want);

  FileCompareSummary sum;
  const std::string text = capture_compare(run_results, replay_results, {}, sum);
  EXPECT_FALSE(sum.failed({})) << text;
  EXPECT_EQ(sum.identical, want.size());  // records without outputs compare by status and count as identical
  EXPECT_EQ(sum.different, 0u);

  // Every record is in the results file, with its outputs.
  GoldenReader rr(run_results.string());
  EXPECT_EQ(rr.info().kind, FileKind::kResults);
  std::size_t stored = 0, with_outputs = 0;
  for (const std::string& id : rr.case_ids())
    for (const StoredResult& s : rr.load_results(id)) {
      ++stored;
      with_outputs += !s.outputs.empty();
    }
  EXPECT_EQ(stored, want.size());
  std::size_t ran = 0;
  for (const Record& r : want) ran += !r.metrics.empty();
  EXPECT_EQ(with_outputs, ran);
}

TEST_F(H5Files, ReplayWithoutTheBackendsBlockSizeIsSkippedNotRun) {
  ScratchDir d;
  const fs::path only16 = d / "bs16.h5";
  ExportOptions opt = small_export_options();
  opt.block_sizes = [](const CaseSpec&) { return std::vector<int>{16}; };
  export_golden(small_specs(), only16.string(), opt);
  auto backends = select_backends("cpu.splitkv");  // prefers block size 64
  GoldenRun g(GoldenRunOptions{"", only16.string(), {}, "", kDefaultMaxBytes, "test", ""});
  RunConfig cfg = small_run_config(g.file_cases(""));
  cfg.ops = {Op::kLayer};
  g.attach(cfg);
  for (const Record& r : run_cases(cfg, backends)) {
    if (r.status == Status::kNotSupported) continue;
    EXPECT_EQ(r.status, Status::kSkipped) << r.case_id;
    EXPECT_NE(r.message.find("no stored cache for block size 64"), std::string::npos) << r.message;
  }
}

// The published XXH64 vectors (seed 0 unless given): the empty input, the
// tails of 1 to 7 bytes, exactly 32 bytes and 31, and the four-lane path.
// A suite group's `ops` travel with the case: the file stores them and run
// --golden on the file's own cases runs each case in those ops alone, the
// records a run of the suite gives (it ran the file's cases in every op of
// the run before).
TEST(H5Ops, RunGoldenRunsACaseInTheOpsItsGroupNamed) {
  ScratchDir dir;
  const std::string path = (dir / "ops.h5").string();
  std::vector<CaseSpec> specs = small_specs();
  ASSERT_GE(specs.size(), 2u);
  specs[0].ops = {Op::kDecode};  // the first case in the decode op alone, the others in every op
  export_golden(specs, path, small_export_options());
  EXPECT_EQ(GoldenReader(path).header(specs[0].id()).spec.ops, std::vector<Op>{Op::kDecode});
  EXPECT_TRUE(GoldenReader(path).header(specs[1].id()).spec.ops.empty());

  auto backends = select_backends("cpu.paged");
  const std::vector<Record> want = run_cases(small_run_config(specs), backends);
  RunConfig cfg = small_run_config({});
  GoldenRun golden(GoldenRunOptions{path, "", {}, "", kDefaultMaxBytes, "test", ""});
  cfg.cases = golden.file_cases("");
  golden.attach(cfg);
  const std::vector<Record> got = run_cases(cfg, backends);
  expect_same_records(got, want);
  std::set<std::string> first_ops;
  for (const Record& r : got)
    if (r.case_id == specs[0].id()) first_ops.insert(r.op);
  EXPECT_EQ(first_ops, std::set<std::string>{"decode"});
}

TEST(ContentHashes, Xxh64MatchesThePublishedVectors) {
  auto x = [](std::string_view s, std::uint64_t seed = 0) { return xxh64(s.data(), s.size(), seed); };
  EXPECT_EQ(x(""), 0xEF46DB3751D8E999ull);
  EXPECT_EQ(x("a"), 0xD24EC4F1A98C6E5Bull);
  EXPECT_EQ(x("abc"), 0x44BC2CF5AD770999ull);
  EXPECT_EQ(x("Hello, world!"), 0xF58336A78B6F9476ull);
  EXPECT_EQ(x("1234567890123456789012345678901"), 0x8F367CB873A5376Eull);
  EXPECT_EQ(x("12345678901234567890123456789012"), 0x40FD1AA52D98274Cull);
  EXPECT_EQ(x("The quick brown fox jumps over the lazy dog"), 0x0B242D361FDA71BCull);
  EXPECT_EQ(x("abc", 5381), 0x19D1C1B5C673451Full);
  EXPECT_EQ(x("12345678901234567890123456789012", 5381), 0x38EA26E7C55F8095ull);
  // A ContentHash checks with the kind it was stored with.
  const std::string s = "mlagate";
  const ContentHash xh = ContentHash::of(ContentHash::Kind::kXxh64, s.data(), s.size());
  const ContentHash fh = ContentHash::of(ContentHash::Kind::kFnv1a64, s.data(), s.size());
  EXPECT_EQ(xh.value, xxh64(s.data(), s.size()));
  EXPECT_EQ(fh.value, fnv1a64(s.data(), s.size()));
  EXPECT_TRUE(xh.matches(s.data(), s.size()));
  EXPECT_FALSE(xh.matches(s.data(), s.size() - 1));
}

// run --golden checks regenerated inputs by the file's xxh64_<name> (files
// since XXH64 was stored) or, where a file has none, by its FNV hash_<name>:
// either mismatch stops the run naming the case and the tensor, in-process
// and through the binary, whose worker passes the error to the parent.
TEST_F(H5Files, RegeneratedInputMismatchNamesTheCaseAndTensor) {
  const std::string id = small_specs()[1].id();
  struct Variant {
    const char* name;
    std::function<void(const fs::path&)> edit;
    const char* kind;
  };
  const Variant variants[] = {
      {"xxh64", [&](const fs::path& f) { set_string_attr(f, case_path(id), "xxh64_kv_c", "0123456789abcdef"); }, "xxh64"},
      {"fnv1a64 (an older file)",
       [&](const fs::path& f) {
         for (const char* n : {"q", "kv_c", "k_pe", "W_UK", "W_UV"}) delete_attr(f, case_path(id), std::string("xxh64_") + n);
         set_string_attr(f, case_path(id), "hash_kv_c", "0123456789abcdef");
       },
       "fnv1a64"},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    const fs::path f = scratch_ / "edited.h5";
    fs::copy_file(golden_, f, fs::copy_options::overwrite_existing);
    v.edit(f);
    auto backends = select_backends("cpu.paged");
    RunConfig cfg = small_run_config(small_specs());
    GoldenRun g(GoldenRunOptions{f.string(), "", {}, "", kDefaultMaxBytes, "test", ""});
    g.attach(cfg);
    try {
      run_cases(cfg, backends);
      ADD_FAILURE() << "a regenerated input that differs from the file must stop the run";
    } catch (const GoldenFileError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("case " + id), std::string::npos) << m;
      EXPECT_NE(m.find("input kv_c (" + std::string(v.kind) + " "), std::string::npos) << m;
    }
    EXPECT_EQ(cli({"run", "--golden", f.string(), "--backend", "cpu.paged", "--no-progress", "--isolate", "none"}),
              kExitUsage);
    const BinaryRun r = run_binary({"run", "--golden", f.string(), "--backend", "cpu.paged", "--no-progress", "-q"},
                                   scratch_.path());
    EXPECT_EQ(r.rc, kExitUsage) << r.out << r.err;
    EXPECT_NE(r.err.find("mlagate: error: case " + id + ": regenerated input kv_c"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

TEST_F(H5Files, RunGoldenWithOtherCacheOptionsIsAClearError) {
  auto backends = select_backends("cpu.paged");
  RunConfig cfg = small_run_config(small_specs());
  cfg.exec.poison = Poison::kSentinel;
  GoldenRun g(GoldenRunOptions{golden_, "", {}, "", kDefaultMaxBytes, "test", ""});
  g.attach(cfg);
  try {
    run_cases(cfg, backends);
    FAIL() << "expected an error";
  } catch (const GoldenFileError& e) {
    EXPECT_NE(std::string(e.what()).find("--poison nan"), std::string::npos) << e.what();
  }
}

TEST_F(H5Files, RunGoldenOfACaseNotInTheFileIsAnInputError) {
  EXPECT_EQ(cli({"run", "--golden", golden_, "--spec", "small_prefill", "--tp", "16", "--no-progress"}), kExitUsage);
}

// A backend as a kernel developer's change would leave it: the same name, one
// element of its decode output doubled.
class Nudged : public Backend {
 public:
  explicit Nudged(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  std::string_view description() const override { return inner_->description(); }
  Capabilities capabilities() const override { return inner_->capabilities(); }
  Support supports(const CaseSpec& s, Op op) const override { return inner_->supports(s, op); }
  void decode(const DecodeArgs& a) override {
    inner_->decode(a);
    auto* o = a.o_lat.as<std::uint16_t>();
    o[0] = static_cast<std::uint16_t>(o[0] + 0x80);  // bf16 exponent + 1: the element doubles
  }
  void prefill(const PrefillArgs& a) override { inner_->prefill(a); }
  void cache_write(PagedCache& c, const TensorView& kv, const TensorView& pe, std::span<const std::int64_t> s) override {
    inner_->cache_write(c, kv, pe, s);
  }

 private:
  std::unique_ptr<Backend> inner_;
};

TEST_F(H5Files, CompareFindsAChangedKernelAndNamesIt) {
  const fs::path before = scratch_ / "before.h5", after = scratch_ / "after.h5";
  for (const fs::path& out : {before, after}) {
    auto backends = select_backends("cpu.paged,cpu.splitkv");
    if (out == after)
      for (auto& b : backends)
        if (b->name() == "cpu.splitkv") b = std::make_unique<Nudged>(std::move(b));
    GoldenRun g(GoldenRunOptions{"", golden_, {}, out.string(), kDefaultMaxBytes, "test", ""});
    RunConfig cfg = small_run_config(g.file_cases(""));
    cfg.ops = {Op::kLayer};
    g.attach(cfg);
    run_cases(cfg, backends);
    g.finish();
  }
  FileCompareSummary sum;
  const std::string text = capture_compare(before, after, {}, sum);
  EXPECT_TRUE(sum.failed({})) << text;
  EXPECT_EQ(sum.different, small_specs().size()) << text;  // cpu.splitkv on every case
  EXPECT_EQ(sum.identical, small_specs().size()) << text;  // cpu.paged untouched
  EXPECT_NE(text.find("DIFFERENT        cpu.splitkv  layer   " + small_specs()[0].id()), std::string::npos) << text;
  EXPECT_EQ(text.find("DIFFERENT        cpu.paged"), std::string::npos) << text;
  EXPECT_NE(text.find("out: "), std::string::npos) << text;
  EXPECT_EQ(cli({"compare", before.string(), after.string()}), kExitFailed);
  EXPECT_EQ(cli({"compare", before.string(), before.string()}), kExitPassed);
  // One latent element doubled moves the layer output by far less than 0.1.
  EXPECT_EQ(cli({"compare", before.string(), after.string(), "--atol", "0.1"}), kExitPassed);
}

TEST_F(H5Files, CompareReportsRecordsPresentInOneFileOnly) {
  const fs::path both = scratch_ / "both.h5", one = scratch_ / "one.h5";
  for (const auto& [out, globs] : {std::pair{both, "cpu.paged,cpu.splitkv"}, std::pair{one, "cpu.paged"}}) {
    auto backends = select_backends(globs);
    GoldenRun g(GoldenRunOptions{"", golden_, {}, out.string(), kDefaultMaxBytes, "test", ""});
    RunConfig cfg = small_run_config(g.file_cases("small_decode"));
    cfg.ops = {Op::kLayer};
    g.attach(cfg);
    run_cases(cfg, backends);
    g.finish();
  }
  FileCompareSummary sum;
  const std::string text = capture_compare(both, one, {}, sum);
  EXPECT_EQ(sum.only_a, 1u) << text;
  EXPECT_NE(text.find("ONLY_IN_A        cpu.splitkv"), std::string::npos) << text;
  EXPECT_EQ(cli({"compare", both.string(), one.string()}), kExitFailed);
  EXPECT_EQ(cli({"compare", both.string(), one.string(), "--ignore-missing"}), kExitPassed);
}

TEST(H5Atomic, KilledExportLeavesNoFileAndKeepsTheOldOne) {
  ScratchDir d;
  const fs::path target = d / "g.h5";
  ExportOptions opt = small_export_options();
  opt.after_case = [](std::size_t n, const std::string&) {
    if (n == 2) throw std::runtime_error("killed");
  };
  EXPECT_THROW(export_golden(small_specs(), target.string(), opt), std::runtime_error);
  EXPECT_TRUE(d.entries().empty()) << "a killed export must leave neither the file nor its temporary";

  write_bytes(target, "the previous golden file");
  EXPECT_THROW(export_golden(small_specs(), target.string(), opt), std::runtime_error);
  EXPECT_EQ(read_bytes(target), "the previous golden file");
  EXPECT_EQ(d.entries(), std::vector<std::string>{"g.h5"});

  // And a completed export replaces it whole.
  opt.after_case = nullptr;
  export_golden(small_specs(), target.string(), opt);
  EXPECT_EQ(GoldenReader(target.string()).case_ids().size(), small_specs().size());
  EXPECT_EQ(d.entries(), std::vector<std::string>{"g.h5"});
}

TEST(H5Atomic, ResultsWriterWithoutCommitLeavesNothing) {
  ScratchDir d;
  { ResultsWriter w((d / "r.h5").string(), "test"); }
  EXPECT_TRUE(d.entries().empty());
  EXPECT_THROW(ResultsWriter((d / "missing" / "r.h5").string(), "test"), GoldenFileError);
}

TEST(H5Cli, ExportRunReplayCompareExitCodes) {
  ScratchDir d;
  const std::string g = (d / "g.h5").string(), a = (d / "a.h5").string(), b = (d / "b.h5").string(),
                    c = (d / "c.h5").string();
  ASSERT_EQ(cli({"export", "--suite", "smoke", "--filter", "small_prefill/tp16/bf16/kv=auto/bs=auto/seed=0$|mixed_small/tp16",
                 "--out", g}),
            kExitPassed);
  EXPECT_EQ(GoldenReader(g).case_ids().size(), 2u);
  EXPECT_EQ(cli({"run", "--golden", g, "--no-progress", "-q", "--save-results", a}), kExitPassed);
  EXPECT_EQ(cli({"replay", g, "--no-progress", "-q", "--save-results", b}), kExitPassed);
  EXPECT_EQ(cli({"compare", a, b}), kExitPassed);
  // A different prefill chunking changes the prefill requests' numerics.
  EXPECT_EQ(cli({"replay", g, "--no-progress", "-q", "--prefill-chunk", "8", "--save-results", c}), kExitPassed);
  EXPECT_EQ(cli({"compare", a, c}), kExitFailed);
  EXPECT_EQ(cli({"compare", a, c, "--atol", "0.05"}), kExitPassed);
  // One case by id; a failing verdict still writes the results file.
  const std::string id = "smoke/mixed_small/tp16/bf16/kv=auto/bs=auto/seed=0";
  EXPECT_EQ(cli({"replay", g, "--case", id, "--backend", "cpu.paged", "--policy", "fixed", "--atol", "0", "--rtol", "0",
                 "--no-progress", "-q", "--save-results", c}),
            kExitFailed);
  GoldenReader rc(c);
  ASSERT_EQ(rc.case_ids(), std::vector<std::string>{id});
  EXPECT_EQ(rc.load_results(id).at(0).status, Status::kIncorrect);
  // Usage and input errors.
  EXPECT_EQ(cli({"replay", g, "--case", "no/such/case"}), kExitUsage);
  EXPECT_EQ(cli({"replay", a}), kExitUsage);                // a results file cannot be replayed
  EXPECT_EQ(cli({"compare", g, a}), kExitUsage);            // a golden file is not a results file
  EXPECT_EQ(cli({"run", "--golden", g, "--save-results", g}), kExitUsage);  // would replace its own input
  EXPECT_EQ(cli({"export", "--spec", "small_decode", "--out", (d / "missing" / "x.h5").string()}), kExitUsage);
  EXPECT_FALSE(fs::exists(d / "missing"));
  EXPECT_EQ(cli({"export", "--spec", "small_decode"}), kExitUsage);  // --out is required
  EXPECT_EQ(cli({"replay", (d / "nothing.h5").string()}), kExitUsage);
}


// A case id that is another's prefix ("…/cmp=4x64" and "…/cmp=4x64/sink", as
// the v4 suite has them), the longer written first: the shorter one's group
// is already there as a path, and it is still a case of its own, listed in
// /case_ids, so the file reads back (it was refused: "neither a case that
// /case_ids lists nor on the path to one").
TEST(H5NestedIds, WrittenLongestFirstTheyReadBack) {
  const std::string prefix = "v4/v4_decode/tp2/bf16/kv=fp8_v4/bs=auto/seed=0/dims=v4/win=128/cmp=4x64";
  std::vector<CaseSpec> pair;
  for (const CaseSpec& s : load_suite("v4").cases)
    if (s.id() == prefix || s.id() == prefix + "/sink") pair.push_back(s);
  ASSERT_EQ(pair.size(), 2u);
  std::sort(pair.begin(), pair.end(), [](const CaseSpec& a, const CaseSpec& b) { return a.id().size() > b.id().size(); });
  ScratchDir d;
  {
    ResultsWriter w((d / "r.h5").string(), "test");
    for (const CaseSpec& s : pair) w.add_case(s, nullptr, make_policy("fixed", 0.05, 0.01));
    w.commit();
  }
  GoldenReader results((d / "r.h5").string());
  EXPECT_EQ(results.case_ids(), (std::vector<std::string>{prefix + "/sink", prefix}));
  ExportOptions opt;
  opt.ops = {Op::kSparseDecode};
  opt.block_sizes = [](const CaseSpec&) { return std::vector<int>{64}; };
  export_golden(pair, (d / "g.h5").string(), opt);
  GoldenReader golden((d / "g.h5").string());
  EXPECT_EQ(golden.case_ids(), (std::vector<std::string>{prefix + "/sink", prefix}));
  EXPECT_TRUE(golden.has_case(prefix));
}

}  // namespace
}  // namespace mlagate
