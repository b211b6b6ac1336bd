// The exec backend: one bundle, one run of the command and one outputs file
// per kernel call, in a fresh temporary directory removed afterwards.
#include "backends/exec/exec_backend.h"

#include <stdlib.h>

#include <algorithm>
#include <limits>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <sstream>

#include "backends/exec/bundle.h"
#include "backends/exec/subprocess.h"
#include "backends/plugin/abi.h"
#include "backends/plugin/plugin_backends.h"
#include "cases/errors.h"
#include "cases/remove_tree.h"

namespace mlagate {

namespace {

namespace fs = std::filesystem;

// A fresh directory under $TMPDIR, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "mlagate-exec-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("exec: cannot create a temporary directory: " + std::string(std::strerror(errno)));
    path_ = tmpl;
  }
  ~TempDir() { remove_tree(path_.string()); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
  return s;
}

std::string signal_text(int sig) {
  const char* d = strsignal(sig);
  return std::to_string(sig) + (d ? " (" + std::string(d) + ")" : "");
}

class ExecBackend final : public Backend {
 public:
  explicit ExecBackend(ExecConfig cfg) : cfg_(std::move(cfg)) {}

  std::string_view name() const override { return cfg_.name; }
  std::string_view description() const override { return description_; }
  Capabilities capabilities() const override { return cfg_.caps; }
  Support supports(const CaseSpec& spec, Op op) const override {
    last_spec_ = spec;  // the runner asks before it runs: the case id of the calls that follow
    return check_capabilities(cfg_.caps, spec, op);
  }

  void decode(const DecodeArgs& a) override {
    if (!has(Op::kDecode)) Backend::decode(a);
    exec::BundleCall call{plugin::decode_problem(a, spec()), {}, {}, {}};
    const std::vector<std::int32_t> table = plugin::call_block_table(a);
    const PagedCache& cache = *a.cache;
    const std::int64_t b = static_cast<std::int64_t>(a.seq_lens.size());
    // Strided views (only to a program that declares strided_views): q_lat and
    // q_pe as their spans with their strides; the outputs' spans as they are
    // now (the harness's poison and padding), for a program that writes into
    // them in place and hands the spans back.
    exec::add_strided_input(call, "q_lat", a.q_lat);
    exec::add_strided_input(call, "q_pe", a.q_pe);
    call.inputs.push_back({"kv_cache", cache.data.view()});
    call.inputs.push_back(
        {"block_table", TensorView{DType::kI32, {b, cache.block_table.dim(1)}, const_cast<std::int32_t*>(table.data())}});
    call.inputs.push_back(
        {"query_start_loc", TensorView{DType::kI32, {b + 1}, const_cast<std::int32_t*>(a.query_start_loc.data())}});
    if (!a.o_lat.contiguous()) exec::add_strided_input(call, "o_lat_span", a.o_lat);
    if (!a.lse.contiguous()) exec::add_strided_input(call, "lse_span", a.lse);
    add_cache_attrs(call, "", cache);
    invoke(call, {{"o_lat", a.o_lat}, {"lse", a.lse}});
  }

  void prefill(const PrefillArgs& a) override {
    if (!has(Op::kPrefill)) Backend::prefill(a);
    exec::BundleCall call{plugin::prefill_problem(a, spec()), {}, {}, {}};
    const std::int64_t b1 = static_cast<std::int64_t>(a.cu_seqlens_q.size());
    call.inputs = {{"q", a.q},
                   {"k", a.k},
                   {"v", a.v},
                   {"cu_seqlens_q", TensorView{DType::kI32, {b1}, const_cast<std::int32_t*>(a.cu_seqlens_q.data())}},
                   {"cu_seqlens_k", TensorView{DType::kI32, {b1}, const_cast<std::int32_t*>(a.cu_seqlens_k.data())}}};
    invoke(call, {{"o", a.o}, {"lse", a.lse}});
  }

  void cache_write(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                   std::span<const std::int64_t> slots) override {
    if (!has(Op::kCacheWrite)) return Backend::cache_write(cache, kv_c, k_pe, slots);
    exec::BundleCall call{plugin::cache_write_problem(cache, kv_c, k_pe, slots.size(), spec()), {}, {}, {}};
    const std::int64_t n = static_cast<std::int64_t>(slots.size());
    call.inputs = {{"kv_c", kv_c},
                   {"k_pe", k_pe},
                   {"slot_mapping", TensorView{DType::kI64, {n}, const_cast<std::int64_t*>(slots.data())}},
                   {"kv_cache", cache.data.view()}};
    add_cache_attrs(call, "", cache);
    invoke(call, {{"kv_cache", cache.data.view()}});
  }

