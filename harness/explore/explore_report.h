// The reports of a search (EXPLORE.md, "Reports"): the JSON report (the saved
// state plus derived figures: cases per second, time per case, the verdict),
// its self-contained HTML page, and the console summary.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

namespace mlagate {

nlohmann::json explore_report(const nlohmann::json& state);
void write_explore_html(std::ostream& os, const nlohmann::json& report);
std::string explore_summary_text(const nlohmann::json& report);
// --profile: where the search's wall went, a row per phase (profile_s, then
// shrink_s and triage_s), largest first, in seconds, % of the search's wall
// and ms per case that ran.
std::string explore_profile_text(const nlohmann::json& report);

}  // namespace mlagate
