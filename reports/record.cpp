// Status names and location formatting for records.
#include "reports/record.h"

#include <charconv>
#include <ctime>

namespace mlagate {

std::string_view status_name(Status s) {
  switch (s) {
    case Status::kPassed: return "PASSED";
    case Status::kIncorrect: return "INCORRECT";
    case Status::kNonfinite: return "NONFINITE";
    case Status::kCrashed: return "CRASHED";
    case Status::kTimeout: return "TIMEOUT";
    case Status::kNotSupported: return "NOT_SUPPORTED";
    case Status::kSkipped: return "SKIPPED";
    case Status::kInvalidCase: return "INVALID_CASE";
    case Status::kNondeterministic: return "NONDETERMINISTIC";
    case Status::kBatchVariant: return "BATCH_VARIANT";
  }
  return "?";
}

bool status_is_failure(Status s) {
  return s == Status::kIncorrect || s == Status::kNonfinite || s == Status::kCrashed || s == Status::kTimeout ||
         s == Status::kInvalidCase || s == Status::kNondeterministic;
}

bool status_fails_run(Status s, bool require_batch_invariance) {
  return status_is_failure(s) || (require_batch_invariance && s == Status::kBatchVariant);
}

std::string_view expected_name(Expected e) {
  switch (e) {
    case Expected::kNone: return "";
    case Expected::kXfail: return "XFAIL";
    case Expected::kXpass: return "XPASS";
  }
  return "?";
}

bool record_fails_run(const Record& r, bool require_batch_invariance) {
  switch (r.expected.outcome) {
    case Expected::kXfail: return false;
    case Expected::kXpass: return r.expected.strict;
    case Expected::kNone: break;
  }
  return status_fails_run(r.status, require_batch_invariance);
}

std::string Location::str() const {
  if (flat < 0) return "(none)";
  // Unknown coordinates (-1) are left out rather than printed as -1.
  std::string s;
  auto add = [&](const char* what, int v) {
    if (v >= 0) s += (s.empty() ? "" : ", ") + std::string(what) + " " + std::to_string(v);
  };
  add("request", request);
  add("token", token);
  add("head", head);
  add("dim", dim);
  return s.empty() ? "element " + std::to_string(flat) : s;
}

std::string iso_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string exact_number(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::optional<Status> status_from_name(std::string_view name) {
  for (Status s : kAllStatuses)
    if (status_name(s) == name) return s;
  return std::nullopt;
}

}  // namespace mlagate
