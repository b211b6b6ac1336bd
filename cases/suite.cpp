// Suite files: YAML parsing with file:line errors, the built-in (embedded)
// suites and batch specs, and command-line sweeps.
#include "cases/suite.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include "cases/errors.h"
#include "cases/op.h"

namespace mlagate {
namespace detail {
const std::vector<std::pair<std::string_view, std::string_view>>& embedded_files();
}  // namespace detail

namespace {

std::string where(const std::string& source, const YAML::Node& n) {
  const YAML::Mark m = n.Mark();
  return m.line >= 0 ? source + ":" + std::to_string(m.line + 1) : source;
}

[[noreturn]] void fail_at(const std::string& source, const YAML::Node& n, const std::string& why) {
  throw InputError(where(source, n) + ": " + why);
}

template <class T>
T scalar(const std::string& source, const YAML::Node& n, const char* what) {
  if (!n.IsScalar()) fail_at(source, n, std::string(what) + " must be a scalar");
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    fail_at(source, n, std::string("bad value '") + n.Scalar() + "' for " + what);
  }
}

// A list of ints, or {repeat: X, times: N}.
std::vector<int> int_list(const std::string& source, const YAML::Node& n, const char* what) {
  std::vector<int> out;
  if (n.IsMap()) {
    // A missing key is an invalid node, whose every query throws yaml-cpp's
    // InvalidNode (the suite fuzzer found it): refused here, at the map's line.
    if (!n["repeat"] || !n["times"]) fail_at(source, n, std::string(what) + ": {repeat: X, times: N} needs both keys");
    const int x = scalar<int>(source, n["repeat"], what);
    const int times = scalar<int>(source, n["times"], what);
    if (times < 1 || times > 1'000'000) fail_at(source, n, std::string(what) + ": times out of range");
    out.assign(static_cast<std::size_t>(times), x);
    return out;
  }
  if (!n.IsSequence()) fail_at(source, n, std::string(what) + " must be a list");
  for (const auto& e : n) out.push_back(scalar<int>(source, e, what));
  return out;
}

std::vector<std::string> str_list(const std::string& source, const YAML::Node& n, const char* what) {
  std::vector<std::string> out;
  if (n.IsScalar()) return {n.Scalar()};
  if (!n.IsSequence()) fail_at(source, n, std::string(what) + " must be a list");
  for (const auto& e : n) out.push_back(scalar<std::string>(source, e, what));
  return out;
}

struct SpecTable {
  std::vector<BatchSpec> specs;
  std::vector<std::vector<std::string>> tags;  // parallel to specs
};

void parse_specs(const std::string& source, const YAML::Node& map, SpecTable& table) {
  if (!map.IsMap()) fail_at(source, map, "specs must be a map of name -> {seq_lens, query_lens}");
  for (const auto& kv : map) {
    BatchSpec b;
    b.name = scalar<std::string>(source, kv.first, "spec name");
    const YAML::Node& v = kv.second;
    if (!v.IsMap()) fail_at(source, v, "spec " + b.name + " must be a map");
    for (const auto& f : v) {
      const std::string key = f.first.Scalar();
      if (key != "seq_lens" && key != "query_lens" && key != "spec_decode" && key != "tags" && key != "note")
        fail_at(source, f.first, "unknown key '" + key + "' in spec " + b.name);
    }
    if (!v["seq_lens"] || !v["query_lens"]) fail_at(source, v, "spec " + b.name + " needs seq_lens and query_lens");
    b.seq_lens = int_list(source, v["seq_lens"], "seq_lens");
    b.query_lens = int_list(source, v["query_lens"], "query_lens");
    if (v["spec_decode"]) b.spec_decode = scalar<bool>(source, v["spec_decode"], "spec_decode");
    if (v["note"]) b.note = scalar<std::string>(source, v["note"], "note");
    std::vector<std::string> tags;
    if (v["tags"]) tags = str_list(source, v["tags"], "tags");
    for (const auto& existing : table.specs)
      if (existing.name == b.name) fail_at(source, kv.first, "spec " + b.name + " defined twice");
    table.specs.push_back(std::move(b));
    table.tags.push_back(std::move(tags));
  }
}

YAML::Node load_yaml(const std::string& text, const std::string& source) {
  try {
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw InputError(source + ":" + std::to_string(e.mark.line + 1) + ": YAML syntax error: " + e.msg);
  }
}

std::string_view embedded(std::string_view name) {
  for (const auto& [file, text] : detail::embedded_files())
    if (file == name) return text;
  return {};
}

const SpecTable& builtin_specs() {
  static const SpecTable table = [] {
    SpecTable t;
    const YAML::Node root = load_yaml(std::string(embedded("specs.yaml")), "specs.yaml");
    parse_specs("specs.yaml", root["specs"], t);
    return t;
  }();
  return table;
}

const BatchSpec* lookup(const SpecTable& t, const std::string& name) {
  for (const auto& s : t.specs)
    if (s.name == name) return &s;
  return nullptr;
}

template <class T>
void dedupe_by_id(std::vector<T>& cases) {
  std::set<std::string> seen;
  std::vector<T> out;
  for (auto& c : cases)
    if (seen.insert(c.id()).second) out.push_back(std::move(c));
  cases = std::move(out);
}

IntRange int_range(const std::string& source, const YAML::Node& n, const char* what, int lo, int hi) {
  const std::vector<int> v = int_list(source, n, what);
  if (v.size() != 2 || v[0] > v[1] || v[0] < lo || v[1] > hi)
    fail_at(source, n, std::string(what) + " must be [lo, hi] with " + std::to_string(lo) + " <= lo <= hi <= " +
                           std::to_string(hi));
  return {v[0], v[1]};
}

std::vector<double> positive_doubles(const std::string& source, const YAML::Node& n, const char* what) {
  if (!n.IsSequence() || n.size() == 0) fail_at(source, n, std::string(what) + " must be a non-empty list");
  std::vector<double> out;
  for (const auto& e : n) {
    const double v = scalar<double>(source, e, what);
    if (!(v > 0) || !std::isfinite(v)) fail_at(source, e, std::string(what) + " values must be positive and finite");
    out.push_back(v);
  }
  return out;
}

// A suite file's `explore:` block (cases/explore_space.h): each key narrows one
// dimension of the space; the rest keep their defaults.
ExploreSpace parse_explore(const std::string& source, const YAML::Node& n) {
  if (!n.IsMap()) fail_at(source, n, "explore must be a map of dimension -> range or list");
  static const std::set<std::string> kKeys = {"ops", "requests", "seq_len", "query_len", "heads", "dims", "dtype",
                                              "kv_cache_dtype", "block_size", "q_magnitude", "k_scale", "topk",
                                              "window", "compressed", "index_pattern", "padding_percent", "max_keys",
                                              "max_work", "layout"};
  for (const auto& kv : n)
    if (!kKeys.count(kv.first.Scalar())) fail_at(source, kv.first, "unknown explore key '" + kv.first.Scalar() + "'");
  ExploreSpace s;
  auto fail_on = [&](const YAML::Node& at, auto&& f) {
    try {
      f();
    } catch (const InputError& e) { fail_at(source, at, e.what()); }
  };
  if (n["ops"])
    fail_on(n["ops"], [&] {
      for (const auto& o : str_list(source, n["ops"], "ops")) {
        (void)parse_op(o);
        s.ops.push_back(o);
      }
    });
  if (n["requests"]) s.requests = int_range(source, n["requests"], "requests", 1, 4096);
  if (n["seq_len"]) s.seq_len = int_range(source, n["seq_len"], "seq_len", 0, 1 << 20);
  if (n["query_len"]) s.query_len = int_range(source, n["query_len"], "query_len", 1, 8192);
  if (n["heads"]) s.heads = int_range(source, n["heads"], "heads", 1, 1024);
  if (n["dims"])
    fail_on(n["dims"], [&] {
      s.dims = str_list(source, n["dims"], "dims");
      for (const auto& d : s.dims) (void)dims_preset(d);
    });
  if (n["dtype"])
    fail_on(n["dtype"], [&] {
      s.dtypes.clear();
      for (const auto& d : str_list(source, n["dtype"], "dtype")) s.dtypes.push_back(parse_model_dtype(d));
    });
  if (n["kv_cache_dtype"])
    fail_on(n["kv_cache_dtype"], [&] {
      for (const auto& d : str_list(source, n["kv_cache_dtype"], "kv_cache_dtype"))
        s.kv_dtypes.push_back(parse_kv_cache_format(d));
    });
  if (n["block_size"])
    for (int b : int_list(source, n["block_size"], "block_size")) {
      if (b < 1 || b > 1024 || (b & (b - 1)) != 0) fail_at(source, n["block_size"], "block sizes are powers of two in [1, 1024]");
      s.block_sizes.push_back(b);
    }
  if (n["q_magnitude"]) s.q_magnitudes = positive_doubles(source, n["q_magnitude"], "q_magnitude");
  if (n["k_scale"]) s.k_scales = positive_doubles(source, n["k_scale"], "k_scale");
  if (n["topk"]) s.topk = int_range(source, n["topk"], "topk", 1, 65536);
  if (n["window"]) s.window = int_range(source, n["window"], "window", 1, 1 << 20);
  if (n["compressed"]) {
    s.compress.clear();
    for (const auto& t : str_list(source, n["compressed"], "compressed")) {
      if (t == "none") {
        s.compress.push_back(0);
        continue;
      }
      int r = 0;
      try {
        r = YAML::Node(t).as<int>();
      } catch (const YAML::Exception&) {
        fail_at(source, n["compressed"], "bad compressed ratio '" + t + "' (a ratio >= 2, or none)");
      }
      if (r < 2) fail_at(source, n["compressed"], "bad compressed ratio '" + t + "' (a ratio >= 2, or none)");
      s.compress.push_back(r);
    }
  }
  if (n["index_pattern"])
    fail_on(n["index_pattern"], [&] {
      for (const auto& t : str_list(source, n["index_pattern"], "index_pattern")) s.patterns.push_back(parse_index_pattern(t));
    });
  if (n["layout"])
    fail_on(n["layout"], [&] {
      for (const auto& t : str_list(source, n["layout"], "layout")) s.layouts.push_back(parse_layout(t));
    });
  if (n["padding_percent"]) {
    s.padding_percent = scalar<int>(source, n["padding_percent"], "padding_percent");
    if (s.padding_percent < 0 || s.padding_percent > 100) fail_at(source, n["padding_percent"], "padding_percent must be in [0, 100]");
  }
  if (n["max_keys"]) {
    s.max_keys = scalar<std::int64_t>(source, n["max_keys"], "max_keys");
    if (s.max_keys < 1) fail_at(source, n["max_keys"], "max_keys must be >= 1");
  }
  if (n["max_work"]) {
    s.max_work = scalar<double>(source, n["max_work"], "max_work");
    if (!(s.max_work > 0) || !std::isfinite(s.max_work)) fail_at(source, n["max_work"], "max_work must be positive");
  }
  for (const char* k : {"dims", "dtype", "kv_cache_dtype", "block_size", "compressed", "index_pattern", "ops", "layout"})
    if (n[k] && n[k].IsSequence() && n[k].size() == 0) fail_at(source, n[k], std::string(k) + " must not be empty");
  return s;
}

}  // namespace

