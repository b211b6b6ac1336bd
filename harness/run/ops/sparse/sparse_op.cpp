// Sparse op execution: kernel arguments from a case's index sets, guarded
// outputs, timings.
#include "harness/run/ops/sparse/sparse_op.h"

#include <chrono>
#include <cstring>

#include "backends/sparse_convert.h"
#include "cases/encoding.h"
#include "cases/sparse.h"
#include "reports/profile.h"

namespace mlagate {

namespace {

using Clock = std::chrono::steady_clock;

struct Outputs {
  ProducedOutput o, lse;
};

Outputs make_outputs(const Case& c, const ExecOptions& opt) {
  const std::int64_t T = c.num_tokens, N = c.spec.num_heads(), Dv = c.spec.sparse_dv();
  return {ProducedOutput{"o", GuardedBuffer(c.spec.dtype, {T, N, Dv}, opt.poison, opt.reuse_buffers), N, Dv, false},
          ProducedOutput{"lse", GuardedBuffer(DType::kF32, {T, N}, opt.poison, opt.reuse_buffers), N, 1, true}};
}

// Every slot of a cache as model-dtype rows [slots, L+R] written at `row0`.
void flatten_cache(const PagedCache& cache, DType dt, Tensor& kv, std::int64_t row0) {
  const std::int64_t L = cache.kv_lora_rank, R = cache.rope_dim;
  const std::int64_t slots = static_cast<std::int64_t>(cache.num_blocks) * cache.block_size;
  const bool bf16 = dt == DType::kBF16;
  const auto round = [bf16](float x) { return bf16 ? f32_to_bf16(x) : f32_to_f16(x); };
  std::vector<float> a(static_cast<std::size_t>(L)), b(static_cast<std::size_t>(R));
  for (std::int64_t s = 0; s < slots; ++s) {
    std::uint16_t* out = kv.data<std::uint16_t>() + (row0 + s) * (L + R);
    if (cache.kv_dtype == KvCacheDtype::kAuto) {
      std::memcpy(out, cache.entry(s), static_cast<std::size_t>((L + R) * 2));  // 16-bit values verbatim
      continue;
    }
    reference_cache_read(cache, s, a.data(), b.data());
    for (std::int64_t k = 0; k < L; ++k) out[k] = round(a[static_cast<std::size_t>(k)]);
    for (std::int64_t k = 0; k < R; ++k) out[L + k] = round(b[static_cast<std::size_t>(k)]);
  }
}

// Both sparse kernels end alike: the sink, scale and guarded outputs handed
// over, the call timed, both outputs checked and moved into the run.
template <class Args>
OpRun call_sparse_kernel(Backend& b, void (Backend::*kernel)(const Args&), Args& a, const Case& c, Outputs& out,
                         const char* path) {
  OpRun run;
  a.sink = c.sparse->sink;
  a.scale = c.spec.softmax_scale();
  a.o = out.o.buf.view();
  a.lse = out.lse.buf.view();
  const auto t0 = Clock::now();
  (b.*kernel)(a);
  run.run_ms = backend_call_done(t0);
  finish_kernel_op(run, out.o, out.lse, c.num_requests, path);
  return run;
}

}  // namespace

SparseDecodeCall::SparseDecodeCall(const Backend& b, const Case& c, const PagedCache& cache, const PagedCache* extra,
                                   const Tensor& q)
    : rows_(static_cast<std::size_t>(c.num_requests)) {
  const SparseInputs& sp = *c.sparse;
  for (int i = 0; i < c.num_requests; ++i) rows_[static_cast<std::size_t>(i)] = i;
  args.q = q.view();
  args.cache = &cache;
  if (c.spec.sparse.window > 0) {
    args.window = c.spec.sparse.window;
  } else {
    main_slots_ = global_slots(c, sp.main, cache);
    // A backend that reads the valid slots as a prefix gets them first, as
    // vLLM's indexer emits them (backends/sparse_convert.h).
    order_rows_for(b, main_slots_, !sp.main.length.empty());
    args.indices = main_slots_.view();
    args.topk_length = sp.main.length;
  }
  args.seq_lens = c.seq_lens;
  args.query_start_loc = c.query_start_loc;
  args.block_table_rows = rows_;
  if (extra) {
    extra_slots_ = global_slots(c, sp.extra, *extra);
    args.extra_cache = extra;
    args.extra_indices = extra_slots_.view();
    args.extra_topk_length = sp.extra.length;
  }
  args.sink = sp.sink;
  args.scale = c.spec.softmax_scale();
}

OpRun run_sparse_decode_op(Backend& b, const Case& c, const PagedCache& cache, const PagedCache* extra, const Tensor& q,
                           const ExecOptions& opt) {
  Outputs out = make_outputs(c, opt);
  SparseDecodeCall call(b, c, cache, extra, q);
  return call_sparse_kernel(b, &Backend::sparse_decode, call.args, c, out, "sparse_decode");
}

OpRun run_sparse_prefill_op(Backend& b, const Case& c, const PagedCache& cache, const PagedCache* extra, const Tensor& q,
                            const ExecOptions& opt) {
  const SparseInputs& sp = *c.sparse;
  const std::int64_t D = c.spec.dims.kv_lora_rank + c.spec.dims.rope_dim, T = c.num_tokens;
  const std::int64_t main_slots = static_cast<std::int64_t>(cache.num_blocks) * cache.block_size;
  const std::int64_t extra_rows = extra ? static_cast<std::int64_t>(extra->num_blocks) * extra->block_size : 0;
  Tensor kv(c.spec.dtype, {main_slots + extra_rows, D});
  flatten_cache(cache, c.spec.dtype, kv, 0);
  if (extra) flatten_cache(*extra, c.spec.dtype, kv, main_slots);

  Tensor idx;
  std::vector<std::int32_t> lens;
  if (c.spec.sparse.window == 0) {
    // The oob pattern's unused slots as indices >= S_kv, the prefill kernel's
    // other form of "no key" (the decode op gets them as -1).
    idx = global_slots(c, sp.main, cache, main_slots + extra_rows);
    lens = sp.main.length;
  } else {
    // One row per token: the window's slots, then the compressed ones (offset
    // past the main cache's rows), then -1; the length counts the valid ones.
    Tensor win;
    std::vector<std::int32_t> win_lens;
    window_slots(c, c.spec.sparse.window, cache, win, win_lens);
    Tensor cmp = extra ? global_slots(c, sp.extra, *extra) : Tensor();
    const std::int64_t W = c.spec.sparse.window, K2 = extra ? sp.extra.width : 0;
    idx = Tensor(DType::kI32, {T, W + K2});
    lens.assign(static_cast<std::size_t>(T), 0);
    std::int32_t* o = idx.data<std::int32_t>();
    for (std::int64_t t = 0; t < T; ++t) {
      std::int32_t* row = o + t * (W + K2);
      std::fill(row, row + W + K2, -1);
      int k = 0;
      for (int j = 0; j < win_lens[static_cast<std::size_t>(t)]; ++j) row[k++] = win.data<std::int32_t>()[t * W + j];
      for (int j = 0; j < (extra ? sp.extra.count(static_cast<int>(t)) : 0); ++j)
        row[k++] = static_cast<std::int32_t>(main_slots + cmp.data<std::int32_t>()[t * K2 + j]);
      lens[static_cast<std::size_t>(t)] = k;
      // Past the length: rows of the null block (poisoned), never to be read.
      for (int j = k; j < W + K2; ++j) row[j] = j % cache.block_size;
    }
  }
  Outputs out = make_outputs(c, opt);
  SparsePrefillArgs a;
  a.q = q.view();
  a.kv = kv.view();
  a.indices = idx.view();
  a.topk_length = lens;
  return call_sparse_kernel(b, &Backend::sparse_prefill, a, c, out, "sparse_prefill");
}

}  // namespace mlagate
