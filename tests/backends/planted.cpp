// The planted-bug backends: cpu.paged with one deliberate fault each, either
// planted inside the kernel (detail::KernelFaults) or applied to its outputs.
// Production code paths are untouched; only these wrappers ask for faults.
#include "tests/backends/planted.h"

#include <algorithm>
#include <vector>

#include "backends/cpu/attention_core.h"
#include "cases/encoding.h"

namespace mlagate {
namespace {

enum class Bug { kCausalOffByOne, kScale1Pct, kNullBlockLastToken, kHeadsSwapped, kOneNaN, kLseWrongAxis };

detail::KernelFaults faults_for(Bug bug) {
  detail::KernelFaults f;
  if (bug == Bug::kCausalOffByOne) f.extra_visible_keys = 1;
  if (bug == Bug::kNullBlockLastToken) f.last_key_from_null_block = true;
  return f;
}

class PlantedBackend final : public Backend {
 public:
  PlantedBackend(std::string name, std::string description, Bug bug)
      : name_(std::move(name)), description_(std::move(description)), bug_(bug),
        inner_(detail::make_cpu_paged_with_faults(faults_for(bug))) {}

  std::string_view name() const override { return name_; }
  std::string_view description() const override { return description_; }
  Capabilities capabilities() const override { return inner_->capabilities(); }
  Support supports(const CaseSpec& spec, Op op) const override { return inner_->supports(spec, op); }

  void decode(const DecodeArgs& args) override {
    DecodeArgs a = args;
    if (bug_ == Bug::kScale1Pct) a.scale *= 1.01;
    inner_->decode(a);
    corrupt(a.o_lat, a.lse);
  }
  void prefill(const PrefillArgs& args) override {
    PrefillArgs a = args;
    if (bug_ == Bug::kScale1Pct) a.scale *= 1.01;
    inner_->prefill(a);
    corrupt(a.o, a.lse);
  }

 private:
  // o: [T, N, W] 16-bit model dtype; lse: [T, N] float32.
  void corrupt(const TensorView& o, const TensorView& lse) const {
    const std::int64_t t = o.shape.at(0), n = o.shape.at(1), w = o.shape.at(2);
    switch (bug_) {
      case Bug::kHeadsSwapped: {
        if (n < 2) return;
        auto* p = o.as<std::uint16_t>();
        for (std::int64_t i = 0; i < t; ++i) std::swap_ranges(p + i * n * w, p + i * n * w + w, p + (i * n + 1) * w);
        return;
      }
      case Bug::kOneNaN:
        if (o.numel() > 0) o.as<std::uint16_t>()[0] = o.dtype == DType::kBF16 ? kBF16QuietNaN : kF16QuietNaN;
        return;
      case Bug::kLseWrongAxis: {
        float* p = lse.as<float>();
        const std::vector<float> right(p, p + t * n);
        for (std::int64_t i = 0; i < t; ++i)
          for (std::int64_t h = 0; h < n; ++h) p[h * t + i] = right[i * n + h];
        return;
      }
      default:
        return;
    }
  }

  std::string name_;
  std::string description_;
  Bug bug_;
  std::unique_ptr<Backend> inner_;
};

}  // namespace

const std::vector<PlantedBug>& planted_bugs() {
  static const std::vector<PlantedBug> bugs = [] {
    std::vector<PlantedBug> v;
    auto add = [&v](std::string name, std::string description, Status expected, Bug bug) {
      v.push_back({name, description, expected,
                   [=] { return std::make_unique<PlantedBackend>(name, description, bug); }});
    };
    add("bug.causal_off_by_one",
        "each query also sees the key after its causal limit (the next new token); "
        "invisible when every request has one query token",
        Status::kIncorrect, Bug::kCausalOffByOne);
    add("bug.scale_1pct", "softmax scale multiplied by 1.01", Status::kIncorrect, Bug::kScale1Pct);
    add("bug.null_block_last_token",
        "decode reads the last key of each request from block 0 (the poisoned null block) "
        "instead of its own block",
        Status::kNonfinite, Bug::kNullBlockLastToken);
    add("bug.heads_swapped", "heads 0 and 1 of the output exchanged", Status::kIncorrect, Bug::kHeadsSwapped);
    add("bug.one_nan", "output element (token 0, head 0, dim 0) set to NaN", Status::kNonfinite, Bug::kOneNaN);
    add("bug.lse_wrong_axis",
        "lse written as [N, T] into the [T, N] buffer; invisible when T == 1",
        Status::kIncorrect, Bug::kLseWrongAxis);
    return v;
  }();
  return bugs;
}

}  // namespace mlagate
