// The seed test's SDPA reference in the model dtype, emulated in fp32 with the
// model-dtype roundings where torch's einsum and fused
// scaled_dot_product_attention store 16-bit tensors (SPEC: Pass rules, rule 5).
// The baseline policy measures how far this plain same-precision
// implementation lands from the fp64 reference; no libtorch is needed. Every
// value has one fixed order of operations (EmulatedAttention, below), the
// same bits on the CPU and, with --reference cuda, on the GPU.
#pragma once

#include <cstdint>
#include <optional>
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
// Where that rounding is not exact (fp8_ds_mla:raw tile scales, k_scale 0.01:
// cache_values_exact), the decode form and the decode op also run the decode
// path's other plain implementation, the keys as the kernel dequantizes them,
// `e4m3 * scale` in fp32, never rounded. Both are correct and they make
// different errors: vLLM's dense decode kernels and cpu.* / cuda.* read the
// keys in fp32; torch.sdpa.* (and the sparse readers, FlashMLA's bf16 MMA
// operand) round them to the model dtype. Either one alone as err_baseline
// judged the other kind of backend by a different random error, and tiny
// cases failed correct backends (cases/KV_CACHE.md, "err_baseline on inexact
// fp8 caches"); err_baseline is the larger error of the two (baseline_error
// below). The prefill form has one implementation: the layer glue rounds the
// latent into the model-dtype workspace before up-projecting it, as vLLM's
// gather-and-upconvert does, for every backend.
// lse (not an SDPA output) is the fp32 m + log(sum) of step 2.
// (reference/torch/torch_reference.h computes the same forms with libtorch;
// its keys are rounded.)
struct SdpaResult {
  std::vector<double> out;  // model-dtype values; layer and prefill op: [T, N*V]; decode op: [T, N, L]
  std::vector<double> lse;  // [T, N] fp32 values; -inf for rows with no visible key
  // The decode path with fp32 keys, laid out as out and lse; empty where the
  // rounded keys are exact (then it is the same bits) and for the prefill form.
  std::vector<double> out_f32_keys, lse_f32_keys;
};

// Whether every dequantized value of the case's cache (c.kv_c_cache,
// c.k_pe_cache) is exact in the model dtype: true without an fp8 cache, for
// fp8_ds_mla:pow2 (e4m3 times a power of two) and for fp8 with k_scale 1 or 3
// in bf16; false for fp8_ds_mla:raw and k_scale 0.01.
bool cache_values_exact(const Case& c);

class KvProjection;  // reference/kv_projection.h

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
// `source`, when given, is the KvProjection whose k_all() and v_all() k and v
// are (an emulator may then project them itself).
SdpaResult emulate_sdpa_prefill_op(const Case& c, const TensorView& k, const TensorView& v,
                                   const KvProjection* source = nullptr);

// The attention core of the emulation: one call is one request's SDPA, `rows` query rows in each of `heads` independent slices
// (the prefill form's heads; the decode form has one slice whose rows are
// (token, head) pairs) over the request's `keys` keys. Row r of slice h reads
// q at q + r * q_row + h * q_head (dqk elements), key j at k + j * k_row +
// h * k_head (dqk), its value at v + j * v_row + h * v_head (dv); elements are
// `elem` (fp32, or the model dtype's 16 bits). Row r sees keys 0 ..
// emu_visible(r, rows_per_token, context, keys) - 1 (detail/emulation_math.h).
// Results in [rows][heads] order: o (dv model-dtype values a row), and the
// softmax's scaled row max and sum, whose lse the caller forms (max +
// log(sum)); a row that sees no key has o = 0, max = -inf
// and sum = 0.
//
// The arithmetic, in its one fixed order (the same bits on any machine):
// s_j = the fma chain over d = 0..dqk-1 of q[d] * k_j[d] from +0; x_j = s_j *
// scale; m = max x_j; p_j = emu_exp(x_j - m); sum = the lanes' sums of p_j
// (emulation_math.h); P_j = p_j rounded to the model dtype; o[c] = (the fma
// chain over j of P_j * v_j[c] from +0) / sum, rounded. (Until 2026-12-04 the
// CPU computed the cores with Eigen, whose sums follow its blocking: other
// last bits, and other ones on another CPU.)
struct EmulatedAttention {
  enum class Elem : std::uint8_t { kF32, kBF16, kF16 };
  const void* q = nullptr;
  std::int64_t q_row = 0, q_head = 0;
  const void* k = nullptr;
  std::int64_t k_row = 0, k_head = 0;
  const void* v = nullptr;
  std::int64_t v_row = 0, v_head = 0;
  // Rows in pieces (the CPU's cores only; the GPU's refuses them): where
  // set, key row j starts at k_rows[j] and value row j at v_rows[j] (each
  // then + h * k_head or h * v_head), and k, k_row, v and v_row are unused.
  // The prefill form reads the rows its KvProjection holds in place so.
  const void* const* k_rows = nullptr;
  const void* const* v_rows = nullptr;
  Elem elem = Elem::kF32;  // q, k and v alike
  int rows = 0, heads = 1, rows_per_token = 1, context = 0, keys = 0, dqk = 0, dv = 0;
  float scale = 1;
  bool bf16 = true;  // model dtype: bf16, else fp16
  float* o = nullptr;    // [rows * heads * dv]
  float* max = nullptr;  // [rows * heads]
  float* sum = nullptr;  // [rows * heads]
  // The prefill form's k and v are, besides, the glue's up-projection
  // (glue.h, up_project_kv: the same bits wherever projected) of these
  // latent rows [keys, L] and rope rows [keys, R] (model-dtype bits) with the
  // weights of `weights_of`: an emulator may project them itself (the GPU's
  // does: a sixteenth of the bytes to move), and then k and v may be null
  // (the fixed order on the CPU projects them with up_project_kv). Null:
  // read k and v.
  const std::uint16_t* latent = nullptr;
  const std::uint16_t* rope = nullptr;
  const Case* weights_of = nullptr;
};

