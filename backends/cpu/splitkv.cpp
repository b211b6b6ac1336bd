// cpu.splitkv: flash-decoding on the CPU. Each request's keys are cut into
// splits; every split yields a partial fp32 (o, lse) per (token, head), and a
// combine step merges the partials through their LSEs, as split-KV GPU kernels do.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "backends/cpu/attention_core.h"
#include "backends/cpu/cpu_backends.h"

namespace mlagate {
namespace {

using detail::AttendInput;

// Keys per split when the number of splits is chosen from the work.
constexpr int kSplitKeys = 256;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Merges num_splits partials of `rows` rows: part_o [num_splits, rows, dv],
// part_lse [num_splits, rows]. Partials without keys (lse -inf) weigh exactly 0,
// and a row whose partials are all empty gives o = 0, lse = -inf.
void combine(const float* part_o, const float* part_lse, int num_splits, int rows, int dv, float* o, float* lse) {
  for (int i = 0; i < rows; ++i) {
    float* out = o + static_cast<std::size_t>(i) * dv;
    std::fill(out, out + dv, 0.f);
    float m = kNegInf;
    for (int s = 0; s < num_splits; ++s) m = std::max(m, part_lse[static_cast<std::size_t>(s) * rows + i]);
    if (m == kNegInf) {
      lse[i] = kNegInf;
      continue;
    }
    float sum = 0;
    for (int s = 0; s < num_splits; ++s) sum += std::exp(part_lse[static_cast<std::size_t>(s) * rows + i] - m);
    lse[i] = m + std::log(sum);
    for (int s = 0; s < num_splits; ++s) {
      const float w = std::exp(part_lse[static_cast<std::size_t>(s) * rows + i] - lse[i]);
      if (w == 0) continue;
      const float* src = part_o + (static_cast<std::size_t>(s) * rows + i) * dv;
      for (int c = 0; c < dv; ++c) out[c] += w * src[c];
    }
  }
}

class SplitKvBackend final : public Backend {
 public:
  // num_splits 0: one split per kSplitKeys keys of each request.
  explicit SplitKvBackend(int num_splits) : num_splits_(num_splits) {}

  std::string_view name() const override { return "cpu.splitkv"; }
  std::string_view description() const override {
    return "CPU split-KV (flash-decoding) decode: per-split fp32 partials merged through their LSEs; "
           "fp32 logits and softmax, P rounded to the model dtype before P@V";
  }
  Capabilities capabilities() const override {
    Capabilities caps;
    caps.host_only = true;
    caps.ops = {Op::kDecode};
    caps.block_sizes = {64, 16, 32, 128};
    caps.query_len_support = QueryLenSupport::kVarlen;
    // Every request is a decode: the layer op sends prefills through decode too.
    caps.reorder_threshold = 1 << 16;
    caps.dtypes = {DType::kBF16, DType::kF16};
    caps.kv_dtypes = {KvCacheDtype::kAuto, KvCacheDtype::kFp8, KvCacheDtype::kFp8E4m3, KvCacheDtype::kFp8DsMla};
    caps.strided_views = true;  // store_rows and load_decode_rows go through the views' strides
    caps.max_pool_bytes = std::numeric_limits<std::int64_t>::max();  // 64-bit slots and offsets throughout
    return caps;
  }
  void decode(const DecodeArgs& args) override;
  // --cuda-graph: the host emulation (persistent buffers refreshed in place).
  std::unique_ptr<DecodeGraph> capture_decode(const DecodeArgs& args) override { return emulate_decode_graph(*this, args); }

 private:
  int splits_for(int kv_len) const {
    if (num_splits_ > 0) return num_splits_;
    return std::max(1, (kv_len + kSplitKeys - 1) / kSplitKeys);
  }

  int num_splits_;
  detail::GatheredKeys keys_;  // workspace: one decode call at a time per instance
};

void SplitKvBackend::decode(const DecodeArgs& a) {
  detail::GatheredKeys& keys = keys_;
  const detail::DecodeCall call(a, {}, keys);
  const int l = call.l, d = call.d, num_blocks = call.num_blocks;
  const DType dt = call.dt;
  const std::vector<detail::RowBlock>& blocks = call.blocks;

#pragma omp parallel
  {
    std::vector<float> q, part_o, part_lse, o, row_lse;
    detail::AttendScratch scratch;
    std::vector<int> visible, split_visible;
#pragma omp for schedule(dynamic)
    for (int i = 0; i < num_blocks; ++i) {
      const detail::RowBlock& blk = blocks[i];
      const int b = blk.request;
      const int rows = blk.rows;
      const int kv_len = a.seq_lens[b];
      detail::load_decode_rows(a, blk, {}, q, visible);
      const int num_splits = splits_for(kv_len);
      const int split_len = (kv_len + num_splits - 1) / num_splits;
      part_o.resize(static_cast<std::size_t>(num_splits) * rows * l);
      part_lse.resize(static_cast<std::size_t>(num_splits) * rows);
      split_visible.resize(rows);
      for (int s = 0; s < num_splits; ++s) {
        const int k0 = std::min(kv_len, s * split_len);
        const int nk = std::min(kv_len, k0 + split_len) - k0;
        for (int r = 0; r < rows; ++r) split_visible[r] = std::clamp(visible[r] - k0, 0, nk);
        const float* k = keys.data.data() + (keys.start[b] + k0) * d;
        const AttendInput in{.q = q.data(), .rows = rows, .dqk = d,
                             .k = k, .k_stride = d, .v = k, .v_stride = d, .dv = l,
                             .nk = nk, .visible = split_visible.data(),
                             .scale = static_cast<float>(a.scale), .p_dtype = dt};
        detail::attend(in, part_o.data() + static_cast<std::size_t>(s) * rows * l,
                       part_lse.data() + static_cast<std::size_t>(s) * rows, scratch);
      }
      o.resize(static_cast<std::size_t>(rows) * l);
      row_lse.resize(rows);
      combine(part_o.data(), part_lse.data(), num_splits, rows, l, o.data(), row_lse.data());
      call.store_rows(a, blk, o.data(), row_lse.data());
    }
  }
}

}  // namespace

std::unique_ptr<Backend> make_cpu_splitkv() { return std::make_unique<SplitKvBackend>(0); }

std::unique_ptr<Backend> make_cpu_splitkv_forced(int num_splits) {
  if (num_splits < 1) throw std::invalid_argument("cpu.splitkv: num_splits must be >= 1");
  return std::make_unique<SplitKvBackend>(num_splits);
}

}  // namespace mlagate
