// The small subcommands: list, export, compare and shrink.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <map>
#include <set>

#include "backends/registry.h"
#include "cases/errors.h"
#include "cases/suite.h"
#include "golden/golden_file.h"
#include "harness/cli/cli.h"
#include "harness/cli/commands.h"
#include "harness/verdicts/expectations.h"
#include "harness/reliability/shrink.h"
#include "harness/run/ops/layer/routing.h"
#include "harness/run/run_config.h"
#include "reports/report.h"
#include "reports/shard.h"

namespace mlagate {

namespace {

std::string caps_str(const Capabilities& caps) {
  const std::string ops = op_names(caps.ops);
  std::string bss;
  for (int b : caps.block_sizes) bss += (bss.empty() ? "" : ",") + std::to_string(b);
  std::string dts, kvs;
  for (DType t : caps.dtypes) dts += (dts.empty() ? "" : ",") + std::string(dtype_short(t));
  for (KvCacheDtype k : caps.kv_dtypes) kvs += (kvs.empty() ? "" : ",") + std::string(kv_cache_dtype_name(k));
  // The same keys as --exec-caps, so a line can be pasted back as one.
  std::string s = "ops=" + ops + " block_sizes=" + bss + " query_len=" +
                  std::string(query_len_support_name(caps.query_len_support)) +
                  " reorder_threshold=" + std::to_string(caps.reorder_threshold) + " dtypes=" + dts + " kv_dtypes=" + kvs;
  // The layouts a backend takes (cases/LAYOUTS.md), where it declares more than the default.
  if (caps.strided_views) s += " strided_views=1";
  if (caps.max_pool_bytes != Capabilities{}.max_pool_bytes) s += " max_pool_bytes=" + std::to_string(caps.max_pool_bytes);
  return s;
}

}  // namespace

int cmd_list(const std::string& what, const Selection& sel, const std::string& backend_globs, const OutOfTree& ot) {
  if (what == "suites") {
    for (const auto& n : builtin_suite_names()) {
      const Suite s = load_suite(n);
      std::printf("%-8s %4zu cases  %s\n", n.c_str(), s.cases.size(), s.description.c_str());
    }
    return kExitPassed;
  }
  if (what == "specs") {
    for (const auto& b : batch_specs()) {
      std::string s, q;
      for (int x : b.seq_lens) s += (s.empty() ? "" : ",") + std::to_string(x);
      for (int x : b.query_lens) q += (q.empty() ? "" : ",") + std::to_string(x);
      if (s.size() > 40) s = s.substr(0, 37) + "...";
      if (q.size() > 30) q = q.substr(0, 27) + "...";
      std::printf("%-26s seq_lens=%-40s query_lens=%-30s%s\n", b.name.c_str(), s.c_str(), q.c_str(),
                  b.spec_decode ? " spec_decode" : "");
    }
    return kExitPassed;
  }
  if (what == "backends") {
    const std::vector<BackendEntry> extra = ot.entries();
    for (const auto& b : select_backends(backend_globs, {}, extra))
      std::printf("%-12s %s\n             %s\n", std::string(b->name()).c_str(), std::string(b->description()).c_str(),
                  caps_str(b->capabilities()).c_str());
    return kExitPassed;
  }
  const std::vector<CaseSpec> cases = sel.resolve();
  if (what == "cases") {
    for (const auto& c : cases) std::printf("%s\n", c.id().c_str());
    return kExitPassed;
  }
  if (what == "matrix") {
    const std::vector<BackendEntry> extra = ot.entries();
    auto backends = select_backends(backend_globs, {}, extra);
    std::printf("%-64s", "case (layer op; sparse_decode for sparse cases, merge_states for merge cases)");
    for (const auto& b : backends) std::printf(" %-14s", std::string(b->name()).c_str());
    std::printf("\n");
    for (const auto& c : cases) {
      std::printf("%-64s", c.id().c_str());
      std::vector<std::string> reasons;
      for (const auto& b : backends) {
        const Op op = c.merge.active() ? Op::kMergeStates : c.sparse.active() ? Op::kSparseDecode : Op::kLayer;
        Support s = b->supports(c, op);
        if (s.ok && op == Op::kLayer) s = route_requests(b->capabilities(), c).support;
        std::printf(" %-14s", s.ok ? "yes" : "NO");
        if (!s.ok) reasons.push_back(std::string(b->name()) + ": " + s.reason);
      }
      std::printf("\n");
      for (const auto& r : reasons) std::printf("    %s\n", r.c_str());
    }
    return kExitPassed;
  }
  throw InputError("mlagate list: unknown listing '" + what + "' (suites, specs, cases, backends, matrix)");
}

// mlagate shrink: the selection resolves to the failing case (the last --case;
// earlier --case ids are its predecessors, as an order-dependent record's
// repro gives them); every candidate run gets the backend flags given here.
Op failing_op_default(const CaseSpec& c, bool serving) {
  return serving ? Op::kDecode : c.merge.active() ? Op::kMergeStates : c.sparse.active() ? Op::kSparseDecode : Op::kLayer;
}

int cmd_shrink(const Selection& sel, const ShrinkArgs& sa) {
  std::vector<CaseSpec> cases = sa.case_ids.empty() ? sel.resolve() : sel.resolve_ids(sa.case_ids);
  if (sa.case_ids.empty() && cases.size() != 1) {
    throw InputError("shrink: the selection has " + std::to_string(cases.size()) +
                     " cases; name the failing one with --case (or narrow --filter to one)");
  }
  ShrinkOptions o;
  o.target = cases.back();
  o.before.assign(cases.begin(), cases.end() - 1);
  o.backend = sa.backend;
  o.op = sa.op == "auto" ? failing_op_default(o.target, sa.serving.given()) : parse_op(sa.op);
  o.out_dir = sa.out;
  o.max_runs = sa.max_runs;
  (void)ExpectationSet::load(sa.expect);  // a malformed file is an input error before any run
  o.expect = sa.expect;
  if (sa.max_runs < 1) throw InputError("--max-runs must be >= 1");
  // The backend must exist (a plugin or exec backend is loaded here to check).
  bool found = false;
  for (const auto& e : sa.extra.entries()) found = found || e.name == sa.backend;
  for (const auto& e : backend_registry()) found = found || e.name == sa.backend;
  if (!found) throw InputError("shrink: no backend named '" + sa.backend + "' (one exact name)");
  // The candidates' flags, serialized as run's own repro commands serialize them.
  RunArgs ra;
  ra.policy = sa.policy;
  ra.poison = sa.poison;
  ra.splits = sa.splits;
  o.run_args = sa.extra.argv();
  // The mode's flags are shrunk too (fewer steps, fewer ranks): they start the candidates' flags.
  o.mode_flags = sa.serving.argv();
  const std::vector<std::string> computation = ra.computation_argv();
  o.run_args.insert(o.run_args.end(), computation.begin(), computation.end());
  return shrink_main(o);
}

int cmd_export(const Selection& sel, const ExportArgs& ea, const std::string& command_line) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<CaseSpec> cases = sel.resolve();
  ExportOptions opt;
  opt.ops.clear();
  for (const auto& o : ea.ops) {
    const Op op = parse_op(o);
    if (op != Op::kLayer && op != Op::kDecode && op != Op::kPrefill) throw InputError("export --op: layer, decode, prefill");
    opt.ops.push_back(op);
  }
  opt.policy = ea.policy.make();
  opt.cache = ea.poison.cache_options();
  opt.command_line = command_line;
  // bs=auto: a cache for the block size each selected backend runs the case with.
  const auto backends = select_backends(ea.backends);
  opt.block_sizes = [&backends](const CaseSpec& spec) {
    std::vector<int> sizes;
    for (const auto& b : backends) {
      const int bs = resolve_block_size(b->capabilities(), spec);
      if (std::find(sizes.begin(), sizes.end(), bs) == sizes.end()) sizes.push_back(bs);
    }
    return sizes;
  };
  const ExportSummary s = export_golden(cases, ea.out, opt);
  std::printf("exported %zu cases (%zu caches) to %s: %.1f MiB, %.1f s\n", s.cases, s.caches, ea.out.c_str(),
              static_cast<double>(s.file_bytes) / (1 << 20),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return kExitPassed;
}

int cmd_compare(const std::string& a, const std::string& b, const FileCompareOptions& opt) {
  if (!(opt.atol >= 0) || !(opt.rtol >= 0)) throw InputError("--atol and --rtol must be >= 0");
  return compare_results_files(a, b, opt, stdout).failed(opt) ? kExitFailed : kExitPassed;
}

namespace {

bool is_results_file(const std::string& path) {
  for (const char* ext : {".h5", ".hdf5"})
    if (path.size() >= std::strlen(ext) && path.compare(path.size() - std::strlen(ext), std::string::npos, ext) == 0)
      return true;
  return false;
}

// The reports of the shards as one run's: the same build, generator and policy
// are required (else they are not parts of one run); the earliest start, the
// longest wall (shards run side by side), records in input order.
JsonReport merge_reports(const std::vector<std::string>& paths, const std::string& command_line) {
  JsonReport merged;
  std::vector<std::pair<std::string, std::string>> shards;
  std::map<std::string, std::string> owner;  // case\nbackend\nop -> file
  std::set<std::string> suites;
  std::vector<std::pair<std::string, std::vector<Record>>> parts;  // input -> its records
  for (const std::string& path : paths) {
    JsonReport rep = read_json_report(path);
    const RunInfo& r = rep.run;
    RunInfo& m = merged.run;
    if (shards.empty()) {
      m = r;
      m.wall_seconds = 0;
      m.interrupted.clear();
      m.shard.clear();
      m.profile.clear();
    } else {
      auto same = [&](const std::string& what, const std::string& a, const std::string& b) {
        if (a != b) throw InputError(path + ": " + what + " '" + b + "', the first input's '" + a + "': not parts of one run");
      };
      same("git commit", m.git_commit, r.git_commit);
      same("tool version", m.tool_version, r.tool_version);
      same("policy", m.policy, r.policy);
      same("generator version", std::to_string(m.generator_version), std::to_string(r.generator_version));
      m.started_at = std::min(m.started_at, r.started_at);
    }
    m.wall_seconds = std::max(m.wall_seconds, r.wall_seconds);
    // A shard that required batch invariance makes the merged run require it.
    m.require_batch_invariance = m.require_batch_invariance || r.require_batch_invariance;
    if (!r.interrupted.empty())
      m.interrupted += (m.interrupted.empty() ? "" : "; ") + path + ": " + r.interrupted;
    suites.insert(r.suite);
    shards.emplace_back(path, r.shard);
    parts.emplace_back(path, std::move(rep.records));
  }
  // The shard set first: a shard given twice is named as such, not as its first record.
  check_shard_set(shards);
  for (auto& [path, records] : parts)
    for (Record& rec : records) {
      const std::string key = rec.case_id + "\n" + rec.backend + "\n" + rec.op;
      if (auto [it, fresh] = owner.emplace(key, path); !fresh)
        throw InputError("record " + rec.case_id + " " + rec.backend + " " + rec.op + " is in " + it->second + " and " + path);
      merged.records.push_back(std::move(rec));
    }
  merged.run.command_line = command_line;
  merged.run.suite.clear();
  for (const std::string& s : suites) merged.run.suite += (merged.run.suite.empty() ? "" : ",") + s;
  return merged;
}

}  // namespace

int cmd_merge(const MergeArgs& ma, const std::string& command_line) {
  std::vector<std::string> reports, results;
  for (const std::string& in : ma.inputs) (is_results_file(in) ? results : reports).push_back(in);
  const bool report_out = !ma.reports.json.empty() || !ma.reports.junit.empty() || !ma.reports.markdown.empty() ||
                          !ma.reports.html.empty();
  if (!reports.empty() && !report_out)
    throw InputError("merge: JSON reports given but no --json, --junit, --markdown or --html to write");
  if (report_out && reports.empty()) throw InputError("merge: --json/--junit/--markdown/--html need JSON reports among the inputs");
  if (!results.empty() && ma.results.empty()) throw InputError("merge: results files given but no --results to write");
  if (!ma.results.empty() && results.empty()) throw InputError("merge: --results needs results files (*.h5) among the inputs");
  ma.reports.check_paths();
  // Everything is read and checked before anything is written.
  std::optional<JsonReport> merged;
  if (!reports.empty()) merged = merge_reports(reports, command_line);
  if (!results.empty()) {
    const std::size_t n = merge_results_files(results, ma.results, command_line);
    if (!ma.quiet) std::printf("results: %s (%zu cases from %zu files)\n", ma.results.c_str(), n, results.size());
  }
  if (!merged) return kExitPassed;
  // --expect: the merged records judged again by these entries (their facts came with them).
  const ExpectationSet expect = ExpectationSet::load(ma.expect);
  if (!expect.empty())
    for (Record& r : merged->records) expect.apply(r);
  const RunInfo& info = merged->run;
  const std::vector<Record>& records = merged->records;
  const ReportArgs& rep = ma.reports;
  if (!rep.json.empty()) write_report_file(rep.json, [&](std::ostream& os) { write_json(os, info, records); });
  if (!rep.junit.empty()) write_report_file(rep.junit, [&](std::ostream& os) { write_junit(os, info, records); });
  if (!rep.markdown.empty()) write_report_file(rep.markdown, [&](std::ostream& os) { write_markdown(os, info, records); });
  if (!rep.html.empty()) write_report_file(rep.html, [&](std::ostream& os) { write_html(os, info, records); });
  const StatusCounts counts = count_statuses(records, info);
  if (!ma.quiet) {
    std::printf("%s", summary_table(records).c_str());
    std::printf("%s", expectations_summary(expect, records).c_str());
    std::printf("%s: %lld records from %zu reports, %lld failed%s, policy %s\n",
                info.interrupted.empty() ? std::string(overall_verdict(counts)).c_str() : "INTERRUPTED",
                static_cast<long long>(counts.total), reports.size(), static_cast<long long>(counts.failures),
                expected_counts_text(counts).c_str(), info.policy.c_str());
  }
  if (!info.interrupted.empty()) {
    std::fprintf(stderr, "mlagate merge: interrupted inputs (%s): the merged run is incomplete\n", info.interrupted.c_str());
    return kExitFailed;
  }
  if (counts.failures > 0) return kExitFailed;
  if (counts[Status::kPassed] + counts[Status::kBatchVariant] + counts.xfail + counts.xpass == 0 && !ma.allow_nothing_ran) {
    std::fprintf(stderr, "mlagate merge: nothing ran in any input; exit %d (--allow-nothing-ran accepts this)\n",
                 kExitNothingRan);
    return kExitNothingRan;
  }
  return kExitPassed;
}

}  // namespace mlagate
