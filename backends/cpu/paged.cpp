// cpu.paged: decode through the block table in one pass over each request's
// keys, and ordinary varlen prefill, both with a GPU kernel's precision
// (attention_core.h), and its own cache writer for every kv cache dtype
// (cache_writer.cpp). Parallel over blocks of (token, head) rows.
#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#include "backends/cpu/attention_core.h"
#include "backends/cpu/cpu_backends.h"

namespace mlagate {
namespace {

using detail::AttendInput;
using detail::KernelFaults;

// Prefill query rows attended at once per (request, head): bounds the logits
// scratch to kPrefillRows x keys.
constexpr int kPrefillRows = 128;

void paged_decode(const DecodeArgs& a, const KernelFaults& faults, detail::GatheredKeys& keys) {
  const detail::DecodeCall call(a, faults, keys);
  const int l = call.l, d = call.d, num_blocks = call.num_blocks;
  const DType dt = call.dt;
  const std::vector<detail::RowBlock>& blocks = call.blocks;

#pragma omp parallel
  {
    std::vector<float> q, o, row_lse;
    detail::AttendScratch scratch;
    std::vector<int> visible;
#pragma omp for schedule(dynamic)
    for (int i = 0; i < num_blocks; ++i) {
      const detail::RowBlock& blk = blocks[i];
      const int b = blk.request;
      detail::load_decode_rows(a, blk, faults, q, visible);
      o.resize(static_cast<std::size_t>(blk.rows) * l);
      row_lse.resize(blk.rows);
      const float* k = keys.data.data() + keys.start[b] * d;
      const AttendInput in{.q = q.data(), .rows = blk.rows, .dqk = d,
                           .k = k, .k_stride = d, .v = k, .v_stride = d, .dv = l,
                           .nk = a.seq_lens[b], .visible = visible.data(),
                           .scale = static_cast<float>(a.scale), .p_dtype = dt,
                           .without_max = faults.softmax_without_max};
      detail::attend(in, o.data(), row_lse.data(), scratch);
      call.store_rows(a, blk, o.data(), row_lse.data());
    }
  }
}

[[noreturn]] void bad_prefill(const std::string& what) { throw std::invalid_argument("prefill: " + what); }

void check_prefill_args(const PrefillArgs& a) {
  for (const TensorView* t : {&a.q, &a.k, &a.v, &a.o}) {
    if (t->shape.size() != 3) bad_prefill("q, k, v and o must be 3-d, got " + shape_str(t->shape));
  }
  const DType dt = a.q.dtype;
  detail::check_model_dtype(dt, "prefill q");
  if (a.k.dtype != dt || a.v.dtype != dt || a.o.dtype != dt) bad_prefill("q, k, v and o must share one dtype");
  if (a.lse.dtype != DType::kF32) bad_prefill("lse must be float32");
  const std::int64_t t = a.q.shape[0], n = a.q.shape[1], dqk = a.q.shape[2];
  const std::int64_t sk = a.k.shape[0], dv = a.v.shape[2];
  if (a.k.shape != Shape{sk, n, dqk}) bad_prefill("k has shape " + shape_str(a.k.shape));
  if (a.v.shape != Shape{sk, n, dv}) bad_prefill("v has shape " + shape_str(a.v.shape));
  if (a.o.shape != Shape{t, n, dv}) bad_prefill("o has shape " + shape_str(a.o.shape));
  if (a.lse.shape != Shape{t, n}) bad_prefill("lse has shape " + shape_str(a.lse.shape));
  if (a.cu_seqlens_q.size() != a.cu_seqlens_k.size() || a.cu_seqlens_q.empty()) {
    bad_prefill("cu_seqlens_q and cu_seqlens_k must both have B + 1 entries");
  }
  const std::size_t b = a.cu_seqlens_q.size() - 1;
  if (a.cu_seqlens_q[0] != 0 || a.cu_seqlens_q[b] != t) bad_prefill("cu_seqlens_q must run from 0 to T");
  if (a.cu_seqlens_k[0] != 0 || a.cu_seqlens_k[b] != sk) bad_prefill("cu_seqlens_k must run from 0 to Sk");
  for (std::size_t i = 0; i < b; ++i) {
    if (a.cu_seqlens_q[i + 1] < a.cu_seqlens_q[i] || a.cu_seqlens_k[i + 1] < a.cu_seqlens_k[i]) {
      bad_prefill("cu_seqlens must not decrease");
    }
  }
}

void dense_prefill(const PrefillArgs& a, const KernelFaults& faults) {
  check_prefill_args(a);
  const int n = static_cast<int>(a.q.shape[1]);
  const int dqk = static_cast<int>(a.q.shape[2]);
  const int dv = static_cast<int>(a.v.shape[2]);
  const DType dt = a.q.dtype;
  const int num_requests = static_cast<int>(a.cu_seqlens_q.size()) - 1;
  const std::uint16_t* q = a.q.as<std::uint16_t>();
  const std::uint16_t* k = a.k.as<std::uint16_t>();
  const std::uint16_t* v = a.v.as<std::uint16_t>();
  std::uint16_t* o = a.o.as<std::uint16_t>();
  float* lse = a.lse.as<float>();
  const int items = num_requests * n;

#pragma omp parallel
  {
    std::vector<float> qf, kf, vf, of, row_lse;
    detail::AttendScratch scratch;
    std::vector<int> visible;
#pragma omp for schedule(dynamic)
    for (int item = 0; item < items; ++item) {
      const int b = item / n;
      const int h = item % n;
      const int q0 = a.cu_seqlens_q[b];
      const int q_len = a.cu_seqlens_q[b + 1] - q0;
      const int k0 = a.cu_seqlens_k[b];
      const int k_len = a.cu_seqlens_k[b + 1] - k0;
      if (q_len == 0) continue;
      // This head's keys and values, contiguous, widened once for all its queries.
      kf.resize(static_cast<std::size_t>(k_len) * dqk);
      vf.resize(static_cast<std::size_t>(k_len) * dv);
      for (int j = 0; j < k_len; ++j) {
        const std::int64_t tok = static_cast<std::int64_t>(k0 + j) * n + h;
        detail::widen(k + tok * dqk, kf.data() + static_cast<std::size_t>(j) * dqk, dqk, dt);
        detail::widen(v + tok * dv, vf.data() + static_cast<std::size_t>(j) * dv, dv, dt);
      }
      for (int r0 = 0; r0 < q_len; r0 += kPrefillRows) {
        const int rows = std::min(kPrefillRows, q_len - r0);
        qf.resize(static_cast<std::size_t>(rows) * dqk);
        visible.resize(rows);
        of.resize(static_cast<std::size_t>(rows) * dv);
        row_lse.resize(rows);
        for (int i = 0; i < rows; ++i) {
          const std::int64_t tok = static_cast<std::int64_t>(q0 + r0 + i) * n + h;
          detail::widen(q + tok * dqk, qf.data() + static_cast<std::size_t>(i) * dqk, dqk, dt);
          visible[i] = a.causal ? detail::visible_keys(k_len, q_len, r0 + i, faults.extra_visible_keys) : k_len;
        }
        const AttendInput in{.q = qf.data(), .rows = rows, .dqk = dqk,
                             .k = kf.data(), .k_stride = dqk, .v = vf.data(), .v_stride = dv, .dv = dv,
                             .nk = k_len, .visible = visible.data(),
                             .scale = static_cast<float>(a.scale), .p_dtype = dt};
        detail::attend(in, of.data(), row_lse.data(), scratch);
        for (int i = 0; i < rows; ++i) {
          const std::int64_t tok = static_cast<std::int64_t>(q0 + r0 + i) * n + h;
          detail::narrow(of.data() + static_cast<std::size_t>(i) * dv, o + tok * dv, dv, dt);
          lse[tok] = row_lse[i];
        }
      }
    }
  }
}

class PagedBackend final : public Backend {
 public:
  explicit PagedBackend(const KernelFaults& faults) : faults_(faults) {}

