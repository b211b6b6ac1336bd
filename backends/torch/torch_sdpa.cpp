// torch.sdpa.*: torch's scaled_dot_product_attention kernels forced one at a
// time on CUDA. "Supported?" is torch's own dispatcher (at::_fused_sdp_choice)
// with only this kernel enabled, asked about the exact tensors of each call;
// its warnings are the reason given. Then the kernel's op is called directly
// for the output and its log-sum-exp (math returns none: it is at::logsumexp
// over the same fp32 logits).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "backends/torch/torch_backends.h"
#include "cases/errors.h"

namespace mlagate {
namespace {

std::string_view kernel_name(TorchSdpaKernel k) {
  switch (k) {
    case TorchSdpaKernel::kFlash: return "flash";
    case TorchSdpaKernel::kEfficient: return "efficient";
    case TorchSdpaKernel::kCudnn: return "cudnn";
    case TorchSdpaKernel::kMath: return "math";
  }
  return "?";
}

at::ScalarType scalar_type(DType d) {
  switch (d) {
    case DType::kBF16: return at::kBFloat16;
    case DType::kF16: return at::kHalf;
    case DType::kF32: return at::kFloat;
    case DType::kI32: return at::kInt;
    case DType::kU8: return at::kByte;
    default: throw std::invalid_argument("torch.sdpa: unsupported dtype " + std::string(dtype_name(d)));
  }
}

// A view as a tensor on the GPU: a copy of a host view, or a device view
// (TensorView::on_device, prefill's k and v) as it is, not copied.
// A strided host view (layout strided) keeps its strides on the host and
// arrives on the GPU as torch's .to() makes it (a dense copy).
at::Tensor upload(const TensorView& v) {
  std::vector<std::int64_t> shape(v.shape.begin(), v.shape.end());
  const at::TensorOptions o = at::TensorOptions().dtype(scalar_type(v.dtype));
  if (v.on_device) return at::from_blob(v.data, shape, o.device(at::kCUDA, c10::cuda::current_device()));
  if (!v.strides.empty()) return at::from_blob(v.data, shape, v.strides, o).to(at::kCUDA);
  return at::from_blob(v.data, shape, o).to(at::kCUDA);
}

// Copies a GPU tensor into a host view of the same number of elements and dtype.
void download(const at::Tensor& t, const TensorView& dst, std::int64_t first_elem) {
  const at::Tensor host = t.to(at::kCPU, scalar_type(dst.dtype)).contiguous();
  if (!dst.strides.empty()) {  // a strided view (layout strided): its elements only, as output.copy_(o)
    if (first_elem != 0 || host.numel() != dst.numel())
      throw std::logic_error("torch.sdpa: a strided output is written whole");
    dst.unpack_from(host.data_ptr());
    return;
  }
  std::memcpy(static_cast<std::byte*>(dst.data) + first_elem * static_cast<std::int64_t>(dtype_size(dst.dtype)),
              host.data_ptr(), static_cast<std::size_t>(host.numel()) * dtype_size(dst.dtype));
}

// Only `k` enabled while alive, as torch.nn.attention.sdpa_kernel([k]) does.
class OnlyKernel {
 public:
  explicit OnlyKernel(TorchSdpaKernel k) {
    at::Context& ctx = at::globalContext();
    saved_ = {ctx.userEnabledFlashSDP(), ctx.userEnabledMemEfficientSDP(), ctx.userEnabledCuDNNSDP(),
              ctx.userEnabledMathSDP(), ctx.userEnabledOverrideableSDP()};
    ctx.setSDPUseFlash(k == TorchSdpaKernel::kFlash);
    ctx.setSDPUseMemEfficient(k == TorchSdpaKernel::kEfficient);
    ctx.setSDPUseCuDNN(k == TorchSdpaKernel::kCudnn);
    ctx.setSDPUseMath(k == TorchSdpaKernel::kMath);
    // Enabled by default; the dispatcher answers "Invalid backend" for it on
    // CUDA before explaining the others' refusals.
    ctx.setSDPUseOverrideable(false);
  }
  ~OnlyKernel() {
    at::Context& ctx = at::globalContext();
    ctx.setSDPUseFlash(saved_[0]);
    ctx.setSDPUseMemEfficient(saved_[1]);
    ctx.setSDPUseCuDNN(saved_[2]);
    ctx.setSDPUseMath(saved_[3]);
    ctx.setSDPUseOverrideable(saved_[4]);
  }
  OnlyKernel(const OnlyKernel&) = delete;
  OnlyKernel& operator=(const OnlyKernel&) = delete;