  // DeepSeek V3.2 / V4 sparse decode (SCHEMA.md, "sparse_decode"): the paged
  // cache(s) as they are, the index rows, the window rule's inputs and the sink.
  void sparse_decode(const SparseDecodeArgs& a) override {
    if (!has(Op::kSparseDecode)) Backend::sparse_decode(a);
    check_sparse_decode_args(a);
    const PagedCache& cache = *a.cache;
    const std::int64_t N = a.q.shape[1], B = static_cast<std::int64_t>(a.seq_lens.size());
    exec::BundleCall call{sparse_problem(Op::kSparseDecode, a.q, a.o, cache.kv_lora_rank, cache.rope_dim), {}, {}, {}};
    plugin::Problem& p = call.problem;
    p.seq_lens.assign(a.seq_lens.begin(), a.seq_lens.end());
    for (std::int64_t i = 0; i < B; ++i) p.query_lens.push_back(a.query_start_loc[i + 1] - a.query_start_loc[i]);
    p.kv = {cache.kv_dtype, cache.scale_rule};
    p.entry = cache.format();
    p.block_size = cache.block_size;
    p.k_scale = cache.k_scale;
    p.scale = a.scale;
    name_case(p);

    std::vector<std::int32_t> table = table_rows(cache, a.block_table_rows), extra_table;
    call.inputs = {{"q", a.q},
                   {"kv_cache", cache.data.view()},
                   {"block_table", TensorView{DType::kI32, {B, cache.table_width}, table.data()}},
                   {"query_start_loc", ints(a.query_start_loc)}};
    add_cache_attrs(call, "", cache);
    const std::int64_t K = a.indices.shape.size() == 2 ? a.indices.shape[1] : 0;
    call.int_attrs.push_back({"topk", K});
    if (K) call.inputs.push_back({"indices", a.indices});
    call.int_attrs.push_back({"has_topk_length", a.topk_length.empty() ? 0 : 1});
    if (!a.topk_length.empty()) call.inputs.push_back({"topk_length", ints(a.topk_length)});
    call.int_attrs.push_back({"window", a.window});
    if (a.extra_cache) {
      const PagedCache& x = *a.extra_cache;
      if (x.kv_dtype != cache.kv_dtype || x.scale_rule != cache.scale_rule || x.kv_lora_rank != cache.kv_lora_rank ||
          x.rope_dim != cache.rope_dim)
        throw std::invalid_argument("sparse_decode: the compressed cache's format differs from the main cache's (" +
                                    kv_cache_format_name({x.kv_dtype, x.scale_rule}) + " vs " +
                                    kv_cache_format_name({cache.kv_dtype, cache.scale_rule}) + ")");
      extra_table = table_rows(x, a.block_table_rows);
      call.inputs.push_back({"extra_kv_cache", x.data.view()});
      call.inputs.push_back({"extra_block_table", TensorView{DType::kI32, {B, x.table_width}, extra_table.data()}});
      add_cache_attrs(call, "extra_", x);
    } else {
      call.int_attrs.push_back({"extra_num_blocks", 0});
    }
    const std::int64_t K2 = a.extra_indices.shape.size() == 2 ? a.extra_indices.shape[1] : 0;
    call.int_attrs.push_back({"extra_topk", K2});
    if (K2) call.inputs.push_back({"extra_indices", a.extra_indices});
    call.int_attrs.push_back({"has_extra_topk_length", a.extra_topk_length.empty() ? 0 : 1});
    if (!a.extra_topk_length.empty()) call.inputs.push_back({"extra_topk_length", ints(a.extra_topk_length)});
    add_sink(call, a.sink, N);
    invoke(call, {{"o", a.o}, {"lse", a.lse}}, sparse_rule(a.q, a.o, "sparse_decode"));
  }

