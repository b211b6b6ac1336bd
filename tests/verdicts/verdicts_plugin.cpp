// Test-only planted-bug backends for the verdicts (harness/verdicts/VERDICTS.md),
// one plugin library the real binary loads with --plugin (triage and explore
// rerun cases in processes of their own). Each wraps cpu.paged (the
// tests/plugin adapter) with one real bug class, so that triage must name its
// class and explore must find one cause per bug:
//   verdicts.reads_one_past  the decode reads one key past each request's
//                            seq_len (a bound off by one): the key comes from
//                            the poisoned tail or the null block, so the
//                            verdict follows the poison (class "reads memory
//                            it must not")
//   verdicts.kscale_bf16     fp8 / fp8_e4m3 caches dequantized with k_scale
//                            rounded to bf16, FlashInfer's MLA kernels' way
//                            (class "scale rounded to the model dtype")
//   verdicts.lse_rounded     the decode's lse is the log of a softmax normalizer
//                            rounded to the model dtype, FlashInfer FA2's way
//                            (class "model-dtype precision": 8x less error in fp16)
//   verdicts.tile16 and      heads past the last full tile of 16 (more than
//   verdicts.tile16_graph    16, not a multiple of 16) get the output of the
//                            head 16 before them; the two are one kernel (an
//                            adapter and its cudagraph variant): one cause
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cases/encoding.h"
#include "mlagate/plugin.h"
#include "tests/plugin/cpu_paged_plugin.h"

namespace {

enum class Bug { kReadsOnePast, kKscaleBf16, kLseRounded, kTile16 };

struct Planted {
  const char* name;
  const char* description;
  Bug bug;
};

constexpr Planted kPlanted[] = {
    {"verdicts.reads_one_past", "cpu.paged whose decode reads one key past each request's seq_len", Bug::kReadsOnePast},
    {"verdicts.kscale_bf16", "cpu.paged that dequantizes fp8 caches with k_scale rounded to bf16", Bug::kKscaleBf16},
    {"verdicts.lse_rounded", "cpu.paged whose decode lse comes from a normalizer rounded to the model dtype", Bug::kLseRounded},
    {"verdicts.tile16", "cpu.paged whose heads past the last full tile of 16 repeat the previous tile's", Bug::kTile16},
    {"verdicts.tile16_graph", "verdicts.tile16's kernel called as its CUDA-graph variant would (the same bug)", Bug::kTile16},
};
constexpr int kCount = sizeof(kPlanted) / sizeof(kPlanted[0]);

const mlagate_backend* g_inner = nullptr;
mlagate_backend g_tables[kCount];
mlagate_plugin g_plugin;

void repeat_heads(const mlagate_problem* p, const DLTensor& t) {
  if (p->num_heads <= 16 || p->num_heads % 16 == 0) return;
  const std::int64_t width = t.ndim == 3 ? t.shape[2] : 1, elem = t.dtype.bits / 8, heads = t.shape[1];
  char* data = static_cast<char*>(t.data);
  for (std::int64_t tok = 0; tok < t.shape[0]; ++tok)
    for (std::int64_t h = p->num_heads / 16 * 16; h < p->num_heads; ++h)
      std::memcpy(data + (tok * heads + h) * width * elem, data + (tok * heads + h - 16) * width * elem,
                  static_cast<std::size_t>(width * elem));
}

std::int32_t call_inner(const mlagate_problem* p, const mlagate_args* a, char* msg, std::size_t msg_size) {
  if (g_inner->prepare) {
    const std::int32_t rc = g_inner->prepare(g_inner->self, p, a, msg, msg_size);
    if (rc != MLAGATE_STATUS_OK) return rc;
  }
  return g_inner->run(g_inner->self, p, a, msg, msg_size);
}

std::int32_t run(void* self, const mlagate_problem* p, const mlagate_args* a, char* msg, std::size_t msg_size) {
  const Bug bug = static_cast<const Planted*>(self)->bug;
  mlagate_problem prob = *p;
  mlagate_args copy = *a;
  std::vector<std::int32_t> seq;
  if (bug == Bug::kReadsOnePast && p->op == MLAGATE_OP_DECODE) {
    // One key more wherever the request's table row has room for it.
    const DLTensor& s = a->decode.seq_lens;
    const std::int64_t width = a->decode.block_table.shape[1];
    seq.assign(static_cast<const std::int32_t*>(s.data), static_cast<const std::int32_t*>(s.data) + s.shape[0]);
    for (std::int32_t& v : seq)
      if (v > 0 && (v + 1 + p->block_size - 1) / p->block_size <= width) ++v;
    copy.decode.seq_lens.data = seq.data();
    prob.seq_lens = seq.data();
  }
  if (bug == Bug::kKscaleBf16) prob.k_scale = mlagate::round_to_16bit(p->k_scale, true);
  const std::int32_t rc = call_inner(&prob, &copy, msg, msg_size);
  if (rc == MLAGATE_STATUS_OK && bug == Bug::kLseRounded && p->op == MLAGATE_OP_DECODE) {
    // lse = m + log(s) with s = sum exp(logit - m) in [1, ...): s rounded to the model dtype.
    const DLTensor& l = a->decode.lse;
    float* lse = static_cast<float*>(l.data);
    const std::int64_t n = l.shape[0] * l.shape[1];
    for (std::int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(lse[i])) continue;
      const double m = std::floor(lse[i]);
      const float s = static_cast<float>(std::exp(static_cast<double>(lse[i]) - m));
      lse[i] = static_cast<float>(m + std::log(static_cast<double>(mlagate::round_to_16bit(s, p->dtype == MLAGATE_DTYPE_BF16))));
    }
  }
  if (rc != MLAGATE_STATUS_OK || bug != Bug::kTile16) return rc;
  if (p->op == MLAGATE_OP_DECODE) repeat_heads(p, a->decode.o_lat), repeat_heads(p, a->decode.lse);
  if (p->op == MLAGATE_OP_PREFILL) repeat_heads(p, a->prefill.o), repeat_heads(p, a->prefill.lse);
  return rc;
}

// The inner backend's prepare() is made inside run() with the call's own
// (maybe planted) arguments, where its schedule check expects it.
std::int32_t prepare(void*, const mlagate_problem*, const mlagate_args*, char*, std::size_t) { return MLAGATE_STATUS_OK; }

}  // namespace

extern "C" MLAGATE_PLUGIN_EXPORT const mlagate_plugin* mlagate_plugin_entry(void) {
  try {
    const mlagate_plugin* inner = cpu_paged_plugin_table("verdicts.inner", PlantedFault::kNone);
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
      g_tables[i].graph_ops = 0;  // prepare() is made inside run(): no capture
    }
    g_plugin.abi_version = MLAGATE_PLUGIN_ABI_VERSION;
    g_plugin.abi_minor = MLAGATE_PLUGIN_ABI_MINOR;
    g_plugin.struct_size = sizeof(mlagate_plugin);
    g_plugin.backend_struct_size = sizeof(mlagate_backend);
    g_plugin.library = "mlagate_verdicts_plugin";
    g_plugin.num_backends = kCount;
    g_plugin.backends = g_tables;
    return &g_plugin;
  } catch (...) {
    return nullptr;
  }
}
