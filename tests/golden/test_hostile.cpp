// Hostile and corrupt golden files: truncated, bit-flipped, a wrong schema
// version, and consistent-looking files with hostile values (block ids out of
// range, negative lengths, absurd dims, shapes that disagree with the
// attributes, links and external storage). Each gives GoldenFileError with a
// clear message (exit 2 from the CLI), never a crash or an out-of-bounds read;
// this binary also runs under AddressSanitizer (the asan preset).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include "tests/golden/golden_test_util.h"

namespace mlagate {
namespace {

using namespace mlagate::testing;

class H5Hostile : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir();
    good_ = *dir_ / "one.h5";
    std::vector<CaseSpec> specs;
    for (const CaseSpec& s : small_specs())
      if (s.batch.name == "small_decode") specs.push_back(s);
    ExportOptions opt = small_export_options();
    opt.block_sizes = [](const CaseSpec&) { return std::vector<int>{16}; };
    export_golden(specs, good_.string(), opt);
    id_ = specs.at(0).id();
    GoldenReader r(good_.string());
    original_ = new PreparedCase(r.load_case(id_));
  }
  static void TearDownTestSuite() {
    delete original_;
    delete dir_;
  }

  // A copy of the good file to edit.
  fs::path copy(const std::string& name = "edited.h5") {
    const fs::path p = scratch_ / name;
    fs::copy_file(good_, p, fs::copy_options::overwrite_existing);
    return p;
  }
  static std::string group(const std::string& sub = "") { return case_path(id_) + (sub.empty() ? "" : "/" + sub); }

  // Opens and fully loads a file: "" when it loads, else the GoldenFileError
  // message. Anything else thrown is a test failure.
  static std::string load_error(const fs::path& f, std::uint64_t max_bytes = kDefaultMaxBytes) {
    try {
      GoldenReader r(f.string(), max_bytes);
      for (const std::string& id : r.case_ids()) r.load_case(id);
      return "";
    } catch (const GoldenFileError& e) {
      return e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a GoldenFileError: " << e.what();
      return "?";
    }
  }
  static void expect_rejected(const fs::path& f, const std::string& words, std::uint64_t max_bytes = kDefaultMaxBytes) {
    const std::string m = load_error(f, max_bytes);
    EXPECT_NE(m.find(words), std::string::npos) << "expected an error mentioning '" << words << "', got: '" << m << "'";
  }

  ScratchDir scratch_;
  static ScratchDir* dir_;
  static fs::path good_;
  static std::string id_;
  static PreparedCase* original_;
};
ScratchDir* H5Hostile::dir_ = nullptr;
fs::path H5Hostile::good_;
std::string H5Hostile::id_;
PreparedCase* H5Hostile::original_ = nullptr;

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0;
}
bool same_bytes(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}
bool same_case(const PreparedCase& a, const PreparedCase& b) {
  if (a.c.spec.id() != b.c.spec.id() || !same_bytes(a.c.q, b.c.q) || !same_bytes(a.c.kv_c, b.c.kv_c) ||
      !same_bytes(a.c.k_pe, b.c.k_pe) || !same_bytes(a.c.w_uk, b.c.w_uk) || !same_bytes(a.c.w_uv, b.c.w_uv))
    return false;
  if (!same_bytes(a.reference->out, b.reference->out) || !same_bytes(a.reference->lse, b.reference->lse)) return false;
  if (a.decode.has_value() != b.decode.has_value()) return false;
  if (a.decode && (!same_bytes(a.decode->q_lat, b.decode->q_lat) || !same_bytes(a.decode->o_lat, b.decode->o_lat)))
    return false;
  if (a.caches.size() != b.caches.size()) return false;
  for (const auto& [bs, c] : a.caches) {
    const auto it = b.caches.find(bs);
    if (it == b.caches.end() || !same_bytes(c.data.tensor(), it->second.data.tensor()) || !same_bytes(c.block_table, it->second.block_table) ||
        !same_bytes(c.slot_mapping, it->second.slot_mapping) || c.num_blocks != it->second.num_blocks)
      return false;
  }
  return true;
}

TEST_F(H5Hostile, TheGoodFileLoads) { EXPECT_EQ(load_error(good_), ""); }

TEST_F(H5Hostile, TruncatedFilesAreRejected) {
  const std::string bytes = read_bytes(good_);
  const std::size_t n = bytes.size();
  for (std::size_t cut : {std::size_t{0}, std::size_t{7}, std::size_t{8}, std::size_t{100}, std::size_t{512},
                          std::size_t{4096}, n / 4, n / 2, n - 4096, n - 1}) {
    const fs::path p = scratch_ / "cut.h5";
    write_bytes(p, bytes.substr(0, cut));
    EXPECT_NE(load_error(p), "") << "cut at " << cut;
  }
  write_bytes(scratch_ / "cut.h5", bytes.substr(0, n / 2));
  EXPECT_EQ(cli({"replay", (scratch_ / "cut.h5").string(), "--no-progress"}), kExitUsage);
  EXPECT_EQ(cli({"run", "--golden", (scratch_ / "cut.h5").string(), "--no-progress"}), kExitUsage);
}

