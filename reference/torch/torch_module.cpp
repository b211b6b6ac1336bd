// The seed test's SDPA reference with libtorch, on the CPU (Debian's libtorch
// 1.13) or CUDA (libtorch 2.x): the module libmlagate_torch_reference.so,
// loaded on first use (torch_module.h says why). The only version-dependent
// piece is sdpa(): libtorch 1.13 has just the private
// at::_scaled_dot_product_attention, which takes no scale and divides the
// logits by sqrt(q.size(-1)).
#include "reference/torch/torch_module.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace mlagate {
namespace {

constexpr double kNaNd = std::numeric_limits<double>::quiet_NaN();

// What libtorch cannot compute here (not an error of the case or of libtorch):
// the loader throws NotSupportedError for it.
struct Unsupported : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// The prefill form's up-projected keys are built for a group of heads at a
// time, at most this many bytes of [k | v] per group.
constexpr std::int64_t kGroupBytes = std::int64_t{256} << 20;

at::ScalarType scalar_type(DType d) {
  switch (d) {
    case DType::kBF16: return at::kBFloat16;
    case DType::kF16: return at::kHalf;
    case DType::kF32: return at::kFloat;
    case DType::kF64: return at::kDouble;
    default: throw std::invalid_argument("torch reference: unsupported dtype " + std::string(dtype_name(d)));
  }
}

// A case tensor (host bits) as a torch tensor of dtype `as` on `dev`.
at::Tensor to_torch(const Tensor& t, at::ScalarType as, const at::Device& dev) {
  std::vector<std::int64_t> shape(t.shape().begin(), t.shape().end());
  const at::Tensor host =
      at::from_blob(const_cast<std::byte*>(t.bytes()), shape, at::TensorOptions().dtype(scalar_type(t.dtype())));
  return host.to(dev, as, /*non_blocking=*/false, /*copy=*/true);
}

// scaled_dot_product_attention(q, k, v, attn_mask, scale) with a boolean mask
// (true = attend), q/k/v [..., L, E].
at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scale) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, scale);
#else
  // libtorch 1.x scales by 1/sqrt(E), E = q.size(-1). When 1/scale^2 is an
  // integer E' >= E, zero-padding q and k to E' columns gives exactly that
  // scale without touching a dot product (the seed's decode form: 576). Else q
  // is pre-multiplied by scale * sqrt(E) (one extra rounding of q in 16-bit
  // dtypes; the fp64 cross-check is unaffected).
  const std::int64_t e = q.size(-1);
  const double target = 1.0 / (scale * scale);
  const double rounded = std::round(target);
  if (std::fabs(target - rounded) <= 1e-9 * target && rounded >= static_cast<double>(e)) {
    const std::int64_t pad = static_cast<std::int64_t>(rounded) - e;
    if (pad == 0) return std::get<0>(at::_scaled_dot_product_attention(q, k, v, mask, 0.0, false, false));
    const at::Tensor qp = at::constant_pad_nd(q, {0, pad}), kp = at::constant_pad_nd(k, {0, pad});
    return std::get<0>(at::_scaled_dot_product_attention(qp, kp, v, mask, 0.0, false, false));
  }
  const at::Tensor qs = (q.to(at::kDouble) * (scale * std::sqrt(static_cast<double>(e)))).to(q.scalar_type());
  return std::get<0>(at::_scaled_dot_product_attention(qs, k, v, mask, 0.0, false, false));
#endif
}

// The seed's mask for a request: [q_len, s], every context key visible, the
// causal rule on the query part (query u sees new keys 0..u).
at::Tensor seed_mask(std::int64_t q_len, std::int64_t s, const at::Device& dev) {
  const std::int64_t ctx = s - q_len;
  at::Tensor mask = at::ones({q_len, s}, at::TensorOptions().dtype(at::kBool).device(dev));
  mask.narrow(1, ctx, q_len).copy_(at::ones({q_len, q_len}, at::TensorOptions().device(dev)).tril().to(at::kBool));
  return mask;
}

