// The measured support matrix (matrix.h).
#include "harness/verdicts/matrix.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>

#include "harness/verdicts/expectations.h"
#include "reports/text.h"

namespace mlagate {

namespace {

// The dimensions, in the order of the table's column groups: a record's value of each.
struct Dimension {
  const char* name;
  const char* fact;  // nullptr: the record's op
};
constexpr Dimension kDimensions[] = {{"op", nullptr},          {"dtype", "dtype"},           {"kv", "kv_format"},
                                     {"block size", "block_size"}, {"queries", "query_kind"}, {"mode", "mode"}};

// Numbers in numeric order, then words in text order.
bool value_less(const std::string& a, const std::string& b) {
  double x = 0, y = 0;
  const bool na = std::from_chars(a.data(), a.data() + a.size(), x).ptr == a.data() + a.size() && !a.empty();
  const bool nb = std::from_chars(b.data(), b.data() + b.size(), y).ptr == b.data() + b.size() && !b.empty();
  if (na != nb) return na;
  if (na) return x < y;
  return a < b;
}

void add(MatrixCell& c, const Record& r) {
  ++c.records;
  auto note = [](std::vector<std::string>& list, const std::string& why) {
    if (std::find(list.begin(), list.end(), why) == list.end() && list.size() < 6) list.push_back(why);
  };
  if (!record_ran(r)) {
    ++c.not_supported;
    note(c.reasons, std::string(status_name(r.status)) + ": " + r.message);
    return;
  }
  ++c.ran;
  if (r.expected.outcome == Expected::kXfail) {
    ++c.xfail;
    note(c.expected, "XFAIL " + r.expected.entry + ": " + r.expected.reason);
  } else if (r.expected.outcome == Expected::kXpass) {
    ++c.xpass;
    c.xpass_strict += r.expected.strict ? 1 : 0;
    note(c.expected, "XPASS " + r.expected.entry + (r.expected.strict ? " (strict)" : " (not strict)"));
  } else if (status_is_failure(r.status)) {
    ++c.failed;
  } else {
    ++c.passed;
  }
}

void decide(MatrixCell& c) {
  c.verdict = c.records == 0 ? ""
              : c.failed > 0                                          ? "FAILED"
              : c.xpass_strict > 0                                    ? "XPASS"
              : c.xfail > 0                                           ? "XFAIL"
              : c.ran > 0                                             ? "PASSED"
                                                                      : "NOT_SUPPORTED";
}

std::string md(const std::string& s) {
  std::string out;
  for (char ch : detail::printable_text(s)) {
    if (ch == '|') out += "\\|";
    else if (ch == '\n') out += ' ';
    else out += ch;
  }
  return out;
}

}  // namespace

std::string MatrixCell::text() const {
  if (verdict.empty()) return "";
  if (verdict == "NOT_SUPPORTED") return verdict;
  if (verdict == "PASSED") return "PASSED " + std::to_string(ran);
  const long long n = verdict == "FAILED" ? failed : verdict == "XPASS" ? xpass_strict : xfail;
  return verdict + " " + std::to_string(n) + "/" + std::to_string(ran);
}

Matrix build_matrix(std::span<const Record> records, std::vector<std::string> sources) {
  Matrix m;
  m.sources = std::move(sources);
  std::map<std::string, std::set<std::string, decltype(&value_less)>> values;
  for (const Dimension& d : kDimensions) values.emplace(d.name, std::set<std::string, decltype(&value_less)>(&value_less));
  auto value_of = [](const Dimension& d, const Record& r) -> std::string {
    if (!d.fact) return r.op;
    const auto it = r.facts.find(d.fact);
    return it == r.facts.end() ? std::string() : it->second;
  };
  for (const Record& r : records) {
    if (std::find(m.backends.begin(), m.backends.end(), r.backend) == m.backends.end()) m.backends.push_back(r.backend);
    for (const Dimension& d : kDimensions) {
      const std::string v = value_of(d, r);
      if (!v.empty()) values.at(d.name).insert(v);
    }
  }
  for (const Dimension& d : kDimensions)
    for (const std::string& v : values.at(d.name)) m.columns.push_back({d.name, v});
  m.cells.assign(m.backends.size(), std::vector<MatrixCell>(m.columns.size()));
  std::map<std::pair<std::string, std::string>, std::size_t> col;
  for (std::size_t i = 0; i < m.columns.size(); ++i) col[{m.columns[i].dimension, m.columns[i].value}] = i;
  for (const Record& r : records) {
    const std::size_t b = static_cast<std::size_t>(std::find(m.backends.begin(), m.backends.end(), r.backend) - m.backends.begin());
    for (const Dimension& d : kDimensions) {
      const std::string v = value_of(d, r);
      if (!v.empty()) add(m.cells[b][col.at({d.name, v})], r);
    }
  }
  for (auto& row : m.cells)
    for (MatrixCell& c : row) decide(c);
  return m;
}

void write_matrix_markdown(std::ostream& os, const Matrix& m) {
  os << "# Measured support matrix\n\nFrom " << m.sources.size() << " report(s):";
  for (const std::string& s : m.sources) os << " `" << md(s) << "`";
  os << ". A cell is the verdict of the backend's records with that value: FAILED (a failure no expectation names), "
        "XPASS, XFAIL (a known failure), PASSED (every record that ran), NOT_SUPPORTED (none ran); counts are of the "
        "records that ran. The reasons follow the tables.\n";
  std::size_t i = 0;
  while (i < m.columns.size()) {
    const std::string dim = m.columns[i].dimension;
    std::size_t j = i;
    while (j < m.columns.size() && m.columns[j].dimension == dim) ++j;
    os << "\n## " << dim << "\n\n| backend |";
    for (std::size_t k = i; k < j; ++k) os << " " << md(m.columns[k].value) << " |";
    os << "\n| --- |";
    for (std::size_t k = i; k < j; ++k) os << " --- |";
    os << "\n";
    for (std::size_t b = 0; b < m.backends.size(); ++b) {
      os << "| `" << md(m.backends[b]) << "` |";
      for (std::size_t k = i; k < j; ++k) os << " " << m.cells[b][k].text() << " |";
      os << "\n";
    }
    i = j;
  }
  os << "\n## Reasons\n\n";
  for (std::size_t b = 0; b < m.backends.size(); ++b)
    for (std::size_t k = 0; k < m.columns.size(); ++k) {
      const MatrixCell& c = m.cells[b][k];
      const std::vector<std::string>& why = c.verdict == "NOT_SUPPORTED" ? c.reasons : c.expected;
      if (why.empty()) continue;
      os << "- `" << md(m.backends[b]) << "`, " << md(m.columns[k].dimension) << " " << md(m.columns[k].value) << ":";
      for (const std::string& r : why) os << " " << md(r) << ";";
      os << "\n";
    }
}

void write_matrix_html(std::ostream& os, const Matrix& m) {
  auto esc = [](const std::string& s) { return detail::html_text(s, 4096); };
  os << "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>mlagate matrix</title><style>"
        "body{font:14px system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f3f3f3}"
        ".FAILED{background:#f8d0d0}.XPASS{background:#f8e0c0}.XFAIL{background:#f3f0c8}.PASSED{background:#d6f0d6}"
        ".NOT_SUPPORTED{background:#eee;color:#777}</style></head><body><h1>Measured support matrix</h1><p>From";
  for (const std::string& s : m.sources) os << " <code>" << esc(s) << "</code>";
  os << ". Hover a cell for its reasons.</p>";
  std::size_t i = 0;
  while (i < m.columns.size()) {
    const std::string dim = m.columns[i].dimension;
    std::size_t j = i;
    while (j < m.columns.size() && m.columns[j].dimension == dim) ++j;
    os << "<h2>" << esc(dim) << "</h2><table><tr><th>backend</th>";
    for (std::size_t k = i; k < j; ++k) os << "<th>" << esc(m.columns[k].value) << "</th>";
    os << "</tr>";
    for (std::size_t b = 0; b < m.backends.size(); ++b) {
      os << "<tr><th>" << esc(m.backends[b]) << "</th>";
      for (std::size_t k = i; k < j; ++k) {
        const MatrixCell& c = m.cells[b][k];
        std::string title;
        for (const std::string& r : c.verdict == "NOT_SUPPORTED" ? c.reasons : c.expected) title += (title.empty() ? "" : "\n") + r;
        os << "<td class=\"" << esc(c.verdict) << "\" title=\"" << esc(title) << "\">" << esc(c.text()) << "</td>";
      }
      os << "</tr>";
    }
    os << "</table>";
    i = j;
  }
  os << "</body></html>\n";
}

}  // namespace mlagate
