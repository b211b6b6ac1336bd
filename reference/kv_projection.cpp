// The case's up-projected rows, held once wherever they were first projected
// (KvProjection), and the projection of latent rows that reuses them.
#include "reference/kv_projection.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cases/encoding.h"
#include "reference/detail/widen.h"

namespace mlagate {

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
  project_row_runs(*c_, kv_.view(), pe_.view(), rows);
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
  project_row_runs(c, kv_c, k_pe, runs);
}

}  // namespace mlagate
