// Large host blocks kept for reuse inside a process (Tensor's storage). A
// block the size of a case's cache or weights comes from mmap, and every
// first touch of its pages is a page fault in which the kernel zeroes the
// page; freeing it gives the pages back. A run makes such tensors for every
// case, so on the 2-core VM a third of explore's CPU samples were page faults
// and the kernel's zeroing (perf, 2026-12-03). Blocks freed here are kept,
// their pages resident, and serve later requests: a kept block larger than a
// request is split (the rest stays kept), and a request larger than any kept
// block gathers kept blocks into one range by moving their pages (mremap: the
// page tables move, no byte is copied or cleared), so that only what the
// pool lacks is new memory. The bytes a tensor holds are still only what its
// owner writes (Tensor's constructor zero-fills, for_overwrite leaves them),
// so no value depends on where a block came from.
#pragma once

#include <cstddef>
#include <optional>

namespace mlagate {

struct BlockPoolStats {
  std::size_t taken = 0;        // requests served by one kept block (whole or its first part)
  std::size_t gathered = 0;     // requests served by kept blocks moved together (and new pages for the rest)
  std::size_t fresh = 0;        // requests that found nothing kept: all new memory
  std::size_t fresh_bytes = 0;  // bytes of new memory mapped for requests (gathered ones' rest included)
  std::size_t kept_bytes = 0;   // bytes kept now
  std::size_t limit_bytes = 0;  // what it keeps at most
};

// Blocks below this go to operator new as before.
inline constexpr std::size_t kBlockPoolMinBytes = std::size_t{4} << 20;

// Under AddressSanitizer Tensor's storage does not use the pool: its blocks
// are outside ASan's heap, and a reused block would hide a read past a
// tensor or after its end of life (the asan preset, the fuzz project).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kBlockPoolForTensors = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kBlockPoolForTensors = false;
#else
inline constexpr bool kBlockPoolForTensors = true;
#endif
#else
inline constexpr bool kBlockPoolForTensors = true;
#endif

// At least `bytes` (>= kBlockPoolMinBytes), at a 2 MiB boundary; throws
// std::bad_alloc. Give it back with the same `bytes`.
void* block_pool_take(std::size_t bytes);
void block_pool_give(void* p, std::size_t bytes) noexcept;

// The variable that sets the limit, in MiB.
inline constexpr const char* kBlockPoolVariable = "MLAGATE_BLOCK_POOL_MB";
// Such a value in bytes: whole MiB up to a pebibyte; nullopt (the pool then
// keeps its default) for anything else, a sign or a unit say, or null.
std::optional<std::size_t> block_pool_bytes_of(const char* mb);

// What the pool keeps at most: MLAGATE_BLOCK_POOL_MB where set (0 turns
// keeping off), else a 32nd of the machine's memory, at most 2 GiB (16
// workers side by side keep at most half of it between them).
std::size_t block_pool_limit();
// What each of `processes` processes side by side may keep when the run knows
// how many there are (harness/reliability share_cores sets it for its
// workers): half the machine's memory between them, as the default assumes
// for 16, at most 8 GiB each, never less than the default above. A TP 1
// prefill's up-projected keys and values are 2.7 GB (3.1 GB in the pool's
// size classes): under the default's 736 MB on the 2-core VM, each such case
// mapped and zeroed most of them again (PERFORMANCE.md, "Where the time goes").
std::size_t block_pool_share(std::size_t processes);
// Sets it (tests, embedders); blocks kept past it are freed.
void block_pool_set_limit(std::size_t bytes);
BlockPoolStats block_pool_stats();
// Frees every kept block (tests; a process that ends frees them anyway).
void block_pool_release();

}  // namespace mlagate
