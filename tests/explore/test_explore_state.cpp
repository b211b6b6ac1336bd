// The search state DIR/state.json as an input (harness/explore/state.h):
// `mlagate explore --resume` on a malformed or hostile state (wrong types,
// out-of-range or inconsistent numbers, unknown keys, missing keys, a cut or
// empty file, an array) exits 2 with the file and the field in its message,
// and writes nothing: the state's bytes and the findings folder stay as they
// were. A valid state still resumes. validate_explore_state is checked
// directly too, on many more variants than the binary runs.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <tuple>

#include "cases/errors.h"
#include "harness/explore/state.h"
#include "tests/reliability/run_mlagate.h"

namespace mlagate {
namespace {

using namespace rel_test;

// A valid state as Search::main() writes it, with one finding (shrunk) and one
// harness error, after two rounds of 3.
Json explore_state_sample() {
  Json s = {{"schema", "mlagate-explore/1"},
            {"fingerprint", {{"seed", 1}, {"backends", "cpu.paged"}, {"round", 3}}},
            {"next_index", 6},
            {"elapsed_s", 2.5},
            {"search_s", 1.5},
            {"shrink_s", 0.5},
            {"cases", {{"drawn", 6}, {"ran", 5}, {"undrawable", 1}}},
            {"records", {{"PASSED", 4}, {"INCORRECT", 1}}},
            {"record_ms", 12.0},
            {"coverage", {{"op", {{"decode", 5}}}, {"seq_len at a 64 edge", {{"64k+1", 2}}}}},
            {"findings", Json::array()},
            {"harness_errors", Json::array()},
            {"slowest", {{"ms", 3.0}, {"case", "small/x"}}},
            {"done", false},
            {"space_source", "small.yaml"}};
  s["findings"].push_back({{"name", "f1"},
                           {"signature", "INCORRECT decode out: some heads"},
                           {"status", "INCORRECT"},
                           {"backend", "cpu.paged"},
                           {"op", "decode"},
                           {"count", 2},
                           {"case", "small/a"},
                           {"case_file", "x/findings/f1/case.yaml"},
                           {"shape", "1 request"},
                           {"message", "max abs err 3"},
                           {"examples", {"small/a cpu.paged", "small/b cpu.paged"}},
                           {"shrunk",
                            {{"case", "shrunk/a"},
                             {"shape", "1 request"},
                             {"status", "INCORRECT"},
                             {"message", "m"},
                             {"same", true},
                             {"runs", 7},
                             {"suite_file", "s.yaml"},
                             {"bundle", ""},
                             {"repro", "mlagate run"},
                             {"replay", ""}}}});
  s["harness_errors"].push_back({{"round_first_case", 3}, {"op", "decode"}, {"exit_code", 3}, {"output", "boom"}});
  return s;
}

// validate_explore_state's message ("" when it accepts the state).
std::string explore_state_error(const Json& s) {
  try {
    validate_explore_state(s, "out/state.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(ExploreState, ValidStatesAreAccepted) {
  Json s = explore_state_sample();
  EXPECT_EQ(explore_state_error(s), "");
  {
    // Causes (harness/verdicts/VERDICTS.md): each names existing findings, each finding's cause exists.
    Json c = s;
    c["causes"] = Json::array({{{"name", "c1"}, {"class", "reads memory it must not"}, {"explanation", "e"},
                                {"status", "INCORRECT"}, {"outputs", "values"}, {"backends", {"cpu.paged"}},
                                {"findings", {"f1"}}, {"signatures", {"INCORRECT decode out: some heads"}},
                                {"keys", {"k"}}, {"count", 2}, {"triage", Json::object()},
                                {"representative", {{"backend", "cpu.paged"}, {"op", "decode"}, {"case_file", "c.yaml"}}}}});
    c["findings"][0]["cause"] = "c1";
    c["known"] = {{"one-past", {{"count", 3}, {"reason", "r"}, {"link", ""}, {"backends", {"b"}}, {"signatures", Json::array()}}}};
    c["xpass"] = {{"one-past", {{"count", 1}}}};
    c["triage_s"] = 1.5;
    c["profile_s"] = {{"generate", 0.75}, {"ahead", -0.25}, {"process", 0.5}};  // a run's profile has negative rows
    EXPECT_EQ(explore_state_error(c), "");
    c["profile_s"]["run"] = "fast";
    EXPECT_EQ(explore_state_error(c), "explore: out/state.json: profile_s.run: expected a finite number, got \"fast\"");
    c["profile_s"] = Json::array();
    EXPECT_EQ(explore_state_error(c), "explore: out/state.json: profile_s: expected an object, got an array");
    c["profile_s"] = {{"generate", 0.75}};
    c["findings"][0]["cause"] = "c9";
    EXPECT_EQ(explore_state_error(c), "explore: out/state.json: findings[0].cause: expected the name of a cause in causes, got \"c9\"");
    c["findings"][0]["cause"] = "c1";
    c["causes"][0]["findings"] = {"f7"};
    EXPECT_NE(explore_state_error(c).find("causes[0].findings[0]: expected the name of a finding"), std::string::npos)
        << explore_state_error(c);
    c["causes"][0]["findings"] = {"f1"};
    c["known"]["one-past"]["count"] = -1;
    EXPECT_NE(explore_state_error(c).find("known[\"one-past\"].count: expected an integer from 1"), std::string::npos) << explore_state_error(c);
  }
  // Keys another version of failure() may add to a finding or a harness error.
  s["findings"][0]["note"] = "kernel";
  s["findings"][0]["variants"] = Json::array();
  s["findings"][0]["shrunk"]["extra"] = 1;
  s["harness_errors"][0]["note"] = "x";
  EXPECT_EQ(explore_state_error(s), "");
  // A shrink that failed, a finding without a shrunk block, no space_source.
  s["findings"][0]["shrunk"] = {{"error", "--no-shrink"}};
  EXPECT_EQ(explore_state_error(s), "");
  s["findings"][0].erase("shrunk");
  s.erase("space_source");
  EXPECT_EQ(explore_state_error(s), "");
  // A round cut short by a signal: its cases counted, next_index not advanced.
  s["cases"]["drawn"] = 9;
  EXPECT_EQ(explore_state_error(s), "");
  // Integral times written as integers; the first state of a search.
  s["elapsed_s"] = 3;
  EXPECT_EQ(explore_state_error(s), "");
  Json first = explore_state_sample();
  first["next_index"] = 0;
  first["cases"] = {{"drawn", 0}, {"ran", 0}, {"undrawable", 0}};
  first["records"] = Json::object();
  first["coverage"] = Json::object();
  first["findings"] = Json::array();
  first["harness_errors"] = Json::array();
  EXPECT_EQ(explore_state_error(first), "");
}

TEST(ExploreState, EachKeyIsChecked) {
  const std::string p = "explore: out/state.json: ";
  auto with = [](const std::function<void(Json&)>& change) {
    Json s = explore_state_sample();
    change(s);
    return explore_state_error(s);
  };
  // Exact messages for the bug's cases.
  EXPECT_EQ(with([](Json& s) { s["next_index"] = -5; }),
            p + "next_index: expected an integer from 0 to 6 (cases.drawn), got -5");
  EXPECT_EQ(with([](Json& s) { s["next_index"] = 999999999999LL; }),
            p + "next_index: expected an integer from 0 to 6 (cases.drawn), got 999999999999");
  EXPECT_EQ(with([](Json& s) { s["next_index"] = nullptr; }),
            p + "next_index: expected an integer from 0 to 6 (cases.drawn), got null");
  EXPECT_EQ(with([](Json& s) { s["next_index"] = 2.5; }),
            p + "next_index: expected an integer from 0 to 6 (cases.drawn), got 2.5");
  EXPECT_EQ(with([](Json& s) { s["next_index"] = "3"; }),
            p + "next_index: expected an integer from 0 to 6 (cases.drawn), got \"3\"");
  EXPECT_EQ(with([](Json& s) { s["next_index"] = 3.0; }),
            p + "next_index: expected an integer from 0 to 6 (cases.drawn), got 3.0");
  EXPECT_EQ(with([](Json& s) { s["next_index"] = 18446744073709551615ull; }),
            p + "next_index: expected an integer from 0 to 6 (cases.drawn), got 18446744073709551615");
  EXPECT_EQ(with([](Json& s) { s.erase("next_index"); }), p + "next_index: missing");
  EXPECT_EQ(with([](Json& s) { s["bogus"] = 1; }), p + "bogus: unknown key");
  EXPECT_EQ(with([](Json& s) { s["b c"] = 1; s["d"] = 2; }), p + "unknown keys [\"b c\"], d");
  EXPECT_EQ(with([](Json& s) { s["cases"]["ran"] = 7; }),
            p + "cases.ran: expected an integer from 0 to 6 (cases.drawn), got 7");
  EXPECT_EQ(with([](Json& s) { s["cases"]["undrawable"] = 2; }),
            p + "cases.undrawable: expected an integer from 0 to 1 (cases.drawn - cases.ran), got 2");
  EXPECT_EQ(with([](Json& s) { s["cases"]["drawn"] = 9007199254740992LL; }),
            p + "cases.drawn: expected an integer from 0 to 9007199254740991, got 9007199254740992");
  EXPECT_EQ(with([](Json& s) { s["findings"] = Json::object(); }), p + "findings: expected an array, got an object");
  EXPECT_EQ(with([](Json& s) { s["findings"][0].erase("backend"); }), p + "findings[0].backend: missing");
  EXPECT_EQ(with([](Json& s) { s["records"]["BOGUS"] = 1; }),
            p + "records: expected status names such as PASSED as keys, got \"BOGUS\"");
  EXPECT_EQ(with([](Json& s) { s["coverage"]["heads"] = {{"2-3", -1}}; }),
            p + "coverage.heads[\"2-3\"]: expected an integer from 0 to 9007199254740991, got -1");
  EXPECT_EQ(with([](Json& s) { s["findings"][0]["name"] = "f2"; }),
            p + "findings[0].name: expected \"f1\" (the findings in order), got \"f2\"");
  EXPECT_EQ(with([](Json& s) { s["findings"].push_back(s["findings"][0]); s["findings"][1]["name"] = "f2"; }),
            p + "findings[1]: a second finding of backend \"cpu.paged\" and signature \"INCORRECT decode out: some heads\" "
                "(a signature is one finding per backend)");
  EXPECT_EQ(with([](Json& s) { s["harness_errors"][0]["round_first_case"] = 7; }),
            p + "harness_errors[0].round_first_case: expected an integer from 0 to 6 (next_index), got 7");
  EXPECT_EQ(with([](Json& s) { s["elapsed_s"] = -1; }), p + "elapsed_s: expected a finite number >= 0, got -1");
  EXPECT_EQ(with([](Json& s) { s["elapsed_s"] = std::numeric_limits<double>::infinity(); }),
            p + "elapsed_s: expected a finite number >= 0, got infinity");
  EXPECT_EQ(with([](Json& s) { s = Json::array({1, 2}); }), p + "expected a JSON object (a search state), got an array");
  EXPECT_EQ(with([](Json& s) { s["schema"] = 1; }), "explore: out/state.json is not a search state of this mlagate");
  EXPECT_EQ(with([](Json& s) { s.erase("fingerprint"); }), "explore: out/state.json is not a search state of this mlagate");
  EXPECT_EQ(with([](Json& s) { s["findings"][0]["message"] = 5; }), p + "findings[0].message: expected a string, got 5");
  EXPECT_EQ(with([](Json& s) { s["slowest"]["case"] = std::string(100, 'x'); s["slowest"]["ms"] = "slow"; }),
            p + "slowest.ms: expected a finite number >= 0, got \"slow\"");
  EXPECT_EQ(with([](Json& s) { s["done"] = std::string(50, 'y'); }),
            p + "done: expected true or false, got \"" + std::string(40, 'y') + "\"...");
  // The rest: the field named, each key of each part.
  const std::vector<std::pair<std::string, std::function<void(Json&)>>> more = {
      {"fingerprint: expected an object, got \"x\"", [](Json& s) { s["fingerprint"] = "x"; }},
      {"search_s: expected a finite number >= 0", [](Json& s) { s["search_s"] = "1"; }},
      {"shrink_s: missing", [](Json& s) { s.erase("shrink_s"); }},
      {"record_ms: expected a finite number >= 0", [](Json& s) { s["record_ms"] = -0.5; }},
      {"cases: expected an object, got an array", [](Json& s) { s["cases"] = Json::array(); }},
      {"cases.drawn: missing", [](Json& s) { s["cases"].erase("drawn"); }},
      {"cases.skipped: unknown key", [](Json& s) { s["cases"]["skipped"] = 0; }},
      {"records.PASSED: expected an integer from 0 to", [](Json& s) { s["records"]["PASSED"] = true; }},
      {"records: expected an object", [](Json& s) { s["records"] = 4; }},
      {"coverage.op: expected an object, got 3", [](Json& s) { s["coverage"]["op"] = 3; }},
      {"findings[0]: expected an object, got \"f1\"", [](Json& s) { s["findings"][0] = "f1"; }},
      {"findings[0].signature: expected a non-empty string, got \"\"", [](Json& s) { s["findings"][0]["signature"] = ""; }},
      {"findings[0].status: expected a status name such as INCORRECT, got \"BAD\"",
       [](Json& s) { s["findings"][0]["status"] = "BAD"; }},
      {"findings[0].op: expected a non-empty string, got null", [](Json& s) { s["findings"][0]["op"] = nullptr; }},
      {"findings[0].count: expected an integer from 1 to", [](Json& s) { s["findings"][0]["count"] = 0; }},
      {"findings[0].case_file: missing", [](Json& s) { s["findings"][0].erase("case_file"); }},
      {"findings[0].shape: expected a string", [](Json& s) { s["findings"][0]["shape"] = Json::array(); }},
      {"findings[0].examples: expected an array, got \"a\"", [](Json& s) { s["findings"][0]["examples"] = "a"; }},
      {"findings[0].examples: expected 1 to 2 examples (count 2, at most 5), got 3",
       [](Json& s) { s["findings"][0]["examples"].push_back("c"); }},
      {"findings[0].examples[1]: expected a string, got 1", [](Json& s) { s["findings"][0]["examples"][1] = 1; }},
      {"findings[0].shrunk: expected an object, got \"no\"", [](Json& s) { s["findings"][0]["shrunk"] = "no"; }},
      {"findings[0].shrunk.runs: missing", [](Json& s) { s["findings"][0]["shrunk"].erase("runs"); }},
      {"findings[0].shrunk.same: expected true or false, got 1", [](Json& s) { s["findings"][0]["shrunk"]["same"] = 1; }},
      {"findings[0].shrunk.error: expected a string, got 2", [](Json& s) { s["findings"][0]["shrunk"] = {{"error", 2}}; }},
      {"harness_errors: expected an array, got null", [](Json& s) { s["harness_errors"] = nullptr; }},
      {"harness_errors[0].exit_code: expected an integer from -2147483648 to 2147483647, got 1.5",
       [](Json& s) { s["harness_errors"][0]["exit_code"] = 1.5; }},
      {"harness_errors[0].output: missing", [](Json& s) { s["harness_errors"][0].erase("output"); }},
      {"slowest.ms: expected a finite number >= 0, got -3", [](Json& s) { s["slowest"]["ms"] = -3; }},
      {"slowest.case: expected a string, got 1", [](Json& s) { s["slowest"]["case"] = 1; }},
      {"slowest.id: unknown key", [](Json& s) { s["slowest"]["id"] = "x"; }},
      {"done: expected true or false, got \"yes\"", [](Json& s) { s["done"] = "yes"; }},
      {"done: missing", [](Json& s) { s.erase("done"); }},
      {"space_source: expected a string, got 3", [](Json& s) { s["space_source"] = 3; }},
  };
  for (const auto& [want, change] : more) {
    const std::string got = with(change);
    EXPECT_EQ(got.rfind(p + want, 0), 0u) << "want: " << p + want << "\ngot:  " << got;
  }
}

// A tiny space for a search of a few seconds (the state the hostile variants
// are made from).
fs::path explore_state_space(const fs::path& d) {
  const fs::path p = d / "tiny.yaml";
  std::ofstream(p) << "name: tiny\n"
                      "explore:\n"
                      "  ops: [decode]\n"
                      "  requests: [1, 2]\n"
                      "  seq_len: [1, 64]\n"
                      "  query_len: [1, 2]\n"
                      "  heads: [1, 8]\n"
                      "  dims: [deepseek]\n"
                      "  max_work: 1.0e6\n";
  return p;
}

// One real search of 3 cases; each hostile variant of its state is refused by
// --resume with exit 2, the file and the field named, and nothing written:
// the state's bytes, the findings folder, no report, no round. Then the real
// state resumes to 6 cases.
TEST(ExploreState, ResumeRefusesAHostileStateAndWritesNothing) {
  const fs::path d = temp_dir("explore_state");
  const std::string space = explore_state_space(d).string();
  auto args = [&](const fs::path& out, const char* cases, bool resume) {
    std::vector<std::string> a = {"explore", "--backend", "cpu.paged", "--suite", space, "--cases", cases,
                                  "--round", "3", "--seed", "1", "--no-shrink", "--out", out.string()};
    if (resume) a.push_back("--resume");
    return a;
  };
  const fs::path base = d / "base";
  ASSERT_EQ(run_mlagate(args(base, "3", false), d), 0) << slurp(d / "stderr.txt") << slurp(d / "stdout.txt");
  const std::string text = slurp(base / "state.json");
  const Json real = Json::parse(text);
  ASSERT_EQ(real.at("next_index"), 3);
  ASSERT_EQ(real.at("cases").at("drawn"), 3);
  EXPECT_NO_THROW(validate_explore_state(real, "x")) << text;

  auto changed = [&](const std::function<void(Json&)>& change) {
    Json s = real;
    change(s);
    return s.dump(1);
  };
  Json finding = explore_state_sample()["findings"][0];
  finding.erase("backend");
  // (name, the state file's text, what the message must hold after the path)
  const std::vector<std::tuple<std::string, std::string, std::string>> variants = {
      {"null", changed([](Json& s) { s["next_index"] = nullptr; }), ": next_index: expected an integer from 0 to 3"},
      {"negative", changed([](Json& s) { s["next_index"] = -5; }), ": next_index: expected an integer from 0 to 3 (cases.drawn), got -5"},
      {"huge", changed([](Json& s) { s["next_index"] = 999999999999LL; }), ": next_index: expected an integer from 0 to 3 (cases.drawn), got 999999999999"},
      {"string", changed([](Json& s) { s["next_index"] = "3"; }), ": next_index: expected an integer"},
      {"float", changed([](Json& s) { s["next_index"] = 2.5; }), ": next_index: expected an integer from 0 to 3 (cases.drawn), got 2.5"},
      {"ran", changed([](Json& s) { s["cases"]["ran"] = 4; }), ": cases.ran: expected an integer from 0 to 3 (cases.drawn), got 4"},
      {"findings", changed([](Json& s) { s["findings"] = "none"; }), ": findings: expected an array, got \"none\""},
      {"backend", changed([&](Json& s) { s["findings"] = Json::array({finding}); }), ": findings[0].backend: missing"},
      {"status", changed([](Json& s) { s["records"]["GREAT"] = 1; }), ": records: expected status names such as PASSED as keys, got \"GREAT\""},
      {"unknown", changed([](Json& s) { s["resume_from"] = 0; }), ": resume_from: unknown key"},
      {"cut", text.substr(0, text.size() / 2), " is not a search state: "},
      {"empty", "", " is not a search state: "},
      {"array", "[" + text + "]", ": expected a JSON object (a search state), got an array"},
  };
  for (const auto& [name, bytes, want] : variants) {
    SCOPED_TRACE(name);
    const fs::path out = d / name;
    fs::create_directories(out / "findings" / "f1");
    const fs::path state = out / "state.json";
    std::ofstream(state, std::ios::binary) << bytes;
    std::ofstream(out / "findings" / "f1" / "case.yaml") << "kept\n";
    EXPECT_EQ(run_mlagate(args(out, "6", true), d), 2) << slurp(d / "stderr.txt");
    const std::string err = slurp(d / "stderr.txt");
    EXPECT_NE(err.find(state.string() + want), std::string::npos) << err;
    EXPECT_EQ(err.find("internal error"), std::string::npos) << err;
    EXPECT_EQ(slurp(state), bytes);
    EXPECT_EQ(slurp(out / "findings" / "f1" / "case.yaml"), "kept\n");
    EXPECT_FALSE(fs::exists(out / "report.json"));
    EXPECT_FALSE(fs::exists(out / "rounds" / "round.yaml"));
  }
  // The real state resumes: 3 more cases.
  ASSERT_EQ(run_mlagate(args(base, "6", true), d), 0) << slurp(d / "stderr.txt");
  const Json after = Json::parse(slurp(base / "state.json"));
  EXPECT_EQ(after.at("next_index"), 6);
  EXPECT_EQ(after.at("cases").at("drawn"), 6);
  EXPECT_GT(after.at("cases").at("ran").get<int>(), real.at("cases").at("ran").get<int>());
}

}  // namespace
}  // namespace mlagate
