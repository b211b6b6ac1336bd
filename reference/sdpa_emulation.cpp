// The seed test's model-dtype SDPA reference emulated in fp32 with Eigen:
// einsums and SDPA as torch evaluates them on 16-bit tensors (see the header
// for every rounding point). Work units are fixed by the case alone, so the
// bits never depend on the thread count.
#include "reference/sdpa_emulation.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "cases/encoding.h"
#include "reference/glue.h"
#include "reference/kv_projection.h"
#include "reference/detail/emulation_math.h"
#include "reference/detail/softmax.h"
#include "reference/detail/strided_rows.h"
#include "reference/detail/widen.h"

namespace mlagate {
namespace {

using Index = Eigen::Index;
using MatF = detail::RowMat<float>;
using MapF = detail::RowsMap<float>;
using detail::cmat;
using detail::mat;
using AlignedArr = Eigen::Map<Eigen::ArrayXf, Eigen::Aligned64>;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr double kNaNd = std::numeric_limits<double>::quiet_NaN();
// Query rows per attention unit of the decode form (fixed: Eigen sums a row
// differently when it falls in a GEMM's row remainder).
constexpr Index kRowsPerUnit = 128;
constexpr Index kAlignFloats = 16;  // 64-byte rows: Eigen's vectorized exp takes one path

// x rounded to the nearest model-dtype value (RNE), as fp32.
float round_to(float x, DType dt) {
  return round_to_16bit(x, dt == DType::kBF16);
}
void round_all(float* x, Index n, DType dt) {
  for (Index i = 0; i < n; ++i) x[i] = round_to(x[i], dt);
}

// How the decode path reads an fp8 cache's dequantized keys (the header: its
// two plain implementations).
enum class KeyRead : std::uint8_t {
  kModelDtype,  // rounded to the model dtype (the seed's `.to(dtype)`, a 16-bit MMA operand)
  kF32,         // `e4m3 * scale` as the kernel computes it in fp32, not rounded
};

// Elements [first, first+n) of a tensor as fp32; fp32 tensors (an fp8 cache's
// dequantized values) are rounded to the model dtype unless `read` is kF32,
// 16-bit ones are exact.
void load(const TensorView& v, Index first, Index n, float* dst, DType model, KeyRead read = KeyRead::kModelDtype) {
  if (detail::widen_16bit(v, first, n, dst)) return;
  switch (v.dtype) {
    case DType::kF32: {
      const float* p = v.as<float>() + first;
      if (read == KeyRead::kF32) {
        std::copy_n(p, n, dst);
        return;
      }
      for (Index k = 0; k < n; ++k) dst[k] = round_to(p[k], model);
      return;
    }
    default:
      throw std::invalid_argument("sdpa emulation: unexpected dtype " + std::string(dtype_name(v.dtype)));
  }
}

// The keys as the cache holds them (fp8: the dequantized values).
TensorView cached_kv_c(const Case& c) { return c.kv_c_cache.empty() ? c.kv_c.view() : c.kv_c_cache.view(); }
TensorView cached_k_pe(const Case& c) { return c.k_pe_cache.empty() ? c.k_pe.view() : c.k_pe_cache.view(); }

// Keys query token u of request i sees (position c_i + u): 0 .. c_i + u,
// clipped to the request (a seq_len-0 padding request sees none).
int visible_keys(const Case& c, int i, Index u) {
  return detail::emu_visible(static_cast<int>(u), 1, c.context_lens[i], c.seq_lens[i]);
}

// A thread's 64-byte aligned scratch, reused across units.
class Scratch {
 public:
  float* floats(Index n) {
    buf_.resize(static_cast<std::size_t>(n + kAlignFloats));
    const auto addr = reinterpret_cast<std::uintptr_t>(buf_.data());
    const std::uintptr_t pad = (64 - addr % 64) % 64;
    return buf_.data() + pad / sizeof(float);
  }

