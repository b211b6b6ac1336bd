// The layer's glue around a backend's kernels, done by the harness the same
// way for every backend, in a GPU framework's precision (model-dtype inputs,
// fp32 accumulation, model-dtype results): W_UK absorption, up-projection of
// latent keys, W_UV projection of latent outputs, and LSE merging.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cases/case.h"
#include "cases/tensor.h"

namespace mlagate {

// Latent queries of the given tokens: q_lat[i, n, :] = q_nope[t_i, n, :] @ W_UK[:, n, :]^T.
// q_lat: [n, N, L], q_pe: [n, N, R], model dtype.
void absorb_queries(const Case& c, std::span<const int> tokens, Tensor& q_lat, Tensor& q_pe);

// out[i, n*V + v] = o_lat[i, n, :] @ W_UV[:, n, v] written to rows rows[i] of out [T, N*V].
void project_latent_output(const Case& c, const TensorView& o_lat, std::span<const int> rows, Tensor& out);

// A run of latent rows to up-project: rows [first, first + n) of kv_c and
// k_pe into n consecutive K rows [N, P+R] from k and V rows [N, V] from v.
struct RowRun {
  std::int64_t first = 0, n = 0;
  std::uint16_t* k = nullptr;
  std::uint16_t* v = nullptr;
};

// Where the up-projection's arithmetic runs (up_project_kv, KvProjection,
// up_project_kv_known): a projector gets every run of one call at once and
// must write the bits the CPU writes, element for element: K_nope[j, h, p] =
// round16(the fma chain over l = 0..L-1 of kv[j, l] * W_UK[l, h, p], from
// +0, in increasing l), V likewise with W_UV, rounded by encoding.h's
// f32_bits_to_bf16 / f32_bits_to_f16, and k_pe's row copied into every head
// (model-dtype bits verbatim, any other dtype widened and rounded). With the
// same bits wherever a row is projected, KvProjection's sharing of rows
// between the glue, the baseline emulation and the prefill op stays exact
// whichever projector made them. (A NaN result is NaN either way; its sign
// and payload are not promised: x86's depend on the FMA form the compiler
// chose.) Process-wide; null, the default, is the CPU's row-wise GEMM
// (detail::rowwise_gemm). --reference cuda sets reference/cuda's.
using RowProjector = void (*)(const Case& c, const TensorView& kv_c, const TensorView& k_pe,
                              std::span<const RowRun> runs);
void set_row_projector(RowProjector p);
RowProjector row_projector();

// Sets a projector for its lifetime, then puts the previous one back.
class RowProjectorScope {
 public:
  explicit RowProjectorScope(RowProjector p) : previous_(row_projector()) { set_row_projector(p); }
  ~RowProjectorScope() { set_row_projector(previous_); }
  RowProjectorScope(const RowProjectorScope&) = delete;
  RowProjectorScope& operator=(const RowProjectorScope&) = delete;

 private:
  RowProjector previous_;
};

// The runs projected by the process's row projector (the CPU's when none is set).
void project_row_runs(const Case& c, const TensorView& kv_c, const TensorView& k_pe, std::span<const RowRun> runs);

// The CPU's projection of the runs (what a null projector does), whatever
// projector is set: for tests that compare a projector with it.
void project_rows_on_cpu(const Case& c, const TensorView& kv_c, const TensorView& k_pe, std::span<const RowRun> runs);

// Up-projected keys and values of latent rows kv_c [s, L] with k_pe [s, R]:
// k [s, N, P+R] = [kv_c @ W_UK[:, n, :], k_pe], v [s, N, V] = kv_c @ W_UV[:, n, :].
// Every row is projected on its own (detail::rowwise_gemm, or the row
// projector): the same latent row gives the same K and V bits whatever rows
// come with it.
void up_project_kv(const Case& c, const TensorView& kv_c, const TensorView& k_pe, Tensor& k, Tensor& v);


// Running LSE merge of partial attention results in fp32 (vLLM's
// merge_attn_states): acc_o [rows, N, V] / acc_lse [rows, N] absorb part.
// Either side may be an empty row (lse = +-inf, weight 0) without NaN.
void merge_states(std::vector<float>& acc_o, std::vector<float>& acc_lse, const TensorView& part_o,
                  const TensorView& part_lse, std::int64_t rows, std::int64_t heads, std::int64_t dim);

// Tensor rows [first, first+count) of a 2-D model-dtype tensor as a view.
TensorView row_view(const Tensor& t, std::int64_t first, std::int64_t count);

}  // namespace mlagate
