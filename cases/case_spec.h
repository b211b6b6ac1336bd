// The case model: every parameter of one MLA problem (MLA_SPEC sections 1-2)
// and its stable id string, the key for filters, reports and repro commands.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cases/dtype.h"

namespace mlagate {

// MLA dimensions. DeepSeek V2/V3/R1 defaults; "glm" is the second set vLLM sweeps.
struct Dims {
  int kv_lora_rank = 512;  // L: latent width of the cache
  int rope_dim = 64;       // R: qk_rope_head_dim
  int nope_dim = 128;      // P: qk_nope_head_dim
  int v_head_dim = 128;    // V
  int head_size() const { return kv_lora_rank + rope_dim; }  // D = L + R
  bool operator==(const Dims&) const = default;
};
Dims dims_preset(const std::string& name);  // "deepseek" | "glm"; throws InputError
std::string dims_label(const Dims& d);      // "deepseek", "glm" or "L.R.P.V"

// A batch: per-request total lengths and new-token counts (MLA_SPEC section 4).
struct BatchSpec {
  std::string name;
  std::vector<int> seq_lens;    // s_i = context + new tokens
  std::vector<int> query_lens;  // q_i = new tokens; c_i = s_i - q_i is cached context
  bool spec_decode = false;     // uniform multi-token decodes (threshold raised to q_len)
  std::string note;             // why the spec exists (edges)
};

struct CaseSpec {
  std::string suite = "adhoc";  // label only; part of the id
  BatchSpec batch;
  Dims dims;
  int total_heads = 128;  // heads of the model; this rank has total_heads / tp
  int tp = 1;
  DType dtype = DType::kBF16;  // model dtype: bf16 | fp16
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
  ScaleRule scale_rule = ScaleRule::kPow2;  // fp8_ds_mla tile scales; must stay kPow2 for other dtypes
  int block_size = 0;  // 0: each backend uses its preferred block size ("bs=auto")
  std::uint64_t seed = 0;
  double q_magnitude = 1.0;      // q is drawn N(0, q_magnitude^2)
  std::optional<double> scale;   // softmax scale; default 1/sqrt(L+R)
  float k_scale = 1.0f;          // per-tensor cache scale: fp8 and fp8_e4m3 store x / k_scale
                                 // (auto ignores it; fp8_ds_mla must ignore it, its scales are per tile)

  KvCacheFormat kv_format() const { return {kv_cache_dtype, scale_rule}; }

  int num_heads() const { return total_heads / tp; }
  double softmax_scale() const;
  int num_requests() const { return static_cast<int>(batch.seq_lens.size()); }
  int num_tokens() const;     // T = sum q_i
  int num_kv_tokens() const;  // S = sum s_i
  // "vllm/mixed_small/tp1/bf16/kv=auto/bs=16/seed=0" [+ "/dims=glm" "/qmag=8" "/scale=0.1"];
  // the kv part is kv_cache_format_name(): "kv=fp8", "kv=fp8_ds_mla:raw".
  std::string id() const;
  // Throws InvalidCase with the reason if the parameters cannot form a problem.
  void validate() const;
};

}  // namespace mlagate
