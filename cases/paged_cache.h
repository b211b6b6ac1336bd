// The paged KV cache exactly as SPEC: The paged cache: null block 0, each request's
// blocks consecutive from 1 then permuted by the case's generator, a block table
// padded to a multiple of 128/bs, spare blocks, slot mapping and poison.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <string>

#include "cases/case.h"
#include "cases/fp8.h"
#include "cases/page_store.h"
#include "cases/tensor.h"

namespace mlagate {

enum class Poison : std::uint8_t { kNaN, kSentinel, kZero, kNone };
std::string_view poison_name(Poison p);
Poison parse_poison(std::string_view s);  // throws InputError

// An invalid, huge block id for unused block-table entries (poisoned tables).
inline constexpr std::int32_t kPoisonBlockId = 2147480000;
inline constexpr int kDefaultSpareBlocks = 100;

struct CacheOptions {
  Poison poison = Poison::kNaN;     // null block, spare blocks, unused tails
  bool poison_block_table = false;  // unused table entries = kPoisonBlockId instead of 0
  bool write_new_tokens = true;     // false: the layer op writes them (cache_write)
  int spare_blocks = kDefaultSpareBlocks;
};

struct PagedCache {
  KvCacheDtype kv_dtype = KvCacheDtype::kAuto;
  DType elem_dtype = DType::kBF16;  // the model dtype (of an "auto" entry's elements)
  // Format facts writers and readers share (cases/fp8.h has the byte layouts).
  ScaleRule scale_rule = ScaleRule::kPow2;  // fp8_ds_mla tile scales
  float k_scale = 1.f;                      // fp8, fp8_e4m3: entries hold e4m3(x / k_scale)
  int kv_lora_rank = 0, rope_dim = 0;       // L, R
  int block_size = 0;
  int num_blocks = 0;        // used + 1 (null) + spare
  int used_blocks = 0;       // blocks assigned to requests
  int entry_bytes = 0;       // bytes per token entry (auto: 2 * (L + R); fp8: L + R; fp8_ds_mla: 656; fp8_v4: 584)
  std::int64_t block_bytes = 0;  // bytes per block (block_size * entry_bytes; fp8_v4: padded, cases/fp8.h)
  int table_width = 0;       // block-table columns (multiple of 128 / bs)
  // [num_blocks, block_size, entry_bytes] uint8; fp8_v4: [num_blocks, block_bytes]. Placed
  // (cases/page_store.h) in the strided and pool layouts: a layer of a stacked
  // cache, or a huge pool whose blocks 1 .. gap are never written.
  PageStore data;
  Tensor block_table;        // [B, table_width] int32
  Tensor slot_mapping;       // [T] int64: slot of each new token; < 0 means skip
  CacheOptions options;

  // A token's entry in place: formats whose entries are contiguous (all but
  // fp8_v4, which must go through load_entry / store_entry).
  std::byte* entry(std::int64_t slot) { return data.bytes() + slot * entry_bytes; }
  const std::byte* entry(std::int64_t slot) const { return data.bytes() + slot * entry_bytes; }
  bool split_pages() const { return block_bytes != static_cast<std::int64_t>(block_size) * entry_bytes; }
  // Any format: the entry_bytes bytes of a slot's entry in the logical order
  // of cases/fp8.h (fp8_v4: data bytes, then scale bytes) out of / into the pages.
  void load_entry(std::int64_t slot, std::byte* dst) const;
  void store_entry(std::int64_t slot, const std::byte* src);
  // Where byte `offset` of `data` belongs: the slot and the offset within its
  // logical entry; slot -1 for a block's padding (fp8_v4).
  std::pair<std::int64_t, int> locate_byte(std::int64_t offset) const;
  // Physical slot of token p of request i, through the block table.
  std::int64_t slot_of(int request, int pos) const;
  EntryFormat format() const;
};

// Builds the cache for one block size; context tokens are always written. The
// case's layout (cases/LAYOUTS.md) places it: shared prefix pages, the
// case's blocks at the top of a pool past 2^31 or 2^32 bytes, a layer of a
// stacked cache.
PagedCache build_paged_cache(const Case& c, int block_size, const CacheOptions& opt = {});

// The reference cache writer (bit-exact by definition) for every kv cache
// dtype: token rows kv_c[row], k_pe[row] to the given slots, encoded as
// cases/fp8.h's encode_entry; negative slots are skipped.
// kv_c: [n, L], k_pe: [n, R] in the model dtype.
void reference_cache_write(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                           std::span<const std::int64_t> slots);

// The reference reader: entry at `slot` as fp32 kv_c [L], k_pe [R] (decode_entry).
void reference_cache_read(const PagedCache& cache, std::int64_t slot, float* kv_c, float* k_pe);

// Poison pattern for one element of the given dtype (raw bits, little endian).
std::uint16_t poison_bits16(Poison p, DType elem);
// One entry's worth of poison for a format: each field gets its own type's
// pattern (NaN: e4m3 0x7F, fp32 and bf16 quiet NaN; sentinel: the largest
// finite values; zero and none: 0).
void poison_entry(const EntryFormat& f, Poison p, std::byte* entry);

// Where two caches of the same shape first differ, in the words of the
// cache_write conformance check: "first differing byte: token 5 (request 2,
// position 45), field kv_c, element 17, got 0x3a expected 0x3b". new_slots
// [T] maps new tokens to slots (the slot mapping). Empty when identical.
std::string first_cache_difference(const PagedCache& got, const PagedCache& expected,
                                   std::span<const std::int64_t> new_slots, std::span<const std::int32_t> query_start_loc);

}  // namespace mlagate