struct Inputs {
  at::Device dev = at::kCPU;
  at::ScalarType dt = at::kBFloat16;
  at::Tensor q, kv_c, k_pe, w_uk, w_uv;  // [T,N,P+R], [S,L], [S,R], [L,N,P], [L,N,V]
};

Inputs load_inputs(const Case& c, const TorchReferenceOptions& o) {
  if (o.cuda && !torch::cuda::is_available())
    throw Unsupported("torch reference: no CUDA device (libtorch " TORCH_VERSION ", CPU)");
  Inputs in;
  in.dev = o.cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  in.dt = o.fp64 ? at::kDouble : scalar_type(c.spec.dtype);
#if TORCH_VERSION_MAJOR < 2
  if (!o.cuda && in.dt == at::kHalf)
    throw Unsupported("torch reference: libtorch " TORCH_VERSION " has no fp16 matmul on the CPU");
#endif
  in.q = to_torch(c.q, in.dt, in.dev);
  // fp8 caches: the dequantized values (fp32, exact), in the model dtype as
  // the reference's `.to(dtype)` would give them.
  in.kv_c = to_torch(c.kv_c_cache.empty() ? c.kv_c : c.kv_c_cache, in.dt, in.dev);
  in.k_pe = to_torch(c.k_pe_cache.empty() ? c.k_pe : c.k_pe_cache, in.dt, in.dev);
  in.w_uk = to_torch(c.w_uk, in.dt, in.dev);
  in.w_uv = to_torch(c.w_uv, in.dt, in.dev);
  return in;
}

// One request through the decode form: ql = einsum(q_nope, W_UK), MQA SDPA over
// [kv_c | k_pe] with v = kv_c, then einsum(., W_UV). Returns [q_len, N*V].
at::Tensor decode_form(const Case& c, const Inputs& in, int i, bool fold_heads) {
  const Dims& d = c.spec.dims;
  const std::int64_t N = c.spec.num_heads(), q_len = c.query_lens[i], s = c.seq_lens[i];
  const at::Tensor q_c = in.q.narrow(0, c.query_start_loc[i], q_len);
  const at::Tensor q_nope = q_c.narrow(2, 0, d.nope_dim), q_pe = q_c.narrow(2, d.nope_dim, d.rope_dim);
  const at::Tensor ql_nope = at::einsum("qnh,lnh->qnl", {q_nope, in.w_uk});
  const at::Tensor q_mqa = at::cat({ql_nope, q_pe}, -1);  // [q_len, N, L+R]
  const at::Tensor kv = in.kv_c.narrow(0, c.kv_start_loc[i], s), pe = in.k_pe.narrow(0, c.kv_start_loc[i], s);
  const at::Tensor k_mqa = at::cat({kv, pe}, -1);  // [s, L+R]
  const at::Tensor mask = seed_mask(q_len, s, in.dev);
  at::Tensor o;  // [q_len, N, L]
  if (fold_heads) {
    // Every (token, head) a row of one head: the same attention per row.
    const at::Tensor rows_mask = mask.unsqueeze(1).expand({q_len, N, s}).reshape({1, 1, q_len * N, s});
    o = sdpa(q_mqa.reshape({1, 1, q_len * N, d.kv_lora_rank + d.rope_dim}), k_mqa.view({1, 1, s, -1}),
             kv.view({1, 1, s, -1}), rows_mask, c.spec.softmax_scale())
            .view({q_len, N, d.kv_lora_rank});
  } else {
    // The seed's literal layout: [1, N, q_len, D] against the key expanded to N heads.
    const at::Tensor k_sdpa = k_mqa.unsqueeze(1).expand({s, N, -1}).unsqueeze(0).transpose(1, 2);
    const at::Tensor v_sdpa = kv.unsqueeze(1).expand({s, N, -1}).unsqueeze(0).transpose(1, 2);
    o = sdpa(q_mqa.unsqueeze(0).transpose(1, 2), k_sdpa, v_sdpa, mask, c.spec.softmax_scale())
            .transpose(1, 2)
            .squeeze(0);
  }
  return at::einsum("qnl,lnv->qnv", {o, in.w_uv}).flatten(-2);
}