 private:
  std::vector<float> buf_;
};

// One SDPA call on `rows` query rows q [rows, dqk] (model-dtype values) over
// keys k [nk, dqk] and values v [nk, dv] (row strides ks, vs); row r sees keys
// 0 .. visible[r]-1. Writes o [rows, dv] (rounded to the model dtype) and lse.
void sdpa_rows(const float* q, Index rows, Index dqk, const float* k, Index ks, const float* v, Index vs, Index dv,
               const int* visible, float scale, DType dt, float* o, float* lse, Scratch& scratch) {
  Index nk = 0;
  for (Index r = 0; r < rows; ++r) nk = std::max<Index>(nk, visible[r]);
  MapF out = mat(o, rows, dv, dv);
  if (nk == 0) {
    out.setZero();
    std::fill(lse, lse + rows, kNegInf);
    return;
  }
  const Index stride = (nk + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  float* p = scratch.floats(rows * stride + rows);
  float* sums = p + rows * stride;
  MapF s = mat(p, rows, nk, stride);
  s.noalias() = cmat(q, rows, dqk, dqk) * cmat(k, nk, dqk, ks).transpose();
  for (Index r = 0; r < rows; ++r) {
    float* row = p + r * stride;
    const Index n = visible[r];
    std::fill(row + n, row + nk, 0.f);
    if (n == 0) {
      sums[r] = 0;
      lse[r] = kNegInf;
      continue;
    }
    const auto [m, sum] = detail::exp_row(AlignedArr(row, n), scale);
    sums[r] = sum;
    lse[r] = m + std::log(sums[r]);
    round_all(row, n, dt);
  }
  out.noalias() = s * cmat(v, nk, dv, vs);
  for (Index r = 0; r < rows; ++r) {
    if (sums[r] == 0) {
      out.row(r).setZero();  // no key: 0, never 0 * NaN
    } else {
      out.row(r) /= sums[r];
    }
    round_all(o + r * dv, dv, dt);
  }
}

struct Dimensions {
  Index N, L, R, P, V;
};
Dimensions dims_of(const Case& c) {
  const Dims& d = c.spec.dims;
  return {c.spec.num_heads(), d.kv_lora_rank, d.rope_dim, d.nope_dim, d.v_head_dim};
}

void check_model_dtype(const Case& c) {
  if (c.spec.dtype != DType::kBF16 && c.spec.dtype != DType::kF16)
    throw std::invalid_argument("sdpa emulation: model dtype must be bf16 or fp16");
}

// Head h's slice W[:, h, :] of a weight [L, N, W] as fp32 rows [L, W] with row stride ld.
void load_head(const Tensor& w, Index h, float* dst, Index ld, DType dt) {
  const Index L = w.dim(0), N = w.dim(1), W = w.dim(2);
  for (Index l = 0; l < L; ++l) load(w.view(), (l * N + h) * W, W, dst + l * ld, dt);
}

// The fp32 lse of a row as sdpa_rows forms it: max + log(sum) (-inf where
// the row sees no key: max -inf, sum 0).
float lse_of(float max, float sum) { return max + std::log(sum); }

// The emulation's attention cores off the Eigen path (sdpa_emulation.h).
AttentionEmulator g_emulator = nullptr;

// mqa_core through the emulator: every request in one call, its keys (and
// values, their first L columns) loaded as the Eigen path loads them.
void mqa_core_emulated(const Case& c, std::span<const int> req, std::span<const Index> tok0, const float* q_full,
                       float* o_lat, float* lse, KeyRead read, AttentionEmulator emulate) {
  const Dimensions x = dims_of(c);
  const Index D = x.L + x.R;
  const DType dt = c.spec.dtype;
  const TensorView kv_c = cached_kv_c(c), k_pe = cached_k_pe(c);
  // Request k's keys from row first[k] of one buffer.
  std::vector<Index> first(req.size() + 1, 0);
  for (std::size_t k = 0; k < req.size(); ++k) first[k + 1] = first[k] + c.seq_lens[req[k]];
  std::vector<float> keys(static_cast<std::size_t>(std::max<Index>(first.back(), 1) * D));
  std::vector<EmulatedAttention> calls;
  Index out_rows = 0;
  for (std::size_t k = 0; k < req.size(); ++k) out_rows += Index{c.query_lens[req[k]]} * x.N;
  std::vector<float> max(static_cast<std::size_t>(out_rows)), sum(static_cast<std::size_t>(out_rows));
  Index at = 0;
  for (std::size_t k = 0; k < req.size(); ++k) {
    const int i = req[k];
    const Index rows = Index{c.query_lens[i]} * x.N, s = c.seq_lens[i], kv0 = c.kv_start_loc[i];
    if (rows == 0) continue;
    float* kd = keys.data() + first[k] * D;
#pragma omp parallel for schedule(static)
    for (Index j = 0; j < s; ++j) {
      load(kv_c, (kv0 + j) * x.L, x.L, kd + j * D, dt, read);
      load(k_pe, (kv0 + j) * x.R, x.R, kd + j * D + x.L, dt, read);
    }
    const Index row = tok0[k] * x.N;
    EmulatedAttention a;
    a.q = q_full + row * D;
    a.q_row = D;
    a.k = kd;
    a.k_row = D;
    a.v = kd;  // v = kv_c: the first L columns of the keys
    a.v_row = D;
    a.elem = EmulatedAttention::Elem::kF32;
    a.rows = static_cast<int>(rows);
    a.rows_per_token = static_cast<int>(x.N);
    a.context = c.context_lens[i];
    a.keys = static_cast<int>(s);
    a.dqk = static_cast<int>(D);
    a.dv = static_cast<int>(x.L);
    a.scale = static_cast<float>(c.spec.softmax_scale());
    a.bf16 = dt == DType::kBF16;
    a.o = o_lat + row * x.L;
    a.max = max.data() + at;
    a.sum = sum.data() + at;
    calls.push_back(a);
    at += rows;
  }
  emulate(calls);
  for (const EmulatedAttention& a : calls) {
    const Index row = (a.o - o_lat) / x.L;
    for (Index r = 0; r < a.rows; ++r) lse[row + r] = lse_of(a.max[r], a.sum[r]);
  }
}

// The absorbed attention core: q_full [n_tok, N, L+R] rows of the requests'
// tokens (tokens of request req[k] start at row tok0[k]), keys from the case.
// Writes o_lat [n_tok, N, L] (rounded) and lse [n_tok, N].
void mqa_core(const Case& c, std::span<const int> req, std::span<const Index> tok0, const float* q_full, float* o_lat,
              float* lse, KeyRead read) {
  if (const AttentionEmulator emulate = g_emulator) return mqa_core_emulated(c, req, tok0, q_full, o_lat, lse, read, emulate);
  const Dimensions x = dims_of(c);
  const Index D = x.L + x.R;
  const DType dt = c.spec.dtype;
  const float scale = static_cast<float>(c.spec.softmax_scale());
  const TensorView kv_c = cached_kv_c(c), k_pe = cached_k_pe(c);
  struct Unit {
    std::size_t k;  // index into req
    Index row0, rows;
  };
  std::vector<Unit> units;
  Index keys_size = 0;
  for (std::size_t k = 0; k < req.size(); ++k) {
    const int i = req[k];
    const Index rows = Index{c.query_lens[i]} * x.N;
    for (Index r0 = 0; r0 < rows; r0 += kRowsPerUnit) units.push_back({k, r0, std::min(kRowsPerUnit, rows - r0)});
    keys_size = std::max(keys_size, Index{c.seq_lens[i]} * D);
  }
  const auto num_units = static_cast<std::int64_t>(units.size());
#pragma omp parallel
  {
    Scratch scratch;
    std::vector<float> keys(static_cast<std::size_t>(keys_size));
    int keys_request = -1;  // whose keys rows [0, keys_loaded) of `keys` hold
    Index keys_loaded = 0;
    std::vector<int> visible;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t u = 0; u < num_units; ++u) {
      const Unit& un = units[static_cast<std::size_t>(u)];
      const int i = req[un.k];
      const Index row = tok0[un.k] * x.N + un.row0;  // first (token, head) row
      visible.resize(static_cast<std::size_t>(un.rows));
      int nk = 0;
      for (Index r = 0; r < un.rows; ++r) {
        visible[static_cast<std::size_t>(r)] = visible_keys(c, i, (un.row0 + r) / x.N);
        nk = std::max(nk, visible[static_cast<std::size_t>(r)]);
      }
      // A request's units mostly fall to the same thread in turn: its keys
      // stay widened (widening them again per 128 rows was a tenth of the
      // decode form's time on long contexts), and only rows not yet widened
      // are loaded. The values are the same either way.
      const Index kv0 = c.kv_start_loc[i];
      if (i != keys_request) keys_request = i, keys_loaded = 0;
      for (Index j = keys_loaded; j < nk; ++j) {
        load(kv_c, (kv0 + j) * x.L, x.L, keys.data() + j * D, dt, read);
        load(k_pe, (kv0 + j) * x.R, x.R, keys.data() + j * D + x.L, dt, read);
      }
      keys_loaded = std::max<Index>(keys_loaded, nk);
      // v = kv_c: the first L columns of the keys.
      sdpa_rows(q_full + row * D, un.rows, D, keys.data(), D, keys.data(), D, x.L, visible.data(), scale, dt,
                o_lat + row * x.L, lse + row, scratch);
    }
  }
}

// Rows [t0, t0 + n) of q_pe (out of q [T, N, P+R]) into columns L.. of q_full [n, N, L+R].
void copy_q_pe(const Case& c, Index t0, Index n, float* q_full) {
  const Dimensions x = dims_of(c);
  const Index D = x.L + x.R, QW = x.P + x.R;
  for (Index t = 0; t < n; ++t)
    for (Index h = 0; h < x.N; ++h)
      load(c.q.view(), ((t0 + t) * x.N + h) * QW + x.P, x.R, q_full + (t * x.N + h) * D + x.L, c.spec.dtype);
}

SdpaResult empty_result(const Case& c, Index per_token) {
  SdpaResult e;
  e.out.assign(static_cast<std::size_t>(Index{c.num_tokens} * per_token), kNaNd);
  e.lse.assign(static_cast<std::size_t>(Index{c.num_tokens} * c.spec.num_heads()), kNaNd);
  return e;
}

void emulate_decode_form(const Case& c, std::span<const int> req, SdpaResult& e) {
  const Dimensions x = dims_of(c);
  const Index D = x.L + x.R, QW = x.P + x.R;
  const DType dt = c.spec.dtype;
  // The requests' tokens, packed: request req[k] from row tok0[k].
  std::vector<Index> tok0;
  std::vector<Index> token;  // packed row -> token of the case
  for (int i : req) {
    tok0.push_back(static_cast<Index>(token.size()));
    for (int u = 0; u < c.query_lens[i]; ++u) token.push_back(c.query_start_loc[i] + u);
  }
  const Index n = static_cast<Index>(token.size());
  if (n == 0) return;
  std::vector<float> q_full(static_cast<std::size_t>(n * x.N * D));
  // ql[:, h, :] = round(q_nope[:, h, :] @ W_UK[:, h, :]^T): per head, one
  // [q_len, P] x [P, L] GEMM per request. Per request, not over all of `req`'s
  // tokens at once: Eigen sums a row in another order when it falls in a
  // block's remainder, so a request's bits would depend on which requests were
  // emulated with it (the runner emulates the requests each backend routes
  // through a form; export emulates them all).
  std::vector<Index> len;
  for (int i : req) len.push_back(c.query_lens[i]);
#pragma omp parallel
  {
    MatF w(x.L, x.P), qn(n, x.P);
#pragma omp for schedule(dynamic, 1)
    for (Index h = 0; h < x.N; ++h) {
      load_head(c.w_uk, h, w.data(), x.P, dt);
      for (Index t = 0; t < n; ++t) load(c.q.view(), (token[t] * x.N + h) * QW, x.P, qn.data() + t * x.P, dt);
      for (std::size_t k = 0; k < len.size(); ++k) {
        if (len[k] == 0) continue;
        MapF ql = mat(q_full.data() + (tok0[k] * x.N + h) * D, len[k], x.L, x.N * D);
        ql.noalias() = qn.middleRows(tok0[k], len[k]) * w.transpose();
      }
      for (Index t = 0; t < n; ++t) round_all(q_full.data() + (t * x.N + h) * D, x.L, dt);
      for (Index t = 0; t < n; ++t)
        load(c.q.view(), (token[t] * x.N + h) * QW + x.P, x.R, q_full.data() + (t * x.N + h) * D + x.L, dt);
    }
  }
  std::vector<float> o_lat(static_cast<std::size_t>(n * x.N * x.L)), lse(static_cast<std::size_t>(n * x.N));
  // out[:, h*V..] = round(o_lat[:, h, :] @ W_UV[:, h, :]): per head, one
  // [q_len, L] x [L, V] GEMM per request (as above).
  const auto project = [&](std::vector<double>& out, std::vector<double>& lse_out) {
#pragma omp parallel
    {
      MatF w(x.L, x.V), o(n, x.V);
#pragma omp for schedule(dynamic, 1)
      for (Index h = 0; h < x.N; ++h) {
        load_head(c.w_uv, h, w.data(), x.V, dt);
        for (std::size_t k = 0; k < len.size(); ++k)
          if (len[k] > 0)
            o.middleRows(tok0[k], len[k]).noalias() =
                cmat(o_lat.data() + (tok0[k] * x.N + h) * x.L, len[k], x.L, x.N * x.L) * w;
        for (Index t = 0; t < n; ++t) {
          round_all(o.data() + t * x.V, x.V, dt);
          for (Index v = 0; v < x.V; ++v)
            out[static_cast<std::size_t>((token[t] * x.N + h) * x.V + v)] = o(t, v);
          lse_out[static_cast<std::size_t>(token[t] * x.N + h)] = lse[static_cast<std::size_t>(t * x.N + h)];
        }
      }
    }
  };
  mqa_core(c, req, tok0, q_full.data(), o_lat.data(), lse.data(), KeyRead::kModelDtype);
  project(e.out, e.lse);
  // The decode path's other plain implementation (the header): the same
  // queries over the keys in fp32, where that differs from the rounded keys.
  if (!cache_values_exact(c)) {
    e.out_f32_keys.assign(e.out.size(), kNaNd);
    e.lse_f32_keys.assign(e.lse.size(), kNaNd);
    mqa_core(c, req, tok0, q_full.data(), o_lat.data(), lse.data(), KeyRead::kF32);
    project(e.out_f32_keys, e.lse_f32_keys);
  }
}

// Ordinary attention per (request, head) unit: q rows of c.q, keys and values
// from `kv_of`, which fills K [s, P+R] and V [s, V] (row strides P+R, V) for
// (request, head). Writes out [T, N*V] and lse [T, N].
template <class KvOf>
void mha(const Case& c, std::span<const int> req, KvOf&& kv_of, SdpaResult& e) {
  const Dimensions x = dims_of(c);
  const Index QW = x.P + x.R;
  const DType dt = c.spec.dtype;
  const float scale = static_cast<float>(c.spec.softmax_scale());
  Index max_s = 0, max_q = 0;
  for (int i : req) {
    max_s = std::max<Index>(max_s, c.seq_lens[i]);
    max_q = std::max<Index>(max_q, c.query_lens[i]);
  }
  const auto num_units = static_cast<std::int64_t>(req.size()) * x.N;
#pragma omp parallel
  {
    Scratch scratch;
    std::vector<float> k(static_cast<std::size_t>(max_s * QW)), v(static_cast<std::size_t>(max_s * x.V));
    std::vector<float> q(static_cast<std::size_t>(max_q * QW)), o(static_cast<std::size_t>(max_q * x.V));
    std::vector<float> lse(static_cast<std::size_t>(max_q));
    std::vector<int> visible;
    MatF scratch_kv;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t unit = 0; unit < num_units; ++unit) {
      const int i = req[static_cast<std::size_t>(unit / x.N)];
      const Index h = unit % x.N;
      const Index q_len = c.query_lens[i], t0 = c.query_start_loc[i];
      if (q_len == 0) continue;
      visible.resize(static_cast<std::size_t>(q_len));
      for (Index u = 0; u < q_len; ++u) visible[static_cast<std::size_t>(u)] = visible_keys(c, i, u);
      if (c.seq_lens[i] > 0) kv_of(i, h, k.data(), v.data(), scratch_kv);
      for (Index u = 0; u < q_len; ++u) load(c.q.view(), ((t0 + u) * x.N + h) * QW, QW, q.data() + u * QW, dt);
      sdpa_rows(q.data(), q_len, QW, k.data(), QW, v.data(), x.V, x.V, visible.data(), scale, dt, o.data(),
                lse.data(), scratch);
      for (Index u = 0; u < q_len; ++u) {
        for (Index j = 0; j < x.V; ++j)
          e.out[static_cast<std::size_t>(((t0 + u) * x.N + h) * x.V + j)] = o[static_cast<std::size_t>(u * x.V + j)];
        e.lse[static_cast<std::size_t>((t0 + u) * x.N + h)] = lse[static_cast<std::size_t>(u)];
      }
    }
  }
}

// mha through the emulator: every request in one call, all heads at once.
// kv16_of(i, k_buf, v_buf, a) gives request i's K [s, N, P+R] and V [s, N, V]
// rows, model-dtype bits, contiguous (their own memory, or gathered into the
// buffers), and may name their latent rows in `a`.
template <class Kv16Of>
void mha_emulated(const Case& c, std::span<const int> req, Kv16Of&& kv16_of, SdpaResult& e, AttentionEmulator emulate) {
  const Dimensions x = dims_of(c);
  const Index QW = x.P + x.R;
  const bool bf16 = c.spec.dtype == DType::kBF16;
  std::vector<std::vector<std::uint16_t>> k_bufs(req.size()), v_bufs(req.size());
  Index rows_total = 0;
  for (int i : req) rows_total += c.query_lens[i];
  const auto n_all = static_cast<std::size_t>(rows_total * x.N);
  std::vector<float> o(n_all * static_cast<std::size_t>(x.V)), max(n_all), sum(n_all);
  std::vector<EmulatedAttention> calls;
  std::vector<Index> t0_of;
  std::size_t at = 0;
  for (std::size_t k = 0; k < req.size(); ++k) {
    const int i = req[k];
    const Index q_len = c.query_lens[i], t0 = c.query_start_loc[i];
    if (q_len == 0) continue;
    EmulatedAttention a;
    if (c.seq_lens[i] > 0) {
      const auto [kp, vp] = kv16_of(i, k_bufs[k], v_bufs[k], a);
      a.k = kp;
      a.v = vp;
    }
    a.q = c.q.view().as<std::uint16_t>() + t0 * x.N * QW;
    a.q_row = x.N * QW;
    a.q_head = QW;
    a.k_row = x.N * QW;
    a.k_head = QW;
    a.v_row = x.N * x.V;
    a.v_head = x.V;
    a.elem = bf16 ? EmulatedAttention::Elem::kBF16 : EmulatedAttention::Elem::kF16;
    a.rows = static_cast<int>(q_len);
    a.heads = static_cast<int>(x.N);
    a.rows_per_token = 1;
    a.context = c.context_lens[i];
    a.keys = c.seq_lens[i];
    a.dqk = static_cast<int>(QW);
    a.dv = static_cast<int>(x.V);
    a.scale = static_cast<float>(c.spec.softmax_scale());
    a.bf16 = bf16;
    const std::size_t n = static_cast<std::size_t>(q_len * x.N);
    a.o = o.data() + at * static_cast<std::size_t>(x.V);
    a.max = max.data() + at;
    a.sum = sum.data() + at;
    at += n;
    calls.push_back(a);
    t0_of.push_back(t0);
  }
  emulate(calls);
  for (std::size_t k = 0; k < calls.size(); ++k) {
    const EmulatedAttention& a = calls[k];
    const std::size_t n = static_cast<std::size_t>(a.rows) * static_cast<std::size_t>(x.N);
    // [q_len, N, V] and [q_len, N]: the request's rows of out [T, N*V] and lse [T, N].
    std::copy(a.o, a.o + n * static_cast<std::size_t>(x.V), e.out.begin() + t0_of[k] * x.N * x.V);
    for (std::size_t r = 0; r < n; ++r) e.lse[static_cast<std::size_t>(t0_of[k] * x.N) + r] = lse_of(a.max[r], a.sum[r]);
  }
}

// Whether the projection's latent rows are the model dtype's, so that
// name_latent names them.
bool latent_nameable(const Case& c, const KvProjection& p) {
  return p.kv().dtype() == c.spec.dtype && p.pe().dtype() == c.spec.dtype && !p.kv().empty();
}

// Names request i's latent rows in `a` where the projection holds them in the
// model dtype, one after another.
void name_latent(const Case& c, const KvProjection& p, int i, EmulatedAttention& a) {
  const Tensor& kv = p.kv();
  const Tensor& pe = p.pe();
  if (!latent_nameable(c, p)) return;
  const Index kv0 = c.kv_start_loc[i];
  a.latent = kv.data<std::uint16_t>() + kv0 * kv.dim(1);
  a.rope = pe.data<std::uint16_t>() + kv0 * pe.dim(1);
  a.weights_of = &c;
}

// Whether the emulator can take the prefill form's queries (16-bit, as the
// model dtype always is where the emulation runs).
bool emulator_takes_queries(const Case& c) {
  return g_emulator && c.q.view().dtype == c.spec.dtype &&
         (c.spec.dtype == DType::kBF16 || c.spec.dtype == DType::kF16);
}

// K [S, N, P+R] and V [S, N, V] rows of request i, head h, as fp32 (model-dtype values).
void load_kv_rows(const Case& c, const TensorView& k, const TensorView& v, int i, Index h, float* kd, float* vd) {
  const Dimensions x = dims_of(c);
  const Index QW = x.P + x.R, s = c.seq_lens[i], kv0 = c.kv_start_loc[i];
  for (Index j = 0; j < s; ++j) {
    load(k, ((kv0 + j) * x.N + h) * QW, QW, kd + j * QW, c.spec.dtype);
    load(v, ((kv0 + j) * x.N + h) * x.V, x.V, vd + j * x.V, c.spec.dtype);
  }
}

// [k_nope | v] = round(kv_c @ [W_UK | W_UV]) comes from the case's KvProjection
// (the glue's own up-projection: fp32 dot products rounded once, row by row).
void emulate_prefill_form(const Case& c, std::span<const int> req, const KvProjection* shared, SdpaResult& e) {
  std::optional<KvProjection> own;
  if (!shared) {
    own.emplace(c);
    own->ensure(req);
    shared = &*own;
  }
  // The emulator projects K and V itself from named latent rows: then the
  // projection need not hold the rows (the glue's device-only K and V offer
  // none, harness/run/layer.h).
  if (!prefill_emulation_reads_latent(c, *shared) && !std::all_of(req.begin(), req.end(), [&](int i) { return shared->has(i); }))
    throw std::logic_error("sdpa emulation: the shared KvProjection lacks a request's rows");
  const Dimensions x = dims_of(c);
  const Index QW = x.P + x.R;
  const DType dt = c.spec.dtype;
  if (emulator_takes_queries(c)) {
    const auto kv16_of = [&](int i, std::vector<std::uint16_t>& k_buf, std::vector<std::uint16_t>& v_buf,
                             EmulatedAttention& a) {
      name_latent(c, *shared, i, a);
      const Index s = c.seq_lens[i], kv0 = c.kv_start_loc[i];
      const Index k_w = x.N * QW, v_w = x.N * x.V;
      // A request's rows mostly lie in one piece, one after another: lent as they are.
      const std::uint16_t* k0 = s > 0 ? shared->k_row(kv0) : nullptr;
      const std::uint16_t* v0 = s > 0 ? shared->v_row(kv0) : nullptr;
      bool contiguous = k0 != nullptr;
      for (Index j = 1; j < s && contiguous; ++j)
        contiguous = shared->k_row(kv0 + j) == k0 + j * k_w && shared->v_row(kv0 + j) == v0 + j * v_w;
      if (contiguous) return std::pair{k0, v0};
      // Named latent rows (or no keys): the emulator projects K and V itself, no gather.
      if (a.latent || s == 0) return std::pair<const std::uint16_t*, const std::uint16_t*>{nullptr, nullptr};
      k_buf.resize(static_cast<std::size_t>(s * k_w));
      v_buf.resize(static_cast<std::size_t>(s * v_w));
#pragma omp parallel for schedule(static)
      for (Index j = 0; j < s; ++j) {
        std::copy_n(shared->k_row(kv0 + j), k_w, k_buf.data() + j * k_w);
        std::copy_n(shared->v_row(kv0 + j), v_w, v_buf.data() + j * v_w);
      }
      return std::pair<const std::uint16_t*, const std::uint16_t*>{k_buf.data(), v_buf.data()};
    };
    return mha_emulated(c, req, kv16_of, e, g_emulator);
  }
  mha(
      c, req,
      [&](int i, Index h, float* kd, float* vd, MatF&) {
        // Model-dtype rows: widened exactly (no rounding needed).
        const Index s = c.seq_lens[i], kv0 = c.kv_start_loc[i];
        const bool bf16 = dt == DType::kBF16;
        for (Index j = 0; j < s; ++j) {
          detail::widen_16bit(shared->k_row(kv0 + j) + h * QW, bf16, QW, kd + j * QW);
          detail::widen_16bit(shared->v_row(kv0 + j) + h * x.V, bf16, x.V, vd + j * x.V);
        }
      },
      e);
}

}  // namespace

