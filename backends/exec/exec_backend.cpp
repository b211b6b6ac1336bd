// The exec backend: one bundle, one run of the command and one outputs file
// per kernel call, in a fresh temporary directory removed afterwards.
#include "backends/exec/exec_backend.h"

#include <stdlib.h>

#include <algorithm>
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
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
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
    exec::BundleCall call{plugin::decode_problem(a, spec()), {}};
    const std::vector<std::int32_t> table = plugin::call_block_table(a);
    const PagedCache& cache = *a.cache;
    const std::int64_t b = static_cast<std::int64_t>(a.seq_lens.size());
    call.inputs = {{"q_lat", a.q_lat},
                   {"q_pe", a.q_pe},
                   {"kv_cache", cache.data.view()},
                   {"block_table", TensorView{DType::kI32, {b, cache.block_table.dim(1)}, const_cast<std::int32_t*>(table.data())}},
                   {"query_start_loc", TensorView{DType::kI32, {b + 1}, const_cast<std::int32_t*>(a.query_start_loc.data())}}};
    invoke(call, {{"o_lat", a.o_lat}, {"lse", a.lse}});
  }

  void prefill(const PrefillArgs& a) override {
    if (!has(Op::kPrefill)) Backend::prefill(a);
    exec::BundleCall call{plugin::prefill_problem(a, spec()), {}};
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
    exec::BundleCall call{plugin::cache_write_problem(cache, kv_c, k_pe, slots.size(), spec()), {}};
    const std::int64_t n = static_cast<std::int64_t>(slots.size());
    call.inputs = {{"kv_c", kv_c},
                   {"k_pe", k_pe},
                   {"slot_mapping", TensorView{DType::kI64, {n}, const_cast<std::int64_t*>(slots.data())}},
                   {"kv_cache", cache.data.view()}};
    invoke(call, {{"kv_cache", cache.data.view()}});
  }

 private:
  bool has(Op op) const { return std::find(cfg_.caps.ops.begin(), cfg_.caps.ops.end(), op) != cfg_.caps.ops.end(); }
  const CaseSpec* spec() const { return last_spec_ ? &*last_spec_ : nullptr; }

  void invoke(const exec::BundleCall& call, std::vector<exec::ExpectedOutput> outputs) {
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
      o = exec::read_outputs(out, 0, outputs);
    } catch (const WrongOutputError& e) {
      throw WrongOutputError(cfg_.name + " " + op + " outputs: " + e.what());
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

int parse_int(const std::string& key, const std::string& v) {
  try {
    std::size_t pos = 0;
    const int x = std::stoi(v, &pos);
    if (pos == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw InputError("--exec-caps: " + key + ": '" + v + "' is not an integer");
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
        if (op == Op::kLayer) throw InputError("--exec-caps: ops lists kernels (decode, prefill, cache_write), not layer");
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
    } else {
      throw InputError("--exec-caps: unknown key '" + key +
                       "' (ops, block_sizes, query_len, reorder_threshold, dtypes, kv_dtypes)");
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
