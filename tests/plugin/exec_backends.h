// What the exec tests share (test_exec.cpp, test_exec_sparse.cpp): a program
// as an exec backend, alone in the backend list run_cases takes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/exec/exec_backend.h"

namespace mlagate::test {

inline std::vector<std::unique_ptr<Backend>> exec_backends(const std::string& name, const std::string& command,
                                                           const std::string& caps, double timeout_s = 60) {
  ExecConfig c;
  c.name = name;
  c.command = command;
  c.caps = parse_exec_caps(caps);
  c.timeout_s = timeout_s;
  std::vector<std::unique_ptr<Backend>> bs;
  bs.push_back(exec_backend_entry(c).make({}));
  return bs;
}

}  // namespace mlagate::test
