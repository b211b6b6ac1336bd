// Golden files of sparse cases: export, run --golden, replay and results files
// round-trip the sparse inputs (index sets, lengths, sink, V4's compressed
// entries, the oob pattern's past-the-end codes) and references; and a file
// whose sparse values a kernel would act on wrongly (an index outside its
// request, a past-the-end code outside the oob pattern, a poisoned slot inside
// a length, a non-finite reference or sink) is refused as an input error (exit 2), the
// message naming the dataset and the value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "cases/sparse.h"
#include "cases/suite.h"
#include "golden/golden_file.h"
#include "golden_test_util.h"

namespace mlagate {
namespace {

using namespace mlagate::testing;

std::vector<CaseSpec> sparse_specs() {
  std::vector<CaseSpec> out;
  for (const CaseSpec& c : load_suite("sparse").cases)
    if (c.batch.name == "sparse_mixed" && c.sparse.topk == 128 && c.sparse.sink && c.kv_cache_dtype == KvCacheDtype::kAuto &&
        (c.sparse.pattern == IndexPattern::kLengths || c.sparse.pattern == IndexPattern::kRandom))
      out.push_back(c);
  // Past-the-end codes (the oob pattern) stored and read back.
  for (const CaseSpec& c : load_suite("sparse").cases)
    if (c.batch.name == "sparse_mixed" && c.sparse.pattern == IndexPattern::kOutOfRange) out.push_back(c);
  for (const CaseSpec& c : load_suite("v4").cases)
    if (c.batch.name == "v4_mixed" && c.sparse.window == 128 && c.sparse.compress == 4 && c.kv_cache_dtype == KvCacheDtype::kFp8V4)
      out.push_back(c);
  return out;
}

void export_sparse(const fs::path& p) {
  ExportOptions opt = small_export_options();
  export_golden(sparse_specs(), p.string(), opt);
}

std::string id_where(const std::vector<CaseSpec>& specs, bool v4, IndexPattern v32 = IndexPattern::kLengths) {
  for (const CaseSpec& c : specs)
    if (c.sparse.v4() == v4 && (v4 || c.sparse.pattern == v32)) return c.id();
  return {};
}

// Loads every case of the file as replay does; the error message, or "".
std::string load_error(const fs::path& p) {
  try {
    GoldenReader r(p.string());
    for (const std::string& id : r.case_ids()) (void)r.load_case(id);
  } catch (const GoldenFileError& e) {
    return e.what();
  }
  return {};
}

TEST(SparseGolden, ExportRunGoldenReplayAndResultsRoundTrip) {
  ScratchDir d;
  export_sparse(d / "g.h5");
  ASSERT_EQ(sparse_specs().size(), 4u);
  EXPECT_EQ(cli({"run", "--golden", (d / "g.h5").string(), "--backend", "cpu.sparse", "--quiet", "--no-progress",
                 "--save-results", (d / "r.h5").string()}),
            0);
  EXPECT_EQ(cli({"replay", (d / "g.h5").string(), "--backend", "cpu.sparse", "--quiet", "--no-progress"}), 0);
  EXPECT_EQ(cli({"compare", (d / "r.h5").string(), (d / "r.h5").string()}), 0);
  GoldenReader r((d / "g.h5").string());
  const std::string v4 = id_where(sparse_specs(), true);
  const PreparedCase pc = r.load_case(v4);
  ASSERT_TRUE(pc.sparse && pc.c.sparse);
  EXPECT_EQ(pc.c.sparse->extra.width, 96);
  EXPECT_EQ(pc.c.sparse->sink.size(), 8u);
  // The stored sets are exactly the generator's.
  const Case fresh = generate_case(pc.c.spec);
  EXPECT_EQ(pc.c.sparse->extra.pos, fresh.sparse->extra.pos);
  EXPECT_EQ(pc.c.sparse->compressed.kv_c.nbytes(), fresh.sparse->compressed.kv_c.nbytes());
  const PreparedCase oob = r.load_case(id_where(sparse_specs(), false, IndexPattern::kOutOfRange));
  ASSERT_TRUE(oob.c.sparse);
  EXPECT_EQ(oob.c.sparse->main.pos, generate_case(oob.c.spec).sparse->main.pos);
  EXPECT_TRUE(std::any_of(oob.c.sparse->main.pos.begin(), oob.c.sparse->main.pos.end(), is_past_end));
}

TEST(SparseGolden, HostileSparseValuesAreInputErrors) {
  ScratchDir d;
  export_sparse(d / "good.h5");
  const std::vector<CaseSpec> specs = sparse_specs();
  const std::string v32 = id_where(specs, false), v4 = id_where(specs, true);
  const std::string oob_id = id_where(specs, false, IndexPattern::kOutOfRange);
  GoldenReader good((d / "good.h5").string());
  const PreparedCase a = good.load_case(v32), b = good.load_case(v4), oob = good.load_case(oob_id);
  struct Variant {
    const char* name;
    std::string id;
    std::string dataset;
    std::function<Tensor()> make;
    std::string expect;  // in the message
  };
  auto i32 = [](const std::vector<std::int32_t>& v, Shape s) {
    Tensor t(DType::kI32, std::move(s));
    std::copy(v.begin(), v.end(), t.data<std::int32_t>());
    return t;
  };
  const std::int64_t T = a.c.num_tokens, K = a.c.sparse->main.width;
  const std::vector<Variant> variants = {
      {"index past the request", v32, "indices",
       [&] {
         auto v = a.c.sparse->main.pos;
         v[0] = a.c.seq_lens[0];  // one past request 0's last key
         return i32(v, {T, K});
       },
       "index 300 at token 0, slot 0"},
      {"negative index", v32, "indices",
       [&] {
         auto v = a.c.sparse->main.pos;
         v[1] = -7;
         return i32(v, {T, K});
       },
       "index -7"},
      {"huge index", v32, "indices",
       [&] {
         auto v = a.c.sparse->main.pos;
         v[2] = 2147480000;
         return i32(v, {T, K});
       },
       "index 2147480000"},
      {"past-the-end code outside the oob pattern", v32, "indices",
       [&] {
         auto v = a.c.sparse->main.pos;
         v[1] = kIndexPastEnd;
         return i32(v, {T, K});
       },
       "index -3 at token 0, slot 1 is neither -1 nor a key"},
      {"a negative index that is no past-the-end code, in an oob case", oob_id, "indices",
       [&] {
         auto v = oob.c.sparse->main.pos;
         v[1] = kIndexPastEnd - kPastEndNear - 1;
         return i32(v, {oob.c.num_tokens, oob.c.sparse->main.width});
       },
       "index -68 at token 0, slot 1 is neither -1, a past-the-end code nor a key"},
      {"huge index in an oob case", oob_id, "indices",
       [&] {
         auto v = oob.c.sparse->main.pos;
         v[2] = 2147480000;
         return i32(v, {oob.c.num_tokens, oob.c.sparse->main.width});
       },
       "index 2147480000 at token 0, slot 2"},
      {"poisoned slot inside the length", v32, "indices",
       [&] {
         auto v = a.c.sparse->main.pos;
         v[0] = -2;
         return i32(v, {T, K});
       },
       "index -2 at token 0"},
      {"length past the row", v32, "indices_length",
       [&] {
         auto v = a.c.sparse->main.length;
         v[3] = static_cast<std::int32_t>(K + 1);
         return i32(v, {T});
       },
       "length 129"},
      {"compressed index past the compressed entries", v4, "extra_indices",
       [&] {
         auto v = b.c.sparse->extra.pos;
         v[5] = 100;  // request 0 has 400 / 4 = 100 compressed entries
         return i32(v, {b.c.num_tokens, b.c.sparse->extra.width});
       },
       "index 100 at token 0, slot 5"},
      {"NaN sink", v4, "sink",
       [&] {
         Tensor t(DType::kF32, {static_cast<std::int64_t>(b.c.sparse->sink.size())});
         std::copy(b.c.sparse->sink.begin(), b.c.sparse->sink.end(), t.data<float>());
         t.data<float>()[1] = std::numeric_limits<float>::quiet_NaN();
         return t;
       },
       "sink of head 1 is not finite"},
      {"NaN reference", v4, "o",
       [&] {
         Tensor t(DType::kF64, {b.c.num_tokens, b.c.spec.num_heads(), 512});
         std::copy(b.sparse->o.begin(), b.sparse->o.end(), t.data<double>());
         t.data<double>()[77] = std::numeric_limits<double>::quiet_NaN();
         return t;
       },
       "element 77 is not finite"},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    const fs::path p = d / "bad.h5";
    write_bytes(p, read_bytes(d / "good.h5"));
    replace_dataset(p, case_path(v.id) + "/sparse", v.dataset, v.make());
    const std::string why = load_error(p);
    EXPECT_NE(why.find("/sparse/" + v.dataset), std::string::npos) << why;
    EXPECT_NE(why.find(v.expect), std::string::npos) << why;
    EXPECT_EQ(cli({"replay", p.string(), "--backend", "cpu.sparse", "--quiet", "--no-progress"}), 2);
    EXPECT_EQ(cli({"run", "--golden", p.string(), "--backend", "cpu.sparse", "--quiet", "--no-progress"}), 2);
    // The real binary (isolated workers): refused in the parent, one message, no record.
    const fs::path json = d / "report.json";
    const BinaryRun r = run_binary({"run", "--golden", p.string(), "--backend", "cpu.sparse*", "--no-progress", "--json",
                                    json.string()},
                                   d.path());
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_NE(r.err.find(p.string()), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(v.expect), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_FALSE(fs::exists(json));
  }
}

}  // namespace
}  // namespace mlagate
