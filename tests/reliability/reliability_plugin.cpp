// Test-only planted-bug backends for the reliability features, as one plugin
// library (mlagate/plugin.h) so that isolation workers load them exactly as a
// user's kernel: `--plugin libmlagate_reliability_plugin.so`. Each wraps
// cpu.paged (the tests/plugin adapter) and plants one fault in its decode:
//   rel.segv           writes through a null pointer (SIGSEGV)
//   rel.abort          prints an assertion message and aborts (SIGABRT)
//   rel.throw          a C++ exception escapes a noexcept function (std::terminate)
//   rel.hang           never returns
//   rel.nondet         every other call changes the last bit of one output element
//   rel.skip_padding   leaves o_lat rows of seq_len-0 (padding) requests unwritten
//   rel.lse_log2       returns lse in base 2 (the output is right): caught by --dcp
//   rel.batch_bits     flips the last bit of o_lat[0] in batches of 2 or more requests
//                      (right answers whose bits depend on the batch): BATCH_VARIANT
//   rel.stale          keeps o_lat in a workspace reused across calls and never
//                      computes the padding rows there: they hold the previous
//                      case's values (zero on first use)
//   rel.slow           sleeps before each call (which is right): 3 s on the
//                      cases of $MLAGATE_TEST_FAULT_ON, 1 s on others
//   rel.team           serves no call: NOT_SUPPORTED, its message the OpenMP
//                      team the call would have had ("team N"), which the
//                      worker sizes from the cores other workers left
//                      (harness/run/core_share.h)
// The fatal ones fire only on cases whose id contains $MLAGATE_TEST_FAULT_ON
// (every case when it is unset), so a run shows them next to passing cases.
#include <omp.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "mlagate/plugin.h"
#include "tests/plugin/cpu_paged_plugin.h"

