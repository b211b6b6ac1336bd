// The fp64 reference: SPEC: The two paths (absorbed and MHA paths) as chain
// GEMMs (detail/chain_gemm.h: the same bits on any machine) over
// request-sized blocks, parallelized with OpenMP over a fixed set of
// independent work units so the bits never depend on the thread count.
#include "reference/fp64_reference.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/detail/chain_gemm.h"
#include "reference/detail/softmax.h"
#include "reference/detail/strided_rows.h"
#include "reference/detail/widen.h"

#include "cases/encoding.h"

namespace mlagate {
namespace {

using Index = Eigen::Index;
using detail::chain_gemm;
using detail::ChainB;
// Scratch arrays: Eigen leaves them uninitialized (no serial zero-fill pass over
// hundreds of MiB; first touch happens in the parallel loops that fill them)
// and aligns them to EIGEN_MAX_ALIGN_BYTES (64 with AVX-512).
using Buffer = Eigen::VectorXd;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Elements [first, first+n) of a tensor widened to double, one dtype dispatch
// per run instead of TensorView::get's one per element. Widening is exact.
void convert_run(const TensorView& v, Index first, Index n, double* dst) {
  if (detail::widen_16bit(v, first, n, dst)) return;
  switch (v.dtype) {
    case DType::kF64:
      std::copy_n(v.as<double>() + first, n, dst);
      return;
    case DType::kF32:
      std::copy_n(v.as<float>() + first, n, dst);
      return;
    default:
      for (Index k = 0; k < n; ++k) dst[k] = v.get(first + k);
  }
}

// The whole tensor as double, converted in parallel.
Buffer to_f64(const TensorView& v) {
  const Index n = v.numel();
  Buffer out(n);
  constexpr Index kRun = 1 << 14;
#pragma omp parallel for schedule(static)
  for (Index first = 0; first < n; first += kRun) convert_run(v, first, std::min(kRun, n - first), out.data() + first);
  return out;
}

// Head n's slice W[:, n, :] of a weight [L, N, W] as a row-major [L, W] block
// whose rows are dst_stride apart.
void gather_head(const Tensor& w, Index n, double* dst, Index dst_stride) {
  const Index L = w.dim(0), N = w.dim(1), W = w.dim(2);
  const TensorView v = w.view();
  for (Index l = 0; l < L; ++l) convert_run(v, (l * N + n) * W, W, dst + l * dst_stride);
}

// Rows of logits start on 64-byte boundaries: Eigen's vectorized exp handles an
// unaligned head with the scalar std::exp, so alignment that varied with the
// allocation would change bits from run to run.
constexpr Index kRowAlign = 8;
Index padded(Index n) { return (n + kRowAlign - 1) / kRowAlign * kRowAlign; }

// Logit rows per GEMM: about 8 MiB of logits, at least 64 rows so the packed
// key block is reused. Fixed by the case alone, never by the thread count.
Index chunk_rows(Index s) { return std::max<Index>(64, (Index{1} << 20) / std::max<Index>(s, 1)); }

struct Layout {
  int B, T, S, N, L, R, P, V;
};

void check_shape(const Tensor& t, const Shape& want, const char* name) {
  if (t.shape() != want) {
    throw std::invalid_argument(std::string("golden: ") + name + " has shape " + shape_str(t.shape()) +
                                ", expected " + shape_str(want));
  }
}

Layout layout_of(const Case& c) {
  const Dims& d = c.spec.dims;
  Layout x{c.num_requests, c.num_tokens, c.num_kv_tokens, c.spec.num_heads(),
           d.kv_lora_rank, d.rope_dim,   d.nope_dim,      d.v_head_dim};
  const auto b = static_cast<std::size_t>(x.B);
  if (c.seq_lens.size() != b || c.query_lens.size() != b || c.context_lens.size() != b ||
      c.query_start_loc.size() != b + 1 || c.kv_start_loc.size() != b + 1) {
    throw std::invalid_argument("golden: per-request arrays do not match num_requests");
  }
  check_shape(c.q, {x.T, x.N, x.P + x.R}, "q");
  check_shape(c.kv_c, {x.S, x.L}, "kv_c");
  check_shape(c.k_pe, {x.S, x.R}, "k_pe");
  check_shape(c.w_uk, {x.L, x.N, x.P}, "w_uk");
  check_shape(c.w_uv, {x.L, x.N, x.V}, "w_uv");
  if (!c.kv_c_cache.empty() || !c.k_pe_cache.empty()) {
    check_shape(c.kv_c_cache, {x.S, x.L}, "kv_c_cache");
    check_shape(c.k_pe_cache, {x.S, x.R}, "k_pe_cache");
  }
  return x;
}

// The keys as the cache holds them: for fp8 caches the dequantized values a
// correct reader sees (SPEC: KV cache dtypes), else the inputs themselves.
TensorView cached_kv_c(const Case& c) { return c.kv_c_cache.empty() ? c.kv_c.view() : c.kv_c_cache.view(); }
TensorView cached_k_pe(const Case& c) { return c.k_pe_cache.empty() ? c.k_pe.view() : c.k_pe_cache.view(); }

// Keys query token u of request i sees: 0 .. c_i + u, clipped to the request
// (a seq_len-0 padding request has c_i < 0 and sees none).
Index visible_keys(const Case& c, int i, Index u) {
  const Index v = Index{c.context_lens[i]} + u + 1;
  return std::clamp<Index>(v, 0, c.seq_lens[i]);
}

// Row x[0..width) holds raw dot products of which the first n are visible.
// Turns it into softmax probabilities (zeros past n) and returns the natural
// log-sum-exp of the scaled logits; an empty row stays zero with lse -inf.
// The row's storage runs to padded(width) at least (every caller's rows are
// padded(cols) apart).
double softmax_row(double* x, Index n, Index width, double scale) {
  const Index np = padded(n);
  std::fill(x + n, x + std::max(width, np), 0.0);
  if (n == 0) return kNegInf;
  Eigen::Map<Eigen::ArrayXd> a(x, n);
  a *= scale;
  const double mx = a.maxCoeff();
  // The exponentials over whole runs of 8, then the padding zeroed again:
  // Eigen takes a row's tail past its last whole vector with std::exp, whose
  // bits are not its vector exp's, and where that tail begins depends on the
  // vector width (4 with AVX2, 8 with AVX-512). Over whole runs every element
  // takes the vector exp, whose bits are the same with either width (an fma
  // machine's; tests/reference/chain_gemm_test.cpp pins a case's bits).
  Eigen::Map<Eigen::ArrayXd> ap(x, np);
  ap = (ap - mx).exp();
  std::fill(x + n, x + np, 0.0);
  const double sum = detail::sum_in_four_lanes(x, n);
  a /= sum;
  return mx + std::log(sum);
}

// q_full [T, N, L+R] with q_pe [T, N, R] (out of q [T, N, P+R]) in columns L..;
// columns 0..L are the caller's (the latent query).
Buffer q_full_with_pe(const Buffer& q, const Layout& x) {
  const Index D = x.L + x.R, QW = x.P + x.R, rows = Index{x.T} * x.N;
  Buffer q_full(rows * D);
#pragma omp parallel for schedule(static)
  for (Index r = 0; r < rows; ++r) std::copy_n(q.data() + r * QW + x.P, x.R, q_full.data() + r * D + x.L);
  return q_full;
}

struct RowChunk {
  int request;
  Index row0;  // first (token, head) row of the request in the chunk
  Index rows;
};

// The MQA core of the absorbed path. q_full: [T, N, L+R] ([ql | q_pe]); keys
// are the case's kv_c and k_pe; writes o_lat [T, N, L] and lse [T, N].
// Per request, the (token, head) rows form one matrix Q [q_i*N, L+R]; a chunk
// of rows is Q K^T (one GEMM) against the request's keys [kv_c | k_pe], a
// masked softmax, then P kv_c (one GEMM). Each chunk widens the keys it needs
// into its thread's buffer: cheap next to the GEMMs, and it avoids an fp64
// copy of the whole cache (hundreds of MiB of page faults at large_decode).
void mqa_core(const Case& c, const Layout& x, const double* q_full, double* o_lat, double* lse) {
  const Index D = x.L + x.R;
  const Index N = x.N;
  const double scale = c.spec.softmax_scale();
  const TensorView kv_c = cached_kv_c(c), k_pe = cached_k_pe(c);
  std::vector<RowChunk> chunks;
  Index logits_size = 0, keys_size = 0;
  for (int i = 0; i < x.B; ++i) {
    const Index rows = Index{c.query_lens[i]} * N;
    const Index step = chunk_rows(c.seq_lens[i]);
    for (Index r0 = 0; r0 < rows; r0 += step) {
      chunks.push_back({i, r0, std::min(step, rows - r0)});
      logits_size = std::max(logits_size, std::min(step, rows - r0) * padded(c.seq_lens[i]));
    }
    keys_size = std::max(keys_size, Index{c.seq_lens[i]} * D);
  }
  const auto num_chunks = static_cast<std::int64_t>(chunks.size());
#pragma omp parallel
  {
    Buffer logits_buf(logits_size), keys(keys_size);
    int keys_request = -1;  // whose keys rows [0, keys_loaded) of `keys` hold
    Index keys_loaded = 0;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t k = 0; k < num_chunks; ++k) {
      const RowChunk& ch = chunks[k];
      const int i = ch.request;
      const Index row = Index{c.query_start_loc[i]} * N + ch.row0;  // global (token, head) row
      double* o = o_lat + row * x.L;
      double* l = lse + row;
      // Visibility grows with the token, so the chunk's last token sees the most keys.
      const Index cols = visible_keys(c, i, (ch.row0 + ch.rows - 1) / N);
      if (cols == 0) {
        std::fill(o, o + ch.rows * x.L, 0.0);
        std::fill(l, l + ch.rows, kNegInf);
        continue;
      }
      // A request's chunks mostly fall to the same thread in turn: rows
      // already widened for it stay (same values either way).
      const Index kv0 = c.kv_start_loc[i];
      if (i != keys_request) keys_request = i, keys_loaded = 0;
      for (Index j = keys_loaded; j < cols; ++j) {
        convert_run(kv_c, (kv0 + j) * x.L, x.L, keys.data() + j * D);
        convert_run(k_pe, (kv0 + j) * x.R, x.R, keys.data() + j * D + x.L);
      }
      keys_loaded = std::max(keys_loaded, cols);
      const Index stride = padded(cols);
      chain_gemm(ch.rows, cols, D, q_full + row * D, D, keys.data(), D, ChainB::kTransposed, logits_buf.data(), stride);
      for (Index r = 0; r < ch.rows; ++r) {
        l[r] = softmax_row(logits_buf.data() + r * stride, visible_keys(c, i, (ch.row0 + r) / N), cols, scale);
      }
      chain_gemm(ch.rows, x.L, cols, logits_buf.data(), stride, keys.data(), D, ChainB::kRowMajor, o, x.L);
    }
  }
}

}  // namespace