const std::vector<BatchSpec>& batch_specs() { return builtin_specs().specs; }

const BatchSpec& find_batch_spec(const std::string& name) {
  if (const BatchSpec* b = lookup(builtin_specs(), name)) return *b;
  std::string known;
  for (const auto& s : batch_specs()) known += (known.empty() ? "" : ", ") + s.name;
  throw InputError("unknown batch spec '" + name + "' (known: " + known + ")");
}

std::vector<std::string> builtin_suite_names() {
  std::vector<std::string> names;
  for (const auto& [file, text] : detail::embedded_files()) {
    std::string f(file);
    if (f != "specs.yaml" && f.ends_with(".yaml")) names.push_back(f.substr(0, f.size() - 5));
  }
  return names;
}

Suite parse_suite_yaml(const std::string& text, const std::string& source) {
  const YAML::Node root = load_yaml(text, source);
  if (!root.IsMap()) throw InputError(source + ": a suite file must be a YAML map with name and groups");
  for (const auto& kv : root) {
    const std::string key = kv.first.Scalar();
    if (key != "name" && key != "description" && key != "groups" && key != "specs" && key != "repeat" && key != "explore")
      fail_at(source, kv.first,
              "unknown top-level key '" + key + "' (expected name, description, repeat, specs, groups, explore)");
  }
  Suite suite;
  suite.source = source;
  if (!root["name"]) throw InputError(source + ": suite has no name");
  suite.name = scalar<std::string>(source, root["name"], "name");
  if (suite.name.empty() || suite.name.find('/') != std::string::npos)
    fail_at(source, root["name"], "suite name must be non-empty and contain no '/'");
  if (root["description"]) suite.description = scalar<std::string>(source, root["description"], "description");
  if (root["repeat"]) {
    suite.repeat = scalar<int>(source, root["repeat"], "repeat");
    if (suite.repeat < 1 || suite.repeat > 100) fail_at(source, root["repeat"], "repeat must be in [1, 100]");
  }
  // A suite file may define its own batch specs beside the built-in ones.
  SpecTable local = builtin_specs();
  if (root["specs"]) parse_specs(source, root["specs"], local);
  if (root["explore"]) suite.explore = parse_explore(source, root["explore"]);
  const YAML::Node groups = root["groups"];
  if (!groups && suite.explore) return suite;  // a search space alone (mlagate explore --suite FILE)
  if (!groups) throw InputError(source + ": suite needs a non-empty 'groups' list");
  if (!groups.IsSequence() || groups.size() == 0) fail_at(source, groups, "suite needs a non-empty 'groups' list");

  static const std::set<std::string> kKeys = {"specs", "spec_tags", "tp", "dtype", "kv_cache_dtype", "block_size",
                                              "seed", "dims", "q_magnitude", "scale", "total_heads", "k_scale", "note",
                                              "reference_k_scale",
                                              // sparse ops (cases/sparse.h)
                                              "topk", "window", "compressed", "sink", "index_pattern",
                                              // the merge_states op (cases/merge.h): a group with head_dim
                                              "tokens", "head_dim", "lse", "lse_gap",
                                              // memory layouts (cases/LAYOUTS.md)
                                              "layout",
                                              // the ops the group's cases run in (CaseSpec::ops)
                                              "ops"};
  std::vector<std::unique_ptr<BatchSpec>> merge_batches;  // the batches `tokens` makes, alive while groups expand
  for (const auto& g : groups) {
    if (!g.IsMap()) fail_at(source, g, "each group must be a map");
    for (const auto& kv : g)
      if (!kKeys.count(kv.first.Scalar())) fail_at(source, kv.first, "unknown group key '" + kv.first.Scalar() + "'");
    std::vector<const BatchSpec*> specs;
    if (g["specs"])
      for (const auto& name : str_list(source, g["specs"], "specs")) {
        const BatchSpec* b = lookup(local, name);
        if (!b) fail_at(source, g["specs"], "unknown batch spec '" + name + "'");
        specs.push_back(b);
      }
    if (g["spec_tags"])
      for (const auto& tag : str_list(source, g["spec_tags"], "spec_tags")) {
        bool any = false;
        for (std::size_t i = 0; i < local.specs.size(); ++i)
          for (const auto& t : local.tags[i])
            if (t == tag) specs.push_back(&local.specs[i]), any = true;
        if (!any) fail_at(source, g["spec_tags"], "no batch spec has tag '" + tag + "'");
      }
    // A merge group: each entry of `tokens` is a batch of one request of T
    // tokens (seq_len = query_len = T), named "tT".
    const bool merge_group = static_cast<bool>(g["head_dim"]);
    if (g["tokens"] && !merge_group) fail_at(source, g["tokens"], "tokens belongs to a merge group (give head_dim)");
    if (!merge_group)
      for (const char* key : {"lse", "lse_gap"})
        if (g[key]) fail_at(source, g[key], std::string(key) + " belongs to a merge group (give head_dim)");
    if (g["tokens"])
      for (int t : int_list(source, g["tokens"], "tokens")) {
        if (t < 1 || t > 1 << 24) fail_at(source, g["tokens"], "tokens must be in [1, 2^24]");
        merge_batches.push_back(std::make_unique<BatchSpec>(BatchSpec{"t" + std::to_string(t), {t}, {t}, false, {}}));
        specs.push_back(merge_batches.back().get());
      }
    if (specs.empty()) fail_at(source, g, "group selects no batch spec (give specs, spec_tags or, for a merge group, tokens)");

    auto ints = [&](const char* key, std::vector<int> dflt) { return g[key] ? int_list(source, g[key], key) : dflt; };
    auto doubles = [&](const char* key, std::vector<double> dflt) {
      if (!g[key]) return dflt;
      std::vector<double> out;
      if (!g[key].IsSequence()) fail_at(source, g[key], std::string(key) + " must be a list");
      for (const auto& e : g[key]) out.push_back(scalar<double>(source, e, key));
      return out;
    };
    const std::vector<int> tps = ints("tp", {1});
    const std::vector<int> heads = ints("total_heads", {128});
    std::vector<int> block_sizes;
    for (const auto& s : g["block_size"] ? str_list(source, g["block_size"], "block_size") : std::vector<std::string>{"auto"}) {
      if (s == "auto") {
        block_sizes.push_back(0);
        continue;
      }
      // Parsed from the string (a fresh node has no mark): report the list's line.
      int bs = 0;
      try {
        bs = YAML::Node(s).as<int>();
      } catch (const YAML::Exception&) {
        fail_at(source, g["block_size"], "bad value '" + s + "' for block_size");
      }
      // 0 is the spec's internal code for auto: written as a number it is a mistake.
      if (bs < 1) fail_at(source, g["block_size"], "block_size " + s + " (a power of two in [1, 1024], or auto)");
      block_sizes.push_back(bs);
    }
    std::vector<std::uint64_t> seeds;
    for (int s : ints("seed", {0})) {
      if (s < 0) fail_at(source, g["seed"], "seed must be >= 0");
      seeds.push_back(static_cast<std::uint64_t>(s));
    }
    std::vector<DType> dtypes;
    try {
      for (const auto& s : g["dtype"] ? str_list(source, g["dtype"], "dtype") : std::vector<std::string>{"bf16"})
        // A merge group's output may be fp32 too (its lse is fp32 always).
        dtypes.push_back(merge_group && (s == "fp32" || s == "f32" || s == "float32") ? DType::kF32 : parse_model_dtype(s));
    } catch (const InputError& e) { fail_at(source, g["dtype"], e.what()); }
    std::vector<KvCacheFormat> kvs;
    try {
      for (const auto& s : g["kv_cache_dtype"] ? str_list(source, g["kv_cache_dtype"], "kv_cache_dtype") : std::vector<std::string>{"auto"})
        kvs.push_back(parse_kv_cache_format(s));
    } catch (const InputError& e) { fail_at(source, g["kv_cache_dtype"], e.what()); }
    std::vector<Dims> dims;
    try {
      for (const auto& s : g["dims"] ? str_list(source, g["dims"], "dims") : std::vector<std::string>{"deepseek"})
        dims.push_back(dims_preset(s));
    } catch (const InputError& e) { fail_at(source, g["dims"], e.what()); }
    const std::vector<double> qmags = doubles("q_magnitude", {1.0});
    const std::vector<double> scales = doubles("scale", {0.0});  // 0: the default 1/sqrt(D)
    const std::vector<double> kscales = doubles("k_scale", {1.0});
    // reference_k_scale: model_dtype (triage's what-if, CaseSpec::reference_k_scale_rounded) or exact.
    bool ref_kscale_rounded = false;
    if (g["reference_k_scale"]) {
      const std::string v = g["reference_k_scale"].IsScalar() ? g["reference_k_scale"].Scalar() : std::string();
      if (v != "model_dtype" && v != "exact")
        fail_at(source, g["reference_k_scale"], "reference_k_scale must be model_dtype or exact");
      ref_kscale_rounded = v == "model_dtype";
    }
    // Sparse axes: topk (V3.2), window (V4 SWA), compressed ("RATIOxTOPK" or
    // "none": V4's compressed cache), sink (bools), index_pattern.
    std::vector<SparseSpec> sparses{SparseSpec{}};
    auto sparse_axis = [&](auto values, auto setter) {
      std::vector<SparseSpec> next;
      for (const SparseSpec& base : sparses)
        for (const auto& v : values) {
          SparseSpec n = base;
          setter(n, v);
          next.push_back(n);
        }
      sparses = std::move(next);
    };
    if (g["topk"]) sparse_axis(ints("topk", {}), [](SparseSpec& sp, int v) { sp.topk = v; });
    if (g["window"]) sparse_axis(ints("window", {}), [](SparseSpec& sp, int v) { sp.window = v; });
    if (g["compressed"]) {
      std::vector<std::pair<int, int>> cmp;
      for (const auto& t : str_list(source, g["compressed"], "compressed")) {
        if (t == "none") {
          cmp.emplace_back(0, 0);
          continue;
        }
        int ratio = 0, width = 0;
        char x = 0, extra = 0;
        if (std::sscanf(t.c_str(), "%d%c%d%c", &ratio, &x, &width, &extra) != 3 || x != 'x' || ratio < 2 || width < 1)
          fail_at(source, g["compressed"], "bad compressed '" + t + "' (expected RATIOxTOPK such as 4x512, or none)");
        cmp.emplace_back(ratio, width);
      }
      sparse_axis(cmp, [](SparseSpec& sp, std::pair<int, int> v) { sp.compress = v.first, sp.extra_topk = v.second; });
    }
    if (g["sink"]) {
      std::vector<bool> sinks;
      if (!g["sink"].IsSequence()) fail_at(source, g["sink"], "sink must be a list");
      for (const auto& e : g["sink"]) sinks.push_back(scalar<bool>(source, e, "sink"));
      sparse_axis(sinks, [](SparseSpec& sp, bool v) { sp.sink = v; });
    }
    if (g["index_pattern"]) {
      std::vector<IndexPattern> pats;
      try {
        for (const auto& t : str_list(source, g["index_pattern"], "index_pattern")) pats.push_back(parse_index_pattern(t));
      } catch (const InputError& e) { fail_at(source, g["index_pattern"], e.what()); }
      sparse_axis(pats, [](SparseSpec& sp, IndexPattern v) { sp.pattern = v; });
    }

    std::vector<LayoutSpec> layouts{LayoutSpec{}};
    if (g["layout"]) {
      layouts.clear();
      try {
        for (const auto& t : str_list(source, g["layout"], "layout")) layouts.push_back(parse_layout(t));
      } catch (const InputError& e) { fail_at(source, g["layout"], e.what()); }
    }

    std::vector<MergeSpec> merges{MergeSpec{}};
    if (merge_group) {
      std::vector<int> dims_d = int_list(source, g["head_dim"], "head_dim");
      std::vector<LsePattern> pats{LsePattern::kOrdinary};
      if (g["lse"]) {
        pats.clear();
        try {
          for (const auto& t : str_list(source, g["lse"], "lse")) pats.push_back(parse_lse_pattern(t));
        } catch (const InputError& e) { fail_at(source, g["lse"], e.what()); }
      }
      const std::vector<double> gaps = doubles("lse_gap", {0.0});
      merges.clear();
      for (int d : dims_d) {
        if (d < 1) fail_at(source, g["head_dim"], "head_dim must be positive");
        for (LsePattern p : pats)
          for (double gap : gaps) merges.push_back(MergeSpec{d, p, gap});
      }
    }
    // Not an axis: every case of the group takes these ops (each once). An op
    // the case's kind does not run gives NOT_SUPPORTED records, as with --op.
    std::vector<Op> ops;
    if (g["ops"]) {
      try {
        for (const auto& t : str_list(source, g["ops"], "ops")) {
          const Op op = parse_op(t);
          if (std::find(ops.begin(), ops.end(), op) == ops.end()) ops.push_back(op);
        }
      } catch (const InputError& e) { fail_at(source, g["ops"], e.what()); }
      if (ops.empty()) fail_at(source, g["ops"], "ops must name at least one op (leave it out for every op of the run)");
    }
    for (const BatchSpec* b : specs)
      for (const MergeSpec& mg : merges)
      for (int tp : tps) for (int th : heads) for (DType dt : dtypes) for (KvCacheFormat kv : kvs)
        for (int bs : block_sizes) for (std::uint64_t seed : seeds) for (const Dims& dm : dims)
          for (double qm : qmags) for (double sc : scales) for (double ks : kscales) for (const SparseSpec& sp : sparses)
          for (const LayoutSpec& lay : layouts) {
            CaseSpec c;
            c.layout = lay;
            c.sparse = sp;
            c.merge = mg;
            c.suite = suite.name;
            c.batch = *b;
            c.tp = tp;
            c.total_heads = th;
            c.dtype = dt;
            c.kv_cache_dtype = kv.dtype;
            c.scale_rule = kv.scale_rule;
            c.block_size = bs;
            c.seed = seed;
            c.dims = dm;
            c.q_magnitude = qm;
            if (sc != 0.0) c.scale = sc;
            c.k_scale = static_cast<float>(ks);
            c.reference_k_scale_rounded = ref_kscale_rounded;
            c.ops = ops;
            try {
              c.validate();
            } catch (const InvalidCase& e) {
              fail_at(source, g, "impossible case " + c.id() + ": " + e.what());
            }

            suite.cases.push_back(std::move(c));
          }
  }
  const std::size_t before = suite.cases.size();
  dedupe_by_id(suite.cases);
  if (suite.cases.size() != before)
    throw InputError(source + ": " + std::to_string(before - suite.cases.size()) + " duplicate case id(s) across groups");
  return suite;
}

