// The process's kept large blocks (block_pool.h): size classes of a quarter
// step between powers of two, in whole 2 MiB pages at 2 MiB boundaries. A
// request takes the smallest kept block that holds it: whole when it is of
// the request's class or the next one up (at most 1.5x the bytes asked for
// large blocks, 2x just above 4 MiB where the 2 MiB rounding dominates), else
// its first part, the rest kept. When no kept block is large enough, the
// largest ones are moved side by side into one new range (mremap) and only
// what they lack is new memory: an explore search's cases differ in size
// case to case, and a pool that served only a request's own class left a
// quarter of the 2-core VM's new memory to requests that found blocks kept
// but none of their class. Past the limit the least recently kept go back to
// the system.
#include "cases/block_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <list>
#include <mutex>
#include <new>
#include <optional>
#include <unordered_map>
#include <vector>

namespace mlagate {

namespace {

constexpr std::size_t kHuge = std::size_t{2} << 20;

// The class's size: the request rounded up to 1, 1.25, 1.5 or 1.75 times a
// power of two, then to whole 2 MiB pages (huge pages where THP allows).
std::size_t class_bytes(std::size_t bytes) {
  bytes = std::max(bytes, kBlockPoolMinBytes);  // the pool's requests are never smaller
  const int top = std::bit_width(bytes) - 1;  // 2^top <= bytes
  const std::size_t quarter = (std::size_t{1} << top) / 4;
  std::size_t c = (bytes + quarter - 1) / quarter * quarter;
  c = (c + kHuge - 1) / kHuge * kHuge;
  return c;
}

struct Kept {
  void* p;
  std::size_t bytes;  // its class size
};

struct Pool {
  std::mutex mutex;
  std::list<Kept> kept;  // most recently kept first
  // The size of each block handed out: a request may get a block of a larger
  // class than its own, and is given back under its own byte count.
  std::unordered_map<void*, std::size_t> out;
  std::size_t kept_bytes = 0;
  std::size_t taken = 0, gathered = 0, fresh = 0, fresh_bytes = 0;
  std::size_t limit = 0;
  bool limit_read = false;
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: blocks may be given back during static destruction
  return *p;
}

std::size_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) : 0;
}

// A 32nd of the memory, at most 2 GiB: 16 processes keep half of it at most.
std::size_t default_limit() { return std::min(physical_memory() / 32, std::size_t{2} << 30); }

std::size_t read_limit() {
  if (const auto set = block_pool_bytes_of(std::getenv(kBlockPoolVariable))) return *set;
  return default_limit();
}

// `bytes` (whole 2 MiB pages) at a 2 MiB boundary, so that every page of the
// block can be a huge page: mapped 2 MiB larger, the ends trimmed.
// The limit, read on first use; P.mutex held.
std::size_t limit_of(Pool& P) {
  if (!P.limit_read) P.limit = read_limit(), P.limit_read = true;
  return P.limit;
}

// Moves the least recently kept blocks past the limit into `drop` (splicing
// allocates nothing), to be unmapped outside the lock; P.mutex held.
void evict_past_limit(Pool& P, std::list<Kept>& drop) {
  while (P.kept_bytes > limit_of(P)) {
    P.kept_bytes -= P.kept.back().bytes;
    drop.splice(drop.end(), P.kept, std::prev(P.kept.end()));
  }
}

