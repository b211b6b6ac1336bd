// mlagate entry point: everything happens in cli_main. Only the real binary
// can start isolation workers (itself, by exec), so only it names one.
#include <malloc.h>

#include "harness/cli.h"
#include "harness/isolate.h"

int main(int argc, char** argv) {
  // Keep freed memory for the next case instead of returning it to the kernel.
  // A run allocates and frees the same large buffers (caches, up-projected
  // keys, Eigen temporaries) case after case; glibc serves blocks over its mmap
  // threshold (at most 32 MiB) with fresh mmaps, so each was zeroed and
  // page-faulted again: measured, a third of a prefill-heavy run's CPU time
  // (README, Performance). Peak memory is unchanged: cases run one at a time.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
  mlagate::set_worker_executable("/proc/self/exe");
  return mlagate::cli_main(argc, argv);
}
