// The exec backend's files (schema in backends/exec/SCHEMA.md): the case
// bundle mlagate writes for a program (each kernel call's problem as
// attributes, its inputs as datasets) and the outputs file the program writes
// back, read with every shape and dtype checked. HDF5 stays in bundle.cpp.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backends/plugin/abi.h"
#include "cases/tensor.h"

namespace mlagate::exec {

inline constexpr const char* kBundleSchema = "mlagate.exec.bundle";
// Version 2 added the sparse ops (sparse_decode, sparse_prefill) and the
// attributes every call with a paged cache now carries (num_blocks,
// block_bytes, entry_data_bytes, scale_elem_bytes, scale_tile). A bundle is
// stamped with the lowest version that describes it: 1 when every call is a
// dense op (a version-1 program reads it as before), 2 when one is sparse.
inline constexpr int kBundleSchemaVersionDense = 1;
inline constexpr int kBundleSchemaVersion = 2;

// One kernel call: its problem (plugin.h's fields), the op's own attributes
// (the sparse ops' topk, window, ...; SCHEMA.md) and input tensors by name
// ("q_lat", "kv_cache", ...).
struct BundleCall {
  plugin::Problem problem;
  std::vector<std::pair<std::string, std::int64_t>> int_attrs;
  std::vector<std::pair<std::string, TensorView>> inputs;  // contiguous views
  // Strided views' element strides ("q_lat_strides": [T, N, L] strides), one
  // int64 dataset each, beside the view's span (add_strided_input).
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> strides;
};

// A tensor of the call as it is: a contiguous view as a dataset of its shape;
// a strided view (a backend that declares strided_views) as its whole span,
// one flat dataset of its dtype from its first element to its last (whatever
// lies between the rows included), plus NAME_strides, its strides in
// elements (SCHEMA.md, "Strided views").
void add_strided_input(BundleCall& call, const std::string& name, const TensorView& v);

// The schema version a bundle of these calls is stamped with.
int bundle_schema_version(std::span<const BundleCall> calls);

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

// How read_outputs treats a readable call group without an expected dataset.
enum class MissingOutput {
  kCrashed,    // std::runtime_error: the version-1 ops' rule (CRASHED)
  kIncorrect,  // WrongOutputError naming the dataset and what the group holds instead (the sparse ops)
};

// Reads call `index` of an outputs file. A strided destination view takes its
// shape (unpacked into its elements) or its whole span (copied over it,
// padding included). A dataset of the wrong shape or dtype
// throws WrongOutputError (an INCORRECT record); a missing or unreadable file
// or group throws std::runtime_error (CRASHED), a missing dataset as `missing`
// says.
CallOutcome read_outputs(const std::string& path, std::size_t index, std::span<const ExpectedOutput> outputs,
                         MissingOutput missing = MissingOutput::kCrashed);

}  // namespace mlagate::exec
