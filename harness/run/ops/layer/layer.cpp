// The layer op composed from a backend's kernels as vLLM's MLAAttention does
// (SPEC: Ops): the backend's cache_write, its decode kernel on the absorbed
// queries of the decode requests, its MHA prefill over up-projected keys for
// the prefill requests (new tokens, then the context in chunks merged through
// the LSEs), and the harness's own glue around them (reference/glue.h).
#include "harness/run/ops/layer/layer.h"

#include <algorithm>
#include <optional>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <tuple>

#include "backends/decode_args.h"
#include "harness/run/ops/decode/strided_views.h"
#include "cases/encoding.h"
#include "cases/errors.h"
#include "reference/detail/widen.h"
#include "reference/glue.h"
#include "reports/profile.h"

namespace mlagate {

namespace {

using Clock = std::chrono::steady_clock;

// Copies rows of a 2-D tensor (row indices given) into a new tensor.
Tensor gather_rows(const Tensor& t, std::span<const std::int64_t> rows) {
  Shape s = t.shape();
  const std::size_t row_bytes = t.nbytes() / static_cast<std::size_t>(std::max<std::int64_t>(s[0], 1));
  s[0] = static_cast<std::int64_t>(rows.size());
  Tensor out(t.dtype(), s);
  for (std::size_t i = 0; i < rows.size(); ++i)
    std::memcpy(out.bytes() + i * row_bytes, t.bytes() + static_cast<std::size_t>(rows[i]) * row_bytes, row_bytes);
  return out;
}

// Reads latent rows of request r, positions [from, to), back out of the paged
// cache through the block table (the context a chunked prefill gathers). fp8
// entries are dequantized by the reference reader and rounded to the model
// dtype, as vLLM's gather-and-upconvert into a bf16 workspace does.
void gather_from_cache(const Case& c, const PagedCache& cache, int r, int from, int to, Tensor& kv, Tensor& pe,
                       std::int64_t out_row) {
  const std::int64_t L = c.spec.dims.kv_lora_rank, R = c.spec.dims.rope_dim;
  const bool fp8 = is_fp8(cache.kv_dtype), bf16 = c.spec.dtype == DType::kBF16;
  // Rows are independent: spread over the threads for a long context (a TP 1
  // chunk is 16k rows per backend), where one thread would take milliseconds.
  // A row that throws (a block table a cache writer damaged) must not leave
  // the parallel region, which would end the process: the lowest such row's
  // exception is rethrown after it, the same one whatever the thread count.
  int failed_row = to;
  std::exception_ptr failure;
#pragma omp parallel if (to - from >= 256)
  {
    std::vector<float> kv_f(static_cast<std::size_t>(fp8 ? L : 0)), pe_f(static_cast<std::size_t>(fp8 ? R : 0));
#pragma omp for schedule(static)
    for (int p = from; p < to; ++p) {
      const std::int64_t row = out_row + p - from;
      try {
        if (fp8) {
          reference_cache_read(cache, cache.slot_of(r, p), kv_f.data(), pe_f.data());
          f32_run_to_16bit(kv_f.data(), L, bf16, kv.data<std::uint16_t>() + row * L);
          f32_run_to_16bit(pe_f.data(), R, bf16, pe.data<std::uint16_t>() + row * R);
        } else {
          const std::int64_t slot = cache.slot_of(r, p);
          if (slot < 0 || slot >= static_cast<std::int64_t>(cache.num_blocks) * cache.block_size)
            throw std::out_of_range("context gather: request " + std::to_string(r) + " position " +
                                    std::to_string(p) + " maps to slot " + std::to_string(slot) +
                                    ", outside the cache (its block table was damaged)");
          const std::byte* e = cache.entry(slot);
          std::memcpy(kv.bytes() + row * L * 2, e, static_cast<std::size_t>(L * 2));
          std::memcpy(pe.bytes() + row * R * 2, e + L * 2, static_cast<std::size_t>(R * 2));
        }
      } catch (...) {
#pragma omp critical(mlagate_gather_failure)
        if (p < failed_row) failed_row = p, failure = std::current_exception();
      }
    }
  }
  if (failure) std::rethrow_exception(failure);
}

// A kernel's output as floats: its values are model-dtype or fp32, so exact.
std::vector<float> floats_of(const TensorView& v) {
  std::vector<float> out(static_cast<std::size_t>(v.numel()));
  detail::widen_any(v, 0, v.numel(), out.data());
  return out;
}

std::vector<std::int32_t> cumsum(const std::vector<std::int32_t>& lens) {
  std::vector<std::int32_t> cu{0};
  for (auto l : lens) cu.push_back(cu.back() + l);
  return cu;
}

// One backend's layer op in progress: what every step reads and writes.
struct LayerRun {
  Backend& b;
  const Case& c;
  const ExecOptions& opt;
  LayerMemo* memo;
  const DeviceStaging* staging;  // the prefill path's K and V lent in device memory (LayerMemo::on_device)
  PagedCache& cache;
  OpRun& run;
  Tensor& out;  // [T, N*V] model dtype
  Tensor& lse;  // [T, N] fp32
  std::int64_t N, L, R, V;
};

// 1. New tokens into the cache through the backend's own writer.
void write_new_tokens(LayerRun& s) {
  const Case& c = s.c;
  std::vector<std::int64_t> kv_rows;
  std::vector<std::int64_t> write_slots;
  for (int i = 0; i < c.num_requests; ++i) {
    if (c.seq_lens[i] == 0) continue;  // padding: nothing to write
    for (int u = 0; u < c.query_lens[i]; ++u) {
      kv_rows.push_back(c.kv_start_loc[i] + c.context_lens[i] + u);
      write_slots.push_back(s.cache.slot_mapping.data<std::int64_t>()[c.query_start_loc[i] + u]);
    }
  }
  const Tensor kv_new = gather_rows(c.kv_c, kv_rows), pe_new = gather_rows(c.k_pe, kv_rows);
  const auto t0 = Clock::now();
  s.b.cache_write(s.cache, kv_new.view(), pe_new.view(), write_slots);
  s.run.run_ms += backend_call_done(t0);
}

// 2. Decodes first (vLLM reorders the batch), absorbed into latent space.
void run_decodes(LayerRun& s, const std::vector<int>& dec_req) {
  const Case& c = s.c;
  const std::int64_t N = s.N;
  std::vector<int> tokens;
  std::vector<std::int32_t> seq, qsl{0};
  for (int i : dec_req) {
    for (int u = 0; u < c.query_lens[i]; ++u) tokens.push_back(c.query_start_loc[i] + u);
    seq.push_back(c.seq_lens[i]);
    qsl.push_back(qsl.back() + c.query_lens[i]);
  }
  // From the memo, copied: a backend that writes into its inputs must not
  // change the next backend's.
  Tensor q_lat, q_pe;
  if (s.memo) {
    const auto [ql, qp] = s.memo->absorb(c, tokens);
    q_lat = *ql;
    q_pe = *qp;
  } else {
    absorb_queries(c, tokens, q_lat, q_pe);
  }
  const std::int64_t Td = static_cast<std::int64_t>(tokens.size());
  GuardedBuffer o_lat(c.spec.dtype, {Td, N, s.L}, s.opt.poison, s.opt.reuse_buffers);
  GuardedBuffer d_lse(DType::kF32, {Td, N}, s.opt.poison, s.opt.reuse_buffers);
  std::vector<std::int32_t> rows(dec_req.begin(), dec_req.end());
  // Layout strided: the decode kernel gets vLLM's views where it declares them (cases/LAYOUTS.md).
  const LayoutDecodeCall call(c.spec.layout.strided && s.b.capabilities().strided_views, q_lat, q_pe, o_lat.view(),
                              d_lse.view());
  const DecodeArgs a = call.args(s.cache, {seq, qsl, rows}, c.spec.softmax_scale(), c.spec.k_scale);
  const auto t0 = Clock::now();
  s.b.decode(a);
  s.run.run_ms += backend_call_done(t0);
  std::string where = call.finish(s.cache);
  if (s.run.guard_violation.empty()) s.run.guard_violation = std::move(where);
  note_guard(s.run, o_lat, "decode o_lat");
  note_guard(s.run, d_lse, "decode lse");
  project_latent_output(c, o_lat.view(), tokens, s.out);
  const std::vector<float> dl = floats_of(d_lse.view());
  float* lse_out = s.lse.data<float>();
  for (std::int64_t i = 0; i < Td; ++i)
    for (std::int64_t h = 0; h < N; ++h) lse_out[tokens[i] * N + h] = dl[static_cast<std::size_t>(i * N + h)];
}

// One MHA prefill call of the prefill path: K and V up-projected from the
// latent rows kv/pe (rows: the case's kv row each holds), made on the device
// or in host memory, lent to the backend and checked on return.
class PrefillCall {
 public:
  explicit PrefillCall(LayerRun& s) : s_(s), known_(s.memo ? s.memo->projection() : nullptr) {}
  void operator()(const Tensor& q, const Tensor& kv, const Tensor& pe, std::span<const std::int64_t> rows,
                  const std::vector<std::int32_t>& cu_q, const std::vector<std::int32_t>& cu_k, bool causal,
                  const std::string& what, GuardedBuffer& o, GuardedBuffer& l) {
    PrefillArgs a;
    a.q = q.view();
    a.cu_seqlens_q = cu_q;
    a.cu_seqlens_k = cu_k;
    a.causal = causal;
    a.scale = s_.c.spec.softmax_scale();
    a.o = o.view();
    a.lse = l.view();
    if (made_on_device(a, kv, pe))
      call(a);
    else
      call_from_host(a, kv, pe, rows);
    note_guard(s_.run, o, what + " o");
    note_guard(s_.run, l, what + " lse");
  }

