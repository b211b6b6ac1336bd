// The planted-bug backends: cpu.paged with one deliberate fault each, either
// planted inside the kernel (detail::KernelFaults) or applied to its outputs.
// Production code paths are untouched; only these wrappers ask for faults.
#include "tests/backends/planted.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/attention_core.h"
#include "cases/encoding.h"
#include "cases/fp8.h"
#include "cases/paged_cache.h"

namespace mlagate {
namespace {

enum class Bug {
  kCausalOffByOne, kScale1Pct, kNullBlockLastToken, kHeadsSwapped, kOneNaN, kLseWrongAxis, kSoftmaxWithoutMax,
  kBlockStride16, kEmptyRowsNaN, kNondeterministic,
  kFp8ReaderPow2Scales, kFp8WriterTruncates, kFp8ReaderIgnoresKScale, kFp8WriterSaturates240,
  kFp8ScaleModelDtypeMultiply,
  kOffset32Bit, kQStrideIsWidth, kWritesRowPadding, kBlocksNotShared
};

// An fp8/fp8_e4m3 cache of well-formed L + R byte entries (anything else goes
// to cpu.paged as it is, which reports what is wrong with it).
bool is_per_tensor_fp8(const PagedCache& c) {
  return (c.kv_dtype == KvCacheDtype::kFp8 || c.kv_dtype == KvCacheDtype::kFp8E4m3) && !c.split_pages() &&
         c.entry_bytes == c.kv_lora_rank + c.rope_dim &&
         c.data.nbytes() == static_cast<std::size_t>(c.num_blocks) * c.block_size * c.entry_bytes;
}

// FlashInfer's MLA kernels (FA2 and FA3) on fp8 caches: k_scale converted to
// the model dtype (`packed2_t{DTypeQ(ckv_scale)}`) and each dequantized pair
// multiplied by it in the model dtype (`__hmul2`). Emulated by reading the
// whole fp8 cache into an `auto` cache of model-dtype entries, each
// round(round(e4m3) * round(k_scale)): the e4m3 value is exact in bf16 and
// fp16, the fp32 product of two 16-bit values is exact (at most 15
// significant bits), so rounding it once to nearest even is __hmul2's
// correctly rounded product. cpu.paged then attends over those keys unchanged.
void read_fp8_cache_in_model_dtype(const PagedCache& fp8, float k_scale, DType model, PagedCache& out) {
  const bool bf16 = model == DType::kBF16;
  const float scale = round_to_16bit(k_scale, bf16);
  // Each of the 256 e4m3 codes as the kernel dequantizes it, in model-dtype
  // bits (NaN codes stay NaN: the poisoned slots read as before).
  std::array<std::uint16_t, 256> value{};
  for (int code = 0; code < 256; ++code) {
    const float product = round_to_16bit(e4m3_to_f32(static_cast<std::uint8_t>(code)), bf16) * scale;
    value[code] = bf16 ? f32_to_bf16(product) : f32_to_f16(product);
  }
  out = fp8;  // block table, slot mapping, shape; the data is replaced below
  out.kv_dtype = KvCacheDtype::kAuto;
  out.k_scale = 1.f;
  out.entry_bytes = 2 * (fp8.kv_lora_rank + fp8.rope_dim);
  out.block_bytes = static_cast<std::int64_t>(fp8.block_size) * out.entry_bytes;
  out.data = Tensor::for_overwrite(DType::kU8, {fp8.num_blocks, fp8.block_size, out.entry_bytes});
  // An fp8 entry is L + R e4m3 bytes (kv_c, then k_pe), an auto entry the
  // same L + R elements in the model dtype: element i of the one is element i
  // of the other over the whole cache.
  const auto* src = reinterpret_cast<const std::uint8_t*>(fp8.data.bytes());
  auto* dst = reinterpret_cast<std::uint16_t*>(out.data.bytes());
  const std::int64_t n = static_cast<std::int64_t>(fp8.num_blocks) * fp8.block_size * (fp8.kv_lora_rank + fp8.rope_dim);
  for (std::int64_t i = 0; i < n; ++i) dst[i] = value[src[i]];
}

detail::KernelFaults faults_for(Bug bug) {
  detail::KernelFaults f;
  if (bug == Bug::kCausalOffByOne) f.extra_visible_keys = 1;
  if (bug == Bug::kNullBlockLastToken) f.last_key_from_null_block = true;
  if (bug == Bug::kSoftmaxWithoutMax) f.softmax_without_max = true;
  if (bug == Bug::kBlockStride16) f.block_stride_16 = true;
  if (bug == Bug::kFp8ReaderPow2Scales) f.reader_pow2_scales = true;
  if (bug == Bug::kFp8WriterTruncates) f.writer_truncates = true;
  if (bug == Bug::kFp8ReaderIgnoresKScale) f.reader_ignores_k_scale = true;
  if (bug == Bug::kFp8WriterSaturates240) f.writer_saturates_240 = true;
  if (bug == Bug::kOffset32Bit) f.offset_32bit = true;
  if (bug == Bug::kQStrideIsWidth) f.q_stride_is_width = true;
  if (bug == Bug::kWritesRowPadding) f.writes_row_padding = true;
  if (bug == Bug::kBlocksNotShared) f.blocks_not_shared = true;
  return f;
}

class PlantedBackend final : public Backend {
 public:
  PlantedBackend(std::string name, std::string description, Bug bug)
      : name_(std::move(name)), description_(std::move(description)), bug_(bug),
        inner_(detail::make_cpu_paged_with_faults(faults_for(bug))) {}

