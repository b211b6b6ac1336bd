// The JUnit XML report, for CI test views (GitHub, GitLab, Jenkins): backends are suites,
// records are test cases, and the status picks <failure>, <error> or <skipped>. With --expect,
// as pytest writes xfail: an XFAIL record is <skipped> ("XFAIL (STATUS): entry: reason"), a
// strict XPASS a <failure type="XPASS">, a non-strict XPASS a pass with a note in <system-out>.
#include <sstream>
#include <unordered_map>

#include "reports/report.h"
#include "reports/text.h"

namespace mlagate {
namespace {

// The escape of one character of element text, or nullptr when it stands as it is.
const char* text_escape(char c) {
  switch (c) {
    case '&': return "&amp;";
    case '<': return "&lt;";
    case '>': return "&gt;";
    case '\r': return "&#13;";  // a raw CR would be normalized away by parsers
    default: return nullptr;
  }
}

// XML 1.0 cannot hold most control characters even as character references, nor invalid
// UTF-8: printable_text() writes those bytes as "\xNN" before the markup is escaped.
std::string xml_text(std::string_view s) {
  std::string out;
  for (char c : detail::printable_text(s)) {
    if (const char* e = text_escape(c)) out += e;
    else out += c;
  }
  return out;
}

// Attribute values also need quotes escaped, and whitespace as references because parsers
// turn raw tabs and newlines in attributes into spaces.
std::string xml_attr(std::string_view s) {
  std::string out;
  for (char c : detail::printable_text(s)) {
    const char* e = c == '"' ? "&quot;" : c == '\'' ? "&apos;" : c == '\t' ? "&#9;" : c == '\n' ? "&#10;" : text_escape(c);
    if (e) out += e;
    else out += c;
  }
  return out;
}

// JUnit times are seconds; microsecond resolution keeps fast kernels from showing 0.
std::string seconds(double ms) { return detail::format_fixed(ms / 1000.0, 6); }

enum class Outcome { kPass, kFailure, kError, kSkipped };

// JUnit separates a wrong answer (failure) from a test that could not produce one (error).
// require_bi (--require batch-invariance): BATCH_VARIANT is a failure.
Outcome status_outcome(Status s, bool require_bi) {
  switch (s) {
    case Status::kPassed: return Outcome::kPass;
    case Status::kBatchVariant: return require_bi ? Outcome::kFailure : Outcome::kPass;  // else the variance is in the message
    case Status::kIncorrect:
    case Status::kNonfinite:
    case Status::kNondeterministic: return Outcome::kFailure;
    case Status::kCrashed:
    case Status::kTimeout:
    case Status::kInvalidCase: return Outcome::kError;
    case Status::kNotSupported:
    case Status::kSkipped: return Outcome::kSkipped;
  }
  return Outcome::kError;  // an out-of-range value is a bug upstream: never a pass
}

// A record's element, --expect outcomes first: XFAIL is skipped (as pytest shows xfail), a
// strict XPASS a failure, a non-strict XPASS a pass. So failures + errors are exactly the
// records that record_fails_run.
Outcome outcome(const Record& r, bool require_bi) {
  switch (r.expected.outcome) {
    case Expected::kXfail: return Outcome::kSkipped;
    case Expected::kXpass: return r.expected.strict ? Outcome::kFailure : Outcome::kPass;
    case Expected::kNone: break;
  }
  return status_outcome(r.status, require_bi);
}

// "entry: reason", the words an --expect outcome is reported with.
std::string entry_and_reason(const Expectation& e) {
  return e.reason.empty() ? e.entry : e.entry + ": " + e.reason;
}

struct SuiteCounts {
  std::int64_t tests = 0, failures = 0, errors = 0, skipped = 0;
  double run_ms = 0;

