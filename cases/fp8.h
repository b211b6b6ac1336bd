// fp8 KV cache formats (SPEC: KV cache dtypes): our own e4m3fn and UE8M0
// encodings, the fp8_ds_mla tile-scale rules, and the byte layout of one
// token's cache entry for every kv cache dtype. The reference cache writer
// (paged_cache.h) and the reference's view of the cache are built from these;
// backends write and read with their own code and are checked against them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cases/dtype.h"

namespace mlagate {

// e4m3fn (OCP FP8 E4M3, "float8_e4m3fn"): 1 sign, 4 exponent (bias 7), 3
// mantissa bits; no infinities; S.1111.111 is NaN; largest finite 448 (0x7E);
// subnormals m * 2^-9. The e4m3fnuz variant (AMD) saturates at 240 instead.
inline constexpr float kE4m3Max = 448.f;
inline constexpr std::uint8_t kE4m3NaN = 0x7F;

// fp32 -> e4m3fn: round to nearest even; |x| >= 448 (infinities included)
// saturates to +-448 (SATFINITE, as vLLM's writers clamp); NaN -> NaN (0x7F
// with x's sign); -0 stays -0 (0x80).
std::uint8_t f32_to_e4m3(float x);
float e4m3_to_f32(std::uint8_t b);  // exact

// UE8M0 (DeepSeek V4 scales, later): an unsigned 8-bit exponent, value
// 2^(u - 127); 0xFF is NaN. Encoding rounds up to a power of two (a smaller
// scale would overflow the tile); 0 and values <= 2^-127 give 0x00; NaN,
// negative, infinite or > 2^127 give 0xFF.
std::uint8_t f32_to_ue8m0(float x);
float ue8m0_to_f32(std::uint8_t u);

// The fp8_ds_mla scale of a 128-element tile from its amax (max |x| in fp32),
// computed in fp32: raw = max(amax / 448, FLT_MIN); pow2 = the smallest power
// of two >= max(amax / 448, 1e-4). Contract: amax 336 -> 1.0 (pow2); an
// all-zero tile -> 2^-13 (pow2) or FLT_MIN = 2^-126 (raw).
float ds_mla_tile_scale(float amax, ScaleRule rule);
inline constexpr int kDsMlaTile = 128;
inline constexpr int kV4Tile = 64;          // fp8_v4 NoPE tile (one UE8M0 scale each)
inline constexpr int kV4BlockAlign = 576;   // fp8_v4 blocks are padded to a multiple of this (FlashMLA)

// One token's cache entry. Byte offsets (L = kv_lora_rank, R = rope_dim):
//   auto        [0, 2L) kv_c, [2L, 2L+2R) k_pe, in the model dtype
//   fp8/_e4m3   [0, L) e4m3(kv_c / k_scale), [L, L+R) e4m3(k_pe / k_scale)
//   fp8_ds_mla  [0, L) e4m3(kv_c / tile scale), tiles of 128; [L, L+4T) the
//               T = L/128 tile scales as fp32; [L+4T, L+4T+2R) k_pe as bf16
//               verbatim. DeepSeek (L 512, R 64): 512 + 16 + 128 = 656 bytes.
//   fp8_v4      DeepSeek V4 (FlashMLA's MODEL1 layout; L 448, R 64): [0, L)
//               e4m3(kv_c / tile scale), tiles of 64; [L, L+2R) k_pe as bf16
//               verbatim (the token's 576 "data" bytes); [L+2R, L+2R+T) the
//               T = L/64 tile scales as UE8M0 bytes (power of two, the pow2
//               rule), then one pad byte: 584 bytes. In the paged cache these
//               entries are NOT contiguous: a block holds every token's data
//               bytes first, then every token's 8 scale bytes, and blocks are
//               padded to a multiple of 576 bytes (PagedCache::load_entry).
// Every multi-byte field is little endian.
struct EntryFormat {
  KvCacheFormat kv;
  DType model = DType::kBF16;  // dtype of the values written (auto entries store it)
  int kv_lora_rank = 0;        // L
  int rope_dim = 0;            // R
  float k_scale = 1.f;         // fp8, fp8_e4m3: values are stored as x / k_scale
  int bytes = 0;               // entry size
  int kv_c_offset = 0, kv_c_elem = 0;  // byte offset and bytes per element of each field
  int scale_offset = 0, scale_count = 0;  // fp8_ds_mla: fp32 tile scales, fp8_v4: UE8M0 bytes (count 0 otherwise)
  int scale_elem = 0;                     // bytes per scale: 4 (fp32) or 1 (UE8M0)
  int tile = 0;                           // elements per scale tile (128 or 64)
  int k_pe_offset = 0, k_pe_elem = 0;
  // fp8_v4: bytes [0, data_bytes) of the entry sit in the block's data region
  // and [data_bytes, bytes) in its scale region; data_bytes == bytes otherwise.
  int data_bytes = 0;
  bool split_pages() const { return data_bytes != bytes; }
};
// Throws InvalidCase when the dims cannot take the format (fp8_ds_mla needs
// L % 128 == 0 and a bf16 model dtype; fp8_v4 L 448, R 64 and bf16).
EntryFormat make_entry_format(KvCacheFormat kv, DType model, int kv_lora_rank, int rope_dim, float k_scale);

// The reference encoding of one token (what the reference writer stores):
// kv_c [L], k_pe [R] as model-dtype bits -> entry [f.bytes]. fp8 values are
// e4m3(x / scale), the division in fp32, rounded to nearest even.
void encode_entry(const EntryFormat& f, const std::uint16_t* kv_c, const std::uint16_t* k_pe, std::byte* entry);
// What a correct reader sees: entry -> kv_c [L], k_pe [R] in fp32,
// e4m3 * scale computed in fp32 (auto and bf16 RoPE widen exactly).
void decode_entry(const EntryFormat& f, const std::byte* entry, float* kv_c, float* k_pe);

// The layout as text, for file attributes and messages, e.g. fp8_ds_mla:
// "kv_c float8_e4m3fn[512] @0; scale float32[4] @512; k_pe bfloat16[64] @528".
std::string entry_layout_string(const EntryFormat& f);
// The element type of the entry's values: "float8_e4m3fn" for the fp8 dtypes,
// the model dtype's name for auto.
std::string entry_value_dtype(const EntryFormat& f);

// The field holding byte `offset` of an entry, for conformance messages.
struct EntryField {
  std::string name;  // "kv_c", "k_pe" or "scale"
  int element = 0;   // element index within the field
};
EntryField entry_field(const EntryFormat& f, int offset);

// Bytes of one block of a paged cache in this format: block_size entries back
// to back, or for fp8_v4 the data region, the scale region and the padding to
// a multiple of 576 bytes.
std::int64_t block_bytes(const EntryFormat& f, int block_size);

}  // namespace mlagate
