// Layer composition and kernel-level op execution over guarded buffers.
#include "harness/run/layer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <tuple>

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

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0;
}

}  // namespace

// Four independent multiply-xor lanes per block of words, blocks in parallel,
// each block's lanes mixed with its index so that moved data changes the
// print too.
std::uint64_t fingerprint(const Tensor& t) { return fingerprint(t.bytes(), t.nbytes()); }

std::uint64_t fingerprint(const void* data, std::size_t nbytes) {
  const auto* p = static_cast<const std::byte*>(data);
  const std::int64_t words = static_cast<std::int64_t>(nbytes / 8);
  constexpr std::int64_t kBlock = 1 << 16;
  const std::int64_t blocks = (words + kBlock - 1) / kBlock;
  const auto mix = [](std::uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
  };
  std::uint64_t print = mix(nbytes);
#pragma omp parallel for schedule(static) reduction(^ : print)
  for (std::int64_t b = 0; b < blocks; ++b) {
    std::uint64_t h[4] = {1, 2, 3, 4};
    const std::int64_t end = std::min(words, (b + 1) * kBlock);
    std::int64_t i = b * kBlock;
    for (; i + 4 <= end; i += 4)
      for (int l = 0; l < 4; ++l) {
        std::uint64_t w;
        std::memcpy(&w, p + (i + l) * 8, 8);
        h[l] = (h[l] ^ w) * 0x100000001b3ull;
      }
    for (; i < end; ++i) {
      std::uint64_t w;
      std::memcpy(&w, p + i * 8, 8);
      h[0] = (h[0] ^ w) * 0x100000001b3ull;
    }
    print ^= mix(mix(h[0]) ^ mix(h[1] + 1) ^ mix(h[2] + 2) ^ mix(h[3] + 3) ^ mix(static_cast<std::uint64_t>(b) + 0x9e3779b97f4a7c15ull));
  }
  for (std::size_t i = static_cast<std::size_t>(words) * 8; i < nbytes; ++i)  // the tail bytes
    print = mix(print ^ static_cast<std::uint64_t>(p[i]));
  return print;
}

namespace {

// A memo entry's key: its latent and rope rows' prints. fingerprint(): a long
// context's megabytes on every thread, where std::hash would take one.
std::size_t input_hash(const Tensor& kv, const Tensor& pe) {
  return fingerprint(kv) ^ (fingerprint(pe) * 0x9e3779b97f4a7c15ull);
}

// The entry of `entries` (Projection or DeviceProjection) made from exactly
// these input bytes, or null.
template <class Entries>
auto* find_entry(const Entries& entries, std::size_t h, const Tensor& kv, const Tensor& pe) {
  for (const auto& p : entries)
    if (p->hash == h && same_bytes(p->kv, kv) && same_bytes(p->pe, pe)) return p.get();
  return static_cast<decltype(entries.front().get())>(nullptr);
}

}  // namespace

std::pair<const Tensor*, const Tensor*> LayerMemo::up_project(const Case& c, const Tensor& kv, const Tensor& pe,
                                                              std::span<const std::int64_t> rows, KvProjection* known) {
  const std::size_t h = input_hash(kv, pe);
  if (const auto* p = find_entry(projections_, h, kv, pe)) return {p->k.get(), p->v.get()};
  spare_.reset();  // valid until this call only: its memory serves the new one
  auto p = std::make_unique<Projection>();
  p->hash = h;
  p->k = std::make_shared<Tensor>();
  p->v = std::make_shared<Tensor>();
  if (known) {
    up_project_kv_known(c, kv.view(), pe.view(), rows, *known, *p->k, *p->v);
  } else {
    up_project_kv(c, kv.view(), pe.view(), *p->k, *p->v);
  }
  // Rows the case's projection takes from here are held there whatever the
  // memo does, so such an entry is kept past the byte limit (no memory is
  // saved by dropping it) and always fingerprinted: a backend writing into it
  // must not leave damaged rows behind for the baseline.
  const bool offered = known && known->offer(kv.view(), pe.view(), rows, p->k, p->v) > 0;
  const std::size_t size = kv.nbytes() + pe.nbytes() + (offered ? 0 : p->k->nbytes() + p->v->nbytes());
  if (bytes_ + size > kMaxBytes && !offered) {
    spare_ = std::move(p);
    return {spare_->k.get(), spare_->v.get()};
  }
  p->kv = kv;
  p->pe = pe;
  // Fingerprinted when first lent in host memory (lending()): an entry lent
  // only on the device never needs its prints (2.7 GB of reads at TP 1).
  p->offered_to = offered ? known : nullptr;
  bytes_ += size;
  projections_.push_back(std::move(p));
  return {projections_.back()->k.get(), projections_.back()->v.get()};
}