// One request through the prefill form: [k_nope | v] = einsum(kv_c, [W_UK | W_UV]),
// SDPA of q over [k_nope | k_pe], heads in groups. Returns [q_len, N*V].
at::Tensor prefill_form(const Case& c, const Inputs& in, int i) {
  const Dims& d = c.spec.dims;
  const std::int64_t N = c.spec.num_heads(), q_len = c.query_lens[i], s = c.seq_lens[i];
  const at::Tensor q_c = in.q.narrow(0, c.query_start_loc[i], q_len);  // [q_len, N, P+R]
  const at::Tensor kv = in.kv_c.narrow(0, c.kv_start_loc[i], s), pe = in.k_pe.narrow(0, c.kv_start_loc[i], s);
  const at::Tensor kv_b_proj = at::cat({in.w_uk, in.w_uv}, -1);  // [L, N, P+V]
  const at::Tensor mask = seed_mask(q_len, s, in.dev);
  const std::int64_t per_head = s * (2 * d.nope_dim + d.v_head_dim + d.rope_dim) * q_c.element_size();
  const std::int64_t group = std::clamp<std::int64_t>(kGroupBytes / std::max<std::int64_t>(per_head, 1), 1, N);
  std::vector<at::Tensor> outs;
  for (std::int64_t h0 = 0; h0 < N; h0 += group) {
    const std::int64_t g = std::min(group, N - h0);
    const at::Tensor kv_nope = at::einsum("sl,lnh->snh", {kv, kv_b_proj.narrow(1, h0, g)});  // [s, g, P+V]
    const at::Tensor k_nope = kv_nope.narrow(2, 0, d.nope_dim), v = kv_nope.narrow(2, d.nope_dim, d.v_head_dim);
    const at::Tensor k_full = at::cat({k_nope, pe.unsqueeze(1).expand({s, g, d.rope_dim})}, -1);
    const at::Tensor q_g = q_c.narrow(1, h0, g);
    outs.push_back(sdpa(q_g.unsqueeze(0).transpose(1, 2), k_full.unsqueeze(0).transpose(1, 2),
                        v.unsqueeze(0).transpose(1, 2), mask, c.spec.softmax_scale())
                       .transpose(1, 2)
                       .squeeze(0));  // [q_len, g, V]
  }
  return at::cat(outs, 1).flatten(-2);
}

std::string info() {
  std::string s = "libtorch " TORCH_VERSION;
  s += torch::cuda::is_available() ? ", CUDA (" + std::to_string(torch::cuda::device_count()) + " GPU)" : ", CPU";
  return s;
}

bool cuda_available() { return torch::cuda::is_available(); }

SdpaResult layer(const Case& c, SdpaForm form, std::span<const int> requests, const TorchReferenceOptions& o) {
  const c10::NoGradGuard no_grad;
  const Inputs in = load_inputs(c, o);
  const std::int64_t N = c.spec.num_heads(), V = c.spec.dims.v_head_dim;
  SdpaResult r;
  r.out.assign(static_cast<std::size_t>(c.num_tokens * N * V), kNaNd);
  for (int i : requests) {
    if (i < 0 || i >= c.num_requests) throw std::out_of_range("torch reference: request " + std::to_string(i));
    const std::int64_t q_len = c.query_lens[i];
    double* dst = r.out.data() + static_cast<std::size_t>(c.query_start_loc[i] * N * V);
    if (c.seq_lens[i] == 0) {  // padding: no key, output 0 (SDPA would give NaN)
      std::fill(dst, dst + q_len * N * V, 0.0);
      continue;
    }
    const at::Tensor out =
        form == SdpaForm::kDecode ? decode_form(c, in, i, /*fold_heads=*/!o.seed_layout) : prefill_form(c, in, i);
    const at::Tensor host = out.to(at::kCPU, at::kDouble).contiguous();
    std::copy_n(host.data_ptr<double>(), q_len * N * V, dst);
  }
  return r;
}