// Each flip either is caught (GoldenFileError) or hit bytes nothing reads
// (free space, padding): then everything loads bit-identical to the original.
TEST_F(H5Hostile, RandomByteFlipsAreCaughtOrHarmless) {
  const std::string bytes = read_bytes(good_);
  const auto meta = metadata_ranges(good_);
  std::uint64_t meta_bytes = 0;
  for (const auto& [a, b] : meta) meta_bytes += b - a;
  ASSERT_GT(meta_bytes, 0u);
  int seeds = 240;
  if (const char* env = std::getenv("MLAGATE_FLIP_SEEDS")) seeds = std::atoi(env);
  int caught = 0, harmless = 0;
  const fs::path p = scratch_ / "flip.h5";
  for (int seed = 0; seed < seeds; ++seed) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed));
    std::uint64_t off;
    if (seed % 4 != 0) {  // three in four flips hit metadata: that is where a parser can go wrong
      std::uint64_t k = rng() % meta_bytes;
      std::size_t r = 0;
      while (k >= meta[r].second - meta[r].first) k -= meta[r].second - meta[r].first, ++r;
      off = meta[r].first + k;
    } else {
      off = rng() % bytes.size();
    }
    std::string flipped = bytes;
    flipped[off] = static_cast<char>(flipped[off] ^ (1 << (rng() % 8)));
    write_bytes(p, flipped);
    try {
      GoldenReader r(p.string());
      ASSERT_EQ(r.case_ids(), std::vector<std::string>{id_}) << "seed " << seed << " offset " << off;
      const PreparedCase got = r.load_case(id_);
      EXPECT_TRUE(same_case(got, *original_)) << "seed " << seed << " offset " << off << ": loaded, but not the original";
      ++harmless;
    } catch (const GoldenFileError&) {
      ++caught;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "seed " << seed << " offset " << off << ": not a GoldenFileError: " << e.what();
    }
    if (seed % 40 == 1) {
      const int rc = cli({"replay", p.string(), "--backend", "cpu.paged", "-q", "--no-progress"});
      EXPECT_TRUE(rc == kExitPassed || rc == kExitUsage) << "seed " << seed << " rc " << rc;
    }
  }
  EXPECT_GT(caught, seeds / 2) << caught << " caught, " << harmless << " harmless";
  RecordProperty("caught", caught);
  RecordProperty("harmless", harmless);
}

TEST_F(H5Hostile, WrongSchemaVersionOrName) {
  fs::path p = copy();
  set_int_attr(p, "/", "schema_version", 2);
  expect_rejected(p, "schema version 2 is not supported (this mlagate reads 1)");
  EXPECT_EQ(cli({"replay", p.string()}), kExitUsage);
  p = copy();
  set_string_attr(p, "/", "schema", "someone.else");
  expect_rejected(p, "not an mlagate golden or results file");
  p = copy();
  set_int_attr(p, group(), "schema_version", 3);
  expect_rejected(p, "'schema_version' = 3 is outside [1, 1]");
  p = copy();
  set_string_attr(p, "/", "file_kind", "recipe");
  expect_rejected(p, "file_kind 'recipe'");
}

TEST_F(H5Hostile, BlockIdOutOfRange) {
  const PagedCache& c = original_->caches.at(16);
  for (std::int32_t bad : {c.num_blocks, c.num_blocks + 7, -3, kPoisonBlockId}) {
    Tensor bt = c.block_table;
    bt.data<std::int32_t>()[0] = bad;
    const fs::path p = copy();
    replace_dataset(p, group("cache/bs16"), "block_table", bt);
    expect_rejected(p, "block_table[0, 0]: block id " + std::to_string(bad) + " is out of range [1, " +
                           std::to_string(c.num_blocks) + ")");
  }
  const fs::path p = copy();
  Tensor bt = c.block_table;
  bt.data<std::int32_t>()[1] = bt.data<std::int32_t>()[0];  // request 0 holds 2 blocks at bs 16
  replace_dataset(p, group("cache/bs16"), "block_table", bt);
  expect_rejected(p, "is used twice");
  EXPECT_EQ(cli({"replay", p.string()}), kExitUsage);
  // The unused tail must hold the recorded filler.
  Tensor tail = c.block_table;
  tail.data<std::int32_t>()[c.table_width - 1] = 5;
  const fs::path q = copy("tail.h5");
  replace_dataset(q, group("cache/bs16"), "block_table", tail);
  expect_rejected(q, "past the request's blocks, expected 0");
}

