// Test-only planted-bug backends for `mlagate explore`, as one plugin library
// that the real binary (and the runs the search starts) load with --plugin.
// Each wraps cpu.paged (the tests/plugin adapter) and is wrong only at shapes
// no built-in suite has, so every fixed suite passes it (test_explore.cpp
// checks that no built-in case meets its trigger) and only a search finds it:
//   explore.heads_tile16  heads past the last full tile of 16 (more than 16
//                         heads, not a multiple of 16) get the output of the
//                         head 16 before them: a head loop tiled by 16 whose
//                         remainder tile reuses the previous tile's pointers
//   explore.qlen_past_64  query tokens 64 and up of a request (q_len > 64) get
//                         the output of the token 64 before them: a query tile
//                         of 64 whose second tile is never computed
//   explore.seq_past_64k  a request of 65,536 keys or more is read with
//                         seq_len mod 65,536 (its length kept in 16 bits)
//   explore.bs1_mod64     block size 1, a request past 2,048 keys with
//                         seq_len = 64 k + 1: its last 65 keys are skipped (a
//                         per-64-key loop that, once the context needs a second
//                         level of it, stops one tile early and drops the
//                         remainder of one key)
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "mlagate/plugin.h"
#include "tests/plugin/cpu_paged_plugin.h"

namespace {

enum class Bug { kHeadsTile16, kQlenPast64, kSeqPast64k, kBs1Mod64 };

struct Planted {
  const char* name;
  const char* description;
  Bug bug;
};

constexpr Planted kPlanted[] = {
    {"explore.heads_tile16", "cpu.paged whose heads past the last full tile of 16 repeat the previous tile's", Bug::kHeadsTile16},
    {"explore.qlen_past_64", "cpu.paged whose query tokens 64 and up of a request repeat the first tile's", Bug::kQlenPast64},
    {"explore.seq_past_64k", "cpu.paged that keeps seq_len in 16 bits (65,536 keys or more wrap)", Bug::kSeqPast64k},
    {"explore.bs1_mod64", "cpu.paged that skips the last 65 keys of a seq_len 64k+1 request past 2,048 keys at block size 1",
     Bug::kBs1Mod64},
};
constexpr int kCount = sizeof(kPlanted) / sizeof(kPlanted[0]);

const mlagate_backend* g_inner = nullptr;
mlagate_backend g_tables[kCount];
mlagate_plugin g_plugin;

// Copies token rows or head slices of an output [T, N, W] (elem bytes each).
struct Out {
  char* data;
  std::int64_t tokens, heads, width, elem;
  char* at(std::int64_t t, std::int64_t h) const { return data + ((t * heads + h) * width) * elem; }
  void copy_head(std::int64_t t, std::int64_t from, std::int64_t to) const {
    std::memcpy(at(t, to), at(t, from), static_cast<std::size_t>(width * elem));
  }
  void copy_token(std::int64_t from, std::int64_t to) const {
    std::memcpy(at(to, 0), at(from, 0), static_cast<std::size_t>(heads * width * elem));
  }
};

Out out_of(const DLTensor& t) {
  const std::int64_t width = t.ndim == 3 ? t.shape[2] : 1;
  return {static_cast<char*>(t.data), t.shape[0], t.shape[1], width, t.dtype.bits / 8};
}

void after(Bug bug, const mlagate_problem* p, const DLTensor& o, const DLTensor& lse, const DLTensor& starts) {
  const Out outs[2] = {out_of(o), out_of(lse)};
  if (bug == Bug::kHeadsTile16 && p->num_heads > 16 && p->num_heads % 16 != 0) {
    for (const Out& x : outs)
      for (std::int64_t t = 0; t < x.tokens; ++t)
        for (std::int64_t h = p->num_heads / 16 * 16; h < p->num_heads; ++h) x.copy_head(t, h - 16, h);
  }
  if (bug == Bug::kQlenPast64) {
    const auto* qs = static_cast<const std::int32_t*>(starts.data);
    for (std::int64_t b = 0; b < starts.shape[0] - 1; ++b)
      for (std::int32_t t = qs[b] + 64; t < qs[b + 1]; ++t)
        for (const Out& x : outs) x.copy_token(t - 64, t);
  }
}

std::int32_t run(void* self, const mlagate_problem* p, const mlagate_args* a, char* msg, std::size_t msg_size) {
  const Bug bug = static_cast<const Planted*>(self)->bug;
  if (p->op == MLAGATE_OP_DECODE && (bug == Bug::kSeqPast64k || bug == Bug::kBs1Mod64)) {
    // The kernel sees fewer keys than the call gives: shortened seq_lens.
    const DLTensor& s = a->decode.seq_lens;
    const auto* seq = static_cast<const std::int32_t*>(s.data);
    std::vector<std::int32_t> mine(seq, seq + s.shape[0]);
    for (std::int32_t& v : mine) {
      if (bug == Bug::kSeqPast64k) v &= 0xFFFF;
      if (bug == Bug::kBs1Mod64 && p->block_size == 1 && v > 2048 && v % 64 == 1) v -= 65;
    }
    mlagate_args copy = *a;
    copy.decode.seq_lens.data = mine.data();
    mlagate_problem prob = *p;
    prob.seq_lens = mine.data();
    if (g_inner->prepare) {
      const std::int32_t rc = g_inner->prepare(g_inner->self, &prob, &copy, msg, msg_size);
      if (rc != MLAGATE_STATUS_OK) return rc;
    }
    return g_inner->run(g_inner->self, &prob, &copy, msg, msg_size);
  }
  const std::int32_t rc = g_inner->run(g_inner->self, p, a, msg, msg_size);
  if (rc != MLAGATE_STATUS_OK) return rc;
  if (p->op == MLAGATE_OP_DECODE) after(bug, p, a->decode.o_lat, a->decode.lse, a->decode.query_start_loc);
  if (p->op == MLAGATE_OP_PREFILL) after(bug, p, a->prefill.o, a->prefill.lse, a->prefill.cu_seqlens_q);
  return rc;
}

// The inner backend's prepare() (its run() checks that it saw the call).
std::int32_t prepare(void*, const mlagate_problem* p, const mlagate_args* a, char* msg, std::size_t msg_size) {
  return g_inner->prepare ? g_inner->prepare(g_inner->self, p, a, msg, msg_size) : MLAGATE_STATUS_OK;
}

}  // namespace

extern "C" MLAGATE_PLUGIN_EXPORT const mlagate_plugin* mlagate_plugin_entry(void) {
  try {
    const mlagate_plugin* inner = cpu_paged_plugin_table("explore.inner", PlantedFault::kNone);
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
    g_plugin.abi_minor = MLAGATE_PLUGIN_ABI_MINOR;
    g_plugin.struct_size = sizeof(mlagate_plugin);
    g_plugin.backend_struct_size = sizeof(mlagate_backend);
    g_plugin.library = "mlagate_explore_plugin";
    g_plugin.num_backends = kCount;
    g_plugin.backends = g_tables;
    return &g_plugin;
  } catch (...) {
    return nullptr;
  }
}