  std::string_view name() const override { return name_; }
  std::string_view description() const override { return description_; }
  Capabilities capabilities() const override { return inner_->capabilities(); }
  Support supports(const CaseSpec& spec, Op op) const override { return inner_->supports(spec, op); }

  void decode(const DecodeArgs& args) override {
    DecodeArgs a = args;
    if (bug_ == Bug::kScale1Pct) a.scale *= 1.01;
    if (bug_ == Bug::kFp8ScaleModelDtypeMultiply && a.cache != nullptr && is_per_tensor_fp8(*a.cache)) {
      read_fp8_cache_in_model_dtype(*a.cache, a.k_scale, a.q_lat.dtype, model_dtype_cache_);
      a.cache = &model_dtype_cache_;
      a.k_scale = 1.f;
    }
    inner_->decode(a);
    corrupt(a.o_lat, a.lse);
  }
  void prefill(const PrefillArgs& args) override {
    PrefillArgs a = args;
    if (bug_ == Bug::kScale1Pct) a.scale *= 1.01;
    inner_->prefill(a);
    corrupt(a.o, a.lse);
  }
  void cache_write(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                   std::span<const std::int64_t> slots) override {
    inner_->cache_write(cache, kv_c, k_pe, slots);
  }

 private:
  // o: [T, N, W] 16-bit model dtype; lse: [T, N] float32.
  void corrupt(const TensorView& o, const TensorView& lse) const {
    const std::int64_t t = o.shape.at(0), n = o.shape.at(1), w = o.shape.at(2);
    switch (bug_) {
      case Bug::kHeadsSwapped: {
        if (n < 2) return;
        auto* p = o.as<std::uint16_t>();
        for (std::int64_t i = 0; i < t; ++i) std::swap_ranges(p + i * n * w, p + i * n * w + w, p + (i * n + 1) * w);
        return;
      }
      case Bug::kOneNaN:
        if (o.numel() > 0) o.as<std::uint16_t>()[0] = o.dtype == DType::kBF16 ? kBF16QuietNaN : kF16QuietNaN;
        return;
      case Bug::kEmptyRowsNaN: {
        // A row that sees no key divides 0 by 0 (lse -inf marks it).
        const float* l = lse.as<float>();
        auto* p = o.as<std::uint16_t>();
        const std::uint16_t nan = o.dtype == DType::kBF16 ? kBF16QuietNaN : kF16QuietNaN;
        for (std::int64_t i = 0; i < t * n; ++i)
          if (std::isinf(l[i]) && l[i] < 0) std::fill(p + i * w, p + (i + 1) * w, nan);
        return;
      }
      case Bug::kNondeterministic:
        // An atomics-order reduction: the last bit of one element depends on
        // the call (far inside any tolerance; only a bitwise repeat sees it).
        if (o.numel() > 0 && (calls_++ % 2 == 1)) o.as<std::uint16_t>()[0] ^= 1u;
        return;
      case Bug::kLseWrongAxis: {
        float* p = lse.as<float>();
        const std::vector<float> right(p, p + t * n);
        for (std::int64_t i = 0; i < t; ++i)
          for (std::int64_t h = 0; h < n; ++h) p[h * t + i] = right[i * n + h];
        return;
      }
      default:
        return;
    }
  }

