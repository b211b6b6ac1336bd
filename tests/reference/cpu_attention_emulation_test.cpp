// The CPU's fast attention core (emulate_attention_cpu, the emulation's
// default) against the fixed order's plain yardstick
// (emulate_attention_fixed_order), byte for byte, NaN payloads included:
// random problems of every element type, depths and widths at every tile
// and panel remainder, rows over several units and keys over several depth
// passes, empty rows, no keys, subnormal and zero exponentials, NaN and
// infinite keys, rows in pieces, at one thread and at several; and every
// form and op of real cases through the emulation.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cases/case.h"
#include "cases/encoding.h"
#include "cases/suite.h"
#include "reference/glue.h"
#include "reference/kv_projection.h"
#include "reference/sdpa_emulation.h"
#include "tests/reference/emulation_inputs.h"

namespace mlagate {
namespace {

using E = EmulatedAttention::Elem;
using test::make;
using test::Problem;
using test::run;

// Every test runs on each of the core's paths: the fma tiles, and the bf16
// pair path where the build has VDPBF16PS (else skipped, visibly).
enum class Path { kFma, kPairs };

class CpuAttentionEmulation : public ::testing::TestWithParam<Path> {
 protected:
  void SetUp() override {
    if (GetParam() == Path::kPairs && !cpu_emulation_has_pairs())
      GTEST_SKIP() << "this build has no VDPBF16PS (AVX512_BF16): the pair path is not compiled";
    previous_ = set_cpu_emulation_pairs(GetParam() == Path::kPairs);
  }
  void TearDown() override { set_cpu_emulation_pairs(previous_); }