 private:
  std::array<bool, 5> saved_{};
};

// Collects torch warnings (the dispatcher explains a refusal through them).
class WarningCapture : public c10::WarningHandler {
 public:
  void process(const c10::Warning& w) override { messages.push_back(w.msg()); }
  std::vector<std::string> messages;
};

// The dispatcher's warnings about kernel k, from its "<kernel> not used
// because:" line to the next such line.
std::string reasons_for(TorchSdpaKernel k, const std::vector<std::string>& messages) {
  const char* header = k == TorchSdpaKernel::kFlash       ? "Flash attention kernel not used because"
                       : k == TorchSdpaKernel::kEfficient ? "Memory efficient kernel not used because"
                       : k == TorchSdpaKernel::kCudnn     ? "cuDNN attention kernel not used because"
                                                           : "";
  std::string out;
  bool in = false;
  for (const std::string& m : messages) {
    const bool is_header = m.find("kernel not used because") != std::string::npos;
    if (is_header) {
      in = *header && m.find(header) != std::string::npos;
      continue;
    }
    if (in) out += (out.empty() ? "" : "; ") + m;
  }
  if (out.empty())
    for (const std::string& m : messages) out += (out.empty() ? "" : "; ") + m;
  return out;
}

// Empty when torch would run kernel k on these tensors, else torch's reason.
std::string refusal(TorchSdpaKernel k, const at::Tensor& q, const at::Tensor& key, const at::Tensor& v, bool causal,
                    double scale) {
  OnlyKernel only(k);
  WarningCapture capture;
  c10::WarningUtils::WarningHandlerGuard guard(&capture);
  // Some refusals are TORCH_WARN_ONCE: every probe must hear them.
  const bool warn_always = c10::WarningUtils::get_warnAlways();
  c10::WarningUtils::set_warnAlways(true);
  std::string why;
  try {
    (void)at::_fused_sdp_choice(q, key, v, {}, 0.0, causal, scale);
  } catch (const c10::Error& e) {
    why = reasons_for(k, capture.messages);
    if (why.empty()) why = e.what_without_backtrace();
  }
  c10::WarningUtils::set_warnAlways(warn_always);
  return why;
}

// One SDPA call of kernel k: q [1, H, Lq, Dqk], key [1, H, Lk, Dqk], v [1, H, Lk, Dv].
// Returns o [1, H, Lq, Dv] (model dtype) and lse [1, H, Lq] (fp32, natural log).
// check: ask the dispatcher first (NotSupportedError with its reason); the
// bench's timed launches skip it, having asked while preparing.
std::pair<at::Tensor, at::Tensor> call(TorchSdpaKernel k, const at::Tensor& q, const at::Tensor& key, const at::Tensor& v,
                                       bool causal, double scale, bool check = true) {
  if (check) {
    if (std::string why = refusal(k, q, key, v, causal, scale); !why.empty())
      throw NotSupportedError("torch.sdpa." + std::string(kernel_name(k)) + ": " + why);
  }
  const std::int64_t lq = q.size(2);
  at::Tensor o, lse;
  switch (k) {
    case TorchSdpaKernel::kFlash: {
      auto r = at::_scaled_dot_product_flash_attention(q, key, v, 0.0, causal, false, scale);
      o = std::get<0>(r);
      lse = std::get<1>(r);
      break;
    }
    case TorchSdpaKernel::kEfficient: {
      auto r = at::_scaled_dot_product_efficient_attention(q, key, v, {}, true, 0.0, causal, scale);
      o = std::get<0>(r);
      lse = std::get<1>(r);
      break;
    }
    case TorchSdpaKernel::kCudnn: {
      auto r = at::_scaled_dot_product_cudnn_attention(q, key, v, {}, true, 0.0, causal, false, scale);
      o = std::get<0>(r);
      lse = std::get<1>(r);
      break;
    }
    case TorchSdpaKernel::kMath: {
      auto r = at::_scaled_dot_product_attention_math(q, key, v, {}, 0.0, causal, {}, scale);
      o = std::get<0>(r);
      at::Tensor logits = at::matmul(q.to(at::kFloat), key.to(at::kFloat).transpose(-2, -1)) * scale;
      if (causal) {
        const at::Tensor upper = at::ones({lq, key.size(2)}, q.options().dtype(at::kBool)).triu(1);
        logits = logits.masked_fill(upper, -std::numeric_limits<float>::infinity());
      }
      lse = at::logsumexp(logits, -1);
      break;
    }
  }
  // Kernels pad or add a trailing axis to their lse ([1, H, 32k] or [1, H, Lq, 1]).
  lse = lse.reshape({q.size(0), q.size(1), -1}).narrow(2, 0, lq).to(at::kFloat);
  return {o, lse};
}

// Keys a query token sees: 0 .. kv_len - q_len + u, clamped (bottom-right rule).
std::int64_t visible(std::int64_t kv_len, std::int64_t q_len, std::int64_t u) {
  return std::clamp<std::int64_t>(kv_len - q_len + u + 1, 0, kv_len);
}

// A decode's tensors on the GPU: the cache's entries as model-dtype
// [num_blocks, bs, L+R], the block table, q = [q_lat | q_pe] and the outputs.
struct DecodeState {
  at::Tensor entries, table, q_full, o_all, lse_all;
  std::vector<std::int32_t> seq_lens, query_start, rows;
  std::int64_t N = 0, L = 0, D = 0, bs = 0;
  double scale = 0;
  bool dequantized = false;  // fp8 entries were dequantized to the model dtype on upload
};

DecodeState upload_decode(const std::string& name, const DecodeArgs& a) {
  const PagedCache& cache = *a.cache;
  DecodeState st;
  const std::int64_t T = a.q_lat.shape.at(0), R = a.q_pe.shape.at(2);
  st.N = a.q_lat.shape.at(1);
  st.L = a.q_lat.shape.at(2);
  st.D = st.L + R;
  st.bs = cache.block_size;
  st.scale = a.scale;
  const at::ScalarType dt = scalar_type(a.q_lat.dtype);
  if (cache.kv_lora_rank != st.L || cache.rope_dim != R) throw std::invalid_argument(name + ": cache dims differ from q_lat/q_pe");
  const at::Tensor raw = upload(TensorView{DType::kU8, {cache.num_blocks, st.bs, cache.entry_bytes}, const_cast<std::byte*>(cache.data.bytes())});
  switch (cache.kv_dtype) {
    case KvCacheDtype::kAuto: st.entries = raw.view(dt); break;
    case KvCacheDtype::kFp8:
    case KvCacheDtype::kFp8E4m3:
      st.entries = (raw.view(at::kFloat8_e4m3fn).to(at::kFloat) * a.k_scale).to(dt);
      st.dequantized = true;
      break;
    default: throw NotSupportedError(name + ": kv cache dtype " + std::string(kv_cache_dtype_name(cache.kv_dtype)));
  }
  st.table = upload(cache.block_table.view()).to(at::kLong);
  st.q_full = at::cat({upload(a.q_lat), upload(a.q_pe)}, -1);  // [T, N, L+R]
  st.o_all = at::zeros({T, st.N, st.L}, st.q_full.options());
  st.lse_all = at::full({T, st.N}, -std::numeric_limits<float>::infinity(), st.q_full.options().dtype(at::kFloat));
  st.seq_lens.assign(a.seq_lens.begin(), a.seq_lens.end());
  st.query_start.assign(a.query_start_loc.begin(), a.query_start_loc.end());
  st.rows.assign(a.block_table_rows.begin(), a.block_table_rows.end());
  return st;
}

// Every request: gather its keys through the block table, then MQA by SDPA
// into st.o_all / st.lse_all (rows of requests without keys are left alone).
void run_decode(TorchSdpaKernel kernel, DecodeState& st, bool check) {
  const std::int64_t N = st.N, L = st.L, D = st.D, bs = st.bs;
  for (std::size_t b = 0; b < st.seq_lens.size(); ++b) {
    const std::int64_t s = st.seq_lens[b], t0 = st.query_start[b], q_len = st.query_start[b + 1] - t0;
    if (s == 0 || q_len == 0) continue;
    const std::int64_t nb = (s + bs - 1) / bs;
    // Gather through the block table on the GPU: [nb, bs, D] -> the request's first s keys.
    const at::Tensor blocks = st.table.select(0, st.rows[b]).narrow(0, 0, nb);
    const at::Tensor keys = st.entries.index_select(0, blocks).reshape({nb * bs, D}).narrow(0, 0, s).contiguous();
    // Queries that see every key run together; the others one token at a time.
    std::int64_t u = 0;
    while (u < q_len) {
      std::int64_t u1 = u + 1;
      const std::int64_t vis = visible(s, q_len, u);
      if (vis == s) u1 = q_len;  // the rest see every key too
      if (vis > 0) {
        const std::int64_t rows = (u1 - u) * N;
        const at::Tensor q = st.q_full.narrow(0, t0 + u, u1 - u).reshape({1, 1, rows, D});
        const at::Tensor k = keys.narrow(0, 0, vis).view({1, 1, vis, D});
        const at::Tensor v = keys.narrow(0, 0, vis).narrow(1, 0, L).view({1, 1, vis, L});
        auto [o, lse] = call(kernel, q, k, v, false, st.scale, check);
        st.o_all.narrow(0, t0 + u, u1 - u).copy_(o.reshape({u1 - u, N, L}));
        st.lse_all.narrow(0, t0 + u, u1 - u).copy_(lse.reshape({u1 - u, N}));
      }
      u = u1;
    }
  }
}

class TorchSdpaBackend final : public Backend {
 public:
  explicit TorchSdpaBackend(TorchSdpaKernel k) : kernel_(k), name_("torch.sdpa." + std::string(kernel_name(k))) {
    description_ = "libtorch " TORCH_VERSION " scaled_dot_product_attention forced to its " +
                   std::string(kernel_name(k)) + " kernel on CUDA; decode: MQA over the paged cache gathered on the GPU";
  }
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return description_; }
  Capabilities capabilities() const override {
    Capabilities c;
    c.ops = {Op::kDecode, Op::kPrefill};
    c.block_sizes = {16, 1, 32, 64, 128};
    c.query_len_support = QueryLenSupport::kVarlen;
    c.reorder_threshold = 1;
    c.dtypes = {DType::kBF16, DType::kF16};
    c.kv_dtypes = {KvCacheDtype::kAuto, KvCacheDtype::kFp8, KvCacheDtype::kFp8E4m3};
    c.device_inputs = true;  // prefill reads k and v from device memory in place (upload())
    c.strided_views = true;  // decode: q gathered by torch (cat), o and lse copied into the views (download())
    return c;
  }
  Support supports(const CaseSpec& spec, Op op) const override;
  void decode(const DecodeArgs& a) override;
  void prefill(const PrefillArgs& a) override;
  std::unique_ptr<DecodeBench> prepare_decode_bench(const DecodeArgs& a) override;

