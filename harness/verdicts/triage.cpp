// triage (triage.h): the what-if variants of a failing record, the class they
// point to, and the bug report.
#include "harness/verdicts/triage.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backends/exec/subprocess.h"
#include "cases/encoding.h"
#include "cases/errors.h"
#include "harness/reliability/isolate.h"
#include "harness/reliability/shrink.h"
#include "harness/reliability/spawn.h"
#include "harness/verdicts/facts.h"
#include "reports/report.h"
#include "reports/text.h"

namespace mlagate {

namespace verdicts_embed {
const std::vector<std::pair<std::string_view, std::string_view>>& embedded_files();
}  // namespace verdicts_embed

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

bool ran(const std::string& status) {
  return !status.empty() && status != "NOT_SUPPORTED" && status != "SKIPPED" && status != "INVALID_CASE";
}

// The record's main failing output: the first failing one that is not an lse,
// else the lse (as failure signatures pick it), else the first.
const Metrics* main_output(const Record& r) {
  const Metrics* pick = nullptr;
  for (const Metrics& m : r.metrics)
    if (!m.passed && m.output != "quant_error" && (pick == nullptr || (pick->output == "lse" && m.output != "lse"))) pick = &m;
  if (!pick && !r.metrics.empty()) pick = &r.metrics.front();
  return pick;
}

// The request the failure sits in: its first non-finite element, else its worst one.
int failing_request(const Record& r) {
  for (const Metrics& m : r.metrics)
    if (!m.passed && m.nonfinite_mismatches > 0 && m.first_nonfinite.request >= 0) return m.first_nonfinite.request;
  const Metrics* m = main_output(r);
  return m ? m->worst.request : -1;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

// `flags` with `--name value` set to value (added when absent).
std::vector<std::string> with_flag(std::vector<std::string> flags, const std::string& name, const std::string& value) {
  for (std::size_t i = 0; i + 1 < flags.size(); ++i)
    if (flags[i] == name) {
      flags[i + 1] = value;
      return flags;
    }
  flags.insert(flags.end(), {name, value});
  return flags;
}
bool has_flag(const std::vector<std::string>& flags, const std::string& name) {
  return std::find(flags.begin(), flags.end(), name) != flags.end();
}

class Runner {
 public:
  // `first`: the runs' files are numbered from first + 1 (a second Runner in one folder numbers after the first's).
  Runner(const TriageOptions& o, bool isolate, int first = 0) : opt_(o), isolate_(isolate), n_(first) {
    fs::create_directories(fs::path(o.out_dir) / "runs");
  }

  // One case on the backend with `extra` flags: its record (status "" when the run gave none).
  Record run(const CaseSpec& spec, const std::vector<std::string>& extra, std::string& command,
             const std::vector<std::string>& outputs = {}) {
    const fs::path dir = fs::path(opt_.out_dir) / "runs";
    const std::string tag = std::to_string(++n_);
    CaseSpec c = spec;
    c.suite = "triage";
    c.batch.name = "triage_case";  // a name no built-in batch spec has (the file defines it inline)
    const std::string yaml = (dir / ("case" + tag + ".yaml")).string();
    {
      std::ofstream f(yaml);
      f << cases_as_suite_yaml({c}, "triage");
    }
    const std::string json = (dir / ("record" + tag + ".json")).string();
    std::vector<std::string> args = {"run", "--suite", yaml, "--backend", opt_.backend, "--op", std::string(op_name(opt_.op))};
    args.insert(args.end(), opt_.run_args.begin(), opt_.run_args.end());
    for (std::size_t i = 0; i < extra.size(); ++i) {
      // A flag given again replaces the run_args' one (--poison zero over --poison nan).
      if (extra[i].rfind("--", 0) == 0 && i + 1 < extra.size() && extra[i + 1].rfind("--", 0) != 0) {
        args = with_flag(args, extra[i], extra[i + 1]);
        ++i;
      } else {
        args.push_back(extra[i]);
      }
    }
    args.insert(args.end(), outputs.begin(), outputs.end());
    if (!isolate_ && !has_flag(args, "--isolate")) args.insert(args.end(), {"--isolate", "none"});
    command = "mlagate";
    for (const std::string& a : args) command += " " + exec::shell_word(a);
    std::vector<std::string> argv = {worker_executable()};
    argv.insert(argv.end(), args.begin(), args.end());
    for (const char* s : {"--no-progress", "-q", "--allow-nothing-ran", "--json"}) argv.push_back(s);
    argv.push_back(json);
    const int rc = spawn_and_wait(argv, (dir / ("run" + tag + ".log")).string());
    Record none;
    none.status = Status::kSkipped;
    none.message = "the run gave no record (exit " + std::to_string(rc) + ", see " + (dir / ("run" + tag + ".log")).string() + ")";
    try {
      const JsonReport rep = read_json_report(json);
      for (const Record& r : rep.records)
        if (r.case_id == c.id() && r.backend == opt_.backend && r.op == op_name(opt_.op)) return r;
    } catch (const std::exception&) {
    }
    if (rc != 0 && !isolate_) {
      // Without a worker process a crash takes the run with it: that is a crash.
      none.status = Status::kCrashed;
      none.message = "the run died (exit " + std::to_string(rc) + ") without a record";
    }
    return none;
  }

 private:
  const TriageOptions& opt_;
  bool isolate_;
  int n_ = 0;
};

std::string fmt(double v) { return std::isnan(v) ? "-" : detail::format_g(v); }

}  // namespace

std::pair<std::string, std::string> classify(const std::string& given, const std::vector<TriageVariant>& v,
                                             double given_max_abs) {
  auto find = [&](const std::string& name) -> const TriageVariant* {
    for (const TriageVariant& x : v)
      if (x.name == name && x.applicable && ran(x.status)) return &x;
    return nullptr;
  };
  auto passes = [&](const std::string& name) {
    const TriageVariant* x = find(name);
    return x && x->status == "PASSED";
  };
  auto differs = [&](const std::string& name) {
    const TriageVariant* x = find(name);
    return x && x->status != given;
  };
  if (given == "PASSED") return {kClassNotReproduced, "the case passed when run again: nothing to triage"};
  if (const TriageVariant* r = find("repeat"); r && r->status == "NONDETERMINISTIC")
    return {kClassNondeterministic, "three runs on the same inputs gave different bits"};
  if (given == "NONDETERMINISTIC") return {kClassNondeterministic, "the record itself compares repeated runs"};
  if (differs("poison zero") || differs("poison sentinel")) {
    std::string how;
    for (const char* n : {"poison zero", "poison sentinel"})
      if (const TriageVariant* x = find(n); x && x->status != given) how += (how.empty() ? "" : "; ") + std::string(n) + ": " + x->status;
    return {kClassPoison, "the verdict follows what the unused cache and output memory hold (" + how +
                              "): the kernel reads or keeps memory outside the case's keys and outputs"};
  }
  if (passes("k_scale exact") || passes("reference, scale rounded"))
    return {kClassScaleRounding, std::string("it passes ") +
                                     (passes("k_scale exact") ? "with a k_scale exact in the model dtype" : "") +
                                     (passes("k_scale exact") && passes("reference, scale rounded") ? " and " : "") +
                                     (passes("reference, scale rounded")
                                          ? "against a reference that reads the cache with the scale rounded to the model dtype"
                                          : "") +
                                     ": the kernel multiplies by the scale in the model dtype"};
  if (passes("Q magnitude down")) return {kClassLargeQ, "it passes with Q 4x smaller: the logits' size drives it (overflow, exp range)"};
  if (passes("request alone") || passes("batch reversed"))
    return {kClassBatch, std::string("it passes ") + (passes("request alone") ? "with the failing request alone" : "with the batch reversed") +
                             ": the result depends on the other requests or their order"};
  if (passes("another block size")) return {kClassBlockSize, "it passes at another block size"};
  // The error follows the model dtype's rounding: 4x less (or a pass) with 3 more
  // mantissa bits, 4x more with 3 fewer (the ratio is 8 for a rounding).
  if (const TriageVariant* x = find("other model dtype")) {
    const bool finer = x->change.rfind("model dtype fp16", 0) == 0;
    const bool both = std::isfinite(given_max_abs) && std::isfinite(x->max_abs) && given_max_abs > 0 && x->max_abs > 0;
    if (finer ? (x->status == "PASSED" || (both && x->max_abs * 4 <= given_max_abs)) : (both && x->max_abs >= 4 * given_max_abs))
      return {kClassPrecision, std::string("with ") + (finer ? "fp16 (3 more mantissa bits) it " : "bf16 (3 fewer mantissa bits) it ") +
                                   (x->status == "PASSED" && finer ? std::string("passes")
                                                                   : "errs " + fmt(finer ? given_max_abs / x->max_abs : x->max_abs / given_max_abs) +
                                                                         (finer ? "x less" : "x more")) +
                                   ": an intermediate is rounded to the model dtype where the reference keeps fp32"};
  }
  return {kClassUnexplained, "it fails the same way under every what-if that applies"};
}

namespace {

using Planned = std::pair<TriageVariant, std::pair<CaseSpec, std::vector<std::string>>>;

// The what-if variants of `given` (a record of opt.spec), each a case and flags, or not applicable with the reason.
std::vector<Planned> plan_variants(const TriageOptions& opt, const Record& given) {
  const CaseSpec& s = opt.spec;
  std::vector<Planned> todo;
  auto add = [&](std::string name, std::string change, CaseSpec c, std::vector<std::string> flags) {
    TriageVariant v;
    v.name = std::move(name);
    v.change = std::move(change);
    todo.push_back({std::move(v), {std::move(c), std::move(flags)}});
  };
  auto skip = [&](std::string name, std::string change, std::string why) {
    TriageVariant v;
    v.name = std::move(name);
    v.change = std::move(change);
    v.applicable = false;
    v.why_not = std::move(why);
    todo.push_back({std::move(v), {}});
  };
  const bool serving = has_flag(opt.run_args, "--cuda-graph") || has_flag(opt.run_args, "--check") ||
                       has_flag(opt.run_args, "--dcp") || has_flag(opt.run_args, "--steps");
  if (serving || given.status == Status::kNondeterministic)
    skip("repeat", "--repeat 3: three runs compared bitwise", serving ? "a serving mode runs once" : "the record compared runs already");
  else add("repeat", "--repeat 3: three runs compared bitwise", s, {"--repeat", "3"});
  add("poison zero", "--poison zero: the null block, spare blocks, unused tails and outputs hold 0 instead of NaN", s, {"--poison", "zero"});
  add("poison sentinel", "--poison sentinel: they hold a large finite value", s, {"--poison", "sentinel"});
  const int req = failing_request(given);
  const bool batch = s.num_requests() >= 2 && !s.merge.active();
  if (batch && req >= 0 && req < s.num_requests()) {
    CaseSpec alone = s;
    alone.batch.name = s.batch.name + "_r" + std::to_string(req);
    alone.batch.seq_lens = {s.batch.seq_lens[static_cast<std::size_t>(req)]};
    alone.batch.query_lens = {s.batch.query_lens[static_cast<std::size_t>(req)]};
    add("request alone", "request " + std::to_string(req) + " alone (the one the failure sits in)", alone, {});
  } else {
    skip("request alone", "the failing request without the others", !batch ? "one request" : "no failing request located");
  }
  if (batch) {
    CaseSpec rev = s;
    rev.batch.name = s.batch.name + "_rev";
    std::reverse(rev.batch.seq_lens.begin(), rev.batch.seq_lens.end());
    std::reverse(rev.batch.query_lens.begin(), rev.batch.query_lens.end());
    add("batch reversed", "the requests in reverse order", rev, {});
  } else {
    skip("batch reversed", "the requests in reverse order", "one request");
  }
  const int bs = given.block_size > 0 ? given.block_size : s.block_size;
  int other_bs = 0;
  for (int b : opt.caps.block_sizes)
    if (b != bs) {
      other_bs = b;
      break;
    }
  if (other_bs > 0 && !s.merge.active()) {
    CaseSpec c = s;
    c.block_size = other_bs;
    add("another block size", "block size " + std::to_string(other_bs) + " instead of " + std::to_string(bs), c, {});
  } else {
    skip("another block size", "another block size the backend takes", "the backend takes one block size");
  }
  {
    CaseSpec c = s;
    c.q_magnitude = s.q_magnitude / 4;
    add("Q magnitude down", "Q magnitude " + exact_number(c.q_magnitude) + " instead of " + exact_number(s.q_magnitude), c, {});
  }
  const bool per_tensor = s.kv_cache_dtype == KvCacheDtype::kFp8 || s.kv_cache_dtype == KvCacheDtype::kFp8E4m3;
  const double rounded = round_to_16bit(s.k_scale, s.dtype == DType::kBF16);
  if (per_tensor && !k_scale_exact_in_model_dtype(s)) {
    CaseSpec c = s;
    c.k_scale = static_cast<float>(rounded);
    add("k_scale exact", "k_scale " + exact_number(rounded) + " (exact in the model dtype) instead of " + exact_number(s.k_scale), c, {});
    CaseSpec r = s;
    r.reference_k_scale_rounded = true;
    add("reference, scale rounded",
        "the same bytes and k_scale; the reference reads the cache with k_scale rounded to the model dtype (" +
            exact_number(rounded) + ")",
        r, {});
  } else {
    const std::string why = per_tensor ? "k_scale " + exact_number(s.k_scale) + " is exact in the model dtype"
                                       : "no per-tensor k_scale (kv " + kv_cache_format_name(s.kv_format()) + ")";
    skip("k_scale exact", "a k_scale exact in the model dtype", why);
    skip("reference, scale rounded", "the reference with k_scale rounded to the model dtype", why);
  }
  // The other 16-bit model dtype: fp16 has 3 more mantissa bits than bf16 (MLA
  // kernels take no fp32 inputs, so this is the what-if of more precision).
  const DType other = s.dtype == DType::kBF16 ? DType::kF16 : DType::kBF16;
  const bool takes_other = std::find(opt.caps.dtypes.begin(), opt.caps.dtypes.end(), other) != opt.caps.dtypes.end();
  const bool bf16_only_cache = s.kv_cache_dtype == KvCacheDtype::kFp8DsMla || s.kv_cache_dtype == KvCacheDtype::kFp8V4;
  if ((s.dtype == DType::kBF16 || s.dtype == DType::kF16) && takes_other && !bf16_only_cache && !s.merge.active()) {
    CaseSpec c = s;
    c.dtype = other;
    add("other model dtype",
        other == DType::kF16 ? "model dtype fp16 (3 more mantissa bits) instead of bf16"
                             : "model dtype bf16 (3 fewer mantissa bits) instead of fp16",
        c, {});
  } else {
    skip("other model dtype", "the other 16-bit model dtype",
         bf16_only_cache ? "the cache format stores bf16" : !takes_other ? "the backend takes one model dtype" : "not a bf16 or fp16 case");
  }
  return todo;
}

// Runs one planned variant and fills its status, verdict and the metric of the
// given record's main output (`output`: the errors are compared output to output).
TriageVariant run_variant(Runner& runner, Planned item, Status given, const std::string& output) {
  TriageVariant v = std::move(item.first);
  if (v.applicable) {
    Record r;
    try {
      item.second.first.validate();
      r = runner.run(item.second.first, item.second.second, v.command);
    } catch (const InputError& e) {
      v.applicable = false;
      v.why_not = e.what();
    }
    if (v.applicable) {
      v.status = std::string(status_name(r.status));
      v.message = r.message;
      for (const Metrics& m : r.metrics)
        if (m.output == output) {
          v.output = m.output;
          v.max_abs = m.max_abs;
          v.min_fudge = m.min_fudge;
        }
      if (r.status == given) v.verdict = "fails the same way";
      else if (r.status == Status::kPassed) v.verdict = "passes";
      else if (r.status == Status::kNotSupported || r.status == Status::kSkipped) {
        v.verdict = "not run: " + r.message;
        v.applicable = false;
        v.why_not = r.message;
      } else v.verdict = "fails otherwise (" + v.status + ")";
    }
  }
  if (!v.applicable && v.verdict.empty()) v.verdict = "n/a: " + v.why_not;
  return v;
}

// The variants that decide each class (confirm_class runs only these).
std::vector<std::string> decisive_variants(const std::string& cls) {
  if (cls == kClassNondeterministic) return {"repeat"};
  if (cls == kClassPoison) return {"poison zero", "poison sentinel"};
  if (cls == kClassScaleRounding) return {"k_scale exact", "reference, scale rounded"};
  if (cls == kClassLargeQ) return {"Q magnitude down"};
  if (cls == kClassBatch) return {"request alone", "batch reversed"};
  if (cls == kClassBlockSize) return {"another block size"};
  if (cls == kClassPrecision) return {"other model dtype"};
  return {};
}

// A progress line on opt.log, flushed: triage runs for minutes and a reader
// watches it live.
void say(const TriageOptions& opt, const char* f, const std::string& a, const std::string& b) {
  if (!opt.log) return;
  std::fprintf(opt.log, f, a.c_str(), b.c_str());
  std::fflush(opt.log);
}

// The case as a suite file beside the report: the repro line names it, not the
// scratch copy. Returns the repro command accordingly.
std::string keep_case_file(const TriageOptions& opt, const std::string& given_cmd) {
  const std::string scratch = (fs::path(opt.out_dir) / "runs" / "case1.yaml").string();
  const std::string kept = (fs::path(opt.out_dir) / "case.yaml").string();
  std::error_code ec;
  fs::copy_file(scratch, kept, fs::copy_options::overwrite_existing, ec);
  if (!ec) return replace_all(given_cmd, exec::shell_word(scratch), exec::shell_word(kept));
  return given_cmd;
}

// The report's bundle and results: the given case again, its failure saved.
// A crashing case keeps the worker process, so its outputs are not saved.
void save_bundle(const TriageOptions& opt, Runner& runner, bool crashes, TriageResult& res) {
  const fs::path bundle_dir = fs::path(opt.out_dir) / "bundle";
  fs::remove_all(bundle_dir);
  std::vector<std::string> outs = {"--save-failures", bundle_dir.string()};
  const std::string results = (fs::path(opt.out_dir) / "results.h5").string();
  if (!crashes) outs.insert(outs.end(), {"--save-results", results, "--isolate", "none"});
  std::string cmd;
  (void)runner.run(opt.spec, {}, cmd, outs);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(bundle_dir, ec)) res.bundle = e.path().string();
  if (!crashes && fs::exists(results)) res.results = results;
}

// `mlagate replay` of the saved bundle ("" without one).
std::string replay_line_of(const TriageOptions& opt, const TriageResult& res) {
  if (res.bundle.empty()) return "";
  std::string line = "mlagate replay " + exec::shell_word(res.bundle) + " --backend " + opt.backend + " --op " + std::string(op_name(opt.op));
  for (const std::string& a : opt.run_args) line += " " + exec::shell_word(a);
  return line;
}

// repro.py, the embedded template filled in; it needs both the bundle and the
// kernel's outputs, so it is written only when both were saved.
void write_repro_py(const TriageOptions& opt, TriageResult& res) {
  if (res.bundle.empty() || res.results.empty()) return;
  std::string script;
  for (const auto& [name, text] : verdicts_embed::embedded_files())
    if (name == "repro_template.py") script = std::string(text);
  script = replace_all(script, "@BUNDLE@", "bundle/" + fs::path(res.bundle).filename().string());
  script = replace_all(script, "@RESULTS@", "results.h5");
  script = replace_all(script, "@CASE_ID@", res.record.case_id);
  script = replace_all(script, "@BACKEND@", opt.backend);
  script = replace_all(script, "@OP@", std::string(op_name(opt.op)));
  res.repro_py = (fs::path(opt.out_dir) / "repro.py").string();
  std::ofstream(res.repro_py) << script;
}

// report.md's "The case": the shape in words and the first 64 requests.
void md_case(std::ostream& md, const CaseSpec& s) {
  const bool per_tensor = s.kv_cache_dtype == KvCacheDtype::kFp8 || s.kv_cache_dtype == KvCacheDtype::kFp8E4m3;
  md << "\n## The case\n\n" << case_shape(s) << "; model dtype " << dtype_short(s.dtype) << ", dims " << dims_label(s.dims)
     << " (kv_lora_rank " << s.dims.kv_lora_rank << ", rope " << s.dims.rope_dim << "), kv cache "
     << kv_cache_format_name(s.kv_format());
  if (per_tensor) md << " with k_scale " << exact_number(s.k_scale);
  md << ", Q magnitude " << exact_number(s.q_magnitude) << ", seed " << s.seed << ".\n\n";
  md << "| request | seq_len | query_len |\n| ---: | ---: | ---: |\n";
  for (int i = 0; i < s.num_requests() && i < 64; ++i)
    md << "| " << i << " | " << s.batch.seq_lens[static_cast<std::size_t>(i)] << " | " << s.batch.query_lens[static_cast<std::size_t>(i)] << " |\n";
  if (s.num_requests() > 64) md << "| ... | " << s.num_requests() - 64 << " more | |\n";
}

// report.md's "Expected against actual": each output's errors, the failing
// ones with their worst positions.
void md_outputs(std::ostream& md, const TriageResult& res) {
  const Record& r = res.record;
  md << "\nCase id `" << r.case_id << "`.\n\n## Expected against actual\n\n" << res.status << ": " << r.message << "\n\n";
  for (const Metrics& m : r.metrics) {
    md << "- `" << m.output << "`: " << (m.passed ? "within the policy" : "fails") << "; max abs error " << fmt(m.max_abs);
    if (m.worst.flat >= 0) md << " at " << m.worst.str();
    if (m.nonfinite_mismatches > 0) md << "; " << m.nonfinite_mismatches << " non-finite, the first at " << m.first_nonfinite.str();
    if (!std::isnan(m.min_fudge)) md << "; needs fudge " << fmt(m.min_fudge);
    md << "\n";
    if (!m.passed && !m.worst_elements.empty()) {
      md << "\n  | where | got | expected | error |\n  | --- | ---: | ---: | ---: |\n";
      for (const WorstElement& w : m.worst_elements)
        md << "  | " << w.where.str() << " | " << fmt(w.got) << " | " << fmt(w.expected) << " | " << fmt(w.err) << " |\n";
      md << "\n";
    }
  }
}

// report.md's variants table, the given case first for comparison.
void md_variants(std::ostream& md, const TriageResult& res) {
  const Metrics* given_main = main_output(res.record);
  md << "\n## What-if variants\n\n| variant | change | status | " << (given_main ? given_main->output : std::string("output"))
     << " max abs | needs fudge | verdict |\n| --- | --- | --- | ---: | ---: | --- |\n";
  md << "| as given | | " << res.status << " | " << fmt(given_main ? given_main->max_abs : kNaN) << " | "
     << fmt(given_main ? given_main->min_fudge : kNaN) << " | |\n";
  for (const TriageVariant& v : res.variants)
    md << "| " << v.name << " | " << v.change << " | " << (v.status.empty() ? "-" : v.status) << " | " << fmt(v.max_abs) << " | "
       << fmt(v.min_fudge) << " | " << v.verdict << " |\n";
}

void write_report_md(const TriageOptions& opt, TriageResult& res, const std::string& repro_line, const std::string& replay_line) {
  std::ostringstream md;
  md << "# " << opt.backend << " " << op_name(opt.op) << ": " << res.status << " (" << res.cls << ")\n\n";
  md << res.explanation << ".\n\n## Environment\n\n";
  for (const std::string& e : opt.environment) md << "- " << e << "\n";
  md_case(md, opt.spec);
  md_outputs(md, res);
  md_variants(md, res);
  md << "\nClass: **" << res.cls << "**: " << res.explanation << ".\n\n## Reproduce\n\n```sh\n" << repro_line << "\n";
  if (!replay_line.empty()) md << replay_line << "\n";
  md << "```\n\n";
  if (!res.bundle.empty()) md << "The golden bundle (inputs, paged cache, fp64 reference; HDF5, golden/SCHEMA.md): `" << res.bundle << "`.\n";
  if (!res.repro_py.empty())
    md << "Without mlagate (h5py and numpy): `python3 " << res.repro_py << "` reads the bundle and the kernel's outputs (`" << res.results
       << "`) and prints the mismatch with its positions.\n";
  res.report_md = (fs::path(opt.out_dir) / "report.md").string();
  write_report_file(res.report_md, [&](std::ostream& os) { os << md.str(); });
}

void write_report_json(const TriageOptions& opt, TriageResult& res, const std::string& repro_line, const std::string& replay_line) {
  Json vj = Json::array();
  for (const TriageVariant& v : res.variants)
    vj.push_back({{"name", v.name}, {"change", v.change}, {"applicable", v.applicable}, {"status", v.status},
                  {"message", v.message}, {"output", v.output}, {"max_abs", std::isnan(v.max_abs) ? Json(nullptr) : Json(v.max_abs)},
                  {"min_fudge", std::isnan(v.min_fudge) ? Json(nullptr) : Json(v.min_fudge)}, {"verdict", v.verdict},
                  {"command", v.command}});
  const Json doc = {{"schema", "mlagate.triage/1"},
                    {"backend", opt.backend},
                    {"op", op_name(opt.op)},
                    {"case", res.record.case_id},
                    {"shape", case_shape(opt.spec)},
                    {"status", res.status},
                    {"message", res.record.message},
                    {"class", res.cls},
                    {"explanation", res.explanation},
                    {"environment", opt.environment},
                    {"variants", vj},
                    {"repro", repro_line},
                    {"replay", replay_line},
                    {"bundle", res.bundle},
                    {"results", res.results},
                    {"repro_py", res.repro_py}};
  res.report_json = (fs::path(opt.out_dir) / "report.json").string();
  write_report_file(res.report_json, [&](std::ostream& os) { os << doc.dump(1, ' ', false, Json::error_handler_t::replace) << "\n"; });
}

}  // namespace