  std::string_view name() const override { return "cpu.paged"; }
  std::string_view description() const override {
    return "CPU paged-cache decode in one pass over the keys, and varlen prefill; fp32 logits, "
           "softmax and accumulation, P rounded to the model dtype before P@V";
  }
  Capabilities capabilities() const override {
    Capabilities caps;
    caps.host_only = true;
    caps.ops = {Op::kDecode, Op::kPrefill, Op::kCacheWrite};
    caps.block_sizes = {16, 1, 32, 64, 128};
    caps.query_len_support = QueryLenSupport::kUniform;
    caps.reorder_threshold = 1;
    caps.dtypes = {DType::kBF16, DType::kF16};
    caps.kv_dtypes = {KvCacheDtype::kAuto, KvCacheDtype::kFp8, KvCacheDtype::kFp8E4m3, KvCacheDtype::kFp8DsMla};
    caps.strided_views = true;  // store_rows and load_decode_rows go through the views' strides
    caps.max_pool_bytes = std::numeric_limits<std::int64_t>::max();  // 64-bit slots and offsets throughout
    return caps;
  }
  void decode(const DecodeArgs& args) override { paged_decode(args, faults_, keys_); }
  void cache_write(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                   std::span<const std::int64_t> slots) override {
    detail::write_cache(cache, kv_c, k_pe, slots, faults_);
  }
  void prefill(const PrefillArgs& args) override { dense_prefill(args, faults_); }
  // --cuda-graph: the host emulation (persistent buffers refreshed in place).
  std::unique_ptr<DecodeGraph> capture_decode(const DecodeArgs& args) override { return emulate_decode_graph(*this, args); }

 private:
  KernelFaults faults_;
  detail::GatheredKeys keys_;  // workspace: one decode call at a time per instance
};

}  // namespace

std::unique_ptr<Backend> detail::make_cpu_paged_with_faults(const KernelFaults& faults) {
  return std::make_unique<PagedBackend>(faults);
}

std::unique_ptr<Backend> make_cpu_paged() { return std::make_unique<PagedBackend>(KernelFaults{}); }

}  // namespace mlagate
