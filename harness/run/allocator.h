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
// (PERFORMANCE.md). Trimming is off (-1), not merely raised: the largest
// buffers (a TP 1 case's up-projected K and V, 2.7 GB) are beyond any
// threshold mallopt's int can hold, and each trim cost the next case a
// gigabyte-scale round of page faults. Peak memory is unchanged: cases run
// one at a time.
inline void keep_freed_memory() {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);
  mallopt(M_TOP_PAD, 64 << 20);
}

}  // namespace mlagate