 private:
  std::optional<bool> previous_;
};

INSTANTIATE_TEST_SUITE_P(Paths, CpuAttentionEmulation, ::testing::Values(Path::kFma, Path::kPairs),
                         [](const ::testing::TestParamInfo<Path>& i) {
                           return std::string(i.param == Path::kFma ? "Fma" : "Pairs");
                         });

void expect_yardsticks_bytes(const EmulatedAttention& a, const std::string& what) {
  SCOPED_TRACE(what);
  test::expect_same_outputs(a, emulate_attention_cpu, emulate_attention_fixed_order, true);
}

TEST_P(CpuAttentionEmulation, ShapesAtEveryRemainderGiveTheYardsticksBytes) {
  struct Shape {
    E elem;
    int rows, heads, keys, dqk, dv, context;
    float spread;
  };
  const Shape shapes[] = {
      {E::kF32, 64, 1, 300, 576, 512, 200, 1.0f},    // decode form, 16 tokens of 4 heads
      {E::kF32, 130, 1, 700, 576, 512, 600, 1.0f},   // three units of rows, keys over three depth passes
      {E::kF32, 5, 1, 17, 70, 33, 15, 1.0f},         // odd depth and width, a partial tile everywhere
      {E::kBF16, 7, 3, 130, 192, 128, 120, 1.0f},    // prefill form
      {E::kBF16, 200, 2, 600, 192, 128, 400, 1.0f},  // rows over four units, each its own keys
      {E::kF16, 9, 2, 65, 100, 100, 56, 1.0f},       // fp16
      {E::kBF16, 6, 2, 40, 48, 24, -3, 1.0f},        // the first rows see no key
      {E::kBF16, 70, 1, 40, 48, 24, -50, 1.0f},      // a whole unit of rows sees none
      {E::kBF16, 3, 2, 0, 64, 64, 0, 1.0f},          // no keys at all
      {E::kBF16, 8, 2, 90, 64, 64, 80, 12.0f},       // logits far apart: subnormal and zero exponentials
      {E::kF16, 8, 2, 90, 64, 64, 80, 12.0f},        // the same in fp16: P underflows to its subnormals
      {E::kBF16, 8, 2, 90, 64, 64, 80, 60.0f},       // exponents below -126 and past the cut at -104
      {E::kF16, 70, 2, 333, 32, 16, 300, 3.0f},      // rows over several tiles, long rows
      {E::kBF16, 1, 1, 1, 1, 1, 0, 1.0f},            // one of everything
      {E::kBF16, 65, 1, 257, 129, 65, 192, 2.0f},    // one past each block
  };
  std::uint32_t seed = 1;
  for (const Shape& s : shapes) {
    Problem p = make(s.elem, s.rows, s.heads, s.keys, s.dqk, s.dv, s.context, s.spread, seed);
    expect_yardsticks_bytes(p.a, "shape " + std::to_string(seed++));
  }
}

TEST_P(CpuAttentionEmulation, RandomShapesGiveTheYardsticksBytes) {
  std::mt19937 rng(2026);
  const auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int t = 0; t < 60; ++t) {
    const E elem = t % 3 == 0 ? E::kF32 : t % 3 == 1 ? E::kBF16 : E::kF16;
    const int heads = elem == E::kF32 ? 1 : pick(1, 3);
    const int keys = pick(0, 520), dqk = pick(1, 260), rows = pick(1, 140);
    const int dv = elem == E::kF32 ? pick(1, dqk) : pick(1, 200);  // the decode form's values are key columns
    const float spread = std::array{0.5f, 1.0f, 4.0f, 30.0f}[static_cast<std::size_t>(pick(0, 3))];
    Problem p = make(elem, rows, heads, keys, dqk, dv, pick(-20, keys), spread, 100u + static_cast<std::uint32_t>(t));
    expect_yardsticks_bytes(p.a, "random shape " + std::to_string(t) + ": rows " + std::to_string(rows) + " heads " +
                                     std::to_string(heads) + " keys " + std::to_string(keys) + " dqk " +
                                     std::to_string(dqk) + " dv " + std::to_string(dv));
  }
}

// Rows in pieces: each key and value row at an address of its own (the
// prefill form's rows where the glue's chunks left them), in reversed order
// in memory; the bytes of the contiguous call.
TEST_P(CpuAttentionEmulation, RowsInPiecesGiveTheContiguousBytes) {
  for (const E elem : {E::kBF16, E::kF16}) {
    Problem p = make(elem, 70, 3, 300, 96, 80, 250, 1.0f, 31);
    const std::size_t kw = 3 * 96, vw = 3 * 80, keys = 300;
    std::vector<std::uint16_t> k(p.k16.size()), v(p.v16.size());
    std::vector<const void*> k_rows(keys), v_rows(keys);
    for (std::size_t j = 0; j < keys; ++j) {
      const std::size_t at = keys - 1 - j;
      std::copy_n(p.k16.data() + j * kw, kw, k.data() + at * kw);
      std::copy_n(p.v16.data() + j * vw, vw, v.data() + at * vw);
      k_rows[j] = k.data() + at * kw;
      v_rows[j] = v.data() + at * vw;
    }
    EmulatedAttention pieces = p.a;
    pieces.k = pieces.v = nullptr;
    pieces.k_rows = k_rows.data(), pieces.v_rows = v_rows.data();
    const test::Outputs want = run(p.a, emulate_attention_fixed_order);
    for (const AttentionEmulator e : {emulate_attention_cpu, emulate_attention_fixed_order}) {
      const test::Outputs got = run(pieces, e);
      EXPECT_EQ("", test::difference(got.o, want.o, true));
      EXPECT_EQ("", test::difference(got.max, want.max, true));
      EXPECT_EQ("", test::difference(got.sum, want.sum, true));
    }
  }
}

// The prefill form over a projection whose rows lie in two pieces (the
// glue's prefill chunks) reads them where they lie: the bytes of one piece.
TEST_P(CpuAttentionEmulation, ThePrefillFormReadsRowsInPiecesInPlace) {
  const Case c = generate_case(load_suite("smoke").cases[2]);  // mixed_small
  test::OpInputs whole(c);
  KvProjection split(c);
  const test::TwoPieces two = test::project_in_two_pieces(c, split);
  const std::int64_t kv0 = c.kv_start_loc[0], half = two.half;
  ASSERT_GT(half, 0);
  ASSERT_EQ(two.offered, static_cast<std::size_t>(half));
  ASSERT_NE(split.k_row(kv0 + half), split.k_row(kv0) + half * c.spec.num_heads() *
                                                              (c.spec.dims.nope_dim + c.spec.dims.rope_dim))
      << "request 0's rows are not in two pieces";
  const SdpaResult pieces = emulate_sdpa_layer(c, SdpaForm::kPrefill, test::all_requests(c), &split);
  const SdpaResult one = emulate_sdpa_layer(c, SdpaForm::kPrefill, test::all_requests(c), &whole.projection);
  EXPECT_EQ(0, std::memcmp(pieces.out.data(), one.out.data(), one.out.size() * sizeof(double)));
  EXPECT_EQ(0, std::memcmp(pieces.lse.data(), one.lse.data(), one.lse.size() * sizeof(double)));
}

// A NaN or infinite key reaches only the rows that see it: a row's chains
// stop at its own keys (a term 0 * NaN past them would poison it).
TEST_P(CpuAttentionEmulation, ABadKeyReachesOnlyTheRowsThatSeeIt) {
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Problem p = make(E::kBF16, 70, 2, 300, 64, 32, 200, 1.0f, 99);
    // Key 245, head 1: rows 0..44 see keys up to 200 + r.
    for (int d = 0; d < 64; ++d) p.k16[(static_cast<std::size_t>(245) * 2 + 1) * 64 + d] = f32_to_bf16(bad);
    for (int c = 0; c < 32; ++c) p.v16[(static_cast<std::size_t>(245) * 2 + 1) * 32 + c] = f32_to_bf16(bad);
    expect_yardsticks_bytes(p.a, std::isnan(bad) ? "a NaN key" : "an infinite key");
    const test::Outputs o = run(p.a, emulate_attention_cpu);
    for (int r = 0; r < 70; ++r) {
      const bool sees = 200 + r + 1 > 245;
      const float x = o.o[(static_cast<std::size_t>(r) * 2 + 1) * 32];
      EXPECT_EQ(std::isfinite(x), !sees) << "row " << r;
      EXPECT_TRUE(std::isfinite(o.o[static_cast<std::size_t>(r) * 2 * 32])) << "head 0, row " << r;
    }
  }
}