ReferenceOutputs reference_absorbed(const Case& c) {
  const Layout x = layout_of(c);
  const Index N = x.N, D = x.L + x.R, QW = x.P + x.R;
  const Buffer q = to_f64(c.q.view());
  Buffer q_full = q_full_with_pe(q, x);

  // ql[:, n, :] = q_nope[:, n, :] W_UK[:, n, :]^T, one [T, P] x [P, L] GEMM per head.
#pragma omp parallel
  {
    Buffer w(Index{x.L} * x.P);
#pragma omp for schedule(dynamic, 1)
    for (Index n = 0; n < N; ++n) {
      gather_head(c.w_uk, n, w.data(), x.P);
      chain_gemm(x.T, x.L, x.P, q.data() + n * QW, N * QW, w.data(), x.P, ChainB::kTransposed, q_full.data() + n * D,
                 N * D);
    }
  }

  ReferenceOutputs g;
  g.o_lat.resize(static_cast<std::size_t>(x.T) * N * x.L);
  g.lse.resize(static_cast<std::size_t>(x.T) * N);
  mqa_core(c, x, q_full.data(), g.o_lat.data(), g.lse.data());

  // out[:, n*V..] = o_lat[:, n, :] W_UV[:, n, :], one [T, L] x [L, V] GEMM per head.
  g.out.resize(static_cast<std::size_t>(x.T) * N * x.V);
#pragma omp parallel
  {
    Buffer w(Index{x.L} * x.V);
#pragma omp for schedule(dynamic, 1)
    for (Index n = 0; n < N; ++n) {
      gather_head(c.w_uv, n, w.data(), x.V);
      chain_gemm(x.T, x.V, x.L, g.o_lat.data() + n * x.L, N * x.L, w.data(), x.V, ChainB::kRowMajor,
                 g.out.data() + n * x.V, N * x.V);
    }
  }
  return g;
}

