// The list of in-tree backends. Adding a backend is one folder and one line in
// registry.cpp.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"

namespace mlagate {

struct BackendEntry {
  using Factory = std::unique_ptr<Backend> (*)();
  using FactoryWithOptions = std::unique_ptr<Backend> (*)(const BackendOptions&);
  BackendEntry(std::string n, Factory f) : name(std::move(n)), make([f](const BackendOptions&) { return f(); }) {}
  using Make = std::function<std::unique_ptr<Backend>(const BackendOptions&)>;
  BackendEntry(std::string n, FactoryWithOptions f) : name(std::move(n)), make(f) {}
  BackendEntry(std::string n, Make f) : name(std::move(n)), make(std::move(f)) {}  // out-of-tree (plugin, exec)

  std::string name;
  Make make;
};

const std::vector<BackendEntry>& backend_registry();
// Backends whose name matches any of the comma-separated globs ("cpu.*,cuda.ref"),
// made with the given options. Throws InputError if a glob matches nothing.
// `extra`: out-of-tree backends (--plugin, --exec), matched like the registry's;
// a name taken twice (in-tree or out-of-tree) is an InputError.
std::vector<std::unique_ptr<Backend>> select_backends(const std::string& globs, const BackendOptions& options = {},
                                                      std::span<const BackendEntry> extra = {});
bool glob_match(std::string_view pattern, std::string_view text);

// Backends an embedding host registers in this process (the Python module's
// callables): out-of-tree entries that every command's --backend globs match,
// as if given by --plugin. Empty in the mlagate binary.
void set_embedded_backends(std::vector<BackendEntry> entries);
const std::vector<BackendEntry>& embedded_backends();
// The command that runs the CLI with those backends, for repro lines: "mlagate"
// in the binary; the host's own (a Python command loading the same functions).
void set_embedded_command(std::string words);
const std::string& embedded_command();

}  // namespace mlagate