TEST_F(H5Hostile, SlotMappingOutOfRange) {
  const PagedCache& c = original_->caches.at(16);
  for (std::int64_t bad : {std::int64_t{1} << 40, std::int64_t{-7}, std::int64_t{0}}) {
    Tensor sm = c.slot_mapping;
    sm.data<std::int64_t>()[1] = bad;
    const fs::path p = copy();
    replace_dataset(p, group("cache/bs16"), "slot_mapping", sm);
    expect_rejected(p, "slot_mapping[1] = " + std::to_string(bad) + ", but the block table gives");
  }
}

TEST_F(H5Hostile, NegativeOrInconsistentLengths) {
  auto lens = [](std::vector<std::int32_t> v) {
    Tensor t(DType::kI32, {static_cast<std::int64_t>(v.size())});
    std::memcpy(t.bytes(), v.data(), t.nbytes());
    return t;
  };
  fs::path p = copy();
  replace_dataset(p, group(), "seq_lens", lens({-5, 40}));
  expect_rejected(p, "negative seq_len -5");
  EXPECT_EQ(cli({"replay", p.string()}), kExitUsage);
  p = copy();
  replace_dataset(p, group(), "query_lens", lens({0, 1}));
  expect_rejected(p, "query_len 0 < 1");
  p = copy();
  replace_dataset(p, group(), "query_lens", lens({33, 1}));
  expect_rejected(p, "query_len 33 > seq_len 32");
  p = copy();
  replace_dataset(p, group(), "seq_lens", lens({32, 40, 8}));
  expect_rejected(p, "seq_lens: shape [3] disagrees with the case's attributes, which give [2]");
  p = copy();
  replace_dataset(p, group(), "query_start_loc", lens({0, 2, 2}));
  expect_rejected(p, "query_start_loc is not the prefix sum");
  p = copy();
  set_int_attr(p, group(), "num_tokens", 3);
  expect_rejected(p, "num_tokens disagrees");
  p = copy();
  replace_dataset(p, group(), "seq_lens", lens({2'000'000'000, 2'000'000'000}));
  expect_rejected(p, "total tokens exceed the int range");
}

TEST_F(H5Hostile, AbsurdDims) {
  fs::path p = copy();
  set_int_attr(p, group(), "kv_lora_rank", std::int64_t{1} << 30);
  expect_rejected(p, "dims out of range: L=1073741824");
  p = copy();
  set_int_attr(p, group(), "tp", 0);
  expect_rejected(p, "heads and tp must be positive");
  p = copy();
  set_int_attr(p, group(), "total_heads", std::int64_t{1} << 30);
  set_int_attr(p, group(), "tp", 1);
  expect_rejected(p, "case too large");
  p = copy();
  set_int_attr(p, group(), "num_requests", std::int64_t{1} << 40);
  expect_rejected(p, "'num_requests' = 1099511627776 is outside");
  p = copy();
  set_int_attr(p, group(), "tp", std::int64_t{1} << 40);
  expect_rejected(p, "'tp' = 1099511627776 is outside");
  p = copy();
  set_int_attr(p, group("cache/bs16"), "num_blocks", std::int64_t{1} << 31);
  expect_rejected(p, "'num_blocks' = 2147483648 is outside");
  p = copy();
  set_int_attr(p, group("cache/bs16"), "entry_bytes", 64);
  expect_rejected(p, "entry_bytes 64, but this case's cache format has 1152");
  EXPECT_EQ(cli({"replay", p.string()}), kExitUsage);
}

TEST_F(H5Hostile, DatasetShapeOrTypeDisagreesWithAttributes) {
  const Case& c = original_->c;
  Shape s = c.q.shape();
  s[0] += 1;
  fs::path p = copy();
  replace_dataset(p, group("inputs"), "q", Tensor(c.q.dtype(), s));
  expect_rejected(p, "inputs/q: shape [3, 8, 192] disagrees with the case's attributes, which give [2, 8, 192]");
  EXPECT_EQ(cli({"replay", p.string()}), kExitUsage);
  p = copy();
  replace_dataset(p, group("inputs"), "kv_c", Tensor(DType::kF32, c.kv_c.shape()));
  expect_rejected(p, "inputs/kv_c: stored as float32, expected uint16 (bfloat16)");
  p = copy();
  replace_dataset(p, group("golden"), "out", Tensor(DType::kF64, {2, 1}));
  expect_rejected(p, "golden/out: shape [2, 1] disagrees");
  p = copy();
  Shape ds = original_->caches.at(16).data.shape();
  ds[2] -= 2;
  replace_dataset(p, group("cache/bs16"), "data", Tensor(DType::kU8, ds));
  expect_rejected(p, "cache/bs16/data: shape");
  p = copy();
  set_string_attr(p, group("inputs/q"), "dtype", "float16");
  expect_rejected(p, "dtype attribute 'float16', expected 'bfloat16'");
  p = copy();
  Tensor q = c.q;
  q.data<std::uint16_t>()[0] ^= 1;  // consistent dataset hash, but not the case's hash_q
  replace_dataset(p, group("inputs"), "q", q);
  expect_rejected(p, "content differs from the case's hash_q");
  p = copy();
  set_string_attr(p, group("inputs/k_pe"), "xxh64", "00000000deadbeef");
  expect_rejected(p, "content hash xxh64 ");
  // Without xxh64 (an older file) the fnv1a64 attribute is the one checked.
  p = copy();
  delete_attr(p, group("inputs/k_pe"), "xxh64");
  set_string_attr(p, group("inputs/k_pe"), "fnv1a64", "00000000deadbeef");
  expect_rejected(p, "content hash fnv1a64 ");
  // Where xxh64 is checked, fnv1a64 must still be a hash (FNV-only readers).
  p = copy();
  set_string_attr(p, group("inputs/k_pe"), "fnv1a64", "deadbeef");
  expect_rejected(p, "attribute 'fnv1a64' is not a 16-digit hex hash");
}

