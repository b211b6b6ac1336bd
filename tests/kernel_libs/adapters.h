// What the real-library adapters' tests share (test_kernel_libs.cpp,
// test_vllm_sparse.cpp): the adapters this build has, one made by name, and a
// NOT_SUPPORTED answer checked for its reason.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "harness/cli/cli.h"

namespace mlagate {

// The adapters this build has, by the registry's names.
inline std::vector<std::string> adapter_names() {
  std::vector<std::string> names;
  for (const BackendEntry& e : backend_registry())
    if (e.name.rfind("flashmla", 0) == 0 || e.name.rfind("flashinfer", 0) == 0 || e.name.rfind("flash_attn", 0) == 0)
      names.push_back(e.name);
  return names;
}

inline std::unique_ptr<Backend> make(const std::string& name) { return std::move(select_backends(name).front()); }

inline void expect_no(const Support& s, const std::string& words) {
  EXPECT_FALSE(s.ok) << "expected NOT_SUPPORTED (" << words << ")";
  EXPECT_NE(s.reason.find(words), std::string::npos) << s.reason;
}

}  // namespace mlagate
