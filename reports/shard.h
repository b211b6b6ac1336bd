// Shards: one run's selection split over several machines or GPUs by case id
// (`mlagate run --shard I/N`), and the check `mlagate merge` makes that the
// parts it is given are exactly the shards of one run.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mlagate {

struct Shard {
  int index = 0, count = 1;  // 0 <= index < count
  std::string str() const;   // "I/N"
};

// "I/N" with 0 <= I < N (GTEST_SHARD_INDEX / GTEST_TOTAL_SHARDS numbering);
// nullopt for anything else.
std::optional<Shard> parse_shard(std::string_view s);

// The shard a case belongs to: FNV-1a 64 of its id, modulo count. Depends on
// the id alone, so a case stays in its shard whatever else the selection holds.
int shard_of(std::string_view case_id, int count);

// Inputs of a merge as (name, shard): shard "" for an unsharded input. Throws
// InputError when sharded inputs disagree on N, a shard appears twice, one is
// missing, or sharded and unsharded inputs are mixed.
void check_shard_set(const std::vector<std::pair<std::string, std::string>>& inputs);

}  // namespace mlagate
