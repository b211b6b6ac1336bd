// The serving-mode planted bugs (planted.h): each wraps a correct CPU backend
// and goes wrong only across calls, the way serving engines drive kernels.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
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
  void sparse_decode(const SparseDecodeArgs& a) override { inner_->sparse_decode(a); }
  void sparse_prefill(const SparsePrefillArgs& a) override { inner_->sparse_prefill(a); }
  void cache_write(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                   std::span<const std::int64_t> slots) override {
    inner_->cache_write(cache, kv_c, k_pe, slots);
  }
  // Captured as the correct CPU backends are (host emulation).
  std::unique_ptr<DecodeGraph> capture_decode(const DecodeArgs& a) override { return emulate_decode_graph(*this, a); }

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

// A kernel that returns early for requests with no key and never writes
// their o_lat rows (the lse it writes: -inf).
class SkipsEmptyRows final : public Wrapper {
 public:
  using Wrapper::Wrapper;
  void decode(const DecodeArgs& a) override {
    const std::int64_t row = a.o_lat.shape.at(1) * a.o_lat.shape.at(2) * 2;  // bytes per token
    std::vector<std::byte> keep(a.o_lat.nbytes());
    std::memcpy(keep.data(), a.o_lat.data, keep.size());
    inner_->decode(a);
    for (std::size_t b = 0; b < a.seq_lens.size(); ++b)
      if (a.seq_lens[b] == 0)
        for (std::int32_t t = a.query_start_loc[b]; t < a.query_start_loc[b + 1]; ++t)
          std::memcpy(static_cast<std::byte*>(a.o_lat.data) + t * row, keep.data() + t * row, static_cast<std::size_t>(row));
  }
};

// vLLM #37442's class: the eager path allocates its output zeroed
// (torch.zeros) around a kernel that skips empty rows, so every plain call is
// right; the captured graph writes into a persistent output allocated once
// (torch.empty) that nothing clears, and padding rows (seq_len 0) keep
// whatever was there (here the allocation's NaN).
class GraphStalePadding final : public Wrapper {
 public:
  GraphStalePadding(std::string name, std::string description, std::unique_ptr<Backend> inner)
      : Wrapper(std::move(name), std::move(description), std::make_unique<SkipsEmptyRows>("kernel", "", std::move(inner))) {}
  void decode(const DecodeArgs& a) override {
    std::memset(a.o_lat.data, 0, a.o_lat.nbytes());
    inner_->decode(a);
  }
  std::unique_ptr<DecodeGraph> capture_decode(const DecodeArgs& a) override { return emulate_decode_graph(*inner_, a); }
};

// vLLM #38719's class: a writer that clamps slot_mapping at 0, so a padding
// token (slot -1) is written into slot 0, another request's key. Plain runs
// never hand a writer slot -1; a captured step's padded batch does.
class GraphPaddingWritesSlot0 final : public Wrapper {
 public:
  using Wrapper::Wrapper;
  void cache_write(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                   std::span<const std::int64_t> slots) override {
    std::vector<std::int64_t> clamped(slots.begin(), slots.end());
    for (std::int64_t& s : clamped) s = std::max<std::int64_t>(s, 0);
    inner_->cache_write(cache, kv_c, k_pe, clamped);
  }
};

// vLLM #35175's class: metadata built at capture and not refreshed in place
// (a replay reads the captured batch's seq_lens): right for the batch it was
// captured with, wrong for every later batch of that size.
class GraphMetadataFixedAtCapture final : public Wrapper {
 public:
  using Wrapper::Wrapper;
  std::unique_ptr<DecodeGraph> capture_decode(const DecodeArgs& a) override {
    class Stale final : public DecodeGraph {
     public:
      Stale(std::unique_ptr<DecodeGraph> g, std::span<const std::int32_t> seq) : g_(std::move(g)), seq_(seq.begin(), seq.end()) {}
      void replay(const DecodeArgs& a) override {
        DecodeArgs b = a;
        b.seq_lens = seq_;
        g_->replay(b);
      }

     private:
      std::unique_ptr<DecodeGraph> g_;
      std::vector<std::int32_t> seq_;
    };
    return std::make_unique<Stale>(emulate_decode_graph(*inner_, a), a.seq_lens);
  }
};

// The sparse decode op's batch-size heuristic: from 4 requests on, the keys
// of each row in splits of 256 merged through their LSEs (cpu.sparse.splitkv),
// below that one pass (cpu.sparse). Both right; the bits change with the batch.
class SparseBatchSizeSplits final : public Wrapper {
 public:
  SparseBatchSizeSplits(std::string name, std::string description, std::unique_ptr<Backend> inner)
      : Wrapper(std::move(name), std::move(description), std::move(inner)), split_(make_cpu_sparse_splitkv()) {}
  void sparse_decode(const SparseDecodeArgs& a) override {
    (a.seq_lens.size() >= 4 ? split_ : inner_)->sparse_decode(a);
  }
  void sparse_prefill(const SparsePrefillArgs& a) override { inner_->sparse_prefill(a); }