  // FlashMLA's sparse prefill (SCHEMA.md, "sparse_prefill"): the flat
  // model-dtype workspace kv [S_kv, D], index rows into it.
  void sparse_prefill(const SparsePrefillArgs& a) override {
    if (!has(Op::kSparsePrefill)) Backend::sparse_prefill(a);
    check_sparse_prefill_args(a);
    const std::int64_t T = a.q.shape[0], N = a.q.shape[1], D = a.q.shape[2], S = a.kv.shape[0];
    // L and R from the case when it matches (the workspace's rows are [kv_c | k_pe]).
    int L = static_cast<int>(a.o.shape[2]), R = static_cast<int>(D - a.o.shape[2]);
    if (const CaseSpec* s = spec(); s && s->dims.kv_lora_rank + s->dims.rope_dim == D) {
      L = s->dims.kv_lora_rank;
      R = s->dims.rope_dim;
    }
    exec::BundleCall call{sparse_problem(Op::kSparsePrefill, a.q, a.o, L, R), {}, {}, {}};
    plugin::Problem& p = call.problem;
    // No requests: one "request" of T queries over the S_kv rows (as cache_write's n slots).
    p.seq_lens = {static_cast<std::int32_t>(S)};
    p.query_lens = {static_cast<std::int32_t>(T)};
    p.scale = a.scale;
    name_case(p);
    if (const CaseSpec* s = spec(); s && !p.case_id.empty()) p.kv = s->kv_format();  // where the workspace came from
    call.inputs = {{"q", a.q}, {"kv", a.kv}, {"indices", a.indices}};
    call.int_attrs = {{"s_kv", S}, {"topk", a.indices.shape[1]}, {"has_topk_length", a.topk_length.empty() ? 0 : 1}};
    if (!a.topk_length.empty()) call.inputs.push_back({"topk_length", ints(a.topk_length)});
    add_sink(call, a.sink, N);
    invoke(call, {{"o", a.o}, {"lse", a.lse}}, sparse_rule(a.q, a.o, "sparse_prefill"));
  }

 private:
  bool has(Op op) const { return std::find(cfg_.caps.ops.begin(), cfg_.caps.ops.end(), op) != cfg_.caps.ops.end(); }
  const CaseSpec* spec() const { return last_spec_ ? &*last_spec_ : nullptr; }

  static TensorView ints(std::span<const std::int32_t> v) {
    return TensorView{DType::kI32, {static_cast<std::int64_t>(v.size())}, const_cast<std::int32_t*>(v.data())};
  }

  // The block-table rows of a call's requests as one [B, W] table.
  static std::vector<std::int32_t> table_rows(const PagedCache& c, std::span<const std::int32_t> rows) {
    const std::int64_t W = c.table_width, n = c.block_table.dim(0);
    std::vector<std::int32_t> t(rows.size() * static_cast<std::size_t>(W));
    for (std::size_t i = 0; i < rows.size(); ++i) {
      if (rows[i] < 0 || rows[i] >= n) throw std::out_of_range("block table row " + std::to_string(rows[i]) + " out of range");
      std::copy_n(c.block_table.data<std::int32_t>() + rows[i] * W, W, t.data() + i * static_cast<std::size_t>(W));
    }
    return t;
  }

  // A paged cache's page geometry (SCHEMA.md, "Cache entry layouts"); prefix
  // "extra_" for V4's compressed cache, which also gets its entry size.
  static void add_cache_attrs(exec::BundleCall& call, const std::string& prefix, const PagedCache& c) {
    const EntryFormat f = c.format();
    call.int_attrs.push_back({prefix + "num_blocks", c.num_blocks});
    if (!prefix.empty()) {
      call.int_attrs.push_back({prefix + "block_size", c.block_size});
      call.int_attrs.push_back({prefix + "entry_bytes", c.entry_bytes});
    }
    call.int_attrs.push_back({prefix + "block_bytes", c.block_bytes});
    if (prefix.empty()) {
      call.int_attrs.push_back({"entry_data_bytes", f.data_bytes});
      call.int_attrs.push_back({"scale_elem_bytes", f.scale_elem});
      call.int_attrs.push_back({"scale_tile", f.tile});
    }
  }

  void add_sink(exec::BundleCall& call, std::span<const float> sink, std::int64_t N) {
    call.int_attrs.push_back({"has_sink", sink.empty() ? 0 : 1});
    if (sink.empty()) return;
    if (static_cast<std::int64_t>(sink.size()) != N)
      throw std::invalid_argument("sink has " + std::to_string(sink.size()) + " entries for " + std::to_string(N) + " heads");
    call.inputs.push_back({"sink", TensorView{DType::kF32, {N}, const_cast<float*>(sink.data())}});
  }

  // The problem of a sparse call: shapes from q and o (Dv in v_head_dim).
  static plugin::Problem sparse_problem(Op op, const TensorView& q, const TensorView& o, int L, int R) {
    plugin::Problem p;
    p.op = op;
    p.num_heads = static_cast<int>(q.shape[1]);
    p.kv_lora_rank = L;
    p.rope_dim = R;
    p.nope_dim = 0;
    p.v_head_dim = static_cast<int>(o.shape[2]);
    p.dtype = q.dtype;
    return p;
  }

