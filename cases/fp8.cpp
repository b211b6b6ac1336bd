// e4m3fn and UE8M0 by bit manipulation, the fp8_ds_mla scale rules, and the
// reference encoding and decoding of a cache entry. Built with
// -ffp-contract=off: every product and quotient is one IEEE fp32 operation.
#include "cases/fp8.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "cases/encoding.h"
#include "cases/errors.h"

namespace mlagate {

std::uint8_t f32_to_e4m3(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | kE4m3NaN;
  // 448 = 1.75 * 2^8 is 0x43E00000; everything at or above it (inf too) saturates.
  if (a >= 0x43E00000u) return sign | 0x7E;
  const int e = static_cast<int>(a >> 23) - 127;  // unbiased fp32 exponent (-127: zero or fp32 subnormal)
  if (e < -6) {
    // Below e4m3's smallest normal 2^-6: a multiple of the subnormal unit 2^-9,
    // q = round_half_even(x / 2^-9) in [0, 8]; q == 8 is the smallest normal (code 0x08).
    if (e < -11) return sign;  // |x| < 2^-11 < half a unit: zero (fp32 subnormals included)
    const std::uint32_t mant = (a & 0x007FFFFFu) | 0x00800000u;  // x = mant * 2^(e - 23)
    const int shift = 14 - e;                                    // 21..25: bits below the 2^-9 unit
    const std::uint32_t kept = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    const std::uint32_t q = kept + ((rem > half || (rem == half && (kept & 1u))) ? 1u : 0u);
    return static_cast<std::uint8_t>(sign | q);
  }
  // Normal: biased exponent e + 7 in [1, 15], 3 of the 23 mantissa bits kept.
  std::uint32_t code = (static_cast<std::uint32_t>(e + 7) << 3) | ((a >> 20) & 0x7u);
  const std::uint32_t rem = a & 0x000FFFFFu;
  if (rem > 0x00080000u || (rem == 0x00080000u && (code & 1u))) ++code;  // a carry bumps the exponent
  // Below 448 the largest result is 0x7E (448 itself): 0x7F (NaN) cannot come out.
  return static_cast<std::uint8_t>(sign | code);
}

float e4m3_to_f32(std::uint8_t b) {
  const bool neg = (b & 0x80u) != 0;
  const int exp = (b >> 3) & 0xF, mant = b & 0x7;
  float v;
  if (exp == 0xF && mant == 0x7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    v = static_cast<float>(mant) * 0x1p-9f;  // subnormal: exact
  } else {
    // (8 + mant) * 2^(exp - 10), built from bits: exact.
    v = std::bit_cast<float>((static_cast<std::uint32_t>(exp - 7 + 127) << 23) | (static_cast<std::uint32_t>(mant) << 20));
  }
  return neg ? -v : v;
}

std::uint8_t f32_to_ue8m0(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if (u == 0 || u == 0x80000000u) return 0x00;
  if ((u >> 31) != 0 || (u & 0x7F800000u) == 0x7F800000u) return 0xFF;  // negative, inf, NaN
  const std::uint32_t e = u >> 23;         // biased exponent 0..254
  const std::uint32_t mant = u & 0x7FFFFFu;
  if (e == 0) return mant <= 0x00400000u ? 0x00 : 0x01;  // fp32 subnormal: <= 2^-127 or up to 2^-126
  const std::uint32_t code = mant == 0 ? e : e + 1;       // round up to a power of two
  return code >= 0xFF ? 0xFF : static_cast<std::uint8_t>(code);
}

float ue8m0_to_f32(std::uint8_t u) {
  if (u == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  if (u == 0) return std::bit_cast<float>(0x00400000u);  // 2^-127, an fp32 subnormal
  return std::bit_cast<float>(static_cast<std::uint32_t>(u) << 23);
}

float ds_mla_tile_scale(float amax, ScaleRule rule) {
  const float s = amax / kE4m3Max;
  if (rule == ScaleRule::kRaw) return std::max(s, FLT_MIN);
  // 2^ceil(log2(t)) from the bits: t itself when it is a power of two, else the
  // next one up. t >= 1e-4 is a normal number.
  const float t = std::max(s, 1e-4f);
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(t);
  if ((bits & 0x7F800000u) == 0x7F800000u) return t;  // inf or NaN amax: propagate
  if ((bits & 0x007FFFFFu) == 0) return t;
  return std::bit_cast<float>(((bits >> 23) + 1) << 23);
}

EntryFormat make_entry_format(KvCacheFormat kv, DType model, int kv_lora_rank, int rope_dim, float k_scale) {
  EntryFormat f;
  f.kv = kv;
  f.model = model;
  f.kv_lora_rank = kv_lora_rank;
  f.rope_dim = rope_dim;
  f.k_scale = k_scale;
  const int L = kv_lora_rank, R = rope_dim;
  switch (kv.dtype) {
    case KvCacheDtype::kAuto:
      f.kv_c_elem = f.k_pe_elem = static_cast<int>(dtype_size(model));
      f.k_pe_offset = L * f.kv_c_elem;
      f.bytes = (L + R) * f.kv_c_elem;
      break;
    case KvCacheDtype::kFp8:
    case KvCacheDtype::kFp8E4m3:
      f.kv_c_elem = f.k_pe_elem = 1;
      f.k_pe_offset = L;
      f.bytes = L + R;
      break;
    case KvCacheDtype::kFp8DsMla:
      if (L % kDsMlaTile != 0)
        throw InvalidCase("fp8_ds_mla needs kv_lora_rank a multiple of 128, got " + std::to_string(L));
      if (model != DType::kBF16) throw InvalidCase("fp8_ds_mla stores RoPE as bf16 verbatim: the model dtype must be bf16");
      f.kv_c_elem = 1;
      f.scale_offset = L;
      f.scale_count = L / kDsMlaTile;
      f.k_pe_offset = L + 4 * f.scale_count;
      f.k_pe_elem = 2;
      f.bytes = f.k_pe_offset + 2 * R;
      f.scale_elem = 4;
      f.tile = kDsMlaTile;
      break;
    case KvCacheDtype::kFp8V4:
      // The only layout in the wild (FlashMLA MODEL1): 448 NoPE + 64 RoPE.
      if (L != 448 || R != 64)
        throw InvalidCase("fp8_v4 is DeepSeek V4's entry: kv_lora_rank 448 and rope dim 64, got " + std::to_string(L) +
                          " and " + std::to_string(R));
      if (model != DType::kBF16) throw InvalidCase("fp8_v4 stores RoPE as bf16 verbatim: the model dtype must be bf16");
      f.kv_c_elem = 1;
      f.k_pe_offset = L;
      f.k_pe_elem = 2;
      f.data_bytes = L + 2 * R;
      f.scale_offset = f.data_bytes;
      f.scale_count = L / kV4Tile;
      f.scale_elem = 1;
      f.tile = kV4Tile;
      f.bytes = f.data_bytes + (f.scale_count + 8) / 8 * 8;  // 7 scales + 1 pad = 8
      break;
  }
  if (f.data_bytes == 0) f.data_bytes = f.bytes;
  if (kv.dtype != KvCacheDtype::kFp8DsMla && kv.scale_rule != ScaleRule::kPow2)
    throw InvalidCase("scale rule " + std::string(scale_rule_name(kv.scale_rule)) + " applies to fp8_ds_mla only");
  return f;
}

namespace {

float load16(std::uint16_t bits, DType dt) { return dt == DType::kBF16 ? bf16_to_f32(bits) : f16_to_f32(bits); }

// Tables for the per-element conversions, which were most of building an fp8
// cache (perf: f32_to_e4m3, encode_entry, decode_entry and e4m3_to_f32 were 9%
// of a vllm-suite run's CPU time). Each entry is the function's own result,
// so the bits are those of the element-wise path.
const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> v{};
    for (int b = 0; b < 256; ++b) v[static_cast<std::size_t>(b)] = e4m3_to_f32(static_cast<std::uint8_t>(b));
    return v;
  }();
  return t;
}

// e4m3(x / scale) for every 16-bit input x of the model dtype: fp8 /
// fp8_e4m3 entries with their k_scale, and the tiles of fp8_ds_mla (pow2
// rule) and fp8_v4, whose scales are powers of two, a handful in a cache (a
// tile's amax / 448 of unit normals is about 2^-7). A few tables per thread
// (the formats a run alternates between are few); one is 64 KiB and 65,536
// conversions to build, as many as a 128-token cache of rank 512 makes.
constexpr std::int64_t kTableEntries = std::int64_t{1} << 16;

struct EncodingTables {
  struct Table {
    DType model;
    std::uint32_t scale_bits;
    std::unique_ptr<std::uint8_t[]> codes;
  };
  std::array<Table, 8> tables{};
  std::size_t next = 0;
  std::int64_t served = kTableEntries;  // conversions the tables made since the last build

