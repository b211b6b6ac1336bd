// Out-of-tree backends from shared libraries (`--plugin lib.so`): the library
// is loaded and every table of include/mlagate/plugin.h is checked before any
// backend is made; each backend it exports becomes a registry entry, so
// --backend globs select plugin backends like in-tree ones.
#pragma once

#include <string>
#include <vector>

#include "backends/registry.h"
#include "cases/errors.h"

namespace mlagate {

// A library that cannot be used: missing file, dlopen failure, no entry
// symbol, wrong ABI version, malformed tables, null function pointers. An
// InputError: the CLI exits 2 with this message.
struct PluginLoadError : InputError {
  using InputError::InputError;
};

// Loads one library (it stays mapped until the process exits) and returns one
// entry per backend it exports, in table order. Throws PluginLoadError.
std::vector<BackendEntry> load_plugin(const std::string& path);

// What an out-of-tree backend may be called: 1-64 letters, digits, '.', '_', '-'.
bool valid_backend_name(const std::string& name);

}  // namespace mlagate