bool prefill_emulation_reads_latent(const Case& c, const KvProjection& p) {
  return emulator_takes_queries(c) && latent_nameable(c, p);
}

void set_attention_emulator(AttentionEmulator e) { g_emulator = e; }
AttentionEmulator attention_emulator() { return g_emulator; }

std::string_view sdpa_form_name(SdpaForm f) { return f == SdpaForm::kDecode ? "decode" : "prefill"; }

bool cache_values_exact(const Case& c) {
  // fill_cache_values' answer for the values it made (every cache value
  // comes from it); the scan below for a Case put together otherwise.
  if (c.kv_c_cache.empty() && c.k_pe_cache.empty()) return true;
  if (c.cache_values_exact_memo) return *c.cache_values_exact_memo;
  const DType dt = c.spec.dtype;
  const auto exact = [dt](const Tensor& t) {
    if (t.empty()) return true;
    const float* p = t.data<float>();
    const std::int64_t n = t.numel();
    bool ok = true;
#pragma omp parallel for schedule(static) reduction(&& : ok)
    for (std::int64_t k = 0; k < n; ++k) ok = ok && round_to(p[k], dt) == p[k];
    return ok;
  };
  return exact(c.kv_c_cache) && exact(c.k_pe_cache);
}

SdpaResult emulate_sdpa_layer(const Case& c, SdpaForm form, std::span<const int> requests,
                              const KvProjection* projection) {
  check_model_dtype(c);
  const Dimensions x = dims_of(c);
  SdpaResult e = empty_result(c, x.N * x.V);
  for (int i : requests)
    if (i < 0 || i >= c.num_requests) throw std::out_of_range("sdpa emulation: request " + std::to_string(i));
  if (form == SdpaForm::kDecode) {
    emulate_decode_form(c, requests, e);
  } else {
    emulate_prefill_form(c, requests, projection, e);
  }
  return e;
}

