// The process's kept large blocks (block_pool.h): size classes of a quarter
// step between powers of two, in whole 2 MiB pages, so a block serves any
// request of its class and a request takes the smallest kept block of its
// class or the next one up (at most 1.5x the bytes asked for large blocks,
// 2x just above 4 MiB where the 2 MiB rounding dominates). Past the limit the
// least recently kept go back to the system.
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
#include <unordered_map>

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
  std::size_t taken = 0, fresh = 0;
  std::size_t limit = 0;
  bool limit_read = false;
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: blocks may be given back during static destruction
  return *p;
}

std::size_t read_limit() {
  if (const char* v = std::getenv("MLAGATE_BLOCK_POOL_MB"); v && *v >= '0' && *v <= '9') {
    char* end = nullptr;
    const unsigned long long mb = std::strtoull(v, &end, 10);
    // Whole megabytes up to a pebibyte; anything else (a sign, a unit) is ignored.
    if (end && *end == '\0' && mb <= (1ull << 30)) return static_cast<std::size_t>(mb) << 20;
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const std::size_t phys = pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) : 0;
  return std::min(phys / 32, std::size_t{2} << 30);
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

}  // namespace

std::size_t block_pool_limit() {
  Pool& P = pool();
  const std::lock_guard lock(P.mutex);
  return limit_of(P);
}

void* block_pool_take(std::size_t bytes) {
  const std::size_t want = class_bytes(bytes);
  const std::size_t most = class_bytes(want + 1);  // this class and the next one up
  Pool& P = pool();
  {
    const std::lock_guard lock(P.mutex);
    auto best = P.kept.end();
    for (auto it = P.kept.begin(); it != P.kept.end(); ++it)
      if (it->bytes >= want && it->bytes <= most && (best == P.kept.end() || it->bytes < best->bytes)) best = it;
    if (best != P.kept.end()) {
      const Kept k = *best;
      P.out.emplace(k.p, k.bytes);  // first: if it throws, the block is still kept
      P.kept_bytes -= k.bytes;
      P.kept.erase(best);
      ++P.taken;
      return k.p;
    }
    ++P.fresh;
  }
  void* p = map_block(want);
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
  return {P.taken, P.fresh, P.kept_bytes, limit_of(P)};
}

void block_pool_release() {
  Pool& P = pool();
  const std::lock_guard lock(P.mutex);
  for (const Kept& k : P.kept) munmap(k.p, k.bytes);
  P.kept.clear();
  P.kept_bytes = 0;
}

}  // namespace mlagate
