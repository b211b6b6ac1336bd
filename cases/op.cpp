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
  }
  return "?";
}

std::span<const Op> all_ops() {
  static constexpr Op kOps[] = {Op::kDecode, Op::kPrefill, Op::kLayer, Op::kCacheWrite, Op::kSparseDecode, Op::kSparsePrefill};
  return kOps;
}

bool is_sparse_op(Op op) { return op == Op::kSparseDecode || op == Op::kSparsePrefill; }

Op parse_op(std::string_view s) {
  for (Op op : all_ops())
    if (s == op_name(op)) return op;
  throw InputError("unknown op '" + std::string(s) +
                   "' (expected layer, decode, prefill, cache_write, sparse_decode or sparse_prefill)");
}

}  // namespace mlagate
