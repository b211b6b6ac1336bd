// glibc allocator settings for runs of many large cases: shared by the mlagate
// binary and the test binaries (which run whole suites in-process).
#pragma once

#include <malloc.h>

namespace mlagate {

// Keep freed memory for the next case instead of returning it to the kernel.
// A run allocates and frees the same large buffers (caches, up-projected
// keys, Eigen temporaries) case after case; glibc serves blocks over its mmap
// threshold (at most 32 MiB) with fresh mmaps, so each was zeroed and
// page-faulted again: measured, a third of a prefill-heavy run's CPU time
// (PERFORMANCE.md). Peak memory is unchanged: cases run one at a time.
inline void keep_freed_memory() {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
}

}  // namespace mlagate
