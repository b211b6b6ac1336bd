// ExploreSpace as YAML (explore_space.h): the block a suite file's `explore:`
// key parses back to the same space (suite.cpp parses it).
#include "cases/explore_space.h"

#include <charconv>
#include <sstream>

namespace mlagate {

namespace {

template <class T, class F>
std::string list(const std::vector<T>& v, F&& f) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + f(v[i]);
  return s + "]";
}
// Shortest round-trip text of a double (the same digits on any machine).
std::string exact_number(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
std::string range(const IntRange& r) { return "[" + std::to_string(r.lo) + ", " + std::to_string(r.hi) + "]"; }

}  // namespace

std::string explore_space_yaml(const ExploreSpace& s) {
  std::ostringstream y;
  y << "explore:\n";
  if (!s.ops.empty()) y << "  ops: " << list(s.ops, [](const std::string& o) { return o; }) << "\n";
  y << "  requests: " << range(s.requests) << "\n"
    << "  seq_len: " << range(s.seq_len) << "\n"
    << "  query_len: " << range(s.query_len) << "\n"
    << "  heads: " << range(s.heads) << "\n"
    << "  dims: " << list(s.dims, [](const std::string& d) { return d; }) << "\n"
    << "  dtype: " << list(s.dtypes, [](DType d) { return std::string(d == DType::kBF16 ? "bf16" : "fp16"); }) << "\n";
  if (!s.kv_dtypes.empty())
    y << "  kv_cache_dtype: " << list(s.kv_dtypes, [](KvCacheFormat f) { return "\"" + kv_cache_format_name(f) + "\""; })
      << "\n";
  if (!s.block_sizes.empty()) y << "  block_size: " << list(s.block_sizes, [](int b) { return std::to_string(b); }) << "\n";
  y << "  q_magnitude: " << list(s.q_magnitudes, [](double d) { return exact_number(d); }) << "\n"
    << "  k_scale: " << list(s.k_scales, [](double d) { return exact_number(d); }) << "\n"
    << "  topk: " << range(s.topk) << "\n"
    << "  window: " << range(s.window) << "\n"
    << "  compressed: " << list(s.compress, [](int r) { return r ? std::to_string(r) : std::string("none"); }) << "\n";
  if (!s.patterns.empty())
    y << "  index_pattern: " << list(s.patterns, [](IndexPattern p) { return std::string(index_pattern_name(p)); }) << "\n";
  if (!s.layouts.empty())
    y << "  layout: " << list(s.layouts, [](const LayoutSpec& l) { return layout_name(l); }) << "\n";
  y << "  padding_percent: " << s.padding_percent << "\n"
    << "  max_keys: " << s.max_keys << "\n";
  if (s.max_work > 0) y << "  max_work: " << exact_number(s.max_work) << "\n";
  return y.str();
}

}  // namespace mlagate
