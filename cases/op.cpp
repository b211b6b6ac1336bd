// Op names: one table for printing and parsing.
#include "cases/op.h"

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

}  // namespace mlagate
