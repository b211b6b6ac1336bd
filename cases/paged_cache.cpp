// Builds the randomized paged KV cache of SPEC: The paged cache and implements the
// reference cache writer and reader for every kv cache dtype (cases/fp8.h).
#include "cases/paged_cache.h"

#include <algorithm>
#include <cstring>
#include <limits>
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

void PagedCache::load_entry(std::int64_t slot, std::byte* dst) const {
  if (!split_pages()) {
    std::memcpy(dst, entry(slot), static_cast<std::size_t>(entry_bytes));
    return;
  }
  const EntryFormat f = format();
  const std::byte* block = data.bytes() + slot / block_size * block_bytes;
  const std::int64_t o = slot % block_size;
  std::memcpy(dst, block + o * f.data_bytes, static_cast<std::size_t>(f.data_bytes));
  const int tail = f.bytes - f.data_bytes;
  std::memcpy(dst + f.data_bytes, block + static_cast<std::int64_t>(block_size) * f.data_bytes + o * tail,
              static_cast<std::size_t>(tail));
}

void PagedCache::store_entry(std::int64_t slot, const std::byte* src) {
  if (!split_pages()) {
    std::memcpy(entry(slot), src, static_cast<std::size_t>(entry_bytes));
    return;
  }
  const EntryFormat f = format();
  std::byte* block = data.bytes() + slot / block_size * block_bytes;
  const std::int64_t o = slot % block_size;
  std::memcpy(block + o * f.data_bytes, src, static_cast<std::size_t>(f.data_bytes));
  const int tail = f.bytes - f.data_bytes;
  std::memcpy(block + static_cast<std::int64_t>(block_size) * f.data_bytes + o * tail, src + f.data_bytes,
              static_cast<std::size_t>(tail));
}

std::pair<std::int64_t, int> PagedCache::locate_byte(std::int64_t offset) const {
  if (!split_pages()) return {offset / entry_bytes, static_cast<int>(offset % entry_bytes)};
  const EntryFormat f = format();
  const std::int64_t block = offset / block_bytes, in = offset % block_bytes;
  const std::int64_t data_end = static_cast<std::int64_t>(block_size) * f.data_bytes;
  const int tail = f.bytes - f.data_bytes;
  if (in < data_end) return {block * block_size + in / f.data_bytes, static_cast<int>(in % f.data_bytes)};
  if (in < data_end + static_cast<std::int64_t>(block_size) * tail)
    return {block * block_size + (in - data_end) / tail, f.data_bytes + static_cast<int>((in - data_end) % tail)};
  return {-1, 0};
}

EntryFormat PagedCache::format() const {
  return make_entry_format({kv_dtype, scale_rule}, elem_dtype, kv_lora_rank, rope_dim, k_scale);
}

void reference_cache_write(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                           std::span<const std::int64_t> slots) {
  if (kv_c.dtype != cache.elem_dtype || k_pe.dtype != cache.elem_dtype)
    throw std::invalid_argument("reference_cache_write: kv_c/k_pe dtype differs from the cache's");
  const std::int64_t L = kv_c.shape.at(1), R = k_pe.shape.at(1);
  if (L != cache.kv_lora_rank || R != cache.rope_dim)
    throw std::invalid_argument("reference_cache_write: kv_c/k_pe widths differ from the cache's L, R");
  const EntryFormat f = cache.format();
  if (f.bytes != cache.entry_bytes) throw std::invalid_argument("reference_cache_write: entry size mismatch");
  if (kv_c.shape.at(0) < static_cast<std::int64_t>(slots.size()) || k_pe.shape.at(0) < static_cast<std::int64_t>(slots.size()))
    throw std::invalid_argument("reference_cache_write: fewer rows than slots");
  const std::int64_t capacity = static_cast<std::int64_t>(cache.num_blocks) * cache.block_size;
  const auto* kv = static_cast<const std::uint16_t*>(kv_c.data);
  const auto* pe = static_cast<const std::uint16_t*>(k_pe.data);
  // Slots checked first (no exception may leave a parallel loop). Distinct
  // slots are encoded in parallel (fp8 entry encoding was most of building a
  // cache); each entry's bytes depend on its token alone, so the cache is the
  // same bits either way. A repeated slot must end with the last token's
  // entry, so then the loop stays sequential.
  std::vector<std::int64_t> sorted;
  sorted.reserve(slots.size());
  for (const std::int64_t slot : slots) {
    if (slot >= capacity) throw std::out_of_range("reference_cache_write: slot " + std::to_string(slot) + " out of range");
    if (slot >= 0) sorted.push_back(slot);
  }
  std::sort(sorted.begin(), sorted.end());
  const bool distinct = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
  const auto n = static_cast<std::int64_t>(slots.size());
#pragma omp parallel if (distinct && n >= 64)
  {
    std::vector<std::byte> entry(static_cast<std::size_t>(f.bytes));
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < n; ++t) {
      const std::int64_t slot = slots[static_cast<std::size_t>(t)];
      if (slot < 0) continue;
      encode_entry(f, kv + t * L, pe + t * R, entry.data());
      cache.store_entry(slot, entry.data());
    }
  }
}

