// mlagate shrink (shrink.h): greedy one-step reductions, each checked by a
// separate `mlagate run` of the binary on a suite file written here.
#include "harness/reliability/shrink.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "backends/exec/subprocess.h"
#include "cases/errors.h"
#include "cases/remove_tree.h"
#include "cases/suite.h"
#include "harness/reliability/isolate.h"
#include "harness/reliability/spawn.h"
#include "reports/record.h"

namespace mlagate {

namespace {

namespace fs = std::filesystem;

std::string ints(const std::vector<int>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// What one run of a candidate said about the target record.
struct Outcome {
  bool ran = false;  // the run produced a record for the target
  std::string status, message;
  std::string expected, expected_entry, expected_reason;  // the record's --expect outcome, if any
};

std::string quote(const std::string& s) { return exec::shell_word(s); }

class Shrinker {
 public:
  explicit Shrinker(const ShrinkOptions& o) : opt_(o) {
    fs::create_directories(fs::path(opt_.out_dir) / "runs");
    if (worker_executable().empty()) throw InputError("shrink runs the mlagate binary: unavailable in this process");
  }

  // The run's arguments (after the binary) for `cases`, the last being the target.
  std::vector<std::string> run_args(const std::string& yaml, const std::vector<CaseSpec>& cases,
                                    const std::vector<std::string>& flags) const {
    std::vector<std::string> a = {"run", "--suite", yaml, "--backend", opt_.backend, "--op", std::string(op_name(opt_.op))};
    if (cases.size() > 1)
      for (const CaseSpec& c : cases) a.insert(a.end(), {"--case", c.id()});
    a.insert(a.end(), opt_.run_args.begin(), opt_.run_args.end());
    a.insert(a.end(), flags.begin(), flags.end());
    return a;
  }

  Outcome run(const CaseSpec& target, const std::vector<std::string>& flags) {
    ++runs_;
    std::vector<CaseSpec> cases = opt_.before;
    cases.push_back(target);
    const fs::path dir = fs::path(opt_.out_dir) / "runs";
    const std::string yaml = (dir / "candidate.yaml").string();
    {
      std::ofstream f(yaml);
      f << cases_as_suite_yaml(cases);
    }
    const std::string json = (dir / "candidate.json").string();
    fs::remove(json);
    std::vector<std::string> argv = {worker_executable()};
    for (auto& s : run_args(yaml, cases, flags)) argv.push_back(s);
    for (const char* s : {"--no-progress", "-q", "--allow-nothing-ran", "--json"}) argv.push_back(s);
    argv.push_back(json);
    // A failure that is no crash or hang needs no worker process (the
    // candidate is a process of its own): half the time of a small run.
    if (!isolate_) argv.insert(argv.end(), {"--isolate", "none"});
    (void)spawn_and_wait(argv, (dir / "candidate.out").string());  // the record says how it went
    Outcome o;
    std::ifstream in(json);
    if (!in) return o;  // an input error (an impossible case): not the same failure
    nlohmann::json doc;
    try {
      doc = nlohmann::json::parse(in);
    } catch (const std::exception&) {
      return o;
    }
    for (const auto& r : doc.value("records", nlohmann::json::array()))
      if (r.value("id", "") == target.id() && r.value("backend", "") == opt_.backend &&
          r.value("op", "") == op_name(opt_.op)) {
        o.ran = true;
        o.status = r.value("status", "");
        o.message = r.value("message", "");
        if (const auto e = r.find("expected"); e != r.end() && e->is_object()) {
          o.expected = e->value("outcome", "");
          o.expected_entry = e->value("entry", "");
          o.expected_reason = e->value("reason", "");
        }
      }
    return o;
  }

  bool same(const Outcome& want, const Outcome& got) const {
    if (!got.ran || got.status != want.status) return false;
    // An order-dependent failure must stay one (not become a plain failure).
    const bool od = want.message.rfind("order-dependent", 0) == 0;
    return !od || got.message.rfind("order-dependent", 0) == 0;
  }

  int runs() const { return runs_; }
  void isolate(bool on) { isolate_ = on; }

 private:
  const ShrinkOptions& opt_;
  int runs_ = 0;
  bool isolate_ = true;
};

struct Candidate {
  std::string what;
  CaseSpec spec;
  std::vector<std::string> flags;
};

bool valid(const CaseSpec& c) {
  try {
    c.validate();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// The value of `--name V` in flags (0 when absent), and flags with it set to v.
int flag_value(const std::vector<std::string>& flags, const std::string& name) {
  for (std::size_t i = 0; i + 1 < flags.size(); ++i)
    if (flags[i] == name) return std::atoi(flags[i + 1].c_str());
  return 0;
}
std::vector<std::string> with_flag(std::vector<std::string> flags, const std::string& name, int v) {
  for (std::size_t i = 0; i + 1 < flags.size(); ++i)
    if (flags[i] == name) {
      flags[i + 1] = std::to_string(v);
      return flags;
    }
  flags.insert(flags.end(), {name, std::to_string(v)});
  return flags;
}

// The reductions of one shrink step, in the order added; a reduction whose
// case would not validate is dropped here, so the generators need not check.
class CandidateList {
 public:
  explicit CandidateList(const std::vector<std::string>& flags) : flags_(flags) {}
  void add(std::string what, CaseSpec c) { add(std::move(what), std::move(c), flags_); }
  void add(std::string what, CaseSpec c, std::vector<std::string> f) {
    if (valid(c)) out_.push_back({std::move(what), std::move(c), std::move(f)});
  }
  const std::vector<std::string>& flags() const { return flags_; }
  std::vector<Candidate> take() { return std::move(out_); }

 private:
  const std::vector<std::string>& flags_;
  std::vector<Candidate> out_;
};

// A merge case's one-step reductions, biggest first: fewer tokens, fewer
// heads, half the head dim, the lse pattern toward ordinary (mixed first to
// ordinary, then to each pattern it mixes, so the row kind that fails is
// named), no lse gap, bf16.
std::vector<Candidate> merge_candidates(const CaseSpec& s, const std::vector<std::string>& flags) {
  CandidateList out(flags);
  const int t = s.num_tokens();
  for (int nt : {t / 2, t - 1}) {
    if (nt < 1 || nt >= t || (nt == t - 1 && t / 2 == t - 1)) continue;
    CaseSpec c = s;
    c.batch.seq_lens = {nt};
    c.batch.query_lens = {nt};
    out.add("tokens " + std::to_string(t) + " -> " + std::to_string(nt), c);
  }
  if (s.total_heads % (s.tp * 2) == 0) {
    CaseSpec c = s;
    c.tp *= 2;
    out.add("heads " + std::to_string(s.num_heads()) + " -> " + std::to_string(c.num_heads()), c);
  } else if (s.tp == 1 && s.total_heads > 1) {
    CaseSpec c = s;
    c.total_heads = s.total_heads / 2;
    out.add("heads " + std::to_string(s.num_heads()) + " -> " + std::to_string(c.num_heads()), c);
  }
  if (s.merge.head_dim > 1) {
    CaseSpec c = s;
    c.merge.head_dim = s.merge.head_dim / 2;
    out.add("head dim " + std::to_string(s.merge.head_dim) + " -> " + std::to_string(c.merge.head_dim), c);
  }
  auto pattern = [&](LsePattern p) {
    CaseSpec c = s;
    c.merge.lse = p;
    out.add("lse " + std::string(lse_pattern_name(s.merge.lse)) + " -> " + std::string(lse_pattern_name(p)), c);
  };
  if (s.merge.lse != LsePattern::kOrdinary) pattern(LsePattern::kOrdinary);
  if (s.merge.lse == LsePattern::kMixed)
    for (LsePattern p : {LsePattern::kPrefixEmpty, LsePattern::kSuffixEmpty, LsePattern::kPrefixPosInf, LsePattern::kSuffixPosInf,
                         LsePattern::kBothEmpty, LsePattern::kBothPosInf})
      pattern(p);
  if (s.merge.gap != 0) {
    CaseSpec c = s;
    c.merge.gap = 0;
    out.add("lse gap " + exact_number(s.merge.gap) + " -> 0", c);
  }
  if (s.dtype != DType::kBF16) {
    CaseSpec c = s;
    c.dtype = DType::kBF16;
    out.add("dtype bf16", c);
  }
  return out.take();
}

// A serving mode's numbers (fewer steps, fewer ranks, a smaller interleave):
// they come first because each makes every later candidate run cheaper.
void serving_mode_candidates(const CaseSpec& s, CandidateList& out) {
  const std::vector<std::string>& flags = out.flags();
  if (const int n = flag_value(flags, "--steps"); n > 1)
    out.add("steps " + std::to_string(n) + " -> " + std::to_string(n / 2), s, with_flag(flags, "--steps", n / 2));
  if (const int n = flag_value(flags, "--dcp"); n > 2)
    out.add("ranks " + std::to_string(n) + " -> " + std::to_string(std::max(2, n / 2)), s,
            with_flag(flags, "--dcp", std::max(2, n / 2)));
  if (const int k = flag_value(flags, "--dcp-interleave"); k > 1)
    out.add("interleave " + std::to_string(k) + " -> " + std::to_string(k / 2), s, with_flag(flags, "--dcp-interleave", k / 2));
}

// Request i's context and query shorter.
void request_candidates(const CaseSpec& s, int i, CandidateList& out) {
  const int b = s.num_requests();
  const int q = s.batch.query_lens[i], sl = s.batch.seq_lens[i], ctx = sl - q;
  // Halve first; then cut by a power of two >= 64 (a context keeps its
  // remainder by every tile up to that size), then by a quarter.
  std::vector<int> cuts;
  if (ctx > 0) cuts.push_back(ctx - ctx / 2);
  int p2 = 64;
  while (p2 * 2 < ctx) p2 *= 2;
  if (ctx > 64) cuts.push_back(p2);
  if (ctx >= 4) cuts.push_back(ctx / 4);
  for (int cut : cuts) {
    if (cut <= 0) continue;
    CaseSpec c = s;
    c.batch.seq_lens[i] = sl - cut;
    out.add("request " + std::to_string(i) + " context " + std::to_string(ctx) + " -> " + std::to_string(ctx - cut), c);
  }
  for (int nq : {q / 2, q - q / 4, q - 1}) {
    if (nq < 1 || nq >= q) continue;
    CaseSpec c = s;
    c.batch.query_lens[i] = nq;
    c.batch.seq_lens[i] = sl == 0 ? 0 : sl - (q - nq);
    // Spec decode keeps its query lengths uniform.
    if (c.batch.spec_decode)
      for (int j = 0; j < b; ++j) {
        c.batch.seq_lens[j] = s.batch.seq_lens[j] == 0 ? 0 : s.batch.seq_lens[j] - (s.batch.query_lens[j] - nq);
        c.batch.query_lens[j] = nq;
      }
    out.add("request " + std::to_string(i) + " query " + std::to_string(q) + " -> " + std::to_string(nq), c);
  }
  if (q > 1 && sl > 0 && !s.batch.spec_decode) {
    CaseSpec c = s;  // fewer query tokens over the same keys (a seq_len rule survives it)
    c.batch.query_lens[i] = q / 2;
    out.add("request " + std::to_string(i) + " query " + std::to_string(q) + " -> " + std::to_string(q / 2) + ", same keys", c);
  }
}

// The batch's shape: fewer requests, fewer heads, each request shorter.
void batch_candidates(const CaseSpec& s, CandidateList& out) {
  const int b = s.num_requests();
  for (int i = 0; i < b && b > 1; ++i) {
    CaseSpec c = s;
    c.batch.seq_lens.erase(c.batch.seq_lens.begin() + i);
    c.batch.query_lens.erase(c.batch.query_lens.begin() + i);
    out.add("drop request " + std::to_string(i), c);
  }
  if (s.total_heads % (s.tp * 2) == 0) {
    CaseSpec c = s;
    c.tp *= 2;
    out.add("heads " + std::to_string(s.num_heads()) + " -> " + std::to_string(c.num_heads()), c);
  } else if (s.tp == 1 && s.total_heads > 1) {
    CaseSpec c = s;  // a head count no TP split gives (a drawn case): halve it
    c.total_heads = s.total_heads / 2;
    out.add("heads " + std::to_string(s.num_heads()) + " -> " + std::to_string(c.num_heads()), c);
  }
  for (int i = 0; i < b; ++i) request_candidates(s, i, out);
  if (s.tp == 1 && s.total_heads > 1) {
    CaseSpec c = s;  // one head fewer: a head-count rule (not a multiple of 16) survives it
    c.total_heads = s.total_heads - 1;
    out.add("heads " + std::to_string(s.num_heads()) + " -> " + std::to_string(c.num_heads()), c);
  }
}

// Sparse cases: narrower index rows, no compressed cache, no sink, plain indices.
void sparse_candidates(const CaseSpec& s, CandidateList& out) {
  const SparseSpec& sp = s.sparse;
  auto sparse = [&](std::string what, auto&& edit) {
    CaseSpec c = s;
    edit(c.sparse);
    out.add(std::move(what), c);
  };
  if (sp.topk > 1) sparse("topk " + std::to_string(sp.topk) + " -> " + std::to_string(sp.topk / 2), [](SparseSpec& x) { x.topk /= 2; });
  if (sp.window > 1)
    sparse("window " + std::to_string(sp.window) + " -> " + std::to_string(sp.window / 2), [](SparseSpec& x) { x.window /= 2; });
  if (sp.compress > 0) {
    sparse("no compressed cache", [](SparseSpec& x) { x.compress = x.extra_topk = 0; });
    if (sp.extra_topk > 1)
      sparse("compressed row " + std::to_string(sp.extra_topk) + " -> " + std::to_string(sp.extra_topk / 2),
             [](SparseSpec& x) { x.extra_topk /= 2; });
  }
  if (sp.sink) sparse("no sink", [](SparseSpec& x) { x.sink = false; });
  if (sp.active() && sp.pattern != IndexPattern::kRandom)
    sparse("index pattern random", [](SparseSpec& x) { x.pattern = IndexPattern::kRandom; });
}

// Toward the plain case: Q magnitude and k_scale 1, bf16, an auto cache (dims stay: no
// set is smaller than another for every kernel).
void plain_case_candidates(const CaseSpec& s, CandidateList& out) {
  if (s.q_magnitude > 1) {
    CaseSpec c = s;
    c.q_magnitude = std::max(1.0, s.q_magnitude / 2);
    out.add("q magnitude " + exact_number(s.q_magnitude) + " -> " + exact_number(c.q_magnitude), c);
  }
  if (s.k_scale != 1.0f) {
    CaseSpec c = s;
    c.k_scale = 1.0f;
    out.add("k_scale " + exact_number(s.k_scale) + " -> 1", c);
  }
  if (s.dtype != DType::kBF16) {
    CaseSpec c = s;
    c.dtype = DType::kBF16;
    out.add("dtype bf16", c);
  }
  if (s.kv_cache_dtype != KvCacheDtype::kAuto && !s.sparse.v4()) {
    CaseSpec c = s;
    c.kv_cache_dtype = KvCacheDtype::kAuto;
    c.scale_rule = ScaleRule::kPow2;
    c.k_scale = 1.0f;
    out.add("kv cache auto", c);
  }
  // Toward the contiguous layout a part at a time, so the part that fails is named.
  auto layout = [&](std::string what, auto&& edit) {
    CaseSpec c = s;
    edit(c.layout);
    out.add("layout " + layout_name(s.layout) + " -> " + layout_name(c.layout) + " (" + what + ")", c);
  };
  if (s.layout.strided) layout("no strided views", [](LayoutSpec& l) { l.strided = false; });
  if (s.layout.shared) layout("no shared pages", [](LayoutSpec& l) { l.shared = false; });
  if (s.layout.pool == PoolSize::k4G) layout("a pool past 2^31", [](LayoutSpec& l) { l.pool = PoolSize::k2G; });
  if (s.layout.pool != PoolSize::kFitted) layout("a fitted pool", [](LayoutSpec& l) { l.pool = PoolSize::kFitted; });
}

// One-step reductions of (spec, flags), biggest first.
std::vector<Candidate> candidates(const CaseSpec& s, const std::vector<std::string>& flags, bool splits_given) {
  if (s.merge.active()) return merge_candidates(s, flags);
  CandidateList out(flags);
  serving_mode_candidates(s, out);
  batch_candidates(s, out);
  sparse_candidates(s, out);
  for (int bs : {1, 2, 4, 8, 16, 32, 64}) {
    if (s.block_size != 0 && bs >= s.block_size) break;
    CaseSpec c = s;
    c.block_size = bs;
    out.add("block size " + (s.block_size ? std::to_string(s.block_size) : std::string("auto")) + " -> " + std::to_string(bs), c);
  }
  if (!splits_given && flag_value(flags, "--splits") == 0) out.add("one split (--splits 1)", s, with_flag(flags, "--splits", 1));
  plain_case_candidates(s, out);
  return out.take();
}

}  // namespace

std::string case_shape(const CaseSpec& c) {
  if (c.merge.active())
    return std::to_string(c.num_tokens()) + " tokens, " + std::to_string(c.num_heads()) + " heads, head dim " +
           std::to_string(c.merge.head_dim) + ", lse " + std::string(lse_pattern_name(c.merge.lse)) +
           (c.merge.gap != 0 ? " gap " + exact_number(c.merge.gap) : std::string());
  const std::vector<int>& s = c.batch.seq_lens;
  return std::to_string(c.num_requests()) + " requests, " + std::to_string(c.num_tokens()) + " query tokens, " +
         std::to_string(std::accumulate(s.begin(), s.end(), 0)) + " keys, " + std::to_string(c.num_heads()) +
         " heads, block size " + (c.block_size ? std::to_string(c.block_size) : std::string("auto"));
}

std::string cases_as_suite_yaml(const std::vector<CaseSpec>& cases, const std::string& name) {
  std::ostringstream y;
  y << "# Written by mlagate " << name << ": the cases as they ran (rerun with the command it printed).\n"
    << "name: " << name << "\ndescription: cases written by mlagate " << name << "\nspecs:\n";
  for (const CaseSpec& c : cases)
    y << "  " << c.batch.name << ": {seq_lens: " << ints(c.batch.seq_lens) << ", query_lens: " << ints(c.batch.query_lens)
      << (c.batch.spec_decode ? ", spec_decode: true" : "") << "}\n";
  y << "groups:\n";
  for (const CaseSpec& c : cases) {
    y << "  - specs: [" << c.batch.name << "]\n"
      << "    tp: [" << c.tp << "]\n"
      << "    total_heads: [" << c.total_heads << "]\n"
      << "    dtype: [" << (c.dtype == DType::kBF16 ? "bf16" : c.dtype == DType::kF16 ? "fp16" : "fp32") << "]\n"
      << "    kv_cache_dtype: [\"" << kv_cache_format_name(c.kv_format()) << "\"]\n"
      << "    block_size: [" << (c.block_size ? std::to_string(c.block_size) : std::string("auto")) << "]\n"
      << "    seed: [" << c.seed << "]\n"
      << "    dims: [\"" << dims_label(c.dims) << "\"]\n"  // a preset's name, or L.R.P.V
      << "    q_magnitude: [" << exact_number(c.q_magnitude) << "]\n"
      << "    k_scale: [" << exact_number(c.k_scale) << "]\n";
    if (c.reference_k_scale_rounded) y << "    reference_k_scale: model_dtype\n";
    if (c.scale) y << "    scale: [" << exact_number(*c.scale) << "]\n";
    const SparseSpec& sp = c.sparse;
    if (sp.topk) y << "    topk: [" << sp.topk << "]\n";
    if (sp.window) y << "    window: [" << sp.window << "]\n";
    if (sp.compress) y << "    compressed: [\"" << sp.compress << "x" << sp.extra_topk << "\"]\n";
    if (sp.active())
      y << "    sink: [" << (sp.sink ? "true" : "false") << "]\n"
        << "    index_pattern: [" << index_pattern_name(sp.pattern) << "]\n";
    if (!c.layout.contiguous()) y << "    layout: [" << layout_name(c.layout) << "]\n";
    if (!c.ops.empty()) {
      y << "    ops: [";
      for (std::size_t i = 0; i < c.ops.size(); ++i) y << (i ? ", " : "") << op_name(c.ops[i]);
      y << "]\n";
    }
    if (c.merge.active())
      y << "    head_dim: [" << c.merge.head_dim << "]\n"
        << "    lse: [" << lse_pattern_name(c.merge.lse) << "]\n"
        << "    lse_gap: [" << exact_number(c.merge.gap) << "]\n";
  }
  // What the file gives back must be these cases, bit for bit (ids carry every field).
  const Suite back = parse_suite_yaml(y.str(), name + ".yaml");
  if (back.cases.size() != cases.size())
    throw std::logic_error(name + ": the suite file holds " + std::to_string(back.cases.size()) + " cases");
  for (std::size_t i = 0; i < cases.size(); ++i)
    if (back.cases[i].id() != cases[i].id() || back.cases[i].ops != cases[i].ops)
      throw std::logic_error(name + ": " + cases[i].id() + " reads back as " + back.cases[i].id());
  return y.str();
}

ShrinkResult shrink_case(const ShrinkOptions& in) {
  ShrinkOptions opt = in;
  std::FILE* log = opt.log;
  // The cases as the suite file names them: suite "shrunk", batch specs named apart.
  for (std::size_t i = 0; i < opt.before.size(); ++i) {
    opt.before[i].suite = "shrunk";
    opt.before[i].batch.name = "before" + std::to_string(i);
  }
  opt.target.suite = "shrunk";
  opt.target.batch.name = "target";
  bool splits_given = false;
  for (const auto& a : opt.run_args) splits_given = splits_given || a == "--splits";
  Shrinker sh(opt);
  CaseSpec cur = opt.target;
  std::vector<std::string> flags = opt.mode_flags;
  const Outcome want = sh.run(cur, flags);
  if (!want.ran) throw InputError("shrink: the case gave no record for " + opt.backend + " " + std::string(op_name(opt.op)) +
                                  " (see " + (fs::path(opt.out_dir) / "runs" / "candidate.out").string() + ")");
  if (want.status == "PASSED" || want.status == "NOT_SUPPORTED" || want.status == "SKIPPED")
    throw InputError("shrink: " + opt.backend + " " + std::string(op_name(opt.op)) + " on " + in.target.id() + " is " +
                     want.status + ": nothing to shrink");
  sh.isolate(want.status == "CRASHED" || want.status == "TIMEOUT");
  if (log) {
    std::fprintf(log, "shrinking %s %s: %s\n  %s\n  from: %s\n", opt.backend.c_str(), std::string(op_name(opt.op)).c_str(),
                 want.status.c_str(), want.message.c_str(), case_shape(cur).c_str());
    std::fflush(log);
  }
  bool progress = true;
  std::string stopped_by;
  auto may_run = [&] {
    if (sh.runs() >= opt.max_runs) stopped_by = "--max-runs " + std::to_string(opt.max_runs);
    else if (opt.deadline && std::chrono::steady_clock::now() >= *opt.deadline) stopped_by = "the time given (explore's budget)";
    return stopped_by.empty();
  };
  while (progress && may_run()) {
    progress = false;
    for (const Candidate& c : candidates(cur, flags, splits_given)) {
      if (!may_run()) break;
      const Outcome got = sh.run(c.spec, c.flags);
      if (!sh.same(want, got)) continue;
      cur = c.spec;
      flags = c.flags;
      if (log) {
        std::fprintf(log, "  %-34s %s\n", c.what.c_str(), got.status.c_str());
        std::fflush(log);
      }
      progress = true;
      break;
    }
  }
  // The result: its suite file, a golden bundle of it (--save-failures) and the command.
  ShrinkResult res;
  res.from = opt.target;
  res.to = cur;
  const fs::path dir(opt.out_dir);
  std::vector<CaseSpec> cases = opt.before;
  cases.push_back(cur);
  res.yaml = (dir / "shrunk.yaml").string();
  {
    std::ofstream f(res.yaml);
    f << cases_as_suite_yaml(cases);
  }
  const fs::path bundle = dir / "bundle";
  if (!remove_tree(bundle.string())) throw std::runtime_error("shrink: cannot remove the old " + bundle.string());
  std::vector<std::string> final_flags = flags;
  final_flags.insert(final_flags.end(), {"--save-failures", bundle.string()});
  for (const std::string& e : opt.expect) final_flags.insert(final_flags.end(), {"--expect", e});
  sh.isolate(true);  // the last run as the repro command runs it
  const Outcome last = sh.run(cur, final_flags);
  res.runs = sh.runs();
  res.stopped_by = stopped_by;
  res.status = last.status;
  res.message = last.message;
  res.same = sh.same(want, last);
  res.expected = last.expected;
  res.expected_entry = last.expected_entry;
  res.expected_reason = last.expected_reason;
  res.repro = "mlagate";
  for (const auto& a : sh.run_args(res.yaml, cases, flags)) res.repro += " " + quote(a);
  std::string flags_str;
  for (const auto& a : opt.run_args) flags_str += " " + quote(a);
  for (const auto& a : flags) flags_str += " " + quote(a);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(bundle, ec)) {
    res.bundle = e.path().string();
    res.replay = "mlagate replay " + quote(res.bundle) + " --backend " + quote(opt.backend) + " --op " +
                 std::string(op_name(opt.op)) + flags_str;
  }
  return res;
}

int shrink_main(const ShrinkOptions& opt) {
  const ShrinkResult r = shrink_case(opt);
  std::printf("  to:   %s (%d runs)\n  %s: %s\n  suite file: %s\n", case_shape(r.to).c_str(), r.runs, r.status.c_str(),
              r.message.c_str(), r.yaml.c_str());
  if (!r.bundle.empty()) std::printf("  golden bundle: %s\n  replay: %s\n", r.bundle.c_str(), r.replay.c_str());
  std::printf("  repro: %s\n", r.repro.c_str());
  if (!r.stopped_by.empty()) std::printf("  note: stopped by %s; a smaller case may still fail\n", r.stopped_by.c_str());
  if (!r.same) std::printf("  note: the last run gave %s, not the first run's status (a flaky failure?)\n", r.status.c_str());
  if (!opt.expect.empty()) {
    if (r.expected == "XFAIL")
      std::printf("  known: expected by %s: %s\n", r.expected_entry.c_str(), r.expected_reason.c_str());
    else
      std::printf("  new: no --expect entry expects this failure%s\n",
                  r.expected == "XPASS" ? " (an entry selects the case but the last run passed)" : "");
  }
  return 0;
}

}  // namespace mlagate
