// "cpu.merge": vLLM's merge_attn_states on the host with a GPU kernel's
// precision and form, written apart from the reference's merge_row (so a
// mistake on either side shows up as a difference): per (token, head) row, an
// lse of +inf read as -inf (FlashAttention 2's empty row), m = max, each
// side's scale exp(l - m) / sum in fp32 computed first, the output
// prefix * scale_p + suffix * scale_s rounded to the output dtype, lse =
// log(sum) + m. A row empty on both sides (m = -inf) writes output 0 and lse
// -inf instead of the NaN that -inf - -inf gives.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backends/cpu/cpu_backends.h"
#include "cases/encoding.h"

namespace mlagate {
namespace {

float load(const TensorView& t, std::int64_t i) {
  switch (t.dtype) {
    case DType::kBF16: return bf16_to_f32(t.as<std::uint16_t>()[i]);
    case DType::kF16: return f16_to_f32(t.as<std::uint16_t>()[i]);
    default: return t.as<float>()[i];
  }
}

void store(const TensorView& t, std::int64_t i, float v) {
  switch (t.dtype) {
    case DType::kBF16: t.as<std::uint16_t>()[i] = f32_to_bf16(v); break;
    case DType::kF16: t.as<std::uint16_t>()[i] = f32_to_f16(v); break;
    default: t.as<float>()[i] = v;
  }
}

class MergeBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu.merge"; }
  std::string_view description() const override {
    return "merge_states (vLLM's merge_attn_states) on the host: fp32 scales, +inf read as an empty side";
  }
  Capabilities capabilities() const override {
    Capabilities caps = merge_states_capabilities();
    caps.host_only = true;
    return caps;
  }
  void merge_states(const MergeStatesArgs& a) override {
    check_merge_states_args(a);
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    const std::int64_t rows = a.prefix_lse.numel(), D = a.prefix_output.shape[2];
    const float* pl = a.prefix_lse.as<float>();
    const float* sl = a.suffix_lse.as<float>();
    float* ol = a.output_lse.as<float>();
#pragma omp parallel for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      float lp = pl[r], ls = sl[r];
      if (lp == std::numeric_limits<float>::infinity()) lp = kNegInf;
      if (ls == std::numeric_limits<float>::infinity()) ls = kNegInf;
      const float m = std::max(lp, ls);
      if (m == kNegInf) {
        for (std::int64_t x = 0; x < D; ++x) store(a.output, r * D + x, 0.f);
        ol[r] = kNegInf;
        continue;
      }
      const float ep = std::exp(lp - m), es = std::exp(ls - m), sum = ep + es;
      const float sp = ep / sum, ss = es / sum;
      for (std::int64_t x = 0; x < D; ++x) {
        // An empty side's values are never read: its weight is 0, its rows may hold anything.
        const float vp = sp == 0.f ? 0.f : load(a.prefix_output, r * D + x) * sp;
        const float vs = ss == 0.f ? 0.f : load(a.suffix_output, r * D + x) * ss;
        store(a.output, r * D + x, vp + vs);
      }
      ol[r] = std::log(sum) + m;
    }
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_merge() { return std::make_unique<MergeBackend>(); }

}  // namespace mlagate