void LayerMemo::lending(const Tensor* k, const Tensor* v) {
  for (const auto& entry : projections_) {
    Projection& p = *entry;
    if (p.k.get() != k || p.v.get() != v) continue;
    if (!p.printed) {
      p.k_print = fingerprint(*p.k);
      p.v_print = fingerprint(*p.v);
      p.printed = true;
    }
    return;
  }
}

void LayerMemo::returned(const Tensor* k, const Tensor* v) {
  for (auto it = projections_.begin(); it != projections_.end(); ++it) {
    Projection& p = **it;
    if (p.k.get() != k || p.v.get() != v) continue;
    if (!p.printed) throw std::logic_error("LayerMemo::returned: K and V lent in host memory without lending()");
    if (fingerprint(*p.k) != p.k_print || fingerprint(*p.v) != p.v_print) {
      if (p.offered_to) p.offered_to->withdraw(p.k.get());
      bytes_ -= p.kv.nbytes() + p.pe.nbytes() + (p.offered_to ? 0 : p.k->nbytes() + p.v->nbytes());
      if (p.device_k) device_bytes_ -= p.k->nbytes() + p.v->nbytes();
      projections_.erase(it);
    }
    return;
  }
  // spare_: not kept and not offered, nothing to check.
}

PagedCache& LayerMemo::cache_copy(const PagedCache& base) {
  cache_ = base;  // Tensor's assignment: the storage reused, the bytes copied on every thread
  return cache_;
}

std::pair<void*, void*> LayerMemo::on_device(const DeviceStaging& s, const Tensor* k, const Tensor* v) {
  for (const auto& entry : projections_) {
    Projection& p = *entry;
    if (p.k.get() != k || p.v.get() != v) continue;
    const std::size_t size = k->nbytes() + v->nbytes();
    if (!p.device_k && device_bytes_ + size <= kMaxDeviceBytes) {
      std::shared_ptr<void> dk = s.upload(k->bytes(), k->nbytes());
      p.device_v = s.upload(v->bytes(), v->nbytes());
      p.device_k = std::move(dk);
      device_bytes_ += size;
    }
    if (p.device_k)
      return {s.to_scratch(0, p.device_k.get(), k->nbytes(), true), s.to_scratch(1, p.device_v.get(), v->nbytes(), true)};
    break;
  }
  // Not kept (spare_, or past the device limit): straight from the host.
  return {s.to_scratch(0, k->bytes(), k->nbytes(), false), s.to_scratch(1, v->bytes(), v->nbytes(), false)};
}

