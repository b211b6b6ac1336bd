// The exec backend's files (schema in backends/exec/SCHEMA.md): the case
// bundle mlagate writes for a program (each kernel call's problem as
// attributes, its inputs as datasets) and the outputs file the program writes
// back, read with every shape and dtype checked. HDF5 stays in bundle.cpp.
#pragma once

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backends/plugin/abi.h"
#include "cases/tensor.h"

namespace mlagate::exec {

inline constexpr const char* kBundleSchema = "mlagate.exec.bundle";
inline constexpr int kBundleSchemaVersion = 1;

// One kernel call: its problem (plugin.h's fields) and input tensors by name
// ("q_lat", "kv_cache", ...).
struct BundleCall {
  plugin::Problem problem;
  std::vector<std::pair<std::string, TensorView>> inputs;
};

// Writes /calls/0 .. /calls/n-1. Throws on I/O failure.
void write_bundle(const std::string& path, const std::string& backend, std::span<const BundleCall> calls);

// An output the program must write: its name, and where its values go (the
// view's shape and dtype are the expected ones).
struct ExpectedOutput {
  std::string name;
  TensorView dest;
};

// What the program said about one call: "ok" (outputs read into the views),
// "not_supported", "error" or "unavailable", with its message.
struct CallOutcome {
  std::string status = "ok";
  std::string message;
};

// Reads call `index` of an outputs file. A dataset of the wrong shape or dtype
// throws WrongOutputError (an INCORRECT record); a missing or unreadable file,
// group or dataset throws std::runtime_error (CRASHED).
CallOutcome read_outputs(const std::string& path, std::size_t index, std::span<const ExpectedOutput> outputs);

}  // namespace mlagate::exec
