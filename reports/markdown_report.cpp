// The Markdown report, for a CI job summary ($GITHUB_STEP_SUMMARY): a verdict, counts per
// backend, the first failures and, with --expect, the unexpected passes (XPASS) and the
// expected failures (XFAIL) by entry. Cells and rows are capped so the file stays far under
// GitHub's 1 MiB limit for a step summary, whatever the records hold.
#include <algorithm>
#include <map>

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
// --expect: rows of the XPASS table and entries of the XFAIL table. With the caps below a
// row stays under about 2 * (kMaxId + kMaxEntry + kMaxReason + kMaxLink + 4 * kMaxName) bytes,
// so both tables together add at most ~250 KiB to the failure table's ~500 KiB.
constexpr std::size_t kMaxExpectationRows = 50;
constexpr std::size_t kMaxEntry = 100;   // an entry's id
constexpr std::size_t kMaxReason = 200;  // an entry's reason
constexpr std::size_t kMaxLink = 300;    // an entry's link

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

// An entry's link: a Markdown autolink when it is a plain http(s) URL that GFM reads back
// intact (no characters a table cell or an autolink would take), else inert code.
std::string md_link(std::string_view link) {
  if (link.empty()) return "";
  const bool web = link.size() <= kMaxLink && (link.rfind("https://", 0) == 0 || link.rfind("http://", 0) == 0);
  const bool plain = std::all_of(link.begin(), link.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("-._~:/?#@!$&'()*+,;=%").find(c) != std::string_view::npos;
  });
  if (web && plain) return std::string("<").append(link).append(">");  // (not "<" + ...: GCC 12 warns falsely, -Wrestrict)
  return md_code(link, kMaxLink);
}

// The status column of a record: its status, or what an --expect entry made of it.
std::string md_status(const Record& r) {
  switch (r.expected.outcome) {
    case Expected::kXfail: return "XFAIL (" + std::string(status_name(r.status)) + ")";
    case Expected::kXpass: return r.expected.strict ? "XPASS(strict)" : "XPASS";
    case Expected::kNone: break;
  }
  return std::string(status_name(r.status));
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
  // XFAIL and XPASS columns only when an entry made something of a record, as in the console table.
  const StatusCounts all = count_statuses(records);
  const bool expectations = all.xfail + all.xpass > 0;
  const std::size_t columns = kAllStatuses.size() + (expectations ? 2 : 0);
  os << "| backend |";
  for (Status s : kAllStatuses) os << ' ' << status_name(s) << " |";
  if (expectations) os << " XFAIL | XPASS |";
  os << " time |\n|---|";
  for (std::size_t i = 0; i < columns; ++i) os << "--:|";
  os << "--:|\n";

  const auto row = [&](const std::string& name, const StatusCounts& c, double ms) {
    os << "| " << name << " |";
    for (Status s : kAllStatuses) os << ' ' << c[s] << " |";
    if (expectations) os << ' ' << c.xfail << " | " << c.xpass << " |";
    os << ' ' << detail::format_fixed(ms / 1000.0, 3) << " s |\n";
  };
  const std::size_t shown = std::min(rows.size(), kMaxBackendRows);
  for (std::size_t i = 0; i < shown; ++i) {
    row(md_text(rows[i].backend, kMaxName), rows[i].counts, rows[i].total_ms);
  }
  if (rows.size() > shown) {
    os << "| ... and " << rows.size() - shown << " more backends | |";
    for (std::size_t i = 0; i < columns; ++i) os << " |";
    os << '\n';
  }
  double total_ms = 0;
  for (const BackendSummary& b : rows) total_ms += b.total_ms;
  row("**TOTAL**", all, total_ms);
}

// Strict XPASS first (they fail the run), each group in run order.
void write_xpass_section(std::ostream& os, std::span<const Record> records, const StatusCounts& counts) {
  if (counts.xpass == 0) return;
  os << "\n## Unexpected passes (XPASS)\n\n"
     << "An expectations entry says these records fail, and they did not. A strict entry's XPASS fails the run: "
        "if the fix landed, remove the entry.\n\n"
     << "| case | backend | op | status | entry | reason | link |\n"
     << "|---|---|---|---|---|---|---|\n";
  std::size_t shown = 0;
  for (const bool strict : {true, false}) {
    for (const Record& r : records) {
      if (r.expected.outcome != Expected::kXpass || r.expected.strict != strict) continue;
      if (shown == kMaxExpectationRows) break;
      ++shown;
      os << "| " << md_code(r.case_id, kMaxId) << " | " << md_text(r.backend, kMaxName) << " | "
         << md_text(r.op, kMaxName) << " | " << md_status(r) << " | " << md_code(r.expected.entry, kMaxEntry) << " | "
         << md_text(r.expected.reason, kMaxReason) << " | " << md_link(r.expected.link) << " |\n";
    }
  }
  if (const auto hidden = counts.xpass - static_cast<std::int64_t>(shown); hidden > 0) {
    os << "\n... and " << hidden << " more XPASS records (see the JSON report)\n";
  }
}

