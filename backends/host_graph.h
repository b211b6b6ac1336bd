// What the host emulations of a captured graph share (internal to backends/:
// backend.cpp's decode graph, sparse_graph.cpp's sparse decode graph): the
// step the graph runs, its note, the batch's persistent seq_lens, offsets and
// table rows, and the outputs, allocated once as a caching allocator hands
// them out (torch.empty: never cleared, here NaN, so that a row no replay
// writes shows up) and copied out after every replay.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"

namespace mlagate {

// Graph: the interface (DecodeGraph, SparseDecodeGraph); Args: its arguments;
// Out: their value output (DecodeArgs::o_lat, SparseDecodeArgs::o).
template <class Graph, class Args, TensorView Args::*Out>
class HostGraph : public Graph {
 public:
  using Step = std::function<void(const Args& persistent, bool capture)>;

  void replay(const Args& a) override {
    run(a, false);
    std::memcpy((a.*Out).data, out_.bytes(), out_.nbytes());
    std::memcpy(a.lse.data, lse_.bytes(), lse_.nbytes());
  }
  std::string note() const override { return note_; }

 protected:
  HostGraph(const Args& a, Step step, std::string note)
      : step_(std::move(step)),
        note_(std::move(note)),
        out_((a.*Out).dtype, (a.*Out).shape),
        lse_(a.lse.dtype, a.lse.shape),
        seq_lens_(a.seq_lens.size()),
        qsl_(a.query_start_loc.size()),
        rows_(a.block_table_rows.size()) {
    for (Tensor* t : {&out_, &lse_}) {
      const TensorView v = t->view();
      for (std::int64_t i = 0; i < v.numel(); ++i) v.set(i, std::numeric_limits<double>::quiet_NaN());
    }
  }
  // The arguments copied into the persistent buffers (shapes as captured, else
  // std::invalid_argument), then step_ on them. The derived constructor calls
  // it once with capture = true, as stream capture's warm-up runs the work.
  virtual void run(const Args& a, bool capture) = 0;

  Step step_;
  std::string note_;
  Tensor out_, lse_;
  std::vector<std::int32_t> seq_lens_, qsl_, rows_;
};

}  // namespace mlagate