// An output chain that reaches -0 keeps it: the row's terms are tiny
// negative products that round to -0, and no term past its keys is added
// (0 * v + -0 would be +0). The yardstick writes -0; so must the fast path.
TEST_P(CpuAttentionEmulation, AChainAtMinusZeroStaysThere) {
  Problem p = make(E::kBF16, 12, 1, 40, 8, 16, 20, 1.0f, 5);
  p.a.rows_per_token = 1;
  // Key 0 gives each row exp(0) = 1 at logit 0 and value -0 (the chain is +0
  // after it); every other key's logit is 28 below, a probability near 2^-41,
  // and its values -2^-120 make products under fp32's least subnormal: the
  // first rounds the chain to -0, and the rest keep it there.
  std::fill(p.q16.begin(), p.q16.end(), f32_to_bf16(1.0f));
  for (int j = 0; j < 40; ++j)
    for (int d = 0; d < 8; ++d) p.k16[static_cast<std::size_t>(j) * 8 + d] = f32_to_bf16(j == 0 ? 0.0f : -10.0f);
  // Keys past row 0's 21 have values +2^-120: a term 0 * v of theirs added to
  // row 0's chain would make its -0 a +0.
  for (int j = 0; j < 40; ++j)
    for (int c = 0; c < 16; ++c)
      p.v16[static_cast<std::size_t>(j) * 16 + c] =
          f32_to_bf16(j == 0 ? -0.0f : std::ldexp(j <= 20 ? -1.0f : 1.0f, -120));
  expect_yardsticks_bytes(p.a, "chains at -0");
  const test::Outputs o = run(p.a, emulate_attention_fixed_order);
  EXPECT_TRUE(std::signbit(o.o[0]) && o.o[0] == 0.0f) << "the case no longer makes -0: " << o.o[0];
}

