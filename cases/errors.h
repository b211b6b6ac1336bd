// Exception types shared by every layer. The CLI maps them to exit codes:
// InputError -> 2 (usage or input), InvalidCase -> INVALID_CASE records or 2,
// anything else -> 3 (internal).
#pragma once

#include <stdexcept>
#include <string>

namespace mlagate {

// Bad user input: malformed suite file, unknown name, impossible sweep.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A case whose parameters cannot describe a valid MLA problem.
struct InvalidCase : InputError {
  using InputError::InputError;
};

// A backend was asked for something it does not implement.
struct NotSupportedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace mlagate