std::pair<void*, void*> LayerMemo::project_on_device(const DeviceStaging& s, const Case& c, const Tensor& kv,
                                                     const Tensor& pe) {
  if (!s.project) throw std::logic_error("LayerMemo::project_on_device: the staging has no projector");
  const std::size_t h = input_hash(kv, pe);
  DeviceProjection* hit = find_entry(device_projections_, h, kv, pe);
  if (!hit) {
    spare_device_.reset();  // valid until this call only: its device memory serves the new one
    auto p = std::make_unique<DeviceProjection>();
    p->hash = h;
    std::tie(p->k, p->v) = s.project(c, kv.view(), pe.view());
    const Dims& d = c.spec.dims;
    const auto rows = static_cast<std::size_t>(kv.dim(0)), N = static_cast<std::size_t>(c.spec.num_heads());
    p->k_bytes = rows * N * static_cast<std::size_t>(d.nope_dim + d.rope_dim) * 2;
    p->v_bytes = rows * N * static_cast<std::size_t>(d.v_head_dim) * 2;
    if (device_bytes_ + p->k_bytes + p->v_bytes > kMaxDeviceBytes) {
      spare_device_ = std::move(p);
      hit = spare_device_.get();
    } else {
      p->kv = kv;
      p->pe = pe;
      bytes_ += kv.nbytes() + pe.nbytes();
      device_bytes_ += p->k_bytes + p->v_bytes;
      device_projections_.push_back(std::move(p));
      hit = device_projections_.back().get();
    }
  }
  // Scratch copies: a backend writing into what it is lent reaches no one.
  return {s.to_scratch(0, hit->k.get(), hit->k_bytes, true), s.to_scratch(1, hit->v.get(), hit->v_bytes, true)};
}

std::pair<const Tensor*, const Tensor*> LayerMemo::absorb(const Case& c, const std::vector<int>& tokens) {
  for (const auto& a : absorbed_)
    if (a->tokens == tokens) return {&a->q_lat, &a->q_pe};
  auto a = std::make_unique<Absorbed>();
  a->tokens = tokens;
  absorb_queries(c, tokens, a->q_lat, a->q_pe);
  const std::size_t size = a->q_lat.nbytes() + a->q_pe.nbytes();
  if (bytes_ + size > kMaxBytes) {
    spare_absorbed_ = std::move(a);
    return {&spare_absorbed_->q_lat, &spare_absorbed_->q_pe};
  }
  bytes_ += size;
  absorbed_.push_back(std::move(a));
  return {&absorbed_.back()->q_lat, &absorbed_.back()->q_pe};
}

Routing route_requests(const Capabilities& caps, const CaseSpec& spec) {
  Routing r;
  const auto& q = spec.batch.query_lens;
  const bool has_decode = std::find(caps.ops.begin(), caps.ops.end(), Op::kDecode) != caps.ops.end();
  const bool has_prefill = std::find(caps.ops.begin(), caps.ops.end(), Op::kPrefill) != caps.ops.end();
  int threshold = caps.reorder_threshold;
  if (spec.batch.spec_decode) {
    if (caps.query_len_support == QueryLenSupport::kSingleOnly) {
      r.support = Support::no("spec decode needs QueryLenSupport UNIFORM or VARLEN (decode kernel is SINGLE_ONLY)");
      return r;
    }
    threshold = std::max(threshold, *std::max_element(q.begin(), q.end()));
  }
  if (!has_decode) threshold = 0;
  int uniform_len = -1;
  for (std::size_t i = 0; i < q.size(); ++i) {
    bool dec = q[i] <= threshold;
    if (dec && caps.query_len_support == QueryLenSupport::kSingleOnly) dec = q[i] == 1;
    if (dec && caps.query_len_support == QueryLenSupport::kUniform) {
      if (uniform_len < 0) uniform_len = q[i];
      dec = q[i] == uniform_len;
    }
    r.is_decode.push_back(dec);
  }
  for (std::size_t i = 0; i < q.size(); ++i)
    if (!r.is_decode[i] && !has_prefill) {
      r.support = Support::no("request " + std::to_string(i) + " (query_len " + std::to_string(q[i]) +
                              ") takes the prefill path and the backend has no prefill kernel");
      return r;
    }
  return r;
}

void note_guard(OpRun& run, const GuardedBuffer& buf, const std::string& name) {
  if (run.guard_violation.empty()) run.guard_violation = buf.check_guards(name);
}

void finish_kernel_op(OpRun& run, ProducedOutput& out, ProducedOutput& lse, int num_requests, const char* path) {
  note_guard(run, out.buf, out.name);
  note_guard(run, lse.buf, lse.name);
  for (int i = 0; i < num_requests; ++i) run.paths.push_back(path);
  run.outputs.push_back(std::move(out));
  run.outputs.push_back(std::move(lse));
}