ReferenceOutputs reference_mha(const Case& c) {
  const Layout x = layout_of(c);
  const Index N = x.N, QW = x.P + x.R, KW = x.P + x.V;
  const double scale = c.spec.softmax_scale();
  const Buffer q = to_f64(c.q.view());
  const Buffer kv_c = to_f64(cached_kv_c(c));
  const Buffer k_pe = to_f64(cached_k_pe(c));

  ReferenceOutputs g;
  g.out.assign(static_cast<std::size_t>(x.T) * N * x.V, 0.0);
  g.lse.assign(static_cast<std::size_t>(x.T) * N, kNegInf);

  // One unit per (request, head): up-project the request's keys for that head,
  // then attend. Units with no key leave out 0 and lse -inf.
  std::vector<int> requests;
  Index max_s = 0, logits_size = 0;
  for (int i = 0; i < x.B; ++i) {
    const Index s = c.seq_lens[i];
    if (s == 0) continue;
    requests.push_back(i);
    max_s = std::max(max_s, s);
    logits_size = std::max(logits_size, std::min<Index>(chunk_rows(s), c.query_lens[i]) * padded(s));
  }
  const auto num_units = static_cast<std::int64_t>(requests.size()) * N;
#pragma omp parallel
  {
    detail::RowMat<double> w(x.L, KW);     // [W_UK[:, n, :] | W_UV[:, n, :]]
    detail::RowMat<double> kv(max_s, KW);  // [k_nope | v] of every key of the request
    Buffer logits_buf(logits_size);        // aligned rows (see padded)
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t k = 0; k < num_units; ++k) {
      const int i = requests[k / N];
      const Index n = k % N;
      const Index s = c.seq_lens[i], t0 = c.query_start_loc[i], q_i = c.query_lens[i], kv0 = c.kv_start_loc[i];
      gather_head(c.w_uk, n, w.data(), KW);
      gather_head(c.w_uv, n, w.data() + x.P, KW);
      // The up-projection: [s, L] x [L, P+V].
      chain_gemm(s, KW, x.L, kv_c.data() + kv0 * x.L, x.L, w.data(), KW, ChainB::kRowMajor, kv.data(), KW);
      const Index step = chunk_rows(s);
      for (Index u0 = 0; u0 < q_i; u0 += step) {
        const Index rows = std::min(step, q_i - u0);
        const Index cols = visible_keys(c, i, u0 + rows - 1);
        if (cols == 0) continue;
        const Index stride = padded(cols);
        const double* q_rows = q.data() + ((t0 + u0) * N + n) * QW;  // token stride N*(P+R)
        // One chain over the depth [P | R]: q_nope k_nope, then on into q_pe k_pe.
        chain_gemm(rows, cols, x.P, q_rows, N * QW, kv.data(), KW, ChainB::kTransposed, logits_buf.data(), stride);
        chain_gemm(rows, cols, x.R, q_rows + x.P, N * QW, k_pe.data() + kv0 * x.R, x.R, ChainB::kTransposed,
                   logits_buf.data(), stride, /*accumulate=*/true);
        for (Index r = 0; r < rows; ++r) {
          g.lse[(t0 + u0 + r) * N + n] =
              softmax_row(logits_buf.data() + r * stride, visible_keys(c, i, u0 + r), cols, scale);
        }
        chain_gemm(rows, x.V, cols, logits_buf.data(), stride, kv.data() + x.P, KW, ChainB::kRowMajor,
                   g.out.data() + (t0 + u0) * N * x.V + n * x.V, N * x.V);
      }
    }
  }
  return g;
}