  bool require_bi = false;
  void add(const Record& r) {
    ++tests;
    switch (outcome(r, require_bi)) {
      case Outcome::kPass: break;
      case Outcome::kFailure: ++failures; break;
      case Outcome::kError: ++errors; break;
      case Outcome::kSkipped: ++skipped; break;
    }
    run_ms += r.timings.run_ms;
  }
};

void write_counts(std::ostream& os, const SuiteCounts& c) {
  os << " tests=\"" << c.tests << "\" failures=\"" << c.failures << "\" errors=\"" << c.errors
     << "\" skipped=\"" << c.skipped << "\"";
}

void write_property(std::ostream& os, std::string_view indent, std::string_view name,
                    std::string_view value) {
  os << indent << "<property name=\"" << xml_attr(name) << "\" value=\"" << xml_attr(value)
     << "\"/>\n";
}

// Multi-line detail of one output, for the body of a <failure>.
std::string describe(const Metrics& m) {
  std::ostringstream os;
  os << (m.output.empty() ? "output" : m.output) << " (numel " << m.numel << "): "
     << (m.passed ? "passed" : "FAILED");
  if (!m.message.empty()) os << ": " << m.message;
  os << "\n  max_abs=" << detail::format_g(m.max_abs);
  if (m.worst.flat >= 0) os << " at " << m.worst.str();
  os << "\n  max_rel=" << detail::format_g(m.max_rel)
     << " (rel_floor=" << detail::format_g(m.rel_floor) << ")"
     << " mean_abs=" << detail::format_g(m.mean_abs) << " nmse=" << detail::format_g(m.nmse)
     << " cos_diff=" << detail::format_g(m.cos_diff) << " max_ulp=" << detail::format_g(m.max_ulp)
     << "\n  ref_norm=" << detail::format_g(m.ref_norm)
     << " out_norm=" << detail::format_g(m.out_norm)
     << "\n  min_atol=" << detail::format_g(m.min_atol)
     << " min_fudge=" << detail::format_g(m.min_fudge);
  if (m.nonfinite_mismatches > 0) {
    os << "\n  nonfinite_mismatches=" << m.nonfinite_mismatches;
    if (m.first_nonfinite.flat >= 0) os << ", first at " << m.first_nonfinite.str();
  }
  os << '\n';
  return os.str();
}

std::string body(const Record& r, bool with_metrics) {
  // A passing record (a strict XPASS) has no message: its status line would say nothing.
  std::string out = r.message.empty() && r.status == Status::kPassed
                        ? std::string()
                        : std::string(status_name(r.status)) + ": " + r.message + '\n';
  if (with_metrics) {
    for (const Metrics& m : r.metrics) out += describe(m);
  }
  if (!r.details.empty()) out += r.details + (r.details.back() == '\n' ? "" : "\n");
  if (!r.repro.empty()) out += "repro: " + r.repro + '\n';
  return out;
}

// The --expect lines of a body: what the entry made of the record, its reason and link.
std::string expectation_body(const Record& r) {
  const Expectation& e = r.expected;
  const std::string status(status_name(r.status));
  std::string out;
  if (e.outcome == Expected::kXfail) {
    out = "XFAIL: expectations entry " + e.entry + " expects this failure (" + status + "): " + e.reason + '\n';
  } else {
    out = std::string(e.strict ? "XPASS(strict)" : "XPASS") + ": expectations entry " + e.entry +
          " expects this record to fail and it did not (" + status + "); if the fix landed, remove the entry. Reason: " +
          e.reason + '\n';
  }
  if (!e.link.empty()) out += "link: " + e.link + '\n';
  return out;
}

void write_testcase(std::ostream& os, const Record& r, bool require_bi) {
  os << "    <testcase classname=\"" << xml_attr(r.backend + "." + r.op) << "\" name=\""
     << xml_attr(r.case_id) << "\" time=\"" << seconds(r.timings.run_ms) << "\">\n";

  constexpr std::string_view kIndent = "        ";
  const Expectation& e = r.expected;
  os << "      <properties>\n";
  write_property(os, kIndent, "backend", r.backend);
  write_property(os, kIndent, "op", r.op);
  write_property(os, kIndent, "block_size", std::to_string(r.block_size));
  write_property(os, kIndent, "policy", r.policy);
  // One set per output ("out.max_abs", "lse.max_abs"): outputs have different scales.
  for (const Metrics& m : r.metrics) {
    const std::string prefix = m.output.empty() ? "" : m.output + ".";
    write_property(os, kIndent, prefix + "max_abs", detail::format_g(m.max_abs));
    write_property(os, kIndent, prefix + "min_atol", detail::format_g(m.min_atol));
    write_property(os, kIndent, prefix + "min_fudge", detail::format_g(m.min_fudge));
  }
  write_property(os, kIndent, "repro", r.repro);
  // --expect: what the entry made of the record, and its words.
  if (e.outcome != Expected::kNone) {
    write_property(os, kIndent, "expected", expected_name(e.outcome));
    write_property(os, kIndent, "expected.entry", e.entry);
    write_property(os, kIndent, "expected.reason", e.reason);
    if (!e.link.empty()) write_property(os, kIndent, "expected.link", e.link);
    write_property(os, kIndent, "expected.strict", e.strict ? "true" : "false");
  }
  os << "      </properties>\n";

  const std::string type = std::string(status_name(r.status));
  // The element follows outcome(), as the suite's counts do.
  switch (outcome(r, require_bi)) {
    case Outcome::kPass:
      if (e.outcome == Expected::kXpass)  // not strict: a notice, the test passes
        os << "      <system-out>" << xml_text(expectation_body(r)) << "</system-out>\n";
      break;
    case Outcome::kFailure:
      if (e.outcome == Expected::kXpass) {
        os << "      <failure message=\"" << xml_attr("XPASS(strict): " + entry_and_reason(e))
           << "\" type=\"XPASS\">" << xml_text(expectation_body(r) + body(r, true)) << "</failure>\n";
      } else {
        os << "      <failure message=\"" << xml_attr(r.message) << "\" type=\"" << type << "\">"
           << xml_text(body(r, true)) << "</failure>\n";
      }
      break;
    case Outcome::kError:
      os << "      <error message=\"" << xml_attr(r.message) << "\" type=\"" << type << "\">"
         << xml_text(body(r, !r.metrics.empty())) << "</error>\n";
      break;
    case Outcome::kSkipped:
      if (e.outcome == Expected::kXfail) {
        // pytest's xfail: skipped, with the status it failed with and the entry's reason; the
        // body keeps the evidence (metrics, repro) for a reader who wonders whether it still holds.
        os << "      <skipped message=\"" << xml_attr("XFAIL (" + type + "): " + entry_and_reason(e))
           << "\" type=\"XFAIL\">" << xml_text(expectation_body(r) + body(r, !r.metrics.empty())) << "</skipped>\n";
      } else {
        os << "      <skipped message=\"" << xml_attr(type + ": " + r.message) << "\"/>\n";
      }
      break;
  }
  os << "    </testcase>\n";
}

}  // namespace

void write_junit(std::ostream& os, const RunInfo& run, std::span<const Record> records) {
  // Backends in order of first appearance, each with its records in run order.
  std::vector<std::string> backends;
  std::unordered_map<std::string, std::vector<const Record*>> by_backend;
  SuiteCounts all;
  all.require_bi = run.require_batch_invariance;
  for (const Record& r : records) {
    auto [it, inserted] = by_backend.try_emplace(r.backend);
    if (inserted) backends.push_back(r.backend);
    it->second.push_back(&r);
    all.add(r);
  }

  os << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  os << "<testsuites name=\"mlagate\"";
  write_counts(os, all);
  os << " time=\"" << detail::format_fixed(run.wall_seconds, 6) << "\">\n";
  for (const std::string& backend : backends) {
    const std::vector<const Record*>& cases = by_backend.at(backend);
    SuiteCounts counts;
    counts.require_bi = run.require_batch_invariance;
    for (const Record* r : cases) counts.add(*r);

    os << "  <testsuite name=\"" << xml_attr(backend) << "\"";
    write_counts(os, counts);
    os << " time=\"" << seconds(counts.run_ms) << "\"";
    if (!run.started_at.empty()) os << " timestamp=\"" << xml_attr(run.started_at) << "\"";
    os << ">\n";

    constexpr std::string_view kIndent = "      ";
    os << "    <properties>\n";
    write_property(os, kIndent, "tool_version", run.tool_version);
    write_property(os, kIndent, "git_commit", run.git_commit);
    write_property(os, kIndent, "command_line", run.command_line);
    write_property(os, kIndent, "suite", run.suite);
    write_property(os, kIndent, "policy", run.policy);
    write_property(os, kIndent, "generator_version", std::to_string(run.generator_version));
    os << "    </properties>\n";

    for (const Record* r : cases) write_testcase(os, *r, run.require_batch_invariance);
    os << "  </testsuite>\n";
  }
  os << "</testsuites>\n";
}

}  // namespace mlagate
