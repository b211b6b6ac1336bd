// Reads and rewrites the golden files under tests/reports/expected/.
#include "tests/reports/snapshot.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string_view>

namespace mlagate::test {
namespace {

std::string golden_path(const std::string& name) {
  return std::string(MLAGATE_REPORTS_EXPECTED_DIR) + "/" + name;
}

}  // namespace

bool update_snapshots() {
  const char* v = std::getenv("MLAGATE_UPDATE_SNAPSHOTS");
  return v != nullptr && std::string_view(v) == "1";
}

std::string read_snapshot(const std::string& name) {
  std::ifstream in(golden_path(name), std::ios::binary);
  if (!in) throw std::runtime_error("cannot read golden file " + golden_path(name));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_snapshot(const std::string& name, const std::string& text) {
  std::ofstream out(golden_path(name), std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush()) throw std::runtime_error("cannot write golden file " + golden_path(name));
}

}  // namespace mlagate::test
