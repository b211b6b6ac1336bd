// The search's coverage table (coverage.h).
#include "harness/explore/coverage.h"

#include <sstream>

#include "cases/dtype.h"
#include "cases/sparse.h"

namespace mlagate {

std::string coverage_bucket(long long v) {
  if (v <= 1) return std::to_string(v);
  long long lo = 1;
  while (lo * 2 <= v) lo *= 2;
  return std::to_string(lo) + "-" + std::to_string(lo * 2 - 1);
}

std::string coverage_number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

void cover(nlohmann::json& cov, const CaseSpec& c, Op op, int block_size) {
  auto add = [&](const std::string& dim, const std::string& value) {
    nlohmann::json& d = cov[dim];
    if (!d.is_object()) d = nlohmann::json::object();
    d[value] = d.value(value, 0) + 1;
  };
  add("op", std::string(op_name(op)));
  add("requests", coverage_bucket(c.num_requests()));
  const int bs = block_size > 0 ? block_size : c.block_size;
  bool padding = false;
  for (int i = 0; i < c.num_requests(); ++i) {
    const int s = c.batch.seq_lens[i];
    add("seq_len", coverage_bucket(s));
    padding = padding || s == 0;
    if (bs > 0 && s > 0 && (s % bs == 0 || s % bs == 1 || s % bs == bs - 1)) add("seq_len at a block edge", "bs " + std::to_string(bs));
    if (s > 0 && (s % 64 == 0 || s % 64 == 1 || s % 64 == 63)) add("seq_len at a 64 edge", s % 64 == 0 ? "64k" : s % 64 == 1 ? "64k+1" : "64k-1");
    add("query_len", coverage_bucket(c.batch.query_lens[i]));
  }
  add("padding requests", padding ? "yes" : "no");
  add("spec decode", c.batch.spec_decode ? "yes" : "no");
  const int h = c.num_heads();
  add("heads", coverage_bucket(h));
  add("heads kind", (h & (h - 1)) == 0 ? "power of two" : h % 16 == 0 ? "multiple of 16" : h % 8 == 0 ? "multiple of 8" : "other");
  add("dims", dims_label(c.dims));
  add("dtype", std::string(dtype_short(c.dtype)));
  add("kv_cache_dtype", kv_cache_format_name(c.kv_format()));
  add("block_size", bs > 0 ? std::to_string(bs) : "auto");
  add("q_magnitude", coverage_number(c.q_magnitude));
  add("k_scale", coverage_number(c.k_scale));
  add("keys per case", coverage_bucket(c.num_kv_tokens()));
  add("layout", layout_name(c.layout));
  if (c.sparse.active()) {
    add("index_pattern", std::string(index_pattern_name(c.sparse.pattern)));
    if (c.sparse.topk) add("topk", coverage_bucket(c.sparse.topk));
    if (c.sparse.window) add("window", coverage_bucket(c.sparse.window));
    add("compressed", c.sparse.compress ? std::to_string(c.sparse.compress) + "x" : "none");
    add("sink", c.sparse.sink ? "yes" : "no");
  }
}

}  // namespace mlagate