// A NaN with a payload of its own (fp32 keys of the decode form, fp16 and
// bf16 keys) comes out of both implementations with the same bytes: the
// rounding keeps or makes the quiet NaN as encoding.h does.
TEST_P(CpuAttentionEmulation, APayloadNaNKeyGivesTheYardsticksBytes) {
  // Signaling with a payload; and all ones, whose rounding to bf16 without
  // the NaN case would carry into the sign.
  for (const std::uint32_t bits : {0x7FA00001u, 0x7FFFFFFFu}) {
    Problem p = make(E::kF32, 16, 1, 40, 70, 33, 30, 1.0f, 41);
    p.kf[static_cast<std::size_t>(20) * 70 + 5] = std::bit_cast<float>(bits);
    expect_yardsticks_bytes(p.a, "fp32 key " + std::to_string(bits));
  }
  for (const E elem : {E::kF16, E::kBF16}) {
    Problem p = make(elem, 10, 2, 40, 64, 32, 30, 1.0f, 43);
    const std::uint16_t nan = elem == E::kF16 ? 0x7E01 : 0x7FC1;
    p.k16[(static_cast<std::size_t>(25) * 2 + 1) * 64 + 7] = nan;
    p.v16[(static_cast<std::size_t>(33) * 2) * 32 + 3] = nan;
    expect_yardsticks_bytes(p.a, elem == E::kF16 ? "fp16 key and value" : "bf16 key and value");
  }
}

// fp16 outputs past 65504 round to infinity in both.
TEST_P(CpuAttentionEmulation, Fp16OverflowGivesTheYardsticksBytes) {
  Problem p = make(E::kF16, 8, 1, 30, 32, 16, 20, 1.0f, 47);
  for (std::size_t j = 0; j < 30; ++j) p.v16[j * 16 + 2] = f32_to_f16(j % 2 ? 65504.0f : 60000.0f);
  expect_yardsticks_bytes(p.a, "fp16 values near the largest");
}

// The decode form's requests in groups (every request alone, and two at a
// time) give the bytes of one call.
TEST_P(CpuAttentionEmulation, TheDecodeFormsGroupsGiveOneCallsBytes) {
  const Case c = generate_case(load_suite("smoke").cases[2]);  // mixed_small
  const SdpaResult one = emulate_sdpa_layer(c, SdpaForm::kDecode, test::all_requests(c));
  const std::int64_t D = c.spec.dims.kv_lora_rank + c.spec.dims.rope_dim;
  for (const std::int64_t bytes : {std::int64_t{1}, 2 * D * 2 * c.seq_lens[0]}) {
    const std::int64_t previous = set_decode_key_group_bytes(bytes);
    const SdpaResult grouped = emulate_sdpa_layer(c, SdpaForm::kDecode, test::all_requests(c));
    set_decode_key_group_bytes(previous);
    EXPECT_EQ(0, std::memcmp(grouped.out.data(), one.out.data(), one.out.size() * sizeof(double))) << bytes;
    EXPECT_EQ(0, std::memcmp(grouped.lse.data(), one.lse.data(), one.lse.size() * sizeof(double))) << bytes;
  }
}

// The bytes do not depend on the thread count (units are rows; no sum crosses them).
TEST_P(CpuAttentionEmulation, BytesDoNotDependOnThreads) {
  Problem p = make(E::kBF16, 150, 3, 400, 96, 80, 300, 1.0f, 17);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const test::Outputs one = run(p.a, emulate_attention_cpu);
  omp_set_num_threads(std::max(threads, 3));
  const test::Outputs many = run(p.a, emulate_attention_cpu);
  omp_set_num_threads(threads);
  EXPECT_EQ("", test::difference(one.o, many.o, true));
  EXPECT_EQ("", test::difference(one.sum, many.sum, true));
}

