// Tests for cases/fp8: e4m3fn and UE8M0 bit-exact over every code and every
// bf16 input against slow references written from the format definitions, the
// fp8_ds_mla scale rules and their contract values, and the byte layout of
// every kv cache dtype's entry.
#include "cases/fp8.h"

#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cases/encoding.h"
#include "cases/errors.h"

namespace mlagate {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// e4m3fn from its definition (OCP FP8): bias 7, no infinities, S.1111.111 NaN.
double e4m3_value(int code) {
  const int s = code >> 7, e = (code >> 3) & 0xF, m = code & 7;
  if (e == 0xF && m == 7) return kNaN;
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return s ? -mag : mag;
}

// The code the encoder must give for x (double, any value): the nearest of
// the 127 finite magnitudes, ties to the even code (the mantissa's last bit is
// the code's), |x| >= 448 saturating to 448, NaN to NaN with x's sign.
int e4m3_expected(double x) {
  const int sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7F;
  const double a = std::fabs(x);
  if (a >= 448) return sign | 0x7E;
  int best = 0;
  for (int c = 1; c <= 0x7E; ++c) {
    const double d = std::fabs(e4m3_value(c) - a), db = std::fabs(e4m3_value(best) - a);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return sign | best;
}

TEST(E4m3, EveryCodeDecodesToItsDefinition) {
  for (int c = 0; c < 256; ++c) {
    SCOPED_TRACE(c);
    const float v = e4m3_to_f32(static_cast<std::uint8_t>(c));
    const double want = e4m3_value(c);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(v));
      continue;
    }
    EXPECT_EQ(static_cast<double>(v), want);
    EXPECT_EQ(std::signbit(v), c >= 0x80);  // -0 included
  }
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0x1p-9f);   // smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x08), 0x1p-6f);   // smallest normal
  EXPECT_EQ(e4m3_to_f32(0x77), 240.f);     // e4m3fnuz's largest, an ordinary value here
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xFF)));
}

TEST(E4m3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(static_cast<std::uint8_t>(c))), c) << c;
  }
}

// Every bf16 value: in range it rounds to the nearest e4m3 (ties to even),
// beyond it saturates, NaN stays NaN; and a bf16 value that is an e4m3 value
// comes back unchanged through encode and decode.
TEST(E4m3, EveryBf16ValueEncodesExactly) {
  int exact = 0;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float x = bf16_to_f32(static_cast<std::uint16_t>(b));
    const std::uint8_t got = f32_to_e4m3(x);
    const int want = e4m3_expected(x);
    ASSERT_EQ(got, want) << "bf16 0x" << std::hex << b << " = " << x;
    if (!std::isnan(x) && std::fabs(x) <= 448 && static_cast<double>(e4m3_to_f32(got)) == static_cast<double>(x)) {
      ++exact;
      EXPECT_EQ(std::signbit(e4m3_to_f32(got)), std::signbit(x));
    }
  }
  // Every finite e4m3 value (126 magnitudes x 2 signs + two zeros) is a bf16 value.
  EXPECT_EQ(exact, 254);
}

