// The case's own kv rows up-projected once (KvProjection): a store of rows
// the layer op's glue, the baseline emulation's prefill form, the kernel-level
// prefill op and golden export share, so a row's K and V are computed once.
// The layer op module owns the run's instance (harness/run/ops/layer/memo.h);
// reference/glue.h stays stateless math.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "cases/case.h"
#include "cases/tensor.h"
#include "reference/glue.h"

namespace mlagate {

// The case's own kv rows up-projected once, from the latent rows the
// reference reads (kv_c, or for fp8 caches the cache's dequantized values in
// the model dtype). Shared by the layer glue, the baseline emulation's prefill
// form and the kernel-level prefill op: a row is held wherever it was first
// projected (a piece of its own, or a row of the glue's K and V for a
// backend, offered here), so a TP 1 case's TFLOP of up-projection and its
// gigabytes are spent once.
class KvProjection {
 public:
  explicit KvProjection(const Case& c);  // the case must outlive it
  // Projects the rows of these requests not held yet.
  void ensure(std::span<const int> requests);
  bool has(int request) const;  // every row of the request held
  const Tensor& kv() const { return kv_; }  // [S, L] model dtype: the latent rows projected
  const Tensor& pe() const { return pe_; }  // [S, R]
  // Row r's K [N, P+R] and V [N, V] (model dtype), null while not held.
  const std::uint16_t* k_row(std::int64_t r) const { return k_rows_[static_cast<std::size_t>(r)]; }
  const std::uint16_t* v_row(std::int64_t r) const { return v_rows_[static_cast<std::size_t>(r)]; }
  // Every row contiguous, K [S, N, P+R] and V [S, N, V] (the kernel-level
  // prefill op's inputs): held rows copied, the others projected into place.
  const Tensor& k_all();
  const Tensor& v_all();
  // Rows j of (k, v), computed by up_project_kv from latent rows kv[j], pe[j]
  // that are the case's row rows[j]: those not held yet whose latent bits
  // match the case's are held from now on (sharing k and v). Returns how many.
  std::size_t offer(const TensorView& kv, const TensorView& pe, std::span<const std::int64_t> rows,
             const std::shared_ptr<const Tensor>& k, const std::shared_ptr<const Tensor>& v);
  // The rows held in k's storage are dropped (a backend wrote into it); k_all()'s
  // tensors among them are made again on next use.
  void withdraw(const Tensor* k);

 private:
  struct Piece {
    std::shared_ptr<const Tensor> k, v;
  };
  void hold(std::int64_t r, int piece, std::int64_t row_in_piece);
  // Appends the runs [first, n) of rows in [from, to) not held.
  void unheld_runs(std::int64_t from, std::int64_t to, std::vector<std::pair<std::int64_t, std::int64_t>>& runs) const;
  // Rows [first, first + n) projected into k and v from their row `at`
  // (null k: a piece of their own).
  struct PieceRun {
    std::int64_t first = 0, n = 0;
    std::shared_ptr<Tensor> k, v;
    std::int64_t at = 0;
  };
  // Projects the runs in one call (one upload of the weights for a GPU
  // projector), then holds their rows.
  void project_pieces(std::vector<PieceRun>& runs);
  const Case* c_;
  Tensor kv_, pe_;
  std::vector<Piece> pieces_;
  std::vector<const std::uint16_t*> k_rows_, v_rows_;
  std::vector<int> piece_of_;  // row -> index into pieces_, -1
  std::shared_ptr<Tensor> k_all_, v_all_;
};

// up_project_kv(c, kv_c, k_pe) where row j of kv_c is row rows[j] of the
// case's kv (-1: none): rows whose latent and rope bits equal known's (of a
// projected request) are copied from it, the others projected. The result is
// the bits up_project_kv gives.
void up_project_kv_known(const Case& c, const TensorView& kv_c, const TensorView& k_pe,
                         std::span<const std::int64_t> rows, const KvProjection& known, Tensor& k, Tensor& v);

}  // namespace mlagate
