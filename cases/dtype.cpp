// Names and sizes of dtypes; the lists of model and KV cache dtypes.
#include "cases/dtype.h"

#include <array>

#include "cases/errors.h"

namespace mlagate {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF64: return "float64";
    case DType::kF32: return "float32";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kU8: return "uint8";
  }
  return "?";
}

std::string_view dtype_short(DType t) {
  switch (t) {
    case DType::kF64: return "f64";
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
  }
  return "?";
}

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF64: case DType::kI64: return 8;
    case DType::kF32: case DType::kI32: return 4;
    case DType::kBF16: case DType::kF16: return 2;
    case DType::kU8: return 1;
  }
  return 0;
}

std::span<const DType> model_dtypes() {
  static constexpr std::array<DType, 2> kList{DType::kBF16, DType::kF16};
  return kList;
}

DType parse_model_dtype(std::string_view s) {
  for (DType t : model_dtypes())
    if (s == dtype_short(t) || s == dtype_name(t)) return t;
  if (s == "float16" || s == "half" || s == "f16") return DType::kF16;
  throw InputError("unknown model dtype '" + std::string(s) + "' (expected bf16 or fp16)");
}

std::string_view kv_cache_dtype_name(KvCacheDtype t) {
  switch (t) {
    case KvCacheDtype::kAuto: return "auto";
    case KvCacheDtype::kFp8: return "fp8";
    case KvCacheDtype::kFp8E4m3: return "fp8_e4m3";
    case KvCacheDtype::kFp8DsMla: return "fp8_ds_mla";
    case KvCacheDtype::kFp8V4: return "fp8_v4";
  }
  return "?";
}

std::span<const KvCacheDtype> kv_cache_dtypes() {
  static constexpr std::array<KvCacheDtype, 5> kList{KvCacheDtype::kAuto, KvCacheDtype::kFp8, KvCacheDtype::kFp8E4m3,
                                                     KvCacheDtype::kFp8DsMla, KvCacheDtype::kFp8V4};
  return kList;
}

bool is_fp8(KvCacheDtype t) { return t != KvCacheDtype::kAuto; }

KvCacheDtype parse_kv_cache_dtype(std::string_view s) {
  for (KvCacheDtype t : kv_cache_dtypes())
    if (s == kv_cache_dtype_name(t)) return t;
  std::string known;
  for (KvCacheDtype t : kv_cache_dtypes()) known += (known.empty() ? "" : ", ") + std::string(kv_cache_dtype_name(t));
  throw InputError("unknown or unsupported kv cache dtype '" + std::string(s) + "' (available: " + known + ")");
}

std::string_view scale_rule_name(ScaleRule r) {
  switch (r) {
    case ScaleRule::kPow2: return "pow2";
    case ScaleRule::kRaw: return "raw";
  }
  return "?";
}

std::string kv_cache_format_name(KvCacheFormat f) {
  std::string s(kv_cache_dtype_name(f.dtype));
  // Appended piece by piece: GCC 12 warned (-Wrestrict, a false positive) on
  // ":" + std::string(...) inlined here.
  if (f.dtype == KvCacheDtype::kFp8DsMla) s.append(":").append(scale_rule_name(f.scale_rule));
  return s;
}

KvCacheFormat parse_kv_cache_format(std::string_view s) {
  const std::size_t colon = s.find(':');
  KvCacheFormat f;
  f.dtype = parse_kv_cache_dtype(s.substr(0, colon));
  if (colon == std::string_view::npos) return f;
  const std::string_view rule = s.substr(colon + 1);
  if (f.dtype != KvCacheDtype::kFp8DsMla)
    throw InputError("kv cache dtype '" + std::string(s) + "': only fp8_ds_mla takes a scale rule");
  if (rule == scale_rule_name(ScaleRule::kPow2)) return f;
  if (rule == scale_rule_name(ScaleRule::kRaw)) {
    f.scale_rule = ScaleRule::kRaw;
    return f;
  }
  throw InputError("kv cache dtype '" + std::string(s) + "': unknown scale rule '" + std::string(rule) +
                   "' (expected pow2 or raw)");
}

}  // namespace mlagate
