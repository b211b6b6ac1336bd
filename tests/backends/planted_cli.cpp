// mlagate with the planted merge_states and layout bugs (tests/backends/planted.h) as
// embedded backends: the binary `mlagate shrink` spawns for its candidates
// must know the backend it shrinks on, and no plugin or exec backend can take
// the merge op, so the tests that shrink a planted merge bug run this instead
// of the real binary. Test-only; never installed.
#include "backends/registry.h"
#include "harness/cli/cli.h"
#include "harness/reliability/isolate.h"
#include "harness/run/allocator.h"
#include "tests/backends/planted.h"

int main(int argc, char** argv) {
  mlagate::keep_freed_memory();
  mlagate::set_worker_executable("/proc/self/exe");
  std::vector<mlagate::BackendEntry> entries;
  for (const auto* list : {&mlagate::planted_merge_bugs(), &mlagate::planted_layout_bugs()})
    for (const mlagate::PlantedBug& b : *list) {
      auto make = b.make;
      entries.emplace_back(b.name, mlagate::BackendEntry::Make([make](const mlagate::BackendOptions&) { return make(); }));
    }
  mlagate::set_embedded_backends(std::move(entries));
  return mlagate::cli_main(argc, argv);
}
