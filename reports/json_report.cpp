// The JSON report: the full content of every Record, for tools and later analysis.
// Keys keep their insertion order (ordered_json) so the file reads in the order documented here.
#include <cmath>

#include <nlohmann/json.hpp>

#include "reports/report.h"

namespace mlagate {
namespace {

using Json = nlohmann::ordered_json;

// JSON has no NaN or infinities: NaN (a metric that was not computed) is written as null,
// and +-inf as the strings "inf" and "-inf" so that an overflow stays distinguishable from null.
Json number(double v) {
  if (std::isnan(v)) return nullptr;
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

// Location fields are -1 where they do not apply (an lse output has no dim): null in JSON.
Json location_field(std::int64_t i) { return i < 0 ? Json(nullptr) : Json(i); }

Json location(const Location& l) {
  return {{"flat", location_field(l.flat)},
          {"request", location_field(l.request)},
          {"token", location_field(l.token)},
          {"head", location_field(l.head)},
          {"dim", location_field(l.dim)}};
}

Json metrics(const Metrics& m) {
  return {
      {"output", m.output},
      {"numel", m.numel},
      {"max_abs", number(m.max_abs)},
      {"max_rel", number(m.max_rel)},
      {"rel_floor", number(m.rel_floor)},
      {"mean_abs", number(m.mean_abs)},
      {"nmse", number(m.nmse)},
      {"cos_diff", number(m.cos_diff)},
      {"max_ulp", number(m.max_ulp)},
      {"ref_norm", number(m.ref_norm)},
      {"out_norm", number(m.out_norm)},
      {"worst", location(m.worst)},
      {"nonfinite_mismatches", m.nonfinite_mismatches},
      {"first_nonfinite", location(m.first_nonfinite)},
      {"min_atol", number(m.min_atol)},
      {"min_fudge", number(m.min_fudge)},
      {"err_baseline", number(m.err_baseline)},
      {"baseline_floor", number(m.baseline_floor)},
      {"passed", m.passed},
      {"message", m.message},
  };
}

Json record(const Record& r) {
  Json all_metrics = Json::array();
  for (const Metrics& m : r.metrics) all_metrics.push_back(metrics(m));
  const Timings& t = r.timings;
  return {
      {"id", r.case_id},
      {"backend", r.backend},
      {"op", r.op},
      {"status", status_name(r.status)},
      {"message", r.message},
      {"policy", r.policy},
      {"block_size", r.block_size},
      {"paths", r.paths},
      {"metrics", std::move(all_metrics)},
      {"timings_ms",
       {{"generate", number(t.generate_ms)},
        {"golden", number(t.golden_ms)},
        {"cache", number(t.cache_ms)},
        {"run", number(t.run_ms)},
        {"compare", number(t.compare_ms)},
        {"baseline", number(t.baseline_ms)},
        {"glue", number(t.glue_ms)},
        {"total", number(t.total_ms)}}},
      {"repro", r.repro},
  };
}

// details (a crashed worker's stderr tail, sanitizer findings) only where there are any.
Json record_with_details(const Record& r) {
  Json j = record(r);
  if (!r.details.empty()) j["details"] = r.details;
  return j;
}

Json summary(const StatusCounts& counts) {
  Json j = Json::object();
  for (Status s : kAllStatuses) j[std::string(status_name(s))] = counts[s];
  j["total"] = counts.total;
  j["failures"] = counts.failures;
  j["verdict"] = overall_verdict(counts);
  return j;
}

}  // namespace

void write_json(std::ostream& os, const RunInfo& run, std::span<const Record> records) {
  Json all_records = Json::array();
  for (const Record& r : records) all_records.push_back(record_with_details(r));
  Json doc = {
      {"schema", "mlagate.report"},
      {"schema_version", 1},
      {"run",
       {{"tool_version", run.tool_version},
        {"git_commit", run.git_commit},
        {"command_line", run.command_line},
        {"suite", run.suite},
        {"policy", run.policy},
        {"started_at", run.started_at},
        {"wall_seconds", number(run.wall_seconds)},
        {"generator_version", run.generator_version}}},
      {"summary", summary(count_statuses(records))},
      {"records", std::move(all_records)},
  };
  if (!run.profile.empty()) {
    // After the documented keys: {"wall_ms", "phases_ms": {phase: ms, ..., "unaccounted": ms}}.
    Json phases = Json::object();
    for (const auto& [name, ms] : run.profile) phases[name] = number(ms);
    doc["profile"] = {{"wall_ms", number(run.profile_wall_ms)}, {"phases_ms", std::move(phases)}};
  }
  // Messages from backends may hold arbitrary bytes; strict mode would throw on them.
  if (!run.interrupted.empty()) {
    Json d = doc;
    d["run"]["interrupted"] = run.interrupted;  // only then: whole runs keep the documented keys
    os << d.dump(2, ' ', false, Json::error_handler_t::replace) << '\n';
    return;
  }
  os << doc.dump(2, ' ', false, Json::error_handler_t::replace) << '\n';
}

}  // namespace mlagate
