// Status counting shared by every report, and the plain-text console table.
// The table's columns are the statuses in enum order, so a new status shows up without edits here.
#include <algorithm>
#include <sstream>
#include <unordered_map>

#include "reports/report.h"
#include "reports/text.h"

namespace mlagate {
namespace {

double record_total_ms(const Record& r) {
  const Timings& t = r.timings;
  return t.generate_ms + t.reference_ms + t.baseline_ms + t.cache_ms + t.glue_ms + t.run_ms + t.compare_ms;
}

// Narrower headers than status_name() keep the console table within 100 columns.
std::string_view short_status_name(Status s) {
  switch (s) {
    case Status::kNotSupported: return "NOT_SUPP";
    case Status::kInvalidCase: return "INVALID";
    case Status::kNondeterministic: return "NONDET";
    case Status::kBatchVariant: return "BATCHVAR";
    default: return status_name(s);
  }
}

}  // namespace

void StatusCounts::add(const Record& r, bool require_batch_invariance) {
  switch (r.expected.outcome) {
    case Expected::kXfail: ++xfail; break;
    case Expected::kXpass:
      ++xpass;
      xpass_strict += r.expected.strict ? 1 : 0;
      break;
    case Expected::kNone: ++by_status[static_cast<std::size_t>(r.status)]; break;
  }
  ++total;
  failures += record_fails_run(r, require_batch_invariance) ? 1 : 0;
}

void StatusCounts::add(const StatusCounts& o) {
  for (std::size_t i = 0; i < by_status.size(); ++i) by_status[i] += o.by_status[i];
  xfail += o.xfail;
  xpass += o.xpass;
  xpass_strict += o.xpass_strict;
  total += o.total;
  failures += o.failures;
}

StatusCounts count_statuses(std::span<const Record> records) {
  StatusCounts counts;
  for (const Record& r : records) counts.add(r);
  return counts;
}

StatusCounts count_statuses(std::span<const Record> records, const RunInfo& run) {
  StatusCounts counts;
  for (const Record& r : records) counts.add(r, run.require_batch_invariance);
  return counts;
}

std::vector<BackendSummary> summarize_by_backend(std::span<const Record> records) {
  std::vector<BackendSummary> out;
  std::unordered_map<std::string, std::size_t> index;
  for (const Record& r : records) {
    auto [it, inserted] = index.try_emplace(r.backend, out.size());
    if (inserted) {
      out.emplace_back();
      out.back().backend = r.backend;
    }
    BackendSummary& b = out[it->second];
    b.counts.add(r);
    b.total_ms += record_total_ms(r);
  }
  return out;
}

std::string_view overall_verdict(const StatusCounts& counts) {
  if (counts.failures > 0) return "FAIL";
  if (counts[Status::kPassed] + counts[Status::kBatchVariant] + counts.xfail + counts.xpass > 0) return "PASS";
  return "NOTHING RAN";
}

std::string expected_counts_text(const StatusCounts& c) {
  if (c.xfail + c.xpass == 0) return "";
  return ", " + std::to_string(c.xfail) + " expected (XFAIL), " + std::to_string(c.xpass) + " unexpectedly passed (XPASS" +
         (c.xpass_strict ? ", " + std::to_string(c.xpass_strict) + " strict" : std::string()) + ")";
}

std::string summary_table(std::span<const Record> records) {
  std::vector<BackendSummary> rows = summarize_by_backend(records);
  BackendSummary total;
  total.backend = "TOTAL";
  bool expectations = false;  // XFAIL and XPASS columns only in runs with --expect outcomes
  for (const BackendSummary& b : rows) {
    total.counts.add(b.counts);
    total.total_ms += b.total_ms;
    expectations = expectations || b.counts.xfail + b.counts.xpass > 0;
  }
  rows.push_back(std::move(total));

  // cells[row][col]; row 0 is the header, column 0 the backend name.
  std::vector<std::vector<std::string>> cells;
  std::vector<std::string> header{"backend"};
  for (Status s : kAllStatuses) header.emplace_back(short_status_name(s));
  if (expectations) header.insert(header.end(), {"XFAIL", "XPASS"});
  header.emplace_back("time");
  cells.push_back(std::move(header));
  for (const BackendSummary& b : rows) {
    std::vector<std::string> row{detail::printable_text(b.backend)};
    for (Status s : kAllStatuses) row.push_back(std::to_string(b.counts[s]));
    if (expectations) row.insert(row.end(), {std::to_string(b.counts.xfail), std::to_string(b.counts.xpass)});
    row.push_back(detail::format_fixed(b.total_ms / 1000.0, 3) + " s");
    cells.push_back(std::move(row));
  }

  std::vector<std::size_t> width(cells.front().size(), 0);
  for (const auto& row : cells) {
    for (std::size_t c = 0; c < row.size(); ++c) {
      width[c] = std::max(width[c], detail::display_width(row[c]));
    }
  }

  std::ostringstream os;
  for (const auto& row : cells) {
    for (std::size_t c = 0; c < row.size(); ++c) {
      const std::string pad(width[c] - detail::display_width(row[c]), ' ');
      if (c == 0) {
        os << row[c] << pad;  // names left-aligned, numbers right-aligned
      } else {
        os << "  " << pad << row[c];
      }
    }
    os << '\n';
  }
  return os.str();
}

}  // namespace mlagate
