// The decode kernel's arguments filled in one place (DecodeArgs): the layer
// op, the kernel-level decode op, graph replay and the host graph emulation
// all hand a backend the same fields the same way.
#pragma once

#include <cstdint>
#include <span>

#include "backends/backend.h"

namespace mlagate {

inline DecodeArgs decode_args(const TensorView& q_lat, const TensorView& q_pe, const PagedCache& cache,
                              std::span<const std::int32_t> seq_lens, std::span<const std::int32_t> query_start_loc,
                              std::span<const std::int32_t> block_table_rows, double scale, float k_scale,
                              const TensorView& o_lat, const TensorView& lse) {
  DecodeArgs a;
  a.q_lat = q_lat;
  a.q_pe = q_pe;
  a.cache = &cache;
  a.seq_lens = seq_lens;
  a.query_start_loc = query_start_loc;
  a.block_table_rows = block_table_rows;
  a.scale = scale;
  a.k_scale = k_scale;
  a.o_lat = o_lat;
  a.lse = lse;
  return a;
}

// The case's softmax scale and k_scale.
inline DecodeArgs decode_args(const CaseSpec& spec, const TensorView& q_lat, const TensorView& q_pe,
                              const PagedCache& cache, std::span<const std::int32_t> seq_lens,
                              std::span<const std::int32_t> query_start_loc,
                              std::span<const std::int32_t> block_table_rows, const TensorView& o_lat,
                              const TensorView& lse) {
  return decode_args(q_lat, q_pe, cache, seq_lens, query_start_loc, block_table_rows, spec.softmax_scale(),
                     spec.k_scale, o_lat, lse);
}

}  // namespace mlagate