namespace {

enum class Fault { kSegv, kAbort, kThrow, kHang, kNondet, kSkipPadding, kStale, kLseLog2, kBatchBits, kSlow, kTeam };

struct Planted {
  const char* name;
  const char* description;
  Fault fault;
};

constexpr Planted kPlanted[] = {
    {"rel.segv", "cpu.paged whose decode writes through a null pointer", Fault::kSegv},
    {"rel.abort", "cpu.paged whose decode fails an assertion and aborts", Fault::kAbort},
    {"rel.throw", "cpu.paged whose decode lets an exception escape (std::terminate)", Fault::kThrow},
    {"rel.hang", "cpu.paged whose decode never returns", Fault::kHang},
    {"rel.nondet", "cpu.paged that flips the last bit of o_lat[0] on every other call", Fault::kNondet},
    {"rel.skip_padding", "cpu.paged that leaves o_lat of seq_len-0 requests unwritten", Fault::kSkipPadding},
    {"rel.stale", "cpu.paged computing o_lat in a reused workspace, padding rows never written there", Fault::kStale},
    {"rel.lse_log2", "cpu.paged returning its lse in base 2", Fault::kLseLog2},
    {"rel.batch_bits", "cpu.paged whose o_lat[0] last bit depends on the batch size", Fault::kBatchBits},
    {"rel.slow", "cpu.paged that sleeps before each call", Fault::kSlow},
    {"rel.team", "serves nothing: NOT_SUPPORTED with the OpenMP team of its call", Fault::kTeam},
};
constexpr int kCount = sizeof(kPlanted) / sizeof(kPlanted[0]);

const mlagate_backend* g_inner = nullptr;
mlagate_backend g_tables[kCount];
mlagate_plugin g_plugin;

bool fires(const mlagate_problem* p) {
  const char* on = std::getenv("MLAGATE_TEST_FAULT_ON");
  return on == nullptr || (p->case_id != nullptr && std::strstr(p->case_id, on) != nullptr);
}

// The planted fault itself: the compiler's warning is the point.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wterminate"
void throw_through_noexcept() noexcept { throw std::runtime_error("rel.throw: exception escaped the kernel"); }
#pragma GCC diagnostic pop

// Rows [first, last) of requests with seq_len 0 (padding), per the args.
template <class F>
void for_padding_rows(const mlagate_problem* p, const mlagate_decode_args& d, F&& f) {
  const auto* seq = static_cast<const std::int32_t*>(d.seq_lens.data);
  const auto* qsl = static_cast<const std::int32_t*>(d.query_start_loc.data);
  for (std::int64_t b = 0; b < d.seq_lens.shape[0]; ++b)
    if (seq[b] == 0) f(qsl[b], qsl[b + 1]);
}

std::int32_t run(void* self, const mlagate_problem* p, const mlagate_args* a, char* msg, std::size_t msg_size) {
  const Planted& planted = *static_cast<const Planted*>(self);
  if (planted.fault == Fault::kTeam) {
    std::snprintf(msg, msg_size, "team %d", omp_get_max_threads());
    return MLAGATE_STATUS_NOT_SUPPORTED;
  }
  if (planted.fault == Fault::kSlow) {
    std::this_thread::sleep_for(std::chrono::seconds(fires(p) ? 3 : 1));
    return g_inner->run(g_inner->self, p, a, msg, msg_size);
  }
  if (p->op != MLAGATE_OP_DECODE) return g_inner->run(g_inner->self, p, a, msg, msg_size);
  const mlagate_decode_args& d = a->decode;
  const std::int64_t row = d.o_lat.shape[1] * d.o_lat.shape[2];  // 16-bit elements per token
  auto* o = static_cast<std::uint16_t*>(d.o_lat.data);
  const std::int64_t numel = d.o_lat.shape[0] * row;
  if (fires(p)) {
    switch (planted.fault) {
      case Fault::kSegv: {
        int* volatile nowhere = nullptr;
        *nowhere = 1;
        break;
      }
      case Fault::kAbort:
        std::fprintf(stderr, "rel.abort: decode.cu:123: assertion 'num_splits <= kMaxSplits' failed\n");
        std::abort();
      case Fault::kThrow:
        throw_through_noexcept();
        break;
      case Fault::kHang:
        std::fprintf(stderr, "rel.hang: waiting for a barrier that never comes\n");
        for (;;) ::pause();
      default:
        break;
    }
  }
  if (planted.fault == Fault::kSkipPadding) {
    // The kernel's own output, except that padding rows are skipped.
    std::vector<std::uint16_t> keep(o, o + numel);
    const std::int32_t rc = g_inner->run(g_inner->self, p, a, msg, msg_size);
    for_padding_rows(p, d, [&](std::int32_t first, std::int32_t last) {
      std::memcpy(o + first * row, keep.data() + first * row, static_cast<std::size_t>((last - first) * row) * 2);
    });
    return rc;
  }
  if (planted.fault == Fault::kStale) {
    static std::vector<std::uint16_t> workspace;  // grows, never cleared: "allocated once at init"
    if (workspace.size() < static_cast<std::size_t>(numel)) workspace.resize(static_cast<std::size_t>(numel), 0);
    const std::int32_t rc = g_inner->run(g_inner->self, p, a, msg, msg_size);
    if (rc != MLAGATE_STATUS_OK) return rc;
    std::vector<std::uint16_t> fresh(o, o + numel);
    std::vector<bool> padding(static_cast<std::size_t>(d.o_lat.shape[0]), false);
    for_padding_rows(p, d, [&](std::int32_t first, std::int32_t last) {
      for (std::int32_t t = first; t < last; ++t) padding[static_cast<std::size_t>(t)] = true;
    });
    for (std::int64_t t = 0; t < d.o_lat.shape[0]; ++t)
      if (!padding[static_cast<std::size_t>(t)])
        std::memcpy(workspace.data() + t * row, fresh.data() + t * row, static_cast<std::size_t>(row) * 2);
    std::memcpy(o, workspace.data(), static_cast<std::size_t>(numel) * 2);
    return rc;
  }
  const std::int32_t rc = g_inner->run(g_inner->self, p, a, msg, msg_size);
  if (planted.fault == Fault::kLseLog2 && rc == MLAGATE_STATUS_OK) {
    auto* l = static_cast<float*>(d.lse.data);
    for (std::int64_t i = 0; i < d.lse.shape[0] * d.lse.shape[1]; ++i) l[i] = static_cast<float>(l[i] / 0.69314718055994531);
  }
  if (planted.fault == Fault::kBatchBits && rc == MLAGATE_STATUS_OK && numel > 0 && d.seq_lens.shape[0] >= 2) o[0] ^= 1u;
  if (planted.fault == Fault::kNondet && rc == MLAGATE_STATUS_OK && numel > 0) {
    static unsigned calls = 0;
    if (++calls % 2 == 0) o[numel / 2] ^= 1u;
  }
  return rc;
}

// The inner backend's prepare() (its run() checks that it saw the call).
std::int32_t prepare(void*, const mlagate_problem* p, const mlagate_args* a, char* msg, std::size_t msg_size) {
  return g_inner->prepare ? g_inner->prepare(g_inner->self, p, a, msg, msg_size) : MLAGATE_STATUS_OK;
}

}  // namespace

extern "C" MLAGATE_PLUGIN_EXPORT const mlagate_plugin* mlagate_plugin_entry(void) {
  try {
    const mlagate_plugin* inner = cpu_paged_plugin_table("rel.inner", PlantedFault::kNone);
    if (inner == nullptr || inner->num_backends != 1) return nullptr;
    g_inner = &inner->backends[0];
    for (int i = 0; i < kCount; ++i) {
      g_tables[i] = *g_inner;  // cpu.paged's capabilities
      g_tables[i].name = kPlanted[i].name;
      g_tables[i].description = kPlanted[i].description;
      g_tables[i].self = const_cast<Planted*>(&kPlanted[i]);
      g_tables[i].supports = nullptr;
      g_tables[i].run = run;
      g_tables[i].prepare = prepare;
      g_tables[i].destroy = nullptr;
    }
    g_plugin.abi_version = MLAGATE_PLUGIN_ABI_VERSION;
    g_plugin.struct_size = sizeof(mlagate_plugin);
    g_plugin.library = "mlagate_reliability_plugin";
    g_plugin.num_backends = kCount;
    g_plugin.backends = g_tables;
    return &g_plugin;
  } catch (...) {
    return nullptr;
  }
}
