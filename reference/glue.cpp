// Glue math in fp32 over model-dtype inputs (the row-wise GEMM's fma chains);
// every result is rounded to the model dtype exactly where a GPU framework
// would store it.
#include "reference/glue.h"
#include "reference/merge_reference.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "cases/encoding.h"
#include "reference/detail/rowwise_gemm.h"
#include "reference/detail/widen.h"

namespace mlagate {

namespace {

// Widens one 16-bit model-dtype value to fp32 (hot loops avoid TensorView::get).
using Load16 = float (*)(std::uint16_t);
Load16 loader(DType d) { return d == DType::kBF16 ? bf16_to_f32 : f16_to_f32; }

}  // namespace

TensorView row_view(const Tensor& t, std::int64_t first, std::int64_t count) {
  Shape s = t.shape();
  std::int64_t row = 1;
  for (std::size_t i = 1; i < s.size(); ++i) row *= s[i];
  s[0] = count;
  return {t.dtype(), s, const_cast<std::byte*>(t.bytes()) + first * row * static_cast<std::int64_t>(dtype_size(t.dtype()))};
}

// Both projections below widen, per head, only that head's slice of the
// weight and of the activations, into buffers of the thread that owns the
// head: no whole-tensor float copies (a TP 1 weight is 8M elements, and
// allocating and zeroing such copies on every call cost more than the GEMMs).
// The products are the row-wise GEMM's (detail/rowwise_gemm.h): every element
// one fma chain in order of depth, the same bits on any machine. Until
// 2026-12-04 they were Eigen's, whose fp32 bits differ between an AVX2 and an
// AVX-512 build: an AVX2 machine's absorbed queries differed from this VM's
// in 11 of the vllm and sparse suites' 100 input sets (bf16 bytes), so a
// backend's inputs, its records and a golden file's stored queries did.
void absorb_queries(const Case& c, std::span<const int> tokens, Tensor& q_lat, Tensor& q_pe) {
  const Dims& d = c.spec.dims;
  const std::int64_t N = c.spec.num_heads(), L = d.kv_lora_rank, P = d.nope_dim, R = d.rope_dim;
  const std::int64_t n = static_cast<std::int64_t>(tokens.size());
  q_lat = Tensor::for_overwrite(c.spec.dtype, {n, N, L});  // every element written below
  q_pe = Tensor::for_overwrite(c.spec.dtype, {n, N, R});
  const TensorView w = c.w_uk.view();  // [L, N, P]
  const bool bf16 = c.spec.dtype == DType::kBF16;
  const Load16 load = loader(c.spec.dtype);
  const std::uint16_t* q = c.q.data<std::uint16_t>();
  std::uint16_t* lat = q_lat.data<std::uint16_t>();
  std::uint16_t* pe = q_pe.data<std::uint16_t>();
  const std::int64_t QD = P + R;
#pragma omp parallel
  {
    std::vector<float> qn(static_cast<std::size_t>(n * P)), wh(static_cast<std::size_t>(L * P));
#pragma omp for schedule(static)
    for (std::int64_t h = 0; h < N; ++h) {
      for (std::int64_t i = 0; i < n; ++i) {
        for (std::int64_t k = 0; k < P; ++k) qn[i * P + k] = load(q[(tokens[i] * N + h) * QD + k]);
        std::copy_n(q + (tokens[i] * N + h) * QD + P, R, pe + (i * N + h) * R);
      }
      for (std::int64_t l = 0; l < L; ++l) detail::widen_any(w, (l * N + h) * P, P, wh.data() + l * P);
      // b [P, L]: row k is W_UK[:, h, k].
      const detail::PackedPanels wt(P, L, [&](std::int64_t k, float* dst) {
        for (std::int64_t l = 0; l < L; ++l) dst[l] = wh[l * P + k];
      });
      detail::rowwise_gemm(qn.data(), n, P, wt,
                           [&](std::int64_t r0, std::int64_t nr, std::int64_t c0, std::int64_t nc, const float* t) {
                             for (std::int64_t i = 0; i < nr; ++i)
                               f32_run_to_16bit(t + i * detail::kPanelCols, nc, bf16, lat + ((r0 + i) * N + h) * L + c0);
                           });
    }
  }
}

void project_latent_output(const Case& c, const TensorView& o_lat, std::span<const int> rows, Tensor& out) {
  const Dims& d = c.spec.dims;
  const std::int64_t N = c.spec.num_heads(), L = d.kv_lora_rank, V = d.v_head_dim;
  const std::int64_t n = static_cast<std::int64_t>(rows.size());
  const TensorView w = c.w_uv.view();  // [L, N, V]
  const bool bf16 = c.spec.dtype == DType::kBF16;
  std::uint16_t* dst = out.data<std::uint16_t>();
#pragma omp parallel
  {
    std::vector<float> o(static_cast<std::size_t>(n * L));
#pragma omp for schedule(static)
    for (std::int64_t h = 0; h < N; ++h) {
      // o_lat [n, N, L] in any dtype the backend wrote: widened exactly.
      for (std::int64_t i = 0; i < n; ++i) detail::widen_any(o_lat, (i * N + h) * L, L, o.data() + i * L);
      const detail::PackedPanels wh(L, V, [&](std::int64_t l, float* row) { detail::widen_any(w, (l * N + h) * V, V, row); });
      detail::rowwise_gemm(o.data(), n, L, wh,
                           [&](std::int64_t r0, std::int64_t nr, std::int64_t c0, std::int64_t nc, const float* t) {
                             for (std::int64_t i = 0; i < nr; ++i)
                               f32_run_to_16bit(t + i * detail::kPanelCols, nc, bf16, dst + rows[r0 + i] * N * V + h * V + c0);
                           });
    }
  }
}

namespace {

// A weight [L, N, W] as packed panels of its [L, N*W] matrix.
detail::PackedPanels pack_weight(const Tensor& w) {
  const std::int64_t L = w.dim(0), cols = w.dim(1) * w.dim(2);
  const TensorView wv = w.view();
  return detail::PackedPanels(L, cols, [&](std::int64_t l, float* dst) { detail::widen_any(wv, l * cols, cols, dst); });
}

// Rows [first, first + n) of kv_c / k_pe up-projected into consecutive K rows
// [N, P+R] from k_out and V rows [N, V] from v_out, every row by the row-wise
// GEMM: its bits do not depend on which rows are projected together.
void project_rows(const Case& c, const TensorView& kv_c, const TensorView& k_pe, std::int64_t first, std::int64_t n,
                  const detail::PackedPanels& wk, const detail::PackedPanels& wv, std::uint16_t* k_out,
                  std::uint16_t* v_out) {
  const Dims& d = c.spec.dims;
  const std::int64_t N = c.spec.num_heads(), L = d.kv_lora_rank, P = d.nope_dim, R = d.rope_dim, V = d.v_head_dim;
  const bool bf16 = c.spec.dtype == DType::kBF16;
  // Indexed by the input row j: row `first` lands at k_out.
  std::uint16_t* kt = k_out - first * N * (P + R);
  std::uint16_t* vt = v_out - first * N * V;
  const bool pe16 = k_pe.dtype == c.spec.dtype;  // model dtype bits: copied verbatim
  const std::int64_t blocks = (n + detail::kGemmBlockRows - 1) / detail::kGemmBlockRows;
#pragma omp parallel
  {
    std::vector<float> a(static_cast<std::size_t>(detail::kGemmBlockRows * L));
    std::vector<float> pe_f(static_cast<std::size_t>(R));
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t j0 = first + b * detail::kGemmBlockRows;
      const std::int64_t rows = std::min(detail::kGemmBlockRows, first + n - j0);
      detail::widen_any(kv_c, j0 * L, rows * L, a.data());
      // A panel's columns [col0, col0 + ncols) of head-major [N, W] rows, rounded
      // into dst: row j's head h holds its W values from (j * N + h) * head_stride.
      const auto sink = [&](std::uint16_t* dst, std::int64_t W, std::int64_t head_stride) {
        return [&, dst, W, head_stride](std::int64_t row0, std::int64_t nrows, std::int64_t col0, std::int64_t ncols,
                                        const float* tile) {
          for (std::int64_t i = 0; i < nrows; ++i) {
            const std::int64_t j = j0 + row0 + i;
            for (std::int64_t col = col0; col < col0 + ncols;) {
              const std::int64_t h = col / W, w = col % W, run = std::min(col0 + ncols - col, W - w);
              f32_run_to_16bit(tile + i * detail::kPanelCols + (col - col0), run, bf16,
                        dst + (j * N + h) * head_stride + w);
              col += run;
            }
          }
        };
      };
      detail::rowwise_gemm(a.data(), rows, L, wk, sink(kt, P, P + R));
      detail::rowwise_gemm(a.data(), rows, L, wv, sink(vt, V, V));
      for (std::int64_t j = j0; j < j0 + rows; ++j) {
        if (pe16) {
          const auto* pe = static_cast<const std::uint16_t*>(k_pe.data) + j * R;
          for (std::int64_t h = 0; h < N; ++h) std::copy_n(pe, R, kt + (j * N + h) * (P + R) + P);
        } else {
          detail::widen_any(k_pe, j * R, R, pe_f.data());
          std::vector<std::uint16_t> pe(static_cast<std::size_t>(R));
          f32_run_to_16bit(pe_f.data(), R, bf16, pe.data());
          for (std::int64_t h = 0; h < N; ++h) std::copy_n(pe.data(), R, kt + (j * N + h) * (P + R) + P);
        }
      }
    }
  }
}

std::atomic<RowProjector> g_row_projector{nullptr};

}  // namespace

