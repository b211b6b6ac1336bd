// The sparse ops' references: per query token, gather the keys it names (in
// order, duplicates included), then one softmax per head with the optional
// sink in the denominator. Tokens are independent work units, so the bits do
// not depend on the thread count.
#include "reference/sparse_reference.h"

#include <Eigen/Core>
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "cases/encoding.h"
#include "cases/sparse.h"
#include "reference/detail/chain_gemm.h"

namespace mlagate {
namespace {

using Index = Eigen::Index;
template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

double widen(const TensorView& v, std::int64_t i) {
  switch (v.dtype) {
    case DType::kF32: return v.as<float>()[i];
    case DType::kBF16: return bf16_to_f32(v.as<std::uint16_t>()[i]);
    case DType::kF16: return f16_to_f32(v.as<std::uint16_t>()[i]);
    default: throw std::invalid_argument("sparse reference: unexpected dtype " + std::string(dtype_name(v.dtype)));
  }
}

float round_to(double x, DType dt) {
  return round_to_16bit(static_cast<float>(x), dt == DType::kBF16);
}

// One key (the whole entry, L + R) of `owner` at a request-local position, as
// a correct reader of its cache sees it.
template <class T>
void load_key(const Case& owner, int request, int pos, T* dst, bool round_model) {
  const std::int64_t L = owner.spec.dims.kv_lora_rank, R = owner.spec.dims.rope_dim;
  const std::int64_t row = owner.kv_start_loc[static_cast<std::size_t>(request)] + pos;
  const TensorView kv = owner.kv_c_cache.empty() ? owner.kv_c.view() : owner.kv_c_cache.view();
  const TensorView pe = owner.k_pe_cache.empty() ? owner.k_pe.view() : owner.k_pe_cache.view();
  const DType dt = owner.spec.dtype;
  for (std::int64_t k = 0; k < L; ++k) {
    const double x = widen(kv, row * L + k);
    dst[k] = static_cast<T>(round_model ? round_to(x, dt) : x);
  }
  for (std::int64_t k = 0; k < R; ++k) {
    const double x = widen(pe, row * R + k);
    dst[L + k] = static_cast<T>(round_model ? round_to(x, dt) : x);
  }
}

template <class T>
void gather_keys(const Case& c, int request, int t, RowMat<T>& keys, std::vector<int>& mp, std::vector<int>& ep,
                 bool round_model) {
  main_positions(c, t, mp);
  extra_positions(c, t, ep);
  const Index D = c.spec.dims.kv_lora_rank + c.spec.dims.rope_dim;
  keys.resize(static_cast<Index>(mp.size() + ep.size()), D);
  Index j = 0;
  for (int p : mp) load_key(c, request, p, keys.row(j++).data(), round_model);
  for (int p : ep) load_key(c.sparse->compressed, request, p, keys.row(j++).data(), round_model);
}

void check(const Case& c, const TensorView& q) {
  if (!c.sparse) throw std::invalid_argument("sparse reference: not a sparse case");
  const Shape want{c.num_tokens, c.spec.num_heads(), c.spec.dims.kv_lora_rank + c.spec.dims.rope_dim};
  if (q.shape != want) throw std::invalid_argument("sparse reference: q has shape " + shape_str(q.shape));
}

}  // namespace

Tensor sparse_query(const Case& c, const TensorView& q_lat) {
  const Dims& d = c.spec.dims;
  const std::int64_t T = c.num_tokens, N = c.spec.num_heads(), L = d.kv_lora_rank, R = d.rope_dim, P = d.nope_dim;
  if (q_lat.shape != Shape{T, N, L} || q_lat.dtype != c.spec.dtype)
    throw std::invalid_argument("sparse_query: q_lat has shape " + shape_str(q_lat.shape));
  Tensor q(c.spec.dtype, {T, N, L + R});
  const auto* ql = q_lat.as<std::uint16_t>();
  const auto* qs = c.q.data<std::uint16_t>();
  auto* out = q.data<std::uint16_t>();
  for (std::int64_t th = 0; th < T * N; ++th) {
    std::copy_n(ql + th * L, L, out + th * (L + R));
    std::copy_n(qs + th * (P + R) + P, R, out + th * (L + R) + L);
  }
  return q;
}

namespace {

// Every row as a row without keys leaves it: o = 0, lse = -inf.
SparseReference empty_reference(Index T, Index N, Index Dv) {
  SparseReference r;
  r.o.assign(static_cast<std::size_t>(T * N * Dv), 0.0);
  r.lse.assign(static_cast<std::size_t>(T * N), -std::numeric_limits<double>::infinity());
  return r;
}

}  // namespace

SparseReference sparse_golden(const Case& c, const TensorView& q) {
  check(c, q);
  const Index T = c.num_tokens, N = c.spec.num_heads(), D = q.shape[2], Dv = c.spec.sparse_dv();
  const double scale = c.spec.softmax_scale();
  const std::vector<float>& sink = c.sparse->sink;
  const std::vector<int> req = token_requests(c);
  SparseReference r = empty_reference(T, N, Dv);
#pragma omp parallel
  {
    RowMat<double> keys, qt(N, D), s;
    std::vector<int> mp, ep;
#pragma omp for schedule(dynamic)
    for (Index t = 0; t < T; ++t) {
      gather_keys(c, req[static_cast<std::size_t>(t)], static_cast<int>(t), keys, mp, ep, false);
      const Index n = keys.rows();
      if (n == 0) continue;  // no key: o = 0, lse = -inf
      for (Index h = 0; h < N; ++h)
        for (Index k = 0; k < D; ++k) qt(h, k) = widen(q, (t * N + h) * D + k);
      s.resize(N, n);
      detail::chain_gemm(N, n, D, qt.data(), D, keys.data(), keys.cols(), detail::ChainB::kTransposed, s.data(), n);
      for (Index h = 0; h < N; ++h) {
        const double m = (s.row(h) * scale).maxCoeff();
        double sum = 0;
        for (Index j = 0; j < n; ++j) sum += (s(h, j) = std::exp(s(h, j) * scale - m));
        const double lse = m + std::log(sum);
        r.lse[static_cast<std::size_t>(t * N + h)] = lse;
        // exp(sink - lse) as a weight beside the keys' total of 1.
        const double keep = sink.empty() ? 1.0 : 1.0 / (1.0 + std::exp(static_cast<double>(sink[static_cast<std::size_t>(h)]) - lse));
        double* o = r.o.data() + (t * N + h) * Dv;
        for (Index j = 0; j < n; ++j) {
          const double w = s(h, j) / sum * keep;
          for (Index k = 0; k < Dv; ++k) o[k] += w * keys(j, k);
        }
      }
    }
  }
  return r;
}

SparseReference sparse_emulation(const Case& c, const TensorView& q) {
  check(c, q);
  const Index T = c.num_tokens, N = c.spec.num_heads(), D = q.shape[2], Dv = c.spec.sparse_dv();
  const auto scale = static_cast<float>(c.spec.softmax_scale());
  const DType dt = c.spec.dtype;
  const std::vector<float>& sink = c.sparse->sink;
  const std::vector<int> req = token_requests(c);
  SparseReference r = empty_reference(T, N, Dv);
#pragma omp parallel
  {
    RowMat<float> keys, qt(N, D), s, p, o;
    std::vector<int> mp, ep;
#pragma omp for schedule(dynamic)
    for (Index t = 0; t < T; ++t) {
      gather_keys(c, req[static_cast<std::size_t>(t)], static_cast<int>(t), keys, mp, ep, true);
      const Index n = keys.rows();
      if (n == 0) continue;
      for (Index h = 0; h < N; ++h)
        for (Index k = 0; k < D; ++k) qt(h, k) = static_cast<float>(widen(q, (t * N + h) * D + k));
      s.noalias() = qt * keys.transpose();
      p.resize(N, n);
      for (Index h = 0; h < N; ++h) {
        float m = -std::numeric_limits<float>::infinity();
        for (Index j = 0; j < n; ++j) m = std::max(m, s(h, j) *= scale);
        float sum = 0;
        for (Index j = 0; j < n; ++j) {
          const float e = std::exp(s(h, j) - m);
          sum += e;
          p(h, j) = round_to(e, dt);
        }
        r.lse[static_cast<std::size_t>(t * N + h)] = m + std::log(sum);
        if (!sink.empty()) sum += std::exp(sink[static_cast<std::size_t>(h)] - m);
        p.row(h) /= sum;
      }
      o.noalias() = p * keys.leftCols(Dv);
      for (Index h = 0; h < N; ++h)
        for (Index k = 0; k < Dv; ++k) r.o[static_cast<std::size_t>((t * N + h) * Dv + k)] = round_to(o(h, k), dt);
    }
  }
  return r;
}

}  // namespace mlagate