TEST(E4m3, Fp32TiesSubnormalsAndSaturation) {
  EXPECT_EQ(f32_to_e4m3(448.f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(464.f), 0x7E);   // the tie between 448 and the absent 480: saturates
  EXPECT_EQ(f32_to_e4m3(1e30f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::quiet_NaN()), 0xFF);
  EXPECT_EQ(f32_to_e4m3(-0.f), 0x80);
  EXPECT_EQ(f32_to_e4m3(0x1p-10f), 0x00);         // half the smallest subnormal: ties to 0 (even)
  EXPECT_EQ(f32_to_e4m3(0x1.000002p-10f), 0x01);  // just above the tie
  EXPECT_EQ(f32_to_e4m3(0x1.8p-9f), 0x02);        // 1.5 units: ties to 2 (even)
  EXPECT_EQ(f32_to_e4m3(0x1.4p-8f), 0x02);        // 2.5 units: ties to 2 (even)
  EXPECT_EQ(f32_to_e4m3(0x1.ep-7f), 0x08);        // 7.5 units: ties up (8 is even) into the first normal
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);          // tie between 1 and 1.125: 1 (even)
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3A);          // tie between 1.125 and 1.25: 1.25 (even)
  EXPECT_EQ(f32_to_e4m3(1.0624999f), 0x38);
  EXPECT_EQ(f32_to_e4m3(1.0625001f), 0x39);       // just past the tie: up (truncation would say 0x38)
  EXPECT_EQ(f32_to_e4m3(15.5f), 0x58);            // tie between 15 (0x57) and 16: carries into the exponent
  EXPECT_EQ(f32_to_e4m3(250.f), 0x78);            // 256 is nearer than 240
  EXPECT_EQ(f32_to_e4m3(247.f), 0x77);            // 240 is nearer than 256
  EXPECT_EQ(f32_to_e4m3(300.f), 0x79);            // 288 < 300 < 320: 288
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
  // Random fp32 values in the whole range against the slow reference.
  std::uint32_t s = 12345;
  for (int i = 0; i < 50000; ++i) {
    s = s * 1664525u + 1013904223u;
    const float x = std::bit_cast<float>((s & 0x80000000u) | (0x30000000u + (s >> 1) % 0x14000000u));
    ASSERT_EQ(f32_to_e4m3(x), e4m3_expected(x)) << x;
  }
}

TEST(Ue8m0, EveryCodeIsAPowerOfTwoAndRoundTrips) {
  for (int u = 0; u < 255; ++u) {
    const float v = ue8m0_to_f32(static_cast<std::uint8_t>(u));
    EXPECT_EQ(static_cast<double>(v), std::ldexp(1.0, u - 127)) << u;
    EXPECT_EQ(f32_to_ue8m0(v), u) << u;
  }
  EXPECT_TRUE(std::isnan(ue8m0_to_f32(0xFF)));
}

TEST(Ue8m0, RoundsUpToAPowerOfTwo) {
  EXPECT_EQ(f32_to_ue8m0(1.0f), 127);
  EXPECT_EQ(f32_to_ue8m0(1.0000001f), 128);  // a smaller scale would overflow the tile
  EXPECT_EQ(f32_to_ue8m0(0.75f), 127);
  EXPECT_EQ(f32_to_ue8m0(0x1p-13f), 114);
  EXPECT_EQ(f32_to_ue8m0(1e-4f), 114);       // 2^-13.3 -> 2^-13
  EXPECT_EQ(f32_to_ue8m0(0x1p127f), 254);
  EXPECT_EQ(f32_to_ue8m0(0x1.000002p127f), 0xFF);  // beyond 2^127
  EXPECT_EQ(f32_to_ue8m0(0.f), 0);
  EXPECT_EQ(f32_to_ue8m0(0x1p-127f), 0);
  EXPECT_EQ(f32_to_ue8m0(0x1.8p-127f), 1);  // fp32 subnormal above 2^-127: 2^-126
  EXPECT_EQ(f32_to_ue8m0(-1.f), 0xFF);
  EXPECT_EQ(f32_to_ue8m0(std::numeric_limits<float>::infinity()), 0xFF);
  EXPECT_EQ(f32_to_ue8m0(std::numeric_limits<float>::quiet_NaN()), 0xFF);
}

// the contract examples of SPEC: KV cache dtypes, then the rules against exact
// double arithmetic over every positive bf16 amax.
TEST(DsMlaScale, ContractExamples) {
  EXPECT_EQ(ds_mla_tile_scale(336.f, ScaleRule::kPow2), 1.0f);
  EXPECT_EQ(ds_mla_tile_scale(0.f, ScaleRule::kPow2), 0x1p-13f);
  EXPECT_EQ(ds_mla_tile_scale(0.f, ScaleRule::kRaw), FLT_MIN);
  EXPECT_EQ(ds_mla_tile_scale(336.f, ScaleRule::kRaw), 0.75f);
  EXPECT_EQ(ds_mla_tile_scale(448.f, ScaleRule::kPow2), 1.0f);  // exactly a power of two: kept
  EXPECT_EQ(ds_mla_tile_scale(449.f, ScaleRule::kPow2), 2.0f);
  EXPECT_EQ(ds_mla_tile_scale(3.5f, ScaleRule::kPow2), 0x1p-7f);
}