  std::string name_;
  std::string description_;
  Bug bug_;
  mutable std::uint64_t calls_ = 0;
  std::unique_ptr<Backend> inner_;
  PagedCache model_dtype_cache_;  // bug.fp8_scale_model_dtype_multiply: the fp8 cache as its kernel reads it
};

// One planted bug: its backend is made fresh for each use.
PlantedBug planted(std::string name, std::string description, Status expected, Bug bug,
                   std::function<bool(const CaseSpec&)> exposed_by = {}) {
  return {name, description, expected, [=] { return std::make_unique<PlantedBackend>(name, description, bug); },
          std::move(exposed_by)};
}

}  // namespace

const std::vector<PlantedBug>& planted_bugs() {
  static const std::vector<PlantedBug> bugs = [] {
    std::vector<PlantedBug> v;
    v.push_back(planted("bug.causal_off_by_one",
        "each query also sees the key after its causal limit (the next new token); "
        "invisible when every request has one query token",
        Status::kIncorrect, Bug::kCausalOffByOne));
    v.push_back(planted("bug.scale_1pct", "softmax scale multiplied by 1.01", Status::kIncorrect, Bug::kScale1Pct));
    v.push_back(planted("bug.null_block_last_token",
        "decode reads the last key of each request from block 0 (the poisoned null block) "
        "instead of its own block",
        Status::kNonfinite, Bug::kNullBlockLastToken));
    v.push_back(planted("bug.heads_swapped", "heads 0 and 1 of the output exchanged", Status::kIncorrect, Bug::kHeadsSwapped));
    v.push_back(planted("bug.one_nan", "output element (token 0, head 0, dim 0) set to NaN", Status::kNonfinite, Bug::kOneNaN));
    v.push_back(planted("bug.lse_wrong_axis",
        "lse written as [N, T] into the [T, N] buffer; invisible when T == 1",
        Status::kIncorrect, Bug::kLseWrongAxis));
    v.push_back(planted("bug.softmax_without_max",
        "decode's softmax is exp(s) / sum exp(s) without subtracting the row max (a split-KV partial in fp32 "
        "without a running max): right until a logit passes ~88.7, then inf / inf; only large-magnitude Q reaches it",
        Status::kNonfinite, Bug::kSoftmaxWithoutMax));
    return v;
  }();
  return bugs;
}

const std::vector<PlantedBug>& planted_gate_bugs() {
  static const std::vector<PlantedBug> bugs = [] {
    std::vector<PlantedBug> v;
    v.push_back(planted("bug.block_stride_16",
        "decode addresses a key as block * 16 + offset whatever the cache's block size: exact at block size 16 "
        "(cpu.paged's preferred, the only one the vllm suite runs), wrong keys at every other: the poisoned "
        "(NaN) unused slots of the cache, or another request's keys",
        Status::kNonfinite, Bug::kBlockStride16));
    v.push_back(planted("bug.empty_rows_nan", "rows that see no key (seq_len 0 padding, no context) divide 0 by 0: NaN, not 0",
        Status::kNonfinite, Bug::kEmptyRowsNaN));
    v.push_back(planted("bug.nondeterministic", "the last bit of output element 0 flips on every other call (an atomics-order reduction)",
        Status::kNondeterministic, Bug::kNondeterministic));
    return v;
  }();
  return bugs;
}

const std::vector<PlantedBug>& planted_layout_bugs() {
  static const std::vector<PlantedBug> bugs = [] {
    std::vector<PlantedBug> v;
    v.push_back(planted("bug.offset_32bit",
        "decode computes a block's byte offset block * block_bytes in unsigned 32 bits (flashinfer #3136, "
        "aiter #5765): exact in pools under 4 GiB, a page low in the pool read instead past it",
        Status::kIncorrect, Bug::kOffset32Bit, [](const CaseSpec& c) { return c.layout.pool == PoolSize::k4G; }));
    v.push_back(planted("bug.q_stride_is_width",
        "decode reads q_lat with the row stride of its width (L), not the view's: right for a contiguous q_lat, "
        "other rows of a fused [T, N, L+R] q",
        Status::kIncorrect, Bug::kQStrideIsWidth, [](const CaseSpec& c) { return c.layout.strided; }));
    v.push_back(planted("bug.writes_row_padding",
        "decode writes each o_lat row out to the view's row stride (zeros past L), as a kernel writing whole "
        "padded tiles: nothing past L in a contiguous output, the neighbouring bytes of a larger buffer",
        Status::kIncorrect, Bug::kWritesRowPadding, [](const CaseSpec& c) { return c.layout.strided; }));
    v.push_back(planted("bug.blocks_not_shared",
        "decode gathers each physical block once and looks a request's blocks up at its running block count, "
        "as if no two requests shared a page: shifted keys under prefix caching",
        Status::kIncorrect, Bug::kBlocksNotShared, [](const CaseSpec& c) { return c.layout.shared; }));
    return v;
  }();
  return bugs;
}

const std::vector<PlantedBug>& planted_fp8_bugs() {
  static const std::vector<PlantedBug> bugs = [] {
    std::vector<PlantedBug> v;
    const auto add = [&v](std::string name, std::string description, Bug bug,
                          std::function<bool(const CaseSpec&)> exposed_by) {
      v.push_back(planted(std::move(name), std::move(description), Status::kIncorrect, bug, std::move(exposed_by)));
    };
    const auto ds_mla = [](const CaseSpec& c) { return c.kv_cache_dtype == KvCacheDtype::kFp8DsMla; };
    add("bug.fp8_reader_pow2_scales",
        "decode reads each fp8_ds_mla tile scale as a power of two (its exponent bits only), as a reader "
        "written for UE8M0/pow2 scales does; exact on pow2-rule caches, wrong on raw-rule ones",
        Bug::kFp8ReaderPow2Scales,
        [](const CaseSpec& c) { return c.kv_cache_dtype == KvCacheDtype::kFp8DsMla && c.scale_rule == ScaleRule::kRaw; });
    add("bug.fp8_writer_truncates", "cache_write rounds e4m3 toward zero instead of to nearest even",
        Bug::kFp8WriterTruncates, [](const CaseSpec& c) { return is_fp8(c.kv_cache_dtype); });
    add("bug.fp8_reader_ignores_k_scale", "decode reads fp8/fp8_e4m3 entries as e4m3 without multiplying by k_scale",
        Bug::kFp8ReaderIgnoresKScale, [](const CaseSpec& c) {
          return (c.kv_cache_dtype == KvCacheDtype::kFp8 || c.kv_cache_dtype == KvCacheDtype::kFp8E4m3) && c.k_scale != 1.f;
        });
    add("bug.fp8_scale_model_dtype_multiply",
        "decode dequantizes fp8/fp8_e4m3 entries in the model dtype, as FlashInfer's MLA kernels (FA2, FA3) did: "
        "k_scale rounded to bf16/fp16 and e4m3 * k_scale rounded to it again (__hmul2); exact where k_scale is "
        "(1, 3), every key and value scaled by round(k_scale) / k_scale elsewhere (bf16(0.01): +0.098%): in MLA "
        "the keys are the values, so the bias does not cancel",
        Bug::kFp8ScaleModelDtypeMultiply, [](const CaseSpec& c) {
          return (c.kv_cache_dtype == KvCacheDtype::kFp8 || c.kv_cache_dtype == KvCacheDtype::kFp8E4m3) &&
                 round_to_16bit(c.k_scale, c.dtype == DType::kBF16) != c.k_scale;
        });
    add("bug.fp8_writer_saturates_240",
        "cache_write clamps e4m3 to +-240 (the e4m3fnuz range) instead of +-448: every fp8_ds_mla tile's "
        "amax, and fp8 values beyond 240 * k_scale",
        Bug::kFp8WriterSaturates240, [ds_mla](const CaseSpec& c) {
          return ds_mla(c) || ((c.kv_cache_dtype == KvCacheDtype::kFp8 || c.kv_cache_dtype == KvCacheDtype::kFp8E4m3) &&
                               c.k_scale < 0.02f);
        });
    return v;
  }();
  return bugs;
}

}  // namespace mlagate

