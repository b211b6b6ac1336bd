// DCP's layout of a request's keys over ranks (vLLM's interleaved sharding):
// pure arithmetic the DCP mode and the serving calls' shards share.
#pragma once

#include <algorithm>

namespace mlagate {

// DCP's sharding of one request's keys (vLLM's interleaved layout): token p
// belongs to rank (p / interleave) % ranks, at local position
// (p / (ranks * interleave)) * interleave + p % interleave; rank r holds
// dcp_local_count of the first `visible` keys.
inline int dcp_rank_of(int pos, int ranks, int interleave) { return (pos / interleave) % ranks; }
inline int dcp_local_pos(int pos, int ranks, int interleave) {
  return (pos / (ranks * interleave)) * interleave + pos % interleave;
}
inline int dcp_local_count(int visible, int rank, int ranks, int interleave) {
  const int cycle = ranks * interleave;
  return (visible / cycle) * interleave + std::clamp(visible % cycle - rank * interleave, 0, interleave);
}

}  // namespace mlagate
