// The in-tree backends: one line each. Test-only planted-bug backends live in
// tests/ and are never listed here.
#include "backends/registry.h"

#include "backends/cpu/cpu_backends.h"
#include "cases/errors.h"
#include "mlagate/config.h"
#if MLAGATE_HAS_CUDA
#include "backends/cuda/cuda_backends.h"
#endif
#if MLAGATE_HAS_TORCH_SDPA
#include "backends/torch/torch_backends.h"
#endif
#if MLAGATE_HAS_FLASHMLA
#include "backends/flashmla/flashmla_backend.h"
#endif
#if MLAGATE_HAS_FLASHINFER
#include "backends/flashinfer/flashinfer_backend.h"
#endif
#if MLAGATE_HAS_FLASH_ATTN
#include "backends/flash_attn/flash_attn_backend.h"
#endif

namespace mlagate {

namespace {
// --splits N forces cpu.splitkv's splits too, so it can be compared with cuda.splitkv.
std::unique_ptr<Backend> make_cpu_splitkv_with(const BackendOptions& o) {
  return o.num_splits > 0 ? make_cpu_splitkv_forced(o.num_splits) : make_cpu_splitkv();
}
}  // namespace

const std::vector<BackendEntry>& backend_registry() {
  static const std::vector<BackendEntry> kRegistry = {
      {"cpu.paged", make_cpu_paged},
      {"cpu.splitkv", make_cpu_splitkv_with},
      {"cpu.sparse", make_cpu_sparse},
      {"cpu.sparse.splitkv", make_cpu_sparse_splitkv},
      {"cpu.merge", make_cpu_merge},
#if MLAGATE_HAS_CUDA
      {"cuda.ref", make_cuda_ref},
      {"cuda.splitkv", make_cuda_splitkv},
      {"cuda.sparse", make_cuda_sparse},
      {"cuda.merge", make_cuda_merge},
#endif
#if MLAGATE_HAS_TORCH_SDPA
      {"torch.sdpa.flash", make_torch_sdpa_flash},
      {"torch.sdpa.efficient", make_torch_sdpa_efficient},
      {"torch.sdpa.cudnn", make_torch_sdpa_cudnn},
      {"torch.sdpa.math", make_torch_sdpa_math},
#endif
#if MLAGATE_HAS_FLASHMLA
      {"flashmla", make_flashmla},
      {"flashmla.sparse", make_flashmla_sparse},
#endif
#if MLAGATE_HAS_FLASHINFER
      {"flashinfer.mla.fa2", make_flashinfer_mla_fa2},
#endif
#if MLAGATE_HAS_FLASHINFER_FA3
      {"flashinfer.mla.fa3", make_flashinfer_mla_fa3},
      {"flashinfer.mla.sparse", make_flashinfer_mla_sparse},
#endif
#if MLAGATE_HAS_FLASH_ATTN
      {"flash_attn.mla", make_flash_attn_mla},
      {"flash_attn.mla.cudagraph", make_flash_attn_mla_cudagraph},
      {"flash_attn.mla.sparse", make_flash_attn_mla_sparse},
#endif
  };
  return kRegistry;
}

bool glob_match(std::string_view p, std::string_view t) {
  // Iterative '*' / '?' matcher with backtracking to the last star.
  std::size_t pi = 0, ti = 0, star = std::string_view::npos, mark = 0;
  while (ti < t.size()) {
    if (pi < p.size() && (p[pi] == '?' || p[pi] == t[ti])) {
      ++pi, ++ti;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = ti;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      ti = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

std::vector<std::unique_ptr<Backend>> select_backends(const std::string& globs, const BackendOptions& options,
                                                      std::span<const BackendEntry> extra) {
  std::vector<const BackendEntry*> entries;
  for (const auto& e : backend_registry()) entries.push_back(&e);
  for (const auto& e : extra) {
    for (const BackendEntry* o : entries)
      if (o->name == e.name) throw InputError("backend name '" + e.name + "' is taken twice (--plugin, --exec or in-tree)");
    entries.push_back(&e);
  }
  std::vector<std::string> patterns;
  std::size_t start = 0;
  while (start <= globs.size()) {
    const std::size_t comma = globs.find(',', start);
    const std::string p = globs.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!p.empty()) patterns.push_back(p);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (patterns.empty()) patterns.push_back("*");
  std::vector<std::unique_ptr<Backend>> out;
  for (const auto& p : patterns) {
    bool any = false;
    for (const BackendEntry* e : entries)
      if (glob_match(p, e->name)) {
        any = true;
        bool dup = false;
        for (const auto& b : out) dup = dup || b->name() == e->name;
        if (!dup) out.push_back(e->make(options));
      }
    if (!any) {
      std::string known;
      for (const BackendEntry* e : entries) known += (known.empty() ? "" : ", ") + e->name;
      throw InputError("--backend '" + p + "' matches no backend (available: " + known + ")");
    }
  }
  return out;
}

namespace {
std::vector<BackendEntry>& embedded() {
  static std::vector<BackendEntry> entries;
  return entries;
}
std::string& embedded_cmd() {
  static std::string words = "mlagate";
  return words;
}
}  // namespace

void set_embedded_backends(std::vector<BackendEntry> entries) { embedded() = std::move(entries); }
void set_embedded_command(std::string words) { embedded_cmd() = words.empty() ? "mlagate" : std::move(words); }
const std::string& embedded_command() { return embedded_cmd(); }
const std::vector<BackendEntry>& embedded_backends() { return embedded(); }

}  // namespace mlagate