// The runs with rows, projected by the row projector if one is set.
void project_row_runs(const Case& c, const TensorView& kv_c, const TensorView& k_pe, std::span<const RowRun> runs) {
  std::vector<RowRun> todo;
  for (const RowRun& r : runs)
    if (r.n > 0) todo.push_back(r);
  if (todo.empty()) return;
  if (const RowProjector p = g_row_projector.load()) return p(c, kv_c, k_pe, todo);
  project_rows_on_cpu(c, kv_c, k_pe, todo);
}

void set_row_projector(RowProjector p) { g_row_projector.store(p); }
RowProjector row_projector() { return g_row_projector.load(); }

void project_rows_on_cpu(const Case& c, const TensorView& kv_c, const TensorView& k_pe, std::span<const RowRun> runs) {
  if (std::none_of(runs.begin(), runs.end(), [](const RowRun& r) { return r.n > 0; })) return;
  const detail::PackedPanels wk = pack_weight(c.w_uk), wv = pack_weight(c.w_uv);
  for (const RowRun& r : runs)
    if (r.n > 0) project_rows(c, kv_c, k_pe, r.first, r.n, wk, wv, r.k, r.v);
}

void up_project_kv(const Case& c, const TensorView& kv_c, const TensorView& k_pe, Tensor& k, Tensor& v) {
  const Dims& d = c.spec.dims;
  const std::int64_t N = c.spec.num_heads(), P = d.nope_dim, R = d.rope_dim, V = d.v_head_dim;
  const std::int64_t s = kv_c.shape.at(0);
  // Every element is written below.
  k = Tensor::for_overwrite(c.spec.dtype, {s, N, P + R});
  v = Tensor::for_overwrite(c.spec.dtype, {s, N, V});
  const RowRun run{0, s, k.data<std::uint16_t>(), v.data<std::uint16_t>()};
  project_row_runs(c, kv_c, k_pe, {&run, 1});
}


void merge_states(std::vector<float>& acc_o, std::vector<float>& acc_lse, const TensorView& part_o,
                  const TensorView& part_lse, std::int64_t rows, std::int64_t heads, std::int64_t dim) {
  // One row of part_o as floats (fp32 or model-dtype values: exact).
  std::vector<float> row(static_cast<std::size_t>(dim));
  for (std::int64_t r = 0; r < rows * heads; ++r) {
    const float la = acc_lse[static_cast<std::size_t>(r)];
    const float lb = static_cast<float>(part_lse.get(r));
    // The merge_states op's core (reference/merge_reference.h), in fp32; an
    // empty side (+-inf) is never read, so its row is not widened.
    if (!std::isinf(lb)) detail::widen_any(part_o, r * dim, dim, row.data());
    float* acc = acc_o.data() + r * dim;
    acc_lse[static_cast<std::size_t>(r)] = merge_row<float>(la, lb, acc, row.data(), acc, dim);
  }
}

}  // namespace mlagate
