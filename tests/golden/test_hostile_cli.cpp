// Hostile golden and results files as a user meets them, through the real
// mlagate binary (process isolation, workers spawned as in production) and
// in-process: every variant is an input error of the file, refused in the
// parent before any backend runs. Each must exit 2 with one message naming the
// file, the dataset and the bad value, and leave no record, report, journal or
// results file behind; never a CRASHED or NONFINITE record that blames the
// kernels. The hostile files are made here by editing a freshly exported one
// (dataset hashes recomputed, so the semantic check under test must catch it).
// Two exceptions, by design: run --golden does not read the bytes of stored
// inputs and cache data (it regenerates them and checks the stored hashes), so
// a corrupt chunk there is replay's to refuse (CorruptedDataChunk); and it
// checks those regenerated inputs and rebuilt caches where each case is made,
// in the worker, which hands the error to the parent (exit 2, one message;
// RunGoldenRebuiltCacheMismatchIsRefused).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>

#include "tests/golden/golden_test_util.h"

namespace mlagate {
namespace {

using namespace mlagate::testing;

class HostileCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir();
    good_ = *dir_ / "good.h5";
    export_small(good_);  // small_decode, mixed_small/tp16, edge_padding; bs 16 and 64; layer + decode references
    GoldenReader r(good_.string());
    originals_ = new std::map<std::string, PreparedCase>();
    for (const std::string& id : r.case_ids()) {
      originals_->emplace(id, r.load_case(id));
      if (id.find("small_decode") != std::string::npos) decode_id_ = id;
      if (id.find("edge_padding") != std::string::npos) padding_id_ = id;
    }
  }
  static void TearDownTestSuite() {
    delete originals_;
    delete dir_;
  }

  static const PreparedCase& original(const std::string& id) { return originals_->at(id); }
  static std::string group(const std::string& id, const std::string& sub = "") {
    return case_path(id) + (sub.empty() ? "" : "/" + sub);
  }
  fs::path copy(const std::string& name) {
    const fs::path p = scratch_ / name;
    fs::copy_file(good_, p, fs::copy_options::overwrite_existing);
    return p;
  }

  // The file must be refused by run --golden and by replay, with the binary
  // (workers as in production) and in-process, before anything runs.
  void expect_refused(const fs::path& file, const std::vector<std::string>& words,
                      const std::vector<std::string>& narrowing = {}) {
    const std::string f = file.string();
    const fs::path json = scratch_ / "report.json", results = scratch_ / "results.h5";
    const std::vector<std::vector<std::string>> commands = {
        {"run", "--golden", f, "--backend", "cpu.*", "--op", "layer,decode", "--no-progress", "--json", json.string()},
        {"replay", f, "--backend", "cpu.*", "--op", "layer,decode", "--no-progress", "--json", json.string()},
    };
    for (std::vector<std::string> cmd : commands) {
      cmd.insert(cmd.end(), narrowing.begin(), narrowing.end());
      const std::string what = cmd[0] + " " + file.filename().string();
      const BinaryRun r = run_binary(cmd, scratch_.path());
      EXPECT_EQ(r.rc, kExitUsage) << what << "\nstdout: " << r.out << "\nstderr: " << r.err;
      // One message: the file, the dataset and the value.
      EXPECT_EQ(r.err.rfind("mlagate: error: ", 0), 0u) << what << ": " << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << what << ": " << r.err;
      EXPECT_NE(r.err.find(f), std::string::npos) << what << ": the message does not name the file: " << r.err;
      for (const std::string& w : words)
        EXPECT_NE(r.err.find(w), std::string::npos) << what << ": expected '" << w << "' in: " << r.err;
      // No records: nothing on stdout (no CRASHED lines, no summary), no report, no journal.
      EXPECT_EQ(r.out, "") << what;
      EXPECT_FALSE(fs::exists(json)) << what;
      EXPECT_FALSE(fs::exists(json.string() + ".journal.jsonl")) << what;
    }
    // In-process with --save-results (isolation none): no results file, no temporary file.
    const auto before = scratch_.entries();
    std::vector<std::string> cmd = {"replay", f, "--backend", "cpu.paged", "--no-progress", "-q", "--save-results",
                                    results.string()};
    cmd.insert(cmd.end(), narrowing.begin(), narrowing.end());
    EXPECT_EQ(cli(cmd), kExitUsage) << "in-process replay " << file.filename();
    EXPECT_FALSE(fs::exists(results));
    EXPECT_EQ(scratch_.entries(), before) << "files left behind";
  }