TEST_F(H5Hostile, MissingOrMistypedAttributes) {
  fs::path p = copy();
  delete_attr(p, group(), "tp");
  expect_rejected(p, "missing attribute 'tp'");
  p = copy();
  set_string_attr(p, group(), "tp", "eight");
  expect_rejected(p, "attribute 'tp' has the wrong type");
  p = copy();
  set_vlen_string_attr(p, group(), "suite", "smoke");
  expect_rejected(p, "variable-length string");
  p = copy();
  set_string_attr(p, group(), "dtype", "float8");
  expect_rejected(p, "unknown model dtype 'float8'");
  p = copy();
  set_string_attr(p, group(), "suite", "other");
  expect_rejected(p, "the attributes describe case 'other/small_decode");
  // The ops a case runs in (written only where a suite group names them).
  for (const auto& [value, words] : {std::pair{"decode,bogus", "ops: unknown op 'bogus'"},
                                     std::pair{"decode,,layer", "ops: unknown op ''"},
                                     std::pair{"decode,layer,decode", "ops names decode twice"}}) {
    p = copy();
    set_string_attr(p, group(), "ops", value);
    expect_rejected(p, words);
  }
  p = copy();
  set_string_attr(p, group(), "ops", "prefill,decode");
  EXPECT_EQ(load_error(p), "");
  const CaseHeader h = GoldenReader(p.string()).header(id_);
  EXPECT_EQ(h.spec.ops, (std::vector<Op>{Op::kPrefill, Op::kDecode}));
}

TEST_F(H5Hostile, LinksAndExternalStorageAreNotFollowed) {
  fs::path p = copy();
  make_soft_link(p, group(), "inputs");
  expect_rejected(p, "is a soft or external link");
  p = copy();
  const fs::path raw = scratch_ / "raw.bin";
  write_bytes(raw, std::string(original_->c.q.nbytes(), '\x3f'));
  replace_with_external(p, group("inputs"), "q", raw.string(), original_->c.q);
  expect_rejected(p, "external storage is not accepted");
}

TEST_F(H5Hostile, SizesBeyondTheMemoryBudget) {
  expect_rejected(good_, "exceed the memory budget of 65536 bytes (--max-bytes)", 65536);
  EXPECT_EQ(cli({"replay", good_.string(), "--max-bytes", "64KiB", "--no-progress"}), kExitUsage);
  EXPECT_EQ(cli({"replay", good_.string(), "--max-bytes", "1GiB", "--no-progress", "-q"}), kExitPassed);
}

TEST_F(H5Hostile, CompareRejectsHostileResultsFiles) {
  const fs::path a = scratch_ / "a.h5";
  ASSERT_EQ(cli({"replay", good_.string(), "--backend", "cpu.paged", "-q", "--no-progress", "--save-results", a.string()}),
            kExitPassed);
  const fs::path b = scratch_ / "b.h5";
  fs::copy_file(a, b);
  set_string_attr(b, group("results/cpu.paged/layer"), "status", "MAYBE");
  EXPECT_EQ(cli({"compare", a.string(), b.string()}), kExitUsage);
  fs::copy_file(a, b, fs::copy_options::overwrite_existing);
  const Tensor wrong(DType::kBF16, {2, 7});
  replace_dataset(b, group("results/cpu.paged/layer"), "out", wrong);
  EXPECT_EQ(cli({"compare", a.string(), b.string()}), kExitUsage);
  EXPECT_EQ(cli({"compare", a.string(), (scratch_ / "none.h5").string()}), kExitUsage);
}

}  // namespace
}  // namespace mlagate