double baseline_error(const std::vector<double>& a, const std::vector<double>& b, std::size_t first, std::size_t n) {
  if (first + n > a.size() || first + n > b.size()) throw std::out_of_range("baseline_error: rows past the outputs");
  double worst = 0;
  for (std::size_t k = first; k < first + n; ++k)
    if (std::isfinite(a[k]) && std::isfinite(b[k])) worst = std::max(worst, std::fabs(a[k] - b[k]));
  return worst;
}

double baseline_error(const SdpaResult& e, bool lse, const std::vector<double>& ref, std::size_t first, std::size_t n) {
  const std::vector<double>& main = lse ? e.lse : e.out;
  const std::vector<double>& f32_keys = lse ? e.lse_f32_keys : e.out_f32_keys;
  const double err = baseline_error(main, ref, first, n);
  return f32_keys.empty() ? err : std::max(err, baseline_error(f32_keys, ref, first, n));
}

void layer_baseline_errors(const Case& c, const SdpaResult& e, const std::vector<double>& ref_out,
                           const std::vector<double>& ref_lse, std::span<const int> requests, std::vector<double>& out,
                           std::vector<double>& lse) {
  const auto N = static_cast<std::size_t>(c.spec.num_heads()), V = static_cast<std::size_t>(c.spec.dims.v_head_dim);
  const auto B = static_cast<std::size_t>(c.num_requests);
  if (out.size() != B) out.assign(B, std::numeric_limits<double>::quiet_NaN());
  if (lse.size() != B) lse.assign(B, std::numeric_limits<double>::quiet_NaN());
  for (int i : requests) {
    const auto first = static_cast<std::size_t>(c.query_start_loc[i]);
    const auto count = static_cast<std::size_t>(c.query_lens[i]);
    out[static_cast<std::size_t>(i)] = baseline_error(e, false, ref_out, first * N * V, count * N * V);
    lse[static_cast<std::size_t>(i)] = baseline_error(e, true, ref_lse, first * N, count * N);
  }
}

