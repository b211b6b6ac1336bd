// The Markdown report, for a CI job summary ($GITHUB_STEP_SUMMARY): a verdict, counts per
// backend and the first failures. Cells and rows are capped so the file stays far under
// GitHub's 1 MiB limit for a step summary, whatever the records hold.
#include <algorithm>

#include "reports/report.h"
#include "reports/text.h"

namespace mlagate {
namespace {

// Byte caps per cell, before escaping (which at most doubles them). With 200 failure rows
// the failure table stays under 200 * 2 * (kMaxId + kMaxMessage + kMaxRepro + 4 * kMaxName).
constexpr std::size_t kMaxName = 64;       // backend, op, output name
constexpr std::size_t kMaxId = 300;
constexpr std::size_t kMaxMessage = 200;
constexpr std::size_t kMaxRepro = 500;
constexpr std::size_t kMaxRunField = 1000;  // command line, suite, policy
constexpr std::size_t kMaxBackendRows = 100;

// One line of inert text for a table cell: newlines become spaces, and every character that
// Markdown or the HTML it allows would interpret is backslash-escaped (GFM allows that for
// any ASCII punctuation, and "\|" is how a pipe stays inside a table cell).
std::string md_text(std::string_view s, std::size_t max_bytes) {
  std::string out;
  for (char c : detail::printable_text(detail::truncate_text(s, max_bytes))) {
    switch (c) {
      case '\n':
      case '\r':
      case '\t': out += ' '; break;
      case '\\': case '`': case '*': case '_': case '[': case ']': case '<': case '>':
      case '|': case '~': case '&':
        out += '\\';
        out += c;
        break;
      default: out += c;
    }
  }
  return out;
}

// A code span that survives any content: the fence is one backtick longer than the longest
// run inside, padded with spaces when the content touches a backtick. Pipes still need "\|"
// inside code spans in a GFM table.
std::string md_code(std::string_view s, std::size_t max_bytes) {
  std::string text;
  for (char c : detail::printable_text(detail::truncate_text(s, max_bytes))) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
    text += c;
  }
  if (text.empty()) return "";
  std::size_t longest = 0, run = 0;
  for (char c : text) {
    run = c == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  const std::string fence(longest + 1, '`');
  const bool pad = text.front() == '`' || text.back() == '`';
  std::string out = fence + (pad ? " " : "");
  for (char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out + (pad ? " " : "") + fence;
}

// max_abs of the first output that failed (the one the message is about), else of the first.
std::string failure_max_abs(const Record& r) {
  if (r.metrics.empty()) return "";
  auto it = std::find_if(r.metrics.begin(), r.metrics.end(),
                         [](const Metrics& m) { return !m.passed; });
  const Metrics& m = it != r.metrics.end() ? *it : r.metrics.front();
  std::string out = detail::format_g(m.max_abs);
  if (!m.output.empty()) out += " (" + md_text(m.output, kMaxName) + ")";
  return out;
}

void write_counts_table(std::ostream& os, std::span<const Record> records) {
  std::vector<BackendSummary> rows = summarize_by_backend(records);
  os << "| backend |";
  for (Status s : kAllStatuses) os << ' ' << status_name(s) << " |";
  os << " time |\n|---|";
  for (std::size_t i = 0; i < kAllStatuses.size(); ++i) os << "--:|";
  os << "--:|\n";

  const auto row = [&](const std::string& name, const StatusCounts& c, double ms) {
    os << "| " << name << " |";
    for (Status s : kAllStatuses) os << ' ' << c[s] << " |";
    os << ' ' << detail::format_fixed(ms / 1000.0, 3) << " s |\n";
  };
  const std::size_t shown = std::min(rows.size(), kMaxBackendRows);
  for (std::size_t i = 0; i < shown; ++i) {
    row(md_text(rows[i].backend, kMaxName), rows[i].counts, rows[i].total_ms);
  }
  if (rows.size() > shown) {
    os << "| ... and " << rows.size() - shown << " more backends | |";
    for (std::size_t i = 0; i < kAllStatuses.size(); ++i) os << " |";
    os << '\n';
  }
  double total_ms = 0;
  for (const BackendSummary& b : rows) total_ms += b.total_ms;
  row("**TOTAL**", count_statuses(records), total_ms);
}

}  // namespace

void write_markdown(std::ostream& os, const RunInfo& run, std::span<const Record> records) {
  const StatusCounts counts = count_statuses(records, run);
  os << "# mlagate: " << (run.interrupted.empty() ? overall_verdict(counts) : "INTERRUPTED") << "\n\n";
  if (!run.interrupted.empty()) os << "Interrupted (" << md_text(run.interrupted, kMaxRunField) << "): partial results.\n\n";

  os << "mlagate " << md_text(run.tool_version, kMaxName);
  if (!run.git_commit.empty()) os << " (" << md_code(run.git_commit, kMaxName) << ")";
  if (!run.suite.empty()) os << " · suite " << md_code(run.suite, kMaxRunField);
  if (!run.policy.empty()) os << " · policy " << md_code(run.policy, kMaxRunField);
  if (!run.started_at.empty()) os << " · started " << md_text(run.started_at, kMaxName);
  os << " · " << detail::format_fixed(run.wall_seconds, 1) << " s";
  os << " · generator v" << run.generator_version;
  if (!run.command_line.empty()) os << " · " << md_code(run.command_line, kMaxRunField);
  os << "\n\n";

  os << counts.total << " records, " << counts.failures << " failures.\n\n";
  write_counts_table(os, records);

  if (counts.failures == 0) return;
  os << "\n## Failures\n\n"
     << "| case | backend | op | status | max_abs | message | repro |\n"
     << "|---|---|---|---|--:|---|---|\n";
  std::size_t shown = 0;
  for (const Record& r : records) {
    if (!status_fails_run(r.status, run.require_batch_invariance)) continue;
    if (shown == kMarkdownMaxFailureRows) break;
    ++shown;
    os << "| " << md_code(r.case_id, kMaxId) << " | " << md_text(r.backend, kMaxName) << " | "
       << md_text(r.op, kMaxName) << " | " << status_name(r.status) << " | "
       << failure_max_abs(r) << " | " << md_text(r.message, kMaxMessage) << " | "
       << md_code(r.repro, kMaxRepro) << " |\n";
  }
  if (const auto hidden = counts.failures - static_cast<std::int64_t>(shown); hidden > 0) {
    os << "\n... and " << hidden << " more failures (see the JSON report)\n";
  }
}

}  // namespace mlagate
