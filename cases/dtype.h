// Element types of tensors and of KV caches: one list each, with names used in
// case ids, reports and (later) HDF5 attributes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace mlagate {

enum class DType : std::uint8_t { kF64, kF32, kBF16, kF16, kI32, kI64, kU8 };

std::string_view dtype_name(DType t);     // "float64", "bfloat16", ...
std::string_view dtype_short(DType t);    // "f64", "bf16", ... (case ids)
std::size_t dtype_size(DType t);
DType parse_model_dtype(std::string_view s);  // "bf16" | "fp16"; throws InputError

// Model dtypes a case may use. One source of truth for sweeps and validation.
std::span<const DType> model_dtypes();

// KV cache dtypes (SPEC: KV cache dtypes; byte layouts in cases/fp8.h):
// auto: D = L + R elements of the model dtype; fp8, fp8_e4m3 (the same on
// NVIDIA): D bytes of e4m3fn, x / k_scale; fp8_ds_mla: DeepSeek V3.2's 656-byte
// entry (e4m3 NoPE in 128-element tiles, fp32 tile scales, bf16 RoPE);
// fp8_v4: DeepSeek V4's 584-byte entry laid out per page (e4m3 NoPE in
// 64-element tiles with UE8M0 scales, bf16 RoPE; FlashMLA's MODEL1 layout).
enum class KvCacheDtype : std::uint8_t { kAuto, kFp8, kFp8E4m3, kFp8DsMla, kFp8V4 };
std::string_view kv_cache_dtype_name(KvCacheDtype t);
KvCacheDtype parse_kv_cache_dtype(std::string_view s);  // throws InputError
std::span<const KvCacheDtype> kv_cache_dtypes();
bool is_fp8(KvCacheDtype t);  // every dtype but auto

// How an fp8_ds_mla writer picks a tile's scale from its amax (both exist in
// the wild, SPEC: KV cache dtypes): kPow2 = 2^ceil(log2(max(amax/448, 1e-4)))
// (current vLLM and FlashMLA), kRaw = max(amax/448, FLT_MIN) (older writers).
enum class ScaleRule : std::uint8_t { kPow2, kRaw };
std::string_view scale_rule_name(ScaleRule r);  // "pow2" | "raw"

// A cache format as one token, the kv part of a case id and of --kv-cache-dtype
// lists: the dtype name, and for fp8_ds_mla its scale rule ("fp8_ds_mla:raw").
struct KvCacheFormat {
  KvCacheDtype dtype = KvCacheDtype::kAuto;
  ScaleRule scale_rule = ScaleRule::kPow2;  // fp8_ds_mla only; kPow2 for the others
  bool operator==(const KvCacheFormat&) const = default;
};
std::string kv_cache_format_name(KvCacheFormat f);  // "auto", "fp8", "fp8_ds_mla:pow2"
// "fp8_ds_mla" alone is the pow2 rule; a ":rule" on any other dtype is an error.
KvCacheFormat parse_kv_cache_format(std::string_view s);  // throws InputError

}  // namespace mlagate
