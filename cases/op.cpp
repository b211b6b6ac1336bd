// Op names: one table for printing and parsing.
#include "cases/op.h"

#include <algorithm>
#include <string>

#include "cases/errors.h"

namespace mlagate {

std::string_view op_name(Op op) {
  switch (op) {
    case Op::kDecode: return "decode";
    case Op::kPrefill: return "prefill";
    case Op::kLayer: return "layer";
    case Op::kCacheWrite: return "cache_write";
    case Op::kSparseDecode: return "sparse_decode";
    case Op::kSparsePrefill: return "sparse_prefill";
    case Op::kMergeStates: return "merge_states";
  }
  return "?";
}

std::span<const Op> all_ops() {
  static constexpr Op kOps[] = {Op::kDecode, Op::kPrefill, Op::kLayer, Op::kCacheWrite, Op::kSparseDecode, Op::kSparsePrefill, Op::kMergeStates};
  return kOps;
}

bool is_sparse_op(Op op) { return op == Op::kSparseDecode || op == Op::kSparsePrefill; }
bool is_merge_op(Op op) { return op == Op::kMergeStates; }

Op parse_op(std::string_view s) {
  for (Op op : all_ops())
    if (s == op_name(op)) return op;
  throw InputError("unknown op '" + std::string(s) +
                   "' (expected layer, decode, prefill, cache_write, sparse_decode, sparse_prefill or merge_states)");
}

std::string op_names(std::span<const Op> ops) {
  std::string s;
  for (Op op : ops) s += (s.empty() ? "" : ",") + std::string(op_name(op));
  return s;
}

std::vector<Op> parse_op_names(std::string_view s, std::string_view what) {
  std::vector<Op> ops;
  for (std::size_t at = 0; at <= s.size();) {
    const std::size_t end = std::min(s.find(',', at), s.size());
    Op op;
    try {
      op = parse_op(s.substr(at, end - at));
    } catch (const InputError& e) {
      throw InputError(std::string(what) + ": " + e.what());
    }
    for (Op seen : ops)
      if (seen == op) throw InputError(std::string(what) + " names " + std::string(op_name(op)) + " twice");
    ops.push_back(op);
    at = end + 1;
  }
  return ops;
}

}  // namespace mlagate