  // The case id (and spec_decode) when the last case asked about has these heads and dims.
  void name_case(plugin::Problem& p) const {
    const CaseSpec* s = spec();
    if (!s || s->num_heads() != p.num_heads || s->dims.kv_lora_rank != p.kv_lora_rank || s->dims.rope_dim != p.rope_dim) return;
    p.case_id = s->id();
    p.spec_decode = s->batch.spec_decode;
  }

  // What a sparse op must answer, for the messages of a wrong answer.
  static std::string sparse_rule(const TensorView& q, const TensorView& o, const std::string& op) {
    const std::int64_t T = q.shape[0], N = q.shape[1], Dv = o.shape[2];
    return op + " answers o [T, N, Dv] = [" + std::to_string(T) + ", " + std::to_string(N) + ", " + std::to_string(Dv) +
           "] (Dv = v_head_dim: the latent L for V3.2, the whole entry L + R for V4), a float type or " +
           std::string(dtype_name(o.dtype)) + " bits, and lse [T, N] = [" + std::to_string(T) + ", " + std::to_string(N) +
           "], a float type (SCHEMA.md)";
  }

  // `rule`: the sparse ops' answer, named in a wrong answer's message; a
  // missing output is then INCORRECT too ("" for the version-1 ops).
  void invoke(const exec::BundleCall& call, std::vector<exec::ExpectedOutput> outputs, const std::string& rule = "") {
    const TempDir dir;
    const std::string in = dir.file("in.h5"), out = dir.file("out.h5");
    const std::string err = dir.file("stderr.txt");
    exec::write_bundle(in, cfg_.name, std::span<const exec::BundleCall>(&call, 1));
    const std::string cmd = replace_all(replace_all(cfg_.command, "{in}", exec::shell_quote(in)), "{out}", exec::shell_quote(out));
    const exec::CommandResult r = exec::run_command(cmd, cfg_.timeout_s, dir.file("stdout.txt"), err);
    const std::string op(op_name(call.problem.op));
    auto with_stderr = [&](std::string m) {
      const std::string tail = exec::tail_of_file(err);
      return tail.empty() ? m : m + "; stderr: " + tail;
    };
    if (r.timed_out) {
      std::ostringstream s;
      s << cfg_.name << " " << op << ": the command ran past --exec-timeout " << cfg_.timeout_s << " s and was killed";
      throw BackendTimeoutError(with_stderr(s.str()));
    }
    if (r.signal != 0)
      throw std::runtime_error(with_stderr(cfg_.name + " " + op + ": the command was killed by signal " + signal_text(r.signal)));
    if (r.exit_code != 0)
      throw std::runtime_error(with_stderr(cfg_.name + " " + op + ": the command exited with status " + std::to_string(r.exit_code)));
    if (!fs::exists(out)) throw std::runtime_error(with_stderr(cfg_.name + " " + op + ": the command wrote no outputs file {out}"));
    exec::CallOutcome o;
    try {
      o = exec::read_outputs(out, 0, outputs, rule.empty() ? exec::MissingOutput::kCrashed : exec::MissingOutput::kIncorrect);
    } catch (const WrongOutputError& e) {
      throw WrongOutputError(cfg_.name + " " + op + " outputs: " + e.what() + (rule.empty() ? "" : "; rule: " + rule));
    } catch (const std::exception& e) {
      throw std::runtime_error(with_stderr(cfg_.name + " " + op + ": unusable outputs file: " + e.what()));
    }
    if (o.status == "ok") return;
    const std::string m = o.message.empty() ? "(no message)" : o.message;
    if (o.status == "not_supported") throw NotSupportedError(cfg_.name + " " + op + ": " + m);
    if (o.status == "unavailable") throw DeviceUnavailableError(cfg_.name + " " + op + ": " + m);
    throw std::runtime_error(with_stderr(cfg_.name + " " + op + " reported an error: " + m));
  }

  ExecConfig cfg_;
  std::string description_ = "exec: " + cfg_.command;
  mutable std::optional<CaseSpec> last_spec_;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep))
    if (!cur.empty()) out.push_back(cur);
  return out;
}

std::int64_t parse_int64(const std::string& key, const std::string& v) {
  try {
    std::size_t pos = 0;
    const long long x = std::stoll(v, &pos);
    if (pos == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw InputError("--exec-caps: " + key + ": '" + v + "' is not an integer");
}

int parse_int(const std::string& key, const std::string& v) {
  const std::int64_t x = parse_int64(key, v);
  if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max())
    throw InputError("--exec-caps: " + key + ": '" + v + "' is out of range");
  return static_cast<int>(x);
}

}  // namespace

