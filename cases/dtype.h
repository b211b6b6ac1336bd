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

// KV cache dtypes (MLA_SPEC section 7). The fp8 issue extends this list.
enum class KvCacheDtype : std::uint8_t { kAuto };
std::string_view kv_cache_dtype_name(KvCacheDtype t);
KvCacheDtype parse_kv_cache_dtype(std::string_view s);  // throws InputError
std::span<const KvCacheDtype> kv_cache_dtypes();

}  // namespace mlagate
