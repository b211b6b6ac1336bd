// compute-sanitizer reruns (sanitize.h): the command, and the parsing of its
// "========= " report lines.
#include "harness/reliability/sanitize.h"

#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>

#include "backends/exec/subprocess.h"
#include "cases/errors.h"
#include "cases/remove_tree.h"

namespace mlagate {

void check_sanitize_tool(const std::string& tool) {
  if (tool != "memcheck" && tool != "initcheck" && tool != "racecheck")
    throw InputError("--sanitize '" + tool + "' (expected memcheck, initcheck or racecheck)");
}

std::string default_sanitizer() {
  namespace fs = std::filesystem;
  for (const char* env : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* home = std::getenv(env); home && fs::exists(fs::path(home) / "bin/compute-sanitizer"))
      return (fs::path(home) / "bin/compute-sanitizer").string();
  if (fs::exists("/usr/local/cuda/bin/compute-sanitizer")) return "/usr/local/cuda/bin/compute-sanitizer";
  return "compute-sanitizer";
}

void sanitize_record(Record& r, const SanitizeOptions& opt) {
  namespace fs = std::filesystem;
  const std::string prefix = "mlagate ";
  if (r.repro.rfind(prefix, 0) != 0) return;  // nothing to rerun
  constexpr int kFoundExit = 86;  // --error-exitcode: findings, as opposed to mlagate's own 0-3
  const fs::path dir = fs::temp_directory_path() / ("mlagate_sanitize_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string out = (dir / "out.txt").string(), err = (dir / "err.txt").string();
  const std::string command = exec::shell_quote(opt.sanitizer) + " --tool " + opt.tool + " --error-exitcode " +
                              std::to_string(kFoundExit) + " --launch-count " + std::to_string(opt.launch_count) +
                              " --print-limit 10 " + exec::shell_quote(opt.mlagate) + " " + r.repro.substr(prefix.size()) +
                              " --isolate none --no-progress --quiet";
  exec::CommandResult res;
  try {
    res = exec::run_command(command, opt.timeout_s, out, err);
  } catch (const std::exception& e) {
    r.details += std::string(r.details.empty() ? "" : "\n") + "compute-sanitizer not run: " + e.what();
    return;
  }
  // Each file read on its own: inserting an empty file's streambuf would set
  // failbit on the whole stream and hide the other one.
  std::string text;
  for (const std::string& path : {out, err}) {
    std::ifstream in(path, std::ios::binary);
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  remove_tree(dir.string());  // a scratch folder: what is left there is only disk
  std::istringstream all(text);
  std::string findings, first, line;
  long errors = -1;
  const std::regex summary(R"(ERROR SUMMARY: (\d+) error)");
  while (std::getline(all, line)) {
    if (line.rfind("========= ", 0) != 0) continue;
    findings += line + "\n";
    std::smatch m;
    if (std::regex_search(line, m, summary)) errors = std::stol(m[1]);
    else if (first.empty() && line.find("COMPUTE-SANITIZER") == std::string::npos && line.size() > 10 &&
             line.find_first_not_of(' ', 10) != std::string::npos && line[10] != ' ')
      first = line.substr(10);
  }
  const std::string tool = "compute-sanitizer " + opt.tool;
  if (res.timed_out || errors < 0) {
    // No summary: the sanitizer is missing or did not finish; say so, change no verdict.
    r.details += std::string(r.details.empty() ? "" : "\n") + tool + " gave no summary (" +
                 (res.timed_out ? "timed out" : "exit code " + std::to_string(res.exit_code)) + "): " + command;
    return;
  }
  r.details += std::string(r.details.empty() ? "" : "\n") + tool + " (" + command + "):\n" + findings;
  if (errors == 0) {
    r.message += (r.message.empty() ? "" : "; ") + tool + ": no errors";
    return;
  }
  const std::string note = tool + ": " + std::to_string(errors) + " error" + (errors == 1 ? "" : "s") +
                           (first.empty() ? "" : ", first: " + first);
  if (r.status == Status::kPassed) {
    r.status = Status::kIncorrect;
    r.message = note;
  } else {
    r.message += (r.message.empty() ? "" : "; ") + note;
  }
}

}  // namespace mlagate
