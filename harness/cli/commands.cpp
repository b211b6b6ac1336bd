// The small subcommands: list, export, compare and shrink.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "backends/registry.h"
#include "cases/errors.h"
#include "cases/suite.h"
#include "golden/golden_file.h"
#include "harness/cli/cli.h"
#include "harness/cli/commands.h"
#include "harness/reliability/shrink.h"
#include "harness/run/layer.h"

namespace mlagate {

namespace {

std::string caps_str(const Capabilities& caps) {
  std::string ops, bss;
  for (Op o : caps.ops) ops += (ops.empty() ? "" : ",") + std::string(op_name(o));
  for (int b : caps.block_sizes) bss += (bss.empty() ? "" : ",") + std::to_string(b);
  std::string dts, kvs;
  for (DType t : caps.dtypes) dts += (dts.empty() ? "" : ",") + std::string(dtype_short(t));
  for (KvCacheDtype k : caps.kv_dtypes) kvs += (kvs.empty() ? "" : ",") + std::string(kv_cache_dtype_name(k));
  // The same keys as --exec-caps, so a line can be pasted back as one.
  return "ops=" + ops + " block_sizes=" + bss + " query_len=" + std::string(query_len_support_name(caps.query_len_support)) +
         " reorder_threshold=" + std::to_string(caps.reorder_threshold) + " dtypes=" + dts + " kv_dtypes=" + kvs;
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
    std::printf("%-64s", "case (layer op; sparse_decode for sparse cases)");
    for (const auto& b : backends) std::printf(" %-14s", std::string(b->name()).c_str());
    std::printf("\n");
    for (const auto& c : cases) {
      std::printf("%-64s", c.id().c_str());
      std::vector<std::string> reasons;
      for (const auto& b : backends) {
        const Op op = c.sparse.active() ? Op::kSparseDecode : Op::kLayer;
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
  o.op = sa.op == "auto" ? (o.target.sparse.active() ? Op::kSparseDecode : Op::kLayer) : parse_op(sa.op);
  o.out_dir = sa.out;
  o.max_runs = sa.max_runs;
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

}  // namespace mlagate
