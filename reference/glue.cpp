// Glue math with Eigen in fp32 over model-dtype inputs; every result is rounded
// to the model dtype exactly where a GPU framework would store it.
#include "reference/glue.h"
#include "reference/merge_reference.h"

#include <Eigen/Dense>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "cases/encoding.h"
#include "reference/detail/rowwise_gemm.h"
#include "reference/detail/widen.h"

namespace mlagate {

namespace {

using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Stride = Eigen::OuterStride<>;

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
// The products are Eigen's over the same values, so the same bits, except for
// a single token at TP 1: Eigen's matrix-vector kernel blocks by the weight's
// row stride, which was 64 KiB for the old strided view at TP 1 and is the
// head's width now, as at every other TP (a last-bit change, 2026-11-26).
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
    MatF qn(n, P), wh(L, P);
#pragma omp for schedule(static)
    for (std::int64_t h = 0; h < N; ++h) {
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t k = 0; k < P; ++k) qn(i, k) = load(q[(tokens[i] * N + h) * QD + k]);
      for (std::int64_t l = 0; l < L; ++l) detail::widen_any(w, (l * N + h) * P, P, wh.data() + l * P);
      const MatF ql = qn * wh.transpose();  // [n, L]
      for (std::int64_t i = 0; i < n; ++i) {
        f32_run_to_16bit(ql.data() + i * L, L, bf16, lat + (i * N + h) * L);
        std::copy_n(q + (tokens[i] * N + h) * QD + P, R, pe + (i * N + h) * R);
      }
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
    MatF o(n, L), wh(L, V);
#pragma omp for schedule(static)
    for (std::int64_t h = 0; h < N; ++h) {
      // o_lat [n, N, L] in any dtype the backend wrote: widened exactly.
      for (std::int64_t i = 0; i < n; ++i) detail::widen_any(o_lat, (i * N + h) * L, L, o.data() + i * L);
      for (std::int64_t l = 0; l < L; ++l) detail::widen_any(w, (l * N + h) * V, V, wh.data() + l * V);
      const MatF r = o * wh;  // [n, V]
      for (std::int64_t i = 0; i < n; ++i) f32_run_to_16bit(r.data() + i * V, V, bf16, dst + rows[i] * N * V + h * V);
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

// The runs with rows, projected by the row projector if one is set.
void project_runs(const Case& c, const TensorView& kv_c, const TensorView& k_pe, std::span<const RowRun> runs) {
  std::vector<RowRun> todo;
  for (const RowRun& r : runs)
    if (r.n > 0) todo.push_back(r);
  if (todo.empty()) return;
  if (const RowProjector p = g_row_projector.load()) return p(c, kv_c, k_pe, todo);
  project_rows_on_cpu(c, kv_c, k_pe, todo);
}

}  // namespace

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
  project_runs(c, kv_c, k_pe, {&run, 1});
}

KvProjection::KvProjection(const Case& c) : c_(&c) {
  if (c.kv_c_cache.empty()) {
    kv_ = c.kv_c;
    pe_ = c.k_pe;
  } else {
    // fp8 caches: the latent as read back from the cache, in the model dtype.
    const bool bf16 = c.spec.dtype == DType::kBF16;
    kv_ = Tensor::for_overwrite(c.spec.dtype, c.kv_c_cache.shape());
    pe_ = Tensor::for_overwrite(c.spec.dtype, c.k_pe_cache.shape());
    f32_run_to_16bit(c.kv_c_cache.data<float>(), c.kv_c_cache.numel(), bf16, kv_.data<std::uint16_t>());
    f32_run_to_16bit(c.k_pe_cache.data<float>(), c.k_pe_cache.numel(), bf16, pe_.data<std::uint16_t>());
  }
  k_rows_.assign(static_cast<std::size_t>(c.num_kv_tokens), nullptr);
  v_rows_.assign(static_cast<std::size_t>(c.num_kv_tokens), nullptr);
  piece_of_.assign(static_cast<std::size_t>(c.num_kv_tokens), -1);
}

void KvProjection::hold(std::int64_t r, int piece, std::int64_t row_in_piece) {
  const Dims& d = c_->spec.dims;
  const std::int64_t N = c_->spec.num_heads(), P = d.nope_dim, R = d.rope_dim, V = d.v_head_dim;
  const Piece& p = pieces_[static_cast<std::size_t>(piece)];
  k_rows_[static_cast<std::size_t>(r)] = p.k->data<std::uint16_t>() + row_in_piece * N * (P + R);
  v_rows_[static_cast<std::size_t>(r)] = p.v->data<std::uint16_t>() + row_in_piece * N * V;
  piece_of_[static_cast<std::size_t>(r)] = piece;
}

void KvProjection::project_pieces(std::vector<PieceRun>& runs) {
  const Dims& d = c_->spec.dims;
  const std::int64_t N = c_->spec.num_heads(), P = d.nope_dim, R = d.rope_dim, V = d.v_head_dim;
  std::vector<RowRun> rows;
  rows.reserve(runs.size());
  for (PieceRun& p : runs) {
    if (!p.k) {  // a piece of its own
      p.k = std::make_shared<Tensor>(Tensor::for_overwrite(c_->spec.dtype, {p.n, N, P + R}));
      p.v = std::make_shared<Tensor>(Tensor::for_overwrite(c_->spec.dtype, {p.n, N, V}));
      p.at = 0;
    }
    // Row `first` of the latent lands at row `at` of the piece.
    rows.push_back({p.first, p.n, p.k->data<std::uint16_t>() + p.at * N * (P + R),
                    p.v->data<std::uint16_t>() + p.at * N * V});
  }
  project_runs(*c_, kv_.view(), pe_.view(), rows);
  // Held only once projected: a projection that throws leaves nothing held.
  for (const PieceRun& p : runs) {
    pieces_.push_back({p.k, p.v});
    const int piece = static_cast<int>(pieces_.size()) - 1;
    for (std::int64_t j = 0; j < p.n; ++j) hold(p.first + j, piece, p.at + j);
  }
}

void KvProjection::unheld_runs(std::int64_t from, std::int64_t to,
                               std::vector<std::pair<std::int64_t, std::int64_t>>& runs) const {
  for (std::int64_t r = from; r < to;) {
    if (k_rows_[static_cast<std::size_t>(r)]) {
      ++r;
      continue;
    }
    std::int64_t e = r;
    while (e < to && !k_rows_[static_cast<std::size_t>(e)]) ++e;
    runs.emplace_back(r, e - r);
    r = e;
  }
}

void KvProjection::ensure(std::span<const int> requests) {
  const Case& c = *c_;
  std::vector<std::pair<std::int64_t, std::int64_t>> runs;  // [first, first + n) not held
  for (int i : requests) {
    if (i < 0 || i >= c.num_requests) throw std::out_of_range("KvProjection: request " + std::to_string(i));
    unheld_runs(c.kv_start_loc[i], std::int64_t{c.kv_start_loc[i]} + c.seq_lens[i], runs);
  }
  std::vector<PieceRun> pieces;
  for (const auto& [first, n] : runs) pieces.push_back({first, n, nullptr, nullptr, 0});
  project_pieces(pieces);
}

const Tensor& KvProjection::k_all() {
  if (!k_all_) {
    const Case& c = *c_;
    const Dims& d = c.spec.dims;
    const std::int64_t S = c.num_kv_tokens, N = c.spec.num_heads(), P = d.nope_dim, R = d.rope_dim, V = d.v_head_dim;
    auto k = std::make_shared<Tensor>(Tensor::for_overwrite(c.spec.dtype, {S, N, P + R}));
    auto v = std::make_shared<Tensor>(Tensor::for_overwrite(c.spec.dtype, {S, N, V}));
    const std::size_t k_row = static_cast<std::size_t>(N * (P + R)) * 2, v_row = static_cast<std::size_t>(N * V) * 2;
    // Rows held already are copied; the rest projected straight into place.
    for (std::int64_t r = 0; r < S; ++r)
      if (const std::uint16_t* kr = k_rows_[static_cast<std::size_t>(r)]) {
        std::memcpy(k->bytes() + r * k_row, kr, k_row);
        std::memcpy(v->bytes() + r * v_row, v_rows_[static_cast<std::size_t>(r)], v_row);
      }
    std::vector<std::pair<std::int64_t, std::int64_t>> runs;
    unheld_runs(0, S, runs);
    std::vector<PieceRun> pieces;
    for (const auto& [first, n] : runs) pieces.push_back({first, n, k, v, first});
    project_pieces(pieces);
    // Kept only when whole: a projection that throws leaves no half-made tensors.
    k_all_ = std::move(k);
    v_all_ = std::move(v);
  }
  return *k_all_;
}

const Tensor& KvProjection::v_all() {
  k_all();
  return *v_all_;
}

std::size_t KvProjection::offer(const TensorView& kv, const TensorView& pe, std::span<const std::int64_t> rows,
                                const std::shared_ptr<const Tensor>& k, const std::shared_ptr<const Tensor>& v) {
  const std::int64_t L = c_->spec.dims.kv_lora_rank, R = c_->spec.dims.rope_dim;
  if (kv.dtype != kv_.dtype() || pe.dtype != pe_.dtype() || static_cast<std::int64_t>(rows.size()) != kv.shape.at(0))
    return 0;
  const std::size_t kv_row = static_cast<std::size_t>(L) * 2, pe_row = static_cast<std::size_t>(R) * 2;
  int piece = -1;
  std::size_t taken = 0;
  for (std::size_t j = 0; j < rows.size(); ++j) {
    const std::int64_t r = rows[j];
    if (r < 0 || r >= kv_.dim(0) || k_rows_[static_cast<std::size_t>(r)]) continue;
    if (std::memcmp(static_cast<const std::byte*>(kv.data) + j * kv_row, kv_.bytes() + r * kv_row, kv_row) != 0 ||
        std::memcmp(static_cast<const std::byte*>(pe.data) + j * pe_row, pe_.bytes() + r * pe_row, pe_row) != 0)
      continue;  // not the case's own latent (a damaged cache): not this row's projection
    if (piece < 0) {
      pieces_.push_back({k, v});
      piece = static_cast<int>(pieces_.size()) - 1;
    }
    hold(r, piece, static_cast<std::int64_t>(j));
    ++taken;
  }
  return taken;
}

void KvProjection::withdraw(const Tensor* k) {
  if (k_all_ && k == k_all_.get()) k_all_.reset(), v_all_.reset();  // made again on the next k_all()
  for (std::size_t p = 0; p < pieces_.size(); ++p) {
    if (pieces_[p].k.get() != k) continue;
    for (std::size_t r = 0; r < piece_of_.size(); ++r)
      if (piece_of_[r] == static_cast<int>(p)) k_rows_[r] = v_rows_[r] = nullptr, piece_of_[r] = -1;
    pieces_[p] = Piece{};
  }
}

bool KvProjection::has(int request) const {
  const Case& c = *c_;
  if (request < 0 || request >= c.num_requests) return false;
  for (std::int64_t r = c.kv_start_loc[request]; r < std::int64_t{c.kv_start_loc[request]} + c.seq_lens[request]; ++r)
    if (!k_rows_[static_cast<std::size_t>(r)]) return false;
  return true;
}

void up_project_kv_known(const Case& c, const TensorView& kv_c, const TensorView& k_pe,
                         std::span<const std::int64_t> rows, const KvProjection& known, Tensor& k, Tensor& v) {
  const Dims& d = c.spec.dims;
  const std::int64_t N = c.spec.num_heads(), L = d.kv_lora_rank, P = d.nope_dim, R = d.rope_dim, V = d.v_head_dim;
  const std::int64_t s = kv_c.shape.at(0);
  if (static_cast<std::int64_t>(rows.size()) != s)
    throw std::invalid_argument("up_project_kv_known: " + std::to_string(rows.size()) + " row indices for " +
                                std::to_string(s) + " rows");
  k = Tensor::for_overwrite(c.spec.dtype, {s, N, P + R});
  v = Tensor::for_overwrite(c.spec.dtype, {s, N, V});
  const bool same_dtype = kv_c.dtype == known.kv().dtype() && k_pe.dtype == known.pe().dtype();
  const std::size_t kv_row = static_cast<std::size_t>(L) * 2, pe_row = static_cast<std::size_t>(R) * 2;
  const std::size_t k_row = static_cast<std::size_t>(N * (P + R)) * 2, v_row = static_cast<std::size_t>(N * V) * 2;
  // Rows whose latent is the known row's, bit for bit, are copied; the others projected.
  std::vector<char> hit(static_cast<std::size_t>(s), 0);
#pragma omp parallel for schedule(static)
  for (std::int64_t j = 0; j < s; ++j) {
    const std::int64_t r = rows[static_cast<std::size_t>(j)];
    const std::uint16_t* kr = same_dtype && r >= 0 && r < known.kv().dim(0) ? known.k_row(r) : nullptr;
    const bool ok = kr &&
                    std::memcmp(static_cast<const std::byte*>(kv_c.data) + j * kv_row, known.kv().bytes() + r * kv_row,
                                kv_row) == 0 &&
                    std::memcmp(static_cast<const std::byte*>(k_pe.data) + j * pe_row, known.pe().bytes() + r * pe_row,
                                pe_row) == 0;
    hit[static_cast<std::size_t>(j)] = ok;
    if (ok) {
      std::memcpy(k.bytes() + j * k_row, kr, k_row);
      std::memcpy(v.bytes() + j * v_row, known.v_row(r), v_row);
    }
  }
  std::vector<std::int64_t> miss;
  for (std::int64_t j = 0; j < s; ++j)
    if (!hit[static_cast<std::size_t>(j)]) miss.push_back(j);
  if (miss.empty()) return;
  // Runs of consecutive missed rows, each projected in place (row-wise: the same bits).
  std::vector<RowRun> runs;
  for (std::size_t a = 0; a < miss.size();) {
    std::size_t b = a + 1;
    while (b < miss.size() && miss[b] == miss[b - 1] + 1) ++b;
    runs.push_back({miss[a], static_cast<std::int64_t>(b - a), k.data<std::uint16_t>() + miss[a] * N * (P + R),
                    v.data<std::uint16_t>() + miss[a] * N * V});
    a = b;
  }
  project_runs(c, kv_c, k_pe, runs);
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
