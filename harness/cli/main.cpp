// mlagate entry point: everything happens in cli_main. Only the real binary
// can start isolation workers (itself, by exec), so only it names one.
#include "harness/run/allocator.h"
#include "harness/cli/cli.h"
#include "harness/reliability/isolate.h"

int main(int argc, char** argv) {
  mlagate::keep_freed_memory();
  mlagate::set_worker_executable("/proc/self/exe");
  return mlagate::cli_main(argc, argv);
}
