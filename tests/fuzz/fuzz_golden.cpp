// libFuzzer target: the HDF5 golden/results file reader (golden/golden_file.h).
// Each input is written to a file and opened as a golden file: every case
// header and its stored data are read. Any input must give data or an
// InputError (exit 2 at the CLI); another exception, a crash, a sanitizer
// report, a hang or an allocation past the memory budget is a finding.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>
#include <typeinfo>

#include "cases/errors.h"
#include "golden/golden_file.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = "/tmp/mlagate_fuzz_golden_" + std::to_string(::getpid()) + ".h5";
  // Removed after each input: libFuzzer ends a timed run without running
  // static destructors, and the file was left in /tmp, one per run.
  struct Remove {
    ~Remove() { std::remove(path.c_str()); }
  } remove_after;
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    // A small budget: a file claiming huge datasets must be refused, not allocated.
    mlagate::GoldenReader reader(path, std::uint64_t{64} << 20);
    for (const std::string& id : reader.case_ids()) {
      (void)reader.header(id);
      (void)reader.load_case(id);
    }
  } catch (const mlagate::InputError&) {
    // The expected answer to a bad file.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "finding: %s escaped the golden reader: %s\n", typeid(e).name(), e.what());
    std::abort();
  }
  return 0;
}