Capabilities default_exec_caps() {
  Capabilities c;
  c.ops = {Op::kDecode};
  c.block_sizes = {16};
  c.query_len_support = QueryLenSupport::kVarlen;
  c.reorder_threshold = 1;
  c.dtypes = {DType::kBF16, DType::kF16};
  c.kv_dtypes = {KvCacheDtype::kAuto};
  return c;
}

Capabilities parse_exec_caps(const std::string& text) {
  Capabilities c = default_exec_caps();
  std::string t = text;
  std::replace(t.begin(), t.end(), ';', ' ');
  std::istringstream in(t);
  for (std::string item; in >> item;) {
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos) throw InputError("--exec-caps: '" + item + "' is not key=value");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    const std::vector<std::string> list = split(value, ',');
    if (list.empty()) throw InputError("--exec-caps: " + key + " has no value");
    if (key == "ops") {
      c.ops.clear();
      for (const auto& o : list) {
        const Op op = parse_op(o);
        if (op == Op::kLayer)
          throw InputError("--exec-caps: ops lists kernels (decode, prefill, cache_write, sparse_decode, sparse_prefill), not layer");
        c.ops.push_back(op);
      }
    } else if (key == "block_sizes") {
      c.block_sizes.clear();
      for (const auto& b : list) {
        const int bs = parse_int(key, b);
        if (bs < 1) throw InputError("--exec-caps: block size " + b + " must be >= 1");
        c.block_sizes.push_back(bs);
      }
    } else if (key == "query_len") {
      std::string q = value;
      std::transform(q.begin(), q.end(), q.begin(), [](unsigned char ch) { return std::toupper(ch); });
      if (q == "SINGLE_ONLY") c.query_len_support = QueryLenSupport::kSingleOnly;
      else if (q == "UNIFORM") c.query_len_support = QueryLenSupport::kUniform;
      else if (q == "VARLEN") c.query_len_support = QueryLenSupport::kVarlen;
      else throw InputError("--exec-caps: query_len '" + value + "' (SINGLE_ONLY, UNIFORM or VARLEN)");
    } else if (key == "reorder_threshold") {
      c.reorder_threshold = parse_int(key, value);
      if (c.reorder_threshold < 1) throw InputError("--exec-caps: reorder_threshold must be >= 1");
    } else if (key == "dtypes") {
      c.dtypes.clear();
      for (const auto& d : list) c.dtypes.push_back(parse_model_dtype(d));
    } else if (key == "kv_dtypes") {
      c.kv_dtypes.clear();
      for (const auto& k : list) c.kv_dtypes.push_back(parse_kv_cache_dtype(k));
    } else if (key == "strided_views") {
      if (value != "0" && value != "1") throw InputError("--exec-caps: strided_views must be 0 or 1, not '" + value + "'");
      c.strided_views = value == "1";
    } else if (key == "max_pool_bytes") {
      const std::int64_t n = parse_int64(key, value);
      if (n < 0) throw InputError("--exec-caps: max_pool_bytes must be >= 0 (0: 2^31)");
      c.max_pool_bytes = n == 0 ? default_exec_caps().max_pool_bytes : n;
    } else {
      throw InputError("--exec-caps: unknown key '" + key +
                       "' (ops, block_sizes, query_len, reorder_threshold, dtypes, kv_dtypes, strided_views, "
                       "max_pool_bytes)");
    }
  }
  return c;
}

BackendEntry exec_backend_entry(const ExecConfig& cfg) {
  if (!valid_backend_name(cfg.name))
    throw InputError("--exec-name '" + cfg.name + "': 1-64 letters, digits, '.', '_', '-'");
  if (cfg.command.find("{in}") == std::string::npos || cfg.command.find("{out}") == std::string::npos)
    throw InputError("--exec '" + cfg.command + "': the command must name {in} (the case bundle) and {out} (the outputs file)");
  if (!(cfg.timeout_s > 0) || !std::isfinite(cfg.timeout_s)) throw InputError("--exec-timeout must be > 0 seconds");
  return BackendEntry(cfg.name, BackendEntry::Make([cfg](const BackendOptions&) -> std::unique_ptr<Backend> {
                        return std::make_unique<ExecBackend>(cfg);
                      }));
}

}  // namespace mlagate