SdpaResult emulate_sdpa_decode_op(const Case& c, const TensorView& q_lat) {
  check_model_dtype(c);
  const Dimensions x = dims_of(c);
  const Index T = c.num_tokens, D = x.L + x.R;
  if (q_lat.shape != Shape{T, x.N, x.L})
    throw std::invalid_argument("sdpa emulation: q_lat has shape " + shape_str(q_lat.shape) + ", expected " +
                                shape_str({T, x.N, x.L}));
  std::vector<float> q_full(static_cast<std::size_t>(T * x.N * D));
  for (Index r = 0; r < T * x.N; ++r) load(q_lat, r * x.L, x.L, q_full.data() + r * D, c.spec.dtype);
  copy_q_pe(c, 0, T, q_full.data());
  std::vector<int> req(static_cast<std::size_t>(c.num_requests));
  std::vector<Index> tok0(static_cast<std::size_t>(c.num_requests));
  for (int i = 0; i < c.num_requests; ++i) req[i] = i, tok0[i] = c.query_start_loc[i];
  std::vector<float> o(static_cast<std::size_t>(T * x.N * x.L)), lse(static_cast<std::size_t>(T * x.N));
  mqa_core(c, req, tok0, q_full.data(), o.data(), lse.data(), KeyRead::kModelDtype);
  SdpaResult e{std::vector<double>(o.begin(), o.end()), std::vector<double>(lse.begin(), lse.end()), {}, {}};
  // The decode kernel's other plain implementation: the keys in fp32 (the header).
  if (!cache_values_exact(c)) {
    mqa_core(c, req, tok0, q_full.data(), o.data(), lse.data(), KeyRead::kF32);
    e.out_f32_keys.assign(o.begin(), o.end());
    e.lse_f32_keys.assign(lse.begin(), lse.end());
  }
  return e;
}

