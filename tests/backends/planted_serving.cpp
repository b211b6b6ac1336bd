// The serving-mode planted bugs (planted.h): each wraps a correct CPU backend
// and goes wrong only across calls, the way serving engines drive kernels.
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backends.h"
#include "tests/backends/planted.h"

namespace mlagate {
namespace {

// A base for wrappers: everything forwarded to `inner_`.
class Wrapper : public Backend {
 public:
  Wrapper(std::string name, std::string description, std::unique_ptr<Backend> inner)
      : name_(std::move(name)), description_(std::move(description)), inner_(std::move(inner)) {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return description_; }
  Capabilities capabilities() const override { return inner_->capabilities(); }
  Support supports(const CaseSpec& spec, Op op) const override { return inner_->supports(spec, op); }
  void decode(const DecodeArgs& a) override { inner_->decode(a); }
  void prefill(const PrefillArgs& a) override { inner_->prefill(a); }
  void cache_write(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                   std::span<const std::int64_t> slots) override {
    inner_->cache_write(cache, kv_c, k_pe, slots);
  }

 protected:
  std::string name_, description_;
  std::unique_ptr<Backend> inner_;
};

// FlashMLA-style split heuristics: fewer requests, more splits per request
// (max(1, 8 / B)). Every answer is right; the bits depend on the batch.
class BatchSizeSplits final : public Wrapper {
 public:
  using Wrapper::Wrapper;
  void decode(const DecodeArgs& a) override {
    const int b = static_cast<int>(a.seq_lens.size());
    make_cpu_splitkv_forced(std::max(1, 8 / std::max(b, 1)))->decode(a);
  }
};

// The lse in base 2 (log2 of the sum of e^logit): what FlashInfer's kernels
// return natively, handed on without the ln 2 factor. The outputs are right.
class LseLog2 final : public Wrapper {
 public:
  using Wrapper::Wrapper;
  void decode(const DecodeArgs& a) override {
    inner_->decode(a);
    float* l = a.lse.as<float>();
    for (std::int64_t i = 0; i < a.lse.numel(); ++i) l[i] = static_cast<float>(l[i] / std::log(2.0));
  }
};

// A writer that keeps the per-tensor k_scale for the first write into a cache
// and loses it on the writes that follow (TensorRT-LLM #16916's class:
// accuracy decays with generation length). A write continues a sequence when
// the cache is the one written last and the slot written last still holds the
// bytes written there: a fresh copy of a cache never does.
class Fp8ScaleLostAfterStep final : public Wrapper {
 public:
  using Wrapper::Wrapper;
  void cache_write(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                   std::span<const std::int64_t> slots) override {
    const bool per_tensor = cache.kv_dtype == KvCacheDtype::kFp8 || cache.kv_dtype == KvCacheDtype::kFp8E4m3;
    const bool continuing = per_tensor && last_data_ == cache.data.bytes() && last_slot_ >= 0 &&
                            std::memcmp(cache.entry(last_slot_), last_entry_.data(), last_entry_.size()) == 0;
    const float k_scale = cache.k_scale;
    if (continuing) cache.k_scale = 1.f;  // the bug: the scale is gone after the first step
    inner_->cache_write(cache, kv_c, k_pe, slots);
    cache.k_scale = k_scale;
    last_slot_ = -1;
    if (!per_tensor) return;
    for (std::int64_t s : slots)
      if (s >= 0) last_slot_ = s;
    if (last_slot_ < 0) return;
    last_data_ = cache.data.bytes();
    last_entry_.assign(cache.entry(last_slot_), cache.entry(last_slot_) + cache.entry_bytes);
  }

 private:
  const std::byte* last_data_ = nullptr;
  std::int64_t last_slot_ = -1;
  std::vector<std::byte> last_entry_;
};

template <class B>
PlantedServingBug serving_bug(std::string name, std::string description, Status expected, std::string mode,
                              std::function<std::unique_ptr<Backend>()> inner,
                              std::function<bool(const CaseSpec&)> exposed_by = {}) {
  PlantedBug b{name, description, expected,
               [=] { return std::unique_ptr<Backend>(std::make_unique<B>(name, description, inner())); },
               std::move(exposed_by)};
  return {std::move(b), std::move(mode)};
}

}  // namespace

const std::vector<PlantedServingBug>& planted_serving_bugs() {
  static const std::vector<PlantedServingBug> bugs = [] {
    std::vector<PlantedServingBug> v;
    v.push_back(serving_bug<BatchSizeSplits>(
        "bug.batch_size_splits",
        "split-KV decode with max(1, 8 / batch size) splits per request (FlashMLA #212's class): right "
        "answers whose bits change with the batchmates",
        Status::kBatchVariant, "--check batch-invariance", make_cpu_paged));
    v.push_back(serving_bug<LseLog2>(
        "bug.lse_log2",
        "decode's lse in base 2 (log2 sum 2^(logit log2 e)) where the natural log is due (vLLM #47079's "
        "class): the output is right, the LSE merge of DCP shards is not",
        Status::kIncorrect, "--dcp 2", make_cpu_paged));
    v.push_back(serving_bug<Fp8ScaleLostAfterStep>(
        "bug.fp8_scale_lost_after_step",
        "cache_write keeps k_scale for the first write into a cache and drops it for the writes after it "
        "(TensorRT-LLM #16916's class): one write per record passes, a decode loop decays",
        Status::kIncorrect, "--steps 8", make_cpu_paged, [](const CaseSpec& c) {
          return (c.kv_cache_dtype == KvCacheDtype::kFp8 || c.kv_cache_dtype == KvCacheDtype::kFp8E4m3) &&
                 c.k_scale != 1.f;
        }));
    return v;
  }();
  return bugs;
}

}  // namespace mlagate
