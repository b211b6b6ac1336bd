// Shard parsing, assignment by case id, and the completeness check of a merge.
#include "reports/shard.h"

#include <charconv>
#include <cstdint>
#include <map>

#include "cases/errors.h"

namespace mlagate {

std::string Shard::str() const { return std::to_string(index) + "/" + std::to_string(count); }

std::optional<Shard> parse_shard(std::string_view s) {
  const std::size_t slash = s.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  Shard sh;
  const auto a = std::from_chars(s.data(), s.data() + slash, sh.index);
  const auto b = std::from_chars(s.data() + slash + 1, s.data() + s.size(), sh.count);
  if (a.ec != std::errc() || a.ptr != s.data() + slash || b.ec != std::errc() || b.ptr != s.data() + s.size())
    return std::nullopt;
  if (sh.count < 1 || sh.index < 0 || sh.index >= sh.count) return std::nullopt;
  return sh;
}

int shard_of(std::string_view case_id, int count) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : case_id) h = (h ^ ch) * 0x100000001b3ull;
  return static_cast<int>(h % static_cast<std::uint64_t>(count));
}

void check_shard_set(const std::vector<std::pair<std::string, std::string>>& inputs) {
  int count = 0;
  std::map<int, std::string> seen;
  bool unsharded = false;
  for (const auto& [name, text] : inputs) {
    if (text.empty()) {
      unsharded = true;
      continue;
    }
    const std::optional<Shard> sh = parse_shard(text);
    if (!sh) throw InputError(name + ": shard '" + text + "' is not I/N");
    if (count != 0 && sh->count != count)
      throw InputError(name + ": shard " + sh->str() + " is of " + std::to_string(sh->count) + " shards, the others of " +
                       std::to_string(count));
    count = sh->count;
    if (auto [it, fresh] = seen.emplace(sh->index, name); !fresh)
      throw InputError("shard " + sh->str() + " given twice: " + it->second + " and " + name);
  }
  if (count == 0) return;
  if (unsharded) throw InputError("sharded and unsharded inputs mixed: merge the shards of one run");
  std::string missing;
  for (int i = 0; i < count; ++i)
    if (!seen.count(i)) missing += (missing.empty() ? "" : ", ") + Shard{i, count}.str();
  if (!missing.empty()) throw InputError("missing shard(s) " + missing + " of " + std::to_string(count));
}

}  // namespace mlagate
