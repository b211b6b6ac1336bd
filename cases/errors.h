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

// The run's baseline cannot be computed for this case (`--baseline torch` on
// an fp16 case with libtorch 1.x on the CPU, which has no fp16 matmul): the
// record is SKIPPED with the reason, never a failure of the backend's.
struct BaselineUnavailableError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The device a backend needs is absent (a CUDA backend on a machine without a
// GPU): the record is SKIPPED, never a pass and never a crash.
struct DeviceUnavailableError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A backend found that a kernel wrote outside its output (device-side guard
// bands): the record is INCORRECT with this message ("out-of-bounds write: ...").
struct OutOfBoundsWriteError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A backend's own checks found an output of the wrong shape or dtype (the exec
// backend reading a program's outputs file): the record is INCORRECT.
struct WrongOutputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A backend ran past its time limit (the exec backend's --exec-timeout): the
// record is TIMEOUT with this message.
struct BackendTimeoutError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace mlagate
