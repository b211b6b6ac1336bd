// The table between the libtorch reference module (libmlagate_torch_reference.so,
// built from torch_module.cpp) and its loader (torch_reference_loader.cpp).
// libtorch costs every process that links it about 0.6 s of CPU at start
// (operator registration and ~20,000 relocations), and only `--baseline torch`
// and tests/torch use it: so it lives in a module loaded on first use, and
// mlagate, its workers and the test programs start without it.
//
// Both sides are built together from one tree; `key` guards against a module
// of another build (another commit or other layouts). No exception crosses the
// boundary: the module returns its message instead, the loader throws it again.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "mlagate/version.h"
#include "reference/torch/torch_reference.h"

namespace mlagate::torch_module {

// The module's file name, and its entry point (extern "C", the only symbol it exports).
inline constexpr char kFileName[] = "libmlagate_torch_reference.so";
inline constexpr char kEntry[] = "mlagate_torch_reference_module";

// A call's outcome: empty on success; `unsupported` when libtorch cannot
// compute it here (the loader throws NotSupportedError then).
struct Outcome {
  std::string error;
  bool unsupported = false;
};

// What both sides must agree on: the commit and the sizes of what crosses.
inline std::string build_key() {
  return std::string(MLAGATE_VERSION "+" MLAGATE_GIT_COMMIT) + "/" + std::to_string(sizeof(Case)) + "/" +
         std::to_string(sizeof(SdpaResult)) + "/" + std::to_string(sizeof(TorchReferenceOptions)) + "/" +
         std::to_string(sizeof(std::string)) + "/" + std::to_string(sizeof(Outcome));
}

struct Api {
  const char* key;  // build_key() of the module's build
  std::string (*info)();  // "libtorch 1.13.1, CPU"
  bool (*cuda_available)();
  Outcome (*layer)(const Case&, SdpaForm, std::span<const int>, const TorchReferenceOptions&, SdpaResult& out);
  Outcome (*kernel)(const Case&, SdpaForm, const TorchReferenceOptions&, std::string& out);
};

using EntryFn = const Api* (*)();

}  // namespace mlagate::torch_module
