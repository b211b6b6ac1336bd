// torch_reference.h in every build with libtorch: the calls load the module
// libmlagate_torch_reference.so on first use (torch_module.h says why) and go
// through its table. Where the module is looked for, first found wins:
//   1. $MLAGATE_TORCH_REFERENCE_MODULE (a path; only it, when set);
//   2. beside the program or library holding this code (the build tree's
//      harness/ for mlagate, python/mlagate/ for the Python module, an
//      installed wheel's package);
//   3. <that folder>/../lib/mlagate/ (`cmake --install`, a wheel's scripts);
//   4. where this build put it (the build tree, for the test programs).
// A module that is missing, fails to load (its libtorch missing) or comes from
// another build leaves the reference unavailable, and torch_reference_info()
// says why.
#include <dlfcn.h>
#include <errno.h>  // program_invocation_name (GNU)

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "cases/errors.h"
#include "reference/torch/torch_module.h"

namespace mlagate {
namespace {

namespace fs = std::filesystem;

struct Loaded {
  const torch_module::Api* api = nullptr;
  std::string why;  // when api is null: what was tried and what failed
};

std::vector<fs::path> candidates() {
  if (const char* env = std::getenv("MLAGATE_TORCH_REFERENCE_MODULE"); env && *env) return {env};
  std::vector<fs::path> out;
  // The file holding this code: a shared object's own path, or for the
  // program (whose name dladdr gives as argv[0], maybe a bare name found on
  // PATH) /proc/self/exe.
  Dl_info self{};
  if (dladdr(reinterpret_cast<const void*>(&candidates), &self) && self.dli_fname) {
    const bool program = std::string_view(self.dli_fname) == program_invocation_name;
    std::error_code ec;
    const fs::path dir = fs::canonical(program ? "/proc/self/exe" : self.dli_fname, ec).parent_path();
    if (!ec) {
      out.push_back(dir / torch_module::kFileName);
      out.push_back(dir.parent_path() / "lib" / "mlagate" / torch_module::kFileName);
    }
  }
  out.emplace_back(MLAGATE_TORCH_MODULE_BUILD_PATH);
  return out;
}

Loaded load() {
  Loaded r;
  const auto tried = [&r](const std::string& what) { r.why += (r.why.empty() ? "" : "; ") + what; };
  for (const fs::path& p : candidates()) {
    std::error_code ec;
    if (!fs::is_regular_file(p, ec)) {
      tried(p.string() + ": not there");
      continue;
    }
    // Kept loaded for the process's life: its tables and libtorch's static
    // state must outlive every call. RTLD_LOCAL: nothing of it binds ours.
    void* h = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!h) {
      const char* e = dlerror();
      std::string msg = e ? e : "dlopen failed";
      if (msg.rfind(p.string() + ": ", 0) != 0) msg = p.string() + ": " + msg;  // glibc names the file itself
      tried(msg);
      continue;
    }
    const auto entry = reinterpret_cast<torch_module::EntryFn>(dlsym(h, torch_module::kEntry));
    const torch_module::Api* api = entry ? entry() : nullptr;
    if (!api) {
      tried(p.string() + ": no " + torch_module::kEntry);
      continue;
    }
    if (torch_module::build_key() != api->key) {
      tried(p.string() + ": from another build (" + api->key + ", this one is " + torch_module::build_key() + ")");
      continue;
    }
    r.api = api;
    return r;
  }
  r.why = "the libtorch reference module could not be loaded: " + r.why;
  return r;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

const torch_module::Api& api() {
  const Loaded& l = loaded();
  if (!l.api) throw std::runtime_error("torch reference: " + l.why);
  return *l.api;
}

}  // namespace

bool torch_reference_available() { return loaded().api != nullptr; }

std::string torch_reference_info() { return loaded().api ? loaded().api->info() : loaded().why; }

bool torch_cuda_available() { return loaded().api && loaded().api->cuda_available(); }

namespace {
void throw_if_failed(const torch_module::Outcome& o) {
  if (o.error.empty()) return;
  if (o.unsupported) throw NotSupportedError(o.error);
  throw std::runtime_error(o.error);
}
}  // namespace

SdpaResult torch_sdpa_layer(const Case& c, SdpaForm form, std::span<const int> requests, const TorchReferenceOptions& o) {
  SdpaResult r;
  throw_if_failed(api().layer(c, form, requests, o, r));
  return r;
}

std::string torch_sdpa_kernel(const Case& c, SdpaForm form, const TorchReferenceOptions& o) {
  std::string k;
  throw_if_failed(api().kernel(c, form, o, k));
  return k;
}

}  // namespace mlagate