// The fixed order above on the CPU, plainly: the yardstick that the CPU's
// fast implementation and reference/cuda's GPU emulator must match byte for
// byte (tests), one row at a time in plain loops.
void emulate_attention_fixed_order(std::span<const EmulatedAttention> calls);

// The fixed order above on the CPU at GEMM speed (cpu_attention_emulation.cpp):
// the yardstick's bytes, on any machine and at any thread count. The
// emulation's attention cores run here unless an emulator is set.
void emulate_attention_cpu(std::span<const EmulatedAttention> calls);

// A call whose k and v are null but whose latent rows are named, made
// readable: K and V projected into k and v as the glue projects them
// (glue.h, up_project_kv), the copy of the call pointing at them.
EmulatedAttention with_projected_kv(const EmulatedAttention& a, Tensor& k, Tensor& v);

// Where the emulation's attention cores run. Null, the default, is
// emulate_attention_cpu; --reference cuda sets reference/cuda's GPU emulator.
// Every one computes the fixed order above, so the bits are the same
// wherever the cores run. One call takes every request of one form or op
// (the decode form's in groups, so that its widened keys stay within
// memory). Process-wide, like the row projector (glue.h).
using AttentionEmulator = void (*)(std::span<const EmulatedAttention> calls);
void set_attention_emulator(AttentionEmulator e);
AttentionEmulator attention_emulator();

// Whether emulate_sdpa_layer's prefill form reads only the latent rows of
// `p` (an emulator is set: it projects K and V itself, as the GPU's does),
// so that p need not hold the requests' projected rows. Otherwise it reads
// them, and p must hold them (KvProjection::ensure).
bool prefill_emulation_reads_latent(const Case& c, const KvProjection& p);

// The decode form's keys per emulator call, at most (32 MiB; one request
// whatever its size): tests set fewer bytes to emulate a batch in groups.
// Returns the previous value; 0 or less restores the default.
std::int64_t set_decode_key_group_bytes(std::int64_t bytes);

// emulate_attention_cpu's bf16 pair path (cpu_attention_emulation.cpp):
// where the build has VDPBF16PS, a bf16 call's tiles do two steps of each
// chain an instruction when the process prefers pairs
// (detail::pair_path_preferred: MLAGATE_ROWWISE_PATH, else the faster path on
// this machine, as for the glue). The bits are the fma tiles'. Tests force a
// path: true or false, or nullopt for the process's choice; true has no
// effect in a build without the instruction. Returns the previous setting.
std::optional<bool> set_cpu_emulation_pairs(std::optional<bool> use);
// Whether this build compiled the pair path (AVX512_BF16 targeted).
bool cpu_emulation_has_pairs();
// Logit tiles and value passes run on pairs since the process began (tests:
// a forced pair path must have been taken, in both halves of the core).
struct CpuEmulationPairCounts {
  std::uint64_t logit_tiles = 0, value_passes = 0;
};
CpuEmulationPairCounts cpu_emulation_pair_counts();

// Sets an emulator for its lifetime, then puts the previous one back.
class AttentionEmulatorScope {
 public:
  explicit AttentionEmulatorScope(AttentionEmulator e) : previous_(attention_emulator()) { set_attention_emulator(e); }
  ~AttentionEmulatorScope() { set_attention_emulator(previous_); }
  AttentionEmulatorScope(const AttentionEmulatorScope&) = delete;
  AttentionEmulatorScope& operator=(const AttentionEmulatorScope&) = delete;

 private:
  AttentionEmulator previous_;
};

// err_baseline's parts (SPEC: Pass rules, rule 5): the largest |a - b| over
// the pairs of elements [first, first + n) where both are finite.
double baseline_error(const std::vector<double>& a, const std::vector<double>& b, std::size_t first, std::size_t n);
// The same for one output of an emulation (lse or out) against the reference
// `ref`: the larger error of its plain implementations (out and, where it has
// one, out_f32_keys; likewise lse).
double baseline_error(const SdpaResult& e, bool lse, const std::vector<double>& ref, std::size_t first, std::size_t n);

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
