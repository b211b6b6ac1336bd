// Record <-> one JSON line (record_json.h). Every field of Record, Metrics,
// Location and Timings is written, so a record that went through a worker or
// a journal is the record the in-process runner would have made.
#include "reports/record_json.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <vector>

#include <nlohmann/json.hpp>

#include "reports/float_base64.h"

namespace mlagate {
namespace {

using Json = nlohmann::json;

Json num(double v) {
  if (std::isnan(v)) return nullptr;
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}
double get_num(const Json& j) {
  if (j.is_null()) return kNaN;
  if (j.is_string()) {
    const std::string s = j.get<std::string>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    throw std::runtime_error("record json: bad number '" + s + "'");
  }
  return j.get<double>();
}

Json loc(const Location& l) { return Json::array({l.flat, l.request, l.token, l.head, l.dim}); }
// [flat, request, token, head, dim, got, expected, err]: a Location's five
// (get_loc reads the first five) and the three values.
Json worst_elements(const std::vector<WorstElement>& ws) {
  Json out = Json::array();
  for (const WorstElement& w : ws) {
    Json e = loc(w.where);
    e.push_back(num(w.got));
    e.push_back(num(w.expected));
    e.push_back(num(w.err));
    out.push_back(std::move(e));
  }
  return out;
}
Location get_loc(const Json& j) {
  Location l;
  l.flat = j.at(0).get<std::int64_t>();
  l.request = j.at(1).get<int>();
  l.token = j.at(2).get<int>();
  l.head = j.at(3).get<int>();
  l.dim = j.at(4).get<int>();
  return l;
}

Status status_of(const std::string& s) {
  if (const std::optional<Status> st = status_from_name(s)) return *st;
  throw std::runtime_error("record json: unknown status '" + s + "'");
}

}  // namespace

std::string record_to_json_line(const Record& r) {
  Json ms = Json::array();
  for (const Metrics& m : r.metrics)
    ms.push_back({{"output", m.output},
                  {"numel", m.numel},
                  {"max_abs", num(m.max_abs)},
                  {"max_rel", num(m.max_rel)},
                  {"rel_floor", num(m.rel_floor)},
                  {"mean_abs", num(m.mean_abs)},
                  {"nmse", num(m.nmse)},
                  {"cos_diff", num(m.cos_diff)},
                  {"max_ulp", num(m.max_ulp)},
                  {"ref_norm", num(m.ref_norm)},
                  {"out_norm", num(m.out_norm)},
                  {"worst", loc(m.worst)},
                  {"nonfinite_mismatches", m.nonfinite_mismatches},
                  {"first_nonfinite", loc(m.first_nonfinite)},
                  {"min_atol", num(m.min_atol)},
                  {"min_fudge", num(m.min_fudge)},
                  {"err_baseline", num(m.err_baseline)},
                  {"baseline_floor", num(m.baseline_floor)},
                  {"passed", m.passed},
                  {"message", m.message},
                  {"map", Json::array({m.map_tokens, m.map_heads, m.token_bin, m.head_bin})},
                  {"err_token_head", floats_to_base64(m.err_token_head)},
                  {"query_lens", m.query_lens},
                  {"worst_elements", worst_elements(m.worst_elements)}});
  const Timings& t = r.timings;
  Json j = {{"id", r.case_id},
                  {"backend", r.backend},
                  {"op", r.op},
                  {"status", status_name(r.status)},
                  {"message", r.message},
                  {"details", r.details},
                  {"policy", r.policy},
                  {"block_size", r.block_size},
                  {"paths", r.paths},
                  {"metrics", std::move(ms)},
                  {"timings", Json::array({num(t.generate_ms), num(t.reference_ms), num(t.cache_ms), num(t.run_ms),
                                           num(t.compare_ms), num(t.baseline_ms), num(t.glue_ms), num(t.total_ms)})},
                  {"repro", r.repro}};
  // Serving modes only (records of plain calls keep their old keys).
  if (!r.mode.empty()) j["mode"] = r.mode;
  if (!r.steps.empty()) {
    Json steps = Json::array();
    for (const StepResult& s : r.steps)
      steps.push_back(Json::array({s.step, s.requests, status_name(s.status), num(s.max_abs_o), num(s.max_abs_lse)}));
    j["steps"] = std::move(steps);
  }
  if (!r.facts.empty()) j["facts"] = r.facts;
  if (r.expected.outcome != Expected::kNone)
    j["expected"] = Json::array({static_cast<int>(r.expected.outcome), r.expected.entry, r.expected.reason,
                                 r.expected.link, r.expected.strict});
  // Backend messages may hold arbitrary bytes: replaced, never a throw.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Record record_from_json_line(const std::string& line) {
  try {
    const Json j = Json::parse(line);
    Record r;
    r.case_id = j.at("id").get<std::string>();
    r.backend = j.at("backend").get<std::string>();
    r.op = j.at("op").get<std::string>();
    r.status = status_of(j.at("status").get<std::string>());
    r.message = j.at("message").get<std::string>();
    r.details = j.value("details", std::string());
    r.policy = j.at("policy").get<std::string>();
    r.block_size = j.at("block_size").get<int>();
    r.paths = j.at("paths").get<std::vector<std::string>>();
    for (const Json& mj : j.at("metrics")) {
      Metrics m;
      m.output = mj.at("output").get<std::string>();
      m.numel = mj.at("numel").get<std::int64_t>();
      m.max_abs = get_num(mj.at("max_abs"));
      m.max_rel = get_num(mj.at("max_rel"));
      m.rel_floor = get_num(mj.at("rel_floor"));
      m.mean_abs = get_num(mj.at("mean_abs"));
      m.nmse = get_num(mj.at("nmse"));
      m.cos_diff = get_num(mj.at("cos_diff"));
      m.max_ulp = get_num(mj.at("max_ulp"));
      m.ref_norm = get_num(mj.at("ref_norm"));
      m.out_norm = get_num(mj.at("out_norm"));
      m.worst = get_loc(mj.at("worst"));
      m.nonfinite_mismatches = mj.at("nonfinite_mismatches").get<std::int64_t>();
      m.first_nonfinite = get_loc(mj.at("first_nonfinite"));
      m.min_atol = get_num(mj.at("min_atol"));
      m.min_fudge = get_num(mj.at("min_fudge"));
      m.err_baseline = get_num(mj.at("err_baseline"));
      m.baseline_floor = get_num(mj.at("baseline_floor"));
      m.passed = mj.at("passed").get<bool>();
      m.message = mj.at("message").get<std::string>();
      // The error summary; journals written before it have none.
      if (mj.contains("map")) {
        const Json& map = mj.at("map");
        m.map_tokens = map.at(0).get<int>();
        m.map_heads = map.at(1).get<int>();
        m.token_bin = map.at(2).get<int>();
        m.head_bin = map.at(3).get<int>();
        m.err_token_head = floats_from_base64(mj.at("err_token_head").get<std::string>());
        m.query_lens = mj.at("query_lens").get<std::vector<std::int32_t>>();
        for (const Json& w : mj.at("worst_elements"))
          m.worst_elements.push_back({get_loc(w), get_num(w.at(5)), get_num(w.at(6)), get_num(w.at(7))});
      }
      r.metrics.push_back(std::move(m));
    }
    const Json& t = j.at("timings");
    r.timings = {get_num(t.at(0)), get_num(t.at(1)), get_num(t.at(2)), get_num(t.at(3)), get_num(t.at(4))};
    // Journals written before baseline, glue and total were timed hold 5.
    if (t.size() >= 8) {
      r.timings.baseline_ms = get_num(t.at(5));
      r.timings.glue_ms = get_num(t.at(6));
      r.timings.total_ms = get_num(t.at(7));
    }
    r.repro = j.at("repro").get<std::string>();
    r.mode = j.value("mode", std::string());
    if (j.contains("steps"))
      for (const Json& sj : j.at("steps"))
        r.steps.push_back({sj.at(0).get<int>(), sj.at(1).get<int>(), status_of(sj.at(2).get<std::string>()),
                           get_num(sj.at(3)), get_num(sj.at(4))});
    if (j.contains("facts")) r.facts = j.at("facts").get<std::map<std::string, std::string>>();
    if (j.contains("expected")) {
      const Json& e = j.at("expected");
      const int outcome = e.at(0).get<int>();
      if (outcome < 0 || outcome > static_cast<int>(Expected::kXpass)) throw std::runtime_error("malformed record line: bad expected outcome");
      r.expected = {static_cast<Expected>(outcome), e.at(1).get<std::string>(), e.at(2).get<std::string>(),
                    e.at(3).get<std::string>(), e.at(4).get<bool>()};
    }
    return r;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("malformed record line: ") + e.what());
  }
}

}  // namespace mlagate
