// The paged KV cache exactly as MLA_SPEC section 5: null block 0, each request's
// blocks consecutive from 1 then permuted by the case's generator, a block table
// padded to a multiple of 128/bs, spare blocks, slot mapping and poison.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "cases/case.h"
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
  DType elem_dtype = DType::kBF16;  // element type of an "auto" entry (the model dtype)
  int block_size = 0;
  int num_blocks = 0;        // used + 1 (null) + spare
  int used_blocks = 0;       // blocks assigned to requests
  int entry_bytes = 0;       // bytes per token entry (auto: 2 * (L + R))
  int table_width = 0;       // block-table columns (multiple of 128 / bs)
  Tensor data;               // [num_blocks, block_size, entry_bytes] uint8
  Tensor block_table;        // [B, table_width] int32
  Tensor slot_mapping;       // [T] int64: slot of each new token; < 0 means skip
  CacheOptions options;

  std::byte* entry(std::int64_t slot) { return data.bytes() + slot * entry_bytes; }
  const std::byte* entry(std::int64_t slot) const { return data.bytes() + slot * entry_bytes; }
  // Physical slot of token p of request i, through the block table.
  std::int64_t slot_of(int request, int pos) const;
};

// Builds the cache for one block size; context tokens are always written.
PagedCache build_paged_cache(const Case& c, int block_size, const CacheOptions& opt = {});

// The reference cache writer (bit-exact by definition): token rows kv_c[row],
// k_pe[row] to the given slots; negative slots are skipped.
// kv_c: [n, L], k_pe: [n, R] in the model dtype.
void reference_cache_write(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                           std::span<const std::int64_t> slots);

// Poison pattern for one element of the given dtype (raw bits, little endian).
std::uint16_t poison_bits16(Poison p, DType elem);

}  // namespace mlagate
