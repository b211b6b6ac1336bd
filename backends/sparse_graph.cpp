// persistent_sparse_decode_graph and emulate_sparse_decode_graph
// (backends/backend.h): the sparse decode op's persistent arguments for graph
// mode. Every input of the captured call (q, index rows and their lengths,
// both caches, the sink, the batch's seq_lens, offsets and table rows) lives
// in a buffer allocated at capture and refreshed in place for each replay;
// the outputs are allocated once as NaN and never cleared (host_graph.h, the
// part the dense op's emulation shares).
#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <vector>

#include "backends/backend.h"
#include "backends/host_graph.h"

namespace mlagate {

namespace {

class HostSparseDecodeGraph final : public HostGraph<SparseDecodeGraph, SparseDecodeArgs, &SparseDecodeArgs::o> {
 public:
  HostSparseDecodeGraph(const SparseDecodeArgs& a, SparseDecodeGraphStep step, std::string note)
      : HostGraph(a, std::move(step), std::move(note)),
        q_(a.q.dtype, a.q.shape),
        topk_length_(a.topk_length.size()),
        extra_topk_length_(a.extra_topk_length.size()),
        sink_(a.sink.begin(), a.sink.end()),
        window_(a.window),
        scale_(a.scale) {
    check_sparse_decode_args(a);
    const auto rows = static_cast<std::int64_t>(a.seq_lens.size());
    cache_ = persistent_cache_like(*a.cache, rows);
    if (a.indices.data != nullptr) indices_ = Tensor(a.indices.dtype, a.indices.shape);  // V3.2 (V4: none)
    if (a.extra_cache) {
      extra_cache_ = persistent_cache_like(*a.extra_cache, rows);
      extra_indices_ = Tensor(a.extra_indices.dtype, a.extra_indices.shape);
    }
    run(a, true);
  }

 private:
  template <class T>
  static void refresh(std::span<const T> from, std::vector<T>& into, const char* what) {
    if (from.size() != into.size())
      throw std::invalid_argument(std::string("sparse decode graph: ") + what + " of another size than captured");
    std::copy(from.begin(), from.end(), into.begin());
  }
  static void refresh(const TensorView& from, std::optional<Tensor>& into, const char* what) {
    if (!into) {
      if (from.data != nullptr) throw std::invalid_argument(std::string("sparse decode graph: ") + what + " not captured");
      return;
    }
    if (from.shape != into->shape() || from.dtype != into->dtype())
      throw std::invalid_argument(std::string("sparse decode graph: ") + what + " of other shapes than captured");
    std::memcpy(into->bytes(), from.data, into->nbytes());
  }

  void run(const SparseDecodeArgs& a, bool capture) override {
    check_sparse_decode_args(a);
    if (a.q.shape != q_.shape() || a.q.dtype != q_.dtype() || a.o.shape != out_.shape() || a.window != window_ ||
        a.scale != scale_ || (a.extra_cache != nullptr) != extra_cache_.has_value())
      throw std::invalid_argument("sparse decode graph: replayed with other shapes, window or scale than captured");
    std::memcpy(q_.bytes(), a.q.data, q_.nbytes());
    refresh(a.sink, sink_, "sink");
    refresh(a.seq_lens, seq_lens_, "seq_lens");
    refresh(a.query_start_loc, qsl_, "query_start_loc");
    refresh(a.block_table_rows, rows_, "block_table_rows");
    refresh(a.topk_length, topk_length_, "topk_length");
    refresh(a.extra_topk_length, extra_topk_length_, "extra_topk_length");
    refresh(a.indices, indices_, "indices");
    refresh_persistent_cache(*a.cache, cache_);
    if (a.extra_cache) {
      refresh(a.extra_indices, extra_indices_, "extra_indices");
      refresh_persistent_cache(*a.extra_cache, *extra_cache_);
    }
    SparseDecodeArgs p;
    p.q = q_.view();
    p.cache = &cache_;
    if (indices_) p.indices = indices_->view();
    p.topk_length = topk_length_;
    p.window = window_;
    p.seq_lens = seq_lens_;
    p.query_start_loc = qsl_;
    p.block_table_rows = rows_;
    if (extra_cache_) {
      p.extra_cache = &*extra_cache_;
      p.extra_indices = extra_indices_->view();
    }
    p.extra_topk_length = extra_topk_length_;
    p.sink = sink_;
    p.scale = scale_;
    p.o = out_.view();
    p.lse = lse_.view();
    step_(p, capture);
  }

  Tensor q_;
  std::vector<std::int32_t> topk_length_, extra_topk_length_;
  std::vector<float> sink_;
  int window_;
  double scale_;
  PagedCache cache_;
  std::optional<PagedCache> extra_cache_;
  std::optional<Tensor> indices_, extra_indices_;
};

}  // namespace

std::unique_ptr<SparseDecodeGraph> persistent_sparse_decode_graph(const SparseDecodeArgs& args, SparseDecodeGraphStep step,
                                                                  std::string note) {
  return std::make_unique<HostSparseDecodeGraph>(args, std::move(step), std::move(note));
}

std::unique_ptr<SparseDecodeGraph> emulate_sparse_decode_graph(Backend& b, const SparseDecodeArgs& args) {
  return persistent_sparse_decode_graph(args, [&b](const SparseDecodeArgs& p, bool) { b.sparse_decode(p); },
                                        "host emulation of a captured graph (persistent buffers)");
}

}  // namespace mlagate