void* map_block(std::size_t bytes) {
  void* raw = mmap(nullptr, bytes + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto at = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t begin = (at + kHuge - 1) & ~(std::uintptr_t{kHuge} - 1);
  if (begin > at) munmap(raw, begin - at);
  if (const std::uintptr_t tail = at + bytes + kHuge - (begin + bytes); tail > 0)
    munmap(reinterpret_cast<void*>(begin + bytes), tail);
  void* p = reinterpret_cast<void*>(begin);
#ifdef MADV_HUGEPAGE
  madvise(p, bytes, MADV_HUGEPAGE);  // advice only: errors ignored
#endif
  return p;
}

// The first `bytes` of kept block `it` (whole 2 MiB pages), out of the pool:
// the rest, if any, stays kept in its place; P.mutex held.
Kept take_front(Pool& P, std::list<Kept>::iterator it, std::size_t bytes) {
  const Kept head{it->p, bytes};
  if (it->bytes > bytes) {
    it->p = static_cast<std::byte*>(it->p) + bytes;
    it->bytes -= bytes;
  } else {
    P.kept.erase(it);
  }
  P.kept_bytes -= bytes;
  return head;
}

#if defined(__linux__) && defined(MREMAP_FIXED)
constexpr bool kCanMovePages = true;
#else
constexpr bool kCanMovePages = false;  // no mremap: a request larger than every kept block is new memory
#endif

// Moves kept block k's pages to `to`, a range of a block being gathered: the
// page tables move (2 MiB at a time where they are huge pages), no byte is
// copied or cleared. False when the range could not be filled at all.
bool move_pages(const Kept& k, void* to) noexcept {
#if defined(__linux__) && defined(MREMAP_FIXED)
  if (mremap(k.p, k.bytes, k.bytes, MREMAP_MAYMOVE | MREMAP_FIXED, to) != MAP_FAILED) return true;
#endif
  // Not moved (out of mappings, say): `to` may have been unmapped, so map it
  // anew (new memory, as without a pool) and let the kept block go.
  munmap(k.p, k.bytes);
  if (mmap(to, k.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) return false;
#ifdef MADV_HUGEPAGE
  madvise(to, k.bytes, MADV_HUGEPAGE);
#endif
  return true;
}

}  // namespace

std::optional<std::size_t> block_pool_bytes_of(const char* mb) {
  if (!mb || *mb < '0' || *mb > '9') return std::nullopt;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(mb, &end, 10);
  // Whole megabytes up to a pebibyte; anything else (a sign, a unit) is ignored.
  if (!end || *end != '\0' || n > (1ull << 30)) return std::nullopt;
  return static_cast<std::size_t>(n) << 20;
}

std::size_t block_pool_share(std::size_t processes) {
  const std::size_t share = physical_memory() / 2 / std::max<std::size_t>(1, processes);
  return std::max(default_limit(), std::min(share, std::size_t{8} << 30));
}

std::size_t block_pool_limit() {
  Pool& P = pool();
  const std::lock_guard lock(P.mutex);
  return limit_of(P);
}

void* block_pool_take(std::size_t bytes) {
  const std::size_t want = class_bytes(bytes);
  const std::size_t most = class_bytes(want + 1);  // this class and the next one up: taken whole
  Pool& P = pool();
  std::vector<Kept> parts;  // kept blocks to move side by side, in order
  {
    const std::lock_guard lock(P.mutex);
    auto best = P.kept.end();
    for (auto it = P.kept.begin(); it != P.kept.end(); ++it)
      if (it->bytes >= want && (best == P.kept.end() || it->bytes < best->bytes)) best = it;
    if (best != P.kept.end()) {
      const std::size_t n = best->bytes <= most ? best->bytes : want;
      P.out.emplace(best->p, n);  // first: if it throws, the block is still kept
      const Kept k = take_front(P, best, n);
      ++P.taken;
      return k.p;
    }
    // No kept block holds it: the largest ones, the last of them split where
    // it holds more than the rest of the request needs.
    std::size_t have = 0;
    if (kCanMovePages) {
      parts.reserve(P.kept.size());  // so that no push_back below throws once blocks leave the list
      while (have < want && !P.kept.empty()) {
        const auto largest =
            std::max_element(P.kept.begin(), P.kept.end(), [](const Kept& a, const Kept& b) { return a.bytes < b.bytes; });
        const std::size_t n = std::min(largest->bytes, want - have);
        parts.push_back(take_front(P, largest, n));
        have += n;
      }
    }
    ++(parts.empty() ? P.fresh : P.gathered);
    P.fresh_bytes += want - have;
  }
  void* p = nullptr;
  try {
    p = map_block(want);
  } catch (...) {
    for (const Kept& k : parts) munmap(k.p, k.bytes);  // out of memory: let them go too
    throw;
  }
  std::size_t at = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (!move_pages(parts[i], static_cast<std::byte*>(p) + at)) {
      for (std::size_t j = i + 1; j < parts.size(); ++j) munmap(parts[j].p, parts[j].bytes);
      munmap(p, want);
      throw std::bad_alloc();
    }
    at += parts[i].bytes;
  }
  try {
    const std::lock_guard lock(P.mutex);
    P.out.emplace(p, want);
  } catch (...) {
    munmap(p, want);
    throw;
  }
  return p;
}

void block_pool_give(void* p, std::size_t bytes) noexcept {
  if (!p) return;
  Pool& P = pool();
  // Nothing below allocates but the one list node of a kept block (whose
  // failure unmaps the block instead): this runs in destructors.
  void* unmap = nullptr;
  std::size_t unmap_bytes = 0;
  std::list<Kept> drop;  // filled by splicing, which allocates nothing
  {
    const std::lock_guard lock(P.mutex);
    std::size_t size = class_bytes(bytes);
    if (const auto it = P.out.find(p); it != P.out.end()) {
      size = it->second;
      P.out.erase(it);
    }
    if (size > limit_of(P)) {
      unmap = p, unmap_bytes = size;
    } else {
      try {
        P.kept.push_front({p, size});
        P.kept_bytes += size;
      } catch (...) {
        unmap = p, unmap_bytes = size;
      }
      evict_past_limit(P, drop);
    }
  }
  if (unmap) munmap(unmap, unmap_bytes);  // outside the lock
  for (const Kept& k : drop) munmap(k.p, k.bytes);
}

void block_pool_set_limit(std::size_t bytes) {
  Pool& P = pool();
  std::list<Kept> drop;
  {
    const std::lock_guard lock(P.mutex);
    P.limit = bytes, P.limit_read = true;
    evict_past_limit(P, drop);
  }
  for (const Kept& k : drop) munmap(k.p, k.bytes);
}

BlockPoolStats block_pool_stats() {
  Pool& P = pool();
  const std::lock_guard lock(P.mutex);
  return {P.taken, P.gathered, P.fresh, P.fresh_bytes, P.kept_bytes, limit_of(P)};
}

void block_pool_release() {
  Pool& P = pool();
  const std::lock_guard lock(P.mutex);
  for (const Kept& k : P.kept) munmap(k.p, k.bytes);
  P.kept.clear();
  P.kept_bytes = 0;
}

}  // namespace mlagate