TEST(DsMlaScale, EveryBf16AmaxMatchesTheFormula) {
  for (std::uint32_t b = 0; b < 0x7F80; ++b) {  // +0 .. the largest finite bf16
    const float amax = bf16_to_f32(static_cast<std::uint16_t>(b));
    const float s = amax / 448.f;  // the rules are stated in fp32
    EXPECT_EQ(ds_mla_tile_scale(amax, ScaleRule::kRaw), std::max(s, FLT_MIN)) << amax;
    const double t = std::max(static_cast<double>(s), static_cast<double>(1e-4f));
    const double pow2 = std::exp2(std::ceil(std::log2(t)));
    ASSERT_EQ(static_cast<double>(ds_mla_tile_scale(amax, ScaleRule::kPow2)), pow2) << amax;
  }
}

TEST(EntryFormat, LayoutsOfEveryDtype) {
  const EntryFormat a = make_entry_format({KvCacheDtype::kAuto}, DType::kBF16, 512, 64, 1.f);
  EXPECT_EQ(a.bytes, 1152);
  EXPECT_EQ(a.k_pe_offset, 1024);
  for (KvCacheDtype d : {KvCacheDtype::kFp8, KvCacheDtype::kFp8E4m3}) {
    const EntryFormat f = make_entry_format({d}, DType::kF16, 512, 64, 3.f);
    EXPECT_EQ(f.bytes, 576);
    EXPECT_EQ(f.k_pe_offset, 512);
    EXPECT_EQ(f.scale_count, 0);
  }
  const EntryFormat m = make_entry_format({KvCacheDtype::kFp8DsMla, ScaleRule::kRaw}, DType::kBF16, 512, 64, 1.f);
  EXPECT_EQ(m.bytes, 656);  // 512 e4m3 + 4 fp32 scales + 64 bf16
  EXPECT_EQ(m.scale_offset, 512);
  EXPECT_EQ(m.scale_count, 4);
  EXPECT_EQ(m.k_pe_offset, 528);
  EXPECT_EQ(make_entry_format({KvCacheDtype::kFp8DsMla}, DType::kBF16, 256, 32, 1.f).bytes, 256 + 8 + 64);
  EXPECT_THROW(make_entry_format({KvCacheDtype::kFp8DsMla}, DType::kBF16, 500, 64, 1.f), InvalidCase);
  EXPECT_THROW(make_entry_format({KvCacheDtype::kFp8DsMla}, DType::kF16, 512, 64, 1.f), InvalidCase);
  EXPECT_THROW(make_entry_format({KvCacheDtype::kFp8, ScaleRule::kRaw}, DType::kBF16, 512, 64, 1.f), InvalidCase);

  EXPECT_EQ(entry_layout_string(m), "kv_c float8_e4m3fn[512] @0; scale float32[4] @512; k_pe bfloat16[64] @528");
  EXPECT_EQ(entry_layout_string(a), "kv_c bfloat16[512] @0; k_pe bfloat16[64] @1024");
  EXPECT_EQ(entry_layout_string(make_entry_format({KvCacheDtype::kFp8}, DType::kF16, 512, 64, 3.f)),
            "kv_c float8_e4m3fn[512] @0; k_pe float8_e4m3fn[64] @512");
  EXPECT_EQ(entry_value_dtype(a), "bfloat16");
  EXPECT_EQ(entry_field(m, 0).name, "kv_c");
  EXPECT_EQ(entry_field(m, 511).element, 511);
  EXPECT_EQ(entry_field(m, 515).name, "scale");
  EXPECT_EQ(entry_field(m, 515).element, 0);
  EXPECT_EQ(entry_field(m, 527).element, 3);
  EXPECT_EQ(entry_field(m, 528).name, "k_pe");
  EXPECT_EQ(entry_field(m, 655).element, 63);
  EXPECT_EQ(entry_field(a, 1025).name, "k_pe");
  EXPECT_EQ(entry_field(a, 1025).element, 0);
  EXPECT_EQ(entry_field(a, 3).element, 1);
}

std::vector<std::uint16_t> bf16s(std::vector<float> v) {
  std::vector<std::uint16_t> out;
  for (float x : v) out.push_back(f32_to_bf16(x));
  return out;
}