Record rerun(const TriageOptions& opt, const CaseSpec& c) {
  Runner runner(opt, true);
  std::string cmd;
  return runner.run(c, {}, cmd);
}

std::string confirm_class(const TriageOptions& opt, const Record& given, const std::string& cls) {
  const std::vector<std::string> names = decisive_variants(cls);
  if (names.empty()) return cls;  // unexplained: nothing to run
  Runner runner(opt, given.status == Status::kCrashed || given.status == Status::kTimeout);
  std::vector<TriageVariant> done;
  for (Planned& p : plan_variants(opt, given))
    if (std::find(names.begin(), names.end(), p.first.name) != names.end())
      done.push_back(run_variant(runner, std::move(p), given.status, main_output(given) ? main_output(given)->output : ""));
  const Metrics* m = main_output(given);
  return classify(std::string(status_name(given.status)), done, m ? m->max_abs : kNaN).first;
}

TriageResult triage(const TriageOptions& opt) {
  if (worker_executable().empty()) throw InputError("triage runs the mlagate binary: unavailable in this process");
  fs::create_directories(opt.out_dir);
  TriageResult res;
  res.dir = opt.out_dir;

  // The case as given, once isolated (a crash is a record) to learn its status.
  Runner probe(opt, true);
  std::string given_cmd;
  res.record = probe.run(opt.spec, {}, given_cmd);
  res.status = std::string(status_name(res.record.status));
  if (res.record.status == Status::kSkipped || res.record.status == Status::kNotSupported)
    throw InputError("triage: " + opt.backend + " " + std::string(op_name(opt.op)) + " on " + opt.spec.id() + " is " + res.status +
                     ": " + res.record.message);
  const bool crashes = res.record.status == Status::kCrashed || res.record.status == Status::kTimeout;
  given_cmd = keep_case_file(opt, given_cmd);
  Runner runner(opt, crashes, 100);
  say(opt, "triage: %s: %s\n", opt.backend + " " + std::string(op_name(opt.op)) + " on " + case_shape(opt.spec), res.status);
  const Metrics* given_main = main_output(res.record);
  const double given_max_abs = given_main ? given_main->max_abs : kNaN;

  if (opt.bundle && status_is_failure(res.record.status)) save_bundle(opt, runner, crashes, res);

  for (Planned& p : plan_variants(opt, res.record)) {
    res.variants.push_back(run_variant(runner, std::move(p), res.record.status, given_main ? given_main->output : ""));
    say(opt, "  %-26s %s\n", res.variants.back().name, res.variants.back().verdict);
  }
  const auto [cls, why] = classify(res.status, res.variants, given_max_abs);
  res.cls = cls;
  res.explanation = why;
  say(opt, "  class: %s: %s\n", cls, why);

  const std::string replay_line = replay_line_of(opt, res);
  write_repro_py(opt, res);
  write_report_md(opt, res, given_cmd, replay_line);
  write_report_json(opt, res, given_cmd, replay_line);
  return res;
}

}  // namespace mlagate