// Every form and op of real cases, the default emulator against the
// yardstick set as the emulator: the same bytes in every output.
TEST_P(CpuAttentionEmulation, EveryFormAndOpOfRealCasesIsTheYardsticks) {
  for (const CaseSpec& spec : test::emulation_specs()) {
    if (spec.dtype != DType::kBF16 && spec.dtype != DType::kF16) continue;
    SCOPED_TRACE(spec.id());
    const Case c = generate_case(spec);
    test::OpInputs in(c);
    const TensorView k = in.projection.k_all().view(), v = in.projection.v_all().view();
    const auto all = [&] {
      return std::vector<SdpaResult>{emulate_sdpa_layer(c, SdpaForm::kDecode, test::all_requests(c)),
                                     emulate_sdpa_layer(c, SdpaForm::kPrefill, test::all_requests(c), &in.projection),
                                     emulate_sdpa_decode_op(c, in.q_lat.view()), emulate_sdpa_prefill_op(c, k, v)};
    };
    const std::vector<SdpaResult> fast = all();
    const AttentionEmulatorScope scope(emulate_attention_fixed_order);
    const std::vector<SdpaResult> plain = all();
    const char* names[] = {"decode form", "prefill form", "decode op", "prefill op"};
    for (std::size_t i = 0; i < fast.size(); ++i) test::expect_same_results(fast[i], plain[i], names[i], true);
  }
}

// The pair path runs where it can and nowhere else: bf16 calls of even depth
// take it when forced, fp16 and fp32 ones never, and with the fma path
// forced nothing does. (Without this, a pair path that never ran would pass
// every comparison above.)
TEST_P(CpuAttentionEmulation, ThePairPathRunsWhereItCanAndNowhereElse) {
  // Logit tiles and value passes on pairs during one run of p.
  const auto counts_of = [](const Problem& p) {
    const CpuEmulationPairCounts before = cpu_emulation_pair_counts();
    run(p.a, emulate_attention_cpu);
    const CpuEmulationPairCounts after = cpu_emulation_pair_counts();
    return std::pair{after.logit_tiles - before.logit_tiles, after.value_passes - before.value_passes};
  };
  const bool pairs = GetParam() == Path::kPairs;
  for (const auto& [p, what] : {std::pair{make(E::kBF16, 70, 2, 300, 96, 80, 250, 1.0f, 61), "prefill form, bf16"},
                                std::pair{make(E::kBF16, 64, 1, 300, 576, 512, 200, 1.0f, 62), "decode form, bf16"}}) {
    const auto [tiles, passes] = counts_of(p);
    EXPECT_EQ(tiles > 0, pairs) << what << ": logit tiles";
    EXPECT_EQ(passes > 0, pairs) << what << ": value passes";
  }
  const auto none = std::pair<std::uint64_t, std::uint64_t>{0, 0};
  EXPECT_EQ(counts_of(make(E::kF16, 70, 2, 300, 96, 80, 250, 1.0f, 63)), none) << "fp16";
  EXPECT_EQ(counts_of(make(E::kF32, 64, 1, 300, 576, 512, 200, 1.0f, 64)), none) << "fp32 keys";
  EXPECT_EQ(counts_of(make(E::kBF16, 20, 2, 50, 95, 40, 30, 1.0f, 65)), none) << "odd depth";
}

