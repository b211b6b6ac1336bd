// Glue math with Eigen in fp32 over model-dtype inputs; every result is rounded
// to the model dtype exactly where a GPU framework would store it.
#include "reference/glue.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>

#include "cases/encoding.h"

namespace mlagate {

namespace {

using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Stride = Eigen::OuterStride<>;

// Rounds fp32 to the 16-bit model dtype (hot loops avoid TensorView::set).
using Round16 = std::uint16_t (*)(float);
using Load16 = float (*)(std::uint16_t);
Round16 rounder(DType d) { return d == DType::kBF16 ? f32_to_bf16 : f32_to_f16; }
Load16 loader(DType d) { return d == DType::kBF16 ? bf16_to_f32 : f16_to_f32; }

std::vector<float> to_f32(const TensorView& v) {
  std::vector<float> out(static_cast<std::size_t>(v.numel()));
  const std::int64_t n = v.numel();
  if (v.dtype == DType::kBF16 || v.dtype == DType::kF16) {
    const Load16 load = loader(v.dtype);
    const auto* src = static_cast<const std::uint16_t*>(v.data);
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = load(src[i]);
  } else {
    for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = static_cast<float>(v.get(i));
  }
  return out;
}

}  // namespace

TensorView row_view(const Tensor& t, std::int64_t first, std::int64_t count) {
  Shape s = t.shape();
  std::int64_t row = 1;
  for (std::size_t i = 1; i < s.size(); ++i) row *= s[i];
  s[0] = count;
  return {t.dtype(), s, const_cast<std::byte*>(t.bytes()) + first * row * static_cast<std::int64_t>(dtype_size(t.dtype()))};
}

void absorb_queries(const Case& c, std::span<const int> tokens, Tensor& q_lat, Tensor& q_pe) {
  const Dims& d = c.spec.dims;
  const std::int64_t N = c.spec.num_heads(), L = d.kv_lora_rank, P = d.nope_dim, R = d.rope_dim;
  const std::int64_t n = static_cast<std::int64_t>(tokens.size());
  q_lat = Tensor(c.spec.dtype, {n, N, L});
  q_pe = Tensor(c.spec.dtype, {n, N, R});
  const std::vector<float> w = to_f32(c.w_uk.view());  // [L, N*P]
  const Load16 load = loader(c.spec.dtype);
  const Round16 round = rounder(c.spec.dtype);
  const std::uint16_t* q = c.q.data<std::uint16_t>();
  std::uint16_t* lat = q_lat.data<std::uint16_t>();
  std::uint16_t* pe = q_pe.data<std::uint16_t>();
  const std::int64_t QD = P + R;
#pragma omp parallel for schedule(static)
  for (std::int64_t h = 0; h < N; ++h) {
    MatF qn(n, P);
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t k = 0; k < P; ++k) qn(i, k) = load(q[(tokens[i] * N + h) * QD + k]);
    Eigen::Map<const MatF, 0, Stride> wh(w.data() + h * P, L, P, Stride(N * P));
    const MatF ql = qn * wh.transpose();  // [n, L]
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t l = 0; l < L; ++l) lat[(i * N + h) * L + l] = round(ql(i, l));
      for (std::int64_t r = 0; r < R; ++r) pe[(i * N + h) * R + r] = q[(tokens[i] * N + h) * QD + P + r];
    }
  }
}

void project_latent_output(const Case& c, const TensorView& o_lat, std::span<const int> rows, Tensor& out) {
  const Dims& d = c.spec.dims;
  const std::int64_t N = c.spec.num_heads(), L = d.kv_lora_rank, V = d.v_head_dim;
  const std::int64_t n = static_cast<std::int64_t>(rows.size());
  const std::vector<float> w = to_f32(c.w_uv.view());  // [L, N*V]
  const std::vector<float> o_all = to_f32(o_lat);      // [n, N, L], any dtype the backend wrote
  const Round16 round = rounder(c.spec.dtype);
  std::uint16_t* dst = out.data<std::uint16_t>();
#pragma omp parallel for schedule(static)
  for (std::int64_t h = 0; h < N; ++h) {
    Eigen::Map<const MatF, 0, Stride> o(o_all.data() + h * L, n, L, Stride(N * L));
    Eigen::Map<const MatF, 0, Stride> wh(w.data() + h * V, L, V, Stride(N * V));
    const MatF r = o * wh;  // [n, V]
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t v = 0; v < V; ++v) dst[rows[i] * N * V + h * V + v] = round(r(i, v));
  }
}