Suite load_suite(const std::string& name_or_path) {
  const std::string_view text = embedded(name_or_path + ".yaml");
  if (!text.empty() && name_or_path.find('/') == std::string::npos && !name_or_path.ends_with(".yaml")) {
    Suite s = parse_suite_yaml(std::string(text), name_or_path + ".yaml");
    s.source = name_or_path;
    return s;
  }
  std::ifstream in(name_or_path);
  if (!in) {
    std::string known;
    for (const auto& n : builtin_suite_names()) known += (known.empty() ? "" : ", ") + n;
    throw InputError("no suite '" + name_or_path + "': not a built-in suite (" + known + ") nor a readable file");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_suite_yaml(ss.str(), name_or_path);
}

bool Sweep::empty() const {
  return specs.empty() && tps.empty() && dtypes.empty() && kv_dtypes.empty() && block_sizes.empty() && seeds.empty();
}

std::vector<CaseSpec> apply_sweep(const Sweep& sw, const std::optional<Suite>& base) {
  std::vector<CaseSpec> seeds_in;
  if (base) {
    seeds_in = base->cases;
    if (!sw.specs.empty()) {
      // --spec with a suite narrows it to those batch specs.
      std::erase_if(seeds_in, [&](const CaseSpec& c) {
        return std::find(sw.specs.begin(), sw.specs.end(), c.batch.name) == sw.specs.end();
      });
      if (seeds_in.empty()) throw InputError("--spec selects no case of suite " + base->name);
    }
  } else {
    if (sw.specs.empty()) throw InputError("give --suite or --spec");
    for (const auto& name : sw.specs) {
      CaseSpec c;
      c.suite = "sweep";
      c.batch = find_batch_spec(name);
      seeds_in.push_back(std::move(c));
    }
  }
  std::vector<CaseSpec> out;
  for (const CaseSpec& s : seeds_in) {
    std::vector<CaseSpec> cur{s};
    auto axis = [&](const auto& values, auto setter) {
      if (values.empty()) return;
      std::vector<CaseSpec> next;
      for (const auto& c : cur)
        for (const auto& v : values) {
          CaseSpec n = c;
          setter(n, v);
          next.push_back(std::move(n));
        }
      cur = std::move(next);
    };
    axis(sw.tps, [](CaseSpec& c, int v) { c.tp = v; });
    axis(sw.dtypes, [](CaseSpec& c, DType v) { c.dtype = v; });
    axis(sw.kv_dtypes, [](CaseSpec& c, KvCacheFormat v) {
      c.kv_cache_dtype = v.dtype;
      c.scale_rule = v.scale_rule;
    });
    axis(sw.block_sizes, [](CaseSpec& c, int v) { c.block_size = v; });
    axis(sw.seeds, [](CaseSpec& c, std::uint64_t v) { c.seed = v; });
    for (auto& c : cur) {
      c.validate();
      out.push_back(std::move(c));
    }
  }
  dedupe_by_id(out);
  return out;
}

}  // namespace mlagate