// Values the pair instruction would flush or that are not finite (a query,
// a key or a value below 2^-50 or from 2^41, in units, tiles and passes of
// their own) take the fma tiles there, and every byte stays the
// yardstick's; so do the decode form's shared rows, looked at once a call.
TEST_P(CpuAttentionEmulation, ValuesOutsideThePairRangeGiveTheYardsticksBytes) {
  const std::uint16_t tiny = f32_to_bf16(std::ldexp(1.0f, -60)), huge = f32_to_bf16(std::ldexp(1.0f, 45));
  for (const std::uint16_t odd : {tiny, huge}) {
    const char* what = odd == tiny ? "2^-60" : "2^45";
    for (const int heads : {2, 1}) {
      Problem p = make(E::kBF16, 140, heads, 600, 96, 80, 500, 1.0f, 71);
      const std::size_t kw = static_cast<std::size_t>(heads) * 96, vw = static_cast<std::size_t>(heads) * 80;
      p.q16[static_cast<std::size_t>(3) * kw + 5] = odd;          // a query of the first unit
      p.k16[static_cast<std::size_t>(40) * kw + 7] = odd;         // a key of one tile
      p.v16[static_cast<std::size_t>(300) * vw + 9] = odd;        // a value of the second pass
      p.v16[static_cast<std::size_t>(599) * vw + vw - 1] = odd;   // the last value of the last pass
      expect_yardsticks_bytes(p.a, std::string(what) + (heads == 1 ? ", decode form" : ", prefill form"));
    }
  }
}

// Subnormal operands, which the pair instruction reads as zero, keep the
// yardstick's bytes (they take the fma tiles), in each operand the pair path
// checks: a query or a key (the row's max logit is then subnormal), a probability (a
// row's other keys 89 below its last, whose value is 0: the output is their
// subnormal sum) and a value (two keys of logit 0, one value 2^-130). In the
// prefill form's units and the decode form's shared rows (heads 1).
TEST_P(CpuAttentionEmulation, SubnormalsThePairInstructionFlushesGiveTheYardsticksBytes) {
  const std::uint16_t one = f32_to_bf16(1.0f), zero = f32_to_bf16(0.0f);
  const std::uint16_t sub = f32_to_bf16(std::ldexp(1.0f, -130)), far = f32_to_bf16(-31.5f);
  for (const int heads : {2, 1}) {
    const auto problem = [&](int keys) {
      Problem p = make(E::kBF16, 1, heads, keys, 8, 16, keys - 1, 1.0f, 81);
      p.a.rows_per_token = 1;  // row 0 sees every key
      std::fill(p.q16.begin(), p.q16.end(), one);
      return p;
    };
    const std::string form = heads == 1 ? ", decode form" : ", prefill form";
    const auto key = [&](Problem& p, int j, int h) {
      return p.k16.data() + (static_cast<std::size_t>(j) * heads + h) * 8;
    };
    const auto value = [&](Problem& p, int j, int h) {
      return p.v16.data() + (static_cast<std::size_t>(j) * heads + h) * 16;
    };
    {
      Problem p = problem(6);
      for (int h = 0; h < heads; ++h) {
        for (int j = 0; j < 6; ++j) std::fill_n(key(p, j, h), 8, j == 0 ? zero : far);
        key(p, 0, h)[3] = sub;
      }
      expect_yardsticks_bytes(p.a, "a subnormal key" + form);
      EXPECT_NE(run(p.a, emulate_attention_fixed_order).max[0], 0.0f) << "the max logit is no longer subnormal";
    }
    {
      Problem p = problem(3);
      for (int h = 0; h < heads; ++h) {
        std::fill_n(p.q16.data() + static_cast<std::size_t>(h) * 8, 8, zero);
        p.q16[static_cast<std::size_t>(h) * 8] = sub;
        for (int j = 0; j < 3; ++j) std::fill_n(key(p, j, h), 8, j == 0 ? one : f32_to_bf16(-1.0f));
      }
      expect_yardsticks_bytes(p.a, "a subnormal query" + form);
      EXPECT_NE(run(p.a, emulate_attention_fixed_order).max[0], 0.0f) << "the max logit is no longer subnormal";
    }
    {
      Problem p = problem(9);
      for (int h = 0; h < heads; ++h)
        for (int j = 0; j < 9; ++j) {
          std::fill_n(key(p, j, h), 8, j == 8 ? zero : far);
          std::fill_n(value(p, j, h), 16, j == 8 ? zero : one);
        }
      expect_yardsticks_bytes(p.a, "subnormal probabilities" + form);
      EXPECT_NE(run(p.a, emulate_attention_fixed_order).o[0], 0.0f) << "the output is no longer their sum";
    }
    {
      Problem p = problem(2);
      for (int h = 0; h < heads; ++h)
        for (int j = 0; j < 2; ++j) {
          std::fill_n(key(p, j, h), 8, zero);
          std::fill_n(value(p, j, h), 16, j == 0 ? sub : zero);
        }
      expect_yardsticks_bytes(p.a, "a subnormal value" + form);
      EXPECT_NE(run(p.a, emulate_attention_fixed_order).o[0], 0.0f) << "the output is no longer subnormal";
    }
  }
}