void reference_cache_read(const PagedCache& cache, std::int64_t slot, float* kv_c, float* k_pe) {
  const std::int64_t capacity = static_cast<std::int64_t>(cache.num_blocks) * cache.block_size;
  if (slot < 0 || slot >= capacity) throw std::out_of_range("reference_cache_read: slot " + std::to_string(slot) + " out of range");
  std::byte entry[4096];
  if (cache.entry_bytes > static_cast<int>(sizeof entry)) throw std::invalid_argument("reference_cache_read: entry too large");
  cache.load_entry(slot, entry);
  decode_entry(cache.format(), entry, kv_c, k_pe);
}

void poison_entry(const EntryFormat& f, Poison p, std::byte* entry) {
  std::memset(entry, 0, static_cast<std::size_t>(f.bytes));
  if (p == Poison::kZero || p == Poison::kNone) return;
  const bool nan = p == Poison::kNaN;
  auto fill16 = [&](int offset, int count, std::uint16_t bits) {
    for (int i = 0; i < count; ++i) std::memcpy(entry + offset + 2 * i, &bits, 2);
  };
  const int L = f.kv_lora_rank, R = f.rope_dim;
  if (f.kv.dtype == KvCacheDtype::kAuto) {
    fill16(0, L + R, poison_bits16(p, f.model));
    return;
  }
  // e4m3: NaN, or 448 (the largest finite) as the sentinel.
  const std::uint8_t e4m3 = nan ? kE4m3NaN : 0x7E;
  std::memset(entry, e4m3, static_cast<std::size_t>(L));
  if (f.kv.dtype == KvCacheDtype::kFp8V4) {
    // UE8M0 0xFF is NaN; 0xFE is 2^127.
    std::memset(entry + f.scale_offset, nan ? 0xFF : 0xFE, static_cast<std::size_t>(f.scale_count));
    fill16(f.k_pe_offset, R, poison_bits16(p, DType::kBF16));
    return;
  }
  if (f.kv.dtype != KvCacheDtype::kFp8DsMla) {
    std::memset(entry + f.k_pe_offset, e4m3, static_cast<std::size_t>(R));
    return;
  }
  const std::uint32_t scale = nan ? 0x7FC00000u : 0x7F000000u;  // quiet NaN or 2^127
  for (int t = 0; t < f.scale_count; ++t) std::memcpy(entry + f.scale_offset + 4 * t, &scale, 4);
  fill16(f.k_pe_offset, R, poison_bits16(p, DType::kBF16));
}

namespace {

std::string hex_byte(std::byte b) {
  static const char* digits = "0123456789abcdef";
  const auto v = static_cast<unsigned>(b);
  return std::string("0x") + digits[v >> 4] + digits[v & 15];
}

// Which token a slot holds: a new token (by the slot mapping), a request's
// context token (by the block table), or none.
std::string describe_slot(const PagedCache& c, std::int64_t slot, std::span<const std::int64_t> new_slots,
                          std::span<const std::int32_t> query_start_loc) {
  for (std::size_t t = 0; t < new_slots.size(); ++t) {
    if (new_slots[t] != slot) continue;
    const auto token = static_cast<std::int64_t>(t);
    int r = 0;
    while (r + 2 < static_cast<int>(query_start_loc.size()) && query_start_loc[r + 1] <= token) ++r;
    // Position of the token within its request: read back from the block table.
    const std::int64_t block = slot / c.block_size;
    const std::int32_t* row = c.block_table.data<std::int32_t>() + static_cast<std::int64_t>(r) * c.table_width;
    int pos = -1;
    for (int j = 0; j < c.table_width; ++j)
      if (row[j] == block) pos = j * c.block_size + static_cast<int>(slot % c.block_size);
    return "token " + std::to_string(t) + " (request " + std::to_string(r) + ", position " + std::to_string(pos) + ")";
  }
  const std::int64_t block = slot / c.block_size, offset = slot % c.block_size;
  const std::int32_t* bt = c.block_table.data<std::int32_t>();
  for (std::int64_t i = 0; i < c.block_table.dim(0); ++i)
    for (int j = 0; j < c.table_width; ++j)
      if (bt[i * c.table_width + j] == block && block != 0)
        return "slot " + std::to_string(slot) + " (request " + std::to_string(i) + ", position " +
               std::to_string(j * c.block_size + offset) + ", not a new token)";
  return "slot " + std::to_string(slot) + " (block " + std::to_string(block) + ", offset " + std::to_string(offset) +
         ", owned by no request)";
}

}  // namespace