 private:
  void call(PrefillArgs& a) {
    const auto t0 = Clock::now();
    s_.b.prefill(a);
    s_.run.run_ms += backend_call_done(t0);
  }
  // K and V made on the device and lent there: they never pass through
  // host memory. A harness failure here (device memory taken by the
  // backends, say) is not the backend's: it takes the host path.
  bool made_on_device(PrefillArgs& a, const Tensor& kv, const Tensor& pe) {
    if (!s_.staging || !s_.staging->project) return false;
    try {
      const auto [dk, dv] = s_.memo->project_on_device(*s_.staging, s_.c, kv, pe);
      const std::int64_t n = kv.dim(0);
      const Dims& d = s_.c.spec.dims;
      a.k = TensorView{s_.c.spec.dtype, {n, s_.N, d.nope_dim + d.rope_dim}, dk};
      a.v = TensorView{s_.c.spec.dtype, {n, s_.N, s_.V}, dv};
      a.k.on_device = a.v.on_device = true;
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }
  void call_from_host(PrefillArgs& a, const Tensor& kv, const Tensor& pe, std::span<const std::int64_t> rows) {
    LayerMemo* memo = s_.memo;
    Tensor k, v;  // without a memo
    const Tensor* mk = nullptr;
    const Tensor* mv = nullptr;
    if (memo) {
      std::tie(mk, mv) = memo->up_project(s_.c, kv, pe, rows, known_);
    } else {
      up_project_kv(s_.c, kv.view(), pe.view(), k, v);
    }
    a.k = memo ? mk->view() : k.view();
    a.v = memo ? mv->view() : v.view();
    bool on_device = false;
    if (s_.staging) {
      // A harness failure here (device memory taken by the backends, say)
      // is not the backend's: it gets host views, as without a staging,
      // and uploads them itself.
      try {
        std::tie(a.k.data, a.v.data) = memo->on_device(*s_.staging, mk, mv);
        a.k.on_device = a.v.on_device = on_device = true;
      } catch (const std::exception&) {
        a.k.data = const_cast<std::byte*>(mk->bytes());
        a.v.data = const_cast<std::byte*>(mv->bytes());
      }
    }
    if (memo && !on_device) memo->lending(mk, mv);
    try {
      call(a);
    } catch (...) {
      // Checked even so: a backend that wrote into the host tensors it was
      // lent and then threw must not leave them damaged for the next one.
      if (memo && !on_device) memo->returned(mk, mv);
      throw;
    }
    if (memo && !on_device) memo->returned(mk, mv);  // lent on the device: the host's copies were not
  }
  LayerRun& s_;
  // The case's own projection of the prefill requests' rows, shared with the
  // baseline emulation and the next backend (null without a memo).
  KvProjection* known_;
};

// The prefill requests' query rows in the prefill batch.
struct PrefillBatch {
  std::vector<int> requests;
  std::vector<std::int64_t> q_rows, new_kv_rows;
  std::vector<std::int32_t> qlens;
  std::vector<std::int64_t> first_token;  // per prefill request: its first row in the prefill batch
  std::int64_t Tp = 0;
  std::vector<float> acc_o, acc_lse;  // the running LSE merge of the partial results
};

// 3a. Causal attention over the new tokens.
void prefill_new_tokens(LayerRun& s, PrefillCall& call, const Tensor& q_all, PrefillBatch& p) {
  const Case& c = s.c;
  Tensor kv = gather_rows(c.kv_c, p.new_kv_rows), pe = gather_rows(c.k_pe, p.new_kv_rows);
  if (is_fp8(s.cache.kv_dtype)) {
    // fp8 caches: the new tokens too are read back from the cache the
    // backend's cache_write filled, so the reference (over the dequantized
    // cache) is one function of the cache and a writer's error shows here.
    std::int64_t row = 0;
    for (int i : p.requests) {
      if (c.seq_lens[i] > 0) gather_from_cache(c, s.cache, i, c.context_lens[i], c.seq_lens[i], kv, pe, row);
      row += c.query_lens[i];
    }
  }
  GuardedBuffer o(c.spec.dtype, {p.Tp, s.N, s.V}, s.opt.poison, s.opt.reuse_buffers);
  GuardedBuffer l(DType::kF32, {p.Tp, s.N}, s.opt.poison, s.opt.reuse_buffers);
  const auto cu = cumsum(p.qlens);
  call(q_all, kv, pe, p.new_kv_rows, cu, cu, true, "prefill", o, l);
  merge_states(p.acc_o, p.acc_lse, o.view(), l.view(), p.Tp, s.N, s.V);
}

// 3b. The context at `offset`, one chunk read back from the paged cache for
// every prefill request with context left there; false when none has.
bool prefill_context_chunk(LayerRun& s, PrefillCall& call, const Tensor& q_all, PrefillBatch& p, int offset, int chunk) {
  const Case& c = s.c;
  const std::int64_t N = s.N, V = s.V;
  std::vector<std::size_t> sub;  // indices into the requests with context left at this offset
  for (std::size_t k = 0; k < p.requests.size(); ++k)
    if (c.context_lens[p.requests[k]] > offset) sub.push_back(k);
  if (sub.empty()) return false;
  std::vector<std::int64_t> sub_q_rows;
  std::vector<std::int32_t> sub_qlens, sub_klens;
  std::int64_t total_k = 0;
  for (std::size_t k : sub) {
    const int i = p.requests[k];
    for (int u = 0; u < c.query_lens[i]; ++u) sub_q_rows.push_back(p.first_token[k] + u);
    sub_qlens.push_back(c.query_lens[i]);
    sub_klens.push_back(std::min(c.context_lens[i], offset + chunk) - offset);
    total_k += sub_klens.back();
  }
  Tensor kv(c.spec.dtype, {total_k, s.L}), pe(c.spec.dtype, {total_k, s.R});
  std::vector<std::int64_t> chunk_rows;  // the case's kv rows gathered
  std::int64_t row = 0;
  for (std::size_t j = 0; j < sub.size(); ++j) {
    const int i = p.requests[sub[j]];
    gather_from_cache(c, s.cache, i, offset, offset + sub_klens[j], kv, pe, row);
    for (int q = 0; q < sub_klens[j]; ++q) chunk_rows.push_back(std::int64_t{c.kv_start_loc[i]} + offset + q);
    row += sub_klens[j];
  }
  const Tensor q_sub = gather_rows(q_all, sub_q_rows);
  const std::int64_t Ts = static_cast<std::int64_t>(sub_q_rows.size());
  GuardedBuffer o(c.spec.dtype, {Ts, N, V}, s.opt.poison, s.opt.reuse_buffers);
  GuardedBuffer l(DType::kF32, {Ts, N}, s.opt.poison, s.opt.reuse_buffers);
  call(q_sub, kv, pe, chunk_rows, cumsum(sub_qlens), cumsum(sub_klens), false, "context chunk", o, l);
  // Scatter into full-size partials (absent rows: lse -inf, weight 0) and merge.
  Tensor part_o(DType::kF32, {p.Tp, N, V}), part_l(DType::kF32, {p.Tp, N});
  std::fill_n(part_l.data<float>(), p.Tp * N, -std::numeric_limits<float>::infinity());
  const std::vector<float> of = floats_of(o.view()), lf = floats_of(l.view());
  for (std::int64_t i = 0; i < Ts; ++i) {
    const std::int64_t r = sub_q_rows[i];
    for (std::int64_t h = 0; h < N; ++h) part_l.data<float>()[r * N + h] = lf[static_cast<std::size_t>(i * N + h)];
    std::copy_n(of.data() + i * N * V, N * V, part_o.data<float>() + r * N * V);
  }
  merge_states(p.acc_o, p.acc_lse, part_o.view(), part_l.view(), p.Tp, N, V);
  return true;
}

// 3. Prefills: causal attention over the new tokens, then the context read
// back from the paged cache in chunks, merged through the LSEs.
void run_prefills(LayerRun& s, const std::vector<int>& pre_req) {
  const Case& c = s.c;
  const std::int64_t N = s.N, V = s.V;
  PrefillBatch p;
  p.requests = pre_req;
  for (int i : pre_req) {
    p.first_token.push_back(static_cast<std::int64_t>(p.q_rows.size()));
    for (int u = 0; u < c.query_lens[i]; ++u) {
      p.q_rows.push_back(c.query_start_loc[i] + u);
      p.new_kv_rows.push_back(c.kv_start_loc[i] + c.context_lens[i] + u);
    }
    p.qlens.push_back(c.query_lens[i]);
  }
  p.Tp = static_cast<std::int64_t>(p.q_rows.size());
  const Tensor q_all = gather_rows(c.q, p.q_rows);
  p.acc_o.assign(static_cast<std::size_t>(p.Tp * N * V), 0.f);
  p.acc_lse.assign(static_cast<std::size_t>(p.Tp * N), -std::numeric_limits<float>::infinity());
  PrefillCall call(s);
  prefill_new_tokens(s, call, q_all, p);
  const int chunk = std::max(1, s.opt.prefill_chunk);
  for (int offset = 0; prefill_context_chunk(s, call, q_all, p, offset, chunk); offset += chunk) {
  }
  // out is the model dtype (bf16 or fp16), lse fp32: stored as TensorView::set would.
  std::uint16_t* ov = s.out.data<std::uint16_t>();
  float* lse_out = s.lse.data<float>();
  const bool bf16 = c.spec.dtype == DType::kBF16;
  for (std::int64_t i = 0; i < p.Tp; ++i) {
    for (std::int64_t h = 0; h < N; ++h) lse_out[p.q_rows[i] * N + h] = p.acc_lse[static_cast<std::size_t>(i * N + h)];
    f32_run_to_16bit(p.acc_o.data() + i * N * V, N * V, bf16, ov + p.q_rows[i] * N * V);
  }
}

}  // namespace

OpRun run_layer(Backend& b, const Case& c, const PagedCache& base_cache, const ExecOptions& opt, LayerMemo* memo) {
  const Capabilities caps = b.capabilities();
  const Routing routing = route_requests(caps, c.spec);
  if (!routing.support.ok) throw NotSupportedError(routing.support.reason);
  const Dims& d = c.spec.dims;
  const std::int64_t N = c.spec.num_heads(), T = c.num_tokens;
  OpRun run;
  PagedCache own;  // without a memo
  PagedCache& cache = memo ? memo->cache_copy(base_cache) : (own = base_cache);
  Tensor out(c.spec.dtype, {T, N * d.v_head_dim});
  Tensor lse(DType::kF32, {T, N});
  LayerRun s{b,    c,   opt, memo, memo && caps.device_inputs ? device_staging() : nullptr,
             cache, run, out, lse,  N,    d.kv_lora_rank,
             d.rope_dim, d.v_head_dim};
  write_new_tokens(s);
  std::vector<int> dec_req, pre_req;
  for (int i = 0; i < c.num_requests; ++i) (routing.is_decode[i] ? dec_req : pre_req).push_back(i);
  run.paths = routing.paths();
  if (!dec_req.empty()) run_decodes(s, dec_req);
  if (!pre_req.empty()) run_prefills(s, pre_req);

  ProducedOutput po{"out", GuardedBuffer(c.spec.dtype, {T, N * d.v_head_dim}, Poison::kZero), N, d.v_head_dim, false};
  std::memcpy(po.buf.view().data, out.bytes(), out.nbytes());
  ProducedOutput pl{"lse", GuardedBuffer(DType::kF32, {T, N}, Poison::kZero), N, 1, true};
  std::memcpy(pl.buf.view().data, lse.bytes(), lse.nbytes());
  run.outputs.push_back(std::move(po));
  run.outputs.push_back(std::move(pl));
  return run;
}

}  // namespace mlagate
