// The list of in-tree backends. Adding a backend is one folder and one line in
// registry.cpp.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"

namespace mlagate {

struct BackendEntry {
  std::string name;
  std::function<std::unique_ptr<Backend>()> make;
};

const std::vector<BackendEntry>& backend_registry();
// Backends whose name matches any of the comma-separated globs ("cpu.*,cuda.ref").
// Throws InputError if a glob matches nothing.
std::vector<std::unique_ptr<Backend>> select_backends(const std::string& globs);
bool glob_match(std::string_view pattern, std::string_view text);

}  // namespace mlagate