// A pass on the fma tiles (a value the pairs refuse) that leaves a subnormal
// accumulator, followed by passes whose values are all pair-safe: the later
// passes must not read that accumulator through the pair instruction (which
// would take it as zero). Row 0 sees 300 keys over two passes; key 0's
// value 2^-127 makes the first pass fma, every later product is 0 (P = +0).
TEST_P(CpuAttentionEmulation, ASubnormalChainFromAnFmaPassKeepsItsBits) {
  for (const int heads : {2, 1}) {
    const int keys = 300;
    Problem p = make(E::kBF16, 1, heads, keys, 8, 16, keys - 1, 1.0f, 81);
    p.a.rows_per_token = 1;
    std::fill(p.q16.begin(), p.q16.end(), f32_to_bf16(1.0f));
    for (int h = 0; h < heads; ++h)
      for (int j = 0; j < keys; ++j) {
        const std::size_t at = static_cast<std::size_t>(j) * heads + h;
        std::fill_n(p.k16.data() + at * 8, 8, f32_to_bf16(j == 0 ? 0.0f : -64.0f));
        std::fill_n(p.v16.data() + at * 16, 16, f32_to_bf16(0.0f));
        if (j == 0) p.v16[at * 16] = f32_to_bf16(std::ldexp(1.0f, -127));
      }
    expect_yardsticks_bytes(p.a, heads == 1 ? "decode form" : "prefill form");
    EXPECT_NE(run(p.a, emulate_attention_fixed_order).o[0], 0.0f) << "the output is no longer subnormal";
  }
}

// Random bf16 problems (rows per token 1 to 5, even depths, keys over
// several passes, visibility from before the first key) with a few odd
// values among the queries, keys and values: below 2^-50, from 2^41, NaN with
// a payload, infinities, the least subnormal, -0. Each path gives the
// yardstick's bytes, NaN payloads included, whatever path each tile takes.
TEST_P(CpuAttentionEmulation, RandomBf16ProblemsWithOddValuesGiveTheYardsticksBytes) {
  std::mt19937 rng(11);
  const auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const std::uint16_t odd[] = {f32_to_bf16(std::ldexp(1.0f, -60)), f32_to_bf16(std::ldexp(1.0f, 45)), 0x7FC1, 0x7F80,
                               0xFF80, 0x0001, 0x8000};
  for (int t = 0; t < 150; ++t) {
    const int heads = pick(1, 3), rows = pick(1, 140), keys = pick(1, 700), dqk = 2 * pick(1, 40), dv = pick(1, 150);
    Problem p = make(E::kBF16, rows, heads, keys, dqk, dv, pick(-10, keys), t % 3 == 0 ? 3.0f : 1.0f,
                     5000u + static_cast<std::uint32_t>(t));
    p.a.rows_per_token = pick(1, 5);
    for (int i = pick(0, 3); i > 0; --i) {
      const int which = pick(0, 2);
      std::vector<std::uint16_t>& v = which == 0 ? p.q16 : which == 1 ? p.k16 : p.v16;
      v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng)] = odd[pick(0, 6)];
    }
    expect_yardsticks_bytes(p.a, "random bf16 problem " + std::to_string(t));
  }
}

}  // namespace
}  // namespace mlagate