void up_project_kv(const Case& c, const TensorView& kv_c, const TensorView& k_pe, Tensor& k, Tensor& v) {
  const Dims& d = c.spec.dims;
  const std::int64_t N = c.spec.num_heads(), L = d.kv_lora_rank, P = d.nope_dim, R = d.rope_dim, V = d.v_head_dim;
  const std::int64_t s = kv_c.shape.at(0);
  // Every element is written below.
  k = Tensor::for_overwrite(c.spec.dtype, {s, N, P + R});
  v = Tensor::for_overwrite(c.spec.dtype, {s, N, V});
  if (s == 0) return;
  const std::vector<float> kv = to_f32(kv_c);
  const std::vector<float> wk = to_f32(c.w_uk.view()), wv = to_f32(c.w_uv.view());
  const Eigen::Map<const MatF> wkm(wk.data(), L, N * P), wvm(wv.data(), L, N * V);
  const Round16 round = rounder(c.spec.dtype);
  std::uint16_t* kt = k.data<std::uint16_t>();
  std::uint16_t* vt = v.data<std::uint16_t>();
  const auto* pe = static_cast<const std::uint16_t*>(k_pe.data);  // model dtype bits, copied verbatim
  // Row blocks, each one GEMM per weight ([rows, L] x [L, N*P] and [L, N*V])
  // into a per-thread fp32 tile that stays warm: the whole fp32 product of a
  // long context (gigabytes at TP 1) is never materialised, only the rounded
  // result. Deterministic for a given row count; Eigen's split of the sum over
  // L may differ from one big GEMM's in the last fp32 bit before rounding, as
  // it already does between machines with other cache sizes.
  constexpr std::int64_t kRows = 64;
  const std::int64_t blocks = (s + kRows - 1) / kRows;
#pragma omp parallel
  {
    MatF kn, vv;
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t j0 = b * kRows, rows = std::min(kRows, s - j0);
      const Eigen::Map<const MatF> a(kv.data() + j0 * L, rows, L);
      kn.noalias() = a * wkm;
      vv.noalias() = a * wvm;
      for (std::int64_t j = 0; j < rows; ++j)
        for (std::int64_t h = 0; h < N; ++h) {
          std::uint16_t* krow = kt + ((j0 + j) * N + h) * (P + R);
          for (std::int64_t p = 0; p < P; ++p) krow[p] = round(kn(j, h * P + p));
          for (std::int64_t r = 0; r < R; ++r) krow[P + r] = pe[(j0 + j) * R + r];
          std::uint16_t* vrow = vt + ((j0 + j) * N + h) * V;
          for (std::int64_t x = 0; x < V; ++x) vrow[x] = round(vv(j, h * V + x));
        }
    }
  }
}

void merge_states(std::vector<float>& acc_o, std::vector<float>& acc_lse, const TensorView& part_o,
                  const TensorView& part_lse, std::int64_t rows, std::int64_t heads, std::int64_t dim) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (std::int64_t r = 0; r < rows * heads; ++r) {
    float la = acc_lse[static_cast<std::size_t>(r)];
    float lb = static_cast<float>(part_lse.get(r));
    // An empty row's lse may come back as +inf (FlashMLA's convention): no keys either way.
    if (std::isinf(la)) la = kNegInf;
    if (std::isinf(lb)) lb = kNegInf;
    const float m = std::max(la, lb);
    if (m == kNegInf) {
      acc_lse[static_cast<std::size_t>(r)] = kNegInf;
      for (std::int64_t x = 0; x < dim; ++x) acc_o[static_cast<std::size_t>(r * dim + x)] = 0.f;
      continue;
    }
    const float wa = std::exp(la - m), wb = std::exp(lb - m), sum = wa + wb;
    for (std::int64_t x = 0; x < dim; ++x) {
      float& o = acc_o[static_cast<std::size_t>(r * dim + x)];
      const float b = lb == kNegInf ? 0.f : static_cast<float>(part_o.get(r * dim + x));
      const float a = la == kNegInf ? 0.f : o;
      o = (a * wa + b * wb) / sum;
    }
    acc_lse[static_cast<std::size_t>(r)] = m + std::log(sum);
  }
}

}  // namespace mlagate