OpRun run_layer(Backend& b, const Case& c, const PagedCache& base_cache, const ExecOptions& opt, LayerMemo* memo) {
  const Capabilities caps = b.capabilities();
  const Routing routing = route_requests(caps, c.spec);
  if (!routing.support.ok) throw NotSupportedError(routing.support.reason);
  const Dims& d = c.spec.dims;
  const std::int64_t N = c.spec.num_heads(), L = d.kv_lora_rank, R = d.rope_dim, V = d.v_head_dim;
  const std::int64_t T = c.num_tokens;
  OpRun run;
  PagedCache own;  // without a memo
  PagedCache& cache = memo ? memo->cache_copy(base_cache) : (own = base_cache);
  // The prefill path's K and V lent in device memory (LayerMemo::on_device).
  const DeviceStaging* staging = memo && caps.device_inputs ? device_staging() : nullptr;

  // 1. New tokens into the cache through the backend's own writer.
  std::vector<std::int64_t> kv_rows;
  std::vector<std::int64_t> write_slots;
  for (int i = 0; i < c.num_requests; ++i) {
    if (c.seq_lens[i] == 0) continue;  // padding: nothing to write
    for (int u = 0; u < c.query_lens[i]; ++u) {
      kv_rows.push_back(c.kv_start_loc[i] + c.context_lens[i] + u);
      write_slots.push_back(cache.slot_mapping.data<std::int64_t>()[c.query_start_loc[i] + u]);
    }
  }
  {
    const Tensor kv_new = gather_rows(c.kv_c, kv_rows), pe_new = gather_rows(c.k_pe, kv_rows);
    const auto t0 = Clock::now();
    b.cache_write(cache, kv_new.view(), pe_new.view(), write_slots);
    run.run_ms += backend_call_done(t0);
  }

  Tensor out(c.spec.dtype, {T, N * V});
  Tensor lse(DType::kF32, {T, N});
  std::vector<int> dec_req, pre_req;
  for (int i = 0; i < c.num_requests; ++i) (routing.is_decode[i] ? dec_req : pre_req).push_back(i);
  run.paths = routing.paths();

  // 2. Decodes first (vLLM reorders the batch), absorbed into latent space.
  if (!dec_req.empty()) {
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
    if (memo) {
      const auto [ql, qp] = memo->absorb(c, tokens);
      q_lat = *ql;
      q_pe = *qp;
    } else {
      absorb_queries(c, tokens, q_lat, q_pe);
    }
    const std::int64_t Td = static_cast<std::int64_t>(tokens.size());
    GuardedBuffer o_lat(c.spec.dtype, {Td, N, L}, opt.poison, opt.reuse_buffers);
    GuardedBuffer d_lse(DType::kF32, {Td, N}, opt.poison, opt.reuse_buffers);
    std::vector<std::int32_t> rows(dec_req.begin(), dec_req.end());
    DecodeArgs a;
    a.q_lat = q_lat.view();
    a.q_pe = q_pe.view();
    a.cache = &cache;
    a.seq_lens = seq;
    a.query_start_loc = qsl;
    a.block_table_rows = rows;
    a.scale = c.spec.softmax_scale();
    a.k_scale = c.spec.k_scale;
    a.o_lat = o_lat.view();
    a.lse = d_lse.view();
    const auto t0 = Clock::now();
    b.decode(a);
    run.run_ms += backend_call_done(t0);
    note_guard(run, o_lat, "decode o_lat");
    note_guard(run, d_lse, "decode lse");
    project_latent_output(c, o_lat.view(), tokens, out);
    const std::vector<float> dl = floats_of(d_lse.view());
    float* lse_out = lse.data<float>();
    for (std::int64_t i = 0; i < Td; ++i)
      for (std::int64_t h = 0; h < N; ++h) lse_out[tokens[i] * N + h] = dl[static_cast<std::size_t>(i * N + h)];
  }

  // 3. Prefills: causal attention over the new tokens, then the context read
  // back from the paged cache in chunks, merged through the LSEs.
  if (!pre_req.empty()) {
    std::vector<std::int64_t> q_rows, new_kv_rows;
    std::vector<std::int32_t> qlens;
    std::vector<std::int64_t> first_token;  // per prefill request: its first row in the prefill batch
    for (int i : pre_req) {
      first_token.push_back(static_cast<std::int64_t>(q_rows.size()));
      for (int u = 0; u < c.query_lens[i]; ++u) {
        q_rows.push_back(c.query_start_loc[i] + u);
        new_kv_rows.push_back(c.kv_start_loc[i] + c.context_lens[i] + u);
      }
      qlens.push_back(c.query_lens[i]);
    }
    const std::int64_t Tp = static_cast<std::int64_t>(q_rows.size());
    const Tensor q_all = gather_rows(c.q, q_rows);
    std::vector<float> acc_o(static_cast<std::size_t>(Tp * N * V), 0.f);
    std::vector<float> acc_lse(static_cast<std::size_t>(Tp * N), -std::numeric_limits<float>::infinity());

    // The case's own projection of the prefill requests' rows, shared with the
    // baseline emulation and the next backend (null without a memo or source).
    KvProjection* known = memo ? memo->projection() : nullptr;
    // rows: the case's kv row each row of kv holds.
    auto call_prefill = [&](const Tensor& q, const Tensor& kv, const Tensor& pe, std::span<const std::int64_t> rows,
                            const std::vector<std::int32_t>& cu_q, const std::vector<std::int32_t>& cu_k, bool causal,
                            const std::string& what, GuardedBuffer& o, GuardedBuffer& l) {
      PrefillArgs a;
      a.q = q.view();
      a.cu_seqlens_q = cu_q;
      a.cu_seqlens_k = cu_k;
      a.causal = causal;
      a.scale = c.spec.softmax_scale();
      a.o = o.view();
      a.lse = l.view();
      const auto call = [&] {
        const auto t0 = Clock::now();
        b.prefill(a);
        run.run_ms += backend_call_done(t0);
      };
      // K and V made on the device and lent there: they never pass through
      // host memory. A harness failure here (device memory taken by the
      // backends, say) is not the backend's: it takes the host path below.
      const auto made_on_device = [&] {
        if (!staging || !staging->project) return false;
        try {
          const auto [dk, dv] = memo->project_on_device(*staging, c, kv, pe);
          const std::int64_t s = kv.dim(0);
          a.k = TensorView{c.spec.dtype, {s, N, d.nope_dim + d.rope_dim}, dk};
          a.v = TensorView{c.spec.dtype, {s, N, V}, dv};
          a.k.on_device = a.v.on_device = true;
          return true;
        } catch (const std::exception&) {
          return false;
        }
      };
      if (made_on_device()) {
        call();
      } else {
        Tensor k, v;  // without a memo
        const Tensor* mk = nullptr;
        const Tensor* mv = nullptr;
        if (memo) {
          std::tie(mk, mv) = memo->up_project(c, kv, pe, rows, known);
        } else {
          up_project_kv(c, kv.view(), pe.view(), k, v);
        }
        a.k = memo ? mk->view() : k.view();
        a.v = memo ? mv->view() : v.view();
        bool on_device = false;
        if (staging) {
          // A harness failure here (device memory taken by the backends, say)
          // is not the backend's: it gets host views, as without a staging,
          // and uploads them itself.
          try {
            std::tie(a.k.data, a.v.data) = memo->on_device(*staging, mk, mv);
            a.k.on_device = a.v.on_device = on_device = true;
          } catch (const std::exception&) {
            a.k.data = const_cast<std::byte*>(mk->bytes());
            a.v.data = const_cast<std::byte*>(mv->bytes());
          }
        }
        if (memo && !on_device) memo->lending(mk, mv);
        try {
          call();
        } catch (...) {
          // Checked even so: a backend that wrote into the host tensors it was
          // lent and then threw must not leave them damaged for the next one.
          if (memo && !on_device) memo->returned(mk, mv);
          throw;
        }
        if (memo && !on_device) memo->returned(mk, mv);  // lent on the device: the host's copies were not
      }
      note_guard(run, o, what + " o");
      note_guard(run, l, what + " lse");
    };

    {
      Tensor kv = gather_rows(c.kv_c, new_kv_rows), pe = gather_rows(c.k_pe, new_kv_rows);
      if (is_fp8(cache.kv_dtype)) {
        // fp8 caches: the new tokens too are read back from the cache the
        // backend's cache_write filled, so the reference (over the dequantized
        // cache) is one function of the cache and a writer's error shows here.
        std::int64_t row = 0;
        for (int i : pre_req) {
          if (c.seq_lens[i] > 0) gather_from_cache(c, cache, i, c.context_lens[i], c.seq_lens[i], kv, pe, row);
          row += c.query_lens[i];
        }
      }
      GuardedBuffer o(c.spec.dtype, {Tp, N, V}, opt.poison, opt.reuse_buffers);
      GuardedBuffer l(DType::kF32, {Tp, N}, opt.poison, opt.reuse_buffers);
      const auto cu = cumsum(qlens);
      call_prefill(q_all, kv, pe, new_kv_rows, cu, cu, true, "prefill", o, l);
      merge_states(acc_o, acc_lse, o.view(), l.view(), Tp, N, V);
    }

    const int chunk = std::max(1, opt.prefill_chunk);
    for (int offset = 0;; offset += chunk) {
      std::vector<std::size_t> sub;  // indices into pre_req with context left at this offset
      for (std::size_t k = 0; k < pre_req.size(); ++k)
        if (c.context_lens[pre_req[k]] > offset) sub.push_back(k);
      if (sub.empty()) break;
      std::vector<std::int64_t> sub_q_rows;
      std::vector<std::int32_t> sub_qlens, sub_klens;
      std::int64_t total_k = 0;
      for (std::size_t k : sub) {
        const int i = pre_req[k];
        for (int u = 0; u < c.query_lens[i]; ++u) sub_q_rows.push_back(first_token[k] + u);
        sub_qlens.push_back(c.query_lens[i]);
        sub_klens.push_back(std::min(c.context_lens[i], offset + chunk) - offset);
        total_k += sub_klens.back();
      }
      Tensor kv(c.spec.dtype, {total_k, L}), pe(c.spec.dtype, {total_k, R});
      std::vector<std::int64_t> chunk_rows;  // the case's kv rows gathered
      std::int64_t row = 0;
      for (std::size_t j = 0; j < sub.size(); ++j) {
        const int i = pre_req[sub[j]];
        gather_from_cache(c, cache, i, offset, offset + sub_klens[j], kv, pe, row);
        for (int p = 0; p < sub_klens[j]; ++p) chunk_rows.push_back(std::int64_t{c.kv_start_loc[i]} + offset + p);
        row += sub_klens[j];
      }
      const Tensor q_sub = gather_rows(q_all, sub_q_rows);
      const std::int64_t Ts = static_cast<std::int64_t>(sub_q_rows.size());
      GuardedBuffer o(c.spec.dtype, {Ts, N, V}, opt.poison, opt.reuse_buffers);
      GuardedBuffer l(DType::kF32, {Ts, N}, opt.poison, opt.reuse_buffers);
      call_prefill(q_sub, kv, pe, chunk_rows, cumsum(sub_qlens), cumsum(sub_klens), false, "context chunk", o, l);
      // Scatter into full-size partials (absent rows: lse -inf, weight 0) and merge.
      Tensor part_o(DType::kF32, {Tp, N, V}), part_l(DType::kF32, {Tp, N});
      std::fill_n(part_l.data<float>(), Tp * N, -std::numeric_limits<float>::infinity());
      const std::vector<float> of = floats_of(o.view()), lf = floats_of(l.view());
      for (std::int64_t i = 0; i < Ts; ++i) {
        const std::int64_t r = sub_q_rows[i];
        for (std::int64_t h = 0; h < N; ++h) part_l.data<float>()[r * N + h] = lf[static_cast<std::size_t>(i * N + h)];
        std::copy_n(of.data() + i * N * V, N * V, part_o.data<float>() + r * N * V);
      }
      merge_states(acc_o, acc_lse, part_o.view(), part_l.view(), Tp, N, V);
    }
    // out is the model dtype (bf16 or fp16), lse fp32: stored as TensorView::set would.
    std::uint16_t* ov = out.data<std::uint16_t>();
    float* lse_out = lse.data<float>();
    const bool bf16 = c.spec.dtype == DType::kBF16;
    for (std::int64_t i = 0; i < Tp; ++i) {
      for (std::int64_t h = 0; h < N; ++h) lse_out[q_rows[i] * N + h] = acc_lse[static_cast<std::size_t>(i * N + h)];
      f32_run_to_16bit(acc_o.data() + i * N * V, N * V, bf16, ov + q_rows[i] * N * V);
    }
  }

  ProducedOutput po{"out", GuardedBuffer(c.spec.dtype, {T, N * V}, Poison::kZero), N, V, false};
  std::memcpy(po.buf.view().data, out.bytes(), out.nbytes());
  ProducedOutput pl{"lse", GuardedBuffer(DType::kF32, {T, N}, Poison::kZero), N, 1, true};
  std::memcpy(pl.buf.view().data, lse.bytes(), lse.nbytes());
  run.outputs.push_back(std::move(po));
  run.outputs.push_back(std::move(pl));
  return run;
}