std::string first_cache_difference(const PagedCache& got, const PagedCache& expected,
                                   std::span<const std::int64_t> new_slots, std::span<const std::int32_t> query_start_loc) {
  if (got.data.nbytes() != expected.data.nbytes() || got.entry_bytes != expected.entry_bytes)
    return "cache shape changed: " + shape_str(got.data.shape()) + ", expected " + shape_str(expected.data.shape());
  const std::byte* a = got.data.bytes();
  const std::byte* b = expected.data.bytes();
  const std::size_t n = got.data.nbytes();
  std::size_t first = n, bytes = 0, entries = 0;
  std::int64_t last_entry = -1;
  // The live bytes (a huge pool's gap is never written, in either cache).
  // Equal stretches are skipped a chunk at a time by memcmp (a correct
  // writer's cache is equal everywhere; the byte loop was 4% of an explore
  // search's CPU); a chunk that differs is walked byte by byte.
  constexpr std::size_t kChunk = 4096;
  expected.data.for_each_live_range([&](std::int64_t lo, std::int64_t hi) {
    for (auto c = static_cast<std::size_t>(lo); c < static_cast<std::size_t>(hi); c += kChunk) {
      const std::size_t end = std::min(c + kChunk, static_cast<std::size_t>(hi));
      if (std::memcmp(a + c, b + c, end - c) == 0) continue;
      for (std::size_t i = c; i < end; ++i) {
        if (a[i] == b[i]) continue;
        if (first == n) first = i;
        ++bytes;
        const std::int64_t e = expected.locate_byte(static_cast<std::int64_t>(i)).first;
        if (e != last_entry) ++entries, last_entry = e;
      }
    }
  });
  if (first == n) {
    const std::string layers = got.data.check_other_layers();
    return layers.empty() ? std::string() : "outside the cache's layer: " + layers;
  }
  const auto [slot, offset] = expected.locate_byte(static_cast<std::int64_t>(first));
  if (slot < 0)
    return "first differing byte: block padding at byte " + std::to_string(first) + " of the cache, got " +
           hex_byte(a[first]) + " expected " + hex_byte(b[first]) + " (" + std::to_string(bytes) + " byte(s) differ)";
  const EntryField field = entry_field(expected.format(), offset);
  return "first differing byte: " + describe_slot(expected, slot, new_slots, query_start_loc) + ", field " + field.name +
         ", element " + std::to_string(field.element) + ", got " + hex_byte(a[first]) + " expected " + hex_byte(b[first]) +
         " (" + std::to_string(bytes) + " byte(s) in " + std::to_string(entries) + " entr" + (entries == 1 ? "y" : "ies") +
         " differ)";
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
  pc.scale_rule = c.spec.scale_rule;
  pc.k_scale = c.spec.k_scale;
  pc.kv_lora_rank = d.kv_lora_rank;
  pc.rope_dim = d.rope_dim;
  const EntryFormat format = pc.format();
  pc.entry_bytes = format.bytes;

  // Logical blocks: request i takes ceil(s_i / bs) consecutive blocks from 1.
  // Layout shared: every request holding the prefix (cases/case.h) after the
  // first maps the prefix's full blocks to the first one's (prefix caching
  // shares whole blocks only) and takes the rest of its blocks of its own.
  const int prefix = shared_prefix_tokens(c.spec), shared_blocks = prefix / block_size;
  int owner = -1;
  std::vector<int> first_block(static_cast<std::size_t>(c.num_requests));
  std::vector<int> nblocks(static_cast<std::size_t>(c.num_requests));
  std::vector<int> shared(static_cast<std::size_t>(c.num_requests), 0);
  int used = 0, widest = 1;
  for (int i = 0; i < c.num_requests; ++i) {
    const auto k = static_cast<std::size_t>(i);
    const int nb = (c.seq_lens[k] + block_size - 1) / block_size;
    if (shared_blocks > 0 && c.context_lens[k] >= prefix) {
      if (owner < 0) owner = i;
      else shared[k] = shared_blocks;
    }
    first_block[k] = 1 + used - shared[k];  // table column j >= shared[k] names logical block first_block + j
    nblocks[k] = nb;
    used += nb - shared[k];
    widest = std::max(widest, nb);
  }
  pc.used_blocks = used;
  // Pool layouts: blocks 1 .. gap are a never-written gap, so that the spares
  // and the case's blocks above them start past 2^31 or 2^32 bytes.
  pc.block_bytes = block_bytes(format, block_size);
  const std::int64_t floor_bytes = c.spec.layout.pool_floor_bytes();
  const std::int64_t gap = floor_bytes > 0 ? (floor_bytes + pc.block_bytes - 1) / pc.block_bytes : 0;
  if (gap + used + 1 + opt.spare_blocks > std::numeric_limits<std::int32_t>::max())
    throw InvalidCase("layout " + layout_name(c.spec.layout) + ": more blocks than an int32 block table names");
  pc.num_blocks = static_cast<int>(gap) + used + 1 + opt.spare_blocks;
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
  // Above the gap and the spares.
  if (gap > 0)
    for (std::size_t k = 1; k < phys.size(); ++k) phys[k] += static_cast<std::int32_t>(gap) + opt.spare_blocks;

  pc.block_table = Tensor(DType::kI32, {c.num_requests, pc.table_width});
  std::int32_t* bt = pc.block_table.data<std::int32_t>();
  const std::int32_t unused = opt.poison_block_table ? kPoisonBlockId : 0;
  for (int i = 0; i < c.num_requests; ++i) {
    const auto k = static_cast<std::size_t>(i);
    for (int j = 0; j < pc.table_width; ++j) {
      std::int32_t b = unused;
      if (j < shared[k]) b = bt[static_cast<std::int64_t>(owner) * pc.table_width + j];
      else if (j < nblocks[k]) b = phys[static_cast<std::size_t>(first_block[k] + j)];
      bt[static_cast<std::int64_t>(i) * pc.table_width + j] = b;
    }
  }

  // Everything starts poisoned; writes below leave only unused regions
  // poisoned. A placed pool poisons its live bytes only (the gap stays unbacked).
  const Shape shape = format.split_pages() ? Shape{pc.num_blocks, pc.block_bytes}
                                           : Shape{pc.num_blocks, block_size, pc.entry_bytes};
  const std::int64_t pool_bytes = static_cast<std::int64_t>(pc.num_blocks) * pc.block_bytes;
  if (c.spec.layout.strided || gap > 0) {
    PageStore::Placement place;
    if (gap > 0) place.gap_begin = pc.block_bytes, place.gap_end = (gap + 1) * pc.block_bytes;
    // A stacked cache: a layer on each side (at most 64 MiB each: what
    // matters is that the pool does not start at its allocation).
    if (c.spec.layout.strided) place.before = place.after = std::min<std::int64_t>(pool_bytes, std::int64_t{64} << 20);
    pc.data = PageStore(shape, place);
  } else {
    pc.data = Tensor(DType::kU8, shape);
  }
  if (pc.kv_dtype == KvCacheDtype::kAuto) {
    const std::uint16_t pb = poison_bits16(opt.poison, pc.elem_dtype);
    if (pb != 0)
      pc.data.for_each_live_range([&](std::int64_t b, std::int64_t e) {
        auto* p16 = reinterpret_cast<std::uint16_t*>(pc.data.bytes() + b);
        std::fill(p16, p16 + (e - b) / 2, pb);
      });
  } else if (opt.poison != Poison::kZero && opt.poison != Poison::kNone) {
    std::vector<std::byte> pattern(static_cast<std::size_t>(pc.entry_bytes));
    poison_entry(format, opt.poison, pattern.data());
    pc.data.for_each_live_range([&](std::int64_t b, std::int64_t e) {
      for (std::int64_t slot = b / pc.block_bytes * block_size; slot < e / pc.block_bytes * block_size; ++slot)
        pc.store_entry(slot, pattern.data());
    });
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
