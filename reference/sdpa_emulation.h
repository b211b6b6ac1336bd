// The seed test's SDPA reference in the model dtype, emulated on the CPU in
// fp32 with the model-dtype roundings where torch's einsum and fused
// scaled_dot_product_attention store 16-bit tensors (SPEC: Pass rules, rule 5).
// The baseline policy measures how far this plain same-precision
// implementation lands from the fp64 reference; no libtorch is needed.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "cases/case.h"
#include "cases/tensor.h"

namespace mlagate {

// The two forms of the seed test's reference (SPEC: The two paths).
enum class SdpaForm : std::uint8_t {
  kDecode,   // ql = einsum(q_nope, W_UK); SDPA over [kv_c | k_pe] with v = kv_c (MQA); einsum(o_lat, W_UV)
  kPrefill,  // [k_nope | v] = einsum(kv_c, [W_UK | W_UV]); SDPA over [k_nope | k_pe] with v (MHA)
};
std::string_view sdpa_form_name(SdpaForm f);  // "decode" | "prefill"

// What the emulation rounds, in order (model dtype = bf16 or fp16, RNE):
//   1. einsum outputs: ql [T,N,L] (decode form), k_nope [S,N,P] and v [S,N,V]
//      (prefill form), each an fp32 dot product rounded once;
//   2. inside SDPA: fp32 logits q.k, times scale, fp32 softmax with the row max
//      subtracted; the unnormalized probabilities rounded to the model dtype
//      before P@V (the tensor-core operand of torch's fused CUDA kernels),
//      fp32 accumulation, division by the fp32 sum of the unrounded ones;
//      the output rounded;
//   3. the decode form's W_UV einsum, rounded.
// fp8 caches: keys are the dequantized cache (c.kv_c_cache) rounded to the
// model dtype, as the reference's `.to(dtype)` of the dequantized tensor.
// lse (not an SDPA output) is the fp32 m + log(sum) of step 2.
// (reference/torch/torch_reference.h computes the same forms with libtorch.)
struct SdpaResult {
  std::vector<double> out;  // model-dtype values; layer and prefill op: [T, N*V]; decode op: [T, N, L]
  std::vector<double> lse;  // [T, N] fp32 values; -inf for rows with no visible key
};

class KvProjection;  // reference/glue.h

// The layer reference for the given requests through one form; rows of the
// other requests are NaN. The prefill form's up-projected keys and values come
// from `projection` when given (it must hold the requests' rows), else are
// projected here; the same bits either way.
SdpaResult emulate_sdpa_layer(const Case& c, SdpaForm form, std::span<const int> requests,
                              const KvProjection* projection = nullptr);

// Kernel-level decode op: SDPA over the case's keys on the given latent queries
// q_lat [T, N, L] (model dtype; q_pe comes from c.q). out is o_lat [T, N, L].
SdpaResult emulate_sdpa_decode_op(const Case& c, const TensorView& q_lat);

// Kernel-level prefill op: SDPA of c.q over the given up-projected keys and
// values k [S, N, P+R], v [S, N, V] (model dtype), bottom-right causal per
// request. out is o [T, N, V] (= [T, N*V]).
SdpaResult emulate_sdpa_prefill_op(const Case& c, const TensorView& k, const TensorView& v);

// err_baseline's parts (SPEC: Pass rules, rule 5): the largest |a - b| over
// the pairs of elements [first, first + n) where both are finite.
double baseline_error(const std::vector<double>& a, const std::vector<double>& b, std::size_t first, std::size_t n);

// The layer op's per-request err_baseline of one form: for each request i of
// `requests`, out[i] and lse[i] are the largest error of the emulation `e`
// against the reference (out [T, N*V], lse [T, N]) over request i's rows.
// A request's values depend on its own rows alone (the emulation's too), so
// the runner, which emulates the requests each backend routes through a form,
// and export, which emulates them all, agree.
void layer_baseline_errors(const Case& c, const SdpaResult& e, const std::vector<double>& ref_out,
                           const std::vector<double>& ref_lse, std::span<const int> requests, std::vector<double>& out,
                           std::vector<double>& lse);

}  // namespace mlagate