void reference_mqa(const Case& c, const TensorView& q_lat, std::vector<double>& o_lat, std::vector<double>& lse) {
  const Layout x = layout_of(c);
  const Index N = x.N, D = x.L + x.R, rows = Index{x.T} * x.N;
  if (q_lat.shape != Shape{x.T, x.N, x.L}) {
    throw std::invalid_argument("reference_mqa: q_lat has shape " + shape_str(q_lat.shape) + ", expected " +
                                shape_str({x.T, x.N, x.L}));
  }
  Buffer q_full = q_full_with_pe(to_f64(c.q.view()), x);
#pragma omp parallel for schedule(static)
  for (Index r = 0; r < rows; ++r) convert_run(q_lat, r * x.L, x.L, q_full.data() + r * D);
  o_lat.resize(static_cast<std::size_t>(x.T) * N * x.L);
  lse.resize(static_cast<std::size_t>(x.T) * N);
  mqa_core(c, x, q_full.data(), o_lat.data(), lse.data());
}

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b, double floor) {
  if (a.size() != b.size()) {
    throw std::invalid_argument("max_rel_diff: sizes differ (" + std::to_string(a.size()) + " vs " +
                                std::to_string(b.size()) + ")");
  }
  constexpr double kInf = std::numeric_limits<double>::infinity();
  double worst = 0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    const double x = a[k], y = b[k];
    if (std::isnan(x) || std::isnan(y)) return kInf;  // NaN never matches anything
    if (std::isinf(x) || std::isinf(y)) {
      if (x != y) return kInf;
      continue;
    }
    const double d = std::abs(x - y);
    if (d == 0) continue;
    worst = std::max(worst, d / std::max(std::abs(y), floor));
  }
  return worst;
}

}  // namespace mlagate