  ScratchDir scratch_;
  static ScratchDir* dir_;
  static fs::path good_;
  static std::map<std::string, PreparedCase>* originals_;
  static std::string decode_id_, padding_id_;
};
ScratchDir* HostileCli::dir_ = nullptr;
fs::path HostileCli::good_;
std::map<std::string, PreparedCase>* HostileCli::originals_ = nullptr;
std::string HostileCli::decode_id_, HostileCli::padding_id_;

TEST_F(HostileCli, TheGoodFilePasses) {
  const BinaryRun r = run_binary({"run", "--golden", good_.string(), "--backend", "cpu.paged", "--no-progress", "-q"}, scratch_.path());
  EXPECT_EQ(r.rc, kExitPassed) << r.out << r.err;
  const BinaryRun p = run_binary({"replay", good_.string(), "--backend", "cpu.paged", "--no-progress", "-q"}, scratch_.path());
  EXPECT_EQ(p.rc, kExitPassed) << p.out << p.err;
}

// Block ids past the end, negative, the null block and the invalid filler id:
// each would make a backend read outside the cache.
TEST_F(HostileCli, BlockIdsOutOfRange) {
  const PagedCache& c = original(decode_id_).caches.at(16);
  for (std::int32_t bad : {c.num_blocks, -3, 0, kPoisonBlockId}) {
    Tensor bt = c.block_table;
    bt.data<std::int32_t>()[0] = bad;
    const fs::path p = copy("block_id_" + std::to_string(bad) + ".h5");
    replace_dataset(p, group(decode_id_, "cache/bs16"), "block_table", bt);
    expect_refused(p, {group(decode_id_, "cache/bs16") + ": block_table[0, 0]: block id " + std::to_string(bad) +
                       " is out of range [1, " + std::to_string(c.num_blocks) + ")"});
  }
}

TEST_F(HostileCli, SlotOutOfRange) {
  Tensor sm = original(decode_id_).caches.at(16).slot_mapping;
  sm.data<std::int64_t>()[1] = std::int64_t{1} << 40;
  const fs::path p = copy("slot.h5");
  replace_dataset(p, group(decode_id_, "cache/bs16"), "slot_mapping", sm);
  expect_refused(p, {group(decode_id_, "cache/bs16") + ": slot_mapping[1] = 1099511627776, but the block table gives"});
}

TEST_F(HostileCli, WrongShapeStoredReference) {
  const PreparedCase& o = original(decode_id_);
  const std::int64_t T = o.c.spec.num_tokens();
  fs::path p = copy("ref_shape.h5");
  replace_dataset(p, group(decode_id_, "golden"), "out", Tensor(DType::kF64, {T, 1}));
  expect_refused(p, {group(decode_id_, "golden/out") + ": shape [" + std::to_string(T) + ", 1] disagrees"});
  p = copy("decode_ref_shape.h5");
  replace_dataset(p, group(decode_id_, "decode"), "lse", Tensor(DType::kF64, {T + 1, 8}));
  expect_refused(p, {group(decode_id_, "decode/lse") + ": shape [" + std::to_string(T + 1) + ", 8] disagrees"});
}

// run --golden regenerates q and used to pass without reading the stored one.
TEST_F(HostileCli, WrongShapeStoredInputs) {
  const Case& c = original(decode_id_).c;
  Shape s = c.q.shape();
  s[0] += 1;
  fs::path p = copy("q_shape.h5");
  replace_dataset(p, group(decode_id_, "inputs"), "q", Tensor(c.q.dtype(), s));
  expect_refused(p, {group(decode_id_, "inputs/q") + ": shape " + shape_str(s) + " disagrees with the case's attributes"});
  Shape k = c.k_pe.shape();
  k[1] -= 1;
  p = copy("k_pe_shape.h5");
  replace_dataset(p, group(decode_id_, "inputs"), "k_pe", Tensor(c.k_pe.dtype(), k));
  expect_refused(p, {group(decode_id_, "inputs/k_pe") + ": shape " + shape_str(k)});
}

