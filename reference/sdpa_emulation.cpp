// The seed test's model-dtype SDPA reference emulated in fp32: einsums and
// SDPA as torch evaluates them on 16-bit tensors (see the header for every
// rounding point). The einsums are the glue's row-wise products (glue.h) and
// the attention cores run in the fixed order (emulate_attention_cpu, or the
// GPU's emulator): every element one chain of operations in a fixed order, so
// the bits depend neither on the thread count nor on the machine.
#include "reference/sdpa_emulation.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "cases/encoding.h"
#include "reference/glue.h"
#include "reference/kv_projection.h"
#include "reference/detail/emulation_math.h"
#include "reference/detail/widen.h"

namespace mlagate {
namespace {

using Index = std::int64_t;

constexpr double kNaNd = std::numeric_limits<double>::quiet_NaN();
// The decode form's keys of one emulator call, at most, but one request
// whatever its size: a batch is emulated in groups of requests whose keys
// stay in one buffer of about this size (whole, a vllm batch's were 150 MB).
constexpr Index kKeyBytesPerCall = Index{1} << 25;  // 32 MiB
Index g_key_group_bytes = kKeyBytesPerCall;  // set_decode_key_group_bytes

// x rounded to the nearest model-dtype value (RNE), as fp32.
float round_to(float x, DType dt) {
  return round_to_16bit(x, dt == DType::kBF16);
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
  if (c.q.dtype() != c.spec.dtype)
    throw std::invalid_argument("sdpa emulation: the case's queries are " + std::string(dtype_name(c.q.dtype())) +
                                ", not its model dtype " + std::string(dtype_name(c.spec.dtype)));
}

// The fp32 lse of a row: max + log(sum) (-inf where the row sees no key:
// max -inf, sum 0).
float lse_of(float max, float sum) { return max + std::log(sum); }

// The emulator set (null: emulate_attention_cpu).
AttentionEmulator g_emulator = nullptr;
AttentionEmulator emulator() { return g_emulator ? g_emulator : emulate_attention_cpu; }

// The absorbed attention core's queries [n_tok, N, L+R]: model-dtype values,
// as fp32 and as their 16 bits.
// Tensors, not vectors: their storage comes from the process's pool of kept
// blocks, unzeroed (cases/block_pool.h). At TP 1 a large_prefill batch's are
// 75 and 38 MB, and a vector's zeroed, newly faulted pages cost more than
// the attention's arithmetic on a VM slow to give new memory.
struct Queries {
  Tensor f32;   // [rows, D]
  Tensor bits;  // [rows, D], the model dtype's
  void make_f32(Index rows, Index D) { f32 = Tensor::for_overwrite(DType::kF32, {rows, D}); }
  void make_bits(DType dt) {
    bits = Tensor::for_overwrite(dt, f32.shape());
    // Exact: model-dtype values.
    f32_run_to_16bit(f32.data<float>(), f32.numel(), dt == DType::kBF16, bits.data<std::uint16_t>());
  }
  // bits [n, N, L+R] straight from 16-bit q_lat [n, N, L] and q_pe [n, N,
  // R], as make_f32 of their widened values then make_bits gives them
  // (rounded_again_16bit: the same bits, NaNs made quiet), without the fp32.
  void make_bits_from(const Tensor& q_lat, const Tensor& q_pe) {
    const Index rows = q_lat.shape().at(0) * q_lat.shape().at(1), L = q_lat.shape().at(2), R = q_pe.shape().at(2),
                D = L + R;
    const bool bf16 = q_lat.dtype() == DType::kBF16;
    bits = Tensor::for_overwrite(q_lat.dtype(), {rows, D});
    const std::uint16_t* ql = q_lat.data<std::uint16_t>();
    const std::uint16_t* qp = q_pe.data<std::uint16_t>();
    std::uint16_t* out = bits.data<std::uint16_t>();
#pragma omp parallel for schedule(static)
    for (Index r = 0; r < rows; ++r) {
      for (Index k = 0; k < L; ++k) out[r * D + k] = rounded_again_16bit(ql[r * L + k], bf16);
      for (Index k = 0; k < R; ++k) out[r * D + L + k] = rounded_again_16bit(qp[r * R + k], bf16);
    }
  }
};

// The decode form's widened keys, this thread's: kept from call to call
// (up to kKeyBytesPerCall; a long request's larger buffer is given back),
// as a fresh buffer each call was zeroed and faulted in at a cost above the
// attention's on a VM.
thread_local std::vector<std::byte> t_key_buffer;
std::byte* key_buffer(std::size_t bytes) {
  if (t_key_buffer.size() < bytes) {
    t_key_buffer = {};
    t_key_buffer.resize(bytes);
  }
  return t_key_buffer.data();
}
void trim_key_buffer() {
  if (t_key_buffer.size() > static_cast<std::size_t>(kKeyBytesPerCall)) t_key_buffer = {};
}

// Whether the keys of a model-dtype read go to the emulator as 16 bits (with
// the queries' bits): a cache whose rows are the model dtype or fp32 (rounded
// to it). Otherwise the fp32 queries are read.
bool keys_read_as_16bit(const Case& c) {
  const auto readable16 = [&](const TensorView& v) { return v.dtype == c.spec.dtype || v.dtype == DType::kF32; };
  return readable16(cached_kv_c(c)) && readable16(cached_k_pe(c));
}

// The absorbed attention core: queries of the requests' tokens (tokens of
// request req[k] start at row tok0[k]), keys from the case. Writes o_lat
// [n_tok, N, L] (rounded) and lse [n_tok, N]. Keys read in the model dtype
// go to the emulator as their 16 bits with the queries', fp32 ones (kF32)
// as fp32 with the fp32 queries: the same values, half the bytes. The
// requests go in groups whose keys fit in kKeyBytesPerCall (a request's
// values depend on its own rows alone, so the grouping changes no bit).
void mqa_core(const Case& c, std::span<const int> req, std::span<const Index> tok0, const Queries& q, float* o_lat,
              float* lse, KeyRead read) {
  const AttentionEmulator emulate = emulator();
  const Dimensions x = dims_of(c);
  const Index D = x.L + x.R;
  const DType dt = c.spec.dtype;
  const bool bf16 = dt == DType::kBF16;
  const TensorView kv_c = cached_kv_c(c), k_pe = cached_k_pe(c);
  const bool keys16 = read == KeyRead::kModelDtype && keys_read_as_16bit(c);
  const Index esize = keys16 ? 2 : 4;
  // Row j's keys [kv_c | k_pe] at dst: 16 bits (fp32 values rounded, as the
  // reference's `.to(dtype)`) or fp32 as `read` says.
  const auto load_row = [&](Index row, std::byte* dst) {
    if (!keys16) {
      auto* f = reinterpret_cast<float*>(dst);
      load(kv_c, row * x.L, x.L, f, dt, read);
      load(k_pe, row * x.R, x.R, f + x.L, dt, read);
      return;
    }
    auto* h = reinterpret_cast<std::uint16_t*>(dst);
    const auto part = [&](const TensorView& v, Index first, Index n, std::uint16_t* out) {
      if (v.dtype == dt) {
        std::memcpy(out, v.as<std::uint16_t>() + first, static_cast<std::size_t>(n) * 2);
      } else {
        f32_run_to_16bit(v.as<float>() + first, n, bf16, out);
      }
    };
    part(kv_c, row * x.L, x.L, h);
    part(k_pe, row * x.R, x.R, h + x.L);
  };
  std::vector<float> max, sum;
  std::vector<EmulatedAttention> calls;
  for (std::size_t k0 = 0; k0 < req.size();) {
    // Requests [k0, k1): at least one, and more while their keys fit.
    std::size_t k1 = k0 + 1;
    Index key_rows = c.seq_lens[req[k0]], out_rows = Index{c.query_lens[req[k0]]} * x.N;
    while (k1 < req.size() && (key_rows + c.seq_lens[req[k1]]) * D * esize <= g_key_group_bytes) {
      key_rows += c.seq_lens[req[k1]];
      out_rows += Index{c.query_lens[req[k1]]} * x.N;
      ++k1;
    }
    std::byte* keys = key_buffer(static_cast<std::size_t>(std::max<Index>(key_rows, 1) * D * esize));
    max.resize(static_cast<std::size_t>(out_rows));
    sum.resize(static_cast<std::size_t>(out_rows));
    calls.clear();
    Index at = 0, first = 0;
    for (std::size_t k = k0; k < k1; ++k) {
      const int i = req[k];
      const Index rows = Index{c.query_lens[i]} * x.N, s = c.seq_lens[i], kv0 = c.kv_start_loc[i];
      std::byte* kd = keys + first * D * esize;
      first += s;
      if (rows == 0) continue;
#pragma omp parallel for schedule(static)
      for (Index j = 0; j < s; ++j) load_row(kv0 + j, kd + j * D * esize);
      const Index row = tok0[k] * x.N;
      EmulatedAttention a;
      a.q = keys16 ? static_cast<const void*>(q.bits.data<std::uint16_t>() + row * D)
                   : static_cast<const void*>(q.f32.data<float>() + row * D);
      a.q_row = D;
      a.k = kd;
      a.k_row = D;
      a.v = kd;  // v = kv_c: the first L columns of the keys
      a.v_row = D;
      a.elem = !keys16 ? EmulatedAttention::Elem::kF32 : bf16 ? EmulatedAttention::Elem::kBF16 : EmulatedAttention::Elem::kF16;
      a.rows = static_cast<int>(rows);
      a.rows_per_token = static_cast<int>(x.N);
      a.context = c.context_lens[i];
      a.keys = static_cast<int>(s);
      a.dqk = static_cast<int>(D);
      a.dv = static_cast<int>(x.L);
      a.scale = static_cast<float>(c.spec.softmax_scale());
      a.bf16 = bf16;
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
    k0 = k1;
  }
  trim_key_buffer();
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
  const Index D = x.L + x.R;
  const DType dt = c.spec.dtype;
  // The requests' tokens, packed: request req[k] from row tok0[k].
  std::vector<Index> tok0;
  std::vector<int> token;  // packed row -> token of the case
  for (int i : req) {
    tok0.push_back(static_cast<Index>(token.size()));
    for (int u = 0; u < c.query_lens[i]; ++u) token.push_back(c.query_start_loc[i] + u);
  }
  const Index n = static_cast<Index>(token.size());
  if (n == 0) return;
  // ql = round(q_nope @ W_UK) and q_pe: the glue's absorbed queries (the
  // same einsum, an fp32 chain per element rounded once), widened.
  Tensor q_lat, q_pe;
  absorb_queries(c, token, q_lat, q_pe);
  // The 16 bits go to the keys' model-dtype read; the fp32 values only to
  // the fp32 keys' read (below) and to a cache not read as 16 bits, so they
  // are made only for those (at TP 1 a large_prefill batch's are 75 MB).
  Queries q;
  q.make_bits_from(q_lat, q_pe);
  const bool f32_keys = !cache_values_exact(c);
  if (f32_keys || !keys_read_as_16bit(c)) {
    q.make_f32(n * x.N, D);
    float* qf = q.f32.data<float>();
#pragma omp parallel for schedule(static)
    for (Index r = 0; r < n * x.N; ++r) {
      detail::widen_16bit(q_lat.view(), r * x.L, x.L, qf + r * D);
      detail::widen_16bit(q_pe.view(), r * x.R, x.R, qf + r * D + x.L);
    }
  }
  // Every row is written by the emulator (a row that sees no key gets zeros).
  Tensor o_lat_t = Tensor::for_overwrite(DType::kF32, {n, x.N, x.L});
  float* const o_lat = o_lat_t.data<float>();
  std::vector<float> lse(static_cast<std::size_t>(n * x.N));
  // out = round(o_lat @ W_UV): the glue's output projection of the packed
  // rows into their tokens' rows.
  Tensor projected = Tensor::for_overwrite(dt, {Index{c.num_tokens}, x.N, x.V});
  const auto project = [&](std::vector<double>& out, std::vector<double>& lse_out) {
    project_latent_output(c, o_lat_t.view(), token, projected);
    const bool bf16 = dt == DType::kBF16;
    const std::uint16_t* p = projected.data<std::uint16_t>();
    for (Index t = 0; t < n; ++t) {
      const Index row = Index{token[static_cast<std::size_t>(t)]} * x.N;
      for (Index k = 0; k < x.N * x.V; ++k)
        out[static_cast<std::size_t>(row * x.V + k)] = bf16 ? bf16_to_f32(p[row * x.V + k]) : f16_to_f32(p[row * x.V + k]);
      for (Index h = 0; h < x.N; ++h)
        lse_out[static_cast<std::size_t>(row + h)] = lse[static_cast<std::size_t>(t * x.N + h)];
    }
  };
  mqa_core(c, req, tok0, q, o_lat, lse.data(), KeyRead::kModelDtype);
  project(e.out, e.lse);
  // The decode path's other plain implementation (the header): the same
  // queries over the keys in fp32, where that differs from the rounded keys.
  if (f32_keys) {
    e.out_f32_keys.assign(e.out.size(), kNaNd);
    e.lse_f32_keys.assign(e.lse.size(), kNaNd);
    mqa_core(c, req, tok0, q, o_lat, lse.data(), KeyRead::kF32);
    project(e.out_f32_keys, e.lse_f32_keys);
  }
}

// Where one call's K and V rows lie when they are not one block: gathered,
// or each row's address.
struct KvRows {
  std::vector<std::uint16_t> k, v;
  std::vector<const void*> k_rows, v_rows;
};

// Ordinary attention, every request in one emulator call, all heads at once.
// kv16_of(i, rows, a) sets request i's K [s, N, P+R] and V [s, N, V] rows,
// model-dtype bits, in `a` (a.k and a.v, or a.k_rows and a.v_rows, the
// memory they name held in `rows`), or names their latent rows there.
template <class Kv16Of>
void mha(const Case& c, std::span<const int> req, Kv16Of&& kv16_of, SdpaResult& e) {
  const Dimensions x = dims_of(c);
  const Index QW = x.P + x.R;
  const bool bf16 = c.spec.dtype == DType::kBF16;
  std::vector<KvRows> rows(req.size());
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
    if (c.seq_lens[i] > 0) kv16_of(i, rows[k], a);
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
  emulator()(calls);
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

// Whether the emulator set projects K and V from named latent rows itself
// (the GPU's: a sixteenth of the bytes to move). The CPU reads the rows the
// projection holds instead: projecting them again would be the glue's TFLOP
// once more.
bool emulator_projects(const Case& c, const KvProjection& p) { return g_emulator && latent_nameable(c, p); }

// [k_nope | v] = round(kv_c @ [W_UK | W_UV]) comes from the case's KvProjection
// (the glue's own up-projection: fp32 dot products rounded once, row by row).
void emulate_prefill_form(const Case& c, std::span<const int> req, const KvProjection* shared, SdpaResult& e) {
  std::optional<KvProjection> own;
  if (!shared) {
    own.emplace(c);
    own->ensure(req);
    shared = &*own;
  }
  // An emulator that projects K and V itself from named latent rows: then the
  // projection need not hold the rows (the glue's device-only K and V offer
  // none, harness/run/layer.h).
  const bool projects = emulator_projects(c, *shared);
  if (!projects && !std::all_of(req.begin(), req.end(), [&](int i) { return shared->has(i); }))
    throw std::logic_error("sdpa emulation: the shared KvProjection lacks a request's rows");
  const Dimensions x = dims_of(c);
  const Index QW = x.P + x.R;
  const auto kv16_of = [&](int i, KvRows& rows, EmulatedAttention& a) {
    if (projects) name_latent(c, *shared, i, a);
    const Index s = c.seq_lens[i], kv0 = c.kv_start_loc[i];
    const Index k_w = x.N * QW, v_w = x.N * x.V;
    // A request's rows mostly lie in one piece, one after another: lent as they are.
    const std::uint16_t* k0 = shared->k_row(kv0);
    const std::uint16_t* v0 = shared->v_row(kv0);
    bool contiguous = k0 != nullptr;
    for (Index j = 1; j < s && contiguous; ++j)
      contiguous = shared->k_row(kv0 + j) == k0 + j * k_w && shared->v_row(kv0 + j) == v0 + j * v_w;
    if (contiguous) {
      a.k = k0, a.v = v0;
      return;
    }
    // Named latent rows: the emulator projects K and V itself, no gather.
    if (a.latent) return;
    if (!g_emulator) {
      // The CPU's cores read the rows where they lie (a gather was gigabytes of copies).
      rows.k_rows.resize(static_cast<std::size_t>(s));
      rows.v_rows.resize(static_cast<std::size_t>(s));
      for (Index j = 0; j < s; ++j) {
        rows.k_rows[static_cast<std::size_t>(j)] = shared->k_row(kv0 + j);
        rows.v_rows[static_cast<std::size_t>(j)] = shared->v_row(kv0 + j);
      }
      a.k_rows = rows.k_rows.data(), a.v_rows = rows.v_rows.data();
      return;
    }
    rows.k.resize(static_cast<std::size_t>(s * k_w));
    rows.v.resize(static_cast<std::size_t>(s * v_w));
#pragma omp parallel for schedule(static)
    for (Index j = 0; j < s; ++j) {
      std::copy_n(shared->k_row(kv0 + j), k_w, rows.k.data() + j * k_w);
      std::copy_n(shared->v_row(kv0 + j), v_w, rows.v.data() + j * v_w);
    }
    a.k = rows.k.data(), a.v = rows.v.data();
  };
  mha(c, req, kv16_of, e);
}

}  // namespace

bool prefill_emulation_reads_latent(const Case& c, const KvProjection& p) { return emulator_projects(c, p); }

void set_attention_emulator(AttentionEmulator e) { g_emulator = e; }

std::int64_t set_decode_key_group_bytes(std::int64_t bytes) {
  const Index previous = g_key_group_bytes;
  g_key_group_bytes = bytes > 0 ? bytes : kKeyBytesPerCall;
  return previous;
}
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
  // fp32 values are rounded to the model dtype; the other 16-bit dtype's
  // would not round as the seed's reference casts them.
  if (q_lat.dtype != c.spec.dtype && q_lat.dtype != DType::kF32)
    throw std::invalid_argument("sdpa emulation: q_lat is " + std::string(dtype_name(q_lat.dtype)) +
                                ", not the model dtype or fp32");
  Queries q;
  q.make_f32(T * x.N, D);
  for (Index r = 0; r < T * x.N; ++r) load(q_lat, r * x.L, x.L, q.f32.data<float>() + r * D, c.spec.dtype);
  copy_q_pe(c, 0, T, q.f32.data<float>());
  q.make_bits(c.spec.dtype);
  std::vector<int> req(static_cast<std::size_t>(c.num_requests));
  std::vector<Index> tok0(static_cast<std::size_t>(c.num_requests));
  for (int i = 0; i < c.num_requests; ++i) req[i] = i, tok0[i] = c.query_start_loc[i];
  // Every row is written by the emulator, as in the decode form.
  Tensor o_t = Tensor::for_overwrite(DType::kF32, {T, x.N, x.L});
  const float* o = o_t.data<float>();
  const auto n_o = static_cast<std::size_t>(o_t.numel());
  std::vector<float> lse(static_cast<std::size_t>(T * x.N));
  mqa_core(c, req, tok0, q, o_t.data<float>(), lse.data(), KeyRead::kModelDtype);
  SdpaResult e{std::vector<double>(o, o + n_o), std::vector<double>(lse.begin(), lse.end()), {}, {}};
  // The decode kernel's other plain implementation: the keys in fp32 (the header).
  if (!cache_values_exact(c)) {
    mqa_core(c, req, tok0, q, o_t.data<float>(), lse.data(), KeyRead::kF32);
    e.out_f32_keys.assign(o, o + n_o);
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
  // K and V of another dtype (fp32) are read rounded to the model dtype, as
  // the seed's reference casts them.
  const auto model_dtype = [&](const TensorView& t, Tensor& own) -> const std::uint16_t* {
    if (t.dtype == c.spec.dtype) return t.as<std::uint16_t>();
    own = Tensor::for_overwrite(c.spec.dtype, t.shape);
    const Index n = own.numel();
    std::vector<float> row(static_cast<std::size_t>(std::min<Index>(n, 4096)));
    for (Index at = 0; at < n; at += static_cast<Index>(row.size())) {
      const Index m = std::min<Index>(static_cast<Index>(row.size()), n - at);
      load(t, at, m, row.data(), c.spec.dtype);
      f32_run_to_16bit(row.data(), m, c.spec.dtype == DType::kBF16, own.data<std::uint16_t>() + at);
    }
    return own.data<std::uint16_t>();
  };
  Tensor k_own, v_own;
  const std::uint16_t* k16 = model_dtype(k, k_own);
  const std::uint16_t* v16 = model_dtype(v, v_own);
  const auto kv16_of = [&](int i, KvRows&, EmulatedAttention& a) {
    if (source && emulator_projects(c, *source)) name_latent(c, *source, i, a);
    const Index kv0 = c.kv_start_loc[i];
    a.k = k16 + kv0 * x.N * QW, a.v = v16 + kv0 * x.N * x.V;
  };
  mha(c, req, kv16_of, e);
  return e;
}

}  // namespace mlagate