 private:
  std::unique_ptr<Backend> split_;
};

// vLLM #35175's class on the sparse op: the captured graph keeps the index
// rows and seq_lens (the window's metadata) of the batch it was captured with.
class SparseGraphMetadataFixedAtCapture final : public Wrapper {
 public:
  using Wrapper::Wrapper;
  std::unique_ptr<SparseDecodeGraph> capture_sparse_decode(const SparseDecodeArgs& a) override {
    class Stale final : public SparseDecodeGraph {
     public:
      Stale(std::unique_ptr<SparseDecodeGraph> g, const SparseDecodeArgs& a)
          : g_(std::move(g)), seq_(a.seq_lens.begin(), a.seq_lens.end()) {
        if (a.indices.data) idx_ = Tensor(a.indices.dtype, a.indices.shape), std::memcpy(idx_->bytes(), a.indices.data, idx_->nbytes());
      }
      void replay(const SparseDecodeArgs& a) override {
        SparseDecodeArgs b = a;
        b.seq_lens = seq_;
        if (idx_) b.indices = idx_->view();
        g_->replay(b);
      }

     private:
      std::unique_ptr<SparseDecodeGraph> g_;
      std::vector<std::int32_t> seq_;
      std::optional<Tensor> idx_;
    };
    return std::make_unique<Stale>(emulate_sparse_decode_graph(*inner_, a), a);
  }
};

// The sparse decode op's lse in base 2, as LseLog2 (the outputs are right).
class SparseLseLog2 final : public Wrapper {
 public:
  using Wrapper::Wrapper;
  void sparse_decode(const SparseDecodeArgs& a) override {
    inner_->sparse_decode(a);
    float* l = a.lse.as<float>();
    for (std::int64_t i = 0; i < a.lse.numel(); ++i) l[i] = static_cast<float>(l[i] / std::log(2.0));
  }
  void sparse_prefill(const SparsePrefillArgs& a) override { inner_->sparse_prefill(a); }
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
    v.push_back(serving_bug<GraphStalePadding>(
        "bug.graph_stale_padding",
        "empty rows (seq_len 0) left unwritten by the kernel: zeroed by the eager path's allocation, NaN in the "
        "captured graph's persistent output (vLLM #37442's class)",
        Status::kNonfinite, "--cuda-graph", make_cpu_paged));
    v.push_back(serving_bug<GraphPaddingWritesSlot0>(
        "bug.graph_padding_writes_slot_0",
        "cache_write clamps slot_mapping at 0: a padded step's padding tokens (slot -1) land in slot 0, another "
        "request's key (vLLM #38719's class); plain runs never pass slot -1",
        Status::kIncorrect, "--cuda-graph", make_cpu_paged));
    v.push_back(serving_bug<GraphMetadataFixedAtCapture>(
        "bug.graph_metadata_fixed_at_capture",
        "the graph replays the seq_lens of the batch it was captured with (vLLM #35175's class): right at the "
        "capture, wrong for the next batch of that size",
        Status::kIncorrect, "--cuda-graph", make_cpu_paged));
    return v;
  }();
  return bugs;
}

PlantedServingBug planted_sparse_batch_bug() {
  return serving_bug<SparseBatchSizeSplits>(
      "bug.sparse_batch_size_splits",
      "sparse decode in splits of 256 keys from 4 requests on, one pass below (a batch-size heuristic): right "
      "answers whose bits change with the batchmates",
      Status::kBatchVariant, "--check batch-invariance", make_cpu_sparse);
}

PlantedServingBug planted_sparse_graph_bug() {
  return serving_bug<SparseGraphMetadataFixedAtCapture>(
      "bug.sparse_graph_metadata_fixed_at_capture",
      "the sparse decode's graph replays the index rows and seq_lens of the batch it was captured with (vLLM "
      "#35175's class): right at the capture, wrong for the next batch of that shape",
      Status::kIncorrect, "--cuda-graph", make_cpu_sparse);
}

PlantedServingBug planted_sparse_lse_bug() {
  return serving_bug<SparseLseLog2>(
      "bug.sparse_lse_log2",
      "sparse decode's lse in base 2 where the natural log is due: the output is right, the LSE merge of DCP "
      "shards is not",
      Status::kIncorrect, "--dcp 2", make_cpu_sparse);
}

}  // namespace mlagate