  const std::uint8_t* find(DType model, float scale) const {
    const auto bits = std::bit_cast<std::uint32_t>(scale);
    for (const Table& t : tables)
      if (t.codes && t.model == model && t.scale_bits == bits) return t.codes.get();
    return nullptr;
  }
  const std::uint8_t* build(DType model, float scale) {
    Table& t = tables[next++ % tables.size()];
    t.model = model;
    t.scale_bits = std::bit_cast<std::uint32_t>(scale);
    t.codes = std::make_unique<std::uint8_t[]>(kTableEntries);
    for (std::uint32_t x = 0; x < kTableEntries; ++x) t.codes[x] = f32_to_e4m3(load16(static_cast<std::uint16_t>(x), model) / scale);
    served = 0;
    return t.codes.get();
  }
};

EncodingTables& encoding_tables() {
  thread_local EncodingTables t;
  return t;
}

// fp8 / fp8_e4m3: one scale for the whole cache.
const std::uint8_t* e4m3_encoding_table(DType model, float k_scale) {
  EncodingTables& T = encoding_tables();
  const std::uint8_t* t = T.find(model, k_scale);
  return t ? t : T.build(model, k_scale);
}

// A tile of n elements: its scale's table, or null (convert element by
// element) where a build would not pay for itself yet. A table is built only
// once the tables have made as many conversions as a build since the last
// one, so tiles whose scales keep changing cost at most twice the
// element-wise conversions (and a thread's first table).
const std::uint8_t* e4m3_tile_table(DType model, float scale, int n) {
  EncodingTables& T = encoding_tables();
  if (const std::uint8_t* t = T.find(model, scale)) {
    T.served += n;
    return t;
  }
  return T.served >= kTableEntries ? T.build(model, scale) : nullptr;
}

// out[i] = e4m3(x[i] / scale) for a tile of n elements: through the scale's
// table where `tables` allows one and it pays, else element by element.
void encode_tile(DType model, float scale, bool tables, const std::uint16_t* x, int n, std::uint8_t* out) {
  if (const std::uint8_t* code = tables ? e4m3_tile_table(model, scale, n) : nullptr) {
    for (int i = 0; i < n; ++i) out[i] = code[x[i]];
    return;
  }
  for (int i = 0; i < n; ++i) out[i] = f32_to_e4m3(load16(x[i], model) / scale);
}

}  // namespace