OpRun run_decode_op(Backend& b, const Case& c, const PagedCache& cache, const Tensor& q_lat, const Tensor& q_pe,
                    const ExecOptions& opt) {
  const std::int64_t N = c.spec.num_heads(), L = c.spec.dims.kv_lora_rank, T = c.num_tokens;
  OpRun run;
  ProducedOutput o{"o_lat", GuardedBuffer(c.spec.dtype, {T, N, L}, opt.poison, opt.reuse_buffers), N, L, false};
  ProducedOutput l{"lse", GuardedBuffer(DType::kF32, {T, N}, opt.poison, opt.reuse_buffers), N, 1, true};
  std::vector<std::int32_t> rows(static_cast<std::size_t>(c.num_requests));
  for (int i = 0; i < c.num_requests; ++i) rows[i] = i;
  DecodeArgs a;
  a.q_lat = q_lat.view();
  a.q_pe = q_pe.view();
  a.cache = &cache;
  a.seq_lens = c.seq_lens;
  a.query_start_loc = c.query_start_loc;
  a.block_table_rows = rows;
  a.scale = c.spec.softmax_scale();
  a.k_scale = c.spec.k_scale;
  a.o_lat = o.buf.view();
  a.lse = l.buf.view();
  const auto t0 = Clock::now();
  b.decode(a);
  run.run_ms = backend_call_done(t0);
  finish_kernel_op(run, o, l, c.num_requests, "decode");
  return run;
}

OpRun run_prefill_op(Backend& b, const Case& c, const Tensor& k, const Tensor& v, const ExecOptions& opt) {
  const std::int64_t N = c.spec.num_heads(), V = c.spec.dims.v_head_dim, T = c.num_tokens;
  OpRun run;
  ProducedOutput o{"o", GuardedBuffer(c.spec.dtype, {T, N, V}, opt.poison, opt.reuse_buffers), N, V, false};
  ProducedOutput l{"lse", GuardedBuffer(DType::kF32, {T, N}, opt.poison, opt.reuse_buffers), N, 1, true};
  PrefillArgs a;
  a.q = c.q.view();
  a.k = k.view();
  a.v = v.view();
  a.cu_seqlens_q = c.query_start_loc;
  a.cu_seqlens_k = c.kv_start_loc;
  a.causal = true;
  a.scale = c.spec.softmax_scale();
  a.o = o.buf.view();
  a.lse = l.buf.view();
  const auto t0 = Clock::now();
  b.prefill(a);
  run.run_ms = backend_call_done(t0);
  finish_kernel_op(run, o, l, c.num_requests, "prefill");
  return run;
}

}  // namespace mlagate
