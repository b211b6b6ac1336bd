// The verdict commands (harness/verdicts/VERDICTS.md): `mlagate triage` (a
// failure's what-if variants, its class and a bug report) and `mlagate expect`
// (expectations files: written from a run's failures, checked, their facts
// listed). Options live here; the work in harness/verdicts/.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sys/utsname.h>

#include "backends/registry.h"
#include "cases/errors.h"
#include "golden/golden_file.h"
#include "harness/cli/cli.h"
#include "harness/cli/commands.h"
#include "harness/verdicts/expect_from.h"
#include "harness/verdicts/facts.h"
#include "harness/verdicts/matrix.h"
#include "harness/verdicts/triage.h"
#include "mlagate/config.h"
#include "mlagate/version.h"
#include "reports/report.h"
#include "cases/suite.h"

namespace mlagate {

namespace {

namespace fs = std::filesystem;

// One line of a command's output (nvidia-smi), empty when it cannot run.
std::string first_line_of(const std::string& command) {
  std::FILE* p = ::popen(command.c_str(), "r");
  if (!p) return "";
  char buf[512] = {};
  std::string line = std::fgets(buf, sizeof buf, p) ? buf : "";
  ::pclose(p);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  return line;
}

}  // namespace

std::vector<std::string> run_environment() {
  std::vector<std::string> env;
  env.push_back(std::string("mlagate ") + MLAGATE_VERSION + " (" + MLAGATE_GIT_COMMIT + "), CUDA build " +
                (MLAGATE_HAS_CUDA ? "yes" : "no") + ", libtorch " + (MLAGATE_HAS_TORCH ? "yes" : "no"));
  const std::string libs = MLAGATE_KERNEL_LIBS;
  env.push_back("kernel libraries: " + (libs.empty() ? std::string("none built in") : libs));
  const std::string gpu = first_line_of("nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null");
  env.push_back("GPU: " + (gpu.empty() ? std::string("none visible (nvidia-smi gave nothing)") : gpu + " (name, driver, memory)"));
  struct utsname u {};
  if (::uname(&u) == 0) env.push_back(std::string("host: ") + u.sysname + " " + u.release + " " + u.machine);
  return env;
}

void TriageArgs::add_options(CLI::App* app) {
  app->add_option("bundle", bundle, "a golden bundle of the failing case (--save-failures, shrink's bundle/)");
  app->add_option("--finding", finding, "an explore finding's folder (EXPLORE.md): its shrunk case, backend, op and flags");
  sel.add_options(app);
  app->add_option("--case", case_ids, "the failing case's exact id in the selection or bundle");
  app->add_option("--backend", backend, "the failing backend (one exact name)");
  app->add_option("--op", op, "the failing op (auto: as shrink picks it)")->capture_default_str();
  app->add_option("--out", out, "folder for the report, the bundle, the results and the variants' runs")->capture_default_str();
  app->add_flag("--no-bundle", no_bundle, "the report without the golden bundle, the kernel's outputs and repro.py (one run fewer)");
  app->add_option("--reference", run.reference, "where the fp64 reference is computed: eigen | cuda")->capture_default_str();
  app->add_option("--splits", run.splits, "forced splits of split-KV backends (0: from the work)")->capture_default_str();
  run.serving.add_options(app, true);
  add_handed_on_options(app, run.policy, run.poison, extra);
}

int cmd_triage(const TriageArgs& a) {
  TriageOptions o;
  std::string backend = a.backend, op = a.op;
  std::vector<std::string> finding_flags;
  if (!a.finding.empty()) {
    const fs::path dir(a.finding);
    std::ifstream in(dir / "finding.json");
    if (!in) throw InputError("triage --finding " + a.finding + ": no finding.json there (an explore finding's folder)");
    nlohmann::json f;
    try {
      f = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      throw InputError("triage --finding " + a.finding + "/finding.json: not JSON: " + e.what());
    }
    auto str = [&](const char* k) {
      if (!f.is_object() || !f.contains(k) || !f[k].is_string())
        throw InputError("triage --finding " + a.finding + "/finding.json: " + k + ": expected a string");
      return f[k].get<std::string>();
    };
    if (backend.empty()) backend = str("backend");
    if (op == "auto") op = str("op");
    std::string case_file = str("case_file");
    if (fs::exists(dir / "shrunk" / "shrunk.yaml")) case_file = (dir / "shrunk" / "shrunk.yaml").string();
    const Suite s = load_suite(case_file);
    if (s.cases.empty()) throw InputError("triage --finding: " + case_file + " holds no case");
    o.spec = s.cases.back();
    if (f.contains("flags")) {
      if (!f["flags"].is_array()) throw InputError("triage --finding " + a.finding + "/finding.json: flags: expected an array");
      for (const auto& x : f["flags"]) {
        if (!x.is_string()) throw InputError("triage --finding " + a.finding + "/finding.json: flags: expected strings");
        finding_flags.push_back(x.get<std::string>());
      }
    }
  } else if (!a.bundle.empty()) {
    GoldenReader rd(a.bundle);
    const std::vector<std::string>& ids = rd.case_ids();
    std::string id = a.case_ids.empty() ? std::string() : a.case_ids.back();
    if (id.empty()) {
      if (ids.size() != 1) throw InputError("triage: " + a.bundle + " holds " + std::to_string(ids.size()) + " cases: name one with --case");
      id = ids.front();
    }
    if (!rd.has_case(id)) throw InputError("triage: " + a.bundle + " has no case " + id);
    o.spec = rd.header(id).spec;
  } else {
    const std::vector<CaseSpec> cases = a.case_ids.empty() ? a.sel.resolve() : a.sel.resolve_ids(a.case_ids);
    if (cases.size() != 1)
      throw InputError("triage: the selection has " + std::to_string(cases.size()) + " cases; name the failing one with --case");
    o.spec = cases.back();
  }
  if (backend.empty()) throw InputError("triage: --backend is required (one exact name)");
  o.backend = backend;
  o.op = op == "auto" ? failing_op_default(o.spec, a.run.serving.given()) : parse_op(op);
  const std::vector<BackendEntry> extra = a.extra.entries();
  const std::vector<std::unique_ptr<Backend>> bs = select_backends(backend, BackendOptions{a.run.splits}, extra);
  if (bs.size() != 1 || bs.front()->name() != backend) throw InputError("triage: --backend names one backend exactly, not '" + backend + "'");
  o.caps = bs.front()->capabilities();
  if (a.finding.empty()) {
    o.run_args = a.extra.argv();
    const std::vector<std::string> comp = a.run.computation_argv();
    o.run_args.insert(o.run_args.end(), comp.begin(), comp.end());
  } else {
    o.run_args = finding_flags;
  }
  o.out_dir = a.out;
  o.bundle = !a.no_bundle;
  o.environment = run_environment();
  const TriageResult r = triage(o);
  std::printf("class: %s\n  %s\n", r.cls.c_str(), r.explanation.c_str());
  if (!r.report_md.empty()) std::printf("report: %s\n", r.report_md.c_str());
  if (!r.repro_py.empty()) std::printf("without mlagate: (cd %s && python3 repro.py)\n", r.dir.c_str());
  return kExitPassed;
}

void ExpectArgs::add_options(CLI::App* app) {
  app->add_option("--from", from, "JSON reports of runs (mlagate run --json): an entry per cause of their failures");
  app->add_option("--out", out, "write the expectations file here (default: standard output)");
  app->add_option("--check", check, "expectations files to check: exit 0 when each is well formed, 2 naming the field when not");
  app->add_flag("--keys", keys, "list the facts an entry's where: can name");
}

int cmd_expect(const ExpectArgs& a) {
  if (a.keys) {
    for (const FactKey& k : fact_keys())
      std::printf("%-14s %-6s %s\n", std::string(k.name).c_str(),
                  k.kind == FactKind::kNumber ? "number" : k.kind == FactKind::kBool ? "bool" : "word", std::string(k.meaning).c_str());
    return kExitPassed;
  }
  if (!a.check.empty()) {
    const ExpectationSet set = ExpectationSet::load(a.check);
    std::printf("%zu entries in %zu file(s): well formed\n", set.entries().size(), a.check.size());
    return kExitPassed;
  }
  if (a.from.empty()) throw InputError("expect: give --from REPORT.json (an entry per cause of its failures), --check FILE or --keys");
  std::vector<Record> records;
  std::string names;
  for (const std::string& p : a.from) {
    JsonReport rep = read_json_report(p);
    for (Record& r : rep.records) records.push_back(std::move(r));
    names += (names.empty() ? "" : ", ") + fs::path(p).filename().string();
  }
  const std::vector<ExpectEntry> entries = entries_from_failures(records, names);
  std::string cmd = "mlagate expect";
  for (const std::string& p : a.from) cmd += " --from " + p;
  const std::string text = expectations_yaml(
      entries, "Written by `" + cmd + "`:\none entry per cause of those runs' failures (harness/verdicts/VERDICTS.md).\n"
               "Each entry selects today's failures and none of today's passes; say in its reason why it fails\n"
               "and add a link to the upstream issue before you commit it.");
  // What it writes must read back: a bug here is caught before a user commits the file.
  (void)ExpectationSet::parse(text, "(generated)");
  if (a.out.empty()) std::printf("%s", text.c_str());
  else {
    write_report_file(a.out, [&](std::ostream& os) { os << text; });
    std::printf("%s: %zu entries for %zu failing records\n", a.out.c_str(), entries.size(),
                static_cast<std::size_t>(std::count_if(records.begin(), records.end(), [](const Record& r) { return status_is_failure(r.status); })));
  }
  return kExitPassed;
}

void MatrixArgs::add_options(CLI::App* app) {
  app->add_option("reports", reports, "JSON reports of runs (mlagate run --json)")->required();
  app->add_option("--expect", expect, "expectations files: the records judged by these entries instead of the reports' own");
  app->add_option("--markdown", markdown, "write the matrix as Markdown here (default: standard output)");
  app->add_option("--html", html, "write the matrix as one HTML page here (reasons on hover)");
}

int cmd_matrix(const MatrixArgs& a) {
  std::vector<Record> records;
  for (const std::string& p : a.reports) {
    JsonReport rep = read_json_report(p);
    for (Record& r : rep.records) records.push_back(std::move(r));
  }
  const ExpectationSet expect = ExpectationSet::load(a.expect);
  if (!expect.empty())
    for (Record& r : records) expect.apply(r);
  std::vector<std::string> names;
  for (const std::string& p : a.reports) names.push_back(fs::path(p).filename().string());
  const Matrix m = build_matrix(records, names);
  if (!a.html.empty()) write_report_file(a.html, [&](std::ostream& os) { write_matrix_html(os, m); });
  if (!a.markdown.empty()) write_report_file(a.markdown, [&](std::ostream& os) { write_matrix_markdown(os, m); });
  if (a.markdown.empty()) write_matrix_markdown(std::cout, m);
  return kExitPassed;
}

}  // namespace mlagate