void encode_entry(const EntryFormat& f, const std::uint16_t* kv_c, const std::uint16_t* k_pe, std::byte* entry) {
  const int L = f.kv_lora_rank, R = f.rope_dim;
  auto* out = reinterpret_cast<std::uint8_t*>(entry);
  switch (f.kv.dtype) {
    case KvCacheDtype::kAuto:
      std::memcpy(entry, kv_c, static_cast<std::size_t>(L) * 2);
      std::memcpy(entry + f.k_pe_offset, k_pe, static_cast<std::size_t>(R) * 2);
      return;
    case KvCacheDtype::kFp8:
    case KvCacheDtype::kFp8E4m3: {
      const std::uint8_t* code = e4m3_encoding_table(f.model, f.k_scale);
      for (int i = 0; i < L; ++i) out[i] = code[kv_c[i]];
      for (int i = 0; i < R; ++i) out[L + i] = code[k_pe[i]];
      return;
    }
    case KvCacheDtype::kFp8DsMla:
      for (int t = 0; t < f.scale_count; ++t) {
        const std::uint16_t* x = kv_c + t * kDsMlaTile;
        float amax = 0;
        for (int i = 0; i < kDsMlaTile; ++i) amax = std::max(amax, std::abs(load16(x[i], f.model)));
        const float scale = ds_mla_tile_scale(amax, f.kv.scale_rule);
        // The raw rule's scales are a tile's own, too many for tables.
        encode_tile(f.model, scale, f.kv.scale_rule == ScaleRule::kPow2, x, kDsMlaTile, out + t * kDsMlaTile);
        std::memcpy(entry + f.scale_offset + 4 * t, &scale, 4);
      }
      std::memcpy(entry + f.k_pe_offset, k_pe, static_cast<std::size_t>(R) * 2);  // bf16 verbatim
      return;
    case KvCacheDtype::kFp8V4:
      std::memset(entry + f.scale_offset, 0, static_cast<std::size_t>(f.bytes - f.scale_offset));  // the pad byte
      for (int t = 0; t < f.scale_count; ++t) {
        const std::uint16_t* x = kv_c + t * kV4Tile;
        float amax = 0;
        for (int i = 0; i < kV4Tile; ++i) amax = std::max(amax, std::abs(load16(x[i], f.model)));
        // The pow2 rule's scale is a power of two, so its UE8M0 code is exact.
        const float scale = ds_mla_tile_scale(amax, ScaleRule::kPow2);
        encode_tile(f.model, scale, true, x, kV4Tile, out + t * kV4Tile);
        out[f.scale_offset + t] = f32_to_ue8m0(scale);
      }
      std::memcpy(entry + f.k_pe_offset, k_pe, static_cast<std::size_t>(R) * 2);  // bf16 verbatim
      return;
  }
}

