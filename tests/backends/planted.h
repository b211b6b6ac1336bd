// Planted-bug backends (tests only, never in the registry): broken variants of
// cpu.paged, one per real MLA bug class, each with the verdict the harness
// must reach on it. They prove the harness catches what it exists to catch.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "harness/record.h"

namespace mlagate {

struct PlantedBug {
  std::string name;         // "bug.<what>", also the backend's name()
  std::string description;
  Status expected;          // the verdict on a case that exposes the bug
  std::function<std::unique_ptr<Backend>()> make;
};

// bug.causal_off_by_one, bug.scale_1pct, bug.null_block_last_token,
// bug.heads_swapped, bug.one_nan, bug.lse_wrong_axis. Each keeps cpu.paged's
// capabilities, so it runs on the same cases.
const std::vector<PlantedBug>& planted_bugs();

}  // namespace mlagate