SdpaResult emulate_sdpa_prefill_op(const Case& c, const TensorView& k, const TensorView& v, const KvProjection* source) {
  check_model_dtype(c);
  const Dimensions x = dims_of(c);
  const Index S = c.num_kv_tokens, QW = x.P + x.R;
  if (k.shape != Shape{S, x.N, QW} || v.shape != Shape{S, x.N, x.V})
    throw std::invalid_argument("sdpa emulation: k " + shape_str(k.shape) + " / v " + shape_str(v.shape) +
                                " do not match [S, N, P+R] / [S, N, V]");
  SdpaResult e = empty_result(c, x.N * x.V);
  std::vector<int> req(static_cast<std::size_t>(c.num_requests));
  for (int i = 0; i < c.num_requests; ++i) req[i] = i;
  if (emulator_takes_queries(c) && k.dtype == c.spec.dtype && v.dtype == c.spec.dtype) {
    const auto kv16_of = [&](int i, std::vector<std::uint16_t>&, std::vector<std::uint16_t>&, EmulatedAttention& a) {
      if (source) name_latent(c, *source, i, a);
      const Index kv0 = c.kv_start_loc[i];
      return std::pair{k.as<std::uint16_t>() + kv0 * x.N * QW, v.as<std::uint16_t>() + kv0 * x.N * x.V};
    };
    mha_emulated(c, req, kv16_of, e, g_emulator);
    return e;
  }
  mha(c, req, [&](int i, Index h, float* kd, float* vd, MatF&) { load_kv_rows(c, k, v, i, h, kd, vd); }, e);
  return e;
}

}  // namespace mlagate