 private:
  // Torch's answer for a representative call of the decode or prefill kernel
  // of this spec's dims and dtype (cached); empty when it runs.
  std::string probe(const CaseSpec& spec, bool decode_kernel) const;
  void need_device() const;

  TorchSdpaKernel kernel_;
  std::string name_, description_;
  mutable std::map<std::tuple<bool, int, int, int, int>, std::string> probes_;
};

void TorchSdpaBackend::need_device() const {
  if (!torch::cuda::is_available()) throw DeviceUnavailableError(name_ + ": no CUDA device (libtorch " TORCH_VERSION ")");
}

std::string TorchSdpaBackend::probe(const CaseSpec& spec, bool decode_kernel) const {
  const Dims& d = spec.dims;
  const int dqk = decode_kernel ? d.kv_lora_rank + d.rope_dim : d.nope_dim + d.rope_dim;
  const int dv = decode_kernel ? d.kv_lora_rank : d.v_head_dim;
  const auto key = std::make_tuple(decode_kernel, dqk, dv, static_cast<int>(spec.dtype), spec.num_heads());
  if (auto it = probes_.find(key); it != probes_.end()) return it->second;
  // The layouts decode() and prefill() build: decode folds the heads into query
  // rows of one head; prefill views [s, N, D] rows as [1, N, s, D].
  const at::TensorOptions o = at::TensorOptions().dtype(scalar_type(spec.dtype)).device(at::kCUDA);
  const std::int64_t n = spec.num_heads(), keys = 64;
  at::Tensor q, k, v;
  if (decode_kernel) {
    const at::Tensor kv = at::zeros({keys, dqk}, o);
    q = at::zeros({1, 1, n, dqk}, o);
    k = kv.view({1, 1, keys, dqk});
    v = kv.narrow(1, 0, dv).view({1, 1, keys, dv});
  } else {
    q = at::zeros({16, n, dqk}, o).unsqueeze(0).transpose(1, 2);
    k = at::zeros({keys, n, dqk}, o).unsqueeze(0).transpose(1, 2);
    v = at::zeros({keys, n, dv}, o).unsqueeze(0).transpose(1, 2);
  }
  std::string why = refusal(kernel_, q, k, v, false, spec.softmax_scale());
  probes_[key] = why;
  return why;
}

Support TorchSdpaBackend::supports(const CaseSpec& spec, Op op) const {
  Support s = check_capabilities(capabilities(), spec, op);
  if (!s.ok) return s;
  if (!torch::cuda::is_available()) return s;  // the ops say SKIPPED
  // Which kernels the op needs: the layer routes q_len <= 1 requests (and every
  // request of a spec-decode batch) to decode (VARLEN, threshold 1), the rest to prefill.
  bool need_decode = op == Op::kDecode, need_prefill = op == Op::kPrefill;
  if (op == Op::kLayer) {
    for (int q : spec.batch.query_lens) {
      if (q <= 1 || spec.batch.spec_decode) {
        need_decode = true;
      } else {
        need_prefill = true;
      }
    }
  }
  for (bool dec : {true, false}) {
    if (dec ? !need_decode : !need_prefill) continue;
    if (std::string why = probe(spec, dec); !why.empty())
      return Support::no(std::string(dec ? "decode" : "prefill") + " kernel: " + why);
  }
  return s;
}

void TorchSdpaBackend::decode(const DecodeArgs& a) {
  need_device();
  const c10::NoGradGuard no_grad;
  DecodeState st = upload_decode(name_, a);
  run_decode(kernel_, st, true);
  download(st.o_all, a.o_lat, 0);
  download(st.lse_all, a.lse, 0);
}

// The bench: uploads, and one full decode with the dispatcher's checks (a
// refusal is NOT_SUPPORTED here), outside the timed region; launch() runs the
// gathers, SDPA calls and output copies on the bench's stream.
std::unique_ptr<DecodeBench> TorchSdpaBackend::prepare_decode_bench(const DecodeArgs& a) {
  class Handle final : public DecodeBench {
   public:
    Handle(TorchSdpaKernel k, DecodeState st) : kernel_(k), st_(std::move(st)) {}
    void launch(void* cuda_stream) override {
      const c10::NoGradGuard no_grad;
      const c10::cuda::CUDAStreamGuard guard(
          c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(cuda_stream), c10::cuda::current_device()));
      run_decode(kernel_, st_, false);
    }
    std::string note() const override {
      std::string n = "timed: per request an index_select gather of its keys, SDPA, output copies";
      if (st_.dequantized) n += "; fp8 entries dequantized before timing";
      return n;
    }

   private:
    TorchSdpaKernel kernel_;
    DecodeState st_;
  };
  need_device();
  const c10::NoGradGuard no_grad;
  DecodeState st = upload_decode(name_, a);
  run_decode(kernel_, st, true);
  c10::cuda::device_synchronize();
  return std::make_unique<Handle>(kernel_, std::move(st));
}

