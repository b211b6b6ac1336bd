// Backends written in Python: a kernel-level op's arguments as a dict of
// PyTensors and numbers (the same names for a backend's call and for a case's
// inputs from mlagate.cases()), and PyBackend, a Backend whose ops call the
// Python layer's dispatcher (mlagate/_backend.py), which calls the user's
// function, moves tensors to the GPU and back when asked, and answers how the
// call went.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/registry.h"

namespace mlagate::py {

namespace pyb = pybind11;

// How an argument's tensors reach Python: borrowed for a call (valid during it,
// outputs written in place), or copied (a case's inputs, kept by Python).
enum class Hold { kBorrow, kCopy };

pyb::dict decode_args(const DecodeArgs& a, Hold h);
pyb::dict prefill_args(const PrefillArgs& a, Hold h);
pyb::dict sparse_decode_args(const SparseDecodeArgs& a, Hold h);
pyb::dict sparse_prefill_args(const SparsePrefillArgs& a, Hold h);
pyb::dict merge_states_args(const MergeStatesArgs& a, Hold h);

// The case's parameters as plain Python values (id, suite, batch, dims, ...).
pyb::dict spec_dict(const CaseSpec& spec);

// A Python backend as declared by mlagate.Backend: its capabilities and two
// callables of the Python layer.
struct PyBackendDecl {
  std::string name, description;
  Capabilities caps;
  // dispatch(op: str, args: dict) -> None on success, or (kind, message) with
  // kind "error" (CRASHED), "not_supported" (NOT_SUPPORTED) or "wrong_output" (INCORRECT).
  pyb::object dispatch;
  // supports(case: dict, op: str) -> None when supported, else the reason (str); or None.
  pyb::object supports;
  // --cuda-graph (declared with cuda_graph=True, else None): capture(args: dict) -> a graph
  // object whose replay(args: dict) answers as dispatch does, or (kind, message) as dispatch answers.
  pyb::object capture;
  ~PyBackendDecl();
};

BackendEntry py_backend_entry(std::shared_ptr<PyBackendDecl> decl);

// Capabilities from the declaration's words ("decode", "bf16", "fp8_ds_mla",
// "varlen"); throws InputError naming a word it does not know.
Capabilities parse_capabilities(const std::vector<std::string>& ops, const std::vector<int>& block_sizes,
                                const std::vector<std::string>& dtypes, const std::vector<std::string>& kv_dtypes,
                                const std::string& query_len_support, int reorder_threshold);

}  // namespace mlagate::py