namespace mlagate {
namespace {

// A merge_states kernel of the naive form, with one of the two infinity
// mistakes real merges have made (cpu.merge's capabilities otherwise).
class PlantedMerge final : public Backend {
 public:
  enum class Bug { kInfNaN, kPosInfAsValue };
  PlantedMerge(std::string name, Bug bug) : name_(std::move(name)), bug_(bug) {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return "planted merge_states bug"; }
  Capabilities capabilities() const override { return merge_states_capabilities(); }
  void merge_states(const MergeStatesArgs& a) override {
    check_merge_states_args(a);
    const std::int64_t rows = a.prefix_lse.numel(), D = a.prefix_output.shape[2];
    for (std::int64_t r = 0; r < rows; ++r) {
      const float lp = a.prefix_lse.as<float>()[r], ls = a.suffix_lse.as<float>()[r];
      const float m = std::max(lp, ls);
      float wp, ws;
      if (bug_ == Bug::kInfNaN) {
        // No case for infinities: -inf - -inf and inf - inf are NaN.
        wp = std::exp(lp - m), ws = std::exp(ls - m);
      } else {
        // Both -inf handled, but +inf taken for a real value: the side that
        // holds the max gets weight 1 ("saves an exp"), so a +inf side wins.
        if (m == -std::numeric_limits<float>::infinity()) {
          for (std::int64_t x = 0; x < D; ++x) a.output.set(r * D + x, 0.0);
          a.output_lse.as<float>()[r] = m;
          continue;
        }
        wp = lp == m ? 1.f : std::exp(lp - m);
        ws = ls == m ? 1.f : std::exp(ls - m);
      }
      const float sum = wp + ws;
      for (std::int64_t x = 0; x < D; ++x) {
        const float p = static_cast<float>(a.prefix_output.get(r * D + x));
        const float s = static_cast<float>(a.suffix_output.get(r * D + x));
        a.output.set(r * D + x, static_cast<double>((p * wp + s * ws) / sum));
      }
      a.output_lse.as<float>()[r] = m + std::log(sum);
    }
  }

 private:
  std::string name_;
  Bug bug_;
};

}  // namespace

const std::vector<PlantedBug>& planted_merge_bugs() {
  static const std::vector<PlantedBug> bugs = [] {
    std::vector<PlantedBug> v;
    v.push_back({"bug.merge_inf_nan",
                 "merge_states computes exp(lse - max) with no case for infinities: a row empty on both sides "
                 "(-inf - -inf) or a +inf side (FA2's empty row: inf - inf) gives NaN",
                 Status::kNonfinite, [] { return std::make_unique<PlantedMerge>("bug.merge_inf_nan", PlantedMerge::Bug::kInfNaN); },
                 {}});
    v.push_back({"bug.merge_pinf_as_value",
                 "merge_states handles -inf but takes +inf (FA2's empty row) for a real lse: the empty side wins, "
                 "the output is its zeros and the lse +inf",
                 Status::kNonfinite,
                 [] { return std::make_unique<PlantedMerge>("bug.merge_pinf_as_value", PlantedMerge::Bug::kPosInfAsValue); },
                 {}});
    return v;
  }();
  return bugs;
}

}  // namespace mlagate