TEST_F(HostileCli, WrongEntrySize) {
  const fs::path p = copy("entry.h5");
  set_int_attr(p, group(decode_id_, "cache/bs16"), "entry_bytes", 64);
  expect_refused(p, {group(decode_id_, "cache/bs16") + ": entry_bytes 64, but this case's cache format has 1152"});
}

TEST_F(HostileCli, UnsupportedFilter) {
  const PreparedCase& o = original(decode_id_);
  const fs::path p = copy("lzf.h5");
  replace_dataset_filtered(p, group(decode_id_, "golden"), "out",
                           doubles(o.reference->out, {o.c.spec.num_tokens(), o.c.spec.num_heads() * o.c.spec.dims.v_head_dim}),
                           32000);
  expect_refused(p, {group(decode_id_, "golden/out") + ": filter 32000 (lzf) is not one of deflate, shuffle, fletcher32"});
}

// A flipped byte inside a compressed, fletcher32-checked chunk of cache data.
TEST_F(HostileCli, CorruptedDataChunk) {
  const fs::path p = copy("chunk.h5");
  const std::string ds = group(decode_id_, "cache/bs16/data");
  const auto chunks = chunk_ranges(p, ds);
  ASSERT_FALSE(chunks.empty()) << ds << " is not chunked";
  std::string bytes = read_bytes(p);
  const std::uint64_t off = chunks[0].first + chunks[0].second / 2;
  bytes[off] = static_cast<char>(bytes[off] ^ 0x20);
  write_bytes(p, bytes);
  // replay reads the stored cache: refused. run --golden never reads the
  // stored cache's bytes (it rebuilds the cache and checks it against the
  // stored hashes, which are intact), so it runs against the intact references.
  const std::string f = p.string();
  const BinaryRun r = run_binary({"replay", f, "--backend", "cpu.paged", "--no-progress", "-q"}, scratch_.path());
  EXPECT_EQ(r.rc, kExitUsage) << r.out << r.err;
  EXPECT_NE(r.err.find(ds), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  const BinaryRun g = run_binary({"run", "--golden", f, "--backend", "cpu.paged", "--no-progress", "-q"}, scratch_.path());
  EXPECT_EQ(g.rc, kExitPassed) << g.out << g.err;
}

// A NaN or an infinity stored in a reference made every backend NONFINITE.
TEST_F(HostileCli, NonFiniteReferences) {
  const PreparedCase& o = original(decode_id_);
  const CaseSpec& s = o.c.spec;
  const std::int64_t T = s.num_tokens(), N = s.num_heads();
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  struct Edit {
    std::string sub, name;
    std::vector<double> values;
    Shape shape;
    std::size_t at;
    double value;
    std::string words;
  };
  const std::vector<Edit> edits = {
      {"golden", "out", o.reference->out, {T, N * s.dims.v_head_dim}, 5, nan,
       "golden/out: element 5 (request 0, token 0, head 0, dim 5) is nan: a stored reference must be finite"},
      {"golden", "out", o.reference->out, {T, N * s.dims.v_head_dim}, 7, inf,
       "golden/out: element 7 (request 0, token 0, head 0, dim 7) is inf"},
      {"golden", "lse", o.reference->lse, {T, N}, 3, nan, "golden/lse: element 3 (request 0, token 0, head 3"},
      {"golden", "lse", o.reference->lse, {T, N}, 0, -inf, "golden/lse: element 0 (request 0, token 0, head 0"},
      {"decode", "o_lat", o.decode->o_lat, {T, N, s.dims.kv_lora_rank}, 2, nan,
       "decode/o_lat: element 2 (request 0, token 0, head 0, dim 2) is nan"},
  };
  int k = 0;
  for (const Edit& e : edits) {
    std::vector<double> v = e.values;
    v.at(e.at) = e.value;
    const fs::path p = copy("nonfinite_" + std::to_string(k++) + ".h5");
    replace_dataset(p, group(decode_id_, e.sub), e.name, doubles(v, e.shape));
    expect_refused(p, {group(decode_id_, "") + "/" + e.words});
  }
}

// The lse of a row that sees no key (a seq_len-0 padding request) is -inf;
// any other value there is corrupt too.
TEST_F(HostileCli, EmptyRowLseMustBeMinusInfinity) {
  const PreparedCase& o = original(padding_id_);
  const CaseSpec& s = o.c.spec;
  ASSERT_EQ(s.batch.seq_lens.at(1), 0);
  const std::int64_t T = s.num_tokens(), N = s.num_heads();
  const std::size_t row1 = static_cast<std::size_t>(N);  // request 1 is token 1
  ASSERT_EQ(o.reference->lse.at(row1), -std::numeric_limits<double>::infinity());
  std::vector<double> lse = o.reference->lse;
  lse[row1 + 2] = 0.0;
  fs::path p = copy("empty_row.h5");
  replace_dataset(p, group(padding_id_, "golden"), "lse", doubles(lse, {T, N}));
  expect_refused(p, {group(padding_id_, "golden/lse") + ": element " + std::to_string(row1 + 2) +
                     " (request 1, token 0, head 2, dim 0) is 0 for a row that sees no key"});
  std::vector<double> dl = o.decode->lse;
  dl[row1] = std::numeric_limits<double>::quiet_NaN();
  p = copy("empty_row_decode.h5");
  replace_dataset(p, group(padding_id_, "decode"), "lse", doubles(dl, {T, N}));
  expect_refused(p, {group(padding_id_, "decode/lse") + ": element " + std::to_string(row1) +
                     " (request 1, token 0, head 0, dim 0) is nan"});
}

// A stored err_baseline part must be an error (finite, >= 0) or NaN (not
// stored): an infinite one would pass every backend under the baseline policy.
TEST_F(HostileCli, StoredErrBaselineMustBeAnError) {
  const std::int64_t B = original(decode_id_).c.num_requests;
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> v(static_cast<std::size_t>(2 * B), 1e-3);
  v[1] = -1e-3;
  fs::path p = copy("baseline_negative.h5");
  replace_dataset(p, group(decode_id_, "err_baseline"), "layer_out", doubles(v, {2, B}));
  expect_refused(p, {group(decode_id_, "err_baseline/layer_out") + ": an err_baseline value is negative or infinite"});
  p = copy("baseline_inf.h5");
  replace_dataset(p, group(decode_id_, "err_baseline"), "decode_op", doubles({1e-3, inf}, {2}));
  expect_refused(p, {group(decode_id_, "err_baseline/decode_op") + ": an err_baseline value is negative or infinite"});
  p = copy("baseline_shape.h5");
  replace_dataset(p, group(decode_id_, "err_baseline"), "layer_lse", doubles(v, {B, 2}));
  expect_refused(p, {group(decode_id_, "err_baseline/layer_lse")});
}

// Every case and every cache the file holds is validated, whichever the
// command selects: a bad bs=64 cache (cpu.paged runs bs=16) of a case the
// filter leaves out still refuses the file.
TEST_F(HostileCli, CasesAndCachesTheCommandDoesNotUseAreValidatedToo) {
  const PagedCache& c = original(decode_id_).caches.at(64);
  Tensor bt = c.block_table;
  bt.data<std::int32_t>()[0] = c.num_blocks + 1000;
  const fs::path p = copy("unused.h5");
  replace_dataset(p, group(decode_id_, "cache/bs64"), "block_table", bt);
  expect_refused(p, {group(decode_id_, "cache/bs64") + ": block_table[0, 0]: block id " + std::to_string(c.num_blocks + 1000)},
                 {"--filter", "edge_padding"});
}

// A case group that /case_ids does not list would be silently skipped.
TEST_F(HostileCli, CaseGroupsTheCaseListDoesNotName) {
  std::string hidden = decode_id_;
  hidden.replace(hidden.find("seed=0"), 6, "seed=9");
  const fs::path p = copy("unlisted.h5");
  copy_group(p, case_path(decode_id_), case_path(hidden));
  expect_refused(p, {case_path(hidden) + ": '" + hidden + "' is neither a case that /case_ids lists nor on the path to one"});
}

// run --golden with a selection naming a case the file lacks, and with other
// poison options than the file's caches: refused in the parent, not in workers.
TEST_F(HostileCli, RunGoldenSelectionMismatchIsRefusedBeforeWorkers) {
  BinaryRun r = run_binary({"run", "--golden", good_.string(), "--spec", "small_prefill", "--tp", "16", "--no-progress"}, scratch_.path());
  EXPECT_EQ(r.rc, kExitUsage) << r.out << r.err;
  EXPECT_NE(r.err.find("no case 'sweep/small_prefill/tp16"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  r = run_binary({"run", "--golden", good_.string(), "--poison", "zero", "--no-progress"}, scratch_.path());
  EXPECT_EQ(r.rc, kExitUsage) << r.out << r.err;
  EXPECT_NE(r.err.find("cache was built with --poison nan"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

// A stored cache whose bytes are self-consistent (dataset hash recomputed) but
// not what this build makes: replay runs the stored bytes and may pass, run
// --golden rebuilds the cache and must refuse the file: its worker finds the
// mismatch as it makes the case and the parent exits 2 with that message
// (here the first case, so before any record).
TEST_F(HostileCli, RunGoldenRebuiltCacheMismatchIsRefused) {
  const PagedCache& c = original(decode_id_).caches.at(16);
  Tensor data = c.data.tensor();
  const std::int64_t last_block = c.num_blocks - 1;  // a spare block: no backend reads it
  data.data<std::uint8_t>()[last_block * c.block_size * c.entry_bytes + 3] ^= 0x10;
  const fs::path p = copy("spare.h5");
  replace_dataset(p, group(decode_id_, "cache/bs16"), "data", data);
  const BinaryRun r = run_binary({"run", "--golden", p.string(), "--backend", "cpu.paged", "--no-progress"}, scratch_.path());
  EXPECT_EQ(r.rc, kExitUsage) << r.out << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("mlagate: error: case " + decode_id_ + ": rebuilt cache bs=16 data (xxh64 "), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(p.string()), std::string::npos) << r.err;
  EXPECT_EQ(run_binary({"replay", p.string(), "--backend", "cpu.paged", "--no-progress", "-q"}, scratch_.path()).rc,
            kExitPassed);
}

// Results files: records of a case the case list does not name, and a record
// whose output disagrees with its case, are a bad file (exit 2) before compare
// prints a line.
TEST_F(HostileCli, CompareRefusesResultsFilesThatDisagreeWithTheirCaseList) {
  const fs::path a = scratch_ / "a.h5";
  ASSERT_EQ(cli({"replay", good_.string(), "--backend", "cpu.paged", "-q", "--no-progress", "--save-results", a.string()}),
            kExitPassed);
  std::string hidden = decode_id_;
  hidden.replace(hidden.find("seed=0"), 6, "seed=9");
  const fs::path b = scratch_ / "b.h5";
  fs::copy_file(a, b);
  copy_group(b, case_path(decode_id_), case_path(hidden));
  BinaryRun r = run_binary({"compare", a.string(), b.string()}, scratch_.path());
  EXPECT_EQ(r.rc, kExitUsage) << r.out << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find(b.string() + ":" + case_path(hidden) + ": '" + hidden + "' is neither a case that /case_ids lists"),
            std::string::npos)
      << r.err;
  // A wrong-shape output in the last case: refused before the first case's line.
  const std::string last = GoldenReader(a.string()).case_ids().back();
  fs::copy_file(a, b, fs::copy_options::overwrite_existing);
  replace_dataset(b, group(last, "results/cpu.paged/layer"), "out", Tensor(DType::kBF16, {1, 3}));
  r = run_binary({"compare", a.string(), b.string(), "-v"}, scratch_.path());
  EXPECT_EQ(r.rc, kExitUsage) << r.out << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find(group(last, "results/cpu.paged/layer/out") + ": shape [1, 3] disagrees"), std::string::npos) << r.err;
  EXPECT_EQ(run_binary({"compare", a.string(), a.string()}, scratch_.path()).rc, kExitPassed);
}

}  // namespace
}  // namespace mlagate
