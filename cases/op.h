// The ops a backend may implement and the harness composes (SPEC: Ops): one
// list, named once, shared by the backends, the runner, the golden files and
// the reports.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace mlagate {

// kSparseDecode / kSparsePrefill: DeepSeek V3.2 and V4 sparse attention
// (cases/sparse.h); they run on sparse cases only. kMergeStates: vLLM's
// merge_attn_states, two partial results merged through their LSEs
// (cases/merge.h); it runs on merge cases only. The others run on dense cases.
enum class Op : std::uint8_t { kDecode, kPrefill, kLayer, kCacheWrite, kSparseDecode, kSparsePrefill, kMergeStates };
std::string_view op_name(Op op);
Op parse_op(std::string_view s);  // throws InputError
std::span<const Op> all_ops();    // every op, in the order above
bool is_sparse_op(Op op);
bool is_merge_op(Op op);  // kMergeStates

}  // namespace mlagate
