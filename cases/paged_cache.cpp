// Builds the randomized paged KV cache of MLA_SPEC section 5 and implements the
// reference cache writer for the auto (model dtype) entry layout.
#include "cases/paged_cache.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "cases/encoding.h"
#include "cases/errors.h"
#include "cases/generator.h"

namespace mlagate {

std::string_view poison_name(Poison p) {
  switch (p) {
    case Poison::kNaN: return "nan";
    case Poison::kSentinel: return "sentinel";
    case Poison::kZero: return "zero";
    case Poison::kNone: return "none";
  }
  return "?";
}

Poison parse_poison(std::string_view s) {
  for (Poison p : {Poison::kNaN, Poison::kSentinel, Poison::kZero, Poison::kNone})
    if (s == poison_name(p)) return p;
  throw InputError("unknown poison '" + std::string(s) + "' (expected nan, sentinel, zero or none)");
}

std::uint16_t poison_bits16(Poison p, DType elem) {
  const bool bf = elem == DType::kBF16;
  switch (p) {
    case Poison::kNaN: return bf ? kBF16QuietNaN : kF16QuietNaN;
    // Huge finite values: a kernel that reads them overflows visibly, and a
    // memory dump shows the pattern.
    case Poison::kSentinel: return bf ? 0x7F00 : 0x7BFF;
    case Poison::kZero:
    case Poison::kNone: return 0;
  }
  return 0;
}

std::int64_t PagedCache::slot_of(int request, int pos) const {
  const std::int32_t* bt = block_table.data<std::int32_t>();
  const std::int32_t block = bt[static_cast<std::int64_t>(request) * table_width + pos / block_size];
  return static_cast<std::int64_t>(block) * block_size + pos % block_size;
}

void reference_cache_write(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                           std::span<const std::int64_t> slots) {
  if (cache.kv_dtype != KvCacheDtype::kAuto) throw NotSupportedError("reference_cache_write: only kv dtype auto");
  if (kv_c.dtype != cache.elem_dtype || k_pe.dtype != cache.elem_dtype)
    throw std::invalid_argument("reference_cache_write: kv_c/k_pe dtype differs from the cache's");
  const std::int64_t L = kv_c.shape.at(1), R = k_pe.shape.at(1);
  if (2 * (L + R) != cache.entry_bytes) throw std::invalid_argument("reference_cache_write: entry size mismatch");
  const std::int64_t capacity = static_cast<std::int64_t>(cache.num_blocks) * cache.block_size;
  for (std::size_t t = 0; t < slots.size(); ++t) {
    const std::int64_t slot = slots[t];
    if (slot < 0) continue;
    if (slot >= capacity) throw std::out_of_range("reference_cache_write: slot " + std::to_string(slot) + " out of range");
    std::byte* e = cache.entry(slot);
    std::memcpy(e, static_cast<const std::byte*>(kv_c.data) + t * L * 2, static_cast<std::size_t>(L * 2));
    std::memcpy(e + L * 2, static_cast<const std::byte*>(k_pe.data) + t * R * 2, static_cast<std::size_t>(R * 2));
  }
}

PagedCache build_paged_cache(const Case& c, int block_size, const CacheOptions& opt) {
  if (block_size < 1 || (block_size & (block_size - 1)) != 0)
    throw InvalidCase("block size " + std::to_string(block_size) + " is not a power of two");
  if (opt.spare_blocks < 0) throw InputError("spare blocks must be >= 0");
  const Dims& d = c.spec.dims;
  PagedCache pc;
  pc.kv_dtype = c.spec.kv_cache_dtype;
  pc.elem_dtype = c.spec.dtype;
  pc.block_size = block_size;
  pc.options = opt;
  pc.entry_bytes = static_cast<int>(dtype_size(c.spec.dtype)) * d.head_size();

  // Logical blocks: request i takes ceil(s_i / bs) consecutive blocks from 1.
  std::vector<int> first_block(static_cast<std::size_t>(c.num_requests));
  std::vector<int> nblocks(static_cast<std::size_t>(c.num_requests));
  int used = 0, widest = 1;
  for (int i = 0; i < c.num_requests; ++i) {
    const int nb = (c.seq_lens[static_cast<std::size_t>(i)] + block_size - 1) / block_size;
    first_block[static_cast<std::size_t>(i)] = 1 + used;
    nblocks[static_cast<std::size_t>(i)] = nb;
    used += nb;
    widest = std::max(widest, nb);
  }
  pc.used_blocks = used;
  pc.num_blocks = used + 1 + opt.spare_blocks;
  const int divisor = std::max(1, 128 / block_size);  // vLLM requires width % (128 / bs) == 0
  pc.table_width = (widest + divisor - 1) / divisor * divisor;

  // Seeded Fisher-Yates permutation of the used blocks 1..used (block 0 stays null).
  std::vector<std::int32_t> phys(static_cast<std::size_t>(used) + 1);
  std::iota(phys.begin(), phys.end(), 0);
  const std::uint64_t key = gen::tensor_key("block_perm") ^ static_cast<std::uint64_t>(block_size);
  for (int k = used; k > 1; --k) {
    const auto j = 1 + static_cast<int>(gen::below(static_cast<std::uint64_t>(k), c.spec.seed, key, static_cast<std::uint64_t>(k)));
    std::swap(phys[static_cast<std::size_t>(k)], phys[static_cast<std::size_t>(j)]);
  }

  pc.block_table = Tensor(DType::kI32, {c.num_requests, pc.table_width});
  std::int32_t* bt = pc.block_table.data<std::int32_t>();
  const std::int32_t unused = opt.poison_block_table ? kPoisonBlockId : 0;
  for (int i = 0; i < c.num_requests; ++i)
    for (int j = 0; j < pc.table_width; ++j)
      bt[static_cast<std::int64_t>(i) * pc.table_width + j] =
          j < nblocks[static_cast<std::size_t>(i)] ? phys[static_cast<std::size_t>(first_block[static_cast<std::size_t>(i)] + j)]
                                                   : unused;

  // Everything starts poisoned; writes below leave only unused regions poisoned.
  pc.data = Tensor(DType::kU8, {pc.num_blocks, block_size, pc.entry_bytes});
  const std::uint16_t pb = poison_bits16(opt.poison, pc.elem_dtype);
  if (pb != 0) {
    auto* p16 = reinterpret_cast<std::uint16_t*>(pc.data.bytes());
    std::fill(p16, p16 + pc.data.nbytes() / 2, pb);
  }

  // Context tokens (and, for kernel-level ops, the new tokens) go in through the
  // reference writer, so every backend with this block size reads identical bytes.
  const std::int64_t L = d.kv_lora_rank, R = d.rope_dim;
  std::vector<std::int64_t> slots;
  for (int i = 0; i < c.num_requests; ++i) {
    const int s = c.seq_lens[static_cast<std::size_t>(i)];
    const int written = opt.write_new_tokens ? s : std::max(0, c.context_lens[static_cast<std::size_t>(i)]);
    if (written == 0) continue;
    slots.resize(static_cast<std::size_t>(written));
    for (int p = 0; p < written; ++p) slots[static_cast<std::size_t>(p)] = pc.slot_of(i, p);
    const std::int64_t row = c.kv_start_loc[static_cast<std::size_t>(i)];
    TensorView kv{c.kv_c.dtype(), {written, L}, const_cast<std::byte*>(c.kv_c.bytes()) + row * L * 2};
    TensorView pe{c.k_pe.dtype(), {written, R}, const_cast<std::byte*>(c.k_pe.bytes()) + row * R * 2};
    reference_cache_write(pc, kv, pe, slots);
  }

  // Slots of the new tokens, in token order; padding requests (seq_len 0) skip.
  pc.slot_mapping = Tensor(DType::kI64, {c.num_tokens});
  std::int64_t* sm = pc.slot_mapping.data<std::int64_t>();
  for (int i = 0; i < c.num_requests; ++i) {
    const int s = c.seq_lens[static_cast<std::size_t>(i)], q = c.query_lens[static_cast<std::size_t>(i)];
    for (int u = 0; u < q; ++u)
      sm[c.query_start_loc[static_cast<std::size_t>(i)] + u] = s == 0 ? -1 : pc.slot_of(i, s - q + u);
  }
  return pc;
}

}  // namespace mlagate