void decode_entry(const EntryFormat& f, const std::byte* entry, float* kv_c, float* k_pe) {
  const int L = f.kv_lora_rank, R = f.rope_dim;
  const auto* in = reinterpret_cast<const std::uint8_t*>(entry);
  const std::array<float, 256>& e4m3 = e4m3_values();
  auto load_bits = [&](int offset, int i) {
    std::uint16_t b;
    std::memcpy(&b, entry + offset + 2 * i, 2);
    return b;
  };
  switch (f.kv.dtype) {
    case KvCacheDtype::kAuto:
      for (int i = 0; i < L; ++i) kv_c[i] = load16(load_bits(0, i), f.model);
      for (int i = 0; i < R; ++i) k_pe[i] = load16(load_bits(f.k_pe_offset, i), f.model);
      return;
    case KvCacheDtype::kFp8:
    case KvCacheDtype::kFp8E4m3:
      for (int i = 0; i < L; ++i) kv_c[i] = e4m3[in[i]] * f.k_scale;
      for (int i = 0; i < R; ++i) k_pe[i] = e4m3[in[L + i]] * f.k_scale;
      return;
    case KvCacheDtype::kFp8DsMla:
      for (int t = 0; t < f.scale_count; ++t) {
        float scale;
        std::memcpy(&scale, entry + f.scale_offset + 4 * t, 4);
        for (int i = t * kDsMlaTile; i < (t + 1) * kDsMlaTile; ++i) kv_c[i] = e4m3[in[i]] * scale;
      }
      for (int i = 0; i < R; ++i) k_pe[i] = bf16_to_f32(load_bits(f.k_pe_offset, i));
      return;
    case KvCacheDtype::kFp8V4:
      for (int t = 0; t < f.scale_count; ++t) {
        const float scale = ue8m0_to_f32(in[f.scale_offset + t]);
        for (int i = t * kV4Tile; i < (t + 1) * kV4Tile; ++i) kv_c[i] = e4m3[in[i]] * scale;
      }
      for (int i = 0; i < R; ++i) k_pe[i] = bf16_to_f32(load_bits(f.k_pe_offset, i));
      return;
  }
}

std::string entry_value_dtype(const EntryFormat& f) {
  return is_fp8(f.kv.dtype) ? "float8_e4m3fn" : std::string(dtype_name(f.model));
}

std::string entry_layout_string(const EntryFormat& f) {
  const bool bf16_rope = f.kv.dtype == KvCacheDtype::kFp8DsMla || f.kv.dtype == KvCacheDtype::kFp8V4;
  const std::string k_pe_dtype = bf16_rope ? "bfloat16" : entry_value_dtype(f);
  std::string s = "kv_c " + entry_value_dtype(f) + "[" + std::to_string(f.kv_lora_rank) + "] @" + std::to_string(f.kv_c_offset);
  const std::string scale = "; scale " + std::string(f.scale_elem == 1 ? "ue8m0" : "float32") + "[" +
                            std::to_string(f.scale_count) + "] @" + std::to_string(f.scale_offset);
  if (f.scale_count > 0 && f.scale_offset < f.k_pe_offset) s += scale;
  s += "; k_pe " + k_pe_dtype + "[" + std::to_string(f.rope_dim) + "] @" + std::to_string(f.k_pe_offset);
  if (f.scale_count > 0 && f.scale_offset > f.k_pe_offset) s += scale;
  if (f.split_pages())
    s += "; per block: every token's " + std::to_string(f.data_bytes) + " data bytes, then every token's " +
         std::to_string(f.bytes - f.data_bytes) + " scale bytes, padded to a multiple of " + std::to_string(kV4BlockAlign);
  return s;
}

std::int64_t block_bytes(const EntryFormat& f, int block_size) {
  const std::int64_t raw = static_cast<std::int64_t>(block_size) * f.bytes;
  if (!f.split_pages()) return raw;
  return (raw + kV4BlockAlign - 1) / kV4BlockAlign * kV4BlockAlign;
}

EntryField entry_field(const EntryFormat& f, int offset) {
  if (offset < f.kv_lora_rank * f.kv_c_elem) return {"kv_c", offset / f.kv_c_elem};
  if (f.scale_count > 0 && offset >= f.scale_offset && offset < f.scale_offset + f.scale_elem * f.scale_count)
    return {"scale", (offset - f.scale_offset) / f.scale_elem};
  if (offset >= f.data_bytes) return {"pad", offset - f.data_bytes};
  return {"k_pe", (offset - f.k_pe_offset) / f.k_pe_elem};
}

}  // namespace mlagate