// One row per entry, the entries with the most records first (then in order of first
// appearance), with one record as an example.
void write_xfail_section(std::ostream& os, std::span<const Record> records, const StatusCounts& counts) {
  if (counts.xfail == 0) return;
  struct Group {
    const Record* example = nullptr;
    std::int64_t count = 0;
    std::vector<Status> statuses;  // in order of first appearance
  };
  std::vector<Group> groups;
  std::map<std::string, std::size_t> index;
  for (const Record& r : records) {
    if (r.expected.outcome != Expected::kXfail) continue;
    const auto [it, inserted] = index.try_emplace(r.expected.entry, groups.size());
    if (inserted) groups.push_back({&r, 0, {}});
    Group& g = groups[it->second];
    ++g.count;
    if (std::find(g.statuses.begin(), g.statuses.end(), r.status) == g.statuses.end()) g.statuses.push_back(r.status);
  }
  std::stable_sort(groups.begin(), groups.end(), [](const Group& a, const Group& b) { return a.count > b.count; });

  os << "\n## Expected failures (XFAIL)\n\n"
     << counts.xfail << (counts.xfail == 1 ? " record" : " records") << " failed as the expectations say ("
     << groups.size() << (groups.size() == 1 ? " entry" : " entries") << "): reported, not failures of this run.\n\n"
     << "| entry | records | status | reason | link | example |\n"
     << "|---|--:|---|---|---|---|\n";
  const std::size_t shown = std::min(groups.size(), kMaxExpectationRows);
  for (std::size_t i = 0; i < shown; ++i) {
    const Group& g = groups[i];
    const Record& r = *g.example;
    std::string statuses;
    for (Status s : g.statuses) statuses += (statuses.empty() ? "" : ", ") + std::string(status_name(s));
    os << "| " << md_code(r.expected.entry, kMaxEntry) << " | " << g.count << " | " << statuses << " | "
       << md_text(r.expected.reason, kMaxReason) << " | " << md_link(r.expected.link) << " | "
       << md_code(r.case_id, kMaxId) << " (" << md_text(r.backend, kMaxName) << ", " << md_text(r.op, kMaxName)
       << ") |\n";
  }
  if (groups.size() > shown) {
    os << "\n... and " << groups.size() - shown << " more entries (see the JSON report)\n";
  }
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

  os << counts.total << " records, " << counts.failures << " failures";
  if (counts.xfail + counts.xpass > 0) {
    os << ", " << counts.xfail << " expected failures (XFAIL), " << counts.xpass << " unexpected passes (XPASS";
    if (counts.xpass > 0) os << ", " << counts.xpass_strict << " strict";
    os << ")";
  }
  os << ".\n\n";
  write_counts_table(os, records);

  // Every record that fails the run: unexpected failures and strict XPASS, never an XFAIL.
  if (counts.failures > 0) {
    os << "\n## Failures\n\n"
       << "| case | backend | op | status | max_abs | message | repro |\n"
       << "|---|---|---|---|--:|---|---|\n";
    std::size_t shown = 0;
    for (const Record& r : records) {
      if (!record_fails_run(r, run.require_batch_invariance)) continue;
      if (shown == kMarkdownMaxFailureRows) break;
      ++shown;
      // A strict XPASS fails for its entry, not for its (passing) message.
      const std::string message = r.expected.outcome == Expected::kXpass
                                      ? md_text("the entry " + r.expected.entry + " expects a failure: " + r.expected.reason,
                                                kMaxMessage)
                                      : md_text(r.message, kMaxMessage);
      os << "| " << md_code(r.case_id, kMaxId) << " | " << md_text(r.backend, kMaxName) << " | "
         << md_text(r.op, kMaxName) << " | " << md_status(r) << " | " << failure_max_abs(r) << " | " << message
         << " | " << md_code(r.repro, kMaxRepro) << " |\n";
    }
    if (const auto hidden = counts.failures - static_cast<std::int64_t>(shown); hidden > 0) {
      os << "\n... and " << hidden << " more failures (see the JSON report)\n";
    }
  }
  write_xpass_section(os, records, counts);
  write_xfail_section(os, records, counts);
}

}  // namespace mlagate