// One fp8_ds_mla entry, byte by byte: tile 0 has amax 336 (scale 1.0 under
// pow2), tile 1 is all zero (2^-13), tile 2 holds 1.5 and -3 (amax 3), tile 3
// the largest bf16 below 448 and a value that needs rounding.
TEST(EntryFormat, DsMlaEntryBytes) {
  std::vector<float> kv(512, 0.f), pe(64);
  kv[0] = 336.f;
  kv[1] = -1.0625f;  // a tie at scale 1: 1 (even)
  kv[256] = 1.5f;
  kv[257] = -3.f;
  kv[384] = 10.f;
  kv[385] = 0.30078125f;  // bf16-exact
  for (int i = 0; i < 64; ++i) pe[static_cast<std::size_t>(i)] = static_cast<float>(i) * 0.37f - 5.f;
  const auto kv16 = bf16s(kv), pe16 = bf16s(pe);
  for (ScaleRule rule : {ScaleRule::kPow2, ScaleRule::kRaw}) {
    SCOPED_TRACE(std::string(scale_rule_name(rule)));
    const EntryFormat f = make_entry_format({KvCacheDtype::kFp8DsMla, rule}, DType::kBF16, 512, 64, 3.f);
    std::vector<std::byte> e(656);
    encode_entry(f, kv16.data(), pe16.data(), e.data());
    float scales[4];
    std::memcpy(scales, e.data() + 512, 16);
    const bool pow2 = rule == ScaleRule::kPow2;
    EXPECT_EQ(scales[0], pow2 ? 1.0f : 0.75f);
    EXPECT_EQ(scales[1], pow2 ? 0x1p-13f : FLT_MIN);
    EXPECT_EQ(scales[2], pow2 ? 0x1p-7f : 3.f / 448.f);
    EXPECT_EQ(scales[3], pow2 ? 0x1p-5f : 10.f / 448.f);
    auto byte = [&](int i) { return std::to_integer<int>(e[static_cast<std::size_t>(i)]); };
    // pow2: 336 / 1 ties between 320 (0x7A) and 352 (0x7B): 320; raw: 336 / 0.75 = 448 exactly.
    EXPECT_EQ(byte(0), pow2 ? 0x7A : 0x7E);
    EXPECT_EQ(byte(1), f32_to_e4m3(-1.0625f / scales[0]));
    if (pow2) EXPECT_EQ(byte(1), 0xB8);  // -1.0625 ties to -1
    for (int i = 128; i < 256; ++i) EXPECT_EQ(byte(i), 0) << i;
    EXPECT_EQ(byte(257), f32_to_e4m3(-3.f / scales[2]));
    EXPECT_EQ(byte(385), f32_to_e4m3(0.30078125f / scales[3]));
    // k_scale plays no part: the tile scales are the entry's own.
    EXPECT_EQ(byte(256), f32_to_e4m3(1.5f / scales[2]));
    // RoPE: the bf16 bits verbatim, little endian.
    EXPECT_EQ(std::memcmp(e.data() + 528, pe16.data(), 128), 0);

    std::vector<float> kv_back(512), pe_back(64);
    decode_entry(f, e.data(), kv_back.data(), pe_back.data());
    EXPECT_EQ(kv_back[0], pow2 ? 320.f : 336.f);
    EXPECT_EQ(kv_back[128], 0.f);
    EXPECT_EQ(kv_back[257], e4m3_to_f32(static_cast<std::uint8_t>(byte(257))) * scales[2]);
    for (int i = 0; i < 64; ++i) EXPECT_EQ(pe_back[static_cast<std::size_t>(i)], bf16_to_f32(pe16[static_cast<std::size_t>(i)]));
  }
}