std::string kernel(const Case& c, SdpaForm form, const TorchReferenceOptions& o) {
#if TORCH_VERSION_MAJOR >= 2
  const c10::NoGradGuard no_grad;
  const Inputs in = load_inputs(c, o);
  const Dims& d = c.spec.dims;
  const std::int64_t N = c.spec.num_heads();
  for (int i = 0; i < c.num_requests; ++i) {
    const std::int64_t q_len = c.query_lens[i], s = c.seq_lens[i];
    if (s == 0) continue;
    at::Tensor mask = seed_mask(q_len, s, in.dev);
    at::Tensor q, k, v;
    if (form == SdpaForm::kDecode && o.seed_layout) {
      q = at::empty({1, N, q_len, d.kv_lora_rank + d.rope_dim}, in.q.options());
      k = at::empty({1, 1, s, d.kv_lora_rank + d.rope_dim}, in.q.options()).expand({1, N, s, -1});
      v = at::empty({1, 1, s, d.kv_lora_rank}, in.q.options()).expand({1, N, s, -1});
    } else if (form == SdpaForm::kDecode) {
      q = at::empty({1, 1, q_len * N, d.kv_lora_rank + d.rope_dim}, in.q.options());
      k = at::empty({1, 1, s, d.kv_lora_rank + d.rope_dim}, in.q.options());
      v = at::empty({1, 1, s, d.kv_lora_rank}, in.q.options());
      mask = mask.unsqueeze(1).expand({q_len, N, s}).reshape({q_len * N, s});
    } else {
      q = at::empty({1, N, q_len, d.nope_dim + d.rope_dim}, in.q.options());
      k = at::empty({1, N, s, d.nope_dim + d.rope_dim}, in.q.options());
      v = at::empty({1, N, s, d.v_head_dim}, in.q.options());
    }
    const std::int64_t choice = at::_fused_sdp_choice(q, k, v, mask, 0.0, false, c.spec.softmax_scale());
    switch (choice) {
      case 0: return "math";
      case 1: return "flash";
      case 2: return "efficient";
      case 3: return "cudnn";
      default: return "backend " + std::to_string(choice);
    }
  }
  return "none (no request has keys)";
#else
  (void)c, (void)form, (void)o;
  return "math";
#endif
}

// The table's calls: every exception becomes its message (torch_module.h).
template <typename F>
torch_module::Outcome catching(F&& f) {
  try {
    f();
    return {};
  } catch (const Unsupported& e) {
    return {e.what(), true};
  } catch (const std::exception& e) {
    return {e.what()[0] ? e.what() : "torch reference: unnamed error"};
  } catch (...) {
    return {"torch reference: unknown exception"};
  }
}

}  // namespace
}  // namespace mlagate

extern "C" __attribute__((visibility("default"))) const mlagate::torch_module::Api* mlagate_torch_reference_module() {
  using namespace mlagate;
  static const std::string key = torch_module::build_key();
  static const torch_module::Api api = {
      .key = key.c_str(),
      .info = &info,
      .cuda_available = &cuda_available,
      .layer = [](const Case& c, SdpaForm f, std::span<const int> r, const TorchReferenceOptions& o, SdpaResult& out) {
        return catching([&] { out = layer(c, f, r, o); });
      },
      .kernel = [](const Case& c, SdpaForm f, const TorchReferenceOptions& o, std::string& out) {
        return catching([&] { out = kernel(c, f, o); });
      },
  };
  return &api;
}
