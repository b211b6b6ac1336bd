// DecodeArgs from its parts, in one call: the harness's decode calls (the
// plain decode op, the layer's decode step, the serving modes' calls and
// padded batches) and the host graph emulation all fill the same ten fields.
#pragma once

#include <cstdint>
#include <span>

#include "backends/backend.h"

namespace mlagate {

// The requests of one decode call: per request the keys its last token sees,
// its query rows (B + 1 offsets) and its row of the cache's block table.
struct DecodeBatch {
  std::span<const std::int32_t> seq_lens, query_start_loc, block_table_rows;
};

inline DecodeArgs decode_args(const TensorView& q_lat, const TensorView& q_pe, const PagedCache& cache,
                              const DecodeBatch& batch, double scale, float k_scale, const TensorView& o_lat,
                              const TensorView& lse) {
  return DecodeArgs{.q_lat = q_lat, .q_pe = q_pe, .cache = &cache, .seq_lens = batch.seq_lens,
                    .query_start_loc = batch.query_start_loc, .block_table_rows = batch.block_table_rows,
                    .scale = scale, .k_scale = k_scale, .o_lat = o_lat, .lse = lse};
}

}  // namespace mlagate