// fp8_ds_mla (pow2) and fp8_v4 tiles convert through a table per scale
// (fp8.cpp): the bytes must be the element-wise conversion's, whether a
// tile's scale has a table, gets one, or is converted element by element
// (every third row has a magnitude of its own, so scales keep changing).
TEST(EntryFormat, TileTablesGiveTheElementWiseBytes) {
  for (const KvCacheFormat kv : {KvCacheFormat{KvCacheDtype::kFp8DsMla, ScaleRule::kPow2}, KvCacheFormat{KvCacheDtype::kFp8V4}}) {
    const bool v4 = kv.dtype == KvCacheDtype::kFp8V4;
    SCOPED_TRACE(v4 ? "fp8_v4" : "fp8_ds_mla");
    const int L = v4 ? 448 : 512, R = 64, tile = v4 ? 64 : 128;
    const EntryFormat f = make_entry_format(kv, DType::kBF16, L, R, 1.f);
    std::vector<std::byte> e(static_cast<std::size_t>(f.bytes));
    std::vector<float> kv_row(static_cast<std::size_t>(L)), pe(static_cast<std::size_t>(R), 0.5f);
    const auto pe16 = bf16s(pe);
    int scales_seen = 0;
    float last_scale = 0;
    for (int row = 0; row < 2000; ++row) {
      const float mag = row % 3 == 0 ? std::ldexp(1.f, row % 40 - 20) : 1.f;
      for (int i = 0; i < L; ++i)
        kv_row[static_cast<std::size_t>(i)] = mag * 3.f * std::sin(static_cast<float>(row * 131 + i) * 0.7f);
      const auto kv16 = bf16s(kv_row);
      encode_entry(f, kv16.data(), pe16.data(), e.data());
      for (int t = 0; t < L / tile; ++t) {
        float scale;
        if (v4) {
          scale = ue8m0_to_f32(static_cast<std::uint8_t>(e[static_cast<std::size_t>(f.scale_offset + t)]));
        } else {
          std::memcpy(&scale, e.data() + f.scale_offset + 4 * t, 4);
        }
        if (scale != last_scale) ++scales_seen, last_scale = scale;
        for (int i = t * tile; i < (t + 1) * tile; ++i)
          ASSERT_EQ(std::to_integer<int>(e[static_cast<std::size_t>(i)]),
                    f32_to_e4m3(bf16_to_f32(kv16[static_cast<std::size_t>(i)]) / scale))
              << "row " << row << " element " << i << " scale " << scale;
      }
    }
    EXPECT_GT(scales_seen, 100) << "the scales did not keep changing: the element-wise way went untested";
  }
}

TEST(EntryFormat, Fp8EntryDividesByKScale) {
  std::vector<float> kv(512), pe(64);
  for (int i = 0; i < 512; ++i) kv[static_cast<std::size_t>(i)] = std::sin(static_cast<float>(i)) * 7.f;
  for (int i = 0; i < 64; ++i) pe[static_cast<std::size_t>(i)] = std::cos(static_cast<float>(i)) * 2000.f;  // some saturate
  const auto kv16 = bf16s(kv), pe16 = bf16s(pe);
  const EntryFormat f = make_entry_format({KvCacheDtype::kFp8}, DType::kBF16, 512, 64, 3.f);
  std::vector<std::byte> e(576);
  encode_entry(f, kv16.data(), pe16.data(), e.data());
  std::vector<float> kv_back(512), pe_back(64);
  decode_entry(f, e.data(), kv_back.data(), pe_back.data());
  int saturated = 0;
  for (int i = 0; i < 576; ++i) {
    const float x = bf16_to_f32(i < 512 ? kv16[static_cast<std::size_t>(i)] : pe16[static_cast<std::size_t>(i - 512)]);
    const auto b = static_cast<std::uint8_t>(e[static_cast<std::size_t>(i)]);
    ASSERT_EQ(b, e4m3_expected(static_cast<double>(x / 3.f))) << i;
    const float back = i < 512 ? kv_back[static_cast<std::size_t>(i)] : pe_back[static_cast<std::size_t>(i - 512)];
    EXPECT_EQ(back, e4m3_to_f32(b) * 3.f);
    if (std::fabs(x / 3.f) >= 448) {
      ++saturated;
      EXPECT_EQ(std::fabs(back), 1344.f);
    } else if (std::fabs(x / 3.f) >= 0x1p-6f) {
      EXPECT_LE(std::fabs(back - x), std::fabs(x) / 16 * (1 + 1e-6)) << i;  // half an e4m3 ulp
    }
  }
  EXPECT_GT(saturated, 0);
}

}  // namespace
}  // namespace mlagate