void TorchSdpaBackend::prefill(const PrefillArgs& a) {
  need_device();
  const c10::NoGradGuard no_grad;
  const std::int64_t T = a.q.shape.at(0), N = a.q.shape.at(1), Dv = a.v.shape.at(2);
  const at::Tensor q_all = upload(a.q), k_all = upload(a.k), v_all = upload(a.v);  // [T|S, N, D]
  at::Tensor o_all = at::zeros({T, N, Dv}, q_all.options());
  at::Tensor lse_all = at::full({T, N}, -std::numeric_limits<float>::infinity(), q_all.options().dtype(at::kFloat));
  // [len, N, D] rows as [1, N, len, D] (a view).
  auto heads_first = [](const at::Tensor& t) { return t.unsqueeze(0).transpose(1, 2); };
  for (std::size_t b = 0; b + 1 < a.cu_seqlens_q.size(); ++b) {
    const std::int64_t t0 = a.cu_seqlens_q[b], q_len = a.cu_seqlens_q[b + 1] - t0;
    const std::int64_t k0 = a.cu_seqlens_k[b], kv_len = a.cu_seqlens_k[b + 1] - k0;
    if (q_len == 0 || kv_len == 0) continue;
    const at::Tensor qb = q_all.narrow(0, t0, q_len), kb = k_all.narrow(0, k0, kv_len), vb = v_all.narrow(0, k0, kv_len);
    auto store = [&](std::int64_t u, std::int64_t n, const at::Tensor& o, const at::Tensor& lse) {
      o_all.narrow(0, t0 + u, n).copy_(o.squeeze(0).transpose(0, 1));
      lse_all.narrow(0, t0 + u, n).copy_(lse.squeeze(0).transpose(0, 1));
    };
    if (!a.causal || q_len == kv_len) {
      // Every query sees every key, or the square causal mask (is_causal).
      auto [o, lse] = call(kernel_, heads_first(qb), heads_first(kb), heads_first(vb), a.causal && q_len > 1, a.scale);
      store(0, q_len, o, lse);
      continue;
    }
    for (std::int64_t u = 0; u < q_len; ++u) {  // bottom-right causal: a prefix of keys per token
      const std::int64_t vis = visible(kv_len, q_len, u);
      if (vis == 0) continue;
      auto [o, lse] = call(kernel_, heads_first(qb.narrow(0, u, 1)), heads_first(kb.narrow(0, 0, vis)),
                           heads_first(vb.narrow(0, 0, vis)), false, a.scale);
      store(u, 1, o, lse);
    }
  }
  download(o_all, a.o, 0);
  download(lse_all, a.lse, 0);
}

}  // namespace

std::unique_ptr<Backend> make_torch_sdpa(TorchSdpaKernel kernel) { return std::make_unique<TorchSdpaBackend>(kernel); }

void torch_sdpa_release_cached_memory() {
  if (torch::cuda::is_available()) c10::cuda::CUDACachingAllocator::emptyCache();
}

}  // namespace mlagate
