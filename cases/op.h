// The ops a backend may implement and the harness composes (SPEC: Ops): one
// list, named once, shared by the backends, the runner, the golden files and
// the reports.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

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

// Ops as comma-separated names ("decode,layer"), the form golden files and
// command lines carry. parse_op_names refuses an unknown or empty name and a
// repeated one with an InputError that begins with `what` (the attribute or
// flag they came from).
std::string op_names(std::span<const Op> ops);
std::vector<Op> parse_op_names(std::string_view s, std::string_view what);

}  // namespace mlagate
