// libFuzzer target: the suite parser (cases/suite.h) and the case validation
// behind it. Any input must give a Suite or an InputError (a message, exit 2
// at the CLI); another exception, a crash, a sanitizer report or a hang is a
// finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "cases/errors.h"
#include "cases/suite.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const mlagate::Suite s = mlagate::parse_suite_yaml(text, "fuzz.yaml");
    for (const mlagate::CaseSpec& c : s.cases) {
      c.validate();
      (void)c.id();
    }
  } catch (const mlagate::InputError&) {
    // The expected answer to bad input.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "finding: %s escaped the suite parser: %s\n", typeid(e).name(), e.what());
    std::abort();
  }
  return 0;
}
